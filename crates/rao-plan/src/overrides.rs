//! `--set path.to.key=value`: change a pipeline without editing the file (recorded in the run record).
//!
//! Paths: `name`, `seed`, `store`, `params.NAME[.SUB…]`, `stages.STAGE.params.NAME[.SUB…]`,
//! `stages.STAGE.retries`, `stages.STAGE.timeout`, `stages.LOOP.loop.max_iterations`,
//! `stages.LOOP.loop.lag.VAR.by`.
//! Stages inside loop bodies are found by name too. Values are YAML scalars (`3`, `0.5`, `true`, `text`).

use serde_json::Value;

use crate::diag::{Diagnostic, did_you_mean};
use crate::spec::{Duration, OrderedMap, PipelineFile, Pos, Sp, StageSpec};

const PATHS_HELP: &str = "`--set PATH=VALUE` takes seed, store, name, params.NAME[.SUB…], stages.STAGE.params.NAME[.SUB…], stages.STAGE.retries, stages.STAGE.timeout, stages.LOOP.loop.max_iterations or stages.LOOP.loop.lag.VAR.by";

pub fn apply(spec: &mut PipelineFile, overrides: &[String]) -> Result<(), Diagnostic> {
    for o in overrides {
        apply_one(spec, o).map_err(|msg| Diagnostic::new(Pos::NONE, format!("--set {o}: {msg}")).help(PATHS_HELP))?;
    }
    Ok(())
}

fn parse_value(text: &str) -> Value {
    serde_saphyr::from_str::<Value>(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

fn apply_one(spec: &mut PipelineFile, o: &str) -> Result<(), String> {
    let (path, raw) = o.split_once('=').ok_or("expected PATH=VALUE")?;
    let value = parse_value(raw);
    let parts: Vec<&str> = path.split('.').collect();
    match parts.as_slice() {
        ["seed"] => {
            spec.seed = Sp::synthetic(value.as_u64().ok_or("seed must be a non-negative integer")?);
        }
        ["store"] => spec.store = Some(Sp::synthetic(value.as_str().map(str::to_string).unwrap_or_else(|| raw.to_string()))),
        ["name"] => spec.name = Sp::synthetic(value.as_str().map(str::to_string).unwrap_or_else(|| raw.to_string())),
        ["params", rest @ ..] if !rest.is_empty() => set_param(&mut spec.params, rest, value)?,
        ["stages", stage, rest @ ..] => {
            let names: Vec<String> = all_stage_names(&spec.stages);
            let s = find_stage(&mut spec.stages, stage).ok_or_else(|| {
                format!(
                    "no stage `{stage}`{}",
                    did_you_mean(stage, names.iter().map(|s| s.as_str())).map(|h| format!("; {h}")).unwrap_or_default()
                )
            })?;
            match rest {
                ["params", p @ ..] if !p.is_empty() => set_param(&mut s.params, p, value)?,
                ["retries"] => s.retries = Some(Sp::synthetic(small_int(&value, "retries", 0, crate::check::MAX_RETRIES)?)),
                ["timeout"] => s.timeout = Some(Sp::synthetic(Duration::parse(raw)?)),
                ["loop", "max_iterations"] => {
                    let l = s.loop_.as_mut().ok_or_else(|| format!("stage `{stage}` is not a loop"))?;
                    l.max_iterations = Sp::synthetic(small_int(&value, "max_iterations", 1, u32::MAX)?);
                }
                ["loop", "lag", var, "by"] => {
                    let l = s.loop_.as_mut().ok_or_else(|| format!("stage `{stage}` is not a loop"))?;
                    let names: Vec<String> = l.lag.keys().map(str::to_string).collect();
                    let lag = l.lag.get_mut(var).ok_or_else(|| match names.is_empty() {
                        true => format!("loop `{stage}` has no `lag`; add `lag: {{{var}: {{of: VAR, by: K}}}}` to it"),
                        false => format!("loop `{stage}` has no lagged variable `{var}` (it has: {})", names.join(", ")),
                    })?;
                    lag.by = Sp::synthetic(small_int(&value, "by", 0, u32::MAX)?);
                }
                // A loop's body stages have names of their own, unique in the file.
                ["stages", body, more @ ..] => {
                    return Err(format!("a loop's stages are set by their own name: `stages.{body}.{}`", more.join(".")));
                }
                _ => return Err("can set params.NAME, retries, timeout, loop.max_iterations or loop.lag.VAR.by of a stage".into()),
            }
        }
        _ => return Err("unknown path; use seed, store, params.NAME or stages.STAGE.params.NAME".into()),
    }
    Ok(())
}

/// An integer from `min` to `max` (never wrapped).
fn small_int(value: &Value, what: &str, min: u32, max: u32) -> Result<u32, String> {
    value
        .as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .filter(|v| (min..=max).contains(v))
        .ok_or_else(|| format!("{what} must be an integer from {min} to {max}, not `{value}`"))
}

fn all_stage_names(stages: &OrderedMap<StageSpec>) -> Vec<String> {
    stages.iter().flat_map(|(n, s)| std::iter::once(n.value.clone()).chain(s.stages.keys().map(str::to_string))).collect()
}

fn find_stage<'a>(stages: &'a mut OrderedMap<StageSpec>, name: &str) -> Option<&'a mut StageSpec> {
    for (n, s) in stages.entries.iter_mut() {
        if n.value == name {
            return Some(s);
        }
        if let Some(b) = find_stage(&mut s.stages, name) {
            return Some(b);
        }
    }
    None
}

fn set_param(params: &mut OrderedMap<Sp<Value>>, path: &[&str], value: Value) -> Result<(), String> {
    let (first, rest) = path.split_first().unwrap();
    if rest.is_empty() {
        params.insert(Sp::synthetic(first.to_string()), Sp::synthetic(value));
        return Ok(());
    }
    let entry = params.get_mut(first).ok_or_else(|| format!("no param `{first}` to descend into"))?;
    let mut cur = &mut entry.value;
    for (i, key) in rest.iter().enumerate() {
        let obj = cur.as_object_mut().ok_or_else(|| format!("`{}` is not a mapping", path[..=i].join(".")))?;
        if i == rest.len() - 1 {
            obj.insert(key.to_string(), value);
            return Ok(());
        }
        cur = obj.entry(key.to_string()).or_insert_with(|| Value::Object(Default::default()));
    }
    Ok(())
}

/// `--set params.NAME…` overrides that no stage reads: neither `${params.NAME…}` itself nor a
/// `${params.…}` above it appears in any stage of `resolved` (the pipeline after overrides), so
/// the override changes nothing. Returns a warning per such override (naming the path, never the
/// value: it may be a secret).
/// `via` names where the overrides were given (`--set`, or a variant's `set:`).
pub fn unused_params(resolved: &Value, overrides: &[String], via: &str) -> Vec<String> {
    let mut refs = Vec::new();
    collect_refs(&resolved["stages"], &mut refs);
    overrides
        .iter()
        .filter_map(|o| {
            let path = o.split_once('=')?.0.strip_prefix("params.")?;
            let parts: Vec<&str> = path.split('.').collect();
            // Used if a stage reads this path, a path above it, or a path below it.
            let used = refs.iter().any(|r: &String| {
                let r: Vec<&str> = r.split('.').collect();
                let n = r.len().min(parts.len());
                r[..n] == parts[..n]
            });
            (!used).then(|| format!("{via} params.{path}: no stage reads `${{params.{path}}}`, so it changes nothing"))
        })
        .collect()
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => {
            for piece in s.split("${params.").skip(1) {
                if let Some(end) = piece.find('}') {
                    out.push(piece[..end].to_string());
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_refs(x, out)),
        Value::Object(m) => m.values().for_each(|x| collect_refs(x, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn an_override_of_a_param_no_stage_reads_is_reported() {
        let resolved = json!({"params": {"window": 96, "limits": {"depth": 2}, "lr": 0.1},
            "stages": {"a": {"params": {"w": "${params.window}", "l": "${params.limits}", "loop": {"stages": {"b": {"params": {"x": "id ${params.lr}"}}}}}}}});
        let sets = ["params.window=64", "params.limits.depth=3", "params.lr=0.2", "params.unused=1", "seed=2"].map(String::from);
        let w = super::unused_params(&resolved, &sets, "--set");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("--set params.unused: no stage reads `${params.unused}`"), "{w:?}");
    }
}
