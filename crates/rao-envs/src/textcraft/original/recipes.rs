//! One Minecraft recipe file, read as the original TextCraft code reads it: only
//! `minecraft:crafting_shaped` and `minecraft:crafting_shapeless` recipes; the result is
//! `result.item` (or a plain string, or the first of a list) with `result.count` (default 1);
//! names lose their namespace (`minecraft:string` → `string`); an ingredient is an `item` or a
//! `tag`, and one given as a list of alternatives is dropped (the original's membership tests
//! find neither key in a list); pattern symbols without a `key` entry are ignored.

use serde_json::Value;

/// `minecraft:oak_planks` → `oak_planks` (the part after the first `:`, as the original does).
pub fn item_name(id: &str) -> &str {
    match id.split_once(':') {
        Some((_, rest)) => rest.split(':').next().unwrap_or(rest),
        None => id,
    }
}

/// An ingredient of a loaded recipe.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ingredient {
    Item(String),
    Tag(String),
}

/// A crafting recipe as the original keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct RawRecipe {
    pub result: String,
    pub count: u32,
    /// Units per craft, in the order first named (the original's dict).
    pub ingredients: Vec<(Ingredient, u32)>,
    pub kind: &'static str,
    /// Ingredients the original drops: lists of alternatives, objects naming neither `item` nor `tag`.
    pub dropped_ingredients: usize,
}

/// What one recipe file is.
#[derive(Debug, Clone, PartialEq)]
pub enum RecipeFile {
    Crafting(RawRecipe),
    /// Not a crafting recipe (smelting, stonecutting, special recipes, …): skipped by type.
    OtherType(String),
    /// Skipped because it cannot be read the way the original reads it (it skips these silently).
    Malformed(Malformed),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Malformed {
    /// Not JSON: where and why.
    Json { line: usize, column: usize, message: String },
    /// JSON, but not what the original can read: why.
    Shape(String),
}

pub const SHAPED: &str = "minecraft:crafting_shaped";
pub const SHAPELESS: &str = "minecraft:crafting_shapeless";

pub fn parse(text: &str) -> RecipeFile {
    let v: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return RecipeFile::Malformed(Malformed::Json { line: e.line(), column: e.column(), message: e.to_string() }),
    };
    let Some(obj) = v.as_object() else { return shape("the file is not a JSON object") };
    let kind = match obj.get("type").and_then(Value::as_str) {
        Some(SHAPED) => SHAPED,
        Some(SHAPELESS) => SHAPELESS,
        Some(other) => return RecipeFile::OtherType(other.to_string()),
        None => return RecipeFile::OtherType("(no `type`)".into()),
    };
    let (result, count) = match result_of(obj.get("result")) {
        Ok(r) => r,
        Err(why) => return shape(&why),
    };
    let mut ingredients: Vec<(Ingredient, u32)> = Vec::new();
    let mut dropped_ingredients = 0;
    let mut add = |ing: &Value| -> Result<(), String> {
        match ingredient(ing)? {
            Some(i) => match ingredients.iter_mut().find(|(j, _)| *j == i) {
                Some(slot) => slot.1 += 1,
                None => ingredients.push((i, 1)),
            },
            None => dropped_ingredients += 1,
        }
        Ok(())
    };
    if kind == SHAPELESS {
        let list = match obj.get("ingredients") {
            None => &Vec::new(),
            Some(Value::Array(a)) => a,
            Some(_) => return shape("`ingredients` is not a list"),
        };
        for ing in list {
            if let Err(why) = add(ing) {
                return shape(&why);
            }
        }
    } else {
        let empty = serde_json::Map::new();
        let key = match obj.get("key") {
            None => &empty,
            Some(Value::Object(k)) => k,
            Some(_) => return shape("`key` is not an object"),
        };
        let rows = match obj.get("pattern") {
            None => &Vec::new(),
            Some(Value::Array(a)) => a,
            Some(_) => return shape("`pattern` is not a list"),
        };
        for row in rows {
            let Some(row) = row.as_str() else { return shape("a `pattern` row is not a string") };
            for ch in row.chars().filter(|c| *c != ' ') {
                if let Some(ing) = key.get(ch.to_string().as_str())
                    && let Err(why) = add(ing)
                {
                    return shape(&why);
                }
            }
        }
    }
    RecipeFile::Crafting(RawRecipe { result, count, ingredients, kind, dropped_ingredients })
}

fn shape(why: &str) -> RecipeFile {
    RecipeFile::Malformed(Malformed::Shape(why.to_string()))
}

/// `result`: a string, `{"item", "count"?}`, or a list whose first element is one of those.
fn result_of(result: Option<&Value>) -> Result<(String, u32), String> {
    let result = match result {
        Some(Value::Array(a)) => a.first().ok_or("`result` is an empty list")?,
        Some(r) => r,
        None => return Err("a crafting recipe without `result`".into()),
    };
    let (name, count) = match result {
        Value::String(s) => (s.as_str(), 1),
        Value::Object(o) => {
            let Some(item) = o.get("item") else {
                let hint =
                    if o.contains_key("id") { " (it names `id`, the newer Minecraft format; the original reads `item`)" } else { "" };
                return Err(format!("`result` has no `item`{hint}"));
            };
            let item = item.as_str().ok_or("`result.item` is not a string")?;
            let count = match o.get("count") {
                None => 1,
                Some(c) => {
                    c.as_u64().filter(|c| (1..=u32::MAX as u64).contains(c)).ok_or("`result.count` is not a positive integer")? as u32
                }
            };
            (item, count)
        }
        _ => return Err("`result` is neither a string nor an object".into()),
    };
    let name = item_name(name);
    if name.trim().is_empty() {
        return Err("`result` names no item".into());
    }
    Ok((name.to_string(), count))
}

/// An `item` (first) or a `tag`; `None` for what the original drops (lists of alternatives,
/// objects with neither key).
fn ingredient(ing: &Value) -> Result<Option<Ingredient>, String> {
    let Some(o) = ing.as_object() else { return Ok(None) };
    let name = |key: &str| -> Result<Option<String>, String> {
        match o.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if !item_name(s).trim().is_empty() => Ok(Some(item_name(s).to_string())),
            Some(_) => Err(format!("an ingredient's `{key}` is not an item name")),
        }
    };
    if let Some(item) = name("item")? {
        return Ok(Some(Ingredient::Item(item)));
    }
    Ok(name("tag")?.map(Ingredient::Tag))
}
