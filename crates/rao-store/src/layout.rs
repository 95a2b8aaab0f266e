//! Where things live in a store, and the checks that every name or path read back from a store
//! passes before it touches a disk. A store may be a bucket other people can write to: a manifest
//! that names `../../etc/x` must be refused, not followed.
//!
//! ```text
//! objects/<fp[..2]>/<fp>/MANIFEST.json        "done": written once, last (first writer wins)
//! objects/<fp[..2]>/<fp>/<attempt>/<output>/… one attempt's published outputs (never rewritten)
//! objects/<fp[..2]>/<fp>/out/<output>/…       outputs of stores written before attempts existed
//! leases/<fp[..2]>/<fp>/g<generation>.json    who is computing <fp> right now
//! progress/<fp>/…                             resumable progress of a long stage
//! runs/<pipeline>/<run>.json                  run records
//! index/<pipeline>/<instance>.json            last fingerprint of each instance name
//! staging/…                                   local stores only: outputs before publication
//! quarantine/<fp>.<time>.json                 damaged manifests, kept for inspection
//! ```

/// Longest name (pipeline, stage, output, run id) rao accepts: far below file systems' 255-byte
/// limit on one path component, with room for the suffixes rao adds (`@k`, `[key=value]`, `.json`).
pub const MAX_NAME_LEN: usize = 120;

/// A fingerprint as rao writes it: 32 lowercase hex digits.
pub fn is_fingerprint(fp: &str) -> bool {
    fp.len() == 32 && fp.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A name that can be one path component everywhere: letters, digits, `_`, `-`, `.`, `@`, `=`,
/// `,`, `[`, `]`, not starting with a dot, at most [`MAX_NAME_LEN`] bytes.
pub fn check_component(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("{what} is empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!("{what} is {} characters long; at most {MAX_NAME_LEN} are allowed", name.len()));
    }
    if name.starts_with('.') {
        return Err(format!("{what} `{name}` starts with a dot"));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@' | '=' | ',' | '[' | ']'))) {
        return Err(format!("{what} `{}` contains `{}`", name.escape_debug(), c.escape_debug()));
    }
    Ok(())
}

/// A relative path inside an artifact: `/`-separated, no empty, `.` or `..` components, not
/// absolute, no backslashes or control characters.
pub fn check_rel_path(path: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("file path `{}` {why}", path.escape_debug()));
    if path.is_empty() {
        return bad("is empty");
    }
    if path.starts_with('/') {
        return bad("is absolute");
    }
    if path.contains('\\') || path.chars().any(char::is_control) {
        return bad("contains a backslash or a control character");
    }
    for part in path.split('/') {
        match part {
            "" => return bad("has an empty component"),
            "." | ".." => return bad("has a `.` or `..` component"),
            _ => {}
        }
    }
    Ok(())
}

pub fn object_dir(fp: &str) -> String {
    key(&["objects", shard(fp), fp])
}

pub fn manifest_key(fp: &str) -> String {
    key(&["objects", shard(fp), fp, "MANIFEST.json"])
}

/// Where output `output` of the attempt `attempt` of `fp` lives (`None`: the layout before
/// attempts, `out/`).
pub fn output_prefix(fp: &str, attempt: Option<&str>, output: &str) -> String {
    key(&["objects", shard(fp), fp, attempt.unwrap_or("out"), output])
}

/// The two-letter folder a fingerprint's objects and leases sit in.
fn shard(fp: &str) -> &str {
    &fp[..2.min(fp.len())]
}

/// `parts` joined by `/` (a cache hit builds several keys per instance: no formatting machinery).
fn key(parts: &[&str]) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.push('/');
        }
        out.push_str(p);
    }
    out
}

pub fn attempt_prefix(fp: &str, attempt: &str) -> String {
    format!("{}/{attempt}", object_dir(fp))
}

pub fn lease_prefix(fp: &str) -> String {
    key(&["leases", shard(fp), fp])
}

pub fn progress_prefix(fp: &str) -> String {
    format!("progress/{fp}")
}

pub fn run_record_key(pipeline: &str, run_id: &str) -> String {
    format!("runs/{pipeline}/{run_id}.json")
}

pub fn quarantine_key(fp: &str, at: f64) -> String {
    format!("quarantine/{fp}.{}.json", at as u64)
}

/// A fresh attempt id: unique across processes and machines sharing a store.
pub fn new_attempt_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = blake3::Hasher::new();
    h.update(crate::lease::host_name().as_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    h.update(&nanos.to_le_bytes());
    format!("a-{}", &h.finalize().to_hex()[..16])
}

/// An attempt id as [`new_attempt_id`] writes it.
pub fn is_attempt_id(a: &str) -> bool {
    a.len() == 18 && a.starts_with("a-") && a[2..].bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_paths_are_refused() {
        for p in ["../x", "a/../../b", "/etc/passwd", "a//b", "./a", "a\\b", "", "a/\n", "a/."] {
            assert!(check_rel_path(p).is_err(), "{p:?} accepted");
        }
        for p in ["a", "a/b.parquet", "dir/sub/file-1_2.json", "..a", "a..b"] {
            assert!(check_rel_path(p).is_ok(), "{p:?} refused");
        }
    }

    #[test]
    fn names_are_one_safe_component() {
        assert!(check_component("run id", "20261130T120000Z-42").is_ok());
        assert!(check_component("instance", "evaluate[band=hard,w=96]").is_ok());
        for bad in ["../../x", "a/b", ".hidden", "", &"x".repeat(MAX_NAME_LEN + 1)] {
            assert!(check_component("run id", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn keys_follow_the_layout() {
        let fp = "0123456789abcdef0123456789abcdef";
        assert_eq!(manifest_key(fp), format!("objects/01/{fp}/MANIFEST.json"));
        assert_eq!(output_prefix(fp, Some("a-0011223344556677"), "trees"), format!("objects/01/{fp}/a-0011223344556677/trees"));
        assert_eq!(output_prefix(fp, None, "trees"), format!("objects/01/{fp}/out/trees"));
        assert_eq!(lease_prefix(fp), format!("leases/01/{fp}"));
        assert_eq!(object_dir("a"), "objects/a/a", "a short name does not panic");
    }

    #[test]
    fn attempt_ids_are_unique_and_recognised() {
        let (a, b) = (new_attempt_id(), new_attempt_id());
        assert_ne!(a, b);
        assert!(is_attempt_id(&a) && is_attempt_id(&b));
        assert!(!is_attempt_id("out") && !is_attempt_id("a-../../../etc"));
    }
}
