//! The node table opens as it is in pyarrow and DuckDB (installed from PyPI by scripts/test).

use std::process::Command;
use std::sync::Arc;

use rao_agent::{Limits, RunMeta, ScriptedExpert};
use rao_core::parquet_io::{nodes_from_parquet, nodes_to_parquet};
use rao_envs::textcraft::{self, Band, ExpertConfig, SynthConfig};
use rao_stages::rollout::{Mode, rollout_trees};
use rao_stages::tasks_io::{tasks_from_parquet, tasks_to_parquet};

fn python() -> String {
    std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trees_and_tasks_open_in_pyarrow_and_duckdb() {
    let world = Arc::new(textcraft::generate(&SynthConfig::small(), 3));
    let tasks = textcraft::synthesize(&world, Band::Medium, 5, false, 2);
    let policy = Arc::new(ScriptedExpert { world: world.clone(), config: ExpertConfig::default() });
    let trees = rollout_trees(
        &world,
        &tasks,
        policy,
        Mode::Recursive,
        2,
        Limits::recursive(96),
        RunMeta { run: "t".into(), iteration: 3, env: "textcraft".into() },
        1,
    )
    .await;
    let nodes: Vec<_> = trees.into_iter().flatten().collect();
    let dir = tempfile::tempdir().unwrap();
    let trees_path = dir.path().join("trees.parquet");
    let tasks_path = dir.path().join("tasks.parquet");
    let bytes = nodes_to_parquet(&nodes).unwrap();
    std::fs::write(&trees_path, &bytes).unwrap();
    std::fs::write(&tasks_path, tasks_to_parquet(&world, &tasks).unwrap()).unwrap();
    // Rust reads back exactly what it wrote.
    assert_eq!(nodes_from_parquet(bytes).unwrap(), nodes);
    assert_eq!(tasks_from_parquet(&world, std::fs::read(&tasks_path).unwrap().into()).unwrap(), tasks);

    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/check_parquet.py");
    let out = Command::new(python()).arg(script).arg(&trees_path).arg(&tasks_path).output().expect("python3 runs");
    assert!(
        out.status.success(),
        "pyarrow/duckdb could not read the files (scripts/test installs them from PyPI; set RAO_PYTHON to that interpreter):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let facts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(facts["pyarrow_rows"], nodes.len());
    assert_eq!(facts["duckdb_nodes"], nodes.len());
    assert_eq!(facts["duckdb_roots"], 10);
    let mean = nodes.iter().map(|n| n.score).sum::<f64>() / nodes.len() as f64;
    assert!((facts["duckdb_mean_score"].as_f64().unwrap() - mean).abs() < 1e-12);
    let spawns = nodes.iter().flat_map(|n| &n.turns).filter(|t| t.action.starts_with("spawn")).count();
    assert_eq!(facts["duckdb_spawn_actions"], spawns);
    assert_eq!(facts["first_completion"], serde_json::json!(nodes[0].turns[0].completion_ids));
    assert!(facts["turn_type"].as_str().unwrap().starts_with("list<item: struct<completion_ids: list<item: uint32>"));
    assert_eq!(facts["tasks"], 5);
}
