//! The JSON Schema of pipeline files, generated from the Rust types plus each kind's params schema.
//!
//! One document: a file with `extends` is checked as a variant, any other as a pipeline. Each
//! kind's params schema comes with its own `$defs`; they are moved to the root (renamed where two
//! kinds disagree on a name) so every `#/$defs/…` pointer resolves. Values inside `params` may be
//! substitutions (`${matrix.window}`) wherever a number or an enum is expected.

use serde_json::{Map, Value, json};

use crate::kind::Kinds;
use crate::spec::{PipelineFile, VariantFile};

const SUBSTITUTION: &str = "Substitution";

/// The schema editors use (`# yaml-language-server: $schema=...`), kept in sync by a test.
pub fn pipeline_schema(registry: &dyn Kinds) -> Value {
    let mut generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
    let pipeline = generator.subschema_for::<PipelineFile>();
    let variant = generator.subschema_for::<VariantFile>();
    let mut defs = generator.take_definitions(true);
    defs.insert(
        SUBSTITUTION.into(),
        json!({
            "description": "A value filled in when the pipeline compiles: `${params.NAME}`, `${matrix.KEY}` or `${loop.iteration}`.",
            "type": "string",
            "pattern": r"^\$\{(params|matrix|loop)\.[A-Za-z0-9_.-]+\}$",
        }),
    );
    // Per-kind params: `if kind == K then params matches K's schema`.
    let mut rules = Vec::new();
    for kind in registry.all() {
        let mut params = serde_json::to_value(kind.params_schema()).expect("schema serialises");
        hoist_defs(&mut params, kind.name(), &mut defs);
        if let Some(o) = params.as_object_mut() {
            o.remove("$schema");
            o.remove("title");
        }
        allow_substitutions(&mut params);
        rules.push(json!({
            "if": {"properties": {"kind": {"const": kind.name()}}, "required": ["kind"]},
            "then": {"properties": {"params": params}},
            "description": kind.describe(),
        }));
    }
    if let Some(stage) = defs.get_mut("StageSpec").and_then(|s| s.as_object_mut()) {
        stage.insert("allOf".into(), Value::Array(rules));
        let names: Vec<&str> = registry.names();
        if let Some(kind) = stage.get_mut("properties").and_then(|p| p.get_mut("kind")) {
            kind["enum"] = json!(names);
        }
    }
    tighten(&mut defs);
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "rao pipeline file",
        "description": "A pipeline (`name`, `stages`, …), or a variant of one (`extends`, `name`, `set`).",
        "if": {"type": "object", "required": ["extends"]},
        "then": variant,
        "else": pipeline,
        "$defs": Value::Object(defs),
    })
}

/// Rules of the compiler's checks (`check.rs`, `lower.rs`) that a schema can state too, so that
/// an editor flags them where they are typed: names, a stage is a kind or a loop, counts.
fn tighten(defs: &mut Map<String, Value>) {
    let name = format!("^[A-Za-z0-9_-]{{1,{}}}$", crate::check::MAX_NAME_LEN);
    let mut set = |def: &str, path: &[&str], rules: Value| {
        let mut at = defs.get_mut(def);
        for key in path {
            at = at.and_then(|v| match key.parse::<usize>() {
                Ok(i) => v.get_mut(i),
                Err(_) => v.get_mut(*key),
            });
        }
        if let (Some(Value::Object(o)), Value::Object(r)) = (at, rules) {
            o.extend(r);
        }
    };
    for def in ["PipelineFile", "VariantFile"] {
        set(def, &["properties", "name"], json!({"pattern": name}));
    }
    set("PipelineFile", &["properties", "stages"], json!({"propertyNames": {"pattern": name}, "minProperties": 1}));
    set("StageSpec", &["properties", "stages"], json!({"propertyNames": {"pattern": name}}));
    set("StageSpec", &["properties", "outputs", "items"], json!({"pattern": name}));
    set("StageSpec", &["properties", "matrix"], json!({"propertyNames": {"pattern": name}}));
    set("StageSpec", &["properties", "matrix", "additionalProperties"], json!({"minItems": 1}));
    set("StageSpec", &["properties", "retries"], json!({"maximum": crate::check::MAX_RETRIES}));
    set("StageSpec", &["properties", "every"], json!({"minimum": 1}));
    set("LoopSpec", &["properties", "max_iterations"], json!({"minimum": 1}));
    set("StageSpec", &["properties", "outputs"], json!({"uniqueItems": true}));
    set("PipelineFile", &["properties", "seed"], json!({"maximum": u64::MAX}));
    // `spec::Duration::parse`: positive, at most a year; text is a number and ms, s, m or h.
    set("Duration", &["anyOf", "0"], json!({"exclusiveMinimum": 0, "maximum": crate::check::MAX_TIMEOUT_S}));
    set("Duration", &["anyOf", "1"], json!({"pattern": r"^\s*\+?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*(ms|s|m|h)?\s*$"}));
    // A stage has a `kind`; a loop has `loop` and a body of `stages`, and nothing a kind takes.
    // As the compiler reads them, a key that is there but empty or null is not there.
    let given = |key: &str, nonempty: Value| json!({"required": [key], "properties": {key: nonempty}});
    let not_null = json!({"not": {"type": "null"}});
    let kind_only = [given("loop", not_null.clone()), given("stages", json!({"minProperties": 1}))];
    let loop_only = [
        given("kind", not_null.clone()),
        given("params", json!({"minProperties": 1})),
        given("inputs", json!({"minProperties": 1})),
        given("outputs", json!({"minItems": 1})),
        given("matrix", json!({"minProperties": 1})),
        given("every", not_null),
    ];
    set(
        "StageSpec",
        &[],
        json!({"oneOf": [
            {"required": ["kind"], "not": {"anyOf": kind_only}},
            {"required": ["loop", "stages"], "properties": {"stages": {"minProperties": 1}}, "not": {"anyOf": loop_only}},
        ]}),
    );
}

/// Move `schema`'s own `$defs` into `defs`; a name another kind already defines differently is
/// renamed `KIND_NAME`, with this schema's pointers to it rewritten.
fn hoist_defs(schema: &mut Value, kind: &str, defs: &mut Map<String, Value>) {
    let Some(Value::Object(mut own)) = schema.as_object_mut().and_then(|o| o.remove("$defs")) else {
        return;
    };
    own.values_mut().for_each(allow_substitutions);
    let renames: Vec<(String, String)> = own
        .iter()
        .filter(|(name, def)| defs.get(*name).is_some_and(|have| have != *def))
        .map(|(name, _)| (name.clone(), format!("{kind}_{name}")))
        .collect();
    for (from, to) in &renames {
        rewrite_refs(schema, from, to);
        own.values_mut().for_each(|def| rewrite_refs(def, from, to));
    }
    for (name, def) in own {
        let name = renames.iter().find(|(f, _)| *f == name).map(|(_, t)| t.clone()).unwrap_or(name);
        defs.insert(name, def);
    }
}

fn rewrite_refs(v: &mut Value, from: &str, to: &str) {
    let (old, new) = (format!("#/$defs/{from}"), format!("#/$defs/{to}"));
    each_schema(v, &mut |o| {
        if o.get("$ref").and_then(Value::as_str) == Some(old.as_str()) {
            o.insert("$ref".into(), Value::String(new.clone()));
        }
    });
}

/// Every property and array item of a params schema also accepts a substitution string.
fn allow_substitutions(params: &mut Value) {
    let wrap = |s: &mut Value| {
        let original = s.take();
        let description = original.get("description").cloned();
        let mut w = json!({"anyOf": [original, {"$ref": format!("#/$defs/{SUBSTITUTION}")}]});
        if let Some(d) = description {
            w["description"] = d;
        }
        *s = w;
    };
    each_schema(params, &mut |o| {
        if let Some(Value::Object(props)) = o.get_mut("properties") {
            props.values_mut().for_each(wrap);
        }
        if let Some(items) = o.get_mut("items").filter(|i| i.is_object()) {
            wrap(items);
        }
    });
}

/// Visit a schema and its subschemas (through the keywords schemars emits), each before its
/// subschemas, so what `f` wraps is visited inside its wrapper.
fn each_schema(v: &mut Value, f: &mut dyn FnMut(&mut Map<String, Value>)) {
    let Value::Object(o) = v else { return };
    f(o);
    for (key, child) in o.iter_mut() {
        match (key.as_str(), child) {
            ("properties" | "$defs" | "patternProperties", Value::Object(m)) => m.values_mut().for_each(|s| each_schema(s, f)),
            ("anyOf" | "oneOf" | "allOf" | "prefixItems", Value::Array(a)) => a.iter_mut().for_each(|s| each_schema(s, f)),
            ("items" | "additionalProperties" | "not" | "if" | "then" | "else", s) => each_schema(s, f),
            _ => {}
        }
    }
}

pub fn pipeline_schema_text(registry: &dyn Kinds) -> String {
    let mut s = serde_json::to_string_pretty(&pipeline_schema(registry)).expect("schema serialises");
    s.push('\n');
    s
}
