//! Content fingerprints of stage instances, and the explanation of why one changed.
//!
//! An instance's fingerprint is the first 128 bits (hex) of a blake3 hash over exactly these
//! fields, each written as its length (u64, little-endian) and then its bytes, after the
//! domain tag `rao-fingerprint-v2`:
//!
//! | field          | what it is                                                                                   |
//! |----------------|----------------------------------------------------------------------------------------------|
//! | `kind`         | the stage kind's name                                                                        |
//! | `kind_version` | the kind's hand-kept version (u32 LE)                                                        |
//! | `code`         | a build-time hash of the source code that produces the kind's outputs (`KindSignature::code_version`) |
//! | `machine`      | what makes the kind's bits machine-dependent, e.g. the CPU's SIMD path (`KindSignature::machine_profile`) |
//! | `params`       | the params *as resolved* (placeholders substituted, defaults filled), canonical JSON         |
//! | `seed`         | the instance's seed (u64 LE), derived from the pipeline seed and the instance name          |
//! | `extra`        | what the kind adds (files a shell command reads, a dataset's listing)                        |
//! | `inputs`       | the number of inputs, then per input (by name) its name, its number of sources and each source as `FINGERPRINT/OUTPUT` |
//!
//! Not in it: where an instance runs (executor, host), when, the store, the pipeline's and the
//! instance's names (except through the seed), `${env.…}` values (only their placeholders).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::compile::{Compiled, Source};

/// Everything a fingerprint is made of. Stored in the status index so a cache miss can be explained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FpParts {
    pub kind: String,
    pub kind_version: u32,
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub machine: String,
    pub params: Value,
    pub seed: u64,
    #[serde(default)]
    pub extra: String,
    /// input name → "FINGERPRINT/OUTPUT" of each upstream artifact.
    pub inputs: FpInputs,
}

/// Input name → `FINGERPRINT/OUTPUT` of each upstream artifact, as a fingerprint names them.
pub type FpInputs = BTreeMap<String, Vec<String>>;

/// The fields of a fingerprint, borrowed: hashed in place from the plan or from `FpParts`.
struct Fields<'a> {
    kind: &'a str,
    kind_version: u32,
    code: &'a str,
    machine: &'a str,
    params: &'a Value,
    seed: u64,
    extra: &'a str,
    inputs: &'a FpInputs,
}

impl Fields<'_> {
    fn fingerprint(&self) -> String {
        // The fields go into one buffer and are hashed at once: the same bytes as hashing each
        // field as it comes, without a hasher call per field.
        let mut buf = Vec::with_capacity(512);
        let field = |buf: &mut Vec<u8>, bytes: &[u8]| {
            buf.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            buf.extend_from_slice(bytes);
        };
        field(&mut buf, b"rao-fingerprint-v2");
        field(&mut buf, self.kind.as_bytes());
        field(&mut buf, &self.kind_version.to_le_bytes());
        field(&mut buf, self.code.as_bytes());
        field(&mut buf, self.machine.as_bytes());
        // Canonical params written in place, behind a length patched in afterwards.
        let at = buf.len();
        buf.extend_from_slice(&[0; 8]);
        canonical_into(self.params, &mut buf);
        let len = (buf.len() - at - 8) as u64;
        buf[at..at + 8].copy_from_slice(&len.to_le_bytes());
        field(&mut buf, &self.seed.to_le_bytes());
        field(&mut buf, self.extra.as_bytes());
        field(&mut buf, &(self.inputs.len() as u64).to_le_bytes());
        for (name, srcs) in self.inputs {
            field(&mut buf, name.as_bytes());
            field(&mut buf, &(srcs.len() as u64).to_le_bytes());
            for s in srcs {
                field(&mut buf, s.as_bytes());
            }
        }
        blake3::hash(&buf).to_hex()[..32].to_string()
    }
}

impl FpParts {
    pub fn fingerprint(&self) -> String {
        Fields {
            kind: &self.kind,
            kind_version: self.kind_version,
            code: &self.code,
            machine: &self.machine,
            params: &self.params,
            seed: self.seed,
            extra: &self.extra,
            inputs: &self.inputs,
        }
        .fingerprint()
    }

    /// A copy to write down (the status index): values of credential-looking params read
    /// `<redacted>`, as in run records. Explains a change; cannot be hashed back to the fingerprint.
    pub fn redacted(&self) -> FpParts {
        FpParts { params: crate::secrets::redacted_value(&self.params), ..self.clone() }
    }

    /// Why `self` (new) differs from `old`: "params.lr changed 0.1 → 0.2", "input tasks changed", …
    /// Credential-looking values are compared and shown redacted on both sides (an index written
    /// by an older rao may hold them in clear).
    pub fn explain_change(&self, old: &FpParts) -> Vec<String> {
        let mut why = Vec::new();
        if self.kind != old.kind || self.kind_version != old.kind_version {
            why.push(format!("kind {} v{} → {} v{}", old.kind, old.kind_version, self.kind, self.kind_version));
        } else if self.code != old.code {
            why.push(format!("code of kind {} changed", self.kind));
        }
        if self.machine != old.machine {
            why.push(format!("machine profile changed: {} → {}", short_text(&old.machine), short_text(&self.machine)));
        }
        let (old_params, new_params) = (crate::secrets::redacted_value(&old.params), crate::secrets::redacted_value(&self.params));
        diff_values("params", &old_params, &new_params, &mut why);
        // Nothing else differs and a value was redacted: that value is what changed.
        let redacted_any = new_params != self.params;
        if self.seed != old.seed {
            why.push("seed changed".into());
        }
        if self.extra != old.extra {
            why.extend(dependency_changes(&old.extra, &self.extra).unwrap_or_else(|| vec!["a dependency file changed".into()]));
        }
        let names: std::collections::BTreeSet<&String> = self.inputs.keys().chain(old.inputs.keys()).collect();
        for n in names {
            if self.inputs.get(n) != old.inputs.get(n) {
                why.push(format!("input {n} changed"));
            }
        }
        if why.is_empty() && redacted_any {
            why.push("a credential-looking param changed (rao does not store their values)".into());
        }
        if why.is_empty() {
            why.push("fingerprint changed".into());
        }
        why
    }
}

/// One file a stage's `fingerprint_extra` lists (a shell stage's `deps`) with its content hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DepHash {
    pub file: String,
    pub blake3: String,
}

/// Which listed files differ between two `extra` fields, where both list files ([`DepHash`]);
/// `None` where either is something else (a dataset's listing, an older store's hash).
fn dependency_changes(old: &str, new: &str) -> Option<Vec<String>> {
    let (old, new): (Vec<DepHash>, Vec<DepHash>) = (serde_json::from_str(old).ok()?, serde_json::from_str(new).ok()?);
    let hash_in = |list: &[DepHash], file: &str| list.iter().find(|d| d.file == file).map(|d| d.blake3.clone());
    let mut files: Vec<&str> = old.iter().chain(&new).map(|d| d.file.as_str()).collect();
    files.sort_unstable();
    files.dedup();
    let mut out = Vec::new();
    for file in files {
        match (hash_in(&old, file), hash_in(&new, file)) {
            (Some(a), Some(b)) if a != b => out.push(format!("dependency `{file}` changed")),
            (None, Some(_)) => out.push(format!("dependency `{file}` added")),
            (Some(_), None) => out.push(format!("dependency `{file}` removed")),
            _ => {}
        }
    }
    (!out.is_empty()).then_some(out)
}

fn diff_values(path: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let p = format!("{path}.{k}");
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => diff_values(&p, x, y, out),
                    (None, Some(y)) => out.push(format!("{p} added ({})", short(y))),
                    (Some(_), None) => out.push(format!("{p} removed")),
                    (None, None) => {}
                }
            }
        }
        (a, b) if a != b => out.push(format!("{path} changed {} → {}", short(a), short(b))),
        _ => {}
    }
}

fn short_text(s: &str) -> String {
    if s.is_empty() { "(none)".into() } else { s.to_string() }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 { format!("{}…", s.chars().take(40).collect::<String>()) } else { s }
}

/// JSON with object keys sorted at every level: the same value always hashes the same. Written
/// straight into one buffer (the fingerprint of every instance is hashed over it).
pub fn canonical(v: &Value) -> String {
    let mut out = Vec::new();
    canonical_into(v, &mut out);
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// [`canonical`], appended to `out`.
fn canonical_into(v: &Value, out: &mut Vec<u8>) {
    fn json(x: &(impl Serialize + ?Sized), out: &mut Vec<u8>) {
        serde_json::to_writer(out, x).expect("JSON into memory cannot fail");
    }
    match v {
        Value::Object(o) => {
            let mut entries: Vec<(&String, &Value)> = o.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, x)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json(k.as_str(), out);
                out.push(b':');
                canonical_into(x, out);
            }
            out.push(b'}');
        }
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_into(x, out);
            }
            out.push(b']');
        }
        other => json(other, out),
    }
}

impl Compiled {
    /// The fingerprint parts of instance `i`, given upstream fingerprints and loop decisions.
    /// `None` when something it depends on is not known yet.
    pub fn fp_parts(&self, i: usize, fp: impl Fn(usize) -> Option<String>, loop_exit: impl Fn(usize) -> Option<u32>) -> Option<FpParts> {
        Some(self.parts_with(i, self.fp_inputs(i, fp, loop_exit)?))
    }

    /// The fingerprint of instance `i` (as `fp_parts(…).fingerprint()`, without copying its params).
    pub fn fingerprint(&self, i: usize, fp: impl Fn(usize) -> Option<String>, loop_exit: impl Fn(usize) -> Option<u32>) -> Option<String> {
        Some(self.fingerprint_with(i, &self.fp_inputs(i, fp, loop_exit)?))
    }

    /// The upstream artifacts of instance `i`; `None` when one is not known yet.
    pub fn fp_inputs(&self, i: usize, fp: impl Fn(usize) -> Option<String>, loop_exit: impl Fn(usize) -> Option<u32>) -> Option<FpInputs> {
        let mut inputs = BTreeMap::new();
        for (name, sources) in &self.instances[i].inputs {
            let mut v = Vec::new();
            for (producer, output) in self.resolve_sources(sources, &loop_exit)? {
                v.push(format!("{}/{}", fp(producer)?, output));
            }
            inputs.insert(name.clone(), v);
        }
        Some(inputs)
    }

    /// The fingerprint of instance `i` with these upstream artifacts, hashed from the plan in place.
    pub fn fingerprint_with(&self, i: usize, inputs: &FpInputs) -> String {
        let inst = &self.instances[i];
        Fields {
            kind: &inst.kind,
            kind_version: inst.kind_version,
            code: &inst.code,
            machine: &inst.machine,
            params: &inst.resolved_params,
            seed: inst.seed,
            extra: &inst.extra,
            inputs,
        }
        .fingerprint()
    }

    /// The fingerprint parts of instance `i` with these upstream artifacts, owned.
    pub fn parts_with(&self, i: usize, inputs: FpInputs) -> FpParts {
        let inst = &self.instances[i];
        FpParts {
            kind: inst.kind.clone(),
            kind_version: inst.kind_version,
            code: inst.code.clone(),
            machine: inst.machine.clone(),
            params: inst.resolved_params.clone(),
            seed: inst.seed,
            extra: inst.extra.clone(),
            inputs,
        }
    }

    /// Concrete (producer instance, output) pairs behind a list of sources.
    pub fn resolve_sources(&self, sources: &[Source], loop_exit: &impl Fn(usize) -> Option<u32>) -> Option<Vec<(usize, String)>> {
        let mut out = Vec::new();
        for s in sources {
            match s {
                Source::Output { instance, output } => out.push((*instance, output.clone())),
                Source::LoopExit { loop_idx, var } => {
                    let k = loop_exit(*loop_idx)?;
                    for src in self.loops[*loop_idx].carry_sources(var, k) {
                        if let Source::Output { instance, output } = src {
                            out.push((instance, output));
                        }
                    }
                }
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys_at_every_level_and_escapes_as_serde_json_does() {
        let v = serde_json::json!({"b": [1, "x\"y\n", {"z": true, "y": 2.5e-7}], "a": {"d": null, "c": -1.5}, "é": "ü"});
        assert_eq!(canonical(&v), r#"{"a":{"c":-1.5,"d":null},"b":[1,"x\"y\n",{"y":2.5e-7,"z":true}],"é":"ü"}"#);
    }
}
