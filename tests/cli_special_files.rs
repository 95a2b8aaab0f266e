//! Files that are not plain files — FIFOs, links, folders where a file was — in a stage's outputs
//! and in the store, and the processes a shell stage leaves behind. Each of these once hung a run
//! or `rao verify`, so every command here runs under a deadline.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What a finished `rao` printed.
struct Ran {
    status: ExitStatus,
    stdout: String,
    /// stdout and stderr.
    text: String,
}

/// Start `rao`, its output going to files (nothing it leaves running can hold a pipe of ours).
fn start(args: &[&str], dir: &Path) -> Child {
    let log = |name: &str| std::fs::File::create(dir.join(name)).unwrap();
    Command::new(env!("CARGO_BIN_EXE_rao"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log(".rao-stdout"))
        .stderr(log(".rao-stderr"))
        .spawn()
        .expect("run rao")
}

/// Wait for a started `rao` until `limit`; one still running then is killed and the test fails.
fn finish(mut child: Child, args: &[&str], dir: &Path, limit: Duration) -> Ran {
    let t0 = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if t0.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("`rao {}` did not finish within {limit:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let stdout = read(".rao-stdout");
    Ran { status, text: format!("{stdout}{}", read(".rao-stderr")), stdout }
}

/// `rao args` in `dir`, failing the test if it takes longer than 30 s.
fn rao(args: &[&str], dir: &Path) -> Ran {
    finish(start(args, dir), args, dir, Duration::from_secs(30))
}

fn pipeline(dir: &Path, stages: &str) {
    std::fs::write(dir.join("p.yaml"), format!("name: p\nstages:\n{stages}")).unwrap();
}

/// The folder of output `o` of an instance's published attempt.
fn output_dir(dir: &Path, instance: &str) -> PathBuf {
    let out = rao(&["status", "p.yaml", "--json"], dir);
    let rows: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.text));
    let fp = rows.as_array().unwrap().iter().find(|r| r["instance"] == instance).unwrap()["fingerprint"].as_str().unwrap().to_string();
    let obj = dir.join(".rao/store/objects").join(&fp[..2]).join(&fp);
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(obj.join("MANIFEST.json")).unwrap()).unwrap();
    obj.join(m["attempt"].as_str().unwrap()).join("o")
}

fn mkfifo(path: &Path) {
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o644) }, 0, "mkfifo {}", path.display());
}

#[test]
fn a_fifo_in_an_output_fails_its_stage_naming_it_and_hangs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // The timeout is no help here (it covers the command, not publishing): only the refusal is.
    pipeline(
        dir.path(),
        "  a: {kind: shell, params: {command: 'mkdir ${outputs.o}/sub; echo x > ${outputs.o}/v; mkfifo ${outputs.o}/sub/f'}, outputs: [o], timeout: 2s}\n  \
         b: {kind: shell, params: {command: 'echo fine > ${outputs.o}/v'}, outputs: [o]}\n",
    );
    let o = rao(&["run", "p.yaml"], dir.path());
    assert_eq!(o.status.code(), Some(1), "{}", o.text);
    assert!(o.text.contains("output `o`: `sub/f` is a FIFO"), "{}", o.text);
    assert_eq!(std::fs::read_to_string(output_dir(dir.path(), "b").join("v")).unwrap(), "fine\n");
}

#[test]
fn a_link_to_a_file_in_an_output_is_stored_as_a_copy_and_other_links_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target.txt");
    std::fs::write(&target, "original\n").unwrap();
    std::fs::create_dir(dir.path().join("folder")).unwrap();
    pipeline(
        dir.path(),
        &format!(
            "  a: {{kind: shell, params: {{command: 'ln -s {} ${{outputs.o}}/l; echo v > ${{outputs.o}}/v; ln -s v ${{outputs.o}}/near'}}, outputs: [o]}}\n",
            target.display()
        ),
    );
    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(o.status.success(), "{}", o.text);
    let out = output_dir(dir.path(), "a");
    for (name, bytes) in [("l", "original\n"), ("near", "v\n")] {
        let meta = std::fs::symlink_metadata(out.join(name)).unwrap();
        assert!(meta.is_file(), "`{name}` stored as {:?}, not a copy", meta.file_type());
        assert_eq!(std::fs::read_to_string(out.join(name)).unwrap(), bytes);
    }
    // Editing what the link pointed to changes nothing in the store.
    std::fs::write(&target, "edited!!\n").unwrap();
    let v = rao(&["verify", "p.yaml"], dir.path());
    assert!(v.status.success(), "{}", v.text);

    // A link to a folder, or to nothing: the stage fails, naming the output and the path.
    for (link, what) in [(dir.path().join("folder"), "a link to a folder"), (dir.path().join("nowhere"), "a link to nothing")] {
        pipeline(
            dir.path(),
            &format!(
                "  c: {{kind: shell, params: {{command: 'mkdir ${{outputs.o}}/d; ln -s {} ${{outputs.o}}/d/l'}}, outputs: [o]}}\n",
                link.display()
            ),
        );
        let o = rao(&["run", "p.yaml"], dir.path());
        assert_eq!(o.status.code(), Some(1), "{}", o.text);
        assert!(o.text.contains(&format!("output `o`: `d/l` is {what}")), "{}", o.text);
    }
}

/// Whether process `pid` is gone (or a zombie about to be reaped).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

/// The PIDs a stage's command wrote to `pids`, once there are `n`.
fn wait_for_pids(pids: &Path, n: usize) -> Vec<i32> {
    let t0 = Instant::now();
    loop {
        let found: Vec<i32> = std::fs::read_to_string(pids).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect();
        if found.len() >= n {
            return found;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the stage never started its processes");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every one of `pids` gone within `within` (shorter than they would live by themselves); those
/// left are killed (they are this test's) and the test fails.
fn assert_all_gone(pids: &[i32], within: Duration, when: &str) {
    let t0 = Instant::now();
    while !pids.iter().all(|&p| gone(p)) && t0.elapsed() < within {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<i32> = pids.iter().copied().filter(|&p| !gone(p)).collect();
    for &p in &left {
        // SAFETY: a signal to a process this test's stage started.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    assert!(left.is_empty(), "{when}: processes the command started still run: {left:?}");
}

/// How long `background_sleeps`' processes may outlive what should take them down: well before
/// their 25 s sleeps end, and room for a watcher on a loaded 2-core machine (5 s was once too
/// little there).
const SLEEPS_GONE_WITHIN: Duration = Duration::from_secs(15);

/// A command that starts two processes in the background and waits for them.
fn background_sleeps(dir: &Path, timeout: &str) -> PathBuf {
    let pids = dir.join("pids");
    let _ = std::fs::remove_file(&pids);
    pipeline(
        dir,
        &format!(
            "  a: {{kind: shell, params: {{command: 'sleep 25 & echo $! >> {p}; sleep 26 & echo $! >> {p}; wait'}}, outputs: [o]{timeout}}}\n",
            p = pids.display()
        ),
    );
    pids
}

#[test]
fn a_timed_out_shell_stage_takes_the_processes_it_started_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let pids = background_sleeps(dir.path(), ", timeout: 1s");
    let o = rao(&["run", "p.yaml"], dir.path());
    assert_eq!(o.status.code(), Some(1), "{}", o.text);
    assert!(o.text.contains("timed out after 1.0s"), "{}", o.text);
    assert_all_gone(&wait_for_pids(&pids, 2), SLEEPS_GONE_WITHIN, "after a timeout");
}

#[test]
fn ctrl_c_sigterm_and_sighup_take_the_processes_a_shell_stage_started_with_it() {
    let dir = tempfile::tempdir().unwrap();
    // A stage runs in a process group of its own, out of the terminal's reach: rao passes each on.
    for (executor, signal) in
        [("in-process", libc::SIGINT), ("process", libc::SIGINT), ("in-process", libc::SIGTERM), ("process", libc::SIGHUP)]
    {
        let pids = background_sleeps(dir.path(), "");
        let args = ["run", "p.yaml", "--json", "--executor", executor];
        let child = start(&args, dir.path());
        let started = wait_for_pids(&pids, 2);
        // As the terminal's Ctrl-C (or its closing, or `kill`) does: the signal to `rao` alone.
        // SAFETY: a signal to the child this test started and has not yet waited for.
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
        let o = finish(child, &args, dir.path(), Duration::from_secs(30));
        assert_eq!(o.status.code(), Some(130), "{executor}, signal {signal}: {}", o.text);
        assert!(o.text.contains(r#""status":"cancelled""#), "{executor}, signal {signal}: {}", o.text);
        assert_all_gone(&started, SLEEPS_GONE_WITHIN, &format!("{executor}: after signal {signal}"));
    }
}

#[test]
fn kill_9_of_rao_takes_the_processes_its_stages_started_with_it() {
    let dir = tempfile::tempdir().unwrap();
    // No signal handler runs: a watcher rao started with its first stage kills what is listed.
    for executor in ["in-process", "process"] {
        let pids = background_sleeps(dir.path(), "");
        let mut child = start(&["run", "p.yaml", "--executor", executor], dir.path());
        let started = wait_for_pids(&pids, 2);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_all_gone(&started, SLEEPS_GONE_WITHIN, &format!("{executor}: after kill -9 of rao"));
    }
}

#[test]
fn verify_reports_a_fifo_or_a_folder_where_a_file_was_as_damage_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let stage = |name: &str| format!("  {name}: {{kind: shell, params: {{command: 'seq 1 100 > ${{outputs.o}}/v'}}, outputs: [o]}}\n");
    pipeline(dir.path(), &format!("{}{}{}", stage("a"), stage("b"), stage("c")));
    assert!(rao(&["run", "p.yaml"], dir.path()).status.success());
    let (a, b) = (output_dir(dir.path(), "a").join("v"), output_dir(dir.path(), "b").join("v"));
    // A FIFO: opening it to read once waited for a writer that never came.
    std::fs::remove_file(&a).unwrap();
    mkfifo(&a);
    let v = rao(&["verify", "p.yaml"], dir.path());
    assert_eq!(v.status.code(), Some(1), "{}", v.text);
    assert!(v.text.contains("DAMAGED") && v.text.contains("(a)") && v.text.contains("1 damaged"), "{}", v.text);
    // A folder: reading it once stopped the whole check as a store failure.
    std::fs::remove_file(&b).unwrap();
    std::fs::create_dir(&b).unwrap();
    let v = rao(&["verify", "p.yaml"], dir.path());
    assert_eq!(v.status.code(), Some(1), "{}", v.text);
    assert!(v.text.contains("(a)") && v.text.contains("(b)") && !v.text.contains("(c)"), "{}", v.text);
    assert!(v.text.contains("3 manifests") && v.text.contains("2 damaged"), "{}", v.text);
    // A link to a device that never ends: read no further than a first buffer.
    let c = output_dir(dir.path(), "c").join("v");
    std::fs::remove_file(&c).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &c).unwrap();
    let v = rao(&["verify", "p.yaml"], dir.path());
    assert!(v.text.contains("(c)") && v.text.contains("3 damaged"), "{}", v.text);
    let r = rao(&["verify", "p.yaml", "--repair"], dir.path());
    assert!(r.text.contains("3 damaged"), "{}", r.text);
    // Set aside: the next run computes them again, and all is well.
    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(o.status.success(), "{}", o.text);
    let v = rao(&["verify", "p.yaml"], dir.path());
    assert!(v.status.success(), "{}", v.text);
}

#[test]
fn what_a_finished_shell_command_left_running_cannot_change_its_published_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    // The command succeeds at once; what it left behind holds its output file open, to write
    // into it once it is published.
    pipeline(
        dir.path(),
        &format!(
            "  a: {{kind: shell, params: {{command: 'echo done > ${{outputs.o}}/v; (exec 3>>${{outputs.o}}/v; sleep 8; echo late >&3) >/dev/null 2>&1 & echo $! >> {p}'}}, outputs: [o]}}\n",
            p = pids.display()
        ),
    );
    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(o.status.success(), "{}", o.text);
    assert_all_gone(&wait_for_pids(&pids, 1), Duration::from_secs(5), "after the command ended");
    let v = rao(&["verify", "p.yaml"], dir.path());
    assert!(v.status.success() && v.text.contains("0 damaged"), "{}", v.text);
    assert_eq!(std::fs::read_to_string(output_dir(dir.path(), "a").join("v")).unwrap(), "done\n");
}
