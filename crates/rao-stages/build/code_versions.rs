//! Code versions of the stage kinds (see rao-plan's `fingerprint.rs`): what build.rs computes,
//! in a module of its own so that a test can run it on crates made for the purpose.
//!
//! A kind's code is the module that implements it, every module of this crate it reaches, the
//! sources of the workspace crates those modules use (with their own workspace dependencies;
//! not the orchestration crates, which do not compute a kind's outputs), and the name and
//! version of every third-party package in those crates' dependency closure (from Cargo.lock).
//!
//! Which modules a module reaches is read from its text: `crate::x`, `super::x`, `use
//! crate::{x, y::{…}}`. Where the text does not show it — an item of the crate root, a macro,
//! a file included or a module at a `#[path]` — the module is taken to reach every module:
//! when in doubt, hash more, never less (a missed edge would serve a stale artifact as current).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Crates of the orchestration: they run kinds, they do not compute their outputs.
const ORCHESTRATION: [&str; 3] = ["rao-pipeline", "rao-plan", "rao-store"];

/// Items of the crate root a module may name without reaching other modules: the generated
/// table of code versions.
const ROOT_ITEMS: [&str; 1] = ["code"];

/// One top-level module: its files, the modules it names, the `rao_*` crates it uses, and
/// whether its text hides what it reaches.
#[derive(Default)]
struct Module {
    files: Vec<PathBuf>,
    /// Files it includes (`include_str!("…")`), named as written from the including file's folder.
    included: Vec<(String, PathBuf)>,
    names: BTreeSet<String>,
    crates: BTreeSet<String>,
    opaque: bool,
}

/// Module name → code version, and the folders whose changes must re-run the computation.
pub fn versions(src: &Path, crates_dir: &Path, lock_text: &str) -> (BTreeMap<String, String>, Vec<PathBuf>) {
    let lock = parse_lock(lock_text);
    let mut modules: BTreeMap<String, Module> = BTreeMap::new();
    for file in rust_files(src) {
        let rel = file.strip_prefix(src).unwrap().to_string_lossy().replace('\\', "/");
        let module = rel.trim_end_matches(".rs").trim_end_matches("/mod").split('/').next().unwrap().to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        let entry = modules.entry(module).or_default();
        entry.files.push(file.clone());
        // Edges are read from the code a build compiles (test modules left out); the hash
        // covers the whole files.
        let code = without_test_modules(&text);
        let depth = rel.trim_end_matches("/mod.rs").split('/').count();
        entry.names.extend(words_after(&code, "crate::"));
        entry.names.extend(root_names_through_super(&code, depth));
        entry.crates.extend(words_after(&text, "rao_").into_iter().map(|w| format!("rao-{}", w.replace('_', "-"))));
        for (literal, path) in included_files(&text, &file) {
            entry.included.push((format!("{rel} includes {literal}"), path));
        }
        // What the text cannot show: a file included by a computed name, a module elsewhere.
        let literal_only = |mac: &str| text.matches(&format!("{mac}(")).count() == text.matches(&format!("{mac}(\"")).count();
        let computed_include = text.contains("include!(") || !literal_only("include_str!") || !literal_only("include_bytes!");
        entry.opaque |= computed_include || text.contains("#[path");
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    // A macro is used by name alone: every module may reach the one that defines it.
    let macro_homes: BTreeSet<String> = modules
        .iter()
        .filter(|(_, m)| m.files.iter().any(|f| std::fs::read_to_string(f).unwrap_or_default().contains("macro_rules!")))
        .map(|(n, _)| n.clone())
        .collect();
    for m in modules.values_mut() {
        let unknown = m.names.iter().any(|n| !names.contains(n) && !ROOT_ITEMS.contains(&n.as_str()));
        m.opaque |= unknown;
        m.names.extend(macro_homes.iter().cloned());
    }
    let mut watched = vec![src.to_path_buf()];
    let mut out = BTreeMap::new();
    for module in names.iter().filter(|m| *m != "lib") {
        // Modules reached from this one (all of them once one on the way is opaque).
        let mut reached = BTreeSet::from([module.clone()]);
        let mut stack = vec![module.clone()];
        while let Some(m) = stack.pop() {
            let next: Vec<String> = match modules[&m].opaque {
                true => names.iter().cloned().collect(),
                false => modules[&m].names.iter().filter(|n| names.contains(*n)).cloned().collect(),
            };
            for n in next {
                if reached.insert(n.clone()) {
                    stack.push(n);
                }
            }
        }
        let mut h = blake3::Hasher::new();
        let mut crates = BTreeSet::new();
        for m in &reached {
            for f in &modules[m].files {
                hash_file(&mut h, src, f);
            }
            for (name, path) in &modules[m].included {
                field(&mut h, name.as_bytes());
                // A file that cannot be read is hashed as its error: the build fails on it anyway.
                field(&mut h, &std::fs::read(path).unwrap_or_else(|e| e.to_string().into_bytes()));
                if let Some(dir) = path.parent() {
                    watched.push(dir.to_path_buf());
                }
            }
            crates
                .extend(modules[m].crates.iter().filter(|c| !ORCHESTRATION.contains(&c.as_str()) && crates_dir.join(c).is_dir()).cloned());
        }
        // Workspace crates those modules use, with their own workspace dependencies.
        let mut stack: Vec<String> = crates.iter().cloned().collect();
        while let Some(c) = stack.pop() {
            for dep in lock.get(&c).map(|p| p.1.clone()).unwrap_or_default() {
                if crates_dir.join(&dep).is_dir() && !ORCHESTRATION.contains(&dep.as_str()) && crates.insert(dep.clone()) {
                    stack.push(dep);
                }
            }
        }
        for c in &crates {
            let dir = crates_dir.join(c).join("src");
            watched.push(dir.clone());
            for f in rust_files(&dir) {
                hash_file(&mut h, crates_dir, &f);
            }
        }
        // Third-party packages in their dependency closure, by name and version.
        for package in third_party_closure(&lock, &crates, crates_dir) {
            field(&mut h, package.as_bytes());
        }
        out.insert(module.clone(), h.finalize().to_hex()[..16].to_string());
    }
    watched.sort();
    watched.dedup();
    (out, watched)
}

/// `include_str!("x")` and `include_bytes!("x")` of `file`: the literal and the path it names.
fn included_files(text: &str, file: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for mac in ["include_str!(\"", "include_bytes!(\""] {
        for (i, _) in text.match_indices(mac) {
            if let Some(literal) = text[i + mac.len()..].split('"').next() {
                out.push((literal.to_string(), file.parent().unwrap_or(Path::new(".")).join(literal)));
            }
        }
    }
    out
}

/// `text` without its `#[cfg(test)] mod … { … }` blocks (a kind's build does not compile them).
fn without_test_modules(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("#[cfg(test)]") {
        let after = rest[i + "#[cfg(test)]".len()..].trim_start();
        let block = after.strip_prefix("mod ").and_then(|m| {
            let open = m.find(['{', ';'])?;
            (m.as_bytes()[open] == b'{').then_some(())?;
            let start = rest.len() - m.len() + open;
            let mut depth = 0usize;
            for (j, c) in rest[start..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(start + j + 1);
                        }
                    }
                    _ => {}
                }
            }
            None
        });
        match block {
            Some(end) => {
                out.push_str(&rest[..i]);
                rest = &rest[end..];
            }
            None => {
                out.push_str(&rest[..i + 1]);
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Names of the crate root reached through `super::` chains from a file `depth` modules deep
/// (`src/x.rs`: 1, `src/x/y.rs`: 2): `super::super::helper` from depth 2 names `helper`. A
/// chain that stays inside the file's own top-level module names nothing new.
fn root_names_through_super(text: &str, depth: usize) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("super::") {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut rest = &text[i..];
        let mut ups = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            ups += 1;
            rest = r;
        }
        if ups >= depth {
            out.extend(words_after(&format!("crate::{rest}"), "crate::"));
        }
    }
    out
}

/// Length-prefixed, so file boundaries cannot shift.
fn field(h: &mut blake3::Hasher, bytes: &[u8]) {
    h.update(&(bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

fn hash_file(h: &mut blake3::Hasher, base: &Path, file: &Path) {
    field(h, file.strip_prefix(base).unwrap_or(file).to_string_lossy().replace('\\', "/").as_bytes());
    field(h, &std::fs::read(file).unwrap());
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Identifiers that follow `prefix` in `text` (`crate::rollout::x` → `rollout`), including the
/// first name of each path in a `use crate::{a, b::{c, d}}` group (`a`, `b`).
fn words_after(text: &str, prefix: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String { s.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices(prefix) {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &text[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level entries of the group: split at commas outside nested braces.
            let (mut depth, mut start) = (0usize, 0usize);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.insert(ident(&group[start..j]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(&group[start..j]));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.remove("");
    out
}

/// Cargo.lock as name → (versions, dependency names).
fn parse_lock(text: &str) -> BTreeMap<String, (Vec<String>, Vec<String>)> {
    let mut out: BTreeMap<String, (Vec<String>, Vec<String>)> = BTreeMap::new();
    for block in text.split("[[package]]").skip(1) {
        let value =
            |key: &str| block.lines().find_map(|l| l.strip_prefix(&format!("{key} = \""))).map(|v| v.trim_end_matches('"').to_string());
        let (Some(name), Some(version)) = (value("name"), value("version")) else { continue };
        let deps: Vec<String> = match block.split_once("dependencies = [") {
            Some((_, rest)) => rest
                .split(']')
                .next()
                .unwrap_or("")
                .lines()
                .filter_map(|l| {
                    l.trim()
                        .trim_end_matches(',')
                        .strip_prefix('"')
                        .map(|d| d.trim_end_matches('"').split(' ').next().unwrap_or("").to_string())
                })
                .collect(),
            None => Vec::new(),
        };
        let entry = out.entry(name).or_default();
        entry.0.push(version);
        entry.1.extend(deps);
    }
    out
}

fn third_party_closure(
    lock: &BTreeMap<String, (Vec<String>, Vec<String>)>,
    roots: &BTreeSet<String>,
    crates_dir: &Path,
) -> BTreeSet<String> {
    let mut seen: BTreeSet<String> = roots.clone();
    let mut stack: Vec<String> = roots.iter().cloned().collect();
    let mut out = BTreeSet::new();
    while let Some(name) = stack.pop() {
        let Some((versions, deps)) = lock.get(&name) else { continue };
        if !crates_dir.join(&name).is_dir() {
            for v in versions {
                out.insert(format!("{name} {v}"));
            }
        }
        for d in deps {
            if seen.insert(d.clone()) {
                stack.push(d.clone());
            }
        }
    }
    out
}
