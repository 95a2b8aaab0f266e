//! One batched `Policy::sample` call against the same requests one at a time, at long contexts
//! (what a language model acting in text sees): 16 requests of about LEN tokens, 4 new tokens
//! each, no grammar. Run: cargo run --example bench_batch -p rao-policy [MODEL_DIR] (default
//! models/tiny-qwen3, from the repository root).

use std::time::Instant;

use rao_envs::grammar::AnyToken;
use rao_policy::{Backend, SampleRequest};

fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "models/tiny-qwen3".into());
    let policy = rao_policy::hf::load(std::path::Path::new(&dir), Backend::Cpu).expect("a model directory").policy;
    let any = AnyToken(policy.cfg.vocab);
    for len in [500usize, 2000] {
        let reqs: Vec<SampleRequest> = (0..16)
            .map(|i| SampleRequest {
                context: (0..len + i * 7).map(|j| ((j * 31 + i) % 300) as u32 + 10).collect(),
                max_new_tokens: 4,
                seed: i as u64,
                recursive: false,
            })
            .collect();
        let t0 = Instant::now();
        let batched = policy.sample(&reqs, &any, 1.0);
        let s_batch = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let alone: Vec<_> = reqs.iter().map(|r| policy.sample(std::slice::from_ref(r), &any, 1.0).remove(0)).collect();
        let s_alone = t0.elapsed().as_secs_f64();
        let same = batched.iter().zip(&alone).filter(|(a, b)| a.0 == b.0).count();
        println!(
            "~{len} tokens: one batch of 16 {s_batch:.3} s, one at a time {s_alone:.3} s ({:.2}×); {same}/16 same tokens",
            s_batch / s_alone
        );
    }
}
