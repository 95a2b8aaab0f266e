//! Something other than a file where an object's `MANIFEST.json` should be (`rm M && mkdir M`):
//! damage of that one object, like a manifest of garbage bytes. It once wedged the store: every
//! run of a pipeline holding the instance failed with a store error, `verify` saw nothing and
//! `gc` stopped on it.

use std::path::{Path, PathBuf};

use crate::support::chain::*;

/// How many times each of a, b, c ran.
fn runs(dir: &Path) -> [usize; 3] {
    let log = std::fs::read_to_string(dir.join("ran.log")).unwrap_or_default();
    ["a", "b", "c"].map(|s| log.lines().filter(|l| *l == s).count())
}

/// Replace the manifest of `fp` by a folder (holding `inside`, if given); its path.
fn folder_for_manifest(dir: &Path, fp: &str, inside: Option<&str>) -> PathBuf {
    let manifest = object_dir(dir, fp).join("MANIFEST.json");
    std::fs::remove_file(&manifest).unwrap();
    std::fs::create_dir(&manifest).unwrap();
    if let Some(name) = inside {
        std::fs::write(manifest.join(name), b"x").unwrap();
    }
    manifest
}

fn quarantined(dir: &Path) -> usize {
    std::fs::read_dir(dir.join(".rao/store/quarantine")).map_or(0, |d| d.count())
}

#[test]
fn a_run_sets_a_folder_in_place_of_a_manifest_aside_and_recomputes_only_that_instance() {
    let dir = chain_done();
    let b = fingerprint(dir.path(), "b");
    let manifest = folder_for_manifest(dir.path(), &b, None);

    let status = rao(&["status", "p.yaml"], dir.path());
    assert!(status.status.success(), "{}", text(&status));
    assert!(text(&status).contains("stale    b") && text(&status).contains("not a regular file"), "{}", text(&status));

    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("DAMAGED  b") && text(&o).contains("not a regular file"), "{}", text(&o));
    assert_eq!(runs(dir.path()), [1, 2, 1], "b recomputed in the same run, nothing else: {}", text(&o));
    assert!(manifest.is_file(), "b's manifest is written again");
    assert_eq!(quarantined(dir.path()), 1, "a note says what was set aside");

    // Done now: the next run computes nothing and the store is clean.
    let again = rao(&["run", "p.yaml"], dir.path());
    assert!(again.status.success(), "{}", text(&again));
    assert_eq!(runs(dir.path()), [1, 2, 1]);
    let v = rao(&["verify", "p.yaml"], dir.path());
    assert!(v.status.success() && text(&v).contains("0 damaged"), "{}", text(&v));
}

/// One level up: a file where the object's folder should be.
#[test]
fn a_run_replaces_a_file_in_place_of_an_object_folder_and_recomputes_only_that_instance() {
    let dir = chain_done();
    let b = fingerprint(dir.path(), "b");
    let object = object_dir(dir.path(), &b);
    std::fs::remove_dir_all(&object).unwrap();
    std::fs::write(&object, b"not a folder").unwrap();

    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(runs(dir.path()), [1, 2, 1], "b recomputed in the same run, nothing else: {}", text(&o));
    assert!(object.join("MANIFEST.json").is_file(), "b's object is a folder again");
    let v = rao(&["verify", "p.yaml"], dir.path());
    assert!(v.status.success() && text(&v).contains("0 damaged"), "{}", text(&v));
}

#[test]
fn verify_reports_a_folder_in_place_of_a_manifest_and_repair_removes_only_that_folder() {
    let dir = chain_done();
    let b = fingerprint(dir.path(), "b");
    let out = output_file(dir.path(), &b);
    // With a file in it: such a folder is listed as if it were one of the object's attempts.
    let manifest = folder_for_manifest(dir.path(), &b, Some("x"));

    let v = rao(&["verify", "--store", ".rao/store"], dir.path());
    assert_eq!(v.status.code(), Some(1), "{}", text(&v));
    assert!(text(&v).contains(&format!("DAMAGED {b}")) && text(&v).contains("not a regular file"), "{}", text(&v));
    assert!(text(&v).contains("3 manifests") && text(&v).contains("1 damaged"), "{}", text(&v));
    assert!(manifest.join("x").exists(), "verify without --repair changed the store");

    let r = rao(&["verify", "--store", ".rao/store", "--repair"], dir.path());
    assert!(r.status.success(), "{}", text(&r));
    assert!(text(&r).contains("1 damaged, 1 set aside"), "{}", text(&r));
    assert!(!manifest.exists(), "the folder in the manifest's place is removed");
    assert!(out.is_file(), "the rest of the object stays: {}", out.display());
    assert_eq!(quarantined(dir.path()), 1);

    let v = rao(&["verify", "--store", ".rao/store"], dir.path());
    assert!(v.status.success() && text(&v).contains("2 manifests") && text(&v).contains("0 damaged"), "{}", text(&v));
    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(runs(dir.path()), [1, 2, 1], "{}", text(&o));
}

#[test]
fn gc_goes_on_past_a_folder_in_place_of_a_manifest_keeping_the_object_a_pipeline_wants() {
    let dir = chain_done();
    let old_c = edit_c(dir.path());
    assert!(rao(&["run", "p.yaml"], dir.path()).status.success());
    // b is still what p.yaml names; old c no longer is.
    let b = fingerprint(dir.path(), "b");
    let b_out = output_file(dir.path(), &b);
    let b_manifest = folder_for_manifest(dir.path(), &b, None);
    folder_for_manifest(dir.path(), &old_c, None);

    let dry = rao(&["gc", "p.yaml", "--min-age", "0"], dir.path());
    assert!(dry.status.success(), "{}", text(&dry));
    assert!(text(&dry).contains(&format!("would remove objects/{}/{old_c}/MANIFEST.json", &old_c[..2])), "{}", text(&dry));
    assert!(!text(&dry).contains(&b), "b's attempt is kept, as under a manifest of garbage: {}", text(&dry));

    let gc = rao(&["gc", "p.yaml", "--delete", "--min-age", "0"], dir.path());
    assert!(gc.status.success(), "gc stopped on one damaged object: {}", text(&gc));
    assert!(!text(&gc).contains("stopped"), "{}", text(&gc));
    assert!(!object_dir(dir.path(), &old_c).exists(), "an object no pipeline wants goes whole: {}", text(&gc));
    assert!(b_out.is_file() && b_manifest.is_dir(), "gc sets nothing aside: that is verify's and run's: {}", text(&gc));

    // The run then repairs b; a second gc finds nothing to remove.
    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(runs(dir.path()), [1, 2, 2], "{}", text(&o));
    // Set aside, b's manifest names the new attempt: the old one is an orphan now, and goes.
    let gc = rao(&["gc", "p.yaml", "--delete", "--min-age", "0"], dir.path());
    assert!(gc.status.success(), "{}", text(&gc));
    assert!(!b_out.exists(), "{}", text(&gc));
}

/// A manifest whose files are not at their recorded sizes: `status` and `plan` say what `run`
/// will find (damaged, so it runs again), not done.
#[test]
fn status_and_plan_see_an_output_of_the_wrong_size_as_the_run_does() {
    let dir = chain_done();
    let b = fingerprint(dir.path(), "b");
    let file = walk(&object_dir(dir.path(), &b)).into_iter().find(|p| p.file_name().is_some_and(|n| n == "v")).expect("b's output file");
    std::fs::write(&file, b"short").unwrap();

    let status = text(&rao(&["status", "p.yaml"], dir.path()));
    assert!(status.contains("stale    b") && status.contains("has 5 bytes"), "{status}");
    assert!(status.contains("done     c"), "c's inputs are named by fingerprint, so c is still done:\n{status}");
    let plan = text(&rao(&["plan", "p.yaml"], dir.path()));
    assert!(plan.lines().any(|l| l.contains("will run") && l.contains(" b ")), "{plan}");

    let o = rao(&["run", "p.yaml"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("DAMAGED  b") && text(&o).contains("has 5 bytes"), "{}", text(&o));
    assert_eq!(runs(dir.path()), [1, 2, 1], "{}", text(&o));
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}
