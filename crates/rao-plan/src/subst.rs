//! Placeholders the engine owns: `${params.NAME[.SUB…]}` (global params, which may refer to other
//! global params), `${matrix.KEY}` and `${loop.iteration}`. Others (`${inputs.x}` for `shell`,
//! `${env.NAME}` filled at run time) are left as they are. A `${` that no `}` closes is an error:
//! taken literally, it reached the program as a broken placeholder (`sh`'s "Bad substitution").

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
        self.params_in(params, None)
    }

    /// Like [`Scope::params`]; with the file's text (`source`, which the positions refer to), an
    /// unclosed `${` is reported at the `${` itself rather than at the start of its value.
    pub fn params_in(&self, params: &OrderedMap<Sp<Value>>, source: Option<&str>) -> Result<Value, Diagnostic> {
        let mut out = serde_json::Map::new();
        for (k, v) in params.iter() {
            out.insert(k.value.clone(), self.value(&v.value, v.pos, source, &mut Vec::new())?);
        }
        Ok(Value::Object(out))
    }

    fn value(&self, v: &Value, pos: Pos, source: Option<&str>, chain: &mut Vec<String>) -> Result<Value, Diagnostic> {
        match v {
            Value::String(s) => self.string(s, pos, source, chain),
            Value::Array(a) => a.iter().map(|x| self.value(x, pos, source, chain)).collect::<Result<_, _>>().map(Value::Array),
            Value::Object(o) => {
                let mut m = serde_json::Map::new();
                for (k, x) in o {
                    m.insert(k.clone(), self.value(x, pos, source, chain)?);
                }
                Ok(Value::Object(m))
            }
            other => Ok(other.clone()),
        }
    }

    fn lookup(&self, key: &str, pos: Pos, source: Option<&str>, chain: &mut Vec<String>) -> Result<Option<Value>, Diagnostic> {
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
            let mut v = self.value(&entry.value, entry.pos, source, chain)?;
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

    fn string(&self, s: &str, pos: Pos, source: Option<&str>, chain: &mut Vec<String>) -> Result<Value, Diagnostic> {
        // A string that is exactly one placeholder keeps the value's type.
        if let Some(inner) = s.strip_prefix("${").and_then(|r| r.strip_suffix('}'))
            && !inner.contains("${")
            && !inner.contains('}')
            && let Some(v) = self.lookup(inner, pos, source, chain)?
        {
            return Ok(v);
        }
        let mut out = String::new();
        let mut rest = s;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                return Err(unclosed(s, s.len() - rest.len() + start, pos, source));
            };
            let key = &after[..end];
            match self.lookup(key, pos, source, chain)? {
                Some(v) => out.push_str(&scalar_text(&v)),
                None => out.push_str(&rest[start..start + 2 + end + 1]),
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(Value::String(out))
    }
}

/// The error for the `${` at byte `at` of `s` (the string value written at `pos`), which no `}`
/// closes.
fn unclosed(s: &str, at: usize, pos: Pos, source: Option<&str>) -> Diagnostic {
    let head = placeholder_head(&s[at..]);
    let pos = source.map_or(pos, |src| locate(src, pos, s, at));
    let examples = "such as `${params.NAME}`, `${matrix.KEY}` or `${loop.iteration}`";
    let help = match head {
        "${" => format!("a `${{` starts a placeholder, {examples}"),
        _ => format!("write `{head}}}` (a `${{` starts a placeholder, {examples})"),
    };
    Diagnostic::new(pos, format!("`{head}` is not closed: no `}}` follows this `${{`")).help(help)
}

/// `${` and the name-like characters after it (`${params.world` of `${params.world and more`).
/// At most 80 characters of name are kept (the head is shown in messages). `from` starts with `${`.
fn placeholder_head(from: &str) -> &str {
    let mut end = 2;
    for (i, c) in from[2..].char_indices() {
        if i >= 80 || !(c.is_alphanumeric() || matches!(c, '.' | '_' | '-')) {
            break;
        }
        end = 2 + i + c.len_utf8();
    }
    &from[..end]
}

/// Where in the file the `${` at byte `at` of string `s` is, `s` being the value written at
/// `value_pos` (which points at the value's start: its quote or first character; for a block
/// scalar, its first line). Found by searching the value's lines for the same placeholder head (`${inputs.x`),
/// counting the ones before it; the value's position when it cannot be found (a value changed by
/// `--set`, or hidden behind an escape such as `\x24{`).
pub fn locate(source: &str, value_pos: Pos, s: &str, at: usize) -> Pos {
    let Some(tail) = s.get(at..).filter(|t| t.starts_with("${") && value_pos.line > 0) else {
        return value_pos;
    };
    let head = placeholder_head(tail);
    let nth = s[..at].matches(head).count();
    let lines: Vec<&str> = source.split('\n').collect();
    let first = value_pos.line as usize - 1;
    let Some(line) = lines.get(first) else { return value_pos };
    let indent = |l: &str| l.len() - l.trim_start_matches([' ', '\t']).len();
    let mut start = line.char_indices().nth(value_pos.column.saturating_sub(1) as usize).map_or(line.len(), |(b, _)| b);
    // The value's lines: the line it starts on, then the ones it continues on, blank ones
    // included. After a key on its line, those are indented deeper than that line; at the start
    // of its line (a block scalar's first line, a value under its key), as deep or deeper.
    let after_key = start > indent(line);
    let mut seen = 0;
    for (i, l) in lines.iter().enumerate().skip(first) {
        if i > first && !l.trim().is_empty() && (indent(l) < indent(line) || (after_key && indent(l) == indent(line))) {
            break;
        }
        let mut from = start;
        while let Some(found) = l[from..].find(head) {
            let byte = from + found;
            if seen == nth {
                return Pos { line: i as u64 + 1, column: l[..byte].chars().count() as u64 + 1 };
            }
            seen += 1;
            from = byte + head.len();
        }
        start = 0;
    }
    value_pos
}

/// A value as it appears inside a string or an instance name.
pub fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(line: u64, column: u64) -> Pos {
        Pos { line, column }
    }

    #[test]
    fn locate_finds_the_placeholder_in_the_value_not_in_its_neighbours() {
        // A flow value after its key: the next line at the same depth is another entry.
        let src = "  a: {command: 'x ${inputs.i} ${inputs.i}'}\n  b: {command: '${inputs.i}'}\n";
        let s = "x ${inputs.i} ${inputs.i}";
        assert_eq!(locate(src, at(1, 16), s, 2), at(1, 19));
        assert_eq!(locate(src, at(1, 16), s, 14), at(1, 31));
        // Block scalar whose position is its first content line: continues at the same depth.
        let src = "    command: |\n      set -e\n      cat ${inputs.é}\n    env: {}\n";
        assert_eq!(locate(src, at(2, 7), "set -e\ncat ${inputs.é}\n", 11), at(3, 11));
        // Not in the value's lines (changed by `--set`): the value's own position.
        assert_eq!(locate(src, at(2, 7), "${inputs.other}", 0), at(2, 7));
        assert_eq!(locate(src, Pos::NONE, "${inputs.é}", 0), Pos::NONE);
    }

    #[test]
    fn an_unclosed_placeholder_is_an_error_at_its_dollar() {
        let src = "params: {w: 3}\nstages:\n  a: {kind: noop, params: {value: 'size ${params.w'}}\n";
        let params = OrderedMap::default();
        let scope = Scope { params: &params, matrix: &BTreeMap::new(), iteration: None };
        let e = scope.string("size ${params.w", at(3, 35), Some(src), &mut Vec::new()).unwrap_err();
        assert_eq!(e.pos, at(3, 41));
        assert!(e.message.contains("`${params.w` is not closed"), "{}", e.message);
        // Closed ones that are not the engine's stay as they are (`sh`'s `${HOME}`).
        assert_eq!(scope.string("${HOME}/x", at(3, 35), None, &mut Vec::new()).unwrap(), Value::from("${HOME}/x"));
    }
}
