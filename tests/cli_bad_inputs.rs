//! A corpus of bad pipeline files (`tests/bad-pipelines/*.yaml`), each rejected by `rao validate`
//! with a located error that says what to fix — never a panic, a hang or unbounded memory.
//!
//! Each file starts with its expectation: `# expect: LINE:COLUMN TEXT` (or `# expect: - TEXT`
//! for problems that have no place in the file, such as a bad `--set`), then optional
//! `# set: PATH=VALUE` overrides and `# setup:` lines (`dir NAME`, `fifo NAME`, `base NAME`: a
//! valid pipeline for variants to extend).

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Address space a validation may use (the binary maps far more than it touches).
const MEMORY_LIMIT: u64 = 4 << 30;
const TIME_LIMIT: Duration = Duration::from_secs(20);

struct Case {
    file: PathBuf,
    position: Option<String>,
    text: String,
    sets: Vec<String>,
    setups: Vec<String>,
}

fn read_case(file: &Path) -> Case {
    let body = std::fs::read_to_string(file).unwrap();
    let mut case = Case { file: file.to_path_buf(), position: None, text: String::new(), sets: Vec::new(), setups: Vec::new() };
    for line in body.lines().take_while(|l| l.starts_with("# ")) {
        if let Some(e) = line.strip_prefix("# expect: ") {
            let (pos, text) = e.split_once(' ').unwrap_or((e, ""));
            case.position = (pos != "-").then(|| pos.to_string());
            case.text = text.to_string();
        } else if let Some(s) = line.strip_prefix("# set: ") {
            case.sets.push(s.to_string());
        } else if let Some(s) = line.strip_prefix("# setup: ") {
            case.setups.push(s.to_string());
        }
    }
    case
}

const BASE: &str = "name: base\nstages:\n  a: {kind: noop}\n";

/// Run `rao validate` on one case; `Err` says what was wrong with rao's answer.
fn check(case: &Case) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let name = case.file.file_name().unwrap().to_str().unwrap().to_string();
    std::fs::copy(&case.file, dir.path().join(&name)).unwrap();
    for s in &case.setups {
        let (what, arg) = s.split_once(' ').unwrap();
        let path = dir.path().join(arg);
        match what {
            "dir" => std::fs::create_dir(&path).unwrap(),
            "fifo" => {
                let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
                // SAFETY: a valid NUL-terminated path.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
            }
            "base" => std::fs::write(&path, BASE).unwrap(),
            other => panic!("unknown setup `{other}`"),
        }
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rao"));
    cmd.arg("validate").arg(&name).current_dir(dir.path()).env("RUST_BACKTRACE", "0").stdout(Stdio::piped()).stderr(Stdio::piped());
    for s in &case.sets {
        cmd.args(["--set", s]);
    }
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit { rlim_cur: MEMORY_LIMIT, rlim_max: MEMORY_LIMIT };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > TIME_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("hung (killed after {TIME_LIMIT:?})"));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    match status.code() {
        Some(2) => {}
        Some(0) => return Err("accepted".into()),
        Some(101) => return Err(format!("panicked:\n{err}")),
        other => return Err(format!("exit {other:?} (killed by a signal or out of memory?):\n{err}")),
    }
    let located = match &case.position {
        Some(pos) => format!("--> {name}:{pos}\n"),
        None => format!("--> {name}\n"),
    };
    if !err.contains(&located) {
        return Err(format!("expected `{}` in:\n{err}", located.trim()));
    }
    if !err.contains(&case.text) {
        return Err(format!("expected the text `{}` in:\n{err}", case.text));
    }
    if !err.contains("= help: ") {
        return Err(format!("no `= help:` saying what to fix:\n{err}"));
    }
    Ok(())
}

#[test]
fn every_bad_pipeline_is_rejected_at_its_place_without_panic_hang_or_unbounded_memory() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/bad-pipelines");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 100, "the corpus has {} files", files.len());
    let failures: Vec<String> = files
        .iter()
        .filter_map(|f| check(&read_case(f)).err().map(|e| format!("{}: {e}", f.file_name().unwrap().to_string_lossy())))
        .collect();
    assert!(failures.is_empty(), "{} of {} cases failed:\n\n{}", failures.len(), files.len(), failures.join("\n\n"));
}

#[test]
fn validate_reports_every_structural_problem_with_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let text = "\
name: three-problems
stages:
  a:
    kind: shell
    retrys: 2
    params: {command: \"echo a > ${outputs.o}/v\"}
    outputs: [o]
  l:
    loop: {max_iterations: 2}
    stages:
      b: {kind: noop, timeout: banana}
  c:
    kind: shell
    outptus: [o]
";
    std::fs::write(dir.path().join("p.yaml"), text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rao")).args(["validate", "p.yaml"]).current_dir(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for (place, words) in [("p.yaml:5:5", "unknown field `retrys`"), ("p.yaml:11:32", "banana"), ("p.yaml:14:5", "unknown field `outptus`")]
    {
        let at = err.find(&format!("--> {place}\n")).unwrap_or_else(|| panic!("no problem reported at {place}:\n{err}"));
        let message = err[..at].rfind("error: ").map(|i| &err[i..at]).unwrap();
        assert!(message.contains(words), "at {place} expected `{words}`, got `{message}`");
    }
    assert!(err.contains("3 problems in p.yaml"), "{err}");
}

/// A model folder that is not one rao loads is refused by `validate`, before anything runs, at
/// the `hf_model` stage, saying what is wrong with the folder: another family, no tokenizer, no
/// weights.
#[test]
fn validate_checks_a_local_model_folder_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-qwen3");
    let folder = |name: &str, keep: &[&str], config: Option<&str>| {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        for f in keep {
            std::fs::copy(models.join(f), d.join(f)).unwrap();
        }
        if let Some(c) = config {
            std::fs::write(d.join("config.json"), c).unwrap();
        }
    };
    let gpt2 = r#"{"model_type": "gpt2", "vocab_size": 50257, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}"#;
    folder("gpt2", &["tokenizer.json", "tokenizer_config.json"], Some(gpt2));
    folder("no-tokenizer", &["config.json", "model.safetensors"], None);
    folder("no-weights", &["config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"], None);
    for (name, says) in [
        ("gpt2", "model_type `gpt2` is not supported; rao loads `llama`, `qwen2` and `qwen3` models"),
        ("no-tokenizer", "no tokenizer.json"),
        ("no-weights", "no weights: neither model.safetensors nor model.safetensors.index.json"),
    ] {
        let p = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &p,
            format!("name: m\nstages:\n  files: {{kind: dataset, params: {{url: {name}}}}}\n  base: {{kind: hf_model, inputs: {{files: files.data}}}}\n"),
        )
        .unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_rao")).args(["validate", p.to_str().unwrap()]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{name}: validated");
        assert!(err.contains(&format!("stage `base`: the model folder `{name}` (dataset `files`)")) && err.contains(says), "{name}: {err}");
        assert!(err.contains(&format!("{name}.yaml:4:3")), "{name}: located at the stage: {err}");
    }
}
