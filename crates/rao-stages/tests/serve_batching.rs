//! `rao serve` answers the requests in flight together in one batched sampling call (per
//! temperature), and each reply is the one the request gets when it is sent alone: rao's own
//! model and a language model acting in text (the tiny random Qwen3 of `models/tiny-qwen3`).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use rao_envs::text::conversation;
use rao_envs::textcraft;
use rao_policy::{Backend, ModelConfig, Policy, hf};
use rao_stages::envs::TaskSet;
use rao_stages::envs::textcraft::task_set;
use rao_stages::neural::LoadedModel;
use rao_stages::rollout::LimitParams;
use rao_stages::serve::Served;
use serde_json::{Value, json};

/// The first conversation of each task, recursive and flat, each with its own seed, greedy and
/// sampled in turn.
fn requests(set: &dyn TaskSet) -> Vec<Value> {
    let mut out = Vec::new();
    for task in 0..set.len() {
        let episode = set.episode(task);
        let goal = episode.root_goal();
        for recursive in [true, false] {
            let messages = conversation(episode.as_ref(), &episode.prompt(&goal, 0, recursive)).unwrap();
            let seed = out.len() as u64;
            out.push(json!({"messages": messages, "seed": seed, "temperature": if seed.is_multiple_of(2) { 0.0 } else { 1.0 }, "logprobs": true}));
        }
    }
    out
}

/// Every request sent at once to `batched` gets the reply `alone` gives it, and they took fewer
/// sampling calls than requests.
async fn answered_together_as_alone(batched: &Served, alone: &Served, requests: &[Value]) {
    let together = futures::future::join_all(requests.iter().map(|r| batched.complete(r))).await;
    let calls = batched.batches.load(Ordering::SeqCst);
    assert!(calls < requests.len() / 2, "{} requests in flight took {calls} sampling calls", requests.len());
    for (request, reply) in requests.iter().zip(together) {
        let reply = reply.unwrap();
        let single = alone.complete(request).await.unwrap();
        let choice = |v: &Value| v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        assert_eq!(choice(&reply), choice(&single), "seed {}", request["seed"]);
        assert_eq!(reply["usage"], single["usage"]);
        let logprobs = |v: &Value| -> Vec<f64> {
            v["choices"][0]["logprobs"]["content"].as_array().unwrap().iter().map(|t| t["logprob"].as_f64().unwrap()).collect()
        };
        let (a, b) = (logprobs(&reply), logprobs(&single));
        assert_eq!(a.len(), b.len());
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-4), "seed {}: {a:?} vs {b:?}", request["seed"]);
    }
    assert_eq!(alone.batches.load(Ordering::SeqCst), requests.len(), "max_batch 1 answers each request alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rao_model_requests_in_flight_are_batched_and_answered_as_alone() {
    let world = Arc::new(textcraft::generate(&textcraft::SynthConfig::small(), 1));
    let set: Arc<dyn TaskSet> = Arc::new(task_set(&world, &textcraft::synthesize(&world, textcraft::Band::Medium, 12, false, 3)));
    let cfg = ModelConfig { vocab: set.vocab().len(), ..ModelConfig::tiny() };
    let served = |max_batch| {
        let policy = Arc::new(Policy::new(cfg.clone(), Backend::Cpu, 7).unwrap());
        Served::new("tiny".into(), policy, set.clone(), &LimitParams::default()).with_max_batch(max_batch)
    };
    answered_together_as_alone(&served(64), &served(1), &requests(set.as_ref())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn language_model_requests_in_flight_are_batched_and_answered_as_alone() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-qwen3");
    let world = Arc::new(textcraft::generate(&textcraft::SynthConfig::small(), 1));
    let set: Arc<dyn TaskSet> = Arc::new(task_set(&world, &textcraft::synthesize(&world, textcraft::Band::Easy, 8, false, 3)));
    let limits = LimitParams { window: 4096, ..LimitParams::default() };
    let served = |max_batch| {
        let pre = hf::load(&dir, Backend::Cpu).unwrap();
        let loaded = LoadedModel { policy: pre.policy, tokenizer: pre.tokenizer.map(Arc::new) };
        Served::from_loaded("tiny-qwen3".into(), loaded, set.clone(), &limits, rao_policy::prefix_cache::DEFAULT_BUDGET_BYTES)
            .unwrap()
            .with_max_batch(max_batch)
    };
    answered_together_as_alone(&served(64), &served(1), &requests(set.as_ref())).await;
}
