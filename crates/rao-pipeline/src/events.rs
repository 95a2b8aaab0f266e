//! What a run reports as it goes: progress bars on a terminal (`bars.rs`), plain lines
//! otherwise, JSON on request.

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    RunStarted {
        pipeline: String,
        run_id: String,
        instances: usize,
        /// Instances per stage (the instance name up to `@` or `[`): what an ETA counts on.
        stages: BTreeMap<String, usize>,
        /// Each stage's kind: a stage not measured yet is expected to take what finished
        /// instances of its kind took (a final `evaluate` what the loop's held-out ones took).
        #[serde(default)]
        kinds: BTreeMap<String, String>,
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
    /// Inner progress of a running stage (throttled: see `progress.rs`).
    Progress {
        instance: String,
        done: u64,
        total: u64,
        /// What `done` counts: `steps`, `trees`, …
        unit: String,
        /// The latest numbers worth seeing, e.g. `loss 0.412`.
        message: String,
    },
    /// A milestone a stage reports (e.g. a gate check's result), shown as a line of its own.
    Note {
        instance: String,
        message: String,
    },
    /// A point of a curve a running stage records (the warm start's loss and gate at each
    /// check): trackers get it as it comes; the manifest keeps the curve.
    Metric {
        instance: String,
        metric: String,
        step: u64,
        value: f64,
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
    /// Ctrl-C: the running instances are asked to stop (they stop at their next step).
    Cancelling {
        running: Vec<String>,
    },
    /// A running instance that stopped because the run was cancelled.
    Cancelled {
        instance: String,
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
    /// The command stopped with an error of its own (an invalid pipeline file, a store it cannot
    /// open, a run it could not start or record): the last event of a `--json` stream that has
    /// no `run_finished`. The exit status is 2.
    Error {
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
pub struct Reporter {
    emit: Arc<dyn Fn(&Event) + Send + Sync>,
    /// What the reporter holds back, written out by `flush` (see `HeldLines`).
    held: Option<Arc<HeldLines>>,
}

/// How often plain output repeats a running stage's progress (a log, not an animation).
const PLAIN_PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Output lines waiting to be written. A cache hit's line waits for the next other event (or an
/// explicit `Reporter::flush`), so a fully cached run of a hundred stages writes its lines in one
/// system call instead of a hundred; every other line goes out at once, with those before it.
pub struct HeldLines {
    held: Mutex<Vec<u8>>,
    write: fn(&[u8]),
}

impl HeldLines {
    fn new(write: fn(&[u8])) -> Arc<Self> {
        Arc::new(HeldLines { held: Mutex::new(Vec::new()), write })
    }
    fn push(&self, line: &str, hold: bool) {
        let mut held = self.held.lock();
        held.extend_from_slice(line.as_bytes());
        held.push(b'\n');
        if !hold {
            (self.write)(&held);
            held.clear();
        }
    }
    fn flush(&self) {
        let mut held = self.held.lock();
        if !held.is_empty() {
            (self.write)(&held);
            held.clear();
        }
    }
}

impl Drop for HeldLines {
    fn drop(&mut self) {
        self.flush();
    }
}

// A closed stream (`rao run --json | head`) stops the events, not the run.
fn write_stdout(bytes: &[u8]) {
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(bytes);
}
fn write_stderr(bytes: &[u8]) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(bytes);
}

impl Reporter {
    pub fn new(f: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        Reporter { emit: Arc::new(f), held: None }
    }
    pub fn emit(&self, e: Event) {
        (self.emit)(&e)
    }
    /// This reporter, and `also` given every event after it (e.g. live trackers).
    pub fn and_then(self, also: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        let first = self.emit;
        Reporter {
            emit: Arc::new(move |e| {
                first(e);
                also(e)
            }),
            held: self.held,
        }
    }
    /// Write out held-back lines now (the scheduler calls it before it waits, and at its end).
    pub fn flush(&self) {
        if let Some(h) = &self.held {
            h.flush();
        }
    }
    pub fn silent() -> Self {
        Reporter::new(|_| {})
    }
    /// One JSON object per line on stdout.
    pub fn json() -> Self {
        let lines = HeldLines::new(write_stdout);
        let held = lines.clone();
        Reporter {
            emit: Arc::new(move |e| held.push(&serde_json::to_string(e).expect("events serialise"), matches!(e, Event::Cached { .. }))),
            held: Some(lines),
        }
    }
    /// Human lines on stderr; a running stage's progress at most every ten seconds.
    pub fn plain() -> Self {
        let t0 = Instant::now();
        let last_progress: Mutex<HashMap<String, Instant>> = Mutex::new(HashMap::new());
        let lines = HeldLines::new(write_stderr);
        let held = lines.clone();
        let emit = move |e: &Event| {
            if let Event::Progress { instance, .. } = e {
                let mut last = last_progress.lock();
                let now = Instant::now();
                if last.get(instance).is_some_and(|t| now.duration_since(*t) < PLAIN_PROGRESS_EVERY) {
                    return;
                }
                last.insert(instance.clone(), now);
            }
            let t = t0.elapsed().as_secs_f64();
            if let Some(line) = human_line(e) {
                held.push(&format!("[{t:7.2}s] {line}"), matches!(e, Event::Cached { .. }));
            }
        };
        Reporter { emit: Arc::new(emit), held: Some(lines) }
    }
    /// Progress bars when stderr is a terminal, plain lines otherwise.
    pub fn auto() -> Self {
        if std::io::stderr().is_terminal() { crate::bars::reporter() } else { Self::plain() }
    }
}

/// The stage an instance belongs to: its name up to the loop iteration (`@`) or matrix (`[`).
pub fn stage_of(instance: &str) -> &str {
    instance.split(['@', '[']).next().unwrap_or(instance)
}

/// `done/total unit · message`, as progress reads in a line.
pub fn progress_text(done: u64, total: u64, unit: &str, message: &str) -> String {
    let mut s = format!("{done}/{total} {unit}");
    if !message.is_empty() {
        s.push_str(" · ");
        s.push_str(message);
    }
    s
}

/// `text` with control characters other than newline and tab written as escapes (`\u{1b}`):
/// text from a store or a stage's stderr must not drive the terminal (move the cursor, retitle
/// the window, clear the screen).
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return std::borrow::Cow::Borrowed(text);
    }
    text.chars()
        .map(|c| if c.is_control() && c != '\n' && c != '\t' { c.escape_unicode().to_string() } else { c.to_string() })
        .collect::<String>()
        .into()
}

/// An event as a line for people (see [`terminal_safe`]).
pub fn human_line(e: &Event) -> Option<String> {
    human_line_raw(e).map(|l| terminal_safe(&l).into_owned())
}

fn human_line_raw(e: &Event) -> Option<String> {
    Some(match e {
        Event::RunStarted { pipeline, run_id, instances, store, .. } => {
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
        Event::Progress { instance, done, total, unit, message } => {
            format!("progress {instance}: {}", progress_text(*done, *total, unit, message))
        }
        Event::Note { instance, message } => format!("note     {instance}: {message}"),
        // Points of curves go to trackers and the report, not to the screen.
        Event::Metric { .. } => return None,
        Event::Finished { instance, seconds, .. } => format!("done     {instance} ({seconds:.2}s)"),
        Event::Failed { instance, error } => format!("FAILED   {instance}: {error}"),
        Event::Skipped { instance, reason } => format!("skipped  {instance}: {reason}"),
        Event::Cancelling { running } if running.is_empty() => "cancelling: nothing was running".to_string(),
        Event::Cancelling { running } => format!("cancelling: stopping {} (Ctrl-C again to stop at once)", running.join(", ")),
        Event::Cancelled { instance } => format!("stopped  {instance} (cancelled)"),
        Event::Waiting { instance, holder } => format!("waiting  {instance}: {holder} is computing it"),
        Event::Damaged { instance, why, .. } => format!("DAMAGED  {instance}: {why}; set aside, recomputing"),
        Event::Warning { message } => format!("warning: {message}"),
        Event::Error { message } => format!("error: {message}"),
        Event::RunFinished { run_id, status, done, cached, failed, skipped, seconds } => {
            format!("run {run_id} {status} in {seconds:.2}s: {done} ran, {cached} cached, {failed} failed, {skipped} skipped")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static WRITES: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    fn record(bytes: &[u8]) {
        WRITES.with(|w| w.borrow_mut().push(String::from_utf8_lossy(bytes).into_owned()));
    }
    fn writes() -> Vec<String> {
        WRITES.with(|w| w.borrow_mut().drain(..).collect())
    }

    /// Held lines go out in order, in one write, with the next line that is not held, or at a
    /// flush, or when the last reporter goes away; nothing is written twice or lost.
    #[test]
    fn held_lines_are_written_in_order_with_the_next_line_at_a_flush_or_at_the_end() {
        let lines = HeldLines::new(record);
        lines.push("cached a", true);
        lines.push("cached b", true);
        assert!(writes().is_empty());
        lines.push("start c", false);
        assert_eq!(writes(), vec!["cached a\ncached b\nstart c\n"]);
        lines.flush();
        assert!(writes().is_empty(), "an empty flush writes nothing");
        lines.push("cached d", true);
        lines.flush();
        assert_eq!(writes(), vec!["cached d\n"]);
        lines.push("cached e", true);
        drop(lines);
        assert_eq!(writes(), vec!["cached e\n"]);
    }

    #[test]
    fn stage_of_strips_iteration_and_matrix() {
        assert_eq!(stage_of("rollout@12"), "rollout");
        assert_eq!(stage_of("shard[i=1,j=2]"), "shard");
        assert_eq!(stage_of("rollout@3[shard=0]"), "rollout");
        assert_eq!(stage_of("warmstart"), "warmstart");
    }
}
