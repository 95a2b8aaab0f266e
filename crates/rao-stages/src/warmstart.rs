//! `warmstart`: supervised next-token training on the scripted expert's demonstrations (a mix of
//! flat and recursive behaviour with noise) — and, from an optional `demo_trees` input, on the
//! successful nodes of trees any policy made — until the policy copies item names reliably: a
//! gate checks node success on held-out shallow tasks before RL may start.

use std::sync::Arc;

use futures::future::BoxFuture;
use rao_agent::{Policy as RuntimePolicy, RunMeta};
use rao_envs::rng::Rng;
use rao_pipeline::{InputDecl, StageContext, TypedStage};
use rao_policy::hf::TextTokenizer;
use rao_policy::{Backend, Checkpoint, Loss, ModelConfig, Policy, Sequence};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::envs::{self, ExpertSpec, TaskSet};
use crate::neural::{LoadedModel, NeuralPolicy, load_model, write_checkpoint};
use crate::rollout::{LimitParams, Mode, rollout_trees, tree_metrics};
use crate::text_policy::{TextForm, TextPolicy, text_grammar};
use crate::training::{node_sequence, read_trees};

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DemoParams {
    /// Recursive demonstration trees per task.
    pub recursive_trees: usize,
    /// Flat demonstration trees per task.
    pub flat_trees: usize,
    /// Probability that a recursive node delegates (the strategy the warm start imitates).
    pub delegate: f64,
    /// Probability of a useless action at each step.
    pub noise: f64,
    /// Rename at random (consistently within each sequence) every time a demonstration is used,
    /// so the policy learns to read and copy names rather than memorise them: items (TextCraft;
    /// in worlds of the original's files within a tier and word count, tags and their members
    /// kept), speakers and spells (long documents), entities and relations (multi-hop).
    pub rename_items: bool,
    /// With `rename_items`: also move every name up by a random number of tiers (order kept), so
    /// the policy learns to copy tier tokens no demonstration reaches (held-out Hard targets).
    /// Synthetic worlds only: the original's tiers differ in size.
    pub shift_tiers: bool,
}

impl Default for DemoParams {
    fn default() -> Self {
        DemoParams { recursive_trees: 2, flat_trees: 1, delegate: 0.5, noise: 0.1, rename_items: true, shift_tiers: true }
    }
}

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GateParams {
    /// Node success the policy must reach on held-out shallow tasks.
    pub min_node_success: f64,
    /// Fail the stage if the gate is not reached (else only record it).
    pub required: bool,
    /// When the gate is never reached, write the checkpoint of the gate check that scored best
    /// rather than the last one (held-out success can fall while the training loss still does).
    pub keep_best: bool,
}

impl Default for GateParams {
    fn default() -> Self {
        GateParams { min_node_success: 0.9, required: true, keep_best: false }
    }
}

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WarmstartParams {
    /// A new model of this shape, trained from scratch in the environment's tokens; or leave it
    /// out and give a `checkpoint` input (e.g. `hf_model`'s) to warm-start that model — in text,
    /// for a language model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelConfig>,
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

/// What the warm start trains: the `checkpoint` input's model (in text for a language model),
/// or none (a new model is made), with the grammar its actions follow.
struct Start {
    policy: Option<Policy>,
    tokenizer: Option<Arc<TextTokenizer>>,
    grammar: Arc<dyn rao_envs::grammar::Grammar>,
    form: Option<TextForm>,
}

async fn start(ctx: &StageContext, set: &dyn TaskSet, p: &WarmstartParams) -> anyhow::Result<Start> {
    let (policy, tokenizer) = match ctx.inputs.contains_key("checkpoint") {
        true => {
            let LoadedModel { policy, tokenizer } = load_model(ctx, "checkpoint", p.backend).await?;
            (Some(policy), tokenizer)
        }
        false => (None, None),
    };
    let env_grammar = set.grammar(p.limits.max_children as usize);
    let (grammar, form): (Arc<dyn rao_envs::grammar::Grammar>, Option<TextForm>) = match (&policy, &tokenizer) {
        (Some(policy), Some(t)) => {
            let grammar = text_grammar(policy, t, env_grammar.as_ref())?;
            let form = TextForm::new(t.clone(), set.episode(0), grammar.stop())?;
            (Arc::new(grammar), Some(form))
        }
        _ => (env_grammar, None),
    };
    Ok(Start { policy, tokenizer, grammar, form })
}

/// A gate check at the current step: held-out node and root success into `st`, its line, the
/// curves and a note.
async fn check_gate(
    ctx: &StageContext,
    gate_set: &dyn TaskSet,
    policy: &Policy,
    tokenizer: Option<&Arc<TextTokenizer>>,
    p: &WarmstartParams,
    st: &mut LoopState,
) -> anyhow::Result<()> {
    (st.node_success, st.root_success) = gate_check(gate_set, Arc::new(policy.clone()), tokenizer, &p.limits, ctx.seed).await?;
    st.lines.push_str(&format!(
        "step {} loss {:.4} gate node_success {:.3} root_success {:.3}\n",
        st.step, st.loss, st.node_success, st.root_success
    ));
    ctx.record("gate_node_success", st.step as u64, st.node_success);
    ctx.record("gate_root_success", st.step as u64, st.root_success);
    let verdict = if st.node_success >= p.gate.min_node_success { "passed" } else { "not yet" };
    ctx.note(format!(
        "gate at step {}: node success {:.3} (gate {}: {verdict}), root success {:.3}, loss {:.4}",
        st.step, st.node_success, p.gate.min_node_success, st.root_success, st.loss
    ));
    Ok(())
}

/// The sequences the warm start imitates: the scripted expert's trees of every task (recursive
/// and flat, as many of each as `demos` says), and the successful nodes of `demo_trees` if given.
async fn demonstrations(ctx: &StageContext, set: &dyn TaskSet, p: &WarmstartParams) -> anyhow::Result<Vec<Sequence>> {
    let all = set.all();
    let spec = ExpertSpec { delegate: p.demos.delegate, noise: p.demos.noise, seed: ctx.seed };
    let expert = set.expert(spec, &p.limits.limits(Mode::Recursive));
    let mut seqs = Vec::new();
    for (mode, g) in [(Mode::Recursive, p.demos.recursive_trees), (Mode::Flat, p.demos.flat_trees)] {
        if g == 0 {
            continue;
        }
        let trees = rollout_trees(set, &all, expert.clone(), mode, g, p.limits.limits(mode), RunMeta::default(), ctx.seed).await;
        seqs.extend(trees.iter().flatten().map(|n| node_sequence(n, 1.0)).filter(|s| s.generated.iter().any(|g| *g)));
    }
    if ctx.inputs.contains_key("demo_trees") {
        let from_trees = demos_from_trees(set, &read_trees(ctx, "demo_trees").await?)?;
        ctx.set_metric("demo_sequences_from_trees", from_trees.len() as f64);
        seqs.extend(from_trees);
    }
    anyhow::ensure!(!seqs.is_empty(), "no demonstrations: the expert made none (trees 0) and `demo_trees` holds no successful node");
    ctx.set_metric("demo_sequences", seqs.len() as f64);
    Ok(seqs)
}

/// Demonstrations from trees any policy made (e.g. `policy: openai` evaluations): every node
/// that solved its own goal (score 1), as the sequence it acted — whatever happened to its root.
/// The trees must be of this environment, in its vocabulary.
pub fn demos_from_trees(set: &dyn TaskSet, nodes: &[rao_core::NodeRecord]) -> anyhow::Result<Vec<Sequence>> {
    let mut out = Vec::new();
    for n in nodes.iter().filter(|n| n.score >= 1.0) {
        anyhow::ensure!(
            n.env.is_empty() || n.env == set.env(),
            "`demo_trees` holds {} trees (task {}) but the tasks are {}",
            n.env,
            n.task_id,
            set.env()
        );
        anyhow::ensure!(
            n.token_space.is_empty(),
            "`demo_trees`: node {} of task {} holds a language model's tokens; demonstrations are read in the environment's tokens \
             (an `evaluate` or `rollout` of the expert, `policy: openai` or rao's own model)",
            n.node_id,
            n.task_id
        );
        let s = node_sequence(n, 1.0);
        if let Some(t) = s.tokens.iter().find(|&&t| t as usize >= set.vocab().len()) {
            anyhow::bail!("`demo_trees`: node {} of task {} has token {t}, outside this environment's vocabulary", n.node_id, n.task_id);
        }
        if s.generated.iter().any(|g| *g) {
            out.push(s);
        }
    }
    Ok(out)
}

/// Recursive rollout of the learned policy on `tasks` (in text through `tokenizer` for a
/// language model): (node success, root success).
pub async fn gate_check(
    set: &dyn TaskSet,
    policy: Arc<Policy>,
    tokenizer: Option<&Arc<TextTokenizer>>,
    limits: &LimitParams,
    seed: u64,
) -> anyhow::Result<(f64, f64)> {
    let grammar = set.grammar(limits.max_children as usize);
    let acting: Arc<dyn RuntimePolicy> = match tokenizer {
        Some(t) => Arc::new(TextPolicy::new(policy, t.clone(), grammar.as_ref(), set.episode(0), 1.0, limits.window)?),
        None => Arc::new(NeuralPolicy::new(policy, grammar, 1.0)),
    };
    let all = set.all();
    let trees = rollout_trees(set, &all, acting, Mode::Recursive, 1, limits.limits(Mode::Recursive), RunMeta::default(), seed).await;
    let m: std::collections::BTreeMap<_, _> = tree_metrics(&trees).into_iter().collect();
    Ok((m["node_success"], m["root_success"]))
}

/// One epoch of minibatches (as indices into the sequences): shuffled, then grouped with
/// sequences of similar length (less padding, same data), in shuffled batch order.
pub fn length_bucketed(order: &mut [usize], len: impl Fn(usize) -> usize, batch: usize, rng: &mut Rng) -> Vec<Vec<usize>> {
    rng.shuffle(order);
    let mut batches = Vec::new();
    for mega in order.chunks_mut(batch * 8) {
        mega.sort_by_key(|&i| len(i));
        batches.extend(mega.chunks(batch).map(|c| c.to_vec()));
    }
    rng.shuffle(&mut batches);
    batches
}

/// Everything the training loop carries from one epoch to the next: saved as the stage's
/// progress at epoch boundaries, so a killed warm start resumes where it was and ends with the
/// same bits as one that never stopped.
#[derive(serde::Serialize, serde::Deserialize)]
struct LoopState {
    step: usize,
    rng: u64,
    /// The sequences' order (each epoch reshuffles the previous one).
    order: Vec<usize>,
    node_success: f64,
    root_success: f64,
    loss: f64,
    lines: String,
    /// (node success, root success, step) of the best gate check kept so far.
    best: Option<(f64, f64, usize)>,
}

impl LoopState {
    /// Before the first step, over `n` sequences.
    fn fresh(seed: u64, n: usize) -> LoopState {
        LoopState {
            step: 0,
            rng: Rng::new(seed ^ 0x5EED).state(),
            order: (0..n).collect(),
            node_success: 0.0,
            root_success: 0.0,
            loss: f64::NAN,
            lines: String::new(),
            best: None,
        }
    }
}

const PROGRESS: &str = "warmstart.progress";

/// How often progress is saved (at the first epoch boundary after this many seconds;
/// `RAO_PROGRESS_EVERY_S` for tests).
fn progress_every() -> std::time::Duration {
    let secs = std::env::var("RAO_PROGRESS_EVERY_S").ok().and_then(|s| s.parse::<f64>().ok()).filter(|s| s.is_finite() && *s >= 0.0);
    std::time::Duration::from_secs_f64(secs.unwrap_or(30.0))
}

fn encode_progress(state: &LoopState, policy: &Checkpoint, best: Option<&Checkpoint>) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut part = |bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(bytes);
    };
    part(&serde_json::to_vec(state)?);
    for ck in std::iter::once(policy).chain(best) {
        part(&serde_json::to_vec(&ck.meta)?);
        part(&ck.params);
        part(&ck.optim);
    }
    Ok(out)
}

fn decode_progress(bytes: &[u8]) -> anyhow::Result<(LoopState, Checkpoint, Option<Checkpoint>)> {
    let mut parts = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        anyhow::ensure!(rest.len() >= 8, "truncated progress");
        let n = u64::from_le_bytes(rest[..8].try_into()?) as usize;
        anyhow::ensure!(rest.len() - 8 >= n, "truncated progress");
        parts.push(&rest[8..8 + n]);
        rest = &rest[8 + n..];
    }
    anyhow::ensure!(parts.len() == 4 || parts.len() == 7, "progress has {} parts", parts.len());
    let checkpoint = |p: &[&[u8]]| -> anyhow::Result<Checkpoint> {
        Ok(Checkpoint { meta: serde_json::from_slice(p[0])?, params: p[1].to_vec(), optim: p[2].to_vec() })
    };
    let state: LoopState = serde_json::from_slice(parts[0])?;
    let best = if parts.len() == 7 { Some(checkpoint(&parts[4..7])?) } else { None };
    Ok((state, checkpoint(&parts[1..4])?, best))
}

pub struct Warmstart;

impl TypedStage for Warmstart {
    fn code() -> &'static str {
        crate::code::of("warmstart")
    }
    fn machine_profile(p: &Self::Params) -> String {
        rao_policy::machine_profile(p.backend)
    }
    type Params = WarmstartParams;
    const NAME: &'static str = crate::kinds::WARMSTART;
    // 2: Burn-record checkpoints, noise actions name only items in context; 3: tier shifts;
    // 4: any environment (long-document and multi-hop demonstrations have their names permuted);
    // 5: fused projections in the model (same maths, new float rounding); 6: the expert
    // re-delegates what a refused craft reports missing; 7: fused CPU kernels (new float rounding)
    const VERSION: u32 = 7;
    const DESCRIBE: &'static str = "supervised warm start on noisy expert demonstrations, gated on held-out node success";
    const INPUTS: &'static [InputDecl] = &[
        InputDecl { name: "tasks", required: true },
        InputDecl { name: "gate_tasks", required: true },
        InputDecl { name: "demo_trees", required: false },
        // A model to warm-start instead of a new one (`hf_model`'s checkpoint: then in text).
        InputDecl { name: "checkpoint", required: false },
        InputDecl { name: crate::neural::BASE_INPUT, required: false },
    ];

    fn check(p: &WarmstartParams, inputs: &[&str]) -> Vec<rao_pipeline::ParamError> {
        let given = inputs.contains(&"checkpoint");
        let mut out = p.limits.check("limits");
        out.extend(match (&p.model, given) {
            (None, false) => vec![rao_pipeline::ParamError {
                key: Some("model".into()),
                message: "the warm start needs a model: a new one's shape (`model`) or a `checkpoint` input".into(),
                help: Some("add `model: {d_model: 64, n_layers: 2, n_heads: 4, d_ff: 192}`, or `checkpoint: STAGE.checkpoint` under `inputs` (e.g. an `hf_model` stage's)".into()),
            }],
            (Some(_), true) => vec![rao_pipeline::ParamError {
                key: Some("model".into()),
                message: "`model` shapes a new model, but a `checkpoint` input is given to start from".into(),
                help: Some("remove `model` to warm-start the checkpoint, or the `checkpoint` input to start a new model".into()),
            }],
            _ => vec![],
        });
        out
    }
    const OUTPUTS: &'static [&'static str] = &["checkpoint"];

    // The training loop shares the policy, its state and the best checkpoint with the resume
    // before it and the gate's verdict after it; what stands alone is a function below
    // (demonstrations, the starting model, a gate check).
    fn run(ctx: StageContext, p: WarmstartParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            let set = envs::load(&ctx, "tasks").await?;
            let gate_set = envs::load(&ctx, "gate_tasks").await?;
            anyhow::ensure!(set.env() == gate_set.env(), "`tasks` are {} tasks but `gate_tasks` are {}", set.env(), gate_set.env());
            let seqs = demonstrations(&ctx, set.as_ref(), &p).await?;
            let Start { policy: start, tokenizer, grammar, form } = start(&ctx, set.as_ref(), &p).await?;
            // A checkpoint back as a policy (progress saved by an earlier attempt).
            let restore = |ck: &Checkpoint| -> anyhow::Result<Policy> {
                match (&start, &ck.meta.lora) {
                    (Some(base), Some(_)) => {
                        let mut policy = base.clone();
                        policy.load_adapters(ck)?;
                        Ok(policy)
                    }
                    _ => Policy::from_checkpoint(ck, p.backend),
                }
            };
            let log = ctx.scratch.join("warmstart.log");
            std::fs::create_dir_all(&ctx.scratch)?;
            let resumed = match ctx.load_progress(PROGRESS).await? {
                Some(bytes) => match decode_progress(&bytes) {
                    Ok(saved) if saved.0.order.len() == seqs.len() => Some(saved),
                    _ => None,
                },
                None => None,
            };
            let (mut policy, mut st, mut best) = match resumed {
                Some((state, ck, best_ck)) => {
                    let policy = restore(&ck)?;
                    let best = state.best.zip(best_ck).map(|((n, r, at), ck)| (n, r, at, ck));
                    ctx.set_metric("resumed_at_step", state.step as f64);
                    (policy, state, best)
                }
                None => {
                    let policy = match &start {
                        Some(policy) => policy.clone(),
                        None => {
                            let model = p.model.clone().ok_or_else(|| anyhow::anyhow!("`model` or a `checkpoint` input is needed"))?;
                            Policy::new(ModelConfig { vocab: set.vocab().len(), ..model }, p.backend, ctx.seed)?
                        }
                    };
                    (policy, LoopState::fresh(ctx.seed, seqs.len()), None)
                }
            };
            ctx.set_metric("params", policy.model.num_params() as f64);
            let mut rng = Rng::from_state(st.rng);
            let mut last_save = std::time::Instant::now();
            let max_steps = p.max_steps as u64;
            ctx.progress(
                st.step as u64,
                max_steps,
                "steps",
                if st.step > 0 { format!("resumed at step {}", st.step) } else { String::new() },
            );
            'train: loop {
                // An epoch boundary: everything the rest of training depends on is in `st`,
                // `rng`, the policy and `best`.
                if st.step > 0 && last_save.elapsed() >= progress_every() {
                    st.rng = rng.state();
                    st.best = best.as_ref().map(|b| (b.0, b.1, b.2));
                    let bytes = encode_progress(&st, &policy.checkpoint(), best.as_ref().map(|b| &b.3))?;
                    ctx.save_progress(PROGRESS, &bytes).await?;
                    last_save = std::time::Instant::now();
                }
                let batches = if p.bucket_by_length {
                    length_bucketed(&mut st.order, |i| seqs[i].tokens.len(), p.batch.max(1), &mut rng)
                } else {
                    rng.shuffle(&mut st.order);
                    st.order.chunks(p.batch.max(1)).map(|c| c.to_vec()).collect()
                };
                for chunk in batches {
                    let batch: Vec<Sequence> = if p.demos.rename_items {
                        chunk.iter().map(|&i| set.augment(&seqs[i], p.demos.shift_tiers, &mut rng)).collect()
                    } else {
                        chunk.iter().map(|&i| seqs[i].clone()).collect()
                    };
                    // A language model learns the demonstrations as its rollouts would feed them.
                    let batch = match &form {
                        Some(form) => batch.iter().map(|s| form.sequence(s)).collect::<anyhow::Result<Vec<_>>>()?,
                        None => batch,
                    };
                    let frac = st.step as f64 / p.max_steps.max(1) as f64;
                    let lr = p.lr * (1.0 - frac * (1.0 - p.lr_final));
                    st.loss = policy.train_step(&batch, grammar.as_ref(), Loss::Supervised, lr, 1.0).loss;
                    st.step += 1;
                    // The loss curve at up to 200 points, for the report and the trackers.
                    if st.step % (p.max_steps / 200).max(1) == 0 {
                        ctx.record("loss", st.step as u64, st.loss);
                    }
                    let gate_now = st.step % p.eval_every.max(1) == 0 || st.step >= p.max_steps;
                    let checking = if gate_now { " · checking the gate" } else { "" };
                    ctx.progress(st.step as u64, max_steps, "steps", format!("loss {:.4}{checking}", st.loss));
                    ctx.cancellation_point().await?;
                    if gate_now {
                        let checkpoint = policy.checkpoint();
                        check_gate(&ctx, gate_set.as_ref(), &policy, tokenizer.as_ref(), &p, &mut st).await?;
                        std::fs::write(&log, &st.lines)?;
                        if p.gate.keep_best && best.as_ref().is_none_or(|b| st.node_success >= b.0) {
                            best = Some((st.node_success, st.root_success, st.step, checkpoint));
                        }
                        if st.node_success >= p.gate.min_node_success || st.step >= p.max_steps {
                            break 'train;
                        }
                    }
                }
            }
            let LoopState { step, mut node_success, mut root_success, loss, mut lines, .. } = st;
            let checkpoint = match best.filter(|b| b.2 != step) {
                Some((n, r, at, kept)) => {
                    lines.push_str(&format!("kept the checkpoint of step {at} (gate node_success {n:.3}, the best)\n"));
                    ctx.note(format!("kept the checkpoint of step {at} (gate node success {n:.3}, the best)"));
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
            write_checkpoint(&ctx, "checkpoint", &checkpoint, tokenizer.as_deref())
        })
    }
}
