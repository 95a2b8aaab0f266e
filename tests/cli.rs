//! The `rao` binary's integration tests: one test binary (one link on a 2-core CI machine, not
//! fourteen), a module per area, helpers in `support`.

mod support;

mod cli_architecture;
mod cli_bad_inputs;
mod cli_damaged_manifest;
mod cli_pipeline;
mod cli_progress;
mod cli_ray;
mod cli_s3;
mod cli_serve;
mod cli_special_files;
mod cli_store;
mod cli_text_model;
mod cli_textcraft_original;
mod cli_tracking;
mod cli_training;
mod cli_vllm;
