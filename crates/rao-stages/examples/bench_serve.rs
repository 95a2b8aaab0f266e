//! Rollout throughput of a learned policy in process and through `rao serve` + `policy: openai`
//! (HTTP on 127.0.0.1): generated tokens per second, small world, Medium tasks, recursive,
//! sampled at temperature 1. The policy is the main job's model size (random weights, W = 96),
//! or with MODEL_DIR a Hugging Face model acting in text (W = 4096 of its tokens; at most 12
//! nodes of depth ≤ 2 and 6 steps each, since a random model launches sub-agents at random). In process
//! every round of every live node is one batched forward pass; through the server, 16 requests
//! in flight, answered each alone (`--max-batch 1`, the CPU's default) and batched
//! (`--max-batch 64`, a GPU's default), and each conversation rendered whole (a client sends text).
//! Run: cargo run --example bench_serve -p rao-stages [TASKS] [MODEL_DIR]
//! (`BENCH_WIDTH` and `BENCH_LAYERS` size rao's model: 64 and 2 by default, the main job's.)

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
use rao_stages::serve::{DEFAULT_HEADER_TIMEOUT, Served, serve};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(16);
    let world = Arc::new(textcraft::generate(&SynthConfig::small(), 1));
    let set: Arc<dyn TaskSet> = Arc::new(task_set(&world, &textcraft::synthesize(&world, Band::Medium, n, false, 3)));
    let model_dir = std::env::args().nth(2);
    let loaded = || -> LoadedModel {
        match &model_dir {
            None => {
                // BENCH_WIDTH=512 BENCH_LAYERS=8: a larger model of the same kind (d_ff = 3 × width).
                let env = |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
                let (d_model, n_layers) = (env("BENCH_WIDTH", 64), env("BENCH_LAYERS", 2));
                let cfg = rao_policy::ModelConfig {
                    vocab: set.vocab().len(),
                    d_model,
                    n_layers,
                    n_heads: (d_model / 16).max(1),
                    d_ff: 3 * d_model,
                    ..rao_policy::ModelConfig::tiny()
                };
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

    let first = loaded();
    let in_process_params = first.policy.model.num_params();
    let in_process = acting_policy(first, set.as_ref(), &limits, 1.0, DEFAULT_BUDGET_BYTES).unwrap();
    // Two servers of the same model: one answering each request alone (`--max-batch 1`), one
    // batching the requests in flight (`--max-batch 64`).
    let mut servers = Vec::new();
    for max_batch in [1, rao_stages::serve::GPU_MAX_BATCH] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(
            Served::from_loaded("bench".into(), loaded(), set.clone(), &params, DEFAULT_BUDGET_BYTES).unwrap().with_max_batch(max_batch),
        );
        tokio::spawn(serve(listener, served.clone(), DEFAULT_HEADER_TIMEOUT));
        servers.push((addr, served));
    }
    let cache = tempfile::tempdir().unwrap();
    let through = |addr: std::net::SocketAddr, round: usize| {
        let endpoint = ChatEndpoint {
            base_url: format!("http://{addr}/v1"),
            model: "bench".into(),
            api_key_env: "RAO_BENCH_NO_KEY".into(),
            timeout_s: 60.0,
            retries: 0,
            concurrency: 16,
            logprobs: true,
            // A fresh cache each round: every request reaches the server.
            cache_dir: cache.path().join(format!("{addr}-{round}")).display().to_string(),
        };
        Arc::new(OpenAiPolicy::new(Arc::new(ChatApi::new(endpoint, cache.path()).unwrap()), set.episode(0), 1.0))
    };
    // Interleaved rounds (the first of each warms up); the median of the rest.
    let (mut t_in, mut tok_in) = (vec![], 0);
    let mut t_http = vec![vec![]; servers.len()];
    let mut tok_http = vec![0; servers.len()];
    for round in 0..4 {
        let t0 = Instant::now();
        let trees = rollout_trees(set.as_ref(), &set.all(), in_process.clone(), Mode::Recursive, 1, limits, RunMeta::default(), 5).await;
        (tok_in, _) = (generated(&trees), t_in.push(t0.elapsed().as_secs_f64()));
        for (k, (addr, served)) in servers.iter().enumerate() {
            let (t0, before) = (Instant::now(), served.completion_tokens.load(Ordering::SeqCst));
            rollout_trees(set.as_ref(), &set.all(), through(*addr, round), Mode::Recursive, 1, limits, RunMeta::default(), 5).await;
            tok_http[k] = served.completion_tokens.load(Ordering::SeqCst) - before;
            t_http[k].push(t0.elapsed().as_secs_f64());
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.remove(0);
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let s_in = median(&mut t_in);
    let what = model_dir.as_deref().map_or_else(
        || format!("rao's model ({} parameters), W = 96", in_process_params),
        |d| format!("{d} in text, W = 4096, ≤ 12 nodes"),
    );
    println!("{n} Medium tasks, recursive, {what}");
    println!("in process:                      {tok_in:>6} tokens in {s_in:>6.2} s = {:>8.0} tok/s", tok_in as f64 / s_in);
    for (k, (_, served)) in servers.iter().enumerate() {
        let s_http = median(&mut t_http[k]);
        let how = if k == 0 { "each request alone" } else { "requests batched  " };
        println!(
            "through rao serve, {how}: {:>6} tokens in {s_http:>6.2} s = {:>8.0} tok/s ({:.2}× in process; {} sampling calls in all)",
            tok_http[k],
            tok_http[k] as f64 / s_http,
            (tok_http[k] as f64 / s_http) / (tok_in as f64 / s_in),
            served.batches.load(Ordering::SeqCst)
        );
    }
}
