//! What rao started goes when rao is killed outright.
//!
//! A shell stage runs in a process group of its own and a `process` executor's stage in a
//! `rao exec` child; rao kills them when it is cancelled, times out or ends. `kill -9` (or the
//! out-of-memory killer) gives rao no chance to: its children would run on, unowned, writing into
//! the store. So the first time rao starts one, it also starts a small `sh` (in a group of its
//! own, deaf to the terminal's signals) that reads, from a pipe only rao holds, what to kill
//! (`+ -PGID` for a group, `+ PID` for a process) and what is no longer running (`- …`). When the
//! pipe closes — rao has exited, however it ended — the watcher kills what is still listed. A
//! normal end has unlisted everything already.

#[cfg(unix)]
use parking_lot::Mutex;
#[cfg(unix)]
use std::io::Write;

/// The list, kept in the shell's memory as " ID ID … " (POSIX `sh`: no arrays). Removal cuts the
/// first " ID " out with two parameter expansions (no `sed` per line).
#[cfg(unix)]
const WATCHER: &str = r#"trap '' INT TERM HUP
set -f
t=' '
while read -r op id; do
  case $op in
    +) t="$t$id " ;;
    -) case $t in *" $id "*) t="${t%%" $id "*} ${t#*" $id "}" ;; esac ;;
  esac
done
for id in $t; do kill -s KILL -- "$id" 2>/dev/null; done
"#;

#[cfg(unix)]
static WATCHER_PIPE: Mutex<Option<std::process::ChildStdin>> = Mutex::new(None);

/// Listed with the watcher while alive: unlisted when dropped. Drop it after the process (group)
/// has been killed or waited for, and before its id can be reused (before reaping, where that is
/// in the caller's hands).
pub struct Watched(#[cfg_attr(not(unix), allow(dead_code))] Option<String>);

impl Watched {
    /// A process group (its leader's PID).
    pub fn group(pgid: Option<u32>) -> Watched {
        Watched::list(pgid.map(|p| format!("-{p}")))
    }

    /// A single process.
    pub fn process(pid: Option<u32>) -> Watched {
        Watched::list(pid.map(|p| p.to_string()))
    }

    fn list(id: Option<String>) -> Watched {
        #[cfg(unix)]
        if let Some(id) = &id {
            send(&format!("+ {id}\n"));
        }
        Watched(id)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(id) = &self.0 {
            send(&format!("- {id}\n"));
        }
    }
}

/// One line to the watcher, started on first use. A watcher that cannot start or has gone costs
/// only this guarantee, never the run: the error is dropped.
#[cfg(unix)]
fn send(line: &str) {
    use std::os::unix::process::CommandExt;
    let mut pipe = WATCHER_PIPE.lock();
    // A watcher that has gone (the write fails: rao ignores SIGPIPE while it runs stages) is
    // replaced once; the new one knows only what is listed from then on.
    for _ in 0..2 {
        if pipe.is_none() {
            *pipe = std::process::Command::new(crate::local_file::shell())
                .arg("-c")
                .arg(WATCHER)
                .current_dir("/")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .process_group(0)
                .spawn()
                .ok()
                .and_then(|mut child| child.stdin.take());
        }
        // One `write` of a short line: the pipe takes it whole.
        match pipe.as_mut().map(|p| p.write_all(line.as_bytes())) {
            Some(Ok(())) | None => return,
            Some(Err(_)) => *pipe = None,
        }
    }
}
