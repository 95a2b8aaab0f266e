//! `rao kinds`: every stage kind's inputs, outputs and parameters — types, defaults and
//! descriptions — read from the same params schemas the pipeline schema is made of.

use serde_json::Value;

use crate::kind::{KindSignature, Kinds};

/// One parameter as a reader wants it: dotted name, type, default, first paragraph of its doc.
pub struct ParamDoc {
    pub name: String,
    pub ty: String,
    pub default: Option<String>,
    pub doc: String,
}

/// Parameters of a kind, nested objects flattened one level (`limits.window`).
pub fn params_of(kind: &dyn KindSignature) -> Vec<ParamDoc> {
    let schema = serde_json::to_value(kind.params_schema()).unwrap_or(Value::Null);
    let mut out = Vec::new();
    collect(&schema, &schema, "", 0, &mut out);
    out
}

fn collect(root: &Value, schema: &Value, prefix: &str, depth: usize, out: &mut Vec<ParamDoc>) {
    let schema = resolve(root, schema);
    let Some(props) = schema.get("properties").and_then(Value::as_object) else { return };
    let required: Vec<&str> = schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    for (name, p) in props {
        let full = format!("{prefix}{name}");
        let target = resolve(root, p);
        let default = p.get("default").or_else(|| target.get("default")).map(compact);
        let default = match (default, required.contains(&name.as_str())) {
            (None, true) => Some("(required)".to_string()),
            (d, _) => d,
        };
        out.push(ParamDoc {
            name: full.clone(),
            ty: type_of(root, p),
            default,
            doc: first_paragraph(p).or_else(|| first_paragraph(target)).unwrap_or_default(),
        });
        if depth == 0 && target.get("properties").is_some() {
            collect(root, target, &format!("{full}."), depth + 1, out);
        }
    }
}

/// Follows `$ref` and a nullable wrapper (`anyOf: [X, null]`) to the schema that describes the value.
fn resolve<'v>(root: &'v Value, schema: &'v Value) -> &'v Value {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str)
        && let Some(name) = r.strip_prefix("#/$defs/")
        && let Some(def) = root.get("$defs").and_then(|d| d.get(name))
    {
        return resolve(root, def);
    }
    if let Some(any) = schema.get("anyOf").and_then(Value::as_array) {
        let not_null: Vec<&Value> = any.iter().filter(|s| s.get("type") != Some(&Value::String("null".into()))).collect();
        if let [one] = not_null.as_slice() {
            return resolve(root, one);
        }
    }
    schema
}

/// A short type: `integer`, `number`, `string`, `a | b | c` for an enum, `list of T`, a
/// definition's name for an object.
fn type_of(root: &Value, schema: &Value) -> String {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.rsplit('/').next().unwrap_or(r);
        let target = resolve(root, schema);
        return match enum_values(target) {
            Some(values) => values,
            None => name.to_string(),
        };
    }
    if let Some(values) = enum_values(schema) {
        return values;
    }
    if let Some(any) = schema.get("anyOf").or_else(|| schema.get("oneOf")).and_then(Value::as_array) {
        let parts: Vec<String> =
            any.iter().filter(|s| s.get("type") != Some(&Value::String("null".into()))).map(|s| type_of(root, s)).collect();
        return parts.join(" | ");
    }
    match schema.get("type") {
        Some(Value::String(t)) if t == "array" => match schema.get("items") {
            Some(items) => format!("list of {}", type_of(root, items)),
            None => "list".into(),
        },
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect::<Vec<_>>().join(" | "),
        _ => "any".into(),
    }
}

fn enum_values(schema: &Value) -> Option<String> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return Some(values.iter().map(compact).collect::<Vec<_>>().join(" | "));
    }
    let variants = schema.get("oneOf").or_else(|| schema.get("anyOf"))?.as_array()?;
    let consts: Option<Vec<String>> =
        variants.iter().map(|v| v.get("const").or_else(|| v.get("enum").and_then(|e| e.get(0))).map(compact)).collect();
    consts.filter(|c| !c.is_empty()).map(|c| c.join(" | "))
}

fn compact(v: &Value) -> String {
    match v {
        Value::Null => "none".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn first_paragraph(schema: &Value) -> Option<String> {
    let text = schema.get("description")?.as_str()?;
    Some(text.split("\n\n").next().unwrap_or(text).split_whitespace().collect::<Vec<_>>().join(" "))
}

fn inputs_line(kind: &dyn KindSignature) -> String {
    match kind.inputs() {
        None => "any names (`${inputs.NAME}` in its params)".into(),
        Some([]) => "none".into(),
        Some(decls) => {
            decls.iter().map(|d| format!("{}{}", d.name, if d.required { "" } else { " (optional)" })).collect::<Vec<_>>().join(", ")
        }
    }
}

fn outputs_line(kind: &dyn KindSignature) -> String {
    match kind.outputs() {
        None => "as listed under the stage's `outputs:`".into(),
        Some([]) => "none".into(),
        Some(outs) => outs.join(", "),
    }
}

/// The terminal's view: one kind in full, or every kind (`None`) with its description.
pub fn render_text(registry: &dyn Kinds, only: Option<&str>) -> Result<String, String> {
    let mut out = String::new();
    match only {
        None => {
            let width = registry.names().into_iter().map(str::len).max().unwrap_or(0);
            for kind in registry.all() {
                out.push_str(&format!("{:width$}  {}\n", kind.name(), kind.describe()));
            }
            out.push_str("\n`rao kinds KIND` shows a kind's inputs, outputs and parameters.\n");
        }
        Some(name) => {
            let kind = registry.kind(name).ok_or_else(|| {
                let hint = crate::diag::did_you_mean(name, registry.names()).unwrap_or_else(|| "`rao kinds` lists them".into());
                format!("no stage kind `{name}`: {hint}")
            })?;
            out.push_str(&format!(
                "{} — {}\n\ninputs:  {}\noutputs: {}\n\nparams:\n",
                kind.name(),
                kind.describe(),
                inputs_line(kind.as_ref()),
                outputs_line(kind.as_ref())
            ));
            let params = params_of(kind.as_ref());
            if params.is_empty() {
                out.push_str("  (none)\n");
            }
            for p in params {
                let default = p.default.map(|d| format!(" = {d}")).unwrap_or_default();
                out.push_str(&format!("  {}: {}{default}\n", p.name, p.ty));
                if !p.doc.is_empty() {
                    out.push_str(&format!("      {}\n", p.doc));
                }
            }
        }
    }
    Ok(out)
}

/// docs/KINDS.md: every kind as a section with a table of its parameters.
pub fn render_markdown(registry: &dyn Kinds) -> String {
    let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    let mut out = String::from(
        "# Stage kinds\n\nGenerated by `rao kinds --markdown` from the types the pipeline schema is made of \
         (a test keeps it current). `rao kinds KIND` prints the same in a terminal.\n",
    );
    for kind in registry.all() {
        out.push_str(&format!(
            "\n## `{}`\n\n{}\n\n- inputs: {}\n- outputs: {}\n",
            kind.name(),
            kind.describe(),
            inputs_line(kind.as_ref()),
            outputs_line(kind.as_ref())
        ));
        let params = params_of(kind.as_ref());
        if params.is_empty() {
            continue;
        }
        out.push_str("\n| param | type | default | what it is |\n|---|---|---|---|\n");
        for p in params {
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                p.name,
                cell(&p.ty),
                p.default.map(|d| format!("`{}`", cell(&d))).unwrap_or_default(),
                cell(&p.doc)
            ));
        }
    }
    out
}
