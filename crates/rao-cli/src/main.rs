//! `rao`: validate, plan, run and inspect RAO training pipelines.

mod artifacts;
mod terminal;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use rao_pipeline::{Compiled, Registry, Reporter, RunOptions, Store};

#[derive(Parser)]
#[command(name = "rao", version, about = "Declarative, reproducible pipelines for training recursive agents with RAO")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct PipelineArgs {
    /// The pipeline file (YAML).
    pipeline: PathBuf,
    /// Override a value: `params.lr=0.001`, `stages.train.loop.max_iterations=20`, `seed=7`.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    set: Vec<String>,
    /// Use this store instead of the pipeline's (path, file://, memory://, s3://, gs://, az://).
    #[arg(long)]
    store: Option<String>,
}

/// `rao gc --keep-runs`.
#[derive(Copy, Clone, ValueEnum)]
enum KeepRuns {
    Latest,
    None,
}

#[derive(Copy, Clone, ValueEnum)]
enum Format {
    Text,
    Dot,
    Mermaid,
    Json,
}

#[derive(Copy, Clone, ValueEnum)]
enum ModeArg {
    Recursive,
    Flat,
}

#[derive(Copy, Clone, ValueEnum)]
enum StatusArg {
    Finished,
    StepBudget,
    ContextOverflow,
}

#[derive(Copy, Clone, ValueEnum)]
enum CompareFormat {
    Markdown,
    Csv,
    Json,
}

#[derive(Copy, Clone, ValueEnum, PartialEq)]
enum ExecutorKind {
    /// Run stages inside this process.
    InProcess,
    /// Run each stage as a separate `rao exec` process.
    Process,
    /// Submit each stage as a Ray job (`rao exec` as its entrypoint) through Ray's Jobs API.
    Ray,
}

#[derive(Subcommand)]
enum Command {
    /// Check a pipeline file; nothing runs.
    Validate {
        #[command(flatten)]
        p: PipelineArgs,
    },
    /// Show the compiled DAG: which stages are cached and which would run, and why.
    Plan {
        #[command(flatten)]
        p: PipelineArgs,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        /// One node per stage entry instead of per instance (loops and matrices folded).
        #[arg(long)]
        folded: bool,
    },
    /// Run the pipeline: everything not already in the store.
    Run {
        #[command(flatten)]
        p: PipelineArgs,
        /// Stage instances run at once (default: number of CPUs).
        #[arg(long, short = 'j')]
        jobs: Option<usize>,
        /// GPUs available to stages that ask for them.
        #[arg(long, default_value_t = 0)]
        gpus: u32,
        /// Re-run this stage (or instance) and everything downstream, even if cached.
        #[arg(long)]
        force: Vec<String>,
        /// Run only this stage and what depends on it (upstream must be done).
        #[arg(long)]
        from: Vec<String>,
        /// Run only this stage (its inputs must be done).
        #[arg(long)]
        only: Vec<String>,
        /// Machine-readable event stream on stdout (one JSON object per line).
        #[arg(long)]
        json: bool,
        /// Where stages run (default: the pipeline's `executor:`, else in-process). A stage's own
        /// `executor:` still wins.
        #[arg(long, value_enum)]
        executor: Option<ExecutorKind>,
        /// With `--executor ray`: the Ray dashboard address (Jobs API).
        #[arg(long, env = "RAO_RAY_ADDRESS", default_value = "http://127.0.0.1:8265")]
        ray_address: String,
        /// Export the run when it ends (besides the file's `tracking:`): an MLflow server URL
        /// (`http://127.0.0.1:5000`) or `tensorboard:DIR`. A failed export is only a warning.
        #[arg(long, value_name = "URL")]
        track: Vec<String>,
    },
    /// Per stage instance: done, stale or missing, with the reason; then the totals.
    Status {
        #[command(flatten)]
        p: PipelineArgs,
        /// One JSON object per instance (instance, stage, kind, state, fingerprint, reasons).
        #[arg(long)]
        json: bool,
        /// One line per stage entry (loops and matrices folded) with its counts.
        #[arg(long)]
        folded: bool,
    },
    /// Run one stage instance by itself (what remote executors call). Its inputs must be done.
    Exec {
        #[command(flatten)]
        p: PipelineArgs,
        /// The instance name, e.g. `rollout@3` or `evaluate[band=hard]`.
        instance: String,
        /// No progress lines.
        #[arg(long)]
        quiet: bool,
        /// Events as JSON lines on stdout instead of progress lines and the manifest (what
        /// `rao run --executor process` reads to show the stage's progress).
        #[arg(long, conflicts_with = "quiet")]
        json: bool,
        /// The run this execution belongs to (set by `rao run`'s executors; recorded in the manifest).
        #[arg(long)]
        run_id: Option<String>,
    },
    /// Serve the policy of a stage instance's `checkpoint` input, acting in the environment of its
    /// `tasks` input, as an OpenAI-compatible chat-completions API (e.g. `rao serve
    /// pipelines/textcraft-synth.yaml evaluate`). Its inputs must be done.
    Serve {
        #[command(flatten)]
        p: PipelineArgs,
        /// The instance whose inputs to serve, e.g. `evaluate` or `rollout@59`.
        instance: String,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8000")]
        addr: String,
        /// Requests in flight answered together in one batched sampling pass, at most (1: each by
        /// itself, several at once on the CPU's cores). Default: 1 on the CPU (measured faster
        /// there), 64 on a GPU backend.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
        max_batch: Option<u64>,
        /// Seconds a connection may take to send a request's headers (from opening, or from the
        /// previous reply) before it is closed.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
        header_timeout: u64,
        /// Print what a request must hold (the environment's instructions, the message layout and
        /// a ready request) and exit; a running server answers the same at `GET /v1/environment`.
        #[arg(long)]
        explain: bool,
    },
    /// Check every manifest of a store and every byte it names (sizes and blake3 hashes).
    Verify {
        /// A pipeline file whose store to check (or give --store).
        pipeline: Option<PathBuf>,
        /// The store to check (path, file://, s3://, gs://, az://).
        #[arg(long)]
        store: Option<String>,
        /// Set damaged manifests aside (their instances run again on the next run).
        #[arg(long)]
        repair: bool,
        /// The report as JSON (counts and every damaged object with why).
        #[arg(long)]
        json: bool,
    },
    /// Remove what nothing needs: staging of dead runs, attempts no manifest names, files a
    /// killed writer left half-written, lapsed leases — and, given pipeline files, every object none of them references — if it was
    /// written at least --min-age ago. Dry run unless --delete.
    Gc {
        /// Pipelines whose artifacts to keep (their current fingerprints, under the --set values
        /// given, and what their newest runs used: see --keep-runs). None: keep every finished
        /// artifact and remove only leftovers.
        pipelines: Vec<PathBuf>,
        /// Overrides the pipelines are compiled with, as for `rao run` (repeatable).
        #[arg(long = "set", value_name = "PATH=VALUE")]
        sets: Vec<String>,
        /// `latest`: also keep what the newest run of each pipeline used under each list of
        /// `--set` values it was run with (`--set seed=2`, …), and the newest that succeeded;
        /// `none`: keep only what the files reference under the --set values given here.
        #[arg(long, value_enum, default_value = "latest")]
        keep_runs: KeepRuns,
        /// The store to clean (default: the first pipeline's).
        #[arg(long)]
        store: Option<String>,
        /// Really delete (default: only list what would go).
        #[arg(long)]
        delete: bool,
        /// Leave whatever was written less than this long ago (a run elsewhere may be publishing
        /// it, or using it under `--set` overrides these files do not show): `30m`, `2h`, `0`.
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_min_age)]
        min_age: std::time::Duration,
        /// The report as JSON (what was or would be removed, bytes, the error that stopped it).
        #[arg(long)]
        json: bool,
    },
    /// Print execution trees: goals, actions, receipts and scores, indented by depth.
    Inspect {
        /// A trees Parquet file (a path, or a key inside --store), or a pipeline file followed by
        /// a stage instance (`rao inspect P evaluate`, `rao inspect P rollout@60`).
        trees: String,
        /// With a pipeline file: the instance whose trees to print (a stage name: its last one).
        instance: Option<String>,
        /// With a pipeline file: overrides, as for `run`.
        #[arg(long = "set", value_name = "PATH=VALUE")]
        set: Vec<String>,
        /// Read from this store (URL or path) instead of the local filesystem / the file's store.
        #[arg(long)]
        store: Option<String>,
        /// Only the trees of this task id.
        #[arg(long)]
        task: Option<String>,
        /// Only this tree of each task (its index in the task's group).
        #[arg(long)]
        group: Option<i32>,
        /// Only the recursive or the flat trees.
        #[arg(long, value_enum)]
        mode: Option<ModeArg>,
        /// A report group: `easy`, `160-239 lines`, `3 hops`, …
        #[arg(long)]
        band: Option<String>,
        /// Trees with a node that ended this way.
        #[arg(long, value_enum)]
        status: Option<StatusArg>,
        /// Only trees whose root did not fully succeed.
        #[arg(long)]
        failed: bool,
        /// Trees to print.
        #[arg(long, default_value_t = 3)]
        limit: usize,
    },
    /// Print the evaluation summary of the pipeline as written (with its --set overrides), or of
    /// a past run (--run ID), and write the run's HTML page (evaluations, curves, depth, cost).
    Report {
        #[command(flatten)]
        p: PipelineArgs,
        /// A run id from `runs/PIPELINE/` in the store (`latest`: the last run started). Without
        /// it, the evaluations of the file as given now are read from the store by fingerprint.
        #[arg(long)]
        run: Option<String>,
        /// Write the HTML page here (default: `reports/PIPELINE/RUN.html` in the store; `-`: to
        /// stdout, the table then goes to stderr).
        #[arg(long, value_name = "PATH")]
        html: Option<PathBuf>,
        /// Also export this run to a tracker: an MLflow server URL or `tensorboard:DIR`.
        #[arg(long, value_name = "URL")]
        track: Vec<String>,
    },
    /// Put pipelines (variants) side by side over seeds: the parameters that differ and every
    /// evaluation metric with 95% intervals and a significance mark against the first pipeline.
    /// Reads the store only; `rao run` produces what is missing (the commands are printed).
    Compare {
        /// Pipeline files; the first is the baseline the others are tested against.
        #[arg(required = true)]
        pipelines: Vec<PathBuf>,
        /// An override for every pipeline: `params.lr=0.001`.
        #[arg(long = "set", value_name = "PATH=VALUE")]
        set: Vec<String>,
        /// Seeds to compare over, e.g. `1,2,3` (each pipeline with `--set seed=N`); default: each
        /// file's own seed.
        #[arg(long, value_delimiter = ',')]
        seeds: Vec<u64>,
        /// Use this store instead of each pipeline's own.
        #[arg(long)]
        store: Option<String>,
        #[arg(long, value_enum, default_value = "markdown")]
        format: CompareFormat,
        /// Only these metrics (comma-separated): success, mean_score, mean_depth, mean_nodes,
        /// steps_per_task, tokens_per_task, overflow_rate, seconds_per_task. Default: all.
        #[arg(long, value_delimiter = ',')]
        metric: Vec<String>,
    },
    /// Print where a finished stage instance's artifacts are (a local path, or a URL in the store).
    Path {
        #[command(flatten)]
        p: PipelineArgs,
        /// The instance (`evaluate`, `rollout@60`, `evaluate[window=64]`), or a stage name: its
        /// last finished instance.
        instance: String,
        /// A file of it: `OUTPUT/PATH` or a file name (`trees.parquet`). Without it: the output
        /// directory (or the instance's directory when it has several outputs).
        file: Option<String>,
    },
    /// Print the JSON Schema of pipeline files.
    Schema,
    /// List the stage kinds; with KIND, its inputs, outputs and parameters (types, defaults,
    /// descriptions).
    Kinds {
        /// A kind (`rollout`, `update`, …). Without it: every kind, one line each.
        kind: Option<String>,
        /// Every kind in full as Markdown (docs/KINDS.md).
        #[arg(long, conflicts_with = "kind")]
        markdown: bool,
    },
}

/// One executor per instance: the stage's own `executor:`, else the command line's, else the
/// file's, else in-process. Instances that agree share one executor.
fn executors(
    c: &rao_pipeline::Compiled,
    cli: Option<ExecutorKind>,
    ray_address: &str,
    registry: &Registry,
    store: &rao_pipeline::Store,
    reporter: &Reporter,
) -> anyhow::Result<Arc<dyn rao_pipeline::Executor>> {
    use rao_plan::spec::{ExecutorKind as K, ExecutorSpec};
    let cli = cli.map(|k| ExecutorSpec {
        kind: match k {
            ExecutorKind::InProcess => K::InProcess,
            ExecutorKind::Process => K::Process,
            ExecutorKind::Ray => K::Ray,
        },
        address: None,
    });
    let default = cli.or_else(|| c.executor.clone()).unwrap_or(ExecutorSpec { kind: K::InProcess, address: None });
    let exe = std::env::current_exe()?;
    let mut made: std::collections::HashMap<ExecutorSpec, Arc<dyn rao_pipeline::Executor>> = Default::default();
    let mut per_instance = Vec::with_capacity(c.instances.len());
    for inst in &c.instances {
        let spec = inst.executor.clone().unwrap_or_else(|| default.clone());
        let e = made.entry(spec.clone()).or_insert_with(|| -> Arc<dyn rao_pipeline::Executor> {
            match spec.kind {
                K::InProcess => Arc::new(rao_pipeline::InProcess {
                    registry: Arc::new(registry.clone()),
                    store: store.clone(),
                    reporter: reporter.clone(),
                }),
                K::Process => Arc::new(rao_pipeline::LocalProcess { exe: exe.clone(), store: store.clone(), reporter: reporter.clone() }),
                K::Ray => Arc::new(rao_pipeline::ray::Ray::new(
                    spec.address.as_deref().unwrap_or(ray_address),
                    exe.clone(),
                    store.clone(),
                    reporter.clone(),
                )),
            }
        });
        per_instance.push(e.clone());
    }
    let names: std::collections::BTreeSet<&'static str> = per_instance.iter().map(|e| e.name()).collect();
    let name = if names.len() == 1 { names.into_iter().next().unwrap() } else { "mixed" };
    Ok(Arc::new(rao_pipeline::PerInstance { executors: per_instance, name }))
}

/// `rao 0.1.0 (commit 1234abcd5678)`: recorded with every run.
fn code_version() -> String {
    format!("rao {} (commit {})", env!("CARGO_PKG_VERSION"), env!("RAO_GIT_COMMIT"))
}

fn main() -> ExitCode {
    rao_stages::tune_allocator();
    let cli = Cli::parse();
    // Commands that print a result end quietly when their reader goes away (`rao plan | head`),
    // as Unix tools do; `run` and `exec` keep going (their results are in the store, not stdout).
    #[cfg(unix)]
    if !matches!(cli.command, Command::Run { .. } | Command::Exec { .. }) {
        // SAFETY: restores the default disposition of one signal before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    // Stages run inside `exec` and `serve` on a worker thread per core; `rao run` starts its
    // workers when its first stage runs (`executor.rs`), so a fully cached run starts none, and
    // every other command only reads and writes a few files: on this thread (starting and
    // stopping the workers took a quarter of `rao validate`'s time).
    let mut runtime = match cli.command {
        Command::Exec { .. } | Command::Serve { .. } => tokio::runtime::Builder::new_multi_thread(),
        _ => tokio::runtime::Builder::new_current_thread(),
    };
    let rt = runtime.enable_all().build().expect("tokio runtime");
    // A stream of events on stdout ends in one, whatever stopped the command.
    let event_stream = matches!(cli.command, Command::Run { json: true, .. } | Command::Exec { json: true, .. });
    let code = match rt.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{e:#}");
            if event_stream {
                let event = rao_pipeline::Event::Error { message: format!("{e:#}") };
                println!("{}", serde_json::to_string(&event).expect("events serialise"));
            }
            ExitCode::from(2)
        }
    };
    // Every command has finished its work here; joining the idle worker threads one by one
    // takes longer than a cached run's checks of a hundred stages, and the exit ends them anyway.
    rt.shutdown_background();
    code
}

/// Write the HTML page of `res`; returns where it is (a local path, or a URL in the store).
async fn write_report(store: &Store, res: &rao_results::RunResults, to: Option<&std::path::Path>) -> anyhow::Result<String> {
    let page = rao_results::html::page(res);
    if let Some(path) = to {
        std::fs::write(path, &page).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        return Ok(path.display().to_string());
    }
    let name = match (&res.run, res.evaluations.first()) {
        (Some(r), _) => r.run_id.clone(),
        (None, Some(e)) => format!("eval-{}", &e.fingerprint[..12.min(e.fingerprint.len())]),
        (None, None) => "stages".into(),
    };
    let key = format!("reports/{}/{name}.html", res.pipeline);
    store.put(&key, bytes::Bytes::from(page)).await?;
    Ok(match store.local_path(&key) {
        Some(p) => p.display().to_string(),
        None => format!("{}/{key}", store.url().trim_end_matches('/')),
    })
}

/// Export a finished run to its trackers; failures are warnings (the run's outcome stands).
async fn export_run(c: &Compiled, store: &Store, run_id: &str, targets: &[rao_results::tracking::Target]) {
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

/// One pipeline of `rao compare`: its evaluations for every seed, read from the store.
async fn compare_arm(
    file: &std::path::Path,
    set: &[String],
    seeds: &[u64],
    store: Option<&str>,
    registry: &Registry,
) -> anyhow::Result<rao_results::compare::Arm> {
    let seeds: Vec<Option<u64>> = if seeds.is_empty() { vec![None] } else { seeds.iter().copied().map(Some).collect() };
    let mut runs = Vec::new();
    let (mut name, mut resolved) = (String::new(), serde_json::Value::Null);
    for seed in seeds {
        let mut overrides = set.to_vec();
        overrides.extend(seed.map(|s| format!("seed={s}")));
        let p = PipelineArgs { pipeline: file.to_path_buf(), set: overrides, store: store.map(str::to_string) };
        let (c, st) = load_read_only(&p, registry)?;
        let (evaluations, missing) = rao_results::results::evaluations(&c, &st).await?;
        if resolved.is_null() {
            (name, resolved) = (c.name.clone(), (*c.resolved).clone());
        }
        let command = run_command(&p);
        runs.push(rao_results::compare::SeedRun { seed: c.resolved["seed"].as_u64().unwrap_or(0), evaluations, missing, command });
    }
    Ok(rao_results::compare::Arm { file: file.display().to_string(), name, resolved, runs })
}

/// `rao gc --min-age`: a duration as pipeline files write them, or `0`.
fn parse_min_age(text: &str) -> Result<std::time::Duration, String> {
    if text.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic()).trim().parse::<f64>() == Ok(0.0) {
        return Ok(std::time::Duration::ZERO);
    }
    rao_plan::spec::Duration::parse(text).map(|d| d.0)
}

/// A store given on the command line: a relative path is taken from the current directory,
/// as every command-line tool does (a `store:` in the file is relative to the file).
fn cli_store_url(s: &str) -> anyhow::Result<String> {
    // An empty or `~` path is left to the store, which refuses or expands it.
    if s.contains("://") || std::path::Path::new(s).is_absolute() || s.trim().is_empty() || s.starts_with('~') {
        return Ok(s.to_string());
    }
    Ok(std::env::current_dir()?.join(s).display().to_string())
}

/// Compile a pipeline, through the user's plan cache (a file compiled before is read back).
fn compile(p: &PipelineArgs, registry: &Registry) -> anyhow::Result<Compiled> {
    let cache = rao_plan::plan_cache::PlanCache::from_env();
    rao_pipeline::load_cached(&p.pipeline, &p.set, registry, cache.as_ref()).map_err(|d| anyhow::anyhow!("{d}"))
}

/// Warn of `params.…` entries, in `--set` or a variant's `set:`, that no stage reads.
fn warn_unused_params(c: &Compiled, p: &PipelineArgs) {
    let variant = format!("`set:` of {}:", p.pipeline.display());
    for w in c.resolved.unused_params(&c.variant_sets, &variant).into_iter().chain(c.resolved.unused_params(&p.set, "--set")) {
        eprintln!("warning: {w}");
    }
}

/// Compile a pipeline and open its store (`read_only`: a missing local store is not created).
fn load_with(p: &PipelineArgs, registry: &Registry, read_only: bool) -> anyhow::Result<(Compiled, Store)> {
    let mut c = compile(p, registry)?;
    warn_unused_params(&c, p);
    if let Some(s) = &p.store {
        c.store_url = cli_store_url(s)?;
    }
    let store = if read_only { Store::open_read_only(&c.store_url, &c.base_dir)? } else { Store::open(&c.store_url, &c.base_dir)? };
    Ok((c, store))
}

fn load(p: &PipelineArgs, registry: &Registry) -> anyhow::Result<(Compiled, Store)> {
    load_with(p, registry, false)
}

/// The `rao run` that produces what a read-only command found missing (see [`rao_command`]).
fn run_command(p: &PipelineArgs) -> String {
    rao_command("run", p)
}

/// `rao VERB` for the pipeline as given: the same file, `--set` values (credentials shown
/// `<redacted>`) and `--store`, each quoted for a POSIX shell if needed.
fn rao_command(verb: &str, p: &PipelineArgs) -> String {
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
fn require_contents(store: &Store, then: &str) -> anyhow::Result<()> {
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

fn load_read_only(p: &PipelineArgs, registry: &Registry) -> anyhow::Result<(Compiled, Store)> {
    load_with(p, registry, true)
}

/// The store of `verify`/`gc`: `--store`, else the first pipeline's. It must be there (checked
/// before anything could create it).
fn maintenance_store(store: &Option<String>, pipeline: Option<&PathBuf>, registry: &Registry, read_only: bool) -> anyhow::Result<Store> {
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

async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let registry = rao_stages::registry();
    match cli.command {
        Command::Validate { p } => {
            let c = compile(&p, &registry)?;
            warn_unused_params(&c, &p);
            let count = |n: usize, one: &str| format!("{n} {one}{}", if n == 1 { "" } else { "s" });
            println!("{}: ok ({}, {})", p.pipeline.display(), count(c.instances.len(), "stage instance"), count(c.loops.len(), "loop"));
        }
        Command::Plan { p, format, folded } => {
            let (c, store) = load_read_only(&p, &registry)?;
            let rows = rao_pipeline::plan::rows(&c, &store).await?;
            let out = match format {
                Format::Text => rao_pipeline::events::terminal_safe(&rao_pipeline::plan::render_text(&c, &rows, folded)).into_owned(),
                Format::Dot => rao_pipeline::plan::render_dot(&c, &rows, folded),
                Format::Mermaid => rao_pipeline::plan::render_mermaid(&c, &rows, folded),
                Format::Json if folded => serde_json::to_string_pretty(&rao_pipeline::plan::folded_json(&c, &rows))? + "\n",
                Format::Json => serde_json::to_string_pretty(&rows)? + "\n",
            };
            print!("{out}");
        }
        Command::Status { p, json, folded } => {
            let (c, store) = load_read_only(&p, &registry)?;
            let rows = rao_pipeline::plan::rows(&c, &store).await?;
            match (json, folded) {
                (true, true) => println!("{}", serde_json::to_string_pretty(&rao_pipeline::plan::folded_json(&c, &rows))?),
                (true, false) => println!("{}", serde_json::to_string_pretty(&rows)?),
                (false, _) => print!("{}", rao_pipeline::events::terminal_safe(&rao_pipeline::plan::render_status(&c, &rows, folded))),
            }
        }
        Command::Run { p, jobs, gpus, force, from, only, json, executor, ray_address, track } => {
            let (c, store) = load(&p, &registry)?;
            let mut targets = rao_results::tracking::Target::from_section(c.resolved.tracking(), &c.base_dir);
            for t in &track {
                targets.push(rao_results::tracking::Target::parse(t, std::path::Path::new(".")).map_err(anyhow::Error::msg)?);
            }
            let reporter = if json { Reporter::json() } else { Reporter::auto() };
            // Trackers get each point as it is recorded, and the whole run at its end.
            let live = (!targets.is_empty()).then(|| rao_results::tracking::live::Live::start(targets.clone(), store.clone()));
            let reporter = match &live {
                Some(live) => reporter.and_then(live.observer()),
                None => reporter,
            };
            let _no_echo = (!json && std::io::IsTerminal::is_terminal(&std::io::stderr())).then(terminal::NoEchoedCtrlC::new);
            let exec = executors(&c, executor, &ray_address, &registry, &store, &reporter)?;
            let jobs = jobs.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
            let opts = RunOptions { jobs, gpus, force, from, only, reporter, handle_ctrl_c: true, code_version: code_version() };
            let c = Arc::new(c);
            let record = rao_pipeline::run(c.clone(), exec, &store, opts).await;
            // Engines the run started stop with it, whatever its outcome.
            rao_stages::engine_launch::stop_all().await;
            if let Some(live) = live {
                live.finish().await;
            }
            let record = record?;
            export_run(&c, &store, &record.run_id, &targets).await;
            let evaluated = record.instances.iter().any(|i| {
                i.kind == rao_stages::kinds::EVALUATE
                    && matches!(i.status, rao_pipeline::InstanceStatus::Done | rao_pipeline::InstanceStatus::Cached)
            });
            if !json && evaluated {
                // Where the results are: the same file and overrides, read back by fingerprint.
                match store.url().starts_with("memory://") {
                    true => eprintln!("results: in memory only, gone when this command ends (give a store path to keep them)"),
                    false => eprintln!("results: {}", rao_command("report", &p)),
                }
            }
            let failures = record.failures();
            if !failures.is_empty() && !json {
                eprintln!("\n{} stage(s) failed:", failures.len());
                for (name, why) in &failures {
                    eprintln!("  {name}: {why}");
                }
            }
            let status = record.status;
            // The process ends here: freeing the plan and the record piece by piece would be a
            // tenth of a fully cached run's instructions, for memory the exit returns anyway.
            std::mem::forget((c, record));
            return Ok(match status {
                rao_pipeline::RunStatus::Succeeded => ExitCode::SUCCESS,
                rao_pipeline::RunStatus::Cancelled => ExitCode::from(130),
                _ => ExitCode::FAILURE,
            });
        }
        Command::Exec { mut p, instance, quiet, json, run_id } => {
            // Overrides with a credential among them come by the environment (`exec_env`).
            if let Ok(sets) = std::env::var(rao_pipeline::exec::SET_VAR) {
                p.set.extend(sets.lines().map(str::to_string));
            }
            let (c, store) = load(&p, &registry)?;
            let reporter = if json {
                Reporter::json()
            } else if quiet {
                Reporter::silent()
            } else {
                Reporter::plain()
            };
            let run_id = run_id.unwrap_or_else(rao_pipeline::scheduler::new_run_id);
            // Ctrl-C (or SIGTERM, SIGHUP) stops the stage at its next step and releases its
            // lease, as in `rao run`.
            let cancel = rao_pipeline::CancellationToken::new();
            let on_ctrl_c = cancel.clone();
            tokio::spawn(async move {
                rao_pipeline::interrupt::interrupted().await;
                on_ctrl_c.cancel();
            });
            let m = rao_pipeline::exec::execute_by_name(&c, &registry, &store, &instance, &run_id, &reporter, cancel).await;
            rao_stages::engine_launch::stop_all().await;
            let m = match m {
                Err(e) if matches!(e.downcast_ref(), Some(rao_pipeline::exec::ExecError::Cancelled)) => {
                    eprintln!("cancelled: {instance}");
                    return Ok(ExitCode::from(130));
                }
                r => r?,
            };
            if !quiet && !json {
                println!("{}", serde_json::to_string_pretty(&m)?);
            }
        }
        Command::Serve { p, instance, addr, max_batch, header_timeout, explain } => {
            let (c, store) = load_read_only(&p, &registry)?;
            let ctx = rao_pipeline::exec::context_by_name(&c, &store, &instance).await?;
            anyhow::ensure!(
                ctx.inputs.contains_key("tasks") && ctx.inputs.contains_key("checkpoint"),
                "`{instance}` has no `tasks` and `checkpoint` inputs to serve (an `evaluate` or a `rollout` of a checkpoint has)"
            );
            let mut served = rao_stages::serve::Served::from_stage(&ctx).await?;
            if let Some(max_batch) = max_batch {
                served = served.with_max_batch(max_batch as usize);
            }
            if explain {
                print!("{}", served.explain(&format!("http://{addr}/v1")));
                return Ok(ExitCode::SUCCESS);
            }
            let served = std::sync::Arc::new(served);
            let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
            eprintln!(
                "serving `{}` on http://{}/v1 (POST /chat/completions, GET /models; up to {} requests a batch)\n\
                 what a request holds: GET /environment, or `rao serve … --explain`",
                served.model,
                listener.local_addr()?,
                served.max_batch()
            );
            rao_stages::serve::serve(listener, served, std::time::Duration::from_secs(header_timeout)).await?;
        }
        Command::Inspect { trees, instance, set, store, task, group, mode, band, status, failed, limit } => {
            let what = match &instance {
                Some(i) => format!("the trees of `{i}`"),
                None => format!("`{trees}`"),
            };
            let bytes = match instance {
                Some(instance) => {
                    let p = PipelineArgs { pipeline: PathBuf::from(&trees), set, store };
                    let (c, store) = load_read_only(&p, &registry)?;
                    let rows = rao_pipeline::plan::rows(&c, &store).await?;
                    let row = artifacts::find_instance(&c, &rows, &instance)?;
                    let manifest = artifacts::finished(&store, row, &run_command(&p)).await?;
                    store.get(&artifacts::key(&manifest, Some("trees.parquet"))?).await?
                }
                None if trees.ends_with(".yaml") || trees.ends_with(".yml") => {
                    anyhow::bail!(
                        "`{trees}` is a pipeline file: name the instance whose trees to print, e.g. `rao inspect {trees} evaluate`"
                    )
                }
                None => match store {
                    Some(url) => Store::open_read_only(&cli_store_url(&url)?, std::path::Path::new("."))?.get(&trees).await?,
                    None => bytes::Bytes::from(std::fs::read(&trees).map_err(|e| anyhow::anyhow!("cannot read {trees}: {e}"))?),
                },
            };
            let nodes = rao_core::parquet_io::nodes_from_parquet(bytes)
                .map_err(|e| anyhow::anyhow!("{what} is not an execution-trees Parquet file (as rollout and evaluate write): {e}"))?;
            let filter = rao_stages::inspect::Filter {
                task,
                group,
                mode: mode.map(|m| match m {
                    ModeArg::Recursive => rao_core::Mode::Recursive,
                    ModeArg::Flat => rao_core::Mode::Flat,
                }),
                band,
                status: status.map(|s| match s {
                    StatusArg::Finished => rao_core::NodeStatus::Finished,
                    StatusArg::StepBudget => rao_core::NodeStatus::StepBudget,
                    StatusArg::ContextOverflow => rao_core::NodeStatus::ContextOverflow,
                }),
                failed,
            };
            print!("{}", rao_stages::inspect::render(&nodes, &filter, limit).map_err(anyhow::Error::msg)?);
        }
        Command::Report { p, run, html, track } => {
            let (c, store) = load_read_only(&p, &registry)?;
            require_contents(&store, &format!("; `{}` makes it", run_command(&p)))?;
            let res = rao_results::RunResults::load(&c, &store, run.as_deref()).await?;
            // A past run (`--run`) is produced again under its own --set values.
            let again = PipelineArgs { set: if run.is_some() { res.overrides.clone() } else { p.set.clone() }, ..p.clone() };
            for (name, why) in
                res.missing.iter().filter(|(n, _)| c.instances.iter().any(|i| &i.name == n && i.kind == rao_stages::kinds::EVALUATE))
            {
                let given = if run.is_some() { "for that run" } else { "for this pipeline as given" };
                eprintln!("{name}: not in the store {given} ({why}); `{}` produces it", run_command(&again));
            }
            let rows: Vec<_> = res.evaluations.iter().flat_map(|e| e.rows.iter().cloned()).collect();
            let evaluates = c.instances.iter().any(|i| i.kind == rao_stages::kinds::EVALUATE);
            if res.run.is_none() && (if evaluates { rows.is_empty() } else { res.costs.is_empty() }) {
                let what = if evaluates { "evaluation" } else { "result" };
                anyhow::bail!(
                    "nothing to report: no run and no {what} of pipeline `{}` with seed {} is in the store; `{}` produces them",
                    c.name,
                    res.seed,
                    run_command(&again)
                );
            }
            // A pipeline without evaluations is reported by its stages: time and outputs.
            let mut table = if evaluates { rao_results::text::eval_table(&rows) } else { rao_results::text::stage_table(&res.costs) };
            table += &match &res.run {
                Some(r) => format!(
                    "pipeline {} · seed {} · run {} ({}) · {}{}\n",
                    c.name,
                    res.seed,
                    r.run_id,
                    r.status,
                    rao_results::html::utc(r.started_at),
                    // `--run`: a run of another file with the same pipeline name (or of this one
                    // before it moved) says which.
                    if same_file(std::path::Path::new(&res.file), &c.file) { String::new() } else { format!(" · of {}", res.file) }
                ),
                None => format!("pipeline {} · seed {} · no run record names these results\n", c.name, res.seed),
            };
            // `--html -`: the page on stdout (for a pipe), the table beside it on stderr.
            if html.as_deref() == Some(std::path::Path::new("-")) {
                eprint!("{table}");
                print!("{}", rao_results::html::page(&res));
            } else {
                print!("{table}");
                match write_report(&store, &res, html.as_deref()).await {
                    Ok(at) => println!("report: {at}"),
                    // The table is out; a store this user may only read has no room for the page.
                    Err(e) if html.is_none() => {
                        eprintln!("warning: the HTML report was not written into the store ({e:#}); `--html FILE` writes it elsewhere")
                    }
                    Err(e) => return Err(e),
                }
            }
            if let (false, Some(r)) = (track.is_empty(), &res.run) {
                let targets = track
                    .iter()
                    .map(|t| rao_results::tracking::Target::parse(t, std::path::Path::new(".")).map_err(anyhow::Error::msg))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                export_run(&c, &store, &r.run_id, &targets).await;
            }
        }
        Command::Compare { pipelines, set, seeds, store, format, metric } => {
            // A seed given twice would count one run as two independent ones.
            if let Some(seed) = seeds.iter().enumerate().find_map(|(i, s)| seeds[..i].contains(s).then_some(s)) {
                anyhow::bail!("--seeds: seed {seed} is given twice; each seed counts once (e.g. `--seeds 1,2,3`)");
            }
            if !seeds.is_empty()
                && let Some(o) = set.iter().find(|o| o.split_once('=').is_some_and(|(k, _)| k.trim() == "seed"))
            {
                anyhow::bail!("`--set {o}` and `--seeds` both set the seed (--seeds would win): give the seeds with --seeds only");
            }
            let metrics = match metric.is_empty() {
                true => rao_results::compare::Metric::ALL.to_vec(),
                false => metric
                    .iter()
                    .map(|m| {
                        rao_results::compare::Metric::parse(m).ok_or_else(|| {
                            let names: Vec<&str> = rao_results::compare::Metric::ALL.iter().map(|m| m.name()).collect();
                            anyhow::anyhow!("unknown metric `{m}`; one of {}", names.join(", "))
                        })
                    })
                    .collect::<anyhow::Result<_>>()?,
            };
            let mut arms = Vec::new();
            for file in &pipelines {
                arms.push(compare_arm(file, &set, &seeds, store.as_deref(), &registry).await?);
            }
            let cmp = rao_results::compare::compare(&arms, &metrics);
            print!(
                "{}",
                match format {
                    CompareFormat::Markdown => rao_results::compare_out::markdown(&cmp),
                    CompareFormat::Csv => rao_results::compare_out::csv(&cmp),
                    CompareFormat::Json => rao_results::compare_out::json(&cmp),
                }
            );
            for m in cmp.missing.iter().filter(|_| !matches!(format, CompareFormat::Markdown)) {
                eprintln!(
                    "missing: {} (file {}) seed {} ({}): run `{}`",
                    m.pipeline,
                    cmp.pipelines[m.arm].1,
                    m.seed,
                    m.instances.join(", "),
                    m.command
                );
            }
        }
        Command::Path { p, instance, file } => {
            let (c, store) = load_read_only(&p, &registry)?;
            let rows = rao_pipeline::plan::rows(&c, &store).await?;
            let row = artifacts::find_instance(&c, &rows, &instance)?;
            let manifest = artifacts::finished(&store, row, &run_command(&p)).await?;
            println!("{}", artifacts::locate(&store, &manifest, file.as_deref())?);
        }
        Command::Verify { pipeline, store, repair, json } => {
            let store = maintenance_store(&store, pipeline.as_ref(), &registry, !repair)?;
            let report = rao_pipeline::maintenance::verify(&store, repair).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                for d in &report.damaged {
                    println!("DAMAGED {} ({}): {}", d.fingerprint, d.instance.as_deref().unwrap_or("?"), d.why);
                }
                println!(
                    "{}: {} manifests, {} files, {} bytes checked; {} damaged{}",
                    store.url(),
                    report.manifests,
                    report.files,
                    report.bytes,
                    report.damaged.len(),
                    if repair { format!(", {} set aside (they run again next time)", report.quarantined) } else { String::new() }
                );
            }
            if !report.damaged.is_empty() && !repair {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Gc { pipelines, sets, keep_runs, store, delete, min_age, json } => {
            let store = maintenance_store(&store, pipelines.first(), &registry, !delete)?;
            let keep = if pipelines.is_empty() {
                None
            } else {
                let mut keep = Some(std::collections::BTreeSet::new());
                for p in &pipelines {
                    let c = rao_pipeline::load(p, &sets, &registry).map_err(|d| anyhow::anyhow!("{d}"))?;
                    let snap = rao_pipeline::snapshot::snapshot(&c, &store).await?;
                    // What a pipeline references is only known in full once its loops have
                    // decided; until then nothing finished goes.
                    if let Some(name) = snap.undetermined(&c) {
                        eprintln!(
                            "note: {}: `{name}` waits on a loop that has not decided (run the pipeline first); \
                             every finished object is kept, only leftovers go",
                            p.display()
                        );
                        keep = None;
                    }
                    let newest = match keep_runs {
                        KeepRuns::Latest => Some(rao_pipeline::run_record::newest_runs_fingerprints(&store, &c.name).await?),
                        KeepRuns::None => None,
                    };
                    if let Some(key) = newest.as_ref().and_then(|n| n.unreadable.as_ref()) {
                        eprintln!(
                            "note: {}: run record `{key}` cannot be read, so what its run used is unknown; \
                             every finished object is kept, only leftovers go",
                            p.display()
                        );
                        keep = None;
                    }
                    if let Some(k) = keep.as_mut() {
                        k.extend(snap.fps.into_iter().flatten());
                        if let Some(newest) = newest {
                            k.extend(newest.fingerprints);
                            let other_sets = newest.with_overrides;
                            if !other_sets.is_empty() {
                                let listed: Vec<String> = other_sets.iter().map(|o| o.join(" ")).collect();
                                eprintln!(
                                    "note: {}: also kept what its newest runs under other --set values used ({}); `--keep-runs none` keeps only what the file names",
                                    p.display(),
                                    listed.join("; ")
                                );
                            }
                        }
                    }
                }
                keep
            };
            let report = rao_pipeline::maintenance::gc(&store, keep.as_ref(), delete, min_age).await;
            let verb = if delete { "removed" } else { "would remove" };
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                for r in &report.removed {
                    println!("{verb} {r}");
                }
                println!(
                    "{verb} {} objects or prefixes, {} bytes{}",
                    report.removed.len(),
                    report.bytes,
                    if delete { "" } else { " (dry run: pass --delete)" }
                );
            }
            if let Some(e) = &report.stopped_by {
                // A store error, like every other command's: exit 2, after the report of what went.
                eprintln!(
                    "error: gc stopped part way: {e}\n  what the report lists {}; the rest was not looked at. \
                     Run it again once the store answers.",
                    if delete { "was removed" } else { "would go" }
                );
                return Ok(ExitCode::from(2));
            }
        }
        Command::Schema => print!("{}", rao_plan::schema::pipeline_schema_text(&registry)),
        Command::Kinds { kind, markdown: true } => {
            debug_assert!(kind.is_none());
            print!("{}", rao_plan::kinds_doc::render_markdown(&registry))
        }
        Command::Kinds { kind, markdown: false } => {
            print!("{}", rao_plan::kinds_doc::render_text(&registry, kind.as_deref()).map_err(anyhow::Error::msg)?)
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether two paths (as given, from this folder) name one file.
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}
