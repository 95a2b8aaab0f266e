//! A stand-in for the RAO authors' TextCraft files, made from Minecraft's own recipes
//! ([`super::vanilla`]): the same layout (`recipes/*.json`, `textcraft_train.jsonl`,
//! `textcraft_val.jsonl`) and tasks made the way TextCraft's are — one to three target items, an
//! inventory of the base items they need plus a distractor or two, and the gold crafting
//! sequence. Validation targets are items no training task asks for (a fifth of the craftable
//! items of every tier). Every task is checked by loading the files as the original code reads
//! them and replaying its gold.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Map, Value, json};

use rao_envs::rng::Rng;
use rao_envs::textcraft::original::recipes::{self, Ingredient, RecipeFile};
use rao_envs::textcraft::original::{self, LoadError, SourceFile, item_text, tag_text};
use rao_envs::textcraft::world::{ItemId, World};

/// What to make.
#[derive(Debug, Clone)]
pub struct StandinConfig {
    pub train: usize,
    pub validation: usize,
    /// Seed of the split and of the tasks (the data set's identity, not a run's seed).
    pub seed: u64,
    /// Share of each tier's craftable items that only validation tasks ask for.
    pub holdout: f64,
    /// The step budget written into every task (`max_steps`).
    pub max_steps: u32,
}

impl Default for StandinConfig {
    fn default() -> Self {
        StandinConfig { train: 1000, validation: 100, seed: 1, holdout: 0.2, max_steps: 50 }
    }
}

pub const TRAIN_FILE: &str = "textcraft_train.jsonl";
pub const VAL_FILE: &str = "textcraft_val.jsonl";

/// The files of the stand-in (paths relative to its root) and a summary of what they hold.
#[derive(Debug)]
pub struct Standin {
    pub files: Vec<(String, String)>,
    /// Craftable items per tier (tier → count), as the loader ranks them.
    pub items_per_tier: BTreeMap<u32, usize>,
    /// Tasks per deepest target tier, for each split.
    pub train_tiers: BTreeMap<u32, usize>,
    pub validation_tiers: BTreeMap<u32, usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum StandinError {
    #[error(transparent)]
    Data(#[from] super::vanilla::DataError),
    #[error("the recipes do not load: {0}")]
    Load(#[from] LoadError),
    #[error("{0}")]
    Empty(String),
    #[error("task {id}: its gold does not replay ({why}); this is a bug of the stand-in")]
    Gold { id: String, why: String },
}

/// Build the stand-in from `minecraft-data`'s `recipes.json` and `items.json` of one version.
pub fn build(recipes_json: &str, items_json: &str, cfg: &StandinConfig) -> Result<Standin, StandinError> {
    let recipe_files: Vec<SourceFile> = super::vanilla::recipe_files(recipes_json, items_json)?
        .into_iter()
        .map(|(name, text)| SourceFile { name: format!("recipes/{name}"), text })
        .collect();
    let empty = SourceFile { name: "(none)".into(), text: String::new() };
    let world = original::load(&recipe_files, &empty, "standin")?.world;
    let names = original_names(&recipe_files);
    let craftable: Vec<ItemId> = world.items.iter().filter(|i| i.tier > 0 && !i.is_tag()).map(|i| i.id).collect();
    let mut items_per_tier: BTreeMap<u32, usize> = BTreeMap::new();
    for &i in &craftable {
        *items_per_tier.entry(world.item(i).tier).or_default() += 1;
    }
    let (train_pool, val_pool) = split(&world, &craftable, cfg);
    if train_pool.is_empty() || val_pool.is_empty() {
        return Err(StandinError::Empty(format!("{} craftable items: too few to split into training and validation", craftable.len())));
    }
    let bases: Vec<ItemId> = world.items.iter().filter(|i| i.tier == 0 && !i.is_tag()).map(|i| i.id).collect();
    let mut files: Vec<(String, String)> = recipe_files.iter().map(|f| (f.name.clone(), f.text.clone())).collect();
    let mut tiers = Vec::new();
    for (file, split_name, pool, n) in [(TRAIN_FILE, "train", &train_pool, cfg.train), (VAL_FILE, "val", &val_pool, cfg.validation)] {
        let mut rng = Rng::derive(cfg.seed, &format!("standin/{split_name}"));
        let mut lines = Vec::with_capacity(n);
        let mut per_tier: BTreeMap<u32, usize> = BTreeMap::new();
        for k in 0..n {
            let task = make_task(&world, pool, &bases, &mut rng);
            *per_tier.entry(task.targets.iter().map(|(i, _)| world.item(*i).tier).max().unwrap_or(0)).or_default() += 1;
            lines.push(task.line(&world, &names, &format!("textcraft.{split_name}.{k}"), cfg.max_steps));
        }
        let text = lines.join("\n") + "\n";
        check_gold(&recipe_files, file, &text)?;
        files.push((file.to_string(), text));
        tiers.push(per_tier);
    }
    let validation_tiers = tiers.pop().unwrap_or_default();
    let train_tiers = tiers.pop().unwrap_or_default();
    Ok(Standin { files, items_per_tier, train_tiers, validation_tiers })
}

/// The file names of every item and tag, by the text the world knows them by.
fn original_names(files: &[SourceFile]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for f in files {
        if let RecipeFile::Crafting(r) = recipes::parse(&f.text) {
            out.insert(item_text(&r.result), r.result.clone());
            for (ing, _) in &r.ingredients {
                match ing {
                    Ingredient::Item(i) => out.insert(item_text(i), i.clone()),
                    Ingredient::Tag(t) => out.insert(tag_text(t), t.clone()),
                };
            }
        }
    }
    out
}

/// Craftable items for training targets and for validation targets: `holdout` of every tier
/// (at least one where a tier has two or more) goes to validation.
fn split(world: &World, craftable: &[ItemId], cfg: &StandinConfig) -> (Vec<ItemId>, Vec<ItemId>) {
    let mut rng = Rng::derive(cfg.seed, "standin/holdout");
    let mut by_tier: BTreeMap<u32, Vec<ItemId>> = BTreeMap::new();
    for &i in craftable {
        by_tier.entry(world.item(i).tier).or_default().push(i);
    }
    let (mut train, mut val) = (Vec::new(), Vec::new());
    for (_, mut items) in by_tier {
        rng.shuffle(&mut items);
        let held = ((items.len() as f64 * cfg.holdout).round() as usize).max(usize::from(items.len() >= 2)).min(items.len());
        val.extend_from_slice(&items[..held]);
        train.extend_from_slice(&items[held..]);
    }
    train.sort();
    val.sort();
    (train, val)
}

/// One craft of a gold trajectory: `crafts` of `item`'s recipe, taking `ingredients`.
struct Step {
    item: ItemId,
    crafts: u64,
    made: u64,
    ingredients: Vec<(ItemId, u64)>,
}

struct NewTask {
    targets: Vec<(ItemId, u64)>,
    inventory: Vec<(ItemId, u64)>,
    gold: Vec<Step>,
}

/// Targets drawn a tier first (so deep items are not drowned by the many shallow ones), then an
/// item of that tier; the base items they need, found by crafting down from the deepest item.
fn make_task(world: &World, pool: &[ItemId], bases: &[ItemId], rng: &mut Rng) -> NewTask {
    let mut tiers: Vec<u32> = pool.iter().map(|&i| world.item(i).tier).collect();
    tiers.dedup();
    let n_targets = match rng.f64() {
        x if x < 0.6 => 1,
        x if x < 0.9 => 2,
        _ => 3,
    };
    let mut targets: Vec<(ItemId, u64)> = Vec::new();
    while targets.len() < n_targets {
        let tier = tiers[rng.below(tiers.len())];
        let of_tier: Vec<ItemId> = pool.iter().copied().filter(|&i| world.item(i).tier == tier).collect();
        let item = of_tier[rng.below(of_tier.len())];
        if targets.iter().any(|(t, _)| *t == item) {
            continue;
        }
        let per_craft = world.item(item).recipes.iter().map(|r| r.result_count as u64).min().unwrap_or(1);
        targets.push((item, per_craft * if rng.chance(0.3) { 2 } else { 1 }));
    }
    let mut need: BTreeMap<ItemId, u64> = targets.iter().copied().collect();
    let mut gold = Vec::new();
    // Deepest first: every need of an item is known before it is crafted (ingredients are
    // always of a lower tier).
    while let Some((&item, &units)) =
        need.iter().filter(|(i, u)| **u > 0 && world.item(**i).tier > 0).max_by_key(|(i, _)| (world.item(**i).tier, **i))
    {
        need.insert(item, 0);
        let step = craft_step(world, item, units, rng);
        for &(j, u) in &step.ingredients {
            *need.entry(j).or_default() += u;
        }
        gold.push(step);
    }
    gold.reverse();
    let mut inventory: Vec<(ItemId, u64)> = need.into_iter().filter(|(i, u)| *u > 0 && world.item(*i).tier == 0).collect();
    for _ in 0..rng.range(1, 2) {
        let d = bases[rng.below(bases.len())];
        if !inventory.iter().any(|(i, _)| *i == d) {
            inventory.push((d, rng.range(1, 3)));
        }
    }
    inventory.sort();
    NewTask { targets, inventory, gold }
}

/// Craft `units` of `item` with one of its recipes whose ingredients are all of a lower tier; a
/// tag is paid with one of its lower-tier items not otherwise used by the craft.
fn craft_step(world: &World, item: ItemId, units: u64, rng: &mut Rng) -> Step {
    let tier = world.item(item).tier;
    let lower = |j: ItemId| -> Vec<ItemId> {
        let it = world.item(j);
        if it.is_tag() {
            it.members.iter().copied().filter(|&m| world.item(m).tier < tier).collect()
        } else {
            (it.tier < tier).then_some(j).into_iter().collect()
        }
    };
    let usable: Vec<_> = world.item(item).recipes.iter().filter(|r| r.ingredients.iter().all(|(j, _)| !lower(*j).is_empty())).collect();
    let recipe = usable[rng.below(usable.len())];
    let per_craft = recipe.result_count as u64;
    let crafts = units.div_ceil(per_craft);
    let concrete: Vec<ItemId> = recipe.ingredients.iter().map(|(j, _)| *j).filter(|&j| !world.item(j).is_tag()).collect();
    let mut ingredients: Vec<(ItemId, u64)> = Vec::new();
    for &(j, amount) in &recipe.ingredients {
        let is_tag = world.item(j).is_tag();
        let free = |m: &ItemId| !is_tag || (!concrete.contains(m) && !ingredients.iter().any(|(i, _)| i == m));
        let options: Vec<ItemId> = lower(j).into_iter().filter(free).collect();
        let pick = if options.is_empty() { lower(j)[0] } else { options[rng.below(options.len())] };
        ingredients.push((pick, crafts * amount as u64));
    }
    Step { item, crafts, made: crafts * per_craft, ingredients }
}

impl NewTask {
    /// The task as a line of the authors' JSONL.
    fn line(&self, world: &World, names: &HashMap<String, String>, id: &str, max_steps: u32) -> String {
        let name = |i: ItemId| names.get(&world.item(i).name).cloned().unwrap_or_else(|| world.item(i).name.replace(' ', "_"));
        let counts =
            |pairs: &[(ItemId, u64)]| -> Value { Value::Object(pairs.iter().map(|&(i, u)| (name(i), json!(u))).collect::<Map<_, _>>()) };
        let goal: Vec<String> = self.targets.iter().map(|&(i, u)| format!("{u}x {}", name(i))).collect();
        let gold: Vec<Value> = self
            .gold
            .iter()
            .map(|s| json!({"action": "craft", "target": [name(s.item), s.crafts], "ingredients": counts(&s.ingredients), "result_count": s.made}))
            .collect();
        let line = json!({
            "goal": format!("Craft the following items: {}", goal.join(", ")),
            "id": id,
            "max_steps": max_steps,
            "misc": {"target_items": counts(&self.targets), "initial_inventory": counts(&self.inventory), "gold_trajectory": gold},
        });
        line.to_string()
    }
}

/// Load the task file as the original code reads it and require every task to load with gold
/// that reaches its targets.
fn check_gold(recipe_files: &[SourceFile], file: &str, text: &str) -> Result<(), StandinError> {
    let loaded = original::load(recipe_files, &SourceFile { name: file.into(), text: text.into() }, file)?;
    let r = &loaded.report;
    if let Some(p) = r.problems.first().or(r.gold.failures.first()) {
        return Err(StandinError::Gold { id: file.into(), why: p.to_string() });
    }
    if r.gold.reaching_success != r.task_lines {
        return Err(StandinError::Gold {
            id: file.into(),
            why: format!("{} of {} tasks reach their targets", r.gold.reaching_success, r.task_lines),
        });
    }
    Ok(())
}
