//! Smoke test of the wgpu backend against the CPU (Flex) backend: the same initial parameters,
//! the same sequences, a few training steps on each; losses, gradient norms, recomputed log-probs
//! and greedy decodes must agree within tolerance. Run by `scripts/wgpu-check` (needs a build
//! with `--features wgpu` and a Vulkan/GL adapter, e.g. Mesa's lavapipe).

use std::time::Instant;

use rao_envs::textcraft::{self, SynthConfig, grammar::TextCraftGrammar};
use rao_policy::{Backend, Loss, ModelConfig, Policy, SampleRequest, Sequence};

const STEPS: usize = 4;
const TOLERANCE: f64 = 2e-3;

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
    if failures.is_empty() {
        println!("wgpu-check: OK — {STEPS} training steps match the CPU backend within {TOLERANCE} (relative)");
        Ok(())
    } else {
        anyhow::bail!("wgpu-check FAILED:\n  {}", failures.join("\n  "))
    }
}

fn bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
