//! TextCraft-Synth: generation rules, determinism, the action language, the verifier, and
//! solvability (the original TextCraft files: `textcraft_original.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use rao_envs::env::{Episode, Step};
use rao_envs::textcraft::expert::{ExpertConfig, expert_action};
use rao_envs::textcraft::{self, Action, Band, Lang, SynthConfig, TextCraftEpisode, World};
use rao_envs::vocab::{EOS, Tok};

/// Drive one node with the expert directly on an episode (no runtime): flat, unlimited budget.
fn run_flat(world: &Arc<World>, task: &textcraft::Task, max_steps: usize) -> f64 {
    let ep = TextCraftEpisode::new(world.clone(), task.clone());
    let goal = ep.root_goal();
    let mut ctx = ep.prompt(&goal, 0, false);
    let mut made: BTreeMap<String, i64> = BTreeMap::new();
    let cfg = ExpertConfig::default();
    for _ in 0..max_steps {
        let action = expert_action(world, &cfg, &ctx);
        ctx.extend(&action);
        ctx.push(EOS);
        let out = ep.step(&goal, &action, false);
        for (k, v) in out.counters {
            *made.entry(k).or_default() += v;
        }
        match out.step {
            Step::Finish => return ep.verify(&goal, true, None, &made),
            Step::Observe(o) => ctx.extend(o),
            Step::Spawn(_) => unreachable!(),
        }
    }
    0.0
}

#[test]
fn same_seed_same_world_and_tasks_byte_for_byte() {
    let cfg = SynthConfig::full();
    let a = serde_json::to_string(&textcraft::generate(&cfg, 3)).unwrap();
    let b = serde_json::to_string(&textcraft::generate(&cfg, 3)).unwrap();
    let c = serde_json::to_string(&textcraft::generate(&cfg, 4)).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    let w = textcraft::generate(&cfg, 3);
    let t1 = serde_json::to_string(&textcraft::synthesize(&w, Band::Medium, 20, false, 9)).unwrap();
    let t2 = serde_json::to_string(&textcraft::synthesize(&w, Band::Medium, 20, false, 9)).unwrap();
    assert_eq!(t1, t2);
}

#[test]
fn full_world_follows_the_generation_rules() {
    let w = textcraft::generate(&SynthConfig::full(), 11);
    let mut per_tier_domain: BTreeMap<(u32, String), usize> = BTreeMap::new();
    for it in &w.items {
        let dom = it.name.split(' ').next().unwrap().to_string();
        *per_tier_domain.entry((it.tier, dom.clone())).or_default() += 1;
        if it.tier == 0 {
            assert!(it.is_base());
            continue;
        }
        let r = &it.recipes[0];
        let tiers: Vec<u32> = r.ingredients.iter().map(|(i, _)| w.item(*i).tier).collect();
        assert!(tiers.contains(&(it.tier - 1)), "{} has no ingredient of tier t-1", it.name);
        assert!(tiers.iter().all(|&t| t < it.tier && t + 4 >= it.tier), "{}: {tiers:?}", it.name);
        assert!(r.ingredients.len() <= 6);
        if dom != "X" {
            assert!(r.ingredients.iter().all(|(i, _)| w.item(*i).name.starts_with(&dom)), "same domain");
        }
        for (_, a) in &r.ingredients {
            assert!(if it.tier <= 4 { (1..=2).contains(a) } else { *a == 1 });
        }
        let rc = r.result_count;
        let ok = match it.tier {
            1 => (2..=4).contains(&rc),
            2 => (2..=3).contains(&rc),
            3..=5 => (1..=2).contains(&rc),
            _ => rc == 1,
        };
        assert!(ok, "{} result count {rc}", it.name);
    }
    assert_eq!(per_tier_domain[&(0, "M".into())], 10);
    assert_eq!(per_tier_domain[&(1, "C".into())], 25);
    assert_eq!(per_tier_domain[&(12, "T".into())], 21);
    assert_eq!(per_tier_domain[&(11, "X".into())], 2);
    // 20% of every tier held out.
    for t in 1..=12 {
        let all: Vec<_> = w.items.iter().filter(|i| i.tier == t).collect();
        let held = all.iter().filter(|i| i.held_out).count() as f64;
        assert!((held / all.len() as f64 - 0.2).abs() < 0.02, "tier {t}");
    }
}

#[test]
fn tasks_have_their_band_inventory_rules_and_are_solvable() {
    let w = Arc::new(textcraft::generate(&SynthConfig::full(), 5));
    for band in [Band::Easy, Band::Medium, Band::Hard] {
        for validation in [false, true] {
            for t in textcraft::synthesize(&w, band, 15, validation, 1) {
                let (lo, hi) = w.bands.tiers(band);
                let item = w.item(t.target());
                assert!(item.tier >= lo && item.tier <= hi);
                assert_eq!(item.held_out, validation, "validation targets are exactly the held-out items");
                let count = t.targets[0].1;
                assert!(count >= 1 && count <= if band == Band::Hard { 2 } else { 3 });
                let needs = w.base_needs(t.target(), count);
                for (item, n) in &needs {
                    let have = t.inventory.iter().find(|(i, _)| i == item).unwrap().1 as u64;
                    assert!(have >= *n && have as f64 <= *n as f64 * 1.5 + 1.0, "buffer 0–50%");
                }
                let distractors = t.inventory.iter().filter(|(i, _)| !needs.contains_key(i)).count();
                assert!((1..=3).contains(&distractors));
                assert!(textcraft::is_solvable(&w, &t));
                if band != Band::Hard {
                    // (Hard trees take thousands of flat steps: checked by is_solvable above.)
                    assert_eq!(run_flat(&w, &t, 100_000), 1.0, "the flat expert replays {} to success", t.id);
                }
            }
        }
    }
}

#[test]
fn action_language_roundtrip_and_errors() {
    let w = Arc::new(textcraft::generate(&SynthConfig::small(), 2));
    let lang = Lang::new(&w);
    let item = w.targets(Band::Easy, false)[0];
    for a in [
        Action::Info(item),
        Action::Craft(item, 1),
        Action::Craft(item, 12),
        Action::Inv,
        Action::Finish,
        Action::Spawn(vec![(item, 2), (item + 1, 1)]),
    ] {
        assert_eq!(lang.parse(&lang.encode(&a)), Ok(a.clone()), "{a:?}");
    }
    let task = textcraft::synthesize(&w, Band::Easy, 1, false, 3).remove(0);
    let ep = TextCraftEpisode::new(w.clone(), task.clone());
    let goal = ep.root_goal();
    let obs = |toks: &[Tok]| match ep.step(&goal, toks, true).step {
        Step::Observe(o) => w.vocab.text(&o),
        other => panic!("{other:?}"),
    };
    assert_eq!(obs(&w.vocab.ids("finish craft")), "<obs> err syntax");
    assert_eq!(obs(&w.vocab.ids("craft finish")), "<obs> err unknown");
    assert_eq!(obs(&w.vocab.ids("info M t0")), "<obs> err unknown");
    let base = w.base_items()[0];
    assert_eq!(obs(&lang.encode(&Action::Craft(base, 1))), "<obs> err base");
    assert!(obs(&lang.encode(&Action::Info(base))).starts_with("<obs> base"));
    // Crafting the target before its ingredients exist names what is missing.
    assert!(obs(&lang.encode(&Action::Craft(task.target(), 1))).starts_with("<obs> err need"));
    assert_eq!(obs(&lang.encode(&Action::Spawn(task.target_units()))), "<obs> err self");
    // Flat agents cannot spawn.
    match ep.step(&goal, &lang.encode(&Action::Spawn(vec![(item, 1)])), false).step {
        Step::Observe(o) => assert_eq!(w.vocab.text(&o), "<obs> err syntax"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn verifier_counts_units_crafted_by_the_subtree() {
    let w = Arc::new(textcraft::generate(&SynthConfig::small(), 2));
    let item = w.targets(Band::Easy, false)[0];
    let goal = Lang::new(&w).item_count(item, 2);
    let name = w.item(item).name.clone();
    let made = |n: i64| BTreeMap::from([(name.clone(), n)]);
    assert_eq!(textcraft::verify_goal(&w, &goal, true, None, &made(2)), 1.0);
    assert_eq!(textcraft::verify_goal(&w, &goal, true, None, &made(1)), 0.0, "too few");
    assert_eq!(textcraft::verify_goal(&w, &goal, false, None, &made(3)), 0.0, "did not finish");
    assert_eq!(textcraft::verify_goal(&w, &goal, true, None, &BTreeMap::new()), 0.0);
}

#[test]
fn grammar_accepts_every_expert_action_and_only_well_formed_ones() {
    use rao_envs::grammar::Grammar;
    use rao_envs::rng::Rng;
    let w = Arc::new(textcraft::generate(&SynthConfig::small(), 2));
    let g = textcraft::grammar::TextCraftGrammar::new(&w, 8);
    let lang = Lang::new(&w);
    let accepts = |recursive: bool, toks: &[Tok]| {
        (0..toks.len()).all(|i| g.allowed(recursive, &[], &toks[..i]).contains(&toks[i])) && g.allowed(recursive, &[], toks).contains(&EOS)
    };
    let item = w.targets(Band::Medium, false)[0];
    for a in [
        Action::Info(item),
        Action::Craft(item, 1),
        Action::Craft(item, 17),
        Action::Inv,
        Action::Finish,
        Action::Spawn(vec![(item, 2), (item + 1, 1)]),
    ] {
        assert!(accepts(true, &lang.encode(&a)), "{a:?}");
    }
    assert!(!accepts(false, &lang.encode(&Action::Spawn(vec![(item, 1)]))), "no spawn in flat mode");
    assert!(!accepts(true, &lang.encode(&Action::Craft(item, 100))), "at most two digits");
    // Random walks through the grammar always parse.
    let mut rng = Rng::new(5);
    for _ in 0..500 {
        let mut toks = Vec::new();
        loop {
            let allowed = g.allowed(true, &[], &toks);
            let t = allowed[rng.below(allowed.len())];
            if t == EOS {
                break;
            }
            toks.push(t);
        }
        assert!(lang.parse(&toks).is_ok(), "{}", w.vocab.text(&toks));
    }
}

#[test]
fn shifted_renaming_is_a_permutation_that_keeps_tier_order_and_base_items() {
    let world = textcraft::generate(&SynthConfig::small(), 1);
    let top = world.items.iter().map(|i| i.tier).max().unwrap();
    for shift in 0..=3 {
        let map = world.random_renaming_shifted(&mut rao_envs::rng::Rng::new(shift as u64), shift);
        let mut targets: Vec<_> = map.values().copied().collect();
        targets.sort();
        targets.dedup();
        assert_eq!(targets.len(), world.items.len(), "a permutation: distinct names stay distinct");
        for it in &world.items {
            let to = world.item(map[&it.id]);
            assert_eq!(to.tokens[0], it.tokens[0], "same domain");
            if it.is_base() {
                assert!(to.is_base());
            } else if it.tier + shift <= top {
                assert_eq!(to.tier, it.tier + shift, "{} → {}", it.name, to.name);
            }
        }
    }
    // A demonstration renamed with a shift names tiers no Medium task reaches.
    let rng = &mut rao_envs::rng::Rng::new(9);
    let map = world.random_renaming_shifted(rng, 2);
    let medium_top = world.items.iter().find(|i| i.tier == 5).unwrap();
    assert_eq!(world.item(map[&medium_top.id]).tier, 7);
}

/// A parent whose craft is refused for lack of a craftable ingredient (its child failed, or it
/// never delegated) delegates exactly the shortfall again, then crafts; a flat node, or one at
/// the deepest level allowed to delegate, does not spawn.
#[test]
fn expert_redelegates_what_a_refused_craft_reports_missing() {
    let w = Arc::new(textcraft::generate(&SynthConfig::small(), 1));
    let task = textcraft::synthesize(&w, Band::Medium, 1, false, 5).remove(0);
    let ep = TextCraftEpisode::new(w.clone(), task.clone());
    let lang = Lang::new(&w);
    let goal = ep.root_goal();
    let cfg = ExpertConfig::default();
    // The node crafts its goal before any child made the ingredients: refused.
    let run = |recursive: bool, depth: u32| {
        let mut ctx = ep.prompt(&goal, depth, recursive);
        let craft = lang.encode(&Action::Craft(task.target(), task.targets[0].1 as u64));
        ctx.extend(&craft);
        ctx.push(EOS);
        let Step::Observe(obs) = ep.step(&goal, &craft, recursive).step else { panic!("a refused craft is an observation") };
        ctx.extend(&obs);
        (obs, expert_action(&w, &cfg, &ctx))
    };
    let (obs, action) = run(true, 0);
    assert_eq!(obs[..3], w.vocab.ids("<obs> err need")[..]);
    let ((missing, n), _) = lang.parse_item_count(&obs[3..]).unwrap();
    assert!(!w.item(missing).is_base(), "a Medium target's first shortfall is a crafted ingredient");
    assert_eq!(action, lang.encode(&Action::Spawn(vec![(missing, n)])));
    // Flat, or too deep to delegate: no spawn.
    for (recursive, depth) in [(false, 0), (true, cfg.max_depth)] {
        let (_, action) = run(recursive, depth);
        assert_ne!(action.first(), Some(&w.vocab.id("spawn")), "recursive={recursive} depth={depth}");
    }
}
