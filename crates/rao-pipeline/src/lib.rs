//! rao-pipeline: a generic, RL-free orchestrator. Pipeline files compile to a DAG of stage
//! instances that run concurrently, cached by content in an object store, and resume after a crash.

pub mod builtin;
pub mod compile;
pub mod dataset;
pub mod diag;
pub mod events;
pub mod exec;
pub mod fingerprint;
pub mod kind;
pub mod overrides;
pub mod plan;
pub mod ray;
pub mod scheduler;
pub mod schema;
pub mod snapshot;
pub mod spec;
pub mod store;

pub use compile::{Compiled, compile_str, load};
pub use diag::Diagnostics;
pub use events::{Event, Reporter};
pub use kind::{InputArtifact, InputDecl, ParamError, Registry, StageContext, StageKind, Typed, TypedStage};
pub use scheduler::{Executor, InProcess, LocalProcess, PerInstance, RunOptions, RunRecord, run};
pub use store::Store;
