//! `rao serve` and `policy: openai` end to end: a trained checkpoint served over HTTP on
//! 127.0.0.1, an `evaluate` stage whose policy is that endpoint, and the trees it writes equal to
//! the in-process evaluation's (greedy); the official `openai` Python client talks to the server.

use crate::support::{rao, text};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BASE: &str = r#"
name: served
seed: 2
params:
  limits: {window: 64, max_depth: 2, max_children: 2, max_nodes: 8, step_budget: 6}
stages:
  demo_tasks: {kind: synthesize, params: {tiers: [1, 2], per_band: 24, task_seed: 1}}
  gate_tasks: {kind: synthesize, params: {tiers: [1, 1], per_band: 8, split: validation, task_seed: 2}}
  eval_tasks: {kind: synthesize, params: {tiers: [1, 2], per_band: 6, split: validation, task_seed: 3}}
  warmstart:
    kind: warmstart
    inputs: {tasks: demo_tasks.tasks, gate_tasks: gate_tasks.tasks}
    params:
      model: {d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64}
      limits: "${params.limits}"
      max_steps: 30
      eval_every: 30
      batch: 16
      gate: {required: false}
  evaluate:
    kind: evaluate
    inputs: {tasks: eval_tasks.tasks, checkpoint: warmstart.checkpoint}
    params: {temperature: 0, modes: [recursive, flat], limits: "${params.limits}"}
"#;

/// An evaluation that samples (temperature 1), in process; the same instance name through the
/// server in another file gets the same seeds.
const SAMPLED: &str = r#"  evaluate_sampled:
    kind: evaluate
    inputs: {tasks: eval_tasks.tasks, checkpoint: warmstart.checkpoint}
    params: {temperature: 1, modes: [recursive], limits: "${params.limits}"}
"#;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 request over a plain socket: (status code, body).
fn post_raw(addr: &str, path: &str, content_type: &str, body: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer.split_whitespace().nth(1).unwrap_or("").to_string();
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `rao serve p.yaml evaluate` (plus `extra` arguments) on a free port, once it listens.
fn start_server(dir: &Path, extra: &[&str]) -> (Server, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let server = Server(
        Command::new(env!("CARGO_BIN_EXE_rao"))
            .args(["serve", "p.yaml", "evaluate", "--addr", &addr])
            .args(extra)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t0 = Instant::now();
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(60), "rao serve did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, addr)
}

fn trees(dir: &Path, pipeline: &str, instance: &str) -> Vec<rao_core::NodeRecord> {
    let o = rao(&["path", pipeline, instance, "trees.parquet"], dir);
    assert!(o.status.success(), "{}", text(&o));
    let path = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let mut nodes = rao_core::parquet_io::nodes_from_parquet(std::fs::read(path).unwrap().into()).unwrap();
    nodes.sort_by(|a, b| (&a.mode, &a.task_id, a.group, a.node_id).cmp(&(&b.mode, &b.task_id, b.group, b.node_id)));
    nodes
}

/// The README's `rao serve` example with `addr` for its address: the shell lines that talk to the
/// server (`curl …`) and the Python block.
fn readme_serve_example(addr: &str) -> (String, String) {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap();
    let section = &readme[readme.find("## Serve the trained agent").expect("the README's serve section")..];
    let block = |fence: &str| {
        let start = section.find(fence).unwrap_or_else(|| panic!("a {fence} block in the serve section")) + fence.len();
        section[start..start + section[start..].find("```").unwrap()].replace("127.0.0.1:8000", addr)
    };
    // Its lines that talk to the server: the wait for it to listen, then the request.
    let curl = block("```sh\n").lines().filter(|l| l.starts_with("curl ") || l.starts_with("until curl ")).collect::<Vec<_>>().join("\n");
    assert!(!curl.is_empty(), "the serve section's shell block talks to the server with curl");
    (curl, block("```python\n"))
}

/// The base file plus an evaluation named `stage` whose policy is the server at `addr`.
fn through_server(addr: &str, stage: &str, temperature: u32, modes: &str) -> String {
    format!(
        "{BASE}  {stage}:
    kind: evaluate
    inputs: {{tasks: eval_tasks.tasks}}
    params:
      policy: openai
      openai: {{base_url: \"http://{addr}/v1\", model: served/evaluate, cache_dir: .rao/chat-cache, retries: 0}}
      temperature: {temperature}
      modes: [{modes}]
      limits: \"${{params.limits}}\"
"
    )
}

#[test]
fn an_evaluation_through_rao_serve_equals_the_in_process_one() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.yaml"), format!("{BASE}{SAMPLED}")).unwrap();
    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));

    let (_server, addr) = start_server(dir.path(), &[]);

    // A body that is not JSON, or not declared as JSON, is refused with a JSON error too.
    for (content_type, body, status) in [("application/json", "{\"messages\": [", "400"), ("text/plain", "{}", "415")] {
        let (code, answer) = post_raw(&addr, "/v1/chat/completions", content_type, body);
        assert_eq!(code, status, "{answer}");
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("not JSON ({e}): {answer}"));
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{answer}");
        assert!(!answer["error"]["message"].as_str().unwrap_or("").is_empty(), "{answer}");
    }

    // Unknown routes and methods, and options the server does not serve, are JSON errors too:
    // a client is never left to believe it streamed or got `n` choices.
    let chat = |extra: &str| format!("{{\"messages\": [{{\"role\": \"user\", \"content\": \"x\"}}]{extra}}}");
    for (path, body, status, says) in [
        ("/v1/completions", "{}".to_string(), "404", "no route /v1/completions"),
        ("/v1/models", "{}".to_string(), "405", "POST is not served at /v1/models"),
        ("/v1/chat/completions", chat(", \"stream\": true"), "400", "`stream`"),
        ("/v1/chat/completions", chat(", \"n\": 3"), "400", "`n`"),
        ("/v1/chat/completions", chat(", \"max_tokens\": 0"), "400", "`max_tokens`"),
    ] {
        let (code, answer) = post_raw(&addr, path, "application/json", &body);
        assert_eq!(code, status, "{path} {body}: {answer}");
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("not JSON ({e}): {answer}"));
        assert!(answer["error"]["message"].as_str().unwrap_or("").contains(says), "{answer}");
    }

    // The same file plus an evaluation whose policy is the server.
    std::fs::write(dir.path().join("q.yaml"), through_server(&addr, "evaluate_served", 0, "recursive, flat")).unwrap();
    let o = rao(&["run", "q.yaml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("cached   warmstart"), "the checkpoint is the one served:\n{}", text(&o));
    let (want, got) = (trees(dir.path(), "q.yaml", "evaluate"), trees(dir.path(), "q.yaml", "evaluate_served"));
    assert_eq!(want.len(), got.len());
    assert!(want.iter().map(|n| n.turns.len()).sum::<usize>() > want.len(), "the nodes act more than once");
    for (w, g) in want.iter().zip(&got) {
        let turns =
            |n: &rao_core::NodeRecord| n.turns.iter().map(|t| (t.completion_ids.clone(), t.observation_ids.clone())).collect::<Vec<_>>();
        assert_eq!((&w.mode, &w.task_id, w.node_id, &w.goal, &w.status), (&g.mode, &g.task_id, g.node_id, &g.goal, &g.status));
        assert_eq!(turns(w), turns(g), "task {} node {}", w.task_id, w.node_id);
        assert_eq!(w.score, g.score);
    }

    // Sampled through the server: the same actions, and each reply's log-probs (the server's,
    // stop token included) sum to the in-process behaviour log-probs of that action.
    std::fs::write(dir.path().join("r.yaml"), through_server(&addr, "evaluate_sampled", 1, "recursive")).unwrap();
    let o = rao(&["run", "r.yaml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let (want, got) = (trees(dir.path(), "p.yaml", "evaluate_sampled"), trees(dir.path(), "r.yaml", "evaluate_sampled"));
    assert_eq!(want.len(), got.len());
    let mut sampled_turns = 0;
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(w.turns.len(), g.turns.len(), "task {} node {}", w.task_id, w.node_id);
        for (tw, tg) in w.turns.iter().zip(&g.turns) {
            assert_eq!(tw.completion_ids, tg.completion_ids, "task {} node {}: the same sample", w.task_id, w.node_id);
            let (lw, lg) = (tw.logprobs.iter().sum::<f32>(), tg.logprobs.iter().sum::<f32>());
            assert!((lw - lg).abs() < 1e-4, "task {} node {}: log-prob {lg} through the server, {lw} in process", w.task_id, w.node_id);
            assert!(tg.logprobs.iter().skip(1).all(|&l| l == 0.0), "the reply's log-prob is on its first token");
            sampled_turns += usize::from(lw < -1e-3);
        }
    }
    assert!(sampled_turns > 0, "some actions were not certain, so the log-probs are checked");

    // The official client: the model list, and a conversation rao would never show refused with
    // the reason.
    let python = std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = format!(
        r#"
import openai
client = openai.OpenAI(base_url="http://{addr}/v1", api_key="unused", max_retries=0)
print(client.models.list().data[0].id)
try:
    client.chat.completions.create(model="served/evaluate", messages=[{{"role": "system", "content": "hi"}}, {{"role": "user", "content": "Goal: win\n(You are at depth 0.)"}}])
    print("accepted")
except openai.BadRequestError as e:
    print("refused:", e.body["message"] if isinstance(e.body, dict) else e)
"#
    );
    let out = Command::new(&python).arg("-c").arg(&script).output().expect("python runs");
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "the openai client (scripts/test installs it):\n{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.starts_with("served/evaluate\n"), "{said}");
    assert!(said.contains("refused: message 0 is not this environment's instructions"), "{said}");

    // The README's serve example, as pasted (its address made this server's): the curl pipe and
    // the Python client each get an action back; `--explain` prints what a request holds.
    let (curl, python_example) = readme_serve_example(&addr);
    // (`timeout`: a wait line whose route the server lacks would loop for ever.)
    let out = Command::new("timeout").args(["60", "sh", "-c"]).arg(&curl).output().expect("sh runs");
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("the README's curl example ({e}):\n{curl}\n{}", String::from_utf8_lossy(&out.stdout)));
    assert!(!reply["choices"][0]["message"]["content"].as_str().unwrap_or("").is_empty(), "{reply}");
    let out = Command::new(&python).arg("-c").arg(&python_example).output().expect("python runs");
    let action = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(out.status.success() && !action.is_empty(), "the README's Python example:\n{action}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(action, reply["choices"][0]["message"]["content"], "both ask for task 0's root agent, greedy");
    let explained = text(&rao(&["serve", "p.yaml", "evaluate", "--explain"], dir.path()));
    assert!(explained.contains("The recursive instructions (message 0):") && explained.contains("curl -s"), "{explained}");

    // A client that opens connections and sends nothing, or headers a byte at a time, has them
    // closed after `--header-timeout`; the server keeps answering others.
    let (_slow, addr) = start_server(dir.path(), &["--header-timeout", "1"]);
    let closed_within = |partial: &[u8]| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let t0 = Instant::now();
        for &b in partial {
            if s.write_all(&[b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut rest = Vec::new();
        match s.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "not closed: {e}"),
        }
        t0.elapsed()
    };
    let silent = closed_within(b"");
    let trickle = closed_within(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    for (what, took) in [("silent", silent), ("trickling", trickle)] {
        assert!(took < Duration::from_secs(10), "a {what} connection held {took:?}");
    }
    let (code, answer) = post_raw(&addr, "/v1/completions", "application/json", "{}");
    assert_eq!(code, "404", "{answer}");
}
