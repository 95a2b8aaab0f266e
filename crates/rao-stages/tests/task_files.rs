//! Task files in rao's JSONL format: what a user writes by hand or exports from elsewhere.

use rao_envs::textcraft::{self, Band, SynthConfig};
use rao_stages::tasks_io::tasks_from_jsonl;

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
