//! The scripted expert in worlds of the original TextCraft, where an item has several recipes,
//! tags take any of their items, and which ones work depends on the inventory. A node looks at
//! the inventory (`inv`), plans every craft its goal needs ([`super::plan`]), and crafts with
//! the original's exact rule (`craft ITEM N from …`). A recursive node delegates the subtree of an
//! ingredient (`spawn ITEM N`, one child at a time: children share the inventory) when a child
//! starting from that inventory would plan exactly the same crafts — so delegating never changes
//! what is crafted — and does the rest itself. Anything unexpected (a refused spawn, a failed
//! child or craft) makes it look at the inventory again and re-plan; after a refused spawn or a
//! failed child it stops delegating.

use super::craft::Inventory;
use super::episode::{Action, Lang};
use super::expert::{ExpertConfig, hash_tokens, items_in, noise_action, parse_context};
use super::plan::{Craft, Plan, plan};
use super::world::{ItemId, World};
use crate::node::NodeView;
use crate::rng::Rng;
use crate::vocab::{OBS, Tok};

/// The expert's next action for a node of an original-rules world, given its whole context.
pub fn expert_action(world: &World, cfg: &ExpertConfig, ctx: &[Tok]) -> Vec<Tok> {
    let lang = Lang::new(world);
    let finish = lang.encode(&Action::Finish);
    let inv = lang.encode(&Action::Inv);
    let Some(p) = parse_context(world, ctx) else { return finish };
    let Some(goals) = lang.parse_goals(&p.goal) else { return finish };
    let prompt_len = 3 + p.goal.len();
    let delegate = Rng::new(hash_tokens(cfg.seed, &ctx[..prompt_len])).chance(cfg.delegate);
    let mut step_rng = Rng::new(hash_tokens(cfg.seed ^ 0xA5A5, ctx));
    if cfg.noise > 0.0 && step_rng.chance(cfg.noise) && !p.turns.is_empty() {
        return noise_action(world, &items_in(world, ctx), &mut step_rng);
    }
    // Plan from the last look at the inventory; without one, look first.
    let Some(last_inv) = p.turns.iter().rposition(|(a, _)| *a == inv) else { return inv };
    let Some(held) = read_inventory(world, &p.turns[last_inv].1) else { return inv };
    let Ok(plan) = plan(world, &held, &goals) else { return finish };
    let may_delegate = p.recursive && delegate && p.depth < cfg.max_depth && !delegation_went_wrong(world, &p);
    let actions = node_actions(world, &plan, &held, may_delegate);
    let mut next = 0;
    for (action, obs) in &p.turns[last_inv + 1..] {
        if next < actions.len() && *action == lang.encode(&actions[next]) {
            if !went_well(world, &actions[next], obs) {
                return inv;
            }
            next += 1;
        }
    }
    lang.encode(actions.get(next).unwrap_or(&Action::Finish))
}

/// What a node does with its plan: for each craft, `info` on its item, its ingredients' crafts
/// (delegated or its own), then the craft itself; in the plan's order.
fn node_actions(world: &World, plan: &Plan, held: &Inventory, may_delegate: bool) -> Vec<Action> {
    // The inventory before each craft of the plan.
    let mut before = Vec::with_capacity(plan.crafts.len() + 1);
    let mut inv = held.clone();
    for c in &plan.crafts {
        before.push(inv.clone());
        for &(i, n) in &c.ingredients {
            let left = inv.get(&i).copied().unwrap_or(0).saturating_sub(n);
            inv.insert(i, left);
        }
        *inv.entry(c.item).or_default() += c.total;
    }
    let mut out = Vec::new();
    for root in plan.roots() {
        emit(world, plan, &before, root, may_delegate, &mut out);
    }
    out
}

fn emit(world: &World, plan: &Plan, before: &[Inventory], i: usize, may_delegate: bool, out: &mut Vec<Action>) {
    let c = &plan.crafts[i];
    out.push(Action::Info(c.item));
    for child in plan.children(i) {
        let k = &plan.crafts[child];
        if may_delegate && same_crafts(world, plan, before, child) {
            out.push(Action::Spawn(vec![(k.item, k.goal)]));
        } else {
            emit(world, plan, before, child, may_delegate, out);
        }
    }
    out.push(Action::CraftFrom(c.item, c.total, c.ingredients.clone()));
}

/// Whether a child given craft `i`'s item and units, starting from the inventory its subtree
/// starts from, would plan exactly the crafts of that subtree.
fn same_crafts(world: &World, plan: &Plan, before: &[Inventory], i: usize) -> bool {
    let c = &plan.crafts[i];
    let Ok(own) = super::plan::plan(world, &before[c.start], &[(c.item, c.goal)]) else { return false };
    let key = |c: &Craft| (c.item, c.total, c.ingredients.clone());
    own.crafts.len() == i + 1 - c.start && own.crafts.iter().zip(&plan.crafts[c.start..=i]).all(|(a, b)| key(a) == key(b))
}

/// Whether a planned action's observation is what the plan expects.
fn went_well(world: &World, action: &Action, obs: &[Tok]) -> bool {
    let ok = world.vocab.id("ok");
    match action {
        Action::Craft(..) | Action::CraftFrom(..) => obs.get(1) == Some(&ok),
        Action::Spawn(_) => obs.len() > 1 && obs[1..].iter().all(|t| *t == ok),
        _ => true,
    }
}

/// A spawn of this node was refused, or a child it launched failed.
fn delegation_went_wrong(world: &World, p: &NodeView) -> bool {
    let (spawn, ok) = (world.vocab.id("spawn"), world.vocab.id("ok"));
    p.turns.iter().any(|(a, obs)| a.first() == Some(&spawn) && obs.len() > 1 && obs[1..].iter().any(|t| *t != ok))
}

/// The inventory an `inv` observation shows (`<obs> ITEM n …` or `<obs> empty`).
pub fn read_inventory(world: &World, obs: &[Tok]) -> Option<Inventory> {
    if obs.first() != Some(&OBS) {
        return None;
    }
    let mut out = Inventory::new();
    if obs.get(1) == Some(&world.vocab.id("empty")) {
        return Some(out);
    }
    let mut i = 1;
    while i < obs.len() {
        let (item, used): (ItemId, usize) = world.parse_item(&obs[i..])?;
        i += used;
        let mut n = 0u64;
        let digits_start = i;
        while let Some(d) = obs.get(i).and_then(|&t| world.vocab.digit_value(t)) {
            n = n.saturating_mul(10).saturating_add(d);
            i += 1;
        }
        if i == digits_start {
            return None;
        }
        out.insert(item, n);
    }
    Some(out)
}
