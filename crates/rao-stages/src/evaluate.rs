//! `evaluate`: success on held-out tasks of every band (or other report group of the task's
//! environment: tier range, document length, hop count), for the recursive agent and a flat
//! baseline, with confidence intervals, tree shape, cost and wall-clock; metrics and trees to
//! Parquet (`rao report` draws the run's page from them).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use rao_agent::RunMeta;
use rao_core::parquet_io::{Column, table_to_parquet};
use rao_core::{NodeRecord, NodeStatus};
use rao_pipeline::{InputDecl, StageContext, TypedStage};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::chat_api::ChatEndpoint;
use crate::engine_policy::EngineEndpoints;
use crate::envs;
use crate::rollout::{
    ExpertParams, LimitParams, Mode, PolicyKind, RolloutParams, TreeProgress, gold_trees, label_bands, make_policy,
    rollout_trees_reporting, run_batch, tree_specs,
};
use crate::training::write_trees;
use crate::update::HISTORY_FILE;

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvaluateParams {
    #[serde(default = "checkpoint")]
    pub policy: PolicyKind,
    /// Modes to evaluate the policy in.
    #[serde(default = "modes")]
    pub modes: Vec<Mode>,
    #[serde(default)]
    pub limits: LimitParams,
    /// Sampling temperature (0 = greedy).
    #[serde(default = "crate::defaults::one_f64")]
    pub temperature: f64,
    /// Attempts per task.
    #[serde(default = "crate::defaults::one_usize")]
    pub group_size: usize,
    #[serde(default)]
    pub backend: rao_policy::Backend,
    /// A label for this evaluation in reports (e.g. `recursive` or `flat-baseline`).
    #[serde(default)]
    pub label: Option<String>,
    /// Run one task's trees at a time, so `s/task` is each task's latency alone rather than
    /// its share of a batch of all tasks (slower to run; same seeds).
    #[serde(default)]
    pub latency: bool,
    /// The endpoint of `policy: openai`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openai: Option<ChatEndpoint>,
    /// The servers of `policy: engine`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineEndpoints>,
    /// A language model's prefix cache, in MiB (as `rollout`'s).
    #[serde(default = "crate::rollout::default_prefix_cache_mb")]
    pub prefix_cache_mb: usize,
}

fn checkpoint() -> PolicyKind {
    PolicyKind::Checkpoint
}
fn modes() -> Vec<Mode> {
    vec![Mode::Recursive, Mode::Flat]
}

/// One row of the evaluation table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalRow {
    pub label: String,
    pub mode: Mode,
    pub band: String,
    pub tasks: usize,
    pub success: f64,
    /// Mean root score (equal to `success` where scores are 0 or 1; partial credit otherwise,
    /// e.g. 0.75^|error| for counts).
    #[serde(default)]
    pub mean_score: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    pub mean_depth: f64,
    pub mean_nodes: f64,
    pub steps_per_task: f64,
    pub tokens_per_task: f64,
    pub overflow_rate: f64,
    pub seconds_per_task: f64,
}

/// 95% Wilson score interval.
pub fn wilson(successes: usize, n: usize) -> (f64, f64) {
    if n == 0 {
        return (0.0, 0.0);
    }
    let (p, n, z) = (successes as f64 / n as f64, n as f64, 1.96f64);
    let denom = 1.0 + z * z / n;
    let centre = (p + z * z / (2.0 * n)) / denom;
    let half = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt() / denom;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

pub fn summarize(label: &str, mode: Mode, band: &str, trees: &[&Vec<NodeRecord>]) -> EvalRow {
    let n = trees.len();
    let ok = trees.iter().filter(|t| t[0].score >= 1.0).count();
    let (lo, hi) = wilson(ok, n);
    let nf = n.max(1) as f64;
    let sum = |f: &dyn Fn(&Vec<NodeRecord>) -> f64| trees.iter().map(|t| f(t)).sum::<f64>() / nf;
    EvalRow {
        label: label.into(),
        mode,
        band: band.into(),
        tasks: n,
        success: ok as f64 / nf,
        mean_score: sum(&|t| t[0].score),
        ci_low: lo,
        ci_high: hi,
        mean_depth: sum(&|t| t.iter().map(|x| x.depth).max().unwrap_or(0) as f64),
        mean_nodes: sum(&|t| t.len() as f64),
        steps_per_task: sum(&|t| t.iter().map(|x| x.steps as f64).sum()),
        tokens_per_task: sum(&|t| t.iter().map(|x| x.context_tokens as f64).sum()),
        overflow_rate: sum(&|t| t.iter().filter(|x| x.status == NodeStatus::ContextOverflow).count() as f64 / t.len() as f64),
        seconds_per_task: sum(&|t| {
            let start = t.iter().map(|x| x.started_ms).fold(f64::MAX, f64::min);
            let end = t.iter().map(|x| x.finished_ms).fold(f64::MIN, f64::max);
            (end - start) / 1000.0
        }),
    }
}

pub struct Evaluate;

impl TypedStage for Evaluate {
    fn check(p: &EvaluateParams, inputs: &[&str]) -> Vec<rao_pipeline::ParamError> {
        let no_modes = p.modes.is_empty().then(|| rao_pipeline::ParamError {
            key: Some("modes".into()),
            message: "modes is empty: nothing would be evaluated".into(),
            help: Some("give `modes: [recursive]`, `[flat]` or both (the default)".into()),
        });
        crate::rollout::needs_checkpoint(p.policy, inputs)
            .into_iter()
            .chain(crate::rollout::needs_endpoint(p.policy, p.openai.as_ref()))
            .chain(crate::rollout::needs_engine(p.policy, p.engine.as_ref()))
            .chain(no_modes)
            .chain(crate::rollout::check_count("group_size", p.group_size, crate::rollout::MAX_GROUP_SIZE))
            .chain(p.limits.check("limits"))
            .collect()
    }
    fn code() -> &'static str {
        crate::code::of("evaluate")
    }
    fn machine_profile(p: &Self::Params) -> String {
        rao_policy::machine_profile(p.backend)
    }
    type Params = EvaluateParams;
    const NAME: &'static str = crate::kinds::EVALUATE;
    // 2: mean root score column; any environment; 3: fused projections; 4: expert recovery; 5: fused CPU kernels;
    // 6: trees with mode, band, run and env; 7: no HTML page of its own (`rao report` draws one per run)
    const VERSION: u32 = 7;
    const DESCRIBE: &'static str = "held-out success per band (with 95% CI), tree shape, cost and wall-clock; trees and metrics as Parquet";
    const INPUTS: &'static [InputDecl] = &[
        InputDecl { name: "tasks", required: true },
        InputDecl { name: "checkpoint", required: false },
        // The base model's files, for a checkpoint of LoRA adapters (`hf_model` with `lora`).
        InputDecl { name: crate::neural::BASE_INPUT, required: false },
    ];
    const OUTPUTS: &'static [&'static str] = &["report"];

    fn run(ctx: StageContext, p: EvaluateParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            let set = envs::load(&ctx, "tasks").await?;
            let all = set.all();
            let group_of: BTreeMap<&str, String> = (0..set.len()).map(|i| (set.id(i), set.label(i))).collect();
            let label = p.label.clone().unwrap_or_else(|| ctx.pipeline.clone());
            let rp = RolloutParams {
                policy: p.policy,
                mode: Mode::Recursive,
                group_size: p.group_size,
                limits: p.limits.clone(),
                expert: ExpertParams::default(),
                temperature: p.temperature,
                backend: p.backend,
                iteration: 0,
                shard: None,
                openai: p.openai.clone(),
                engine: p.engine.clone(),
                prefix_cache_mb: p.prefix_cache_mb,
            };
            // `policy: gold` replays each task's own trajectory: no one policy for all tasks.
            let policy = if p.policy == PolicyKind::Gold { None } else { Some(make_policy(&ctx, set.as_ref(), &rp).await?) };
            let meta = RunMeta { run: ctx.pipeline.clone(), iteration: 0, env: set.env().into() };
            let mut rows = Vec::new();
            let mut all_nodes = Vec::new();
            let progress = TreeProgress::of(&ctx, p.modes.len() * all.len() * p.group_size);
            for &mode in &p.modes {
                let mode_name = mode.as_str();
                let limits = p.limits.limits(mode);
                let trees = match policy.clone() {
                    None => gold_trees(set.as_ref(), &all, mode, p.group_size, limits, meta.clone(), ctx.seed, &progress).await?,
                    Some(policy) if p.latency => {
                        // One task's trees at a time, each with the seeds it has in the whole set.
                        let mut trees = Vec::new();
                        for (position, &t) in all.iter().enumerate() {
                            let specs = tree_specs(set.as_ref(), std::iter::once((position, t)), mode, p.group_size, ctx.seed);
                            trees.extend(run_batch(policy.clone(), specs, limits, meta.clone(), &progress).await);
                        }
                        label_bands(set.as_ref(), &mut trees);
                        trees
                    }
                    Some(policy) => {
                        rollout_trees_reporting(set.as_ref(), &all, policy, mode, p.group_size, limits, meta.clone(), ctx.seed, &progress)
                            .await
                    }
                };
                let first = rows.len();
                for group in set.label_order() {
                    let mine: Vec<&Vec<NodeRecord>> =
                        trees.iter().filter(|t| group_of.get(t[0].task_id.as_str()) == Some(&group)).collect();
                    if mine.is_empty() {
                        continue;
                    }
                    let row = summarize(&label, mode, &group, &mine);
                    ctx.set_metric(&format!("{mode_name}_{group}_success"), row.success);
                    rows.push(row);
                }
                let by_group: Vec<String> = rows[first..].iter().map(|r| format!("{} {:.2}", r.band, r.success)).collect();
                ctx.note(format!("{mode_name}: success {}", by_group.join(", ")));
                all_nodes.extend(trees.into_iter().flatten());
            }
            let history: Vec<BTreeMap<String, f64>> = match ctx.inputs.get("checkpoint").and_then(|v| v.first()) {
                Some(a) => match ctx.read_input_file(a, HISTORY_FILE).await {
                    Ok(b) => serde_json::from_slice(&b)?,
                    Err(_) => vec![],
                },
                None => vec![],
            };
            for (k, v) in policy.iter().flat_map(|p| p.counters()) {
                ctx.set_metric(k, v);
            }
            if let Some(why) = policy.as_ref().and_then(|p| p.unusable()) {
                anyhow::bail!("policy: {why}");
            }
            write_trees(&ctx, "report", &all_nodes)?;
            ctx.write_output("report", "metrics.parquet", &rows_to_parquet(&rows)?)?;
            ctx.write_output("report", "summary.json", serde_json::to_string_pretty(&rows)?.as_bytes())?;
            ctx.write_output("report", "history.json", serde_json::to_string_pretty(&history)?.as_bytes())?;
            Ok(())
        })
    }
}

fn rows_to_parquet(rows: &[EvalRow]) -> anyhow::Result<bytes::Bytes> {
    let s = |f: &dyn Fn(&EvalRow) -> String| Column::Str(rows.iter().map(f).collect());
    let f = |f: &dyn Fn(&EvalRow) -> f64| Column::F64(rows.iter().map(f).collect());
    Ok(table_to_parquet(vec![
        ("label", s(&|r| r.label.clone())),
        ("mode", s(&|r| r.mode.to_string())),
        ("band", s(&|r| r.band.clone())),
        ("tasks", Column::I64(rows.iter().map(|r| r.tasks as i64).collect())),
        ("success", f(&|r| r.success)),
        ("mean_score", f(&|r| r.mean_score)),
        ("ci_low", f(&|r| r.ci_low)),
        ("ci_high", f(&|r| r.ci_high)),
        ("mean_depth", f(&|r| r.mean_depth)),
        ("mean_nodes", f(&|r| r.mean_nodes)),
        ("steps_per_task", f(&|r| r.steps_per_task)),
        ("tokens_per_task", f(&|r| r.tokens_per_task)),
        ("overflow_rate", f(&|r| r.overflow_rate)),
        ("seconds_per_task", f(&|r| r.seconds_per_task)),
    ])?)
}
