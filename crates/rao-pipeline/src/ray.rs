//! The Ray executor: each ready stage instance becomes a Ray job (Ray's Jobs REST API) whose
//! entrypoint is `rao exec` for that instance. The shared store's manifest is the only truth of
//! completion; the job's status only says when to look.
//!
//! Submission is idempotent: the submission id derives from the instance's fingerprint, so a
//! restarted `rao run` finds a job still running and follows it instead of submitting it again.
//! A job that finished without a manifest (failed, stopped) is retried under a new suffix.
//! Dropping the future (Ctrl-C, timeout) asks Ray to stop the job.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use crate::compile::Compiled;
use crate::events::{Event, Reporter};
use crate::exec::{ExecOutput, Finished, Job, exec_args};
use crate::executor::{Executor, finished_by};
use crate::store::Store;

#[derive(Clone)]
pub struct Ray {
    /// The Ray dashboard's HTTP address, e.g. `http://127.0.0.1:8265`.
    pub address: String,
    /// The `rao` binary the cluster's nodes run (same path on every node).
    pub exe: PathBuf,
    pub store: Store,
    pub reporter: Reporter,
    pub client: reqwest::Client,
}

impl Ray {
    pub fn new(address: &str, exe: PathBuf, store: Store, reporter: Reporter) -> Ray {
        let address = if address.contains("://") { address.to_string() } else { format!("http://{address}") };
        Ray { address: address.trim_end_matches('/').to_string(), exe, store, reporter, client: reqwest::Client::new() }
    }
}

/// The id Ray knows this instance's `attempt`-th job by: a function of what the job computes.
pub fn submission_id(fingerprint: &str, attempt: u32) -> String {
    if attempt == 0 { format!("rao-{fingerprint}") } else { format!("rao-{fingerprint}-r{attempt}") }
}

/// `s` as one word for a POSIX shell: as it is when it is plain, else in single quotes.
pub fn shell_quote(s: &str) -> String {
    match !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-./=:,@+%".contains(c)) {
        true => s.to_string(),
        false => format!("'{}'", s.replace('\'', r"'\''")),
    }
}

/// Stops a submitted job if its follower is dropped before the job ends.
struct StopOnDrop {
    client: reqwest::Client,
    url: Option<String>,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let (Some(url), Ok(rt)) = (self.url.take(), tokio::runtime::Handle::try_current()) {
            let client = self.client.clone();
            rt.spawn(async move {
                let _ = client.post(url).send().await;
            });
        }
    }
}

impl Ray {
    async fn job_status(&self, id: &str) -> Result<Option<String>, String> {
        let resp = self.client.get(format!("{}/api/jobs/{id}", self.address)).send().await.map_err(|e| self.unreachable(e))?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let v: Value = resp.json().await.map_err(|e| format!("Ray answered something that is not a job: {e}"))?;
        Ok(v["status"].as_str().map(str::to_string))
    }

    fn unreachable(&self, e: reqwest::Error) -> String {
        format!("cannot reach Ray at {} ({e}); start a head with `ray start --head` or pass --ray-address", self.address)
    }

    async fn logs_tail(&self, id: &str) -> String {
        let logs = match self.client.get(format!("{}/api/jobs/{id}/logs", self.address)).send().await {
            Ok(r) => r.json::<Value>().await.ok().and_then(|v| v["logs"].as_str().map(str::to_string)).unwrap_or_default(),
            Err(_) => String::new(),
        };
        logs.lines().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    async fn submit(&self, c: &Compiled, job: &Job, id: &str) -> Result<(), String> {
        let inst = &c.instances[job.instance];
        let cmd = [vec![self.exe.display().to_string()], exec_args(c, &inst.name, &self.store, &job.run_id, ExecOutput::Quiet)].concat();
        let entrypoint = cmd.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" ");
        let mut body = json!({
            "entrypoint": entrypoint,
            "submission_id": id,
            "entrypoint_num_cpus": inst.resources.cpu.unwrap_or(1),
            "entrypoint_num_gpus": inst.resources.gpu,
            "metadata": {"rao_pipeline": c.name, "rao_instance": inst.name, "rao_fingerprint": job.fingerprint},
        });
        let env: serde_json::Map<String, Value> = crate::exec::exec_env(c).into_iter().map(|(k, v)| (k, Value::String(v))).collect();
        if !env.is_empty() {
            body["runtime_env"] = json!({"env_vars": env});
        }
        // A head that just started answers "no available agent … try again later" for a while.
        let t0 = std::time::Instant::now();
        loop {
            let resp = self.client.post(format!("{}/api/jobs/", self.address)).json(&body).send().await.map_err(|e| self.unreachable(e))?;
            if resp.status().is_success() {
                return Ok(());
            }
            // Lost a race with another `rao run` submitting the same job: follow theirs.
            if self.job_status(id).await?.is_some() {
                return Ok(());
            }
            let text = resp.text().await.unwrap_or_default();
            if text.contains("try again") && t0.elapsed() < Duration::from_secs(120) {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            return Err(format!("Ray refused job {id}: {}", text.lines().last().unwrap_or("")));
        }
    }

    async fn run_job(&self, c: Arc<Compiled>, job: Job) -> Result<Finished, String> {
        let inst = &c.instances[job.instance];
        let terminal = |s: &str| matches!(s, "SUCCEEDED" | "FAILED" | "STOPPED");
        let mut attempt = 0;
        let id = loop {
            let id = submission_id(&job.fingerprint, attempt);
            match self.job_status(&id).await? {
                // An earlier `rao run`'s job that ended: done if it left a manifest, else it
                // failed or was stopped, and this run submits a fresh one under the next id.
                Some(s) if terminal(&s) => {
                    if let Some(f) = finished_by(&self.store, &job).await? {
                        return Ok(f);
                    }
                    attempt += 1;
                    if attempt > 64 {
                        return Err(format!("{attempt} earlier Ray jobs of `{}` ended without a manifest", inst.name));
                    }
                }
                Some(_) => break id, // still pending or running: follow it
                None => {
                    self.submit(&c, &job, &id).await?;
                    break id;
                }
            }
        };
        self.reporter.emit(Event::Started { instance: inst.name.clone(), fingerprint: job.fingerprint.clone(), attempt: attempt + 1 });
        let mut guard = StopOnDrop { client: self.client.clone(), url: Some(format!("{}/api/jobs/{id}/stop", self.address)) };
        let status = loop {
            match self.job_status(&id).await? {
                Some(s) if terminal(&s) => break s,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        guard.url = None;
        match finished_by(&self.store, &job).await? {
            Some(f) => Ok(f),
            None => Err(format!("Ray job {id} ended {status} without a manifest:\n{}", self.logs_tail(&id).await)),
        }
    }
}

impl Executor for Ray {
    fn name(&self) -> &'static str {
        "ray"
    }
    fn execute(&self, c: Arc<Compiled>, job: Job) -> BoxFuture<'static, Result<Finished, String>> {
        let me = self.clone();
        Box::pin(crate::executor::unless_cancelled(job.cancel.clone(), async move { me.run_job(c, job).await }))
    }
}
