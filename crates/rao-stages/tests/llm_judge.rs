//! The LLM judge against a real HTTP server on 127.0.0.1: verdicts, retries, the content cache,
//! and the API key never written anywhere.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rao_core::NodeRecord;
use rao_core::tree::Turn;
use rao_stages::llm_judge::{LlmJudge, LlmJudgeParams};
use tokio::net::TcpListener;

#[path = "support/chat_server.rs"]
mod chat_server;

/// An OpenAI-compatible endpoint: 500 on the very first request, 401 without the key, and a
/// verdict of 1 for nodes that finished.
async fn serve(listener: TcpListener, requests: Arc<AtomicUsize>) {
    chat_server::serve(
        listener,
        Arc::new(move |head: &str, body: &serde_json::Value| {
            if requests.fetch_add(1, Ordering::SeqCst) == 0 {
                ("500 Internal Server Error", "{}".to_string())
            } else if !head.contains("Bearer secret-key-123") {
                ("401 Unauthorized", "{}".to_string())
            } else {
                let user = body["messages"][1]["content"].as_str().unwrap_or("");
                let score = if user.contains("Ended: finished") { 1 } else { 0 };
                ("200 OK", chat_server::completion(&format!("Verdict: {{\"score\": {score}, \"reason\": \"checked\"}}")))
            }
        }),
    )
    .await
}

fn node(goal: &str, status: &str) -> NodeRecord {
    NodeRecord {
        goal: goal.into(),
        status: status.parse().unwrap(),
        turns: vec![Turn { action: "craft M t1 i1 <eos>".into(), observation: "<obs> ok".into(), ..Default::default() }],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn judges_over_http_with_retries_cache_and_no_key_leak() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    tokio::spawn(serve(listener, requests.clone()));
    // The key lives only in the environment variable the pipeline names.
    unsafe { std::env::set_var("RAO_TEST_JUDGE_KEY", "secret-key-123") };
    let cache = tempfile::tempdir().unwrap();
    let params = LlmJudgeParams {
        base_url: format!("http://{addr}/v1"),
        model: "judge-mini".into(),
        api_key_env: "RAO_TEST_JUDGE_KEY".into(),
        timeout_s: 5.0,
        retries: 3,
        concurrency: 2,
        logprobs: false,
        cache_dir: cache.path().display().to_string(),
    };
    let judge = Arc::new(LlmJudge::new(params.clone(), cache.path()).unwrap());
    let mut nodes = vec![node("M t1 i1", "finished"), node("M t1 i2", "step_budget"), node("M t2 i0", "finished")];
    let stats = judge.score_nodes(&mut nodes).await.unwrap();
    assert_eq!(nodes.iter().map(|n| n.score).collect::<Vec<_>>(), vec![1.0, 0.0, 1.0]);
    assert_eq!(nodes[0].judge.as_deref(), Some("llm:judge-mini"));
    assert_eq!(stats.calls, 4, "three verdicts plus one retry after the 500");
    // Same content again: answered from the cache, no request sent.
    let before = requests.load(Ordering::SeqCst);
    let mut again = vec![node("M t1 i1", "finished"), node("M t1 i2", "step_budget"), node("M t2 i0", "finished")];
    let stats = Arc::new(LlmJudge::new(params, cache.path()).unwrap()).score_nodes(&mut again).await.unwrap();
    assert_eq!(stats.cache_hits, 3);
    assert_eq!(requests.load(Ordering::SeqCst), before);
    // The key appears in no file the judge wrote.
    for e in std::fs::read_dir(cache.path()).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        assert!(!text.contains("secret-key-123"));
    }
}
