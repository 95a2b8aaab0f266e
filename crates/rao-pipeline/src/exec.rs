//! Running one stage instance: retries, timeout, upload of outputs, manifest last.
//!
//! The scheduler's in-process executor and `rao exec` (a separate process) both come here,
//! with nothing but the compiled pipeline and the store: no scheduler memory is needed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::compile::Compiled;
use crate::events::{Event, Reporter};
use crate::fingerprint::FpParts;
use crate::kind::{InputArtifact, Registry, StageContext};
use crate::store::{FileEntry, Manifest, Store, manifest_key, output_prefix};

pub fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// The status-index entry: which fingerprint an instance name had last, and of what.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct IndexEntry {
    pub fingerprint: String,
    pub parts: FpParts,
}

pub fn index_key(pipeline: &str, instance: &str) -> String {
    let safe: String =
        instance.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '@' | '=' | ',') { c } else { '_' }).collect();
    format!("index/{pipeline}/{safe}.json")
}

/// Everything needed to run instance `i` once its inputs are done.
pub struct Job {
    pub instance: usize,
    pub parts: FpParts,
    pub fingerprint: String,
    pub inputs: BTreeMap<String, Vec<InputArtifact>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("timed out after {0:.1?}")]
    Timeout(Duration),
    #[error("{0:#}")]
    Failed(anyhow::Error),
}

/// Run a job to completion (with its retries) and write its manifest. Returns the manifest.
pub async fn execute(c: &Compiled, registry: &Registry, store: &Store, job: Job, reporter: &Reporter) -> Result<Manifest, ExecError> {
    let inst = &c.instances[job.instance];
    let kind = registry
        .get(&inst.kind)
        .ok_or_else(|| ExecError::Failed(anyhow::anyhow!("stage kind `{}` is not registered in this binary", inst.kind)))?
        .clone();
    let started_at = now_secs();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        reporter.emit(Event::Started { instance: inst.name.clone(), fingerprint: job.fingerprint.clone(), attempt });
        let staging = staging_dir(store, &job.fingerprint, attempt);
        let scratch = std::env::temp_dir().join(format!("rao-scratch-{}-{}-{attempt}", std::process::id(), job.fingerprint));
        let remove_staged = || inst.outputs.iter().for_each(|o| _ = std::fs::remove_dir_all(staged_output(&staging, o)));
        remove_staged();
        let metrics = Arc::new(Mutex::new(BTreeMap::new()));
        let ctx = StageContext {
            pipeline: c.name.clone(),
            instance: inst.name.clone(),
            fingerprint: job.fingerprint.clone(),
            seed: inst.seed,
            params: inst.params.clone(),
            fingerprint_extra: inst.extra.clone(),
            base_dir: c.base_dir.clone(),
            inputs: job.inputs.clone(),
            outputs: inst.outputs.clone(),
            store: store.clone(),
            scratch: scratch.clone(),
            staging: staging.clone(),
            metrics: metrics.clone(),
        };
        let fut = kind.run(ctx);
        let result = match inst.timeout {
            Some(t) => match tokio::time::timeout(t, fut).await {
                Ok(r) => r.map_err(ExecError::Failed),
                Err(_) => Err(ExecError::Timeout(t)),
            },
            None => fut.await.map_err(ExecError::Failed),
        };
        let result = match result {
            Ok(()) => {
                publish(c, store, &job, inst.outputs.as_slice(), &staging, metrics, started_at, attempt).await.map_err(ExecError::Failed)
            }
            Err(e) => Err(e),
        };
        remove_staged();
        let _ = std::fs::remove_dir_all(&scratch);
        match result {
            Ok(m) => return Ok(m),
            Err(e) if attempt <= inst.retries => {
                let delay = (0.2 * 2f64.powi(attempt as i32 - 1)).min(10.0);
                reporter.emit(Event::Retrying { instance: inst.name.clone(), attempt, error: e.to_string(), delay_s: delay });
                tokio::time::sleep(Duration::from_secs_f64(delay)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Where a stage writes output `name` before it is published: a sibling of the other outputs'
/// (no parent directory to create and delete: new inodes are most of a small stage's cost).
pub fn staged_output(staging: &Path, name: &str) -> PathBuf {
    let mut path = staging.as_os_str().to_owned();
    path.push(".");
    path.push(name);
    PathBuf::from(path)
}

fn staging_dir(store: &Store, fp: &str, attempt: u32) -> PathBuf {
    let name = format!("{fp}.{}.{attempt}", std::process::id());
    match store.local_root() {
        // Same filesystem as the objects: publishing is a rename.
        Some(root) => root.join("staging").join(name),
        None => std::env::temp_dir().join("rao-staging").join(name),
    }
}

/// Move staged outputs into the store, then write the manifest (last: it is what "done" means).
#[allow(clippy::too_many_arguments)]
async fn publish(
    c: &Compiled,
    store: &Store,
    job: &Job,
    outputs: &[String],
    staging: &Path,
    metrics: Arc<Mutex<BTreeMap<String, f64>>>,
    started_at: f64,
    attempts: u32,
) -> anyhow::Result<Manifest> {
    let mut files_by_output = BTreeMap::new();
    for out in outputs {
        let prefix = output_prefix(&job.fingerprint, out);
        let dir = staged_output(staging, out);
        let target = store.local_path(&prefix);
        // Leftovers of a killed attempt are never trusted: start clean.
        match &target {
            Some(t) => _ = std::fs::remove_dir_all(t),
            None => store.delete_prefix(&prefix).await?,
        }
        let mut entries = Vec::new();
        for rel in walk_files(&dir)? {
            let bytes = std::fs::read(dir.join(&rel))?;
            entries.push(FileEntry { path: rel.clone(), size: bytes.len() as u64, blake3: blake3::hash(&bytes).to_hex().to_string() });
            if target.is_none() {
                store.put(&format!("{prefix}/{rel}"), Bytes::from(bytes)).await?;
            }
        }
        // A local store takes the whole directory in one rename (same filesystem).
        if let (Some(t), false) = (&target, entries.is_empty()) {
            std::fs::create_dir_all(t.parent().unwrap())?;
            std::fs::rename(&dir, t)?;
        }
        files_by_output.insert(out.clone(), entries);
    }
    let inst = &c.instances[job.instance];
    let manifest = Manifest {
        fingerprint: job.fingerprint.clone(),
        kind: inst.kind.clone(),
        kind_version: inst.kind_version,
        instance: inst.name.clone(),
        pipeline: c.name.clone(),
        outputs: files_by_output,
        metrics: metrics.lock().unwrap().clone(),
        started_at,
        finished_at: now_secs(),
        attempts,
    };
    store.put_json(&manifest_key(&job.fingerprint), &manifest).await?;
    store.put_json(&index_key(&c.name, &inst.name), &IndexEntry { fingerprint: job.fingerprint.clone(), parts: job.parts.clone() }).await?;
    Ok(manifest)
}

/// Relative paths of all files under `dir` (sorted; empty if it does not exist).
fn walk_files(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    if !dir.exists() {
        return Ok(out);
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let p = e.path();
            if e.file_type()?.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().replace('\\', "/");
                out.push(rel);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Input artifacts of instance `i`, from the manifests of its producers.
pub fn input_artifacts(
    c: &Compiled,
    i: usize,
    loop_exit: impl Fn(usize) -> Option<u32>,
    manifest: impl Fn(usize) -> Option<Manifest>,
) -> Option<BTreeMap<String, Vec<InputArtifact>>> {
    let mut out = BTreeMap::new();
    for (name, sources) in &c.instances[i].inputs {
        let mut v = Vec::new();
        for (producer, output) in c.resolve_sources(sources, &loop_exit)? {
            let m = manifest(producer)?;
            v.push(InputArtifact {
                instance: c.instances[producer].name.clone(),
                fingerprint: m.fingerprint.clone(),
                files: m.outputs.get(&output).cloned().unwrap_or_default(),
                output,
            });
        }
        out.insert(name.clone(), v);
    }
    Some(out)
}

/// The arguments of `rao exec` for one instance (after the program name), with absolute paths so
/// the command works from any directory and on any node that sees the same files and store.
pub fn exec_args(c: &Compiled, instance: &str, store: &Store) -> Vec<String> {
    let file = std::fs::canonicalize(&c.file).unwrap_or_else(|_| c.file.clone());
    let store = store.local_root().map(|r| r.display().to_string()).unwrap_or_else(|| store.url().to_string());
    let mut args = vec!["exec".to_string(), file.display().to_string(), instance.to_string(), "--store".into(), store, "--quiet".into()];
    for o in &c.overrides {
        args.extend(["--set".to_string(), o.clone()]);
    }
    args
}

/// `rao exec`: run one instance by name, reading everything it needs from the store.
/// Fails if an input is not done; a done instance is not run again.
pub async fn execute_by_name(
    c: &Compiled,
    registry: &Registry,
    store: &Store,
    name: &str,
    reporter: &Reporter,
) -> anyhow::Result<Manifest> {
    let i = c.instance_index(name).ok_or_else(|| {
        let names: Vec<&str> = c.instances.iter().map(|x| x.name.as_str()).collect();
        anyhow::anyhow!(
            "no instance `{name}` in pipeline `{}`{}",
            c.name,
            crate::diag::did_you_mean(name, names.iter().copied()).map(|h| format!("; {h}")).unwrap_or_default()
        )
    })?;
    let snap = crate::snapshot::snapshot(c, store).await?;
    if let Some(m) = &snap.manifests[i] {
        return Ok(m.clone());
    }
    let parts = snap.parts[i].clone().ok_or_else(|| anyhow::anyhow!("`{name}` depends on a loop that has not finished"))?;
    let inputs = input_artifacts(c, i, |l| snap.loop_exit[l], |j| snap.manifests[j].clone()).ok_or_else(|| {
        let missing: Vec<&str> = c.predecessors(i).filter(|&j| snap.manifests[j].is_none()).map(|j| c.instances[j].name.as_str()).collect();
        anyhow::anyhow!("`{name}` cannot run yet: inputs not done: {}", missing.join(", "))
    })?;
    let fingerprint = parts.fingerprint();
    Ok(execute(c, registry, store, Job { instance: i, parts, fingerprint, inputs }, reporter).await?)
}
