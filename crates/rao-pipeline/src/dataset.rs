//! `dataset`: files read straight from a bucket URL (or a local path) into an artifact that later
//! stages take as input. Its fingerprint covers the objects' identities — ETag (else version, else
//! modification time) in a bucket, a content hash for local files — looked up when the pipeline
//! is planned, so a changed dataset re-runs what depends on it and an unchanged one is a cache hit
//! without downloading anything.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{GetOptions, ObjectMeta, ObjectStore, ObjectStoreExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

use crate::kind::{InputDecl, KindSignature, ParamError, StageContext, StageKind, check_typed, parse_typed, resolve_typed};
use crate::store::{is_cloud_scheme, open_cloud};

/// Params of `dataset`.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DatasetParams {
    /// One object (`s3://bucket/tasks.jsonl`, `gs://…`, `az://…`, or a local file relative to the
    /// pipeline file), or a folder: every object under that prefix, keeping relative paths.
    pub url: String,
}

/// One file of a dataset as listed: path relative to the dataset root, size, identity.
#[derive(Debug, Clone, Serialize, PartialEq)]
struct Entry {
    path: String,
    size: u64,
    /// `etag:…`, `version:…` or `modified:…` in a bucket; `blake3:…` for a local file.
    identity: String,
    #[serde(skip)]
    location: Location,
}

#[derive(Debug, Clone, PartialEq)]
enum Location {
    Object(Path),
    File(PathBuf),
}

/// Where a dataset URL points.
enum Source {
    Cloud { store: Arc<dyn ObjectStore>, root: Path },
    Local(PathBuf),
}

impl Source {
    fn open(url: &str, base_dir: &FsPath) -> anyhow::Result<Source> {
        match url.split_once("://").map(|(s, _)| s) {
            Some(s) if is_cloud_scheme(s) => {
                let (store, root) = open_cloud(url).map_err(|e| anyhow::anyhow!("dataset `{url}`: {e}"))?;
                Ok(Source::Cloud { store, root })
            }
            Some("file") => {
                let parsed = url::Url::parse(url)?;
                Ok(Source::Local(parsed.to_file_path().map_err(|_| anyhow::anyhow!("dataset `{url}`: not a local file path"))?))
            }
            Some(other) => anyhow::bail!("dataset `{url}`: unsupported scheme `{other}://`; use s3://, gs://, az://, file:// or a path"),
            None => Ok(Source::Local(base_dir.join(url))),
        }
    }

    /// Every file of the dataset, sorted by path.
    async fn list(&self, url: &str) -> anyhow::Result<Vec<Entry>> {
        let mut entries = match self {
            Source::Cloud { store, root } => list_cloud(store.as_ref(), root).await?,
            Source::Local(path) => match list_local(path) {
                Err(e) if !path.exists() && hub_id_hint(url).is_some() => {
                    anyhow::bail!("dataset `{url}`: {e}. {}", hub_id_hint(url).unwrap_or_default())
                }
                r => r?,
            },
        };
        if entries.is_empty() {
            let hint = hub_id_hint(url).map(|h| format!(". {h}")).unwrap_or_default();
            anyhow::bail!("dataset `{url}`: no object there and none under it{hint}");
        }
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(entries)
    }
}

/// For a missing local path shaped like a Hugging Face Hub id (`Qwen/Qwen3-0.6B`): how to get it.
fn hub_id_hint(url: &str) -> Option<String> {
    let (owner, name) = url.split_once('/')?;
    let word = |w: &str| !w.is_empty() && !w.starts_with('.') && w.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    (word(owner) && word(name)).then(|| {
        format!(
            "`{url}` looks like a Hugging Face Hub id; rao reads models from folders and buckets, not the Hub: download it with \
             `hf download {url} --local-dir $PWD/models/{name}` (pip install huggingface_hub) and give that folder, e.g. \
             `--set params.model=$PWD/models/{name}`"
        )
    })
}

fn identity_of(meta: &ObjectMeta) -> String {
    match (&meta.e_tag, &meta.version) {
        (Some(e), _) => format!("etag:{e}"),
        (None, Some(v)) => format!("version:{v}"),
        (None, None) => format!("modified:{}", meta.last_modified.to_rfc3339()),
    }
}

async fn list_cloud(store: &dyn ObjectStore, root: &Path) -> anyhow::Result<Vec<Entry>> {
    // One object if the URL names one; otherwise everything under it as a prefix.
    if !root.as_ref().is_empty() {
        match store.head(root).await {
            Ok(meta) => {
                let name = root.filename().unwrap_or("data").to_string();
                return Ok(vec![Entry {
                    path: name,
                    size: meta.size,
                    identity: identity_of(&meta),
                    location: Location::Object(root.clone()),
                }]);
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let metas: Vec<ObjectMeta> = store.list(Some(root)).try_collect().await?;
    Ok(metas
        .into_iter()
        .map(|m| {
            let rel = m.location.prefix_match(root).map(|parts| parts.map(|p| p.as_ref().to_string()).collect::<Vec<_>>().join("/"));
            Entry {
                path: rel.unwrap_or_else(|| m.location.to_string()),
                size: m.size,
                identity: identity_of(&m),
                location: Location::Object(m.location.clone()),
            }
        })
        .collect())
}

fn list_local(path: &FsPath) -> anyhow::Result<Vec<Entry>> {
    let hash = |p: &FsPath| -> anyhow::Result<(u64, String)> {
        let (size, hash) = crate::local_file::hash_regular(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        Ok((size, format!("blake3:{}", hash.to_hex())))
    };
    if path.is_file() {
        let (size, identity) = hash(path)?;
        let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| "data".into());
        return Ok(vec![Entry { path: name, size, identity, location: Location::File(path.to_path_buf()) }]);
    }
    let mut out = Vec::new();
    // Each folder with the real paths of the folders above it: a link back up is an error, not a
    // walk without end.
    let mut stack = vec![(path.to_path_buf(), Vec::new())];
    while let Some((dir, mut above)) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&dir) else { continue };
        let real = std::fs::canonicalize(&dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
        anyhow::ensure!(!above.contains(&real), "{}: a link leads back to a folder above it", dir.display());
        above.push(real);
        for e in read {
            let p = e?.path();
            if p.is_dir() {
                stack.push((p, above.clone()));
            } else {
                let (size, identity) = hash(&p)?;
                let rel = p.strip_prefix(path).unwrap().to_string_lossy().replace('\\', "/");
                out.push(Entry { path: rel, size, identity, location: Location::File(p) });
            }
        }
    }
    Ok(out)
}

/// The fingerprint contribution of a listing.
fn listing_id(entries: &[Entry]) -> String {
    blake3::hash(&serde_json::to_vec(entries).expect("a listing serialises")).to_hex().to_string()
}

/// Run `fut` to completion from synchronous code, whether or not a runtime is already running on
/// this thread (planning happens inside the CLI's runtime).
fn block_on_aside<F: Future + Send>(fut: F) -> F::Output
where
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime").block_on(fut))
            .join()
            .expect("dataset listing thread panicked")
    })
}

pub struct Dataset;

impl Dataset {
    /// The kind's name in pipeline files.
    pub const NAME: &'static str = "dataset";
}

impl KindSignature for Dataset {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn version(&self) -> u32 {
        1
    }
    fn describe(&self) -> &'static str {
        "files from a bucket URL or local path, fingerprinted by ETag/version (content hash locally)"
    }
    fn params_schema(&self) -> schemars::Schema {
        schemars::schema_for!(DatasetParams)
    }
    fn check_params(&self, params: &Value) -> Result<(), ParamError> {
        check_typed::<DatasetParams>(params)
    }
    fn resolve_params(&self, params: &Value) -> Result<Value, ParamError> {
        resolve_typed::<DatasetParams>(params)
    }
    fn code_version(&self) -> &'static str {
        env!("RAO_CODE_DATASET")
    }
    fn inputs(&self) -> Option<&'static [InputDecl]> {
        Some(&[])
    }
    fn outputs(&self) -> Option<&'static [&'static str]> {
        Some(&["data"])
    }
    fn fingerprint_extra(&self, params: &Value, base_dir: &FsPath) -> Result<String, String> {
        let p: DatasetParams = parse_typed(params).map_err(|e| e.message)?;
        let source = Source::open(&p.url, base_dir).map_err(|e| format!("{e:#}"))?;
        let entries = block_on_aside(source.list(&p.url)).map_err(|e| format!("{e:#}"))?;
        Ok(listing_id(&entries))
    }
}

impl StageKind for Dataset {
    fn run(&self, ctx: StageContext) -> BoxFuture<'static, anyhow::Result<()>> {
        async move { fetch(ctx).await }.boxed()
    }
}

async fn fetch(ctx: StageContext) -> anyhow::Result<()> {
    let p: DatasetParams = ctx.params_as()?;
    let source = Source::open(&p.url, &ctx.base_dir)?;
    let entries = source.list(&p.url).await?;
    // The fingerprint was taken when the run was planned: never store other data under it.
    anyhow::ensure!(
        listing_id(&entries) == ctx.fingerprint_extra,
        "dataset `{}` changed after this run was planned; run again to use the new version",
        p.url
    );
    let out = ctx.output_dir("data")?;
    let mut bytes = 0u64;
    for e in &entries {
        let target = out.join(&e.path);
        if let Some(parent) = target.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        match (&source, &e.location) {
            (Source::Cloud { store, .. }, Location::Object(path)) => {
                // Ask for exactly the listed version: a concurrent overwrite fails instead of mixing.
                let if_match = e.identity.strip_prefix("etag:").map(str::to_string);
                let got = store.get_opts(path, GetOptions { if_match, ..Default::default() }).await?;
                let mut file = tokio::fs::File::create(&target).await?;
                let mut stream = got.into_stream();
                while let Some(chunk) = stream.next().await {
                    file.write_all(&chunk?).await?;
                }
                file.flush().await?;
            }
            (_, Location::File(path)) => {
                let data = tokio::fs::read(path).await?;
                anyhow::ensure!(
                    format!("blake3:{}", blake3::hash(&data).to_hex()) == e.identity,
                    "dataset file {} changed while it was read; run again",
                    path.display()
                );
                tokio::fs::write(&target, data).await?;
            }
            (Source::Local(_), Location::Object(_)) => unreachable!("local datasets list files"),
        }
        bytes += e.size;
    }
    ctx.set_metric("files", entries.len() as f64);
    ctx.set_metric("bytes", bytes as f64);
    Ok(())
}
