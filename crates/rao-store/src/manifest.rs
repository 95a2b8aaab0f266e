//! Manifests: what "done" means for a stage instance, read back from a store that is not trusted.
//!
//! A manifest names the attempt directory that holds its outputs and every file's size and blake3
//! hash. Reading one checks it (valid JSON, its own fingerprint, safe paths), and a cache hit
//! checks that every file is there with its size; an input's content hash is checked before a
//! stage reads it (`integrity.rs`). Whatever fails is *damaged*: reported, set aside
//! (quarantined) and recomputed, never used. So is, in a local store, something other than a
//! regular file where the manifest should be (a folder, a pipe, a device): a read of it fails,
//! but what failed is that one object, not the store. Any other read error is the store's and
//! stops the caller.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::layout::{self, check_component, check_rel_path, is_attempt_id, manifest_key};
use crate::store::{Store, StoreError, StoreResult};

/// One file of an output.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileEntry {
    /// Path relative to the output's directory.
    pub path: String,
    pub size: u64,
    pub blake3: String,
}

/// Written last, after every output file: its presence is what "done" means.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub fingerprint: String,
    pub kind: String,
    pub kind_version: u32,
    pub instance: String,
    pub pipeline: String,
    /// The attempt directory under the object's folder that holds the outputs (absent in stores
    /// written before attempts existed: `out/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<String>,
    /// The run that produced it (absent in older stores).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    pub outputs: BTreeMap<String, Vec<FileEntry>>,
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    /// Curves the stage recorded while it ran (metric → (step, value)), e.g. the warm start's
    /// loss and gate checks.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub curves: BTreeMap<String, Vec<(u64, f64)>>,
    pub started_at: f64,
    pub finished_at: f64,
    pub attempts: u32,
}

impl Manifest {
    /// Store key prefix of output `output`.
    pub fn output_prefix(&self, output: &str) -> String {
        layout::output_prefix(&self.fingerprint, self.attempt.as_deref(), output)
    }

    /// Store key of one file of an output.
    pub fn file_key(&self, output: &str, path: &str) -> String {
        format!("{}/{path}", self.output_prefix(output))
    }

    /// Everything a manifest read from a store must satisfy before any of it is used.
    pub fn check(&self, expected_fp: &str) -> Result<(), String> {
        if self.fingerprint != expected_fp {
            return Err(format!("it names fingerprint `{}` but is stored under `{expected_fp}`", self.fingerprint.escape_debug()));
        }
        if let Some(a) = &self.attempt
            && !is_attempt_id(a)
        {
            return Err(format!("attempt `{}` is not an attempt id", a.escape_debug()));
        }
        for (output, files) in &self.outputs {
            check_component("output name", output)?;
            for f in files {
                check_rel_path(&f.path).map_err(|e| format!("output `{output}`: {e}"))?;
                if f.blake3.len() != 64 || !f.blake3.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!("output `{output}`, file `{}`: `blake3` is not a hash", f.path));
                }
            }
        }
        Ok(())
    }
}

/// What the store holds under a fingerprint's manifest key.
#[derive(Debug, Clone)]
pub enum ManifestState {
    Missing,
    Done(Manifest),
    /// Present but unusable: why, and the bytes found (for quarantine).
    Damaged {
        why: String,
        bytes: bytes::Bytes,
    },
}

impl ManifestState {
    pub fn done(self) -> Option<Manifest> {
        match self {
            ManifestState::Done(m) => Some(m),
            _ => None,
        }
    }
}

/// Read and check the manifest of `fp`.
pub async fn read(store: &Store, fp: &str) -> StoreResult<ManifestState> {
    Ok(read_raw(store, fp).await?.0)
}

/// [`read`], with the bytes read (empty when what stands there is not a regular file): what
/// [`quarantine`] is given to set a damaged manifest aside.
pub async fn read_raw(store: &Store, fp: &str) -> StoreResult<(ManifestState, bytes::Bytes)> {
    let key = manifest_key(fp);
    match store.get_bounded(&key, crate::store::MAX_METADATA_BYTES).await {
        Ok(Some(bytes)) => Ok((parse(fp, bytes.clone()), bytes)),
        Ok(None) => Ok((ManifestState::Missing, bytes::Bytes::new())),
        Err(crate::store::StoreError::TooLarge { size, .. }) => Ok((
            ManifestState::Damaged { why: format!("MANIFEST.json is {size} bytes, too large to be one"), bytes: bytes::Bytes::new() },
            bytes::Bytes::new(),
        )),
        // What was found there, not a store that failed to answer: damage of this object only.
        Err(_) if is_not_a_file(store, &key) => {
            Ok((ManifestState::Damaged { why: NOT_A_FILE.into(), bytes: bytes::Bytes::new() }, bytes::Bytes::new()))
        }
        Err(e) => Err(e),
    }
}

const NOT_A_FILE: &str = "MANIFEST.json is not a regular file (a folder, a pipe or a device)";

/// Whether `key` is, in a local store, something other than a regular file: a folder, a pipe, a
/// device (links followed, as reads follow them). Asked after a read of `key` failed, it tells
/// damage (what was found) from a store that failed to answer (any other error, a bucket's
/// included): a path that cannot even be looked at is the latter.
pub fn is_not_a_file(store: &Store, key: &str) -> bool {
    match store.local_path(key).map(std::fs::metadata) {
        Some(Ok(m)) => !m.is_file(),
        // A file where one of its folders should be (`objects/ab/<fp>` itself a file).
        Some(Err(e)) => e.kind() == std::io::ErrorKind::NotADirectory,
        None => false,
    }
}

pub fn parse(fp: &str, bytes: bytes::Bytes) -> ManifestState {
    match serde_json::from_slice::<Manifest>(&bytes) {
        Err(e) => ManifestState::Damaged { why: format!("MANIFEST.json is not a valid manifest ({e})"), bytes },
        Ok(m) => match m.check(fp) {
            Ok(()) => ManifestState::Done(m),
            Err(why) => ManifestState::Damaged { why: format!("MANIFEST.json is not trustworthy: {why}"), bytes },
        },
    }
}

/// Every file of the manifest is present with its recorded size (a cheap check on each cache hit:
/// a stat per file locally, one listing per output in a bucket).
pub async fn check_sizes(store: &Store, m: &Manifest) -> StoreResult<Result<(), String>> {
    if let Some(local) = local_sizes(store, m) {
        return Ok(local);
    }
    for (output, files) in &m.outputs {
        if files.is_empty() {
            continue;
        }
        let prefix = format!("{}/", m.output_prefix(output));
        let found = store.list(&prefix).await?;
        let listed: BTreeMap<String, u64> =
            found.into_iter().filter_map(|(key, size)| Some((key.strip_prefix(&prefix)?.to_string(), size))).collect();
        if let Err(why) = compare_sizes(output, files, |path| listed.get(path).copied()) {
            return Ok(Err(why));
        }
    }
    Ok(Ok(()))
}

/// [`check_sizes`] for a local store, a stat per file (`None` for a bucket).
fn local_sizes(store: &Store, m: &Manifest) -> Option<Result<(), String>> {
    store.local_root()?;
    for (output, files) in &m.outputs {
        let prefix = m.output_prefix(output);
        if let Err(why) = compare_sizes(output, files, |path| store.local_file_size(&format!("{prefix}/{path}")).and_then(Result::ok)) {
            return Some(Err(why));
        }
    }
    Some(Ok(()))
}

/// Each file's size as found (`None`: missing) against the manifest's.
fn compare_sizes(output: &str, files: &[FileEntry], found: impl Fn(&str) -> Option<u64>) -> Result<(), String> {
    for f in files {
        match found(&f.path) {
            None => return Err(format!("output `{output}`: file `{}` is missing", f.path)),
            Some(size) if size != f.size => {
                return Err(format!("output `{output}`: file `{}` has {size} bytes, the manifest says {}", f.path, f.size));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Set a damaged manifest aside so the instance counts as not done: its bytes go to
/// `quarantine/`, then it is deleted — unless someone has meanwhile replaced it with another one.
/// Something that is not a regular file where the manifest should be (local stores) has no bytes
/// to keep: a note says what went, and it is removed (a folder with what is in it).
pub async fn quarantine(store: &Store, fp: &str, found: &bytes::Bytes) -> StoreResult<()> {
    let key = manifest_key(fp);
    let set_aside = |why: String| -> bytes::Bytes {
        serde_json::to_vec(&serde_json::json!({ "set_aside": why })).expect("serialising to JSON cannot fail").into()
    };
    let note = match store.get_bounded(&key, crate::store::MAX_METADATA_BYTES).await {
        Ok(now) if now.as_ref() != Some(found) => return Ok(()),
        Ok(_) => found.clone(),
        // Still too large to be a manifest: not kept (it could fill the disk twice).
        Err(StoreError::TooLarge { size, .. }) => set_aside(format!("MANIFEST.json of {size} bytes; it was removed")),
        // Nothing to compare: still not a file, it is still damaged. (No one's new manifest can
        // be renamed onto a folder; onto a device, in a race this narrow, it costs a recompute.)
        Err(_) if is_not_a_file(store, &key) => set_aside(format!("{NOT_A_FILE}; it was removed")),
        Err(e) => return Err(e),
    };
    store.put(&layout::quarantine_key(fp, crate::clock::now_secs()), note).await?;
    delete(store, fp).await
}

/// Delete the manifest of `fp`, or what stands in its place: a folder there (local stores) goes
/// with what is in it. Only that path: the object's attempts stay. A link goes, never what it
/// points to.
pub async fn delete(store: &Store, fp: &str) -> StoreResult<()> {
    let key = manifest_key(fp);
    // `store.delete` removes one object: a folder at a key's place holds other keys, so it is
    // removed here, for the manifest's path alone, rather than by every delete. A fingerprint
    // read from a listing is one plain name: the path stays inside the object's folder.
    let plain = !fp.is_empty() && !fp.contains(['/', '\\']) && fp != "." && fp != "..";
    // Something other than a folder where the object's folder should be: that is what goes.
    let object = store.local_path(&layout::object_dir(fp)).filter(|_| plain);
    if let Some(path) = object.filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| !m.is_dir())) {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(StoreError::Object { key, message: format!("{}: {e}", path.display()) })
            }
            _ => Ok(()),
        };
    }
    let folder = store.local_path(&key).filter(|_| plain);
    if let Some(path) = folder.filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())) {
        return match std::fs::remove_dir_all(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(StoreError::Object { key, message: format!("{}: {e}", path.display()) })
            }
            _ => Ok(()),
        };
    }
    store.delete(&key).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(path: &str) -> Manifest {
        Manifest {
            fingerprint: "0123456789abcdef0123456789abcdef".into(),
            kind: "noop".into(),
            kind_version: 1,
            instance: "a".into(),
            pipeline: "p".into(),
            attempt: Some("a-0123456789abcdef".into()),
            run_id: None,
            outputs: BTreeMap::from([("o".into(), vec![FileEntry { path: path.into(), size: 1, blake3: "0".repeat(64) }])]),
            metrics: BTreeMap::new(),
            curves: BTreeMap::new(),
            started_at: 0.0,
            finished_at: 0.0,
            attempts: 1,
        }
    }

    #[test]
    fn a_manifest_with_an_escaping_path_is_damaged() {
        let fp = "0123456789abcdef0123456789abcdef";
        assert!(matches!(parse(fp, serde_json::to_vec(&manifest("f.txt")).unwrap().into()), ManifestState::Done(_)));
        for bad in ["../../../../etc/x", "/etc/x", "a/../../b"] {
            let state = parse(fp, serde_json::to_vec(&manifest(bad)).unwrap().into());
            assert!(matches!(state, ManifestState::Damaged { .. }), "{bad}");
        }
        let other = parse("ffffffffffffffffffffffffffffffff", serde_json::to_vec(&manifest("f")).unwrap().into());
        assert!(matches!(other, ManifestState::Damaged { .. }));
        assert!(matches!(parse(fp, bytes::Bytes::from_static(b"{\"fingerprint\": \"01")), ManifestState::Damaged { .. }));
    }

    fn block<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().build().expect("a runtime").block_on(f)
    }

    /// A folder where the manifest should be is damage of that object: setting it aside removes
    /// that folder, with what is in it, and nothing else; a link there goes, never its target. A
    /// regular file whose read fails is the store's error, not damage.
    #[cfg(unix)]
    #[test]
    fn a_folder_in_place_of_a_manifest_is_damage_and_only_it_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(".", dir.path()).unwrap();
        let fp = "0123456789abcdef0123456789abcdef";
        let obj = dir.path().join(layout::object_dir(fp));
        std::fs::create_dir_all(obj.join("MANIFEST.json/inner")).unwrap();
        std::fs::write(obj.join("MANIFEST.json/inner/x"), b"x").unwrap();
        std::fs::create_dir_all(obj.join("a-0123456789abcdef/o")).unwrap();
        std::fs::write(obj.join("a-0123456789abcdef/o/v"), b"v").unwrap();
        let set_aside = || {
            block(async {
                let (state, bytes) = read_raw(&store, fp).await.unwrap();
                assert!(matches!(&state, ManifestState::Damaged { why, .. } if why.contains("not a regular file")), "{state:?}");
                quarantine(&store, fp, &bytes).await.unwrap();
                assert!(matches!(read(&store, fp).await.unwrap(), ManifestState::Missing));
            })
        };
        set_aside();
        assert!(obj.join("a-0123456789abcdef/o/v").is_file(), "the rest of the object stays");
        assert_eq!(std::fs::read_dir(dir.path().join("quarantine")).unwrap().count(), 1, "a note says what went");

        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"k").unwrap();
        std::os::unix::fs::symlink(outside.path(), obj.join("MANIFEST.json")).unwrap();
        set_aside();
        assert!(outside.path().join("keep").is_file(), "a link's target stays");

        #[cfg(target_os = "linux")]
        {
            std::os::unix::fs::symlink("/proc/self/mem", obj.join("MANIFEST.json")).unwrap();
            assert!(block(read(&store, fp)).is_err(), "an I/O error on a regular file is the store's, not damage");
        }
    }
}
