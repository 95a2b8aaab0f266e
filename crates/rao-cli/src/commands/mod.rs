//! The commands, one module per group; what several of them share is here.

pub mod compare;
pub mod inspect;
pub mod maintenance;
pub mod plan;
pub mod report;
pub mod results;
pub mod run;
pub mod serve;

pub(crate) use std::path::PathBuf;
pub(crate) use std::process::ExitCode;
pub(crate) use std::sync::Arc;

pub(crate) use clap::ValueEnum;
pub(crate) use rao_pipeline::{Compiled, Registry, Reporter, RunOptions, Store};

pub(crate) use crate::{artifacts, terminal};

/// Export a finished run to its trackers; failures are warnings (the run's outcome stands).
pub(crate) async fn export_run(c: &Compiled, store: &Store, run_id: &str, targets: &[rao_results::tracking::Target]) {
    if targets.is_empty() {
        return;
    }
    let res = match rao_results::RunResults::load(c, store, Some(run_id)).await {
        Ok(r) => r,
        Err(e) => return eprintln!("warning: tracking skipped, the run's results could not be read: {e:#}"),
    };
    let page = rao_results::html::page(&res);
    for t in targets {
        match rao_results::tracking::export(t, &res, &page).await {
            Ok(at) => eprintln!("tracked: {} → {at}", t.describe()),
            Err(e) => eprintln!("warning: tracking to {} failed (the run itself is unaffected): {e:#}", t.describe()),
        }
    }
}

/// A store given on the command line: a relative path is taken from the current directory,
/// as every command-line tool does (a `store:` in the file is relative to the file).
pub(crate) fn cli_store_url(s: &str) -> anyhow::Result<String> {
    // An empty or `~` path is left to the store, which refuses or expands it.
    if s.contains("://") || std::path::Path::new(s).is_absolute() || s.trim().is_empty() || s.starts_with('~') {
        return Ok(s.to_string());
    }
    Ok(std::env::current_dir()?.join(s).display().to_string())
}

/// Compile a pipeline, through the user's plan cache (a file compiled before is read back).
pub(crate) fn compile(p: &PipelineArgs, registry: &Registry) -> anyhow::Result<Compiled> {
    let cache = rao_plan::plan_cache::PlanCache::from_env();
    rao_pipeline::load_cached(&p.pipeline, &p.set, registry, cache.as_ref()).map_err(|d| anyhow::anyhow!("{d}"))
}

/// Warn of `params.…` entries, in `--set` or a variant's `set:`, that no stage reads.
pub(crate) fn warn_unused_params(c: &Compiled, p: &PipelineArgs) {
    let variant = format!("`set:` of {}:", p.pipeline.display());
    for w in c.resolved.unused_params(&c.variant_sets, &variant).into_iter().chain(c.resolved.unused_params(&p.set, "--set")) {
        eprintln!("warning: {w}");
    }
}

/// Compile a pipeline and open its store (`read_only`: a missing local store is not created).
pub(crate) fn load_with(p: &PipelineArgs, registry: &Registry, read_only: bool) -> anyhow::Result<(Compiled, Store)> {
    let mut c = compile(p, registry)?;
    warn_unused_params(&c, p);
    if let Some(s) = &p.store {
        c.store_url = cli_store_url(s)?;
    }
    let store = if read_only { Store::open_read_only(&c.store_url, &c.base_dir)? } else { Store::open(&c.store_url, &c.base_dir)? };
    Ok((c, store))
}

pub(crate) fn load(p: &PipelineArgs, registry: &Registry) -> anyhow::Result<(Compiled, Store)> {
    load_with(p, registry, false)
}

/// The `rao run` that produces what a read-only command found missing (see [`rao_command`]).
pub(crate) fn run_command(p: &PipelineArgs) -> String {
    rao_command("run", p)
}

/// `rao VERB` for the pipeline as given: the same file, `--set` values (credentials shown
/// `<redacted>`) and `--store`, each quoted for a POSIX shell if needed.
pub(crate) fn rao_command(verb: &str, p: &PipelineArgs) -> String {
    let quoted = rao_pipeline::ray::shell_quote;
    let mut command = format!("rao {verb} {}", quoted(&p.pipeline.display().to_string()));
    for o in rao_plan::secrets::redact_overrides(&p.set) {
        command.push_str(&format!(" --set {}", quoted(&o)));
    }
    if let Some(s) = &p.store {
        command.push_str(&format!(" --store {}", quoted(s)));
    }
    command
}

/// For commands that only read what runs wrote (`report`, `verify`, `gc`): a local store that
/// does not exist, or a memory store (empty in every new process), holds nothing to read — most
/// likely a mistyped path, which would otherwise pass as a store with nothing wrong in it.
pub(crate) fn require_contents(store: &Store, then: &str) -> anyhow::Result<()> {
    if store.url().starts_with("memory://") {
        anyhow::bail!("a memory:// store is empty in every new process: give the store a run wrote to");
    }
    // Opened read-only, a local folder that is not there is an empty store with no local root.
    let scheme = store.url().split_once("://").map(|(s, _)| s);
    let cloud = scheme.is_some_and(rao_store::store::is_cloud_scheme);
    if store.local_root().is_none() && !cloud {
        anyhow::bail!("no store at {}: check the path (nothing has run into it){then}", store.url());
    }
    Ok(())
}

pub(crate) fn load_read_only(p: &PipelineArgs, registry: &Registry) -> anyhow::Result<(Compiled, Store)> {
    load_with(p, registry, true)
}

/// The store of `verify`/`gc`: `--store`, else the first pipeline's. It must be there (checked
/// before anything could create it).
pub(crate) fn maintenance_store(
    store: &Option<String>,
    pipeline: Option<&PathBuf>,
    registry: &Registry,
    read_only: bool,
) -> anyhow::Result<Store> {
    let found = match (store, pipeline) {
        (Some(s), _) => Store::open_read_only(&cli_store_url(s)?, std::path::Path::new("."))?,
        (None, Some(p)) => load_read_only(&PipelineArgs { pipeline: p.clone(), set: Vec::new(), store: None }, registry)?.1,
        (None, None) => anyhow::bail!("give a pipeline file or --store URL"),
    };
    require_contents(&found, "")?;
    match read_only {
        true => Ok(found),
        // The same store, opened for writing: a local one by its resolved folder (its URL may be
        // relative to the pipeline file's folder).
        false => {
            let url = found.local_root().map_or_else(|| found.url().to_string(), |root| root.display().to_string());
            Ok(Store::open(&url, std::path::Path::new("."))?)
        }
    }
}

/// Whether two paths (as given, from this folder) name one file.
pub(crate) fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

#[derive(clap::Args, Clone)]
pub(crate) struct PipelineArgs {
    /// The pipeline file (YAML).
    pub pipeline: PathBuf,
    /// Override a value: `params.lr=0.001`, `stages.train.loop.max_iterations=20`, `seed=7`.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<String>,
    /// Use this store instead of the pipeline's (path, file://, memory://, s3://, gs://, az://).
    #[arg(long)]
    pub store: Option<String>,
}
