//! Task sets as artifacts: `world.json` (the world, so any stage can rebuild it) and
//! `tasks.parquet` (one row per task; targets, inventories and gold actions as JSON text;
//! `target`/`count` name the first target).

use arrow::array::{Array, AsArray};
use arrow::datatypes::Int64Type;
use bytes::Bytes;
use rao_core::parquet_io::{Column, read_batches, table_to_parquet};
use rao_envs::textcraft::{Band, ItemId, Task, World};

pub const WORLD_FILE: &str = "world.json";
pub const TASKS_FILE: &str = "tasks.parquet";

pub fn tasks_to_parquet(world: &World, tasks: &[Task]) -> anyhow::Result<Bytes> {
    let names = |f: &dyn Fn(&Task) -> String| tasks.iter().map(f).collect::<Vec<_>>();
    Ok(table_to_parquet(vec![
        ("id", Column::Str(names(&|t| t.id.clone()))),
        ("band", Column::OptStr(tasks.iter().map(|t| t.band.map(|b| b.name().to_string())).collect())),
        ("target", Column::Str(names(&|t| world.item(t.target()).name.clone()))),
        ("target_tier", Column::I64(tasks.iter().map(|t| world.item(t.target()).tier as i64).collect())),
        ("count", Column::I64(tasks.iter().map(|t| t.targets[0].1 as i64).collect())),
        ("targets", Column::Str(names(&|t| named(world, &t.targets)))),
        ("validation", Column::Bool(tasks.iter().map(|t| t.validation).collect())),
        ("inventory", Column::Str(names(&|t| named(world, &t.inventory)))),
        ("gold", Column::Str(names(&|t| serde_json::to_string(&t.gold).unwrap()))),
        ("group", Column::OptStr(tasks.iter().map(|t| t.group.clone()).collect())),
    ])?)
}

/// `[[name, units], …]`
fn named(world: &World, pairs: &[(ItemId, u32)]) -> String {
    serde_json::to_string(&pairs.iter().map(|(i, n)| (world.item(*i).name.clone(), *n)).collect::<Vec<_>>()).unwrap()
}

pub fn tasks_from_parquet(world: &World, bytes: Bytes) -> anyhow::Result<Vec<Task>> {
    let mut out = Vec::new();
    for b in read_batches(bytes)? {
        let s = |n: &str| {
            b.column_by_name(n).map(|c| c.as_string::<i32>().clone()).ok_or_else(|| anyhow::anyhow!("tasks.parquet lacks column `{n}`"))
        };
        let (id, band, target, inventory, gold) = (s("id")?, s("band")?, s("target")?, s("inventory")?, s("gold")?);
        let count = b.column_by_name("count").unwrap().as_primitive::<Int64Type>().clone();
        let validation = b.column_by_name("validation").unwrap().as_boolean().clone();
        // Artifacts written before tasks had several targets and a group lack these columns.
        let (targets, group) = (s("targets").ok(), s("group").ok());
        for r in 0..b.num_rows() {
            let item = |name: &str| world.by_name(name).ok_or_else(|| anyhow::anyhow!("task {} names unknown item `{name}`", id.value(r)));
            let items = |json: &str| -> anyhow::Result<Vec<(ItemId, u32)>> {
                let pairs: Vec<(String, u32)> = serde_json::from_str(json)?;
                pairs.iter().map(|(n, c)| Ok((item(n)?, *c))).collect()
            };
            out.push(Task {
                id: id.value(r).to_string(),
                band: if band.is_null(r) { None } else { Band::parse(band.value(r)) },
                targets: match &targets {
                    Some(t) => items(t.value(r))?,
                    None => vec![(item(target.value(r))?, count.value(r) as u32)],
                },
                inventory: items(inventory.value(r))?,
                validation: validation.value(r),
                gold: serde_json::from_str(gold.value(r))?,
                group: group.as_ref().filter(|g| !g.is_null(r)).map(|g| g.value(r).to_string()),
            });
        }
    }
    Ok(out)
}

/// A task file in rao's format: `.parquet` as `synthesize` writes it, or `.jsonl` with one
/// `{"id"?, "target", "count"?, "inventory": [[item, units], …], "band"?}` object per line.
pub fn read_task_file(world: &World, path: &std::path::Path) -> anyhow::Result<Vec<Task>> {
    let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("task file {}: {e}", path.display()))?;
    match path.extension().and_then(|e| e.to_str()) {
        Some("parquet") => tasks_from_parquet(world, Bytes::from(bytes)),
        Some("jsonl") | Some("json") => {
            tasks_from_jsonl(world, std::str::from_utf8(&bytes)?).map_err(|e| anyhow::anyhow!("task file {}: {e}", path.display()))
        }
        _ => anyhow::bail!("task file {}: use a .parquet or .jsonl file", path.display()),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskLine {
    id: Option<String>,
    target: String,
    #[serde(default = "crate::defaults::one_u32")]
    count: u32,
    inventory: Vec<(String, u32)>,
    #[serde(default)]
    band: Option<String>,
}

pub fn tasks_from_jsonl(world: &World, text: &str) -> anyhow::Result<Vec<Task>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = |m: String| anyhow::anyhow!("line {}: {m}", n + 1);
        let t: TaskLine = serde_json::from_str(line).map_err(|e| at(e.to_string()))?;
        let item = |name: &str| world.by_name(name).ok_or_else(|| at(format!("unknown item `{name}` (not in this world)")));
        let mut inventory = t.inventory.iter().map(|(name, units)| Ok((item(name)?, *units))).collect::<anyhow::Result<Vec<_>>>()?;
        inventory.sort();
        out.push(Task {
            id: t.id.unwrap_or_else(|| format!("line-{}", n + 1)),
            band: match &t.band {
                Some(b) => Some(Band::parse(b).ok_or_else(|| at(format!("unknown band `{b}`")))?),
                None => None,
            },
            targets: vec![(item(&t.target)?, t.count)],
            inventory,
            validation: false,
            gold: Vec::new(),
            group: None,
        });
    }
    Ok(out)
}
