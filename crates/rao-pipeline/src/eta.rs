//! How long a run has left, estimated from the instances that finished in it.
//!
//! Each stage's instances are expected to take as long as that stage's finished ones did on
//! average (or, before any has finished, its kind's); a running instance that reports progress
//! is expected to go on at its own pace. While a stage left to run has nothing to measure it by,
//! there is no estimate, only the name of that stage. The work left is divided by the
//! parallelism the run has shown so far (busy
//! time of finished and running instances over the wall clock since the first start). Cached
//! and skipped instances are no work.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::events::{Event, stage_of};

#[derive(Debug, Default, Clone, Copy)]
struct Mean {
    sum: f64,
    n: u32,
}

impl Mean {
    fn add(&mut self, x: f64) {
        self.sum += x;
        self.n += 1;
    }
    fn get(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum / self.n as f64)
    }
}

#[derive(Debug)]
struct Running {
    started: Instant,
    /// (done, total) of the last progress update.
    progress: Option<(u64, u64)>,
}

/// The state an estimate is made from; fed with the run's events.
#[derive(Debug, Default)]
pub struct Eta {
    /// Instances per stage in the whole run.
    planned: BTreeMap<String, usize>,
    /// Instances per stage that are settled (finished, failed, cached, skipped, cancelled).
    settled: BTreeMap<String, usize>,
    running: HashMap<String, Running>,
    seconds: BTreeMap<String, Mean>,
    /// Stage → kind, and the seconds of finished instances per kind.
    kinds: BTreeMap<String, String>,
    kind_seconds: BTreeMap<String, Mean>,
    all_seconds: Mean,
    first_start: Option<Instant>,
    /// Instances that ran to completion (or failure) in this run; cached ones do not count.
    pub ran: usize,
    /// Instances that were (or will be) taken from the store or skipped.
    pub not_run: usize,
    pub total: usize,
}

impl Eta {
    /// Instances this run executes (known so far): the total less what was cached or skipped.
    pub fn to_run(&self) -> usize {
        self.total.saturating_sub(self.not_run)
    }

    pub fn observe(&mut self, e: &Event, now: Instant) {
        match e {
            Event::RunStarted { instances, stages, kinds, .. } => {
                self.total = *instances;
                self.planned = stages.clone();
                self.kinds = kinds.clone();
            }
            Event::Started { instance, .. } => {
                self.first_start.get_or_insert(now);
                self.running.insert(instance.clone(), Running { started: now, progress: None });
            }
            Event::Progress { instance, done, total, .. } => {
                if let Some(r) = self.running.get_mut(instance) {
                    r.progress = Some((*done, *total));
                }
            }
            Event::Finished { instance, seconds, .. } => {
                self.running.remove(instance);
                let stage = stage_of(instance);
                self.seconds.entry(stage.to_string()).or_default().add(*seconds);
                if let Some(kind) = self.kinds.get(stage) {
                    self.kind_seconds.entry(kind.clone()).or_default().add(*seconds);
                }
                self.all_seconds.add(*seconds);
                self.ran += 1;
                self.settle(instance);
            }
            Event::Failed { instance, .. } => {
                // A failure is no measure of how long the stage takes.
                self.ran += usize::from(self.running.remove(instance).is_some());
                self.settle(instance);
            }
            Event::Cached { instance, .. } | Event::Skipped { instance, .. } | Event::Cancelled { instance } => {
                self.running.remove(instance);
                self.not_run += 1;
                self.settle(instance);
            }
            _ => {}
        }
    }

    fn settle(&mut self, instance: &str) {
        *self.settled.entry(stage_of(instance).to_string()).or_default() += 1;
    }

    /// Time left, once anything has finished to measure it by.
    pub fn remaining(&self, now: Instant) -> Option<Estimate> {
        if self.all_seconds.n == 0 && self.running.values().all(|r| r.left_per_done().is_none()) {
            return None;
        }
        let mean_of = |stage: &str| {
            let of_kind = || self.kinds.get(stage).and_then(|k| self.kind_seconds.get(k)).and_then(Mean::get);
            self.seconds.get(stage).and_then(Mean::get).or_else(of_kind)
        };
        let mut work = 0.0;
        let mut unmeasured: Option<String> = None;
        let mut busy = self.all_seconds.sum;
        let mut running_per_stage: BTreeMap<&str, usize> = BTreeMap::new();
        for (name, r) in &self.running {
            let stage = stage_of(name);
            *running_per_stage.entry(stage).or_default() += 1;
            let elapsed = now.saturating_duration_since(r.started).as_secs_f64();
            busy += elapsed;
            match (r.left_per_done(), mean_of(stage)) {
                // Its own pace: the time per unit so far, for the units left.
                (Some(ratio), _) => work += elapsed * ratio,
                (None, Some(mean)) => work += (mean - elapsed).max(0.0),
                (None, None) => {
                    unmeasured.get_or_insert_with(|| stage.to_string());
                }
            }
        }
        for (stage, &planned) in &self.planned {
            let settled = self.settled.get(stage).copied().unwrap_or(0);
            let running = running_per_stage.get(stage.as_str()).copied().unwrap_or(0);
            let waiting = planned.saturating_sub(settled + running);
            if waiting > 0 {
                match mean_of(stage) {
                    Some(mean) => work += waiting as f64 * mean,
                    None => {
                        unmeasured.get_or_insert_with(|| stage.clone());
                    }
                }
            }
        }
        if let Some(stage) = unmeasured {
            return Some(Estimate::Unmeasured(stage));
        }
        // The parallelism the run has shown: busy time (finished and running) over wall clock.
        let parallelism = match self.first_start {
            Some(t0) => {
                let wall = now.saturating_duration_since(t0).as_secs_f64();
                if wall > 0.0 { (busy / wall).max(1.0) } else { 1.0 }
            }
            None => 1.0,
        };
        Some(Estimate::Left(Duration::from_secs_f64((work / parallelism).max(0.0))))
    }
}

impl Running {
    /// Units left per unit done, once the stage reported any done.
    fn left_per_done(&self) -> Option<f64> {
        match self.progress {
            Some((done, total)) if done > 0 && total >= done => Some((total - done) as f64 / done as f64),
            _ => None,
        }
    }
}

/// How long a run has left.
#[derive(Debug, Clone, PartialEq)]
pub enum Estimate {
    Left(Duration),
    /// A stage still to run has nothing to measure it by yet (no finished instance of it or of
    /// its kind): no honest number until it has run once.
    Unmeasured(String),
}

impl std::fmt::Display for Estimate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Estimate::Left(left) => write!(f, "{}", clock(*left)),
            Estimate::Unmeasured(stage) => write!(f, "once `{stage}` has run"),
        }
    }
}

/// `1:02:03` or `4:05`.
pub fn clock(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 { format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60) } else { format!("{}:{:02}", s / 60, s % 60) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(name: &str) -> Event {
        Event::Started { instance: name.into(), fingerprint: String::new(), attempt: 1 }
    }
    fn finished(name: &str, seconds: f64) -> Event {
        Event::Finished { instance: name.into(), fingerprint: String::new(), seconds }
    }
    fn run_started(stages: &[(&str, usize)]) -> Event {
        Event::RunStarted {
            pipeline: "p".into(),
            run_id: "r".into(),
            instances: stages.iter().map(|s| s.1).sum(),
            stages: stages.iter().map(|(s, n)| (s.to_string(), *n)).collect(),
            kinds: stages.iter().map(|(s, _)| (s.to_string(), s.trim_end_matches(|c: char| c.is_ascii_digit()).to_string())).collect(),
            store: String::new(),
        }
    }

    #[test]
    fn nothing_finished_means_no_estimate_and_cached_instances_are_no_work() {
        let mut eta = Eta::default();
        let t0 = Instant::now();
        eta.observe(&run_started(&[("a", 10), ("b", 2)]), t0);
        for k in 0..8 {
            eta.observe(&Event::Cached { instance: format!("a@{k}"), fingerprint: String::new() }, t0);
        }
        assert_eq!(eta.to_run(), 4);
        eta.observe(&started("a@8"), t0);
        assert_eq!(eta.remaining(t0), None);
    }

    #[test]
    fn each_stage_is_expected_to_take_what_its_finished_instances_took() {
        let mut eta = Eta::default();
        let t0 = Instant::now();
        // One slow warm start, then a loop of fast rollouts: the warm start does not inflate them.
        eta.observe(&run_started(&[("warmstart", 1), ("rollout", 5)]), t0);
        eta.observe(&started("warmstart"), t0);
        eta.observe(&finished("warmstart", 60.0), t0 + Duration::from_secs(60));
        eta.observe(&started("rollout@1"), t0 + Duration::from_secs(60));
        eta.observe(&finished("rollout@1", 2.0), t0 + Duration::from_secs(62));
        let left = secs(eta.remaining(t0 + Duration::from_secs(62)));
        assert!((left - 8.0).abs() < 1e-6, "{left}");
    }

    #[test]
    fn a_running_stage_with_progress_goes_on_at_its_own_pace() {
        let mut eta = Eta::default();
        let t0 = Instant::now();
        eta.observe(&run_started(&[("prep", 1), ("warmstart", 1)]), t0);
        eta.observe(&started("prep"), t0);
        eta.observe(&finished("prep", 1.0), t0 + Duration::from_secs(1));
        eta.observe(&started("warmstart"), t0 + Duration::from_secs(1));
        let unit = |done| Event::Progress { instance: "warmstart".into(), done, total: 1000, unit: "steps".into(), message: String::new() };
        eta.observe(&unit(250), t0 + Duration::from_secs(11));
        // 250 steps in 10 s: 750 more take 30 s.
        let left = secs(eta.remaining(t0 + Duration::from_secs(11)));
        assert!((left - 30.0).abs() < 1e-6, "{left}");
    }

    #[test]
    fn work_is_divided_by_the_parallelism_seen_so_far() {
        let mut eta = Eta::default();
        let t0 = Instant::now();
        eta.observe(&run_started(&[("s", 6)]), t0);
        // Two at a time, 10 s each: 20 s of work in 10 s of wall clock.
        eta.observe(&started("s[i=0]"), t0);
        eta.observe(&started("s[i=1]"), t0);
        eta.observe(&finished("s[i=0]", 10.0), t0 + Duration::from_secs(10));
        eta.observe(&finished("s[i=1]", 10.0), t0 + Duration::from_secs(10));
        let left = secs(eta.remaining(t0 + Duration::from_secs(10)));
        assert!((left - 20.0).abs() < 1e-6, "{left}");
    }

    fn secs(e: Option<Estimate>) -> f64 {
        match e {
            Some(Estimate::Left(d)) => d.as_secs_f64(),
            other => panic!("no estimate: {other:?}"),
        }
    }

    #[test]
    fn a_stage_not_measured_yet_gives_no_number_but_its_name() {
        let mut eta = Eta::default();
        let t0 = Instant::now();
        eta.observe(&run_started(&[("prep", 2), ("evaluate", 1)]), t0);
        eta.observe(&started("prep[i=0]"), t0);
        eta.observe(&finished("prep[i=0]", 4.0), t0 + Duration::from_secs(4));
        let e = eta.remaining(t0 + Duration::from_secs(4)).unwrap();
        assert_eq!(e, Estimate::Unmeasured("evaluate".into()));
        assert_eq!(e.to_string(), "once `evaluate` has run");
        eta.observe(&started("prep[i=1]"), t0 + Duration::from_secs(4));
        eta.observe(&finished("prep[i=1]", 4.0), t0 + Duration::from_secs(8));
        eta.observe(&started("evaluate"), t0 + Duration::from_secs(8));
        eta.observe(&finished("evaluate", 1.0), t0 + Duration::from_secs(9));
        assert_eq!(eta.remaining(t0 + Duration::from_secs(9)), Some(Estimate::Left(Duration::ZERO)));
    }

    #[test]
    fn a_stage_not_measured_yet_takes_what_its_kind_took() {
        // `heldout1` and `heldout2` share a kind (the helper names kinds by the stage's name
        // without its digits): the second is expected to take what the first took.
        let mut eta = Eta::default();
        let t0 = Instant::now();
        eta.observe(&run_started(&[("heldout1", 1), ("heldout2", 1)]), t0);
        eta.observe(&started("heldout1"), t0);
        eta.observe(&finished("heldout1", 5.0), t0 + Duration::from_secs(5));
        assert!((secs(eta.remaining(t0 + Duration::from_secs(5))) - 5.0).abs() < 1e-6);
    }

    #[test]
    fn clock_reads_minutes_or_hours() {
        assert_eq!(clock(Duration::from_secs(65)), "1:05");
        assert_eq!(clock(Duration::from_secs(3723)), "1:02:03");
    }
}
