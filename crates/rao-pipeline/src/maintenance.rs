//! `rao verify` and `rao gc` for a pipeline store: the store's own maintenance, with gc keeping
//! whatever a run still going uses (runs are this crate's notion, not the store's).

use std::collections::BTreeSet;
use std::time::Duration;

pub use rao_store::maintenance::{GcReport, VerifyReport, remove_dead_staging, verify};

use crate::store::Store;

/// [`rao_store::maintenance::gc`], keeping — when given pipelines to keep — also every object
/// that a run still going (on any machine) has met so far: such a run may use `--set` values,
/// or a file edited since.
pub async fn gc(store: &Store, keep: Option<&BTreeSet<String>>, delete: bool, min_age: Duration) -> GcReport {
    let keep = match keep {
        None => None,
        Some(k) => match crate::run_record::live_fingerprints(store).await {
            Ok(live) => Some(k.union(&live).cloned().collect::<BTreeSet<_>>()),
            Err(e) => return GcReport { deleted: delete, stopped_by: Some(e.to_string()), ..Default::default() },
        },
    };
    rao_store::maintenance::gc(store, keep.as_ref(), delete, min_age).await
}
