//! The RL stage kinds, binding the orchestrator to the environments, runtime and learner.

use rao_pipeline::Registry;

/// Every stage kind this build of rao knows: the engine's built-ins plus the RL kinds.
pub fn registry() -> Registry {
    Registry::with_builtins()
}
