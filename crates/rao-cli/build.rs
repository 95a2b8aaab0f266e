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
    for path in ["HEAD", "packed-refs"].map(String::from).into_iter().chain(git(&["symbolic-ref", "-q", "HEAD"])) {
        if let Some(p) = git(&["rev-parse", "--git-path", &path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
}
