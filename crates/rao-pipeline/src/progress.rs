//! A running stage's inner progress (`StageContext::progress`), thinned out before it becomes
//! events: a training loop may call it every few milliseconds, a reader wants a few updates a
//! second and a bounded number per stage.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::events::{Event, Reporter};

/// Two updates of one stage are at least this far apart (first and last always go out).
const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// At most one update per percent of the total: ≤ 101 progress events per stage instance.
const BUCKETS: u64 = 100;

/// When the last update went out, and at which percent.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    last: Option<(Instant, u64)>,
}

impl Throttle {
    /// Whether an update at `done` of `total` goes out now (and if so, remember it).
    pub(crate) fn admit(&mut self, done: u64, total: u64, now: Instant) -> bool {
        let bucket = if total == 0 { 0 } else { done.min(total) * BUCKETS / total };
        let admit = match self.last {
            None => true,
            Some(_) if done >= total => true,
            Some((at, last_bucket)) => bucket != last_bucket && now.duration_since(at) >= MIN_INTERVAL,
        };
        if admit {
            self.last = Some((now, bucket));
        }
        admit
    }
}

/// What a stage uses to report: its instance's name, the run's reporter and the throttle.
pub(crate) struct StageProgress {
    pub(crate) instance: String,
    pub(crate) reporter: Reporter,
    pub(crate) throttle: Mutex<Throttle>,
}

impl StageProgress {
    pub(crate) fn new(instance: &str, reporter: Reporter) -> Self {
        StageProgress { instance: instance.to_string(), reporter, throttle: Mutex::new(Throttle::default()) }
    }

    pub(crate) fn progress(&self, done: u64, total: u64, unit: &str, message: String) {
        if !self.throttle.lock().unwrap_or_else(|p| p.into_inner()).admit(done, total, Instant::now()) {
            return;
        }
        self.reporter.emit(Event::Progress { instance: self.instance.clone(), done, total, unit: unit.to_string(), message });
    }

    pub(crate) fn note(&self, message: String) {
        self.reporter.emit(Event::Note { instance: self.instance.clone(), message });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_and_last_always_go_out_the_rest_at_most_once_per_percent_and_interval() {
        let mut t = Throttle::default();
        let t0 = Instant::now();
        assert!(t.admit(0, 1000, t0));
        // Same percent, later: no.
        assert!(!t.admit(5, 1000, t0 + Duration::from_secs(5)));
        // Next percent, too soon: no.
        assert!(!t.admit(20, 1000, t0 + Duration::from_millis(50)));
        assert!(t.admit(20, 1000, t0 + Duration::from_millis(150)));
        assert!(t.admit(1000, 1000, t0 + Duration::from_millis(151)));
        // A total of 0 does not divide by zero.
        let mut z = Throttle::default();
        assert!(z.admit(0, 0, t0));
        assert!(z.admit(0, 0, t0));
    }

    #[test]
    fn a_fast_loop_of_a_million_steps_makes_at_most_a_hundred_and_one_updates() {
        let mut t = Throttle::default();
        let t0 = Instant::now();
        let n = (0..=1_000_000u64).filter(|&i| t.admit(i, 1_000_000, t0 + Duration::from_millis(i))).count();
        assert!(n <= 101, "{n} updates");
        assert!(n >= 100, "{n} updates: one per percent when the loop is slow enough");
    }
}
