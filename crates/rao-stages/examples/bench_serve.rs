//! Rollout throughput of a learned policy in process and through `rao serve` + `policy: openai`
//! (HTTP on 127.0.0.1): generated tokens per second, small world, Medium tasks, recursive,
//! sampled at temperature 1. The policy is the main job's model size (random weights, W = 96),
//! or with MODEL_DIR a Hugging Face model acting in text (W = 4096 of its tokens; at most 12
//! nodes of depth ≤ 2 and 6 steps each, since a random model launches sub-agents at random). In process
//! every round of every live node is one batched forward pass; the server answers each request
//! alone (and renders each conversation whole: a client sends text).
//! Run: cargo run --example bench_serve -p rao-stages [TASKS] [MODEL_DIR]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use rao_agent::RunMeta;
use rao_envs::textcraft::{self, Band, SynthConfig};
use rao_policy::hf;
use rao_policy::prefix_cache::DEFAULT_BUDGET_BYTES;
use rao_stages::chat_api::{ChatApi, ChatEndpoint};
use rao_stages::envs::TaskSet;
use rao_stages::envs::textcraft::task_set;
use rao_stages::neural::{LoadedModel, acting_policy};
use rao_stages::openai_policy::OpenAiPolicy;
use rao_stages::rollout::{LimitParams, Mode, rollout_trees};
use rao_stages::serve::{Served, serve};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(16);
    let world = Arc::new(textcraft::generate(&SynthConfig::small(), 1));
    let set: Arc<dyn TaskSet> = Arc::new(task_set(&world, &textcraft::synthesize(&world, Band::Medium, n, false, 3)));
    let model_dir = std::env::args().nth(2);
    let loaded = || -> LoadedModel {
        match &model_dir {
            None => {
                let cfg = rao_policy::ModelConfig { vocab: set.vocab().len(), ..rao_policy::ModelConfig::tiny() };
                LoadedModel { policy: rao_policy::Policy::new(cfg, rao_policy::Backend::default(), 1).unwrap(), tokenizer: None }
            }
            Some(dir) => {
                let dir = std::path::Path::new(dir);
                let pre = hf::load(dir, rao_policy::Backend::default()).unwrap();
                LoadedModel { policy: pre.policy, tokenizer: pre.tokenizer.map(Arc::new) }
            }
        }
    };
    // A random language model launches sub-agents at random: small trees keep a round short.
    let params = match model_dir {
        None => LimitParams::default(),
        Some(_) => {
            LimitParams { window: 4096, step_budget: Some(6), max_depth: 2, max_children: 3, max_nodes: 12, ..LimitParams::default() }
        }
    };
    let limits = params.limits(Mode::Recursive);
    let generated = |trees: &[Vec<rao_core::NodeRecord>]| trees.iter().flatten().map(|n| n.generated_tokens as usize).sum::<usize>();

    let in_process = acting_policy(loaded(), set.as_ref(), &limits, 1.0, DEFAULT_BUDGET_BYTES).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(Served::from_loaded("bench".into(), loaded(), set.clone(), &params, DEFAULT_BUDGET_BYTES).unwrap());
    tokio::spawn(serve(listener, served.clone()));
    let cache = tempfile::tempdir().unwrap();
    let through = |round: usize| {
        let endpoint = ChatEndpoint {
            base_url: format!("http://{addr}/v1"),
            model: "bench".into(),
            api_key_env: "RAO_BENCH_NO_KEY".into(),
            timeout_s: 60.0,
            retries: 0,
            concurrency: 16,
            logprobs: true,
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
        let (t0, before) = (Instant::now(), served.completion_tokens.load(Ordering::SeqCst));
        rollout_trees(set.as_ref(), &set.all(), through(round), Mode::Recursive, 1, limits, RunMeta::default(), 5).await;
        (tok_http, _) = (served.completion_tokens.load(Ordering::SeqCst) - before, t_http.push(t0.elapsed().as_secs_f64()));
    }
    let median = |v: &mut Vec<f64>| {
        v.remove(0);
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (s_in, s_http) = (median(&mut t_in), median(&mut t_http));
    let what = model_dir.as_deref().map_or("rao's model, W = 96".to_string(), |d| format!("{d} in text, W = 4096, ≤ 12 nodes"));
    println!("{n} Medium tasks, recursive, {what}");
    println!("in process:       {tok_in:>6} tokens in {s_in:>6.2} s = {:>8.0} tok/s", tok_in as f64 / s_in);
    println!(
        "through rao serve: {tok_http:>6} tokens in {s_http:>6.2} s = {:>8.0} tok/s ({:.2}× in process)",
        tok_http as f64 / s_http,
        (tok_http as f64 / s_http) / (tok_in as f64 / s_in)
    );
}
