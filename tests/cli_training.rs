//! The learning pipeline end to end, scaled down: it runs, it learns, and it is reproducible.

use crate::support::rao;
use std::path::Path;
use std::process::Command;

/// The main pipeline, shrunk to seconds.
fn small_pipeline(dir: &Path) -> std::path::PathBuf {
    let main = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../pipelines/textcraft-synth.yaml")).unwrap();
    let p = dir.join("small.yaml");
    std::fs::write(&p, main).unwrap();
    p
}

const SHRINK: &[&str] = &[
    "--set",
    "stages.demo_tasks.params.per_band=12",
    "--set",
    "stages.gate_tasks.params.per_band=6",
    "--set",
    "stages.eval_tasks.params.per_band=4",
    "--set",
    "stages.eval_deep_tasks.params.per_band=2",
    "--set",
    "stages.heldout_tasks.params.per_band=2",
    "--set",
    "stages.warmstart.params.max_steps=40",
    "--set",
    "stages.warmstart.params.eval_every=20",
    "--set",
    "stages.warmstart.params.batch=16",
    // 40 steps cannot pass the gate: record it instead of failing.
    "--set",
    "stages.warmstart.params.gate.required=false",
    "--set",
    "stages.train.loop.max_iterations=2",
    "--set",
    "stages.train_tasks.params.per_band=3",
    "--set",
    "params.model.d_model=32",
    "--set",
    "params.model.d_ff=64",
];

/// Every file called `name` in a store: (path with the attempt directory as `*`, real path).
/// Attempt ids differ between stores; fingerprints and contents must not.
fn files_named(store: &Path, name: &str) -> Vec<(String, std::path::PathBuf)> {
    let mut out = Vec::new();
    let mut stack = vec![store.join("objects")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().unwrap() == name {
                // objects/ff/FP/ATTEMPT/output/file
                let rel = p.strip_prefix(store).unwrap().display().to_string();
                let parts: Vec<&str> = rel.split('/').collect();
                out.push(([parts[..3].join("/"), parts[4..].join("/")].join("/*/"), p));
            }
        }
    }
    out.sort();
    out
}

fn file_hashes(store: &Path, name: &str) -> Vec<(String, String)> {
    files_named(store, name).into_iter().map(|(k, p)| (k, blake3::hash(&std::fs::read(p).unwrap()).to_hex().to_string())).collect()
}

#[test]
fn two_runs_from_scratch_give_identical_checkpoints_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_pipeline(dir.path());
    let mut stores = Vec::new();
    for s in ["s1", "s2"] {
        let mut args = vec!["run", p.to_str().unwrap(), "--store", s];
        args.extend(SHRINK);
        let o = rao(&args, dir.path());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        stores.push(dir.path().join(s));
    }
    let params = file_hashes(&stores[0], "model.bpk");
    assert_eq!(params.len(), 3, "warm start + 2 updates: {params:?}");
    assert_eq!(params, file_hashes(&stores[1], "model.bpk"), "bit-identical checkpoints");
    // Every evaluation number but wall-clock time, and every training metric, agree.
    let summaries = |store: &Path| -> Vec<serde_json::Value> {
        files_named(store, "summary.json")
            .iter()
            .map(|(_, path)| {
                let mut rows: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
                for r in rows.as_array_mut().unwrap() {
                    r.as_object_mut().unwrap().remove("seconds_per_task");
                }
                rows
            })
            .collect()
    };
    assert_eq!(summaries(&stores[0]), summaries(&stores[1]));
    let training = |store: &Path| -> Vec<serde_json::Value> {
        let rec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(store.join("runs/textcraft-synth/latest.json")).unwrap()).unwrap();
        rec["instances"].as_array().unwrap().iter().filter(|i| i["kind"] == "update").map(|i| i["metrics"].clone()).collect()
    };
    assert_eq!(training(&stores[0]), training(&stores[1]));
    assert!(training(&stores[0])[0]["loss"].is_number() || training(&stores[0])[0]["skipped"] == 1.0);
    // The summary prints and the run's page has what it must.
    let mut args = vec!["report", p.to_str().unwrap(), "--store", "s1"];
    args.extend(SHRINK);
    let o = rao(&args, dir.path());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("recursive") && text.contains("flat"), "{text}");
    // The loop's held-out evaluation (`every: 10`, so only in the last of 2 iterations) is a
    // learning curve, not a row of the run's results.
    assert!(!text.lines().any(|l| l.starts_with("heldout")), "{text}");
    let page_path = text.lines().find_map(|l| l.strip_prefix("report: ")).unwrap_or_else(|| panic!("no page: {text}"));
    let page = std::fs::read_to_string(page_path).unwrap();
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(stores[0].join("runs/textcraft-synth/latest.json")).unwrap()).unwrap();
    report_page_has_what_it_must(&page, &rec);
    // Nothing changed: everything is cached.
    let mut args = vec!["run", p.to_str().unwrap(), "--store", "s1", "--json"];
    args.extend(SHRINK);
    let o = rao(&args, dir.path());
    let last = String::from_utf8_lossy(&o.stdout).lines().last().unwrap().to_string();
    let ev: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(ev["done"], 0, "{last}");
}

/// The run's HTML page: what ran, every evaluation with intervals, every recorded metric of the
/// loop as a curve, depth and cost; self-contained (no scripts, nothing fetched).
fn report_page_has_what_it_must(page: &str, rec: &serde_json::Value) {
    let run_id = rec["run_id"].as_str().unwrap();
    for must in [
        "textcraft-synth",
        run_id,
        "seed</th><td>1<",
        "--set stages.train.loop.max_iterations=2",
        "rao 0.1.0 (commit ",
        "Held-out evaluation",
        "95% Wilson interval",
        "Success by band",
        "Tree depth by band",
        "Tokens per task by band",
        "Trees per maximum depth",
        "Where the time went",
        "Learning curves",
    ] {
        assert!(page.contains(must), "the report lacks `{must}`");
    }
    // Every metric every loop-body instance recorded has its curve.
    let mut curves = 0;
    for inst in rec["instances"].as_array().unwrap().iter().filter(|i| i["name"].as_str().unwrap().contains('@')) {
        let series = inst["stage"].as_str().unwrap();
        for metric in inst["metrics"].as_object().unwrap().keys() {
            // A rate is a line of its stage's shared 0–1 chart, named in its legend; others chart alone.
            let own_chart = page.contains(&format!("{series} · {metric}"));
            let in_rates = page.contains(&format!("{series} · rates")) && {
                // A legend wraps a long name: its first line starts the name.
                let head: String = metric.chars().take(12).collect();
                page.contains(&format!(">\n{head}"))
            };
            assert!(own_chart || in_rates, "no curve of {series} · {metric}");
            curves += 1;
        }
    }
    assert!(curves >= 20, "{curves} metrics recorded");
    assert!(page.contains("heldout · "), "the held-out evaluation's curves");
    // Every evaluation row with its interval: label, mode, band and "[lo, hi]".
    for label in ["rao", "warmstart", "expert"] {
        for band in ["easy", "medium", "hard"] {
            assert!(page.contains(&format!("<td class='l'>{band}</td>")) && page.contains(&format!(">{label}</td>")), "{label} {band}");
        }
    }
    assert!(page.matches("<svg").count() >= 8, "charts drawn");
    assert!(!page.contains("<script") && !page.contains("src=") && !page.contains("href=\"http"), "self-contained");
}

/// RL on its own raises success. The warm start imitates a demonstrator that wastes 40% of its
/// steps on noise actions, under a 4-action budget, so it often runs out before `finish`; RL
/// (rollout → judge → advantage → CISPO update) must learn to stop wasting steps. Success is
/// measured on 256 held-out trees before and after; the margin is many standard errors wide.
/// Demonstration and gate tasks of the learning tests: tier-1 crafting, drawn by fixed seeds.
macro_rules! tier1_demo_and_gate_tasks {
    () => {
        r#"  demo_tasks:
    kind: synthesize
    params: {tiers: [1, 1], per_band: 64, task_seed: 1}
  gate_tasks:
    kind: synthesize
    params: {tiers: [1, 1], per_band: 16, split: validation, task_seed: 2}
"#
    };
}

const RL_SMOKE: &str = concat!(
    r#"
name: rl-smoke
seed: 5
params:
  limits: {window: 64, max_depth: 0, max_children: 1, max_nodes: 1, step_budget: 4}
  model: {d_model: 64, n_layers: 2, n_heads: 4, d_ff: 128}
stages:
"#,
    tier1_demo_and_gate_tasks!(),
    r#"  eval_tasks:
    kind: synthesize
    params: {tiers: [1, 1], per_band: 64, split: validation, task_seed: 3}
  warmstart:
    kind: warmstart
    inputs: {tasks: demo_tasks.tasks, gate_tasks: gate_tasks.tasks}
    params:
      model: "${params.model}"
      limits: "${params.limits}"
      demos: {recursive_trees: 0, flat_trees: 4, delegate: 0.0, noise: 0.4}
      max_steps: 800
      eval_every: 400
      batch: 32
      gate: {required: false}
  train:
    loop:
      max_iterations: 20
      init: {policy: warmstart.checkpoint}
      carry: {policy: update.checkpoint}
    stages:
      train_tasks:
        kind: synthesize
        params: {tiers: [1, 1], per_band: 16}
      rollout:
        kind: rollout
        inputs: {tasks: train_tasks.tasks, checkpoint: loop.policy}
        params: {policy: checkpoint, mode: flat, group_size: 8, iteration: "${loop.iteration}", limits: "${params.limits}"}
      judge:
        kind: judge
        inputs: {trees: rollout.trees, tasks: train_tasks.tasks}
        params: {mode: exact}
      advantage:
        kind: advantage
        inputs: {trees: judge.trees}
        params: {lambda: 0.0, baseline: leave_one_out, depth_weighting: true}
      update:
        kind: update
        inputs: {checkpoint: loop.policy, trees: advantage.trees, tasks: train_tasks.tasks}
        params: {loss: {kind: cispo, lo: 0.0, hi: 5.0}, lr: 1.0e-3, max_children: 1}
  evaluate_warmstart:
    kind: evaluate
    inputs: {tasks: eval_tasks.tasks, checkpoint: warmstart.checkpoint}
    params: {label: warmstart, modes: [flat], group_size: 4, limits: "${params.limits}"}
  evaluate_rl:
    kind: evaluate
    inputs: {tasks: eval_tasks.tasks, checkpoint: train.policy}
    params: {label: rl, modes: [flat], group_size: 4, limits: "${params.limits}"}
"#
);

#[test]
fn rl_raises_success_over_the_warm_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rl.yaml"), RL_SMOKE).unwrap();
    let o = rao(&["run", "rl.yaml", "--store", "s"], dir.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let success = |instance: &str| -> (f64, f64) {
        let idx: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(format!("s/index/rl-smoke/{instance}.json"))).unwrap()).unwrap();
        let fp = idx["fingerprint"].as_str().unwrap();
        let object = dir.path().join(format!("s/objects/{}/{fp}", &fp[..2]));
        let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(object.join("MANIFEST.json")).unwrap()).unwrap();
        let path = object.join(manifest["attempt"].as_str().unwrap()).join("report/summary.json");
        let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let row = &rows[0];
        assert_eq!(row["tasks"], 256, "{row}");
        (row["success"].as_f64().unwrap(), row["tasks"].as_f64().unwrap())
    };
    let (before, n) = success("evaluate_warmstart");
    let (after, _) = success("evaluate_rl");
    // Standard error of the difference of two proportions at their pooled rate.
    let p = (before + after) / 2.0;
    let se = (2.0 * p * (1.0 - p) / n).sqrt().max(1e-3);
    eprintln!("success: warm start {before:.3} → RL {after:.3} (difference {:.1} standard errors)", (after - before) / se);
    assert!(after - before >= 0.15, "RL did not raise success enough: {before:.3} → {after:.3}");
    assert!(after - before >= 4.0 * se, "the gain {:.3} is within noise (se {se:.3})", after - before);
}

/// `update.optimizer: fresh` starts RL's AdamW afresh from the warm start's checkpoint (its step
/// count restarts; later updates carry their own), where the default carries the warm start's.
#[test]
fn a_fresh_optimizer_drops_the_warm_starts_state_only_at_the_first_update() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rl.yaml"), RL_SMOKE).unwrap();
    let steps = |extra: &[&str]| -> Vec<u64> {
        let mut args = vec!["run", "rl.yaml", "--store", "s"];
        let shrink =
            ["stages.warmstart.params.max_steps=100", "stages.warmstart.params.eval_every=100", "stages.train.loop.max_iterations=2"];
        args.extend(shrink.iter().chain(extra).flat_map(|s| ["--set", s]));
        let o = rao(&args, dir.path());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let mut steps: Vec<u64> = files_named(&dir.path().join("s"), "checkpoint.json")
            .iter()
            .map(|(_, path)| {
                let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
                meta["optimizer"]["step"].as_u64().unwrap()
            })
            .collect();
        steps.sort();
        steps
    };
    // The warm start's 100 steps, then one step per update on top of them.
    assert_eq!(steps(&[]), [100, 101, 102]);
    // The same store: the warm start is reused, and the first update drops its 100 steps.
    assert_eq!(steps(&["stages.update.params.optimizer=fresh"]), [1, 2, 100, 101, 102]);
}

/// With `gate.keep_best`, a warm start that never reaches its gate writes the checkpoint of its
/// best gate check, not its last: the recorded gate score is the best one logged, and a kept
/// earlier step is named in the log.
#[test]
fn warm_start_keeps_its_best_gate_check() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = concat!(
        r#"
name: keep-best
seed: 3
params:
  limits: {window: 64, max_depth: 0, max_children: 1, max_nodes: 1, step_budget: 4}
stages:
"#,
        tier1_demo_and_gate_tasks!(),
        r#"  warmstart:
    kind: warmstart
    inputs: {tasks: demo_tasks.tasks, gate_tasks: gate_tasks.tasks}
    params:
      model: {d_model: 64, n_layers: 2, n_heads: 4, d_ff: 128}
      limits: "${params.limits}"
      demos: {recursive_trees: 0, flat_trees: 2, delegate: 0.0, noise: 0.4}
      max_steps: 350
      eval_every: 50
      batch: 32
      gate: {min_node_success: 1.01, required: false, keep_best: true}
"#
    );
    std::fs::write(dir.path().join("kb.yaml"), pipeline).unwrap();
    let o = rao(&["run", "kb.yaml", "--store", "s"], dir.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("s/index/keep-best/warmstart.json")).unwrap()).unwrap();
    let fp = idx["fingerprint"].as_str().unwrap();
    let object = dir.path().join(format!("s/objects/{}/{fp}", &fp[..2]));
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(object.join("MANIFEST.json")).unwrap()).unwrap();
    let log = std::fs::read_to_string(object.join(manifest["attempt"].as_str().unwrap()).join("checkpoint/warmstart.log")).unwrap();
    let checks: Vec<(u64, f64)> = log
        .lines()
        .filter(|l| l.starts_with("step "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[1].parse().unwrap(), w[6].parse().unwrap())
        })
        .collect();
    assert_eq!(checks.len(), 7, "{log}");
    let best = checks.iter().map(|c| c.1).fold(f64::MIN, f64::max);
    // This seed's run peaks before its end (if the model's numerics change, retune max_steps so
    // that it still does: the test is about that case).
    assert!(best > 0.0 && checks.last().unwrap().1 < best, "the last check is the best one:\n{log}");
    let recorded = manifest["metrics"]["gate_node_success"].as_f64().unwrap();
    assert!((recorded - best).abs() <= 1e-3, "recorded {recorded} but the best check scored {best}:\n{log}");
    let latest_best = checks.iter().rev().find(|c| c.1 == best).unwrap().0;
    assert!(log.contains(&format!("kept the checkpoint of step {latest_best}")), "{log}");
    assert_eq!(manifest["metrics"]["kept_step"].as_f64(), Some(latest_best as f64));
}

/// `demo_trees`: a warm start learns from the successful nodes of trees another policy made (here
/// the expert's rollout stands in for, say, a `policy: openai` evaluation): each node that solved
/// its own goal is one demonstration, and nothing else is.
#[test]
fn warm_start_takes_demonstrations_from_trees() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = concat!(
        r#"
name: demo-trees
seed: 4
params:
  limits: {window: 64, max_depth: 0, max_children: 1, max_nodes: 1, step_budget: 4}
stages:
"#,
        tier1_demo_and_gate_tasks!(),
        r#"  others:
    kind: rollout
    inputs: {tasks: demo_tasks.tasks}
    params: {policy: expert, mode: flat, group_size: 1, expert: {noise: 0.5}, limits: "${params.limits}"}
  warmstart:
    kind: warmstart
    inputs: {tasks: demo_tasks.tasks, gate_tasks: gate_tasks.tasks, demo_trees: others.trees}
    params:
      model: {d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64}
      limits: "${params.limits}"
      demos: {recursive_trees: 0, flat_trees: 0}
      max_steps: 10
      eval_every: 10
      batch: 16
      gate: {required: false}
"#
    );
    std::fs::write(dir.path().join("dt.yaml"), pipeline).unwrap();
    let o = rao(&["run", "dt.yaml", "--store", "s"], dir.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (_, trees) = files_named(&dir.path().join("s"), "trees.parquet").into_iter().next().expect("the rollout's trees");
    let nodes = rao_core::parquet_io::nodes_from_parquet(std::fs::read(trees).unwrap().into()).unwrap();
    let solved = nodes.iter().filter(|n| n.score >= 1.0).count();
    assert!(solved > 0 && solved < nodes.len(), "noise 0.5 leaves some nodes unsolved: {solved} of {}", nodes.len());
    let idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("s/index/demo-trees/warmstart.json")).unwrap()).unwrap();
    let fp = idx["fingerprint"].as_str().unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(format!("s/objects/{}/{fp}/MANIFEST.json", &fp[..2]))).unwrap()).unwrap();
    assert_eq!(manifest["metrics"]["demo_sequences_from_trees"].as_f64(), Some(solved as f64), "{manifest}");
    assert_eq!(manifest["metrics"]["demo_sequences"].as_f64(), Some(solved as f64));
}

/// A warm start killed with `kill -9` at a random step resumes from its saved progress and ends
/// with the same bits as one that never stopped.
#[test]
fn a_killed_warm_start_resumes_to_the_same_checkpoint() {
    let pipeline = concat!(
        r#"
name: resume
seed: 5
params:
  limits: {window: 64, max_depth: 0, max_children: 1, max_nodes: 1, step_budget: 4}
stages:
"#,
        tier1_demo_and_gate_tasks!(),
        r#"  warmstart:
    kind: warmstart
    inputs: {tasks: demo_tasks.tasks, gate_tasks: gate_tasks.tasks}
    params:
      model: {d_model: 32, n_layers: 2, n_heads: 4, d_ff: 64}
      limits: "${params.limits}"
      demos: {recursive_trees: 0, flat_trees: 2, delegate: 0.0, noise: 0.4}
      max_steps: 240
      eval_every: 60
      batch: 32
      gate: {min_node_success: 1.01, required: false, keep_best: true}
"#
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), pipeline).unwrap();
    let run = |store: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rao"));
        c.args(["run", "r.yaml", "--store", store]).current_dir(dir.path()).env("RAO_PROGRESS_EVERY_S", "0");
        c
    };
    let t0 = std::time::Instant::now();
    let o = run("whole").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let whole_run = t0.elapsed();

    let mut child = run("killed").stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
    let progress = dir.path().join("killed/progress");
    let t0 = std::time::Instant::now();
    while std::fs::read_dir(&progress).map(|d| d.count()).unwrap_or(0) == 0 {
        assert!(t0.elapsed() < std::time::Duration::from_secs(300), "no progress was ever saved");
        assert!(child.try_wait().unwrap().is_none(), "the warm start ended before it saved progress");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // A random moment after the first save, within the first half of what the whole run took
    // (so the run is still going on any machine): the kill lands at some step of some epoch.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    std::thread::sleep(whole_run.mul_f64(0.5 * f64::from(nanos % 1000) / 1000.0));
    child.kill().unwrap();
    child.wait().unwrap();
    let o = run("killed").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let whole = file_hashes(&dir.path().join("whole"), "model.bpk");
    assert_eq!(whole.len(), 1);
    assert_eq!(whole, file_hashes(&dir.path().join("killed"), "model.bpk"), "the resumed warm start ended elsewhere");
    assert_eq!(file_hashes(&dir.path().join("whole"), "optim.bin"), file_hashes(&dir.path().join("killed"), "optim.bin"));
    let idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("killed/index/resume/warmstart.json")).unwrap()).unwrap();
    let fp = idx["fingerprint"].as_str().unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(format!("killed/objects/{}/{fp}/MANIFEST.json", &fp[..2]))).unwrap())
            .unwrap();
    let resumed = manifest["metrics"]["resumed_at_step"].as_f64();
    eprintln!("resumed at step {resumed:?}");
    assert!(resumed.is_some_and(|s| s > 0.0), "the second run did not resume: {}", manifest["metrics"]);
    assert!(!dir.path().join(format!("killed/progress/{fp}")).exists(), "progress is removed once published");
}

/// The asynchronous loop (lag 1: rollout i samples with update i−2's policy, beside update i−1)
/// killed with SIGKILL at random moments, then run again: it ends exactly where a run that was
/// never killed ends — every checkpoint and optimiser state equal byte for byte, so no iteration
/// was repeated or skipped and no rollout lost or trained on twice — and every tree row records
/// the version of the policy that sampled it.
#[test]
fn an_async_loop_killed_at_random_moments_ends_where_an_unkilled_one_does() {
    let dir = tempfile::tempdir().unwrap();
    let p = small_pipeline(dir.path());
    let p = p.to_str().unwrap();
    let mut set: Vec<&str> = SHRINK.to_vec();
    set.extend(["--set", "stages.train.loop.max_iterations=5", "--set", "stages.train.loop.lag.behaviour.by=1"]);
    let args = |cmd: &str, store: &str| -> Vec<String> {
        [cmd, p, "--store", store].into_iter().chain(set.iter().copied()).map(str::to_string).collect()
    };
    let run = |store: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rao"));
        c.args(args("run", store)).current_dir(dir.path());
        c
    };
    let t0 = std::time::Instant::now();
    let o = run("whole").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let whole_run = t0.elapsed();

    let published = || std::fs::read_dir(dir.path().join("killed/index/textcraft-synth")).map(|d| d.count()).unwrap_or(0);
    let mut kills = 0;
    for _ in 0..4 {
        let mut child = run("killed").stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
        // Once this run has published something new (after the warm start), a random moment
        // within a third of what the whole run took: each kill lands in some stage of some
        // iteration, and the rounds get through the loop.
        let warm = dir.path().join("killed/index/textcraft-synth/warmstart.json");
        let before = published();
        while (!warm.exists() || published() == before) && child.try_wait().unwrap().is_none() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        std::thread::sleep(whole_run.mul_f64(f64::from(nanos % 1000) / 3000.0));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            kills += 1;
        }
        child.wait().unwrap();
        eprintln!("killed with {} instances published", published());
    }
    let o = run("killed").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    eprintln!("killed {kills} times; the whole run took {whole_run:?}");
    assert!(kills >= 1, "no kill landed");

    let (whole, killed) = (dir.path().join("whole"), dir.path().join("killed"));
    let params = file_hashes(&whole, "model.bpk");
    assert_eq!(params.len(), 6, "warm start + 5 updates: {params:?}");
    assert_eq!(params, file_hashes(&killed, "model.bpk"), "the killed run's checkpoints differ");
    assert_eq!(file_hashes(&whole, "optim.bin"), file_hashes(&killed, "optim.bin"));
    for i in 1..=5 {
        let o = Command::new(env!("CARGO_BIN_EXE_rao"))
            .args(args("path", "killed").into_iter().take(2).chain([format!("rollout@{i}"), "trees.parquet".into()]))
            .args(["--store", "killed"])
            .args(&set)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let path = String::from_utf8(o.stdout).unwrap();
        let nodes = rao_core::parquet_io::nodes_from_parquet(std::fs::read(dir.path().join(path.trim())).unwrap().into()).unwrap();
        let versions: std::collections::BTreeSet<i32> = nodes.iter().map(|n| n.policy_version).collect();
        // Update 0 is the warm start; rollout i samples with update max(i − 2, 0).
        assert_eq!(versions, [(i - 2).max(0)].into(), "rollout@{i}");
    }
}
