//! rao-store: the content-addressed object store rao's results live in — its key layout,
//! manifests (written last, once), leases, staging, integrity checks, `verify` and `gc`.
//!
//! Architecture invariant: this crate knows nothing of pipelines, stages or runs. It stores
//! objects under fingerprints that others compute; what a fingerprint means is the caller's.

pub mod artifact;
pub mod clock;
pub mod integrity;
pub mod layout;
pub mod lease;
pub mod local_file;
pub mod maintenance;
pub mod manifest;
pub mod staging;
pub mod store;

pub use artifact::InputArtifact;
pub use store::{Store, StoreError, StoreResult};
