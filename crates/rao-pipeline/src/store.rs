//! The artifact store: one object-store prefix holding every stage's outputs, manifests,
//! run records and the status index. Local directory by default; memory, S3, GCS and Azure by URL.

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store `{url}`: {message}")]
    Open { url: String, message: String },
    #[error("store object `{key}`: {source}")]
    Object { key: String, source: object_store::Error },
    #[error("store object `{key}` is not valid JSON: {source}")]
    Json { key: String, source: serde_json::Error },
    #[error("reading local file {path}: {source}")]
    Local { path: String, source: std::io::Error },
}

/// A handle to the store; cheap to clone and shared by every stage of a run.
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    prefix: Path,
    url: String,
    /// For a local directory store: its root, so local tools can read artifacts in place.
    local_root: Option<PathBuf>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({})", self.url)
    }
}

impl Store {
    /// Open a store from a URL or a path; relative paths are taken from `base_dir`.
    /// Cloud credentials come from the usual environment variables (AWS_*, GOOGLE_*, AZURE_*).
    pub fn open(url: &str, base_dir: &FsPath) -> StoreResult<Store> {
        let err = |m: String| StoreError::Open { url: url.to_string(), message: m };
        let scheme = url.split_once("://").map(|(s, _)| s);
        match scheme {
            Some("memory") => Ok(Store {
                inner: Arc::new(object_store::memory::InMemory::new()),
                prefix: Path::default(),
                url: url.to_string(),
                local_root: None,
            }),
            Some(s) if is_cloud_scheme(s) => {
                let (inner, prefix) = open_cloud(url).map_err(err)?;
                Ok(Store { inner, prefix, url: url.to_string(), local_root: None })
            }
            Some("file") => {
                let parsed = url::Url::parse(url).map_err(|e| err(e.to_string()))?;
                let path = parsed.to_file_path().map_err(|_| err("not a local file path".into()))?;
                Self::open_local(url, &path)
            }
            Some(other) => {
                Err(err(format!("unknown store scheme `{other}://`; use a local path, file://, memory://, s3://, gs:// or az://")))
            }
            None => {
                let path = if FsPath::new(url).is_absolute() { PathBuf::from(url) } else { base_dir.join(url) };
                Self::open_local(url, &path)
            }
        }
    }

    fn open_local(url: &str, path: &FsPath) -> StoreResult<Store> {
        std::fs::create_dir_all(path)
            .map_err(|e| StoreError::Open { url: url.to_string(), message: format!("cannot create directory {}: {e}", path.display()) })?;
        let root = path.canonicalize().map_err(|e| StoreError::Local { path: path.display().to_string(), source: e })?;
        let fs = object_store::local::LocalFileSystem::new_with_prefix(&root)
            .map_err(|e| StoreError::Open { url: url.to_string(), message: e.to_string() })?;
        Ok(Store { inner: Arc::new(fs), prefix: Path::default(), url: url.to_string(), local_root: Some(root) })
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

    fn path(&self, key: &str) -> Path {
        if self.prefix.as_ref().is_empty() { Path::from(key) } else { Path::from(format!("{}/{}", self.prefix.as_ref(), key)) }
    }

    fn strip(&self, p: &Path) -> String {
        let s = p.as_ref();
        let pre = self.prefix.as_ref();
        if pre.is_empty() { s.to_string() } else { s.strip_prefix(pre).unwrap_or(s).trim_start_matches('/').to_string() }
    }

    /// Write an object. Local and cloud stores make the object visible whole or not at all.
    pub async fn put(&self, key: &str, bytes: Bytes) -> StoreResult<()> {
        self.inner
            .put(&self.path(key), PutPayload::from_bytes(bytes))
            .await
            .map(|_| ())
            .map_err(|e| StoreError::Object { key: key.to_string(), source: e })
    }

    pub async fn get(&self, key: &str) -> StoreResult<Bytes> {
        // A local store is read directly: object_store hops to a blocking thread per read, which
        // dominates a fully cached run of many small stages.
        if let Some(path) = self.local_path(key) {
            return match std::fs::read(&path) {
                Ok(b) => Ok(Bytes::from(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(StoreError::Object {
                    key: key.to_string(),
                    source: object_store::Error::NotFound { path: path.display().to_string(), source: Box::new(e) },
                }),
                Err(e) => Err(StoreError::Local { path: path.display().to_string(), source: e }),
            };
        }
        let map = |e| StoreError::Object { key: key.to_string(), source: e };
        self.inner.get(&self.path(key)).await.map_err(map)?.bytes().await.map_err(map)
    }

    pub async fn get_opt(&self, key: &str) -> StoreResult<Option<Bytes>> {
        match self.get(key).await {
            Ok(b) => Ok(Some(b)),
            Err(StoreError::Object { source: object_store::Error::NotFound { .. }, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn exists(&self, key: &str) -> StoreResult<bool> {
        match self.inner.head(&self.path(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(StoreError::Object { key: key.to_string(), source: e }),
        }
    }

    /// Every object under `prefix` (recursively), as (key relative to the store, size).
    pub async fn list(&self, prefix: &str) -> StoreResult<Vec<(String, u64)>> {
        let p = self.path(prefix);
        let metas: Vec<_> =
            self.inner.list(Some(&p)).try_collect().await.map_err(|e| StoreError::Object { key: prefix.to_string(), source: e })?;
        let mut out: Vec<(String, u64)> = metas.iter().map(|m| (self.strip(&m.location), m.size)).collect();
        out.sort();
        Ok(out)
    }

    pub async fn get_json<T: for<'de> Deserialize<'de>>(&self, key: &str) -> StoreResult<Option<T>> {
        match self.get_opt(key).await? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b).map(Some).map_err(|e| StoreError::Json { key: key.to_string(), source: e }),
        }
    }

    pub async fn put_json<T: Serialize>(&self, key: &str, value: &T) -> StoreResult<()> {
        let bytes = serde_json::to_vec_pretty(value).expect("serialising to JSON cannot fail");
        self.put(key, Bytes::from(bytes)).await
    }

    pub async fn delete_prefix(&self, prefix: &str) -> StoreResult<()> {
        for (key, _) in self.list(prefix).await? {
            self.inner.delete(&self.path(&key)).await.map_err(|e| StoreError::Object { key: key.clone(), source: e })?;
        }
        Ok(())
    }
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

/// Where the artifacts of the stage instance with fingerprint `fp` live.
pub fn object_dir(fp: &str) -> String {
    format!("objects/{}/{}", &fp[..2], fp)
}

pub fn manifest_key(fp: &str) -> String {
    format!("{}/MANIFEST.json", object_dir(fp))
}

pub fn output_prefix(fp: &str, output: &str) -> String {
    format!("{}/out/{}", object_dir(fp), output)
}

/// One file of an output.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileEntry {
    /// Path relative to the output's directory.
    pub path: String,
    pub size: u64,
    pub blake3: String,
}

/// Written last, after every output file: its presence is what "done" means.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub fingerprint: String,
    pub kind: String,
    pub kind_version: u32,
    pub instance: String,
    pub pipeline: String,
    pub outputs: BTreeMap<String, Vec<FileEntry>>,
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    pub started_at: f64,
    pub finished_at: f64,
    pub attempts: u32,
}
