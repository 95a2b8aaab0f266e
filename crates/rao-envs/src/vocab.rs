//! Token vocabularies: the exact ids the policy sees and produces. Token ids are the truth;
//! text is the tokens joined by spaces, for humans.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

pub type Tok = u32;

/// Special tokens every environment shares, at fixed ids.
pub const PAD: Tok = 0;
pub const BOS: Tok = 1;
/// Ends every action the policy generates.
pub const EOS: Tok = 2;
/// Starts every observation.
pub const OBS: Tok = 3;
pub const SPECIALS: [&str; 4] = ["<pad>", "<bos>", "<eos>", "<obs>"];

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Vocab {
    tokens: Vec<String>,
    #[serde(skip)]
    index: HashMap<String, Tok>,
}

impl Vocab {
    /// Specials first, then `words` in order (duplicates ignored).
    pub fn new<'a>(words: impl IntoIterator<Item = &'a str>) -> Self {
        let mut v = Vocab { tokens: Vec::new(), index: HashMap::new() };
        for w in SPECIALS.iter().copied().chain(words) {
            v.add(w);
        }
        v
    }

    pub fn add(&mut self, w: &str) -> Tok {
        if let Some(&t) = self.index.get(w) {
            return t;
        }
        let t = self.tokens.len() as Tok;
        self.tokens.push(w.to_string());
        self.index.insert(w.to_string(), t);
        t
    }

    /// Rebuild the lookup table after deserialising.
    pub fn reindex(&mut self) {
        self.index = self.tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as Tok)).collect();
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn id(&self, w: &str) -> Tok {
        *self.index.get(w).unwrap_or_else(|| panic!("token `{w}` is not in the vocabulary"))
    }

    pub fn get(&self, w: &str) -> Option<Tok> {
        self.index.get(w).copied()
    }

    pub fn word(&self, t: Tok) -> &str {
        self.tokens.get(t as usize).map(|s| s.as_str()).unwrap_or("<?>")
    }

    pub fn ids(&self, text: &str) -> Vec<Tok> {
        text.split_whitespace().map(|w| self.id(w)).collect()
    }

    pub fn text(&self, toks: &[Tok]) -> String {
        toks.iter().map(|&t| self.word(t)).collect::<Vec<_>>().join(" ")
    }

    /// Numbers are written digit by digit ("1 2" is twelve) so any count is spellable.
    pub fn number(&self, n: u64) -> Vec<Tok> {
        n.to_string().chars().map(|c| self.id(&c.to_string())).collect()
    }

    pub fn digit_value(&self, t: Tok) -> Option<u64> {
        let w = self.word(t);
        (w.len() == 1).then(|| w.chars().next().unwrap().to_digit(10)).flatten().map(|d| d as u64)
    }

    pub fn words(&self) -> &[String] {
        &self.tokens
    }
}
