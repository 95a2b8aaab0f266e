//! Scripted TextCraft experts. They read only the node's own token context (goal, actions,
//! observations) and the world's recipes, and act through the same action language as a policy.

use super::episode::{Action, Lang};
use super::world::{ItemId, Rules, World};
use crate::node::{NodeView, parse_node};
use crate::rng::Rng;
use crate::vocab::Tok;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ExpertConfig {
    /// Deepest level at which a node may still launch children.
    pub max_depth: u32,
    /// Probability that a node delegates its ingredients (else it crafts its subtree itself).
    pub delegate: f64,
    /// Probability of a noise action (a harmless but useless `info`/`inv`/`craft`) at each step.
    pub noise: f64,
    pub seed: u64,
}

impl Default for ExpertConfig {
    fn default() -> Self {
        ExpertConfig { max_depth: 6, delegate: 1.0, noise: 0.0, seed: 0 }
    }
}

/// A node's context, split into its parts (the layout every environment shares).
pub fn parse_context(world: &World, ctx: &[Tok]) -> Option<NodeView> {
    let verbs: Vec<Tok> = ["info", "craft", "inv", "finish", "spawn"].iter().map(|w| world.vocab.id(w)).collect();
    parse_node(&world.vocab, ctx, &verbs)
}

/// Craftable ingredients of `item` and the units needed to make `n` of it.
fn craftable_needs(world: &World, item: ItemId, n: u64) -> Vec<(ItemId, u64)> {
    let Some(r) = world.item(item).recipes.first() else { return vec![] };
    let crafts = n.div_ceil(r.result_count as u64);
    r.ingredients.iter().filter(|(i, _)| !world.item(*i).is_base()).map(|&(i, a)| (i, crafts * a as u64)).collect()
}

/// `info X`, then the same for every craftable ingredient (depth first), then `craft X n`.
pub fn flat_sequence(world: &World, item: ItemId, n: u64, out: &mut Vec<Action>) {
    out.push(Action::Info(item));
    for (ing, units) in craftable_needs(world, item, n) {
        flat_sequence(world, ing, units, out);
    }
    out.push(Action::Craft(item, n));
}

/// The plan of a node: what the expert does, in order, ending with `finish`.
pub fn node_plan(world: &World, cfg: &ExpertConfig, item: ItemId, n: u64, depth: u32, recursive: bool, delegate: bool) -> Vec<Action> {
    let children = craftable_needs(world, item, n);
    let mut plan = Vec::new();
    if recursive && delegate && depth < cfg.max_depth && !children.is_empty() {
        plan.push(Action::Info(item));
        plan.push(Action::Spawn(children));
        plan.push(Action::Craft(item, n));
    } else {
        flat_sequence(world, item, n, &mut plan);
    }
    plan.push(Action::Finish);
    plan
}

pub(crate) fn hash_tokens(seed: u64, toks: &[Tok]) -> u64 {
    let mut h = seed ^ 0x51_7cc1_b727_220a;
    for &t in toks {
        h = (h ^ t as u64).wrapping_mul(0x0100_0000_01b3).rotate_left(13);
    }
    h
}

/// The expert's next action for a node, given its whole context.
pub fn expert_action(world: &World, cfg: &ExpertConfig, ctx: &[Tok]) -> Vec<Tok> {
    if world.rules == Rules::Original {
        return super::expert_original::expert_action(world, cfg, ctx);
    }
    let lang = Lang::new(world);
    let finish = lang.encode(&Action::Finish);
    let Some(p) = parse_context(world, ctx) else { return finish };
    let Some((item, n)) = lang.parse_goal(&p.goal) else { return finish };
    // Per-node choices are a function of the prompt, so every step of the node agrees.
    let prompt_len = 3 + p.goal.len();
    let mut node_rng = Rng::new(hash_tokens(cfg.seed, &ctx[..prompt_len]));
    let delegate = node_rng.chance(cfg.delegate);
    let plan = node_plan(world, cfg, item, n, p.depth, p.recursive, delegate);
    // Follow the plan, skipping over actions that were noise or failed.
    let ok = world.vocab.id("ok");
    let mut next = 0;
    for (action, obs) in &p.turns {
        if next < plan.len() && *action == lang.encode(&plan[next]) {
            let failed_craft = matches!(plan[next], Action::Craft(..)) && obs.get(1) != Some(&ok);
            if !failed_craft {
                next += 1;
            }
        }
    }
    let mut step_rng = Rng::new(hash_tokens(cfg.seed ^ 0xA5A5, ctx));
    if cfg.noise > 0.0 && step_rng.chance(cfg.noise) {
        return noise_action(world, &items_in(world, ctx), &mut step_rng);
    }
    if p.recursive
        && p.depth < cfg.max_depth
        && let Some(missing) = shortfall_after_failed_craft(world, &p)
    {
        return lang.encode(&Action::Spawn(vec![missing]));
    }
    lang.encode(plan.get(next).unwrap_or(&Action::Finish))
}

/// Recovery: when the node's last action was a craft refused with `err need X n` for a craftable
/// X (a child failed, or never ran), what to delegate again. Without it a node whose child failed
/// repeats the refused craft until its window overflows — the most common failure of trained
/// policies on deep trees, learned from demonstrations that never recovered.
fn shortfall_after_failed_craft(world: &World, p: &NodeView) -> Option<(ItemId, u64)> {
    let (action, obs) = p.turns.last()?;
    let v = &world.vocab;
    let refused = action.first() == Some(&v.id("craft")) && obs.get(1) == Some(&v.id("err")) && obs.get(2) == Some(&v.id("need"));
    if !refused {
        return None;
    }
    let ((item, n), _) = Lang::new(world).parse_item_count(&obs[3..]).ok()?;
    (!world.item(item).is_base()).then_some((item, n))
}

/// Items named anywhere in `toks`, in order of first appearance.
pub fn items_in(world: &World, toks: &[Tok]) -> Vec<ItemId> {
    let mut seen = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match world.parse_item(&toks[i..]) {
            Some((item, used)) => {
                if !seen.contains(&item) {
                    seen.push(item);
                }
                i += used;
            }
            None => i += 1,
        }
    }
    seen
}

/// A well-formed action that does no harm (and no good): a repeated `info`, an `inv`, or crafting
/// a base item (always refused). It names only items in `seen` (those already in the node's
/// context), so imitating noise teaches wasted steps, never inventing or mis-copying a name.
pub fn noise_action(world: &World, seen: &[ItemId], rng: &mut Rng) -> Vec<Tok> {
    let lang = Lang::new(world);
    let bases: Vec<ItemId> = seen.iter().copied().filter(|i| world.item(*i).is_base()).collect();
    match rng.below(3) {
        0 if !seen.is_empty() => lang.encode(&Action::Info(seen[rng.below(seen.len())])),
        2 if !bases.is_empty() => lang.encode(&Action::Craft(bases[rng.below(bases.len())], 1)),
        _ => lang.encode(&Action::Inv),
    }
}

/// A uniformly random well-formed action (verb, then items and counts).
pub fn random_action(world: &World, recursive: bool, rng: &mut Rng) -> Vec<Tok> {
    let lang = Lang::new(world);
    let n_items = world.items.len();
    let verbs = if recursive { 5 } else { 4 };
    let action = match rng.below(verbs) {
        0 => Action::Info(rng.below(n_items) as ItemId),
        1 => Action::Craft(rng.below(n_items) as ItemId, rng.range(1, 3)),
        2 => Action::Inv,
        3 => Action::Finish,
        _ => Action::Spawn((0..rng.range(1, 3)).map(|_| (rng.below(n_items) as ItemId, rng.range(1, 3))).collect()),
    };
    lang.encode(&action)
}
