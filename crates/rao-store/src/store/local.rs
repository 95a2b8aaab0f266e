//! Direct file-system operations of a local store, with the same guarantees as object_store's
//! local backend: an object appears whole or not at all.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(PartialEq)]
pub enum Mode {
    Replace,
    /// Fail (return `false`) if the key exists: a hard link never overwrites.
    CreateOnly,
}

/// Temporary files carry this in their name; listings skip them.
const TEMP_MARK: &str = ".rao-tmp.";

/// A local store's root directory, held open; files are named relative to it. Callers pass
/// only plain relative names (`is_plain`), so nothing resolves outside the root.
pub struct Dir {
    #[cfg(unix)]
    fd: std::os::fd::OwnedFd,
    #[cfg(not(unix))]
    root: std::path::PathBuf,
}

impl Dir {
    #[cfg(unix)]
    pub fn open(root: &Path) -> std::io::Result<Dir> {
        use std::os::unix::fs::OpenOptionsExt;
        // On Linux O_PATH: a handle to name files by, not one to read the directory through.
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let flags = libc::O_PATH | libc::O_DIRECTORY;
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let flags = libc::O_DIRECTORY;
        let dir = std::fs::OpenOptions::new().read(true).custom_flags(flags).open(root)?;
        Ok(Dir { fd: dir.into() })
    }
    #[cfg(not(unix))]
    pub fn open(root: &Path) -> std::io::Result<Dir> {
        Ok(Dir { root: root.to_path_buf() })
    }

    #[cfg(unix)]
    fn open_file(&self, rel: &str) -> std::io::Result<std::fs::File> {
        use std::os::fd::{AsRawFd, FromRawFd};
        let name = c_name(rel)?;
        // SAFETY: `name` is a NUL-terminated string that outlives the call; a returned
        // descriptor is owned by nothing else and is handed to the `File`.
        // O_NONBLOCK: opening a FIFO (a file replaced by one) waits for a writer otherwise. On a
        // regular file it changes nothing.
        let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK;
        let fd = unsafe { libc::openat(self.fd.as_raw_fd(), name.as_ptr(), flags) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(unsafe { std::fs::File::from_raw_fd(fd) })
    }
    #[cfg(not(unix))]
    fn open_file(&self, rel: &str) -> std::io::Result<std::fs::File> {
        std::fs::File::open(self.root.join(rel))
    }

    /// A whole file with one system call fewer than `std::fs::read` for the small objects
    /// most reads are (manifests: a fully cached run reads one per stage): no `fstat` for a
    /// size hint unless the first read fills its buffer, and no zeroing of the buffer. It
    /// reads on until a read finds the end: a short read is not the end on every filesystem
    /// (FUSE, network mounts).
    ///
    /// Only a regular file is read past its first buffer: the `fstat` made then (or when a
    /// read fails: a folder, a FIFO with nothing to read) refuses anything else, so a link to
    /// a device is not read without end. A FIFO without a writer reads as empty.
    pub fn read(&self, rel: &str) -> std::io::Result<Vec<u8>> {
        self.read_at_most(rel, u64::MAX)
    }

    /// [`Dir::read`] of a file that may hold at most `max` bytes (more: an error, before
    /// anything past the first buffer is read).
    pub fn read_at_most(&self, rel: &str, max: u64) -> std::io::Result<Vec<u8>> {
        use std::io::Read;
        const FIRST_READ: usize = 16 << 10;
        let mut file = self.open_file(rel)?;
        let mut buf = Vec::with_capacity(FIRST_READ);
        // Through `Take`, not `File`: a `File` asks the file system for its size first.
        let first = (&mut file).take(FIRST_READ as u64).read_to_end(&mut buf);
        if first.is_ok() && buf.len() < FIRST_READ {
            return Ok(buf);
        }
        let size = match file.metadata() {
            Ok(meta) if meta.is_file() => meta.len(),
            Ok(_) => {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not a regular file (a folder, a pipe or a device)"));
            }
            Err(e) => return Err(first.err().unwrap_or(e)),
        };
        first?;
        if size > max {
            return Err(too_large(size, max));
        }
        // The size is known now: read to the end through `Take` again (no second `fstat`).
        // A sparse file may claim far more than memory holds: an error, not an abort.
        buf.try_reserve(usize::try_from(size).unwrap_or(usize::MAX).saturating_sub(buf.len()))
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::OutOfMemory, format!("{size} bytes: {e}")))?;
        // A file that grows while it is read stops one byte past the bound.
        (&mut file).take(max.saturating_sub(buf.len() as u64).saturating_add(1)).read_to_end(&mut buf)?;
        if buf.len() as u64 > max {
            return Err(too_large(buf.len() as u64, max));
        }
        Ok(buf)
    }

    /// The size of a regular file; a link (rao stores none), FIFO, device or folder is an
    /// error, as a tampered store may put one where a file was.
    #[cfg(unix)]
    pub fn size(&self, rel: &str) -> std::io::Result<u64> {
        use std::os::fd::AsRawFd;
        let name = c_name(rel)?;
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: `name` is NUL-terminated and `st` is written by the call before it is read.
        if unsafe { libc::fstatat(self.fd.as_raw_fd(), name.as_ptr(), st.as_mut_ptr(), libc::AT_SYMLINK_NOFOLLOW) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let st = unsafe { st.assume_init() };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not a regular file (a link, a pipe or a device)"));
        }
        Ok(st.st_size as u64)
    }
    #[cfg(not(unix))]
    pub fn size(&self, rel: &str) -> std::io::Result<u64> {
        let meta = std::fs::symlink_metadata(self.root.join(rel))?;
        if !meta.file_type().is_file() {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not a regular file (a link, a pipe or a device)"));
        }
        Ok(meta.len())
    }
}

fn too_large(size: u64, max: u64) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, TooLarge { size, max })
}

/// A file larger than a bounded read takes ([`Dir::read_at_most`]).
#[derive(Debug, thiserror::Error)]
#[error("{size} bytes, more than the {max} read for it")]
pub struct TooLarge {
    pub size: u64,
    pub max: u64,
}

#[cfg(unix)]
fn c_name(rel: &str) -> std::io::Result<std::ffi::CString> {
    std::ffi::CString::new(rel).map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte in a file name"))
}

pub fn write_whole(path: &Path, bytes: &[u8], mode: Mode) -> std::io::Result<bool> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"));
    };
    let name = name.to_string_lossy();
    let tmp = parent.join(format!(".{name}{TEMP_MARK}{}.{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
    let written = (|| {
        // The folder is made only when missing: most writes go to one that exists (a mkdir
        // and a stat fewer each).
        let mut f = making_parent(&tmp, || std::fs::File::create(&tmp))?;
        f.write_all(bytes)?;
        f.flush()
    })();
    let result = written.and_then(|()| match mode {
        Mode::Replace => std::fs::rename(&tmp, path).map(|()| true),
        Mode::CreateOnly => match std::fs::hard_link(&tmp, path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        },
    });
    if mode == Mode::CreateOnly || result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `op` (a create or rename at `path`), making `path`'s folder when it is missing. The folder
/// is made only then: most writes go to one that exists (a mkdir and a stat fewer each). It
/// tries again a few times because `rao gc` may remove an empty folder just made.
pub fn making_parent<T>(path: &Path, mut op: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let parent = path.parent().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"))?;
    let mut tries = 0;
    loop {
        match op() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 8 => {
                tries += 1;
                std::fs::create_dir_all(parent)?;
            }
            result => return result,
        }
    }
}

/// Remove `dir`'s empty subfolders, deepest first, then `dir` if it is empty (`remove_dir`
/// refuses a folder with anything in it). Links are not followed, `dir` itself included.
pub fn remove_empty_dirs(dir: &Path) {
    if !std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        return;
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_dirs(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Whether a file name is one of [`write_whole`]'s temporaries: `.NAME.rao-tmp.PID.COUNT`.
/// Matched whole, so that an output that merely contains the mark is no temporary.
pub fn is_temporary(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    name.starts_with('.')
        && name.rsplit_once(TEMP_MARK).and_then(|(_, tail)| tail.split_once('.')).is_some_and(|(pid, n)| digits(pid) && digits(n))
}

/// Every file under `dir` as (key relative to `root`, size), sorted; temporary files skipped.
pub fn list(root: &Path, dir: &Path) -> std::io::Result<Vec<super::Listed>> {
    list_where(root, dir, |name| !is_temporary(name) && !name.contains('#'))
}

/// The temporary files under `dir` (a writer's unfinished files), listed as [`list`] lists.
pub fn temporaries(root: &Path, dir: &Path) -> std::io::Result<Vec<super::Listed>> {
    list_where(root, dir, is_temporary)
}

/// Every regular file under `dir` whose name `wanted` accepts, sorted by key.
fn list_where(root: &Path, dir: &Path, wanted: impl Fn(&str) -> bool) -> std::io::Result<Vec<super::Listed>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.kind() == std::io::ErrorKind::NotADirectory => continue,
            Err(e) => return Err(e),
        };
        // An entry deleted between the listing and its stat (another run removing an old
        // lease generation, say) was simply not there.
        let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        for e in entries {
            let e = e?;
            let ty = match e.file_type() {
                Err(err) if gone(&err) => continue,
                ty => ty?,
            };
            let name = e.file_name().to_string_lossy().to_string();
            if ty.is_dir() {
                stack.push(e.path());
            } else if ty.is_file() && wanted(&name) {
                // Symbolic links and other special files are not objects: skipped.
                if let Ok(rel) = e.path().strip_prefix(root) {
                    let meta = match e.metadata() {
                        Err(err) if gone(&err) => continue,
                        meta => meta?,
                    };
                    let modified = meta.modified().unwrap_or(std::time::SystemTime::UNIX_EPOCH);
                    out.push(super::Listed { key: rel.to_string_lossy().replace('\\', "/"), size: meta.len(), modified });
                }
            }
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}
