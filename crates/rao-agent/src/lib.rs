//! rao-agent: the recursive runtime. Runs execution trees on tokio and batches every live
//! node's policy call into one request per round.

pub mod batcher;
pub mod policy;
pub mod runtime;

pub use batcher::Batcher;
pub use policy::{ModelTokens, Policy, Request, Response, ScriptedExpert, ScriptedPolicy, UniformRandom};
pub use runtime::{Limits, RunMeta, TreeDone, TreeSpec, run_trees, run_trees_observed};
