//! The terminal display of a run: one line for the run (clock, instances done of those to run,
//! ETA, the latest note), one per running instance (its own progress), finished instances and
//! notes printed above them — but instances that took under [`QUICK`] only counted in the run's
//! line (a loop's small stages would scroll everything else away).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressState, ProgressStyle};

use crate::eta::Eta;
use crate::events::{Event, Reporter, human_line};

/// Instances that finish faster than this are counted, not listed.
const QUICK: f64 = 2.0;

/// A note longer than this is cut in the run's line (it is printed whole above the bars).
const NOTE_IN_LINE: usize = 60;

fn run_style(eta: Arc<Mutex<Eta>>) -> ProgressStyle {
    // `wide_msg` is cut to the terminal's width: a line that wrapped would be left behind on
    // the screen when the bars are redrawn.
    ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} done · ETA {eta_left}{wide_msg}")
        .expect("a valid template")
        .progress_chars("=> ")
        .with_key("eta_left", move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
            let left = eta.lock().remaining(Instant::now());
            let _ = match left {
                Some(e) => write!(w, "{e}"),
                None => write!(w, "?"),
            };
        })
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("  {spinner} {prefix} {elapsed} {wide_msg}").expect("a valid template")
}

fn inner_style() -> ProgressStyle {
    ProgressStyle::with_template("  {spinner} {prefix} {elapsed} [{bar:20}] {pos}/{len} {wide_msg}")
        .expect("a valid template")
        .progress_chars("=> ")
}

struct Bars {
    multi: MultiProgress,
    run: ProgressBar,
    eta: Arc<Mutex<Eta>>,
    running: Mutex<HashMap<String, ProgressBar>>,
    /// `· N cached`, `· N quick` and the latest note, after the ETA.
    cached: Mutex<usize>,
    quick: Mutex<usize>,
    last_note: Mutex<String>,
}

impl Bars {
    fn new() -> Self {
        let multi = MultiProgress::new();
        let eta = Arc::new(Mutex::new(Eta::default()));
        let run = multi.add(ProgressBar::new(0));
        run.set_style(run_style(eta.clone()));
        // The clock and the ETA move between events.
        run.enable_steady_tick(Duration::from_secs(1));
        Bars {
            multi,
            run,
            eta,
            running: Mutex::new(HashMap::new()),
            cached: Mutex::new(0),
            quick: Mutex::new(0),
            last_note: Mutex::new(String::new()),
        }
    }

    fn print(&self, e: &Event) {
        if let Some(line) = human_line(e) {
            self.multi.println(line).ok();
        }
    }

    fn refresh_run_line(&self) {
        let (to_run, ran) = {
            let eta = self.eta.lock();
            (eta.to_run(), eta.ran)
        };
        self.run.set_length(to_run as u64);
        self.run.set_position(ran as u64);
        let cached = *self.cached.lock();
        let note = self.last_note.lock().clone();
        let mut msg = String::new();
        if cached > 0 {
            msg.push_str(&format!(" · {cached} cached"));
        }
        let quick = *self.quick.lock();
        if quick > 0 {
            msg.push_str(&format!(" · {quick} under {QUICK} s"));
        }
        if !note.is_empty() {
            msg.push_str(" · ");
            msg.push_str(&note);
        }
        self.run.set_message(msg);
    }

    fn drop_bar(&self, instance: &str) {
        if let Some(pb) = self.running.lock().remove(instance) {
            pb.finish_and_clear();
        }
    }

    fn on(&self, e: &Event) {
        // The model first, the bars after: a bar drawing reads the model (never both locks).
        self.eta.lock().observe(e, Instant::now());
        match e {
            Event::RunStarted { .. } => {}
            Event::Started { instance, attempt, .. } => {
                let pb = self.multi.add(ProgressBar::new_spinner());
                pb.set_style(spinner_style());
                pb.enable_steady_tick(Duration::from_millis(120));
                pb.set_prefix(instance.clone());
                if *attempt > 1 {
                    pb.set_message(format!("(attempt {attempt})"));
                }
                if let Some(old) = self.running.lock().insert(instance.clone(), pb) {
                    old.finish_and_clear();
                }
            }
            Event::Progress { instance, done, total, unit, message } => {
                if let Some(pb) = self.running.lock().get(instance) {
                    if pb.length().is_none() {
                        pb.set_style(inner_style());
                    }
                    pb.set_length(*total);
                    pb.set_position(*done);
                    pb.set_message(if message.is_empty() { unit.clone() } else { format!("{unit} · {message}") });
                }
            }
            Event::Note { instance, message } => {
                let mut short: String = message.chars().take(NOTE_IN_LINE).collect();
                if short.len() < message.len() {
                    short.push('…');
                }
                *self.last_note.lock() = format!("{instance}: {short}");
                self.print(e);
            }
            Event::Finished { instance, seconds, .. } if *seconds < QUICK => {
                self.drop_bar(instance);
                *self.quick.lock() += 1;
            }
            Event::Finished { instance, .. } | Event::Failed { instance, .. } | Event::Cancelled { instance } => {
                self.drop_bar(instance);
                self.print(e);
            }
            Event::Cached { instance, .. } => {
                // Reused after waiting for another run's lease: its spinner goes.
                self.drop_bar(instance);
                *self.cached.lock() += 1;
            }
            Event::Skipped { .. } | Event::Metric { .. } => {}
            Event::Retrying { .. }
            | Event::Waiting { .. }
            | Event::Damaged { .. }
            | Event::Warning { .. }
            | Event::Error { .. }
            | Event::Cancelling { .. } => self.print(e),
            Event::RunFinished { .. } => {
                // Nothing keeps drawing once the run is over (a spinner left ticking would be
                // drawn again under the lines printed after the run).
                for (_, pb) in self.running.lock().drain() {
                    pb.finish_and_clear();
                }
                self.run.finish_and_clear();
                self.print(e);
                return;
            }
        }
        self.refresh_run_line();
    }
}

/// Progress bars on stderr (a terminal).
pub fn reporter() -> Reporter {
    let bars = Bars::new();
    Reporter::new(move |e| bars.on(e))
}
