//! Secrets stay out of everything rao writes down: run records, events, fingerprints.
//!
//! - A param written `${env.NAME}` is filled from the environment only when the stage starts:
//!   the fingerprint and the records hold the placeholder, never the value.
//! - `--set` values of keys that look like credentials are recorded as `<redacted>`.
//! - Error text that goes into run records and JSON events (a failing command's stderr tail) has
//!   the values of credential-looking environment variables replaced with `***`.

use serde_json::Value;

/// Names that look like they hold a credential.
pub fn looks_secret(name: &str) -> bool {
    // Case-insensitive substring search without an upper-cased copy: run records test every key.
    const WORDS: [&[u8]; 11] = [
        b"TOKEN",
        b"SECRET",
        b"PASSWORD",
        b"PASSWD",
        b"CREDENTIAL",
        b"API_KEY",
        b"APIKEY",
        b"ACCESS_KEY",
        b"PRIVATE_KEY",
        b"AUTH",
        b"SESSION",
    ];
    let n = name.as_bytes();
    WORDS.iter().any(|w| n.windows(w.len()).any(|win| win.eq_ignore_ascii_case(w)))
}

/// Values given on the command line (`--set params.api_token=…`) that error text must not show.
static GIVEN: std::sync::RwLock<Vec<String>> = std::sync::RwLock::new(Vec::new());

/// Whether a `--set PATH=VALUE` entry sets a credential-looking key.
pub fn sets_secret(entry: &str) -> bool {
    entry.split_once('=').is_some_and(|(path, _)| looks_secret(path.rsplit('.').next().unwrap_or(path)))
}

/// Remember the values of credential-looking `--set` entries, so that [`redact`] hides them too
/// (a failing command's text holds them once filled in).
pub fn remember_given(overrides: &[String]) {
    // A number or a flag under a credential-looking name (`max_session_steps=1000`) is no
    // credential: hiding every `1000` in error text would only confuse.
    let plain = |v: &str| v.parse::<f64>().is_ok() || matches!(v, "true" | "false" | "null");
    let values = overrides.iter().filter(|o| sets_secret(o)).filter_map(|o| o.split_once('=')).map(|(_, v)| v.trim()).filter(|v| !plain(v));
    // As typed and without YAML quotes: the command sees the unquoted text.
    let values: Vec<String> =
        values.flat_map(|v| [v, v.trim_matches(|c| c == '\'' || c == '"')]).filter(|v| v.len() >= 4).map(str::to_string).collect();
    if !values.is_empty() {
        let mut given = GIVEN.write().unwrap_or_else(|e| e.into_inner());
        given.extend(values);
        given.sort();
        given.dedup();
    }
}

/// `text` with the value of every credential-looking environment variable and `--set` entry (at
/// least 4 characters long) replaced by `***`.
pub fn redact(text: &str) -> String {
    let mut values: Vec<String> = std::env::vars().filter(|(k, v)| looks_secret(k) && v.len() >= 4).map(|(_, v)| v).collect();
    values.extend(GIVEN.read().unwrap_or_else(|e| e.into_inner()).iter().cloned());
    replace_all(text, values)
}

/// `text` with each of `values` replaced by `***`.
fn replace_all(text: &str, mut values: Vec<String>) -> String {
    let mut out = text.to_string();
    // Longest first, so a value that contains another is replaced whole.
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    for v in values {
        if out.contains(&v) {
            out = out.replace(&v, "***");
        }
    }
    out
}

/// Fill `${env.NAME}` placeholders from the environment (at run time only).
pub fn fill_env(v: &Value) -> Result<Value, String> {
    Ok(match v {
        Value::String(s) => Value::String(fill_env_str(s)?),
        Value::Array(a) => Value::Array(a.iter().map(fill_env).collect::<Result<_, _>>()?),
        Value::Object(o) => Value::Object(o.iter().map(|(k, x)| Ok((k.clone(), fill_env(x)?))).collect::<Result<_, String>>()?),
        other => other.clone(),
    })
}

fn fill_env_str(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("${env.") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 6..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let name = &after[..end];
        let value =
            std::env::var(name).map_err(|_| format!("environment variable `{name}` is not set (a param reads `${{env.{name}}}`)"))?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Whether a record keeps the value of `key` (else it writes `<redacted>`): keys that do not look
/// like credentials, and values that hold no secret (an `${env.…}` placeholder, an object, null).
fn keeps(key: &str, v: &Value) -> bool {
    !looks_secret(key) || matches!(v, Value::String(s) if s.starts_with("${env.")) || v.is_object() || v.is_null()
}

/// `v` to be written down: values of credential-looking keys `<redacted>` (see [`Redacted`]),
/// and credentials given with `--set` inside other strings (a token pasted into a command by
/// `${params.api_token}`) `***`. (Params hold `${env.…}` placeholders, never the values.)
pub fn redacted_value(v: &Value) -> Value {
    let by_key = serde_json::to_value(Redacted(v)).unwrap_or(Value::Null);
    let text = by_key.to_string();
    let hidden = replace_all(&text, GIVEN.read().unwrap_or_else(|e| e.into_inner()).clone());
    if hidden == text { by_key } else { serde_json::from_str(&hidden).unwrap_or(by_key) }
}

/// Serialises a resolved pipeline for records: params whose key looks like a credential are
/// written `<redacted>` (unless they only hold an `${env.…}` placeholder). No redacted copy is
/// made: a run record writes the whole pipeline at the run's start and at its end.
pub struct Redacted<'a>(pub &'a Value);

impl serde::Serialize for Redacted<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::Object(o) => {
                let mut m = s.serialize_map(Some(o.len()))?;
                for (k, x) in o {
                    if keeps(k, x) {
                        m.serialize_entry(k, &Redacted(x))?;
                    } else {
                        m.serialize_entry(k, "<redacted>")?;
                    }
                }
                m.end()
            }
            Value::Array(a) => {
                let mut q = s.serialize_seq(Some(a.len()))?;
                for x in a {
                    q.serialize_element(&Redacted(x))?;
                }
                q.end()
            }
            other => other.serialize(s),
        }
    }
}

/// `--set` entries as recorded: values of keys that look like credentials become `<redacted>`.
pub fn redact_overrides(overrides: &[String]) -> Vec<String> {
    overrides
        .iter()
        .map(|o| match o.split_once('=') {
            Some((path, _)) if sets_secret(o) => format!("{path}=<redacted>"),
            _ => o.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_placeholders_fill_at_run_time_only() {
        // SAFETY: test-local variable name, set before any read.
        unsafe { std::env::set_var("RAO_TEST_FILL_ENV_TOKEN", "abc123") };
        let v = serde_json::json!({"url": "https://x/?t=${env.RAO_TEST_FILL_ENV_TOKEN}", "n": 3});
        assert_eq!(fill_env(&v).unwrap()["url"], "https://x/?t=abc123");
        assert!(fill_env(&serde_json::json!("${env.RAO_TEST_SURELY_UNSET_VAR}")).unwrap_err().contains("RAO_TEST_SURELY_UNSET_VAR"));
        assert_eq!(redact("token abc123 leaked"), "token *** leaked");
    }

    #[test]
    fn secret_keys_are_redacted_in_records() {
        let v = serde_json::json!({"params": {"api_key": "k-1", "hf_token": "${env.HF_TOKEN}", "lr": 0.1}});
        let r = serde_json::to_value(Redacted(&v)).unwrap();
        assert_eq!(r["params"]["api_key"], "<redacted>");
        assert_eq!(r["params"]["hf_token"], "${env.HF_TOKEN}");
        assert_eq!(r["params"]["lr"], 0.1);
        assert_eq!(serde_json::to_value(Redacted(&r)).unwrap(), r, "what was redacted stays as it is");
        assert!(looks_secret("hf_Token") && looks_secret("x-api_key") && !looks_secret("tok") && !looks_secret("lr"));
    }
}
