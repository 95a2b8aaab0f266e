//! TextCraft tasks: targets and counts, and the initial inventory that makes them solvable.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::world::{Band, ItemId, Rules, World};
use crate::rng::Rng;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Task {
    pub id: String,
    pub band: Option<Band>,
    /// What to make: (item, units), every one of them (TextCraft-Synth tasks have one; the
    /// original TextCraft's have one to three).
    pub targets: Vec<(ItemId, u32)>,
    /// Initial inventory: (item, units), sorted by item id.
    pub inventory: Vec<(ItemId, u32)>,
    /// Validation task (target held out of training).
    pub validation: bool,
    /// Optional gold action texts (the original TextCraft format ships them).
    #[serde(default)]
    pub gold: Vec<String>,
    /// The report group of a task without a band (e.g. the task file it was read from).
    #[serde(default)]
    pub group: Option<String>,
}

impl Task {
    /// Initial inventory as a map.
    pub fn inventory_map(&self) -> HashMap<ItemId, u64> {
        self.inventory.iter().map(|&(i, n)| (i, n as u64)).collect()
    }
    /// The first target (the only one of a TextCraft-Synth task).
    pub fn target(&self) -> ItemId {
        self.targets[0].0
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
            targets: vec![(target, count)],
            inventory: inv.into_iter().map(|(i, n)| (i, n as u32)).collect(),
            validation,
            gold: Vec::new(),
            group: None,
        });
    }
    out
}

/// Whether the task can be done from its inventory. TextCraft-Synth: the canonical recipes,
/// each branch on its own, need no more than the inventory holds. The original TextCraft: a
/// crafting plan over every recipe and tag reaches every target (see [`super::plan`]).
pub fn is_solvable(world: &World, task: &Task) -> bool {
    match world.rules {
        Rules::Synth => {
            let inv = task.inventory_map();
            task.targets
                .iter()
                .all(|&(target, count)| world.base_needs(target, count).iter().all(|(item, n)| inv.get(item).copied().unwrap_or(0) >= *n))
        }
        Rules::Original => super::plan::plan(world, &task.inventory_map(), &task.target_units()).is_ok(),
    }
}

impl Task {
    /// Targets as (item, units) in u64.
    pub fn target_units(&self) -> Vec<(ItemId, u64)> {
        self.targets.iter().map(|&(i, n)| (i, n as u64)).collect()
    }
}
