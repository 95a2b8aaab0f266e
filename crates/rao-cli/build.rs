//! The commit the binary is built from, for run records and reports (`RAO_GIT_COMMIT`).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let o = Command::new("git").args(args).output().ok().filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=RAO_GIT_COMMIT={commit}");
    // A position-dependent executable: as a PIE, every start relocated 1.3 MB of `.data.rel.ro`
    // (1.0 M of `rao --version`'s 1.7 M instructions, 330 of its 500 page faults, about 1.3 ms).
    // The cost is ASLR for the executable's own image (libraries and the heap stay randomised).
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu") {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
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
