//! What the store says about a compiled pipeline: fingerprints, finished instances, loop decisions.
//! `plan`, `status` and `rao exec` read it; none of them needs a scheduler.

use crate::compile::{Compiled, Source};
use crate::exec::{IndexEntry, index_key};
use crate::fingerprint::FpParts;
use crate::manifest::{self, Manifest, ManifestState};
use crate::store::{Store, StoreResult};

pub struct Snapshot {
    pub parts: Vec<Option<FpParts>>,
    pub fps: Vec<Option<String>>,
    pub manifests: Vec<Option<Manifest>>,
    pub loop_exit: Vec<Option<u32>>,
    /// Instances of loop iterations after the loop stopped early.
    pub skipped: Vec<bool>,
    /// Why an instance's manifest is unusable, where it is (it counts as not done).
    pub damaged: Vec<Option<String>>,
}

impl Snapshot {
    /// An instance whose fingerprint the store cannot tell yet (it waits on a loop that has not
    /// decided where it stops), if there is one: then the fingerprints are not the whole pipeline.
    pub fn undetermined<'a>(&self, c: &'a Compiled) -> Option<&'a str> {
        (0..self.fps.len()).find(|&i| self.fps[i].is_none() && !self.skipped[i]).map(|i| c.instances[i].name.as_str())
    }

    pub fn metric_of<'a>(&'a self, c: &'a Compiled, loop_idx: usize) -> impl Fn(usize) -> Option<Option<f64>> + 'a {
        move |j| {
            let stop = c.loops[loop_idx].stop.as_ref()?;
            self.manifests[j].as_ref().map(|m| m.metrics.get(&stop.metric).copied())
        }
    }
}

/// Read the store's view of every instance, in dependency order.
pub async fn snapshot(c: &Compiled, store: &Store) -> StoreResult<Snapshot> {
    let n = c.instances.len();
    let mut s = Snapshot {
        parts: vec![None; n],
        fps: vec![None; n],
        manifests: vec![None; n],
        loop_exit: vec![None; c.loops.len()],
        skipped: vec![false; n],
        damaged: vec![None; n],
    };
    // Sizes checked as a run checks a cache hit, so what this calls done a run reuses.
    let mut ahead = crate::read_ahead::read(c, store, &vec![false; n]).await;
    for &i in &c.order {
        for (_, sources) in &c.instances[i].inputs {
            for src in sources {
                if let Source::LoopExit { loop_idx, .. } = src
                    && s.loop_exit[*loop_idx].is_none()
                {
                    s.loop_exit[*loop_idx] = c.loops[*loop_idx].exit_iteration(s.metric_of(c, *loop_idx));
                }
            }
        }
        let parts = c.fp_parts(i, |j| s.fps[j].clone(), |l| s.loop_exit[l]);
        if let Some(p) = parts {
            let fp = p.fingerprint();
            // A damaged manifest counts as not done (the next run sets it aside and recomputes).
            match ahead.take(i, &fp) {
                Some(ManifestState::Done(m)) => s.manifests[i] = Some(m),
                Some(ManifestState::Damaged { why, .. }) => s.damaged[i] = Some(why),
                Some(ManifestState::Missing) => {}
                None => match manifest::read(store, &fp).await? {
                    ManifestState::Done(m) => match manifest::check_sizes(store, &m).await? {
                        Ok(()) => s.manifests[i] = Some(m),
                        Err(why) => s.damaged[i] = Some(why),
                    },
                    ManifestState::Damaged { why, .. } => s.damaged[i] = Some(why),
                    ManifestState::Missing => {}
                },
            }
            s.fps[i] = Some(fp);
            s.parts[i] = Some(p);
        }
    }
    for (l, lp) in c.loops.iter().enumerate() {
        if s.loop_exit[l].is_none() {
            s.loop_exit[l] = lp.exit_iteration(s.metric_of(c, l));
        }
        if let Some(k) = s.loop_exit[l] {
            for it in lp.iterations.iter().skip(k as usize) {
                for &i in it.values().flatten() {
                    s.skipped[i] = true;
                }
            }
        }
    }
    Ok(s)
}

/// The last recorded fingerprint of an instance name (to explain a cache miss).
/// An entry that is not one (damaged, hostile, too large) explains nothing and is passed over:
/// the index only explains, a plan does not depend on it.
pub async fn last_index(c: &Compiled, store: &Store, instance: &str) -> StoreResult<Option<IndexEntry>> {
    match store.get_json(&index_key(&c.name, instance)).await {
        Err(crate::store::StoreError::Json { .. } | crate::store::StoreError::TooLarge { .. }) => Ok(None),
        other => other,
    }
}
