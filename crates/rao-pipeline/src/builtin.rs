//! Built-in kinds that need no RL: `shell` (run a command) and `noop` (for tests and benchmarks).

use std::collections::BTreeMap;
use std::path::Path;

use futures::FutureExt;
use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::kind::{InputDecl, KindSignature, ParamError, StageContext, StageKind, check_typed, resolve_typed};

/// Params of `shell`.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShellParams {
    /// Run with `sh -c` in the pipeline file's directory. `${inputs.NAME}` and `${outputs.NAME}`
    /// expand to directories (also in env vars `RAO_IN_NAME` / `RAO_OUT_NAME`), `${seed}` to the seed.
    pub command: String,
    /// Local files (relative to the pipeline file) the command reads: their content is part
    /// of the fingerprint, so editing a script re-runs the stage.
    #[serde(default)]
    pub deps: Vec<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

pub struct Shell;

impl KindSignature for Shell {
    fn name(&self) -> &'static str {
        "shell"
    }
    fn version(&self) -> u32 {
        1
    }
    fn describe(&self) -> &'static str {
        "run a shell command; inputs and outputs are directories passed by path"
    }
    fn params_schema(&self) -> schemars::Schema {
        schemars::schema_for!(ShellParams)
    }
    fn check_params(&self, params: &Value) -> Result<(), ParamError> {
        check_typed::<ShellParams>(params)
    }
    fn resolve_params(&self, params: &Value) -> Result<Value, ParamError> {
        resolve_typed::<ShellParams>(params)
    }
    fn code_version(&self) -> &'static str {
        env!("RAO_CODE_BUILTIN")
    }
    fn inputs(&self) -> Option<&'static [InputDecl]> {
        None
    }
    fn outputs(&self) -> Option<&'static [&'static str]> {
        None
    }
    fn io_placeholder_params(&self) -> &'static [&'static str] {
        &["command"]
    }
    fn fingerprint_extra(&self, params: &Value, base_dir: &Path) -> Result<String, String> {
        let p: ShellParams = crate::kind::parse_typed(params).map_err(|e| e.message)?;
        if p.deps.is_empty() {
            return Ok(String::new());
        }
        // Each file with its hash, so that `rao plan` can say which one changed.
        let mut hashed = Vec::new();
        for dep in &p.deps {
            let path = base_dir.join(dep);
            let hash = hash_dep(&path).map_err(|e| format!("shell dependency `{dep}` ({}): {e}", path.display()))?;
            hashed.push(crate::fingerprint::DepHash { file: dep.clone(), blake3: hash.to_hex().to_string() });
        }
        Ok(serde_json::to_string(&hashed).expect("strings serialise"))
    }
}

impl StageKind for Shell {
    fn run(&self, ctx: StageContext) -> BoxFuture<'static, anyhow::Result<()>> {
        async move { run_shell(ctx).await }.boxed()
    }
}

/// The content hash of a file a command reads.
fn hash_dep(path: &Path) -> Result<blake3::Hash, String> {
    crate::local_file::hash_regular(path).map(|(_, hash)| hash)
}

fn env_name(prefix: &str, name: &str) -> String {
    let clean: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    format!("{prefix}{clean}")
}

async fn run_shell(ctx: StageContext) -> anyhow::Result<()> {
    let p: ShellParams = ctx.params_as()?;
    let sh = if p.env.contains_key("PATH") { Path::new("sh") } else { crate::local_file::shell() };
    let mut cmd = tokio::process::Command::new(sh);
    // Paths are quoted for where they stand in the command (`shell_words`), in one pass: a path
    // that happens to hold `${…}` is not filled in again.
    let mut values = std::collections::BTreeMap::new();
    for (name, artifacts) in &ctx.inputs {
        let mut dirs = Vec::new();
        for a in artifacts {
            dirs.push(ctx.input_dir(a).await?.display().to_string());
        }
        cmd.env(env_name("RAO_IN_", name), dirs.join(" "));
        values.insert(format!("inputs.{name}"), dirs);
    }
    for name in &ctx.outputs {
        let dir = ctx.output_dir(name)?.display().to_string();
        cmd.env(env_name("RAO_OUT_", name), &dir);
        values.insert(format!("outputs.{name}"), vec![dir]);
    }
    values.insert("seed".into(), vec![ctx.seed.to_string()]);
    let command = crate::shell_words::fill(&p.command, &values);
    cmd.arg("-c")
        .arg(&command)
        .current_dir(&ctx.base_dir)
        .env("RAO_SEED", ctx.seed.to_string())
        .env("RAO_INSTANCE", &ctx.instance)
        .envs(&p.env)
        .stdin(std::process::Stdio::null())
        // What a command prints is not kept (only the tail of its stderr, for a failure).
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        // A timeout or Ctrl-C drops this future: the child must not outlive it.
        .kill_on_drop(true);
    // In a process group of its own, so that what the command starts (`train & watch`) is killed
    // with it — `kill_on_drop` alone kills only `sh`. (A group, not a session: `setsid` would need
    // a `pre_exec` hook, which makes the spawn a `fork` of all of rao: BENCHMARKS.md, "Where
    // settings come from".)
    // The terminal's signals no longer reach it: rao handles Ctrl-C, SIGTERM and SIGHUP by
    // cancelling its stages (`interrupt.rs`), which kills their groups. A command that reads the
    // terminal (a password prompt) is stopped, as a background job is, until its timeout.
    #[cfg(unix)]
    cmd.process_group(0);
    let mut child = cmd.spawn()?;
    let stderr = child.stderr.take().map(|e| tokio::spawn(stderr_tail(e)));
    // Armed until the group has been killed below: dropped before that (a timeout, Ctrl-C), it
    // kills the group. `sh` is not reaped before then, so its id names this group and no other.
    let group = KillGroup { pgid: child.id(), _listed: crate::reaper::Watched::group(child.id()) };
    exited_unreaped(child.id()).await?;
    // What the command left running in the background (`cmd &` with its output redirected)
    // could go on writing into outputs that are then published and hashed: it goes now.
    drop(group);
    let status = child.wait().await?;
    // A process that left the group (`setsid cmd &`) may hold stderr open: the tail so far.
    let tail = match stderr {
        Some(reader) => tokio::time::timeout(std::time::Duration::from_secs(2), reader).await.ok().and_then(Result::ok).unwrap_or_default(),
        None => String::new(),
    };
    if !status.success() {
        anyhow::bail!("command exited with {status}: {}\n{tail}", p.command);
    }
    Ok(())
}

/// The last five lines of what a command writes to stderr, from at most its last 64 KiB (a
/// command may write without end).
async fn stderr_tail(mut stderr: tokio::process::ChildStderr) -> String {
    use tokio::io::AsyncReadExt;
    const KEEP: usize = 64 << 10;
    let (mut kept, mut buf) = (Vec::new(), vec![0u8; 16 << 10]);
    while let Ok(n @ 1..) = stderr.read(&mut buf).await {
        kept.extend_from_slice(&buf[..n]);
        if kept.len() > 2 * KEEP {
            kept.drain(..kept.len() - KEEP);
        }
    }
    let text = String::from_utf8_lossy(&kept[kept.len().saturating_sub(KEEP)..]).to_string();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// Waits until the process `pid` (a child of this one) has exited, without reaping it: while it
/// is a zombie its id still names its process group, so killing that group reaches no one else.
async fn exited_unreaped(pid: Option<u32>) -> anyhow::Result<()> {
    #[cfg(unix)]
    if let Some(pid) = pid.and_then(|p| libc::id_t::try_from(p).ok()) {
        tokio::task::spawn_blocking(move || {
            loop {
                let mut info = std::mem::MaybeUninit::<libc::siginfo_t>::zeroed();
                // SAFETY: `info` is written by the call; WNOWAIT leaves the child to be reaped later.
                let r = unsafe { libc::waitid(libc::P_PID, pid, info.as_mut_ptr(), libc::WEXITED | libc::WNOWAIT) };
                match r {
                    0 => return Ok(()),
                    _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => continue,
                    _ => return Err(std::io::Error::last_os_error()),
                }
            }
        })
        .await??;
    }
    Ok(())
}

/// Kills a shell command's process group (its id is the `sh`'s PID) when dropped: when the
/// command has ended (before `sh` is reaped), and when the stage's future is dropped before that
/// (a timeout, Ctrl-C). Until then the group is listed with the watcher that kills it if rao is
/// killed outright (`reaper`); the listing goes after the kill, with the second field.
#[cfg_attr(not(unix), allow(dead_code))]
struct KillGroup {
    pgid: Option<u32>,
    _listed: crate::reaper::Watched,
}

impl Drop for KillGroup {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(pgid) = self.pgid.and_then(|id| libc::pid_t::try_from(id).ok()) {
            // SAFETY: a plain system call, to a group whose leader is not yet reaped (see above).
            unsafe { libc::killpg(pgid, libc::SIGKILL) };
        }
    }
}

/// Params of `noop`.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoopParams {
    /// Anything: only hashed into the fingerprint.
    #[serde(default)]
    pub value: Option<Value>,
}

/// Does nothing and writes empty outputs: measures the engine's own overhead.
pub struct Noop;

impl KindSignature for Noop {
    fn name(&self) -> &'static str {
        "noop"
    }
    fn version(&self) -> u32 {
        1
    }
    fn describe(&self) -> &'static str {
        "does nothing (engine tests and benchmarks)"
    }
    fn params_schema(&self) -> schemars::Schema {
        schemars::schema_for!(NoopParams)
    }
    fn check_params(&self, params: &Value) -> Result<(), ParamError> {
        check_typed::<NoopParams>(params)
    }
    fn resolve_params(&self, params: &Value) -> Result<Value, ParamError> {
        resolve_typed::<NoopParams>(params)
    }
    fn code_version(&self) -> &'static str {
        env!("RAO_CODE_BUILTIN")
    }
    fn inputs(&self) -> Option<&'static [InputDecl]> {
        None
    }
    fn outputs(&self) -> Option<&'static [&'static str]> {
        None
    }
}

impl StageKind for Noop {
    fn run(&self, _ctx: StageContext) -> BoxFuture<'static, anyhow::Result<()>> {
        async { Ok(()) }.boxed()
    }
}
