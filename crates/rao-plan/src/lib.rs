//! rao-plan: pipeline files → a compiled plan. Parses and checks a pipeline file (located
//! diagnostics), applies `--set` overrides and variants, expands matrices and loops into stage
//! instances, and computes what each instance's fingerprint hashes.
//!
//! Architecture invariant: no async runtime, no store, no I/O but reading the pipeline file, the
//! files its stages name for fingerprints, and the plan cache. Kinds are known only by their
//! signatures ([`KindSignature`]); how they run is the runner's (rao-pipeline).

pub mod check;
pub mod compile;
pub mod diag;
pub mod expand;
pub mod fingerprint;
pub mod kind;
pub mod kinds_doc;
pub mod lower;
pub mod overrides;
pub mod parse;
pub mod plan_cache;
pub mod resolved;
pub mod schema;
pub mod secrets;
pub mod serde_words;
pub mod spec;
pub mod subst;
pub mod unknown_keys;

pub use compile::{Compiled, compile_str, load, load_cached};
pub use diag::Diagnostics;
pub use kind::{InputDecl, KindSignature, Kinds, ParamError, Upstream};
