//! rao-core: the shared vocabulary of rao — execution trees, RAO's reward arithmetic,
//! and their Arrow/Parquet form.

pub mod parquet_io;
pub mod rao;
pub mod tree;

pub use tree::{GroupKey, Mode, NodeRecord, NodeStatus, TreeKey, Turn};
