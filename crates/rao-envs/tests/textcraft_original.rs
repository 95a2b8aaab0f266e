//! The original TextCraft files, read as the RAO authors' environment reads them. The fixture
//! (`data/textcraft-original-fixture`, hand-written in the published layout) has every feature
//! the published data has; one test per rule.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rao_envs::env::{Episode, Step};
use rao_envs::textcraft::craft::{self, CraftError};
use rao_envs::textcraft::expert::{ExpertConfig, expert_action};
use rao_envs::textcraft::original::{self, Loaded, SourceFile};
use rao_envs::textcraft::{Action, Lang, Task, TextCraftEpisode, World, plan};
use rao_envs::vocab::EOS;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/textcraft-original-fixture")
}

fn source(path: &Path) -> SourceFile {
    SourceFile { name: path.file_name().unwrap().to_string_lossy().to_string(), text: std::fs::read_to_string(path).unwrap() }
}

fn recipes(dir: &Path) -> Vec<SourceFile> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| source(&p))
        .collect()
}

fn load(tasks: &str) -> Loaded {
    original::load(&recipes(&fixture().join("recipes")), &source(&fixture().join(tasks)), "textcraft_val").unwrap()
}

fn id(w: &World, name: &str) -> u32 {
    w.by_name(name).unwrap_or_else(|| panic!("no item `{name}`"))
}

fn names(w: &World, ids: &[u32]) -> Vec<String> {
    ids.iter().map(|&i| w.item(i).name.clone()).collect()
}

fn task<'a>(l: &'a Loaded, id: &str) -> &'a Task {
    l.tasks.iter().find(|t| t.id == id).unwrap_or_else(|| panic!("no task `{id}`"))
}

/// Run actions (texts in rao's language) through an episode, then finish; the root's score.
fn replay(world: &Arc<World>, task: &Task, actions: &[String]) -> f64 {
    let ep = TextCraftEpisode::new(world.clone(), task.clone());
    let goal = ep.root_goal();
    let mut made: BTreeMap<String, i64> = BTreeMap::new();
    for a in actions {
        let out = ep.step(&goal, &world.vocab.ids(a), false);
        assert_eq!(out.step, Step::Observe(world.vocab.ids("<obs> ok")), "{}: `{a}`", task.id);
        for (k, v) in out.counters {
            *made.entry(k).or_default() += v;
        }
    }
    let out = ep.step(&goal, &world.vocab.ids("finish"), false);
    ep.verify(&goal, true, out.result.as_deref(), &made)
}

/// Drive one flat node with the expert (no runtime); its score.
fn run_flat(world: &Arc<World>, task: &Task, max_steps: usize) -> f64 {
    let ep = TextCraftEpisode::new(world.clone(), task.clone());
    let goal = ep.root_goal();
    let mut ctx = ep.prompt(&goal, 0, false);
    let cfg = ExpertConfig::default();
    for _ in 0..max_steps {
        let action = expert_action(world, &cfg, &ctx);
        ctx.extend(&action);
        ctx.push(EOS);
        let out = ep.step(&goal, &action, false);
        match out.step {
            Step::Finish => return ep.verify(&goal, true, out.result.as_deref(), &BTreeMap::new()),
            Step::Observe(o) => ctx.extend(o),
            Step::Spawn(_) => unreachable!(),
        }
    }
    0.0
}

/// Finding 1: Files that are not crafting recipes — smelting, blasting, stonecutting, special recipes
/// without a `result` — are skipped and counted by type; nothing stops the directory.
#[test]
fn non_crafting_recipe_files_are_skipped_and_counted_by_type() {
    let l = load("textcraft_val.jsonl");
    let r = &l.report;
    assert_eq!(r.recipe_files, 34);
    let skipped: BTreeMap<&str, usize> = r.skipped_by_type.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    assert_eq!(
        skipped,
        BTreeMap::from([
            ("minecraft:blasting", 1),
            ("minecraft:crafting_special_armordye", 1),
            ("minecraft:crafting_special_firework_rocket", 1),
            ("minecraft:smelting", 2),
            ("minecraft:stonecutting", 1),
        ])
    );
    assert_eq!(r.crafting_recipes.values().sum::<usize>(), 28);
    assert_eq!(r.malformed_recipes, 0);
    assert!(r.summary()[0].contains("6 skipped as not crafting"), "{}", r.summary()[0]);
    assert!(l.world.by_name("cobblestone slab").is_none(), "stonecutting results are not items");
    // The iron ingot is crafted (from nuggets, from a block), never smelted.
    let ingot = id(&l.world, "iron ingot");
    assert_eq!(l.world.item(ingot).recipes.len(), 2);
}

/// Finding 2: `minecraft:string` in a recipe and `string` in a task are one item.
#[test]
fn namespaced_and_plain_names_are_one_item() {
    let l = load("textcraft_val.jsonl");
    let w = &l.world;
    assert!(w.vocab.get("minecraft").is_none() && w.vocab.get("minecraft:string").is_none());
    let string = id(w, "string");
    let wool = id(w, "white wool");
    assert_eq!(w.item(wool).recipes[0].ingredients, vec![(string, 4)]);
    // Task 11 names it `minecraft:string` in its inventory, others `string`: the same item.
    assert_eq!(task(&l, "textcraft.val.11").inventory, vec![(id(w, "black dye"), 2), (string, 8)]);
    assert_eq!(task(&l, "textcraft.val.7").inventory.iter().find(|(i, _)| *i == string), Some(&(string, 12)));
    let mut names: Vec<&str> = w.items.iter().map(|i| i.name.as_str()).collect();
    let n = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n, "no two items share a name");
}

/// Finding 3: A tag is satisfied by the items whose names its rule matches (no tag files).
#[test]
fn tags_are_resolved_by_item_names() {
    let l = load("textcraft_val.jsonl");
    let w = Arc::new(l.world);
    let members = |tag: &str| names(&w, &w.item(id(&w, &format!("tag {tag}"))).members);
    assert_eq!(members("planks"), ["birch planks", "oak planks"]);
    assert_eq!(members("logs"), ["birch log", "oak log"]);
    assert_eq!(members("oak logs"), ["oak log"]);
    assert_eq!(members("wool"), ["black wool", "white wool"]);
    assert_eq!(members("stone tool materials"), ["cobblestone", "stone"]);
    assert_eq!(members("stone crafting materials"), ["cobblestone", "stone"]);
    // Charcoal is only smelted, so no crafting recipe names it: the original's `coals` is coal alone.
    assert_eq!(members("coals"), ["coal"]);
    assert_eq!(l.report.tags.get("planks"), Some(&2));
    // Any planks pay for `planks`, as a concrete item named in the craft.
    let stick = id(&w, "stick");
    for planks in ["oak planks", "birch planks"] {
        let mut inv = craft::Inventory::from([(id(&w, planks), 2)]);
        assert_eq!(craft::exact(&w, &mut inv, stick, 4, &[(id(&w, planks), 2)]), Ok(4), "{planks}");
        assert_eq!(inv.get(&stick), Some(&4));
    }
    // The tag itself is not an ingredient one can hand over.
    let mut inv = craft::Inventory::from([(id(&w, "oak planks"), 2)]);
    assert_eq!(craft::exact(&w, &mut inv, stick, 4, &[(id(&w, "tag planks"), 2)]), Err(CraftError::NoMatch));
}

/// Finding 4: An ingredient given as a list of alternatives is dropped, as the original's loader drops it.
#[test]
fn ingredients_given_as_alternatives_are_dropped_as_the_original_drops_them() {
    let l = load("textcraft_val.jsonl");
    let w = &l.world;
    let torch = &w.item(id(w, "torch")).recipes;
    assert_eq!(torch.len(), 1);
    assert_eq!((torch[0].result_count, torch[0].ingredients.clone()), (4, vec![(id(w, "stick"), 1)]), "coal or charcoal: dropped");
    assert_eq!(w.item(id(w, "tnt")).recipes[0].ingredients, vec![(id(w, "gunpowder"), 5)], "sand or red sand: dropped");
    assert_eq!(l.report.dropped_ingredients, ["tnt.json", "torch.json"]);
    // So the task asking for a torch and a table never spends its coal.
    let t = task(&l, "textcraft.val.1");
    assert!(t.gold.iter().all(|g| !g.contains("coal")), "{:?}", t.gold);
}

/// Finding 5: Crafting loops (lapis ↔ block, ingot ↔ nuggets ↔ block) neither recurse forever nor raise
/// tiers; plans never make an item from itself.
#[test]
fn crafting_loops_end_and_tiers_stay_sane() {
    let l = load("textcraft_val.jsonl");
    let w = &l.world;
    let tier = |n: &str| w.item(id(w, n)).tier;
    // Sticks come from bamboo in one step (their best recipe); coal, made only from its block
    // and back, counts as given.
    assert_eq!((tier("oak log"), tier("oak planks"), tier("stick"), tier("torch"), tier("campfire")), (0, 1, 1, 2, 2));
    assert_eq!((tier("wooden pickaxe"), tier("white bed"), tier("bucket"), tier("lapis block")), (2, 2, 1, 0));
    assert!(w.items.iter().all(|i| i.tier <= 2), "no tier runs away through a loop");
    let loops = &l.report.items_on_loops;
    assert_eq!(loops, &["coal", "coal_block", "iron_block", "iron_ingot", "iron_nugget", "lapis_block", "lapis_lazuli"]);
    // The bucket needs ingots; the first ingot recipe (by file name) is from a block, which is
    // made of ingots: the plan takes the nuggets.
    let t = task(&l, "textcraft.val.4");
    let p = plan::plan(w, &t.inventory_map(), &t.target_units()).unwrap();
    let crafts: Vec<(String, u64)> = p.crafts.iter().map(|c| (w.item(c.item).name.clone(), c.total)).collect();
    assert_eq!(crafts, [("iron ingot".to_string(), 3), ("bucket".to_string(), 1)]);
    // Nothing to make ingots from: no plan, and no endless search.
    let none = craft::Inventory::from([(id(w, "lapis block"), 1)]);
    assert_eq!(plan::plan(w, &none, &[(id(w, "iron block"), 1)]), Err(plan::PlanError::NoPlan));
    assert!(plan::plan(w, &none, &[(id(w, "lapis lazuli"), 9)]).is_ok(), "from its block");
}

/// Finding 6: Every recipe of an item counts: sticks from bamboo (the second stick recipe by file name).
#[test]
fn every_recipe_of_an_item_is_considered() {
    let l = load("textcraft_val.jsonl");
    let w = Arc::new(l.world.clone());
    let t = task(&l, "textcraft.val.2");
    assert_eq!(w.item(id(&w, "stick")).recipes.len(), 2);
    assert!(rao_envs::textcraft::is_solvable(&w, t));
    assert_eq!(t.gold, ["craft stick 2 from bamboo 4"]);
    assert_eq!(replay(&w, t, &t.gold), 1.0);
    assert_eq!(run_flat(&w, t, 50), 1.0, "the expert finds the bamboo recipe");
    // `info` shows every recipe.
    let obs = Lang::new(&w).info_obs(id(&w, "stick"), 0);
    assert_eq!(w.vocab.text(&obs), "<obs> x 4 tag planks 2 or bamboo 2");
}

/// Finding 7: Every target of a task counts: success needs all of them held when the root finishes.
#[test]
fn every_target_of_a_task_counts() {
    let l = load("textcraft_val.jsonl");
    let w = Arc::new(l.world.clone());
    let t = task(&l, "textcraft.val.7");
    assert_eq!(names(&w, &t.targets.iter().map(|x| x.0).collect::<Vec<_>>()), ["white bed", "stick", "crafting table"]);
    let ep = TextCraftEpisode::new(w.clone(), t.clone());
    assert_eq!(w.vocab.text(&ep.root_goal()), "white bed , stick 4 , crafting table");
    assert_eq!(replay(&w, t, &t.gold), 1.0);
    // Without the last craft (the table) two of three targets are there: failure.
    assert_eq!(replay(&w, t, &t.gold[..t.gold.len() - 1]), 0.0);
    let multi = l.tasks.iter().filter(|t| t.targets.len() > 1).count();
    assert_eq!(multi, 4);
}

/// Finding 8: A gold step's `target` count is a number of crafts: 2 crafts of planks make 8.
#[test]
fn gold_counts_are_crafts() {
    let l = load("textcraft_val.jsonl");
    let t = task(&l, "textcraft.val.0@1");
    assert_eq!(
        t.gold,
        ["craft oak planks 8 from oak log 2", "craft stick 4 from oak planks 2", "craft wooden pickaxe from oak planks 3 , stick 2"]
    );
    assert_eq!(l.report.gold.with_gold, 10);
    assert_eq!(l.report.gold.reaching_success, 10, "{:?}", l.report.gold.failures);
}

/// Finding 9: The original's craft: the total is divisible by the yield, ingredients are exact, tags are
/// paid with a concrete item, nothing extra; rao's compact craft is what its own agents use.
#[test]
fn the_craft_action_follows_the_original_rule() {
    let l = load("textcraft_val.jsonl");
    let w = Arc::new(l.world);
    let (log, planks, stick, pick) = (id(&w, "oak log"), id(&w, "oak planks"), id(&w, "stick"), id(&w, "wooden pickaxe"));
    let inv = || craft::Inventory::from([(log, 2), (planks, 3), (stick, 2), (id(&w, "dirt"), 1)]);
    let exact = |item, total, provided: &[(u32, u64)]| craft::exact(&w, &mut inv(), item, total, provided);
    assert_eq!(exact(planks, 8, &[(log, 2)]), Ok(8));
    assert_eq!(exact(planks, 6, &[(log, 2)]), Err(CraftError::NoMatch), "6 is not a multiple of 4");
    assert_eq!(exact(planks, 8, &[(log, 1)]), Err(CraftError::NoMatch), "two crafts take two logs");
    assert_eq!(exact(planks, 4, &[(log, 1), (id(&w, "dirt"), 1)]), Err(CraftError::NoMatch), "nothing extra");
    assert_eq!(exact(planks, 12, &[(log, 3)]), Err(CraftError::Need(log, 1)));
    assert_eq!(exact(pick, 1, &[(planks, 3), (stick, 2)]), Ok(1));
    assert_eq!(exact(log, 1, &[]), Err(CraftError::NoRecipe));
    // Through the episode: the exact form, and the compact one (which overproduces).
    let t = Task {
        id: "t".into(),
        band: None,
        targets: vec![(pick, 1)],
        inventory: vec![(log, 2)],
        validation: false,
        gold: vec![],
        group: None,
    };
    let ep = TextCraftEpisode::new(w.clone(), t);
    let goal = ep.root_goal();
    let obs = |a: &str| match ep.step(&goal, &w.vocab.ids(a), false).step {
        Step::Observe(o) => w.vocab.text(&o),
        other => panic!("{other:?}"),
    };
    assert_eq!(obs("craft oak planks 5 from oak log 2"), "<obs> err recipe");
    assert_eq!(obs("craft oak planks 4 from oak log 1"), "<obs> ok");
    assert_eq!(obs("craft oak planks 2"), "<obs> ok", "compact: ⌈2/4⌉ = 1 craft");
    assert_eq!(ep.held(planks), 8);
    assert_eq!(obs("craft stick 4 from tag planks 2"), "<obs> err recipe", "a tag is paid with an item");
    assert_eq!(obs("craft oak planks 4 from oak log 1"), "<obs> err need oak log", "one more log (a count of 1 is not written)");
    let lang = Lang::new(&w);
    let a = Action::CraftFrom(pick, 1, vec![(planks, 3), (stick, 2)]);
    assert_eq!(lang.parse(&lang.encode(&a)), Ok(a));
}

/// Finding 10: Bad lines and tasks that cannot be done are reported with their line and what is wrong;
/// the rest loads. Duplicate ids stay distinct.
#[test]
fn bad_lines_and_unsolvable_tasks_are_reported_where_they_are() {
    let l = load("textcraft_val.jsonl");
    let r = &l.report;
    assert_eq!((r.task_lines, r.tasks_loaded, r.tasks_skipped), (13, 10, 3));
    let problems: Vec<String> = r.problems.iter().map(|p| p.to_string()).collect();
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].starts_with("textcraft_val.jsonl:4:166: not a task in JSON: trailing comma"), "{}", problems[0]);
    assert_eq!(
        problems[1],
        "textcraft_val.jsonl:7: task `textcraft.val.5` cannot be done: the inventory lacks 1 oak log (no recipe makes them)"
    );
    assert!(problems[2].starts_with("textcraft_val.jsonl:8: no targets"), "{}", problems[2]);
    assert_eq!(r.duplicate_ids, BTreeMap::from([("textcraft.val.0".to_string(), vec![1, 6])]));
    let ids: Vec<&str> = l.tasks.iter().map(|t| t.id.as_str()).filter(|i| i.starts_with("textcraft.val.0")).collect();
    assert_eq!(ids, ["textcraft.val.0@1", "textcraft.val.0@6"]);
    assert!(l.tasks.iter().all(|t| t.group.as_deref() == Some("textcraft_val")));
}

#[test]
fn unreadable_recipe_files_are_reported_and_skipped() {
    let mut files = recipes(&fixture().join("recipes"));
    files.push(SourceFile {
        name: "broken.json".into(),
        text: "{\"type\": \"minecraft:crafting_shaped\",\n  \"pattern\": [\"#\"]\n  \"key\": {}}".into(),
    });
    files.push(SourceFile {
        name: "newer.json".into(),
        text: r#"{"type": "minecraft:crafting_shapeless", "ingredients": [{"item": "minecraft:stick"}], "result": {"id": "minecraft:ladder"}}"#.into(),
    });
    let l = original::load(&files, &source(&fixture().join("textcraft_train.jsonl")), "train").unwrap();
    let problems: Vec<String> = l.report.problems.iter().map(|p| p.to_string()).collect();
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].starts_with("broken.json:3:3: not JSON: expected `,` or `}`"), "{}", problems[0]);
    assert!(problems[1].starts_with("newer.json: `result` has no `item` (it names `id`"), "{}", problems[1]);
    assert_eq!(l.report.malformed_recipes, 2);
    assert_eq!(l.tasks.len(), 12, "every training task still loads");
    // Only non-crafting files: a clear error, no world.
    let smelting: Vec<SourceFile> = files.into_iter().filter(|f| f.text.contains("smelting")).collect();
    let err = original::load(&smelting, &source(&fixture().join("textcraft_train.jsonl")), "train").unwrap_err().to_string();
    assert!(err.starts_with("no crafting recipe (`minecraft:crafting_shaped` or `minecraft:crafting_shapeless`) among 2 recipe files (skipped by type: 2 minecraft:smelting)"), "{err}");
}

#[test]
fn a_gold_that_does_not_reach_its_targets_is_reported() {
    let text = std::fs::read_to_string(fixture().join("textcraft_train.jsonl")).unwrap();
    // Task 0's gold with a step whose crafts and ingredients disagree (2 crafts of sticks take 4 planks).
    let first = text.lines().next().unwrap().replace(
        r#""target": ["stick", 1], "ingredients": {"oak_planks": 2}, "result_count": 4"#,
        r#""target": ["stick", 2], "ingredients": {"oak_planks": 2}"#,
    );
    let l = original::load(&recipes(&fixture().join("recipes")), &SourceFile { name: "one.jsonl".into(), text: first }, "one").unwrap();
    assert_eq!((l.report.gold.with_gold, l.report.gold.reaching_success), (1, 0));
    assert_eq!(
        l.report.gold.failures[0].to_string(),
        "one.jsonl:1: gold of task `textcraft.train.0` fails at step 2 (`craft stick 8 from oak planks 2`): its ingredients match no recipe of stick for 8 units"
    );
}

/// Gold trajectories of every fixture task reach success through the episode, and the flat
/// expert solves every task.
#[test]
fn gold_and_the_flat_expert_reach_every_fixture_task() {
    for file in ["textcraft_val.jsonl", "textcraft_train.jsonl"] {
        let l = load(file);
        let w = Arc::new(l.world.clone());
        assert!(!l.tasks.is_empty());
        for t in &l.tasks {
            assert!(!t.gold.is_empty());
            assert_eq!(replay(&w, t, &t.gold), 1.0, "gold of {}", t.id);
            assert_eq!(run_flat(&w, t, 100), 1.0, "flat expert on {}", t.id);
        }
    }
}

#[test]
fn the_grammar_accepts_the_exact_craft_and_its_tags() {
    use rao_envs::grammar::Grammar;
    let l = load("textcraft_val.jsonl");
    let w = Arc::new(l.world);
    let g = rao_envs::textcraft::grammar::TextCraftGrammar::new(&w, 4);
    let accepts = |toks: &[u32]| {
        (0..toks.len()).all(|i| g.allowed(false, &[], &toks[..i]).contains(&toks[i])) && g.allowed(false, &[], toks).contains(&EOS)
    };
    for a in ["craft wooden pickaxe from oak planks 3 , stick 2", "craft oak planks 8 from oak log 2", "craft stick 4", "info tag planks"] {
        assert!(accepts(&w.vocab.ids(a)), "{a}");
    }
    assert!(!accepts(&w.vocab.ids("craft stick from")), "an exact craft names its ingredients");
}

/// Untrusted data: a chain of 40 recipes each taking nine of the one before (units past what
/// 64 bits hold) and a loop through 200 items neither panic nor run away.
#[test]
fn deep_chains_and_long_loops_neither_panic_nor_run_away() {
    let shaped = |result: &str, ing: &str| SourceFile {
        name: format!("{result}.json"),
        text: format!(
            r#"{{"type": "minecraft:crafting_shaped", "pattern": ["XXX", "XXX", "XXX"], "key": {{"X": {{"item": "minecraft:{ing}"}}}}, "result": {{"item": "minecraft:{result}"}}}}"#
        ),
    };
    let mut files: Vec<SourceFile> = (1..=40).map(|k| shaped(&format!("c{k}"), &format!("c{}", k - 1))).collect();
    files.extend((0..200).map(|k| shaped(&format!("r{k}"), &format!("r{}", (k + 1) % 200))));
    let tasks = SourceFile {
        name: "t.jsonl".into(),
        text: [
            r#"{"id": "deep", "misc": {"target_items": {"c40": 1}, "initial_inventory": {"c0": 9}}}"#,
            r#"{"id": "loop", "misc": {"target_items": {"r0": 1}, "initial_inventory": {"r5": 1}}}"#,
            r#"{"id": "ok", "misc": {"target_items": {"c1": 1}, "initial_inventory": {"c0": 9}}}"#,
        ]
        .join("\n"),
    };
    let l = original::load(&files, &tasks, "t").unwrap();
    assert_eq!(l.tasks.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["ok"]);
    let problems: Vec<String> = l.report.problems.iter().map(|p| p.to_string()).collect();
    assert!(problems[0].starts_with("t.jsonl:1: task `deep` cannot be done"), "{problems:?}");
    assert!(problems[1].starts_with("t.jsonl:2: task `loop` cannot be done"), "{problems:?}");
    assert_eq!(l.world.item(id(&l.world, "c40")).tier, 40);
    assert!(l.report.items_on_loops.len() == 200);
}

/// Warm-start renaming in a world of the original's files: a permutation within a tier and word
/// count (a renamed demonstration keeps its length), tags and their members never move, and
/// something does move.
#[test]
fn renaming_keeps_tier_and_word_count_and_leaves_tags_alone() {
    let w = load("textcraft_train.jsonl").world;
    let in_tag: std::collections::HashSet<u32> = w.items.iter().flat_map(|i| i.members.clone()).collect();
    let mut moved = 0;
    for seed in 0..20 {
        let map = w.random_renaming_same_shape(&mut rao_envs::rng::Rng::new(seed));
        let mut images: Vec<u32> = map.values().copied().collect();
        images.sort();
        images.dedup();
        assert_eq!(images.len(), map.len(), "distinct names stay distinct");
        for it in &w.items {
            let to = w.item(*map.get(&it.id).unwrap_or(&it.id));
            if it.is_tag() || in_tag.contains(&it.id) {
                assert_eq!(to.id, it.id, "{} is a tag or a tag's member", it.name);
            }
            assert_eq!((to.tier, to.tokens.len()), (it.tier, it.tokens.len()), "{} → {}", it.name, to.name);
            moved += usize::from(to.id != it.id);
        }
        let text: Vec<_> = w.items.iter().flat_map(|i| i.tokens.clone()).collect();
        assert_eq!(w.rename_tokens(&text, &map).len(), text.len());
    }
    assert!(moved > 0, "the fixture has items to swap");
}

/// `held_and_made`: a goal held at finish counts only if the node's subtree made its units; the
/// original's `held` takes the inventory alone.
#[test]
fn a_goal_already_held_is_reached_only_by_making_it_under_held_and_made() {
    use rao_envs::textcraft::{GoalCheck, verify_goal};
    let mut w = load("textcraft_val.jsonl").world;
    let goal = w.vocab.ids("stick 4");
    let held = r#"{"held":{"stick":6}}"#;
    let made = |n: i64| BTreeMap::from([("stick".to_string(), n)]);
    assert_eq!(verify_goal(&w, &goal, true, Some(held), &made(0)), 1.0, "the original's rule: held is enough");
    w.goal_check = GoalCheck::HeldAndMade;
    assert_eq!(verify_goal(&w, &goal, true, Some(held), &made(0)), 0.0, "held but not made");
    assert_eq!(verify_goal(&w, &goal, true, Some(held), &made(2)), 0.0, "made too few");
    assert_eq!(verify_goal(&w, &goal, true, Some(held), &made(4)), 1.0);
    assert_eq!(verify_goal(&w, &goal, true, Some(r#"{"held":{"stick":3}}"#), &made(4)), 0.0, "made but not held");
    assert_eq!(verify_goal(&w, &goal, false, Some(held), &made(4)), 0.0, "not finished");
}
