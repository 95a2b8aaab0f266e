//! Local files a pipeline names (shell `deps`, `dataset` paths): regular files only — a pipe
//! would block and a device never end — hashed as a stream, so their size never matters to memory.

use std::path::Path;

/// Size and blake3 of a regular file.
pub fn hash_regular(path: &Path) -> Result<(u64, blake3::Hash), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot be read: {e}"))?;
    if !meta.is_file() {
        return Err("is not a regular file (a folder, a pipe or a device)".into());
    }
    hash_file(path).map_err(|e| format!("cannot be read: {e}"))
}

/// Size and blake3 of the file at `path`, read as a stream (it need not fit in memory). Opened
/// without waiting: should it have become a FIFO since it was looked at, no writer is awaited.
pub fn hash_file(path: &Path) -> std::io::Result<(u64, blake3::Hash)> {
    let mut open = std::fs::OpenOptions::new();
    open.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut open, libc::O_NONBLOCK);
    let mut h = blake3::Hasher::new();
    h.update_reader(open.open(path)?)?;
    Ok((h.count(), h.finalize()))
}

/// `sh` as a spawn by name would find it on this process's `PATH`, looked up once: spawning by
/// name tries every `PATH` entry before it, one failing `execve` each, at every shell stage.
#[cfg(unix)]
pub fn shell() -> &'static Path {
    use std::os::unix::fs::PermissionsExt;
    static SH: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    SH.get_or_init(|| {
        let runnable = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
        let path = std::env::var_os("PATH").unwrap_or_default();
        // A relative entry would be looked up from the stage's folder: left to the spawn.
        let first = std::env::split_paths(&path).take_while(|dir| dir.is_absolute()).map(|dir| dir.join("sh")).find(|p| runnable(p));
        first.unwrap_or_else(|| "sh".into())
    })
}

#[cfg(not(unix))]
pub fn shell() -> &'static Path {
    Path::new("sh")
}
