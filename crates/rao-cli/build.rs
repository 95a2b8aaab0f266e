//! The commit the binary is built from, for run records and reports (`RAO_GIT_COMMIT`).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let o = Command::new("git").args(args).output().ok().filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=RAO_GIT_COMMIT={commit}");
    // Rebuild when HEAD moves: HEAD itself (checkouts) and the branch it points at (commits).
    // `refs/heads` is watched whole (cargo scans a directory): a branch that is packed now may
    // get a loose ref file at the next commit.
    for path in ["HEAD", "packed-refs", "refs/heads"] {
        // Only paths that exist: cargo re-runs a build script whose watched path is missing.
        if let Some(p) = git(&["rev-parse", "--git-path", path]).filter(|p| std::path::Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
}
