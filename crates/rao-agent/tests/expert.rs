use std::sync::Arc;

use rao_agent::{Batcher, Limits, RunMeta, ScriptedExpert, TreeSpec, run_trees};
use rao_envs::textcraft::{self, Band, ExpertConfig, SynthConfig, TextCraftEpisode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_world_expert_table() {
    let world = Arc::new(textcraft::generate(&SynthConfig::small(), 1));
    for window in [64usize, 96, 128, 640] {
        for recursive in [false, true] {
            let mut line = format!("W={window:<4} {:<5}", if recursive { "rec" } else { "flat" });
            for band in [Band::Easy, Band::Medium, Band::Hard] {
                let tasks = textcraft::synthesize(&world, band, 30, true, 7);
                let policy = Arc::new(ScriptedExpert { world: world.clone(), config: ExpertConfig::default() });
                let b = Batcher::start(policy);
                let trees = tasks
                    .iter()
                    .map(|t| TreeSpec {
                        episode: Arc::new(TextCraftEpisode::new(world.clone(), t.clone())),
                        task_id: t.id.clone(),
                        group: 0,
                        recursive,
                        seed: 1,
                    })
                    .collect();
                let limits = if recursive { Limits::recursive(window) } else { Limits::flat(window) };
                let out = run_trees(&b, trees, limits, RunMeta::default()).await;
                b.close();
                let ok = out.iter().filter(|t| t[0].score >= 1.0).count();
                line.push_str(&format!(" {}={:.2}", band.name(), ok as f64 / out.len() as f64));
            }
            println!("{line}");
        }
    }
}
