//! Placeholders the engine owns: `${params.NAME[.SUB…]}` (global params, which may refer to other
//! global params), `${matrix.KEY}` and `${loop.iteration}`. Others (`${inputs.x}` for `shell`,
//! `${env.NAME}` filled at run time) are left as they are.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::diag::{Diagnostic, did_you_mean};
use crate::spec::{OrderedMap, Pos, Sp};

/// What a placeholder can see.
pub struct Scope<'a> {
    pub params: &'a OrderedMap<Sp<Value>>,
    pub matrix: &'a BTreeMap<String, Value>,
    pub iteration: Option<u32>,
}

/// A global param referring to itself through others (`a → b → a`) would never resolve.
const MAX_PARAM_DEPTH: usize = 16;

impl Scope<'_> {
    /// Every string in `params` with its placeholders replaced.
    pub fn params(&self, params: &OrderedMap<Sp<Value>>) -> Result<Value, Diagnostic> {
        let mut out = serde_json::Map::new();
        for (k, v) in params.iter() {
            out.insert(k.value.clone(), self.value(&v.value, v.pos, &mut Vec::new())?);
        }
        Ok(Value::Object(out))
    }

    fn value(&self, v: &Value, pos: Pos, chain: &mut Vec<String>) -> Result<Value, Diagnostic> {
        match v {
            Value::String(s) => self.string(s, pos, chain),
            Value::Array(a) => a.iter().map(|x| self.value(x, pos, chain)).collect::<Result<_, _>>().map(Value::Array),
            Value::Object(o) => {
                let mut m = serde_json::Map::new();
                for (k, x) in o {
                    m.insert(k.clone(), self.value(x, pos, chain)?);
                }
                Ok(Value::Object(m))
            }
            other => Ok(other.clone()),
        }
    }

    fn lookup(&self, key: &str, pos: Pos, chain: &mut Vec<String>) -> Result<Option<Value>, Diagnostic> {
        if let Some(p) = key.strip_prefix("params.") {
            // `params.a.b` descends into mappings.
            let mut parts = p.split('.');
            let first = parts.next().unwrap_or("");
            let Some(entry) = self.params.get(first) else {
                return Err(Diagnostic::new(pos, format!("`${{{key}}}`: no global param `{first}`"))
                    .help(did_you_mean(first, self.params.keys()).unwrap_or_else(|| "define it under the top-level `params:`".into())));
            };
            if chain.iter().any(|c| c == first) || chain.len() >= MAX_PARAM_DEPTH {
                chain.push(first.to_string());
                return Err(Diagnostic::new(entry.pos, format!("params refer to each other in a circle: {}", chain.join(" → ")))
                    .help("a param may use other params, but not itself through them"));
            }
            chain.push(first.to_string());
            let mut v = self.value(&entry.value, entry.pos, chain)?;
            chain.pop();
            for part in parts {
                let keys = v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>().join(", ")).unwrap_or_default();
                v = v.get(part).cloned().ok_or_else(|| {
                    Diagnostic::new(pos, format!("`${{{key}}}`: `{part}` not found")).help(if keys.is_empty() {
                        "that param has no sub-keys".to_string()
                    } else {
                        format!("its keys: {keys}")
                    })
                })?;
            }
            return Ok(Some(v));
        }
        if let Some(m) = key.strip_prefix("matrix.") {
            return match self.matrix.get(m) {
                Some(v) => Ok(Some(v.clone())),
                None => Err(Diagnostic::new(pos, format!("`${{{key}}}`: this stage has no matrix key `{m}`"))
                    .help("add it under the stage's `matrix:`")),
            };
        }
        if key == "loop.iteration" {
            return match self.iteration {
                Some(k) => Ok(Some(Value::from(k))),
                None => Err(Diagnostic::new(pos, "`${loop.iteration}` is only defined inside a loop body")
                    .help("use it in the params of a loop's body stages")),
            };
        }
        Ok(None)
    }

    fn string(&self, s: &str, pos: Pos, chain: &mut Vec<String>) -> Result<Value, Diagnostic> {
        // A string that is exactly one placeholder keeps the value's type.
        if let Some(inner) = s.strip_prefix("${").and_then(|r| r.strip_suffix('}'))
            && !inner.contains("${")
            && !inner.contains('}')
            && let Some(v) = self.lookup(inner, pos, chain)?
        {
            return Ok(v);
        }
        let mut out = String::new();
        let mut rest = s;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                out.push_str(&rest[start..]);
                rest = "";
                break;
            };
            let key = &after[..end];
            match self.lookup(key, pos, chain)? {
                Some(v) => out.push_str(&scalar_text(&v)),
                None => out.push_str(&rest[start..start + 2 + end + 1]),
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(Value::String(out))
    }
}

/// A value as it appears inside a string or an instance name.
pub fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
