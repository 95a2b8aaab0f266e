//! End-to-end: the `rao` binary on real pipeline files, real processes and a real local store.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::concurrent;
use crate::support::{rao, text};

/// A chain a → b → c whose commands log each execution to `ran.log` and take a while.
fn chain(dir: &Path) -> std::path::PathBuf {
    let log = dir.join("ran.log");
    let p = dir.join("chain.yaml");
    let stage = |name: &str, input: Option<&str>| {
        let inputs = input.map(|i| format!(", inputs: {{i: {i}.o}}")).unwrap_or_default();
        format!(
            "  {name}: {{kind: shell, params: {{command: 'echo {name} >> {log}; sleep 0.6; echo {name} > ${{outputs.o}}/v'}}, outputs: [o]{inputs}}}\n",
            log = log.display()
        )
    };
    let body = format!("name: chain\nstages:\n{}{}{}", stage("a", None), stage("b", Some("a")), stage("c", Some("b")));
    std::fs::write(&p, body).unwrap();
    p
}

#[test]
fn kill_9_mid_run_leaves_finished_work_and_the_next_run_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let p = chain(dir.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_rao")).args(["run", p.to_str().unwrap()]).current_dir(dir.path()).spawn().unwrap();
    // Wait until b has started (a is done), then kill -9 the whole run.
    let log = dir.path().join("ran.log");
    let t0 = Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains('b') {
        assert!(t0.elapsed() < Duration::from_secs(30), "b never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let status = text(&rao(&["status", p.to_str().unwrap()], dir.path()));
    assert!(status.contains("done     a"), "{status}");
    assert!(status.contains("missing  b"), "b must not look done: {status}");
    let second = rao(&["run", p.to_str().unwrap()], dir.path());
    assert!(second.status.success(), "{}", text(&second));
    let out = text(&second);
    assert!(out.contains("cached   a"), "{out}");
    let ran = std::fs::read_to_string(&log).unwrap();
    assert_eq!(ran.matches('a').count(), 1, "a ran once: {ran}");
    assert_eq!(ran.matches('c').count(), 1, "c ran once: {ran}");
    let status = text(&rao(&["status", p.to_str().unwrap()], dir.path()));
    assert!(status.contains("3/3 done"), "{status}");
}

/// `rao path` refuses a matrix stage's bare name with its instances' names, says what to name
/// for a loop, and takes a loop body stage for its last finished iteration.
#[test]
fn path_refuses_ambiguous_names_with_the_names_to_use() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("m.yaml"),
        "name: m\nstages:\n  count: {kind: shell, matrix: {n: [1, 2]}, params: {command: 'echo ${matrix.n} > ${outputs.o}/v'}, outputs: [o]}\n  refine:\n    loop:\n      max_iterations: 2\n      init: {s: count.o}\n      carry: {s: step.o}\n    stages:\n      step: {kind: shell, inputs: {i: loop.s}, params: {command: 'echo x > ${outputs.o}/v'}, outputs: [o]}\n",
    )
    .unwrap();
    assert!(rao(&["run", "m.yaml"], dir.path()).status.success());
    let o = rao(&["path", "m.yaml", "count"], dir.path());
    assert!(
        !o.status.success() && text(&o).contains("stage `count` has 2 instances (a matrix); name one: count[n=1], count[n=2]"),
        "{}",
        text(&o)
    );
    let o = rao(&["path", "m.yaml", "refine"], dir.path());
    assert!(!o.status.success() && text(&o).contains("`refine` is a loop, not a stage: name one of its stages (step)"), "{}", text(&o));
    let last = rao(&["path", "m.yaml", "step"], dir.path());
    assert!(last.status.success(), "{}", text(&last));
    assert_eq!(last.stdout, rao(&["path", "m.yaml", "step@2"], dir.path()).stdout);
    assert!(rao(&["path", "m.yaml", "count[n=2]"], dir.path()).status.success());
}

/// After a run in which a stage failed, `status` and `plan` say it failed (which run, which
/// error) and why its dependents did not run, folded or not; once it is fixed, it is missing no
/// more.
#[test]
fn status_and_plan_report_failures_as_failures() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f.yaml");
    let write = |command: &str| {
        std::fs::write(
            &p,
            format!(
                "name: f\nstages:\n  ok: {{kind: shell, params: {{command: 'true'}}, outputs: [o]}}\n  boom: {{kind: shell, params: {{command: '{command}'}}, inputs: {{i: ok.o}}, outputs: [o]}}\n  after: {{kind: shell, params: {{command: 'true'}}, inputs: {{i: boom.o}}}}\n"
            ),
        )
        .unwrap()
    };
    write("exit 3");
    let p = p.to_str().unwrap();
    assert!(!rao(&["run", p], dir.path()).status.success());
    let status = text(&rao(&["status", p], dir.path()));
    let failed = status.lines().find(|l| l.starts_with("failed   boom")).unwrap_or_else(|| panic!("{status}"));
    assert!(failed.contains("failed in run ") && failed.contains("exit status: 3"), "{status}");
    assert!(status.contains("skipped in run ") && status.contains("upstream `boom` failed"), "{status}");
    assert!(status.contains("2 to run (1 failed last time, 1 missing)"), "{status}");
    let folded = text(&rao(&["status", p, "--folded"], dir.path()));
    assert!(folded.contains("failed   boom") && folded.contains("missing  after"), "{folded}");
    let plan = text(&rao(&["plan", p], dir.path()));
    assert!(plan.lines().any(|l| l.contains("boom") && l.contains("failed in run")), "{plan}");
    let json: serde_json::Value = serde_json::from_slice(&rao(&["status", p, "--json"], dir.path()).stdout).unwrap();
    assert_eq!(json[1]["state"], "failed", "{json}");
    // Fixed: it is a change, not a failure any more.
    write("true");
    let status = text(&rao(&["status", p], dir.path()));
    assert!(status.contains("missing  boom") && status.contains("changed since it failed in run "), "{status}");
    assert!(status.contains("2 to run (2 missing)"), "{status}");
}

#[test]
fn only_runs_its_stage_skips_the_rest_and_fails_when_an_input_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let p = chain(dir.path());
    let p = p.to_str().unwrap();
    let ran = || std::fs::read_to_string(dir.path().join("ran.log")).unwrap_or_default();
    // `b` needs `a`, which is not done: b fails (saying what to do), c is only skipped.
    let o = rao(&["run", p, "--only", "b"], dir.path());
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("FAILED   b: its input `a` is not done and not selected: run it first, or use --from a"), "{}", text(&o));
    assert!(text(&o).contains("skipped  a: not done, and not selected by --only/--from"), "{}", text(&o));
    assert!(text(&o).contains("skipped  c: upstream `b` did not finish"), "{}", text(&o));
    assert!(text(&o).contains("1 stage(s) failed"), "{}", text(&o));
    assert_eq!(ran(), "");
    // `c` needs `b`, which is missing because `a` is: both are named, and where to start.
    let o = rao(&["run", p, "--only", "c"], dir.path());
    assert!(!o.status.success(), "{}", text(&o));
    let expected = "FAILED   c: its input `b` is not done and not selected, nor is `a` above it: run them first, or use --from a";
    assert!(text(&o).contains(expected), "{}", text(&o));
    assert_eq!(ran(), "");
    // `a` alone succeeds although b and c are not done.
    let o = rao(&["run", p, "--only", "a"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(ran(), "a\n");
    let o = rao(&["run", p, "--only", "b"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(ran(), "a\nb\n");
}

#[test]
fn validate_fails_with_file_line_column_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.yaml");
    std::fs::write(&p, "name: bad\nstages:\n  a: {kind: shell, params: {command: 'touch ran'}, outputs: [o]}\n  b: {kind: shell, params: {command: 'true'}, inputs: {i: a.out}}\n").unwrap();
    for cmd in ["validate", "run"] {
        let o = rao(&[cmd, "bad.yaml"], dir.path());
        assert_eq!(o.status.code(), Some(2));
        let t = text(&o);
        assert!(t.contains("bad.yaml:4:"), "{t}");
        assert!(t.contains("has no output `out`") && t.contains("did you mean `o`?"), "{t}");
    }
    assert!(!dir.path().join("ran").exists(), "nothing may run when validation fails");
}

/// Keys serde would drop without a word (an internally tagged enum's unit variant, a type without
/// `deny_unknown_fields`) are refused at their place, with a suggestion.
#[test]
fn a_key_a_kind_would_ignore_is_refused_where_it_stands() {
    let dir = tempfile::tempdir().unwrap();
    let stages = "stages:\n  tasks: {kind: synthesize, params: {tiers: [1, 2], per_band: 4}}\n  \
        rollout: {kind: rollout, inputs: {tasks: tasks.tasks}, params: {policy: expert}}\n  \
        judge: {kind: judge, inputs: {trees: rollout.trees, tasks: tasks.tasks}, params: {mode: exact, verifer: strict}}\n  \
        advantage: {kind: advantage, inputs: {trees: judge.trees}}\n  \
        warmstart: {kind: warmstart, inputs: {tasks: tasks.tasks, gate_tasks: tasks.tasks}, \
        params: {model: {d_model: 16, n_layers: 1, n_heads: 2, d_ff: 32}, max_steps: 1, gate: {required: false}}}\n  \
        update: {kind: update, inputs: {trees: advantage.trees, checkpoint: warmstart.checkpoint, tasks: tasks.tasks}, \
        params: {loss: {kind: ppo_clip, epsilon: 0.2, epsilon_hi: 0.3}}}\n";
    std::fs::write(dir.path().join("k.yaml"), format!("name: k\n{stages}")).unwrap();
    let o = rao(&["validate", "k.yaml"], dir.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("k.yaml:5:") && t.contains("params.verifer: unknown key"), "{t}");
    assert!(t.contains("k.yaml:8:") && t.contains("params.loss.epsilon_hi: unknown key") && t.contains("did you mean `epsilon`?"), "{t}");
    // Without them the same file is valid: maps and free-form values keep their own keys.
    let fixed = stages.replace(", verifer: strict", "").replace(", epsilon_hi: 0.3", "");
    std::fs::write(dir.path().join("k.yaml"), format!("name: k\n{fixed}")).unwrap();
    let o = rao(&["validate", "k.yaml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
}

/// Counts and budgets that leave nothing to run, or ask for more memory than any machine has
/// (which aborted rao), are refused before anything runs, each at its stage.
#[test]
fn degenerate_counts_and_budgets_are_refused_by_validate() {
    let dir = tempfile::tempdir().unwrap();
    let file = "name: d\nstages:\n  \
        tasks: {kind: synthesize, params: {per_band: 100000000000000}}\n  \
        shallow: {kind: synthesize, params: {tiers: [5, 2]}}\n  \
        rollout: {kind: rollout, inputs: {tasks: shallow.tasks}, params: {group_size: 0, limits: {window: 0, max_nodes: 0}}}\n  \
        evaluate: {kind: evaluate, inputs: {tasks: tasks.tasks}, params: {policy: expert, modes: [], limits: {step_budget: 0}}}\n  \
        chains: {kind: multihop_tasks, params: {hops: [3, 2], per_hops: 0}}\n";
    std::fs::write(dir.path().join("d.yaml"), file).unwrap();
    let o = rao(&["validate", "d.yaml"], dir.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    for (line, says) in [
        (3, "per_band is 100000000000000: it must be between 1 and 1000000"),
        (4, "tiers [5, 2] is not a range [min, max] of this world's tiers 0–7"),
        (5, "group_size is 0"),
        (5, "limits.window is 0"),
        (5, "limits.max_nodes is 0"),
        (6, "modes is empty"),
        (6, "limits.step_budget is 0"),
        (7, "per_hops is 0"),
        (7, "hops [3, 2] is not a range"),
    ] {
        assert!(t.contains(says), "{says}:\n{t}");
        assert!(t.contains(&format!("d.yaml:{line}:")), "line {line}:\n{t}");
    }
    // A value of the wrong shape is told what the key is for.
    std::fs::write(dir.path().join("d.yaml"), "name: d\nstages:\n  tasks: {kind: synthesize, params: {tiers: [1]}}\n").unwrap();
    let t = text(&rao(&["validate", "d.yaml"], dir.path()));
    assert!(
        t.contains("invalid length 1") && t.contains("`tiers` is: Instead of bands: targets of these tiers, inclusive (`[1, 2]`"),
        "{t}"
    );
}

#[test]
fn plan_explains_what_changed_and_exec_runs_one_instance_alone() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.yaml");
    std::fs::write(
        &p,
        "name: p\nparams: {n: 3}\nstages:\n  a: {kind: shell, params: {command: 'seq ${params.n} > ${outputs.o}/f', deps: [script.sh]}, outputs: [o]}\n  b: {kind: shell, params: {command: 'wc -l < ${inputs.i}/f > ${outputs.o}/f'}, inputs: {i: a.o}, outputs: [o]}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("script.sh"), "v1").unwrap();
    // `rao exec` on b before a is done: refused, nothing written.
    let o = rao(&["exec", "p.yaml", "b"], dir.path());
    assert!(!o.status.success());
    assert!(text(&o).contains("inputs not done: a"), "{}", text(&o));
    // Each instance by itself, in separate processes, as a remote executor would.
    assert!(rao(&["exec", "p.yaml", "a"], dir.path()).status.success());
    assert!(rao(&["exec", "p.yaml", "b"], dir.path()).status.success());
    let plan = text(&rao(&["plan", "p.yaml"], dir.path()));
    assert!(plan.contains("cached    a") && plan.contains("cached    b"), "{plan}");
    let plan = text(&rao(&["plan", "p.yaml", "--set", "params.n=4"], dir.path()));
    assert!(plan.contains("params.command changed"), "{plan}");
    assert!(plan.contains("input i changed"), "{plan}");
    std::fs::write(dir.path().join("script.sh"), "v2").unwrap();
    let plan = text(&rao(&["plan", "p.yaml"], dir.path()));
    assert!(plan.contains("dependency `script.sh` changed"), "{plan}");
    let dot = text(&rao(&["plan", "p.yaml", "--format", "dot"], dir.path()));
    assert!(dot.starts_with("digraph") && dot.contains("a -> b"), "{dot}");
    // After a run under another seed, a change is explained against that run, and said to be.
    assert!(rao(&["run", "p.yaml", "--set", "seed=77"], dir.path()).status.success());
    let plan = text(&rao(&["plan", "p.yaml", "--set", "params.n=4"], dir.path()));
    assert!(plan.contains("compared with its last run, which had another seed; params.command changed"), "{plan}");
    assert!(!plan.contains("seed changed"), "{plan}");
}

#[test]
fn process_executor_gives_the_same_artifacts_as_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.yaml");
    std::fs::write(
        &p,
        "name: p\nseed: 5\nstages:\n  a: {kind: shell, params: {command: 'echo $RAO_SEED > ${outputs.o}/s'}, outputs: [o]}\n  b: {kind: shell, matrix: {k: [1, 2]}, params: {command: 'cat ${inputs.i}/s > ${outputs.o}/s; echo ${matrix.k} >> ${outputs.o}/s'}, inputs: {i: a.o}, outputs: [o]}\n",
    )
    .unwrap();
    let a = rao(&["run", "p.yaml", "--store", "s1", "--executor", "process", "--json"], dir.path());
    assert!(a.status.success(), "{}", text(&a));
    let b = rao(&["run", "p.yaml", "--store", "s2"], dir.path());
    assert!(b.status.success(), "{}", text(&b));
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&a.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events.last().unwrap()["event"], "run_finished");
    let files = |s: &str| {
        let mut v: Vec<(String, Vec<u8>)> = Vec::new();
        let root = dir.path().join(s).join("objects");
        let mut stack = vec![root.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(d).unwrap() {
                let e = e.unwrap().path();
                if e.is_dir() {
                    stack.push(e);
                } else if e.file_name().unwrap() != "MANIFEST.json" {
                    // objects/ff/FP/ATTEMPT/output/file: attempt ids are unique per store.
                    let rel = e.strip_prefix(&root).unwrap().display().to_string();
                    let parts: Vec<&str> = rel.split('/').collect();
                    let key = [parts[..2].join("/"), parts[3..].join("/")].join("/*/");
                    v.push((key, std::fs::read(&e).unwrap()));
                }
            }
        }
        v.sort();
        v
    };
    assert_eq!(files("s1"), files("s2"));
    assert_eq!(files("s1").len(), 3);
}

/// A credential given with `--set` reaches the stage that `rao exec` runs, but not that process's
/// command line (which every user of the machine can read).
#[cfg(target_os = "linux")]
#[test]
fn the_process_executor_keeps_a_set_credential_off_command_lines() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        "name: p\nparams: {api_token: none}\nstages:\n  \
         a: {kind: shell, params: {command: 'tr \"\\\\0\" \" \" < /proc/$PPID/cmdline > ${outputs.o}/cmdline; echo ${params.api_token} > ${outputs.o}/token'}, outputs: [o]}\n",
    )
    .unwrap();
    let o = rao(&["run", "p.yaml", "--executor", "process", "--set", "params.api_token=tok-on-the-command-line"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let out = std::fs::read_dir(dir.path().join(".rao/store/objects")).unwrap().flatten().flat_map(|shard| {
        std::fs::read_dir(shard.path()).unwrap().flatten().flat_map(|obj| std::fs::read_dir(obj.path()).unwrap().flatten())
    });
    let attempt = out.map(|e| e.path()).find(|p| p.join("o/cmdline").is_file()).expect("a's output");
    let cmdline = std::fs::read_to_string(attempt.join("o/cmdline")).unwrap();
    assert!(cmdline.contains(" exec ") && cmdline.contains("--run-id"), "the stage's parent is `rao exec`: {cmdline}");
    assert!(!cmdline.contains("tok-on-the-command-line"), "{cmdline}");
    assert_eq!(std::fs::read_to_string(attempt.join("o/token")).unwrap(), "tok-on-the-command-line\n");
}

/// `rao report FILE --set …` shows the evaluations of the file as given (found by fingerprint),
/// not whichever run wrote `latest` last; `--run latest` still shows the last run's record.
#[test]
fn report_follows_the_overrides_it_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let body = "name: windows\nseed: 1\nparams: {window: 96}\nstages:\n  \
        tasks: {kind: synthesize, params: {bands: [medium], per_band: 4, split: validation, world_seed: 1}}\n  \
        eval: {kind: evaluate, inputs: {tasks: tasks.tasks}, params: {policy: expert, label: expert, modes: [flat], limits: {window: \"${params.window}\", max_depth: 6, max_children: 4}}}\n";
    std::fs::write(dir.path().join("w.yaml"), body).unwrap();
    for w in ["96", "640"] {
        let o = rao(&["run", "w.yaml", "--set", &format!("params.window={w}")], dir.path());
        assert!(o.status.success(), "{}", text(&o));
    }
    // Flat Medium: the expert overflows a 96-token window and solves every task with 640.
    let success = |args: &[&str]| -> String {
        let o = rao(args, dir.path());
        assert!(o.status.success(), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let row = out.lines().find(|l| l.starts_with("expert ")).unwrap_or_else(|| panic!("no row:\n{}", text(&o)));
        row.split_whitespace().nth(4).unwrap().to_string()
    };
    assert_eq!(success(&["report", "w.yaml"]), "0.00");
    assert_eq!(success(&["report", "w.yaml", "--set", "params.window=640"]), "1.00");
    assert_eq!(success(&["report", "w.yaml", "--run", "latest"]), "1.00");
    // An override that never ran: no rows, and it says so.
    let o = rao(&["report", "w.yaml", "--set", "params.window=128"], dir.path());
    assert!(!String::from_utf8_lossy(&o.stdout).contains("expert "), "{}", text(&o));
    assert!(text(&o).contains("not in the store for this pipeline as given"), "{}", text(&o));
    assert!(!o.status.success() && text(&o).contains("nothing to report"), "{}", text(&o));
    // `--html -`: the page alone on stdout, the table on stderr.
    let o = rao(&["report", "w.yaml", "--html", "-"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("<!doctype html>"), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("expert "), "{}", text(&o));
    assert!(!dir.path().join("-").exists());
    // A seed in --set beside --seeds would be overridden without a word.
    let o = rao(&["compare", "w.yaml", "--set", "seed=2", "--seeds", "1"], dir.path());
    assert!(!o.status.success() && text(&o).contains("both set the seed"), "{}", text(&o));
}

/// The run a report names (and whose settings its page and trackers show) is one that ran the
/// file as given: not a run of other settings that shares an evaluation with it (here the
/// expert's at a fixed window, which does not depend on the changed param).
#[test]
fn report_names_only_a_run_of_the_settings_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let body = "name: windows\nseed: 1\nparams: {window: 96}\nstages:\n  \
        tasks: {kind: synthesize, params: {bands: [easy], per_band: 2, split: validation, world_seed: 1}}\n  \
        eval: {kind: evaluate, inputs: {tasks: tasks.tasks}, params: {policy: expert, label: at-window, modes: [flat], limits: {window: \"${params.window}\", max_depth: 6, max_children: 4}}}\n  \
        fixed: {kind: evaluate, inputs: {tasks: tasks.tasks}, params: {policy: expert, label: fixed, modes: [flat], limits: {window: 640, max_depth: 6, max_children: 4}}}\n";
    std::fs::write(dir.path().join("w.yaml"), body).unwrap();
    let run = rao(&["run", "w.yaml", "--json"], dir.path());
    assert!(run.status.success(), "{}", text(&run));
    let started: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&run.stdout).lines().next().unwrap()).unwrap();
    let run_id = started["run_id"].as_str().unwrap();
    let header = |args: &[&str]| -> String {
        let o = rao(args, dir.path());
        assert!(o.status.success(), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        out.lines().find(|l| l.starts_with("pipeline windows")).unwrap_or_else(|| panic!("no header:\n{out}")).to_string()
    };
    let own = header(&["report", "w.yaml"]);
    assert!(own.contains(&format!("run {run_id} (succeeded)")), "{own}");
    // Window 128 never ran: only the fixed evaluation is in the store for it.
    let other = header(&["report", "w.yaml", "--set", "params.window=128"]);
    assert!(other.contains("no run record names these results"), "{other}");
}

/// Runs are kept by pipeline name: `--run latest` of one file can be another file's run with the
/// same name, and the report says whose (its settings and file, not the file given).
#[test]
fn a_past_run_of_another_file_with_the_same_name_is_shown_as_that_files() {
    let dir = tempfile::tempdir().unwrap();
    for (file, window) in [("a.yaml", 96), ("b.yaml", 640)] {
        let body = format!(
            "name: shared\nseed: 1\nstages:\n  \
             tasks: {{kind: synthesize, params: {{bands: [medium], per_band: 2, split: validation, world_seed: 1}}}}\n  \
             eval: {{kind: evaluate, inputs: {{tasks: tasks.tasks}}, params: {{policy: expert, label: expert, modes: [flat], limits: {{window: {window}, max_depth: 6, max_children: 4}}}}}}\n"
        );
        std::fs::write(dir.path().join(file), body).unwrap();
    }
    for file in ["a.yaml", "b.yaml"] {
        let o = rao(&["run", file], dir.path());
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = rao(&["report", "a.yaml", "--run", "latest"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let header = out.lines().find(|l| l.starts_with("pipeline shared")).unwrap_or_else(|| panic!("no header:\n{out}"));
    assert!(header.ends_with(" · of b.yaml"), "{header}");
    // The file given, by fingerprint: its own results, no note.
    let o = rao(&["report", "a.yaml"], dir.path());
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(!out.contains(" · of "), "{out}");
}

/// A value the kind refuses, given by a variant's `set:`, is shown at the base file's use of it
/// (the line the value goes to) with the variant's line that gave it; given by `--set`, says so.
#[test]
fn a_refused_value_names_the_variant_line_or_the_set_that_gave_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("base.yaml"),
        "name: base\nstages:\n  tasks: {kind: synthesize, params: {bands: [easy], per_band: 2, world_seed: 1}}\n  \
         eval: {kind: evaluate, inputs: {tasks: tasks.tasks}, params: {policy: expert, modes: [flat]}}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("v.yaml"), "extends: base.yaml\nname: v\nset:\n  stages.eval.params.modes: [sideways]\n").unwrap();
    let o = rao(&["validate", "v.yaml"], dir.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("base.yaml:4:"), "{}", text(&o));
    assert!(text(&o).contains("(by v.yaml:4:3)"), "{}", text(&o));
    let o = rao(&["validate", "base.yaml", "--set", "stages.eval.params.modes=[sideways]"], dir.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("(by --set)"), "{}", text(&o));
}

#[test]
fn validate_refuses_an_empty_store_and_a_tracker_that_is_no_url_at_their_lines() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("t.yaml"),
        "name: t\nstore: ''\ntracking:\n  mlflow: ftp://x\nstages:\n  a: {kind: shell, params: {command: 'true'}, outputs: [o]}\n",
    )
    .unwrap();
    let o = rao(&["validate", "t.yaml"], dir.path());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("t.yaml:2:8") && text(&o).contains("the store path is empty"), "{}", text(&o));
    assert!(text(&o).contains("t.yaml:4:11") && text(&o).contains("is not an MLflow server URL"), "{}", text(&o));
}

#[test]
fn a_variant_in_another_folder_reads_its_bases_paths_as_the_base_does() {
    let dir = tempfile::tempdir().unwrap();
    for d in ["main", "variants"] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
    }
    std::fs::write(dir.path().join("main/data.txt"), "from the base's folder\n").unwrap();
    std::fs::write(
        dir.path().join("main/p.yaml"),
        "name: p\nparams: {n: 1}\nstages:\n  a: {kind: shell, params: {command: 'cat data.txt > ${outputs.o}/v; pwd >> ${outputs.o}/v', deps: [data.txt]}, outputs: [o]}\n  \
         b: {kind: shell, params: {command: 'seq ${params.n} > ${outputs.o}/v'}, outputs: [o]}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("variants/v.yaml"),
        "extends: ../main/p.yaml\nname: pv\nset:\n  params.n: 2\n  params.nothing_reads_this: 3\n",
    )
    .unwrap();
    let o = rao(&["run", "main/p.yaml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let o = rao(&["run", "variants/v.yaml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    // The base's store and deps: `a` (unchanged) is the base's result, only `b` runs again.
    assert!(text(&o).contains("cached   a"), "{}", text(&o));
    assert!(!dir.path().join("variants/.rao").exists(), "the variant made a store of its own");
    assert!(text(&o).contains("warning: `set:` of variants/v.yaml: params.nothing_reads_this: no stage reads"), "{}", text(&o));
    let o = rao(&["validate", "variants/v.yaml"], dir.path());
    assert!(o.status.success() && text(&o).contains("ok (2 stage instances, 0 loops)"), "{}", text(&o));
    assert!(text(&o).contains("params.nothing_reads_this"), "{}", text(&o));
}

#[test]
fn shell_commands_get_store_paths_with_spaces_and_quotes_whole() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("my runs");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(
        folder.join("p.yaml"),
        "name: p\nstages:\n  a: {kind: shell, params: {command: 'seq 3 > ${outputs.o}/f'}, outputs: [o]}\n  \
         b: {kind: shell, params: {command: 'wc -l < ${inputs.i}/f | tr -d \" \" > \"${outputs.o}/n\"'}, inputs: {i: a.o}, outputs: [o]}\n  \
         c: {kind: shell, params: {command: 'cat \"${inputs.n}/n\" ${inputs.f}/f > result.txt'}, inputs: {n: b.o, f: a.o}, outputs: [o]}\n",
    )
    .unwrap();
    let o = rao(&["run", "my runs/p.yaml", "--store", "it's a store"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(folder.join("result.txt")).unwrap(), "3\n1\n2\n3\n");
    assert!(dir.path().join("it's a store/objects").is_dir());
}

#[test]
fn an_empty_store_path_is_refused_and_a_tilde_is_the_home_folder() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        "name: p\nstages:\n  a: {kind: shell, params: {command: 'echo 1 > ${outputs.o}/v'}, outputs: [o]}\n",
    )
    .unwrap();
    let run =
        |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_rao")).args(args).env("HOME", &home).current_dir(dir.path()).output().unwrap();
    let o = run(&["run", "p.yaml", "--store", ""]);
    assert!(!o.status.success() && text(&o).contains("the store path is empty"), "{}", text(&o));
    assert!(!dir.path().join("objects").exists(), "the current folder became a store");
    let o = run(&["run", "p.yaml", "--store", "~/rao-store"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(home.join("rao-store/objects").is_dir(), "`~/` is the home folder");
    assert!(!dir.path().join("~").exists(), "a folder named `~` was made");
    std::fs::write(dir.path().join("q.yaml"), "name: q\nstore: ''\nstages:\n  a: {kind: shell, params: {command: 'true'}, outputs: [o]}\n")
        .unwrap();
    let o = run(&["run", "q.yaml"]);
    assert!(!o.status.success() && text(&o).contains("the store path is empty"), "{}", text(&o));
}

#[test]
fn checked_in_schema_matches_the_binary() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let o = rao(&["schema"], &root);
    let have = std::fs::read_to_string(root.join("schemas/pipeline.schema.json")).unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout) == have,
        "schemas/pipeline.schema.json is out of date: regenerate it with `cargo run -- schema > schemas/pipeline.schema.json`"
    );
}

/// `rao kinds` lists every kind, shows one in full (its parameters with types, defaults and
/// descriptions, nested ones too), refuses an unknown one with a suggestion, and docs/KINDS.md is
/// its Markdown, current.
#[test]
fn kinds_are_listed_and_described_and_the_reference_page_is_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let all = text(&rao(&["kinds"], &root));
    for kind in ["rollout", "update", "warmstart", "hf_model", "shell", "dataset"] {
        assert!(all.lines().any(|l| l.starts_with(kind)), "{kind} missing:\n{all}");
    }
    let o = rao(&["kinds", "rollout"], &root);
    let rollout = text(&o);
    assert!(o.status.success(), "{rollout}");
    assert!(rollout.contains("inputs:  tasks, checkpoint (optional), base (optional)"), "{rollout}");
    assert!(rollout.contains("  group_size: integer = 4\n      Trees per task (G)."), "{rollout}");
    assert!(rollout.contains("  engine.launch: EngineLaunch"), "{rollout}");
    let o = rao(&["kinds", "rolout"], &root);
    assert!(!o.status.success() && text(&o).contains("no stage kind `rolout`: did you mean `rollout`?"), "{}", text(&o));
    let o = rao(&["kinds", "--markdown"], &root);
    let have = std::fs::read_to_string(root.join("docs/KINDS.md")).unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout) == have,
        "docs/KINDS.md is out of date: regenerate it with `cargo run -- kinds --markdown > docs/KINDS.md`"
    );
}

/// A pipeline without evaluations (the shell example) is reported by its stages — instances,
/// time, outputs — under the run that produced them; before any run there is nothing to report.
#[test]
fn a_pipeline_without_evaluations_is_reported_by_its_stages_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/shell/pipeline.yaml");
    std::fs::copy(example, dir.path().join("p.yaml")).unwrap();
    let o = rao(&["report", "p.yaml"], dir.path());
    assert!(!o.status.success() && text(&o).contains("`rao run p.yaml` makes it"), "{}", text(&o));
    // A store that holds another pipeline's run only: still nothing to report for this one.
    let other =
        "name: other\nstages:\n  hello:\n    kind: shell\n    params: {command: 'echo hi > ${outputs.out}/hi.txt'}\n    outputs: [out]\n";
    std::fs::write(dir.path().join("other.yaml"), other).unwrap();
    assert!(rao(&["run", "other.yaml"], dir.path()).status.success());
    let o = rao(&["report", "p.yaml"], dir.path());
    assert!(!o.status.success() && text(&o).contains("nothing to report: no run and no result"), "{}", text(&o));
    for _ in 0..3 {
        let o = rao(&["run", "p.yaml"], dir.path());
        assert!(o.status.success(), "{}", text(&o));
    }
    let first_run = {
        let o = rao(&["report", "p.yaml", "--run", "latest"], dir.path());
        assert!(o.status.success(), "{}", text(&o));
        text(&o)
    };
    let o = rao(&["report", "p.yaml"], dir.path());
    let report = text(&o);
    assert!(o.status.success(), "{report}");
    assert!(!report.contains("no run record names these results"), "{report}");
    assert!(report.contains("pipeline shell-example · seed 7 · run "), "{report}");
    let generate = report.lines().find(|l| l.starts_with("generate ")).unwrap_or_else(|| panic!("{report}"));
    assert!(generate.contains(" shell ") && generate.ends_with("numbers"), "{generate}");
    assert!(report.lines().any(|l| l.starts_with("count ") && l.contains(" 2 ") && l.ends_with("total")), "{report}");
    assert!(first_run.lines().any(|l| l.starts_with("generate ")), "{first_run}");
    let page = report.lines().last().unwrap().strip_prefix("report: ").unwrap().to_string();
    assert!(!page.ends_with("empty.html"), "{page}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("<h2 id='stages'>Stages</h2>") && html.contains("numbers (") && !html.contains("Held-out"), "{page}");
}

/// Every pipeline, variant and example the repository ships.
fn shipped_pipeline_files(root: &Path) -> Vec<std::path::PathBuf> {
    let mut files = vec![root.join("examples/shell/pipeline.yaml")];
    for e in std::fs::read_dir(root.join("pipelines")).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "yaml") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The folded graph of every shipped pipeline draws exactly what its stages read: an edge A → B
/// for each input of a B instance that an A instance's output feeds (a loop's result: the stage
/// its variable is carried from), and nothing else — e.g. `evaluate`, which reads `train.policy`
/// and `eval_tasks`, gets no edge from the loop's rollouts, though it waits for them.
#[test]
fn folded_graphs_draw_exactly_what_each_stage_reads() {
    use rao_plan::compile::Source;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let registry = rao_stages::registry();
    let mut checked = 0;
    for f in shipped_pipeline_files(&root) {
        let c = rao_pipeline::load(&f, &[], &registry).unwrap_or_else(|e| panic!("{}: {e:?}", f.display()));
        let stage = |i: usize| c.instances[i].stage.clone();
        let mut want = std::collections::BTreeSet::new();
        for (i, inst) in c.instances.iter().enumerate() {
            for source in inst.inputs.iter().flat_map(|(_, sources)| sources) {
                let from = match source {
                    Source::Output { instance, .. } => stage(*instance),
                    Source::LoopExit { loop_idx, var } => c.loops[*loop_idx].carry[var].0.clone(),
                };
                if from != inst.stage {
                    want.insert((from, stage(i)));
                }
            }
        }
        let o = rao(&["plan", f.to_str().unwrap(), "--format", "mermaid", "--folded"], &root);
        assert!(o.status.success(), "{}: {}", f.display(), text(&o));
        let mermaid = String::from_utf8_lossy(&o.stdout).to_string();
        // Node ids are `s_` and the stage name with `_` doubled and other bytes hex-escaped.
        let name_of = |id: &str| {
            let line = mermaid.lines().find(|l| l.trim_start().starts_with(&format!("{id}[\""))).unwrap();
            line.split("[\"").nth(1).unwrap().split("<br/>").next().unwrap().to_string()
        };
        let drawn: std::collections::BTreeSet<(String, String)> =
            mermaid.lines().filter_map(|l| l.trim().split_once(" --> ")).map(|(a, b)| (name_of(a), name_of(b))).collect();
        assert_eq!(drawn, want, "{}: the folded graph's edges\n{mermaid}", f.display());
        checked += 1;
    }
    assert!(checked >= 12, "{checked} files");
    // The case a user saw drawn wrong.
    let o = rao(&["plan", "pipelines/multihop.yaml", "--format", "mermaid", "--folded"], &root);
    let mut into_evaluate: Vec<&str> = std::str::from_utf8(&o.stdout).unwrap().lines().filter(|l| l.ends_with("--> s_evaluate")).collect();
    into_evaluate.sort();
    assert_eq!(into_evaluate, ["  s_eval__tasks --> s_evaluate", "  s_update --> s_evaluate"], "{into_evaluate:?}");
}

#[test]
fn shipped_pipelines_validate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for f in shipped_pipeline_files(&root) {
        let o = rao(&["validate", f.to_str().unwrap()], &root);
        assert!(o.status.success(), "{}: {}", f.display(), text(&o));
    }
}

/// The schema editors are pointed at, checked by a real JSON Schema validator (the `jsonschema`
/// package, installed by scripts/test): every shipped file passes, and copies broken in known
/// places (a wrong type, an unknown param or kind, a typo in a nested param; for variants a
/// wrong `extends`, a `set` path that is no override, `stages` in a variant) fail right there.
#[test]
fn shipped_pipelines_match_the_json_schema_and_broken_copies_fail_where_broken() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into());
    let files = shipped_pipeline_files(&root);
    let o = Command::new(&python)
        .arg(root.join("scripts/check_schema.py"))
        .arg(root.join("schemas/pipeline.schema.json"))
        .args(&files)
        .output()
        .expect("python runs");
    assert!(
        o.status.success(),
        "check_schema.py failed (scripts/test installs jsonschema; set RAO_PYTHON to that interpreter):\n{}",
        text(&o)
    );
    let results: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(results.len(), files.len());
    let (mut variants, mut pipelines) = (0, 0);
    for r in &results {
        assert_eq!(r["errors"], serde_json::json!([]), "{} does not match the schema: {r}", r["file"]);
        let broken = r["broken"].as_array().unwrap();
        assert!(broken.len() >= 3, "{r}");
        for b in broken {
            assert_eq!(b["path"], b["expect"], "{}, {}: the validator's error is not where the file was broken: {b}", r["file"], b["what"]);
        }
        if broken.iter().any(|b| b["what"] == "extends is a number") { variants += 1 } else { pipelines += 1 }
    }
    assert!(variants >= 8 && pipelines >= 4, "{variants} variants, {pipelines} pipelines");
}

/// The main job's plan without a store: totals, a folded status, folded JSON, and a dot graph
/// with the loop as one cluster that Graphviz lays out at once (not 1,000 instance nodes).
/// What the compiler refuses for its shape alone — names, a stage that is neither a kind nor a
/// loop, empty or out-of-range counts, durations — the schema refuses too, so an editor flags it
/// where it is typed (files of the bad-pipelines corpus, each rejected by `rao validate`).
#[test]
fn the_json_schema_refuses_what_the_compiler_refuses_for_its_shape() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into());
    let shapes = [
        "stage-no-kind",
        "stage-no-kind-in-loop",
        "stage-kind-and-loop",
        "stage-stages-without-loop",
        "loop-with-params",
        "loop-no-stages",
        "loop-zero-iterations",
        "loop-every-zero",
        "top-stages-empty",
        "top-name-empty",
        "top-name-dots",
        "top-name-slash",
        "top-name-huge",
        "top-seed-too-big",
        "stage-name-slash",
        "stage-name-long",
        "output-bad-name",
        "output-name-long",
        "output-twice",
        "matrix-key-invalid",
        "matrix-empty",
        "stage-retries-huge",
        "stage-timeout-zero",
        "stage-timeout-negative",
        "stage-timeout-unit",
    ];
    let files: Vec<std::path::PathBuf> = shapes.iter().map(|f| root.join(format!("tests/bad-pipelines/{f}.yaml"))).collect();
    let o = Command::new(&python)
        .arg(root.join("scripts/check_schema.py"))
        .arg("--as-is")
        .arg(root.join("schemas/pipeline.schema.json"))
        .args(&files)
        .output()
        .expect("python runs");
    assert!(o.status.success(), "check_schema.py failed (scripts/test installs jsonschema):\n{}", text(&o));
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_ne!(r["errors"], serde_json::json!([]), "the schema accepts {}", r["file"]);
    }
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), shapes.len());
    // Keys that are there but empty or null are not there, for the schema as for the compiler.
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.yaml");
    std::fs::write(
        &empty,
        "name: p\nstages:\n  a: {kind: noop, stages: {}, loop: null}\n  \
         l: {loop: {max_iterations: 2}, params: {}, inputs: {}, outputs: [], matrix: {}, every: null, stages: {b: {kind: noop}}}\n",
    )
    .unwrap();
    assert!(rao(&["validate", empty.to_str().unwrap()], dir.path()).status.success());
    let o = Command::new(&python)
        .arg(root.join("scripts/check_schema.py"))
        .args(["--as-is".as_ref(), root.join("schemas/pipeline.schema.json").as_os_str(), empty.as_os_str()])
        .output()
        .expect("python runs");
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    assert_eq!(r["errors"], serde_json::json!([]), "{r}");
}

#[test]
fn plan_and_status_fold_loops_and_count() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let store = tempfile::tempdir().unwrap();
    let p = root.join("pipelines/textcraft-synth.yaml");
    let run = |args: &[&str]| -> String {
        let mut all = args.to_vec();
        all.extend([p.to_str().unwrap(), "--store", store.path().to_str().unwrap()]);
        let o = rao(&all, &root);
        assert!(o.status.success(), "{all:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let plan = run(&["plan"]);
    assert!(plan.ends_with("317 instances: 0 cached, 317 to run (317 missing)\n"), "{plan}");
    let status = run(&["status", "--folded"]);
    assert_eq!(status.lines().count(), 18, "one line per stage entry and the totals: {status}");
    assert!(status.contains("missing  rollout                      ×60   0 done, 60 to run (60 missing)"), "{status}");
    let folded: serde_json::Value = serde_json::from_str(&run(&["plan", "--format", "json", "--folded"])).unwrap();
    let rollout = folded.as_array().unwrap().iter().find(|g| g["name"] == "rollout").unwrap();
    assert_eq!((rollout["loop"].as_str(), rollout["instances"].as_u64(), rollout["missing"].as_u64()), (Some("train"), Some(60), Some(60)));
    let dot = run(&["plan", "--format", "dot"]);
    assert!(dot.lines().count() < 60, "{dot}");
    assert!(
        dot.contains("subgraph cluster_train") && dot.contains("rollout ×60 · will run") && dot.contains("fillcolor=\"#ffd8a8\""),
        "{dot}"
    );
    let mermaid = run(&["plan", "--format", "mermaid"]);
    assert!(mermaid.contains("subgraph loop_train") && mermaid.contains(":::run"), "{mermaid}");
}

/// `a.yaml` (`NAME`: the scripted expert evaluated on 8 Medium tasks, recursive and flat, at a
/// 96-token window) and its variant `b.yaml` (`NAME-wide`: a 640-token window, where flat fits).
fn window_variants(dir: &Path, name: &str) {
    let base = format!(
        "name: {name}\nseed: 1\nparams: {{window: 96}}\nstages:\n  \
        tasks: {{kind: synthesize, params: {{bands: [medium], per_band: 8, split: validation, world_seed: 1}}}}\n  \
        eval: {{kind: evaluate, inputs: {{tasks: tasks.tasks}}, params: {{policy: expert, label: expert, modes: [recursive, flat], limits: {{window: \"${{params.window}}\", max_depth: 6, max_children: 4}}}}}}\n"
    );
    std::fs::write(dir.join("a.yaml"), base).unwrap();
    std::fs::write(dir.join("b.yaml"), format!("extends: a.yaml\nname: {name}-wide\nset:\n  params.window: 640\n")).unwrap();
}

/// `rao compare` reads the store: parameters that differ, every metric per pipeline with
/// intervals and a significance mark, in markdown, CSV and JSON; what is missing is named with
/// the command that produces it, and nothing runs.
#[test]
fn compare_puts_variants_and_seeds_side_by_side_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    window_variants(dir.path(), "cmp");
    for (file, seed) in [("a.yaml", "1"), ("a.yaml", "2"), ("b.yaml", "1")] {
        let o = rao(&["run", file, "--set", &format!("seed={seed}")], dir.path());
        assert!(o.status.success(), "{}", text(&o));
    }
    let objects = || std::fs::read_dir(dir.path().join(".rao/store/objects")).unwrap().count();
    let before = objects();
    let md = rao(&["compare", "a.yaml", "b.yaml", "--seeds", "1,2"], dir.path());
    assert!(md.status.success(), "{}", text(&md));
    let out = String::from_utf8_lossy(&md.stdout).to_string();
    assert!(out.contains("| `params.window` | 96 | 640 |"), "{out}");
    assert!(out.contains("| `name` | cmp | cmp-wide |"), "{out}");
    // Flat Medium: the expert overflows 96 tokens (0 of 8, in both seeds) and fits in 640 (8 of 8).
    let flat = out.lines().find(|l| l.starts_with("| eval (expert) | flat | medium |")).unwrap_or_else(|| panic!("{out}"));
    // b has seed 1 only: its cells say so, and so does its row of the header.
    assert!(flat.contains("| 0.00 [0.00, 0.00] | 1.00 [0.68, 1.00] ** (seed 1) |"), "{flat}");
    assert!(out.contains("| B | cmp-wide | `b.yaml` | 1, 2 (not all in the store) |"), "{out}");
    let rec = out.lines().find(|l| l.starts_with("| eval (expert) | recursive | medium |")).unwrap();
    assert!(!rec.contains('*'), "the recursive expert solves all in both: {rec}");
    assert!(out.contains("B (cmp-wide) seed 2 (eval): `rao run b.yaml --set seed=2`"), "{out}");
    // Bands as columns: a row per pipeline, evaluation and mode, the same cells.
    let by_band = rao(&["compare", "a.yaml", "b.yaml", "--seeds", "1,2", "--metric", "success", "--columns", "bands"], dir.path());
    let by_band = String::from_utf8_lossy(&by_band.stdout).to_string();
    assert!(by_band.contains("| | evaluation | mode | medium |\n|---|---|---|---|\n"), "{by_band}");
    assert!(by_band.contains("| A | eval (expert) | flat | 0.00 [0.00, 0.00] |\n"), "{by_band}");
    assert!(by_band.contains("| B | eval (expert) | flat | 1.00 [0.68, 1.00] ** (seed 1) |\n"), "{by_band}");
    assert_eq!(by_band.lines().filter(|l| l.starts_with("| A | eval") || l.starts_with("| B | eval")).count(), 4, "{by_band}");
    // Brief: the metric tables alone (the document says what A and B are); what is missing is still named.
    let brief = rao(&["compare", "a.yaml", "b.yaml", "--seeds", "1,2", "--metric", "success", "--columns", "bands", "--brief"], dir.path());
    let brief = String::from_utf8_lossy(&brief.stdout).to_string();
    assert!(brief.starts_with("**success**\n\n| | evaluation | mode | medium |\n"), "{brief}");
    assert!(brief.contains("| B | eval (expert) | flat | 1.00 [0.68, 1.00] ** (seed 1) |\n"), "{brief}");
    assert!(!brief.contains("Parameters that differ") && !brief.contains("Brackets:"), "{brief}");
    assert!(brief.contains("B (cmp-wide) seed 2 (eval): `rao run b.yaml --set seed=2`"), "{brief}");
    let nope = rao(&["compare", "a.yaml", "--evaluation", "eval,nope"], dir.path());
    assert!(
        !nope.status.success() && text(&nope).contains("--evaluation nope: a.yaml has no evaluation of that name; its evaluations: eval"),
        "{}",
        text(&nope)
    );
    let csv_bands = rao(&["compare", "a.yaml", "--columns", "bands", "--format", "csv"], dir.path());
    assert!(
        !csv_bands.status.success() && text(&csv_bands).contains("--columns and --brief lay out the Markdown table"),
        "{}",
        text(&csv_bands)
    );
    assert_eq!(objects(), before, "compare runs nothing");
    // A variant that keeps its base's `name:` and lacks seed 2: only its own row says so.
    std::fs::write(dir.path().join("c.yaml"), "extends: a.yaml\nname: cmp\nset:\n  params.window: 128\n").unwrap();
    assert!(rao(&["run", "c.yaml"], dir.path()).status.success());
    let same = String::from_utf8_lossy(&rao(&["compare", "a.yaml", "c.yaml", "--seeds", "1,2"], dir.path()).stdout).to_string();
    assert!(
        same.contains("| A | cmp | `a.yaml` | 1, 2 |") && same.contains("| B | cmp | `c.yaml` | 1, 2 (not all in the store) |"),
        "{same}"
    );

    let csv = rao(&["compare", "a.yaml", "b.yaml", "--seeds", "1,2", "--format", "csv", "--metric", "success"], dir.path());
    assert!(String::from_utf8_lossy(&csv.stderr).contains("missing: cmp-wide (file b.yaml) seed 2"), "{}", text(&csv));
    let csv = String::from_utf8_lossy(&csv.stdout).to_string();
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("pipeline,file,evaluation,label,mode,band,metric,seeds,value,ci_low,ci_high,p_vs_first"), "{csv}");
    assert_eq!(lines.len(), 1 + 4, "2 modes × 2 pipelines: {csv}");
    let b_flat = lines.iter().find(|l| l.starts_with("cmp-wide,") && l.contains(",flat,")).unwrap();
    assert!(b_flat.contains(",success,1,1,") && b_flat.ends_with(",fisher,**"), "{b_flat}");

    let json = rao(&["compare", "a.yaml", "b.yaml", "--seeds", "1,2", "--format", "json"], dir.path());
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["pipelines"][0][2], serde_json::json!([1, 2]));
    assert_eq!(v["missing"][0]["command"], "rao run b.yaml --set seed=2");
    let cell = v["cells"].as_array().unwrap().iter().find(|c| c["arm"] == 0 && c["mode"] == "flat" && c["metric"] == "success").unwrap();
    assert_eq!(cell["seeds"], serde_json::json!([1, 2]));
    // One run counted twice would narrow the interval and invent significance.
    let twice = rao(&["compare", "a.yaml", "b.yaml", "--seeds", "1,2,1"], dir.path());
    assert!(!twice.status.success() && text(&twice).contains("seed 1 is given twice"), "{}", text(&twice));
    let bad = rao(&["compare", "a.yaml", "--metric", "sucess"], dir.path());
    assert!(!bad.status.success() && text(&bad).contains("unknown metric `sucess`"), "{}", text(&bad));

    // One file against itself under another setting (`B:` sets the second only), seed by seed.
    let o = rao(&["run", "a.yaml", "--set", "params.window=640"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let own = |extra: &[&str]| {
        let args =
            [&["compare", "a.yaml", "a.yaml", "--set", "B:params.window=640", "--metric", "success", "--columns", "seeds"], extra].concat();
        rao(&args, dir.path())
    };
    let o = own(&["--seeds", "1,2"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("| `params.window` | 96 | 640 |"), "{out}");
    assert!(out.contains("| | evaluation | mode | band | seed 1 | seed 2 | mean |\n|---|---|---|---|---|---|---|\n"), "{out}");
    assert!(out.contains("| A | eval (expert) | flat | medium | 0.00 | 0.00 | 0.00 [0.00, 0.00] |\n"), "{out}");
    // B's seed 2 was never run at 640 tokens: its column says so, and so does the command to run.
    assert!(out.contains("| B | eval (expert) | flat | medium | 1.00 | — | 1.00 [0.68, 1.00] ** (seed 1) |\n"), "{out}");
    assert!(out.contains("`rao run a.yaml --set params.window=640 --set seed=2`"), "{out}");
    let o = own(&["--set", "C:params.window=128"]);
    assert!(!o.status.success() && text(&o).contains("--set C:params.window=128: no pipeline C: 2 are compared (A to B"), "{}", text(&o));
    let o = own(&["--set", "B:"]);
    assert!(!o.status.success() && text(&o).contains("--set B:: after `B:` give PATH=VALUE"), "{}", text(&o));
    let o = own(&["--set", "B:seed=3", "--seeds", "1"]);
    assert!(!o.status.success() && text(&o).contains("`--set seed=3` and `--seeds` both set the seed"), "{}", text(&o));
}

/// `rao compare --columns iterations` lays out an evaluation inside a loop as learning curves (a
/// row per seed and their mean, a column per iteration), each cell the very value `--format json`
/// gives for that instance; a point a seed lacks is `—` and named with its command; by default
/// compare leaves loop evaluations out, and a once-run one cannot be a curve. `--training` adds
/// a loop stage's recorded metric as a curve.
#[test]
fn compare_lays_out_learning_curves_by_iteration() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("c.yaml"),
        "name: curve\nseed: 1\nparams: {limits: {window: 160, max_depth: 6, max_children: 4}}\nstages:\n  \
         once_tasks: {kind: synthesize, params: {bands: [medium], per_band: 4, split: validation, world_seed: 1}}\n  \
         once: {kind: evaluate, inputs: {tasks: once_tasks.tasks}, params: {policy: expert, label: expert, modes: [recursive], limits: \"${params.limits}\"}}\n  \
         train:\n    loop: {max_iterations: 4}\n    stages:\n      \
         tasks: {kind: synthesize, params: {bands: [medium], per_band: 8, split: validation, world_seed: 1}}\n      \
         heldout: {kind: evaluate, every: 2, inputs: {tasks: tasks.tasks}, params: {policy: expert, label: expert, modes: [recursive], limits: \"${params.limits}\"}}\n",
    )
    .unwrap();
    for extra in [&["--set", "seed=1"][..], &["--set", "seed=2"], &["--set", "seed=3", "--set", "stages.train.loop.max_iterations=2"]] {
        let o = rao(&[&["run", "c.yaml"], extra].concat(), dir.path());
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = rao(&["compare", "c.yaml", "--seeds", "1,2,3", "--metric", "mean_nodes", "--columns", "iterations"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    let md = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(md.contains("| | evaluation | mode | band | seed | 2 | 4 |\n"), "{md}");
    assert!(!md.contains("| once"), "a once-run evaluation is no curve: {md}");
    let json = rao(
        &["compare", "c.yaml", "--seeds", "1,2,3", "--metric", "mean_nodes", "--evaluation", "heldout", "--format", "json"],
        dir.path(),
    );
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&json)));
    let at = |iteration: u64| {
        let cells = v["cells"].as_array().unwrap();
        cells.iter().find(|c| c["evaluation"] == "heldout" && c["iteration"] == iteration).unwrap_or_else(|| panic!("{v}")).clone()
    };
    let value = |iteration: u64, seed: u64| -> Option<f64> {
        let c = at(iteration);
        let k = c["seeds"].as_array().unwrap().iter().position(|s| *s == seed)?;
        c["per_seed"][k].as_f64()
    };
    let cell = |x: Option<f64>| x.map(|x| format!("{x:.1}")).unwrap_or_else(|| "—".into());
    for seed in [1, 2, 3] {
        let row =
            format!("| A | heldout (expert) | recursive | medium | seed {seed} | {} | {} |\n", cell(value(2, seed)), cell(value(4, seed)));
        assert!(md.contains(&row), "{row} in {md}");
    }
    assert_eq!(value(4, 3), None, "seed 3 stopped at iteration 2");
    let mean = |iteration: u64| at(iteration)["value"].as_f64().unwrap();
    assert!(md.contains(&format!("| mean | {:.1} | {:.1} (seeds 1, 2) |\n", mean(2), mean(4))), "{md}");
    let values: Vec<f64> = [(2, 1), (2, 2), (4, 1), (4, 2)].iter().filter_map(|&(i, s)| value(i, s)).collect();
    assert!(values.iter().any(|x| *x != values[0]), "tree sizes differ between draws, so a column mix-up shows: {values:?}");
    assert!(md.contains("seed 3 (heldout@4): `rao run c.yaml --set seed=3`"), "{md}");
    // By default compare shows what ran once; a loop evaluation is named as such.
    let o = rao(&["compare", "c.yaml", "--seeds", "1,2", "--metric", "success"], dir.path());
    let plain = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(plain.contains("| once (expert) | recursive | medium |") && !plain.contains("heldout"), "{plain}");
    let o = rao(&["compare", "c.yaml", "--evaluation", "nope"], dir.path());
    assert!(text(&o).contains("its evaluations: heldout (in a loop), once"), "{}", text(&o));
    let o = rao(&["compare", "c.yaml", "--columns", "iterations", "--evaluation", "once"], dir.path());
    assert!(!o.status.success() && text(&o).contains("`once` of c.yaml runs once, not in a loop"), "{}", text(&o));

    // Training curves: a loop stage's metric from its manifests, a column every iteration.
    let curves = |extra: &[&str]| {
        let args = [&["compare", "c.yaml", "--seeds", "1,2,3", "--metric", "success", "--columns", "iterations"], extra].concat();
        rao(&args, dir.path())
    };
    let o = curves(&["--every", "1", "--training", "tasks.tasks,heldout.recursive_medium_success"]);
    assert!(o.status.success(), "{}", text(&o));
    let md = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(md.contains("| | metric | seed | 1 | 2 | 3 | 4 |\n"), "{md}");
    assert!(md.contains("| A | tasks.tasks | seed 3 | 8.00 | 8.00 | — | — |\n"), "8 tasks drawn each iteration: {md}");
    assert!(md.contains("| A | tasks.tasks | mean | 8.00 | 8.00 | 8.00 (2 of 3 seeds) | 8.00 (2 of 3 seeds) |\n"), "{md}");
    assert!(md.contains("| A | heldout.recursive_medium_success | seed 1 | — | 1.00 | — | 1.00 |\n"), "{md}");
    let o = curves(&["--training", "heldout.nope"]);
    assert!(text(&o).contains("`heldout` records no metric `nope`; it records recursive_medium_success"), "{}", text(&o));
    let o = curves(&["--training", "once.x"]);
    assert!(text(&o).contains("`once` records no metric `x`"), "{}", text(&o));
    let o = rao(&["compare", "c.yaml", "--training", "tasks.tasks"], dir.path());
    assert!(!o.status.success() && text(&o).contains("runs in a loop of c.yaml, a curve: give --columns iterations"), "{}", text(&o));

    // What stages run once recorded: a value a seed, beside the other layouts' tables.
    let o = rao(
        &[
            "compare",
            "c.yaml",
            "--seeds",
            "1,2,3",
            "--metric",
            "success",
            "--columns",
            "seeds",
            "--training",
            "once_tasks.tasks,once.recursive_medium_success",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let md = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(md.contains("| | metric | seed 1 | seed 2 | seed 3 | mean |\n"), "{md}");
    assert!(md.contains("| A | once_tasks.tasks | 4 | 4 | 4 | 4 |\n"), "4 tasks synthesised: {md}");
    let once =
        rao(&["compare", "c.yaml", "--seeds", "1,2,3", "--metric", "success", "--evaluation", "once", "--format", "json"], dir.path());
    let j: serde_json::Value = serde_json::from_slice(&once.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&once)));
    let cell = j["cells"].as_array().unwrap().iter().find(|c| c["evaluation"] == "once").unwrap_or_else(|| panic!("{j}")).clone();
    let mut want: Vec<f64> = cell["per_seed"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    want.push(cell["value"].as_f64().unwrap());
    let row = md.lines().find(|l| l.starts_with("| A | once.recursive_medium_success |")).unwrap_or_else(|| panic!("{md}"));
    let shown: Vec<f64> = row.split('|').skip(3).filter(|c| !c.trim().is_empty()).map(|c| c.trim().parse().unwrap()).collect();
    assert_eq!(shown.len(), want.len(), "{row}");
    assert!(
        shown.iter().zip(&want).all(|(a, b)| (a - b).abs() < 5e-4),
        "the evaluation's own metric equals its success cell: {row} against {want:?}"
    );
    let o = curves(&["--training", "once_tasks.tasks"]);
    assert!(!o.status.success() && text(&o).contains("its stage runs once in c.yaml, not in a loop"), "{}", text(&o));
    let o = curves(&["--training", "nope.x"]);
    assert!(text(&o).contains("has no stage `nope`; its stages: heldout, once, once_tasks, tasks"), "{}", text(&o));
}

/// `rao results` rewrites a document's `<!-- rao compare … -->` blocks from the store: it leaves a
/// block whose runs are missing as it is (and says which), `--run` runs them first, text outside
/// the blocks is kept byte for byte, `--check` fails on a table edited by hand, and a broken
/// block is an error at its line that changes nothing.
#[test]
fn results_regenerates_the_tables_of_a_document_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    window_variants(dir.path(), "res");
    std::fs::create_dir(dir.path().join("docs")).unwrap();
    let doc = dir.path().join("docs/results.md");
    let original = "# Results\n\nThe window, measured:\n\n<!-- rao compare ../a.yaml ../b.yaml --seeds 1,2 --metric success -->\n\
        | typed | by hand |\n<!-- end rao compare -->\n\nWhat it shows.\n";
    std::fs::write(&doc, original).unwrap();
    let results = |args: &[&str]| rao(&[&["results", "docs/results.md"], args].concat(), dir.path());

    // Nothing in the store: the block stays, the four runs are named, and the exit says so.
    let o = results(&[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("docs/results.md:5: left as it is: 4 runs are not in the store"), "{}", text(&o));
    assert!(text(&o).contains("rao run docs/../b.yaml --set seed=2"), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(&doc).unwrap(), original);

    let o = results(&["--run"]);
    assert!(o.status.success(), "{}", text(&o));
    let written = std::fs::read_to_string(&doc).unwrap();
    let table = String::from_utf8_lossy(&rao(&["compare", "a.yaml", "b.yaml", "--seeds", "1,2", "--metric", "success"], dir.path()).stdout)
        .replace("`a.yaml`", "`../a.yaml`")
        .replace("`b.yaml`", "`../b.yaml`");
    let expected = original.replace("| typed | by hand |\n", &format!("\n{table}\n"));
    assert_eq!(written, expected, "the block holds compare's table, everything else as it was");
    assert!(written.contains("| eval (expert) | flat | medium | 0.00 [0.00, 0.00] | 1.00"), "{written}");

    // Current: --check passes and a second rewrite changes nothing.
    assert!(results(&["--check"]).status.success());
    let o = results(&[]);
    assert!(o.status.success() && text(&o).contains("1 block, 0 rewritten"), "{}", text(&o));
    // A number edited by hand is found; --check writes nothing.
    let edited = written.replace("| flat | medium | 0.00 [0.00, 0.00] |", "| flat | medium | 0.01 [0.00, 0.00] |");
    std::fs::write(&doc, &edited).unwrap();
    let o = results(&["--check"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("docs/results.md:5: the table differs from what the store gives"), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(&doc).unwrap(), edited);
    assert!(results(&[]).status.success());
    assert_eq!(std::fs::read_to_string(&doc).unwrap(), written);

    // Broken blocks: located, nothing written.
    for (bad, says) in [
        (written.replace("<!-- end rao compare -->\n", ""), "docs/results.md:5: this block is never closed"),
        (written.replace("--metric success", "--metric sucess"), "docs/results.md:5: unknown metric `sucess`"),
        (written.replace("--seeds 1,2", "--seeds 1,2 --format csv"), "docs/results.md:5: `rao compare"),
        (written.replace("../b.yaml", "../c.yaml"), "docs/results.md:5:"),
    ] {
        std::fs::write(&doc, &bad).unwrap();
        let o = results(&[]);
        assert_eq!(o.status.code(), Some(2), "{bad}\n{}", text(&o));
        assert!(text(&o).contains(says), "{says}: {}", text(&o));
        assert_eq!(std::fs::read_to_string(&doc).unwrap(), bad);
    }
}

/// The project's own generated tables are well-formed: every block of the README and RESULTS.md
/// parses, names pipeline files that compile and metrics that exist (`--check` is 0 or 1, never
/// an error), whatever this checkout's store holds.
#[test]
fn the_documents_generated_tables_are_well_formed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let o = rao(&["results", "--check", "README.md", "RESULTS.md"], &root);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    for doc in ["README.md", "RESULTS.md"] {
        assert!(text(&o).lines().any(|l| l.starts_with(&format!("{doc}: ")) && l.contains(" would change")), "{doc}: {}", text(&o));
    }
}

/// Evaluation trees hold both modes of every task: in DuckDB each node has a unique key, run,
/// env, mode and band are filled, and every child joins to exactly one parent of its own mode one
/// level up. `rao path` finds the files by instance name.
#[test]
fn evaluation_trees_have_unique_keys_and_join_to_their_parents_in_duckdb() {
    let dir = tempfile::tempdir().unwrap();
    let body = "name: trees\nseed: 4\nstages:\n  \
        tasks: {kind: synthesize, params: {bands: [easy, medium], per_band: 3, split: validation}}\n  \
        rollout: {kind: rollout, inputs: {tasks: tasks.tasks}, params: {policy: expert, group_size: 2}}\n  \
        evaluate: {kind: evaluate, inputs: {tasks: tasks.tasks}, params: {policy: expert, group_size: 2, modes: [recursive, flat]}}\n";
    std::fs::write(dir.path().join("t.yaml"), body).unwrap();
    let run = rao(&["run", "t.yaml"], dir.path());
    assert!(run.status.success(), "{}", text(&run));
    let python = std::env::var("RAO_PYTHON").unwrap_or_else(|_| "python3".into());
    let facts = |instance: &str| -> serde_json::Value {
        let o = rao(&["path", "t.yaml", instance, "trees.parquet"], dir.path());
        assert!(o.status.success(), "{}", text(&o));
        let path = String::from_utf8_lossy(&o.stdout).trim().to_string();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = Command::new(&python).arg(root.join("scripts/check_trees.py")).arg(&path).output().expect("python runs");
        assert!(out.status.success(), "DuckDB could not read {path} (scripts/test installs it):\n{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let (tasks, group) = (6, 2);
    for instance in ["evaluate", "rollout"] {
        let f = facts(instance);
        assert_eq!(f["rows"], f["distinct_keys"], "{instance}: duplicate node keys: {f}");
        assert_eq!(f["empty"], serde_json::json!({"run": 0, "env": 0, "mode": 0, "band": 0}), "{instance}: {f}");
        assert_eq!(f["bands"], serde_json::json!(["easy", "medium"]), "{instance}: {f}");
        let modes = f["per_mode"].as_object().unwrap();
        let expected: &[&str] = if instance == "evaluate" { &["flat", "recursive"] } else { &["recursive"] };
        assert_eq!(modes.keys().map(String::as_str).collect::<Vec<_>>(), expected, "{f}");
        for (mode, m) in modes {
            assert_eq!(m["roots"], tasks * group, "{instance} {mode}: one root per tree: {f}");
            assert_eq!(m["joined"], m["children"], "{instance} {mode}: every child has exactly one parent: {f}");
            assert_eq!(m["depth_ok"], m["children"], "{instance} {mode}: {f}");
        }
        assert!(modes["recursive"]["children"].as_u64().unwrap() > 0, "the expert delegates: {f}");
        if instance == "evaluate" {
            assert_eq!(modes["flat"]["children"], 0, "{f}");
        }
    }
    // Inspect keeps the recursive and the flat tree of a task apart, by file or by instance name.
    let o = rao(&["path", "t.yaml", "evaluate", "report/trees.parquet"], dir.path());
    let trees = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let headers = |args: &[&str]| -> Vec<String> {
        let o = rao(args, dir.path());
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.starts_with("task ")).map(str::to_string).collect()
    };
    let all = headers(&["inspect", &trees, "--limit", "100"]);
    assert_eq!(all.len(), 2 * tasks * group, "{all:?}");
    assert_eq!(all.iter().filter(|h| h.contains(" flat tree ")).count(), tasks * group, "{all:?}");
    assert_eq!(headers(&["inspect", "t.yaml", "evaluate", "--limit", "100"]), all);
    let flat = headers(&["inspect", "t.yaml", "evaluate", "--mode", "flat", "--band", "medium", "--limit", "100"]);
    assert_eq!(flat.len(), 3 * group, "{flat:?}");
    assert!(flat.iter().all(|h| h.contains(" flat tree ") && h.contains("(medium)")), "{flat:?}");
    // The flat expert overflows on Medium tasks: every failed flat tree ran out of context.
    let failed = headers(&["inspect", "t.yaml", "evaluate", "--mode", "flat", "--failed", "--limit", "100"]);
    assert!(!failed.is_empty() && failed.iter().all(|h| !h.contains("root score 1 ")), "{failed:?}");
    assert_eq!(headers(&["inspect", "t.yaml", "evaluate", "--mode", "flat", "--status", "context-overflow", "--limit", "100"]), failed);
    for (args, says) in [
        (vec!["inspect", "t.yaml", "evaluate", "--task", "nosuch"], "no tree of task `nosuch`"),
        (vec!["inspect", "t.yaml", "evaluate", "--band", "hard"], "its bands: easy, medium"),
        (vec!["inspect", "t.yaml"], "name the instance whose trees to print"),
        // Not run under these values: the hint runs it under them, in the same store.
        (
            vec!["inspect", "t.yaml", "evaluate", "--set", "seed=9", "--store", ".rao/store"],
            "`rao run t.yaml --set seed=9 --store .rao/store` produces it",
        ),
        (
            vec!["path", "t.yaml", "evaluate", "--set", "stages.evaluate.params.label=a b"],
            "`rao run t.yaml --set 'stages.evaluate.params.label=a b'` produces it",
        ),
    ] {
        let o = rao(&args, dir.path());
        assert!(!o.status.success() && text(&o).contains(says), "{args:?}: {}", text(&o));
    }
    // An override no stage reads is named (the file has no `${params.…}` at all).
    let o = rao(&["validate", "t.yaml", "--set", "params.window=64"], dir.path());
    assert!(o.status.success() && text(&o).contains("warning: --set params.window: no stage reads"), "{}", text(&o));
    // Unknown instances and files are errors that name what exists.
    let o = rao(&["path", "t.yaml", "evaluat"], dir.path());
    assert!(!o.status.success() && text(&o).contains("did you mean `evaluate`?"), "{}", text(&o));
    let o = rao(&["path", "t.yaml", "evaluate", "nope.parquet"], dir.path());
    assert!(!o.status.success() && text(&o).contains("report/summary.json"), "{}", text(&o));
}

/// The long-document and multi-hop regimes through the very stage kinds TextCraft uses: task
/// drawing, rollout, exact judge, advantage, evaluation; the same file and seed give the same
/// tasks, and the expert's report shows recursion winning where a flat context overflows.
#[test]
fn the_other_regimes_run_through_the_same_stages() {
    let dir = tempfile::tempdir().unwrap();
    let stages = |env: &str, tasks: &str| {
        format!(
            "  {env}_tasks: {{kind: {env}_tasks, params: {tasks}}}\n  \
             {env}_rollout: {{kind: rollout, inputs: {{tasks: {env}_tasks.tasks}}, params: {{policy: expert, group_size: 2, limits: {{window: 96, max_depth: 6, max_children: 4}}}}}}\n  \
             {env}_judge: {{kind: judge, inputs: {{trees: {env}_rollout.trees, tasks: {env}_tasks.tasks}}, params: {{mode: exact}}}}\n  \
             {env}_advantage: {{kind: advantage, inputs: {{trees: {env}_judge.trees}}, params: {{lambda: 0.4}}}}\n  \
             {env}_eval: {{kind: evaluate, inputs: {{tasks: {env}_tasks.tasks}}, params: {{policy: expert, label: {env}, limits: {{window: 96, max_depth: 2, max_children: 4}}}}}}\n"
        )
    };
    let body = format!(
        "name: regimes\nseed: 3\nstages:\n{}{}",
        stages("longdoc", "{count: 6, split: validation}"),
        stages("multihop", "{hops: [2, 4], per_hops: 4, split: validation}")
    );
    std::fs::write(dir.path().join("r.yaml"), &body).unwrap();
    let first = rao(&["run", "r.yaml", "--json"], dir.path());
    assert!(first.status.success(), "{}", text(&first));
    let report = text(&rao(&["report", "r.yaml"], dir.path()));
    let row = |label: &str, mode: &str, band: &str| -> Vec<String> {
        let line = report
            .lines()
            .find(|l| l.split_whitespace().take(3).collect::<Vec<_>>() == [label, mode, band])
            .unwrap_or_else(|| panic!("no row {label} {mode} {band}:\n{report}"));
        line.split_whitespace().map(str::to_string).collect()
    };
    // Columns: label, mode, band (two words here), tasks, success, …
    assert_eq!(row("multihop", "recursive", "4")[5], "1.00", "{report}");
    assert_eq!(row("multihop", "flat", "4")[5], "0.00", "{report}");
    assert_eq!(row("multihop", "flat", "2")[5], "1.00", "{report}");
    let doc_rows: Vec<&str> = report.lines().filter(|l| l.starts_with("longdoc ")).collect();
    assert!(doc_rows.iter().filter(|l| l.contains("recursive")).all(|l| l.split_whitespace().nth(5) == Some("1.00")), "{report}");
    assert!(doc_rows.iter().filter(|l| l.contains(" flat ")).all(|l| l.split_whitespace().nth(5) == Some("0.00")), "{report}");

    // Same file, same seed, fresh store: the same tasks (byte for byte) and the same judged trees.
    let again = tempfile::tempdir().unwrap();
    std::fs::write(again.path().join("r.yaml"), &body).unwrap();
    assert!(rao(&["run", "r.yaml"], again.path()).status.success());
    for env in ["longdoc", "multihop"] {
        let tasks = |d: &Path| -> Vec<u8> {
            let out = rao(&["status", "r.yaml", "--json"], d);
            let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let fp = rows.as_array().unwrap().iter().find(|r| r["instance"] == format!("{env}_tasks")).unwrap()["fingerprint"]
                .as_str()
                .unwrap()
                .to_string();
            artifact_file(&d.join(".rao/store"), &fp, "tasks", "tasks.parquet")
        };
        assert_eq!(tasks(dir.path()), tasks(again.path()), "{env}: same seed, same tasks");
    }
}

/// `policy: paced_expert` takes the scripted expert's decisions and pays the model's compute:
/// its trees are the expert's (same actions, scores and shapes, in both modes), and `latency:
/// true` (one task at a time) changes only the timing.
#[test]
fn the_paced_expert_acts_exactly_like_the_expert() {
    let dir = tempfile::tempdir().unwrap();
    let limits = "{window: 96, max_depth: 2, max_children: 4}";
    let body = format!(
        "name: paced\nseed: 2\nstages:\n  \
         docs: {{kind: longdoc_tasks, params: {{config: {{min_lines: 40, max_lines: 120}}, count: 6, split: validation}}}}\n  \
         demos: {{kind: longdoc_tasks, params: {{config: {{min_lines: 40, max_lines: 120}}, count: 4}}}}\n  \
         warmstart: {{kind: warmstart, inputs: {{tasks: demos.tasks, gate_tasks: docs.tasks}}, params: {{model: {{d_model: 16, n_layers: 1, n_heads: 2, d_ff: 32}}, limits: {limits}, max_steps: 2, eval_every: 2, gate: {{min_node_success: 0.9, required: false}}}}}}\n  \
         expert: {{kind: evaluate, inputs: {{tasks: docs.tasks}}, params: {{policy: expert, label: same, limits: {limits}}}}}\n  \
         paced: {{kind: evaluate, inputs: {{tasks: docs.tasks, checkpoint: warmstart.checkpoint}}, params: {{policy: paced_expert, label: same, latency: true, limits: {limits}}}}}\n"
    );
    std::fs::write(dir.path().join("p.yaml"), &body).unwrap();
    let run = rao(&["run", "p.yaml"], dir.path());
    assert!(run.status.success(), "{}", text(&run));
    let report = text(&rao(&["report", "p.yaml"], dir.path()));
    // Every column but the last (s/task) of each row, per evaluation (rows are printed per stage).
    let rows: Vec<String> = report
        .lines()
        .filter(|l| l.starts_with("same "))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().split_last().unwrap().1.join(" "))
        .collect();
    assert!(rows.len() >= 4 && rows.len().is_multiple_of(2), "{report}");
    let (a, b) = rows.split_at(rows.len() / 2);
    assert_eq!(a, b, "{report}");
    assert!(a.iter().any(|r| r.contains("recursive") && r.contains(" 1.00 ")), "the expert solves these recursively: {report}");
}

/// One file of a finished instance's output in a local store directory (found via its manifest).
fn artifact_file(store: &Path, fp: &str, output: &str, file: &str) -> Vec<u8> {
    let m = local_manifest(store, fp);
    let attempt = m["attempt"].as_str().unwrap_or("out");
    std::fs::read(store.join("objects").join(&fp[..2]).join(fp).join(attempt).join(output).join(file)).unwrap()
}

/// The manifest of `fp` in a local store directory.
fn local_manifest(store: &Path, fp: &str) -> serde_json::Value {
    let path = store.join("objects").join(&fp[..2]).join(fp).join("MANIFEST.json");
    serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

#[test]
fn concurrent_runs_on_one_local_store_execute_each_stage_once_with_identical_results() {
    let reference = tempfile::tempdir().unwrap();
    let p = concurrent::wide_pipeline(reference.path(), &reference.path().join("ran.log"));
    let alone = rao(&["run", p.to_str().unwrap(), "--store", "s"], reference.path());
    assert!(alone.status.success(), "{}", text(&alone));
    let status = rao(&["status", p.to_str().unwrap(), "--store", "s", "--json"], reference.path());
    let want = concurrent::outputs(&String::from_utf8_lossy(&status.stdout), |fp| local_manifest(&reference.path().join("s"), fp));
    for (runs, trials) in [(2, 4), (4, 3)] {
        for trial in 0..trials {
            let dir = tempfile::tempdir().unwrap();
            let log = dir.path().join("ran.log");
            let p = concurrent::wide_pipeline(dir.path(), &log);
            concurrent::run_together(runs, || {
                let mut c = Command::new(env!("CARGO_BIN_EXE_rao"));
                c.args(["run", p.to_str().unwrap(), "--store", "s", "-j", "2"]).current_dir(dir.path());
                c
            });
            concurrent::assert_each_ran_once(&log);
            let status = rao(&["status", p.to_str().unwrap(), "--store", "s", "--json"], dir.path());
            let got = concurrent::outputs(&String::from_utf8_lossy(&status.stdout), |fp| local_manifest(&dir.path().join("s"), fp));
            assert_eq!(got, want, "{runs} runs, trial {trial}: results differ from a single run");
            let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("s/staging")).map(|d| d.flatten().count()).into_iter().collect();
            assert!(leftovers.iter().all(|n| *n == 0), "staging left behind: {leftovers:?}");
        }
    }
}

/// `rao run --json` and `rao exec --json` are event streams on stdout: when the command cannot
/// start (a bad file, a store that is a file), the stream still ends in one event, `error`,
/// with the same located message as stderr.
#[test]
fn a_json_stream_that_cannot_start_ends_in_an_error_event() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.yaml"), "name: bad\nstages:\n  a: {kind: no_such_kind}\n").unwrap();
    std::fs::write(dir.path().join("ok.yaml"), "name: ok\nstages:\n  a: {kind: noop}\n").unwrap();
    std::fs::write(dir.path().join("a-file"), "not a store").unwrap();
    for (args, says) in [
        (&["run", "bad.yaml", "--json"][..], "bad.yaml:3:"),
        (&["exec", "bad.yaml", "a", "--json"][..], "bad.yaml:3:"),
        (&["run", "ok.yaml", "--store", "a-file", "--json"][..], "a-file"),
    ] {
        let o = rao(args, dir.path());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let stdout = String::from_utf8_lossy(&o.stdout);
        let events: Vec<serde_json::Value> =
            stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {l}"))).collect();
        let last = events.last().unwrap_or_else(|| panic!("{args:?}: no event on stdout; stderr:\n{}", text(&o)));
        assert_eq!(last["event"], "error", "{args:?}: {stdout}");
        let message = last["message"].as_str().unwrap_or("");
        assert!(message.contains(says), "{args:?}: {message}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(message.lines().next().unwrap()), "{args:?}: stderr says it too");
    }
}
