//! What the store tests share: the a → b → c chain of `shell` stages (each logging that it ran),
//! run in a temporary folder, and where its objects are.

use std::path::{Path, PathBuf};

pub use super::{rao, text};

/// a → b → c, each logging its execution to `ran.log`.
pub fn chain(dir: &Path) -> PathBuf {
    let log = dir.join("ran.log");
    let stage = |name: &str, input: Option<&str>| {
        let (inputs, read) = match input {
            Some(i) => (format!(", inputs: {{i: {i}.o}}"), "cat ${inputs.i}/v > ${outputs.o}/v; ".to_string()),
            None => (String::new(), String::new()),
        };
        format!(
            "  {name}: {{kind: shell, params: {{command: 'echo {name} >> {log}; {read}seq 1 1000 >> ${{outputs.o}}/v; echo {name} >> ${{outputs.o}}/v'}}, outputs: [o]{inputs}}}\n",
            log = log.display()
        )
    };
    let p = dir.join("p.yaml");
    std::fs::write(&p, format!("name: p\nstages:\n{}{}{}", stage("a", None), stage("b", Some("a")), stage("c", Some("b")))).unwrap();
    p
}

/// A folder with the chain, run once.
pub fn chain_done() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    chain(dir.path());
    let run = rao(&["run", "p.yaml"], dir.path());
    assert!(run.status.success(), "{}", text(&run));
    dir
}

pub fn ran(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("ran.log")).unwrap_or_default()
}

/// Fingerprint of an instance, from `rao status --json`.
pub fn fingerprint(dir: &Path, instance: &str) -> String {
    let out = rao(&["status", "p.yaml", "--json"], dir);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    rows.as_array().unwrap().iter().find(|r| r["instance"] == instance).unwrap()["fingerprint"].as_str().unwrap().to_string()
}

/// Change stage c's command in the pipeline file; c's fingerprint before the change.
pub fn edit_c(dir: &Path) -> String {
    let old_c = fingerprint(dir, "c");
    let edited = std::fs::read_to_string(dir.join("p.yaml")).unwrap().replace("echo c >>", "echo c  >>");
    std::fs::write(dir.join("p.yaml"), edited).unwrap();
    old_c
}

/// Every file under `dir` (none if it does not exist).
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match e.path().is_dir() {
            true => files.extend(walk(&e.path())),
            false => files.push(e.path()),
        }
    }
    files
}

pub fn object_dir(dir: &Path, fp: &str) -> PathBuf {
    dir.join(".rao/store/objects").join(&fp[..2]).join(fp)
}

/// The one file of output `o` of an instance.
pub fn output_file(dir: &Path, fp: &str) -> PathBuf {
    let obj = object_dir(dir, fp);
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(obj.join("MANIFEST.json")).unwrap()).unwrap();
    obj.join(m["attempt"].as_str().unwrap()).join("o/v")
}

/// Fingerprint of an instance under `--set` values.
pub fn fingerprint_with(dir: &Path, instance: &str, sets: &[&str]) -> String {
    let mut args = vec!["status", "p.yaml", "--json"];
    for s in sets {
        args.extend(["--set", s]);
    }
    let out = rao(&args, dir);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    rows.as_array().unwrap().iter().find(|r| r["instance"] == instance).unwrap()["fingerprint"].as_str().unwrap().to_string()
}
