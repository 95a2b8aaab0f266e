//! rao-pipeline: a generic, RL-free orchestrator. Pipeline files compile to a DAG of stage
//! instances that run concurrently, cached by content in an object store, and resume after a crash.

mod bars;
pub mod builtin;
pub mod check;
pub mod compile;
pub mod dataset;
pub mod diag;
pub mod eta;
pub mod events;
pub mod exec;
pub mod executor;
pub mod expand;
pub mod fingerprint;
pub mod interrupt;
pub mod kind;
pub mod kinds_doc;
pub mod lower;
pub mod maintenance;
pub mod overrides;
pub mod parse;
pub mod plan;
pub mod plan_cache;
mod progress;
pub mod publish;
pub mod ray;
mod read_ahead;
pub mod reaper;
pub mod resolved;
pub mod run_record;
pub mod scheduler;
pub mod schema;
pub mod secrets;
pub mod serde_words;
mod shell_words;
pub mod snapshot;
pub mod spec;
pub mod subst;
pub mod unknown_keys;

pub use compile::{Compiled, compile_str, load, load_cached};
pub use diag::Diagnostics;
pub use events::{Event, Reporter};
pub use executor::{Executor, InProcess, LocalProcess, PerInstance};
pub use kind::{InputDecl, ParamError, Registry, StageContext, StageKind, Typed, TypedStage, Upstream};
pub use rao_store::{InputArtifact, Store};
pub use run_record::{InstanceStatus, RunRecord, RunStatus};
pub use scheduler::{RunOptions, run};
// The store's modules under their old paths inside this crate (the store is a layer below).
use rao_store::{clock, integrity, layout, lease, local_file, manifest, staging, store};
/// How a run tells its jobs to stop (Ctrl-C): `Job::cancel`, `exec::execute_by_name`.
pub use tokio_util::sync::CancellationToken;
