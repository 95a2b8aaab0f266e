//! The RL stage kinds, binding the orchestrator to the environments, runtime and learner.

use std::sync::Arc;

use rao_pipeline::{Registry, Typed};

/// Build-time code versions of the stage kinds (see build.rs).
pub mod code {
    include!(concat!(env!("OUT_DIR"), "/code_versions.rs"));
}
pub mod envs;
pub mod inspect;
pub mod kinds;
pub mod rollout;
pub mod synthesize;
pub mod tasks_io;
pub mod textcraft_files;
pub mod textcraft_minecraft;

/// Every stage kind this build of rao knows: the engine's built-ins plus the RL kinds.
pub fn registry() -> Registry {
    let mut r = Registry::with_builtins();
    r.register(Arc::new(Typed::<synthesize::Synthesize>::default()));
    r.register(Arc::new(Typed::<textcraft_files::TextCraftFiles>::default()));
    r.register(Arc::new(Typed::<textcraft_minecraft::TextCraftMinecraft>::default()));
    r.register(Arc::new(Typed::<rename_items::RenameItems>::default()));
    r.register(Arc::new(Typed::<rollout::Rollout>::default()));
    r.register(Arc::new(Typed::<warmstart::Warmstart>::default()));
    r.register(Arc::new(Typed::<judge::Judge>::default()));
    r.register(Arc::new(Typed::<advantage::Advantage>::default()));
    r.register(Arc::new(Typed::<update::Update>::default()));
    r.register(Arc::new(Typed::<evaluate::Evaluate>::default()));
    r.register(Arc::new(Typed::<hf_model::HfModel>::default()));
    r.register(Arc::new(Typed::<hf_export::HfExport>::default()));
    r.register(Arc::new(Typed::<text_model::TextModelKind>::default()));
    envs::register(&mut r);
    r
}
pub mod advantage;
pub mod chat_api;
mod defaults;
pub mod engine_launch;
pub mod engine_policy;
pub mod engine_version;
pub mod evaluate;
pub mod hf_export;
pub mod hf_model;
pub mod judge;
pub mod llm_judge;
pub mod neural;
pub mod openai_policy;
pub mod rename_items;
pub mod serve;
pub mod text_model;
pub mod text_policy;
pub mod training;
pub mod update;
pub mod warmstart;
pub use rao_policy::tune_allocator;
