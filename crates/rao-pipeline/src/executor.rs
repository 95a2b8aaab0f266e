//! Where stage instances run: the `Executor` seam, with the in-process, child-process and
//! per-instance executors (Ray's is in `ray.rs`).

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::compile::Compiled;
use crate::events::{Event, Reporter};
use crate::exec::{self, Finished, Job};
use crate::registry::Registry;
use crate::store::Store;

/// Something that can run a job: in this process, as a child process, or on a cluster.
pub trait Executor: Send + Sync {
    fn name(&self) -> &'static str;
    fn execute(&self, c: Arc<Compiled>, job: Job) -> BoxFuture<'static, Result<Finished, String>>;
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
    fn execute(&self, c: Arc<Compiled>, job: Job) -> BoxFuture<'static, Result<Finished, String>> {
        let (registry, store, reporter) = (self.registry.clone(), self.store.clone(), self.reporter.clone());
        let stage =
            async move { exec::execute(&c, &registry, &store, job, &reporter).await.map_err(|e| crate::secrets::redact(&e.to_string())) };
        Box::pin(async move {
            let mut task = AbortOnDrop(stage_runtime().spawn(stage));
            (&mut task.0).await.unwrap_or_else(|e| Err(format!("the stage's task ended without a result: {e}")))
        })
    }
}

/// Where in-process stages run (they compute for minutes on every core): the caller's runtime if
/// it has worker threads, else one of their own, started with the first stage that runs — so a
/// `rao run` that finds everything cached starts no threads (on a 2-core VM, starting and
/// stopping them took a third of a fully cached run of the 100-stage chain).
fn stage_runtime() -> tokio::runtime::Handle {
    static OWN: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => h,
        _ => OWN
            .get_or_init(|| {
                tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("rao-stage").build().expect("tokio runtime")
            })
            .handle()
            .clone(),
    }
}

/// A spawned stage is stopped when the scheduler drops it (Ctrl-C), as it was when it ran in the
/// scheduler's own task.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
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
    fn execute(&self, c: Arc<Compiled>, job: Job) -> BoxFuture<'static, Result<Finished, String>> {
        let (exe, store, reporter) = (self.exe.clone(), self.store.clone(), self.reporter.clone());
        Box::pin(async move {
            let inst = &c.instances[job.instance];
            reporter.emit(Event::Started { instance: inst.name.clone(), fingerprint: job.fingerprint.clone(), attempt: 1 });
            let mut child = tokio::process::Command::new(&exe)
                .args(exec::exec_args(&c, &inst.name, &store, &job.run_id, exec::ExecOutput::JsonEvents))
                .envs(exec::exec_env(&c))
                .kill_on_drop(true)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
            let (stdout, mut stderr) = (child.stdout.take().expect("piped"), child.stderr.take().expect("piped"));
            let pid = child.id();
            // Killed if rao is (`reaper`). Unlisted as soon as the child has been waited for (below),
            // or when this future is dropped (the child is killed then).
            let watched = crate::reaper::Watched::process(pid);
            // Cancelled: the child gets Ctrl-C and stops as a run does (its stage at the next
            // step, its lease released). If it is still running when the scheduler's grace ends,
            // this future is dropped and the child killed. Its saved progress stays either way.
            let waited = async {
                tokio::select! {
                    status = child.wait() => status,
                    _ = job.cancel.cancelled() => {
                        interrupt(pid);
                        child.wait().await
                    }
                }
            };
            let mut err = Vec::new();
            let (_, _, status) =
                tokio::join!(forward_events(stdout, &reporter), tokio::io::AsyncReadExt::read_to_end(&mut stderr, &mut err), waited);
            // The child is reaped: its pid may be anyone's from now on (the manifest read below can
            // take a while on a bucket).
            drop(watched);
            let status = status.map_err(|e| format!("waiting for {}: {e}", exe.display()))?;
            if job.cancel.is_cancelled() && !status.success() {
                return Err("cancelled".into());
            }
            if !status.success() {
                let err = String::from_utf8_lossy(&err);
                return Err(crate::secrets::redact(&format!("`rao exec` exited with {status}: {}", err.trim())));
            }
            finished_by(&store, &job).await?.ok_or_else(|| "`rao exec` succeeded but wrote no manifest".to_string())
        })
    }
}

/// Ctrl-C for a child process (where there are signals).
fn interrupt(pid: Option<u32>) {
    #[cfg(unix)]
    if let Some(pid) = pid.and_then(|p| libc::pid_t::try_from(p).ok()) {
        // SAFETY: a signal to our own child, not yet waited for (so its pid is not reused).
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
    #[cfg(not(unix))]
    let _ = pid;
}

/// Pass on what a child `rao exec --json` reports from inside its stage (progress, notes,
/// retries, waits, warnings); its start and end, and an error that stops it, are this process's
/// to report. Lines that are not events are ignored.
async fn forward_events(stdout: tokio::process::ChildStdout, reporter: &Reporter) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match serde_json::from_str::<Event>(&line) {
            Ok(Event::Started { .. } | Event::Finished { .. } | Event::Failed { .. } | Event::Cached { .. } | Event::Error { .. })
            | Err(_) => {}
            Ok(e) => reporter.emit(e),
        }
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
    fn execute(&self, c: Arc<Compiled>, job: Job) -> BoxFuture<'static, Result<Finished, String>> {
        self.executors[job.instance].execute(c, job)
    }
}

/// `fut`, unless the run is cancelled first (then it is dropped: executors that run a job
/// elsewhere stop it on drop).
pub async fn unless_cancelled(
    cancel: tokio_util::sync::CancellationToken,
    fut: impl std::future::Future<Output = Result<Finished, String>>,
) -> Result<Finished, String> {
    cancel.run_until_cancelled_owned(fut).await.unwrap_or_else(|| Err("cancelled".to_string()))
}

/// The published result of a job that another process ran (`rao exec`, a Ray job), if any.
pub async fn finished_by(store: &Store, job: &Job) -> Result<Option<Finished>, String> {
    let m = exec::reusable(store, &job.fingerprint, job.forced_at).await.map_err(|e| e.to_string())?;
    Ok(m.map(|manifest| {
        let reused = manifest.run_id.as_deref() != Some(job.run_id.as_str());
        Finished { manifest, reused }
    }))
}
