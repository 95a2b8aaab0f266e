//! The kinds' code versions are conservative: editing any file a kind's module compiles — reached
//! by a path, a nested `use` group, `super::` chains, an item of the crate root, a macro or an
//! included file — changes that kind's version; editing a module it does not reach does not.
//! Run on small crates made for each case, with the very code build.rs runs.

#[path = "../build/code_versions.rs"]
mod code_versions;

use std::path::Path;

/// A workspace folder with crate `demo` holding `files` (paths under `crates/`).
fn workspace(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let p = dir.path().join("crates").join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

fn version(dir: &Path, module: &str) -> String {
    let crates = dir.join("crates");
    let (versions, _) = code_versions::versions(&crates.join("demo/src"), &crates, "");
    versions.get(module).cloned().unwrap_or_else(|| panic!("no version for module {module}: {versions:?}"))
}

/// Whether appending a comment to `edited` changes module `kind`'s version.
fn edit_changes(files: &[(&str, &str)], kind: &str, edited: &str) -> bool {
    let dir = workspace(files);
    let before = version(dir.path(), kind);
    let path = dir.path().join("crates").join(edited);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("\n// edited\n");
    std::fs::write(&path, text).unwrap();
    before != version(dir.path(), kind)
}

const LIB: (&str, &str) = ("demo/src/lib.rs", "pub mod kind;\npub mod helper;\npub mod other;\n");
const HELPER: (&str, &str) = ("demo/src/helper.rs", "pub fn f() -> u32 { 1 }\npub mod inner { pub fn g() {} }\n");
const OTHER: (&str, &str) = ("demo/src/other.rs", "pub fn unrelated() {}\n");

#[test]
fn a_module_reached_by_a_path_is_part_of_the_version() {
    let kind = ("demo/src/kind.rs", "pub fn run() -> u32 { crate::helper::f() }\n");
    assert!(edit_changes(&[LIB, HELPER, OTHER, kind], "kind", "demo/src/helper.rs"));
    assert!(edit_changes(&[LIB, HELPER, OTHER, kind], "kind", "demo/src/kind.rs"));
    assert!(!edit_changes(&[LIB, HELPER, OTHER, kind], "kind", "demo/src/other.rs"), "a module it does not reach");
}

#[test]
fn a_module_named_inside_a_nested_use_group_is_part_of_the_version() {
    let kind = ("demo/src/kind.rs", "use crate::{other::unrelated as _u, helper::{f, inner::g}};\npub fn run() -> u32 { g(); f() }\n");
    assert!(edit_changes(&[LIB, HELPER, OTHER, kind], "kind", "demo/src/helper.rs"));
    // After a nested group: a scan that stops at the first `}` misses it.
    let after_nested = ("demo/src/kind.rs", "use crate::{other::{unrelated}, helper::f};\npub fn run() -> u32 { unrelated(); f() }\n");
    assert!(edit_changes(&[LIB, HELPER, OTHER, after_nested], "kind", "demo/src/helper.rs"));
}

#[test]
fn a_module_reached_through_super_is_part_of_the_version() {
    let lib = ("demo/src/lib.rs", "pub mod kind;\npub mod helper;\n");
    let kind = ("demo/src/kind/mod.rs", "pub mod step;\n");
    let step = ("demo/src/kind/step.rs", "pub fn run() -> u32 { super::super::helper::f() }\n");
    assert!(edit_changes(&[lib, HELPER, kind, step], "kind", "demo/src/helper.rs"));
}

#[test]
fn an_item_of_the_crate_root_makes_every_module_part_of_the_version() {
    let lib = ("demo/src/lib.rs", "pub mod kind;\npub mod helper;\npub mod other;\npub use helper::f as root_f;\n");
    let kind = ("demo/src/kind.rs", "pub fn run() -> u32 { crate::root_f() }\n");
    assert!(edit_changes(&[lib, HELPER, OTHER, kind], "kind", "demo/src/helper.rs"));
}

#[test]
fn a_macro_makes_its_module_part_of_every_version() {
    let lib = ("demo/src/lib.rs", "#[macro_use]\nmod macros;\npub mod kind;\n");
    let macros = ("demo/src/macros.rs", "macro_rules! one { () => { 1 } }\n");
    let kind = ("demo/src/kind.rs", "pub fn run() -> u32 { one!() }\n");
    assert!(edit_changes(&[lib, macros, kind], "kind", "demo/src/macros.rs"));
}

#[test]
fn an_included_file_is_part_of_the_version() {
    let kind = ("demo/src/kind.rs", "pub const TABLE: &str = include_str!(\"../data/table.txt\");\n");
    let table = ("demo/data/table.txt", "a 1\n");
    assert!(edit_changes(&[LIB, HELPER, OTHER, kind, table], "kind", "demo/data/table.txt"));
}

#[test]
fn a_workspace_crate_used_is_part_of_the_version_and_the_orchestration_is_not() {
    let kind = ("demo/src/kind.rs", "pub fn run() { rao_core::f(); rao_pipeline::g(); }\n");
    let core = ("rao-core/src/lib.rs", "pub fn f() {}\n");
    let pipeline = ("rao-pipeline/src/lib.rs", "pub fn g() {}\n");
    assert!(edit_changes(&[LIB, HELPER, OTHER, kind, core, pipeline], "kind", "rao-core/src/lib.rs"));
    assert!(!edit_changes(&[LIB, HELPER, OTHER, kind, core, pipeline], "kind", "rao-pipeline/src/lib.rs"));
}

/// This crate's own kinds: the versions build.rs wrote are the ones the scan gives now.
#[test]
fn the_built_versions_are_the_scan_of_this_crate() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let crates = here.parent().unwrap();
    let lock = std::fs::read_to_string(crates.parent().unwrap().join("Cargo.lock")).unwrap();
    let (versions, _) = code_versions::versions(&here.join("src"), crates, &lock);
    for (module, version) in &versions {
        assert_eq!(rao_stages::code::of(module), version, "module {module}");
    }
    assert!(versions.contains_key("rollout") && versions.contains_key("update"));
}
