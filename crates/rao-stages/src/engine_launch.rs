//! Engines rao starts itself (`engine: {launch: …}`): vLLM servers on a model's directory, on
//! 127.0.0.1, started by the first stage that needs them, shared by every stage of the run
//! that asks for the same launch, and stopped when the run ends — whatever way it ends.
//!
//! Each server runs in a process group of its own (vLLM's workers outlive a leader that is gone,
//! so the whole group is signalled). `rao` stops the groups when the run ends (`stop_all`);
//! should `rao` itself be killed, a guard process (a shell reading a pipe only `rao` holds) sees
//! the pipe close and kills the groups.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// vLLM's LoRA ranks (`--max-lora-rank` takes only these).
const LORA_RANKS: [usize; 9] = [1, 8, 16, 32, 64, 128, 256, 320, 512];

/// How rao starts the servers.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EngineLaunch {
    /// The model's directory as published (config.json, weights, tokenizer files), local;
    /// relative to the pipeline file's folder.
    pub model: PathBuf,
    /// How many servers to start (each a port of 127.0.0.1).
    #[serde(default = "crate::defaults::one_usize")]
    pub servers: usize,
    /// More server arguments, after rao's own (`--model`, `--served-model-name`, `--host`,
    /// `--port`, and for a checkpoint of LoRA adapters `--enable-lora --max-lora-rank R
    /// --max-loras 2`), e.g. `["--dtype", "bfloat16", "--gpu-memory-utilization", "0.8"]`.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables of the servers (e.g. `CUDA_VISIBLE_DEVICES`, `VLLM_CPU_KVCACHE_SPACE`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The Python that has vLLM (default: `$RAO_VLLM_PYTHON`, else `python3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<PathBuf>,
    /// Seconds a server may take to answer /health.
    #[serde(default = "start_timeout")]
    pub start_timeout_s: u64,
}

fn start_timeout() -> u64 {
    900
}

impl EngineLaunch {
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !(1..=64).contains(&self.servers) {
            out.push(format!("launch.servers must be from 1 to 64 (got {})", self.servers));
        }
        if self.model.to_str().is_some_and(|m| m.contains("://")) {
            out.push(format!(
                "launch.model `{}` is a URL: rao starts engines on a local directory; for a model in a bucket, copy it to the machine or give `urls` of servers you run",
                self.model.display()
            ));
        }
        if !(1..=86_400).contains(&self.start_timeout_s) {
            out.push(format!("launch.start_timeout_s must be from 1 to 86400 (got {})", self.start_timeout_s));
        }
        out
    }
}

struct Server {
    child: Child,
    /// Held open while rao lives: the guard kills the group when it closes.
    _guard_pipe: ChildStdin,
    guard: Child,
    log: PathBuf,
}

impl Server {
    /// Starts `cmd` in a process group of its own, its output to `log`, with a guard that stops
    /// the group when rao's end of a pipe closes (rao ended, however it ended).
    fn spawn(mut cmd: Command, log: PathBuf) -> std::io::Result<Server> {
        let out = std::fs::File::create(&log)?;
        cmd.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn()?;
        let group = child.id();
        // `kill -SIG -PGID`: dash, a common /bin/sh, takes no `--` there.
        let mut guard = Command::new("sh")
            .args(["-c", &format!("read _; kill -TERM -{group} 2>/dev/null; sleep 10; kill -KILL -{group} 2>/dev/null")])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let pipe = guard.stdin.take().expect("piped");
        Ok(Server { child, _guard_pipe: pipe, guard, log })
    }

    fn group(&self) -> i32 {
        self.child.id() as i32
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Its exit status, waiting up to `grace` for it; `None` if it still runs.
    fn exit_within(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        let t0 = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(None) if t0.elapsed() < grace => std::thread::sleep(Duration::from_millis(200)),
                Ok(status) => return status,
                Err(_) => return None,
            }
        }
    }

    /// What went wrong with this server at `url`, if anything: it has exited, or it no longer
    /// answers /health and does not exit within `grace` (hung). `None` while it answers.
    fn failure(&mut self, url: &str, grace: Duration) -> Option<String> {
        let status = match self.child.try_wait() {
            Ok(Some(status)) => Some(status),
            Ok(None) if !answers(&health_url(url)) => self.exit_within(grace),
            _ => return None,
        };
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let cause = first_exception(&log).map(|e| format!(", the first exception in it `{e}`")).unwrap_or_default();
        let what = match status {
            Some(status) => format!("exited ({status})"),
            None => format!("stopped answering /health and has not exited within {} s", grace.as_secs()),
        };
        Some(format!("the engine rao started at {url} {what}; its log is {}{cause}", self.log.display()))
    }

    /// SIGTERM to the group, up to `grace` for it to go, then SIGKILL to what is left.
    fn stop(&mut self, grace: Duration) {
        let group = self.group();
        unsafe { libc::kill(-group, libc::SIGTERM) };
        let _ = self.exit_within(grace);
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.child.wait();
        let _ = self.guard.kill();
        let _ = self.guard.wait();
    }
}

/// One `launch` of this run: the servers' base URLs, found again by the launch's key.
struct Launched {
    key: String,
    urls: Vec<String>,
}

/// The launches started so far. Held across a start, so that stages asking for the same launch
/// at once start it once.
static ENGINES: tokio::sync::Mutex<Vec<Launched>> = tokio::sync::Mutex::const_new(Vec::new());

/// Every server this process started, by base URL, each behind a lock of its own: a diagnosis
/// (which may wait `DYING_GRACE` for a dying server) holds neither a start nor other servers,
/// and a second caller diagnosing the same server waits for the first and gets its answer.
static SERVERS: parking_lot::Mutex<Vec<(String, Arc<parking_lot::Mutex<Server>>)>> = parking_lot::const_mutex(Vec::new());

/// The base URLs (`http://127.0.0.1:PORT/v1`) of the servers of `launch`, serving the model as
/// `served_name`, started now if this run has not started them yet. `lora_rank`: the rank of
/// the checkpoint's adapters (the servers then load adapters at run time).
pub async fn urls(launch: &EngineLaunch, base_dir: &Path, served_name: &str, lora_rank: Option<usize>) -> anyhow::Result<Vec<String>> {
    let model = base_dir.join(&launch.model);
    anyhow::ensure!(
        model.join("config.json").is_file(),
        "launch.model `{}` is not a model directory (no config.json in {})",
        launch.model.display(),
        model.display()
    );
    let key = serde_json::to_string(&(launch, &model, served_name, lora_rank))?;
    let mut engines = ENGINES.lock().await;
    if let Some(e) = engines.iter().find(|e| e.key == key) {
        return Ok(e.urls.clone());
    }
    let launch = launch.clone();
    let served = served_name.to_string();
    let started = tokio::task::spawn_blocking(move || start(&launch, &model, &served, lora_rank)).await??;
    let urls = started.iter().map(|(url, _)| url.clone()).collect::<Vec<_>>();
    SERVERS.lock().extend(started.into_iter().map(|(url, s)| (url, Arc::new(parking_lot::Mutex::new(s)))));
    engines.push(Launched { key, urls: urls.clone() });
    Ok(urls)
}

/// How long a server that no longer answers /health gets to exit before it is reported as
/// hung: after a crash vLLM's teardown takes seconds on a loaded machine, and the requests
/// fail before it has ended.
const DYING_GRACE: Duration = Duration::from_secs(60);

/// Why requests to `urls` may have failed: for each server among them that rao started and
/// that has exited since (or no longer answers /health and does not exit within
/// `DYING_GRACE`), its exit status, its log's path and the first exception in the log (vLLM
/// writes the cause far above the shutdown noise at the end). Called on the failure path
/// only, so the wait for a dying server costs nothing in a healthy run.
pub fn exited(urls: &[String]) -> Vec<String> {
    diagnose(urls, DYING_GRACE)
}

fn diagnose(urls: &[String], grace: Duration) -> Vec<String> {
    let asked: Vec<(String, Arc<parking_lot::Mutex<Server>>)> =
        SERVERS.lock().iter().filter(|(url, _)| urls.contains(url)).map(|(url, s)| (url.clone(), s.clone())).collect();
    asked.into_iter().filter_map(|(url, server)| server.lock().failure(&url, grace)).collect()
}

/// The first `SomethingError: …` or `SomethingException: …` a log reports, without the log
/// line's prefix: the cause, where later ones (vLLM's `EngineDeadError`) are consequences.
fn first_exception(log: &str) -> Option<&str> {
    log.lines().find_map(|line| {
        // vLLM's lines: `(Worker pid=N) ERROR date time [file:line] RuntimeError: …`.
        let message = line.rsplit_once("] ").map_or(line, |(_, m)| m).trim();
        let (name, _) = message.split_once(": ")?;
        let is_type = !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '.');
        (is_type && (name.ends_with("Error") || name.ends_with("Exception"))).then_some(message)
    })
}

/// Stops every server this process started (the end of a run).
pub async fn stop_all() {
    ENGINES.lock().await.clear();
    let servers = std::mem::take(&mut *SERVERS.lock());
    if servers.is_empty() {
        return;
    }
    let _ = tokio::task::spawn_blocking(move || {
        for (_, s) in servers {
            s.lock().stop(Duration::from_secs(15));
        }
    })
    .await;
}

/// Starts the servers side by side and waits until each answers.
fn start(launch: &EngineLaunch, model: &Path, served: &str, lora_rank: Option<usize>) -> anyhow::Result<Vec<(String, Server)>> {
    let python =
        launch.python.clone().or_else(|| std::env::var_os("RAO_VLLM_PYTHON").map(PathBuf::from)).unwrap_or_else(|| "python3".into());
    let logs = std::env::temp_dir().join("rao-engines");
    std::fs::create_dir_all(&logs)?;
    let mut servers = Vec::new();
    for _ in 0..launch.servers {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = logs.join(format!("vllm-{}-{port}.log", std::process::id()));
        let mut cmd = Command::new(&python);
        cmd.args(["-m", "vllm.entrypoints.openai.api_server", "--model"]).arg(model).args([
            "--served-model-name",
            served,
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ]);
        if let Some(rank) = lora_rank {
            let max_rank = LORA_RANKS.iter().find(|&&r| r >= rank).copied().unwrap_or(rank);
            cmd.args(["--enable-lora", "--max-lora-rank", &max_rank.to_string(), "--max-loras", "2"]);
            cmd.env("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True");
        }
        cmd.args(&launch.args).envs(&launch.env);
        let server =
            Server::spawn(cmd, log).map_err(|e| anyhow::anyhow!("could not start `{}` (the Python with vLLM): {e}", python.display()))?;
        servers.push((format!("http://127.0.0.1:{port}/v1"), server));
    }
    let t0 = Instant::now();
    let limit = Duration::from_secs(launch.start_timeout_s);
    for i in 0..servers.len() {
        let health = health_url(&servers[i].0);
        loop {
            let server = &mut servers[i].1;
            if let Some(status) = server.child.try_wait()? {
                let tail = server.log_tail();
                stop_these(servers);
                anyhow::bail!("the engine exited ({status}) before answering; its log ends:\n{tail}");
            }
            if answers(&health) {
                break;
            }
            if t0.elapsed() > limit {
                let tail = servers[i].1.log_tail();
                stop_these(servers);
                anyhow::bail!(
                    "the engine did not answer within {} s (launch.start_timeout_s); its log ends:\n{tail}",
                    launch.start_timeout_s
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    Ok(servers)
}

fn stop_these(servers: Vec<(String, Server)>) {
    for (_, mut s) in servers {
        s.stop(Duration::from_secs(5));
    }
}

/// A server's health check URL from its base URL (`http://127.0.0.1:PORT/v1`).
fn health_url(base: &str) -> String {
    base.trim_end_matches("/v1").to_string() + "/health"
}

/// Whether `GET url` answers 200 (one short HTTP/1.1 exchange).
fn answers(url: &str) -> bool {
    use std::io::Read;
    let Some(rest) = url.strip_prefix("http://") else { return false };
    let Some((host, path)) = rest.split_once('/') else { return false };
    let Ok(mut s) = std::net::TcpStream::connect(host) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if write!(s, "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    // `HTTP/1.x 200`: a server may answer in HTTP/1.0 (Python's http.server does).
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && &head[8..] == b" 200"
}

#[cfg(test)]
mod tests {
    use super::{Server, first_exception};
    use std::io::{Read, Write};
    use std::process::Command;
    use std::time::{Duration, Instant};

    /// A base URL of 127.0.0.1 where nothing listens.
    fn silent_url() -> String {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        format!("http://127.0.0.1:{port}/v1")
    }

    fn server(script: &str, dir: &std::path::Path) -> Server {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        Server::spawn(cmd, dir.join("engine.log")).unwrap()
    }

    /// A server that stopped answering is given the grace to exit, and its exit and the cause
    /// in its log are named; one that neither answers nor exits is named as hung.
    #[test]
    fn a_dying_engine_is_named_with_its_cause_and_a_hung_one_as_hung() {
        let dir = tempfile::tempdir().unwrap();
        let url = silent_url();
        let mut dying = server("sleep 1; echo 'RuntimeError: out of blocks'; exit 3", dir.path());
        let said = dying.failure(&url, Duration::from_secs(30)).expect("a failure");
        assert!(said.contains("exited (exit status: 3)") && said.contains("`RuntimeError: out of blocks`"), "{said}");

        let mut hung = server("exec sleep 600", dir.path());
        let t0 = Instant::now();
        let said = hung.failure(&url, Duration::from_secs(1)).expect("a failure");
        assert!(said.contains("stopped answering /health and has not exited within 1 s"), "{said}");
        assert!(t0.elapsed() < Duration::from_secs(10));
        // `stop` waits for the process: it returns early only if the SIGKILL after the grace took.
        let t0 = Instant::now();
        hung.stop(Duration::from_secs(1));
        assert!(t0.elapsed() < Duration::from_secs(30), "the hung engine outlived its stop");
    }

    /// A diagnosis does not wait for a start (the launches' lock), and two callers asking about
    /// the same dying server at once both get its exit and cause.
    #[test]
    fn concurrent_callers_each_get_the_diagnosis_while_a_start_holds_the_launches() {
        let dir = tempfile::tempdir().unwrap();
        let url = silent_url();
        let dying = server("sleep 1; echo 'RuntimeError: out of blocks'; exit 3", dir.path());
        super::SERVERS.lock().push((url.clone(), std::sync::Arc::new(parking_lot::Mutex::new(dying))));
        let _start_in_progress = super::ENGINES.try_lock().unwrap();
        let callers: Vec<_> = (0..2)
            .map(|_| {
                let url = url.clone();
                std::thread::spawn(move || super::diagnose(std::slice::from_ref(&url), Duration::from_secs(30)))
            })
            .collect();
        for caller in callers {
            let said = caller.join().unwrap();
            assert!(said.len() == 1 && said[0].contains("exited (exit status: 3)") && said[0].contains("out of blocks"), "{said:?}");
        }
        super::SERVERS.lock().retain(|(u, _)| *u != url);
    }

    /// A base URL of 127.0.0.1 whose every request gets `status_line` back.
    fn answering_url(status_line: &'static str) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf);
                let _ = conn.write_all(format!("{status_line}\r\ncontent-length: 0\r\n\r\n").as_bytes());
            }
        });
        url
    }

    /// A server that answers /health (in HTTP/1.1 or 1.0) is not blamed for a failed request;
    /// one that answers with an error is.
    #[test]
    fn an_engine_that_answers_is_not_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut alive = server("exec sleep 600", dir.path());
        for status_line in ["HTTP/1.1 200 OK", "HTTP/1.0 200 OK"] {
            assert_eq!(alive.failure(&answering_url(status_line), Duration::from_secs(30)), None, "{status_line}");
        }
        let said = alive.failure(&answering_url("HTTP/1.1 503 Service Unavailable"), Duration::from_secs(1));
        assert!(said.is_some_and(|s| s.contains("stopped answering /health")));
        alive.stop(Duration::from_secs(1));
    }

    #[test]
    fn the_first_exception_of_a_log_is_its_cause() {
        let log = "WARNING [x.py:1] limits can cause errors like `OSError: [Errno 24] Too many open files`\n\
                   (Worker pid=1) ERROR 12-06 19:43:06 [m.py:10] Traceback (most recent call last):\n\
                   (Worker pid=1) ERROR 12-06 19:43:06 [m.py:10] RuntimeError: CPU Generator does not use offset\n\
                   (APIServer pid=2) ERROR 12-06 19:43:06 [a.py:9] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n";
        assert_eq!(first_exception(log), Some("RuntimeError: CPU Generator does not use offset"));
        assert_eq!(first_exception("INFO all well\n"), None);
    }
}
