//! Smoke test of the wgpu backend against the CPU (Flex) backend: the same initial parameters,
//! the same sequences, a few training steps on each; losses, gradient norms, recomputed log-probs
//! and greedy decodes must agree within tolerance. Given a Hugging Face checkpoint directory
//! (`wgpu_check [HF_DIR]`), the same for that model: logits of a padded batch, then LoRA
//! training steps. Run by `scripts/wgpu-check` (needs a build with `--features wgpu` and a
//! Vulkan/GL adapter, e.g. Mesa's lavapipe), which makes a tiny random Qwen3 with transformers.

use std::time::Instant;

use std::path::Path;

use rao_envs::grammar::AnyToken;
use rao_envs::textcraft::{self, SynthConfig, grammar::TextCraftGrammar};
use rao_envs::vocab::Tok;
use rao_policy::lora::{LoraConfig, LoraTarget};
use rao_policy::{Backend, Loss, ModelConfig, Policy, SampleRequest, Sequence, hf};

const STEPS: usize = 4;
const TOLERANCE: f64 = 2e-3;
/// Largest difference of the Hugging Face model's logits between the backends (f32 on both).
const LOGIT_TOLERANCE: f32 = 1e-3;

struct Trace {
    losses: Vec<f64>,
    grad_norms: Vec<f64>,
    logprobs: Vec<f32>,
    greedy: Vec<Vec<u32>>,
    final_params: Vec<u8>,
}

fn requests(world: &textcraft::World) -> Vec<SampleRequest> {
    let v = &world.vocab;
    world
        .items
        .iter()
        .filter(|i| !i.is_base())
        .take(4)
        .enumerate()
        .map(|(k, it)| {
            let mut ctx = vec![v.id("<bos>"), v.id("<rec>"), v.id("@0")];
            ctx.extend(&it.tokens);
            for _ in 0..k {
                ctx.extend(v.ids("info"));
                ctx.extend(&it.tokens);
                ctx.extend(v.ids("<eos> <obs> ok"));
            }
            SampleRequest { context: ctx, max_new_tokens: 10, seed: 40 + k as u64, recursive: true }
        })
        .collect()
}

fn sequences(reqs: &[SampleRequest], outs: &[(Vec<u32>, Vec<f32>)]) -> Vec<Sequence> {
    let advantage = |k: usize| if k.is_multiple_of(2) { 1.0 } else { -0.6 };
    reqs.iter()
        .zip(outs)
        .enumerate()
        .map(|(k, (r, (toks, lps)))| Sequence::from_completion(&r.context, toks, lps, advantage(k), true))
        .collect()
}

fn trace(
    backend: Backend,
    cfg: &ModelConfig,
    grammar: &TextCraftGrammar,
    reqs: &[SampleRequest],
    seqs: &[Sequence],
) -> anyhow::Result<Trace> {
    let mut policy = Policy::new(cfg.clone(), backend, 7)?;
    let t0 = Instant::now();
    let logprobs = policy.sequence_logprobs(seqs, grammar, 1.0).concat();
    println!("  {backend:?}: log-probs of {} tokens in {:.1}s", logprobs.len(), t0.elapsed().as_secs_f64());
    let t0 = Instant::now();
    let greedy = policy.sample(reqs, grammar, 0.0).into_iter().map(|(t, _)| t).collect();
    println!("  {backend:?}: greedy decode of {} rows in {:.1}s", reqs.len(), t0.elapsed().as_secs_f64());
    let (mut losses, mut grad_norms) = (vec![], vec![]);
    for step in 0..STEPS {
        let t0 = Instant::now();
        let loss = if step == STEPS - 1 { Loss::Supervised } else { Loss::Cispo { lo: 0.0, hi: 5.0 } };
        let m = policy.train_step(seqs, grammar, loss, 1e-3, 1.0);
        println!("  {backend:?}: step {step} loss {:.6} grad-norm {:.6} in {:.1}s", m.loss, m.grad_norm, t0.elapsed().as_secs_f64());
        losses.push(m.loss);
        grad_norms.push(m.grad_norm);
    }
    Ok(Trace { losses, grad_norms, logprobs, greedy, final_params: policy.checkpoint().params })
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= TOLERANCE * a.abs().max(b.abs()).max(1.0)
}

fn main() -> anyhow::Result<()> {
    let hf_dir = std::env::args().nth(1);
    let mut failures = own_model()?;
    if let Some(dir) = &hf_dir {
        failures.extend(hf_model(Path::new(dir))?);
    }
    if failures.is_empty() {
        let hf = if hf_dir.is_some() { " and on the Hugging Face model" } else { "" };
        println!("wgpu-check: OK — {STEPS} training steps match the CPU backend within {TOLERANCE} (relative){hf}");
        Ok(())
    } else {
        anyhow::bail!("wgpu-check FAILED:\n  {}", failures.join("\n  "))
    }
}

/// rao's own model over the TextCraft vocabulary, full fine-tuning.
fn own_model() -> anyhow::Result<Vec<String>> {
    let world = textcraft::generate(&SynthConfig::small(), 1);
    let grammar = TextCraftGrammar::new(&world, 4);
    let cfg = ModelConfig {
        vocab: world.vocab.len(),
        d_model: 32,
        n_layers: 2,
        n_heads: 4,
        d_ff: 64,
        rope_theta: 10_000.0,
        prev_token: false,
        ..ModelConfig::tiny()
    };
    let reqs = requests(&world);
    let outs = Policy::new(cfg.clone(), Backend::Cpu, 7)?.sample(&reqs, &grammar, 1.0);
    let seqs = sequences(&reqs, &outs);

    println!("CPU (Flex):");
    let cpu = trace(Backend::Cpu, &cfg, &grammar, &reqs, &seqs)?;
    println!("wgpu:");
    let gpu = trace(Backend::Wgpu, &cfg, &grammar, &reqs, &seqs)?;

    let mut failures = vec![];
    for (i, (a, b)) in cpu.losses.iter().zip(&gpu.losses).enumerate() {
        if !close(*a, *b) {
            failures.push(format!("step {i} loss: cpu {a} vs wgpu {b}"));
        }
    }
    for (i, (a, b)) in cpu.grad_norms.iter().zip(&gpu.grad_norms).enumerate() {
        if !close(*a, *b) {
            failures.push(format!("step {i} grad norm: cpu {a} vs wgpu {b}"));
        }
    }
    let worst_lp = cpu.logprobs.iter().zip(&gpu.logprobs).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    if worst_lp > 1e-3 {
        failures.push(format!("log-probs differ by up to {worst_lp}"));
    }
    if cpu.greedy != gpu.greedy {
        failures.push(format!("greedy decodes differ: cpu {:?} vs wgpu {:?}", cpu.greedy, gpu.greedy));
    }
    let (pa, pb) = (bytes(&cpu.final_params), bytes(&gpu.final_params));
    let worst_param = pa.iter().zip(&pb).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    if worst_param > 1e-3 {
        failures.push(format!("parameters after {STEPS} steps differ by up to {worst_param}"));
    }
    println!("max |log-prob diff| {worst_lp:.2e}; max |param diff| after {STEPS} steps {worst_param:.2e}");
    Ok(failures)
}

/// What one backend computes on a Hugging Face checkpoint: logits of a padded batch, then LoRA
/// (rank 4, every projection) training steps, then the logits again.
struct HfTrace {
    logits: Vec<Vec<Vec<f32>>>,
    losses: Vec<f64>,
    grad_norms: Vec<f64>,
    trained_logits: Vec<Vec<Vec<f32>>>,
}

fn hf_trace(dir: &Path, backend: Backend, prompts: &[Vec<Tok>], seqs: &[Sequence]) -> anyhow::Result<HfTrace> {
    let mut policy = hf::load(dir, backend)?.policy;
    let t0 = Instant::now();
    let logits = policy.logits(prompts);
    println!("  {backend:?}: logits of {} prompts in {:.1}s", prompts.len(), t0.elapsed().as_secs_f64());
    policy.add_lora(LoraConfig { rank: 4, alpha: 8.0, targets: LoraTarget::ALL.to_vec(), dropout: 0.0 }, 11)?;
    let grammar = AnyToken(policy.cfg.vocab);
    let (mut losses, mut grad_norms) = (vec![], vec![]);
    for step in 0..STEPS {
        let t0 = Instant::now();
        let m = policy.train_step(seqs, &grammar, Loss::Cispo { lo: 0.0, hi: 5.0 }, 1e-3, 1.0);
        println!("  {backend:?}: LoRA step {step} loss {:.6} grad-norm {:.6} in {:.1}s", m.loss, m.grad_norm, t0.elapsed().as_secs_f64());
        losses.push(m.loss);
        grad_norms.push(m.grad_norm);
    }
    let trained_logits = policy.logits(prompts);
    Ok(HfTrace { logits, losses, grad_norms, trained_logits })
}

fn max_logit_difference(a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>]) -> f32 {
    let flat = |x: &[Vec<Vec<f32>>]| x.iter().flatten().flatten().copied().collect::<Vec<f32>>();
    flat(a).iter().zip(flat(b)).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// A Hugging Face checkpoint on both backends: logits before and after LoRA training, and the
/// training steps' losses and gradient norms, agree.
fn hf_model(dir: &Path) -> anyhow::Result<Vec<String>> {
    let vocab = hf::read_config(dir)?.model.vocab;
    // Prompts of different lengths (the batch is right-padded), ids spread over the vocabulary.
    let prompts: Vec<Vec<Tok>> =
        [5usize, 12, 9].iter().enumerate().map(|(i, &n)| (0..n).map(|j| ((i * 131 + j * 37 + 3) % vocab) as Tok).collect()).collect();
    let advantage = [1.0, -0.5, 0.8];
    let completions: Vec<Vec<Tok>> = prompts.iter().map(|p| p.iter().map(|t| (t * 7 + 1) % vocab as Tok).take(6).collect()).collect();
    let as_seqs = |old: &[Vec<f32>]| -> Vec<Sequence> {
        prompts
            .iter()
            .zip(&completions)
            .zip(old)
            .zip(advantage)
            .map(|(((p, c), o), a)| Sequence::from_completion(p, c, o, a, false))
            .collect()
    };
    // Behaviour log-probs: the base model's own (CPU), so the first step's ratios are 1.
    let placeholder: Vec<Vec<f32>> = completions.iter().map(|c| vec![0.0; c.len()]).collect();
    let base = hf::load(dir, Backend::Cpu)?.policy;
    let seqs = as_seqs(&base.sequence_logprobs(&as_seqs(&placeholder), &AnyToken(vocab), 1.0));
    println!("Hugging Face model {}, CPU (Flex):", dir.display());
    let cpu = hf_trace(dir, Backend::Cpu, &prompts, &seqs)?;
    println!("Hugging Face model, wgpu:");
    let gpu = hf_trace(dir, Backend::Wgpu, &prompts, &seqs)?;
    let mut failures = vec![];
    let before = max_logit_difference(&cpu.logits, &gpu.logits);
    let after = max_logit_difference(&cpu.trained_logits, &gpu.trained_logits);
    for (what, diff) in [("logits".to_string(), before), (format!("logits after {STEPS} LoRA steps"), after)] {
        if diff > LOGIT_TOLERANCE {
            failures.push(format!("Hugging Face model: {what} differ by up to {diff} (tolerance {LOGIT_TOLERANCE})"));
        }
    }
    for (i, ((a, b), (c, d))) in cpu.losses.iter().zip(&gpu.losses).zip(cpu.grad_norms.iter().zip(&gpu.grad_norms)).enumerate() {
        if !close(*a, *b) || !close(*c, *d) {
            failures.push(format!("Hugging Face model, LoRA step {i}: loss cpu {a} vs wgpu {b}, grad norm cpu {c} vs wgpu {d}"));
        }
    }
    println!("Hugging Face model: max |logit diff| {before:.2e} before and {after:.2e} after {STEPS} LoRA steps");
    Ok(failures)
}

fn bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
