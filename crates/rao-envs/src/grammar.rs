//! Constrained decoding: which tokens may come next in an action. The sampler masks every other
//! token, and training applies the same mask, so behaviour and learner log-probs agree exactly.

use crate::vocab::Tok;

pub trait Grammar: Send + Sync {
    /// Tokens allowed after `prefix` (the action generated so far), `<eos>` included when the
    /// action may end here. Never empty.
    fn allowed(&self, recursive: bool, prefix: &[Tok]) -> Vec<Tok>;
}

/// No constraint: every token of a vocabulary of the given size may come next (a language model
/// sampling freely).
pub struct AnyToken(pub usize);

impl Grammar for AnyToken {
    fn allowed(&self, _recursive: bool, _prefix: &[Tok]) -> Vec<Tok> {
        (0..self.0 as Tok).collect()
    }
}
