//! Constrained decoding: which tokens may come next in an action. The sampler masks every other
//! token, and training applies the same mask, so behaviour and learner log-probs agree exactly.

use crate::vocab::Tok;

pub trait Grammar: Send + Sync {
    /// Tokens allowed after `prefix` (the action generated so far) in a node whose tokens before
    /// this action are `context` (prompt, earlier actions and observations), `<eos>` included
    /// when the action may end here. Never empty.
    fn allowed(&self, recursive: bool, context: &[Tok], prefix: &[Tok]) -> Vec<Tok>;

    /// The same action language in text, for a language model: a grammar in llguidance's Lark
    /// dialect over the environment's words separated by single spaces (as `text::words` writes
    /// an action). `None`: this grammar has no text form.
    fn lark(&self, _recursive: bool) -> Option<String> {
        None
    }
}

/// Why an environment cannot be acted in by a language model: its grammar has no text form.
pub const NO_TEXT_FORM: &str = "this environment's actions have no text form (a grammar that reads the node's context, \
     such as TextCraft's `item_names: seen_words`, has none yet: use `item_names: world` with a language model)";

/// A Lark string literal for `text` (backslashes, quotes and control characters escaped).
pub fn lark_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `(item){0,max}` in Lark: up to `max` more of `item` (nothing when `max` is 0).
pub fn lark_up_to(item: &str, max: usize) -> String {
    if max == 0 { String::new() } else { format!("({item}){{0,{max}}}") }
}

/// A Lark alternation of literal texts (`"a" | "b c"`), longest first.
pub fn lark_choice<S: AsRef<str>>(texts: &[S]) -> String {
    let mut texts: Vec<&str> = texts.iter().map(AsRef::as_ref).collect();
    texts.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
    texts.dedup();
    texts.iter().map(|t| lark_string(t)).collect::<Vec<_>>().join(" | ")
}

/// No constraint: every token of a vocabulary of the given size may come next (a language model
/// sampling freely).
pub struct AnyToken(pub usize);

impl Grammar for AnyToken {
    fn allowed(&self, _recursive: bool, _context: &[Tok], _prefix: &[Tok]) -> Vec<Tok> {
        (0..self.0 as Tok).collect()
    }
}
