//! A running stage's inner progress (`StageContext::progress`), thinned out before it becomes
//! events: a training loop may call it every few milliseconds, a reader wants a few updates a
//! second and a bounded number per stage.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use crate::events::{Event, Reporter};

/// Two updates of one stage are at least this far apart (first and last always go out).
const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// One update per percent of the total at most…
const BUCKETS: u64 = 100;
/// …unless the last one is this old: a long stage whose percent moves slowly still shows its
/// latest step (and loss) every second.
const MAX_SILENCE: Duration = Duration::from_secs(1);

/// When the last update went out, and at which percent.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    last: Option<(Instant, u64)>,
}

impl Throttle {
    /// Whether an update at `done` of `total` goes out now (and if so, remember it).
    pub(crate) fn admit(&mut self, done: u64, total: u64, now: Instant) -> bool {
        // Nothing to do is all done.
        let bucket = (done.min(total) * BUCKETS).checked_div(total).unwrap_or(BUCKETS);
        let admit = match self.last {
            None => true,
            // The end goes out once.
            Some((_, last_bucket)) if done >= total && last_bucket != BUCKETS => true,
            Some((at, last_bucket)) => {
                let since = now.duration_since(at);
                (bucket != last_bucket && since >= MIN_INTERVAL) || since >= MAX_SILENCE
            }
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
        if !self.throttle.lock().admit(done, total, Instant::now()) {
            return;
        }
        self.reporter.emit(Event::Progress { instance: self.instance.clone(), done, total, unit: unit.to_string(), message });
    }

    pub(crate) fn metric(&self, metric: &str, step: u64, value: f64) {
        self.reporter.emit(Event::Metric { instance: self.instance.clone(), metric: metric.to_string(), step, value });
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
        // Same percent, soon after: no; a second later: yes.
        assert!(!t.admit(5, 1000, t0 + Duration::from_millis(500)));
        assert!(t.admit(6, 1000, t0 + Duration::from_millis(1000)));
        // Next percent, too soon: no.
        assert!(!t.admit(20, 1000, t0 + Duration::from_millis(1050)));
        assert!(t.admit(20, 1000, t0 + Duration::from_millis(1150)));
        assert!(t.admit(1000, 1000, t0 + Duration::from_millis(1151)));
        // The end goes out once.
        assert!(!t.admit(1000, 1000, t0 + Duration::from_millis(1152)));
        // A total of 0 does not divide by zero.
        let mut z = Throttle::default();
        assert!(z.admit(0, 0, t0));
        assert!(!z.admit(0, 0, t0));
    }

    #[test]
    fn updates_come_ten_a_second_at_most_and_once_per_percent_when_slower() {
        let mut t = Throttle::default();
        let t0 = Instant::now();
        // A step every microsecond: a second in all.
        let n = (0..=1_000_000u64).filter(|&i| t.admit(i, 1_000_000, t0 + Duration::from_micros(i))).count();
        assert!((10..=11).contains(&n), "{n} updates: one per 100 ms");
        // A step every 10 µs (10 s in all, a percent every 100 ms): one per percent.
        let mut t = Throttle::default();
        let n = (0..=1_000_000u64).filter(|&i| t.admit(i, 1_000_000, t0 + Duration::from_micros(10 * i))).count();
        assert!((100..=101).contains(&n), "{n} updates");
    }

    #[test]
    fn a_slow_percent_still_updates_every_second() {
        let mut t = Throttle::default();
        let t0 = Instant::now();
        // 100,000 steps at 5 ms each: a percent takes 5 s, an update comes every second.
        let n = (0..=2_000u64).filter(|&i| t.admit(i, 100_000, t0 + Duration::from_millis(5 * i))).count();
        assert!((10..=12).contains(&n), "{n} updates in 10 s");
    }
}
