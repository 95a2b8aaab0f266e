//! The store against a real S3-compatible server (moto's, from PyPI, started here on 127.0.0.1):
//! a pipeline runs against `s3://bucket/prefix`, is killed mid-run, resumes, and a second
//! "machine" (another process in a fresh directory) finds everything cached. Credentials come
//! from the standard AWS variables and never appear in output or records. Task datasets are read
//! straight from the bucket and re-run what depends on them when their ETag changes; transient
//! failures (connection refused, 500s) between rao and the server are retried.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::concurrent;
use crate::support::text;

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

/// Send one raw HTTP request to moto and return its reply. A server that has just opened its
/// port may still reset a connection: try again for a few seconds.
fn request(port: u16, head: &str, body: &[u8]) -> String {
    let t0 = Instant::now();
    loop {
        let attempt = (|| -> std::io::Result<String> {
            let mut s = TcpStream::connect(("127.0.0.1", port))?;
            s.write_all(head.as_bytes())?;
            s.write_all(body)?;
            let mut reply = String::new();
            s.read_to_string(&mut reply)?;
            Ok(reply)
        })();
        match attempt {
            Ok(reply) => return reply,
            Err(e) if t0.elapsed() < Duration::from_secs(10) => eprintln!("moto not ready ({e}); retrying"),
            Err(e) => panic!("moto on port {port}: {e}"),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `PUT /bucket` (moto does not check signatures for bucket creation).
fn create_bucket(port: u16, bucket: &str) {
    let reply =
        request(port, &format!("PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"), b"");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

/// Upload a local file to `bucket/key` with boto3 (installed with moto), as a user's tooling would.
fn put_object(port: u16, bucket: &str, key: &str, file: &Path) {
    let python = std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import sys, boto3\n\
                  s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1', aws_access_key_id='x', aws_secret_access_key='y')\n\
                  s3.upload_file(sys.argv[2], sys.argv[3], sys.argv[4])\n";
    let out = Command::new(python)
        .args(["-c", script, &format!("http://127.0.0.1:{port}"), &file.display().to_string(), bucket, key])
        .output()
        .unwrap();
    assert!(out.status.success(), "upload failed: {}", text(&out));
}

fn rao(args: &[&str], dir: &Path, port: u16) -> Command {
    let mut c = crate::support::command(args, dir);
    c.env("AWS_ACCESS_KEY_ID", "rao-test")
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT", format!("http://127.0.0.1:{port}"))
        .env("AWS_ALLOW_HTTP", "true");
    c
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
    let mut child =
        rao(&["run", "p.yaml", "--store", store], machine1.path(), s3.port).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
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

/// Run `rao` and return its JSON events' final summary (done, cached).
fn run_json(args: &[&str], dir: &Path, port: u16) -> (u64, u64) {
    let out = rao(args, dir, port).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(!text(&out).contains(SECRET), "the secret key leaked into output");
    let last: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    (last["done"].as_u64().unwrap(), last["cached"].as_u64().unwrap())
}

#[test]
fn a_task_dataset_in_the_bucket_reruns_what_reads_it_when_its_etag_changes() {
    let s3 = start_s3();
    create_bucket(s3.port, "rao-data");
    let dir = tempfile::tempdir().unwrap();

    // Two task sets (world.json + tasks.parquet each), made by rao itself in a local store.
    let make_sets = "name: gen\nstages:\n  a: {kind: synthesize, params: {per_band: 3, task_seed: 1}}\n  b: {kind: synthesize, params: {per_band: 5, task_seed: 2}}\n  \
               out_a: {kind: shell, params: {command: 'mkdir -p set1 && cp ${inputs.t}/* set1/'}, inputs: {t: a.tasks}, outputs: [o]}\n  \
               out_b: {kind: shell, params: {command: 'mkdir -p set2 && cp ${inputs.t}/* set2/'}, inputs: {t: b.tasks}, outputs: [o]}\n";
    std::fs::write(dir.path().join("gen.yaml"), make_sets).unwrap();
    let made = rao(&["run", "gen.yaml"], dir.path(), s3.port).output().unwrap();
    assert!(made.status.success(), "{}", text(&made));
    let read = |p: &str| std::fs::read(dir.path().join(p)).unwrap();
    put_object(s3.port, "rao-data", "textcraft/world.json", &dir.path().join("set1/world.json"));
    put_object(s3.port, "rao-data", "textcraft/tasks.parquet", &dir.path().join("set1/tasks.parquet"));

    // The pipeline reads the bucket prefix; its last stage copies the tasks it got out for us.
    let p = "name: from-bucket\nstore: s3://rao-data/cache\nstages:\n  data: {kind: dataset, params: {url: 's3://rao-data/textcraft/'}}\n  \
             tasks: {kind: synthesize, inputs: {dataset: data.data}, params: {tasks_file: tasks.parquet}}\n  \
             seen: {kind: shell, params: {command: 'cp ${inputs.t}/tasks.parquet seen.parquet'}, inputs: {t: tasks.tasks}, outputs: [o]}\n";
    std::fs::write(dir.path().join("p.yaml"), p).unwrap();
    assert_eq!(run_json(&["run", "p.yaml"], dir.path(), s3.port), (3, 0));
    assert_eq!(read("seen.parquet"), read("set1/tasks.parquet"), "the tasks read from the bucket are the tasks uploaded");
    assert_eq!(run_json(&["run", "p.yaml"], dir.path(), s3.port), (0, 3), "unchanged dataset: all cached");

    // A new version of the task file (new ETag): the dataset and everything after it re-run.
    put_object(s3.port, "rao-data", "textcraft/tasks.parquet", &dir.path().join("set2/tasks.parquet"));
    let plan = text(&rao(&["plan", "p.yaml"], dir.path(), s3.port).output().unwrap());
    assert!(plan.contains("will run") && plan.contains("data"), "{plan}");
    assert_eq!(run_json(&["run", "p.yaml"], dir.path(), s3.port), (3, 0));
    assert_eq!(read("seen.parquet"), read("set2/tasks.parquet"));
    assert_eq!(run_json(&["run", "p.yaml"], dir.path(), s3.port), (0, 3));
}

/// A real HTTP hop between rao and the S3 server that misbehaves on purpose: it does not listen
/// for its first `quiet` (connections are refused), then answers every `nth` request with a 500
/// and forwards the others (one request per connection), each after holding it for `hold` (a
/// bucket that far away). It counts the requests it has at once.
struct FlakyProxy {
    port: u16,
    failures: Arc<AtomicUsize>,
    forwarded: Arc<AtomicUsize>,
    most_at_once: Arc<AtomicUsize>,
}

fn start_flaky_proxy(upstream: u16, quiet: Duration, nth: usize, hold: Duration) -> FlakyProxy {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (failures, forwarded, most_at_once) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (f, w, most) = (failures.clone(), forwarded.clone(), most_at_once.clone());
    std::thread::spawn(move || {
        std::thread::sleep(quiet);
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let at_once = Arc::new(AtomicUsize::new(0));
        for client in listener.incoming().flatten() {
            let (f, w, seen, at_once, most) = (f.clone(), w.clone(), seen.clone(), at_once.clone(), most.clone());
            std::thread::spawn(move || {
                most.fetch_max(at_once.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                std::thread::sleep(hold);
                let _ = relay(client, upstream, || seen.fetch_add(1, Ordering::SeqCst) % nth == nth - 1, &f, &w);
                at_once.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    FlakyProxy { port, failures, forwarded, most_at_once }
}

/// Read an HTTP message head (through the blank line) and return it with the bytes read past it.
fn read_head(s: &mut TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&buf).to_string(), rest));
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The head with its `Connection` header replaced by `Connection: close`.
fn closing(head: &str) -> String {
    let mut lines: Vec<&str> = head.trim_end().split("\r\n").filter(|l| !l.to_ascii_lowercase().starts_with("connection:")).collect();
    lines.push("Connection: close");
    lines.join("\r\n") + "\r\n\r\n"
}

fn relay(
    mut client: TcpStream,
    upstream: u16,
    fail: impl Fn() -> bool,
    failures: &AtomicUsize,
    forwarded: &AtomicUsize,
) -> std::io::Result<()> {
    let (head, mut body) = read_head(&mut client)?;
    let length = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap()))
        .unwrap_or(0);
    assert!(!head.to_ascii_lowercase().contains("transfer-encoding: chunked"), "the proxy handles sized bodies only");
    while body.len() < length {
        let mut chunk = vec![0u8; length - body.len()];
        let n = client.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    if fail() {
        failures.fetch_add(1, Ordering::SeqCst);
        let msg = "<Error><Code>InternalError</Code><Message>injected by the test</Message></Error>";
        return write!(
            client,
            "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{msg}",
            msg.len()
        );
    }
    let mut up = TcpStream::connect(("127.0.0.1", upstream))?;
    up.write_all(closing(&head).as_bytes())?;
    up.write_all(&body)?;
    let (reply_head, first) = read_head(&mut up)?;
    client.write_all(closing(&reply_head).as_bytes())?;
    client.write_all(&first)?;
    std::io::copy(&mut up, &mut client)?;
    forwarded.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[test]
fn refused_connections_and_500s_from_the_bucket_are_retried() {
    let s3 = start_s3();
    create_bucket(s3.port, "rao-flaky");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ran.log");
    pipeline(dir.path(), &log);
    let store = "s3://rao-flaky/cache";

    // rao starts while nothing listens on the proxy's port, and every 3rd request then fails.
    let proxy = start_flaky_proxy(s3.port, Duration::from_millis(1500), 3, Duration::ZERO);
    let run = rao(&["run", "p.yaml", "--store", store], dir.path(), proxy.port).output().unwrap();
    assert!(run.status.success(), "{}", text(&run));
    assert!(!text(&run).contains(SECRET));
    let (failed, forwarded) = (proxy.failures.load(Ordering::SeqCst), proxy.forwarded.load(Ordering::SeqCst));
    assert!(failed >= 3 && forwarded >= 6, "the proxy served {failed} failures and {forwarded} good replies");

    // Straight to the server: every stage is done, once, with the right content.
    let status = text(&rao(&["status", "p.yaml", "--store", store], dir.path(), s3.port).output().unwrap());
    assert!(status.contains("3/3 done"), "{status}");
    let ran = std::fs::read_to_string(&log).unwrap();
    assert_eq!(ran.lines().collect::<Vec<_>>(), ["a", "b", "c"], "each stage ran exactly once");
}

#[test]
fn a_cached_run_on_a_distant_bucket_has_many_requests_in_flight() {
    let s3 = start_s3();
    create_bucket(s3.port, "rao-far");
    let dir = tempfile::tempdir().unwrap();
    let mut text_of =
        String::from("name: far-chain\nstages:\n  s0: {kind: shell, params: {command: 'echo 0 > ${outputs.o}/v'}, outputs: [o]}\n");
    for i in 1..40 {
        text_of.push_str(&format!("  s{i}: {{kind: shell, params: {{command: 'cat ${{inputs.i}}/v > ${{outputs.o}}/v; echo {i} >> ${{outputs.o}}/v'}}, inputs: {{i: s{}.o}}, outputs: [o]}}\n", i - 1));
    }
    std::fs::write(dir.path().join("p.yaml"), text_of).unwrap();
    let store = "s3://rao-far/cache";
    assert_eq!(run_json(&["run", "p.yaml", "--store", store], dir.path(), s3.port), (40, 0));

    // Through a hop that holds every request 20 ms: the manifests of a chain are read ahead of
    // the walk down it, many at once, and the run and `status` find the same as straight.
    let proxy = start_flaky_proxy(s3.port, Duration::ZERO, usize::MAX, Duration::from_millis(20));
    assert_eq!(run_json(&["run", "p.yaml", "--store", store], dir.path(), proxy.port), (0, 40));
    let most = proxy.most_at_once.load(Ordering::SeqCst);
    assert!(most >= 8, "at most {most} requests at once during a cached run");
    // And the walk used what was read ahead: about one manifest and one listing per stage, not
    // each read again.
    let requests = proxy.forwarded.load(Ordering::SeqCst);
    assert!(requests <= 2 * 40 + 10, "{requests} requests for a cached run of 40 stages");
    let status = |port| text(&rao(&["status", "p.yaml", "--store", store], dir.path(), port).output().unwrap());
    let (far, near) = (status(proxy.port), status(s3.port));
    assert!(far.contains("40/40 done"), "{far}");
    assert_eq!(far, near);
}

/// Every `MANIFEST.json` under `prefix` in the bucket, by fingerprint (one boto3 call).
fn bucket_manifests(port: u16, bucket: &str, prefix: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
    let python = std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import sys, json, boto3\n\
                  s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1', aws_access_key_id='x', aws_secret_access_key='y')\n\
                  out = {}\n\
                  for page in s3.get_paginator('list_objects_v2').paginate(Bucket=sys.argv[2], Prefix=sys.argv[3]):\n\
                  \x20   for o in page.get('Contents', []):\n\
                  \x20       if o['Key'].endswith('/MANIFEST.json'):\n\
                  \x20           out[o['Key'].split('/')[-2]] = json.loads(s3.get_object(Bucket=sys.argv[2], Key=o['Key'])['Body'].read())\n\
                  print(json.dumps(out))\n";
    let out = Command::new(python).args(["-c", script, &format!("http://127.0.0.1:{port}"), bucket, prefix]).output().unwrap();
    assert!(out.status.success(), "listing failed: {}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn concurrent_runs_on_one_bucket_execute_each_stage_once_with_identical_results() {
    let s3 = start_s3();
    create_bucket(s3.port, "rao-shared");
    let results = |dir: &Path, store: &str, prefix: &str| {
        let status = rao(&["status", "wide.yaml", "--store", store, "--json"], dir, s3.port).output().unwrap();
        let manifests = bucket_manifests(s3.port, "rao-shared", prefix);
        concurrent::outputs(&String::from_utf8_lossy(&status.stdout), |fp| manifests[fp].clone())
    };
    let reference = tempfile::tempdir().unwrap();
    concurrent::wide_pipeline(reference.path(), &reference.path().join("ran.log"));
    let alone = rao(&["run", "wide.yaml", "--store", "s3://rao-shared/alone"], reference.path(), s3.port).output().unwrap();
    assert!(alone.status.success(), "{}", text(&alone));
    let want = results(reference.path(), "s3://rao-shared/alone", "alone/");
    for (runs, trial) in [(2, 0), (2, 1), (4, 0), (4, 1)] {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("ran.log");
        concurrent::wide_pipeline(dir.path(), &log);
        let store = format!("s3://rao-shared/t{runs}-{trial}");
        concurrent::run_together(runs, || rao(&["run", "wide.yaml", "--store", &store, "-j", "2"], dir.path(), s3.port));
        concurrent::assert_each_ran_once(&log);
        assert_eq!(results(dir.path(), &store, &format!("t{runs}-{trial}/")), want, "{runs} runs, trial {trial}");
    }
}
