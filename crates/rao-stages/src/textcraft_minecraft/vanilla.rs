//! Minecraft's crafting recipes as vanilla recipe files, from the public `minecraft-data`
//! package (its `recipes.json` and `items.json` for one game version). That package lists every
//! variant of a recipe that takes a tag (a stick from each kind of planks) as a recipe of its
//! own; the vanilla files name the tag once. The variants are folded back: recipes of one result
//! that differ only in one ingredient slot become one file naming a tag, where the original
//! TextCraft's tag rules (`rao_envs::textcraft::original::tags::members`) give a non-empty subset of the variants'
//! items; otherwise each variant stays a file of its own (an alternative recipe).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{Value, json};

use rao_envs::textcraft::original::tags;

/// The package's two files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackageFile {
    Recipes,
    Items,
}

impl std::fmt::Display for PackageFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PackageFile::Recipes => "recipes.json",
            PackageFile::Items => "items.json",
        })
    }
}

/// What cannot be read from the package's files: which file, and why.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct DataError {
    pub file: PackageFile,
    pub message: String,
}

fn bad(file: PackageFile, message: impl Into<String>) -> DataError {
    DataError { file, message: message.into() }
}

/// One ingredient slot: an item, or (after folding) a tag.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Slot {
    Item(String),
    Tag(String),
}

/// A recipe as the package gives it, names resolved.
#[derive(Debug, Clone, PartialEq)]
struct Variant {
    result: String,
    count: u32,
    /// Shaped: rows of cells (`None`: empty). Shapeless: one row of ingredients.
    cells: Vec<Vec<Option<Slot>>>,
    shaped: bool,
}

/// At most this many recipe variants are read (the package has a few thousand).
const MAX_VARIANTS: usize = 100_000;

/// The vanilla recipe files (`(file name, JSON text)`, sorted by name) for the package's
/// `recipes.json` and `items.json` of one version.
pub fn recipe_files(recipes_json: &str, items_json: &str) -> Result<Vec<(String, String)>, DataError> {
    let names = item_names(items_json)?;
    let variants = variants(recipes_json, &names)?;
    let universe: BTreeSet<&str> =
        variants.iter().flat_map(|v| std::iter::once(v.result.as_str()).chain(v.cells.iter().flatten().flatten().map(slot_name))).collect();
    let mut by_result: BTreeMap<&str, Vec<&Variant>> = BTreeMap::new();
    for v in &variants {
        by_result.entry(v.result.as_str()).or_default().push(v);
    }
    // A tag the folded files make empty or wider (its items named only through it) is refused
    // for that result, and the variants folded again.
    let mut refused: BTreeSet<(String, String)> = BTreeSet::new();
    let folded = loop {
        let folded: Vec<(&str, Vec<Folded>)> = by_result.iter().map(|(r, list)| (*r, fold(list, &universe, &refused))).collect();
        let used: BTreeSet<&str> = folded
            .iter()
            .flat_map(|(_, f)| f.iter())
            .flat_map(|f| std::iter::once(f.recipe.result.as_str()).chain(f.recipe.cells.iter().flatten().flatten().filter_map(item_of)))
            .collect();
        let bad: Vec<(String, String)> = folded
            .iter()
            .flat_map(|(_, f)| f.iter())
            .flat_map(|f| f.tags.iter().map(move |(tag, items)| (f, tag, items)))
            .filter(|(_, tag, items)| {
                let members = tags::members(tag, used.iter().copied());
                members.is_empty() || !members.iter().all(|m| items.contains(m))
            })
            .map(|(f, tag, _)| (f.recipe.result.clone(), tag.clone()))
            .collect();
        if bad.is_empty() {
            break folded;
        }
        refused.extend(bad);
    };
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for (result, list) in folded {
        for (k, Folded { recipe, .. }) in list.into_iter().enumerate() {
            let stem = if k == 0 { result.to_string() } else { format!("{result}_from_{}", main_ingredient(&recipe)) };
            let mut name = format!("{stem}.json");
            let mut n = 2;
            while files.contains_key(&name) {
                name = format!("{stem}_{n}.json");
                n += 1;
            }
            files.insert(name, serde_json::to_string_pretty(&vanilla(&recipe)).expect("JSON values serialise"));
        }
    }
    Ok(files.into_iter().collect())
}

fn item_of(s: &Slot) -> Option<&str> {
    match s {
        Slot::Item(n) => Some(n),
        Slot::Tag(_) => None,
    }
}

fn slot_name(s: &Slot) -> &str {
    match s {
        Slot::Item(n) | Slot::Tag(n) => n,
    }
}

/// `items.json`: `[{"id": 1, "name": "stone", …}, …]` → id → name.
fn item_names(text: &str) -> Result<HashMap<u64, String>, DataError> {
    const FILE: PackageFile = PackageFile::Items;
    let v: Value = serde_json::from_str(text).map_err(|e| bad(FILE, format!("not JSON: {e}")))?;
    let list = v.as_array().ok_or_else(|| bad(FILE, "not a list of items"))?;
    let mut out = HashMap::with_capacity(list.len());
    for (k, it) in list.iter().enumerate() {
        let id = it.get("id").and_then(Value::as_u64);
        let name = it.get("name").and_then(Value::as_str).filter(|n| is_item_name(n));
        let (Some(id), Some(name)) = (id, name) else {
            return Err(bad(FILE, format!("item {} has no numeric `id` and lower-case `name`", k + 1)));
        };
        out.insert(id, name.to_string());
    }
    Ok(out)
}

/// Lower-case letters, digits and `_`: what vanilla ids use (and what a file name may carry).
fn is_item_name(n: &str) -> bool {
    !n.is_empty() && n.len() <= 64 && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// `recipes.json`: `{"<result id>": [{"inShape": [[id|null, …], …] | "ingredients": [id, …],
/// "result": {"id", "count"}}, …]}`.
fn variants(text: &str, names: &HashMap<u64, String>) -> Result<Vec<Variant>, DataError> {
    const FILE: PackageFile = PackageFile::Recipes;
    let v: Value = serde_json::from_str(text).map_err(|e| bad(FILE, format!("not JSON: {e}")))?;
    let map = v.as_object().ok_or_else(|| bad(FILE, "not an object of result ids"))?;
    let name = |id: &Value, at: &str| -> Result<String, DataError> {
        let n = id.as_u64().ok_or_else(|| bad(FILE, format!("{at}: an ingredient is not an item id: {id}")))?;
        names.get(&n).cloned().ok_or_else(|| bad(FILE, format!("{at}: item id {n} is not in items.json")))
    };
    let mut out = Vec::new();
    for (key, list) in map {
        let list = list.as_array().ok_or_else(|| bad(FILE, format!("`{key}`: not a list of recipes")))?;
        for (k, r) in list.iter().enumerate() {
            let at = format!("`{key}` recipe {}", k + 1);
            let result = r.get("result").ok_or_else(|| bad(FILE, format!("{at}: no `result`")))?;
            let count = result.get("count").and_then(Value::as_u64).filter(|c| (1..=64).contains(c)).unwrap_or(1) as u32;
            let result = name(result.get("id").unwrap_or(&Value::Null), &at)?;
            let cell =
                |c: &Value| -> Result<Option<Slot>, DataError> { if c.is_null() { Ok(None) } else { Ok(Some(Slot::Item(name(c, &at)?))) } };
            let (shaped, cells) = match (r.get("inShape"), r.get("ingredients")) {
                (Some(Value::Array(rows)), _) => {
                    let mut grid = Vec::with_capacity(rows.len());
                    for row in rows {
                        let row = row.as_array().ok_or_else(|| bad(FILE, format!("{at}: an `inShape` row is not a list")))?;
                        grid.push(row.iter().map(cell).collect::<Result<Vec<_>, _>>()?);
                    }
                    (true, grid)
                }
                (_, Some(Value::Array(ings))) => (false, vec![ings.iter().map(cell).collect::<Result<Vec<_>, _>>()?]),
                _ => return Err(bad(FILE, format!("{at}: neither `inShape` nor `ingredients`"))),
            };
            let cells_n: usize = cells.iter().map(Vec::len).sum();
            if cells_n == 0 || cells_n > 9 || cells.iter().flatten().all(Option::is_none) {
                return Err(bad(FILE, format!("{at}: {cells_n} cells; a crafting grid has 1 to 9 and at least one ingredient")));
            }
            out.push(Variant { result, count, cells, shaped });
            if out.len() > MAX_VARIANTS {
                return Err(bad(FILE, format!("more than {MAX_VARIANTS} recipes")));
            }
        }
    }
    Ok(out)
}

/// The variants of one result as vanilla recipes: a family of variants that differ only where
/// one item is swapped for another becomes one recipe with a tag, when the original's tag rules
/// name a subset of the swapped items; every other variant stays as it is. First-seen order.
/// A vanilla recipe, and for one that names tags: each tag and the items of the variants it folds.
struct Folded {
    recipe: Variant,
    tags: Vec<(String, BTreeSet<String>)>,
}

/// The variants of one result as vanilla recipes: a family of variants that differ from the
/// first only by swapping some of its ingredients for others (every cell of a swapped ingredient
/// swapped alike: any planks with any wooden slab in a barrel) becomes one recipe naming a tag for
/// each swapped ingredient, when the original's tag rules name a subset of its items for each;
/// every other variant stays as it is. First-seen order.
fn fold(list: &[&Variant], universe: &BTreeSet<&str>, refused: &BTreeSet<(String, String)>) -> Vec<Folded> {
    let mut left: Vec<&Variant> = list.to_vec();
    let mut out = Vec::new();
    while let Some(seed) = left.first().copied() {
        let others: Vec<(&Variant, BTreeMap<String, String>)> = left[1..].iter().filter_map(|o| Some((*o, swaps(seed, o)?))).collect();
        let tag_of = |items: &BTreeSet<String>| -> Option<String> {
            let names: BTreeSet<&str> = items.iter().map(String::as_str).collect();
            tag_for(&names, universe).filter(|t| !refused.contains(&(seed.result.clone(), t.clone())))
        };
        // The swapped ingredients a tag can stand for; variants that swap any other stay apart.
        let foldable: BTreeSet<String> =
            classes(others.iter().map(|(_, s)| s)).into_iter().filter(|(_, items)| tag_of(items).is_some()).map(|(f, _)| f).collect();
        let family: Vec<&(&Variant, BTreeMap<String, String>)> =
            others.iter().filter(|(_, s)| s.keys().all(|k| foldable.contains(k))).collect();
        let tags: Option<Vec<(String, String, BTreeSet<String>)>> =
            classes(family.iter().map(|(_, s)| s)).into_iter().map(|(from, items)| Some((from, tag_of(&items)?, items))).collect();
        let family: Vec<&Variant> = std::iter::once(seed).chain(family.iter().map(|(v, _)| *v)).collect();
        match tags.filter(|t| !t.is_empty()) {
            Some(tags) => {
                let mut v = seed.clone();
                for cell in v.cells.iter_mut().flatten() {
                    if let Some((_, tag, _)) = tags.iter().find(|(from, _, _)| cell.as_ref().and_then(item_of) == Some(from.as_str())) {
                        *cell = Some(Slot::Tag(tag.clone()));
                    }
                }
                out.push(Folded { recipe: v, tags: tags.into_iter().map(|(_, t, items)| (t, items)).collect() });
                left.retain(|l| !family.iter().any(|f| std::ptr::eq(*f, *l)));
            }
            None => {
                out.push(Folded { recipe: seed.clone(), tags: Vec::new() });
                left.remove(0);
            }
        }
    }
    out
}

/// For each swapped ingredient, the items that take its place (itself included).
fn classes<'a>(swaps: impl Iterator<Item = &'a BTreeMap<String, String>>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in swaps {
        for (from, to) in s {
            out.entry(from.clone()).or_insert_with(|| BTreeSet::from([from.clone()])).insert(to.clone());
        }
    }
    out
}

/// `other` is `seed` with some ingredients swapped for others, every cell of a swapped
/// ingredient alike and nothing else changed: the swaps (seed's item → other's item).
fn swaps(seed: &Variant, other: &Variant) -> Option<BTreeMap<String, String>> {
    if seed.shaped != other.shaped || seed.count != other.count || seed.cells.len() != other.cells.len() {
        return None;
    }
    let mut map: BTreeMap<&str, &str> = BTreeMap::new();
    for (a, b) in seed.cells.iter().zip(&other.cells) {
        if a.len() != b.len() {
            return None;
        }
        for (x, y) in a.iter().zip(b) {
            match (x.as_ref().and_then(item_of), y.as_ref().and_then(item_of)) {
                (None, None) => {}
                (Some(x), Some(y)) => {
                    if *map.entry(x).or_insert(y) != y {
                        return None;
                    }
                }
                _ => return None,
            }
        }
    }
    let swapped: BTreeMap<String, String> = map.into_iter().filter(|(x, y)| x != y).map(|(x, y)| (x.to_string(), y.to_string())).collect();
    // Two seed items swapped for the same item would merge two slots: not a tag per slot.
    let targets: BTreeSet<&String> = swapped.values().collect();
    (!swapped.is_empty() && targets.len() == swapped.len()).then_some(swapped)
}

/// Tag names vanilla uses for ingredient slots, in the order they are tried.
const TAGS: &[&str] =
    &["planks", "logs", "wool", "coals", "wooden_slabs", "stone_tool_materials", "stone_crafting_materials", "soul_fire_base_blocks"];

/// The tag whose members under the original's rules are a non-empty subset of `items`, the
/// largest such; per-wood log tags (`oak_logs`, `crimson_stems`) are tried too.
fn tag_for(items: &BTreeSet<&str>, universe: &BTreeSet<&str>) -> Option<String> {
    let woods: BTreeSet<String> = items
        .iter()
        .filter_map(|i| {
            let i = i.trim_start_matches("stripped_");
            ["_log", "_wood", "_stem", "_hyphae"].iter().find_map(|s| i.strip_suffix(s)).map(str::to_string)
        })
        .collect();
    let candidates = TAGS.iter().map(|t| t.to_string()).chain(woods.iter().flat_map(|w| [format!("{w}_logs"), format!("{w}_stems")]));
    let mut best: Option<(usize, String)> = None;
    for tag in candidates {
        let members = tags::members(&tag, universe.iter().copied());
        if !members.is_empty()
            && members.iter().all(|m| items.contains(m.as_str()))
            && best.as_ref().is_none_or(|(n, _)| members.len() > *n)
        {
            best = Some((members.len(), tag));
        }
    }
    best.map(|(_, t)| t)
}

/// The ingredient a recipe uses most (named in an alternative's file name).
fn main_ingredient(v: &Variant) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for s in v.cells.iter().flatten().flatten() {
        *counts.entry(slot_name(s)).or_default() += 1;
    }
    counts.into_iter().max_by_key(|(n, c)| (*c, std::cmp::Reverse(*n))).map(|(n, _)| n.to_string()).unwrap_or_default()
}

fn ingredient_json(s: &Slot) -> Value {
    match s {
        Slot::Item(n) => json!({ "item": format!("minecraft:{n}") }),
        Slot::Tag(t) => json!({ "tag": format!("minecraft:{t}") }),
    }
}

/// The vanilla JSON of a recipe (the layout the original TextCraft reads).
fn vanilla(v: &Variant) -> Value {
    let result = json!({ "item": format!("minecraft:{}", v.result), "count": v.count });
    if !v.shaped {
        let ingredients: Vec<Value> = v.cells.iter().flatten().flatten().map(ingredient_json).collect();
        return json!({ "type": "minecraft:crafting_shapeless", "ingredients": ingredients, "result": result });
    }
    const SYMBOLS: &[u8] = b"#XYZABCDE";
    let mut key: Vec<&Slot> = Vec::new();
    let width = v.cells.iter().map(Vec::len).max().unwrap_or(0);
    let pattern: Vec<String> = v
        .cells
        .iter()
        .map(|row| {
            (0..width)
                .map(|c| match row.get(c).and_then(Option::as_ref) {
                    None => ' ',
                    Some(s) => {
                        let k = key.iter().position(|x| *x == s).unwrap_or_else(|| {
                            key.push(s);
                            key.len() - 1
                        });
                        SYMBOLS[k] as char
                    }
                })
                .collect()
        })
        .collect();
    let key: serde_json::Map<String, Value> =
        key.iter().enumerate().map(|(k, s)| ((SYMBOLS[k] as char).to_string(), ingredient_json(s))).collect();
    json!({ "type": "minecraft:crafting_shaped", "pattern": pattern, "key": key, "result": result })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ITEMS: &str = r#"[{"id":1,"name":"oak_planks"},{"id":2,"name":"birch_planks"},{"id":3,"name":"stick"},
        {"id":4,"name":"oak_slab"},{"id":5,"name":"birch_slab"},{"id":6,"name":"barrel"},{"id":7,"name":"oak_log"},
        {"id":8,"name":"stripped_oak_log"},{"id":9,"name":"torch"},{"id":10,"name":"coal"},{"id":11,"name":"charcoal"},
        {"id":12,"name":"birch_log"},{"id":13,"name":"oak_wood"}]"#;

    /// Planks from logs: planks are items of the world, not only names in a tag.
    const PLANKS: &str =
        r#""1": [{"ingredients": [7], "result": {"id": 1, "count": 4}}], "2": [{"ingredients": [12], "result": {"id": 2, "count": 4}}]"#;

    fn files(recipes: &str) -> BTreeMap<String, Value> {
        recipe_files(recipes, ITEMS).unwrap().into_iter().map(|(n, t)| (n, serde_json::from_str(&t).unwrap())).collect()
    }

    #[test]
    fn variants_that_swap_an_ingredient_become_one_file_naming_its_tag() {
        let f = files(
            r#"{"3": [{"inShape": [[1],[1]], "result": {"id": 3, "count": 4}}, {"inShape": [[2],[2]], "result": {"id": 3, "count": 4}}],
                "1": [{"ingredients": [7], "result": {"id": 1, "count": 4}}, {"ingredients": [8], "result": {"id": 1, "count": 4}}],
                "2": [{"ingredients": [12], "result": {"id": 2, "count": 4}}],
                "13": [{"inShape": [[7, 7], [7, 7]], "result": {"id": 13, "count": 3}}]}"#,
        );
        assert_eq!(f.keys().collect::<Vec<_>>(), ["birch_planks.json", "oak_planks.json", "oak_wood.json", "stick.json"]);
        assert_eq!(f["stick.json"]["key"]["#"], json!({"tag": "minecraft:planks"}));
        assert_eq!(f["stick.json"]["pattern"], json!(["#", "#"]));
        assert_eq!(f["stick.json"]["result"], json!({"item": "minecraft:stick", "count": 4}));
        // `oak_logs` under the original's rule is the logs named `oak_log…`: a subset of the two
        // (`logs` is not: it holds the birch log too). The oak log is an item of the world (oak
        // wood is made of it), so the tag is not empty once the planks' variants are folded.
        assert_eq!(f["oak_planks.json"]["ingredients"], json!([{"tag": "minecraft:oak_logs"}]));
        assert_eq!(f["oak_planks.json"]["type"], "minecraft:crafting_shapeless");
    }

    #[test]
    fn a_swap_no_tag_covers_stays_an_alternative_while_the_rest_folds() {
        // Barrels: any planks (tag `planks`) with any slab (the original's `wooden_slabs` rule
        // names no `*_slab` without "planks"/"wood" in it): one file per slab.
        let mut variants = Vec::new();
        for planks in [1, 2] {
            for slab in [4, 5] {
                variants.push(format!(r#"{{"inShape": [[{planks},{slab},{planks}],[{planks},null,{planks}],[{planks},{slab},{planks}]], "result": {{"id": 6, "count": 1}}}}"#));
            }
        }
        let f = files(&format!(r#"{{"6": [{}], {PLANKS}}}"#, variants.join(",")));
        assert_eq!(f.keys().collect::<Vec<_>>(), ["barrel.json", "barrel_from_planks.json", "birch_planks.json", "oak_planks.json"]);
        assert_eq!(f["barrel.json"]["pattern"], json!(["#X#", "# #", "#X#"]));
        assert_eq!(f["barrel.json"]["key"], json!({"#": {"tag": "minecraft:planks"}, "X": {"item": "minecraft:oak_slab"}}));
        assert_eq!(f["barrel_from_planks.json"]["key"]["X"], json!({"item": "minecraft:birch_slab"}));
    }

    #[test]
    fn a_tag_only_its_own_recipe_names_is_not_made() {
        // `coals` would hold coal and charcoal, but neither is made or used anywhere else: after
        // folding no item would satisfy it, so the torches stay two recipes.
        let f = files(
            r#"{"9": [{"inShape": [[10],[3]], "result": {"id": 9, "count": 4}}, {"inShape": [[11],[3]], "result": {"id": 9, "count": 4}}],
                "3": [{"inShape": [[1],[1]], "result": {"id": 3, "count": 4}}]}"#,
        );
        assert_eq!(f.keys().collect::<Vec<_>>(), ["stick.json", "torch.json", "torch_from_charcoal.json"]);
    }

    #[test]
    fn bad_package_files_are_refused_with_the_file_and_the_recipe() {
        let e = |recipes: &str, items: &str| recipe_files(recipes, items).unwrap_err().to_string();
        assert!(e("{", ITEMS).starts_with("recipes.json: not JSON"), "{}", e("{", ITEMS));
        assert_eq!(e("{}", "[{\"id\": 1}]"), "items.json: item 1 has no numeric `id` and lower-case `name`");
        assert_eq!(e("{}", "[{\"id\": 1, \"name\": \"../x\"}]"), "items.json: item 1 has no numeric `id` and lower-case `name`");
        assert_eq!(
            e(r#"{"3": [{"inShape": [[99]], "result": {"id": 3}}]}"#, ITEMS),
            "recipes.json: `3` recipe 1: item id 99 is not in items.json"
        );
        assert_eq!(e(r#"{"3": [{"result": {"id": 3}}]}"#, ITEMS), "recipes.json: `3` recipe 1: neither `inShape` nor `ingredients`");
        assert_eq!(
            e(r#"{"3": [{"ingredients": [1,1,1,1,1,1,1,1,1,1], "result": {"id": 3}}]}"#, ITEMS),
            "recipes.json: `3` recipe 1: 10 cells; a crafting grid has 1 to 9 and at least one ingredient"
        );
    }
}
