use std::time::Instant;
use rao_envs::textcraft::{self, SynthConfig, grammar::TextCraftGrammar};
use rao_envs::vocab::Tok;
use rao_policy::{Backend, Loss, ModelConfig, Policy, Sequence};
fn main() {
    rao_policy::tune_allocator();
    let steps: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    let world = textcraft::generate(&SynthConfig::small(), 1);
    let grammar = TextCraftGrammar::new(&world, 8);
    let cfg = ModelConfig { vocab: world.vocab.len(), d_model: 64, n_layers: 2, n_heads: 4, d_ff: 192, rope_theta: 10_000.0 };
    let mut policy = Policy::new(cfg, Backend::Cpu, 1).unwrap();
    let v = &world.vocab;
    let item = world.items.iter().find(|i| i.tier == 3).unwrap();
    let prompt: Vec<Tok> = [vec![v.id("<bos>"), v.id("<rec>"), v.id("@0")], item.tokens.clone()].concat();
    let seqs: Vec<Sequence> = (0..64).map(|i| {
        let mut tokens = prompt.clone();
        while tokens.len() < 64 { tokens.extend(&item.tokens); }
        tokens.truncate(64);
        let generated: Vec<bool> = (0..64).map(|j| j >= 32).collect();
        Sequence { tokens, generated, old_logprobs: vec![-1.0; 64], advantage: (i % 3) as f32 - 0.7, recursive: true }
    }).collect();
    let loss = Loss::Cispo { lo: 0.0, hi: 5.0 };
    policy.train_step(&seqs, &grammar, loss, 1e-4, 1.0);
    let (mut tf, mut tb) = (0.0, 0.0);
    let t0 = Instant::now();
    for _ in 0..steps {
        let a = Instant::now();
        let (total, _) = policy.loss(&seqs, &grammar, loss, 1.0);
        let _ = total.clone().into_scalar::<f32>();
        tf += a.elapsed().as_secs_f64();
        let b = Instant::now();
        let _g = total.backward();
        tb += b.elapsed().as_secs_f64();
    }
    let n = steps as f64;
    println!("fwd+loss {:.1} ms, backward {:.1} ms, total {:.1} ms", tf / n * 1e3, tb / n * 1e3, t0.elapsed().as_secs_f64() / n * 1e3);
    let m = policy.train_step(&seqs, &grammar, loss, 1e-4, 1.0);
    println!("loss {:.6} grad_norm {:.6}", m.loss, m.grad_norm);
}
