//! Manifests: what "done" means for a stage instance, read back from a store that is not trusted.
//!
//! A manifest names the attempt directory that holds its outputs and every file's size and blake3
//! hash. Reading one checks it (valid JSON, its own fingerprint, safe paths), and a cache hit
//! checks that every file is there with its size; an input's content hash is checked before a
//! stage reads it (`integrity.rs`). Whatever fails is *damaged*: reported, set aside
//! (quarantined) and recomputed, never used.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::layout::{self, check_component, check_rel_path, is_attempt_id, manifest_key};
use crate::store::{Store, StoreResult};

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
    let Some(bytes) = store.get_opt(&manifest_key(fp)).await? else { return Ok(ManifestState::Missing) };
    Ok(parse(fp, bytes))
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
pub async fn quarantine(store: &Store, fp: &str, found: &bytes::Bytes) -> StoreResult<()> {
    let key = manifest_key(fp);
    if store.get_opt(&key).await?.as_ref() != Some(found) {
        return Ok(());
    }
    store.put(&layout::quarantine_key(fp, crate::exec::now_secs()), found.clone()).await?;
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
}
