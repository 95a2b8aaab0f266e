//! Local files a pipeline names (shell `deps`, `dataset` paths): regular files only — a pipe
//! would block and a device never end — hashed as a stream, so their size never matters to memory.

use std::path::Path;

/// Size and blake3 of a regular file.
pub fn hash_regular(path: &Path) -> Result<(u64, blake3::Hash), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot be read: {e}"))?;
    if !meta.is_file() {
        return Err("is not a regular file (a folder, a pipe or a device)".into());
    }
    let file = std::fs::File::open(path).map_err(|e| format!("cannot be read: {e}"))?;
    let mut h = blake3::Hasher::new();
    h.update_reader(file).map_err(|e| format!("cannot be read: {e}"))?;
    Ok((h.count(), h.finalize()))
}
