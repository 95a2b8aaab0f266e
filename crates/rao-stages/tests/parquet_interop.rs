//! The node table opens as it is in pyarrow and DuckDB (installed from PyPI by scripts/test).

use std::process::Command;
use std::sync::Arc;

use rao_agent::{Limits, RunMeta, ScriptedExpert};
use rao_core::parquet_io::{nodes_from_parquet, nodes_to_parquet};
use rao_envs::textcraft::{self, Band, ExpertConfig, SynthConfig};
use rao_stages::envs::TaskSet;
use rao_stages::envs::textcraft::task_set;
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
    let set = task_set(&world, &tasks);
    let trees = rollout_trees(
        &set,
        &set.all(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trees_of_all_three_environments_share_one_schema_in_pyarrow() {
    use rao_envs::{longdoc, multihop};
    use rao_stages::envs::ExpertSpec;
    use rao_stages::envs::longdoc::LongDocSet;
    use rao_stages::envs::multihop::MultiHopSet;

    let world = Arc::new(textcraft::generate(&SynthConfig::small(), 3));
    let cfg = longdoc::DocConfig::default();
    let graph = multihop::generate(&multihop::GraphConfig::default(), 1);
    let sets: Vec<(&str, Box<dyn TaskSet>)> = vec![
        ("textcraft", Box::new(task_set(&world, &textcraft::synthesize(&world, Band::Medium, 3, false, 2)))),
        ("longdoc", Box::new(LongDocSet { lang: Arc::new(longdoc::Lang::new(&cfg)), tasks: longdoc::synthesize(&cfg, 3, false, 2) })),
        (
            "multihop",
            Box::new(MultiHopSet { tasks: multihop::synthesize(&graph, (2, 4), 1, false, 2), lang: Arc::new(multihop::Lang::new(graph)) }),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for (env, set) in &sets {
        let limits = Limits { max_depth: 2, max_children: 4, ..Limits::recursive(96) };
        let expert = set.expert(ExpertSpec { delegate: 1.0, noise: 0.0, seed: 1 }, &limits);
        let meta = RunMeta { run: "t".into(), iteration: 0, env: env.to_string() };
        let nodes: Vec<_> =
            rollout_trees(set.as_ref(), &set.all(), expert, Mode::Recursive, 1, limits, meta, 1).await.into_iter().flatten().collect();
        assert!(nodes.iter().any(|n| n.depth > 0), "{env}: the expert delegates");
        let path = dir.path().join(format!("{env}.parquet"));
        std::fs::write(&path, nodes_to_parquet(&nodes).unwrap()).unwrap();
        paths.push(path.display().to_string());
    }
    let script = "import sys, json, pyarrow.parquet as pq\n\
                  tables = [pq.read_table(p) for p in sys.argv[1:]]\n\
                  print(json.dumps({'same_schema': all(t.schema.equals(tables[0].schema) for t in tables),\n\
                                    'envs': [sorted(set(t.column('env').to_pylist())) for t in tables],\n\
                                    'rows': [t.num_rows for t in tables]}))\n";
    let out = Command::new(python()).arg("-c").arg(script).args(&paths).output().expect("python3 runs");
    assert!(out.status.success(), "pyarrow could not read the trees (set RAO_PYTHON):\n{}", String::from_utf8_lossy(&out.stderr));
    let facts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(facts["same_schema"], true, "{facts}");
    assert_eq!(facts["envs"], serde_json::json!([["textcraft"], ["longdoc"], ["multihop"]]));
    assert!(facts["rows"].as_array().unwrap().iter().all(|r| r.as_u64().unwrap() > 3), "{facts}");
}
