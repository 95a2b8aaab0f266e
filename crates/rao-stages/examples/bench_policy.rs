//! Policy speed on this CPU: batched generation (1 vs 64 live nodes) and the update step, with
//! the FLOP rate reached as a fraction of a measured matmul peak.
//! Run: cargo run --example bench_policy -p rao-stages [-- D_MODEL LAYERS]

use std::time::Instant;

use burn::tensor::{Tensor, TensorData};
use rao_envs::textcraft::{self, SynthConfig, grammar::TextCraftGrammar};
use rao_envs::vocab::Tok;
use rao_policy::{Backend, Loss, ModelConfig, Policy, SampleRequest, Sequence};

fn main() {
    rao_policy::tune_allocator();
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let d = args.first().copied().unwrap_or(64);
    let layers = args.get(1).copied().unwrap_or(2);
    let world = textcraft::generate(&SynthConfig::small(), 1);
    let grammar = TextCraftGrammar::new(&world, 8);
    let cfg = ModelConfig {
        vocab: world.vocab.len(),
        d_model: d,
        n_layers: layers,
        n_heads: 4,
        d_ff: 3 * d,
        rope_theta: 10_000.0,
        prev_token: false,
        ..ModelConfig::tiny()
    };
    let mut policy = Policy::new(cfg.clone(), Backend::Cpu, 1).unwrap();
    println!("model: d={d} layers={layers} params={} vocab={}", policy.model.num_params(), cfg.vocab);
    let v = &world.vocab;
    let item = world.items.iter().find(|i| i.tier == 3).unwrap();
    let prompt: Vec<Tok> = [vec![v.id("<bos>"), v.id("<rec>"), v.id("@0")], item.tokens.clone()].concat();

    // Generation: every row makes exactly 16 tokens then `<eos>` (an untrained model's own actions
    // have random lengths, which would measure the lengths, not the sampler).
    struct Fixed(Vec<Tok>);
    impl rao_envs::grammar::Grammar for Fixed {
        fn allowed(&self, _: bool, _: &[Tok], prefix: &[Tok]) -> Vec<Tok> {
            if prefix.len() >= 16 { vec![rao_envs::vocab::EOS] } else { self.0.clone() }
        }
    }
    let fixed = Fixed((4..world.vocab.len() as Tok).collect());
    let mut base = 0.0;
    for batch in [1usize, 64] {
        let reqs: Vec<SampleRequest> =
            (0..batch).map(|i| SampleRequest { context: prompt.clone(), max_new_tokens: 40, seed: i as u64, recursive: true }).collect();
        let (mut toks, t0) = (0usize, Instant::now());
        let mut reps = 0;
        while t0.elapsed().as_secs_f64() < 2.0 {
            toks += policy.sample(&reqs, &fixed, 1.0).iter().map(|(t, _)| t.len()).sum::<usize>();
            reps += 1;
        }
        let tps = toks as f64 / t0.elapsed().as_secs_f64();
        if batch == 1 {
            base = tps;
        }
        println!("generate  batch {batch:>3}: {tps:>9.0} tokens/s ({reps} calls; {:.1}× batch 1)", tps / base);
    }

    // Update step: 64 sequences of 64 tokens, half generated.
    let seqs: Vec<Sequence> = (0..64)
        .map(|i| {
            let mut tokens = prompt.clone();
            while tokens.len() < 64 {
                tokens.extend(&item.tokens);
            }
            tokens.truncate(64);
            let generated: Vec<bool> = (0..64).map(|j| j >= 32).collect();
            Sequence { tokens, generated, old_logprobs: vec![-1.0; 64], advantage: if i % 2 == 0 { 1.0 } else { -1.0 }, recursive: true }
        })
        .collect();
    let loss = Loss::Cispo { lo: 0.0, hi: 5.0 };
    let tokens = 64.0 * 63.0;
    // Forward ≈ 2·params·tokens + attention 4·L·T²·d per sequence; backward ≈ 2× forward.
    let flops = 3.0 * (2.0 * policy.model.num_params() as f64 * tokens + 4.0 * layers as f64 * 64.0 * 63.0 * 63.0 * d as f64);
    // The same step through Burn's decomposed ops first, then through rao's fused kernels.
    let mut per_step = 0.0;
    for fused in [false, true] {
        rao_policy::kernels::set_enabled(fused);
        for _ in 0..2 {
            policy.train_step(&seqs, &grammar, loss, 1e-4, 1.0); // warm-up
        }
        // Median of single-step times: robust to the machine's speed drifting during the run.
        let mut times: Vec<f64> = (0..15)
            .map(|_| {
                let t0 = Instant::now();
                policy.train_step(&seqs, &grammar, loss, 1e-4, 1.0);
                t0.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let secs = times[times.len() / 2];
        let label = if fused { "update   " } else { "decomposed" };
        let vs = if fused { format!("; {:.2}× the decomposed ops", per_step / secs) } else { String::new() };
        println!(
            "{label} 64×64 tokens: {:.1} ms/step (median), {:.0} tokens/s, {:.2} GFLOP/s{vs}",
            secs * 1e3,
            tokens / secs,
            flops / secs / 1e9
        );
        per_step = secs;
    }

    // Matmul peak on this machine (Burn, same backend).
    let dev = burn::tensor::Device::flex();
    let n = 512;
    let a = Tensor::<2>::from_data(TensorData::new(vec![0.5f32; n * n], [n, n]), &dev);
    let b = Tensor::<2>::from_data(TensorData::new(vec![0.25f32; n * n], [n, n]), &dev);
    let _ = a.clone().matmul(b.clone()).into_data();
    let t0 = Instant::now();
    let reps = 20;
    for _ in 0..reps {
        let _ = a.clone().matmul(b.clone()).into_data();
    }
    let peak = 2.0 * (n * n * n) as f64 * reps as f64 / t0.elapsed().as_secs_f64() / 1e9;
    println!("matmul 512³ peak: {peak:.1} GFLOP/s → update step reaches {:.0}% of it", 100.0 * flops / per_step / 1e9 / peak);
}
