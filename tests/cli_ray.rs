//! The Ray executor against a real local Ray head (Ray from PyPI, started here on 127.0.0.1):
//! results equal the in-process executor's bit for bit, and a `rao run` killed while a stage's
//! job runs re-attaches to that job instead of submitting it again.

use crate::support::{rao, text};
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `ray start --head` on free loopback ports; `ray stop` on drop.
struct RayHead {
    ray: PathBuf,
    dashboard: String,
}

impl Drop for RayHead {
    fn drop(&mut self) {
        let _ = Command::new(&self.ray).args(["stop", "--force"]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

fn start_ray() -> RayHead {
    let python = PathBuf::from(std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into()));
    let ray = python.parent().map(|d| d.join("ray")).filter(|p| p.exists()).unwrap_or_else(|| PathBuf::from("ray"));
    let (port, dash) = (free_port(), free_port());
    let out = Command::new(&ray)
        .args(["start", "--head", "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", "--num-cpus=2", "--disable-usage-stats"])
        .arg(format!("--port={port}"))
        .arg(format!("--dashboard-port={dash}"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} ({e}); scripts/test installs ray[default] from PyPI", ray.display()));
    assert!(out.status.success(), "ray start failed: {}", String::from_utf8_lossy(&out.stderr));
    let head = RayHead { ray, dashboard: format!("http://127.0.0.1:{dash}") };
    let t0 = Instant::now();
    while http_get(&head.dashboard, "/api/jobs/").is_none() {
        assert!(t0.elapsed() < Duration::from_secs(60), "Ray's Jobs API did not come up");
        std::thread::sleep(Duration::from_millis(250));
    }
    head
}

/// A tiny HTTP GET (no client library needed for two calls).
fn http_get(base: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let hostport = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(hostport).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n").ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    let code = reply.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, reply.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
}

/// instance → (output files and their blake3), from a local store's index and manifests.
fn outputs(store: &Path, pipeline: &str) -> BTreeMap<String, serde_json::Value> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(store.join("index").join(pipeline)).unwrap() {
        let idx: serde_json::Value = serde_json::from_slice(&std::fs::read(e.unwrap().path()).unwrap()).unwrap();
        let fp = idx["fingerprint"].as_str().unwrap();
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(store.join(format!("objects/{}/{fp}/MANIFEST.json", &fp[..2]))).unwrap()).unwrap();
        out.insert(m["instance"].as_str().unwrap().to_string(), m["outputs"].clone());
    }
    out
}

#[test]
fn ray_runs_a_pipeline_like_the_local_executor_and_reattaches_after_a_kill() {
    let head = start_ray();
    let dir = tempfile::tempdir().unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/shell/pipeline.yaml");
    std::fs::copy(example, dir.path().join("p.yaml")).unwrap();

    let on_ray =
        rao(&["run", "p.yaml", "--store", "ray-store", "--executor", "ray", "--ray-address", &head.dashboard, "-j", "2"], dir.path());
    assert!(on_ray.status.success(), "{}", text(&on_ray));
    let local = rao(&["run", "p.yaml", "--store", "local-store"], dir.path());
    assert!(local.status.success(), "{}", text(&local));
    let (a, b) = (outputs(&dir.path().join("ray-store"), "shell-example"), outputs(&dir.path().join("local-store"), "shell-example"));
    assert_eq!(a.len(), 9);
    assert_eq!(a, b, "Ray and in-process runs give the same files, bit for bit");

    // Kill `rao run` while the slow stage's job runs on Ray; the next run follows that job.
    std::fs::write(
        dir.path().join("slow.yaml"),
        format!(
            "name: slow\nstages:\n  s: {{kind: shell, params: {{command: 'echo ran >> {} && sleep 3 && echo done > ${{outputs.o}}/v'}}, outputs: [o]}}\n",
            dir.path().join("ran.log").display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rao"))
        .args(["run", "slow.yaml", "--store", "slow-store", "--executor", "ray", "--ray-address", &head.dashboard])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !dir.path().join("ran.log").exists() {
        assert!(t0.elapsed() < Duration::from_secs(60), "the Ray job never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap(); // SIGKILL: no chance to stop the job
    child.wait().unwrap();
    let again = rao(&["run", "slow.yaml", "--store", "slow-store", "--executor", "ray", "--ray-address", &head.dashboard], dir.path());
    assert!(again.status.success(), "{}", text(&again));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ran.log")).unwrap(),
        "ran\n",
        "the stage ran once: the job was followed, not resubmitted"
    );
    let fp = outputs(&dir.path().join("slow-store"), "slow");
    assert_eq!(fp.len(), 1);
    let (code, jobs) = http_get(&head.dashboard, "/api/jobs/").unwrap();
    assert_eq!(code, 200);
    let jobs: serde_json::Value = serde_json::from_str(&jobs).unwrap();
    let ours: Vec<&str> = jobs
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["metadata"]["rao_pipeline"] == "slow")
        .filter_map(|j| j["submission_id"].as_str())
        .collect();
    assert_eq!(ours.len(), 1, "one submission: {ours:?}");

    // One stage of a pipeline file on Ray (`executor:` on the stage), the others in-process.
    std::fs::write(
        dir.path().join("mixed.yaml"),
        format!(
            "name: mixed\nstages:\n  a: {{kind: shell, params: {{command: 'echo a > ${{outputs.o}}/v'}}, outputs: [o]}}\n  b:\n    kind: shell\n    executor: {{kind: ray, address: '{}'}}\n    params: {{command: 'cat ${{inputs.i}}/v > ${{outputs.o}}/v; echo b >> ${{outputs.o}}/v'}}\n    inputs: {{i: a.o}}\n    outputs: [o]\n",
            head.dashboard
        ),
    )
    .unwrap();
    let mixed = rao(&["run", "mixed.yaml", "--store", "mixed-store"], dir.path());
    assert!(mixed.status.success(), "{}", text(&mixed));
    let (_, jobs) = http_get(&head.dashboard, "/api/jobs/").unwrap();
    let jobs: serde_json::Value = serde_json::from_str(&jobs).unwrap();
    let on_ray: Vec<&str> = jobs
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["metadata"]["rao_pipeline"] == "mixed")
        .filter_map(|j| j["metadata"]["rao_instance"].as_str())
        .collect();
    assert_eq!(on_ray, vec!["b"], "only the stage that asked for Ray ran there");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("mixed-store/runs/mixed/latest.json")).unwrap()).unwrap();
    assert_eq!(record["executor"], "mixed");
}
