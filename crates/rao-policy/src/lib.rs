//! The Burn policy: a small decoder-only transformer over the environments' tokenizer,
//! batched constrained sampling with a KV cache, RL losses, AdamW with global clipping,
//! and deterministic checkpoints. The only crate that depends on Burn.

pub mod model;
pub mod params;
pub mod policy;

pub use model::{ModelConfig, Transformer};
pub use policy::{Backend, Checkpoint, Loss, Policy, SampleRequest, Sequence, StepMetrics};
