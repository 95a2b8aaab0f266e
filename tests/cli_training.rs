//! The learning pipeline end to end, scaled down: it runs, it learns, and it is reproducible.

use std::path::Path;
use std::process::Command;

fn rao(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rao")).args(args).current_dir(dir).output().expect("run rao")
}

/// The main pipeline, shrunk to seconds.
fn small_pipeline(dir: &Path) -> std::path::PathBuf {
    let main = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../pipelines/textcraft-synth.yaml")).unwrap();
    let p = dir.join("small.yaml");
    std::fs::write(&p, main).unwrap();
    p
}

const SHRINK: &[&str] = &[
    "--set", "stages.demo_tasks.params.per_band=12",
    "--set", "stages.gate_tasks.params.per_band=6",
    "--set", "stages.eval_tasks.params.per_band=4",
    "--set", "stages.warmstart.params.max_steps=40",
    "--set", "stages.warmstart.params.eval_every=20",
    "--set", "stages.warmstart.params.batch=16",
    "--set", "stages.train.loop.max_iterations=2",
    "--set", "stages.train_tasks.params.per_band=3",
    "--set", "params.model.d_model=32",
    "--set", "params.model.d_ff=64",
];

fn file_hashes(store: &Path, name: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![store.join("objects")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().unwrap() == name {
                out.push((p.strip_prefix(store).unwrap().display().to_string(), blake3::hash(&std::fs::read(&p).unwrap()).to_hex().to_string()));
            }
        }
    }
    out.sort();
    out
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
    let params = file_hashes(&stores[0], "params.bin");
    assert_eq!(params.len(), 3, "warm start + 2 updates: {params:?}");
    assert_eq!(params, file_hashes(&stores[1], "params.bin"), "bit-identical checkpoints");
    // Every evaluation number but wall-clock time, and every training metric, agree.
    let summaries = |store: &Path| -> Vec<serde_json::Value> {
        file_hashes(store, "summary.json")
            .iter()
            .map(|(rel, _)| {
                let mut rows: serde_json::Value = serde_json::from_slice(&std::fs::read(store.join(rel)).unwrap()).unwrap();
                for r in rows.as_array_mut().unwrap() {
                    r.as_object_mut().unwrap().remove("seconds_per_task");
                }
                rows
            })
            .collect()
    };
    assert_eq!(summaries(&stores[0]), summaries(&stores[1]));
    let training = |store: &Path| -> Vec<serde_json::Value> {
        let rec: serde_json::Value = serde_json::from_slice(&std::fs::read(store.join("runs/textcraft-synth/latest.json")).unwrap()).unwrap();
        rec["instances"].as_array().unwrap().iter().filter(|i| i["kind"] == "update").map(|i| i["metrics"].clone()).collect()
    };
    assert_eq!(training(&stores[0]), training(&stores[1]));
    assert!(training(&stores[0])[0]["loss"].is_number() || training(&stores[0])[0]["skipped"] == 1.0);
    // The report is there and the summary prints.
    let mut args = vec!["report", p.to_str().unwrap(), "--store", "s1"];
    args.extend(SHRINK);
    let o = rao(&args, dir.path());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("recursive") && text.contains("flat") && text.contains("report.html"), "{text}");
    // Nothing changed: everything is cached.
    let mut args = vec!["run", p.to_str().unwrap(), "--store", "s1", "--json"];
    args.extend(SHRINK);
    let o = rao(&args, dir.path());
    let last = String::from_utf8_lossy(&o.stdout).lines().last().unwrap().to_string();
    let ev: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(ev["done"], 0, "{last}");
}
