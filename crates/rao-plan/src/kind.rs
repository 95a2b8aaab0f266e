//! Stage kinds as the planner sees them: registered by name, with typed params and declared
//! inputs/outputs. How a kind runs is not this crate's business.

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A problem with one parameter: `key` is the top-level param it concerns (if known).
#[derive(Debug, Clone)]
pub struct ParamError {
    pub key: Option<String>,
    pub message: String,
    pub help: Option<String>,
}

/// A stage upstream of the one being checked: its name, kind and params with defaults filled.
pub struct Upstream {
    pub stage: String,
    pub kind: &'static str,
    pub params: Value,
    /// The pipeline file's folder (relative paths in `params` are relative to it).
    pub base_dir: std::path::PathBuf,
}

/// A declared input of a kind.
#[derive(Debug, Clone, Copy)]
pub struct InputDecl {
    pub name: &'static str,
    pub required: bool,
}

/// What the planner knows of a kind: its name, parameters, inputs and outputs, and what goes into
/// its fingerprints. How it runs is the runner's (`rao_pipeline::StageKind`).
pub trait KindSignature: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// Bump when the kind's behaviour changes: it is part of every fingerprint.
    fn version(&self) -> u32;
    fn describe(&self) -> &'static str;
    /// JSON Schema of `params` (for the pipeline schema and editors).
    fn params_schema(&self) -> schemars::Schema;
    fn check_params(&self, params: &Value) -> Result<(), ParamError>;
    /// Declared inputs; `None` accepts any input names (e.g. `shell`).
    fn inputs(&self) -> Option<&'static [InputDecl]>;
    /// Declared outputs; `None` takes them from the stage's `outputs:` list.
    fn outputs(&self) -> Option<&'static [&'static str]>;
    /// The params in which the kind replaces `${inputs.NAME}` and `${outputs.NAME}` with folders
    /// when it runs: the compiler checks that each NAME is one of the stage's.
    fn io_placeholder_params(&self) -> &'static [&'static str] {
        &[]
    }
    /// Extra content hashed into the fingerprint (e.g. files a command reads).
    fn fingerprint_extra(&self, _params: &Value, _base_dir: &Path) -> Result<String, String> {
        Ok(String::new())
    }
    /// A hash of the source code that produces this kind's outputs, computed at build time
    /// (part of the fingerprint: changed code is a cache miss without bumping `version`).
    fn code_version(&self) -> &'static str {
        ""
    }
    /// What makes this kind's output bits depend on the machine that computes them (e.g. the SIMD
    /// path of CPU kernels); part of the fingerprint, so machines that differ never share results.
    fn machine_profile(&self, _params: &Value) -> String {
        String::new()
    }
    /// The params as the kind will use them, defaults filled in: what the fingerprint hashes, so
    /// writing a default out is no cache miss and changing a default is one.
    fn resolve_params(&self, params: &Value) -> Result<Value, ParamError> {
        Ok(params.clone())
    }
    /// Checks across params and inputs that `rao validate` runs before anything executes
    /// (e.g. a minimum above a maximum). `inputs` are the names of the inputs given.
    fn check(&self, _params: &Value, _inputs: &[&str]) -> Vec<ParamError> {
        Vec::new()
    }
    /// Checks against the stages upstream of this one, which `upstream()` lists on demand
    /// (nearest first, through inputs transitively): e.g. an update must use its rollout's
    /// grammar.
    fn check_upstream(&self, _params: &Value, _upstream: &dyn Fn() -> Vec<Upstream>) -> Vec<ParamError> {
        Vec::new()
    }
}

/// Check `params` against a serde type `P` (use `#[serde(deny_unknown_fields)]` on it), and
/// refuse keys that `P` would silently drop where that attribute does not reach
/// ([`crate::unknown_keys`]).
pub fn check_typed<P: DeserializeOwned + schemars::JsonSchema + 'static>(params: &Value) -> Result<(), ParamError> {
    parse_typed::<P>(params)?;
    let unknown = crate::unknown_keys::unknown_keys(&schema_of::<P>(), params);
    let Some(first) = unknown.first() else { return Ok(()) };
    let key = first.path.split(['.', '[']).next().unwrap_or(&first.path).to_string();
    let more = match unknown.len() {
        1 => String::new(),
        n => format!(" (and {} more: {})", n - 1, unknown[1..].iter().map(|u| u.path.as_str()).collect::<Vec<_>>().join(", ")),
    };
    let name = first.path.rsplit(['.', ']']).next().unwrap_or(&first.path);
    let help = crate::diag::did_you_mean(name, first.declared.iter().map(String::as_str))
        .unwrap_or_else(|| format!("remove it: the keys here are {}", first.declared.join(", ")));
    Err(ParamError {
        key: Some(key),
        message: format!("params.{}: unknown key, which this kind would ignore{more}", first.path),
        help: Some(help),
    })
}

/// The first paragraph of the schema's description of top-level key `key`, on one line.
fn described(schema: &Value, key: &str) -> Option<String> {
    let text = schema.get("properties")?.get(key)?.get("description")?.as_str()?;
    Some(text.split("\n\n").next().unwrap_or(text).split_whitespace().collect::<Vec<_>>().join(" "))
}

/// `P`'s JSON Schema, made once per type (a plan checks every instance).
fn schema_of<P: schemars::JsonSchema + 'static>() -> std::sync::Arc<Value> {
    use std::any::TypeId;
    use std::collections::HashMap;
    use std::sync::{Arc, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<TypeId, Arc<Value>>>> = OnceLock::new();
    let mut cache = CACHE.get_or_init(Default::default).lock();
    cache.entry(TypeId::of::<P>()).or_insert_with(|| Arc::new(schemars::schema_for!(P).to_value())).clone()
}

/// `params` parsed into `P` and written back: every default filled in.
pub fn resolve_typed<P: DeserializeOwned + serde::Serialize + schemars::JsonSchema + 'static>(params: &Value) -> Result<Value, ParamError> {
    let p = parse_typed::<P>(params)?;
    serde_json::to_value(&p).map_err(|e| ParamError { key: None, message: format!("params: {e}"), help: None })
}

/// Parse `params` into `P`, naming the offending key on failure.
pub fn parse_typed<P: DeserializeOwned + schemars::JsonSchema + 'static>(params: &Value) -> Result<P, ParamError> {
    let params = if params.is_null() { Value::Object(Default::default()) } else { params.clone() };
    serde_path_to_error::deserialize::<_, P>(params).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let unknown = inner.strip_prefix("unknown field `").and_then(|r| r.split('`').next()).map(str::to_string);
        let key = unknown.clone().or_else(|| {
            let first = path.split(['.', '[']).next().unwrap_or("").to_string();
            (!first.is_empty() && first != "?").then_some(first)
        });
        let missing = inner.strip_prefix("missing field `").and_then(|r| r.split('`').next()).map(str::to_string);
        let help = unknown.as_ref().and_then(|u| {
            let schema = schema_of::<P>();
            let names: Vec<String> =
                schema.get("properties").and_then(|p| p.as_object()).map(|o| o.keys().cloned().collect()).unwrap_or_default();
            crate::diag::did_you_mean(u, names.iter().map(|s| s.as_str()))
        });
        let help = help.or_else(|| match &missing {
            Some(m) => Some(format!("add `{m}:` to the stage's params")),
            // What the key is for says what its value should look like (`tiers: [1]` → "… [1, 2] …").
            None if inner.starts_with("invalid") => Some(match key.as_deref().and_then(|k| described(&schema_of::<P>(), k)) {
                Some(what) => format!("`{}` is: {what}", key.as_deref().unwrap_or_default()),
                None => "change the value to the expected type".into(),
            }),
            None => None,
        });
        let words = crate::serde_words::in_users_words(&inner);
        let message = if path.is_empty() || path == "." || unknown.is_some() {
            format!("params: {words}")
        } else {
            format!("params.{path}: {words}")
        };
        ParamError { key, message, help }
    })
}

/// The kinds a pipeline may use, looked up by name (the runner's registry implements it).
pub trait Kinds {
    fn kind(&self, name: &str) -> Option<Arc<dyn KindSignature>>;
    /// Every kind, in name order.
    fn all(&self) -> Vec<Arc<dyn KindSignature>>;
    fn names(&self) -> Vec<&'static str> {
        self.all().iter().map(|k| k.name()).collect()
    }
}
