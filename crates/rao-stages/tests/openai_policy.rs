//! `policy: openai` against a real HTTP server on 127.0.0.1, in every environment: the server
//! answers each conversation with the scripted expert's action for that context (a table made
//! from the expert's own trees, in the environment's text form), so the trees through HTTP must
//! be the expert's trees exactly — the text rendering, the reply parsing and the round trip
//! through the chat API are all checked by one equality. Also: a 500 costs a retry, a rerun is
//! answered from the cache, and an endpoint that is down costs the nodes `err syntax`, never the
//! run.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rao_agent::RunMeta;
use rao_core::NodeRecord;
use rao_envs::text::{self, conversation, parse_reply};
use rao_envs::{Tok, longdoc, multihop, textcraft};
use rao_stages::chat_api::{ChatApi, ChatEndpoint};
use rao_stages::envs::longdoc::LongDocSet;
use rao_stages::envs::multihop::MultiHopSet;
use rao_stages::envs::{ExpertSpec, TaskSet};
use rao_stages::openai_policy::OpenAiPolicy;
use rao_stages::rollout::{LimitParams, Mode, rollout_trees};
use tokio::net::TcpListener;

/// The conversation as the server sees it: the JSON of its messages.
fn key(messages: &serde_json::Value) -> String {
    messages.to_string()
}

/// What the expert answered at each context of its trees, keyed by the conversation.
fn expert_table(set: &dyn TaskSet, trees: &[Vec<NodeRecord>]) -> HashMap<String, String> {
    let episode = set.episode(0);
    let mut table = HashMap::new();
    for n in trees.iter().flatten() {
        let mut ctx: Vec<Tok> = n.prompt_ids.clone();
        for t in &n.turns {
            let messages = conversation(episode.as_ref(), &ctx).expect("a node's context is a conversation");
            table.insert(key(&serde_json::to_value(&messages).unwrap()), text::words(set.vocab(), &t.completion_ids));
            ctx.extend(&t.completion_ids);
            ctx.extend(&t.observation_ids);
        }
    }
    table
}

#[path = "support/chat_server.rs"]
mod chat_server;

/// An OpenAI-compatible endpoint that answers from `table` (500 on its very first request).
async fn serve(listener: TcpListener, table: Arc<HashMap<String, String>>, requests: Arc<AtomicUsize>) {
    chat_server::serve(
        listener,
        Arc::new(move |_head: &str, body: &serde_json::Value| {
            if requests.fetch_add(1, Ordering::SeqCst) == 0 {
                return ("500 Internal Server Error", "{}".to_string());
            }
            let content = table.get(&key(&body["messages"])).cloned().unwrap_or_else(|| "I am not sure what to do.".into());
            ("200 OK", chat_server::completion(&content))
        }),
    )
    .await
}

fn endpoint(base_url: String, cache: &std::path::Path, retries: u32) -> ChatEndpoint {
    ChatEndpoint {
        base_url,
        model: "expert-replay".into(),
        api_key_env: "RAO_TEST_NO_SUCH_KEY".into(),
        timeout_s: 5.0,
        retries,
        concurrency: 8,
        logprobs: true,
        cache_dir: cache.display().to_string(),
    }
}

/// A node as two rollouts of the same tasks must agree on it: task, node, parent, goal, each
/// turn's completion and observation tokens, status, score bits (not the clocks).
type NodeShape = (String, i32, Option<i32>, String, Vec<(Vec<u32>, Vec<u32>)>, rao_core::NodeStatus, u64);

fn shape(trees: &[Vec<NodeRecord>]) -> Vec<NodeShape> {
    trees
        .iter()
        .flatten()
        .map(|n| {
            let turns = n.turns.iter().map(|t| (t.completion_ids.clone(), t.observation_ids.clone())).collect();
            (n.task_id.clone(), n.node_id, n.parent_id, n.goal.clone(), turns, n.status, n.score.to_bits())
        })
        .collect()
}

async fn replay(set: &dyn TaskSet) {
    let limits = LimitParams::default().limits(Mode::Recursive);
    let meta = RunMeta { run: "openai-test".into(), iteration: 0, env: set.env().into() };
    let tasks = set.all();
    let expert = set.expert(ExpertSpec { delegate: 1.0, noise: 0.0, seed: 7 }, &limits);
    let want = rollout_trees(set, &tasks, expert, Mode::Recursive, 1, limits, meta.clone(), 7).await;
    assert!(want.iter().flatten().any(|n| n.parent_id.is_some()), "{}: the expert delegates, so sub-agents are covered", set.env());

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    tokio::spawn(serve(listener, Arc::new(expert_table(set, &want)), requests.clone()));
    let cache = tempfile::tempdir().unwrap();
    let run = || async {
        let api = Arc::new(ChatApi::new(endpoint(format!("http://{addr}/v1"), cache.path(), 2), cache.path()).unwrap());
        let policy = Arc::new(OpenAiPolicy::new(api.clone(), set.episode(0), 0.0));
        let trees = rollout_trees(set, &tasks, policy.clone(), Mode::Recursive, 1, limits, meta.clone(), 7).await;
        (trees, api.stats(), policy.unusable.load(Ordering::SeqCst), policy.failed.load(Ordering::SeqCst))
    };
    let (got, stats, unusable, failed) = run().await;
    assert_eq!((unusable, failed), (0, 0), "{}: every reply parsed", set.env());
    assert_eq!(shape(&got), shape(&want), "{}: the trees through HTTP are the expert's", set.env());
    let actions = want.iter().flatten().map(|n| n.turns.len()).sum::<usize>();
    assert_eq!(stats.calls, actions + 1, "{}: one request per action, plus the retry after the 500", set.env());

    // Again: every answer comes from the cache, nothing is sent, the trees are the same.
    let before = requests.load(Ordering::SeqCst);
    let (again, stats, _, _) = run().await;
    assert_eq!((stats.calls, stats.cache_hits), (0, actions), "{}", set.env());
    assert_eq!(requests.load(Ordering::SeqCst), before);
    assert_eq!(shape(&again), shape(&want));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_replaying_the_expert_gives_the_experts_trees_in_every_environment() {
    let world = Arc::new(textcraft::generate(&textcraft::SynthConfig::small(), 3));
    let tasks = textcraft::synthesize(&world, textcraft::Band::Medium, 3, true, 3);
    replay(&rao_stages::envs::textcraft::task_set(&world, &tasks)).await;

    let doc = longdoc::DocConfig { min_lines: 20, max_lines: 60, ..Default::default() };
    let set = LongDocSet { lang: Arc::new(longdoc::Lang::new(&doc)), tasks: longdoc::synthesize(&doc, 3, true, 3) };
    replay(&set).await;

    let graph = multihop::generate(&multihop::GraphConfig::default(), 3);
    let tasks = multihop::synthesize(&graph, (3, 3), 3, true, 3);
    replay(&MultiHopSet { lang: Arc::new(multihop::Lang::new(graph)), tasks }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_is_down_costs_the_nodes_a_syntax_error_not_the_run() {
    let world = Arc::new(textcraft::generate(&textcraft::SynthConfig::small(), 3));
    let tasks = textcraft::synthesize(&world, textcraft::Band::Easy, 2, true, 3);
    let set = rao_stages::envs::textcraft::task_set(&world, &tasks);
    // A port nothing listens on.
    let port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
    let cache = tempfile::tempdir().unwrap();
    let api = Arc::new(ChatApi::new(endpoint(format!("http://127.0.0.1:{port}/v1"), cache.path(), 1), cache.path()).unwrap());
    let policy = Arc::new(OpenAiPolicy::new(api.clone(), set.episode(0), 0.0));
    let mut limits = LimitParams::default().limits(Mode::Recursive);
    limits.step_budget = 3;
    limits.root_step_budget = None;
    let meta = RunMeta { run: "down".into(), iteration: 0, env: "textcraft".into() };
    let trees = rollout_trees(&set, &set.all(), policy.clone(), Mode::Recursive, 1, limits, meta, 1).await;
    let nodes: Vec<&NodeRecord> = trees.iter().flatten().collect();
    assert_eq!(nodes.len(), 2, "one root per task, nothing launched");
    let syntax = world.vocab.ids("err syntax");
    for n in nodes {
        assert_eq!(n.turns.len(), 3, "the step budget ran out");
        assert!(n.turns.iter().all(|t| t.observation_ids[1..] == syntax[..]));
        assert_eq!(n.score, 0.0);
    }
    assert_eq!(policy.failed.load(Ordering::SeqCst), 6);
    assert_eq!(api.stats().calls, 12, "each request tried twice (one retry)");
}

#[test]
fn replies_parse_to_the_environments_tokens() {
    let world = textcraft::generate(&textcraft::SynthConfig::small(), 3);
    let v = &world.vocab;
    let item = world.items.iter().find(|i| !i.is_base()).unwrap();
    let name = v.text(&item.tokens);
    let want = |s: &str| v.ids(s);
    assert_eq!(parse_reply(v, &format!("craft {name} 1 2")).unwrap(), want(&format!("craft {name} 1 2")));
    // The first non-empty line; surrounding space; a comma touching the word before it.
    assert_eq!(parse_reply(v, &format!("\n  spawn {name} 2, {name}  \nthen finish")).unwrap(), want(&format!("spawn {name} 2 , {name}")));
    // What chat models wrap an answer in.
    assert_eq!(parse_reply(v, &format!("```\ncraft {name} 1 2\n```")).unwrap(), want(&format!("craft {name} 1 2")));
    assert_eq!(parse_reply(v, &format!("Action: `info {name}`")).unwrap(), want(&format!("info {name}")));
    assert_eq!(parse_reply(v, "\"finish\"").unwrap(), want("finish"));
    assert_eq!(parse_reply(v, "I will finish now."), Err(text::ReplyError::UnknownWord("I".into())));
    assert_eq!(parse_reply(v, "craft wood"), Err(text::ReplyError::UnknownWord("wood".into())));
    assert_eq!(parse_reply(v, "finish <eos>"), Err(text::ReplyError::UnknownWord("<eos>".into())));
    assert_eq!(parse_reply(v, " \n "), Err(text::ReplyError::Empty));
    // The text of an action parses back to the action.
    let action = want(&format!("spawn {name} 3 , {name}"));
    assert_eq!(parse_reply(v, &text::words(v, &action)).unwrap(), action);
}

#[test]
fn a_conversation_starts_with_the_instructions_and_the_goal_then_alternates() {
    let doc = longdoc::DocConfig { min_lines: 20, max_lines: 40, ..Default::default() };
    let set = LongDocSet { lang: Arc::new(longdoc::Lang::new(&doc)), tasks: longdoc::synthesize(&doc, 1, true, 1) };
    let ep = set.episode(0);
    let goal = ep.root_goal();
    let v = ep.vocab();
    let mut ctx = ep.prompt(&goal, 0, true);
    let first = conversation(ep.as_ref(), &ctx).unwrap();
    assert_eq!(first.len(), 2);
    assert!(first[0].content.contains("`split K`"), "recursive instructions describe launching: {}", first[0].content);
    assert!(first[1].content.starts_with(&format!("Goal: {}", text::words(v, &goal))));
    let flat = conversation(ep.as_ref(), &ep.prompt(&goal, 0, false)).unwrap();
    assert!(!flat[0].content.contains("`split K`") && flat[0].content.contains("no sub-agents"));
    ctx.extend(v.ids("read 0 0 0 0 0 2 <eos>"));
    let obs = ep.step(&goal, &v.ids("read 0 0 0 0 0 2"), true);
    let rao_envs::Step::Observe(obs) = obs.step else { panic!("a read is observed") };
    ctx.extend(&obs);
    let c = conversation(ep.as_ref(), &ctx).unwrap();
    let roles: Vec<_> = c.iter().map(|m| m.role).collect();
    use rao_envs::text::Role::*;
    assert_eq!(roles, vec![System, User, Assistant, User]);
    assert_eq!(c[2].content, "read 0 0 0 0 0 2");
    assert_eq!(c[3].content, text::words(v, &obs));
    assert!(!c[3].content.contains("<obs>"));
}

/// `rao serve` and `policy: openai` are a pair: a checkpoint served over HTTP and driven by the
/// openai policy, greedy, makes the trees the in-process policy makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_openai_against_rao_serve_gives_the_in_process_trees() {
    use rao_stages::serve::{DEFAULT_HEADER_TIMEOUT, Served, serve};
    let world = Arc::new(textcraft::generate(&textcraft::SynthConfig::small(), 5));
    let mut tasks = textcraft::synthesize(&world, textcraft::Band::Easy, 3, true, 5);
    tasks.extend(textcraft::synthesize(&world, textcraft::Band::Medium, 2, true, 5));
    let set: Arc<dyn TaskSet> = Arc::new(rao_stages::envs::textcraft::task_set(&world, &tasks));
    let limit_params = LimitParams::default();
    let cfg = rao_policy::ModelConfig { vocab: set.vocab().len(), ..rao_policy::ModelConfig::tiny() };
    let model = Arc::new(rao_policy::Policy::new(cfg, rao_policy::Backend::default(), 11).unwrap());
    let limits = limit_params.limits(Mode::Recursive);
    let meta = RunMeta { run: "serve-test".into(), iteration: 0, env: set.env().into() };
    let in_process = Arc::new(rao_stages::neural::NeuralPolicy::new(model.clone(), set.grammar(limits.max_children as usize), 0.0));
    let want = rollout_trees(set.as_ref(), &set.all(), in_process, Mode::Recursive, 1, limits, meta.clone(), 9).await;

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, Arc::new(Served::new("tiny".into(), model, set.clone(), &limit_params)), DEFAULT_HEADER_TIMEOUT));
    let cache = tempfile::tempdir().unwrap();
    let api = Arc::new(
        ChatApi::new(ChatEndpoint { model: "tiny".into(), ..endpoint(format!("http://{addr}/v1"), cache.path(), 0) }, cache.path())
            .unwrap(),
    );
    let policy = Arc::new(OpenAiPolicy::new(api, set.episode(0), 0.0));
    let got = rollout_trees(set.as_ref(), &set.all(), policy.clone(), Mode::Recursive, 1, limits, meta, 9).await;
    assert_eq!((policy.unusable.load(Ordering::SeqCst), policy.failed.load(Ordering::SeqCst)), (0, 0));
    assert_eq!(shape(&got), shape(&want), "the trees through rao serve are the in-process policy's");

    // What a request must hold is served, and the ready request it gives is answered.
    let http = reqwest::Client::new();
    let get = |path: &str| {
        let (http, url) = (http.clone(), format!("http://{addr}/v1{path}"));
        async move { http.get(url).send().await.unwrap() }
    };
    let env: serde_json::Value = get("/environment").await.json().await.unwrap();
    let instructions = set.episode(0).instructions(true);
    assert_eq!(env["instructions"]["recursive"], instructions.as_str(), "{env}");
    assert_eq!(env["tasks"], set.len());
    assert!(env["words"].as_array().unwrap().iter().any(|w| w == "craft"), "{env}");
    let example: serde_json::Value = get("/environment/example?task=1&mode=flat").await.json().await.unwrap();
    assert_eq!(example["messages"][0]["content"], set.episode(1).instructions(false).as_str());
    let post = |body: serde_json::Value| {
        let (http, url) = (http.clone(), format!("http://{addr}/v1/chat/completions"));
        async move {
            let resp = http.post(url).json(&body).send().await.unwrap();
            (resp.status().as_u16(), resp.json::<serde_json::Value>().await.unwrap())
        }
    };
    let (status, reply) = post(env["example"].clone()).await;
    assert_eq!(status, 200, "{reply}");
    assert!(!reply["choices"][0]["message"]["content"].as_str().unwrap().is_empty(), "{reply}");
    assert_eq!(get("/environment/example?task=99").await.status().as_u16(), 400);

    // A request that differs is refused saying where, what this environment would show there
    // and what the request has.
    let refused = |body: serde_json::Value| async move {
        let (status, reply) = post(body).await;
        (status, reply["error"]["message"].as_str().unwrap_or_default().to_string())
    };
    let goal = |text: &str| serde_json::json!({"role": "user", "content": text});
    let system = serde_json::json!({"role": "system", "content": instructions});
    let cases = [
        (serde_json::json!([system]), "the request has 1 message(s)"),
        (
            serde_json::json!([{"role": "system", "content": "be nice"}, goal("Goal: win\n(You are at depth 0.)")]),
            "message 0 is not this environment's instructions",
        ),
        (serde_json::json!([system, goal("win")]), "message 1 is the goal as `Goal: GOAL"),
        (serde_json::json!([system, goal("Goal: win\n(You are at depth 0.)")]), "message 1: `win` is not a word of this environment"),
        (serde_json::json!([system, {"role": "assistant", "content": "hello"}]), "message 1 is the goal, role `user`"),
    ];
    for (messages, says) in cases {
        let (status, message) = refused(serde_json::json!({"messages": messages})).await;
        assert_eq!(status, 400, "{message}");
        assert!(message.contains(says), "want `{says}` in: {message}");
    }
    // A turn the environment would not show: its own words are quoted back.
    let mut messages = env["example"]["messages"].clone();
    messages.as_array_mut().unwrap().push(serde_json::json!({"role": "user", "content": "craft"}));
    let (status, message) = refused(serde_json::json!({"messages": messages})).await;
    assert_eq!(status, 400);
    assert!(message.contains("message 2 is not what this environment would show there"), "{message}");
    // The model's name is checked, as OpenAI's API does.
    let (status, message) = refused(serde_json::json!({"model": "gpt-4o", "messages": env["example"]["messages"]})).await;
    assert_eq!((status, message.contains("this server serves `tiny`")), (404, true), "{message}");
}
