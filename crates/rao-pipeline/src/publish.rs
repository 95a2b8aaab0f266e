//! Publishing a finished attempt: its outputs go to a directory of their own
//! (`objects/<fp>/<attempt>/`), then the manifest is created — once. The first writer wins; a
//! later one (a run whose lease lapsed while it worked) discards its copy. Nothing that a
//! manifest names is ever removed or rewritten, so a reader never sees a missing or partial input.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use bytes::Bytes;

use crate::compile::Compiled;
use crate::exec::{IndexEntry, Job, index_key, now_secs};
use crate::layout::{self, manifest_key, new_attempt_id};
use crate::manifest::{self, FileEntry, Manifest, ManifestState};
use crate::staging::staged_output;
use crate::store::Store;

pub struct Published {
    pub manifest: Manifest,
    /// `false`: another writer had published first; its manifest is returned and ours discarded.
    pub ours: bool,
}

/// Move staged outputs into a fresh attempt directory, then create the manifest.
pub async fn publish(
    c: &Compiled,
    store: &Store,
    job: &Job,
    staging: &Path,
    recorded: Arc<Mutex<crate::kind::Recorded>>,
    started_at: f64,
    attempts: u32,
) -> anyhow::Result<Published> {
    let inst = &c.instances[job.instance];
    let attempt = new_attempt_id();
    let mut files_by_output = BTreeMap::new();
    for out in &inst.outputs {
        let prefix = layout::output_prefix(&job.fingerprint, Some(&attempt), out);
        let dir = staged_output(staging, out);
        let target = store.local_path(&prefix);
        let mut entries = Vec::new();
        for rel in walk_files(&dir, out)? {
            let path = dir.join(&rel);
            let entry = |size: u64, hash: blake3::Hash| FileEntry { path: rel.clone(), size, blake3: hash.to_hex().to_string() };
            match &target {
                // Hashed as a stream (a checkpoint need not fit in memory), and refused should it
                // no longer be a regular file: the check `dataset` makes of its local files.
                Some(_) => {
                    let (size, hash) =
                        crate::local_file::hash_regular(&path).map_err(|e| anyhow::anyhow!("output `{out}`: `{rel}` {e}"))?;
                    entries.push(entry(size, hash));
                }
                None => {
                    let bytes = std::fs::read(&path).map_err(|e| anyhow::anyhow!("output `{out}`: `{rel}` cannot be read: {e}"))?;
                    entries.push(entry(bytes.len() as u64, blake3::hash(&bytes)));
                    store.put(&format!("{prefix}/{rel}"), Bytes::from(bytes)).await?;
                }
            }
        }
        // A local store takes the whole directory in one rename (same filesystem); the attempt
        // directory is new, so the rename cannot meet anything already there.
        if let (Some(t), false) = (&target, entries.is_empty()) {
            // Only the first output of an attempt needs its parent made.
            crate::store::local::making_parent(t, || std::fs::rename(&dir, t))?;
        }
        files_by_output.insert(out.clone(), entries);
    }
    // One lock, taken and dropped here: two `lock()` temporaries in one struct expression would
    // both live to its end and deadlock.
    let (metrics, curves) = {
        let mut recorded = recorded.lock();
        (recorded.metrics.clone(), std::mem::take(&mut recorded.curves))
    };
    let manifest = Manifest {
        fingerprint: job.fingerprint.clone(),
        kind: inst.kind.clone(),
        kind_version: inst.kind_version,
        instance: inst.name.clone(),
        pipeline: c.name.clone(),
        attempt: Some(attempt.clone()),
        run_id: Some(job.run_id.clone()),
        outputs: files_by_output,
        metrics,
        curves,
        started_at,
        finished_at: now_secs(),
        attempts,
    };
    let bytes = Bytes::from(serde_json::to_vec_pretty(&manifest)?);
    let key = manifest_key(&job.fingerprint);
    let ours = if job.forced_at.is_some() {
        // `--force` asked for a new result: it replaces the manifest. The old attempt's files stay
        // (a reader holding the old manifest still finds them) until `rao gc`.
        store.put(&key, bytes).await?;
        true
    } else if store.put_if_absent(&key, bytes.clone()).await? {
        true
    } else {
        match manifest::read(store, &job.fingerprint).await? {
            ManifestState::Done(theirs) if manifest::check_sizes(store, &theirs).await?.is_ok() => {
                discard_attempt(store, &job.fingerprint, &attempt).await;
                return Ok(Published { manifest: theirs, ours: false });
            }
            // What is there is damaged (or vanished): ours replaces it.
            ManifestState::Damaged { bytes: found, .. } => {
                manifest::quarantine(store, &job.fingerprint, &found).await?;
                store.put_if_absent(&key, bytes).await?
            }
            _ => {
                store.put(&key, bytes).await?;
                true
            }
        }
    };
    if !ours {
        discard_attempt(store, &job.fingerprint, &attempt).await;
        let theirs = manifest::read(store, &job.fingerprint).await?.done().ok_or_else(|| anyhow::anyhow!("manifest vanished"))?;
        return Ok(Published { manifest: theirs, ours: false });
    }
    store
        .put_json(&index_key(&c.name, &inst.name), &IndexEntry { fingerprint: job.fingerprint.clone(), parts: job.parts.redacted() })
        .await?;
    Ok(Published { manifest, ours: true })
}

async fn discard_attempt(store: &Store, fp: &str, attempt: &str) {
    let prefix = layout::attempt_prefix(fp, attempt);
    match store.local_path(&prefix) {
        Some(dir) => _ = std::fs::remove_dir_all(dir),
        None => _ = store.delete_prefix(&format!("{prefix}/")).await,
    }
}

/// Relative paths of all files under output `output`'s folder `dir` (sorted; empty if it does not
/// exist). Only regular files and folders are published: opening a FIFO to hash it blocks (the
/// run with it, past any timeout), a device never ends, a socket has no bytes. A link to a regular
/// file becomes a copy of its bytes, as `dataset` copies what its links point to: a link kept in
/// the store would lead out of it, and editing its target would damage the object. A link to a
/// folder or one that leads nowhere is refused: its copy could be a whole tree, or nothing.
fn walk_files(dir: &Path, output: &str) -> anyhow::Result<Vec<String>> {
    let refuse = |rel: &str, what: &str| {
        anyhow::anyhow!("output `{output}`: `{rel}` is {what}; only files, folders and links to files are published")
    };
    let io = |rel: &str, e: std::io::Error| anyhow::anyhow!("output `{output}`: `{rel}`: {e}");
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(".", e)),
        Ok(m) if !m.is_dir() => anyhow::bail!("output `{output}` is {}, not a folder", special(m.file_type())),
        Ok(_) => {}
    }
    let mut out = Vec::new();
    let mut links = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| io(&rel_of(dir, &d), e))? {
            let e = e.map_err(|e| io(&rel_of(dir, &d), e))?;
            let p = e.path();
            let rel = rel_of(dir, &p);
            // A name the store's readers refuse is not published: it would read as damage ever after.
            let name = e.file_name();
            let bad_name = |why: &str| anyhow::anyhow!("output `{output}`: `{}` {why}; rename it", rel.escape_debug());
            match name.to_str() {
                None => return Err(bad_name("has a name that is not UTF-8")),
                Some(n) if n.contains('\\') || n.chars().any(char::is_control) => {
                    return Err(bad_name("has a backslash or a control character in its name"));
                }
                Some(n) if crate::store::local::is_temporary(n) => {
                    return Err(bad_name("is named like one of rao's temporary files (`.NAME.rao-tmp.PID.N`)"));
                }
                Some(_) => {}
            }
            // The entry's own type (not its target's): no system call where the listing has it.
            let ty = e.file_type().map_err(|e| io(&rel, e))?;
            if ty.is_dir() {
                stack.push(p);
                continue;
            }
            if ty.is_symlink() {
                match std::fs::metadata(&p) {
                    Ok(m) if m.is_file() => links.push(p),
                    Ok(m) if m.is_dir() => return Err(refuse(&rel, "a link to a folder")),
                    Ok(m) => return Err(refuse(&rel, &format!("a link to {}", special(m.file_type())))),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(refuse(&rel, "a link to nothing")),
                    Err(e) => return Err(io(&rel, e)),
                }
            } else if !ty.is_file() {
                return Err(refuse(&rel, special(ty)));
            }
            out.push(rel);
        }
    }
    // Replaced once the walk is over: a folder's listing need not be stable while it changes.
    for link in links {
        let copy = link.with_file_name(format!(".{}.rao-link-copy", link.file_name().unwrap_or_default().to_string_lossy()));
        std::fs::copy(&link, &copy).and_then(|_| std::fs::rename(&copy, &link)).map_err(|e| io(&rel_of(dir, &link), e))?;
    }
    out.sort();
    Ok(out)
}

/// `path` relative to the output folder `dir`, with `/` between names.
fn rel_of(dir: &Path, path: &Path) -> String {
    match path.strip_prefix(dir).expect("walked below dir").to_string_lossy().replace('\\', "/") {
        rel if rel.is_empty() => ".".into(),
        rel => rel,
    }
}

/// What a file that is neither a regular file nor a folder is, in words.
fn special(ty: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ty.is_fifo() {
            return "a FIFO (named pipe)";
        } else if ty.is_socket() {
            return "a socket";
        } else if ty.is_char_device() || ty.is_block_device() {
            return "a device";
        }
    }
    if ty.is_symlink() { "a link" } else { "not a regular file" }
}
