//! rao-envs: environments, verifiers, scripted experts and task synthesis. Pure and seeded:
//! no async, no global state; the runtime (rao-agent) drives them.

pub mod env;
pub mod grammar;
pub mod longdoc;
pub mod multihop;
pub mod node;
pub mod rng;
pub mod text;
pub mod textcraft;
pub mod vocab;

pub use env::{Episode, Refusal, Step, StepOutput};
pub use vocab::{Tok, Vocab};
