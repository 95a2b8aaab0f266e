//! Run records: `runs/<pipeline>/<run>.json`, written before a run starts its first instance,
//! every half minute while it goes (a heartbeat) and when it ends; a run that only finds cached
//! results writes it once, at its end. A run killed with `kill -9` cannot write its end; the
//! next run of the pipeline (or `rao gc`) finds its marker under `active/`, sees the heartbeat
//! stop or the process gone, and records it as interrupted.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::exec::now_secs;
use crate::layout::{check_component, run_record_key};
use crate::lease::recorded_process_is_gone;
use crate::store::{Store, StoreResult};

/// A run whose heartbeat is older than this is taken for dead (it beats every 30 s).
pub const HEARTBEAT_GRACE_S: f64 = 300.0;
pub const HEARTBEAT_EVERY_S: f64 = 30.0;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Succeeded,
    Failed,
    Cancelled,
    /// Killed or crashed: it stopped without recording an end.
    Interrupted,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Interrupted => "interrupted",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum InstanceStatus {
    Pending,
    Done,
    Cached,
    Failed,
    Skipped,
    Cancelled,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InstanceRecord {
    pub name: String,
    pub stage: String,
    pub kind: String,
    pub status: InstanceStatus,
    pub fingerprint: Option<String>,
    pub reason: Option<String>,
    pub started_at: Option<f64>,
    pub finished_at: Option<f64>,
    pub attempts: u32,
    pub metrics: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: String,
    pub pipeline: String,
    pub file: String,
    pub store: String,
    pub executor: String,
    /// `--set` overrides as given, with the values of secret-looking keys redacted.
    pub overrides: Vec<String>,
    /// The pipeline as resolved; written redacted (`secrets::Redacted`), so a record read back
    /// holds the redacted values.
    pub resolved: rao_plan::resolved::RecordedPipeline,
    /// What `RunOptions::code_version` said (reports show which code measured what).
    #[serde(default)]
    pub code_version: String,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub pid: u32,
    /// The run's PID namespace (see `lease::pid_space`; absent in records of older versions).
    #[serde(default)]
    pub pid_space: String,
    pub started_at: f64,
    #[serde(default)]
    pub heartbeat_at: f64,
    pub finished_at: Option<f64>,
    pub status: RunStatus,
    pub instances: Vec<InstanceRecord>,
}

impl RunRecord {
    pub fn key(&self) -> String {
        run_record_key(&self.pipeline, &self.run_id)
    }

    pub fn failures(&self) -> Vec<(&str, &str)> {
        self.instances
            .iter()
            .filter(|r| r.status == InstanceStatus::Failed)
            .map(|r| (r.name.as_str(), r.reason.as_deref().unwrap_or("")))
            .collect()
    }

    /// `Running` as recorded, unless the run is known to be gone.
    pub fn effective_status(&self) -> RunStatus {
        let gone = recorded_process_is_gone(&self.host, &self.pid_space, self.pid)
            || self.heartbeat_at.max(self.started_at) + HEARTBEAT_GRACE_S < now_secs();
        if self.status == RunStatus::Running && gone { RunStatus::Interrupted } else { self.status }
    }
}

pub fn active_key(pipeline: &str, run_id: &str) -> String {
    format!("active/{pipeline}/{run_id}")
}

/// Read a run record by id (`latest`: the last one written); the id is checked first, so
/// `--run ../../x` cannot reach outside `runs/`.
pub async fn read(store: &Store, pipeline: &str, run_id: &str) -> anyhow::Result<Option<RunRecord>> {
    check_component("run id", run_id)
        .map_err(|e| anyhow::anyhow!("{e}: run ids look like 20261130T120000Z-4242 (see `runs/{pipeline}/` in the store)"))?;
    check_component("pipeline name", pipeline).map_err(|e| anyhow::anyhow!(e))?;
    match store.get_json::<RunRecord>(&run_record_key(pipeline, run_id)).await {
        // Its ids name files (a report page, the record itself): only as a key would name them.
        Ok(Some(r)) if check_component("run id", &r.run_id).is_err() || r.pipeline != pipeline => Err(anyhow::anyhow!(
            "the run record `{}` names run `{}` of pipeline `{}`, not a run of `{pipeline}` (was the store tampered with?)",
            run_record_key(pipeline, run_id),
            r.run_id.escape_debug(),
            r.pipeline.escape_debug()
        )),
        Ok(r) => Ok(r),
        Err(e) => Err(anyhow::anyhow!("{e}")),
    }
}

/// Record as interrupted every run of `pipeline` that is marked active but is gone. Returns
/// their ids.
pub async fn close_interrupted(store: &Store, pipeline: &str) -> StoreResult<Vec<String>> {
    let prefix = format!("active/{pipeline}/");
    let mut closed = Vec::new();
    for (key, _) in store.list(&prefix).await? {
        let Some(run_id) = key.strip_prefix(&prefix) else { continue };
        if check_component("run id", run_id).is_err() {
            store.delete(&key).await?;
            continue;
        }
        let record = store.get_json::<RunRecord>(&run_record_key(pipeline, run_id)).await.ok().flatten();
        match record {
            Some(mut r) if r.effective_status() == RunStatus::Interrupted => {
                // Written back where it was read, whatever ids its contents claim.
                (r.pipeline, r.run_id) = (pipeline.to_string(), run_id.to_string());
                r.status = RunStatus::Interrupted;
                r.finished_at = Some(r.heartbeat_at.max(r.started_at));
                for i in r.instances.iter_mut().filter(|i| i.status == InstanceStatus::Pending) {
                    i.status = InstanceStatus::Cancelled;
                    i.reason = Some("the run was interrupted".into());
                }
                store.put_json(&r.key(), &r).await?;
                store.delete(&key).await?;
                closed.push(run_id.to_string());
            }
            Some(r) if r.status == RunStatus::Running => {}
            // Finished (its end was written but not the marker's removal), or no record at all.
            _ => {
                store.delete(&key).await?;
            }
        }
    }
    Ok(closed)
}

/// Fingerprints of every instance that a run still going (on any machine) has met so far, from
/// the records of the runs marked active: what `rao gc` must keep whatever pipelines it is given
/// (such a run may use `--set` values, or a file edited since). A record that cannot be read
/// adds nothing.
pub async fn live_fingerprints(store: &Store) -> StoreResult<std::collections::BTreeSet<String>> {
    let mut fps = std::collections::BTreeSet::new();
    for (key, _) in store.list("active/").await? {
        let mut parts = key.split('/').skip(1);
        let (Some(pipeline), Some(run_id)) = (parts.next(), parts.next()) else { continue };
        if let Ok(Some(r)) = read(store, pipeline, run_id).await
            && r.effective_status() == RunStatus::Running
        {
            fps.extend(r.instances.into_iter().filter_map(|i| i.fingerprint));
        }
    }
    Ok(fps)
}

/// What the newest recorded runs of a pipeline used ([`newest_runs_fingerprints`]).
pub struct NewestRuns {
    pub fingerprints: std::collections::BTreeSet<String>,
    /// The `--set` lists (as recorded, credentials redacted) of the runs that had any.
    pub with_overrides: Vec<Vec<String>>,
    /// A record that is there but cannot be read (damaged, or written by a newer rao): which
    /// results it names is unknown, so nothing of this pipeline may be taken for garbage.
    pub unreadable: Option<String>,
}

/// What the newest recorded runs of `pipeline` used, one run for each list of `--set` values it
/// was run with (and the newest that succeeded, where a later one of the same values did not):
/// `rao gc P` keeps it, so that results made with `--set seed=2` are not garbage because the
/// file alone names seed 1. A store that fails to answer is an error (gc stops).
pub async fn newest_runs_fingerprints(store: &Store, pipeline: &str) -> StoreResult<NewestRuns> {
    use std::collections::BTreeMap;
    // Per list of overrides: the newest run, and the newest that succeeded.
    let mut newest: BTreeMap<Vec<String>, (Option<RunRecord>, Option<RunRecord>)> = BTreeMap::new();
    let newer = |slot: &Option<RunRecord>, r: &RunRecord| slot.as_ref().is_none_or(|o| r.started_at > o.started_at);
    for (key, _) in store.list(&format!("runs/{pipeline}/")).await? {
        if key.ends_with("/latest.json") {
            continue;
        }
        let r = match store.get_json::<RunRecord>(&key).await {
            Ok(Some(r)) => r,
            // Removed since the listing (another gc, a person): it names nothing any more.
            Ok(None) | Err(crate::store::StoreError::NotFound { .. }) => continue,
            Err(crate::store::StoreError::Json { .. }) => {
                return Ok(NewestRuns { fingerprints: Default::default(), with_overrides: Vec::new(), unreadable: Some(key) });
            }
            Err(e) => return Err(e),
        };
        let slots = newest.entry(r.overrides.clone()).or_default();
        if r.status == RunStatus::Succeeded && newer(&slots.1, &r) {
            slots.1 = Some(r.clone());
        }
        if newer(&slots.0, &r) {
            slots.0 = Some(r);
        }
    }
    let mut fps = std::collections::BTreeSet::new();
    for r in newest.values().flat_map(|(a, b)| [a, b]).flatten() {
        let used = r.instances.iter().filter(|i| matches!(i.status, InstanceStatus::Done | InstanceStatus::Cached));
        fps.extend(used.filter_map(|i| i.fingerprint.clone()));
    }
    let with_overrides = newest.into_keys().filter(|o| !o.is_empty()).collect();
    Ok(NewestRuns { fingerprints: fps, with_overrides, unreadable: None })
}
