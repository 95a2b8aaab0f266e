//! `update`: one RL step on the policy — loads checkpoint k, writes checkpoint k+1 and the
//! training metrics of the iteration.

use futures::future::BoxFuture;
use rao_envs::rng::Rng;
use rao_pipeline::{InputDecl, ParamError, StageContext, TypedStage, Upstream};
use rao_policy::{Backend, Loss};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::envs;
use crate::neural::{LoadedModel, load_model, training_grammar, write_checkpoint};
use crate::rollout::{Rollout, tree_metrics};
use crate::text_policy::token_space;
use crate::training::{node_sequence, read_trees, retry_rate};

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateParams {
    /// CISPO (reference: lo 0, hi 5), REINFORCE or PPO-clip.
    #[serde(default = "default_loss")]
    pub loss: Loss,
    #[serde(default = "default_lr")]
    pub lr: f64,
    /// Gradient steps over the batch (1 = RAO's one step per batch).
    #[serde(default = "crate::defaults::one_usize")]
    pub steps: usize,
    /// Sequences per gradient step (0 = all).
    #[serde(default)]
    pub minibatch: usize,
    #[serde(default = "temp")]
    pub temperature: f64,
    #[serde(default = "default_clip")]
    pub grad_clip: f64,
    #[serde(default)]
    pub backend: Backend,
    /// Cap on children per spawn the grammar allows (as in rollout).
    #[serde(default = "children")]
    pub max_children: usize,
    /// What a negative advantage weighs against a positive one (1 = RAO's symmetric update; 0
    /// learns from better-than-baseline nodes only). Pushing a failed node's tokens down spreads
    /// their probability over everything the grammar allows next; where that is a thousand item
    /// names, copying a name from an observation is what gets lost.
    #[serde(default = "crate::defaults::one_f64")]
    pub negative_weight: f64,
    /// How the loss averages the batch's tokens: `tokens` (RAO's: every generated token weighs
    /// the same, so a long node weighs more than a short one) or `sequences` (each node's tokens
    /// are averaged first, so every node weighs the same whatever its length).
    #[serde(default)]
    pub loss_mean: LossMean,
    /// The AdamW state the first RL update starts from: `carry` (the warm start's moments and
    /// step count, as the checkpoint holds them) or `fresh` (dropped when the checkpoint has no RL
    /// update behind it; later updates carry their own).
    #[serde(default)]
    pub optimizer: OptimizerStart,
    /// How the learning rate moves over the RL updates (counted from the checkpoint's history):
    /// `{kind: constant}` (RAO's), or `{kind: linear | cosine, updates: N, final_fraction: F}`,
    /// from `lr` down to `lr × F` over the first N updates, then held there.
    #[serde(default)]
    pub lr_schedule: LrSchedule,
}

/// The learning rate as a function of how many RL updates came before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LrSchedule {
    #[default]
    Constant,
    Linear {
        updates: usize,
        #[serde(default)]
        final_fraction: f64,
    },
    Cosine {
        updates: usize,
        #[serde(default)]
        final_fraction: f64,
    },
}

impl LrSchedule {
    /// The learning rate of the update that has `done` RL updates behind it.
    pub fn lr(self, lr: f64, done: usize) -> f64 {
        let (updates, last, cosine) = match self {
            LrSchedule::Constant => return lr,
            LrSchedule::Linear { updates, final_fraction } => (updates, final_fraction, false),
            LrSchedule::Cosine { updates, final_fraction } => (updates, final_fraction, true),
        };
        let t = done.min(updates) as f64 / updates.max(1) as f64;
        let left = if cosine { 0.5 * (1.0 + (std::f64::consts::PI * t).cos()) } else { 1.0 - t };
        lr * (last + (1.0 - last) * left)
    }

    fn problems(self) -> Option<String> {
        match self {
            LrSchedule::Constant => None,
            LrSchedule::Linear { updates, final_fraction } | LrSchedule::Cosine { updates, final_fraction } => {
                if updates == 0 {
                    Some("lr_schedule.updates is 0: give how many updates the decay takes, e.g. the loop's max_iterations".into())
                } else if !(0.0..=1.0).contains(&final_fraction) {
                    Some(format!("lr_schedule.final_fraction is {final_fraction}: the share of lr left at the end, from 0 to 1"))
                } else {
                    None
                }
            }
        }
    }
}

/// Where the first RL update's optimiser state comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerStart {
    #[default]
    Carry,
    Fresh,
}

/// What one unit of the loss's average is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LossMean {
    #[default]
    Tokens,
    Sequences,
}

fn generated_len(s: &rao_policy::Sequence) -> usize {
    s.generated.iter().filter(|g| **g).count()
}

/// The advantage of an average generated token of the batch (0 for none).
fn advantage_per_token(seqs: &[rao_policy::Sequence]) -> f64 {
    let tokens: usize = seqs.iter().map(generated_len).sum();
    let sum: f64 = seqs.iter().map(|s| s.advantage as f64 * generated_len(s) as f64).sum();
    if tokens == 0 { 0.0 } else { sum / tokens as f64 }
}

/// Rescales each sequence's advantage so that the token mean the loss takes becomes a mean over
/// sequences of each one's token mean: a sequence of `n` generated tokens is scaled by
/// `mean length / n`.
fn average_per_sequence(seqs: &mut [rao_policy::Sequence]) {
    let total: usize = seqs.iter().map(generated_len).sum();
    let mean = total as f64 / seqs.len().max(1) as f64;
    for s in seqs.iter_mut() {
        let n = generated_len(s);
        if n > 0 {
            s.advantage = (s.advantage as f64 * mean / n as f64) as f32;
        }
    }
}

/// A node's advantage as the update weighs it.
fn weigh(advantage: f64, negative_weight: f64) -> f32 {
    (if advantage < 0.0 { advantage * negative_weight } else { advantage }) as f32
}

fn default_loss() -> Loss {
    Loss::Cispo { lo: 0.0, hi: 5.0 }
}
fn default_lr() -> f64 {
    5e-4
}
fn temp() -> f64 {
    1.0
}
fn default_clip() -> f64 {
    1.0
}
fn children() -> usize {
    8
}

/// Per-iteration training metrics, carried from checkpoint to checkpoint.
pub const HISTORY_FILE: &str = "history.json";

pub struct Update;

impl TypedStage for Update {
    fn code() -> &'static str {
        crate::code::of("update")
    }
    fn machine_profile(p: &Self::Params) -> String {
        rao_policy::machine_profile(p.backend)
    }
    type Params = UpdateParams;
    const NAME: &'static str = crate::kinds::UPDATE;
    const VERSION: u32 = 4; // 2: Burn-record checkpoints; 3: fused projections (new float rounding); 4: fused CPU kernels
    const DESCRIBE: &'static str = "policy-gradient step (CISPO / REINFORCE / PPO-clip) on weighted trees; checkpoint k → k+1";
    const INPUTS: &'static [InputDecl] = &[
        InputDecl { name: "checkpoint", required: true },
        InputDecl { name: "trees", required: true },
        InputDecl { name: "tasks", required: true },
        // The base model's files, for a checkpoint of LoRA adapters (`hf_model` with `lora`).
        InputDecl { name: crate::neural::BASE_INPUT, required: false },
    ];
    const OUTPUTS: &'static [&'static str] = &["checkpoint"];

    fn check(p: &UpdateParams, _inputs: &[&str]) -> Vec<ParamError> {
        let mut out = Vec::new();
        if !(p.negative_weight.is_finite() && p.negative_weight >= 0.0) {
            out.push(ParamError {
                key: Some("negative_weight".into()),
                message: format!("negative_weight is {}: it scales negative advantages, so 0 or more", p.negative_weight),
                help: Some("1 is RAO's update; 0 learns from better-than-baseline nodes only".into()),
            });
        }
        if let Some(message) = p.lr_schedule.problems() {
            out.push(ParamError { key: Some("lr_schedule".into()), message, help: None });
        }
        out
    }

    /// The update scores each token under the grammar the rollout sampled it from; another cap
    /// on children would change which tokens are allowed and so every log-prob ratio.
    fn check_upstream(p: &UpdateParams, upstream: &dyn Fn() -> Vec<Upstream>) -> Vec<ParamError> {
        let ups = upstream();
        let Some(rollout) = ups.iter().find(|u| u.kind == Rollout::NAME) else { return Vec::new() };
        match rollout.params.pointer("/limits/max_children").and_then(serde_json::Value::as_u64) {
            Some(n) if n != p.max_children as u64 => vec![ParamError {
                key: Some("max_children".into()),
                message: format!(
                    "max_children is {} but rollout `{}` samples with limits.max_children {n}: the update would score its tokens under another grammar",
                    p.max_children, rollout.stage
                ),
                help: Some("give both the same value, e.g. `max_children: ${params.limits.max_children}` here and `limits: ${params.limits}` in the rollout".into()),
            }],
            _ => Vec::new(),
        }
    }

    fn run(ctx: StageContext, p: UpdateParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            let set = envs::load(&ctx, "tasks").await?;
            let model = load_model(&ctx, "checkpoint", p.backend).await?;
            let grammar = training_grammar(&model, set.as_ref(), p.max_children)?;
            let LoadedModel { mut policy, tokenizer } = model;
            policy.optim.clip_norm = p.grad_clip;
            // The learning curve travels with the checkpoint: previous iterations plus this one.
            let prev = ctx.input("checkpoint")?[0].clone();
            let mut history: Vec<std::collections::BTreeMap<String, f64>> = match ctx.read_input_file(&prev, HISTORY_FILE).await {
                Ok(b) => serde_json::from_slice(&b)?,
                Err(_) => Vec::new(),
            };
            if p.optimizer == OptimizerStart::Fresh && history.is_empty() {
                policy.optim = rao_policy::params::AdamW::new(p.grad_clip, policy.optim.weight_decay);
            }
            let nodes = read_trees(&ctx, "trees").await?;
            // Ids are only comparable in the token space the checkpoint acts in.
            let space = tokenizer.as_deref().map(token_space).unwrap_or_default();
            if let Some(n) = nodes.iter().find(|n| n.token_space != space) {
                let name = |s: &str| if s.is_empty() { "the environment's tokens".to_string() } else { format!("`{s}`") };
                anyhow::bail!(
                    "the trees hold ids in {} (task {}, node {}) but the checkpoint acts in {}: train a checkpoint on trees of its own rollouts",
                    name(&n.token_space),
                    n.task_id,
                    n.node_id,
                    name(&space)
                );
            }
            let lr = p.lr_schedule.lr(p.lr, history.len());
            ctx.set_metric("lr", lr);
            let mut seqs: Vec<_> = nodes
                .iter()
                .filter_map(|n| n.advantage.filter(|a| a.is_finite()).map(|a| node_sequence(n, weigh(a, p.negative_weight))))
                .filter(|s| s.generated.iter().any(|g| *g))
                .collect();
            // Advantages sum to about zero over nodes; over tokens they need not (failed nodes run
            // longer): what the loss pushes on average, before any averaging per sequence.
            ctx.set_metric("advantage_per_token", advantage_per_token(&seqs));
            if p.loss_mean == LossMean::Sequences {
                average_per_sequence(&mut seqs);
            }
            // Trees regrouped for the iteration's metrics.
            let mut trees: std::collections::BTreeMap<rao_core::TreeKey, Vec<rao_core::NodeRecord>> = Default::default();
            for n in &nodes {
                trees.entry(n.tree_key()).or_default().push(n.clone());
            }
            let trees: Vec<Vec<rao_core::NodeRecord>> = trees
                .into_values()
                .map(|mut t| {
                    t.sort_by_key(|n| n.node_id);
                    t
                })
                .collect();
            for (k, v) in tree_metrics(&trees) {
                ctx.set_metric(k, v);
            }
            ctx.set_metric("retry_rate", retry_rate(&nodes));
            ctx.set_metric("sequences", seqs.len() as f64);
            if seqs.is_empty() {
                // Every group was dropped (no signal): the policy carries over unchanged.
                ctx.set_metric("skipped", 1.0);
            } else {
                let mut rng = Rng::new(ctx.seed);
                let mb = if p.minibatch == 0 { seqs.len() } else { p.minibatch };
                let mut last: rao_policy::StepMetrics = Default::default();
                let total = (p.steps * seqs.len().div_ceil(mb)) as u64;
                let mut done = 0;
                ctx.progress(0, total, "steps", "");
                for _ in 0..p.steps {
                    rng.shuffle(&mut seqs);
                    for chunk in seqs.chunks(mb) {
                        last = policy.train_step(chunk, grammar.as_ref(), p.loss, lr, p.temperature);
                        done += 1;
                        ctx.progress(done, total, "steps", format!("loss {:.4}", last.loss));
                        ctx.cancellation_point().await?;
                    }
                }
                let m: rao_policy::StepMetrics = last;
                ctx.set_metric("loss", m.loss);
                ctx.set_metric("mean_abs_ratio_minus_1", m.mean_abs_ratio_minus_1);
                ctx.set_metric("clip_fraction", m.clip_fraction);
                ctx.set_metric("grad_norm", m.grad_norm);
                ctx.set_metric("tokens", m.tokens as f64);
            }
            policy.version += 1;
            ctx.set_metric("policy_version", policy.version as f64);
            let mut row = ctx.metrics_snapshot();
            let r: Vec<f64> = nodes.iter().filter(|n| n.parent_id.is_none()).filter_map(|n| n.local_reward).collect();
            row.insert("mean_root_reward".into(), r.iter().sum::<f64>() / r.len().max(1) as f64);
            history.push(row);
            ctx.write_output("checkpoint", HISTORY_FILE, serde_json::to_string_pretty(&history)?.as_bytes())?;
            write_checkpoint(&ctx, "checkpoint", &policy.checkpoint(), tokenizer.as_deref())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{LrSchedule, advantage_per_token, average_per_sequence, weigh};
    use rao_policy::Sequence;

    fn seq(prompt: usize, generated: usize, advantage: f32) -> Sequence {
        let completion = vec![1; generated];
        Sequence::from_completion(&vec![1; prompt], &completion, &vec![0.0; generated], advantage, false)
    }

    #[test]
    fn averaging_per_sequence_weighs_every_node_alike_whatever_its_length() {
        // A short success and a long failure: their advantages cancel per node, not per token.
        let mut seqs = vec![seq(5, 2, 1.0), seq(3, 6, -1.0), seq(4, 4, 0.5)];
        // Per token: (1·2 − 1·6 + 0.5·4) / 12 tokens.
        assert!((advantage_per_token(&seqs) + 1.0 / 6.0).abs() < 1e-6, "{}", advantage_per_token(&seqs));
        average_per_sequence(&mut seqs);
        let per_node = (1.0 - 1.0 + 0.5) / 3.0;
        assert!((advantage_per_token(&seqs) - per_node).abs() < 1e-6, "{}", advantage_per_token(&seqs));
        // Signs are kept and the mean length is unchanged, so the loss's scale stays comparable.
        assert!(seqs[0].advantage > 1.0 && seqs[1].advantage < 0.0 && seqs[1].advantage > -1.0);
    }

    #[test]
    fn only_negative_advantages_are_weighed() {
        assert_eq!(weigh(0.5, 0.25), 0.5);
        assert_eq!(weigh(-0.5, 0.25), -0.125);
        assert_eq!(weigh(-0.5, 1.0), -0.5);
        assert_eq!(weigh(-0.5, 0.0), 0.0);
        assert_eq!(weigh(0.0, 0.0), 0.0);
    }

    #[test]
    fn a_schedule_decays_from_lr_to_its_final_fraction_and_holds_there() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(LrSchedule::Constant.lr(5e-4, 1_000), 5e-4));
        let cosine = LrSchedule::Cosine { updates: 200, final_fraction: 0.1 };
        let linear = LrSchedule::Linear { updates: 200, final_fraction: 0.1 };
        for s in [cosine, linear] {
            assert!(close(s.lr(1e-3, 0), 1e-3));
            assert!(close(s.lr(1e-3, 100), 0.55e-3), "half way: {}", s.lr(1e-3, 100));
            assert!(close(s.lr(1e-3, 200), 1e-4) && close(s.lr(1e-3, 5_000), 1e-4));
        }
        // The cosine stays near lr early and falls fastest in the middle.
        assert!(cosine.lr(1e-3, 20) > linear.lr(1e-3, 20));
        assert!(LrSchedule::Linear { updates: 0, final_fraction: 0.0 }.problems().is_some());
        assert!(LrSchedule::Cosine { updates: 10, final_fraction: 1.5 }.problems().is_some());
    }
}
