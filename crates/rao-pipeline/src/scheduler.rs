//! The scheduler: runs ready instances concurrently (up to --jobs and the resource limits),
//! skips what the store already has, stops dependents of failures, and writes the run record.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Serialize;
use tokio::task::JoinSet;

use crate::compile::{Compiled, Source};
use crate::events::{Event, Reporter};
use crate::exec::{self, Job, now_secs};
use crate::kind::Registry;
use crate::store::{Manifest, Store, manifest_key};

/// Something that can run a job: in this process, as a child process, or on a cluster.
pub trait Executor: Send + Sync {
    fn name(&self) -> &'static str;
    fn execute(&self, c: Arc<Compiled>, job: Job) -> BoxFuture<'static, Result<Manifest, String>>;
}

/// Runs stages inside the scheduler's process.
pub struct InProcess {
    pub registry: Arc<Registry>,
    pub store: Store,
    pub reporter: Reporter,
}

impl Executor for InProcess {
    fn name(&self) -> &'static str {
        "in-process"
    }
    fn execute(&self, c: Arc<Compiled>, job: Job) -> BoxFuture<'static, Result<Manifest, String>> {
        let (registry, store, reporter) = (self.registry.clone(), self.store.clone(), self.reporter.clone());
        Box::pin(async move { exec::execute(&c, &registry, &store, job, &reporter).await.map_err(|e| e.to_string()) })
    }
}

/// Runs each stage as `rao exec` in a child process: the seam remote executors use.
pub struct LocalProcess {
    pub exe: std::path::PathBuf,
    pub store: Store,
    pub reporter: Reporter,
}

impl Executor for LocalProcess {
    fn name(&self) -> &'static str {
        "process"
    }
    fn execute(&self, c: Arc<Compiled>, job: Job) -> BoxFuture<'static, Result<Manifest, String>> {
        let (exe, store, reporter) = (self.exe.clone(), self.store.clone(), self.reporter.clone());
        Box::pin(async move {
            let inst = &c.instances[job.instance];
            reporter.emit(Event::Started { instance: inst.name.clone(), fingerprint: job.fingerprint.clone(), attempt: 1 });
            let out = tokio::process::Command::new(&exe)
                .args(exec::exec_args(&c, &inst.name, &store))
                .kill_on_drop(true)
                .stdin(std::process::Stdio::null())
                .output()
                .await
                .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                return Err(format!("`rao exec` exited with {}: {}", out.status, err.trim()));
            }
            store
                .get_json::<Manifest>(&manifest_key(&job.fingerprint))
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "`rao exec` succeeded but wrote no manifest".to_string())
        })
    }
}

/// Routes each instance to its own executor (a stage may name one, e.g. Ray for the rollouts).
pub struct PerInstance {
    pub executors: Vec<Arc<dyn Executor>>,
    pub name: &'static str,
}

impl Executor for PerInstance {
    fn name(&self) -> &'static str {
        self.name
    }
    fn execute(&self, c: Arc<Compiled>, job: Job) -> BoxFuture<'static, Result<Manifest, String>> {
        self.executors[job.instance].execute(c, job)
    }
}

#[derive(Clone)]
pub struct RunOptions {
    pub jobs: usize,
    pub gpus: u32,
    pub force: Vec<String>,
    pub from: Vec<String>,
    pub only: Vec<String>,
    pub reporter: Reporter,
    /// Stop on Ctrl-C (the CLI); tests leave it off.
    pub handle_ctrl_c: bool,
    /// The version of the code that runs (the CLI's version and commit), kept in the run record.
    pub code_version: String,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            jobs: 1,
            gpus: 0,
            force: vec![],
            from: vec![],
            only: vec![],
            reporter: Reporter::silent(),
            handle_ctrl_c: false,
            code_version: String::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum InstanceStatus {
    Pending,
    Done,
    Cached,
    Failed,
    Skipped,
    Cancelled,
}

#[derive(Debug, Clone, Serialize)]
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

/// Written to `runs/PIPELINE/RUN_ID.json` when a run starts and again when it ends.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    pub run_id: String,
    pub pipeline: String,
    pub file: String,
    pub store: String,
    pub executor: String,
    pub overrides: Vec<String>,
    pub resolved: serde_json::Value,
    /// What `RunOptions::code_version` said (reports show which code measured what).
    pub code_version: String,
    pub started_at: f64,
    pub finished_at: Option<f64>,
    pub status: String,
    pub instances: Vec<InstanceRecord>,
}

impl RunRecord {
    pub fn key(&self) -> String {
        format!("runs/{}/{}.json", self.pipeline, self.run_id)
    }
    pub fn failures(&self) -> Vec<(&str, &str)> {
        self.instances
            .iter()
            .filter(|r| r.status == InstanceStatus::Failed)
            .map(|r| (r.name.as_str(), r.reason.as_deref().unwrap_or("")))
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    Usage(String),
}

pub fn new_run_id() -> String {
    let secs = now_secs();
    let days = (secs / 86400.0).floor() as i64;
    let rem = secs as i64 - days * 86400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z-{}", rem / 3600, rem / 60 % 60, rem % 60, std::process::id())
}

enum Outcome {
    Finished(usize, Result<Manifest, String>),
}

/// Run a compiled pipeline against a store.
pub async fn run(c: Arc<Compiled>, executor: Arc<dyn Executor>, store: &Store, opts: RunOptions) -> Result<RunRecord, RunError> {
    let n = c.instances.len();
    let t0 = std::time::Instant::now();
    let pick = |names: &[String]| -> Result<Vec<usize>, RunError> {
        let mut v = Vec::new();
        for name in names {
            v.extend(c.select(name).ok_or_else(|| RunError::Usage(format!("no stage or instance named `{name}` in {}", c.name)))?);
        }
        Ok(v)
    };
    let forced = c.downstream(&pick(&opts.force)?);
    let selected: Vec<bool> = if !opts.only.is_empty() {
        let mut s = vec![false; n];
        for i in pick(&opts.only)? {
            s[i] = true;
        }
        s
    } else if !opts.from.is_empty() {
        c.downstream(&pick(&opts.from)?)
    } else {
        vec![true; n]
    };
    for inst in &c.instances {
        if inst.resources.gpu > opts.gpus {
            return Err(RunError::Usage(format!(
                "stage `{}` needs {} GPU(s) but this run has {} (pass --gpus N, or remove `resources.gpu`)",
                inst.name, inst.resources.gpu, opts.gpus
            )));
        }
    }
    let mut record = RunRecord {
        run_id: new_run_id(),
        pipeline: c.name.clone(),
        file: c.file.display().to_string(),
        store: store.url().to_string(),
        executor: executor.name().to_string(),
        overrides: c.overrides.clone(),
        resolved: c.resolved.clone(),
        code_version: opts.code_version.clone(),
        started_at: now_secs(),
        finished_at: None,
        status: "running".into(),
        instances: c
            .instances
            .iter()
            .map(|i| InstanceRecord {
                name: i.name.clone(),
                stage: i.stage.clone(),
                kind: i.kind.clone(),
                status: InstanceStatus::Pending,
                fingerprint: None,
                reason: None,
                started_at: None,
                finished_at: None,
                attempts: 0,
                metrics: BTreeMap::new(),
            })
            .collect(),
    };
    store.put_json(&record.key(), &record).await?;
    let rep = opts.reporter.clone();
    rep.emit(Event::RunStarted { pipeline: c.name.clone(), run_id: record.run_id.clone(), instances: n, store: store.url().to_string() });

    let position: Vec<usize> = {
        let mut p = vec![0; n];
        for (k, &i) in c.order.iter().enumerate() {
            p[i] = k;
        }
        p
    };
    let mut waiting_on: Vec<usize> = (0..n).map(|i| c.predecessors(i).count()).collect();
    let mut upstream_failed: Vec<Option<String>> = vec![None; n];
    let mut settled = vec![false; n];
    let mut manifests: Vec<Option<Manifest>> = vec![None; n];
    let mut fps: Vec<Option<String>> = vec![None; n];
    let mut loop_exit: Vec<Option<u32>> = vec![None; c.loops.len()];
    let mut ready: BinaryHeap<Reverse<(usize, usize)>> =
        (0..n).filter(|&i| waiting_on[i] == 0).map(|i| Reverse((position[i], i))).collect();
    let mut deferred: Vec<usize> = Vec::new();
    let (mut cpu_free, mut gpu_free) = (opts.jobs.max(1) as u32, opts.gpus);
    let mut running: JoinSet<Outcome> = JoinSet::new();
    let mut running_needs: BTreeMap<usize, (u32, u32)> = BTreeMap::new();
    let mut ctrl_c = Box::pin(async move {
        if opts.handle_ctrl_c {
            let _ = tokio::signal::ctrl_c().await;
        } else {
            std::future::pending::<()>().await;
        }
    });
    let mut cancelled = false;

    // Marks instance `i` settled and releases its successors.
    macro_rules! settle {
        ($i:expr, $failed:expr) => {{
            let i: usize = $i;
            settled[i] = true;
            let failed: Option<String> = $failed;
            for s in c.successors(i).collect::<Vec<_>>() {
                if let Some(why) = &failed {
                    if upstream_failed[s].is_none() {
                        upstream_failed[s] = Some(why.clone());
                    }
                }
                waiting_on[s] -= 1;
                if waiting_on[s] == 0 {
                    ready.push(Reverse((position[s], s)));
                }
            }
        }};
    }

    loop {
        // Launch or settle everything that is ready.
        while let Some(Reverse((_, i))) = ready.pop() {
            if settled[i] {
                continue;
            }
            let inst = &c.instances[i];
            if let Some(why) = upstream_failed[i].clone() {
                record.instances[i].status = InstanceStatus::Skipped;
                record.instances[i].reason = Some(why.clone());
                rep.emit(Event::Skipped { instance: inst.name.clone(), reason: why.clone() });
                settle!(i, Some(format!("upstream `{}` did not finish", inst.name)));
                continue;
            }
            if let Some((l, k)) = inst.iteration {
                if loop_exit[l].is_some_and(|e| k > e) {
                    let why = format!("loop `{}` stopped at iteration {}", c.loops[l].name, loop_exit[l].unwrap());
                    record.instances[i].status = InstanceStatus::Skipped;
                    record.instances[i].reason = Some(why.clone());
                    rep.emit(Event::Skipped { instance: inst.name.clone(), reason: why });
                    settle!(i, None);
                    continue;
                }
            }
            decide_loops(&c, &manifests, &mut loop_exit, i);
            let Some(parts) = c.fp_parts(i, |j| fps[j].clone(), |l| loop_exit[l]) else {
                let why = "its inputs could not be resolved".to_string();
                record.instances[i].status = InstanceStatus::Failed;
                record.instances[i].reason = Some(why.clone());
                rep.emit(Event::Failed { instance: inst.name.clone(), error: why.clone() });
                settle!(i, Some(why));
                continue;
            };
            let fp = parts.fingerprint();
            fps[i] = Some(fp.clone());
            record.instances[i].fingerprint = Some(fp.clone());
            if !forced[i] {
                if let Some(m) = store.get_json::<Manifest>(&manifest_key(&fp)).await? {
                    record.instances[i].status = InstanceStatus::Cached;
                    record.instances[i].metrics = m.metrics.clone();
                    rep.emit(Event::Cached { instance: inst.name.clone(), fingerprint: fp });
                    manifests[i] = Some(m);
                    on_loop_progress(&c, &manifests, &mut loop_exit, i);
                    settle!(i, None);
                    continue;
                }
            }
            if !selected[i] || cancelled {
                let why = if cancelled { "run cancelled".to_string() } else { "not done, and not selected by --only/--from".to_string() };
                record.instances[i].status = if cancelled { InstanceStatus::Cancelled } else { InstanceStatus::Failed };
                record.instances[i].reason = Some(why.clone());
                if !cancelled {
                    rep.emit(Event::Failed { instance: inst.name.clone(), error: why.clone() });
                }
                settle!(i, Some(why));
                continue;
            }
            let need_cpu = inst.resources.cpu.unwrap_or(1).min(opts.jobs.max(1) as u32);
            let need_gpu = inst.resources.gpu;
            if need_cpu > cpu_free || need_gpu > gpu_free {
                deferred.push(i);
                continue;
            }
            let inputs = exec::input_artifacts(&c, i, |l| loop_exit[l], |j| manifests[j].clone()).expect("inputs are settled");
            cpu_free -= need_cpu;
            gpu_free -= need_gpu;
            running_needs.insert(i, (need_cpu, need_gpu));
            record.instances[i].started_at = Some(now_secs());
            let job = Job { instance: i, parts, fingerprint: fp, inputs };
            let fut = executor.execute(c.clone(), job);
            running.spawn(async move { Outcome::Finished(i, fut.await) });
        }
        if running.is_empty() {
            break;
        }
        let outcome = tokio::select! {
            r = running.join_next() => r,
            _ = &mut ctrl_c, if !cancelled => {
                cancelled = true;
                running.abort_all();
                None
            }
        };
        match outcome {
            Some(Ok(Outcome::Finished(i, result))) => {
                let (cpu, gpu) = running_needs.remove(&i).unwrap();
                cpu_free += cpu;
                gpu_free += gpu;
                let inst = &c.instances[i];
                let r = &mut record.instances[i];
                r.finished_at = Some(now_secs());
                match result {
                    Ok(m) => {
                        r.status = InstanceStatus::Done;
                        r.attempts = m.attempts;
                        r.metrics = m.metrics.clone();
                        r.started_at = Some(m.started_at);
                        r.finished_at = Some(m.finished_at);
                        rep.emit(Event::Finished {
                            instance: inst.name.clone(),
                            fingerprint: m.fingerprint.clone(),
                            seconds: m.finished_at - m.started_at,
                        });
                        manifests[i] = Some(m);
                        on_loop_progress(&c, &manifests, &mut loop_exit, i);
                        settle!(i, None);
                    }
                    Err(e) => {
                        r.status = InstanceStatus::Failed;
                        r.reason = Some(e.clone());
                        rep.emit(Event::Failed { instance: inst.name.clone(), error: e });
                        settle!(i, Some(format!("upstream `{}` failed", inst.name)));
                    }
                }
                // Resources freed: deferred instances may start now.
                for d in deferred.drain(..) {
                    ready.push(Reverse((position[d], d)));
                }
            }
            Some(Err(join_err)) if join_err.is_cancelled() => {}
            Some(Err(join_err)) => return Err(RunError::Usage(format!("a stage task panicked: {join_err}"))),
            None => {
                // Cancelled: everything still running is marked, the rest is settled as cancelled.
                for (&i, _) in running_needs.iter() {
                    record.instances[i].status = InstanceStatus::Cancelled;
                    record.instances[i].reason = Some("run cancelled (Ctrl-C)".into());
                }
                running_needs.clear();
                while running.join_next().await.is_some() {}
                break;
            }
        }
    }
    for r in record.instances.iter_mut().filter(|r| r.status == InstanceStatus::Pending) {
        r.status = if cancelled { InstanceStatus::Cancelled } else { InstanceStatus::Skipped };
    }
    let count = |s: InstanceStatus| record.instances.iter().filter(|r| r.status == s).count();
    let (done, cached, failed, skipped) =
        (count(InstanceStatus::Done), count(InstanceStatus::Cached), count(InstanceStatus::Failed), count(InstanceStatus::Skipped));
    record.status = if cancelled {
        "cancelled"
    } else if failed > 0 {
        "failed"
    } else {
        "succeeded"
    }
    .into();
    record.finished_at = Some(now_secs());
    store.put_json(&record.key(), &record).await?;
    store.put_json(&format!("runs/{}/latest.json", c.name), &record).await?;
    rep.emit(Event::RunFinished {
        run_id: record.run_id.clone(),
        status: record.status.clone(),
        done,
        cached,
        failed,
        skipped,
        seconds: t0.elapsed().as_secs_f64(),
    });
    Ok(record)
}

/// Before fingerprinting `i`, decide any loop whose final value it reads.
fn decide_loops(c: &Compiled, manifests: &[Option<Manifest>], loop_exit: &mut [Option<u32>], i: usize) {
    for (_, sources) in &c.instances[i].inputs {
        for s in sources {
            if let Source::LoopExit { loop_idx, .. } = s {
                if loop_exit[*loop_idx].is_none() {
                    loop_exit[*loop_idx] = c.loops[*loop_idx].exit_iteration(metric_reader(c, manifests, *loop_idx));
                }
            }
        }
    }
}

/// After `i` finished: if it carries a loop's stop metric, the loop may now be decided.
fn on_loop_progress(c: &Compiled, manifests: &[Option<Manifest>], loop_exit: &mut [Option<u32>], i: usize) {
    if let Some((l, _)) = c.instances[i].iteration {
        if loop_exit[l].is_none() && c.loops[l].stop.as_ref().is_some_and(|s| s.stage == c.instances[i].stage) {
            loop_exit[l] = c.loops[l].exit_iteration(metric_reader(c, manifests, l));
        }
    }
}

fn metric_reader<'a>(c: &'a Compiled, manifests: &'a [Option<Manifest>], l: usize) -> impl Fn(usize) -> Option<Option<f64>> + 'a {
    move |j| {
        let stop = c.loops[l].stop.as_ref()?;
        manifests[j].as_ref().map(|m| m.metrics.get(&stop.metric).copied())
    }
}
