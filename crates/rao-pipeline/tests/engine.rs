//! The engine through its library API: validation with positions, caching, loops, failures, stores.

use std::sync::Arc;

use rao_pipeline::{InProcess, InstanceStatus, Registry, Reporter, RunOptions, RunRecord, RunStatus, Store, compile_str};

fn compile(text: &str, dir: &std::path::Path) -> Result<rao_pipeline::Compiled, rao_pipeline::Diagnostics> {
    compile_str("p.yaml", text, dir, &[], &Registry::with_builtins())
}

fn errors(text: &str) -> Vec<(u64, u64, String, Option<String>)> {
    let dir = tempfile::tempdir().unwrap();
    match compile(text, dir.path()) {
        Ok(_) => panic!("expected errors"),
        Err(d) => d.items.into_iter().map(|i| (i.pos.line, i.pos.column, i.message, i.help)).collect(),
    }
}

async fn run_with(text: &str, dir: &std::path::Path, store: &Store, overrides: &[String], jobs: usize) -> RunRecord {
    let registry = Registry::with_builtins();
    let c = compile_str("p.yaml", text, dir, overrides, &registry).unwrap_or_else(|d| panic!("{d}"));
    let exec = Arc::new(InProcess { registry: Arc::new(registry), store: store.clone(), reporter: Reporter::silent() });
    rao_pipeline::run(Arc::new(c), exec, store, RunOptions { jobs, ..Default::default() }).await.unwrap()
}

/// The bytes of one file of a finished instance's output, found through its manifest.
async fn output_file(store: &Store, fp: &str, output: &str, file: &str) -> bytes::Bytes {
    let m = rao_store::manifest::read(store, fp).await.unwrap().done().expect("a finished manifest");
    store.get(&m.file_key(output, file)).await.unwrap()
}

fn status_of<'a>(r: &'a RunRecord, name: &str) -> &'a InstanceStatus {
    &r.instances.iter().find(|i| i.name == name).unwrap_or_else(|| panic!("no instance {name}")).status
}

#[test]
fn yaml_syntax_error_has_position() {
    let e = errors("name: x\nstages:\n  a:\n    kind: shell\n   params: [\n");
    assert_eq!(e.len(), 1);
    assert_eq!((e[0].0, e[0].1), (5, 4), "{e:?}");
}

#[test]
fn unknown_key_suggests_the_right_one() {
    let e = errors("name: x\nstages:\n  a:\n    kind: noop\n    retires: 2\n");
    assert_eq!((e[0].0, e[0].1), (5, 5));
    assert!(e[0].2.contains("retires"));
    assert_eq!(e[0].3.as_deref(), Some("did you mean `retries`?"));
}

#[test]
fn wrong_type_is_located() {
    let e = errors("name: x\nseed: abc\nstages:\n  a: {kind: noop}\n");
    assert_eq!((e[0].0, e[0].1), (2, 7), "{e:?}");
}

#[test]
fn semantic_errors_are_all_reported_with_positions() {
    let text = "\
name: x
stages:
  a:
    kind: shel
  b:
    kind: shell
    params: {command: 'true', comand: 1}
    inputs: {i: a.nope}
    outputs: [o, o]
  c:
    kind: noop
    inputs: {i: ghost.out}
";
    let e = errors(text);
    let find = |needle: &str| e.iter().find(|x| x.2.contains(needle)).unwrap_or_else(|| panic!("no `{needle}` in {e:?}"));
    let k = find("unknown stage kind `shel`");
    assert_eq!((k.0, k.1), (4, 11));
    assert_eq!(k.3.as_deref(), Some("did you mean `shell`?"));
    let p = find("unknown field `comand`");
    assert_eq!(p.0, 7);
    assert_eq!(p.3.as_deref(), Some("did you mean `command`?"));
    let d = find("declared twice");
    assert_eq!((d.0, d.1), (9, 18));
    let g = find("unknown stage `ghost`");
    assert_eq!((g.0, g.1), (12, 17));
}

#[test]
fn reference_to_missing_output_names_the_outputs() {
    let e =
        errors("name: x\nstages:\n  a: {kind: shell, params: {command: 'true'}, outputs: [data]}\n  b: {kind: noop, inputs: {i: a.dat}}\n");
    assert_eq!(e[0].0, 4);
    assert!(e[0].2.contains("has no output `dat`"));
    assert_eq!(e[0].3.as_deref(), Some("did you mean `data`?"));
}

#[test]
fn cycles_name_their_stages() {
    let text = "\
name: x
stages:
  a: {kind: noop, inputs: {i: c.o}, outputs: [o]}
  b: {kind: noop, inputs: {i: a.o}, outputs: [o]}
  c: {kind: noop, inputs: {i: b.o}, outputs: [o]}
  d: {kind: noop, outputs: [o]}
";
    let e = errors(text);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].2.contains("cycle: a → b → c → a"), "{}", e[0].2);
    assert_eq!(e[0].0, 3);
}

#[test]
fn loops_and_matrices_expand() {
    let dir = tempfile::tempdir().unwrap();
    let text = "\
name: x
stages:
  init: {kind: noop, outputs: [m]}
  train:
    loop:
      max_iterations: 3
      init: {model: init.m}
      carry: {model: update.m}
    stages:
      rollout: {kind: noop, inputs: {m: loop.model}, outputs: [t]}
      update: {kind: noop, inputs: {m: loop.model, t: rollout.t}, outputs: [m]}
  eval:
    kind: noop
    matrix: {band: [easy, hard]}
    params: {value: '${matrix.band}'}
    inputs: {m: train.model}
";
    let c = compile(text, dir.path()).unwrap();
    let names: Vec<&str> = c.order.iter().map(|&i| c.instances[i].name.as_str()).collect();
    assert_eq!(
        names,
        ["init", "rollout@1", "update@1", "rollout@2", "update@2", "rollout@3", "update@3", "eval[band=easy]", "eval[band=hard]"]
    );
    let eval = &c.instances[c.instance_index("eval[band=hard]").unwrap()];
    assert_eq!(eval.params["value"], "hard");
    // Iteration 2 reads iteration 1's update.
    let r2 = c.instance_index("rollout@2").unwrap();
    let u1 = c.instance_index("update@1").unwrap();
    assert!(c.predecessors(r2).any(|p| p == u1));
}

#[tokio::test]
async fn cache_hit_then_exactly_the_changed_stage_and_dependents_rerun() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open("memory://", dir.path()).unwrap();
    let text = "\
name: x
params: {n: 3}
stages:
  a: {kind: shell, params: {command: 'seq 1 ${params.n} > ${outputs.o}/f'}, outputs: [o]}
  b: {kind: shell, params: {command: 'wc -l < ${inputs.i}/f > ${outputs.o}/f'}, inputs: {i: a.o}, outputs: [o]}
  c: {kind: shell, params: {command: 'echo hi > ${outputs.o}/f'}, outputs: [o]}
  d: {kind: shell, params: {command: 'cat ${inputs.x}/f ${inputs.y}/f > ${outputs.o}/f'}, inputs: {x: b.o, y: c.o}, outputs: [o]}
";
    let r1 = run_with(text, dir.path(), &store, &[], 2).await;
    assert!(r1.instances.iter().all(|i| i.status == InstanceStatus::Done), "{r1:?}");
    let r2 = run_with(text, dir.path(), &store, &[], 2).await;
    assert!(r2.instances.iter().all(|i| i.status == InstanceStatus::Cached));
    let r3 = run_with(text, dir.path(), &store, &["params.n=5".into()], 2).await;
    for (name, want) in
        [("a", InstanceStatus::Done), ("b", InstanceStatus::Done), ("c", InstanceStatus::Cached), ("d", InstanceStatus::Done)]
    {
        assert_eq!(status_of(&r3, name), &want, "{name}");
    }
    // The final artifact really changed: 5 lines counted, then "hi".
    let d = r3.instances.iter().find(|i| i.name == "d").unwrap();
    let fp = d.fingerprint.as_ref().unwrap();
    let bytes = output_file(&store, fp, "o", "f").await;
    assert_eq!(String::from_utf8_lossy(&bytes), "5\nhi\n");
    assert_eq!(r3.overrides, vec!["params.n=5".to_string()]);
}

#[tokio::test]
async fn independent_stages_overlap_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open("memory://", dir.path()).unwrap();
    let text = "\
name: x
stages:
  a: {kind: shell, params: {command: 'sleep 0.4'}}
  b: {kind: shell, params: {command: 'sleep 0.4'}}
  c: {kind: shell, params: {command: 'sleep 0.4'}}
";
    let r = run_with(text, dir.path(), &store, &[], 3).await;
    let spans: Vec<(f64, f64)> = r.instances.iter().map(|i| (i.started_at.unwrap(), i.finished_at.unwrap())).collect();
    let latest_start = spans.iter().map(|s| s.0).fold(f64::MIN, f64::max);
    let earliest_end = spans.iter().map(|s| s.1).fold(f64::MAX, f64::min);
    assert!(latest_start < earliest_end, "all three ran at the same time: {spans:?}");
    // And with --jobs 1 they do not.
    let store1 = Store::open("memory://", dir.path()).unwrap();
    let r1 = run_with(text, dir.path(), &store1, &[], 1).await;
    let mut s1: Vec<(f64, f64)> = r1.instances.iter().map(|i| (i.started_at.unwrap(), i.finished_at.unwrap())).collect();
    s1.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(s1.windows(2).all(|w| w[0].1 <= w[1].0 + 1e-3), "jobs=1 overlapped: {s1:?}");
}

#[tokio::test]
async fn a_failure_stops_dependents_but_independent_stages_finish() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open("memory://", dir.path()).unwrap();
    let text = "\
name: x
stages:
  bad: {kind: shell, params: {command: 'echo boom >&2; exit 3'}, outputs: [o], retries: 1}
  after: {kind: noop, inputs: {i: bad.o}}
  other: {kind: shell, params: {command: 'sleep 0.2'}}
  other2: {kind: noop, inputs: {}}
";
    let r = run_with(text, dir.path(), &store, &[], 2).await;
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(status_of(&r, "bad"), &InstanceStatus::Failed);
    assert_eq!(status_of(&r, "after"), &InstanceStatus::Skipped);
    assert_eq!(status_of(&r, "other"), &InstanceStatus::Done);
    assert_eq!(status_of(&r, "other2"), &InstanceStatus::Done);
    let why = r.failures()[0].1;
    assert!(why.contains("boom") && why.contains("exit"), "{why}");
}

#[tokio::test]
async fn retries_then_succeeds_and_timeouts_fail() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open("memory://", dir.path()).unwrap();
    let flag = dir.path().join("flag");
    let text = format!(
        "name: x\nstages:\n  flaky: {{kind: shell, params: {{command: 'test -e {f} || {{ touch {f}; exit 1; }}'}}, retries: 2}}\n  slow: {{kind: shell, params: {{command: 'sleep 5'}}, timeout: 300ms}}\n",
        f = flag.display()
    );
    let r = run_with(&text, dir.path(), &store, &[], 2).await;
    let flaky = r.instances.iter().find(|i| i.name == "flaky").unwrap();
    assert_eq!(flaky.status, InstanceStatus::Done);
    assert_eq!(flaky.attempts, 2);
    let slow = r.instances.iter().find(|i| i.name == "slow").unwrap();
    assert_eq!(slow.status, InstanceStatus::Failed);
    assert!(slow.reason.as_deref().unwrap().contains("timed out"));
    assert!(slow.finished_at.unwrap() - slow.started_at.unwrap() < 3.0, "the child was not killed on timeout");
}

#[tokio::test]
async fn loop_stops_early_on_a_metric_and_feeds_the_last_iteration_downstream() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store").to_str().unwrap(), dir.path()).unwrap();
    // Each step appends a line; the stop metric is read from a file by a tiny metric kind below.
    let text = &counting_loop(
        6,
        Some("step.lines, above: 4"),
        "  final: {kind: shell, params: {command: 'cp ${inputs.s}/n ${outputs.o}/n'}, inputs: {s: grow.state}, outputs: [o]}\n",
    );
    let mut registry = Registry::with_builtins();
    registry.register(Arc::new(Counting));
    let c = Arc::new(compile_str("p.yaml", text, dir.path(), &[], &registry).unwrap_or_else(|d| panic!("{d}")));
    let exec = Arc::new(InProcess { registry: Arc::new(registry.clone()), store: store.clone(), reporter: Reporter::silent() });
    // Before the run the store cannot tell what `final` will be (`rao gc` then keeps everything).
    let undecided = rao_pipeline::snapshot::snapshot(&c, &store).await.unwrap();
    assert_eq!(undecided.undetermined(&c), Some("final"));
    let r = rao_pipeline::run(c.clone(), exec.clone(), &store, RunOptions::default()).await.unwrap();
    assert_eq!(r.status, RunStatus::Succeeded);
    let decided = rao_pipeline::snapshot::snapshot(&c, &store).await.unwrap();
    assert_eq!(decided.undetermined(&c), None);
    for k in 1..=3 {
        assert_eq!(status_of(&r, &format!("step@{k}")), &InstanceStatus::Done);
    }
    for k in 4..=6 {
        assert_eq!(status_of(&r, &format!("step@{k}")), &InstanceStatus::Skipped);
    }
    let fin = r.instances.iter().find(|i| i.name == "final").unwrap();
    let bytes = output_file(&store, fin.fingerprint.as_ref().unwrap(), "o", "n").await;
    assert_eq!(String::from_utf8_lossy(&bytes).lines().count(), 4);
    // The same decision is made from the store alone.
    let rows = rao_pipeline::plan::rows(&c, &store).await.unwrap();
    assert!(rows.iter().all(|r| matches!(r.state, rao_pipeline::plan::State::Done | rao_pipeline::plan::State::Skipped)), "{rows:?}");
    let again = rao_pipeline::run(c, exec, &store, RunOptions::default()).await.unwrap();
    assert_eq!(status_of(&again, "final"), &InstanceStatus::Cached);
}

#[tokio::test]
async fn a_body_stage_with_every_runs_on_every_nth_iteration_and_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store").to_str().unwrap(), dir.path()).unwrap();
    let look = "      look: {kind: shell, every: 3, params: {command: 'wc -l < ${inputs.s}/n > ${outputs.o}/lines'}, inputs: {s: step.o}, outputs: [o]}\n";
    let text = |max: u32, stop: Option<&str>| counting_loop(max, stop, look);
    let mut registry = Registry::with_builtins();
    registry.register(Arc::new(Counting));
    let run = |text: String| {
        let (registry, store) = (registry.clone(), store.clone());
        let dir = dir.path().to_path_buf();
        async move {
            let c = Arc::new(compile_str("p.yaml", &text, &dir, &[], &registry).unwrap_or_else(|d| panic!("{d}")));
            let exec = Arc::new(InProcess { registry: Arc::new(registry), store: store.clone(), reporter: Reporter::silent() });
            rao_pipeline::run(c, exec, &store, RunOptions::default()).await.unwrap()
        }
    };
    // Seven iterations: `look` at 3, 6 and 7 (the last), reading that iteration's state.
    let r = run(text(7, None)).await;
    assert_eq!(r.status, RunStatus::Succeeded);
    let looks: Vec<&str> = r.instances.iter().filter(|i| i.name.starts_with("look@")).map(|i| i.name.as_str()).collect();
    assert_eq!(looks, ["look@3", "look@6", "look@7"]);
    for (k, lines) in [(3, 4), (6, 7), (7, 8)] {
        let look = r.instances.iter().find(|i| i.name == format!("look@{k}")).unwrap();
        let bytes = output_file(&store, look.fingerprint.as_ref().unwrap(), "o", "lines").await;
        assert_eq!(String::from_utf8_lossy(&bytes).trim(), lines.to_string(), "look@{k}");
    }
    // Stopped early after iteration 4: `look@3` ran, the later ones are skipped with their loop.
    let r = run(text(7, Some("step.lines, above: 5"))).await;
    assert_eq!(status_of(&r, "look@3"), &InstanceStatus::Cached);
    assert_eq!(status_of(&r, "look@6"), &InstanceStatus::Skipped);
    assert_eq!(status_of(&r, "look@7"), &InstanceStatus::Skipped);
}

#[tokio::test]
async fn a_stop_metric_the_stage_does_not_report_is_said_once_and_the_loop_runs_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store").to_str().unwrap(), dir.path()).unwrap();
    let text = &counting_loop(3, Some("step.line, above: 1"), "");
    let mut registry = Registry::with_builtins();
    registry.register(Arc::new(Counting));
    let c = Arc::new(compile_str("p.yaml", text, dir.path(), &[], &registry).unwrap_or_else(|d| panic!("{d}")));
    let exec = Arc::new(InProcess { registry: Arc::new(registry.clone()), store: store.clone(), reporter: Reporter::silent() });
    let notes = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = notes.clone();
    let reporter = Reporter::new(move |e| {
        if let rao_pipeline::events::Event::Note { message, .. } = e {
            seen.lock().unwrap().push(message.clone());
        }
    });
    let r = rao_pipeline::run(c, exec, &store, RunOptions { reporter, ..RunOptions::default() }).await.unwrap();
    assert_eq!(r.status, RunStatus::Succeeded);
    assert_eq!(status_of(&r, "step@3"), &InstanceStatus::Done, "a metric never reported never stops the loop");
    let notes = notes.lock().unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("`step.line`") && notes[0].contains("it reports: lines") && notes[0].contains("all 3 iterations"),
        "{notes:?}"
    );
}

/// A loop of `counting` steps over a one-line seed file, stopping on `stop` (`METRIC, above: X`)
/// if given, followed by the lines in `after` (indented 6: more loop-body stages; 2: stages after
/// the loop).
fn counting_loop(max_iterations: u32, stop: Option<&str>, after: &str) -> String {
    let stop = stop.map(|s| format!("      stop_when: {{metric: {s}}}\n")).unwrap_or_default();
    format!(
        "\
name: x
stages:
  seed: {{kind: shell, params: {{command: 'echo 1 > ${{outputs.o}}/n'}}, outputs: [o]}}
  grow:
    loop:
      max_iterations: {max_iterations}
      init: {{state: seed.o}}
      carry: {{state: step.o}}
{stop}    stages:
      step: {{kind: counting, inputs: {{prev: loop.state}}}}
{after}"
    )
}

/// Appends a line to its input file and reports the line count as metric `lines`.
struct Counting;
impl rao_pipeline::KindSignature for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }
    fn version(&self) -> u32 {
        1
    }
    fn describe(&self) -> &'static str {
        "test kind"
    }
    fn params_schema(&self) -> schemars::Schema {
        schemars::json_schema!({"type": "object"})
    }
    fn check_params(&self, _: &serde_json::Value) -> Result<(), rao_pipeline::ParamError> {
        Ok(())
    }
    fn inputs(&self) -> Option<&'static [rao_pipeline::InputDecl]> {
        Some(&[rao_pipeline::InputDecl { name: "prev", required: true }])
    }
    fn outputs(&self) -> Option<&'static [&'static str]> {
        Some(&["o"])
    }
}

impl rao_pipeline::StageKind for Counting {
    fn run(&self, ctx: rao_pipeline::StageContext) -> futures::future::BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            let prev = ctx.input("prev")?[0].clone();
            let mut text = String::from_utf8(ctx.read_input_file(&prev, "n").await?.to_vec())?;
            text.push_str("1\n");
            ctx.set_metric("lines", text.lines().count() as f64);
            ctx.write_output("o", "n", text.as_bytes())
        })
    }
}

#[tokio::test]
async fn local_directory_and_memory_stores_give_the_same_artifacts() {
    let dir = tempfile::tempdir().unwrap();
    let text = "\
name: x
seed: 11
stages:
  a: {kind: shell, params: {command: 'echo $RAO_SEED > ${outputs.o}/seed; seq 1 10 > ${outputs.o}/nums'}, outputs: [o]}
  b: {kind: shell, params: {command: 'sort -r ${inputs.i}/nums > ${outputs.o}/rev'}, inputs: {i: a.o}, outputs: [o]}
";
    let mem = Store::open("memory://", dir.path()).unwrap();
    let local = Store::open(dir.path().join("s").to_str().unwrap(), dir.path()).unwrap();
    let r1 = run_with(text, dir.path(), &mem, &[], 2).await;
    let r2 = run_with(text, dir.path(), &local, &[], 2).await;
    for (x, y) in r1.instances.iter().zip(&r2.instances) {
        assert_eq!(x.fingerprint, y.fingerprint);
        let key = rao_store::store::manifest_key(x.fingerprint.as_ref().unwrap());
        let m1: rao_store::store::Manifest = mem.get_json(&key).await.unwrap().unwrap();
        let m2: rao_store::store::Manifest = local.get_json(&key).await.unwrap().unwrap();
        assert_eq!(m1.outputs, m2.outputs, "same files, same hashes");
    }
    // The local store is a plain directory other tools can read.
    assert!(local.local_root().unwrap().join("objects").is_dir());
}

#[test]
fn a_variant_extends_a_pipeline_and_its_bad_changes_point_at_its_own_lines() {
    let dir = tempfile::tempdir().unwrap();
    let base = "name: base\nparams:\n  size: 1\nstages:\n  a:\n    kind: noop\n    params: {value: 1}\n  b:\n    kind: noop\n    inputs: {x: a.out}\n";
    std::fs::write(dir.path().join("base.yaml"), base.replace("kind: noop\n    params", "kind: noop\n    outputs: [out]\n    params"))
        .unwrap();
    let variant =
        "extends: base.yaml\nname: variant\ndescription: a smaller one\nset:\n  params.size: 2\n  stages.a.params.value: [3, 4]\n";
    std::fs::write(dir.path().join("v.yaml"), variant).unwrap();
    let registry = Registry::with_builtins();
    let c = rao_plan::compile::load(&dir.path().join("v.yaml"), &["seed=9".to_string()], &registry).unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(c.name, "variant");
    assert_eq!(c.resolved["params"]["size"], 2);
    assert_eq!(c.resolved["stages"]["a"]["params"]["value"], serde_json::json!([3, 4]));
    assert_eq!(c.resolved["seed"], 9, "command-line overrides apply on top");
    assert_eq!(c.overrides, vec!["seed=9".to_string()], "only the command line's overrides are recorded as overrides");

    let bad = "extends: base.yaml\nname: variant\nset:\n  params.size: 2\n  stages.c.params.value: 1\n";
    std::fs::write(dir.path().join("bad.yaml"), bad).unwrap();
    let d = rao_plan::compile::load(&dir.path().join("bad.yaml"), &[], &registry).unwrap_err();
    assert!(d.file.ends_with("bad.yaml"), "{}", d.file);
    assert_eq!(d.items.len(), 1);
    assert_eq!(d.items[0].pos.line, 5, "{d}");
    assert!(d.items[0].message.contains("no stage `c`"), "{d}");

    std::fs::write(dir.path().join("missing.yaml"), "extends: nowhere.yaml\nname: m\n").unwrap();
    let d = rao_plan::compile::load(&dir.path().join("missing.yaml"), &[], &registry).unwrap_err();
    assert_eq!(d.items[0].pos.line, 1, "{d}");
}

#[tokio::test]
async fn a_dataset_reruns_its_dependents_exactly_when_its_content_changes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("data/sub")).unwrap();
    std::fs::write(dir.path().join("data/tasks.jsonl"), "one\n").unwrap();
    std::fs::write(dir.path().join("data/sub/extra.txt"), "x\n").unwrap();
    let store = Store::open("memory://", dir.path()).unwrap();
    let text = "\
name: x
stages:
  data: {kind: dataset, params: {url: data}}
  use: {kind: shell, params: {command: 'cat ${inputs.d}/tasks.jsonl ${inputs.d}/sub/extra.txt > ${outputs.o}/f'}, inputs: {d: data.data}, outputs: [o]}
";
    let r1 = run_with(text, dir.path(), &store, &[], 2).await;
    assert!(r1.instances.iter().all(|i| i.status == InstanceStatus::Done), "{r1:?}");
    // Rewriting the same bytes (a new modification time) is still a cache hit.
    std::fs::write(dir.path().join("data/tasks.jsonl"), "one\n").unwrap();
    let r2 = run_with(text, dir.path(), &store, &[], 2).await;
    assert!(r2.instances.iter().all(|i| i.status == InstanceStatus::Cached), "{r2:?}");
    // New content of the same size: the dataset and what reads it run again, on the new bytes.
    std::fs::write(dir.path().join("data/tasks.jsonl"), "two\n").unwrap();
    let r3 = run_with(text, dir.path(), &store, &[], 2).await;
    assert_eq!((status_of(&r3, "data"), status_of(&r3, "use")), (&InstanceStatus::Done, &InstanceStatus::Done));
    let fp = r3.instances.iter().find(|i| i.name == "use").unwrap().fingerprint.clone().unwrap();
    let bytes = output_file(&store, &fp, "o", "f").await;
    assert_eq!(String::from_utf8_lossy(&bytes), "two\nx\n");

    // A dataset that is not there is an error at its stage's line, before anything runs.
    let e = errors("name: x\nstages:\n  gone: {kind: dataset, params: {url: /nonexistent/rao-dataset.jsonl}}\n");
    assert_eq!(e[0].0, 3, "{e:?}");
    assert!(e[0].2.contains("stage `gone`") && e[0].2.contains("no object there"), "{e:?}");
}

#[test]
fn a_dataset_folder_that_links_back_up_is_refused_not_walked_forever() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("data/sub")).unwrap();
    std::fs::write(dir.path().join("data/sub/tasks.jsonl"), "one\n").unwrap();
    std::os::unix::fs::symlink("..", dir.path().join("data/sub/up")).unwrap();
    let e = match compile("name: x\nstages:\n  data: {kind: dataset, params: {url: data}}\n", dir.path()) {
        Ok(_) => panic!("a folder that contains itself was listed"),
        Err(d) => d.items,
    };
    assert_eq!(e[0].pos.line, 3, "{e:?}");
    assert!(e[0].message.contains("a link leads back to a folder above it"), "{e:?}");
}

/// Panics in its stage code.
struct Panicking;
impl rao_pipeline::KindSignature for Panicking {
    fn name(&self) -> &'static str {
        "panicking"
    }
    fn version(&self) -> u32 {
        1
    }
    fn describe(&self) -> &'static str {
        "test kind"
    }
    fn params_schema(&self) -> schemars::Schema {
        schemars::json_schema!({"type": "object"})
    }
    fn check_params(&self, _: &serde_json::Value) -> Result<(), rao_pipeline::ParamError> {
        Ok(())
    }
    fn inputs(&self) -> Option<&'static [rao_pipeline::InputDecl]> {
        None
    }
    fn outputs(&self) -> Option<&'static [&'static str]> {
        Some(&["o"])
    }
}

impl rao_pipeline::StageKind for Panicking {
    fn run(&self, _ctx: rao_pipeline::StageContext) -> futures::future::BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move { panic!("index out of bounds in the stage") })
    }
}

#[tokio::test]
async fn a_panicking_stage_fails_alone_and_the_run_record_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open("memory://", dir.path()).unwrap();
    let mut registry = Registry::with_builtins();
    registry.register(Arc::new(Panicking));
    let text = "\
name: x
stages:
  bad: {kind: panicking}
  after: {kind: noop, inputs: {i: bad.o}}
  other: {kind: shell, params: {command: 'sleep 0.2; echo ok > ${outputs.o}/f'}, outputs: [o]}
";
    let c = compile_str("p.yaml", text, dir.path(), &[], &registry).unwrap_or_else(|d| panic!("{d}"));
    let exec = Arc::new(InProcess { registry: Arc::new(registry), store: store.clone(), reporter: Reporter::silent() });
    let r = rao_pipeline::run(Arc::new(c), exec, &store, RunOptions { jobs: 2, ..Default::default() }).await.unwrap();
    assert_eq!(status_of(&r, "bad"), &InstanceStatus::Failed);
    let why = r.instances.iter().find(|i| i.name == "bad").unwrap().reason.clone().unwrap();
    assert!(why.contains("panicked") && why.contains("index out of bounds"), "{why}");
    assert_eq!(status_of(&r, "after"), &InstanceStatus::Skipped);
    assert_eq!(status_of(&r, "other"), &InstanceStatus::Done);
    assert_eq!(r.status, RunStatus::Failed);
}

#[test]
fn fingerprints_hash_params_as_resolved_and_the_kinds_code() {
    let dir = tempfile::tempdir().unwrap();
    let fp = |stage: &str| {
        let c = compile(&format!("name: x\nstages:\n  a: {stage}\n"), dir.path()).unwrap_or_else(|d| panic!("{d}"));
        let parts = c.fp_parts(0, |_| None, |_| None).unwrap();
        (parts.fingerprint(), parts)
    };
    // A default written out is the same instance as one left out …
    let (implicit, parts) = fp("{kind: shell, params: {command: 'echo hi > ${outputs.o}/f'}, outputs: [o]}");
    let (explicit, _) = fp("{kind: shell, params: {command: 'echo hi > ${outputs.o}/f', deps: [], env: {}}, outputs: [o]}");
    assert_eq!(implicit, explicit);
    // … and a different value is not.
    let (other, other_parts) = fp("{kind: shell, params: {command: 'echo hi > ${outputs.o}/f', env: {A: b}}, outputs: [o]}");
    assert_ne!(implicit, other);
    assert_eq!(other_parts.explain_change(&parts), vec!["params.env.A added (\"b\")".to_string()]);
    // The kind's code is in it: another build of the kind's source is another fingerprint.
    assert_eq!(parts.code.len(), 16, "shell has a build-time code version");
    let mut changed = parts.clone();
    changed.code = "0".repeat(16);
    assert_ne!(changed.fingerprint(), implicit);
    assert_eq!(changed.explain_change(&parts), vec!["code of kind shell changed".to_string()]);
}

/// A loop whose rollouts read the policy `by` updates behind (`lag`), of shell stages that write
/// what they read: `policy` files name the chain of updates, `trees` the policy they sampled with.
fn lagged_loop(by: Option<u32>, sleep: f64) -> String {
    let (lag, read) = match by {
        Some(by) => (format!("      lag: {{behaviour: {{of: policy, by: {by}}}}}\n"), "loop.behaviour"),
        None => (String::new(), "loop.policy"),
    };
    format!(
        "\
name: x
stages:
  init: {{kind: shell, params: {{command: 'echo p0 > ${{outputs.o}}/p'}}, outputs: [o]}}
  train:
    loop:
      max_iterations: 5
      init: {{policy: init.o}}
      carry: {{policy: update.o}}
{lag}    stages:
      rollout:
        kind: shell
        inputs: {{b: {read}}}
        params: {{command: 'sleep {sleep}; cat ${{inputs.b}}/p > ${{outputs.o}}/t'}}
        outputs: [o]
      update:
        kind: shell
        inputs: {{p: loop.policy, t: rollout.o}}
        params: {{command: 'sleep {sleep}; (cat ${{inputs.p}}/p; echo \"+ trees of [$(tr \"\\n\" \" \" < ${{inputs.t}}/t)]\") > ${{outputs.o}}/p'}}
        outputs: [o]
"
    )
}

#[test]
fn a_lagged_variable_reads_the_carried_value_that_many_iterations_back() {
    let dir = tempfile::tempdir().unwrap();
    let c = compile(&lagged_loop(Some(2), 0.0), dir.path()).unwrap();
    let reads = |name: &str| -> Vec<String> {
        let i = c.instance_index(name).unwrap();
        c.predecessors(i).map(|p| c.instances[p].name.clone()).collect()
    };
    // Iteration i samples with update i−1−2; before update 1, with the init.
    assert_eq!(reads("rollout@1"), ["init"]);
    assert_eq!(reads("rollout@3"), ["init"]);
    assert_eq!(reads("rollout@4"), ["update@1"]);
    assert_eq!(reads("rollout@5"), ["update@2"]);
    // The learner always starts from the freshest policy.
    let mut u5 = reads("update@5");
    u5.sort();
    assert_eq!(u5, ["rollout@5", "update@4"]);
}

#[test]
fn a_lag_that_follows_nothing_carried_or_shadows_a_carried_name_is_located() {
    let e = errors(&lagged_loop(Some(1), 0.0).replace("of: policy", "of: polcy"));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].2.contains("lag `behaviour` follows `polcy`, which the loop does not carry"), "{e:?}");
    assert_eq!((e[0].0, e[0].3.as_deref()), (9, Some("did you mean `policy`?")));
    let e = errors(&lagged_loop(Some(1), 0.0).replace("lag: {behaviour:", "lag: {policy:").replace("loop.behaviour", "loop.policy"));
    assert!(e.iter().any(|e| e.2.contains("lag `policy` has the name of a carried variable") && e.0 == 9), "{e:?}");
}

#[tokio::test]
async fn lag_0_is_the_synchronous_loop_and_lag_1_overlaps_rollouts_with_updates() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open("memory://", dir.path()).unwrap();
    // Lag 0 is the loop without a lag, artifact for artifact: its run finds everything cached.
    let plain = run_with(&lagged_loop(None, 0.0), dir.path(), &store, &[], 2).await;
    assert_eq!(plain.status, RunStatus::Succeeded);
    let lag0 = run_with(&lagged_loop(Some(0), 0.0), dir.path(), &store, &[], 2).await;
    assert!(lag0.instances.iter().all(|i| i.status == InstanceStatus::Cached), "{:?}", lag0.instances);
    let fps = |r: &RunRecord| r.instances.iter().map(|i| i.fingerprint.clone().unwrap()).collect::<Vec<_>>();
    assert_eq!(fps(&plain), fps(&lag0));

    // Lag 1: rollout@i+1 runs beside update@i, and every update trains on its own iteration's trees.
    let r = run_with(&lagged_loop(Some(1), 0.3), dir.path(), &store, &[], 2).await;
    assert_eq!(r.status, RunStatus::Succeeded);
    let span = |name: &str| {
        let i = r.instances.iter().find(|i| i.name == name).unwrap();
        (i.started_at.unwrap(), i.finished_at.unwrap())
    };
    for k in 2..=4 {
        let (rs, re) = span(&format!("rollout@{}", k + 1));
        let (us, ue) = span(&format!("update@{k}"));
        assert!(rs < ue && us < re, "rollout@{} and update@{k} did not overlap: {:?} {:?}", k + 1, (rs, re), (us, ue));
    }
    let last = r.instances.iter().find(|i| i.name == "update@5").unwrap().fingerprint.clone().unwrap();
    let policy = String::from_utf8(output_file(&store, &last, "o", "p").await.to_vec()).unwrap();
    // Update i trains on trees sampled with update i−2's policy (the init for i ≤ 2).
    let mut expected = "p0".to_string();
    let mut versions = vec![expected.clone()];
    for i in 1..=5usize {
        let behaviour = versions[i.saturating_sub(2)].clone();
        expected = format!("{expected}\n+ trees of [{} ]", behaviour.replace('\n', " "));
        versions.push(expected.clone());
    }
    assert_eq!(policy.trim_end(), expected);
}
