//! `rollout`: G execution trees per task with a policy, written as a node table in Parquet.

use std::sync::Arc;

use futures::future::BoxFuture;
use rao_agent::{Batcher, Limits, Policy, RunMeta, ScriptedExpert, TreeSpec, UniformRandom, run_trees};
use rao_core::NodeRecord;
use rao_core::parquet_io::nodes_to_parquet;
use rao_envs::textcraft::grammar::TextCraftGrammar;
use rao_envs::textcraft::{ExpertConfig, TextCraftEpisode, World};
use rao_pipeline::{InputDecl, StageContext, TypedStage};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::tasks_io::load_tasks;

pub const TREES_FILE: &str = "trees.parquet";

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// The scripted expert (with optional delegation and noise).
    Expert,
    /// Uniformly random well-formed actions.
    Random,
    /// The learned policy of the `checkpoint` input.
    Checkpoint,
}

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Recursive,
    Flat,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExpertParams {
    #[serde(default = "one")]
    pub delegate: f64,
    #[serde(default)]
    pub noise: f64,
}

fn one() -> f64 {
    1.0
}

impl Default for ExpertParams {
    fn default() -> Self {
        ExpertParams { delegate: 1.0, noise: 0.0 }
    }
}

/// Budgets shared by rollout-like stages.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitParams {
    #[serde(default = "default_window")]
    pub window: usize,
    /// Steps per node; default 25 recursive, 200 flat.
    #[serde(default)]
    pub step_budget: Option<u32>,
    #[serde(default = "default_depth")]
    pub max_depth: u32,
    #[serde(default = "default_children")]
    pub max_children: u32,
    #[serde(default = "default_nodes")]
    pub max_nodes: u32,
}

fn default_window() -> usize {
    96
}
fn default_depth() -> u32 {
    6
}
fn default_children() -> u32 {
    8
}
fn default_nodes() -> u32 {
    512
}

impl Default for LimitParams {
    fn default() -> Self {
        LimitParams {
            window: default_window(),
            step_budget: None,
            max_depth: default_depth(),
            max_children: default_children(),
            max_nodes: default_nodes(),
        }
    }
}

impl LimitParams {
    pub fn limits(&self, mode: Mode) -> Limits {
        let base = match mode {
            Mode::Recursive => Limits::recursive(self.window),
            Mode::Flat => Limits::flat(self.window),
        };
        Limits {
            step_budget: self.step_budget.unwrap_or(base.step_budget),
            max_depth: self.max_depth,
            max_children: self.max_children,
            max_nodes: self.max_nodes,
            ..base
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RolloutParams {
    #[serde(default = "default_policy")]
    pub policy: PolicyKind,
    #[serde(default = "default_mode")]
    pub mode: Mode,
    /// Trees per task (G).
    #[serde(default = "default_group")]
    pub group_size: usize,
    #[serde(default)]
    pub limits: LimitParams,
    #[serde(default)]
    pub expert: ExpertParams,
    /// Sampling temperature of a learned policy (1 = its own distribution).
    #[serde(default = "one")]
    pub temperature: f64,
    #[serde(default)]
    pub backend: rao_policy::Backend,
    /// Loop iteration recorded with every node (e.g. `${loop.iteration}`).
    #[serde(default)]
    pub iteration: i32,
    /// Run only every `count`-th task starting at `index` (all G trees of a task stay together).
    /// Fan a large rollout out with `matrix: {shard: [0, 1, 2, 3]}` and
    /// `shard: {index: "${matrix.shard}", count: 4}`; a stage reading `rollout.trees` gets the
    /// trees of every shard.
    #[serde(default)]
    pub shard: Option<Shard>,
}

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

fn default_policy() -> PolicyKind {
    PolicyKind::Expert
}
fn default_mode() -> Mode {
    Mode::Recursive
}
fn default_group() -> usize {
    4
}

/// Run `group` trees for every task through one batcher; returns all nodes.
pub async fn rollout_trees(
    world: &Arc<World>,
    tasks: &[rao_envs::textcraft::Task],
    policy: Arc<dyn Policy>,
    mode: Mode,
    group: usize,
    limits: Limits,
    meta: RunMeta,
    seed: u64,
) -> Vec<Vec<NodeRecord>> {
    let batcher = Batcher::start(policy);
    let mut trees = Vec::new();
    for (ti, t) in tasks.iter().enumerate() {
        for g in 0..group {
            trees.push(TreeSpec {
                episode: Arc::new(TextCraftEpisode::new(world.clone(), t.clone())),
                task_id: t.id.clone(),
                group: g as i32,
                recursive: mode == Mode::Recursive,
                seed: seed ^ ((ti as u64) << 20 | g as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            });
        }
    }
    let out = run_trees(&batcher, trees, limits, meta).await;
    batcher.close();
    out
}

/// Summary metrics of a set of trees.
pub fn tree_metrics(trees: &[Vec<NodeRecord>]) -> Vec<(&'static str, f64)> {
    let n = trees.len().max(1) as f64;
    let nodes: Vec<&NodeRecord> = trees.iter().flatten().collect();
    let nn = nodes.len().max(1) as f64;
    vec![
        ("root_success", trees.iter().filter(|t| t[0].score >= 1.0).count() as f64 / n),
        ("node_success", nodes.iter().map(|x| x.score).sum::<f64>() / nn),
        ("nodes_per_tree", nodes.len() as f64 / n),
        ("max_depth", nodes.iter().map(|x| x.depth).max().unwrap_or(0) as f64),
        ("overflow_rate", nodes.iter().filter(|x| x.status == "context_overflow").count() as f64 / nn),
        ("tokens_per_tree", nodes.iter().map(|x| x.context_tokens as f64).sum::<f64>() / n),
        ("steps_per_tree", nodes.iter().map(|x| x.steps as f64).sum::<f64>() / n),
    ]
}

pub struct Rollout;

impl TypedStage for Rollout {
    type Params = RolloutParams;
    const NAME: &'static str = "rollout";
    const VERSION: u32 = 1;
    const DESCRIBE: &'static str = "run G execution trees per task with a policy; writes the node table (Parquet)";
    const INPUTS: &'static [InputDecl] = &[InputDecl { name: "tasks", required: true }, InputDecl { name: "checkpoint", required: false }];
    const OUTPUTS: &'static [&'static str] = &["trees"];

    fn run(ctx: StageContext, p: RolloutParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            let (world, mut tasks) = load_tasks(&ctx, "tasks").await?;
            if let Some(Shard { index, count }) = p.shard {
                anyhow::ensure!(count > 0 && index < count, "shard index {index} is not below count {count}");
                tasks = tasks.into_iter().enumerate().filter(|(i, _)| i % count == index).map(|(_, t)| t).collect();
            }
            let policy = make_policy(&ctx, &world, &p).await?;
            let meta = RunMeta { run: ctx.pipeline.clone(), iteration: p.iteration, env: "textcraft".into() };
            let trees = rollout_trees(&world, &tasks, policy, p.mode, p.group_size, p.limits.limits(p.mode), meta, ctx.seed).await;
            for (k, v) in tree_metrics(&trees) {
                ctx.set_metric(k, v);
            }
            let nodes: Vec<NodeRecord> = trees.into_iter().flatten().collect();
            ctx.write_output("trees", TREES_FILE, &nodes_to_parquet(&nodes)?)?;
            Ok(())
        })
    }
}

/// The policy a rollout-like stage asked for.
pub async fn make_policy(ctx: &StageContext, world: &Arc<World>, p: &RolloutParams) -> anyhow::Result<Arc<dyn Policy>> {
    Ok(match p.policy {
        PolicyKind::Expert => Arc::new(ScriptedExpert {
            world: world.clone(),
            config: ExpertConfig { max_depth: p.limits.max_depth, delegate: p.expert.delegate, noise: p.expert.noise, seed: ctx.seed },
        }),
        PolicyKind::Random => Arc::new(UniformRandom { world: world.clone() }),
        PolicyKind::Checkpoint => {
            anyhow::ensure!(ctx.inputs.contains_key("checkpoint"), "`policy: checkpoint` needs a `checkpoint` input");
            let policy = crate::neural::load_policy(ctx, "checkpoint", p.backend).await?;
            Arc::new(crate::neural::NeuralPolicy {
                policy: Arc::new(policy),
                grammar: Arc::new(TextCraftGrammar::new(world, p.limits.max_children as usize)),
                world: world.clone(),
                temperature: p.temperature,
            })
        }
    })
}
