//! The situation RAO exists for: with a small window the recursive expert solves every band
//! while the flat expert overflows on deep tasks. Prints the success table per window.

use rao_core::tree::{Mode, NodeStatus};
use std::sync::Arc;

use rao_agent::{Batcher, Limits, RunMeta, ScriptedExpert, TreeSpec, run_trees};
use rao_core::NodeRecord;
use rao_envs::textcraft::{self, Band, ExpertConfig, SynthConfig, TextCraftEpisode, World};

async fn success(world: &Arc<World>, band: Band, recursive: bool, window: usize) -> (f64, Vec<Vec<NodeRecord>>) {
    let tasks = textcraft::synthesize(world, band, 30, true, 7);
    let policy = Arc::new(ScriptedExpert { world: world.clone(), config: ExpertConfig::default() });
    let b = Batcher::start(policy);
    let trees = tasks
        .iter()
        .map(|t| TreeSpec {
            episode: Arc::new(TextCraftEpisode::new(world.clone(), t.clone())),
            task_id: t.id.clone(),
            group: 0,
            mode: Mode::from_recursive(recursive),
            seed: 1,
        })
        .collect();
    let limits = if recursive { Limits::recursive(window) } else { Limits::flat(window) };
    let out = run_trees(&b, trees, limits, RunMeta::default()).await;
    b.close();
    let ok = out.iter().filter(|t| t[0].score >= 1.0).count();
    (ok as f64 / out.len() as f64, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_world_recursive_expert_solves_every_band_and_flat_overflows() {
    let world = Arc::new(textcraft::generate(&SynthConfig::small(), 1));
    for window in [64usize, 96, 128, 640] {
        for recursive in [false, true] {
            let mut line = format!("W={window:<4} {:<5}", if recursive { "rec" } else { "flat" });
            for band in [Band::Easy, Band::Medium, Band::Hard] {
                let (s, trees) = success(&world, band, recursive, window).await;
                line.push_str(&format!(" {}={s:.2}", band.name()));
                if recursive && window >= 64 {
                    assert_eq!(s, 1.0, "recursive expert, {band:?}, W={window}");
                    let max = trees.iter().flatten().map(|n| n.context_tokens).max().unwrap_or(0);
                    assert!(max <= 48, "a recursive node fits in ~40 tokens (max {max})");
                }
                if !recursive && window == 96 && band != Band::Easy {
                    assert_eq!(s, 0.0, "flat expert, {band:?}, W=96");
                    assert!(trees.iter().all(|t| t[0].status == NodeStatus::ContextOverflow));
                }
            }
            println!("{line}");
        }
    }
}
