//! Task files: rao's JSONL format (what a user writes by hand or exports from elsewhere), and the
//! stand-in for the RAO authors' TextCraft files made from Minecraft's recipes
//! (`scripts/minecraft-data` fetches them; the test command runs it): real recipes load as the
//! original code reads them, tags and alternatives included; every task's gold replays; no
//! validation target is a training target; the same seed gives the same files.

use rao_envs::textcraft::original::{self, SourceFile};
use rao_envs::textcraft::{self, Band, SynthConfig};
use rao_stages::tasks_io::tasks_from_jsonl;
use rao_stages::textcraft_minecraft::tasks::{self as standin, StandinConfig, TRAIN_FILE, VAL_FILE};
use std::collections::BTreeSet;
use std::path::PathBuf;

#[test]
fn jsonl_tasks_read_back_as_the_tasks_they_describe_and_bad_lines_are_named() {
    let world = textcraft::generate(&SynthConfig::preset("small").unwrap(), 3);
    let tasks = textcraft::synthesize(&world, Band::Medium, 6, false, 9);
    assert!(!tasks.is_empty());
    let name = |i| world.item(i).name.clone();
    let lines: Vec<String> = tasks
        .iter()
        .map(|t| {
            serde_json::json!({
                "id": t.id, "target": name(t.target()), "count": t.targets[0].1, "band": "medium",
                // Written in reverse order: the reader sorts inventories as the world does.
                "inventory": t.inventory.iter().rev().map(|(i, n)| (name(*i), *n)).collect::<Vec<_>>(),
            })
            .to_string()
        })
        .collect();
    let read = tasks_from_jsonl(&world, &(lines.join("\n") + "\n\n")).unwrap();
    assert_eq!(read.len(), tasks.len());
    for (r, t) in read.iter().zip(&tasks) {
        assert_eq!((&r.id, &r.targets, &r.inventory, r.band), (&t.id, &t.targets, &t.inventory, Some(Band::Medium)));
    }

    let bad = format!("{}\n{{\"target\": \"no such thing\", \"inventory\": []}}\n", lines[0]);
    let e = tasks_from_jsonl(&world, &bad).unwrap_err().to_string();
    assert!(e.contains("line 2") && e.contains("unknown item `no such thing`"), "{e}");
    let e = tasks_from_jsonl(&world, "{\"target\": 3}\n").unwrap_err().to_string();
    assert!(e.starts_with("line 1:"), "{e}");
}

fn data(file: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/minecraft-data");
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}: {e}; run scripts/minecraft-data (the test command does)", dir.join(file).display()))
}

fn targets(jsonl: &str) -> BTreeSet<String> {
    jsonl
        .lines()
        .flat_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["misc"]["target_items"].as_object().unwrap().keys().cloned().collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn minecraft_recipes_make_the_authors_layout_and_every_gold_replays() {
    let s = standin::build(&data("recipes.json"), &data("items.json"), &StandinConfig::default()).unwrap();
    let recipes: Vec<SourceFile> =
        s.files.iter().filter(|(n, _)| n.starts_with("recipes/")).map(|(n, t)| SourceFile { name: n.clone(), text: t.clone() }).collect();
    eprintln!("{} recipe files; craftable items per tier {:?}", recipes.len(), s.items_per_tier);
    eprintln!("tasks by deepest target tier: train {:?}, validation {:?}", s.train_tiers, s.validation_tiers);
    assert!(recipes.len() > 500, "hundreds of real recipes, not a fixture: {}", recipes.len());
    assert!(s.items_per_tier.keys().max() >= Some(&4), "Minecraft's deepest items are 4 crafts deep: {:?}", s.items_per_tier);
    let file = |name: &str| s.files.iter().find(|(n, _)| n == name).map(|(_, t)| t.clone()).unwrap();
    for (name, n) in [(TRAIN_FILE, 1000), (VAL_FILE, 100)] {
        let loaded = original::load(&recipes, &SourceFile { name: name.into(), text: file(name) }, name).unwrap();
        let r = &loaded.report;
        eprintln!(
            "{name}: {} tasks, gold {}/{}, tags (items each) {:?}",
            r.tasks_loaded, r.gold.reaching_success, r.gold.with_gold, r.tags
        );
        assert_eq!((r.task_lines, r.tasks_loaded, r.gold.reaching_success), (n, n, n));
        assert!(r.problems.is_empty() && r.malformed_recipes == 0, "{:?}", r.problems);
        assert!(r.tags.len() >= 5 && r.tags.values().all(|&m| m > 0), "tags, none empty: {:?}", r.tags);
        // Multi-word names, and tasks of one to three targets.
        assert!(loaded.world.items.iter().any(|i| i.name.split(' ').count() >= 3));
        assert_eq!(loaded.tasks.iter().map(|t| t.targets.len()).collect::<BTreeSet<_>>(), BTreeSet::from([1, 2, 3]));
    }
    // Alternatives: some item has several recipes.
    let loaded = original::load(&recipes, &SourceFile { name: "none".into(), text: String::new() }, "none").unwrap();
    assert!(loaded.world.items.iter().any(|i| i.recipes.len() >= 2));
    let (train, val) = (targets(&file(TRAIN_FILE)), targets(&file(VAL_FILE)));
    assert!(train.is_disjoint(&val), "held-out targets in training: {:?}", train.intersection(&val).collect::<Vec<_>>());

    let again = standin::build(&data("recipes.json"), &data("items.json"), &StandinConfig::default()).unwrap();
    assert!(again.files == s.files, "the same seed makes the same files");
    let other = standin::build(&data("recipes.json"), &data("items.json"), &StandinConfig { seed: 2, ..Default::default() }).unwrap();
    assert_ne!(other.files.last(), s.files.last(), "another seed, other tasks");
}
