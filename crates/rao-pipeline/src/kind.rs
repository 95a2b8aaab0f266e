//! Stage kinds are plugins: registered by name, with typed params and declared inputs/outputs.
//! The engine knows nothing else about them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use rao_plan::kind::{InputDecl, KindSignature, ParamError, Upstream, check_typed, parse_typed, resolve_typed};

use crate::InputArtifact;
use crate::integrity;
use crate::progress::StageProgress;
use crate::store::Store;

/// A kind the runner can run: its signature (what the planner checks) and its work.
pub trait StageKind: KindSignature {
    fn run(&self, ctx: StageContext) -> BoxFuture<'static, anyhow::Result<()>>;
}

/// What a running stage sees: its params, seed, inputs and where to write outputs.
/// Everything comes from the pipeline and the store, never from scheduler memory.
pub struct StageContext {
    pub pipeline: String,
    pub instance: String,
    pub fingerprint: String,
    /// This instance's seed, derived from the pipeline seed and the instance's identity.
    pub seed: u64,
    pub params: Value,
    /// What the kind's `fingerprint_extra` returned when the run was planned (e.g. a dataset's
    /// listing), so the stage can check that what it reads is what was fingerprinted.
    pub fingerprint_extra: String,
    /// The directory of the pipeline file (relative paths in params are taken from here).
    pub base_dir: PathBuf,
    pub inputs: BTreeMap<String, Vec<InputArtifact>>,
    pub outputs: Vec<String>,
    pub store: Store,
    /// Private scratch space, removed after the stage.
    pub scratch: PathBuf,
    pub(crate) staging: PathBuf,
    pub(crate) recorded: Arc<Mutex<Recorded>>,
    pub(crate) progress: StageProgress,
    pub(crate) cancel: CancellationToken,
}

impl StageContext {
    pub fn params_as<P: DeserializeOwned + schemars::JsonSchema + 'static>(&self) -> anyhow::Result<P> {
        parse_typed::<P>(&self.params).map_err(|e| anyhow::anyhow!(e.message))
    }

    /// The local directory the stage writes output `name` into; uploaded when the stage succeeds.
    pub fn output_dir(&self, name: &str) -> anyhow::Result<PathBuf> {
        anyhow::ensure!(
            self.outputs.iter().any(|o| o == name),
            "stage `{}` wrote to undeclared output `{name}` (declared: {})",
            self.instance,
            self.outputs.join(", ")
        );
        let dir = crate::staging::staged_output(&self.staging, name);
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// Write one file of an output.
    pub fn write_output(&self, name: &str, file: &str, bytes: &[u8]) -> anyhow::Result<()> {
        let path = self.output_dir(name)?.join(file);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, bytes)?;
        Ok(())
    }

    /// The artifacts of input `name` (several when it names a fanned-out stage or a list).
    pub fn input(&self, name: &str) -> anyhow::Result<&[InputArtifact]> {
        self.inputs.get(name).map(|v| v.as_slice()).ok_or_else(|| anyhow::anyhow!("stage `{}` has no input named `{name}`", self.instance))
    }

    /// Read one file of one input artifact; its bytes are checked against the manifest.
    pub async fn read_input_file(&self, artifact: &InputArtifact, path: &str) -> anyhow::Result<Bytes> {
        let bytes = match self.store.get(&artifact.key(path)).await {
            Ok(b) => b,
            Err(crate::store::StoreError::NotFound { .. }) if artifact.files.iter().any(|f| f.path == path) => {
                return Err(integrity::InputDamaged {
                    producer: artifact.instance.clone(),
                    fingerprint: artifact.fingerprint.clone(),
                    attempt: artifact.attempt.clone(),
                    output: artifact.output.clone(),
                    why: format!("file `{path}` is missing"),
                }
                .into());
            }
            Err(e) => return Err(e.into()),
        };
        integrity::check_bytes(artifact, path, &bytes)?;
        Ok(bytes)
    }

    /// A local directory holding the artifact's files, checked against the manifest: in place
    /// for a local store (never write into it), else downloaded.
    pub async fn input_dir(&self, artifact: &InputArtifact) -> anyhow::Result<PathBuf> {
        if let Some(dir) = self.store.local_path(&artifact.prefix()) {
            if artifact.files.is_empty() {
                std::fs::create_dir_all(&dir)?;
            }
            integrity::check_dir(artifact, &dir)?;
            return Ok(dir);
        }
        let dir = self.scratch.join("in").join(&artifact.fingerprint).join(&artifact.output);
        std::fs::create_dir_all(&dir)?;
        for f in &artifact.files {
            let bytes = self.read_input_file(artifact, &f.path).await?;
            let target = dir.join(&f.path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(target, bytes)?;
        }
        Ok(dir)
    }

    /// Resumable progress saved by an earlier attempt of this same instance (same fingerprint),
    /// if any: a long stage that was killed picks up from here. Checked: damaged progress is
    /// ignored (the stage starts over).
    pub async fn load_progress(&self, name: &str) -> anyhow::Result<Option<Bytes>> {
        crate::layout::check_component("progress name", name).map_err(|e| anyhow::anyhow!(e))?;
        let key = format!("{}/{name}", crate::layout::progress_prefix(&self.fingerprint));
        let Some(bytes) = self.store.get_opt(&key).await? else { return Ok(None) };
        if bytes.len() < 32 || blake3::hash(&bytes[32..]).as_bytes() != &bytes[..32] {
            return Ok(None);
        }
        Ok(Some(bytes.slice(32..)))
    }

    /// Save resumable progress (written whole or not at all; removed once the stage is published).
    pub async fn save_progress(&self, name: &str, payload: &[u8]) -> anyhow::Result<()> {
        crate::layout::check_component("progress name", name).map_err(|e| anyhow::anyhow!(e))?;
        let key = format!("{}/{name}", crate::layout::progress_prefix(&self.fingerprint));
        let mut bytes = Vec::with_capacity(32 + payload.len());
        bytes.extend_from_slice(blake3::hash(payload).as_bytes());
        bytes.extend_from_slice(payload);
        Ok(self.store.put(&key, Bytes::from(bytes)).await?)
    }

    /// Report how far the stage is: `done` of `total` `unit`s (`"steps"`, `"trees"`), with the
    /// latest numbers worth seeing in `message` (e.g. `"loss 0.412"`). Cheap: call it every step;
    /// the updates that reach the terminal and `--json` are thinned out.
    pub fn progress(&self, done: u64, total: u64, unit: &str, message: impl Into<String>) {
        self.progress.progress(done, total, unit, message.into())
    }

    /// Report a milestone (e.g. a gate check's result): a line of its own on the terminal and a
    /// `note` event.
    pub fn note(&self, message: impl Into<String>) {
        self.progress.note(message.into())
    }

    /// Whether the run is being cancelled (Ctrl-C).
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Call between the steps of a long computation that does not otherwise await: an error once
    /// the run is cancelled, else a yield to the runtime (so a cancelled run can stop this stage
    /// here, without waiting for its next I/O).
    pub async fn cancellation_point(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.cancel.is_cancelled(), "cancelled");
        tokio::task::yield_now().await;
        Ok(())
    }

    /// Record a metric in the manifest (loops can stop on them; reports read them).
    pub fn set_metric(&self, name: &str, value: f64) {
        self.recorded.lock().metrics.insert(name.to_string(), value);
    }

    /// Record a point of a curve within the stage (`metric` at `step`, e.g. the loss at a
    /// training step): the run's trackers get it at once, the manifest keeps the curve for the
    /// report. Non-finite values are not recorded.
    pub fn record(&self, metric: &str, step: u64, value: f64) {
        if value.is_finite() {
            self.recorded.lock().curves.entry(metric.to_string()).or_default().push((step, value));
            self.progress.metric(metric, step, value);
        }
    }
}

/// What a running stage records for its manifest: its metrics and its curves.
#[derive(Debug, Default)]
pub struct Recorded {
    pub(crate) metrics: BTreeMap<String, f64>,
    pub(crate) curves: BTreeMap<String, Vec<(u64, f64)>>,
}

/// The easy way to write a kind: typed params and fixed inputs/outputs. Register with
/// `registry.register(Arc::new(Typed::<MyStage>::default()))`.
pub trait TypedStage: Send + Sync + 'static {
    type Params: DeserializeOwned + serde::Serialize + schemars::JsonSchema + Send + 'static;
    const NAME: &'static str;
    /// Bump to force recomputation when outputs would change for the same params, inputs and
    /// code (rarely needed: `code` changes with the sources).
    const VERSION: u32;
    /// See `StageKind::code_version`.
    fn code() -> &'static str {
        ""
    }
    /// See `StageKind::machine_profile`.
    fn machine_profile(_params: &Self::Params) -> String {
        String::new()
    }
    /// See `StageKind::check`.
    fn check(_params: &Self::Params, _inputs: &[&str]) -> Vec<ParamError> {
        Vec::new()
    }
    /// See `StageKind::check_upstream`.
    fn check_upstream(_params: &Self::Params, _upstream: &dyn Fn() -> Vec<Upstream>) -> Vec<ParamError> {
        Vec::new()
    }
    const DESCRIBE: &'static str;
    const INPUTS: &'static [InputDecl];
    const OUTPUTS: &'static [&'static str];
    fn run(ctx: StageContext, params: Self::Params) -> BoxFuture<'static, anyhow::Result<()>>;
}

pub struct Typed<T>(std::marker::PhantomData<T>);

impl<T> Default for Typed<T> {
    fn default() -> Self {
        Typed(std::marker::PhantomData)
    }
}

impl<T: TypedStage> KindSignature for Typed<T> {
    fn name(&self) -> &'static str {
        T::NAME
    }
    fn version(&self) -> u32 {
        T::VERSION
    }
    fn describe(&self) -> &'static str {
        T::DESCRIBE
    }
    fn params_schema(&self) -> schemars::Schema {
        schemars::schema_for!(T::Params)
    }
    fn check_params(&self, params: &Value) -> Result<(), ParamError> {
        check_typed::<T::Params>(params)
    }
    fn code_version(&self) -> &'static str {
        T::code()
    }
    fn machine_profile(&self, params: &Value) -> String {
        parse_typed::<T::Params>(params).map(|p| T::machine_profile(&p)).unwrap_or_default()
    }
    fn resolve_params(&self, params: &Value) -> Result<Value, ParamError> {
        resolve_typed::<T::Params>(params)
    }
    fn check(&self, params: &Value, inputs: &[&str]) -> Vec<ParamError> {
        match parse_typed::<T::Params>(params) {
            Ok(p) => T::check(&p, inputs),
            Err(e) => vec![e],
        }
    }
    fn check_upstream(&self, params: &Value, upstream: &dyn Fn() -> Vec<Upstream>) -> Vec<ParamError> {
        match parse_typed::<T::Params>(params) {
            Ok(p) => T::check_upstream(&p, upstream),
            Err(e) => vec![e],
        }
    }
    fn inputs(&self) -> Option<&'static [InputDecl]> {
        Some(T::INPUTS)
    }
    fn outputs(&self) -> Option<&'static [&'static str]> {
        Some(T::OUTPUTS)
    }
}

impl<T: TypedStage> StageKind for Typed<T> {
    fn run(&self, ctx: StageContext) -> BoxFuture<'static, anyhow::Result<()>> {
        match ctx.params_as::<T::Params>() {
            Ok(p) => T::run(ctx, p),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }
}

impl StageContext {
    /// The metrics recorded so far.
    pub fn metrics_snapshot(&self) -> BTreeMap<String, f64> {
        self.recorded.lock().metrics.clone()
    }
}
