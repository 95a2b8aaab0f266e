//! What a craft takes and makes, as pure functions over an inventory: rao's compact
//! `craft ITEM N`, and the original TextCraft's craft, which names its exact ingredients.

use std::collections::HashMap;

use super::world::{ItemId, Recipe, World};

pub type Inventory = HashMap<ItemId, u64>;

/// Why a craft was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CraftError {
    /// No recipe makes the item (a base item, or a tag).
    NoRecipe,
    /// The inventory is short of an ingredient (a tag for the compact craft): what, and how many more.
    Need(ItemId, u64),
    /// The named ingredients and total match none of the item's recipes.
    NoMatch,
}

fn held(inv: &Inventory, item: ItemId) -> u64 {
    inv.get(&item).copied().unwrap_or(0)
}

fn take(inv: &mut Inventory, item: ItemId, n: u64) {
    // As the original does: an entry that reaches zero (or below) leaves the inventory.
    let left = held(inv, item).saturating_sub(n);
    if left == 0 {
        inv.remove(&item);
    } else {
        inv.insert(item, left);
    }
}

/// rao's compact craft: the first recipe (in order) the inventory can pay for makes at least `n`
/// units (⌈n / yield⌉ crafts); a tag ingredient is paid with the first of its items the inventory
/// holds enough of (not one the recipe names itself, nor one another tag of it took). Returns
/// the units made; refused, it names what the first recipe lacks.
pub fn compact(world: &World, inv: &mut Inventory, item: ItemId, n: u64) -> Result<u64, CraftError> {
    let recipes = &world.item(item).recipes;
    if recipes.is_empty() {
        return Err(CraftError::NoRecipe);
    }
    let mut first_shortfall = None;
    for r in recipes {
        let crafts = n.div_ceil(r.result_count as u64);
        match compact_payment(world, inv, r, crafts) {
            Ok(pay) => {
                for (ing, units) in pay {
                    take(inv, ing, units);
                }
                let made = crafts.saturating_mul(r.result_count as u64);
                let held = inv.entry(item).or_default();
                *held = held.saturating_add(made);
                return Ok(made);
            }
            Err(short) => {
                first_shortfall.get_or_insert(short);
            }
        }
    }
    Err(first_shortfall.expect("at least one recipe"))
}

/// What `crafts` crafts of `r` take from `inv` (concrete items), or the first shortfall.
fn compact_payment(world: &World, inv: &Inventory, r: &Recipe, crafts: u64) -> Result<Vec<(ItemId, u64)>, CraftError> {
    let mut pay: Vec<(ItemId, u64)> = Vec::with_capacity(r.ingredients.len());
    for &(ing, amount) in &r.ingredients {
        let units = crafts.saturating_mul(amount as u64);
        let it = world.item(ing);
        if it.is_tag() {
            let named = |m: &ItemId| r.ingredients.iter().any(|(i, _)| i == m) || pay.iter().any(|(p, _)| p == m);
            match it.members.iter().copied().filter(|m| !named(m)).find(|&m| held(inv, m) >= units) {
                Some(m) => pay.push((m, units)),
                None => {
                    let best = it.members.iter().map(|&m| held(inv, m)).max().unwrap_or(0);
                    return Err(CraftError::Need(ing, units - best));
                }
            }
        } else if held(inv, ing) >= units {
            pay.push((ing, units));
        } else {
            return Err(CraftError::Need(ing, units - held(inv, ing)));
        }
    }
    Ok(pay)
}

/// Provided ingredients as the original's Python dict holds them: a repeated item keeps its
/// first position and takes its last amount.
pub fn as_dict(pairs: &[(ItemId, u64)]) -> Vec<(ItemId, u64)> {
    let mut out: Vec<(ItemId, u64)> = Vec::with_capacity(pairs.len());
    for &(i, n) in pairs {
        match out.iter_mut().find(|(j, _)| *j == i) {
            Some(slot) => slot.1 = n,
            None => out.push((i, n)),
        }
    }
    out
}

/// The original's matching of one recipe, inventory aside: `total` must be a multiple of the
/// recipe's yield; every concrete ingredient must be provided with exactly its units; every tag
/// takes the first provided item (in the order given) that satisfies it with exactly its units;
/// nothing else may be provided. Returns what the craft takes: (provided item, units) per
/// ingredient of the recipe.
pub fn match_recipe(world: &World, r: &Recipe, total: u64, provided: &[(ItemId, u64)]) -> Option<Vec<(ItemId, u64)>> {
    let yield_ = r.result_count as u64;
    if yield_ == 0 || !total.is_multiple_of(yield_) {
        return None;
    }
    let crafts = total / yield_;
    let mut takes: Vec<(ItemId, u64)> = Vec::with_capacity(r.ingredients.len());
    for &(ing, amount) in &r.ingredients {
        let units = crafts.saturating_mul(amount as u64);
        let it = world.item(ing);
        let found = if it.is_tag() {
            provided.iter().find(|(p, n)| it.members.contains(p) && *n == units).map(|(p, _)| *p)
        } else {
            provided.iter().find(|(p, n)| *p == ing && *n == units).map(|(p, _)| *p)
        };
        takes.push((found?, units));
    }
    if provided.iter().any(|(p, _)| !takes.iter().any(|(t, _)| t == p)) {
        return None; // an ingredient the recipe does not take
    }
    Some(takes)
}

/// The original TextCraft's craft: `provided` names concrete ingredients and their units, `total`
/// the units to make. Each recipe of the item is tried in order; the first that matches
/// ([`match_recipe`]) and that the inventory can pay for is crafted. Refused: `Need` for the
/// first recipe that matched but could not be paid, else `NoMatch`.
pub fn exact(world: &World, inv: &mut Inventory, item: ItemId, total: u64, provided: &[(ItemId, u64)]) -> Result<u64, CraftError> {
    let recipes = &world.item(item).recipes;
    if recipes.is_empty() {
        return Err(CraftError::NoRecipe);
    }
    let provided = as_dict(provided);
    let mut refusal = CraftError::NoMatch;
    for r in recipes {
        let Some(takes) = match_recipe(world, r, total, &provided) else { continue };
        // Each ingredient is checked against the inventory on its own, as the original does.
        if let Some(&(p, units)) = takes.iter().find(|&&(p, units)| held(inv, p) < units) {
            if refusal == CraftError::NoMatch {
                refusal = CraftError::Need(p, units - held(inv, p));
            }
            continue;
        }
        for (p, units) in takes {
            take(inv, p, units);
        }
        let held = inv.entry(item).or_default();
        *held = held.saturating_add(total);
        return Ok(total);
    }
    Err(refusal)
}
