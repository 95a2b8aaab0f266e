//! The JSON Schema of pipeline files, generated from the Rust types plus each kind's params schema.

use serde_json::{Value, json};

use crate::kind::Registry;
use crate::spec::PipelineFile;

/// The schema editors use (`# yaml-language-server: $schema=...`), kept in sync by a test.
pub fn pipeline_schema(registry: &Registry) -> Value {
    let mut root = serde_json::to_value(schemars::schema_for!(PipelineFile)).expect("schema serialises");
    // Per-kind params: `if kind == K then params matches K's schema`.
    let mut rules = Vec::new();
    for kind in registry.kinds() {
        let mut params = serde_json::to_value(kind.params_schema()).expect("schema serialises");
        if let Some(o) = params.as_object_mut() {
            o.remove("$schema");
            o.remove("title");
        }
        rules.push(json!({
            "if": {"properties": {"kind": {"const": kind.name()}}, "required": ["kind"]},
            "then": {"properties": {"params": params}},
            "description": kind.describe(),
        }));
    }
    if let Some(defs) = root.get_mut("$defs").and_then(|d| d.get_mut("StageSpec")).and_then(|s| s.as_object_mut()) {
        defs.insert("allOf".into(), Value::Array(rules));
        let names: Vec<&str> = registry.names().collect();
        if let Some(kind) = defs.get_mut("properties").and_then(|p| p.get_mut("kind")) {
            kind["enum"] = json!(names);
        }
    }
    root
}

pub fn pipeline_schema_text(registry: &Registry) -> String {
    let mut s = serde_json::to_string_pretty(&pipeline_schema(registry)).expect("schema serialises");
    s.push('\n');
    s
}
