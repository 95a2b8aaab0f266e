//! TextCraft tasks: one target and count, and the initial inventory that makes it solvable.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::world::{Band, ItemId, World};
use crate::rng::Rng;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Task {
    pub id: String,
    pub band: Option<Band>,
    pub target: ItemId,
    pub count: u32,
    /// Initial inventory: (item, units), sorted by item id.
    pub inventory: Vec<(ItemId, u32)>,
    /// Validation task (target held out of training).
    pub validation: bool,
    /// Optional gold action texts (the original TextCraft format ships them).
    #[serde(default)]
    pub gold: Vec<String>,
}

impl Task {
    /// Initial inventory as a map.
    pub fn inventory_map(&self) -> HashMap<ItemId, u64> {
        self.inventory.iter().map(|&(i, n)| (i, n as u64)).collect()
    }
}

/// Make `n` tasks of a band. `validation` picks held-out targets.
pub fn synthesize(world: &World, band: Band, n: usize, validation: bool, seed: u64) -> Vec<Task> {
    let (lo, hi) = world.bands.tiers(band);
    let max_count = if matches!(band, Band::Hard | Band::Extreme) { 2 } else { 3 };
    let mut tasks = synthesize_tiers(world, band.name(), (lo, hi), max_count, n, validation, seed);
    tasks.iter_mut().for_each(|t| t.band = Some(band));
    tasks
}

/// Make `n` tasks whose targets have tiers in `tiers` (inclusive), counts 1..=`max_count`,
/// ids `{label}-{split}-{k}` and no band (e.g. the shallow sub-tasks a warm-start gate uses).
pub fn synthesize_tiers(world: &World, label: &str, tiers: (u32, u32), max_count: u64, n: usize, validation: bool, seed: u64) -> Vec<Task> {
    let split = if validation { "val" } else { "train" };
    let mut rng = Rng::derive(seed, &format!("textcraft/tasks/{label}/{split}"));
    let targets = world.targets_in_tiers(tiers.0, tiers.1, validation);
    if targets.is_empty() {
        return Vec::new();
    }
    let bases = world.base_items();
    let mut out = Vec::with_capacity(n);
    for k in 0..n {
        let target = targets[rng.below(targets.len())];
        let count = rng.range(1, max_count) as u32;
        let needs = world.base_needs(target, count);
        let mut inv: BTreeMap<ItemId, u64> = BTreeMap::new();
        let mut needed: Vec<(ItemId, u64)> = needs.into_iter().collect();
        needed.sort();
        for (item, units) in needed {
            // A 0–50% buffer on top of what is exactly needed.
            let buffer = ((units as f64) * rng.f64() * 0.5).round() as u64;
            inv.insert(item, units + buffer);
        }
        let distractors = rng.range(1, 3);
        for _ in 0..distractors {
            let candidates: Vec<ItemId> = bases.iter().copied().filter(|b| !inv.contains_key(b)).collect();
            if candidates.is_empty() {
                break;
            }
            inv.insert(candidates[rng.below(candidates.len())], rng.range(1, 4));
        }
        out.push(Task {
            id: format!("{label}-{split}-{k:05}"),
            band: None,
            target,
            count,
            inventory: inv.into_iter().map(|(i, n)| (i, n as u32)).collect(),
            validation,
            gold: Vec::new(),
        });
    }
    out
}

/// Whether the canonical recipes can make the task from its inventory (each branch on its own).
pub fn is_solvable(world: &World, task: &Task) -> bool {
    let needs = world.base_needs(task.target, task.count);
    let inv = task.inventory_map();
    needs.iter().all(|(item, n)| inv.get(item).copied().unwrap_or(0) >= *n)
}
