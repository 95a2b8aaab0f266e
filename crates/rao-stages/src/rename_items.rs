//! `rename_items`: the same TextCraft tasks in a world whose item names are shuffled. Every item
//! takes the name of another of the same shape — in worlds of the original's files the same tier
//! and word count (tags and their members keep theirs), in synthetic worlds the same domain and
//! tier — so recipes, inventories and targets keep their structure under other names. A policy
//! trained on such tasks must read names from its context instead of recalling them (the warm
//! start's `demos.rename_items`, for rollouts).

use std::collections::HashMap;

use futures::future::BoxFuture;
use rao_envs::rng::Rng;
use rao_envs::textcraft::{ItemId, Rules, Task, World};
use rao_pipeline::{InputDecl, StageContext, TypedStage};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::tasks_io::{TASKS_FILE, WORLD_FILE, tasks_from_parquet};

/// The kind's name. Kept here rather than in `kinds.rs`: every kind's code version hashes that
/// file, so a name added there would make every cached artifact stale.
pub const NAME: &str = "rename_items";

#[derive(Debug, Default, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RenameItemsParams {
    /// Seed of the renaming; default: this instance's seed (a fresh renaming in every loop
    /// iteration).
    #[serde(default)]
    pub rename_seed: Option<u64>,
}

pub struct RenameItems;

impl TypedStage for RenameItems {
    fn code() -> &'static str {
        crate::code::of("rename_items")
    }
    type Params = RenameItemsParams;
    const NAME: &'static str = NAME;
    const VERSION: u32 = 1;
    const DESCRIBE: &'static str = "TextCraft tasks in a world whose items swap names with others of the same shape, so a policy must read names rather than recall them";
    const INPUTS: &'static [InputDecl] = &[InputDecl { name: "tasks", required: true }];
    const OUTPUTS: &'static [&'static str] = &["tasks"];

    fn run(ctx: StageContext, p: RenameItemsParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            let input = match ctx.input("tasks")? {
                [a] => a.clone(),
                _ => anyhow::bail!("input `tasks` takes exactly one task set"),
            };
            let world_json = ctx.read_input_file(&input, WORLD_FILE).await.map_err(|e| {
                anyhow::anyhow!("input `tasks` ({}) has no readable {WORLD_FILE}: rename_items takes TextCraft tasks ({e})", input.instance)
            })?;
            let world = World::from_json(std::str::from_utf8(&world_json)?)?;
            let tasks = tasks_from_parquet(&world, ctx.read_input_file(&input, TASKS_FILE).await?)?;
            let mut rng = Rng::derive(p.rename_seed.unwrap_or(ctx.seed), "rename_items");
            let map = renaming(&world, &mut rng);
            let moved = map.iter().filter(|(a, b)| a != b).count();
            ctx.set_metric("items_renamed", moved as f64);
            let renamed = renamed_world(&world, &map);
            let tasks: Vec<Task> = tasks.into_iter().map(|t| Task { gold: renamed_gold(&world, &map, &t.gold), ..t }).collect();
            crate::synthesize::write_tasks(&ctx, &renamed, &tasks)
        })
    }
}

/// The renaming the warm start's demonstrations use for this kind of world.
fn renaming(world: &World, rng: &mut Rng) -> HashMap<ItemId, ItemId> {
    match world.rules {
        Rules::Original => world.random_renaming_same_shape(rng),
        _ => world.random_renaming(rng),
    }
}

/// The world in which item `a` is called what item `map[a]` was called; recipes, tiers, tags and
/// held-out marks stay with the items.
fn renamed_world(world: &World, map: &HashMap<ItemId, ItemId>) -> World {
    let mut out = world.clone();
    for item in &mut out.items {
        let source = world.item(*map.get(&item.id).unwrap_or(&item.id));
        item.name = source.name.clone();
        item.tokens = source.tokens.clone();
    }
    out.reindex();
    out
}

/// Gold action texts under the new names (a text with a word outside the vocabulary is kept as
/// it is: it names no item).
fn renamed_gold(world: &World, map: &HashMap<ItemId, ItemId>, gold: &[String]) -> Vec<String> {
    gold.iter()
        .map(|action| {
            let toks: Option<Vec<_>> = action.split_whitespace().map(|w| world.vocab.get(w)).collect();
            match toks {
                Some(toks) => world.vocab.text(&world.rename_tokens(&toks, map)),
                None => action.clone(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rao_envs::textcraft::{Band, SynthConfig, generate, is_solvable, synthesize};

    #[test]
    fn a_renamed_world_keeps_every_recipe_under_the_new_names() {
        let world = generate(&SynthConfig::small(), 7);
        let mut rng = Rng::derive(3, "test");
        let map = renaming(&world, &mut rng);
        assert!(map.iter().any(|(a, b)| a != b), "nothing was renamed");
        let renamed = renamed_world(&world, &map);
        for item in &world.items {
            let new = renamed.item(item.id);
            // Same structure, the name of the item it was mapped to, found by that name.
            assert_eq!((new.tier, &new.recipes, new.held_out), (item.tier, &item.recipes, item.held_out));
            assert_eq!(new.name, world.item(map[&item.id]).name);
            assert_eq!(renamed.by_name(&new.name), Some(item.id));
        }
        for task in synthesize(&world, Band::Medium, 5, false, 1) {
            assert!(is_solvable(&renamed, &task));
        }
    }
}
