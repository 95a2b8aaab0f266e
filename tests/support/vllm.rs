//! A real vLLM (PyPI's CPU build, installed by `scripts/python-tools` into target/py) serving a
//! tiny random Qwen3 on 127.0.0.1, for the tests of rao's OpenAI-compatible client and engine
//! rollouts. `RAO_VLLM_PYTHON` names the engine's interpreter (`scripts/test` sets it),
//! `RAO_PYTHON` the reference tools' (to make the model). The server runs in a process group of
//! its own, stopped (SIGTERM to the group, then SIGKILL) when the handle drops: killing only its
//! leader leaves the engine's worker processes running.
#![allow(dead_code)] // each test file uses some of these

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long an engine may take to answer /health (53–57 s on 2 busy cores, measured).
const START_TIMEOUT: Duration = Duration::from_secs(300);

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python(var: &str, what: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var} names {what} (scripts/test sets it)"))
}

/// The tiny Qwen3 vLLM's CPU attention can run (head width 32), made once per test process in `dir`.
pub fn tiny_model(dir: &Path) -> PathBuf {
    let out = dir.join("tiny-qwen3-hd32");
    let o = Command::new(python("RAO_PYTHON", "the reference tools' Python"))
        .arg(root().join("scripts/make_tiny_qwen3_vllm.py"))
        .arg(&out)
        .output()
        .expect("python runs");
    assert!(o.status.success(), "make_tiny_qwen3_vllm.py:\n{}", String::from_utf8_lossy(&o.stderr));
    out
}

pub struct Vllm {
    child: Child,
    pub port: u16,
    /// The model's name in requests (the `--served-model-name`).
    pub model: String,
    log: PathBuf,
    _guard: (Child, Option<std::process::ChildStdin>),
}

impl Vllm {
    /// Starts `vllm` on `model` (extra server arguments after it) and waits until it answers.
    pub fn start(model: &Path, log_dir: &Path, extra: &[&str]) -> Vllm {
        Vllm::launch(model, log_dir, extra).ready()
    }

    /// Starts `vllm` without waiting (several start faster side by side; then `ready`).
    pub fn launch(model: &Path, log_dir: &Path, extra: &[&str]) -> Vllm {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = log_dir.join(format!("vllm-{port}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let served = "tiny";
        let mut cmd = Command::new(python("RAO_VLLM_PYTHON", "the engine's Python (scripts/python-tools)"));
        cmd.args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
            .arg(model)
            .args([
                "--served-model-name",
                served,
                "--dtype",
                "float32",
                "--max-model-len",
                "4096",
                "--enforce-eager",
                "--no-enable-chunked-prefill",
            ])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(extra)
            .env("VLLM_CPU_KVCACHE_SPACE", "1")
            .env("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().expect("start vllm");
        // A guard: when this test process ends (a shared server in a static is never dropped),
        // the pipe closes and the guard stops the server's group.
        let mut guard = Command::new("sh")
            .args(["-c", &format!("read _; kill -TERM -{0} 2>/dev/null; sleep 10; kill -KILL -{0} 2>/dev/null", child.id())])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the guard");
        let guard_pipe = guard.stdin.take();
        Vllm { child, port, model: served.into(), log, _guard: (guard, guard_pipe) }
    }

    /// Waits until the server answers /health.
    pub fn ready(mut self) -> Vllm {
        let t0 = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("vllm exited ({status}) before answering:\n{}", self.log_tail());
            }
            if self.get("/health").is_some_and(|(code, _)| code == 200) {
                return self;
            }
            assert!(t0.elapsed() < START_TIMEOUT, "vllm did not answer within {START_TIMEOUT:?}:\n{}", self.log_tail());
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// A GET on the server: (status code, body), or `None` when nothing answers.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http(self.port, "GET", path, "")
    }

    /// A JSON POST on the server: (status code, body).
    pub fn post(&self, path: &str, body: &serde_json::Value) -> (u16, String) {
        http(self.port, "POST", path, &body.to_string()).expect("vllm answers")
    }
}

impl Vllm {
    /// SIGKILL to the whole server at once, as a crashed machine would go.
    pub fn kill_now(&mut self) {
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Vllm {
    fn drop(&mut self) {
        let group = self.child.id() as i32;
        unsafe { libc::kill(-group, libc::SIGTERM) };
        let t0 = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() && t0.elapsed() < Duration::from_secs(15) {
            std::thread::sleep(Duration::from_millis(100));
        }
        // Whatever of the group is left (the engine's workers outlive a leader that is gone).
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 exchange over a plain socket (bounded by timeouts).
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(120))).ok()?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let code = answer.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
}
