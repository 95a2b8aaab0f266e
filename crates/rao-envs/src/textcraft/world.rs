//! TextCraft worlds: items, recipes, the held-out split, and the vocabulary their names need.
//! Generated from a seed (TextCraft-Synth) or loaded from Minecraft recipe files.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::rng::Rng;
use crate::vocab::{Tok, Vocab};

pub type ItemId = u32;

/// Words of the action language (after the shared specials).
pub const LANGUAGE: &[&str] = &[
    "<rec>", "<flat>", "info", "craft", "inv", "finish", "spawn", ",", "ok", "fail", "err", "base", "have", "x", "need", "syntax", "depth",
    "children", "nodes", "self", "unknown", "empty", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9",
];

/// Depth tokens for the prompt (`@0` = root).
pub const MAX_DEPTH_TOKEN: u32 = 12;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Recipe {
    /// Units produced by one craft.
    pub result_count: u32,
    pub ingredients: Vec<(ItemId, u32)>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Item {
    pub id: ItemId,
    /// Human/text name, e.g. `M t2 i5` (its tokens joined by spaces).
    pub name: String,
    /// The tokens that spell the name.
    pub tokens: Vec<Tok>,
    pub tier: u32,
    /// Alternative recipes; empty for base items. The first is the canonical one.
    pub recipes: Vec<Recipe>,
    /// Held out of training tasks (validation targets only).
    pub held_out: bool,
    /// A tag (an ingredient category of the original TextCraft files, e.g. `tag planks`): the
    /// items that satisfy it. Tags are never held and never crafted; empty for every real item.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<ItemId>,
}

impl Item {
    /// No recipe makes it (tags included: they are never crafted).
    pub fn is_base(&self) -> bool {
        self.recipes.is_empty()
    }
    pub fn is_tag(&self) -> bool {
        !self.members.is_empty()
    }
}

/// Whose rules a world follows: what a craft takes and when a goal counts as reached.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Rules {
    /// TextCraft-Synth: a goal is reached when the node's subtree crafted its units.
    #[default]
    Synth,
    /// The original TextCraft (the RAO authors' environment): a goal is reached when the shared
    /// inventory holds its units when the node finishes; crafts may name their exact ingredients.
    Original,
}

/// A world's rule left at its default is not written to `world.json` (worlds written before the
/// rule existed read the same).
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// Which item names an action may use (the action grammar's item slot).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ItemNames {
    /// Any item of the world.
    #[default]
    World,
    /// Items whose every word is in the node's context (its goal, what `info` and `inv` showed,
    /// its children's results): with a thousand item names, sampling outside the context is
    /// where RL moved probability (RESULTS.md, the stand-in for the authors' files).
    SeenWords,
}

/// When a goal counts as reached in worlds of the original rules.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GoalCheck {
    /// The original's: the inventory holds the goal's units when the node finishes. Agents share
    /// the inventory, so a sub-agent whose items are already there succeeds by finishing.
    #[default]
    Held,
    /// Held when the node finishes, and made by the node's subtree. The same for a task's root
    /// (its targets are not in the inventory it starts from); a sub-agent has to make its items.
    HeldAndMade,
}

/// Which target tiers make each difficulty band.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Bands {
    pub easy: (u32, u32),
    pub medium: (u32, u32),
    pub hard: (u32, u32),
    pub extreme: (u32, u32),
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Band {
    Easy,
    Medium,
    Hard,
    Extreme,
}

impl Band {
    pub const ALL: [Band; 4] = [Band::Easy, Band::Medium, Band::Hard, Band::Extreme];
    pub fn name(self) -> &'static str {
        match self {
            Band::Easy => "easy",
            Band::Medium => "medium",
            Band::Hard => "hard",
            Band::Extreme => "extreme",
        }
    }
    pub fn parse(s: &str) -> Option<Band> {
        Band::ALL.into_iter().find(|b| b.name() == s)
    }
}

impl Bands {
    pub fn tiers(&self, b: Band) -> (u32, u32) {
        match b {
            Band::Easy => self.easy,
            Band::Medium => self.medium,
            Band::Hard => self.hard,
            Band::Extreme => self.extreme,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct World {
    pub name: String,
    pub items: Vec<Item>,
    pub vocab: Vocab,
    pub bands: Bands,
    #[serde(default, skip_serializing_if = "is_default")]
    pub rules: Rules,
    #[serde(default, skip_serializing_if = "is_default")]
    pub names: ItemNames,
    #[serde(default, skip_serializing_if = "is_default")]
    pub goal_check: GoalCheck,
    #[serde(skip)]
    by_tokens: HashMap<Vec<Tok>, ItemId>,
    #[serde(skip)]
    max_name_len: usize,
}

impl World {
    pub fn new(name: String, items: Vec<Item>, vocab: Vocab, bands: Bands) -> World {
        let mut w = World {
            name,
            items,
            vocab,
            bands,
            rules: Rules::Synth,
            names: ItemNames::World,
            goal_check: GoalCheck::Held,
            by_tokens: HashMap::new(),
            max_name_len: 0,
        };
        w.reindex();
        w
    }

    /// Rebuild lookup tables (after deserialising).
    pub fn reindex(&mut self) {
        self.vocab.reindex();
        self.by_tokens = self.items.iter().map(|i| (i.tokens.clone(), i.id)).collect();
        self.max_name_len = self.items.iter().map(|i| i.tokens.len()).max().unwrap_or(0);
    }

    pub fn from_json(text: &str) -> Result<World, serde_json::Error> {
        let mut w: World = serde_json::from_str(text)?;
        w.reindex();
        Ok(w)
    }

    pub fn item(&self, id: ItemId) -> &Item {
        &self.items[id as usize]
    }

    pub fn by_name(&self, name: &str) -> Option<ItemId> {
        let toks: Option<Vec<Tok>> = name.split_whitespace().map(|w| self.vocab.get(w)).collect();
        toks.and_then(|t| self.by_tokens.get(&t).copied())
    }

    /// The longest item name at the start of `toks`: (item, tokens used).
    pub fn parse_item(&self, toks: &[Tok]) -> Option<(ItemId, usize)> {
        (1..=self.max_name_len.min(toks.len())).rev().find_map(|n| self.by_tokens.get(&toks[..n]).map(|&id| (id, n)))
    }

    /// Units of each base item needed to make `count` of `item`, expanding every branch of
    /// the canonical recipes on its own (the way a tree of agents crafts it).
    pub fn base_needs(&self, item: ItemId, count: u32) -> HashMap<ItemId, u64> {
        let mut out = HashMap::new();
        self.expand(item, count as u64, &mut out, &mut |_, _| {});
        out
    }

    /// Walk the per-branch expansion: `visit(item, units)` for every craftable node.
    pub fn expand(&self, item: ItemId, count: u64, base: &mut HashMap<ItemId, u64>, visit: &mut impl FnMut(ItemId, u64)) {
        let it = self.item(item);
        match it.recipes.first() {
            None => *base.entry(item).or_default() += count,
            Some(r) => {
                visit(item, count);
                let crafts = count.div_ceil(r.result_count as u64);
                for &(ing, amount) in &r.ingredients {
                    self.expand(ing, crafts * amount as u64, base, visit);
                }
            }
        }
    }

    /// Craftable items whose tier is in the band's range.
    pub fn targets(&self, band: Band, held_out: bool) -> Vec<ItemId> {
        let (lo, hi) = self.bands.tiers(band);
        self.targets_in_tiers(lo, hi, held_out)
    }

    /// Craftable items of tiers `lo..=hi` in the training (or held-out) split.
    pub fn targets_in_tiers(&self, lo: u32, hi: u32, held_out: bool) -> Vec<ItemId> {
        self.items.iter().filter(|i| !i.is_base() && i.tier >= lo && i.tier <= hi && i.held_out == held_out).map(|i| i.id).collect()
    }

    pub fn base_items(&self) -> Vec<ItemId> {
        self.items.iter().filter(|i| i.is_base() && !i.is_tag()).map(|i| i.id).collect()
    }
}

/// Parameters of a TextCraft-Synth world.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SynthConfig {
    /// Number of domains (at most 5: metal, crystal, organic, arcane, tech).
    pub domains: u32,
    pub max_tier: u32,
    /// Base items (tier 0) per domain.
    pub base_per_domain: u32,
    /// Craftable items per tier per domain; absent: max(1, 25 − ⌊t/3⌋).
    #[serde(default)]
    pub items_per_tier: Option<u32>,
    /// Cap on ingredients per recipe (6 in the full world).
    pub max_ingredients: u32,
    /// Add one ingredient from tier t−3 or t−4 for t ≥ 4.
    pub far_ingredient: bool,
    /// All amounts and result counts 1 (compact worlds).
    pub unit_amounts: bool,
    /// Cross-domain items per tier at tiers 10–12.
    pub cross_domain_per_tier: u32,
    /// Fraction of craftable items of every tier held out for validation.
    pub holdout: f64,
    pub bands: Bands,
}

impl SynthConfig {
    /// The world of ENVIRONMENTS.md: 5 domains, tiers 0–12.
    pub fn full() -> Self {
        SynthConfig {
            domains: 5,
            max_tier: 12,
            base_per_domain: 10,
            items_per_tier: None,
            max_ingredients: 6,
            far_ingredient: true,
            unit_amounts: false,
            cross_domain_per_tier: 2,
            holdout: 0.2,
            bands: Bands { easy: (2, 3), medium: (4, 6), hard: (7, 9), extreme: (10, 12) },
        }
    }

    /// A compact world where a recursive node fits in ~40 tokens: 3 domains, tiers 0–7,
    /// 10 items per tier, at most 2 ingredients, unit amounts.
    pub fn small() -> Self {
        SynthConfig {
            domains: 3,
            max_tier: 7,
            base_per_domain: 10,
            items_per_tier: Some(10),
            max_ingredients: 2,
            far_ingredient: false,
            unit_amounts: true,
            cross_domain_per_tier: 0,
            holdout: 0.2,
            bands: Bands { easy: (2, 3), medium: (4, 5), hard: (6, 7), extreme: (8, 9) },
        }
    }

    /// The small world with two more tiers (8–9, its Extreme band): the same recipes at tiers
    /// 1–7 and the same vocabulary, for evaluating generalisation beyond the tiers trained on.
    pub fn small_deep() -> Self {
        SynthConfig { max_tier: 9, ..Self::small() }
    }

    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "full" => Some(Self::full()),
            "small" => Some(Self::small()),
            "small-deep" => Some(Self::small_deep()),
            _ => None,
        }
    }

    /// The deepest tier the vocabulary spells: this world's, or its deepest band's if deeper.
    pub fn vocab_tiers(&self) -> u32 {
        self.max_tier.max(self.bands.extreme.1)
    }

    fn per_tier(&self, t: u32) -> u32 {
        self.items_per_tier.unwrap_or_else(|| 25u32.saturating_sub(t / 3).max(1))
    }
}

const DOMAINS: [&str; 5] = ["M", "C", "O", "A", "T"];
const CROSS: &str = "X";

/// The vocabulary of a TextCraft-Synth world: language words, domain/tier/index sub-tokens, depths.
fn synth_vocab(cfg: &SynthConfig) -> Vocab {
    let mut words: Vec<String> = LANGUAGE.iter().map(|s| s.to_string()).collect();
    words.extend((0..=MAX_DEPTH_TOKEN).map(|d| format!("@{d}")));
    words.extend(DOMAINS.iter().take(cfg.domains as usize).map(|s| s.to_string()));
    if cfg.cross_domain_per_tier > 0 {
        words.push(CROSS.into());
    }
    // Tier words up to the deepest band's, even where this world stops short of it: a world with
    // more tiers (`small-deep`) then has the same vocabulary, so a policy trained in one plays in
    // the other.
    words.extend((0..=cfg.vocab_tiers()).map(|t| format!("t{t}")));
    let max_idx = (0..=cfg.max_tier)
        .map(|t| if t == 0 { cfg.base_per_domain } else { cfg.per_tier(t) })
        .max()
        .unwrap_or(1)
        .max(cfg.cross_domain_per_tier);
    words.extend((0..max_idx).map(|i| format!("i{i}")));
    Vocab::new(words.iter().map(|s| s.as_str()))
}

/// Generate a TextCraft-Synth world. Same config and seed → the same world, byte for byte.
pub fn generate(cfg: &SynthConfig, seed: u64) -> World {
    let vocab = synth_vocab(cfg);
    let mut rng = Rng::derive(seed, "textcraft-synth/world");
    let mut items: Vec<Item> = Vec::new();
    // by_tier[domain][tier] = item ids
    let mut by_tier: Vec<Vec<Vec<ItemId>>> = vec![vec![Vec::new(); cfg.max_tier as usize + 1]; cfg.domains as usize];
    let new_item = |items: &mut Vec<Item>, dom: &str, tier: u32, idx: u32, recipe: Option<Recipe>| -> ItemId {
        let name = format!("{dom} t{tier} i{idx}");
        let id = items.len() as ItemId;
        items.push(Item {
            id,
            tokens: vocab.ids(&name),
            name,
            tier,
            recipes: recipe.into_iter().collect(),
            held_out: false,
            members: Vec::new(),
        });
        id
    };
    for (d, dom) in DOMAINS.iter().enumerate().take(cfg.domains as usize) {
        for i in 0..cfg.base_per_domain {
            let id = new_item(&mut items, dom, 0, i, None);
            by_tier[d][0].push(id);
        }
    }
    for t in 1..=cfg.max_tier {
        for (d, dom) in DOMAINS.iter().enumerate().take(cfg.domains as usize) {
            for i in 0..cfg.per_tier(t) {
                let recipe = make_recipe(cfg, t, &[&by_tier[d]], &mut rng);
                let id = new_item(&mut items, dom, t, i, Some(recipe));
                by_tier[d][t as usize].push(id);
            }
        }
        if (10..=12).contains(&t) && cfg.domains >= 2 {
            for i in 0..cfg.cross_domain_per_tier {
                let a = rng.below(cfg.domains as usize);
                let b = (a + 1 + rng.below(cfg.domains as usize - 1)) % cfg.domains as usize;
                let recipe = make_recipe(cfg, t, &[&by_tier[a], &by_tier[b]], &mut rng);
                new_item(&mut items, CROSS, t, i, Some(recipe));
            }
        }
    }
    // Hold out a fraction of the craftable items of every tier.
    for t in 1..=cfg.max_tier {
        let mut ids: Vec<ItemId> = items.iter().filter(|i| i.tier == t).map(|i| i.id).collect();
        rng.shuffle(&mut ids);
        let k = ((ids.len() as f64) * cfg.holdout).round() as usize;
        for id in ids.into_iter().take(k) {
            items[id as usize].held_out = true;
        }
    }
    World::new(format!("textcraft-synth/{seed}"), items, vocab, cfg.bands.clone())
}

/// A tier-t recipe from the given domains' items (see ENVIRONMENTS.md §1).
fn make_recipe(cfg: &SynthConfig, t: u32, domains: &[&Vec<Vec<ItemId>>], rng: &mut Rng) -> Recipe {
    let base_count = match t {
        1 => 1,
        2..=7 => 2,
        8..=11 => 3,
        _ => 4,
    };
    let want = (base_count + rng.range(0, (t / 3).min(2) as u64) as u32).min(6).min(cfg.max_ingredients);
    let tier_items =
        |tier: u32| -> Vec<(ItemId, u32)> { domains.iter().flat_map(|d| d[tier as usize].iter().map(move |&i| (i, tier))).collect() };
    // One ingredient from t−1 makes the item's depth exactly t.
    let near = tier_items(t - 1);
    let mut chosen: Vec<ItemId> = vec![near[rng.below(near.len())].0];
    let mut pool: Vec<(ItemId, u32)> = near;
    if t >= 2 {
        pool.extend(tier_items(t - 2));
    }
    pool.retain(|(i, _)| !chosen.contains(i));
    while (chosen.len() as u32) < want && !pool.is_empty() {
        let weights: Vec<f64> = pool.iter().map(|(_, tier)| 1.0 / ((t - tier) as f64 + 1.0)).collect();
        let k = rng.weighted(&weights);
        chosen.push(pool.remove(k).0);
    }
    if cfg.far_ingredient && t >= 4 && (chosen.len() as u32) < cfg.max_ingredients.min(6) {
        let far_tier = if rng.chance(0.5) { t - 3 } else { t - 4 };
        let far = tier_items(far_tier);
        let pick = far[rng.below(far.len())].0;
        if !chosen.contains(&pick) {
            chosen.push(pick);
        }
    }
    let ingredients = chosen.into_iter().map(|i| (i, if cfg.unit_amounts || t > 4 { 1 } else { rng.range(1, 2) as u32 })).collect();
    let result_count = if cfg.unit_amounts {
        1
    } else {
        let n = match t {
            1 => rng.range(2, 4),
            2 => rng.range(2, 3),
            3..=5 => rng.range(1, 2),
            _ => 1,
        };
        n as u32
    };
    Recipe { result_count, ingredients }
}

impl World {
    /// A random renaming of items that keeps the world's structure: items whose names share all
    /// tokens but the last (same domain and tier) swap names. Applied consistently to a whole
    /// demonstration, it forces a learner to read recipes and copy names instead of memorising
    /// item-specific facts.
    pub fn random_renaming(&self, rng: &mut crate::rng::Rng) -> HashMap<ItemId, ItemId> {
        self.random_renaming_shifted(rng, 0)
    }

    /// Like [`World::random_renaming`], and every craftable item of tier k also takes the name of
    /// an item of tier k + `shift` in its domain (cyclically over tiers 1..=max, so it stays a
    /// permutation). With `shift` at most the world's top tier minus the highest tier in a
    /// demonstration, tiers keep their order there, and a learner sees every tier token in
    /// every role — including tiers no training task reaches (Hard targets are held out).
    /// Worlds whose domains have unequal tier sizes are only shuffled within tiers.
    pub fn random_renaming_shifted(&self, rng: &mut crate::rng::Rng, shift: u32) -> HashMap<ItemId, ItemId> {
        // (domain token, tier) → items; tier 0 (base items) is never shifted.
        let mut groups: std::collections::BTreeMap<(Tok, u32), Vec<ItemId>> = std::collections::BTreeMap::new();
        for it in &self.items {
            groups.entry((it.tokens[0], it.tier)).or_default().push(it.id);
        }
        let top = self.items.iter().map(|i| i.tier).max().unwrap_or(0);
        let sizes_equal =
            groups.iter().filter(|((_, t), _)| *t > 0).map(|(_, v)| v.len()).collect::<std::collections::BTreeSet<_>>().len() <= 1;
        let shift = if sizes_equal && top > 0 { shift % top } else { 0 };
        let mut map = HashMap::new();
        for ((domain, tier), ids) in &groups {
            let to_tier = if *tier == 0 { 0 } else { (tier - 1 + shift) % top + 1 };
            let mut targets = groups.get(&(*domain, to_tier)).cloned().unwrap_or_else(|| ids.clone());
            rng.shuffle(&mut targets);
            for (a, b) in ids.iter().zip(targets) {
                map.insert(*a, b);
            }
        }
        map
    }

    /// A random renaming for worlds of the original TextCraft's files, whose names have any
    /// number of words: every item takes the name of another of the same tier and word count,
    /// so a renamed sequence keeps its length (masks still line up). Tags and their members keep
    /// their names: which items satisfy a tag is written in their names (`oak planks` is a
    /// `planks`), and renaming them would teach a rule the world does not have.
    pub fn random_renaming_same_shape(&self, rng: &mut crate::rng::Rng) -> HashMap<ItemId, ItemId> {
        let in_tag: std::collections::HashSet<ItemId> = self.items.iter().flat_map(|i| i.members.iter().copied()).collect();
        let mut groups: std::collections::BTreeMap<(u32, usize), Vec<ItemId>> = std::collections::BTreeMap::new();
        for it in self.items.iter().filter(|i| !i.is_tag() && !in_tag.contains(&i.id)) {
            groups.entry((it.tier, it.tokens.len())).or_default().push(it.id);
        }
        let mut map = HashMap::new();
        for ids in groups.values() {
            let mut targets = ids.clone();
            rng.shuffle(&mut targets);
            map.extend(ids.iter().copied().zip(targets));
        }
        map
    }

    /// Rewrite every item name in `toks` through `renaming`.
    pub fn rename_tokens(&self, toks: &[Tok], renaming: &HashMap<ItemId, ItemId>) -> Vec<Tok> {
        let mut out = Vec::with_capacity(toks.len());
        let mut i = 0;
        while i < toks.len() {
            match self.parse_item(&toks[i..]) {
                Some((id, used)) => {
                    out.extend(&self.item(*renaming.get(&id).unwrap_or(&id)).tokens);
                    i += used;
                }
                None => {
                    out.push(toks[i]);
                    i += 1;
                }
            }
        }
        out
    }
}
