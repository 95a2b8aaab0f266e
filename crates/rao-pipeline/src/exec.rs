//! Running one stage instance: the lease, retries, timeout, publication with the manifest last.
//!
//! The scheduler's in-process executor and `rao exec` (a separate process) both come here,
//! with nothing but the compiled pipeline and the store: no scheduler memory is needed.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use futures::FutureExt;
use tokio_util::sync::CancellationToken;

use crate::InputArtifact;
use crate::compile::Compiled;
use crate::events::{Event, Reporter};
use crate::fingerprint::FpParts;
use crate::integrity::InputDamaged;
use crate::kind::StageContext;
use crate::lease::{self, Acquired};
use crate::manifest::{self, Manifest, ManifestState};
use crate::publish::{self, Published};
use crate::registry::Registry;
use crate::store::Store;

pub use crate::clock::now_secs;

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
    /// The run this job belongs to (recorded in the manifest and the lease).
    pub run_id: String,
    /// `--force`: recompute even if done; only a manifest finished after this time is reused.
    pub forced_at: Option<f64>,
    /// Cancelled when the run is (Ctrl-C): the stage stops at its next await, cleans up and the
    /// job ends with `ExecError::Cancelled`.
    pub cancel: CancellationToken,
}

/// How a job ended well.
#[derive(Debug, Clone)]
pub struct Finished {
    pub manifest: Manifest,
    /// Another run (or process) produced it while this one waited for its lease.
    pub reused: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("timed out after {0:.1?}")]
    Timeout(Duration),
    #[error("cancelled")]
    Cancelled,
    /// The stage failed because an input's bytes are not what its manifest says.
    #[error("{0}")]
    InputDamaged(InputDamaged),
    #[error("{0:#}")]
    Failed(anyhow::Error),
}

impl ExecError {
    /// A stage's own error, classified once here: a damaged input (which the executor repairs)
    /// or any other failure.
    fn of_stage(e: anyhow::Error) -> ExecError {
        match e.downcast::<InputDamaged>() {
            Ok(damaged) => ExecError::InputDamaged(damaged),
            Err(e) => ExecError::Failed(e),
        }
    }
}

/// A manifest of `fp` that can be reused as it is: checked, every file present with its size, and
/// for a forced job finished after the force.
pub async fn reusable(store: &Store, fp: &str, forced_at: Option<f64>) -> anyhow::Result<Option<Manifest>> {
    let Some(m) = manifest::read(store, fp).await?.done() else { return Ok(None) };
    if forced_at.is_some_and(|t| m.finished_at < t) {
        return Ok(None);
    }
    Ok(manifest::check_sizes(store, &m).await?.is_ok().then_some(m))
}

/// Wait until this process holds the lease of the job's fingerprint, or until another run has
/// published it (then its manifest is the answer).
async fn lease_or_reuse(store: &Store, job: &Job, name: &str, reporter: &Reporter) -> anyhow::Result<Result<lease::LeaseGuard, Manifest>> {
    let mut delay = Duration::from_millis(20);
    let mut announced = false;
    loop {
        match lease::try_acquire(store, &job.fingerprint, &job.run_id, name).await? {
            Acquired::Held(guard) => {
                // Checked under the lease: another run may have published it since the caller's
                // cache check (or while this one waited).
                if let Some(m) = reusable(store, &job.fingerprint, job.forced_at).await? {
                    guard.release().await;
                    return Ok(Err(m));
                }
                return Ok(Ok(guard));
            }
            Acquired::Busy(holder) => {
                if !announced {
                    announced = true;
                    reporter.emit(Event::Waiting {
                        instance: name.to_string(),
                        holder: format!("run {} (process {} on {})", holder.run_id, holder.pid, holder.host),
                    });
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1)).min(lease::ttl() / 4);
                if let Some(m) = reusable(store, &job.fingerprint, job.forced_at).await? {
                    return Ok(Err(m));
                }
            }
        }
    }
}

/// Run a job to completion (with its retries) and write its manifest — unless another run
/// finishes it first, then that run's manifest is returned.
pub async fn execute(c: &Compiled, registry: &Registry, store: &Store, job: Job, reporter: &Reporter) -> Result<Finished, ExecError> {
    let inst = &c.instances[job.instance];
    let kind = registry
        .get(&inst.kind)
        .ok_or_else(|| ExecError::Failed(anyhow::anyhow!("stage kind `{}` is not registered in this binary", inst.kind)))?
        .clone();
    let leased = job.cancel.run_until_cancelled(lease_or_reuse(store, &job, &inst.name, reporter)).await;
    let guard = match leased.ok_or(ExecError::Cancelled)?.map_err(ExecError::Failed)? {
        Ok(guard) => guard,
        Err(manifest) => return Ok(Finished { manifest, reused: true }),
    };
    let mut job = job;
    let result = run_attempts(c, registry, &kind, store, &mut job, reporter).await;
    guard.release().await;
    result
}

async fn run_attempts(
    c: &Compiled,
    registry: &Registry,
    kind: &Arc<dyn crate::kind::StageKind>,
    store: &Store,
    job: &mut Job,
    reporter: &Reporter,
) -> Result<Finished, ExecError> {
    let inst = &c.instances[job.instance];
    let started_at = now_secs();
    let mut attempt = 0u32;
    let mut repairs = 0u32;
    loop {
        attempt += 1;
        reporter.emit(Event::Started { instance: inst.name.clone(), fingerprint: job.fingerprint.clone(), attempt });
        let staging = crate::staging::staging_dir(store, &job.fingerprint, attempt);
        let scratch = std::env::temp_dir().join(format!("rao-scratch-{}-{}-{attempt}", std::process::id(), job.fingerprint));
        let remove_staged = || inst.outputs.iter().for_each(|o| _ = std::fs::remove_dir_all(crate::staging::staged_output(&staging, o)));
        remove_staged();
        let recorded = Arc::new(Mutex::new(crate::kind::Recorded::default()));
        // `${env.NAME}` values enter here, at run time only: never the fingerprint or a record.
        let params = crate::secrets::fill_env(&inst.params).map_err(|e| ExecError::Failed(anyhow::anyhow!(e)))?;
        let ctx = StageContext {
            pipeline: c.name.clone(),
            instance: inst.name.clone(),
            fingerprint: job.fingerprint.clone(),
            seed: inst.seed,
            params,
            fingerprint_extra: inst.extra.clone(),
            base_dir: c.base_dir.clone(),
            inputs: job.inputs.clone(),
            outputs: inst.outputs.clone(),
            store: store.clone(),
            scratch: scratch.clone(),
            staging: staging.clone(),
            recorded: recorded.clone(),
            progress: crate::progress::StageProgress::new(&inst.name, reporter.clone()),
            cancel: job.cancel.clone(),
        };
        // A panicking stage fails alone: its siblings and the run go on. Cancelled, the stage's
        // future is dropped at its next await; the cleanup below still runs.
        let stage = std::panic::AssertUnwindSafe(kind.run(ctx)).catch_unwind();
        let cancel = job.cancel.clone();
        let fut = async move {
            match cancel.run_until_cancelled_owned(stage).await {
                Some(Ok(r)) => r,
                Some(Err(panic)) => Err(anyhow::anyhow!("the stage panicked: {}", panic_text(&panic))),
                None => Err(anyhow::anyhow!("cancelled")),
            }
        };
        let result = match inst.timeout {
            Some(t) => match tokio::time::timeout(t, fut).await {
                Ok(r) => r.map_err(ExecError::of_stage),
                Err(_) => Err(ExecError::Timeout(t)),
            },
            None => fut.await.map_err(ExecError::of_stage),
        };
        // A stage that ended well is published even if Ctrl-C came meanwhile; one that failed
        // then is cancelled (not retried).
        let result = match result {
            Err(_) if job.cancel.is_cancelled() => Err(ExecError::Cancelled),
            r => r,
        };
        let result = match result {
            Ok(()) => publish::publish(c, store, job, &staging, recorded, started_at, attempt).await.map_err(ExecError::Failed),
            Err(e) => Err(e),
        };
        remove_staged();
        let _ = std::fs::remove_dir_all(&scratch);
        match result {
            Ok(Published { manifest, ours }) => {
                // Progress of earlier attempts is not needed once the result is published.
                let _ = store.delete_prefix(&format!("{}/", crate::layout::progress_prefix(&job.fingerprint))).await;
                return Ok(Finished { manifest, reused: !ours });
            }
            // A damaged input is set aside and recomputed, then the stage starts over (this is
            // not one of its retries). Bounded: a producer that keeps writing bad bytes fails.
            Err(ExecError::InputDamaged(damaged)) if repairs < 3 => {
                repairs += 1;
                attempt -= 1;
                reporter.emit(Event::Damaged {
                    instance: damaged.producer.clone(),
                    fingerprint: damaged.fingerprint.clone(),
                    why: damaged.to_string(),
                });
                repair_input(c, registry, store, job, &damaged, reporter).await.map_err(ExecError::Failed)?;
            }
            // Saved progress stays: the next run resumes from it.
            Err(ExecError::Cancelled) => return Err(ExecError::Cancelled),
            Err(e) if attempt <= inst.retries => {
                let delay = (0.2 * 2f64.powi(attempt as i32 - 1)).min(10.0);
                let error = crate::secrets::redact(&e.to_string());
                reporter.emit(Event::Retrying { instance: inst.name.clone(), attempt, error, delay_s: delay });
                if job.cancel.run_until_cancelled(tokio::time::sleep(Duration::from_secs_f64(delay))).await.is_none() {
                    return Err(ExecError::Cancelled);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Set the damaged artifact's manifest aside, get a good one (recomputed here, or published
/// meanwhile by another run) and point the job's inputs at it.
async fn repair_input(
    c: &Compiled,
    registry: &Registry,
    store: &Store,
    job: &mut Job,
    damaged: &InputDamaged,
    reporter: &Reporter,
) -> anyhow::Result<()> {
    // Only the manifest that pointed at the damaged files goes; a newer one is used as it is. A
    // damaged one (a folder in its place included) goes too: it is no answer either.
    let (state, bytes) = manifest::read_raw(store, &damaged.fingerprint).await?;
    let stale = match state {
        ManifestState::Done(m) => m.attempt == damaged.attempt,
        ManifestState::Damaged { .. } => true,
        ManifestState::Missing => false,
    };
    if stale {
        manifest::quarantine(store, &damaged.fingerprint, &bytes).await?;
    }
    let fresh = Box::pin(execute_by_name(c, registry, store, &damaged.producer, &job.run_id, reporter, job.cancel.clone())).await?;
    for artifacts in job.inputs.values_mut() {
        for a in artifacts.iter_mut().filter(|a| a.fingerprint == damaged.fingerprint) {
            a.attempt = fresh.attempt.clone();
            a.files = fresh.outputs.get(&a.output).cloned().unwrap_or_default();
        }
    }
    Ok(())
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
                attempt: m.attempt.clone(),
                files: m.outputs.get(&output).cloned().unwrap_or_default(),
                output,
                params: c.instances[producer].params.clone(),
            });
        }
        out.insert(name.clone(), v);
    }
    Some(out)
}

/// What `rao exec` writes as it runs: nothing (a cluster's job logs), or its events as JSON
/// lines on stdout (for a parent `rao run` to show the stage's progress).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecOutput {
    Quiet,
    JsonEvents,
}

/// The arguments of `rao exec` for one instance (after the program name), with absolute paths so
/// the command works from any directory and on any node that sees the same files and store.
pub fn exec_args(c: &Compiled, instance: &str, store: &Store, run_id: &str, output: ExecOutput) -> Vec<String> {
    let file = std::fs::canonicalize(&c.file).unwrap_or_else(|_| c.file.clone());
    let store = store.local_root().map(|r| r.display().to_string()).unwrap_or_else(|| store.url().to_string());
    let flag = match output {
        ExecOutput::Quiet => "--quiet",
        ExecOutput::JsonEvents => "--json",
    };
    let mut args = vec!["exec".to_string(), file.display().to_string(), instance.to_string(), "--store".into(), store, flag.into()];
    args.extend(["--run-id".to_string(), run_id.to_string()]);
    // With a credential among them, the overrides go by the environment ([`exec_env`]): a
    // command line is readable by every user of the machine (`ps`).
    if !c.overrides.iter().any(|o| crate::secrets::sets_secret(o)) {
        for o in &c.overrides {
            args.extend(["--set".to_string(), o.clone()]);
        }
    }
    args
}

/// The variable `rao exec` reads `--set` entries from, one per line, after its own.
pub const SET_VAR: &str = "RAO_EXEC_SET";

/// The environment `rao exec` needs besides [`exec_args`]: the overrides, when one of them is a
/// credential.
pub fn exec_env(c: &Compiled) -> Vec<(String, String)> {
    match c.overrides.iter().any(|o| crate::secrets::sets_secret(o)) {
        true => vec![(SET_VAR.to_string(), c.overrides.join("\n"))],
        false => Vec::new(),
    }
}

/// `rao exec`: run one instance by name, reading everything it needs from the store.
/// Fails if an input is not done; a done instance is not run again. Cancelled through `cancel`,
/// it ends with `ExecError::Cancelled`.
pub async fn execute_by_name(
    c: &Compiled,
    registry: &Registry,
    store: &Store,
    name: &str,
    run_id: &str,
    reporter: &Reporter,
    cancel: CancellationToken,
) -> Result<Manifest, ExecError> {
    let (i, resolved) = resolve_by_name(c, store, name).await.map_err(ExecError::Failed)?;
    let (parts, inputs) = match resolved {
        Resolved::Done { manifest, .. } => return Ok(manifest),
        Resolved::Ready { parts, inputs } => (parts, inputs),
    };
    let fingerprint = parts.fingerprint();
    let job = Job { instance: i, parts, fingerprint, inputs, run_id: run_id.to_string(), forced_at: None, cancel };
    Ok(execute(c, registry, store, job, reporter).await?.manifest)
}

/// An instance found by name: done already (with the inputs it ran with, if they are still in the
/// store), or with every input done.
enum Resolved {
    Done { manifest: Manifest, inputs: Option<BTreeMap<String, Vec<InputArtifact>>> },
    Ready { parts: FpParts, inputs: BTreeMap<String, Vec<InputArtifact>> },
}

async fn resolve_by_name(c: &Compiled, store: &Store, name: &str) -> anyhow::Result<(usize, Resolved)> {
    let i = c.instance_index(name).ok_or_else(|| {
        let names: Vec<&str> = c.instances.iter().map(|x| x.name.as_str()).collect();
        anyhow::anyhow!(
            "no instance `{name}` in pipeline `{}`{}",
            c.name,
            crate::diag::did_you_mean(name, names.iter().copied()).map(|h| format!("; {h}")).unwrap_or_default()
        )
    })?;
    let snap = crate::snapshot::snapshot(c, store).await?;
    let inputs = input_artifacts(c, i, |l| snap.loop_exit[l], |j| snap.manifests[j].clone());
    if let Some(m) = &snap.manifests[i] {
        return Ok((i, Resolved::Done { manifest: m.clone(), inputs }));
    }
    let parts = snap.parts[i].clone().ok_or_else(|| anyhow::anyhow!("`{name}` depends on a loop that has not finished"))?;
    let inputs = inputs.ok_or_else(|| {
        let missing: Vec<&str> = c.predecessors(i).filter(|&j| snap.manifests[j].is_none()).map(|j| c.instances[j].name.as_str()).collect();
        anyhow::anyhow!("`{name}` cannot run yet: inputs not done: {}", missing.join(", "))
    })?;
    Ok((i, Resolved::Ready { parts, inputs }))
}

/// The context an instance would run with — its params and its inputs in the store — for a
/// command that reads those inputs without running the stage (`rao serve`). Its inputs must be
/// done; nothing is written.
pub async fn context_by_name(c: &Compiled, store: &Store, name: &str) -> anyhow::Result<StageContext> {
    let (i, resolved) = resolve_by_name(c, store, name).await?;
    let inst = &c.instances[i];
    let (fingerprint, inputs) = match resolved {
        Resolved::Ready { parts, inputs } => (parts.fingerprint(), inputs),
        Resolved::Done { manifest, inputs } => {
            (manifest.fingerprint, inputs.ok_or_else(|| anyhow::anyhow!("the inputs of `{name}` are no longer in the store"))?)
        }
    };
    Ok(StageContext {
        pipeline: c.name.clone(),
        instance: inst.name.clone(),
        fingerprint: fingerprint.clone(),
        seed: inst.seed,
        params: crate::secrets::fill_env(&inst.params).map_err(|e| anyhow::anyhow!(e))?,
        fingerprint_extra: inst.extra.clone(),
        base_dir: c.base_dir.clone(),
        inputs,
        outputs: vec![],
        store: store.clone(),
        scratch: std::env::temp_dir().join(format!("rao-read-{}-{fingerprint}", std::process::id())),
        staging: std::env::temp_dir().join(format!("rao-read-{}-{fingerprint}-staging", std::process::id())),
        recorded: Arc::default(),
        progress: crate::progress::StageProgress::new(&inst.name, Reporter::silent()),
        cancel: CancellationToken::new(),
    })
}
