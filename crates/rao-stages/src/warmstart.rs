//! `warmstart`: supervised next-token training on the scripted expert's demonstrations (a mix of
//! flat and recursive behaviour with noise) until the policy copies item names reliably: a gate
//! checks node success on held-out shallow tasks before RL may start.

use std::sync::Arc;

use futures::future::BoxFuture;
use rao_agent::RunMeta;
use rao_envs::rng::Rng;
use rao_pipeline::{InputDecl, StageContext, TypedStage};
use rao_policy::{Backend, Checkpoint, Loss, ModelConfig, Policy, Sequence};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::envs::{self, ExpertSpec, TaskSet};
use crate::neural::{NeuralPolicy, write_checkpoint};
use crate::rollout::{LimitParams, Mode, rollout_trees, tree_metrics};
use crate::training::node_sequence;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DemoParams {
    /// Recursive demonstration trees per task.
    #[serde(default = "two")]
    pub recursive_trees: usize,
    /// Flat demonstration trees per task.
    #[serde(default = "one")]
    pub flat_trees: usize,
    /// Probability that a recursive node delegates (the strategy the warm start imitates).
    #[serde(default = "half")]
    pub delegate: f64,
    /// Probability of a useless action at each step.
    #[serde(default = "tenth")]
    pub noise: f64,
    /// Rename at random (consistently within each sequence) every time a demonstration is used,
    /// so the policy learns to read and copy names rather than memorise them: items (TextCraft),
    /// speakers and spells (long documents), entities and relations (multi-hop).
    #[serde(default = "yes")]
    pub rename_items: bool,
    /// With `rename_items`: also move every name up by a random number of tiers (order kept), so
    /// the policy learns to copy tier tokens no demonstration reaches (held-out Hard targets).
    #[serde(default = "yes")]
    pub shift_tiers: bool,
}

impl Default for DemoParams {
    fn default() -> Self {
        DemoParams { recursive_trees: 2, flat_trees: 1, delegate: 0.5, noise: 0.1, rename_items: true, shift_tiers: true }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GateParams {
    /// Node success the policy must reach on held-out shallow tasks.
    #[serde(default = "gate")]
    pub min_node_success: f64,
    /// Fail the stage if the gate is not reached (else only record it).
    #[serde(default = "yes")]
    pub required: bool,
    /// When the gate is never reached, write the checkpoint of the gate check that scored best
    /// rather than the last one (held-out success can fall while the training loss still does).
    #[serde(default)]
    pub keep_best: bool,
}

impl Default for GateParams {
    fn default() -> Self {
        GateParams { min_node_success: 0.9, required: true, keep_best: false }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WarmstartParams {
    pub model: ModelConfig,
    #[serde(default)]
    pub backend: Backend,
    #[serde(default)]
    pub demos: DemoParams,
    #[serde(default)]
    pub limits: LimitParams,
    #[serde(default = "lr")]
    pub lr: f64,
    /// The learning rate decays linearly to `lr × lr_final` at `max_steps`.
    #[serde(default = "lr_final")]
    pub lr_final: f64,
    /// Sequences per step.
    #[serde(default = "batch")]
    pub batch: usize,
    #[serde(default = "max_steps")]
    pub max_steps: usize,
    /// Group sequences of similar length into batches (faster, but batches of only long or only
    /// short sequences train worse here: off by default).
    #[serde(default)]
    pub bucket_by_length: bool,
    /// Check the gate every this many steps (and stop once it passes).
    #[serde(default = "every")]
    pub eval_every: usize,
    #[serde(default)]
    pub gate: GateParams,
}

fn one() -> usize {
    1
}
fn two() -> usize {
    2
}
fn half() -> f64 {
    0.5
}
fn tenth() -> f64 {
    0.1
}
fn gate() -> f64 {
    0.9
}
fn yes() -> bool {
    true
}
fn lr() -> f64 {
    2e-3
}
fn lr_final() -> f64 {
    0.1
}
fn batch() -> usize {
    64
}
fn max_steps() -> usize {
    3000
}
fn every() -> usize {
    250
}

/// Recursive rollout of the learned policy on `tasks`: (node success, root success).
pub async fn gate_check(set: &dyn TaskSet, policy: Arc<Policy>, limits: &LimitParams, seed: u64) -> (f64, f64) {
    let neural = Arc::new(NeuralPolicy::new(policy, set.grammar(limits.max_children as usize), set.vocab(), 1.0));
    let all = set.all();
    let trees = rollout_trees(set, &all, neural, Mode::Recursive, 1, limits.limits(Mode::Recursive), RunMeta::default(), seed).await;
    let m: std::collections::BTreeMap<_, _> = tree_metrics(&trees).into_iter().collect();
    (m["node_success"], m["root_success"])
}

/// One epoch of minibatches: shuffled, then grouped with sequences of similar length (less
/// padding, same data), in shuffled batch order.
pub fn length_bucketed(seqs: &mut [Sequence], batch: usize, rng: &mut Rng) -> Vec<Vec<Sequence>> {
    rng.shuffle(seqs);
    let mut batches = Vec::new();
    for mega in seqs.chunks_mut(batch * 8) {
        mega.sort_by_key(|s| s.tokens.len());
        batches.extend(mega.chunks(batch).map(|c| c.to_vec()));
    }
    rng.shuffle(&mut batches);
    batches
}

pub struct Warmstart;

impl TypedStage for Warmstart {
    type Params = WarmstartParams;
    const NAME: &'static str = "warmstart";
    // 2: Burn-record checkpoints, noise actions name only items in context; 3: tier shifts;
    // 4: any environment (long-document and multi-hop demonstrations have their names permuted);
    // 5: fused projections in the model (same maths, new float rounding); 6: the expert
    // re-delegates what a refused craft reports missing; 7: fused CPU kernels (new float rounding)
    const VERSION: u32 = 7;
    const DESCRIBE: &'static str = "supervised warm start on noisy expert demonstrations, gated on held-out node success";
    const INPUTS: &'static [InputDecl] = &[InputDecl { name: "tasks", required: true }, InputDecl { name: "gate_tasks", required: true }];
    const OUTPUTS: &'static [&'static str] = &["checkpoint"];

    fn run(ctx: StageContext, p: WarmstartParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            let set = envs::load(&ctx, "tasks").await?;
            let gate_set = envs::load(&ctx, "gate_tasks").await?;
            anyhow::ensure!(set.env() == gate_set.env(), "`tasks` are {} tasks but `gate_tasks` are {}", set.env(), gate_set.env());
            let all = set.all();
            let spec = ExpertSpec { delegate: p.demos.delegate, noise: p.demos.noise, seed: ctx.seed };
            let expert = set.expert(spec, &p.limits.limits(Mode::Recursive));
            let mut seqs = Vec::new();
            for (mode, g) in [(Mode::Recursive, p.demos.recursive_trees), (Mode::Flat, p.demos.flat_trees)] {
                if g == 0 {
                    continue;
                }
                let trees =
                    rollout_trees(set.as_ref(), &all, expert.clone(), mode, g, p.limits.limits(mode), RunMeta::default(), ctx.seed).await;
                seqs.extend(trees.iter().flatten().map(|n| node_sequence(n, set.vocab(), 1.0)).filter(|s| s.generated.iter().any(|g| *g)));
            }
            anyhow::ensure!(!seqs.is_empty(), "the expert produced no demonstrations");
            ctx.set_metric("demo_sequences", seqs.len() as f64);
            let cfg = ModelConfig { vocab: set.vocab().len(), ..p.model.clone() };
            let mut policy = Policy::new(cfg, p.backend, ctx.seed)?;
            ctx.set_metric("params", policy.model.num_params() as f64);
            let grammar = set.grammar(p.limits.max_children as usize);
            let mut rng = Rng::new(ctx.seed ^ 0x5EED);
            #[allow(unused_assignments)]
            let (mut step, mut node_success, mut root_success, mut loss) = (0usize, 0.0, 0.0, f64::NAN);
            let log = ctx.scratch.join("warmstart.log");
            std::fs::create_dir_all(&ctx.scratch)?;
            let mut lines = String::new();
            // (node success, root success, step, checkpoint) of the best gate check so far.
            let mut best: Option<(f64, f64, usize, Checkpoint)> = None;
            'train: loop {
                let batches = if p.bucket_by_length {
                    length_bucketed(&mut seqs, p.batch.max(1), &mut rng)
                } else {
                    rng.shuffle(&mut seqs);
                    seqs.chunks(p.batch.max(1)).map(|c| c.to_vec()).collect()
                };
                for chunk in batches {
                    let batch: Vec<Sequence> = if p.demos.rename_items {
                        chunk.iter().map(|s| set.augment(s, p.demos.shift_tiers, &mut rng)).collect()
                    } else {
                        chunk
                    };
                    let frac = step as f64 / p.max_steps.max(1) as f64;
                    let lr = p.lr * (1.0 - frac * (1.0 - p.lr_final));
                    loss = policy.train_step(&batch, grammar.as_ref(), Loss::Supervised, lr, 1.0).loss;
                    step += 1;
                    if step % p.eval_every.max(1) == 0 || step >= p.max_steps {
                        let checkpoint = policy.checkpoint();
                        let snapshot = Arc::new(Policy::from_checkpoint(&checkpoint, p.backend)?);
                        (node_success, root_success) = gate_check(gate_set.as_ref(), snapshot, &p.limits, ctx.seed).await;
                        lines.push_str(&format!(
                            "step {step} loss {loss:.4} gate node_success {node_success:.3} root_success {root_success:.3}\n"
                        ));
                        std::fs::write(&log, &lines)?;
                        if p.gate.keep_best && best.as_ref().is_none_or(|b| node_success >= b.0) {
                            best = Some((node_success, root_success, step, checkpoint));
                        }
                        if node_success >= p.gate.min_node_success || step >= p.max_steps {
                            break 'train;
                        }
                    }
                }
            }
            let checkpoint = match best.filter(|b| b.2 != step) {
                Some((n, r, at, kept)) => {
                    lines.push_str(&format!("kept the checkpoint of step {at} (gate node_success {n:.3}, the best)\n"));
                    (node_success, root_success) = (n, r);
                    ctx.set_metric("kept_step", at as f64);
                    kept
                }
                None => policy.checkpoint(),
            };
            ctx.set_metric("steps", step as f64);
            ctx.set_metric("loss", loss);
            ctx.set_metric("gate_node_success", node_success);
            ctx.set_metric("gate_root_success", root_success);
            ctx.write_output("checkpoint", "warmstart.log", lines.as_bytes())?;
            if p.gate.required && node_success < p.gate.min_node_success {
                anyhow::bail!(
                    "warm start reached node success {node_success:.3} < gate {} after {step} steps: raise max_steps or the model size\n{lines}",
                    p.gate.min_node_success
                );
            }
            write_checkpoint(&ctx, "checkpoint", &checkpoint)
        })
    }
}
