//! rao-pipeline: a generic, RL-free orchestrator — the runner. Plans compiled by rao-plan run
//! as a DAG of stage instances, concurrently, cached by content in a rao-store object store, and
//! resume after a crash.

mod bars;
pub mod builtin;
pub mod dataset;
pub mod eta;
pub mod events;
pub mod exec;
pub mod executor;
pub mod interrupt;
pub mod kind;
pub mod maintenance;
pub mod plan;
mod progress;
pub mod publish;
pub mod ray;
mod read_ahead;
pub mod reaper;
pub mod registry;
pub mod run_record;
pub mod scheduler;
mod shell_words;
pub mod snapshot;

pub use events::{Event, Reporter};
pub use executor::{Executor, InProcess, LocalProcess, PerInstance};
pub use kind::{StageContext, StageKind, Typed, TypedStage};
pub use rao_plan::{Compiled, Diagnostics, InputDecl, KindSignature, Kinds, ParamError, Upstream, compile_str, load, load_cached};
pub use rao_store::{InputArtifact, Store};
pub use registry::Registry;
pub use run_record::{InstanceStatus, RunRecord, RunStatus};
pub use scheduler::{RunOptions, run};
// The layers below under their own names inside this crate: the plan, and the store.
use rao_plan::{compile, diag, fingerprint, secrets};
use rao_store::{clock, integrity, layout, lease, local_file, manifest, staging, store};
/// How a run tells its jobs to stop (Ctrl-C): `Job::cancel`, `exec::execute_by_name`.
pub use tokio_util::sync::CancellationToken;

// Stage and pipeline names become store key components: the planner's limit fits the store's.
const _: () = assert!(rao_plan::check::MAX_NAME_LEN <= rao_store::layout::MAX_NAME_LEN);

#[cfg(test)]
mod tests {
    /// Stage and pipeline names become store key components: every name the planner accepts
    /// must be one the store accepts.
    #[test]
    fn every_valid_name_is_a_valid_store_key_component() {
        let longest = "n".repeat(rao_plan::check::MAX_NAME_LEN);
        assert!(rao_plan::check::valid_name(&longest));
        assert!(rao_store::layout::check_component("stage name", &longest).is_ok());
    }
}
