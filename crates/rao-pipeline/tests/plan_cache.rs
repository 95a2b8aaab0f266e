//! The plan cache serves exactly what compiling would give, re-reads what compiling reads from
//! disk, and falls back to compiling whenever an entry cannot be used.

use std::path::Path;

use rao_pipeline::{Compiled, Registry, load, load_cached};
use rao_plan::plan_cache::PlanCache;

const PIPELINE: &str = "\
name: cached
seed: 7
params:
  lr: 5.0e-4
  tiny: 1.0e-7
  third: 0.1
stages:
  init: {kind: shell, params: {command: 'cat data.txt > ${outputs.m}/m', deps: [data.txt]}, outputs: [m], timeout: 90s, retries: 2}
  train:
    loop:
      max_iterations: 4
      init: {model: init.m}
      carry: {model: update.m}
      stop_when: {metric: update.loss, below: 0.25}
    stages:
      rollout: {kind: noop, inputs: {m: loop.model}, params: {value: {lr: '${params.lr}', it: '${loop.iteration}'}}, outputs: [t]}
      update: {kind: noop, inputs: {m: loop.model, t: rollout.t}, params: {value: ['${params.tiny}', '${params.third}']}, outputs: [m]}
      probe: {kind: noop, inputs: {m: update.m}, every: 2}
  eval:
    kind: noop
    matrix: {band: [easy, hard]}
    params: {value: {band: '${matrix.band}', temperature: 0.7}}
    inputs: {m: train.model}
    resources: {gpu: 1}
";

/// Everything a run uses from a plan, fingerprints included (given stand-in upstream ones).
fn summary(c: &Compiled) -> String {
    let fps: Vec<String> = (0..c.instances.len())
        .map(|i| match c.fp_parts(i, |p| Some(format!("fp{p}")), |_| Some(2)) {
            Some(parts) => format!("{parts:?}"),
            None => "unknown".into(),
        })
        .collect();
    format!("{c:?}\n{fps:?}")
}

fn entries(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir).map(|r| r.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "msgpack"));
    v.sort();
    v
}

struct Setup {
    _tmp: tempfile::TempDir,
    file: std::path::PathBuf,
    cache_dir: std::path::PathBuf,
    registry: Registry,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("data.txt"), "first").unwrap();
    let file = tmp.path().join("p.yaml");
    std::fs::write(&file, PIPELINE).unwrap();
    let cache_dir = tmp.path().join("cache");
    Setup { file, cache_dir, registry: Registry::with_builtins(), _tmp: tmp }
}

#[test]
fn a_hit_equals_a_fresh_compile_floats_and_fingerprints_included() {
    let s = setup();
    let cache = PlanCache::new(&s.cache_dir);
    let set = vec!["params.third=0.30000000000000004".to_string()];
    let fresh = load(&s.file, &set, &s.registry).unwrap();
    let miss = load_cached(&s.file, &set, &s.registry, Some(&cache)).unwrap();
    assert_eq!(entries(&s.cache_dir).len(), 1, "a miss writes one entry");
    let hit = load_cached(&s.file, &set, &s.registry, Some(&cache)).unwrap();
    assert_eq!(summary(&fresh), summary(&miss));
    assert_eq!(summary(&fresh), summary(&hit));
    assert_eq!(hit.order, fresh.order);
    assert_eq!(hit.graph.edge_count(), fresh.graph.edge_count());
    assert_eq!(hit.instances[hit.instance_index("rollout@1").unwrap()].params["value"]["lr"], serde_json::json!(5.0e-4));
    // Other overrides are another entry.
    load_cached(&s.file, &[], &s.registry, Some(&cache)).unwrap();
    assert_eq!(entries(&s.cache_dir).len(), 2);
}

#[test]
fn a_hit_is_read_from_the_entry() {
    let s = setup();
    let cache = PlanCache::new(&s.cache_dir);
    load_cached(&s.file, &[], &s.registry, Some(&cache)).unwrap();
    let entry = entries(&s.cache_dir).pop().unwrap();
    // Rewrite the entry with a different name: a hit must return it.
    let mut plan: Compiled = rmp_serde::from_slice(&std::fs::read(&entry).unwrap()).unwrap();
    plan.name = "from-the-cache".into();
    std::fs::write(&entry, rmp_serde::to_vec_named(&plan).unwrap()).unwrap();
    assert_eq!(load_cached(&s.file, &[], &s.registry, Some(&cache)).unwrap().name, "from-the-cache");
    // A changed file is another key, compiled afresh.
    std::fs::write(&s.file, PIPELINE.replace("seed: 7", "seed: 8")).unwrap();
    let changed = load_cached(&s.file, &[], &s.registry, Some(&cache)).unwrap();
    assert_eq!((changed.name.as_str(), changed.seed), ("cached", 8));
}

#[test]
fn a_hit_hashes_the_files_stages_read_again() {
    let s = setup();
    let cache = PlanCache::new(&s.cache_dir);
    let before = load_cached(&s.file, &[], &s.registry, Some(&cache)).unwrap();
    std::fs::write(s.file.parent().unwrap().join("data.txt"), "second").unwrap();
    let hit = load_cached(&s.file, &[], &s.registry, Some(&cache)).unwrap();
    let fresh = load(&s.file, &[], &s.registry).unwrap();
    let extra = |c: &Compiled| c.instances[c.instance_index("init").unwrap()].extra.clone();
    assert_ne!(extra(&before), extra(&hit), "the dependency's new content is in the fingerprint");
    assert_eq!(summary(&hit), summary(&fresh));
    // A dependency that is gone: the hit is refused and compiling reports it where it is written.
    std::fs::remove_file(s.file.parent().unwrap().join("data.txt")).unwrap();
    let err = load_cached(&s.file, &[], &s.registry, Some(&cache)).unwrap_err().to_string();
    assert!(err.contains("data.txt") && err.contains(":8:"), "{err}");
}

#[test]
fn a_damaged_or_foreign_entry_is_a_miss() {
    let s = setup();
    let cache = PlanCache::new(&s.cache_dir);
    let fresh = load(&s.file, &[], &s.registry).unwrap();
    load_cached(&s.file, &[], &s.registry, Some(&cache)).unwrap();
    let entry = entries(&s.cache_dir).pop().unwrap();
    let bytes = std::fs::read(&entry).unwrap();
    for damaged in [bytes[..bytes.len() / 2].to_vec(), Vec::new(), b"not msgpack at all".to_vec()] {
        std::fs::write(&entry, &damaged).unwrap();
        let c = load_cached(&s.file, &[], &s.registry, Some(&cache)).unwrap();
        assert_eq!(summary(&c), summary(&fresh));
        // The miss wrote a whole entry back.
        assert_eq!(std::fs::read(&entry).unwrap(), bytes);
    }
    // An entry naming a kind this registry lacks is not used.
    let mut plan: Compiled = rmp_serde::from_slice(&bytes).unwrap();
    plan.instances[0].kind = "no-such-kind".into();
    std::fs::write(&entry, rmp_serde::to_vec_named(&plan).unwrap()).unwrap();
    assert_eq!(summary(&load_cached(&s.file, &[], &s.registry, Some(&cache)).unwrap()), summary(&fresh));
}

#[test]
fn variants_and_unwritable_caches_compile_as_before() {
    let s = setup();
    let dir = s.file.parent().unwrap();
    std::fs::write(dir.join("v.yaml"), "extends: p.yaml\nname: cached-variant\nset:\n  seed: 9\n").unwrap();
    let cache = PlanCache::new(&s.cache_dir);
    let v = load_cached(&dir.join("v.yaml"), &[], &s.registry, Some(&cache)).unwrap();
    assert_eq!((v.name.as_str(), v.seed), ("cached-variant", 9));
    assert!(entries(&s.cache_dir).is_empty(), "variants are not cached");
    // A cache folder that cannot be made (a file is in the way): compiling still works.
    std::fs::write(dir.join("blocked"), "").unwrap();
    let blocked = PlanCache::new(dir.join("blocked").join("plans"));
    assert_eq!(load_cached(&s.file, &[], &s.registry, Some(&blocked)).unwrap().name, "cached");
}
