//! Content checks of inputs: every byte a stage reads from an upstream artifact matches the
//! blake3 its manifest recorded — checked as a file is read (downloads included), or once per
//! process for an artifact a stage reads in place from a local store.

use std::collections::HashSet;
use std::path::Path;
use std::sync::OnceLock;

use parking_lot::Mutex;

use crate::artifact::InputArtifact;
use crate::manifest::FileEntry;

/// An input whose bytes are not what its manifest says. Stages fail with it (through `?`);
/// the executor then sets the producer's manifest aside, recomputes it and starts the stage over.
#[derive(Debug, Clone, thiserror::Error)]
#[error("input `{output}` from `{producer}` is damaged: {why}")]
pub struct InputDamaged {
    pub producer: String,
    pub fingerprint: String,
    pub attempt: Option<String>,
    pub output: String,
    pub why: String,
}

impl InputDamaged {
    fn of(a: &InputArtifact, why: String) -> InputDamaged {
        InputDamaged {
            producer: a.instance.clone(),
            fingerprint: a.fingerprint.clone(),
            attempt: a.attempt.clone(),
            output: a.output.clone(),
            why,
        }
    }
}

/// Check the bytes of one file of an artifact against its manifest entry.
pub fn check_bytes(a: &InputArtifact, path: &str, bytes: &[u8]) -> Result<(), InputDamaged> {
    let entry =
        a.files.iter().find(|f| f.path == path).ok_or_else(|| InputDamaged::of(a, format!("its manifest lists no file `{path}`")))?;
    check_entry(a, entry, bytes)
}

fn check_entry(a: &InputArtifact, entry: &FileEntry, bytes: &[u8]) -> Result<(), InputDamaged> {
    check_hash(a, entry, bytes.len() as u64, blake3::hash(bytes))
}

fn check_hash(a: &InputArtifact, entry: &FileEntry, size: u64, hash: blake3::Hash) -> Result<(), InputDamaged> {
    if size != entry.size {
        return Err(InputDamaged::of(a, format!("file `{}` has {size} bytes, the manifest says {}", entry.path, entry.size)));
    }
    if hash.to_hex().as_str() != entry.blake3 {
        return Err(InputDamaged::of(a, format!("file `{}` does not match its recorded blake3 hash", entry.path)));
    }
    Ok(())
}

/// Size and blake3 of a file of a local artifact, read as a stream. Only a regular file is read,
/// and only if its size is the recorded one: rao never publishes a link, a FIFO or a device, so
/// one found there (a tampered store: a FIFO would block, `/dev/zero` never ends) is damage.
fn hash_local(a: &InputArtifact, entry: &FileEntry, path: &Path) -> Result<(u64, blake3::Hash), InputDamaged> {
    let damaged = |why: String| InputDamaged::of(a, format!("file `{}`: {why}", entry.path));
    let meta = std::fs::symlink_metadata(path).map_err(|e| damaged(e.to_string()))?;
    if !meta.file_type().is_file() {
        return Err(damaged("is not a regular file (a link, a pipe or a device)".into()));
    }
    if meta.len() != entry.size {
        // Not read (it may never end): the caller reports the size, which differs whatever the hash.
        return Ok((meta.len(), blake3::Hash::from_bytes([0; 32])));
    }
    crate::local_file::hash_file(path).map_err(|e| damaged(e.to_string()))
}

fn verified() -> &'static Mutex<HashSet<String>> {
    static SET: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    SET.get_or_init(Default::default)
}

/// Check every file of an artifact held in the local directory `dir` (once per process).
pub fn check_dir(a: &InputArtifact, dir: &Path) -> Result<(), InputDamaged> {
    let key = format!("{}/{}/{}", a.fingerprint, a.attempt.as_deref().unwrap_or("out"), a.output);
    if verified().lock().contains(&key) {
        return Ok(());
    }
    for entry in &a.files {
        let (size, hash) = hash_local(a, entry, &dir.join(&entry.path))?;
        check_hash(a, entry, size, hash)?;
    }
    verified().lock().insert(key);
    Ok(())
}
