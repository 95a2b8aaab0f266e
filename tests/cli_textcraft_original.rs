//! The original TextCraft through the `rao` binary: `pipelines/textcraft-original.yaml` end to end
//! on the fixture (shrunk to seconds), its gold check, its report rows and trees, and the errors
//! a user meets with bad data, named in the user's files.

use std::path::{Path, PathBuf};

use crate::support::{rao, text};
use rao_envs::textcraft::World;
use rao_stages::tasks_io::tasks_from_parquet;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/textcraft-original-fixture").canonicalize().unwrap()
}

/// The shipped pipeline file, copied next to the test's store.
fn pipeline(dir: &Path) -> PathBuf {
    let p = dir.join("original.yaml");
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../pipelines/textcraft-original.yaml"), &p).unwrap();
    p
}

/// Seconds instead of minutes: a tiny model, a few warm-start steps, two RL iterations.
const SHRINK: &[&str] = &[
    "--set",
    "stages.warmstart.params.max_steps=20",
    "--set",
    "stages.warmstart.params.eval_every=10",
    "--set",
    "stages.train.loop.max_iterations=2",
    "--set",
    "stages.train_tasks.params.sample=3",
    "--set",
    "params.model.d_model=32",
    "--set",
    "params.model.d_ff=64",
];

fn files_named(root: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().unwrap() == name {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_original_pipeline_runs_end_to_end_on_the_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(dir.path());
    let data = format!("params.data={}", fixture().display());
    let mut args = vec!["run", p.to_str().unwrap(), "--set", &data];
    args.extend(SHRINK);
    let o = rao(&args, dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let log = text(&o);
    assert!(log.contains("tasks: 10 loaded, 3 skipped of 13 lines"), "{log}");
    assert!(log.contains(&format!("{}/textcraft_val.jsonl:7: task `textcraft.val.5` cannot be done", fixture().display())), "{log}");
    assert!(!log.contains("objects/"), "messages name the user's files, not the store's copies: {log}");

    // One row per task file; the gold replays to success on every task, the experts are the ceiling.
    let mut args = vec!["report", p.to_str().unwrap(), "--set", &data];
    args.extend(SHRINK);
    let report = text(&rao(&args, dir.path()));
    let row = |label: &str, mode: &str| {
        report
            .lines()
            .find(|l| l.split_whitespace().take(2).eq([label, mode]))
            .unwrap_or_else(|| panic!("no {label} {mode} row: {report}"))
            .to_string()
    };
    for (label, mode) in [("gold", "flat"), ("expert", "recursive"), ("rao", "recursive"), ("rao", "flat"), ("warmstart", "recursive")] {
        let r = row(label, mode);
        let cells: Vec<&str> = r.split_whitespace().collect();
        assert_eq!((cells[2], cells[3]), ("textcraft_val", "10"), "{r}");
    }
    assert_eq!(row("gold", "flat").split_whitespace().nth(4), Some("1.00"), "{report}");
    assert_eq!(row("expert", "recursive").split_whitespace().nth(4), Some("1.00"), "{report}");

    // Duplicate ids stay distinct in the trees `rao inspect` prints.
    let store = dir.path().join(".rao/store");
    let trees = files_named(&store, "trees.parquet");
    let printed: Vec<String> = trees.iter().map(|t| text(&rao(&["inspect", t.to_str().unwrap(), "--limit", "100"], dir.path()))).collect();
    let gold = printed.iter().find(|t| t.contains("craft oak planks 8 from oak log 2")).expect("the gold trees");
    assert!(gold.contains("task textcraft.val.0@1 (") && gold.contains("task textcraft.val.0@6 ("), "{gold}");
    assert_eq!(gold.matches("root score 1 ").count(), 10, "{gold}");

    // `split: validation` marks the evaluation tasks; each tasks artifact has its load report.
    let mut splits = Vec::new();
    for tasks in files_named(&store, "tasks.parquet") {
        let world = World::from_json(&std::fs::read_to_string(tasks.with_file_name("world.json")).unwrap()).unwrap();
        let t = tasks_from_parquet(&world, std::fs::read(&tasks).unwrap().into()).unwrap();
        splits.push((t.len(), t.iter().all(|t| t.validation)));
        assert!(tasks.with_file_name("load_report.json").is_file());
    }
    splits.sort();
    splits.dedup();
    assert_eq!(splits, [(3, false), (10, true), (12, false)], "training draws of 3, all 12 for demonstrations, 10 validation");
}

#[test]
fn the_stand_in_made_from_minecraft_recipes_runs_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("minecraft.yaml");
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../pipelines/textcraft-minecraft.yaml"), &p).unwrap();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/minecraft-data");
    assert!(data.join("recipes.json").is_file(), "{}: run scripts/minecraft-data (the test command does)", data.display());
    let data = format!("params.minecraft_data={}", data.canonicalize().unwrap().display());
    let mut args = vec!["--set", &data, "--set", "stages.files.params.train=40", "--set", "stages.files.params.validation=12"];
    args.extend(SHRINK);
    let run = [&["run", p.to_str().unwrap()][..], &args].concat();
    let o = rao(&run, dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let report = text(&rao(&[&["report", p.to_str().unwrap()][..], &args].concat(), dir.path()));
    let row = |label: &str, mode: &str| -> Vec<String> {
        let line = report
            .lines()
            .find(|l| l.split_whitespace().take(2).eq([label, mode]))
            .unwrap_or_else(|| panic!("no {label} {mode} row: {report}"));
        line.split_whitespace().map(str::to_string).collect()
    };
    assert_eq!(row("gold", "flat")[2..5], ["textcraft_val", "12", "1.00"], "{report}");
    for (label, mode) in [("expert", "recursive"), ("rao", "recursive"), ("rao", "flat"), ("warmstart", "recursive")] {
        assert_eq!(row(label, mode)[2..4], ["textcraft_val", "12"], "{report}");
    }
    // The files it made are the authors' layout, where `rao path` says.
    let files = text(&rao(&[&["path", p.to_str().unwrap(), "files"][..], &args].concat(), dir.path()));
    let folder = PathBuf::from(files.trim());
    let stick: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(folder.join("recipes/stick.json")).unwrap()).unwrap();
    assert_eq!(stick["key"]["#"]["tag"], "minecraft:planks", "{stick}");
    assert_eq!(std::fs::read_to_string(folder.join("textcraft_val.jsonl")).unwrap().lines().count(), 12);
}

/// A broken package file fails the stand-in's stage naming the file where the user keeps it,
/// and nothing downstream runs.
#[test]
fn a_broken_minecraft_data_file_is_named_where_the_user_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("mc");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("items.json"), r#"[{"id": 1, "name": "stick"}, {"id": 3, "name": "oak_planks"}]"#).unwrap();
    std::fs::write(data.join("recipes.json"), r#"{"1": [{"result": {"id": 1, "count": 4}, "ingredients": [99999]}]}"#).unwrap();
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../pipelines/textcraft-minecraft.yaml");
    let set = format!("params.minecraft_data={}", data.display());
    let o = rao(&["run", p.to_str().unwrap(), "--store", "st", "--set", &set], dir.path());
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    let want = format!("FAILED   files: {}: `1` recipe 1: item id 99999 is not in items.json", data.join("recipes.json").display());
    assert!(out.contains(&want), "no `{want}` in:\n{out}");
    assert!(out.contains("skipped  warmstart"), "{out}");
}

/// Just the dataset and one `textcraft_files` stage reading it.
fn loader(dir: &Path, url: &str) -> PathBuf {
    let p = dir.join("load.yaml");
    let body = format!(
        "name: load\nstages:\n  files: {{kind: dataset, params: {{url: '{url}'}}}}\n  \
         eval_tasks: {{kind: textcraft_files, inputs: {{dataset: files.data}}, params: {{tasks: textcraft_val.jsonl, split: validation}}}}\n"
    );
    std::fs::write(&p, body).unwrap();
    p
}

#[test]
fn bad_data_fails_once_with_the_users_file_named() {
    let dir = tempfile::tempdir().unwrap();
    // A copy of the fixture without its recipe directory.
    let data = dir.path().join("my-textcraft");
    std::fs::create_dir(&data).unwrap();
    for f in ["textcraft_train.jsonl", "textcraft_val.jsonl"] {
        std::fs::copy(fixture().join(f), data.join(f)).unwrap();
    }
    let p = loader(dir.path(), "my-textcraft");
    let o = rao(&["run", p.to_str().unwrap()], dir.path());
    assert!(!o.status.success());
    let out = text(&o);
    let missing = "my-textcraft/recipes: no recipe files (`*.json`) there; `recipes` names a directory of the dataset, which holds: textcraft_train.jsonl, textcraft_val.jsonl";
    // (The run prints a failure where it happens and again in its summary: once per line.)
    let lines: Vec<&str> = out.lines().filter(|l| l.contains(missing)).collect();
    assert!(!lines.is_empty() && lines.iter().all(|l| l.matches("my-textcraft").count() == 1), "said once, naming the user's path: {out}");
    assert!(!out.contains("objects/"), "{out}");

    // Strict: every problem, located in the user's file, and the stage fails.
    let p = loader(dir.path(), &fixture().display().to_string());
    let o = rao(&["run", p.to_str().unwrap(), "--set", "stages.eval_tasks.params.strict=true"], dir.path());
    assert!(!o.status.success());
    let out = text(&o);
    let val = format!("{}/textcraft_val.jsonl", fixture().display());
    for at in [
        format!("{val}:4:166: not a task in JSON"),
        format!("{val}:7: task `textcraft.val.5` cannot be done"),
        format!("{val}:8: no targets"),
    ] {
        assert!(out.contains(&at), "{at}\n{out}");
    }
    assert!(out.contains("3 problem(s)") && out.contains("strict: true"), "{out}");
    // Without `strict` the same data loads.
    let o = rao(&["run", p.to_str().unwrap()], dir.path());
    assert!(o.status.success(), "{}", text(&o));
}

/// `policy: gold` in a rollout: every tree of every task replays its gold to success, recursive
/// mode included (the gold never spawns).
#[test]
fn a_gold_rollout_reaches_every_target() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("gold.yaml");
    let body = format!(
        "name: gold\nstages:\n  files: {{kind: dataset, params: {{url: '{}'}}}}\n  \
         tasks: {{kind: textcraft_files, inputs: {{dataset: files.data}}, params: {{tasks: textcraft_train.jsonl}}}}\n  \
         replay: {{kind: rollout, inputs: {{tasks: tasks.tasks}}, params: {{policy: gold, mode: recursive, group_size: 2, limits: {{window: 512}}}}}}\n",
        fixture().display()
    );
    std::fs::write(&p, body).unwrap();
    let o = rao(&["run", p.to_str().unwrap()], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let trees = files_named(&dir.path().join(".rao/store"), "trees.parquet");
    assert_eq!(trees.len(), 1);
    let shown = text(&rao(&["inspect", trees[0].to_str().unwrap(), "--limit", "100"], dir.path()));
    assert_eq!(shown.matches("root score 1 · 1 nodes").count(), 24, "12 tasks × 2 trees: {shown}");
}
