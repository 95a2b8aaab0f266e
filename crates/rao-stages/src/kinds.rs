//! The names of the stage kinds this crate registers, as pipeline files write them after `kind:`.
//! Code that picks instances by kind (reports, the CLI) compares with these, never with literals.

pub const SYNTHESIZE: &str = "synthesize";
pub const TEXTCRAFT_FILES: &str = "textcraft_files";
pub const LONGDOC_TASKS: &str = "longdoc_tasks";
pub const MULTIHOP_TASKS: &str = "multihop_tasks";
pub const ROLLOUT: &str = "rollout";
pub const WARMSTART: &str = "warmstart";
pub const JUDGE: &str = "judge";
pub const ADVANTAGE: &str = "advantage";
pub const UPDATE: &str = "update";
pub const EVALUATE: &str = "evaluate";
pub const HF_MODEL: &str = "hf_model";
pub const HF_EXPORT: &str = "hf_export";
pub const TEXT_MODEL: &str = "text_model";
