//! Keys and values of token prefixes the sampler has already run, kept from one call to the
//! next. An agent's node asks for one action at a time and each request repeats the node's whole
//! context; a language model's context is hundreds of tokens (its instructions alone), a reply a
//! few. With the longest cached prefix of each request taken from here, a call prefills only the
//! tokens that are new since the node's last action.
//!
//! Entries are found by the exact tokens they cover (a hash of each prefix length is looked up,
//! then the tokens compared), so a hit is never a near match. A node's entry is dropped when its
//! continuation replaces it; prefixes marked shared (a system prompt every node starts with) stay.
//! Past the budget the least recently used entries go: which ones depends only on the order of
//! calls, so runs stay reproducible.

use std::collections::{BTreeMap, HashMap};

use rao_envs::vocab::Tok;

/// One layer's rotated keys and values of a prefix, `len · Dkv` floats each.
#[derive(Clone)]
pub struct LayerRows {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

struct Entry {
    tokens: Vec<Tok>,
    layers: Vec<LayerRows>,
    shared: bool,
    used_at: u64,
}

impl Entry {
    fn floats(&self) -> usize {
        self.layers.iter().map(|l| l.k.len() + l.v.len()).sum()
    }
}

/// What a request found: the length of its cached prefix and where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    pub len: usize,
    key: (usize, u64),
}

/// Counters of a cache's use, for a stage's metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Requests that found a cached prefix.
    pub hits: usize,
    /// Requests that did not.
    pub misses: usize,
    /// Context tokens read from the cache instead of prefilled.
    pub reused_tokens: usize,
    /// Context tokens prefilled.
    pub prefilled_tokens: usize,
}

pub struct PrefixCache {
    entries: HashMap<(usize, u64), Entry>,
    /// How many entries there are of each length (the lengths worth probing).
    lengths: BTreeMap<usize, usize>,
    floats: usize,
    budget_floats: usize,
    clock: u64,
    pub stats: CacheStats,
}

/// The budget when none is given: 1 GiB of keys and values.
pub const DEFAULT_BUDGET_BYTES: usize = 1 << 30;

impl Default for PrefixCache {
    fn default() -> Self {
        PrefixCache::new(DEFAULT_BUDGET_BYTES)
    }
}

/// FNV-1a over token ids, one step per token: the hash of every prefix in one pass.
fn prefix_hashes(tokens: &[Tok]) -> Vec<u64> {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut out = Vec::with_capacity(tokens.len() + 1);
    out.push(h);
    for &t in tokens {
        for byte in t.to_le_bytes() {
            h = (h ^ byte as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        out.push(h);
    }
    out
}

impl PrefixCache {
    pub fn new(budget_bytes: usize) -> PrefixCache {
        PrefixCache {
            entries: HashMap::new(),
            lengths: BTreeMap::new(),
            floats: 0,
            budget_floats: budget_bytes / 4,
            clock: 0,
            stats: CacheStats::default(),
        }
    }

    /// The longest cached prefix of `context` that leaves at least one token to run (the
    /// sampler needs the last position's logits).
    pub fn lookup(&mut self, context: &[Tok]) -> Option<Hit> {
        let below = context.len().saturating_sub(1);
        let hit = (|| {
            if below == 0 {
                return None;
            }
            let hashes = prefix_hashes(&context[..below]);
            self.lengths.range(1..=below).rev().find_map(|(&len, _)| {
                let key = (len, hashes[len]);
                let entry = self.entries.get(&key)?;
                (entry.tokens == context[..len]).then_some(Hit { len, key })
            })
        })();
        self.clock += 1;
        match hit {
            Some(h) => {
                self.entries.get_mut(&h.key).expect("just found").used_at = self.clock;
                self.stats.hits += 1;
                self.stats.reused_tokens += h.len;
                self.stats.prefilled_tokens += context.len() - h.len;
            }
            None => {
                self.stats.misses += 1;
                self.stats.prefilled_tokens += context.len();
            }
        }
        hit
    }

    /// The layers of a hit (valid until the cache next changes).
    pub fn layers(&self, hit: &Hit) -> &[LayerRows] {
        &self.entries[&hit.key].layers
    }

    /// Drops a hit's entry unless it is shared: its node's continuation replaces it.
    pub fn consumed(&mut self, hit: &Hit) {
        if self.entries.get(&hit.key).is_some_and(|e| !e.shared) {
            self.remove(hit.key);
        }
    }

    /// Keeps `layers` (each `tokens.len() · Dkv` floats of keys and of values) for `tokens`.
    pub fn insert(&mut self, tokens: Vec<Tok>, layers: Vec<LayerRows>, shared: bool) {
        if tokens.is_empty() {
            return;
        }
        let key = (tokens.len(), *prefix_hashes(&tokens).last().expect("one hash per prefix"));
        self.clock += 1;
        let entry = Entry { tokens, layers, shared, used_at: self.clock };
        if entry.floats() > self.budget_floats {
            return;
        }
        let shared = shared || self.entries.get(&key).is_some_and(|e| e.shared && e.tokens == entry.tokens);
        self.remove(key);
        self.floats += entry.floats();
        *self.lengths.entry(key.0).or_default() += 1;
        self.entries.insert(key, Entry { shared, ..entry });
        while self.floats > self.budget_floats {
            let oldest = *self.entries.iter().min_by_key(|(_, e)| e.used_at).expect("over budget means not empty").0;
            self.remove(oldest);
        }
    }

    fn remove(&mut self, key: (usize, u64)) {
        if let Some(e) = self.entries.remove(&key) {
            self.floats -= e.floats();
            let n = self.lengths.get_mut(&key.0).expect("counted on insert");
            *n -= 1;
            if *n == 0 {
                self.lengths.remove(&key.0);
            }
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of keys and values held.
    pub fn bytes(&self) -> usize {
        self.floats * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize, x: f32) -> Vec<LayerRows> {
        vec![LayerRows { k: vec![x; n], v: vec![-x; n] }]
    }

    #[test]
    fn the_longest_exact_prefix_is_found_and_leaves_a_token_to_run() {
        let mut c = PrefixCache::default();
        c.insert(vec![1, 2], rows(2, 1.0), true);
        c.insert(vec![1, 2, 3, 4], rows(4, 2.0), false);
        assert_eq!(c.lookup(&[1, 2, 3, 4, 5]).map(|h| h.len), Some(4));
        // The whole context cached: the shorter prefix, so the last token still runs.
        assert_eq!(c.lookup(&[1, 2, 3, 4]).map(|h| h.len), Some(2));
        assert_eq!(c.lookup(&[1, 9, 3, 4]), None);
        assert_eq!(c.lookup(&[2]), None);
        let hit = c.lookup(&[1, 2, 3, 4, 7]).unwrap();
        assert_eq!(c.layers(&hit)[0].k, vec![2.0; 4]);
        c.consumed(&hit);
        assert_eq!(c.lookup(&[1, 2, 3, 4, 7]).map(|h| h.len), Some(2), "a node's entry goes once used");
        let shared = c.lookup(&[1, 2, 3]).unwrap();
        c.consumed(&shared);
        assert_eq!(c.lookup(&[1, 2, 3]).map(|h| h.len), Some(2), "a shared prefix stays");
        assert_eq!(c.stats.hits, 6);
        assert_eq!(c.stats.misses, 2);
    }

    #[test]
    fn past_its_budget_the_least_recently_used_entries_go() {
        // 3 entries of 2 tokens × (1 + 1) floats fit in 48 bytes.
        let mut c = PrefixCache::new(48);
        c.insert(vec![1, 1], rows(2, 1.0), false);
        c.insert(vec![2, 2], rows(2, 1.0), false);
        c.insert(vec![3, 3], rows(2, 1.0), false);
        assert!(c.lookup(&[1, 1, 0]).is_some()); // 1 is now the most recently used
        c.insert(vec![4, 4], rows(2, 1.0), false);
        assert_eq!(c.len(), 3);
        assert!(c.lookup(&[2, 2, 0]).is_none(), "the least recently used went");
        assert!(c.lookup(&[1, 1, 0]).is_some());
        assert!(c.bytes() <= 48);
        c.insert(vec![5; 40], rows(40, 1.0), false);
        assert!(c.lookup(&[5; 41]).is_none(), "an entry larger than the budget is not kept");
    }
}
