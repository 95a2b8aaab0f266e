//! Shared pieces of the learning stages: node tables in and out, nodes as training sequences.

use rao_core::NodeRecord;
use rao_core::parquet_io::{nodes_from_parquet, nodes_to_parquet};
use rao_pipeline::StageContext;
use rao_policy::Sequence;

use crate::rollout::TREES_FILE;

/// All nodes of every artifact of input `name`.
pub async fn read_trees(ctx: &StageContext, name: &str) -> anyhow::Result<Vec<NodeRecord>> {
    let mut nodes = Vec::new();
    for a in ctx.input(name)? {
        nodes.extend(nodes_from_parquet(ctx.read_input_file(a, TREES_FILE).await?)?);
    }
    Ok(nodes)
}

pub fn write_trees(ctx: &StageContext, output: &str, nodes: &[NodeRecord]) -> anyhow::Result<()> {
    ctx.write_output(output, TREES_FILE, &nodes_to_parquet(nodes)?)
}

/// A node's training sequence with the given advantage.
pub fn node_sequence(n: &NodeRecord, advantage: f32) -> Sequence {
    let (tokens, generated, old_logprobs) = n.sequence();
    Sequence { tokens, generated, old_logprobs, advantage, recursive: n.mode.is_recursive() }
}

/// Fraction of spawned goals a node had already spawned before (re-spawning after a failure):
/// the earliest warning of the node explosion RL without caps learns (LEARNING-NOTES.md).
pub fn retry_rate(nodes: &[NodeRecord]) -> f64 {
    let (mut spawned, mut repeats) = (0usize, 0usize);
    for n in nodes {
        let mut seen = std::collections::HashSet::new();
        for t in n.turns.iter().filter(|t| t.action.starts_with("spawn")) {
            for goal in t.action.trim_start_matches("spawn").trim_end_matches("<eos>").split(',') {
                spawned += 1;
                if !seen.insert(goal.trim().to_string()) {
                    repeats += 1;
                }
            }
        }
    }
    if spawned == 0 { 0.0 } else { repeats as f64 / spawned as f64 }
}
