//! What runs produced, for the people reading them: one HTML report per run, comparisons of
//! variants and seeds with intervals and significance, and export to TensorBoard and MLflow.
//! Everything here reads the store; nothing trains.

pub mod compare;
pub mod compare_out;
pub mod doc_blocks;
pub mod html;
pub mod plots;
pub mod results;
pub mod stats;
pub mod text;
pub mod tracking;

pub use results::RunResults;
