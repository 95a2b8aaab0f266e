//! Rollout throughput of the scripted expert: nodes and tokens per second for 1, 8 and 64
//! concurrent trees (recursive, small world, Medium tasks, W = 96).
//! Run: cargo run --example bench_rollout -p rao-stages

use std::sync::Arc;
use std::time::Instant;

use rao_agent::{Limits, RunMeta, ScriptedExpert};
use rao_envs::textcraft::{self, Band, ExpertConfig, SynthConfig};
use rao_stages::envs::TaskSet;
use rao_stages::envs::textcraft::task_set;
use rao_stages::rollout::{Mode, rollout_trees};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let world = Arc::new(textcraft::generate(&SynthConfig::small(), 1));
    println!("{:>6} {:>10} {:>12} {:>14} {:>10}", "trees", "nodes", "nodes/s", "tokens/s", "seconds");
    let mut base = 0.0;
    for concurrent in [1usize, 8, 64] {
        let set = task_set(&world, &textcraft::synthesize(&world, Band::Medium, concurrent, false, 3));
        let policy = Arc::new(ScriptedExpert { world: world.clone(), config: ExpertConfig::default() });
        // Repeat so each setting runs ≥ 1 s.
        let (mut nodes, mut tokens, mut reps) = (0usize, 0usize, 0usize);
        let t0 = Instant::now();
        while t0.elapsed().as_secs_f64() < 1.0 {
            let trees =
                rollout_trees(&set, &set.all(), policy.clone(), Mode::Recursive, 1, Limits::recursive(96), RunMeta::default(), reps as u64)
                    .await;
            nodes += trees.iter().map(|t| t.len()).sum::<usize>();
            tokens += trees.iter().flatten().map(|n| n.context_tokens as usize).sum::<usize>();
            reps += 1;
        }
        let s = t0.elapsed().as_secs_f64();
        let nps = nodes as f64 / s;
        if concurrent == 1 {
            base = nps;
        }
        println!("{concurrent:>6} {nodes:>10} {nps:>12.0} {:>14.0} {s:>10.2}   ({:.1}× the 1-tree rate)", tokens as f64 / s, nps / base);
    }
}
