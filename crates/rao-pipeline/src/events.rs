//! What a run reports as it goes: progress bars on a terminal, plain lines otherwise, JSON on request.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    RunStarted {
        pipeline: String,
        run_id: String,
        instances: usize,
        store: String,
    },
    Cached {
        instance: String,
        fingerprint: String,
    },
    Started {
        instance: String,
        fingerprint: String,
        attempt: u32,
    },
    Retrying {
        instance: String,
        attempt: u32,
        error: String,
        delay_s: f64,
    },
    Finished {
        instance: String,
        fingerprint: String,
        seconds: f64,
    },
    Failed {
        instance: String,
        error: String,
    },
    Skipped {
        instance: String,
        reason: String,
    },
    /// Another run holds this instance's lease: this run waits for its result.
    Waiting {
        instance: String,
        holder: String,
    },
    /// A stored artifact failed its checks; it is set aside and recomputed.
    Damaged {
        instance: String,
        fingerprint: String,
        why: String,
    },
    /// Something went wrong that does not stop the run.
    Warning {
        message: String,
    },
    RunFinished {
        run_id: String,
        status: String,
        done: usize,
        cached: usize,
        failed: usize,
        skipped: usize,
        seconds: f64,
    },
}

/// Where events go; cheap to clone.
#[derive(Clone)]
pub struct Reporter(Arc<dyn Fn(&Event) + Send + Sync>);

impl Reporter {
    pub fn new(f: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        Reporter(Arc::new(f))
    }
    pub fn emit(&self, e: Event) {
        (self.0)(&e)
    }
    pub fn silent() -> Self {
        Reporter::new(|_| {})
    }
    /// One JSON object per line on stdout.
    pub fn json() -> Self {
        // A closed stdout (`rao run --json | head`) stops the events, not the run.
        Reporter::new(|e| {
            use std::io::Write;
            let _ = writeln!(std::io::stdout().lock(), "{}", serde_json::to_string(e).expect("events serialise"));
        })
    }
    /// Human lines on stderr.
    pub fn plain() -> Self {
        let t0 = Instant::now();
        Reporter::new(move |e| {
            let t = t0.elapsed().as_secs_f64();
            if let Some(line) = human_line(e) {
                use std::io::Write;
                let _ = writeln!(std::io::stderr().lock(), "[{t:7.2}s] {line}");
            }
        })
    }
    /// Progress bars when stderr is a terminal, plain lines otherwise.
    pub fn auto() -> Self {
        if std::io::stderr().is_terminal() { Self::bars() } else { Self::plain() }
    }

    fn bars() -> Self {
        use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
        let multi = MultiProgress::new();
        let total = multi.add(ProgressBar::new(0));
        total.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} stages {msg}").unwrap().progress_chars("=> "),
        );
        let running: Mutex<HashMap<String, ProgressBar>> = Mutex::new(HashMap::new());
        Reporter::new(move |e| match e {
            Event::RunStarted { instances, .. } => total.set_length(*instances as u64),
            Event::Started { instance, attempt, .. } => {
                let pb = multi.add(ProgressBar::new_spinner());
                pb.set_style(ProgressStyle::with_template("  {spinner} {msg} {elapsed}").unwrap());
                pb.enable_steady_tick(std::time::Duration::from_millis(120));
                let suffix = if *attempt > 1 { format!(" (attempt {attempt})") } else { String::new() };
                pb.set_message(format!("{instance}{suffix}"));
                if let Some(old) = running.lock().unwrap().insert(instance.clone(), pb) {
                    old.finish_and_clear();
                }
            }
            Event::Finished { instance, .. } | Event::Failed { instance, .. } => {
                if let Some(pb) = running.lock().unwrap().remove(instance) {
                    pb.finish_and_clear();
                }
                total.inc(1);
                if let Some(l) = human_line(e) {
                    multi.println(l).ok();
                }
            }
            Event::Cached { .. } | Event::Skipped { .. } => total.inc(1),
            Event::Retrying { .. } | Event::Waiting { .. } | Event::Damaged { .. } | Event::Warning { .. } => {
                if let Some(l) = human_line(e) {
                    multi.println(l).ok();
                }
            }
            Event::RunFinished { .. } => {
                total.finish_and_clear();
                if let Some(l) = human_line(e) {
                    multi.println(l).ok();
                }
            }
        })
    }
}

fn human_line(e: &Event) -> Option<String> {
    Some(match e {
        Event::RunStarted { pipeline, run_id, instances, store } => {
            format!("run {run_id} of `{pipeline}`: {instances} stage instances, store {store}")
        }
        Event::Cached { instance, .. } => format!("cached   {instance}"),
        Event::Started { instance, attempt, .. } => {
            if *attempt > 1 {
                format!("start    {instance} (attempt {attempt})")
            } else {
                format!("start    {instance}")
            }
        }
        Event::Retrying { instance, attempt, error, delay_s } => {
            format!("retry    {instance} after attempt {attempt} failed ({error}); waiting {delay_s:.1}s")
        }
        Event::Finished { instance, seconds, .. } => format!("done     {instance} ({seconds:.2}s)"),
        Event::Failed { instance, error } => format!("FAILED   {instance}: {error}"),
        Event::Skipped { instance, reason } => format!("skipped  {instance}: {reason}"),
        Event::Waiting { instance, holder } => format!("waiting  {instance}: {holder} is computing it"),
        Event::Damaged { instance, why, .. } => format!("DAMAGED  {instance}: {why}; set aside, recomputing"),
        Event::Warning { message } => format!("warning: {message}"),
        Event::RunFinished { run_id, status, done, cached, failed, skipped, seconds } => {
            format!("run {run_id} {status} in {seconds:.2}s: {done} ran, {cached} cached, {failed} failed, {skipped} skipped")
        }
    })
}
