//! The scripted expert's success per band, mode and window, for the small and the full world.
//! Run: cargo run --example expert_table -p rao-stages

use std::sync::Arc;

use rao_agent::{Limits, RunMeta, ScriptedExpert};
use rao_envs::textcraft::{self, Band, ExpertConfig, SynthConfig};
use rao_stages::envs::textcraft::task_set;
use rao_stages::rollout::{Mode, rollout_trees, tree_metrics};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    for (name, cfg, windows) in
        [("small", SynthConfig::small(), vec![96usize, 640]), ("full", SynthConfig::full(), vec![256usize, 1024, 8192])]
    {
        let world = Arc::new(textcraft::generate(&cfg, 1));
        for w in windows {
            for mode in [Mode::Recursive, Mode::Flat] {
                let mut line = format!("{name:<5} W={w:<5} {:<9}", if mode == Mode::Recursive { "recursive" } else { "flat" });
                for band in Band::ALL {
                    let tasks = textcraft::synthesize(&world, band, 20, true, 7);
                    if tasks.is_empty() {
                        continue;
                    }
                    let policy = Arc::new(ScriptedExpert { world: world.clone(), config: ExpertConfig::default() });
                    let limits = if mode == Mode::Recursive { Limits { max_nodes: 4096, ..Limits::recursive(w) } } else { Limits::flat(w) };
                    let trees = rollout_trees(
                        &task_set(&world, &tasks),
                        &(0..tasks.len()).collect::<Vec<_>>(),
                        policy,
                        mode,
                        1,
                        limits,
                        RunMeta::default(),
                        1,
                    )
                    .await;
                    let ok = trees.iter().filter(|t| t[0].score >= 1.0).count() as f64 / trees.len() as f64;
                    let nodes = trees.iter().map(|t| t.len()).sum::<usize>() as f64 / trees.len() as f64;
                    let why = {
                        let mut s: Vec<&str> = trees
                            .iter()
                            .filter(|t| t[0].score < 1.0)
                            .flat_map(|t| t.iter().map(|n| n.status.as_str()))
                            .filter(|s| *s != "finished")
                            .collect();
                        s.sort();
                        s.dedup();
                        s.join("/")
                    };
                    line.push_str(&format!(
                        "  {}={ok:.2} ({nodes:.0} nodes{})",
                        band.name(),
                        if why.is_empty() { String::new() } else { format!(", {why}") }
                    ));
                }
                println!("{line}");
            }
        }
    }
    // The warm start's demonstrator (imperfect strategy: delegates half the time, noise actions)
    // on the main job's budgets: the ceiling of what imitating it can reach.
    let world = Arc::new(textcraft::generate(&SynthConfig::small(), 1));
    let shallow = textcraft::synthesize_tiers(&world, "tiers1-2", (1, 2), 3, 64, true, 12);
    let easy = textcraft::synthesize(&world, Band::Easy, 64, true, 12);
    let limits = Limits { max_depth: 6, max_children: 4, max_nodes: 128, ..Limits::recursive(96) };
    for (delegate, noise) in [(1.0, 0.0), (0.5, 0.0), (0.5, 0.05)] {
        let mut line = format!("demonstrator delegate={delegate} noise={noise} W=96:");
        for (name, tasks) in [("shallow(t1-2)", &shallow), ("easy", &easy)] {
            let config = ExpertConfig { max_depth: 6, delegate, noise, seed: 3 };
            let policy = Arc::new(ScriptedExpert { world: world.clone(), config });
            let trees = rollout_trees(
                &task_set(&world, tasks),
                &(0..tasks.len()).collect::<Vec<_>>(),
                policy,
                Mode::Recursive,
                1,
                limits,
                RunMeta::default(),
                1,
            )
            .await;
            let m: std::collections::BTreeMap<_, _> = tree_metrics(&trees).into_iter().collect();
            line.push_str(&format!("  {name} node={:.2} root={:.2}", m["node_success"], m["root_success"]));
        }
        println!("{line}");
    }
}
