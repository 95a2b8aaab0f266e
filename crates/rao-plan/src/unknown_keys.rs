//! Keys of a stage's params that its kind would silently ignore.
//!
//! serde's `deny_unknown_fields` does not reach everywhere: an internally tagged enum's unit
//! variant (`judge: {mode: exact, typo: 1}`) and a type without the attribute (a loss's
//! `{kind: cispo, hi: 5, lo_clip: 0}`) accept any extra key and drop it, so a misspelt setting
//! runs with its default and nothing says so. This walks the params beside the kind's JSON Schema
//! and names every key that no alternative of the schema at that place declares — of the
//! alternatives its tag selects, where a property pins one (`judge: {mode: exact, model: x}`:
//! `model` is the `llm` variant's). Maps, structs with a flattened map, and free-form values
//! (`true`, `{}`, a schema that only describes) take any key.

use serde_json::{Map, Value};

/// A key no alternative of the schema declares where it stands.
#[derive(Debug, PartialEq)]
pub struct UnknownKey {
    /// Dotted path: `loss.lo_clip`, `models[1].typo`.
    pub path: String,
    /// The keys that are declared there (for a "did you mean").
    pub declared: Vec<String>,
}

/// The keys in `params` that `schema` (a kind's params schema, with its `$defs`) declares nowhere.
pub fn unknown_keys(schema: &Value, params: &Value) -> Vec<UnknownKey> {
    let mut out = Vec::new();
    walk(schema, &[schema], params, "", &mut out);
    out
}

/// The object schemas a value at this place may match: `$ref`s followed, `anyOf` / `oneOf` /
/// `allOf` flattened. `None`: anything goes here (`true`, `{}`, or too many references deep).
fn alternatives<'a>(root: &'a Value, schema: &'a Value, depth: usize, out: &mut Vec<&'a Map<String, Value>>) -> Option<()> {
    // A `$ref` cycle that never descends into the value stops here, as "anything goes".
    if depth > 32 {
        return None;
    }
    let s = match schema {
        Value::Bool(true) => return None,
        // No constraint at all, only words about the value (a documented `serde_json::Value`).
        Value::Object(s) if s.keys().all(|k| ANNOTATIONS.contains(&k.as_str())) => return None,
        Value::Object(s) => s,
        _ => return Some(()),
    };
    if let Some(Value::String(r)) = s.get("$ref") {
        let target = r.strip_prefix("#/").map_or(Some(root), |path| path.split('/').try_fold(root, |v, part| v.get(part)));
        alternatives(root, target?, depth + 1, out)?;
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for member in s.get(key).and_then(Value::as_array).into_iter().flatten() {
            alternatives(root, member, depth + 1, out)?;
        }
    }
    if s.contains_key("properties") || s.contains_key("additionalProperties") || s.contains_key("items") {
        out.push(s);
    }
    Some(())
}

/// Schema keywords that say nothing about what a value may be.
const ANNOTATIONS: &[&str] = &["description", "title", "default", "examples", "deprecated", "readOnly", "writeOnly", "$comment"];

/// Whether an object schema takes keys beyond its `properties` (a map, or a struct with a
/// flattened map): `additionalProperties` / `unevaluatedProperties` present and not `false`, or
/// `patternProperties`.
fn open_keys(a: &Map<String, Value>) -> Option<&Value> {
    if let Some(p) = a.get("patternProperties") {
        return Some(p);
    }
    ["additionalProperties", "unevaluatedProperties"].iter().filter_map(|k| a.get(*k)).find(|v| **v != Value::Bool(false))
}

/// Of the alternatives, those whose tag fits: a property the value has, which an alternative
/// pins to one value (`const`, or an `enum` of one) that differs, rules that alternative out —
/// so `{mode: exact, model: x}` is checked against the `exact` variant alone. All of them when
/// that would leave none.
fn matching<'a>(alts: &[&'a Map<String, Value>], map: &Map<String, Value>) -> Vec<&'a Map<String, Value>> {
    let pinned = |schema: &Value| -> Option<Value> {
        schema.get("const").cloned().or_else(|| schema.get("enum")?.as_array().filter(|e| e.len() == 1)?.first().cloned())
    };
    let fits = |a: &&Map<String, Value>| {
        let Some(props) = a.get("properties").and_then(Value::as_object) else { return true };
        props.iter().all(|(k, schema)| match (map.get(k), pinned(schema)) {
            (Some(given), Some(pin)) => *given == pin,
            _ => true,
        })
    };
    let kept: Vec<_> = alts.iter().copied().filter(fits).collect();
    if kept.is_empty() { alts.to_vec() } else { kept }
}

fn walk(root: &Value, schemas: &[&Value], value: &Value, path: &str, out: &mut Vec<UnknownKey>) {
    let mut alts = Vec::new();
    for s in schemas {
        if alternatives(root, s, 0, &mut alts).is_none() {
            return;
        }
    }
    match value {
        Value::Object(map) => {
            let alts = matching(&alts, map);
            // A map's values (`additionalProperties: SCHEMA`) are walked; its keys are its own.
            if let Some(values) = alts.iter().find_map(|a| open_keys(a)) {
                if values.is_object() && alts.iter().all(|a| !a.contains_key("properties")) {
                    for (k, v) in map {
                        walk(root, &[values], v, &join(path, k), out);
                    }
                }
                return;
            }
            let declared: Vec<&Map<String, Value>> = alts.iter().filter_map(|a| a.get("properties")?.as_object()).collect();
            if declared.is_empty() {
                return; // not an object here: serde has refused it already
            }
            for (k, v) in map {
                let here: Vec<&Value> = declared.iter().filter_map(|props| props.get(k)).collect();
                if here.is_empty() {
                    let mut names: Vec<String> = Vec::new();
                    for name in declared.iter().flat_map(|props| props.keys()) {
                        if !names.contains(name) {
                            names.push(name.clone());
                        }
                    }
                    let declared = names;
                    out.push(UnknownKey { path: join(path, k), declared });
                } else {
                    walk(root, &here, v, &join(path, k), out);
                }
            }
        }
        Value::Array(items) => {
            let item_schemas: Vec<&Value> = alts.iter().filter_map(|a| a.get("items")).filter(|i| i.is_object()).collect();
            if !item_schemas.is_empty() {
                for (i, v) in items.iter().enumerate() {
                    walk(root, &item_schemas, v, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

#[cfg(test)]
mod tests {
    use schemars::JsonSchema;
    use serde::Deserialize;
    use serde_json::json;

    use super::unknown_keys;

    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    #[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
    enum Judge {
        Exact,
        Llm { url: String },
    }

    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    #[serde(tag = "kind", rename_all = "snake_case")]
    enum Loss {
        Cispo { lo: f64, hi: f64 },
        Reinforce,
    }

    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    #[serde(untagged)]
    enum World {
        Preset(String),
        Shape { domains: u32 },
    }

    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    #[serde(deny_unknown_fields)]
    struct Params {
        #[serde(default)]
        loss: Option<Loss>,
        #[serde(default)]
        env: std::collections::BTreeMap<String, String>,
        #[serde(default)]
        anything: Option<serde_json::Value>,
        #[serde(default)]
        losses: Vec<Loss>,
        #[serde(default)]
        world: Option<World>,
    }

    fn unknown<T: JsonSchema>(params: serde_json::Value) -> Vec<String> {
        unknown_keys(&serde_json::to_value(schemars::schema_for!(T)).unwrap(), &params).into_iter().map(|u| u.path).collect()
    }

    #[test]
    fn keys_serde_would_drop_are_named_with_their_path() {
        // serde accepts both: the unit variant and the enum without deny_unknown_fields drop the key.
        assert!(serde_json::from_value::<Judge>(json!({"mode": "exact", "typo": 1})).is_ok());
        assert_eq!(unknown::<Judge>(json!({"mode": "exact", "typo": 1})), ["typo"]);
        let schema = serde_json::to_value(schemars::schema_for!(Judge)).unwrap();
        let mut declared = unknown_keys(&schema, &json!({"mode": "exact", "typo": 1})).remove(0).declared;
        declared.sort();
        assert_eq!(declared, ["mode"], "the keys of the variant the tag names, for a suggestion");
        assert_eq!(unknown::<Judge>(json!({"mode": "llm", "url": "u"})), Vec::<String>::new());
        let p = json!({"loss": {"kind": "cispo", "lo": 0, "hi": 5, "lo_clip": 1}, "losses": [{"kind": "reinforce"}, {"kind": "reinforce", "x": 1}]});
        assert!(serde_json::from_value::<Params>(p.clone()).is_ok());
        assert_eq!(unknown::<Params>(p), ["loss.lo_clip", "losses[1].x"]);
    }

    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Open {
        known: u32,
        #[serde(flatten)]
        rest: std::collections::BTreeMap<String, u32>,
        /// Anything at all, documented.
        #[serde(default)]
        free: Option<serde_json::Value>,
    }

    #[test]
    fn a_key_of_another_variant_is_refused_and_flattened_maps_take_any_key() {
        // `model` belongs to the `llm` variant: with `mode: exact` it would be dropped.
        assert_eq!(unknown::<Judge>(json!({"mode": "exact", "url": "u"})), ["url"]);
        assert_eq!(unknown::<Params>(json!({"loss": {"kind": "reinforce", "lo": 0}})), ["loss.lo"]);
        assert_eq!(unknown::<Open>(json!({"known": 1, "other": 2, "free": {"a": {"b": 1}}})), Vec::<String>::new());
    }

    #[test]
    fn maps_free_values_and_untagged_alternatives_take_their_own_keys() {
        let p = json!({"env": {"ANY_NAME": "1"}, "anything": {"deep": {"er": 1}}, "world": "small"});
        assert_eq!(unknown::<Params>(p), Vec::<String>::new());
        assert_eq!(unknown::<Params>(json!({"world": {"domains": 3, "tiers": 2}})), ["world.tiers"]);
    }
}
