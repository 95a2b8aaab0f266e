//! The original TextCraft format as a world + task source: a directory of Minecraft recipe
//! JSON files (shaped, shapeless, tags) and a JSONL task file.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::Value;

use super::tasks::Task;
use super::world::{Bands, Item, ItemId, LANGUAGE, MAX_DEPTH_TOKEN, Recipe, World};
use crate::vocab::Vocab;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {message}")]
    Bad { path: String, message: String },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

fn bad(path: &Path, message: impl Into<String>) -> LoadError {
    LoadError::Bad { path: path.display().to_string(), message: message.into() }
}

/// `minecraft:oak_planks` → `oak planks` (the words are the tokens).
pub fn item_text(id: &str) -> String {
    id.rsplit(':').next().unwrap_or(id).split(['_', '/']).filter(|s| !s.is_empty()).collect::<Vec<_>>().join(" ")
}

struct RawRecipe {
    result: String,
    count: u32,
    ingredients: BTreeMap<String, u32>,
}

/// Load a recipe directory and a task file together: items that only appear in tasks
/// (e.g. distractors in an inventory) join the world as base items.
pub fn load(dir: &Path, tasks: &Path) -> Result<(World, Vec<Task>), LoadError> {
    let text = std::fs::read_to_string(tasks).map_err(|e| LoadError::Io { path: tasks.display().to_string(), source: e })?;
    let mut extra = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).map_err(|e| bad(tasks, e.to_string()))?;
        extra.extend(pairs(&v["misc"]["initial_inventory"]).into_iter().map(|(n, _)| n));
        extra.extend(pairs(&v["misc"]["target_items"]).into_iter().map(|(n, _)| n));
    }
    let world = load_world_with(dir, &extra)?;
    let tasks = load_tasks(&world, tasks)?;
    Ok((world, tasks))
}

/// Load every `*.json` recipe under `dir/recipes` (or `dir`), with tags from `dir/tags`.
pub fn load_world(dir: &Path) -> Result<World, LoadError> {
    load_world_with(dir, &[])
}

fn load_world_with(dir: &Path, extra_items: &[String]) -> Result<World, LoadError> {
    let recipe_dir = if dir.join("recipes").is_dir() { dir.join("recipes") } else { dir.to_path_buf() };
    let mut tags: HashMap<String, String> = HashMap::new();
    if dir.join("tags").is_dir() {
        for f in sorted_json_files(&dir.join("tags"))? {
            let v = read_json(&f)?;
            let first = v["values"]
                .as_array()
                .and_then(|a| a.first())
                .and_then(|x| x.as_str())
                .ok_or_else(|| bad(&f, "a tag file needs a non-empty `values` list"))?;
            let name = f.file_stem().unwrap().to_string_lossy().to_string();
            tags.insert(format!("minecraft:{name}"), first.to_string());
            tags.insert(name, first.to_string());
        }
    }
    let resolve = |ing: &Value, f: &Path| -> Result<String, LoadError> {
        let ing = if let Some(a) = ing.as_array() { a.first().ok_or_else(|| bad(f, "empty ingredient alternatives"))? } else { ing };
        if let Some(i) = ing["item"].as_str() {
            return Ok(i.to_string());
        }
        if let Some(t) = ing["tag"].as_str() {
            return Ok(tags.get(t).cloned().unwrap_or_else(|| t.to_string()));
        }
        Err(bad(f, format!("ingredient {ing} has neither `item` nor `tag`")))
    };
    let mut raws = Vec::new();
    for f in sorted_json_files(&recipe_dir)? {
        let v = read_json(&f)?;
        let kind = v["type"].as_str().unwrap_or("");
        let result = &v["result"];
        let (result, count) = match result {
            Value::String(s) => (s.clone(), 1),
            _ => (
                result["item"].as_str().or(result["id"].as_str()).ok_or_else(|| bad(&f, "recipe has no `result.item`"))?.to_string(),
                result["count"].as_u64().unwrap_or(1) as u32,
            ),
        };
        let mut ingredients: BTreeMap<String, u32> = BTreeMap::new();
        match kind {
            "minecraft:crafting_shaped" => {
                let pattern = v["pattern"].as_array().ok_or_else(|| bad(&f, "shaped recipe without `pattern`"))?;
                for row in pattern {
                    for ch in row.as_str().unwrap_or("").chars().filter(|c| *c != ' ') {
                        let key = &v["key"][ch.to_string()];
                        if key.is_null() {
                            return Err(bad(&f, format!("pattern symbol `{ch}` has no entry in `key`")));
                        }
                        *ingredients.entry(resolve(key, &f)?).or_default() += 1;
                    }
                }
            }
            "minecraft:crafting_shapeless" => {
                for ing in v["ingredients"].as_array().ok_or_else(|| bad(&f, "shapeless recipe without `ingredients`"))? {
                    *ingredients.entry(resolve(ing, &f)?).or_default() += 1;
                }
            }
            _ => continue, // smelting etc. are not crafting recipes
        }
        raws.push(RawRecipe { result, count, ingredients });
    }
    if raws.is_empty() {
        return Err(bad(&recipe_dir, "no crafting recipes found"));
    }
    // Every item mentioned, in a stable order.
    let mut names: Vec<String> = raws.iter().flat_map(|r| std::iter::once(r.result.clone()).chain(r.ingredients.keys().cloned())).collect();
    names.extend(extra_items.iter().cloned());
    names.sort();
    names.dedup();
    let id_of: HashMap<&str, ItemId> = names.iter().enumerate().map(|(i, n)| (n.as_str(), i as ItemId)).collect();
    let mut recipes: Vec<Vec<Recipe>> = vec![Vec::new(); names.len()];
    for r in &raws {
        let ingredients = r.ingredients.iter().map(|(n, a)| (id_of[n.as_str()], *a)).collect();
        recipes[id_of[r.result.as_str()] as usize].push(Recipe { result_count: r.count, ingredients });
    }
    // Tier = 1 + the highest tier among the first recipe's ingredients (base = 0); cycles stop at a bound.
    let mut tier = vec![0u32; names.len()];
    for _ in 0..names.len().min(64) {
        let mut changed = false;
        for (i, rs) in recipes.iter().enumerate() {
            if let Some(r) = rs.first() {
                let t = 1 + r.ingredients.iter().map(|(j, _)| tier[*j as usize]).max().unwrap_or(0);
                if t != tier[i] && t < 64 {
                    tier[i] = t;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    let mut words: Vec<String> = LANGUAGE.iter().map(|s| s.to_string()).collect();
    words.extend((0..=MAX_DEPTH_TOKEN).map(|d| format!("@{d}")));
    for n in &names {
        words.extend(item_text(n).split(' ').map(str::to_string));
    }
    let vocab = Vocab::new(words.iter().map(|s| s.as_str()));
    let items: Vec<Item> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let text = item_text(n);
            Item { id: i as ItemId, tokens: vocab.ids(&text), name: text, tier: tier[i], recipes: recipes[i].clone(), held_out: false }
        })
        .collect();
    let bands = Bands { easy: (1, 2), medium: (3, 4), hard: (5, 6), extreme: (7, 64) };
    Ok(World::new(format!("textcraft/{}", dir.display()), items, vocab, bands))
}

fn sorted_json_files(dir: &Path) -> Result<Vec<std::path::PathBuf>, LoadError> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| LoadError::Io { path: dir.display().to_string(), source: e })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    out.sort();
    Ok(out)
}

fn read_json(path: &Path) -> Result<Value, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|e| LoadError::Io { path: path.display().to_string(), source: e })?;
    serde_json::from_str(&text).map_err(|e| bad(path, e.to_string()))
}

/// Pairs from `{item: n}` or `[[item, n], ...]`.
fn pairs(v: &Value) -> Vec<(String, u64)> {
    match v {
        Value::Object(o) => o.iter().map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(1))).collect(),
        Value::Array(a) => a
            .iter()
            .filter_map(|x| match x {
                Value::Array(p) => Some((p.first()?.as_str()?.to_string(), p.get(1).and_then(|n| n.as_u64()).unwrap_or(1))),
                Value::String(s) => Some((s.clone(), 1)),
                _ => None,
            })
            .collect(),
        _ => vec![],
    }
}

/// Load a JSONL task file for `world`. Gold trajectories become action texts.
pub fn load_tasks(world: &World, path: &Path) -> Result<Vec<Task>, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|e| LoadError::Io { path: path.display().to_string(), source: e })?;
    let find =
        |name: &str, line: usize| world.by_name(&item_text(name)).ok_or_else(|| bad(path, format!("line {line}: unknown item `{name}`")));
    let mut tasks = Vec::new();
    for (ln, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).map_err(|e| bad(path, format!("line {}: {e}", ln + 1)))?;
        let misc = &v["misc"];
        let targets = pairs(&misc["target_items"]);
        let (target, count) = targets.first().cloned().ok_or_else(|| bad(path, format!("line {}: no misc.target_items", ln + 1)))?;
        let mut inventory: Vec<(ItemId, u32)> = Vec::new();
        for (name, n) in pairs(&misc["initial_inventory"]) {
            inventory.push((find(&name, ln + 1)?, n as u32));
        }
        inventory.sort();
        let mut gold = Vec::new();
        for step in misc["gold_trajectory"].as_array().into_iter().flatten() {
            if step["action"].as_str() == Some("craft") {
                let t = &step["target"];
                let (name, n) = (t[0].as_str().unwrap_or(""), t[1].as_u64().unwrap_or(1));
                let item = find(name, ln + 1)?;
                let mut s = format!("craft {}", world.item(item).name);
                if n != 1 {
                    s.push_str(&format!(" {}", n.to_string().chars().map(String::from).collect::<Vec<_>>().join(" ")));
                }
                gold.push(s);
            }
        }
        tasks.push(Task {
            id: v["id"].as_str().map(str::to_string).unwrap_or_else(|| format!("task-{ln}")),
            band: None,
            target: find(&target, ln + 1)?,
            count: count as u32,
            inventory,
            validation: false,
            gold,
        });
    }
    Ok(tasks)
}
