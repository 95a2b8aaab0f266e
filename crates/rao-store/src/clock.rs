//! The one wall clock the store's records use (leases, manifests, quarantine notes).

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch (0 on a clock set before it).
pub fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}
