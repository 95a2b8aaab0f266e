//! The store against a real S3-compatible server (moto's, from PyPI, started here on 127.0.0.1):
//! a pipeline runs against `s3://bucket/prefix`, is killed mid-run, resumes, and a second
//! "machine" (another process in a fresh directory) finds everything cached. Credentials come
//! from the standard AWS variables and never appear in output or records.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SECRET: &str = "s3cr3t-never-printed-7f3a";

/// moto's S3 server on a free loopback port; stopped on drop.
struct S3Server {
    child: Child,
    port: u16,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_s3() -> S3Server {
    let python = std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into());
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(&python)
        .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {python} -m moto.server ({e}); scripts/test installs moto[server] from PyPI"));
    let server = S3Server { child, port };
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(30), "moto's S3 server did not start (scripts/test installs moto[server])");
        std::thread::sleep(Duration::from_millis(100));
    }
    server
}

/// `PUT /bucket` (moto does not check signatures for bucket creation).
fn create_bucket(port: u16, bucket: &str) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

fn rao(args: &[&str], dir: &Path, port: u16) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rao"));
    c.args(args)
        .current_dir(dir)
        .env("AWS_ACCESS_KEY_ID", "rao-test")
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT", format!("http://127.0.0.1:{port}"))
        .env("AWS_ALLOW_HTTP", "true");
    c
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// a → b (slow: it is where the run gets killed) → c; every stage appends to a local log.
fn pipeline(dir: &Path, log: &Path) {
    let cmd = |name: &str, extra: &str| format!("echo {name} >> {} && {extra}echo {name} > ${{outputs.o}}/v", log.display());
    let text = format!(
        "name: s3-chain\nstages:\n  a: {{kind: shell, params: {{command: '{}'}}, outputs: [o]}}\n  b: {{kind: shell, params: {{command: '{}'}}, inputs: {{i: a.o}}, outputs: [o]}}\n  c: {{kind: shell, params: {{command: '{}'}}, inputs: {{i: b.o}}, outputs: [o]}}\n",
        cmd("a", ""),
        cmd("b", "sleep 2 && cat ${inputs.i}/v >> ${outputs.o}/w && "),
        cmd("c", "cat ${inputs.i}/v ${inputs.i}/w > ${outputs.o}/all && ")
    );
    std::fs::write(dir.join("p.yaml"), text).unwrap();
}

#[test]
fn a_pipeline_on_s3_is_killed_resumes_and_is_reused_from_a_fresh_directory() {
    let s3 = start_s3();
    create_bucket(s3.port, "rao-ci");
    let store = "s3://rao-ci/team/cache";
    let machine1 = tempfile::tempdir().unwrap();
    let log = machine1.path().join("ran.log");
    pipeline(machine1.path(), &log);

    // Kill -9 while b runs (a is done and published to the bucket).
    let mut child = rao(&["run", "p.yaml", "--store", store], machine1.path(), s3.port).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let t0 = Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains('b') {
        assert!(t0.elapsed() < Duration::from_secs(30), "b never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let status = text(&rao(&["status", "p.yaml", "--store", store], machine1.path(), s3.port).output().unwrap());
    assert!(status.contains("done     a") && status.contains("missing  b"), "{status}");

    // Resume: a is reused from the bucket, b and c run.
    let resumed = rao(&["run", "p.yaml", "--store", store], machine1.path(), s3.port).output().unwrap();
    assert!(resumed.status.success(), "{}", text(&resumed));
    assert!(text(&resumed).contains("cached   a"), "{}", text(&resumed));
    let ran = std::fs::read_to_string(&log).unwrap();
    assert_eq!((ran.matches('a').count(), ran.matches('c').count()), (1, 1), "{ran}");

    // A second machine: a fresh directory with only the pipeline file. Everything is cached.
    let machine2 = tempfile::tempdir().unwrap();
    std::fs::copy(machine1.path().join("p.yaml"), machine2.path().join("p.yaml")).unwrap();
    let again = rao(&["run", "p.yaml", "--store", store, "--json"], machine2.path(), s3.port).output().unwrap();
    assert!(again.status.success(), "{}", text(&again));
    let last: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&again.stdout).lines().last().unwrap()).unwrap();
    assert_eq!((last["done"].as_u64(), last["cached"].as_u64()), (Some(0), Some(3)), "{last}");
    assert!(!machine2.path().join(".rao").exists(), "nothing is stored locally");

    for o in [&resumed, &again] {
        assert!(!text(o).contains(SECRET), "the secret key leaked into output");
    }
    let record = rao(&["status", "p.yaml", "--store", store], machine2.path(), s3.port).output().unwrap();
    assert!(text(&record).contains("3/3 done"), "{}", text(&record));
    assert!(!text(&record).contains(SECRET));
}
