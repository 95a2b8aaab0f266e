//! Adapter versions and several servers, against two real vLLMs (PyPI's CPU build) serving a tiny
//! random Qwen3 with runtime LoRA loading:
//! - a LoRA checkpoint's adapter is loaded into every server under a versioned name and the
//!   engine's greedy trees equal the in-process policy's with those adapters (and differ from
//!   the base model's); every row records the version; a newer version unloads the older, and a
//!   stage still on the older one loads it again instead of sampling from anything else;
//! - an adapter a server cannot serve, or a checkpoint trained in full, fails with a message
//!   that names the version;
//! - one of two servers killed mid-rollout costs retries, never a tree: the greedy trees equal
//!   those of a run without the kill.

#[path = "../../../tests/support/vllm.rs"]
mod vllm;

use std::sync::Arc;
use std::time::Duration;

use rao_agent::RunMeta;
use rao_core::NodeRecord;
use rao_envs::textcraft;
use rao_policy::hf;
use rao_policy::lora::{LoraConfig, LoraTarget};
use rao_policy::{Backend, Policy};
use rao_stages::engine_policy::{EngineEndpoints, EnginePolicy};
use rao_stages::envs::TaskSet;
use rao_stages::rollout::{LimitParams, Mode, rollout_trees};
use rao_stages::text_policy::TextPolicy;

const WINDOW: usize = 3072;

/// `base` with adapters of `rank` on every projection, set to seeded values large enough to
/// change what the model says, at `version`.
fn adapted(base: &Policy, rank: usize, seed: u32, version: i32) -> Policy {
    let mut p = base.clone();
    p.add_lora(LoraConfig { rank, alpha: 2.0 * rank as f64, targets: LoraTarget::ALL.to_vec(), dropout: 0.0 }, 0).unwrap();
    let mut ck = p.checkpoint();
    let mut state = seed.wrapping_mul(2_654_435_761).max(1);
    for chunk in ck.params.chunks_exact_mut(4) {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let x = (state as f32 / u32::MAX as f32 - 0.5) * 0.2;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    ck.meta.version = version;
    p.load_adapters(&ck).unwrap();
    p
}

fn endpoints(urls: Vec<String>, adapter_dir: &std::path::Path) -> EngineEndpoints {
    EngineEndpoints {
        urls,
        model: "tiny".into(),
        timeout_s: 120.0,
        retries: 3,
        concurrency: 8,
        adapter_dir: Some(adapter_dir.into()),
        launch: None,
    }
}

struct Fixture {
    set: Box<dyn TaskSet>,
    tokenizer: Arc<hf::TextTokenizer>,
}

impl Fixture {
    async fn engine(&self, e: EngineEndpoints, policy: &Policy) -> anyhow::Result<Arc<EnginePolicy>> {
        let grammar = self.set.grammar(2);
        EnginePolicy::connect(e, policy, self.tokenizer.clone(), grammar.as_ref(), self.set.episode(0), 0.0, WINDOW).await.map(Arc::new)
    }

    fn local(&self, policy: Policy) -> Arc<TextPolicy> {
        let grammar = self.set.grammar(2);
        Arc::new(TextPolicy::new(Arc::new(policy), self.tokenizer.clone(), grammar.as_ref(), self.set.episode(0), 0.0, WINDOW).unwrap())
    }

    async fn trees(&self, policy: Arc<dyn rao_agent::Policy>) -> Vec<NodeRecord> {
        let limits =
            LimitParams { window: 1 << 20, step_budget: Some(3), max_depth: 2, max_children: 2, max_nodes: 5, ..Default::default() }
                .limits(Mode::Recursive);
        let meta = RunMeta { run: "versions".into(), iteration: 0, env: self.set.env().into() };
        let trees = rollout_trees(self.set.as_ref(), &self.set.all(), policy, Mode::Recursive, 1, limits, meta, 7).await;
        let mut nodes: Vec<NodeRecord> = trees.into_iter().flatten().collect();
        nodes.sort_by_key(|n| (n.tree_key(), n.node_id));
        nodes
    }
}

/// A node's goal and, turn by turn, its action and the ids sampled for it.
type NodeActions = (String, Vec<(String, Vec<u32>)>);

/// What a tree says, turn by turn (timings aside).
fn actions(nodes: &[NodeRecord]) -> Vec<NodeActions> {
    nodes.iter().map(|n| (n.goal.clone(), n.turns.iter().map(|t| (t.action.clone(), t.completion_ids.clone())).collect())).collect()
}

fn served_adapters(server: &vllm::Vllm) -> Vec<String> {
    let (_, body) = server.get("/v1/models").expect("vllm answers");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["data"].as_array().unwrap().iter().filter(|m| !m["parent"].is_null()).map(|m| m["id"].as_str().unwrap().to_string()).collect()
}

fn counter(policy: &EnginePolicy, name: &str) -> f64 {
    rao_agent::Policy::counters(policy).into_iter().find(|(n, _)| *n == name).unwrap().1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_versions_travel_loudly_and_a_dead_server_costs_retries_not_trees() {
    let dir = tempfile::tempdir().unwrap();
    let adapters = dir.path().join("adapters");
    let model_dir = vllm::tiny_model(dir.path());
    let lora = ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "2"];
    let (a, b) = (vllm::Vllm::launch(&model_dir, dir.path(), &lora), vllm::Vllm::launch(&model_dir, dir.path(), &lora));
    let (a, mut b) = (a.ready(), b.ready());
    let pre = hf::load(&model_dir, Backend::Cpu).unwrap();
    let base = pre.policy;
    let world = Arc::new(textcraft::generate(&textcraft::SynthConfig::small(), 3));
    let tasks = textcraft::synthesize(&world, textcraft::Band::Medium, 4, true, 3);
    let fx = Fixture {
        set: Box::new(rao_stages::envs::textcraft::task_set(&world, &tasks)),
        tokenizer: Arc::new(pre.tokenizer.expect("a tokenizer")),
    };

    // Version 1 on both servers: the engine's greedy trees are the adapted model's, not the base's.
    let v1 = adapted(&base, 8, 1, 1);
    let engine = fx.engine(endpoints(vec![a.base_url(), b.base_url()], &adapters), &v1).await.unwrap();
    let name1 = engine.served_model().to_string();
    assert!(name1.starts_with("tiny-v1-"), "{name1}");
    assert_eq!((served_adapters(&a), served_adapters(&b)), (vec![name1.clone()], vec![name1.clone()]));
    let want = fx.trees(fx.local(v1.clone())).await;
    let got = fx.trees(engine.clone()).await;
    assert!(rao_agent::Policy::unusable(engine.as_ref()).is_none());
    assert_eq!(actions(&want), actions(&got), "greedy trees of version 1: in process vs the engine");
    assert!(got.iter().all(|n| n.policy_version == 1), "every row records the version");
    let base_trees = fx.trees(fx.local(base.clone())).await;
    assert_ne!(actions(&base_trees), actions(&got), "the adapter changes what the model does (else this test proves nothing)");

    // Version 2 replaces version 1 on every server; a stage still on version 1 loads it again.
    let v2 = adapted(&base, 8, 2, 2);
    let engine2 = fx.engine(endpoints(vec![a.base_url(), b.base_url()], &adapters), &v2).await.unwrap();
    let name2 = engine2.served_model().to_string();
    assert!(name2.starts_with("tiny-v2-") && name2 != name1, "{name2}");
    assert_eq!(served_adapters(&a), vec![name2.clone()], "version 1 unloaded");
    let again = fx.trees(engine.clone()).await;
    assert_eq!(actions(&again), actions(&want), "version 1, loaded again");
    assert!(counter(&engine, "engine_adapter_reloads") >= 1.0);
    assert_eq!(actions(&fx.trees(engine2.clone()).await), actions(&fx.trees(fx.local(v2.clone())).await), "version 2");

    // Refusals that say which version: an adapter the servers cannot take (rank 32 > 16), and a
    // checkpoint trained in full.
    let too_wide = adapted(&base, 32, 3, 3);
    let err = format!("{:#}", fx.engine(endpoints(vec![a.base_url()], &adapters), &too_wide).await.err().expect("refused"));
    assert!(err.contains("refused adapter version `tiny-v3-") && err.contains("rank"), "{err}");
    let mut full = base.clone();
    full.version = 4;
    let err = format!("{:#}", fx.engine(endpoints(vec![a.base_url()], &adapters), &full).await.err().expect("refused"));
    assert!(err.contains("version 4") && err.contains("trained in full") && err.contains("hf_export"), "{err}");

    // One of two servers killed mid-rollout: every tree completes, equal to a run without the kill.
    let engine = fx.engine(endpoints(vec![a.base_url(), b.base_url()], &adapters), &v2).await.unwrap();
    let watcher = engine.clone();
    let killer = tokio::spawn(async move {
        while counter(&watcher, "engine_requests") < 6.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        b.kill_now();
        b
    });
    let survived = fx.trees(engine.clone()).await;
    let _b = killer.await.unwrap();
    assert!(rao_agent::Policy::unusable(engine.as_ref()).is_none(), "no request failed for good");
    assert!(counter(&engine, "engine_retries") >= 1.0, "the dead server cost retries");
    eprintln!(
        "kill: {} requests, {} retries, {} nodes",
        counter(&engine, "engine_requests"),
        counter(&engine, "engine_retries"),
        survived.len()
    );
    assert_eq!(actions(&survived), actions(&fx.trees(fx.local(v2)).await), "greedy trees with a server killed mid-rollout");
}
