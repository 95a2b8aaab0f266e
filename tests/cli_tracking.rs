//! Exports to the trackers teams run, read back with their own readers: TensorBoard's
//! EventAccumulator on the event files, and the MLflow client against a real `mlflow server` on
//! 127.0.0.1 started here (both from PyPI, installed by scripts/test). A tracker that cannot be
//! reached only warns: the run succeeds.

use crate::support::{rao, text};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn python() -> String {
    std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The main pipeline shrunk to seconds: warm start, two RL iterations, three evaluations.
fn small(dir: &Path) -> Vec<String> {
    std::fs::copy(root().join("pipelines/textcraft-synth.yaml"), dir.join("small.yaml")).unwrap();
    let sets = [
        "stages.demo_tasks.params.per_band=12",
        "stages.gate_tasks.params.per_band=6",
        "stages.eval_tasks.params.per_band=4",
        "stages.eval_deep_tasks.params.per_band=2",
        "stages.warmstart.params.max_steps=20",
        "stages.warmstart.params.eval_every=20",
        "stages.warmstart.params.batch=16",
        "stages.warmstart.params.gate.required=false",
        "stages.train.loop.max_iterations=2",
        "stages.train_tasks.params.per_band=3",
        "params.model.d_model=32",
        "params.model.d_ff=64",
    ];
    let mut args = vec!["run".to_string(), "small.yaml".to_string()];
    for s in sets {
        args.extend(["--set".to_string(), s.to_string()]);
    }
    args
}

fn check(args: &[&str]) -> serde_json::Value {
    let o = Command::new(python()).arg(root().join("scripts/check_tracking.py")).args(args).output().expect("python runs");
    assert!(o.status.success(), "check_tracking.py {args:?} (scripts/test installs tensorboard and mlflow):\n{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Every metric of every loop iteration in the run record, as (key, step, value).
fn recorded(dir: &Path) -> (serde_json::Value, Vec<(String, i64, f64)>) {
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(".rao/store/runs/textcraft-synth/latest.json")).unwrap()).unwrap();
    let mut out = Vec::new();
    for i in rec["instances"].as_array().unwrap() {
        let name = i["name"].as_str().unwrap();
        if let Some((stage, k)) = name.split_once('@') {
            for (m, v) in i["metrics"].as_object().unwrap() {
                out.push((format!("{stage}/{m}"), k.parse().unwrap(), v.as_f64().unwrap()));
            }
        }
    }
    assert!(out.len() >= 40, "{out:?}");
    (rec, out)
}

#[test]
fn tensorboard_reads_every_metric_and_an_unreachable_tracker_only_warns() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = small(dir.path());
    // Port 9 (discard) on 127.0.0.1: nothing listens, the connection is refused.
    args.extend(["--track", "tensorboard:tb", "--track", "http://127.0.0.1:9"].map(String::from));
    let o = rao(&args.iter().map(String::as_str).collect::<Vec<_>>(), dir.path());
    assert!(o.status.success(), "a tracker that fails must not fail the run: {}", text(&o));
    assert!(text(&o).contains("warning: tracking to MLflow http://127.0.0.1:9 failed"), "{}", text(&o));
    let (rec, metrics) = recorded(dir.path());
    let run_dir = dir.path().join("tb/textcraft-synth").join(rec["run_id"].as_str().unwrap());
    let tb = check(&["tensorboard", run_dir.to_str().unwrap()]);
    for (key, step, value) in &metrics {
        let points = tb["scalars"][key].as_array().unwrap_or_else(|| panic!("TensorBoard has no `{key}`"));
        let got = points.iter().find(|p| p[0] == *step).unwrap_or_else(|| panic!("{key} has no step {step}: {points:?}"));
        assert!((got[1].as_f64().unwrap() - value).abs() <= 1e-6 * value.abs().max(1.0), "{key}@{step}: {got:?} vs {value}");
    }
    assert!(tb["scalars"]["eval/expert/recursive/easy/success"][0][1] == 1.0, "{}", tb["scalars"]);
    assert!(tb["texts"]["params"].as_str().unwrap().contains("| `stages.train.loop.max_iterations` | 2 |"), "{}", tb["texts"]);
    assert!(tb["texts"]["run"].as_str().unwrap().contains(rec["run_id"].as_str().unwrap()));
    assert!(std::fs::read_to_string(run_dir.join("report.html")).unwrap().contains("Learning curves"));
}

/// Trackers see the run while it goes: the warm start's loss and gate checks and every loop
/// iteration's metrics reach TensorBoard's reader while a last stage still waits (for the test to
/// have seen them). At the end the export holds the same points and the evaluations.
#[test]
fn trackers_get_each_metric_while_the_run_goes() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = small(dir.path());
    let go = dir.path().join("go");
    let hold = format!(
        "  hold:\n    kind: shell\n    inputs: {{policy: train.policy}}\n    params: {{command: \"for i in $(seq 1800); do [ -e '{}' ] && exit 0; sleep 0.1; done; exit 1\"}}\n",
        go.display()
    );
    let mut file = std::fs::read_to_string(dir.path().join("small.yaml")).unwrap();
    file.push_str(&hold);
    std::fs::write(dir.path().join("small.yaml"), file).unwrap();
    args.extend(["--track", "tensorboard:tb"].map(String::from));
    let mut run = Command::new(env!("CARGO_BIN_EXE_rao"))
        .args(&args)
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let tb = dir.path().join("tb/textcraft-synth");
    let seen = loop {
        assert!(t0.elapsed() < Duration::from_secs(170), "no live metrics in TensorBoard within 170 s");
        assert!(run.try_wait().unwrap().is_none(), "the run ended before the test let it");
        let run_dir = std::fs::read_dir(&tb).ok().and_then(|mut d| d.next()).map(|e| e.unwrap().path());
        if let Some(run_dir) = run_dir {
            let got = check(&["tensorboard", run_dir.to_str().unwrap()]);
            let steps = |k: &str| got["scalars"][k].as_array().map_or(0, Vec::len);
            if steps("rollout/root_success") == 2 && steps("warmstart/loss") > 0 && steps("warmstart/gate_node_success") > 0 {
                break got;
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    std::fs::write(&go, "").unwrap();
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Live, the warm start's points came at their steps; at the end, the same and the rest.
    assert_eq!(seen["scalars"]["warmstart/gate_node_success"][0][0], 20, "{}", seen["scalars"]);
    let (rec, metrics) = recorded(dir.path());
    let done = check(&["tensorboard", tb.join(rec["run_id"].as_str().unwrap()).to_str().unwrap()]);
    assert_eq!(done["scalars"]["warmstart/loss"], seen["scalars"]["warmstart/loss"]);
    for (key, step, _) in &metrics {
        assert!(done["scalars"][key].as_array().is_some_and(|p| p.iter().any(|p| p[0] == *step)), "{key}@{step}");
    }
    assert!(done["scalars"]["eval/expert/recursive/easy/success"].is_array(), "{}", done["scalars"]);
    let page = std::fs::read_to_string(tb.join(rec["run_id"].as_str().unwrap()).join("report.html")).unwrap();
    assert!(page.contains("warmstart (per step)") && page.contains("warmstart · rates"), "the report draws the warm start's curves");
}

/// A real MLflow server on 127.0.0.1, stopped (its whole process group) when the test ends.
struct MlflowServer {
    child: Child,
    url: String,
}

impl MlflowServer {
    fn start(dir: &Path) -> MlflowServer {
        use std::os::unix::process::CommandExt;
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mlflow = Path::new(&python()).with_file_name("mlflow");
        let child = Command::new(if mlflow.exists() { mlflow } else { PathBuf::from("mlflow") })
            .args(["server", "--host", "127.0.0.1", "--port", &port.to_string(), "--workers", "1"])
            // No background job runners (seven extra processes); rao needs only the REST API.
            .env("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
            .arg("--artifacts-destination")
            .arg(dir.join("artifacts"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("mlflow.log")).unwrap())
            .process_group(0)
            .spawn()
            .expect("mlflow server starts (scripts/test installs it)");
        let server = MlflowServer { child, url: format!("http://127.0.0.1:{port}") };
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(180),
                "mlflow server did not start: {}",
                std::fs::read_to_string(dir.join("mlflow.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        server
    }
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["--", &format!("-{}", self.child.id())]).status();
        let _ = self.child.wait();
    }
}

#[test]
fn mlflow_gets_params_metrics_by_step_and_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let server = MlflowServer::start(dir.path());
    let mut args = small(dir.path());
    args.extend(["--track".to_string(), server.url.clone()]);
    let o = rao(&args.iter().map(String::as_str).collect::<Vec<_>>(), dir.path());
    assert!(o.status.success() && text(&o).contains("tracked: MLflow"), "{}", text(&o));
    let (rec, metrics) = recorded(dir.path());
    let got = check(&["mlflow", &server.url, "textcraft-synth"]);
    let runs = got["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{got}");
    let run = &runs[0];
    assert_eq!(run["name"], rec["run_id"]);
    assert_eq!(run["status"], "FINISHED");
    assert_eq!(run["tags"]["rao.run_id"], rec["run_id"]);
    assert!(run["tags"]["rao.code_version"].as_str().unwrap().starts_with("rao "), "{}", run["tags"]);
    assert_eq!(run["params"]["stages.train.loop.max_iterations"], "2");
    assert_eq!(run["params"]["seed"], "1");
    for (key, step, value) in &metrics {
        let points = run["metrics"][key].as_array().unwrap_or_else(|| panic!("MLflow has no `{key}`"));
        let p = points.iter().find(|p| p[0] == *step).unwrap_or_else(|| panic!("{key} has no step {step}"));
        assert!((p[1].as_f64().unwrap() - value).abs() <= 1e-9 * value.abs().max(1.0), "{key}@{step}");
    }
    assert_eq!(run["metrics"]["eval/expert/recursive/easy/success"][0][1], 1.0);
    assert!(run["artifacts"].as_array().unwrap().contains(&serde_json::json!("report.html")), "{run}");
    assert!(run["report"].as_str().unwrap().contains(rec["run_id"].as_str().unwrap()), "the report names its run");
    // A second export of the same run (a cached re-run exports its own run record; `rao report
    // --track` the same one) finds it and adds nothing.
    let o = rao(&["report", "small.yaml", "--run", rec["run_id"].as_str().unwrap(), "--track", &server.url], dir.path());
    assert!(o.status.success() && text(&o).contains("exported before"), "{}", text(&o));
    assert_eq!(check(&["mlflow", &server.url, "textcraft-synth"])["runs"].as_array().unwrap().len(), 1);
}
