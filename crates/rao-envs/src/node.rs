//! What every environment's node context looks like, and reading it back: `<bos> MODE @DEPTH GOAL`
//! then turns of `ACTION <eos> <obs> …`. Experts and verifiers of every environment share this.

use crate::env::Refusal;
use crate::vocab::{BOS, EOS, OBS, Tok, Vocab};

/// Mode and depth words every environment's vocabulary holds (depth tokens `@0`..`@MAX`).
pub const MAX_DEPTH_TOKEN: u32 = 12;

pub fn mode_and_depth_words() -> Vec<String> {
    ["<rec>".to_string(), "<flat>".to_string()].into_iter().chain((0..=MAX_DEPTH_TOKEN).map(|d| format!("@{d}"))).collect()
}

/// The prompt of a node: `<bos>`, mode, depth, goal.
pub fn prompt(vocab: &Vocab, goal: &[Tok], depth: u32, recursive: bool) -> Vec<Tok> {
    let mode = vocab.id(if recursive { "<rec>" } else { "<flat>" });
    let d = vocab.id(&format!("@{}", depth.min(MAX_DEPTH_TOKEN)));
    [vec![BOS, mode, d], goal.to_vec()].concat()
}

/// A node's context, split into its parts.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub recursive: bool,
    pub depth: u32,
    pub goal: Vec<Tok>,
    /// (action without `<eos>`, observation) in order; the observation may be empty (last turn).
    pub turns: Vec<(Vec<Tok>, Vec<Tok>)>,
}

/// Split a context whose actions start with one of `verbs` (tokens observations never hold).
pub fn parse_node(vocab: &Vocab, ctx: &[Tok], verbs: &[Tok]) -> Option<NodeView> {
    if ctx.len() < 3 || ctx[0] != BOS {
        return None;
    }
    let recursive = vocab.word(ctx[1]) == "<rec>";
    let depth: u32 = vocab.word(ctx[2]).strip_prefix('@')?.parse().ok()?;
    let mut i = 3;
    while i < ctx.len() && !verbs.contains(&ctx[i]) {
        i += 1;
    }
    let goal = ctx[3..i].to_vec();
    let mut turns = Vec::new();
    while i < ctx.len() {
        let start = i;
        while i < ctx.len() && ctx[i] != EOS {
            i += 1;
        }
        let action = ctx[start..i].to_vec();
        i += 1;
        let obs_start = i.min(ctx.len());
        while i < ctx.len() && !verbs.contains(&ctx[i]) {
            i += 1;
        }
        turns.push((action, ctx[obs_start..i.min(ctx.len())].to_vec()));
    }
    Some(NodeView { recursive, depth, goal, turns })
}

/// Fixed-width numbers (`width` digit tokens): every number in an action has a known length, so
/// the grammar needs no terminator.
pub fn fixed_number(vocab: &Vocab, n: u64, width: usize) -> Vec<Tok> {
    format!("{n:0width$}").chars().map(|c| vocab.id(&c.to_string())).collect()
}

/// Read a fixed-width number at the start of `toks`.
pub fn read_fixed(vocab: &Vocab, toks: &[Tok], width: usize) -> Option<u64> {
    if toks.len() < width {
        return None;
    }
    toks[..width].iter().try_fold(0u64, |n, &t| vocab.digit_value(t).map(|d| n * 10 + d))
}

/// The observation for a refused launch: `<obs> err WHY` (every environment's vocabulary holds
/// `err`, `depth`, `children`, `nodes`, `self` and `syntax`).
pub fn refusal(vocab: &Vocab, why: Refusal) -> Vec<Tok> {
    let w = match why {
        Refusal::Depth => "depth",
        Refusal::Children => "children",
        Refusal::Nodes => "nodes",
        Refusal::SelfSpawn => "self",
        Refusal::NotRecursive => "syntax",
    };
    vec![OBS, vocab.id("err"), vocab.id(w)]
}

/// `toks` with the names of each group (interchangeable single-token names: entities, speakers)
/// permuted at random, consistently within the sequence: a demonstration that stays valid but
/// cannot be memorised, so a policy learns to read and copy names (see LEARNING-NOTES.md).
pub fn permute_names(toks: &[Tok], groups: &[Vec<Tok>], rng: &mut crate::rng::Rng) -> Vec<Tok> {
    let mut map = std::collections::HashMap::new();
    for g in groups {
        let mut to = g.clone();
        rng.shuffle(&mut to);
        map.extend(g.iter().copied().zip(to));
    }
    toks.iter().map(|t| *map.get(t).unwrap_or(t)).collect()
}

pub const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
