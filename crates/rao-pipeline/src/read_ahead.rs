//! Manifests read ahead from a bucket, many requests in flight.
//!
//! A run (and `plan`, `status`) meets instances one by one along the dependencies and reads one
//! manifest per instance (and, for a cache hit, lists each output): against a bucket a fully
//! cached run is one round trip after another. But every fingerprint that does not wait on a
//! loop's decision follows from the plan alone, so those manifests are requested before the walk,
//! many at once; the walk then takes what was read for the fingerprint it computed itself, and
//! reads anything else as before. Read-ahead is only an earlier look: a failed request or a size
//! that does not match leaves the instance to the walk, which reports what it finds. A local
//! store is not read ahead: there a read costs microseconds, less than starting threads would.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use futures::StreamExt;

use crate::compile::Compiled;
use crate::manifest::{self, ManifestState};
use crate::store::Store;

/// Requests in flight at once.
const IN_FLIGHT: usize = 16;

/// What was read ahead for one instance: the fingerprint it was read for, and what was found.
pub type Ahead = Option<(String, ManifestState)>;

/// Whether a manifest that is done must also have every file at its recorded size.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Sizes {
    Check,
    Skip,
}

/// The fingerprint of every instance that the plan alone determines (its inputs wait on no loop
/// decision), except those `skip` marks; `None` for the others.
fn plan_fingerprints(c: &Compiled, skip: &[bool]) -> Vec<Option<String>> {
    let exits: Vec<Option<u32>> = c.loops.iter().map(|l| l.exit_iteration(|_| None)).collect();
    let mut fps: Vec<Option<String>> = vec![None; c.instances.len()];
    for &i in &c.order {
        fps[i] = c.fp_parts(i, |j| fps[j].clone(), |l| exits[l]).map(|p| p.fingerprint());
    }
    for (fp, &skip) in fps.iter_mut().zip(skip) {
        if skip {
            *fp = None;
        }
    }
    fps
}

/// For a bucket, the manifests of the instances whose fingerprints the plan determines (by
/// instance; not those `skip` marks), read concurrently; nothing for a local store. With
/// [`Sizes::Check`] a done manifest whose files are not all there at their sizes is left out. The first failed request stops further ones (a bucket that cannot be reached is
/// reported by the walk, once, not retried here for every instance), and so does finding more
/// missing than done once a round of requests is back (a run that computes most of its stages
/// would otherwise pay a request for each before it starts).
pub async fn read(c: &Compiled, store: &Store, skip: &[bool], sizes: Sizes) -> Vec<Ahead> {
    let mut out: Vec<Ahead> = vec![None; c.instances.len()];
    if store.local_root().is_some() {
        return out;
    }
    let fps = plan_fingerprints(c, skip);
    let (stop, done, missing) = (AtomicBool::new(false), AtomicUsize::new(0), AtomicUsize::new(0));
    let (stop, done, missing) = (&stop, &done, &missing);
    let found: Vec<(usize, String, ManifestState)> = futures::stream::iter(fps.into_iter().enumerate())
        .filter_map(|(i, fp)| async move { Some((i, fp?)) })
        .map(|(i, fp)| async move {
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            let state = match manifest::read(store, &fp).await {
                Ok(ManifestState::Done(m)) if sizes == Sizes::Check => match manifest::check_sizes(store, &m).await {
                    Ok(Ok(())) => Ok(ManifestState::Done(m)),
                    Ok(Err(_)) => return None,
                    Err(e) => Err(e),
                },
                state => state,
            };
            match state {
                Ok(state) => {
                    let (d, m) = match state {
                        ManifestState::Missing => (done.load(Ordering::Relaxed), missing.fetch_add(1, Ordering::Relaxed) + 1),
                        _ => (done.fetch_add(1, Ordering::Relaxed) + 1, missing.load(Ordering::Relaxed)),
                    };
                    if m >= IN_FLIGHT && m > d {
                        stop.store(true, Ordering::Relaxed);
                    }
                    Some((i, fp, state))
                }
                Err(_) => {
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
        out[i] = Some((fp, state));
    }
    out
}
