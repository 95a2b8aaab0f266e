//! Several `rao run` of one pipeline at once on one store (shared by the local and the S3 tests).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// 30 shell stages: a chain with a fan-in from half-way back at every step, so runs meet both
/// waiting for each other's stages and finding them done. Every execution appends its instance
/// name to `log`.
pub fn wide_pipeline(dir: &Path, log: &Path) -> PathBuf {
    let mut text = String::from("name: wide\nstages:\n");
    text.push_str(&format!(
        "  s0: {{kind: shell, params: {{command: 'echo s0 >> {log}; sleep 0.05; echo root > ${{outputs.o}}/f'}}, outputs: [o]}}\n",
        log = log.display()
    ));
    for i in 1..30 {
        text.push_str(&format!(
            "  s{i}: {{kind: shell, params: {{command: 'echo s{i} >> {log}; sleep 0.05; cat ${{inputs.a}}/f ${{inputs.b}}/f | cksum > ${{outputs.o}}/f; echo s{i} >> ${{outputs.o}}/f'}}, inputs: {{a: s{}.o, b: s{}.o}}, outputs: [o]}}\n",
            i - 1,
            (i - 1) / 2,
            log = log.display()
        ));
    }
    let p = dir.join("wide.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

/// instance → blake3 of every output file, read through the manifests `rao status --json` names.
pub fn outputs(status_json: &str, manifest: impl Fn(&str) -> serde_json::Value) -> BTreeMap<String, Vec<String>> {
    let rows: Vec<serde_json::Value> = serde_json::from_str(status_json).unwrap_or_else(|e| panic!("{e}: {status_json}"));
    rows.iter()
        .map(|r| {
            let fp = r["fingerprint"].as_str().unwrap_or_else(|| panic!("no fingerprint: {r}"));
            let m = manifest(fp);
            let hashes = m["outputs"]["o"].as_array().unwrap().iter().map(|f| f["blake3"].as_str().unwrap().to_string()).collect();
            (r["instance"].as_str().unwrap().to_string(), hashes)
        })
        .collect()
}

/// Start `n` runs at once (each from `cmd`), wait for all; every one must succeed.
pub fn run_together(n: usize, cmd: impl Fn() -> Command) {
    let children: Vec<_> = (0..n).map(|_| cmd().stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap()).collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "a concurrent run failed: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// Each of the 30 instances executed exactly once, whatever the number of runs.
pub fn assert_each_ran_once(log: &Path) {
    let ran = std::fs::read_to_string(log).unwrap();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for line in ran.lines() {
        *counts.entry(line).or_default() += 1;
    }
    assert_eq!(counts.len(), 30, "{counts:?}");
    let twice: Vec<_> = counts.iter().filter(|(_, c)| **c != 1).collect();
    assert!(twice.is_empty(), "executed more than once: {twice:?}");
}
