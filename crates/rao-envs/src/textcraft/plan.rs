//! Crafting plans for the original TextCraft: which crafts, in which order, with which recipe and
//! which concrete item for each tag, make every target from an inventory. A depth-first search
//! over every recipe of an item and every item of a tag, backtracking on dead ends; an item is
//! never made again below itself (so crafting loops such as lapis lazuli ↔ lapis block end), and
//! the search is bounded. Every planned craft is one the original's craft rule accepts.

use std::collections::BTreeMap;

use super::craft::{Inventory, match_recipe};
use super::world::{ItemId, World};

/// Search steps before a plan is given up on (a task of the published data needs a few hundred).
pub const SEARCH_BUDGET: usize = 50_000;

/// One craft of a plan, as the original's craft action names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Craft {
    pub item: ItemId,
    /// Units made (crafts × the recipe's yield).
    pub total: u64,
    /// The concrete items taken and their units, in the order the craft names them.
    pub ingredients: Vec<(ItemId, u64)>,
    /// The craft whose ingredient this one makes (`None`: it makes a target).
    pub parent: Option<usize>,
    /// Its subtree: the crafts `start..=` this one made what it needed.
    pub start: usize,
    /// Units of `item` its subtree provides to its parent (or target), stock included.
    pub goal: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// In the order they are done (every craft after the crafts of its ingredients).
    pub crafts: Vec<Craft>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// No way to make the targets from the inventory.
    NoPlan,
    /// The search gave up after [`SEARCH_BUDGET`] steps.
    Budget,
}

impl Plan {
    /// Crafts whose product goes straight into craft `i`.
    pub fn children(&self, i: usize) -> Vec<usize> {
        (self.crafts[i].start..i).filter(|&j| self.crafts[j].parent == Some(i)).collect()
    }
    /// Crafts that make targets.
    pub fn roots(&self) -> Vec<usize> {
        (0..self.crafts.len()).filter(|&j| self.crafts[j].parent.is_none()).collect()
    }
}

/// A plan that makes `targets` from `inv` (each held at the end, on top of what crafts consumed).
pub fn plan(world: &World, inv: &Inventory, targets: &[(ItemId, u64)]) -> Result<Plan, PlanError> {
    search(world, inv, targets, false).map(|(plan, _)| plan)
}

/// Where no plan exists: the items no recipe makes that a plan would still need, and how many
/// more of each, for the plan that borrows the fewest units. `None` if even borrowing finds no
/// plan (a tag no item satisfies) within the search budget.
pub fn shortfall(world: &World, inv: &Inventory, targets: &[(ItemId, u64)]) -> Option<Vec<(ItemId, u64)>> {
    search(world, inv, targets, true).ok().map(|(_, borrowed)| borrowed.into_iter().collect())
}

#[derive(Debug, Clone)]
enum Step {
    /// Provide `n` units of `item` to `parent`'s craft (ingredient `slot_ing` of it) or to the targets.
    Obtain { item: ItemId, n: u64, path: Vec<ItemId>, parent: Option<usize>, slot_ing: Option<usize> },
    /// Do the craft planned in this slot (its ingredients are all provided).
    Make { slot: usize },
}

#[derive(Debug, Clone)]
struct Slot {
    item: ItemId,
    recipe: usize,
    crafts: u64,
    /// The concrete item chosen for each tag ingredient.
    members: Vec<Option<ItemId>>,
    parent: Option<usize>,
    start: usize,
    goal: u64,
    /// Units still owed to the parent after what stock provided.
    owed: u64,
}

#[derive(Debug, Clone)]
struct State {
    avail: BTreeMap<ItemId, u64>,
    /// Next step last.
    agenda: Vec<Step>,
    slots: Vec<Slot>,
    /// (craft, slot) in the order done.
    done: Vec<(Craft, usize)>,
    borrowed: BTreeMap<ItemId, u64>,
}

fn search(world: &World, inv: &Inventory, targets: &[(ItemId, u64)], borrow: bool) -> Result<(Plan, BTreeMap<ItemId, u64>), PlanError> {
    let start = State {
        avail: inv.iter().filter(|(_, n)| **n > 0).map(|(i, n)| (*i, *n)).collect(),
        agenda: targets.iter().rev().map(|&(item, n)| Step::Obtain { item, n, path: vec![], parent: None, slot_ing: None }).collect(),
        slots: Vec::new(),
        done: Vec::new(),
        borrowed: BTreeMap::new(),
    };
    let mut stack = vec![start];
    let mut steps = 0usize;
    // Borrowing: keep looking for the plan that borrows least.
    let mut best: Option<(Plan, BTreeMap<ItemId, u64>)> = None;
    let borrowed_units = |b: &BTreeMap<ItemId, u64>| b.values().sum::<u64>();
    while let Some(mut st) = stack.pop() {
        loop {
            steps += 1;
            if steps > SEARCH_BUDGET {
                return best.ok_or(PlanError::Budget);
            }
            if best.as_ref().is_some_and(|(_, b)| borrowed_units(&st.borrowed) >= borrowed_units(b)) {
                break; // cannot beat the best borrowing plan
            }
            let Some(step) = st.agenda.pop() else {
                if !borrow || st.borrowed.is_empty() {
                    return Ok((finish(st.done), st.borrowed));
                }
                best = Some((finish(st.done), st.borrowed));
                break;
            };
            match advance(world, st, step, borrow) {
                Advance::Continue(next) => st = next,
                Advance::Branch(options) => {
                    stack.extend(options.into_iter().rev());
                    break;
                }
                Advance::Dead => break,
            }
        }
    }
    best.ok_or(PlanError::NoPlan)
}

/// Slot indices → craft indices.
fn finish(done: Vec<(Craft, usize)>) -> Plan {
    let index_of_slot: BTreeMap<usize, usize> = done.iter().enumerate().map(|(i, (_, slot))| (*slot, i)).collect();
    let crafts = done
        .into_iter()
        .map(|(mut c, _)| {
            c.parent = c.parent.map(|slot| index_of_slot[&slot]);
            c
        })
        .collect();
    Plan { crafts }
}

enum Advance {
    Continue(State),
    /// Alternatives, best first.
    Branch(Vec<State>),
    Dead,
}

fn advance(world: &World, mut st: State, step: Step, borrow: bool) -> Advance {
    match step {
        Step::Make { slot } => make(world, st, slot),
        Step::Obtain { item, n, path, parent, slot_ing } => {
            let it = world.item(item);
            if it.is_tag() {
                return Advance::Branch(choose_member(world, &st, item, n, path, parent, slot_ing));
            }
            let have = st.avail.get(&item).copied().unwrap_or(0);
            if have >= n {
                st.avail.insert(item, have - n);
                return Advance::Continue(st);
            }
            if it.recipes.is_empty() || path.contains(&item) {
                if !borrow {
                    return Advance::Dead;
                }
                *st.borrowed.entry(item).or_default() += n - have;
                st.avail.insert(item, 0);
                return Advance::Continue(st);
            }
            st.avail.insert(item, 0);
            let owed = n - have;
            let mut inner = path.clone();
            inner.push(item);
            let options = it
                .recipes
                .iter()
                .enumerate()
                .map(|(k, r)| {
                    let mut s = st.clone();
                    let crafts = owed.div_ceil(r.result_count.max(1) as u64);
                    let slot = s.slots.len();
                    s.slots.push(Slot {
                        item,
                        recipe: k,
                        crafts,
                        members: vec![None; r.ingredients.len()],
                        parent,
                        start: s.done.len(),
                        goal: n,
                        owed,
                    });
                    s.agenda.push(Step::Make { slot });
                    for (i, &(ing, amount)) in r.ingredients.iter().enumerate().rev() {
                        s.agenda.push(Step::Obtain {
                            item: ing,
                            n: crafts.saturating_mul(amount as u64),
                            path: inner.clone(),
                            parent: Some(slot),
                            slot_ing: Some(i),
                        });
                    }
                    s
                })
                .collect();
            Advance::Branch(options)
        }
    }
}

/// A tag ingredient: one state per item that may pay for it — items held in full first — each
/// then obtaining that item. An item the recipe names itself, or that another tag of it took, is
/// left out (the original's craft could not tell them apart).
fn choose_member(
    world: &World,
    st: &State,
    tag: ItemId,
    n: u64,
    path: Vec<ItemId>,
    parent: Option<usize>,
    slot_ing: Option<usize>,
) -> Vec<State> {
    let taken: Vec<ItemId> = match parent {
        Some(slot) => {
            let s = &st.slots[slot];
            let r = &world.item(s.item).recipes[s.recipe];
            r.ingredients.iter().map(|(i, _)| *i).chain(s.members.iter().flatten().copied()).collect()
        }
        None => vec![],
    };
    let members: Vec<ItemId> = world.item(tag).members.iter().copied().filter(|m| !taken.contains(m)).collect();
    let held_in_full = |m: &ItemId| st.avail.get(m).copied().unwrap_or(0) >= n;
    let ordered = members.iter().filter(|m| held_in_full(m)).chain(members.iter().filter(|m| !held_in_full(m)));
    ordered
        .map(|&m| {
            let mut s = st.clone();
            if let (Some(slot), Some(i)) = (parent, slot_ing) {
                s.slots[slot].members[i] = Some(m);
            }
            s.agenda.push(Step::Obtain { item: m, n, path: path.clone(), parent, slot_ing: None });
            s
        })
        .collect()
}

fn make(world: &World, mut st: State, slot: usize) -> Advance {
    let s = st.slots[slot].clone();
    let r = &world.item(s.item).recipes[s.recipe];
    // Saturating: units multiply down a deep chain of recipes (such a plan fails on the inventory).
    let total = s.crafts.saturating_mul(r.result_count as u64);
    // Tag items first, so the original's first-match lookup for a tag finds the chosen item.
    let mut provided: Vec<(ItemId, u64)> = Vec::with_capacity(r.ingredients.len());
    for (k, &(ing, amount)) in r.ingredients.iter().enumerate() {
        if let Some(m) = s.members[k] {
            provided.push((m, s.crafts.saturating_mul(amount as u64)));
        } else if world.item(ing).is_tag() {
            return Advance::Dead;
        }
    }
    for &(ing, amount) in &r.ingredients {
        if !world.item(ing).is_tag() {
            provided.push((ing, s.crafts.saturating_mul(amount as u64)));
        }
    }
    // The original's craft tries every recipe of the item: the first that matches decides, and
    // any match takes exactly what is provided and makes `total`.
    if !world.item(s.item).recipes.iter().any(|r| match_recipe(world, r, total, &provided).is_some()) {
        return Advance::Dead;
    }
    let left = st.avail.entry(s.item).or_default();
    *left = left.saturating_add(total - s.owed);
    let craft = Craft { item: s.item, total, ingredients: provided, parent: s.parent, start: s.start, goal: s.goal };
    st.done.push((craft, slot));
    Advance::Continue(st)
}
