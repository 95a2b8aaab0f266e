//! The original TextCraft files as a world and tasks, read as the RAO authors' environment
//! reads them (its `recipe_loader.py` and `env.py`): a directory of Minecraft recipe JSON files
//! and a JSONL task file with gold trajectories. What the original does is followed; where rao
//! differs, the README says so. Pure: the caller reads the files and names them for messages.

pub mod recipes;
pub mod report;
pub mod tags;
pub mod task_lines;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use self::recipes::{Ingredient, Malformed, RawRecipe, RecipeFile};
pub use self::report::{GoldSummary, LoadReport, Problem};
use self::task_lines::{GoldStep, TaskLine};
use super::craft::{self, CraftError, match_recipe};
use super::episode::{Action, Lang};
use super::plan::{self, PlanError};
use super::tasks::Task;
use super::world::{Bands, Item, ItemId, LANGUAGE, MAX_DEPTH_TOKEN, Recipe, Rules, World};
use crate::vocab::Vocab;

/// A file as read: the name a user knows it by (dataset URL and path) and its text.
#[derive(Debug, Clone)]
pub struct SourceFile {
    pub name: String,
    pub text: String,
}

/// Words the original's action language adds: the exact craft's `from`, `or` between recipes in
/// `info`, the `tag` of tag names, `recipe` in `err recipe`.
pub const ORIGINAL_WORDS: &[&str] = &["from", "or", "tag", "recipe"];

/// Words an item name may not use as they are (they would read as actions); they get a `'`.
const RESERVED: &[&str] = &["info", "craft", "inv", "finish", "spawn", "from", ","];

/// `oak_planks` → `oak planks` (the words are the tokens).
pub fn item_text(name: &str) -> String {
    name.split(['_', '/', ' ', '\t'])
        .filter(|s| !s.is_empty())
        .map(|w| if RESERVED.contains(&w) { format!("{w}'") } else { w.to_string() })
        .collect::<Vec<_>>()
        .join(" ")
}

/// rao's name of a tag: `tag planks`.
pub fn tag_text(tag: &str) -> String {
    format!("tag {}", item_text(tag))
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    NoRecipes(String),
    #[error("items `{a}` and `{b}` both read as `{text}`; rename one of them")]
    NameClash { a: String, b: String, text: String },
}

/// The world, the tasks that could be loaded, and what happened to everything else.
#[derive(Debug)]
pub struct Loaded {
    pub world: World,
    pub tasks: Vec<Task>,
    pub report: LoadReport,
}

/// Read recipe files (any order; taken by name) and one task file. `group` is the report group
/// of every task (e.g. the task file's name). Bad recipe files and bad task lines are skipped and
/// reported, not fatal: only a directory without any crafting recipe is.
pub fn load(recipe_files: &[SourceFile], task_file: &SourceFile, group: &str) -> Result<Loaded, LoadError> {
    let mut report = LoadReport { recipe_files: recipe_files.len(), ..Default::default() };
    let raws = read_recipes(recipe_files, &mut report);
    if raws.is_empty() {
        return Err(LoadError::NoRecipes(no_recipes_message(recipe_files, &report)));
    }
    let lines: Vec<(usize, Result<TaskLine, task_lines::LineError>)> =
        task_file.text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).map(|(k, l)| (k + 1, task_lines::parse(l))).collect();
    let world = build_world(&raws, &lines, &mut report)?;
    let tasks = build_tasks(&world, task_file, lines, group, &mut report);
    Ok(Loaded { world, tasks, report })
}

fn read_recipes<'a>(files: &'a [SourceFile], report: &mut LoadReport) -> Vec<(&'a str, RawRecipe)> {
    let mut sorted: Vec<&SourceFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut raws = Vec::new();
    for f in sorted {
        match recipes::parse(&f.text) {
            RecipeFile::Crafting(r) => {
                *report.crafting_recipes.entry(r.kind.to_string()).or_default() += 1;
                if r.dropped_ingredients > 0 {
                    report.dropped_ingredients.push(f.name.clone());
                }
                if r.ingredients.is_empty() {
                    report.free_recipes.push(f.name.clone());
                }
                raws.push((f.name.as_str(), r));
            }
            RecipeFile::OtherType(kind) => *report.skipped_by_type.entry(kind).or_default() += 1,
            RecipeFile::Malformed(m) => {
                report.malformed_recipes += 1;
                report.problems.push(match m {
                    Malformed::Json { line, column, message } => Problem::at(&f.name, line, Some(column), format!("not JSON: {message}")),
                    Malformed::Shape(why) => Problem::file(&f.name, format!("{why}; the recipe is skipped")),
                });
            }
        }
    }
    raws
}

fn no_recipes_message(files: &[SourceFile], report: &LoadReport) -> String {
    let mut m = format!("no crafting recipe (`{}` or `{}`) among {} recipe files", recipes::SHAPED, recipes::SHAPELESS, files.len());
    if !report.skipped_by_type.is_empty() {
        let kinds: Vec<String> = report.skipped_by_type.iter().map(|(k, n)| format!("{n} {k}")).collect();
        m.push_str(&format!(" (skipped by type: {})", kinds.join(", ")));
    }
    if let Some(p) = report.problems.first() {
        m.push_str(&format!("; first unreadable one: {p}"));
    }
    m
}

/// Every item the recipes and the task file name, the tags with the items that satisfy them,
/// recipes in file-name order, tiers, and the vocabulary their names need.
fn build_world(
    raws: &[(&str, RawRecipe)],
    lines: &[(usize, Result<TaskLine, task_lines::LineError>)],
    report: &mut LoadReport,
) -> Result<World, LoadError> {
    // What the original's tag rules look at: results and concrete ingredients of recipes.
    let mut recipe_items: BTreeSet<String> = BTreeSet::new();
    let mut tag_names: BTreeSet<String> = BTreeSet::new();
    for (_, r) in raws {
        recipe_items.insert(r.result.clone());
        for (ing, _) in &r.ingredients {
            match ing {
                Ingredient::Item(i) => recipe_items.insert(i.clone()),
                Ingredient::Tag(t) => tag_names.insert(t.clone()),
            };
        }
    }
    let mut names: BTreeSet<String> = recipe_items.clone();
    for (_, line) in lines {
        if let Ok(t) = line {
            names.extend(t.targets.iter().chain(&t.inventory).map(|(n, _)| n.clone()));
            for g in &t.gold {
                names.insert(g.item.clone());
                names.extend(g.ingredients.iter().map(|(n, _)| n.clone()));
            }
        }
    }
    let names: Vec<String> = names.into_iter().collect();
    let tags: Vec<String> = tag_names.into_iter().collect();
    let id_of: HashMap<&str, ItemId> = names.iter().enumerate().map(|(i, n)| (n.as_str(), i as ItemId)).collect();
    let tag_id = |t: &str| (names.len() + tags.binary_search_by(|x| x.as_str().cmp(t)).expect("a known tag")) as ItemId;
    let mut recipes: Vec<Vec<Recipe>> = vec![Vec::new(); names.len() + tags.len()];
    for (_, r) in raws {
        let ingredients = r
            .ingredients
            .iter()
            .map(|(ing, a)| {
                let id = match ing {
                    Ingredient::Item(i) => id_of[i.as_str()],
                    Ingredient::Tag(t) => tag_id(t),
                };
                (id, *a)
            })
            .collect();
        recipes[id_of[r.result.as_str()] as usize].push(Recipe { result_count: r.count, ingredients });
    }
    let mut members: Vec<Vec<ItemId>> = vec![Vec::new(); names.len()];
    for t in &tags {
        let m: Vec<ItemId> = tags::members(t, recipe_items.iter().map(String::as_str)).iter().map(|n| id_of[n.as_str()]).collect();
        report.tags.insert(t.clone(), m.len());
        members.push(m);
    }
    let texts: Vec<String> = names.iter().map(|n| item_text(n)).chain(tags.iter().map(|t| tag_text(t))).collect();
    let originals: Vec<String> = names.iter().cloned().chain(tags.iter().map(|t| format!("tag:{t}"))).collect();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, text) in texts.iter().enumerate() {
        if text.is_empty() {
            return Err(LoadError::NameClash { a: originals[i].clone(), b: originals[i].clone(), text: String::new() });
        }
        if let Some(&j) = seen.get(text.as_str()) {
            return Err(LoadError::NameClash { a: originals[j].clone(), b: originals[i].clone(), text: text.clone() });
        }
        seen.insert(text, i);
    }
    let (tier, on_loops) = tiers(&recipes, &members);
    report.items_on_loops = on_loops.iter().map(|&i| names[i].clone()).collect();
    let mut words: Vec<String> = LANGUAGE.iter().map(|s| s.to_string()).collect();
    words.extend((0..=MAX_DEPTH_TOKEN).map(|d| format!("@{d}")));
    words.extend(ORIGINAL_WORDS.iter().map(|s| s.to_string()));
    for t in &texts {
        words.extend(t.split(' ').map(str::to_string));
    }
    let vocab = Vocab::new(words.iter().map(|s| s.as_str()));
    let items: Vec<Item> = texts
        .iter()
        .enumerate()
        .map(|(i, text)| Item {
            id: i as ItemId,
            tokens: vocab.ids(text),
            name: text.clone(),
            tier: tier[i],
            recipes: recipes[i].clone(),
            held_out: false,
            members: members[i].clone(),
        })
        .collect();
    let bands = Bands { easy: (1, 2), medium: (3, 4), hard: (5, 6), extreme: (7, u32::MAX) };
    let mut world = World::new("textcraft-original".into(), items, vocab, bands);
    world.rules = Rules::Original;
    Ok(world)
}

/// Tier of every item: 0 without a recipe; else the fewest levels of crafting that make it
/// (1 + the highest tier among a recipe's ingredients, for its best recipe; a tag counts as its
/// lowest item). Items that only crafting loops make (lapis lazuli from its block, made of lapis
/// lazuli) count as given, tier 0, like items without a recipe; they are returned too. A loop
/// never raises a tier.
fn tiers(recipes: &[Vec<Recipe>], members: &[Vec<ItemId>]) -> (Vec<u32>, Vec<usize>) {
    let n = recipes.len();
    let mut tier: Vec<Option<u32>> = (0..n).map(|i| (recipes[i].is_empty() && members[i].is_empty()).then_some(0)).collect();
    relax(recipes, members, &mut tier);
    // Unreached items on a loop of unreached items: given.
    let unreached: Vec<usize> = (0..n).filter(|&i| tier[i].is_none()).collect();
    let uses = |i: usize| -> Vec<usize> {
        let direct: Vec<usize> = recipes[i].iter().flat_map(|r| r.ingredients.iter().map(|(j, _)| *j as usize)).collect();
        direct
            .into_iter()
            .flat_map(|j| if members[j].is_empty() { vec![j] } else { members[j].iter().map(|m| *m as usize).collect() })
            .collect()
    };
    let on_loops: Vec<usize> = unreached
        .iter()
        .copied()
        .filter(|&i| {
            let (mut seen, mut stack) = (vec![false; n], uses(i));
            while let Some(j) = stack.pop() {
                if j == i {
                    return true;
                }
                if !seen[j] && tier[j].is_none() {
                    seen[j] = true;
                    stack.extend(uses(j));
                }
            }
            false
        })
        .collect();
    for &i in &on_loops {
        tier[i] = Some(0);
    }
    relax(recipes, members, &mut tier);
    (tier.into_iter().map(|t| t.unwrap_or(0)).collect(), on_loops)
}

/// Lower tiers until nothing changes (at most one round per item).
fn relax(recipes: &[Vec<Recipe>], members: &[Vec<ItemId>], tier: &mut [Option<u32>]) {
    let n = recipes.len();
    for _ in 0..=n {
        let mut changed = false;
        for i in 0..n {
            let best = if !members[i].is_empty() {
                members[i].iter().filter_map(|&m| tier[m as usize]).min()
            } else {
                recipes[i]
                    .iter()
                    .filter_map(|r| {
                        r.ingredients.iter().map(|(j, _)| tier[*j as usize]).try_fold(0u32, |hi, t| t.map(|t| hi.max(t))).map(|hi| hi + 1)
                    })
                    .min()
            };
            if best.is_some() && (tier[i].is_none() || best < tier[i]) {
                tier[i] = best;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
}

fn build_tasks(
    world: &World,
    file: &SourceFile,
    lines: Vec<(usize, Result<TaskLine, task_lines::LineError>)>,
    group: &str,
    report: &mut LoadReport,
) -> Vec<Task> {
    report.task_lines = lines.len();
    let mut ids: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut good: Vec<(usize, TaskLine)> = Vec::new();
    for (line, parsed) in lines {
        match parsed {
            Ok(t) => {
                let id = t.id.clone().unwrap_or_else(|| format!("{group}:{line}"));
                ids.entry(id).or_default().push(line);
                good.push((line, t));
            }
            Err(e) => report.problems.push(Problem::at(&file.name, line, e.column, e.message)),
        }
    }
    report.duplicate_ids = ids.iter().filter(|(_, at)| at.len() > 1).map(|(id, at)| (id.clone(), at.clone())).collect();
    let item = |name: &str| world.by_name(&item_text(name)).expect("every name of the task file is an item of the world");
    let mut tasks = Vec::new();
    for (line, t) in good {
        let mut id = t.id.clone().unwrap_or_else(|| format!("{group}:{line}"));
        if report.duplicate_ids.contains_key(&id) {
            id = format!("{id}@{line}");
        }
        let targets: Vec<(ItemId, u32)> = t.targets.iter().map(|(n, u)| (item(n), *u as u32)).collect();
        let mut inventory: Vec<(ItemId, u32)> = t.inventory.iter().filter(|(_, u)| *u > 0).map(|(n, u)| (item(n), *u as u32)).collect();
        inventory.sort();
        let task = Task { id, band: None, targets, inventory, validation: false, gold: Vec::new(), group: Some(group.to_string()) };
        let inv = task.inventory_map();
        if let Err(e) = plan::plan(world, &inv, &task.target_units()) {
            report.problems.push(Problem::at(
                &file.name,
                line,
                None,
                format!("task `{}` cannot be done: {}", task.id, why_unsolvable(world, &task, e)),
            ));
            continue;
        }
        let gold = gold_actions(world, &t.gold);
        let task = Task { gold: gold.iter().map(|a| world.vocab.text(&Lang::new(world).encode(a))).collect(), ..task };
        if !t.gold.is_empty() {
            report.gold.with_gold += 1;
            match replay_gold(world, &task, &gold) {
                Ok(()) => report.gold.reaching_success += 1,
                Err(why) => report.gold.failures.push(Problem::at(&file.name, line, None, format!("gold of task `{}` {why}", task.id))),
            }
        }
        tasks.push(task);
    }
    report.tasks_loaded = tasks.len();
    report.tasks_skipped = report.task_lines - tasks.len();
    // The task file's problems in line order (recipe files' come first).
    let first = report.problems.iter().position(|p| p.file == file.name).unwrap_or(report.problems.len());
    report.problems[first..].sort_by_key(|p| p.line);
    tasks
}

/// What a task lacks, in words: the base items missing (following the first plan that
/// borrowing them allows), or why no plan exists.
fn why_unsolvable(world: &World, task: &Task, e: PlanError) -> String {
    if e == PlanError::Budget {
        return format!("no crafting plan found within {} search steps", plan::SEARCH_BUDGET);
    }
    let name = |i: ItemId| world.item(i).name.clone();
    match plan::shortfall(world, &task.inventory_map(), &task.target_units()) {
        Some(missing) if !missing.is_empty() => {
            let list: Vec<String> = missing.iter().map(|(i, n)| format!("{n} {}", name(*i))).collect();
            format!("the inventory lacks {} (no recipe makes them)", list.join(", "))
        }
        _ => {
            let unmakeable: Vec<String> = task.targets.iter().filter(|(i, _)| world.item(*i).is_base()).map(|(i, _)| name(*i)).collect();
            if unmakeable.is_empty() {
                "every way to make its targets needs an item no recipe and no inventory provides (an empty tag, or a crafting loop)".into()
            } else {
                format!("no recipe makes {} and the inventory does not hold enough", unmakeable.join(", "))
            }
        }
    }
}

/// Gold steps as the original's craft actions: `target` counts crafts, so the total is crafts ×
/// the yield of the first recipe the named ingredients match (or the step's `result_count`).
fn gold_actions(world: &World, steps: &[GoldStep]) -> Vec<Action> {
    let id = |n: &str| world.by_name(&item_text(n)).expect("gold names are items of the world");
    steps
        .iter()
        .map(|g| {
            let item = id(&g.item);
            let provided: Vec<(ItemId, u64)> = craft::as_dict(&g.ingredients.iter().map(|(n, u)| (id(n), *u)).collect::<Vec<_>>());
            let recipes = &world.item(item).recipes;
            let total = recipes
                .iter()
                .map(|r| g.crafts * r.result_count as u64)
                .find(|&total| recipes.iter().any(|r| match_recipe(world, r, total, &provided).is_some()))
                .or(g.stated_total)
                .unwrap_or(g.crafts * recipes.first().map_or(1, |r| r.result_count as u64));
            Action::CraftFrom(item, total, provided)
        })
        .collect()
}

/// Replay gold crafts with the original's rule from the task's inventory; every target must be
/// held at the end.
fn replay_gold(world: &World, task: &Task, gold: &[Action]) -> Result<(), String> {
    let mut inv = task.inventory_map();
    let name = |i: ItemId| world.item(i).name.clone();
    for (k, a) in gold.iter().enumerate() {
        let Action::CraftFrom(item, total, provided) = a else { continue };
        if let Err(e) = craft::exact(world, &mut inv, *item, *total, provided) {
            let why = match e {
                CraftError::NoRecipe => format!("no recipe makes {}", name(*item)),
                CraftError::NoMatch => format!("its ingredients match no recipe of {} for {total} units", name(*item)),
                CraftError::Need(i, n) => format!("the inventory lacks {n} {}", name(i)),
            };
            return Err(format!("fails at step {} (`{}`): {why}", k + 1, world.vocab.text(&Lang::new(world).encode(a))));
        }
    }
    for &(i, n) in &task.targets {
        let held = inv.get(&i).copied().unwrap_or(0);
        if held < n as u64 {
            return Err(format!("ends holding {held} of the {n} {} asked for", name(i)));
        }
    }
    Ok(())
}
