//! Rollout throughput of a learned policy in process and through `rao serve` + `policy: openai`
//! (HTTP on 127.0.0.1): generated tokens per second, the main job's model size (random weights,
//! sampled at temperature 1), small world, Medium tasks, W = 96, recursive. In process every
//! round of every live node is one batched forward pass; the server answers each request alone.
//! Run: cargo run --example bench_serve -p rao-stages [TASKS]

use std::sync::Arc;
use std::time::Instant;

use rao_agent::RunMeta;
use rao_envs::textcraft::{self, Band, SynthConfig};
use rao_stages::chat_api::{ChatApi, ChatEndpoint};
use rao_stages::envs::TaskSet;
use rao_stages::envs::textcraft::task_set;
use rao_stages::neural::NeuralPolicy;
use rao_stages::openai_policy::OpenAiPolicy;
use rao_stages::rollout::{LimitParams, Mode, rollout_trees};
use rao_stages::serve::{Served, serve};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(16);
    let world = Arc::new(textcraft::generate(&SynthConfig::small(), 1));
    let set: Arc<dyn TaskSet> = Arc::new(task_set(&world, &textcraft::synthesize(&world, Band::Medium, n, false, 3)));
    let cfg = rao_policy::ModelConfig { vocab: set.vocab().len(), ..rao_policy::ModelConfig::tiny() };
    let model = Arc::new(rao_policy::Policy::new(cfg, rao_policy::Backend::default(), 1).unwrap());
    let params = LimitParams::default();
    let limits = params.limits(Mode::Recursive);
    let generated = |trees: &[Vec<rao_core::NodeRecord>]| trees.iter().flatten().map(|n| n.generated_tokens as usize).sum::<usize>();

    let in_process = Arc::new(NeuralPolicy::new(model.clone(), set.grammar(limits.max_children as usize), set.vocab(), 1.0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, Arc::new(Served::new("bench".into(), model, set.clone(), &params))));
    let cache = tempfile::tempdir().unwrap();
    let through = |round: usize| {
        let endpoint = ChatEndpoint {
            base_url: format!("http://{addr}/v1"),
            model: "bench".into(),
            api_key_env: "RAO_BENCH_NO_KEY".into(),
            timeout_s: 60.0,
            retries: 0,
            concurrency: 16,
            // A fresh cache each round: every request reaches the server.
            cache_dir: cache.path().join(round.to_string()).display().to_string(),
        };
        Arc::new(OpenAiPolicy::new(Arc::new(ChatApi::new(endpoint, cache.path()).unwrap()), set.episode(0), 1.0))
    };
    // Interleaved rounds (the first of each warms up); the median of the rest.
    let (mut t_in, mut t_http, mut tok_in, mut tok_http) = (vec![], vec![], 0, 0);
    for round in 0..4 {
        let t0 = Instant::now();
        let trees = rollout_trees(set.as_ref(), &set.all(), in_process.clone(), Mode::Recursive, 1, limits, RunMeta::default(), 5).await;
        (tok_in, _) = (generated(&trees), t_in.push(t0.elapsed().as_secs_f64()));
        let t0 = Instant::now();
        let trees = rollout_trees(set.as_ref(), &set.all(), through(round), Mode::Recursive, 1, limits, RunMeta::default(), 5).await;
        (tok_http, _) = (generated(&trees), t_http.push(t0.elapsed().as_secs_f64()));
    }
    let median = |v: &mut Vec<f64>| {
        v.remove(0);
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (s_in, s_http) = (median(&mut t_in), median(&mut t_http));
    println!("{n} Medium tasks, recursive, vocabulary {}", set.vocab().len());
    println!("in process:       {tok_in:>6} tokens in {s_in:>6.2} s = {:>8.0} tok/s", tok_in as f64 / s_in);
    println!(
        "through rao serve: {tok_http:>6} tokens in {s_http:>6.2} s = {:>8.0} tok/s ({:.2}× in process)",
        tok_http as f64 / s_http,
        (tok_http as f64 / s_http) / (tok_in as f64 / s_in)
    );
}
