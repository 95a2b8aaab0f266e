//! The scheduler: runs ready instances concurrently (up to --jobs and the resource limits),
//! skips what the store already has, stops dependents of failures, and keeps the run record.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::compile::{Compiled, Source};
use crate::events::{Event, Reporter};
use crate::exec::{Finished, Job, now_secs};
use crate::executor::Executor;
use crate::fingerprint::FpParts;
use crate::manifest::{self, Manifest, ManifestState};
use crate::read_ahead;
use crate::run_record::{self, InstanceRecord, InstanceStatus, RunRecord, RunStatus};
use crate::store::Store;

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

/// After Ctrl-C, how long running instances get to stop by themselves (clean up, release their
/// leases) before they are dropped where they are.
const CANCEL_GRACE: Duration = Duration::from_secs(2);

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

/// Run a compiled pipeline against a store.
pub async fn run(c: Arc<Compiled>, executor: Arc<dyn Executor>, store: &Store, opts: RunOptions) -> Result<RunRecord, RunError> {
    let mut s = Scheduler::new(c, executor, store.clone(), opts)?;
    let reporter = s.opts.reporter.clone();
    let ran = async {
        s.start().await?;
        s.drive().await?;
        Ok(s.finish().await)
    }
    .await;
    reporter.flush();
    ran
}

/// The state of one run.
/// Why a selected instance cannot run: its input `input` is neither done nor selected, because
/// `first` (the input itself, or an instance above it) is not.
#[derive(Clone)]
struct MissingInput {
    input: String,
    first: String,
}

struct Scheduler {
    c: Arc<Compiled>,
    executor: Arc<dyn Executor>,
    store: Store,
    opts: RunOptions,
    record: RunRecord,
    t0: Instant,
    /// Instances `--force` recomputes (and when the force began).
    forced: Vec<bool>,
    forced_at: f64,
    /// Instances `--only` / `--from` allow to run.
    selected: Vec<bool>,
    /// Topological position of each instance (ready instances start in this order).
    position: Vec<usize>,
    waiting_on: Vec<usize>,
    upstream_failed: Vec<Option<String>>,
    /// An instance upstream that is neither done nor selected (`--only`/`--from`): a selected
    /// instance below it cannot run, which fails the run; one that is not selected is skipped.
    missing_input: Vec<Option<MissingInput>>,
    settled: Vec<bool>,
    manifests: Vec<Option<Manifest>>,
    fps: Vec<Option<String>>,
    loop_exit: Vec<Option<u32>>,
    /// Loops whose stop metric was found missing from a finished instance (said once each).
    stop_metric_missing: Vec<bool>,
    ready: BinaryHeap<Reverse<(usize, usize)>>,
    /// Ready but waiting for CPU or GPU slots.
    deferred: Vec<usize>,
    cpu_free: u32,
    gpu_free: u32,
    running: JoinSet<(usize, Result<Finished, String>)>,
    running_needs: BTreeMap<usize, (u32, u32)>,
    cancelled: bool,
    /// Handed to every job: cancelled on Ctrl-C.
    cancel: CancellationToken,
    last_heartbeat: f64,
    /// Whether the record and the `active/` marker are in the store yet (see `put_on_record`).
    on_record: bool,
    /// Cache hits found before the walk (`read_ahead`), by instance, with their fingerprints.
    ahead: read_ahead::ReadAhead,
}

impl Scheduler {
    fn new(c: Arc<Compiled>, executor: Arc<dyn Executor>, store: Store, opts: RunOptions) -> Result<Scheduler, RunError> {
        let n = c.instances.len();
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
        if let Some(inst) = c.instances.iter().find(|i| i.resources.gpu > opts.gpus) {
            return Err(RunError::Usage(format!(
                "stage `{}` needs {} GPU(s) but this run has {} (pass --gpus N, or remove `resources.gpu`)",
                inst.name, inst.resources.gpu, opts.gpus
            )));
        }
        let mut position = vec![0; n];
        for (k, &i) in c.order.iter().enumerate() {
            position[i] = k;
        }
        let waiting_on: Vec<usize> = (0..n).map(|i| c.predecessors(i).count()).collect();
        let ready = (0..n).filter(|&i| waiting_on[i] == 0).map(|i| Reverse((position[i], i))).collect();
        let now = now_secs();
        let record = RunRecord {
            run_id: new_run_id(),
            pipeline: c.name.clone(),
            file: c.file.display().to_string(),
            store: store.url().to_string(),
            executor: executor.name().to_string(),
            overrides: crate::secrets::redact_overrides(&c.overrides),
            resolved: c.resolved.for_record(),
            code_version: opts.code_version.clone(),
            host: crate::lease::host_name(),
            pid: std::process::id(),
            pid_space: crate::lease::pid_space().to_string(),
            started_at: now,
            heartbeat_at: now,
            finished_at: None,
            status: RunStatus::Running,
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
        let jobs = opts.jobs.max(1) as u32;
        Ok(Scheduler {
            forced,
            forced_at: now,
            selected,
            position,
            waiting_on,
            upstream_failed: vec![None; n],
            missing_input: vec![None; n],
            settled: vec![false; n],
            manifests: vec![None; n],
            fps: vec![None; n],
            loop_exit: vec![None; c.loops.len()],
            stop_metric_missing: vec![false; c.loops.len()],
            ready,
            deferred: Vec::new(),
            cpu_free: jobs,
            gpu_free: opts.gpus,
            running: JoinSet::new(),
            running_needs: BTreeMap::new(),
            cancelled: false,
            cancel: CancellationToken::new(),
            last_heartbeat: now,
            on_record: false,
            ahead: Default::default(),
            record,
            t0: Instant::now(),
            c,
            executor,
            store,
            opts,
        })
    }

    fn emit(&self, e: Event) {
        self.opts.reporter.emit(e)
    }

    /// Write the run record with a fresh heartbeat; at the end also as `latest.json` (the same
    /// bytes, serialised once). Writing it is bookkeeping: a store that refuses it (read-only,
    /// full) costs a warning, not the run.
    async fn save_record(&mut self, latest_too: bool) {
        self.record.heartbeat_at = now_secs();
        self.last_heartbeat = self.record.heartbeat_at;
        let bytes = bytes::Bytes::from(serde_json::to_vec_pretty(&self.record).expect("a run record serialises"));
        let mut keys = vec![self.record.key()];
        if latest_too {
            keys.push(format!("runs/{}/latest.json", self.c.name));
        }
        for key in keys {
            if let Err(e) = self.store.put(&key, bytes.clone()).await {
                self.emit(Event::Warning { message: format!("cannot write the run record: {e}") });
            }
        }
    }

    async fn start(&mut self) -> Result<(), RunError> {
        // Earlier runs of this pipeline that were killed are recorded as such; their staging goes.
        match run_record::close_interrupted(&self.store, &self.c.name).await {
            Ok(closed) if !closed.is_empty() => {
                self.emit(Event::Warning { message: format!("recorded as interrupted: earlier run(s) {}", closed.join(", ")) })
            }
            Ok(_) => {}
            Err(e) => self.emit(Event::Warning { message: format!("cannot check earlier runs: {e}") }),
        }
        crate::maintenance::remove_dead_staging(&self.store);
        let (mut stages, mut kinds) = (BTreeMap::new(), BTreeMap::new());
        for inst in &self.c.instances {
            let stage = crate::events::stage_of(&inst.name).to_string();
            kinds.insert(stage.clone(), inst.kind.clone());
            *stages.entry(stage).or_default() += 1;
        }
        self.emit(Event::RunStarted {
            pipeline: self.c.name.clone(),
            run_id: self.record.run_id.clone(),
            instances: self.c.instances.len(),
            stages,
            kinds,
            store: self.store.url().to_string(),
        });
        // After the start is announced: against a slow bucket this takes a moment.
        self.ahead = read_ahead::read(&self.c, &self.store, &self.forced).await;
        Ok(())
    }

    /// Put the run on record — its record and its `active/` marker, by which a later run tells
    /// that this one was killed — before its first instance starts, or at its first heartbeat.
    /// A run that only finds cached results writes its record once, at its end.
    async fn put_on_record(&mut self) {
        if std::mem::replace(&mut self.on_record, true) {
            return;
        }
        self.save_record(false).await;
        let marker = run_record::active_key(&self.c.name, &self.record.run_id);
        if let Err(e) = self.store.put(&marker, bytes::Bytes::new()).await {
            self.emit(Event::Warning { message: format!("cannot mark the run active: {e}") });
        }
    }

    /// Mark instance `i` settled and release its successors.
    fn settle(&mut self, i: usize, failed: Option<String>) {
        self.settled[i] = true;
        for s in self.c.successors(i).collect::<Vec<_>>() {
            if let Some(why) = &failed {
                self.upstream_failed[s].get_or_insert_with(|| why.clone());
            }
            self.waiting_on[s] -= 1;
            if self.waiting_on[s] == 0 {
                self.ready.push(Reverse((self.position[s], s)));
            }
        }
    }

    /// Tell the instances below `i` (not done, not selected) that their input `i` is missing,
    /// because `first` (`i` itself or an instance above it) is.
    fn pass_missing(&mut self, i: usize, first: &str) {
        let input = self.c.instances[i].name.clone();
        for s in self.c.successors(i).collect::<Vec<_>>() {
            self.missing_input[s].get_or_insert_with(|| MissingInput { input: input.clone(), first: first.to_string() });
        }
    }

    fn mark(&mut self, i: usize, status: InstanceStatus, reason: Option<String>) {
        self.record.instances[i].status = status;
        self.record.instances[i].reason = reason;
    }

    /// A finished manifest that can serve as a cache hit for `fp`; a damaged one is reported and
    /// set aside (the instance then runs again).
    async fn cache_hit(&mut self, i: usize, fp: &str) -> Result<Option<Manifest>, RunError> {
        if let Some(ManifestState::Done(m)) = self.ahead.take(i, fp) {
            return Ok(Some(m));
        }
        // `read_raw`: something other than a file in the manifest's place is damage too.
        let (state, bytes) = manifest::read_raw(&self.store, fp).await?;
        let why = match state {
            ManifestState::Done(m) => match manifest::check_sizes(&self.store, &m).await? {
                Ok(()) => return Ok(Some(m)),
                Err(why) => why,
            },
            ManifestState::Damaged { why, .. } => why,
            ManifestState::Missing => return Ok(None),
        };
        self.emit(Event::Damaged { instance: self.c.instances[i].name.clone(), fingerprint: fp.to_string(), why });
        manifest::quarantine(&self.store, fp, &bytes).await?;
        Ok(None)
    }

    /// Start or settle everything that is ready.
    async fn launch_ready(&mut self) -> Result<(), RunError> {
        while let Some(Reverse((_, i))) = self.ready.pop() {
            if self.settled[i] {
                continue;
            }
            let c = self.c.clone();
            let inst = &c.instances[i];
            if let Some(missing) = self.missing_input[i].clone() {
                if self.selected[i] {
                    let MissingInput { input, first } = &missing;
                    let why = if input == first {
                        format!("its input `{input}` is not done and not selected: run it first, or use --from {first}")
                    } else {
                        format!(
                            "its input `{input}` is not done and not selected, nor is `{first}` above it: run them first, or use --from {first}"
                        )
                    };
                    self.mark(i, InstanceStatus::Failed, Some(why.clone()));
                    self.emit(Event::Failed { instance: inst.name.clone(), error: why });
                    self.settle(i, Some(format!("upstream `{}` did not finish", inst.name)));
                } else {
                    self.pass_missing(i, &missing.first);
                    self.skip_unselected(i);
                }
                continue;
            }
            if let Some(why) = self.upstream_failed[i].clone() {
                self.mark(i, InstanceStatus::Skipped, Some(why.clone()));
                self.emit(Event::Skipped { instance: inst.name.clone(), reason: why });
                self.settle(i, Some(format!("upstream `{}` did not finish", inst.name)));
                continue;
            }
            if let Some((l, k)) = inst.iteration
                && let Some(exit) = self.loop_exit[l].filter(|&e| k > e)
            {
                let why = format!("loop `{}` stopped at iteration {exit}", c.loops[l].name);
                self.mark(i, InstanceStatus::Skipped, Some(why.clone()));
                self.emit(Event::Skipped { instance: inst.name.clone(), reason: why });
                self.settle(i, None);
                continue;
            }
            self.decide_loops(i);
            let Some(inputs) = c.fp_inputs(i, |j| self.fps[j].clone(), |l| self.loop_exit[l]) else {
                let why = "its inputs could not be resolved".to_string();
                self.mark(i, InstanceStatus::Failed, Some(why.clone()));
                self.emit(Event::Failed { instance: inst.name.clone(), error: why.clone() });
                self.settle(i, Some(why));
                continue;
            };
            let fp = c.fingerprint_with(i, &inputs);
            self.fps[i] = Some(fp.clone());
            self.record.instances[i].fingerprint = Some(fp.clone());
            if !self.forced[i]
                && let Some(m) = self.cache_hit(i, &fp).await?
            {
                self.mark(i, InstanceStatus::Cached, None);
                self.record.instances[i].metrics = m.metrics.clone();
                self.emit(Event::Cached { instance: inst.name.clone(), fingerprint: fp });
                self.manifests[i] = Some(m);
                self.on_loop_progress(i);
                self.settle(i, None);
                continue;
            }
            if self.cancelled {
                let why = "run cancelled".to_string();
                self.mark(i, InstanceStatus::Cancelled, Some(why.clone()));
                self.settle(i, Some(why));
                continue;
            }
            if !self.selected[i] {
                self.pass_missing(i, &inst.name);
                self.skip_unselected(i);
                continue;
            }
            let need_cpu = inst.resources.cpu.unwrap_or(1).min(self.opts.jobs.max(1) as u32);
            let need_gpu = inst.resources.gpu;
            if need_cpu > self.cpu_free || need_gpu > self.gpu_free {
                self.deferred.push(i);
                continue;
            }
            self.put_on_record().await;
            self.launch(i, c.parts_with(i, inputs), fp, need_cpu, need_gpu);
        }
        Ok(())
    }

    /// Skip an instance that is not done and that `--only`/`--from` did not select (no failure:
    /// the selected instances below it fail instead, through `missing_input`).
    fn skip_unselected(&mut self, i: usize) {
        let why = "not done, and not selected by --only/--from".to_string();
        self.mark(i, InstanceStatus::Skipped, Some(why.clone()));
        self.emit(Event::Skipped { instance: self.c.instances[i].name.clone(), reason: why });
        self.settle(i, None);
    }

    fn launch(&mut self, i: usize, parts: FpParts, fingerprint: String, need_cpu: u32, need_gpu: u32) {
        let inputs =
            crate::exec::input_artifacts(&self.c, i, |l| self.loop_exit[l], |j| self.manifests[j].clone()).expect("inputs are settled");
        self.cpu_free -= need_cpu;
        self.gpu_free -= need_gpu;
        self.running_needs.insert(i, (need_cpu, need_gpu));
        self.record.instances[i].started_at = Some(now_secs());
        let job = Job {
            instance: i,
            parts,
            fingerprint,
            inputs,
            run_id: self.record.run_id.clone(),
            forced_at: self.forced[i].then_some(self.forced_at),
            cancel: self.cancel.clone(),
        };
        let fut = self.executor.execute(self.c.clone(), job);
        self.running.spawn(async move { (i, fut.await) });
    }

    fn on_finished(&mut self, i: usize, result: Result<Finished, String>) {
        let (cpu, gpu) = self.running_needs.remove(&i).expect("a running instance has its resources");
        self.cpu_free += cpu;
        self.gpu_free += gpu;
        let name = self.c.instances[i].name.clone();
        self.record.instances[i].finished_at = Some(now_secs());
        match result {
            Ok(Finished { manifest: m, reused }) => {
                let r = &mut self.record.instances[i];
                r.status = if reused { InstanceStatus::Cached } else { InstanceStatus::Done };
                r.attempts = if reused { 0 } else { m.attempts };
                r.metrics = m.metrics.clone();
                r.started_at = Some(m.started_at);
                r.finished_at = Some(m.finished_at);
                self.emit(if reused {
                    Event::Cached { instance: name, fingerprint: m.fingerprint.clone() }
                } else {
                    Event::Finished { instance: name, fingerprint: m.fingerprint.clone(), seconds: m.finished_at - m.started_at }
                });
                self.manifests[i] = Some(m);
                self.on_loop_progress(i);
                self.settle(i, None);
            }
            Err(e) => {
                self.mark(i, InstanceStatus::Failed, Some(e.clone()));
                self.emit(Event::Failed { instance: name.clone(), error: e });
                self.settle(i, Some(format!("upstream `{name}` failed")));
            }
        }
        // Resources freed: deferred instances may start now.
        for d in std::mem::take(&mut self.deferred) {
            self.ready.push(Reverse((self.position[d], d)));
        }
    }

    async fn drive(&mut self) -> Result<(), RunError> {
        let handle_ctrl_c = self.opts.handle_ctrl_c;
        let mut ctrl_c = Box::pin(async move {
            if handle_ctrl_c {
                crate::interrupt::interrupted().await;
            } else {
                std::future::pending::<()>().await;
            }
        });
        let mut heartbeat = tokio::time::interval(Duration::from_secs_f64(run_record::HEARTBEAT_EVERY_S));
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.launch_ready().await?;
            if self.running.is_empty() {
                return Ok(());
            }
            self.opts.reporter.flush();
            tokio::select! {
                r = self.running.join_next() => match r {
                    Some(Ok((i, result))) => self.on_finished(i, result),
                    Some(Err(e)) if e.is_cancelled() => {}
                    // Stages run inside the executor's own panic guard; this is the scheduler's
                    // last line: a panic here is a bug, reported without losing the record.
                    Some(Err(e)) => self.emit(Event::Warning { message: format!("an executor task panicked: {e}") }),
                    None => {}
                },
                _ = &mut ctrl_c, if !self.cancelled => {
                    self.cancel_running().await;
                    return Ok(());
                }
                _ = heartbeat.tick() => {
                    if now_secs() - self.last_heartbeat >= run_record::HEARTBEAT_EVERY_S {
                        match self.on_record {
                            true => self.save_record(false).await,
                            false => self.put_on_record().await,
                        }
                    }
                }
            }
        }
    }

    /// Ctrl-C: every running instance is asked to stop and gets `CANCEL_GRACE` to do so cleanly
    /// (an instance that finished meanwhile keeps its result); then, or at a second Ctrl-C, what
    /// still runs is dropped.
    async fn cancel_running(&mut self) {
        self.cancelled = true;
        self.cancel.cancel();
        let running = self.running_needs.keys().map(|&i| self.c.instances[i].name.clone()).collect();
        self.emit(Event::Cancelling { running });
        let handle_ctrl_c = self.opts.handle_ctrl_c;
        let again = async move {
            if handle_ctrl_c {
                crate::interrupt::interrupted().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let grace = tokio::time::sleep(CANCEL_GRACE);
        tokio::pin!(again, grace);
        loop {
            tokio::select! {
                r = self.running.join_next() => match r {
                    Some(Ok((i, result))) => self.on_stopped(i, result),
                    Some(Err(_)) => {}
                    None => break,
                },
                _ = &mut grace => break,
                _ = &mut again => break,
            }
        }
        self.running.abort_all();
        while let Some(r) = self.running.join_next().await {
            if let Ok((i, result)) = r {
                self.on_stopped(i, result);
            }
        }
        // Dropped without an answer.
        for i in std::mem::take(&mut self.running_needs).into_keys() {
            self.mark(i, InstanceStatus::Cancelled, Some("run cancelled (Ctrl-C)".into()));
            self.emit(Event::Cancelled { instance: self.c.instances[i].name.clone() });
        }
    }

    /// An instance that ended after Ctrl-C: a result is kept, anything else is a cancellation.
    fn on_stopped(&mut self, i: usize, result: Result<Finished, String>) {
        if result.is_ok() {
            return self.on_finished(i, result);
        }
        self.running_needs.remove(&i);
        self.record.instances[i].finished_at = Some(now_secs());
        self.mark(i, InstanceStatus::Cancelled, Some("run cancelled (Ctrl-C)".into()));
        self.emit(Event::Cancelled { instance: self.c.instances[i].name.clone() });
    }

    async fn finish(mut self) -> RunRecord {
        let cancelled = self.cancelled;
        for r in self.record.instances.iter_mut().filter(|r| r.status == InstanceStatus::Pending) {
            r.status = if cancelled { InstanceStatus::Cancelled } else { InstanceStatus::Skipped };
        }
        let count = |s: InstanceStatus| self.record.instances.iter().filter(|r| r.status == s).count();
        let (done, cached, failed, skipped) =
            (count(InstanceStatus::Done), count(InstanceStatus::Cached), count(InstanceStatus::Failed), count(InstanceStatus::Skipped));
        self.record.status = if cancelled {
            RunStatus::Cancelled
        } else if failed > 0 {
            RunStatus::Failed
        } else {
            RunStatus::Succeeded
        };
        self.record.finished_at = Some(now_secs());
        self.save_record(true).await;
        if self.on_record {
            let _ = self.store.delete(&run_record::active_key(&self.c.name, &self.record.run_id)).await;
        }
        self.emit(Event::RunFinished {
            run_id: self.record.run_id.clone(),
            status: self.record.status.as_str().to_string(),
            done,
            cached,
            failed,
            skipped,
            seconds: self.t0.elapsed().as_secs_f64(),
        });
        self.record
    }

    /// Before fingerprinting `i`, decide any loop whose final value it reads.
    fn decide_loops(&mut self, i: usize) {
        for (_, sources) in &self.c.instances[i].inputs {
            for s in sources {
                if let Source::LoopExit { loop_idx, .. } = s
                    && self.loop_exit[*loop_idx].is_none()
                {
                    self.loop_exit[*loop_idx] = self.c.loops[*loop_idx].exit_iteration(metric_reader(&self.c, &self.manifests, *loop_idx));
                }
            }
        }
    }

    /// After `i` finished: if it carries a loop's stop metric, the loop may now be decided.
    fn on_loop_progress(&mut self, i: usize) {
        if let Some((l, _)) = self.c.instances[i].iteration
            && self.loop_exit[l].is_none()
            && let Some(stop) = self.c.loops[l].stop.as_ref().filter(|s| s.stage == self.c.instances[i].stage)
        {
            // A misspelt metric reads as "not met" forever: say so where it shows, once.
            if let Some(m) = &self.manifests[i]
                && !m.metrics.contains_key(&stop.metric)
                && !std::mem::replace(&mut self.stop_metric_missing[l], true)
            {
                let known: Vec<&str> = m.metrics.keys().map(String::as_str).collect();
                let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
                let message = format!(
                    "warning: loop `{}` stops on `{}.{}`, which `{}` does not report (it reports: {known}); the loop runs all {} iterations — fix `stop_when.metric`",
                    self.c.loops[l].name, stop.stage, stop.metric, stop.stage, self.c.loops[l].max_iterations
                );
                self.emit(Event::Note { instance: self.c.instances[i].name.clone(), message });
            }
            self.loop_exit[l] = self.c.loops[l].exit_iteration(metric_reader(&self.c, &self.manifests, l));
        }
    }
}

fn metric_reader<'a>(c: &'a Compiled, manifests: &'a [Option<Manifest>], l: usize) -> impl Fn(usize) -> Option<Option<f64>> + 'a {
    move |j| {
        let stop = c.loops[l].stop.as_ref()?;
        manifests[j].as_ref().map(|m| m.metrics.get(&stop.metric).copied())
    }
}
