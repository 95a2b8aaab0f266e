//! Staging: where a stage's outputs are written before they are published, named so that
//! whose they are (machine, process) can be read off the name.

use std::path::{Path, PathBuf};

use crate::store::Store;

/// Where a stage writes output `name` before it is published: a sibling of the other outputs'
/// (no parent directory to create and delete: new inodes are most of a small stage's cost).
pub fn staged_output(staging: &Path, name: &str) -> PathBuf {
    let mut path = staging.as_os_str().to_owned();
    path.push(".");
    path.push(name);
    PathBuf::from(path)
}

/// A short tag of the processes this one can see — the machine's name and its PID namespace
/// (containers may share a name, not their processes) — so that only staging whose owner is
/// known to be gone is removed.
pub fn host_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let seen_from = format!("{}\0{}", crate::lease::host_name(), crate::lease::pid_space());
        blake3::hash(seen_from.as_bytes()).to_hex()[..8].to_string()
    })
}

/// `<fp>.<host>.<pid>.<attempt>`: whose it is can be read off the name.
pub fn staging_dir(store: &Store, fp: &str, attempt: u32) -> PathBuf {
    let name = format!("{fp}.{}.{}.{attempt}", host_tag(), std::process::id());
    match store.local_root() {
        // Same filesystem as the objects: publishing is a rename.
        Some(root) => root.join("staging").join(name),
        None => std::env::temp_dir().join("rao-staging").join(name),
    }
}

/// The process that owns a staging entry, if it is one of this machine's.
pub fn staging_owner(entry_name: &str) -> Option<u32> {
    let mut parts = entry_name.split('.');
    let (_fp, host, pid) = (parts.next()?, parts.next()?, parts.next()?);
    (host == host_tag()).then(|| pid.parse().ok()).flatten()
}
