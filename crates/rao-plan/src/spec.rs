//! The pipeline file as written: serde types that keep every value's source position.
//!
//! These types are also the source of `schemas/pipeline.schema.json` (see `schema.rs`), so the
//! schema editors see and the parser rao uses cannot drift apart.

use std::fmt;

use schemars::JsonSchema;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A position in a pipeline file (1-based line and column); line 0 means "not from the file".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Pos {
    pub line: u64,
    pub column: u64,
}

impl Pos {
    pub const NONE: Pos = Pos { line: 0, column: 0 };
}

/// A value together with where it was written.
#[derive(Debug, Clone)]
pub struct Sp<T> {
    pub value: T,
    pub pos: Pos,
}

impl<T> Sp<T> {
    pub fn new(value: T, pos: Pos) -> Self {
        Sp { value, pos }
    }
    pub fn synthetic(value: T) -> Self {
        Sp { value, pos: Pos::NONE }
    }
}

impl<T: Default> Default for Sp<T> {
    fn default() -> Self {
        Sp::synthetic(T::default())
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Sp<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = serde_saphyr::Spanned::<T>::deserialize(d)?;
        let pos = Pos { line: s.referenced.line(), column: s.referenced.column() };
        Ok(Sp { value: s.value, pos })
    }
}

impl<T: Serialize> Serialize for Sp<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

impl<T: JsonSchema> JsonSchema for Sp<T> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        T::schema_name()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        T::json_schema(generator)
    }
    fn inline_schema() -> bool {
        T::inline_schema()
    }
}

/// A YAML mapping that keeps its keys' order and positions and rejects duplicate keys.
#[derive(Debug, Clone)]
pub struct OrderedMap<V> {
    pub entries: Vec<(Sp<String>, V)>,
}

impl<V> Default for OrderedMap<V> {
    fn default() -> Self {
        OrderedMap { entries: Vec::new() }
    }
}

impl<V> OrderedMap<V> {
    pub fn get(&self, key: &str) -> Option<&V> {
        self.entries.iter().find(|(k, _)| k.value == key).map(|(_, v)| v)
    }
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.entries.iter_mut().find(|(k, _)| k.value == key).map(|(_, v)| v)
    }
    pub fn key_pos(&self, key: &str) -> Option<Pos> {
        self.entries.iter().find(|(k, _)| k.value == key).map(|(k, _)| k.pos)
    }
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.value.as_str())
    }
    pub fn keys_sp(&self) -> impl Iterator<Item = &Sp<String>> {
        self.entries.iter().map(|(k, _)| k)
    }
    pub fn iter(&self) -> impl Iterator<Item = (&Sp<String>, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }
    pub fn insert(&mut self, key: Sp<String>, value: V) {
        match self.get_mut(&key.value) {
            Some(v) => *v = value,
            None => self.entries.push((key, value)),
        }
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for OrderedMap<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MapVisitor<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for MapVisitor<V> {
            type Value = OrderedMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = OrderedMap { entries: Vec::new() };
                // Hashed: a pipeline can have tens of thousands of stages.
                let mut seen: std::collections::HashMap<String, Pos> = std::collections::HashMap::new();
                while let Some(key) = map.next_key::<Sp<String>>()? {
                    if let Some(first) = seen.insert(key.value.clone(), key.pos) {
                        return Err(serde::de::Error::custom(format!(
                            "duplicate key `{}` (first defined at line {}); each name may appear once",
                            key.value, first.line
                        )));
                    }
                    let value = map.next_value::<V>()?;
                    out.entries.push((key, value));
                }
                Ok(out)
            }
        }
        d.deserialize_map(MapVisitor(std::marker::PhantomData))
    }
}

impl<V: Serialize> Serialize for OrderedMap<V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.entries.len()))?;
        for (k, v) in &self.entries {
            m.serialize_entry(&k.value, v)?;
        }
        m.end()
    }
}

impl<V: JsonSchema> JsonSchema for OrderedMap<V> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        format!("Map_of_{}", V::schema_name()).into()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "object",
            "additionalProperties": generator.subschema_for::<V>(),
        })
    }
    fn inline_schema() -> bool {
        true
    }
}

/// The whole pipeline file.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineFile {
    /// Optional JSON Schema reference for editors; ignored by rao.
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// Pipeline name: names its run records and status index in the store.
    pub name: Sp<String>,
    /// Root seed: every random draw of every stage derives from it.
    #[serde(default)]
    pub seed: Sp<u64>,
    /// Where artifacts live: a local path (default `.rao/store` next to the file), `file://`,
    /// `memory://`, `s3://bucket/prefix`, `gs://bucket/prefix` or `az://container/prefix`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<Sp<String>>,
    /// Global parameters, usable in stage params as `${params.NAME}`.
    #[serde(default)]
    pub params: OrderedMap<Sp<Value>>,
    /// Where stage instances run unless a stage or `rao run --executor` says otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<ExecutorSpec>,
    /// Where each run is exported when it ends (as with `rao run --track`). Not part of any
    /// fingerprint; an export that fails is a warning, never a failed run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<TrackingSpec>,
    /// The stages, by name. Order does not matter: inputs make the edges.
    pub stages: OrderedMap<StageSpec>,
}

/// A variant: another pipeline file plus changes (the flat baseline, the ablations), without a copy.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VariantFile {
    /// Optional JSON Schema reference for editors; ignored by rao.
    #[serde(rename = "$schema", default)]
    pub schema: Option<String>,
    /// The pipeline file this one changes (a path relative to this file).
    pub extends: Sp<String>,
    /// This variant's name (its run records and status index are its own).
    pub name: Sp<String>,
    /// Free text for humans.
    #[serde(default)]
    pub description: Option<String>,
    /// Changes as `--set` takes them: `PATH: VALUE`, e.g. `stages.rollout.params.mode: flat`.
    #[serde(default)]
    #[schemars(extend("propertyNames" = {"pattern": SET_PATH_PATTERN}))]
    pub set: OrderedMap<Sp<Value>>,
}

/// The paths `--set` and a variant's `set` accept (see `overrides.rs`).
pub const SET_PATH_PATTERN: &str = r"^(name|seed|store|params\.[^.]+(\.[^.]+)*|stages\.[^.]+\.(params\.[^.]+(\.[^.]+)*|retries|timeout|loop\.max_iterations|loop\.lag\.[^.]+\.by))$";

/// One stage (or one loop of stages).
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    /// The stage kind (a registered plugin such as `shell`); absent for a `loop` block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Sp<String>>,
    /// Free text for humans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The kind's typed parameters. Strings may use `${params.X}`, `${matrix.X}`, `${loop.iteration}`.
    #[serde(default)]
    pub params: OrderedMap<Sp<Value>>,
    /// Inputs by name: `STAGE.OUTPUT` (or a list of them); `loop.VAR` inside a loop body.
    #[serde(default)]
    pub inputs: OrderedMap<Sp<InputRef>>,
    /// Output names this stage writes (only for kinds whose outputs are not fixed, e.g. `shell`).
    #[serde(default)]
    pub outputs: Vec<Sp<String>>,
    /// How many times a failed attempt is retried (with exponential backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<Sp<u32>>,
    /// Per-attempt time limit: seconds, or a string such as `90s`, `10m`, `2h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Sp<Duration>>,
    /// Resources one instance needs; the scheduler never over-commits the run's limits.
    #[serde(default)]
    pub resources: Resources,
    /// Where this stage's instances run (overrides the pipeline's and the command line's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<ExecutorSpec>,
    /// Fan the stage out over values: one instance per combination, e.g. `{band: [easy, hard]}`.
    #[serde(default)]
    pub matrix: OrderedMap<Sp<Vec<Value>>>,
    /// In a loop body: run only on iterations N, 2N, … and the loop's last (`max_iterations`),
    /// e.g. a held-out evaluation every 10 iterations. No body stage, carry or stop may read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<Sp<u32>>,
    /// Makes this entry a loop: its `stages` run once per iteration.
    #[serde(rename = "loop", default, skip_serializing_if = "Option::is_none")]
    pub loop_: Option<LoopSpec>,
    /// The loop body (only with `loop`).
    #[serde(default)]
    pub stages: OrderedMap<StageSpec>,
}

/// `STAGE.OUTPUT`, or a list of such references.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum InputRef {
    One(String),
    Many(Vec<String>),
}

impl InputRef {
    pub fn refs(&self) -> Vec<&str> {
        match self {
            InputRef::One(s) => vec![s.as_str()],
            InputRef::Many(v) => v.iter().map(|s| s.as_str()).collect(),
        }
    }
}

/// A duration written as seconds (`30`) or with a unit (`500ms`, `30s`, `10m`, `2h`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, JsonSchema)]
#[schemars(with = "DurationSchema")]
pub struct Duration(#[serde(serialize_with = "ser_secs")] pub std::time::Duration);

fn ser_secs<S: serde::Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum DurationSchema {
    Seconds(f64),
    /// A number with a unit: `500ms`, `30s`, `10m`, `2h`.
    Text(String),
}

impl Duration {
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        // The unit is the trailing letters (`1e20` is a number of seconds, `1e20s` too).
        let num = t.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let unit = match &t[num.len()..] {
            "" => "s",
            u => u,
        };
        let n: f64 = num
            .trim()
            .parse()
            .map_err(|_| format!("`{text}` is not a duration; write seconds (`30`) or a number with ms, s, m or h (`10m`)"))?;
        let secs = match unit {
            "ms" => n / 1000.0,
            "s" => n,
            "m" => n * 60.0,
            "h" => n * 3600.0,
            _ => return Err(format!("unknown duration unit `{unit}` in `{text}`; use ms, s, m or h")),
        };
        if !(secs.is_finite() && secs > 0.0) {
            return Err(format!("duration `{text}` must be positive"));
        }
        if secs > crate::check::MAX_TIMEOUT_S {
            return Err(format!("duration `{text}` is longer than a year; write a shorter one (e.g. `2h`)"));
        }
        std::time::Duration::try_from_secs_f64(secs).map(Duration).map_err(|_| format!("`{text}` is not a usable duration"))
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(f64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Duration::parse(&n.to_string()).map_err(serde::de::Error::custom),
            Raw::S(s) => Duration::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

/// An execution engine. Not part of any fingerprint: where a stage runs does not change what it
/// computes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutorSpec {
    pub kind: ExecutorKind,
    /// `ray`: the Ray dashboard (Jobs API) URL, e.g. `http://head:8265`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ExecutorKind {
    /// Inside the `rao run` process.
    InProcess,
    /// Each instance as a `rao exec` child process.
    Process,
    /// Each instance as a Ray job (entrypoint `rao exec`).
    Ray,
}

/// Trackers a run is exported to: its metrics per iteration, evaluations, parameters and report.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrackingSpec {
    /// A TensorBoard log directory (relative to the pipeline file): `tensorboard --logdir DIR`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensorboard: Option<Sp<String>>,
    /// An MLflow tracking server, e.g. `http://127.0.0.1:5000`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlflow: Option<Sp<String>>,
    /// The MLflow experiment (default: the pipeline's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment: Option<String>,
}

/// Resource needs of one stage instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// GPUs the instance holds while it runs.
    #[serde(default)]
    pub gpu: u32,
    /// CPU slots the instance holds (default 1; 0 for stages that only wait).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
}

/// A bounded loop: the body is instantiated as `STAGE@1 .. STAGE@N`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoopSpec {
    /// Upper bound on iterations (required: RL loops must end).
    pub max_iterations: Sp<u32>,
    /// Loop variables for iteration 1: `VAR: STAGE.OUTPUT` outside the loop.
    #[serde(default)]
    pub init: OrderedMap<Sp<String>>,
    /// What iteration k hands to iteration k+1: `VAR: BODYSTAGE.OUTPUT`. Outside the loop,
    /// `LOOPNAME.VAR` is the value after the last iteration that ran.
    #[serde(default)]
    pub carry: OrderedMap<Sp<String>>,
    /// Stop early once a metric of a body stage crosses a threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_when: Option<StopWhen>,
    /// Lagged loop variables: `VAR: {of: CARRIED, by: K}` makes `loop.VAR` in iteration i the
    /// value `CARRIED` had after iteration i−1−K (its `init` while that is before iteration 1).
    /// A rollout reading a policy K updates old may then run beside the K updates in between:
    /// asynchronous training with a fixed staleness, deterministic and resumable.
    #[serde(default)]
    pub lag: OrderedMap<LagSpec>,
}

/// One lagged loop variable: the carried variable it follows and how many iterations behind.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LagSpec {
    /// A variable under the loop's `carry`.
    pub of: Sp<String>,
    /// Iterations behind the freshest value (0: the same as `loop.CARRIED`).
    pub by: Sp<u32>,
}

/// Early stop: `metric: BODYSTAGE.METRIC` with `above` and/or `below` thresholds.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopWhen {
    pub metric: Sp<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub above: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub below: Option<f64>,
}
