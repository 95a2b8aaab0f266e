//! The TextCraft action grammar: verb, then item names from the world (a trie of their
//! tokens), optional counts of at most two digits, `,` between spawn goals. In worlds of the
//! original TextCraft a craft may go on with `from` and its exact ingredients. A world may allow
//! only the names whose words the node has seen ([`ItemNames::SeenWords`]).

use std::collections::{BTreeMap, BTreeSet};

use super::world::{ItemNames, World};
use crate::grammar::{Grammar, lark_choice, lark_up_to};
use crate::vocab::{EOS, Tok};

#[derive(Default)]
struct TrieNode {
    next: BTreeMap<Tok, usize>,
    terminal: bool,
}

/// Most ingredients an exact craft names (a crafting grid holds nine).
const MAX_INGREDIENTS: usize = 9;

pub struct TextCraftGrammar {
    nodes: Vec<TrieNode>,
    info: Tok,
    craft: Tok,
    inv: Tok,
    finish: Tok,
    spawn: Tok,
    comma: Tok,
    /// The exact craft's `from`, in worlds that have it.
    from: Option<Tok>,
    digits: Vec<Tok>,
    /// Most goals in one `spawn`.
    pub max_spawn_goals: usize,
    /// Each item's name as text (its words separated by spaces), for the text form.
    item_texts: Vec<String>,
    names: ItemNames,
    vocab_len: usize,
}

/// The trie nodes an action may use in one context: `live[n]` when some name an action may
/// use goes through node `n` (every node when the world's names are all allowed).
struct Reach {
    live: Option<Vec<bool>>,
}

impl Reach {
    fn allows(&self, node: usize) -> bool {
        self.live.as_ref().is_none_or(|live| live[node])
    }
}

impl TextCraftGrammar {
    pub fn new(world: &World, max_spawn_goals: usize) -> Self {
        let mut nodes = vec![TrieNode::default()];
        for it in &world.items {
            let mut cur = 0;
            for &t in &it.tokens {
                cur = match nodes[cur].next.get(&t) {
                    Some(&n) => n,
                    None => {
                        nodes.push(TrieNode::default());
                        let n = nodes.len() - 1;
                        nodes[cur].next.insert(t, n);
                        n
                    }
                };
            }
            nodes[cur].terminal = true;
        }
        let v = &world.vocab;
        TextCraftGrammar {
            nodes,
            info: v.id("info"),
            craft: v.id("craft"),
            inv: v.id("inv"),
            finish: v.id("finish"),
            spawn: v.id("spawn"),
            comma: v.id(","),
            from: v.get("from"),
            digits: (0..10).map(|d| v.id(&d.to_string())).collect(),
            max_spawn_goals: max_spawn_goals.max(1),
            item_texts: world.items.iter().map(|it| crate::text::words(v, &it.tokens)).collect(),
            names: world.names,
            vocab_len: v.len(),
        }
    }

    /// Which names an action in `context` may use.
    fn reach(&self, context: &[Tok]) -> Reach {
        if self.names == ItemNames::World {
            return Reach { live: None };
        }
        let mut seen = vec![false; self.vocab_len];
        for &t in context {
            if let Some(s) = seen.get_mut(t as usize) {
                *s = true;
            }
        }
        // Depth-first over the words seen; a node is live when a name ends at or below it.
        let mut live = vec![false; self.nodes.len()];
        let mut order = vec![0usize];
        let mut stack = vec![0usize];
        while let Some(n) = stack.pop() {
            for (&t, &child) in &self.nodes[n].next {
                if seen.get(t as usize).copied().unwrap_or(false) {
                    order.push(child);
                    stack.push(child);
                }
            }
        }
        // Children come after their parents in `order`: walking it backwards settles each
        // node after everything below it.
        for &n in order.iter().rev() {
            live[n] = self.nodes[n].terminal || self.nodes[n].next.values().any(|&c| live[c]);
        }
        Reach { live: Some(live) }
    }

    /// After an argument list's tokens `args` (items, counts, commas): what may follow, with at
    /// most `max_goals` comma-separated entries (1: no comma).
    fn after_args(&self, reach: &Reach, args: &[Tok], max_goals: usize) -> Vec<Tok> {
        let mut goals = 1;
        let mut node = 0usize;
        let mut digits = 0usize;
        for &t in args {
            if t == self.comma {
                goals += 1;
                node = 0;
                digits = 0;
            } else if digits > 0 || (self.nodes[node].terminal && self.digits.contains(&t) && !self.nodes[node].next.contains_key(&t)) {
                digits += 1;
            } else if let Some(&n) = self.nodes[node].next.get(&t) {
                node = n;
            } else {
                return vec![EOS]; // not reachable when sampling under this grammar
            }
        }
        let mut out = BTreeSet::new();
        if digits == 0 {
            out.extend(self.nodes[node].next.iter().filter(|&(_, &c)| reach.allows(c)).map(|(&t, _)| t));
        }
        if self.nodes[node].terminal {
            if digits == 0 {
                out.extend(self.digits[1..].iter().copied());
            } else if digits == 1 {
                out.extend(self.digits.iter().copied());
            }
            out.insert(EOS);
            if goals < max_goals {
                out.insert(self.comma);
            }
        }
        out.into_iter().collect()
    }

    fn allowed_in(&self, reach: &Reach, recursive: bool, prefix: &[Tok]) -> Vec<Tok> {
        let Some((&verb, args)) = prefix.split_first() else {
            let mut v = vec![self.info, self.craft, self.inv, self.finish];
            if recursive {
                v.push(self.spawn);
            }
            // Verbs that name an item only when some name may be used.
            if !reach.allows(0) {
                v.retain(|t| *t == self.inv || *t == self.finish);
            }
            return v;
        };
        if verb == self.inv || verb == self.finish {
            return vec![EOS];
        }
        if verb == self.info {
            // Exactly one item, no count.
            let mut node = 0;
            for &t in args {
                match self.nodes[node].next.get(&t) {
                    Some(&n) => node = n,
                    None => return vec![EOS],
                }
            }
            let mut out: Vec<Tok> = self.nodes[node].next.iter().filter(|&(_, &c)| reach.allows(c)).map(|(&t, _)| t).collect();
            if self.nodes[node].terminal {
                out.push(EOS);
            }
            return out;
        }
        if verb == self.spawn {
            return self.after_args(reach, args, self.max_spawn_goals);
        }
        // craft ITEM [N] [from ING [a] (, ING [a])*]
        if let Some(from) = self.from {
            if let Some(at) = args.iter().position(|t| *t == from) {
                return self.after_args(reach, &args[at + 1..], MAX_INGREDIENTS);
            }
            let mut out = self.after_args(reach, args, 1);
            if out.contains(&EOS) {
                out.push(from);
            }
            return out;
        }
        self.after_args(reach, args, 1)
    }
}

impl Grammar for TextCraftGrammar {
    fn lark(&self, recursive: bool) -> Option<String> {
        if self.names != ItemNames::World {
            return None; // which names an action may use depends on its context
        }
        // Counts are one or two digits, the first not 0, as `after_args` allows them.
        let mut action = vec![r#""info " ITEM"#.to_string(), r#""inv""#.into(), r#""finish""#.into()];
        action.push(if self.from.is_some() {
            format!(r#""craft " ARG (" from " ARG {})?"#, lark_up_to(r#"" , " ARG"#, MAX_INGREDIENTS - 1))
        } else {
            r#""craft " ARG"#.into()
        });
        if recursive {
            action.push(format!(r#""spawn " ARG {}"#, lark_up_to(r#"" , " ARG"#, self.max_spawn_goals - 1)));
        }
        Some(format!(
            "start: ACTION\nACTION: {}\nARG: ITEM (\" \" COUNT)?\nCOUNT: /[1-9]( [0-9])?/\nITEM: {}\n",
            action.join(" | "),
            lark_choice(&self.item_texts)
        ))
    }

    fn allowed(&self, recursive: bool, context: &[Tok], prefix: &[Tok]) -> Vec<Tok> {
        let reach = self.reach(context);
        let out = self.allowed_in(&reach, recursive, prefix);
        // Off the grammar (a demonstration naming what its node never saw): only the end.
        if out.is_empty() { vec![EOS] } else { out }
    }
}
