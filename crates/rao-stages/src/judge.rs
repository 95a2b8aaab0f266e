//! `judge`: score every node — the environment's exact verifier, the root's score copied down
//! (root proxy), or an LLM judge over an OpenAI-compatible endpoint.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use rao_core::{NodeRecord, NodeStatus, TreeKey};
use rao_pipeline::{InputDecl, StageContext, TypedStage};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::envs::{self, TaskSet};
use crate::llm_judge::{LlmJudge, LlmJudgeParams};
use crate::training::{read_trees, write_trees};

#[derive(Debug, Clone, Deserialize, serde::Serialize, JsonSchema)]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
pub enum JudgeParams {
    /// The environment's exact verifier for every node.
    Exact,
    /// Every node gets its root's exact score (for tasks without sub-task verifiers).
    RootProxy,
    /// An LLM judge behind an OpenAI-compatible chat-completions API.
    Llm(LlmJudgeParams),
}

/// Exact scores from the node table alone: a node's subtree counters and whether it finished.
pub fn exact_scores(set: &dyn TaskSet, nodes: &mut [NodeRecord]) -> anyhow::Result<()> {
    // One episode per task: verifiers read the task (and the world), never episode state.
    let index: BTreeMap<&str, usize> = (0..set.len()).map(|i| (set.id(i), i)).collect();
    let mut episodes: BTreeMap<String, std::sync::Arc<dyn rao_envs::Episode>> = BTreeMap::new();
    for n in nodes.iter() {
        if !episodes.contains_key(&n.task_id) {
            let i = *index
                .get(n.task_id.as_str())
                .ok_or_else(|| anyhow::anyhow!("node of task `{}`, which is not in the tasks input", n.task_id))?;
            episodes.insert(n.task_id.clone(), set.episode(i));
        }
    }
    // Subtree counters per (tree, node).
    type Key = (TreeKey, i32);
    let key = |n: &NodeRecord, id: i32| (n.tree_key(), id);
    let mut subtree: BTreeMap<Key, BTreeMap<String, i64>> = BTreeMap::new();
    // Deepest first, so children are summed before their parents.
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(nodes[i].depth));
    for i in order {
        let n = &nodes[i];
        let mut mine = subtree.remove(&key(n, n.node_id)).unwrap_or_default();
        for (k, v) in &n.counters {
            *mine.entry(k.clone()).or_default() += v;
        }
        if let Some(p) = n.parent_id {
            let parent = subtree.entry(key(n, p)).or_default();
            for (k, v) in &mine {
                *parent.entry(k.clone()).or_default() += v;
            }
        }
        let finished = n.status == NodeStatus::Finished;
        let score = episodes[&n.task_id].verify(&n.goal_ids, finished, n.result.as_deref(), &mine);
        nodes[i].score = score;
        nodes[i].judge = Some("exact".into());
        subtree.insert(key(&nodes[i], nodes[i].node_id), mine);
    }
    Ok(())
}

pub fn root_proxy(nodes: &mut [NodeRecord]) {
    let roots: BTreeMap<TreeKey, f64> = nodes.iter().filter(|n| n.parent_id.is_none()).map(|n| (n.tree_key(), n.score)).collect();
    for n in nodes.iter_mut() {
        n.score = roots[&n.tree_key()];
        n.judge = Some("root_proxy".into());
    }
}

pub struct Judge;

impl TypedStage for Judge {
    fn code() -> &'static str {
        crate::code::of("judge")
    }
    type Params = JudgeParams;
    const NAME: &'static str = crate::kinds::JUDGE;
    const VERSION: u32 = 1;
    const DESCRIBE: &'static str = "score every node: exact verifier, root proxy, or an LLM judge (OpenAI-compatible HTTP)";
    const INPUTS: &'static [InputDecl] = &[InputDecl { name: "trees", required: true }, InputDecl { name: "tasks", required: true }];
    const OUTPUTS: &'static [&'static str] = &["trees"];

    fn run(ctx: StageContext, p: JudgeParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            let set = envs::load(&ctx, "tasks").await?;
            let mut nodes = read_trees(&ctx, "trees").await?;
            exact_scores(set.as_ref(), &mut nodes)?;
            match &p {
                JudgeParams::Exact => {}
                JudgeParams::RootProxy => root_proxy(&mut nodes),
                JudgeParams::Llm(cfg) => {
                    let judge = std::sync::Arc::new(LlmJudge::new(cfg.clone(), &ctx.base_dir)?);
                    let stats = judge.score_nodes(&mut nodes).await?;
                    ctx.set_metric("llm_calls", stats.calls as f64);
                    ctx.set_metric("llm_cache_hits", stats.cache_hits as f64);
                }
            }
            let mean = nodes.iter().map(|n| n.score).sum::<f64>() / nodes.len().max(1) as f64;
            ctx.set_metric("node_success", mean);
            write_trees(&ctx, "trees", &nodes)
        })
    }
}
