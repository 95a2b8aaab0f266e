//! Manifests read ahead from a bucket, many requests in flight.
//!
//! A run (and `plan`, `status`) meets instances one by one along the dependencies and reads one
//! manifest per instance (and, for a cache hit, lists each output): against a bucket a fully
//! cached run is one round trip after another. But every fingerprint that does not wait on a
//! loop's decision follows from the plan alone, so those manifests are requested before the walk,
//! many at once; the walk then takes what was read for the fingerprint it computed itself, and
//! reads anything else as before. Read-ahead is only an earlier look: a failed or slow request or
//! a size that does not match leaves the instance to the walk, which reports what it finds, and
//! what was read is used only while it is fresh (a run that computes for hours reads the
//! manifests below again when it gets there: another run may have replaced them meanwhile). A
//! local store is not read ahead: there a read costs microseconds, less than starting threads
//! would.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::compile::Compiled;
use crate::manifest::{self, ManifestState};
use crate::store::Store;

/// Requests in flight at once.
const IN_FLIGHT: usize = 16;
/// A request (a manifest and its size check) that takes longer stops the read-ahead: the walk
/// reads that instance, and reports a bucket that cannot be reached, with the store's own retries.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// How long what was read stays usable.
const FRESH_FOR: Duration = Duration::from_secs(10);

/// What was read ahead, by instance: the fingerprint it was read for and what was found.
#[derive(Default)]
pub struct ReadAhead {
    at: Option<Instant>,
    entries: Vec<Option<(String, ManifestState)>>,
}

impl ReadAhead {
    /// What was found for instance `i` under fingerprint `fp`, if it was read for that
    /// fingerprint and is still fresh (each entry is handed out once).
    pub fn take(&mut self, i: usize, fp: &str) -> Option<ManifestState> {
        if self.at.is_none_or(|at| at.elapsed() > FRESH_FOR) {
            self.entries.clear();
            return None;
        }
        match self.entries.get_mut(i)?.take()? {
            (ahead_fp, state) if ahead_fp == fp => Some(state),
            _ => None,
        }
    }
}

/// The fingerprint of every instance that the plan alone determines (its inputs wait on no loop
/// decision), except those `skip` marks; `None` for the others.
fn plan_fingerprints(c: &Compiled, skip: &[bool]) -> Vec<Option<String>> {
    let exits: Vec<Option<u32>> = c.loops.iter().map(|l| l.exit_iteration(|_| None)).collect();
    let mut fps: Vec<Option<String>> = vec![None; c.instances.len()];
    for &i in &c.order {
        fps[i] = c.fingerprint(i, |j| fps[j].clone(), |l| exits[l]);
    }
    for (fp, &skip) in fps.iter_mut().zip(skip) {
        if skip {
            *fp = None;
        }
    }
    fps
}

/// For a bucket, the manifests of the instances whose fingerprints the plan determines (by
/// instance; not those `skip` marks), read concurrently; nothing for a local store. A done
/// manifest whose files are not all there at their sizes is left out (the walk reports it).
/// The first failed or slow request stops further ones (a bucket that cannot be reached is
/// reported by the walk, once, not retried here for every instance), and so does finding more
/// than 16 missing and more missing than done (a run that computes most of its stages would
/// otherwise pay a request for each before it starts); requests already in flight finish.
pub async fn read(c: &Compiled, store: &Store, skip: &[bool]) -> ReadAhead {
    let mut out = ReadAhead { at: None, entries: vec![None; c.instances.len()] };
    if store.local_root().is_some() {
        return out;
    }
    let fps = plan_fingerprints(c, skip);
    // Iterations of a loop that stops on a metric may never run: missing, they say nothing.
    let may_not_run = |i: usize| c.instances[i].iteration.is_some_and(|(l, _)| c.loops[l].stop.is_some());
    let (stop, done, missing) = (AtomicBool::new(false), AtomicUsize::new(0), AtomicUsize::new(0));
    let (stop, done, missing) = (&stop, &done, &missing);
    let found: Vec<(usize, String, ManifestState)> = futures::stream::iter(fps.into_iter().enumerate())
        .filter_map(|(i, fp)| async move { Some((i, fp?)) })
        .map(|(i, fp)| async move {
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            let request = async {
                match manifest::read(store, &fp).await {
                    Ok(ManifestState::Done(m)) => match manifest::check_sizes(store, &m).await {
                        Ok(Ok(())) => Ok(Some(ManifestState::Done(m))),
                        Ok(Err(_)) => Ok(None),
                        Err(e) => Err(e),
                    },
                    state => state.map(Some),
                }
            };
            match tokio::time::timeout(REQUEST_DEADLINE, request).await {
                Ok(Ok(Some(state))) => {
                    let (d, m) = match state {
                        ManifestState::Missing if may_not_run(i) => (0, 0),
                        ManifestState::Missing => (done.load(Ordering::Relaxed), missing.fetch_add(1, Ordering::Relaxed) + 1),
                        _ => (done.fetch_add(1, Ordering::Relaxed) + 1, missing.load(Ordering::Relaxed)),
                    };
                    if m >= IN_FLIGHT && m > d {
                        stop.store(true, Ordering::Relaxed);
                    }
                    Some((i, fp, state))
                }
                Ok(Ok(None)) => None,
                Ok(Err(_)) | Err(_) => {
                    stop.store(true, Ordering::Relaxed);
                    None
                }
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .filter_map(|x| async move { x })
        .collect()
        .await;
    for (i, fp, state) in found {
        out.entries[i] = Some((fp, state));
    }
    out.at = Some(Instant::now());
    out
}
