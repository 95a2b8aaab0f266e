//! Reading a checkpoint directory's files as untrusted input: sizes bounded before reading, and
//! every error names the file (and the line and column where there is one) and what to fix.

use std::path::Path;

use serde::de::DeserializeOwned;

/// The largest JSON file read (Qwen's `tokenizer.json` is about 11 MB).
const MAX_JSON_BYTES: u64 = 256 << 20;

/// A file's text, refusing files over `limit` bytes.
pub fn read_text(path: &Path, limit: u64) -> anyhow::Result<String> {
    let meta = std::fs::metadata(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    anyhow::ensure!(meta.is_file(), "{}: not a file", path.display());
    anyhow::ensure!(meta.len() <= limit, "{}: {} bytes, more than the {} this file may have", path.display(), meta.len(), limit);
    let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| anyhow::anyhow!("{}: not UTF-8 text ({e})", path.display()))
}

/// A JSON file parsed as `T`, with its text (to locate later errors). Parse errors say
/// `path:line:column`.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> anyhow::Result<(T, String)> {
    let text = read_text(path, MAX_JSON_BYTES)?;
    Ok((parse_json(path, &text)?, text))
}

/// JSON text from `path` parsed as `T`; errors say `path:line:column`.
pub fn parse_json<T: DeserializeOwned>(path: &Path, text: &str) -> anyhow::Result<T> {
    serde_json::from_str(text).map_err(|e| anyhow::anyhow!("{}:{}:{}: {e}", path.display(), e.line(), e.column()))
}

/// `path:line:column` of the first `"key"` in a JSON text (the file itself when absent), for
/// errors about a value that parsed but cannot be used.
pub fn locate(path: &Path, text: &str, key: &str) -> String {
    match text.find(&format!("\"{key}\"")) {
        Some(at) => {
            let line = text[..at].matches('\n').count() + 1;
            let column = at - text[..at].rfind('\n').map_or(0, |n| n + 1) + 1;
            format!("{}:{line}:{column}", path.display())
        }
        None => path.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_keys_by_line_and_column() {
        let text = "{\n  \"a\": 1,\n    \"b\": 2\n}";
        assert_eq!(locate(Path::new("c.json"), text, "b"), "c.json:3:5");
        assert_eq!(locate(Path::new("c.json"), text, "z"), "c.json");
    }
}
