//! A run's live progress: stages report how far they are (`progress` events with increasing
//! counts, `note` events for milestones such as a gate check), and Ctrl-C stops a running warm
//! start at its next step, recording the run as cancelled.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::command;

/// Every stage kind that reports progress, scaled down to seconds. The rollout runs the
/// warm-started policy, so some trees of a group succeed and some do not: the update has signal.
const PIPELINE: &str = r#"
name: progress
seed: 5
params:
  limits: {window: 64, max_depth: 0, max_children: 1, max_nodes: 1, step_budget: 4}
  model: {d_model: 32, n_layers: 1, n_heads: 4, d_ff: 64}
stages:
  demo_tasks:
    kind: synthesize
    params: {tiers: [1, 1], per_band: 16, task_seed: 1}
  gate_tasks:
    kind: synthesize
    params: {tiers: [1, 1], per_band: 8, split: validation, task_seed: 2}
  warmstart:
    kind: warmstart
    inputs: {tasks: demo_tasks.tasks, gate_tasks: gate_tasks.tasks}
    params:
      model: "${params.model}"
      limits: "${params.limits}"
      demos: {recursive_trees: 0, flat_trees: 2, delegate: 0.0, noise: 0.4}
      max_steps: 800
      eval_every: 200
      batch: 32
      gate: {required: false}
  train:
    loop:
      max_iterations: 1
      init: {policy: warmstart.checkpoint}
      carry: {policy: update.checkpoint}
    stages:
      train_tasks:
        kind: synthesize
        params: {tiers: [1, 1], per_band: 8}
      rollout:
        kind: rollout
        inputs: {tasks: train_tasks.tasks, checkpoint: loop.policy}
        params: {policy: checkpoint, mode: flat, group_size: 4, iteration: "${loop.iteration}", limits: "${params.limits}"}
      judge:
        kind: judge
        inputs: {trees: rollout.trees, tasks: train_tasks.tasks}
        params: {mode: exact}
      advantage:
        kind: advantage
        inputs: {trees: judge.trees}
        params: {lambda: 0.0, baseline: leave_one_out, depth_weighting: false}
      update:
        kind: update
        inputs: {checkpoint: loop.policy, trees: advantage.trees, tasks: train_tasks.tasks}
        params: {loss: {kind: cispo, lo: 0.0, hi: 5.0}, lr: 1.0e-3, max_children: 1, steps: 3, minibatch: 8}
  evaluate:
    kind: evaluate
    inputs: {tasks: gate_tasks.tasks, checkpoint: train.policy}
    params: {label: rl, modes: [flat], group_size: 2, limits: "${params.limits}"}
"#;

fn events(stdout: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stdout).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

fn run_record(dir: &Path, store: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join(store).join("runs/progress/latest.json")).unwrap()).unwrap()
}

/// In this process and in child `rao exec` processes (whose events the run passes on) alike.
#[test]
fn json_events_report_each_stages_progress_with_increasing_counts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.yaml"), PIPELINE).unwrap();
    for executor in ["in-process", "process"] {
        let o = command(&["run", "p.yaml", "--store", executor, "--json", "--executor", executor], dir.path()).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        check_progress(&events(&o.stdout), &run_record(dir.path(), executor));
    }
}

fn check_progress(events: &[serde_json::Value], record: &serde_json::Value) {
    let update = record["instances"].as_array().unwrap().iter().find(|i| i["name"] == "update@1").unwrap();
    assert!(
        update["metrics"]["sequences"].as_f64() > Some(0.0),
        "no group had signal, so the update took no step (retune the pipeline): {}",
        update["metrics"]
    );

    // Per instance: (done, total, unit) in the order reported.
    let mut progress: BTreeMap<String, Vec<(u64, u64, String)>> = BTreeMap::new();
    for e in events.iter().filter(|e| e["event"] == "progress") {
        let (done, total) = (e["done"].as_u64().unwrap(), e["total"].as_u64().unwrap());
        progress.entry(e["instance"].as_str().unwrap().to_string()).or_default().push((done, total, e["unit"].as_str().unwrap().into()));
    }
    // The update's steps: 3 passes over the sequences that had signal, in minibatches of 8.
    let sequences = update["metrics"]["sequences"].as_f64().unwrap() as u64;
    let update_steps = 3 * sequences.div_ceil(8);
    for (instance, unit, total) in
        [("warmstart", "steps", 800), ("rollout@1", "trees", 32), ("update@1", "steps", update_steps), ("evaluate", "trees", 16)]
    {
        let p = progress.get(instance).unwrap_or_else(|| panic!("no progress from {instance}: {progress:?}"));
        assert!(p.len() >= 2, "{instance}: {p:?}");
        assert!(p.iter().all(|x| x.1 == total && x.2 == unit), "{instance}: {p:?}");
        assert!(p.windows(2).all(|w| w[0].0 < w[1].0), "{instance}: counts do not increase: {p:?}");
        assert_eq!((p[0].0, p.last().unwrap().0), (0, total), "{instance}: {p:?}");
    }
    // 800 steps take a few hundred milliseconds or more: the warm start says where it is on the way.
    assert!(progress["warmstart"].len() >= 3, "{:?}", progress["warmstart"]);
    // Each progress event comes while its instance runs: after it started, before it finished.
    for instance in progress.keys() {
        let at = |kind: &str| events.iter().position(|e| e["event"] == kind && e["instance"] == instance.as_str()).unwrap();
        let last = events.iter().rposition(|e| e["event"] == "progress" && e["instance"] == instance.as_str()).unwrap();
        assert!(at("started") < at("progress") && last < at("finished"), "{instance}");
    }

    let notes: Vec<String> =
        events.iter().filter(|e| e["event"] == "note").map(|e| format!("{}: {}", e["instance"].as_str().unwrap(), e["message"])).collect();
    for want in ["warmstart: \"gate at step 200: node success ", "warmstart: \"gate at step 400: ", "rollout@1: \"root success "] {
        assert!(notes.iter().any(|n| n.starts_with(want)), "no note `{want}…` in {notes:#?}");
    }
}

/// In this process, and in a child `rao exec` (the run passes Ctrl-C on to it).
#[cfg(unix)]
#[test]
fn ctrl_c_stops_a_running_warm_start_within_seconds_and_records_the_run_as_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.yaml"), PIPELINE).unwrap();
    for executor in ["in-process", "process"] {
        ctrl_c_during_the_warm_start(dir.path(), executor);
    }
}

#[cfg(unix)]
fn ctrl_c_during_the_warm_start(dir: &Path, executor: &str) {
    // A warm start far longer than the test, with no gate check on the way: only its own
    // steps can notice the cancellation.
    let mut child = command(
        &[
            "run",
            "p.yaml",
            "--store",
            executor,
            "--executor",
            executor,
            "--json",
            "--set",
            "stages.warmstart.params.max_steps=1000000",
            "--set",
            "stages.warmstart.params.eval_every=1000000",
        ],
        dir,
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    // Wait until the warm start is training (it has reported a step).
    loop {
        let line = lines.next().expect("the run ended before the warm start trained").unwrap();
        let e: serde_json::Value = serde_json::from_str(&line).unwrap();
        let training = e["event"] == "progress" && e["instance"] == "warmstart" && e["done"].as_u64() > Some(0);
        seen.push(e);
        if training {
            break;
        }
    }
    let t0 = Instant::now();
    // SAFETY: a signal to the child this test started and has not yet waited for.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) }, 0);
    seen.extend(lines.map(|l| serde_json::from_str::<serde_json::Value>(&l.unwrap()).unwrap()));
    let status = child.wait().unwrap();
    let took = t0.elapsed();
    eprintln!("{executor}: SIGINT → exit: {took:?}");
    assert_eq!(status.code(), Some(130), "{status}");
    // Measured at a few tens of milliseconds; before the stage checked for cancellation between
    // its steps, it ran on until its next save of progress or gate check.
    assert!(took < Duration::from_secs(10), "Ctrl-C took {took:?}");

    let kinds: Vec<String> =
        seen.iter().map(|e| format!("{} {}", e["event"].as_str().unwrap(), e["instance"].as_str().unwrap_or(""))).collect();
    let cancelling = seen.iter().find(|e| e["event"] == "cancelling").unwrap_or_else(|| panic!("{kinds:#?}"));
    assert_eq!(cancelling["running"], serde_json::json!(["warmstart"]));
    assert!(kinds.contains(&"cancelled warmstart".to_string()), "{kinds:#?}");
    assert!(!kinds.contains(&"finished warmstart".to_string()), "{kinds:#?}");
    let end = seen.last().unwrap();
    assert_eq!((end["event"].as_str(), end["status"].as_str()), (Some("run_finished"), Some("cancelled")), "{end}");

    let record = run_record(dir, executor);
    assert_eq!(record["status"], "cancelled");
    let warmstart = record["instances"].as_array().unwrap().iter().find(|i| i["name"] == "warmstart").unwrap();
    assert_eq!(warmstart["status"], "cancelled", "{warmstart}");
    // Nothing was published for it, and its lease is gone: the next run starts it at once.
    let fp = warmstart["fingerprint"].as_str().unwrap();
    assert!(!dir.join(format!("{executor}/objects/{}/{fp}/MANIFEST.json", &fp[..2])).exists());
    let leases = dir.join(format!("{executor}/leases/{}/{fp}", &fp[..2]));
    assert!(std::fs::read_dir(&leases).map(|d| d.count()).unwrap_or(0) == 0, "a lease is left in {}", leases.display());
}
