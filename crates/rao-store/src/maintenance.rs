//! Keeping a store healthy: `rao verify` (every manifest and every byte it names) and `rao gc`
//! (staging of dead runs, attempts no manifest names, lapsed leases, and — given the pipelines
//! to keep — objects nothing references). Both only read unless asked to change anything.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::layout::{is_attempt_id, is_fingerprint};
use crate::manifest::{self, ManifestState};
use crate::store::{Listed, Store, StoreResult};

/// Remove this machine's staging entries whose process is gone (local stores; best effort).
pub fn remove_dead_staging(store: &Store) -> Vec<String> {
    dead_staging(store, true)
}

/// This machine's staging entries whose process is gone, removed if `remove` (else only listed).
fn dead_staging(store: &Store, remove: bool) -> Vec<String> {
    let Some(root) = store.local_root() else { return Vec::new() };
    let Ok(entries) = std::fs::read_dir(root.join("staging")) else { return Vec::new() };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if crate::staging::staging_owner(&name).is_some_and(crate::lease::process_is_gone) {
            let path = e.path();
            let gone = match remove {
                false => Ok(()),
                true if path.is_dir() => std::fs::remove_dir_all(&path),
                true => std::fs::remove_file(&path),
            };
            if gone.is_ok() {
                removed.push(format!("staging/{name}"));
            }
        }
    }
    removed
}

/// One object of the store, grouped by fingerprint.
#[derive(Default)]
struct ObjectFiles {
    /// When the manifest was written, if there is one.
    manifest: Option<SystemTime>,
    /// attempt (or `out`) → total bytes and when its newest file was written.
    attempts: BTreeMap<String, (u64, SystemTime)>,
}

/// Add a file to a group's (total bytes, newest write).
fn tally(group: &mut (u64, SystemTime), size: u64, modified: SystemTime) {
    group.0 = group.0.saturating_add(size);
    group.1 = group.1.max(modified);
}

async fn objects(store: &Store) -> StoreResult<BTreeMap<String, ObjectFiles>> {
    let mut by_fp: BTreeMap<String, ObjectFiles> = BTreeMap::new();
    for Listed { key, size, modified } in store.list_detailed("objects/").await? {
        let mut parts = key.splitn(4, '/');
        let (_, _, fp, rest) = (parts.next(), parts.next(), parts.next(), parts.next());
        let (Some(fp), Some(rest)) = (fp, rest) else { continue };
        let entry = by_fp.entry(fp.to_string()).or_default();
        if rest == "MANIFEST.json" {
            entry.manifest = Some(modified);
        } else if let Some((attempt, _)) = rest.split_once('/') {
            tally(entry.attempts.entry(attempt.to_string()).or_insert((0, SystemTime::UNIX_EPOCH)), size, modified);
        }
    }
    Ok(by_fp)
}

#[derive(Debug, Serialize)]
pub struct Damage {
    pub fingerprint: String,
    pub instance: Option<String>,
    pub why: String,
}

#[derive(Debug, Default, Serialize)]
pub struct VerifyReport {
    pub manifests: usize,
    pub files: usize,
    pub bytes: u64,
    pub damaged: Vec<Damage>,
    /// Damaged manifests set aside (with `--repair`): their instances run again next time.
    pub quarantined: usize,
}

/// Check every manifest and every byte of every file it names.
pub async fn verify(store: &Store, repair: bool) -> StoreResult<VerifyReport> {
    let mut report = VerifyReport::default();
    for (fp, files) in objects(store).await? {
        // A listing holds regular files only: a folder where the manifest should be is not
        // listed, yet every run meets it. It is checked (and found damaged) like a manifest.
        if files.manifest.is_none() && !manifest::is_not_a_file(store, &crate::layout::manifest_key(&fp)) {
            continue;
        }
        report.manifests += 1;
        let (state, bytes) = manifest::read_raw(store, &fp).await?;
        let (instance, problem) = match state {
            ManifestState::Done(m) => {
                let mut problem = None;
                'files: for (output, entries) in &m.outputs {
                    for f in entries {
                        report.files += 1;
                        report.bytes = report.bytes.saturating_add(f.size);
                        // Only what was read (or found missing) is damage: a store that fails
                        // to answer stops the check instead of condemning what it could not read.
                        let why = match stored(store, &m.file_key(output, &f.path)).await? {
                            Stored::Found(size, _) if size != f.size => {
                                Some(format!("{output}/{}: {size} bytes, manifest says {}", f.path, f.size))
                            }
                            Stored::Found(_, hash) if hash.to_hex().as_str() != f.blake3 => {
                                Some(format!("{output}/{}: content hash differs", f.path))
                            }
                            Stored::Found(..) => None,
                            Stored::Missing => Some(format!("{output}/{}: missing", f.path)),
                            Stored::NotAFile => Some(format!("{output}/{}: not a regular file", f.path)),
                        };
                        if why.is_some() {
                            problem = why;
                            break 'files;
                        }
                    }
                }
                (Some(m.instance.clone()), problem)
            }
            ManifestState::Damaged { why, .. } => (None, Some(why)),
            ManifestState::Missing => continue,
        };
        if let Some(why) = problem {
            if repair {
                manifest::quarantine(store, &fp, &bytes).await?;
                report.quarantined += 1;
            }
            report.damaged.push(Damage { fingerprint: fp, instance, why });
        }
    }
    Ok(report)
}

/// What `verify` finds at a file's key.
enum Stored {
    Found(u64, blake3::Hash),
    Missing,
    /// A folder, a FIFO or a device where the file was (local stores): what was found, not a
    /// store that failed to answer.
    NotAFile,
}

/// The size and hash of the file at `key`: streamed from a local store (a checkpoint need not
/// fit in memory), read whole from a bucket. A store that fails to answer is an error.
async fn stored(store: &Store, key: &str) -> StoreResult<Stored> {
    let Some(path) = store.local_path(key) else {
        return Ok(match store.get_opt(key).await? {
            Some(b) => Stored::Found(b.len() as u64, blake3::hash(&b)),
            None => Stored::Missing,
        });
    };
    let failed = |e: std::io::Error| crate::store::StoreError::Object { key: key.to_string(), message: format!("{}: {e}", path.display()) };
    match std::fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Stored::Missing),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => Ok(Stored::NotAFile),
        Err(e) => Err(failed(e)),
        Ok(meta) if !meta.is_file() => Ok(Stored::NotAFile),
        Ok(_) => crate::local_file::hash_file(&path).map(|(size, hash)| Stored::Found(size, hash)).map_err(failed),
    }
}

/// Which attempt of an object its manifest names.
enum Referenced {
    None,
    One(String),
    /// The manifest is there but cannot be read.
    Unknown,
}

#[derive(Debug, Default, Serialize)]
pub struct GcReport {
    /// Store keys (or key prefixes) removed — or, in a dry run, that would be.
    pub removed: Vec<String>,
    pub bytes: u64,
    pub deleted: bool,
    /// The store error that stopped gc part way; what `removed` lists went (or would go) before it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
}

/// Collect garbage. `keep`: fingerprints of every object to keep — the caller's pipelines and
/// whatever runs still going use (`None`: keep every finished object, remove only leftovers). Nothing written less than `min_age` ago
/// goes (by the store's clock, against this machine's): a run elsewhere may be publishing it, or
/// using it under overrides `keep` does not know.
/// A store error stops it (a failing store is not asked again and again); the report then says
/// what went before the error and what the error was.
pub async fn gc(store: &Store, keep: Option<&BTreeSet<String>>, delete: bool, min_age: Duration) -> GcReport {
    let mut report = GcReport { deleted: delete, ..Default::default() };
    if let Err(e) = collect(store, keep, delete, min_age, &mut report).await {
        report.stopped_by = Some(e.to_string());
    }
    report
}

async fn collect(
    store: &Store,
    keep: Option<&BTreeSet<String>>,
    delete: bool,
    min_age: Duration,
    report: &mut GcReport,
) -> StoreResult<()> {
    report.removed.extend(dead_staging(store, delete));
    // A lease that cannot be read counts as live: when in doubt, nothing goes.
    let lease_live = |fp: &str| {
        let store = store.clone();
        let fp = fp.to_string();
        async move { crate::lease::live_holder(&store, &fp).await.map_or(true, |h| h.is_some()) }
    };
    let old = |t: SystemTime| SystemTime::now().duration_since(t).is_ok_and(|age| age >= min_age);
    for (fp, files) in objects(store).await? {
        if !is_fingerprint(&fp) || lease_live(&fp).await {
            continue;
        }
        let unwanted = keep.is_some_and(|k| !k.contains(&fp)) && files.manifest.is_none_or(old);
        let key = crate::layout::manifest_key(&fp);
        // Not listed (listings hold regular files only) but there: goes with an unwanted object.
        // Asked before the attempts go: a folder with files in it is listed as one of them.
        let not_a_file = files.manifest.is_none() && manifest::is_not_a_file(store, &key);
        let referenced = match manifest::read(store, &fp).await? {
            ManifestState::Done(m) => Referenced::One(m.attempt.unwrap_or_else(|| "out".into())),
            // Unreadable (damaged — not a regular file included —, or written by a newer rao):
            // `rao verify --repair` or the next run sets it aside first; until then its attempts
            // stay. Damage of one object does not stop gc; a store error still does.
            ManifestState::Damaged { .. } => Referenced::Unknown,
            ManifestState::Missing => Referenced::None,
        };
        for (attempt, &(bytes, newest)) in &files.attempts {
            let orphan = match &referenced {
                Referenced::One(a) => a != attempt,
                Referenced::None => true,
                Referenced::Unknown => false,
            } && (is_attempt_id(attempt) || attempt == "out");
            // An attempt that `--force` has just superseded may still be read by a run holding
            // the manifest before: it goes once the manifest that replaced it is old too.
            if (orphan || unwanted) && old(newest) && files.manifest.is_none_or(old) {
                let prefix = format!("{}/{attempt}/", crate::layout::object_dir(&fp));
                if delete {
                    store.delete_prefix(&prefix).await?;
                }
                report.bytes += bytes;
                report.removed.push(prefix);
            }
        }
        if unwanted && (files.manifest.is_some() || not_a_file) && files.attempts.values().all(|&(_, newest)| old(newest)) {
            if delete {
                manifest::delete(store, &fp).await?;
                // What is left of the object is empty folders (local stores). Only empty ones go:
                // a run that found the manifest gone may be publishing a new attempt there now.
                store.remove_empty_folders(&crate::layout::object_dir(&fp));
            }
            report.removed.push(key);
        }
    }
    // A writer killed between writing a file and renaming it into place leaves the temporary
    // (local stores). It goes once old, unless a live lease says its object is being written.
    for (prefix, fp_at) in [("objects/", 2), ("leases/", 2), ("progress/", 1)] {
        for Listed { key, size, modified } in store.temporaries(prefix)? {
            let fp = key.split('/').nth(fp_at).unwrap_or("");
            if !old(modified) || (is_fingerprint(fp) && lease_live(fp).await) {
                continue;
            }
            if delete {
                store.delete(&key).await?;
                if prefix == "objects/" && is_fingerprint(fp) {
                    store.remove_empty_folders(&crate::layout::object_dir(fp));
                }
            }
            report.bytes = report.bytes.saturating_add(size);
            report.removed.push(key);
        }
    }
    for (key, size) in store.list("leases/").await? {
        let fp = key.split('/').nth(2).unwrap_or("");
        if is_fingerprint(fp) && !lease_live(fp).await {
            if delete {
                store.delete(&key).await?;
            }
            report.bytes = report.bytes.saturating_add(size);
            report.removed.push(key);
        }
    }
    // A stage's saved progress (to resume it): bytes and when it was last saved.
    let mut progress: BTreeMap<String, (u64, SystemTime)> = BTreeMap::new();
    for Listed { key, size, modified } in store.list_detailed("progress/").await? {
        if let Some(fp) = key.split('/').nth(1).filter(|fp| is_fingerprint(fp)) {
            tally(progress.entry(fp.to_string()).or_insert((0, SystemTime::UNIX_EPOCH)), size, modified);
        }
    }
    for (fp, (size, newest)) in progress {
        // Done: a manifest stands there, damaged or not (a folder in its place included).
        let done = !matches!(manifest::read(store, &fp).await?, ManifestState::Missing);
        let unwanted = keep.is_some_and(|k| !k.contains(&fp)) && old(newest);
        if (done || unwanted) && !lease_live(&fp).await {
            let prefix = format!("{}/", crate::layout::progress_prefix(&fp));
            if delete {
                store.delete_prefix(&prefix).await?;
            }
            report.bytes = report.bytes.saturating_add(size);
            report.removed.push(prefix);
        }
    }
    Ok(())
}
