//! What the integration tests share: running the `rao` binary, reading what it printed, and the
//! fixtures of several areas (a shell chain, concurrent runs, a real vLLM).

pub mod chain;
pub mod concurrent;
pub mod vllm;

use std::path::Path;
use std::process::{Command, Output};

/// `rao ARGS` run in `dir`, not yet started: add environment, pipes or a timeout.
pub fn command(args: &[&str], dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rao"));
    c.args(args).current_dir(dir);
    c
}

/// `rao ARGS` run in `dir` to its end.
pub fn rao(args: &[&str], dir: &Path) -> Output {
    command(args, dir).output().expect("run rao")
}

/// Everything a command printed: standard output, then standard error.
pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}
