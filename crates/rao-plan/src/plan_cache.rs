//! Compiled plans kept between commands, so a command on a pipeline file that has not changed
//! skips parsing, checking and expanding it — most of the time of a fully cached `rao run`.
//!
//! An entry is keyed by everything compilation reads: the file's bytes, its label and the folder
//! it resolves paths against, the `--set` overrides, every kind the registry knows (name, version,
//! code version) and the compiler itself (the running executable's path, size, modification time
//! and inode). Files a stage's fingerprint hashes (`fingerprint_extra`: a shell stage's `deps`, a
//! local dataset) are read again on every hit and the machine profile is recomputed, so a hit
//! never carries a stale fingerprint. Variants (`extends`) are compiled every time: their key
//! would need the files they extend, which takes a parse to find. An entry that cannot be read
//! or decoded is a miss; writing one is best effort (a read-only cache only costs speed).
//!
//! Entries are MessagePack, not JSON: params hold floats, and serde_json's default parser may return a
//! float one unit off, which would change a fingerprint.
//!
//! The entries live outside any store, in the user's cache folder (`PlanCache::from_env`), so
//! read-only commands still create nothing next to the pipeline file or in a bucket.

use std::path::{Path, PathBuf};

use crate::compile::Compiled;
use crate::kind::Kinds;

/// Entries kept; the oldest beyond this, or beyond `MAX_TOTAL_BYTES` together, are removed when
/// one is written.
const MAX_ENTRIES: usize = 128;
const MAX_TOTAL_BYTES: u64 = 256 << 20;
/// A plan larger than this is not written: reading it back would save little over compiling.
const MAX_WRITTEN_BYTES: usize = 64 << 20;
/// Entries larger than this are not read (rao writes them; the bound keeps a damaged one harmless).
const MAX_ENTRY_BYTES: u64 = 512 << 20;
/// Bumped when the entry format changes (the executable's identity covers code changes).
const FORMAT: &str = "rao-plan-cache-msgpack-1";

pub struct PlanCache {
    dir: PathBuf,
}

impl PlanCache {
    /// A cache whose entries live in `dir` (created when the first entry is written).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        PlanCache { dir: dir.into() }
    }

    /// The user's cache: `$RAO_CACHE_DIR/plans`, else `$XDG_CACHE_HOME/rao/plans`, else
    /// `$HOME/.cache/rao/plans`; none with `RAO_PLAN_CACHE=off` or without any of those.
    pub fn from_env() -> Option<Self> {
        if std::env::var("RAO_PLAN_CACHE").is_ok_and(|v| v == "off" || v == "0") {
            return None;
        }
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let root = var("RAO_CACHE_DIR")
            .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("rao")))
            .or_else(|| var("HOME").map(|d| d.join(".cache").join("rao")))?;
        Some(PlanCache::new(root.join("plans")))
    }

    /// The entry's key, or `None` when the executable cannot be identified (then nothing is cached).
    pub(crate) fn key(label: &str, text: &str, base_dir: &Path, overrides: &[String], registry: &dyn Kinds) -> Option<String> {
        let mut h = blake3::Hasher::new();
        let mut field = |bytes: &[u8]| {
            h.update(&(bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(FORMAT.as_bytes());
        field(executable_identity()?.as_bytes());
        field(label.as_bytes());
        field(base_dir.as_os_str().as_encoded_bytes());
        field(text.as_bytes());
        field(&(overrides.len() as u64).to_le_bytes());
        for o in overrides {
            field(o.as_bytes());
        }
        for name in registry.names() {
            let kind = registry.kind(name)?;
            field(name.as_bytes());
            field(&kind.version().to_le_bytes());
            field(kind.code_version().as_bytes());
        }
        Some(h.finalize().to_hex().to_string())
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.msgpack"))
    }

    /// The plan stored under `key`, with its disk-dependent parts read again; `None` on any
    /// problem (the caller compiles, which reports problems where they are).
    pub(crate) fn get(&self, key: &str, registry: &dyn Kinds) -> Option<Compiled> {
        let path = self.path(key);
        if std::fs::metadata(&path).ok()?.len() > MAX_ENTRY_BYTES {
            return None;
        }
        let mut c: Compiled = rmp_serde::from_slice(&std::fs::read(&path).ok()?).ok()?;
        for inst in &mut c.instances {
            let kind = registry.kind(&inst.kind)?;
            inst.extra = kind.fingerprint_extra(&inst.params, &c.base_dir).ok()?;
            inst.machine = kind.machine_profile(&inst.params);
        }
        let (graph, order) = crate::compile::dependency_graph(&c.instances, &c.loops).ok()?;
        c.graph = graph;
        c.order = order;
        Some(c)
    }

    /// Store `plan` under `key` (atomically: a reader sees a whole entry or none). Best effort.
    pub(crate) fn put(&self, key: &str, plan: &Compiled) {
        // Named fields: the spec types skip empty optional fields, which positional encoding cannot.
        let Ok(bytes) = rmp_serde::to_vec_named(plan) else { return };
        if bytes.len() > MAX_WRITTEN_BYTES {
            return;
        }
        if std::fs::create_dir_all(&self.dir).is_err() {
            return;
        }
        let tmp = self.dir.join(format!(".{key}.{}.tmp", std::process::id()));
        if std::fs::write(&tmp, &bytes).is_err() || std::fs::rename(&tmp, self.path(key)).is_err() {
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        self.prune();
    }

    /// Remove the oldest entries beyond `MAX_ENTRIES` or `MAX_TOTAL_BYTES` (the newest is kept).
    fn prune(&self) {
        let Ok(read) = std::fs::read_dir(&self.dir) else { return };
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = read
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".msgpack"))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, meta.len(), e.path()))
            })
            .collect();
        entries.sort_by_key(|e| std::cmp::Reverse(e.0));
        let mut total = 0u64;
        for (k, (_, len, p)) in entries.iter().enumerate() {
            total += len;
            if k > 0 && (k >= MAX_ENTRIES || total > MAX_TOTAL_BYTES) {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// The running executable: path, size, modification time and inode. Any rebuild changes it.
fn executable_identity() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let meta = std::fs::metadata(&exe).ok()?;
    let modified = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0u64;
    Some(format!("{}\0{}\0{}\0{}", exe.display(), meta.len(), modified.as_nanos(), inode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_entries_go_once_the_cache_holds_more_than_its_byte_budget() {
        let dir = tempfile::tempdir().unwrap();
        let start = std::time::SystemTime::now() - std::time::Duration::from_secs(100);
        for k in 0..4u64 {
            // Sparse files: sizes without writing the bytes.
            let f = std::fs::File::create(dir.path().join(format!("e{k}.msgpack"))).unwrap();
            f.set_len(100 << 20).unwrap();
            f.set_modified(start + std::time::Duration::from_secs(k)).unwrap();
        }
        PlanCache::new(dir.path()).prune();
        let mut left: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, ["e2.msgpack", "e3.msgpack"], "the two newest fit in {MAX_TOTAL_BYTES} bytes");
    }
}
