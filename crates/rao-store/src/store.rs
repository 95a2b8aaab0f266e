//! The artifact store: one object-store prefix holding every stage's outputs, manifests,
//! run records and the status index. Local directory by default; memory, S3, GCS and Azure by URL.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

pub type StoreResult<T> = Result<T, StoreError>;

/// The most bytes read of an object rao writes as metadata (a manifest of 20,000 files is about
/// 3 MB): a larger one in a tampered store is refused, not read into memory.
pub const MAX_METADATA_BYTES: u64 = 64 << 20;

/// Errors carry their cause as text, once: object_store's errors repeat their source's message
/// at every level of the chain ("… (os error 13): … (os error 13)").
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store `{url}`: {message}")]
    Open { url: String, message: String },
    #[error("store object `{key}` does not exist")]
    NotFound { key: String },
    #[error("store object `{key}`: {message}")]
    Object { key: String, message: String },
    #[error("store object `{key}` is not valid JSON: {message}")]
    Json { key: String, message: String },
    /// An object rao writes small, found larger (a tampered store): not read.
    #[error("store object `{key}` is {size} bytes, more than the {max} rao reads for it")]
    TooLarge { key: String, size: u64, max: u64 },
}

impl StoreError {
    fn object(key: &str, e: object_store::Error) -> StoreError {
        match e {
            object_store::Error::NotFound { .. } => StoreError::NotFound { key: key.to_string() },
            e => StoreError::Object { key: key.to_string(), message: chain_text(&e) },
        }
    }
    fn io(key: &str, path: &FsPath, e: std::io::Error) -> StoreError {
        match e.kind() {
            std::io::ErrorKind::NotFound => StoreError::NotFound { key: key.to_string() },
            _ => StoreError::Object { key: key.to_string(), message: format!("{}: {e}", path.display()) },
        }
    }
}

/// An error and its sources as one line, each message once (an outer message that already
/// contains an inner one is enough).
pub fn chain_text(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        let m = inner.to_string();
        if !out.contains(&m) {
            out.push_str(": ");
            out.push_str(&m);
        }
        cur = inner.source();
    }
    out
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    ReadWrite,
    ReadOnly,
}

/// A handle to the store; cheap to clone and shared by every stage of a run.
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    prefix: Path,
    url: String,
    /// For a local directory store: its root, so local tools can read artifacts in place.
    local_root: Option<PathBuf>,
    /// The same root held open: reads and size checks name files relative to it, so the kernel
    /// does not walk the root's own path again for every manifest of a cached run.
    local_dir: Option<Arc<local::Dir>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({})", self.url)
    }
}

impl Store {
    /// Open a store from a URL or a path; relative paths are taken from `base_dir`. A local
    /// directory is created if missing. Cloud credentials come from the usual environment
    /// variables (AWS_*, GOOGLE_*, AZURE_*).
    pub fn open(url: &str, base_dir: &FsPath) -> StoreResult<Store> {
        Self::open_with(url, base_dir, Access::ReadWrite)
    }

    /// Open a store only to read it (`status`, `plan`, `report`, `verify`): a local directory that
    /// does not exist is an empty store and is not created.
    pub fn open_read_only(url: &str, base_dir: &FsPath) -> StoreResult<Store> {
        Self::open_with(url, base_dir, Access::ReadOnly)
    }

    /// A store over any object store (tests give one that fails on purpose).
    #[cfg(test)]
    pub(crate) fn over(inner: Arc<dyn ObjectStore>) -> Store {
        Store { inner, prefix: Path::default(), url: "test://".into(), local_root: None, local_dir: None }
    }

    fn open_with(url: &str, base_dir: &FsPath, access: Access) -> StoreResult<Store> {
        let err = |m: String| StoreError::Open { url: url.to_string(), message: m };
        let scheme = url.split_once("://").map(|(s, _)| s);
        match scheme {
            Some("memory") => Ok(Store {
                inner: Arc::new(object_store::memory::InMemory::new()),
                prefix: Path::default(),
                url: url.to_string(),
                local_root: None,
                local_dir: None,
            }),
            Some(s) if is_cloud_scheme(s) => {
                let (inner, prefix) = open_cloud(url).map_err(err)?;
                Ok(Store { inner, prefix, url: url.to_string(), local_root: None, local_dir: None })
            }
            Some("file") => {
                let parsed = url::Url::parse(url).map_err(|e| err(e.to_string()))?;
                let path = parsed.to_file_path().map_err(|_| err("not a local file path".into()))?;
                Self::open_local(url, &path, access)
            }
            Some(other) => {
                Err(err(format!("unknown store scheme `{other}://`; use a local path, file://, memory://, s3://, gs:// or az://")))
            }
            None => Self::open_local(url, &local_store_path(url, base_dir).map_err(err)?, access),
        }
    }

    fn open_local(url: &str, path: &FsPath, access: Access) -> StoreResult<Store> {
        let err = |m: String| StoreError::Open { url: url.to_string(), message: m };
        if access == Access::ReadOnly && !path.exists() {
            let inner = Arc::new(object_store::memory::InMemory::new());
            return Ok(Store { inner, prefix: Path::default(), url: url.to_string(), local_root: None, local_dir: None });
        }
        std::fs::create_dir_all(path).map_err(|e| err(format!("cannot create directory {}: {e}", path.display())))?;
        let root = path.canonicalize().map_err(|e| err(format!("{}: {e}", path.display())))?;
        // Stages write into `staging/`, gc deletes under `objects/`: through a link there, out of
        // the store. rao makes none; the store itself may be a link (it was resolved above).
        if let Some(name) = std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| e.file_type().is_ok_and(|t| t.is_symlink()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
        {
            return Err(err(format!("`{name}` in the store is a link; a store's folders are real folders (was the store tampered with?)")));
        }
        let fs = object_store::local::LocalFileSystem::new_with_prefix(&root)
            .map_err(|e| StoreError::Open { url: url.to_string(), message: e.to_string() })?;
        let dir = local::Dir::open(&root).map_err(|e| err(format!("{}: {e}", root.display())))?;
        Ok(Store {
            inner: Arc::new(fs),
            prefix: Path::default(),
            url: url.to_string(),
            local_root: Some(root),
            local_dir: Some(Arc::new(dir)),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The local directory behind this store, if it is one.
    pub fn local_root(&self) -> Option<&FsPath> {
        self.local_root.as_deref()
    }

    /// Where `key` lives on disk, for local stores.
    pub fn local_path(&self, key: &str) -> Option<PathBuf> {
        self.local_root.as_ref().map(|r| r.join(key))
    }

    /// Where `key` lives on disk, for local stores and keys made only of plain names (no `..`,
    /// `.`, empty or absolute segments): the direct file-system paths below never leave the root.
    /// Other keys go through object_store, which refuses them.
    fn plain_local_path(&self, key: &str) -> Option<PathBuf> {
        if is_plain(key) { self.local_path(key) } else { None }
    }

    /// The open root of a local store, for keys made only of plain names (as `plain_local_path`).
    fn plain_local_dir(&self, key: &str) -> Option<&local::Dir> {
        self.local_dir.as_deref().filter(|_| is_plain(key))
    }

    /// The size of the file at `key` in a local store (following links, as `std::fs::metadata`);
    /// `None` for other stores and for keys that are not plain names.
    pub fn local_file_size(&self, key: &str) -> Option<std::io::Result<u64>> {
        self.plain_local_dir(key).map(|dir| dir.size(key))
    }

    /// The bytes at `key` in a local store, read without a runtime; `None` for other stores and
    /// for keys that are not plain names.
    fn read_local(&self, key: &str) -> Option<std::io::Result<Bytes>> {
        self.plain_local_dir(key).map(|dir| dir.read(key).map(Bytes::from))
    }

    fn path(&self, key: &str) -> Path {
        if self.prefix.as_ref().is_empty() { Path::from(key) } else { Path::from(format!("{}/{}", self.prefix.as_ref(), key)) }
    }

    fn strip(&self, p: &Path) -> String {
        let s = p.as_ref();
        let pre = self.prefix.as_ref();
        if pre.is_empty() { s.to_string() } else { s.strip_prefix(pre).unwrap_or(s).trim_start_matches('/').to_string() }
    }

    /// Refuse to write or delete at `path` (of `key`, in a local store) through a folder that is
    /// a link: rao makes none, and one in a tampered store would lead writes and `gc`'s deletes
    /// out of the store. A few `lstat`s, only for writes and deletes.
    fn no_links_above(&self, key: &str, path: &std::path::Path) -> StoreResult<()> {
        let Some(root) = &self.local_root else { return Ok(()) };
        for folder in path.ancestors().skip(1).take_while(|a| a.starts_with(root) && *a != root.as_path()) {
            if std::fs::symlink_metadata(folder).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(StoreError::Object {
                    key: key.to_string(),
                    message: format!("{} is a link; a store's folders are real folders (was the store tampered with?)", folder.display()),
                });
            }
        }
        Ok(())
    }

    /// Write an object. Local and cloud stores make the object visible whole or not at all.
    pub async fn put(&self, key: &str, bytes: Bytes) -> StoreResult<()> {
        // Local stores write directly (a temporary file renamed over the key): object_store hops
        // to a blocking thread per call, which dominates the overhead of small stages.
        if let Some(path) = self.plain_local_path(key) {
            self.no_links_above(key, &path)?;
            return local::write_whole(&path, &bytes, local::Mode::Replace).map(|_| ()).map_err(|e| StoreError::io(key, &path, e));
        }
        self.inner.put(&self.path(key), PutPayload::from_bytes(bytes)).await.map(|_| ()).map_err(|e| StoreError::object(key, e))
    }

    pub async fn get(&self, key: &str) -> StoreResult<Bytes> {
        // A local store is read directly: object_store hops to a blocking thread per read, which
        // dominates a fully cached run of many small stages.
        if let Some(read) = self.read_local(key) {
            return read.map_err(|e| StoreError::io(key, &self.local_path(key).unwrap_or_default(), e));
        }
        let map = |e| StoreError::object(key, e);
        self.inner.get(&self.path(key)).await.map_err(map)?.bytes().await.map_err(map)
    }

    /// Like [`Store::get_opt`], for an object rao writes small (a manifest, a record, a lease):
    /// one larger than `max` bytes is an error, not read into memory.
    pub async fn get_bounded(&self, key: &str, max: u64) -> StoreResult<Option<Bytes>> {
        let result = match self.plain_local_dir(key) {
            Some(dir) => dir.read_at_most(key, max).map(Bytes::from).map_err(|e| {
                match e.get_ref().and_then(|x| x.downcast_ref::<local::TooLarge>()) {
                    Some(t) => StoreError::TooLarge { key: key.to_string(), size: t.size, max },
                    None => StoreError::io(key, &self.local_path(key).unwrap_or_default(), e),
                }
            }),
            None => match self.inner.get(&self.path(key)).await {
                Ok(got) if got.meta.size > max => Err(StoreError::TooLarge { key: key.to_string(), size: got.meta.size, max }),
                Ok(got) => got.bytes().await.map_err(|e| StoreError::object(key, e)),
                Err(e) => Err(StoreError::object(key, e)),
            },
        };
        match result {
            Ok(b) => Ok(Some(b)),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn get_opt(&self, key: &str) -> StoreResult<Option<Bytes>> {
        match self.get(key).await {
            Ok(b) => Ok(Some(b)),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn exists(&self, key: &str) -> StoreResult<bool> {
        match self.inner.head(&self.path(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(StoreError::object(key, e)),
        }
    }

    /// Every object under `prefix` (recursively), as (key relative to the store, size), sorted.
    pub async fn list(&self, prefix: &str) -> StoreResult<Vec<(String, u64)>> {
        Ok(self.list_detailed(prefix).await?.into_iter().map(|l| (l.key, l.size)).collect())
    }

    /// Every key under `prefix` with its size and when it was last written, sorted by key.
    pub async fn list_detailed(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        let prefix_path = match prefix.trim_end_matches('/') {
            "" => self.local_root().map(FsPath::to_path_buf),
            p => self.plain_local_path(p),
        };
        if let (Some(root), Some(dir)) = (self.local_root(), prefix_path) {
            return local::list(root, &dir).map_err(|e| StoreError::io(prefix, &dir, e));
        }
        let p = self.path(prefix);
        let metas: Vec<_> = self.inner.list(Some(&p)).try_collect().await.map_err(|e| StoreError::object(prefix, e))?;
        let mut out: Vec<Listed> =
            metas.iter().map(|m| Listed { key: self.strip(&m.location), size: m.size, modified: m.last_modified.into() }).collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// An object rao wrote as JSON (records, leases, index entries, summaries): at most
    /// [`MAX_METADATA_BYTES`].
    pub async fn get_json<T: for<'de> Deserialize<'de>>(&self, key: &str) -> StoreResult<Option<T>> {
        match self.get_bounded(key, MAX_METADATA_BYTES).await? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b).map(Some).map_err(|e| StoreError::Json { key: key.to_string(), message: e.to_string() }),
        }
    }

    pub async fn put_json<T: Serialize>(&self, key: &str, value: &T) -> StoreResult<()> {
        let bytes = serde_json::to_vec_pretty(value).expect("serialising to JSON cannot fail");
        self.put(key, Bytes::from(bytes)).await
    }

    pub async fn delete(&self, key: &str) -> StoreResult<()> {
        if let Some(path) = self.plain_local_path(key) {
            self.no_links_above(key, &path)?;
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StoreError::io(key, &path, e)),
                _ => Ok(()),
            };
        }
        match self.inner.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(StoreError::object(key, e)),
        }
    }

    /// Delete every object under `prefix` (a local store removes the folder itself).
    pub async fn delete_prefix(&self, prefix: &str) -> StoreResult<()> {
        if let Some(path) = self.plain_local_path(prefix.trim_end_matches('/')) {
            self.no_links_above(prefix, &path)?;
            return match std::fs::remove_dir_all(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => self.delete(prefix.trim_end_matches('/')).await,
                Err(e) => Err(StoreError::io(prefix, &path, e)),
            };
        }
        for (key, _) in self.list(prefix).await? {
            self.delete(&key).await?;
        }
        Ok(())
    }

    /// The temporary files under `prefix` that writers left behind (a process killed between
    /// writing and renaming), sorted by key; listings leave them out. Buckets have none: an
    /// object there appears whole or not at all.
    pub fn temporaries(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        match (self.local_root(), self.plain_local_path(prefix.trim_end_matches('/'))) {
            (Some(root), Some(dir)) => local::temporaries(root, &dir).map_err(|e| StoreError::io(prefix, &dir, e)),
            _ => Ok(Vec::new()),
        }
    }

    /// Remove the empty folders under `prefix`, and the folder itself once empty (local stores;
    /// a bucket has no folders). A folder with a file in it stays. Best effort.
    pub fn remove_empty_folders(&self, prefix: &str) {
        if let Some(path) = self.plain_local_path(prefix.trim_end_matches('/')) {
            local::remove_empty_dirs(&path);
        }
    }

    /// Write an object only if none exists under `key` (`If-None-Match: *` on S3, a hard link
    /// locally): `true` if this call created it, `false` if another writer was first.
    pub async fn put_if_absent(&self, key: &str, bytes: Bytes) -> StoreResult<bool> {
        if let Some(path) = self.plain_local_path(key) {
            self.no_links_above(key, &path)?;
            return local::write_whole(&path, &bytes, local::Mode::CreateOnly).map_err(|e| StoreError::io(key, &path, e));
        }
        let opts = object_store::PutOptions { mode: object_store::PutMode::Create, ..Default::default() };
        match self.inner.put_opts(&self.path(key), PutPayload::from_bytes(bytes), opts).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(StoreError::object(key, e)),
        }
    }
}

/// The folder a store given as a path names: relative to the pipeline file's folder, `~/` the
/// home folder as a shell would read it. An empty path (an unset `$STORE`) would make the current
/// folder a store, and `~user` is not expanded: both are refused.
fn local_store_path(path: &str, base_dir: &FsPath) -> Result<PathBuf, String> {
    if path.trim().is_empty() {
        return Err("the store path is empty (an unset variable?): give a folder or a URL, e.g. `.rao/store`".into());
    }
    let path = if path == "~" || path.starts_with("~/") {
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .ok_or("`~` names the home folder, but HOME is not set: give the full path")?;
        PathBuf::from(home).join(path.trim_start_matches('~').trim_start_matches('/'))
    } else if path.starts_with('~') {
        return Err("`~user` is not expanded: give the full path of the folder".into());
    } else {
        PathBuf::from(path)
    };
    Ok(if path.is_absolute() { path } else { base_dir.join(path) })
}

/// Schemes served by a cloud object store (credentials from the environment).
pub fn is_cloud_scheme(scheme: &str) -> bool {
    matches!(scheme, "s3" | "s3a" | "gs" | "az" | "azure" | "abfs" | "abfss")
}

/// The object store behind a cloud URL (`s3://bucket/prefix`, `gs://…`, `az://…`) and the
/// URL's path inside it. Credentials and endpoints come from the usual environment variables
/// (AWS_*, GOOGLE_*, AZURE_*); requests that fail transiently (connection refused, 5xx, 429)
/// are retried with exponential backoff by object_store's default retry policy.
pub fn open_cloud(url: &str) -> Result<(Arc<dyn ObjectStore>, Path), String> {
    let parsed = url::Url::parse(url).map_err(|e| e.to_string())?;
    let path = Path::from_url_path(parsed.path()).map_err(|e| e.to_string())?;
    let store: Arc<dyn ObjectStore> = match parsed.scheme() {
        "s3" | "s3a" => Arc::new(object_store::aws::AmazonS3Builder::from_env().with_url(url).build().map_err(|e| e.to_string())?),
        "gs" => Arc::new(object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(url).build().map_err(|e| e.to_string())?),
        s if is_cloud_scheme(s) => {
            Arc::new(object_store::azure::MicrosoftAzureBuilder::from_env().with_url(url).build().map_err(|e| e.to_string())?)
        }
        other => return Err(format!("`{other}://` is not a cloud object store; use s3://, gs:// or az://")),
    };
    Ok((store, path))
}

/// A key made only of plain names (no `..`, `.`, empty or absolute segments): joined to a local
/// root, it never leaves it.
fn is_plain(key: &str) -> bool {
    !key.is_empty() && key.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != ".." && !seg.contains('\\'))
}

pub use crate::layout::{manifest_key, object_dir};
pub use crate::manifest::{FileEntry, Manifest};

/// One key of a listing.
#[derive(Debug, Clone)]
pub struct Listed {
    pub key: String,
    pub size: u64,
    /// When it was last written, by the store's clock (a file's modification time locally).
    pub modified: std::time::SystemTime,
}

pub mod local;

#[cfg(test)]
mod tests {
    use super::*;

    fn block<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().build().expect("a runtime").block_on(f)
    }

    /// Concurrent runs delete old lease generations while others list them: a file removed
    /// between the directory read and its stat is left out, never an error.
    #[test]
    fn listing_a_folder_whose_files_come_and_go_never_fails() {
        let dir = tempfile::tempdir().unwrap();
        let leases = dir.path().join("leases/ab");
        std::fs::create_dir_all(&leases).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let (leases, stop) = (leases.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut g = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    g += 1;
                    std::fs::write(leases.join(format!("g{g:012}.json")), b"{}").unwrap();
                    let _ = std::fs::remove_file(leases.join(format!("g{:012}.json", g.saturating_sub(1))));
                }
            })
        };
        for _ in 0..3000 {
            local::list(dir.path(), &leases).expect("a listing never fails on a vanished file");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        churn.join().unwrap();
    }

    /// Reads around the first buffer's size (empty, one byte short, exact, one over, many times
    /// over) and below sub-folders give the file's bytes and size, as `std::fs` does.
    #[test]
    fn reading_a_whole_local_file_gives_its_bytes_at_every_size() {
        let dir = tempfile::tempdir().unwrap();
        for size in [0usize, 1, 16383, 16384, 16385, 32768, 100_001, 3 << 20] {
            let bytes: Vec<u8> = (0..size).map(|i| (i * 7 + i / 251) as u8).collect();
            let path = dir.path().join(format!("f{size}"));
            std::fs::write(&path, &bytes).unwrap();
            let root = local::Dir::open(dir.path()).unwrap();
            assert_eq!(root.read(&format!("f{size}")).unwrap(), bytes, "size {size}");
            assert_eq!(root.size(&format!("f{size}")).unwrap(), size as u64, "size {size}");
        }
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/nested"), b"deep").unwrap();
        let root = local::Dir::open(dir.path()).unwrap();
        assert_eq!(root.read("a/b/nested").unwrap(), b"deep");
        assert_eq!(root.size("a/b/nested").unwrap(), 4);
        assert_eq!(root.read("missing").unwrap_err().kind(), std::io::ErrorKind::NotFound);
        assert_eq!(root.size("missing").unwrap_err().kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn local_writes_are_whole_create_only_once_and_listed_without_temporaries_or_links() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().to_str().unwrap(), dir.path()).unwrap();
        block(async {
            assert!(store.put_if_absent("a/b/first", Bytes::from_static(b"1")).await.unwrap());
            assert!(!store.put_if_absent("a/b/first", Bytes::from_static(b"2")).await.unwrap());
            assert_eq!(store.get("a/b/first").await.unwrap().as_ref(), b"1", "the first writer wins");
            store.put("a/b/first", Bytes::from_static(b"33")).await.unwrap();
            assert_eq!(store.get("a/b/first").await.unwrap().as_ref(), b"33");
            std::fs::write(dir.path().join("a/b/.x.rao-tmp.1.2"), b"partial").unwrap();
            std::os::unix::fs::symlink("/etc/passwd", dir.path().join("a/b/link")).unwrap();
            assert_eq!(store.list("a/").await.unwrap(), vec![("a/b/first".to_string(), 2)]);
            assert_eq!(store.list("").await.unwrap(), vec![("a/b/first".to_string(), 2)]);
            store.delete("a/b/first").await.unwrap();
            store.delete("a/b/first").await.unwrap();
            assert!(store.list("a").await.unwrap().is_empty());
            // Keys that would leave the root never reach the file system directly (object_store
            // escapes their `..`).
            let _ = store.put("../escaped", Bytes::from_static(b"x")).await;
            assert!(!dir.path().parent().unwrap().join("escaped").exists());
        });
    }

    #[test]
    fn removing_empty_folders_keeps_every_folder_with_a_file_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(".", dir.path()).unwrap();
        let obj = dir.path().join("objects/ab/abc");
        std::fs::create_dir_all(obj.join("a-1/out/deep")).unwrap();
        std::fs::create_dir_all(obj.join("a-2/out")).unwrap();
        std::fs::write(obj.join("a-2/out/v"), b"new").unwrap();
        store.remove_empty_folders("objects/ab/abc/");
        assert!(!obj.join("a-1").exists(), "empty folders go");
        assert_eq!(std::fs::read(obj.join("a-2/out/v")).unwrap(), b"new", "a file published meanwhile stays");
        std::fs::remove_file(obj.join("a-2/out/v")).unwrap();
        store.remove_empty_folders("objects/ab/abc");
        assert!(!obj.exists() && dir.path().join("objects/ab").exists(), "the folder itself goes once empty, not its parent");
    }

    #[cfg(unix)]
    #[test]
    fn removing_empty_folders_never_goes_through_a_link() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(outside.path().join("empty/inner")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(".", dir.path()).unwrap();
        std::fs::create_dir_all(dir.path().join("objects/ab/abc")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("objects/ab/abd")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("empty"), dir.path().join("objects/ab/abc/a-1")).unwrap();
        store.remove_empty_folders("objects/ab/abd");
        store.remove_empty_folders("objects/ab/abc");
        assert!(outside.path().join("empty/inner").is_dir(), "an empty folder behind a link stays");
    }

    #[test]
    fn reads_and_deletes_of_keys_that_leave_the_root_never_touch_the_file_system() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(outside.path().join("victim")).unwrap();
        std::fs::write(outside.path().join("victim/secret"), b"s").unwrap();
        let root = outside.path().join("store");
        std::fs::create_dir(&root).unwrap();
        let store = Store::open(root.to_str().unwrap(), &root).unwrap();
        block(async {
            assert!(store.get("../victim/secret").await.is_err(), "a read outside the root");
            let _ = store.delete_prefix("../victim/").await;
            let _ = store.delete_prefix("../victim").await;
        });
        assert!(outside.path().join("victim/secret").exists(), "a delete outside the root");
    }
}
