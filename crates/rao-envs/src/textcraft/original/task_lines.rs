//! One line of an original TextCraft task file (JSONL):
//! `{"id", "goal", "max_steps", "misc": {"target_items": {name: units}, "initial_inventory":
//! {name: units}, "gold_trajectory": [{"action": "craft", "target": [name, crafts],
//! "ingredients": {name: units}, "result_count": units}, …]}}`. Names as in recipes, with or
//! without namespace. The gold's `target` count is a number of crafts, as the original's task
//! generator writes it.

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::Value;

use super::recipes::item_name;

/// A task as written in the file, names normalised.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskLine {
    pub id: Option<String>,
    pub targets: Vec<(String, u64)>,
    pub inventory: Vec<(String, u64)>,
    pub gold: Vec<GoldStep>,
}

/// One craft of a gold trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct GoldStep {
    pub item: String,
    pub crafts: u64,
    pub ingredients: Vec<(String, u64)>,
    /// The units the step says it made, if it says.
    pub stated_total: Option<u64>,
}

/// Why a line cannot be read: where in the line (1-based column, if known) and what to fix.
#[derive(Debug, Clone, PartialEq)]
pub struct LineError {
    pub column: Option<usize>,
    pub message: String,
}

/// Most units one entry may name (larger counts are taken as a mistake, not planned for).
pub const MAX_UNITS: u64 = 1_000_000;

/// A JSON object's entries in file order, a repeated key keeping its first place and last value
/// (as Python's `json` builds the dict the original reads).
#[derive(Debug, Clone, Default)]
struct Entries(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut out: Vec<(String, Value)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    match out.iter_mut().find(|(j, _)| *j == k) {
                        Some(slot) => slot.1 = v,
                        None => out.push((k, v)),
                    }
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(serde::Deserialize)]
struct RawLine {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    misc: Option<RawMisc>,
}

#[derive(serde::Deserialize)]
struct RawMisc {
    #[serde(default)]
    target_items: Option<Counts>,
    #[serde(default)]
    initial_inventory: Option<Counts>,
    #[serde(default)]
    gold_trajectory: Option<Vec<RawStep>>,
}

#[derive(serde::Deserialize)]
struct RawStep {
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    target: Option<Value>,
    #[serde(default)]
    ingredients: Option<Entries>,
    #[serde(default)]
    result_count: Option<Value>,
}

/// `{name: units}` in file order, or `[[name, units], …]`.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Counts {
    Object(Entries),
    Pairs(Vec<(String, Value)>),
}

impl Counts {
    fn entries(self) -> Vec<(String, Value)> {
        match self {
            Counts::Object(e) => e.0,
            Counts::Pairs(p) => p,
        }
    }
}

pub fn parse(line: &str) -> Result<TaskLine, LineError> {
    let raw: RawLine =
        serde_json::from_str(line).map_err(|e| LineError { column: Some(e.column()), message: format!("not a task in JSON: {e}") })?;
    let at = |message: String| LineError { column: None, message };
    let id = match raw.id {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(other) => return Err(at(format!("`id` must be a string, not {other}"))),
    };
    let misc = raw.misc.ok_or_else(|| at("no `misc` object (it holds `target_items` and `initial_inventory`)".into()))?;
    let targets = units(misc.target_items.map(Counts::entries).unwrap_or_default(), "misc.target_items", false).map_err(at)?;
    if targets.is_empty() {
        return Err(at("no targets: `misc.target_items` is missing or empty; give {\"item\": units, …}".into()));
    }
    let inventory = units(misc.initial_inventory.map(Counts::entries).unwrap_or_default(), "misc.initial_inventory", true).map_err(at)?;
    let mut gold = Vec::new();
    for (k, step) in misc.gold_trajectory.unwrap_or_default().into_iter().enumerate() {
        if step.action.as_deref() != Some("craft") {
            continue; // the original's gold holds only crafts
        }
        gold.push(gold_step(step).map_err(|m| at(format!("gold step {}: {m}", k + 1)))?);
    }
    Ok(TaskLine { id, targets, inventory, gold })
}

/// Names normalised and units checked (positive, or non-negative where `zero_ok`).
fn units(entries: Vec<(String, Value)>, what: &str, zero_ok: bool) -> Result<Vec<(String, u64)>, String> {
    let mut out: Vec<(String, u64)> = Vec::with_capacity(entries.len());
    for (name, v) in entries {
        let n = v.as_u64().filter(|n| (zero_ok || *n > 0) && *n <= MAX_UNITS).ok_or_else(|| {
            format!("`{what}` gives `{name}` {v}; units must be whole numbers from {} to {MAX_UNITS}", if zero_ok { 0 } else { 1 })
        })?;
        let name = item_name(&name).to_string();
        if name.trim().is_empty() {
            return Err(format!("`{what}` has an empty item name"));
        }
        match out.iter_mut().find(|(j, _)| *j == name) {
            Some(slot) => slot.1 = n,
            None => out.push((name, n)),
        }
    }
    Ok(out)
}

fn gold_step(step: RawStep) -> Result<GoldStep, String> {
    let target = step.target.as_ref().and_then(Value::as_array).ok_or("no `target` [item, crafts]")?;
    let (Some(item), Some(crafts)) = (target.first().and_then(Value::as_str), target.get(1).and_then(Value::as_u64)) else {
        return Err("`target` must be [item, crafts]".into());
    };
    if crafts == 0 || crafts > MAX_UNITS {
        return Err(format!("`target` gives {crafts} crafts"));
    }
    let stated_total = match step.result_count {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or("`result_count` is not a whole number")?),
    };
    let ingredients = units(step.ingredients.unwrap_or_default().0, "ingredients", false)?;
    Ok(GoldStep { item: item_name(item).to_string(), crafts, ingredients, stated_total })
}
