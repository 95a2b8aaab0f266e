//! `rollout`: G execution trees per task with a policy, written as a node table in Parquet.

use std::sync::Arc;

use futures::future::BoxFuture;
use std::sync::atomic::{AtomicUsize, Ordering};

use rao_agent::{Batcher, Limits, Policy, RunMeta, ScriptedPolicy, TreeDone, TreeSpec, run_trees_observed};
use rao_core::parquet_io::nodes_to_parquet;
use rao_core::{NodeRecord, NodeStatus};
use rao_pipeline::{InputDecl, StageContext, TypedStage};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::chat_api::{ChatApi, ChatEndpoint};
use crate::engine_policy::{EngineEndpoints, EnginePolicy};
use crate::envs::{self, ExpertSpec, TaskSet};
use crate::openai_policy::OpenAiPolicy;

pub const TREES_FILE: &str = "trees.parquet";

#[derive(Debug, Clone, Copy, Deserialize, serde::Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// The scripted expert (with optional delegation and noise).
    Expert,
    /// Uniformly random well-formed actions.
    Random,
    /// The learned policy of the `checkpoint` input.
    Checkpoint,
    /// The scripted expert's actions decoded through the `checkpoint` input's model: the
    /// expert's behaviour at the model's compute cost (for wall-clock comparisons).
    #[serde(rename = "paced_expert")]
    PacedExpert,
    /// Each task's gold trajectory (the original TextCraft files ship one) replayed through the
    /// environment, then `finish`: checks a dataset's gold from a pipeline.
    Gold,
    /// A model behind an OpenAI-compatible chat-completions endpoint (the `openai` block),
    /// acting on the environment's text form.
    #[serde(rename = "openai")]
    OpenAi,
    /// The `checkpoint` input's language model served by an inference engine (the `engine`
    /// block: vLLM's token-id completions API), token in and token out: trees `update` trains on.
    Engine,
}

/// `policy: engine` and its `engine` block come together: caught by `rao validate`.
pub fn needs_engine(policy: PolicyKind, engine: Option<&EngineEndpoints>) -> Vec<rao_pipeline::ParamError> {
    let error =
        |key: &str, message: String, help: &str| rao_pipeline::ParamError { key: Some(key.into()), message, help: Some(help.into()) };
    match (policy, engine) {
        (PolicyKind::Engine, None) => vec![error(
            "policy",
            "`policy: engine` needs an `engine` block: the servers to call".into(),
            "add `engine: {launch: {model: DIR}, model: NAME}` for rao to start vLLM on the model's directory, or `engine: {urls: [\"http://127.0.0.1:8000/v1\"], model: NAME}` for servers you run (NAME: the name they serve the model under)",
        )],
        (PolicyKind::Engine, Some(e)) => {
            e.problems().into_iter().map(|p| error("engine", p, "see `rao kinds rollout` or the schema for the `engine` block")).collect()
        }
        (_, None) => vec![],
        (_, Some(_)) => vec![error(
            "engine",
            "an `engine` block is only read with `policy: engine`".into(),
            "set `policy: engine`, or remove the block",
        )],
    }
}

/// `policy: openai` and its `openai` block come together: caught by `rao validate`.
pub fn needs_endpoint(policy: PolicyKind, endpoint: Option<&ChatEndpoint>) -> Option<rao_pipeline::ParamError> {
    match (policy, endpoint) {
        (PolicyKind::OpenAi, None) => Some(rao_pipeline::ParamError {
            key: Some("policy".into()),
            message: "`policy: openai` needs an `openai` block: the endpoint to call".into(),
            help: Some("add `openai: {base_url: \"http://127.0.0.1:8000/v1\", model: NAME}` (and `api_key_env` if it needs a key)".into()),
        }),
        (PolicyKind::OpenAi, Some(_)) | (_, None) => None,
        (_, Some(_)) => Some(rao_pipeline::ParamError {
            key: Some("openai".into()),
            message: "an `openai` block is only read with `policy: openai`".into(),
            help: Some("set `policy: openai`, or remove the block".into()),
        }),
    }
}

/// A count of trees or tasks: at least 1 (0 ran and reported nothing) and at most `max` (past it,
/// memory for the trees was asked for at once and the allocation aborted rao).
pub fn check_count(key: &str, value: usize, max: usize) -> Option<rao_pipeline::ParamError> {
    (value == 0 || value > max).then(|| rao_pipeline::ParamError {
        key: Some(key.into()),
        message: format!("{key} is {value}: it must be between 1 and {max}"),
        help: Some(format!("give `{key}` a count from 1 to {max}")),
    })
}

/// Trees per task (`group_size`) at most: 4,096 attempts of one task is already far past any
/// method's use.
pub const MAX_GROUP_SIZE: usize = 4096;

/// A policy that runs a model needs the model: caught by `rao validate`, before upstream work.
pub fn needs_checkpoint(policy: PolicyKind, inputs: &[&str]) -> Option<rao_pipeline::ParamError> {
    let name = match policy {
        PolicyKind::Checkpoint => "checkpoint",
        PolicyKind::PacedExpert => "paced_expert",
        PolicyKind::Engine => "engine",
        _ => return None,
    };
    (!inputs.contains(&"checkpoint")).then(|| rao_pipeline::ParamError {
        key: Some("policy".into()),
        message: format!("`policy: {name}` needs a `checkpoint` input"),
        help: Some("add `checkpoint: STAGE.checkpoint` (e.g. `warmstart.checkpoint`) under `inputs`, or choose another policy".into()),
    })
}

pub use rao_core::tree::Mode;

#[derive(Debug, Clone, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ExpertParams {
    pub delegate: f64,
    pub noise: f64,
}

impl Default for ExpertParams {
    fn default() -> Self {
        ExpertParams { delegate: 1.0, noise: 0.0 }
    }
}

/// Budgets shared by rollout-like stages.
#[derive(Debug, Clone, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LimitParams {
    pub window: usize,
    /// Steps per node; default 25 recursive, 200 flat.
    pub step_budget: Option<u32>,
    /// Steps of a recursive tree's root, if not `step_budget` (the long-document reference
    /// settings: root 15, children 25).
    pub root_step_budget: Option<u32>,
    pub max_depth: u32,
    pub max_children: u32,
    pub max_nodes: u32,
    /// The paper's shared step budget for a recursive tree: the root's steps for its whole
    /// subtree, a share of what is left reserved for each child it launches (see
    /// `rao_agent::Limits::subtree_steps`). Absent: every node has its own `step_budget`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subtree_steps: Option<u32>,
}

impl Default for LimitParams {
    fn default() -> Self {
        LimitParams {
            window: 96,
            step_budget: None,
            root_step_budget: None,
            max_depth: 6,
            max_children: 8,
            max_nodes: 512,
            subtree_steps: None,
        }
    }
}

impl LimitParams {
    /// Budgets that leave nothing to run (a window of 0 tokens, a tree of 0 nodes, 0 steps) are
    /// refused by `rao validate`: they used to run and report success 0 without a word.
    pub fn check(&self, key: &str) -> Vec<rao_pipeline::ParamError> {
        let zero = |name: &str, what: &str| rao_pipeline::ParamError {
            key: Some(key.into()),
            message: format!("{key}.{name} is 0: {what}"),
            help: Some(format!("give `{name}` at least 1, or leave it out for its default")),
        };
        let mut out = Vec::new();
        if self.window == 0 {
            out.push(zero("window", "no node could read its goal"));
        }
        if self.max_nodes == 0 {
            out.push(zero("max_nodes", "no tree could have its root"));
        }
        for (name, value) in
            [("step_budget", self.step_budget), ("root_step_budget", self.root_step_budget), ("subtree_steps", self.subtree_steps)]
        {
            if value == Some(0) {
                out.push(zero(name, "a node could take no action"));
            }
        }
        out
    }

    pub fn limits(&self, mode: Mode) -> Limits {
        let base = match mode {
            Mode::Recursive => Limits::recursive(self.window),
            Mode::Flat => Limits::flat(self.window),
        };
        Limits {
            step_budget: self.step_budget.unwrap_or(base.step_budget),
            root_step_budget: if mode == Mode::Recursive { self.root_step_budget } else { None },
            max_depth: self.max_depth,
            max_children: self.max_children,
            max_nodes: self.max_nodes,
            subtree_steps: if mode == Mode::Recursive { self.subtree_steps } else { None },
            ..base
        }
    }
}

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
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
    #[serde(default = "crate::defaults::one_f64")]
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
    /// The endpoint of `policy: openai`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openai: Option<ChatEndpoint>,
    /// The servers of `policy: engine`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineEndpoints>,
    /// A language model's prefix cache, in MiB: the keys and values of the nodes' contexts kept
    /// between their actions, so an action prefills only what is new; past it the least recently
    /// used go. A token takes 2 × layers × key/value heads × head width × 4 bytes (≈ 224 KiB for
    /// Qwen3-0.6B, so 1,024 MiB hold about 4,700 tokens): size it to the nodes in flight.
    #[serde(default = "default_prefix_cache_mb")]
    pub prefix_cache_mb: usize,
}

pub fn default_prefix_cache_mb() -> usize {
    rao_policy::prefix_cache::DEFAULT_BUDGET_BYTES >> 20
}

impl RolloutParams {
    pub fn prefix_cache_bytes(&self) -> usize {
        self.prefix_cache_mb.saturating_mul(1 << 20)
    }
}

#[derive(Debug, Clone, Copy, Deserialize, serde::Serialize, JsonSchema)]
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

/// Where a stage's rollouts report the trees they finish: the stage's progress (trees done of
/// all it runs, the share solved so far), or nowhere.
pub struct TreeProgress<'a> {
    ctx: Option<&'a StageContext>,
    total: usize,
    done: AtomicUsize,
    solved: AtomicUsize,
}

impl<'a> TreeProgress<'a> {
    pub fn none() -> Self {
        TreeProgress { ctx: None, total: 0, done: AtomicUsize::new(0), solved: AtomicUsize::new(0) }
    }

    /// Progress of `ctx` over the `total` trees it runs (over one or several rollouts).
    pub fn of(ctx: &'a StageContext, total: usize) -> Self {
        ctx.progress(0, total as u64, "trees", "");
        TreeProgress { ctx: Some(ctx), total, done: AtomicUsize::new(0), solved: AtomicUsize::new(0) }
    }

    fn tree_done(&self, tree: TreeDone) {
        let Some(ctx) = self.ctx else { return };
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        let solved = self.solved.fetch_add(usize::from(tree.root_score >= 1.0), Ordering::Relaxed) + usize::from(tree.root_score >= 1.0);
        ctx.progress(done as u64, self.total as u64, "trees", format!("solved {:.0}%", 100.0 * solved as f64 / done as f64));
    }
}

/// Run `group` trees for each of `tasks` (indices into `set`) through one batcher; returns all nodes.
#[expect(clippy::too_many_arguments, reason = "the rollout's independent settings, used as such by every caller")]
pub async fn rollout_trees(
    set: &dyn TaskSet,
    tasks: &[usize],
    policy: Arc<dyn Policy>,
    mode: Mode,
    group: usize,
    limits: Limits,
    meta: RunMeta,
    seed: u64,
) -> Vec<Vec<NodeRecord>> {
    rollout_trees_reporting(set, tasks, policy, mode, group, limits, meta, seed, &TreeProgress::none()).await
}

/// `rollout_trees`, reporting each finished tree to `progress`.
#[expect(clippy::too_many_arguments, reason = "the rollout's independent settings, used as such by every caller")]
pub async fn rollout_trees_reporting(
    set: &dyn TaskSet,
    tasks: &[usize],
    policy: Arc<dyn Policy>,
    mode: Mode,
    group: usize,
    limits: Limits,
    meta: RunMeta,
    seed: u64,
    progress: &TreeProgress<'_>,
) -> Vec<Vec<NodeRecord>> {
    let specs = tree_specs(set, tasks.iter().copied().enumerate(), mode, group, seed);
    let mut trees = run_batch(policy, specs, limits, meta, progress).await;
    label_bands(set, &mut trees);
    trees
}

/// Write each task's report group (band, length, hop count) into its trees' nodes.
pub fn label_bands(set: &dyn TaskSet, trees: &mut [Vec<NodeRecord>]) {
    let band_of: std::collections::HashMap<&str, String> = (0..set.len()).map(|i| (set.id(i), set.label(i))).collect();
    for node in trees.iter_mut().flatten() {
        node.band = band_of.get(node.task_id.as_str()).cloned().unwrap_or_default();
    }
}

/// `group` trees per (position, task index); a tree's seed depends on its task's position, so
/// running a subset with the positions it has in the whole set gives the same trees' seeds.
pub fn tree_specs(set: &dyn TaskSet, tasks: impl Iterator<Item = (usize, usize)>, mode: Mode, group: usize, seed: u64) -> Vec<TreeSpec> {
    let mut trees = Vec::new();
    for (ti, t) in tasks {
        for g in 0..group {
            trees.push(TreeSpec {
                episode: set.episode(t),
                task_id: set.id(t).to_string(),
                group: g as i32,
                mode,
                seed: seed ^ ((ti as u64) << 20 | g as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            });
        }
    }
    trees
}

/// `policy: gold`: the trees of each task replay its gold trajectory, then finish (the policy is
/// the task's own, so each task runs in a batch of its own).
#[expect(clippy::too_many_arguments, reason = "the rollout's independent settings, used as such by every caller")]
pub async fn gold_trees(
    set: &dyn TaskSet,
    tasks: &[usize],
    mode: Mode,
    group: usize,
    limits: Limits,
    meta: RunMeta,
    seed: u64,
    progress: &TreeProgress<'_>,
) -> anyhow::Result<Vec<Vec<NodeRecord>>> {
    let without: Vec<&str> = tasks.iter().filter(|&&t| set.gold(t).is_none()).map(|&t| set.id(t)).collect();
    anyhow::ensure!(
        without.is_empty(),
        "`policy: gold` replays each task's gold trajectory, and {} task(s) have none: {}",
        without.len(),
        without.iter().take(10).copied().collect::<Vec<_>>().join(", ")
    );
    let mut trees = Vec::new();
    for (position, &t) in tasks.iter().enumerate() {
        let gold = set.gold(t).unwrap_or_default();
        // The k-th action of the node is the k-th gold action (each action ends with `<eos>`).
        let policy = Arc::new(ScriptedPolicy(move |ctx: &[rao_envs::Tok], _window: usize| {
            let done = ctx.iter().filter(|&&x| x == rao_envs::vocab::EOS).count();
            gold.get(done).or(gold.last()).cloned().unwrap_or_default()
        }));
        let specs = tree_specs(set, std::iter::once((position, t)), mode, group, seed);
        trees.extend(run_batch(policy, specs, limits, meta.clone(), progress).await);
    }
    label_bands(set, &mut trees);
    Ok(trees)
}

/// Run trees through one batcher of their own (its forward passes serve only these trees).
pub async fn run_batch(
    policy: Arc<dyn Policy>,
    trees: Vec<TreeSpec>,
    limits: Limits,
    meta: RunMeta,
    progress: &TreeProgress<'_>,
) -> Vec<Vec<NodeRecord>> {
    let limits = if policy.counts_own_window() { Limits { window: usize::MAX / 4, ..limits } } else { limits };
    let batcher = Batcher::start(policy);
    let out = run_trees_observed(&batcher, trees, limits, meta, &|t| progress.tree_done(t)).await;
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
        ("overflow_rate", nodes.iter().filter(|x| x.status == NodeStatus::ContextOverflow).count() as f64 / nn),
        ("tokens_per_tree", nodes.iter().map(|x| x.context_tokens as f64).sum::<f64>() / n),
        ("steps_per_tree", nodes.iter().map(|x| x.steps as f64).sum::<f64>() / n),
    ]
}

/// The numbers of a rollout worth a line: `root success 0.417 · node success 0.803 · 5.2 nodes/tree`.
pub fn headline(metrics: &[(&'static str, f64)]) -> String {
    let get = |k: &str| metrics.iter().find(|m| m.0 == k).map(|m| m.1).unwrap_or(f64::NAN);
    format!("root success {:.3} · node success {:.3} · {:.1} nodes/tree", get("root_success"), get("node_success"), get("nodes_per_tree"))
}

pub struct Rollout;

impl TypedStage for Rollout {
    fn check(p: &RolloutParams, inputs: &[&str]) -> Vec<rao_pipeline::ParamError> {
        let mut out = Vec::new();
        if let Some(Shard { index, count }) = p.shard
            && (count == 0 || index >= count)
        {
            out.push(rao_pipeline::ParamError {
                key: Some("shard".into()),
                message: format!("shard index {index} is not below its count {count}"),
                help: Some("shards are numbered 0 to count − 1, e.g. `matrix: {shard: [0, 1, 2, 3]}` with `count: 4`".into()),
            });
        }
        out.extend(needs_checkpoint(p.policy, inputs));
        out.extend(needs_endpoint(p.policy, p.openai.as_ref()));
        out.extend(needs_engine(p.policy, p.engine.as_ref()));
        out.extend(check_count("group_size", p.group_size, MAX_GROUP_SIZE));
        out.extend(p.limits.check("limits"));
        out
    }
    fn code() -> &'static str {
        crate::code::of("rollout")
    }
    fn machine_profile(p: &Self::Params) -> String {
        rao_policy::machine_profile(p.backend)
    }
    type Params = RolloutParams;
    const NAME: &'static str = crate::kinds::ROLLOUT;
    const VERSION: u32 = 4; // 2: fused projections in the model (new float rounding); 3: expert recovery; 4: fused CPU kernels
    const DESCRIBE: &'static str = "run G execution trees per task with a policy; writes the node table (Parquet)";
    const INPUTS: &'static [InputDecl] = &[
        InputDecl { name: "tasks", required: true },
        InputDecl { name: "checkpoint", required: false },
        // The base model's files, for a checkpoint of LoRA adapters (`hf_model` with `lora`).
        InputDecl { name: crate::neural::BASE_INPUT, required: false },
    ];
    const OUTPUTS: &'static [&'static str] = &["trees"];

    fn run(ctx: StageContext, p: RolloutParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            let set = envs::load(&ctx, "tasks").await?;
            let mut tasks = set.all();
            if let Some(Shard { index, count }) = p.shard {
                anyhow::ensure!(count > 0 && index < count, "shard index {index} is not below count {count}");
                tasks.retain(|i| i % count == index);
            }
            let meta = RunMeta { run: ctx.pipeline.clone(), iteration: p.iteration, env: set.env().into() };
            let progress = TreeProgress::of(&ctx, tasks.len() * p.group_size);
            let limits = p.limits.limits(p.mode);
            let trees = match p.policy {
                PolicyKind::Gold => gold_trees(set.as_ref(), &tasks, p.mode, p.group_size, limits, meta, ctx.seed, &progress).await?,
                _ => {
                    let policy = make_policy(&ctx, set.as_ref(), &p).await?;
                    let trees = rollout_trees_reporting(
                        set.as_ref(),
                        &tasks,
                        policy.clone(),
                        p.mode,
                        p.group_size,
                        limits,
                        meta,
                        ctx.seed,
                        &progress,
                    )
                    .await;
                    for (k, v) in policy.counters() {
                        ctx.set_metric(k, v);
                    }
                    if let Some(why) = policy.unusable() {
                        anyhow::bail!("policy: {why}");
                    }
                    trees
                }
            };
            let metrics = tree_metrics(&trees);
            ctx.note(headline(&metrics));
            for (k, v) in metrics {
                ctx.set_metric(k, v);
            }
            let nodes: Vec<NodeRecord> = trees.into_iter().flatten().collect();
            ctx.write_output("trees", TREES_FILE, &nodes_to_parquet(&nodes)?)?;
            Ok(())
        })
    }
}

/// The policy a rollout-like stage asked for.
pub async fn make_policy(ctx: &StageContext, set: &dyn TaskSet, p: &RolloutParams) -> anyhow::Result<Arc<dyn Policy>> {
    let limits = p.limits.limits(p.mode);
    Ok(match p.policy {
        PolicyKind::Expert => set.expert(ExpertSpec { delegate: p.expert.delegate, noise: p.expert.noise, seed: ctx.seed }, &limits),
        PolicyKind::Random => set.random_policy().ok_or_else(|| anyhow::anyhow!("environment `{}` has no random policy", set.env()))?,
        PolicyKind::Checkpoint => {
            anyhow::ensure!(ctx.inputs.contains_key("checkpoint"), "`policy: checkpoint` needs a `checkpoint` input");
            let model = crate::neural::load_model(ctx, "checkpoint", p.backend).await?;
            crate::neural::acting_policy(model, set, &limits, p.temperature, p.prefix_cache_bytes())?
        }
        PolicyKind::PacedExpert => {
            anyhow::ensure!(
                ctx.inputs.contains_key("checkpoint"),
                "`policy: paced_expert` needs a `checkpoint` input (the model whose compute paces it)"
            );
            let model = crate::neural::load_model(ctx, "checkpoint", p.backend).await?;
            let expert = set.expert(ExpertSpec { delegate: p.expert.delegate, noise: p.expert.noise, seed: ctx.seed }, &limits);
            match model.tokenizer {
                // A language model: the expert's turns in its tokens, at the text window.
                Some(tokenizer) => Arc::new(
                    crate::text_policy::TextPacedExpert::new(expert, Arc::new(model.policy), tokenizer, set.episode(0), limits.window)?
                        .with_prefix_cache(p.prefix_cache_bytes()),
                ),
                None => Arc::new(crate::neural::PacedExpert { expert, model: Arc::new(model.policy) }),
            }
        }
        PolicyKind::OpenAi => {
            let endpoint = p.openai.clone().ok_or_else(|| anyhow::anyhow!("`policy: openai` needs an `openai` block"))?;
            let api = Arc::new(ChatApi::new(endpoint, &ctx.base_dir)?);
            Arc::new(OpenAiPolicy::new(api, set.episode(0), p.temperature))
        }
        PolicyKind::Engine => {
            let endpoints = p.engine.clone().ok_or_else(|| anyhow::anyhow!("`policy: engine` needs an `engine` block"))?;
            anyhow::ensure!(
                ctx.inputs.contains_key("checkpoint"),
                "`policy: engine` needs a `checkpoint` input (the model the engine serves)"
            );
            let model = crate::neural::load_model(ctx, "checkpoint", p.backend).await?;
            let tokenizer = model.tokenizer.clone().ok_or_else(|| {
                anyhow::anyhow!(
                    "`policy: engine` serves a language model: the `checkpoint` input has no tokenizer (make it with `hf_model`)"
                )
            })?;
            let grammar = set.grammar(limits.max_children as usize);
            let mut endpoints = endpoints;
            if let Some(launch) = endpoints.launch.take() {
                let rank = model.policy.lora.as_ref().map(|l| l.rank);
                let t0 = std::time::Instant::now();
                endpoints.urls = crate::engine_launch::urls(&launch, &ctx.base_dir, &endpoints.model, rank).await?;
                // What this stage waited for servers to start (0 when an earlier stage started them).
                ctx.set_metric("engine_wait_s", t0.elapsed().as_secs_f64());
            }
            let engine =
                EnginePolicy::connect(endpoints, &model.policy, tokenizer, grammar.as_ref(), set.episode(0), p.temperature, limits.window)
                    .await?;
            ctx.note(format!("engine serves version {} as `{}`", model.policy.version, engine.served_model()));
            Arc::new(engine)
        }
        PolicyKind::Gold => anyhow::bail!("`policy: gold` replays each task's own trajectory (`gold_trees`), not one policy for all"),
    })
}
