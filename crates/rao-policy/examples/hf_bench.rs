//! Throughput of a Hugging Face checkpoint on one backend: generation with the KV cache (sampling
//! at temperature 1 over the whole vocabulary) at each batch size asked for, and update steps
//! (CISPO through `train_step`) of full fine-tuning and of LoRA. One JSON object per line on
//! stdout, so scripts/gpu-check and benches/scripts/hf_vs_transformers.sh can put them next to
//! PyTorch's (benches/scripts/hf_torch.py).
//!
//! Every measurement runs once untimed first (kernel compilation and autotuning happen there),
//! then timed; each timed call ends with results read back to the host, which waits for the
//! device. A measurement that fails prints an `error` line and the others still run.
//!
//! `--dtype bf16` (or f16) makes that the device's float type before the model loads, so weights,
//! activations, adapters and gradients are held in it (AdamW's state stays f32 on the host); the
//! CPU's fused kernels serve f32 only. `benches/vulkan` builds this same file with Vulkan adapters
//! compiled to SPIR-V rather than WGSL.
//!
//! ```text
//! hf_bench MODEL_DIR [--backend wgpu|cpu] [--dtype f32|bf16|f16] [--prompt 64] [--new 128] [--batches 1,64]
//!           [--train-batch 8] [--train-steps 3] [--greedy-batch 64] [--updates lora|full,lora|none]
//!           [--lora-rank 16]
//! ```

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::FloatDType;
use rao_envs::grammar::AnyToken;
use rao_envs::rng::Rng;
use rao_envs::vocab::Tok;
use rao_policy::lora::{LoraConfig, LoraTarget};
use rao_policy::{Backend, Loss, Policy, SampleRequest, Sequence, hf};
use serde_json::json;

struct Args {
    model: PathBuf,
    backend: Backend,
    dtype: FloatDType,
    prompt: usize,
    new_tokens: usize,
    batches: Vec<usize>,
    train_batch: usize,
    train_steps: usize,
    /// A batch size to also decode greedily (the host's sampling left out), or none.
    greedy_batch: Option<usize>,
    /// Which update steps to measure, in this order (full fine-tuning first: LoRA freezes the base).
    updates: Vec<Update>,
    lora_rank: usize,
}

#[derive(Clone, Copy, PartialEq)]
enum Update {
    Full,
    Lora,
}

const USAGE: &str = "usage: hf_bench MODEL_DIR [--backend wgpu|cpu] [--dtype f32|bf16|f16] [--prompt N] [--new N] [--batches N,N,..] [--train-batch N] [--train-steps N] [--greedy-batch N|none] [--updates full,lora|lora|none] [--lora-rank N]";

fn parse_args() -> anyhow::Result<Args> {
    let mut it = std::env::args().skip(1);
    let mut args = Args {
        model: PathBuf::new(),
        backend: Backend::Wgpu,
        dtype: FloatDType::F32,
        prompt: 64,
        new_tokens: 128,
        batches: vec![1, 64],
        train_batch: 8,
        train_steps: 3,
        greedy_batch: Some(64),
        updates: vec![Update::Lora],
        lora_rank: 16,
    };
    let mut model = None;
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| anyhow::anyhow!("{a} needs a value\n{USAGE}"));
        let number = |s: String| s.parse::<usize>().map_err(|_| anyhow::anyhow!("{a}: `{s}` is not a whole number\n{USAGE}"));
        match a.as_str() {
            "--backend" => {
                args.backend = match value()?.as_str() {
                    "wgpu" => Backend::Wgpu,
                    "cpu" => Backend::Cpu,
                    other => anyhow::bail!("--backend: `{other}` is neither wgpu nor cpu"),
                }
            }
            "--dtype" => {
                args.dtype = match value()?.as_str() {
                    "f32" => FloatDType::F32,
                    "bf16" => FloatDType::BF16,
                    "f16" => FloatDType::F16,
                    other => anyhow::bail!("--dtype: `{other}` is none of f32, bf16, f16"),
                }
            }
            "--prompt" => args.prompt = number(value()?)?,
            "--new" => args.new_tokens = number(value()?)?,
            "--batches" => {
                let v = value()?;
                args.batches =
                    if v == "none" { vec![] } else { v.split(',').map(|s| number(s.to_string())).collect::<anyhow::Result<_>>()? };
            }
            "--updates" => {
                let v = value()?;
                args.updates = if v == "none" { vec![] } else { v.split(',').map(update_kind).collect::<anyhow::Result<_>>()? };
                anyhow::ensure!(
                    !args.updates.windows(2).any(|w| w[0] == Update::Lora && w[1] == Update::Full),
                    "--updates: `full` must come before `lora` (adapters freeze the base for good)"
                );
            }
            "--lora-rank" => args.lora_rank = number(value()?)?,
            "--train-batch" => args.train_batch = number(value()?)?,
            "--train-steps" => args.train_steps = number(value()?)?,
            "--greedy-batch" => {
                let v = value()?;
                args.greedy_batch = if v == "none" { None } else { Some(number(v)?) };
            }
            _ if a.starts_with("--") => anyhow::bail!("unknown option {a}\n{USAGE}"),
            _ => model = Some(PathBuf::from(&a)),
        }
    }
    args.model = model.ok_or_else(|| anyhow::anyhow!("no model directory given\n{USAGE}"))?;
    anyhow::ensure!(args.prompt >= 1 && args.new_tokens >= 2, "--prompt must be ≥ 1 and --new ≥ 2");
    anyhow::ensure!(args.train_batch >= 1 && args.train_steps >= 1, "--train-batch and --train-steps must be ≥ 1");
    anyhow::ensure!(args.lora_rank >= 1, "--lora-rank must be ≥ 1");
    Ok(args)
}

fn update_kind(s: &str) -> anyhow::Result<Update> {
    match s {
        "full" => Ok(Update::Full),
        "lora" => Ok(Update::Lora),
        other => anyhow::bail!("--updates: `{other}` is neither full nor lora"),
    }
}

/// Prompts of random token ids (none of them a stop token, so no row ends before it starts).
fn prompts(batch: usize, len: usize, vocab: usize, stop: &[Tok], seed: u64) -> Vec<Vec<Tok>> {
    let mut rng = Rng::new(seed);
    (0..batch)
        .map(|_| {
            (0..len)
                .map(|_| {
                    loop {
                        let t = rng.below(vocab) as Tok;
                        if !stop.contains(&t) {
                            break t;
                        }
                    }
                })
                .collect()
        })
        .collect()
}

fn requests(prompts: &[Vec<Tok>], new_tokens: usize) -> Vec<SampleRequest> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| SampleRequest { context: p.clone(), max_new_tokens: new_tokens, seed: 1000 + i as u64, recursive: false })
        .collect()
}

fn emit(v: serde_json::Value) {
    println!("{v}");
}

/// Runs `f`, turning a panic (e.g. a device allocation refused) into an error line.
fn measure(name: &str, f: impl FnOnce() -> serde_json::Value) {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => emit(v),
        Err(e) => {
            let msg = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            emit(json!({ "measure": name, "error": msg.unwrap_or_else(|| "panicked".into()) }))
        }
    }
}

/// Generation: one untimed run of the same shape, then one timed.
fn generate(policy: &Policy, args: &Args, batch: usize, temperature: f64, backend: &str) -> serde_json::Value {
    let (vocab, stop) = (policy.cfg.vocab, &policy.stop_tokens);
    let grammar = AnyToken(vocab);
    let warm = requests(&prompts(batch, args.prompt, vocab, stop, 1), args.new_tokens);
    let t0 = Instant::now();
    policy.sample(&warm, &grammar, temperature);
    let warmup_s = t0.elapsed().as_secs_f64();
    let reqs = requests(&prompts(batch, args.prompt, vocab, stop, 2), args.new_tokens);
    let t0 = Instant::now();
    let out = policy.sample(&reqs, &grammar, temperature);
    let seconds = t0.elapsed().as_secs_f64();
    let tokens: usize = out.iter().map(|(t, _)| t.len()).sum();
    json!({
        "measure": if temperature > 0.0 { "generate" } else { "generate_greedy" },
        "backend": backend, "dtype": dtype_name(args.dtype), "batch": batch, "prompt": args.prompt, "new_tokens": args.new_tokens,
        "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens as f64 / seconds, "warmup_s": warmup_s,
    })
}

/// Training sequences: a prompt and a completion of random tokens, behaviour log-probs of a
/// uniform sampler (so importance ratios are near 1), advantages alternating ±1.
fn training_batch(args: &Args, vocab: usize, stop: &[Tok]) -> Vec<Sequence> {
    let toks = prompts(args.train_batch, args.prompt + args.new_tokens, vocab, stop, 3);
    let uniform = -(vocab as f32).ln();
    toks.iter()
        .enumerate()
        .map(|(i, t)| {
            let (context, completion) = t.split_at(args.prompt);
            let old = vec![uniform; completion.len()];
            Sequence::from_completion(context, completion, &old, if i % 2 == 0 { 1.0 } else { -1.0 }, false)
        })
        .collect()
}

/// Update steps of full fine-tuning, or of LoRA adapters (rank `--lora-rank`, alpha twice that,
/// on every projection) added first: one untimed, then `train_steps` timed. Also reports the size
/// of the checkpoint the policy writes afterwards (trained parameters + optimiser state).
fn update_step(policy: &mut Policy, args: &Args, update: Update, backend: &str) -> serde_json::Value {
    let t0 = Instant::now();
    if update == Update::Lora {
        let rank = args.lora_rank;
        policy
            .add_lora(LoraConfig { rank, alpha: 2.0 * rank as f64, targets: LoraTarget::ALL.to_vec(), dropout: 0.0 }, 5)
            .expect("LoRA settings are valid");
    }
    let add_lora_s = t0.elapsed().as_secs_f64();
    let seqs = training_batch(args, policy.cfg.vocab, &policy.stop_tokens);
    let grammar = AnyToken(policy.cfg.vocab);
    let loss = Loss::Cispo { lo: 0.0, hi: 5.0 };
    let t0 = Instant::now();
    let first = policy.train_step(&seqs, &grammar, loss, 1e-5, 1.0);
    let warmup_s = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let mut losses = vec![first.loss];
    let mut trained = 0;
    for _ in 0..args.train_steps {
        let m = policy.train_step(&seqs, &grammar, loss, 1e-5, 1.0);
        losses.push(m.loss);
        trained += m.tokens;
    }
    let seconds = t0.elapsed().as_secs_f64();
    // Positions the forward and backward passes run over (the last token is only a target).
    let positions = seqs.iter().map(|s| s.tokens.len() - 1).sum::<usize>() * args.train_steps;
    let checkpoint = policy.checkpoint();
    let trainable: usize = checkpoint.meta.param_sizes.iter().sum();
    json!({
        "measure": if update == Update::Lora { "lora_step" } else { "full_step" }, "backend": backend, "dtype": dtype_name(args.dtype),
        "batch": args.train_batch, "prompt": args.prompt, "new_tokens": args.new_tokens, "steps": args.train_steps,
        "trained_tokens": trained, "positions": positions, "seconds": seconds, "seconds_per_step": seconds / args.train_steps as f64,
        "tokens_per_s": trained as f64 / seconds, "positions_per_s": positions as f64 / seconds,
        "warmup_s": warmup_s, "add_lora_s": add_lora_s, "losses": losses, "lora_rank": (update == Update::Lora).then_some(args.lora_rank),
        "trainable_parameters": trainable, "checkpoint_param_bytes": checkpoint.params.len(), "checkpoint_optimizer_bytes": checkpoint.optim.len(),
    })
}

fn dtype_name(dtype: FloatDType) -> &'static str {
    match dtype {
        FloatDType::BF16 => "bf16",
        FloatDType::F16 => "f16",
        _ => "f32",
    }
}

/// Makes `--dtype` the float type of `--backend`'s device, before any tensor exists there: the
/// checkpoint then loads in it (tensor creation casts to the device's default).
fn set_float_type(args: &Args) -> anyhow::Result<()> {
    if args.dtype == FloatDType::F32 {
        return Ok(());
    }
    anyhow::ensure!(
        args.backend != Backend::Cpu || !rao_policy::kernels::enabled(),
        "--dtype {} on the CPU needs RAO_FUSED_KERNELS=0 (the fused kernels serve f32 only)",
        dtype_name(args.dtype)
    );
    rao_policy::policy::device(args.backend)?
        .configure(args.dtype)
        .map_err(|e| anyhow::anyhow!("--dtype {} on {:?}: {e}", dtype_name(args.dtype), args.backend))
}

#[allow(dead_code)] // benches/vulkan includes this file as a module and calls `run` itself.
fn main() -> anyhow::Result<()> {
    run("wgpu")
}

/// `wgpu_name`: what the records call the wgpu backend (which shader compiler the build has).
pub fn run(wgpu_name: &str) -> anyhow::Result<()> {
    rao_policy::tune_allocator();
    let args = parse_args()?;
    let t0 = Instant::now();
    set_float_type(&args)?;
    let pretrained = hf::load(&args.model, args.backend).map_err(|e| anyhow::anyhow!("loading {}: {e:#}", args.model.display()))?;
    let mut policy = pretrained.policy;
    let backend = match args.backend {
        Backend::Wgpu => wgpu_name,
        Backend::Cpu => "cpu",
    };
    emit(json!({
        "measure": "load", "backend": backend, "dtype": dtype_name(args.dtype), "family": pretrained.family.model_type(),
        "seconds": t0.elapsed().as_secs_f64(), "vocab": policy.cfg.vocab, "d_model": policy.cfg.d_model, "n_layers": policy.cfg.n_layers,
    }));
    for &batch in &args.batches {
        measure("generate", || generate(&policy, &args, batch, 1.0, backend));
    }
    if let Some(batch) = args.greedy_batch {
        measure("generate_greedy", || generate(&policy, &args, batch, 0.0, backend));
    }
    for &update in &args.updates {
        let name = if update == Update::Lora { "lora_step" } else { "full_step" };
        measure(name, || update_step(&mut policy, &args, update, backend));
    }
    Ok(())
}
