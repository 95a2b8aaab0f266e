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
    let n = name.to_ascii_uppercase();
    ["TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "APIKEY", "ACCESS_KEY", "PRIVATE_KEY", "AUTH", "SESSION"]
        .iter()
        .any(|w| n.contains(w))
}

/// `text` with the value of every credential-looking environment variable (at least 4
/// characters long) replaced by `***`.
pub fn redact(text: &str) -> String {
    let mut out = text.to_string();
    let mut values: Vec<String> = std::env::vars().filter(|(k, v)| looks_secret(k) && v.len() >= 4).map(|(_, v)| v).collect();
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

/// A copy of a resolved pipeline for records: params whose key looks like a credential are
/// replaced by `<redacted>` (unless they only hold an `${env.…}` placeholder).
pub fn redact_value(v: &Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| {
                    let keep = !looks_secret(k) || matches!(x, Value::String(s) if s.starts_with("${env.")) || x.is_object() || x.is_null();
                    (k.clone(), if keep { redact_value(x) } else { Value::String("<redacted>".into()) })
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(redact_value).collect()),
        other => other.clone(),
    }
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
        let r = redact_value(&v);
        assert_eq!(r["params"]["api_key"], "<redacted>");
        assert_eq!(r["params"]["hf_token"], "${env.HF_TOKEN}");
        assert_eq!(r["params"]["lr"], 0.1);
    }
}
