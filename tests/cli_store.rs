//! The store as something other people, crashes and attackers touch: damaged objects are found
//! and recomputed, hostile paths refused, secrets never recorded, killed runs recorded as such,
//! read-only commands create nothing.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::chain::*;

#[test]
fn a_truncated_output_under_a_valid_manifest_is_recomputed_not_served() {
    let dir = chain_done();
    let good = std::fs::read(output_file(dir.path(), &fingerprint(dir.path(), "a"))).unwrap();
    // Truncate a's output: the next run finds it by size, sets it aside and recomputes a only.
    let path = output_file(dir.path(), &fingerprint(dir.path(), "a"));
    std::fs::write(&path, &good[..10]).unwrap();
    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("DAMAGED  a"), "{}", text(&o));
    assert_eq!(ran(dir.path()).matches('a').count(), 2, "a recomputed once: {}", ran(dir.path()));
    assert_eq!(ran(dir.path()).matches('b').count(), 1, "b's own output was fine: {}", ran(dir.path()));
    assert_eq!(std::fs::read(output_file(dir.path(), &fingerprint(dir.path(), "a"))).unwrap(), good);
    assert!(std::fs::read_dir(dir.path().join(".rao/store/quarantine")).unwrap().count() >= 1);

    // Same size, other bytes: a cache hit does not hash, but a stage that reads it does — and
    // `--force c` recomputes from good bytes, not from the damage.
    let path = output_file(dir.path(), &fingerprint(dir.path(), "b"));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let o = rao(&["run", "p.yaml", "--force", "c"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("DAMAGED  b"), "{}", text(&o));
    assert_eq!(ran(dir.path()).matches('b').count(), 2, "{}", ran(dir.path()));
    let c = std::fs::read_to_string(output_file(dir.path(), &fingerprint(dir.path(), "c"))).unwrap();
    assert!(c.starts_with("1\n2\n"), "c read the damaged bytes: {c:.40}");

    // `rao verify` checks every byte: clean now; a flipped byte is reported (exit 1), `--repair`
    // sets it aside, and the next run recomputes it.
    let v = rao(&["verify", "p.yaml"], dir.path());
    assert!(v.status.success(), "{}", text(&v));
    let path = output_file(dir.path(), &fingerprint(dir.path(), "c"));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[3] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let v = rao(&["verify", "p.yaml"], dir.path());
    assert_eq!(v.status.code(), Some(1), "{}", text(&v));
    assert!(text(&v).contains("DAMAGED") && text(&v).contains("(c)"), "{}", text(&v));
    assert!(rao(&["verify", "p.yaml", "--repair"], dir.path()).status.success());
    let status = text(&rao(&["status", "p.yaml"], dir.path()));
    assert!(status.contains("stale    c") && status.contains("its artifacts are missing"), "{status}");
}

#[test]
fn a_truncated_or_deleted_manifest_is_not_done_and_aborts_nothing() {
    let dir = chain_done();
    let fp = fingerprint(dir.path(), "b");
    let manifest = object_dir(dir.path(), &fp).join("MANIFEST.json");
    let bytes = std::fs::read(&manifest).unwrap();
    std::fs::write(&manifest, &bytes[..bytes.len() / 2]).unwrap();
    for cmd in [&["status", "p.yaml"][..], &["plan", "p.yaml"], &["report", "p.yaml"]] {
        let o = rao(cmd, dir.path());
        assert!(o.status.success(), "{cmd:?}: {}", text(&o));
    }
    let status = text(&rao(&["status", "p.yaml"], dir.path()));
    assert!(status.contains("stale    b") && status.contains("damaged: MANIFEST.json is not a valid manifest"), "{status}");
    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(ran(dir.path()).matches('b').count(), 2);
    // A deleted output file is found by the cache hit's size check.
    std::fs::remove_file(output_file(dir.path(), &fingerprint(dir.path(), "c"))).unwrap();
    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(text(&o).contains("DAMAGED  c") && text(&o).contains("missing"), "{}", text(&o));
    assert_eq!(ran(dir.path()).matches('c').count(), 2, "{}", ran(dir.path()));
}

#[test]
fn hostile_manifest_paths_are_refused_and_nothing_is_written_outside_the_store() {
    let dir = chain_done();
    // An attacker with write access to the store rewrites a's manifest to name files outside it.
    let fp = fingerprint(dir.path(), "a");
    let manifest = object_dir(dir.path(), &fp).join("MANIFEST.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let victim = dir.path().join("victim");
    for hostile in ["../../../../../victim", &victim.display().to_string()] {
        m["outputs"]["o"][0]["path"] = serde_json::Value::String(hostile.to_string());
        std::fs::write(&manifest, serde_json::to_vec(&m).unwrap()).unwrap();
        let o = rao(&["run", "p.yaml", "--force", "b"], dir.path());
        assert!(o.status.success(), "{}", text(&o));
        assert!(text(&o).contains("DAMAGED  a") && text(&o).contains("`..`") || text(&o).contains("absolute"), "{}", text(&o));
        assert!(!victim.exists(), "a file was written outside the store");
        m = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    }
    // A run id is one name, never a path.
    let o = rao(&["report", "p.yaml", "--run", "../../../etc/passwd"], dir.path());
    assert!(!o.status.success());
    assert!(text(&o).contains("run id"), "{}", text(&o));
}

#[test]
fn secrets_stay_out_of_run_records_and_events() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.yaml");
    std::fs::write(
        &p,
        "name: p\nparams: {api_token: placeholder}\nstages:\n  \
         a: {kind: shell, params: {command: 'test ${#T} -eq 20 && echo ok > ${outputs.o}/v', env: {T: '${env.RAO_TEST_TOKEN}'}}, outputs: [o]}\n  \
         b: {kind: shell, params: {command: 'echo \"failing with $MY_API_TOKEN\" >&2; exit 3'}, outputs: [o]}\n  \
         c: {kind: shell, params: {command: 'curl -H \"auth: ${params.api_token}\" http://127.0.0.1:1/ 2>/dev/null; exit 4'}, outputs: [o]}\n  \
         d: {kind: shell, params: {command: 'echo ${params.api_token} | wc -c > ${outputs.o}/v', env: {GITHUB_TOKEN: ghp-written-in-the-file}}, outputs: [o]}\n",
    )
    .unwrap();
    let cache = dir.path().join("cache");
    let o = Command::new(env!("CARGO_BIN_EXE_rao"))
        .args(["run", "p.yaml", "--json", "--set", "params.api_token=tok-from-the-command-line"])
        .env("RAO_CACHE_DIR", &cache)
        .env("RAO_TEST_TOKEN", "hunter2-secret-value")
        .env("MY_API_TOKEN", "leaky-credential-42")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let out = text(&o);
    assert!(out.contains("\"instance\":\"a\"") && out.contains("\"event\":\"finished\""), "{out}");
    assert!(out.contains("failing with ***"), "{out}");
    let mut records = String::new();
    for e in std::fs::read_dir(dir.path().join(".rao/store/runs/p")).unwrap() {
        records.push_str(&std::fs::read_to_string(e.unwrap().path()).unwrap());
    }
    // The plan cache (the user's cache folder) holds no credential given on the command line.
    let mut cached = String::new();
    for e in walk(&cache) {
        cached.push_str(&String::from_utf8_lossy(&std::fs::read(e).unwrap()));
    }
    assert!(out.contains("exited with") && out.contains("auth: ***"), "c's failure is reported, the token hidden: {out}");
    for secret in ["hunter2-secret-value", "leaky-credential-42", "tok-from-the-command-line"] {
        assert!(!out.contains(secret), "{secret} in the events: {out}");
        assert!(!records.contains(secret), "{secret} in a run record");
        assert!(!cached.contains(secret), "{secret} in the plan cache");
    }
    assert!(records.contains("params.api_token=<redacted>"), "{records}");
    // Nor does anything else in the store: d succeeded, and its index entry (what `rao plan`
    // explains a change with) holds its params, the token pasted into its command included.
    let mut stored = String::new();
    for e in walk(&dir.path().join(".rao/store")) {
        stored.push_str(&String::from_utf8_lossy(&std::fs::read(e).unwrap()));
    }
    assert!(stored.contains("wc -c"), "d's index entry is there");
    for secret in ["hunter2-secret-value", "leaky-credential-42", "tok-from-the-command-line", "ghp-written-in-the-file"] {
        assert!(!stored.contains(secret), "{secret} in the store");
    }
    let plan = Command::new(env!("CARGO_BIN_EXE_rao"))
        .args(["plan", "p.yaml", "--set", "params.api_token=another-token-value", "--set", "stages.d.params.env.GITHUB_TOKEN=ghp-other"])
        .env("RAO_CACHE_DIR", &cache)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let plan = text(&plan);
    for secret in ["tok-from-the-command-line", "another-token-value", "ghp-written-in-the-file", "ghp-other"] {
        assert!(!plan.contains(secret), "{secret} in the plan: {plan}");
    }
    assert!(plan.contains("a credential-looking param changed"), "{plan}");
    // The env placeholder is what the fingerprint sees: a new token value is no cache miss.
    let again = Command::new(env!("CARGO_BIN_EXE_rao"))
        .args(["status", "p.yaml"])
        .env("RAO_TEST_TOKEN", "another-value")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(text(&again).contains("done     a"), "{}", text(&again));
}

#[test]
fn a_killed_run_is_recorded_as_interrupted_and_its_staging_removed() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.yaml");
    std::fs::write(
        &p,
        "name: p\nstages:\n  slow: {kind: shell, params: {command: 'echo started > ${outputs.o}/v; sleep 30'}, outputs: [o]}\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rao")).args(["run", "p.yaml"]).current_dir(dir.path()).spawn().unwrap();
    let staging = dir.path().join(".rao/store/staging");
    let t0 = Instant::now();
    while std::fs::read_dir(&staging).map(|d| d.count()).unwrap_or(0) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "the stage never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // `rao gc` lists the dead run's staging; as a dry run it removes nothing.
    let dry = rao(&["gc", "--store", ".rao/store"], dir.path());
    assert!(text(&dry).contains("would remove staging/"), "{}", text(&dry));
    assert!(std::fs::read_dir(&staging).unwrap().count() > 0, "a dry run removed staging");
    let records = |d: &Path| -> Vec<serde_json::Value> {
        std::fs::read_dir(d.join(".rao/store/runs/p"))
            .unwrap()
            .map(|e| serde_json::from_slice(&std::fs::read(e.unwrap().path()).unwrap()).unwrap())
            .collect()
    };
    assert!(records(dir.path()).iter().any(|r| r["status"] == "running"));
    // The next run (here: of a quick pipeline under the same name) closes the dead one.
    std::fs::write(&p, "name: p\nstages:\n  quick: {kind: shell, params: {command: 'echo x > ${outputs.o}/v'}, outputs: [o]}\n").unwrap();
    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("recorded as interrupted"), "{}", text(&o));
    let statuses: Vec<String> = records(dir.path()).iter().map(|r| r["status"].as_str().unwrap().to_string()).collect();
    assert!(statuses.contains(&"interrupted".to_string()) && !statuses.contains(&"running".to_string()), "{statuses:?}");
    assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0, "staging of the dead run is left");
}

#[test]
fn read_only_commands_create_nothing_and_store_paths_are_taken_from_the_current_directory() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("pipelines");
    std::fs::create_dir(&sub).unwrap();
    chain(&sub);
    for cmd in [&["status", "pipelines/p.yaml"][..], &["plan", "pipelines/p.yaml"]] {
        let o = rao(cmd, dir.path());
        assert!(o.status.success(), "{cmd:?}: {}", text(&o));
    }
    // Nothing to report, verify or clean where no store is: said, not taken for an empty store.
    for cmd in [&["report", "pipelines/p.yaml"][..], &["verify", "pipelines/p.yaml"], &["gc", "--store", "nowhere", "--delete"]] {
        let o = rao(cmd, dir.path());
        assert!(!o.status.success() && text(&o).contains("no store at"), "{cmd:?}: {}", text(&o));
    }
    assert!(text(&rao(&["report", "pipelines/p.yaml"], dir.path())).contains("`rao run pipelines/p.yaml` makes it"));
    assert!(!dir.path().join("nowhere").exists(), "gc --delete created the store it was to clean");
    assert!(!sub.join(".rao").exists(), "a read-only command created the store");
    let o = rao(&["run", "pipelines/p.yaml", "--store", "here"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(dir.path().join("here/objects").is_dir(), "--store is relative to the current directory");
    assert!(!sub.join("here").exists());
    // A store that refuses run records (here `runs/p` is a file, not a folder) does not fail a
    // fully cached run: the record is bookkeeping.
    std::fs::remove_dir_all(dir.path().join("here/runs")).unwrap();
    std::fs::write(dir.path().join("here/runs"), "not a folder").unwrap();
    let o = rao(&["run", "pipelines/p.yaml", "--store", "here"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("cannot write the run record"), "{}", text(&o));
    assert_eq!(text(&o).matches("os error").count(), text(&o).lines().filter(|l| l.contains("os error")).count());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let target = to.join(p.file_name().unwrap());
        if p.is_dir() { copy_dir(&p, &target) } else { std::fs::copy(&p, &target).map(|_| ()).unwrap() }
    }
}

#[test]
fn gc_keeps_the_outputs_of_a_manifest_it_cannot_read() {
    let dir = chain_done();
    let fp = fingerprint(dir.path(), "a");
    let out = output_file(dir.path(), &fp);
    // Damaged, or written by a newer rao: its outputs are not orphans until `verify --repair`
    // has set it aside.
    let manifest = object_dir(dir.path(), &fp).join("MANIFEST.json");
    let whole = std::fs::read(&manifest).unwrap();
    std::fs::write(&manifest, &whole[..whole.len() / 2]).unwrap();
    let gc = rao(&["gc", "p.yaml", "--delete", "--min-age", "0"], dir.path());
    assert!(gc.status.success(), "{}", text(&gc));
    assert!(out.exists(), "gc removed the outputs of a manifest it could not read: {}", text(&gc));
}

#[test]
fn gc_keeps_what_a_live_run_uses_even_if_no_pipeline_given_to_it_references_it() {
    let dir = chain_done();
    let old_c = edit_c(dir.path());
    // A run of the old file still going (on record and marked active, its process alive: this
    // one), e.g. started with `--set` values that gc is not told about.
    let store = dir.path().join(".rao/store");
    let mut record: serde_json::Value = serde_json::from_slice(&std::fs::read(store.join("runs/p/latest.json")).unwrap()).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    record["run_id"] = "20261203T000000Z-1".into();
    record["status"] = "running".into();
    record["pid"] = std::process::id().into();
    record["heartbeat_at"] = now.into();
    record["finished_at"] = serde_json::Value::Null;
    std::fs::write(store.join("runs/p/20261203T000000Z-1.json"), serde_json::to_vec(&record).unwrap()).unwrap();
    std::fs::create_dir_all(store.join("active/p")).unwrap();
    std::fs::write(store.join("active/p/20261203T000000Z-1"), b"").unwrap();

    // `--keep-runs none`: finished runs keep nothing, so only the live run is in the way.
    let gc = rao(&["gc", "p.yaml", "--delete", "--min-age", "0", "--keep-runs", "none"], dir.path());
    assert!(gc.status.success(), "{}", text(&gc));
    assert!(object_dir(dir.path(), &old_c).join("MANIFEST.json").exists(), "gc removed what a live run uses: {}", text(&gc));
    // Once that run has ended, nothing keeps it.
    std::fs::remove_file(store.join("active/p/20261203T000000Z-1")).unwrap();
    let gc = rao(&["gc", "p.yaml", "--delete", "--min-age", "0", "--keep-runs", "none"], dir.path());
    assert!(gc.status.success() && text(&gc).contains(&old_c), "{}", text(&gc));
    assert!(!object_dir(dir.path(), &old_c).exists());
}

#[test]
fn gc_keeps_an_attempt_just_superseded_by_force_even_when_its_files_are_old() {
    let dir = chain_done();
    let fp = fingerprint(dir.path(), "a");
    let before = output_file(dir.path(), &fp);
    // Written two hours ago, superseded now: a run that read the old manifest may still use it.
    let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(7200);
    std::fs::File::options().write(true).open(&before).unwrap().set_modified(two_hours_ago).unwrap();
    assert!(rao(&["run", "p.yaml", "--force", "a"], dir.path()).status.success());
    assert_ne!(output_file(dir.path(), &fp), before, "--force made a new attempt");
    let gc = rao(&["gc", "p.yaml", "--delete"], dir.path());
    assert!(gc.status.success(), "{}", text(&gc));
    assert!(before.exists(), "gc removed an attempt superseded a moment ago: {}", text(&gc));
    let gc = rao(&["gc", "p.yaml", "--delete", "--min-age", "0"], dir.path());
    assert!(gc.status.success() && !before.exists(), "{}", text(&gc));
}

#[test]
fn gc_lists_then_removes_leftovers_and_what_no_pipeline_references() {
    let dir = chain_done();
    // Leftovers: an attempt no manifest names (a writer that lost the race) …
    let a = object_dir(dir.path(), &fingerprint(dir.path(), "a"));
    let attempt = output_file(dir.path(), &fingerprint(dir.path(), "a")).parent().unwrap().parent().unwrap().to_path_buf();
    copy_dir(&attempt, &a.join("a-00000000000000ff"));
    // … and an old version of the pipeline's objects (c's command changed since).
    let old_c = edit_c(dir.path());
    assert!(rao(&["run", "p.yaml"], dir.path()).status.success());
    assert_ne!(fingerprint(dir.path(), "c"), old_c);

    // All of it was written just now: by default (`--min-age 1h`) a run elsewhere may still be
    // publishing or using it, so nothing goes.
    let young = rao(&["gc", "p.yaml", "--delete"], dir.path());
    assert!(young.status.success() && text(&young).contains("removed 0 objects"), "{}", text(&young));
    assert!(a.join("a-00000000000000ff").exists() && object_dir(dir.path(), &old_c).exists());

    let dry = rao(&["gc", "p.yaml", "--min-age", "0"], dir.path());
    assert!(dry.status.success(), "{}", text(&dry));
    let listed = text(&dry);
    assert!(listed.contains("would remove") && listed.contains("a-00000000000000ff") && listed.contains(&old_c), "{listed}");
    assert!(a.join("a-00000000000000ff").exists(), "a dry run deleted something");
    let del = rao(&["gc", "p.yaml", "--delete", "--min-age", "0"], dir.path());
    assert!(del.status.success(), "{}", text(&del));
    assert!(!a.join("a-00000000000000ff").exists());
    assert!(!object_dir(dir.path(), &old_c).exists());
    // What the pipeline uses is intact and cached.
    assert!(rao(&["verify", "p.yaml"], dir.path()).status.success());
    let again = rao(&["run", "p.yaml"], dir.path());
    assert!(text(&again).contains("3 cached") || text(&again).matches("cached").count() >= 3, "{}", text(&again));
    assert_eq!(ran(dir.path()).lines().count(), 4, "nothing recomputed after gc: {}", ran(dir.path()));
}

// Linux: `/proc/self/mem` is how a test makes a read fail whoever runs it (root reads through
// `chmod 000`).
#[cfg(target_os = "linux")]
#[test]
fn gc_stopped_by_a_store_error_says_what_it_removed_before_and_fails() {
    let dir = chain_done();
    let old_c = edit_c(dir.path());
    assert!(rao(&["run", "p.yaml"], dir.path()).status.success());
    // An object listed after old c's, unwanted, whose manifest cannot be read: a regular file
    // whose read fails with an I/O error (`/proc/self/mem` at offset 0), as a failing disk or
    // mount would. (A folder where the file should be is damage of that object, not this.)
    let last = "f".repeat(32);
    let attempt = object_dir(dir.path(), &last).join("a-0123456789abcdef/o");
    std::fs::create_dir_all(&attempt).unwrap();
    std::fs::write(attempt.join("v"), b"x").unwrap();
    std::os::unix::fs::symlink("/proc/self/mem", object_dir(dir.path(), &last).join("MANIFEST.json")).unwrap();

    let gc = rao(&["gc", "p.yaml", "--delete", "--min-age", "0"], dir.path());
    let (out, err) = (String::from_utf8_lossy(&gc.stdout).to_string(), String::from_utf8_lossy(&gc.stderr).to_string());
    assert_eq!(gc.status.code(), Some(2), "{out}{err}");
    assert!(out.contains(&format!("removed objects/{}/{old_c}", &old_c[..2])), "what went before the error is listed: {out}");
    assert!(err.contains("gc stopped part way") && err.contains(&last), "{err}");
    assert!(!object_dir(dir.path(), &old_c).exists());
    assert!(attempt.join("v").exists(), "nothing after the error went");
}

#[test]
fn gc_removes_what_killed_writers_left_half_written_once_it_is_old() {
    let dir = chain_done();
    let a = object_dir(dir.path(), &fingerprint(dir.path(), "a"));
    // Temporaries as a writer killed between writing and renaming leaves them: one from two
    // hours ago, one from a writer that may still be at work.
    let stale = a.join(".MANIFEST.json.rao-tmp.4000000.0");
    let fresh = a.join(".MANIFEST.json.rao-tmp.4000000.1");
    std::fs::write(&stale, b"{\"half").unwrap();
    std::fs::write(&fresh, b"{\"half").unwrap();
    let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(7200);
    std::fs::File::options().write(true).open(&stale).unwrap().set_modified(two_hours_ago).unwrap();

    let dry = rao(&["gc", "p.yaml"], dir.path());
    assert!(dry.status.success() && text(&dry).contains(".MANIFEST.json.rao-tmp.4000000.0"), "{}", text(&dry));
    assert!(stale.exists(), "a dry run deleted something");
    let gc = rao(&["gc", "p.yaml", "--delete"], dir.path());
    assert!(gc.status.success(), "{}", text(&gc));
    assert!(!stale.exists(), "an old temporary stays: {}", text(&gc));
    assert!(fresh.exists(), "gc removed a temporary written a moment ago: {}", text(&gc));
    assert!(rao(&["verify", "p.yaml"], dir.path()).status.success());

    // An object no pipeline references goes whole, though a killed writer left a file in it.
    let old_c = edit_c(dir.path());
    assert!(rao(&["run", "p.yaml"], dir.path()).status.success());
    std::fs::write(object_dir(dir.path(), &old_c).join(".MANIFEST.json.rao-tmp.4000000.2"), b"{").unwrap();
    let gc = rao(&["gc", "p.yaml", "--delete", "--min-age", "0"], dir.path());
    assert!(gc.status.success(), "{}", text(&gc));
    assert!(!object_dir(dir.path(), &old_c).exists(), "{}", text(&gc));
    let again = rao(&["run", "p.yaml"], dir.path());
    assert!(again.status.success(), "{}", text(&again));
    assert_eq!(ran(dir.path()).lines().count(), 4, "nothing recomputed after gc: {}", ran(dir.path()));
}

#[test]
fn gc_keeps_the_results_of_runs_made_with_set_values_unless_told_otherwise() {
    let dir = chain_done();
    let run = rao(&["run", "p.yaml", "--set", "seed=2"], dir.path());
    assert!(run.status.success(), "{}", text(&run));
    let (plain, seed2) = (fingerprint(dir.path(), "c"), fingerprint_with(dir.path(), "c", &["seed=2"]));
    assert_ne!(plain, seed2, "the seed is part of every fingerprint");

    // The file alone names seed 1; seed 2's results are the newest run of `--set seed=2`.
    let gc = rao(&["gc", "p.yaml", "--delete", "--min-age", "0"], dir.path());
    assert!(gc.status.success() && text(&gc).contains("seed=2"), "{}", text(&gc));
    assert!(object_dir(dir.path(), &seed2).exists() && object_dir(dir.path(), &plain).exists(), "{}", text(&gc));

    // A run record it cannot read: what that run used is unknown, so nothing finished goes.
    let unreadable = dir.path().join(".rao/store/runs/p/20000101T000000Z-1.json");
    std::fs::write(&unreadable, b"{not a record").unwrap();
    let gc = rao(&["gc", "p.yaml", "--set", "seed=2", "--delete", "--min-age", "0"], dir.path());
    assert!(gc.status.success() && text(&gc).contains("cannot be read"), "{}", text(&gc));
    assert!(object_dir(dir.path(), &plain).exists(), "{}", text(&gc));
    std::fs::remove_file(&unreadable).unwrap();

    // Told to keep only what the file names under the values given: the other seed's results go.
    let gc = rao(&["gc", "p.yaml", "--set", "seed=2", "--keep-runs", "none", "--delete", "--min-age", "0"], dir.path());
    assert!(gc.status.success(), "{}", text(&gc));
    assert!(object_dir(dir.path(), &seed2).exists(), "{}", text(&gc));
    assert!(!object_dir(dir.path(), &plain).exists(), "{}", text(&gc));
    let again = rao(&["run", "p.yaml", "--set", "seed=2"], dir.path());
    assert!(again.status.success(), "{}", text(&again));
    assert_eq!(ran(dir.path()).lines().count(), 6, "seed 2 still cached after gc: {}", ran(dir.path()));
}

#[test]
fn a_report_of_a_past_run_whose_results_gc_removed_says_so_and_how_to_make_them_again() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("t.yaml"),
        "name: t\nstages:\n  tasks: {kind: synthesize, params: {bands: [easy], per_band: 2, split: validation}}\n  \
         evaluate: {kind: evaluate, inputs: {tasks: tasks.tasks}, params: {policy: expert, modes: [recursive]}}\n",
    )
    .unwrap();
    assert!(rao(&["run", "t.yaml", "--set", "seed=2"], dir.path()).status.success());
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(".rao/store/runs/t/latest.json")).unwrap()).unwrap();
    let id = record["run_id"].as_str().unwrap().to_string();
    let before = rao(&["report", "t.yaml", "--run", &id], dir.path());
    assert!(before.status.success() && !text(&before).contains("not in the store"), "{}", text(&before));
    let gc = rao(&["gc", "t.yaml", "--keep-runs", "none", "--delete", "--min-age", "0"], dir.path());
    assert!(gc.status.success(), "{}", text(&gc));
    let after = rao(&["report", "t.yaml", "--run", &id], dir.path());
    let said = text(&after);
    assert!(said.contains("evaluate: not in the store for that run (removed since)"), "{said}");
    assert!(said.contains("`rao run t.yaml --set seed=2` produces it"), "{said}");
}

/// A shared bucket edited by someone else: what stands in the store is never followed out of it,
/// read without bound, or taken for rao's own.
#[test]
fn a_tampered_store_can_neither_hang_a_run_nor_lead_writes_and_deletes_out_of_it() {
    let dir = chain_done();
    // A's output replaced by a FIFO, its manifest edited to match an empty file: a cache hit
    // would pass, and reading it would wait for a writer for ever.
    let fp = fingerprint(dir.path(), "a");
    let file = output_file(dir.path(), &fp);
    let manifest_path = object_dir(dir.path(), &fp).join("MANIFEST.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    m["outputs"]["o"][0]["size"] = 0.into();
    m["outputs"]["o"][0]["blake3"] = blake3::hash(b"").to_hex().to_string().into();
    std::fs::write(&manifest_path, serde_json::to_vec(&m).unwrap()).unwrap();
    std::fs::remove_file(&file).unwrap();
    let fifo = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let mut child =
        Command::new(env!("CARGO_BIN_EXE_rao")).args(["run", "p.yaml", "--force", "b"]).current_dir(dir.path()).spawn().unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("the run hangs on a FIFO in the store");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success());
    assert_eq!(ran(dir.path()).matches('a').count(), 2, "a recomputed: {}", ran(dir.path()));

    // A manifest far larger than any rao writes is damage, not read into memory.
    let fp_c = fingerprint(dir.path(), "c");
    let f = std::fs::OpenOptions::new().append(true).open(object_dir(dir.path(), &fp_c).join("MANIFEST.json")).unwrap();
    f.set_len(1 << 30).unwrap();
    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(o.status.success() && text(&o).contains("DAMAGED  c") && text(&o).contains("too large"), "{}", text(&o));

    // An output named like rao's temporaries is refused when published, so gc never mistakes it.
    std::fs::write(
        dir.path().join("t.yaml"),
        "name: t\nstages:\n  x: {kind: shell, params: {command: 'echo 1 > ${outputs.o}/.v.rao-tmp.1.2'}, outputs: [o]}\n",
    )
    .unwrap();
    let o = rao(&["run", "t.yaml"], dir.path());
    assert!(!o.status.success() && text(&o).contains("named like one of rao's temporary files"), "{}", text(&o));

    // A run record whose ids lead elsewhere is refused where it would name a file.
    let latest = dir.path().join(".rao/store/runs/p/latest.json");
    let mut r: serde_json::Value = serde_json::from_slice(&std::fs::read(&latest).unwrap()).unwrap();
    r["run_id"] = "../../../../outside".into();
    std::fs::write(&latest, serde_json::to_vec(&r).unwrap()).unwrap();
    let o = rao(&["report", "p.yaml", "--run", "latest"], dir.path());
    assert!(!o.status.success() && text(&o).contains("was the store tampered with?"), "{}", text(&o));

    // A store folder that is a link (here to another store) is refused before anything is
    // written or deleted through it.
    let victim = tempfile::tempdir().unwrap();
    std::fs::create_dir(victim.path().join("keep")).unwrap();
    std::fs::write(victim.path().join("keep/precious"), "mine").unwrap();
    let objects = dir.path().join(".rao/store/objects");
    std::fs::remove_dir_all(&objects).unwrap();
    std::os::unix::fs::symlink(victim.path(), &objects).unwrap();
    for args in [&["gc", "p.yaml", "--min-age", "0s", "--delete"][..], &["run", "p.yaml"]] {
        let o = rao(args, dir.path());
        assert!(!o.status.success() && text(&o).contains("`objects` in the store is a link"), "{args:?}: {}", text(&o));
    }
    assert_eq!(std::fs::read_to_string(victim.path().join("keep/precious")).unwrap(), "mine");
}
