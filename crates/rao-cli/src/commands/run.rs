//! `rao run` and `rao exec`: running a pipeline, or one instance of it.

use super::*;

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub p: PipelineArgs,
    /// Stage instances run at once (default: number of CPUs).
    #[arg(long, short = 'j')]
    pub jobs: Option<usize>,
    /// GPUs available to stages that ask for them.
    #[arg(long, default_value_t = 0)]
    pub gpus: u32,
    /// Re-run this stage (or instance) and everything downstream, even if cached.
    #[arg(long)]
    pub force: Vec<String>,
    /// Run only this stage and what depends on it (upstream must be done).
    #[arg(long)]
    pub from: Vec<String>,
    /// Run only this stage (its inputs must be done).
    #[arg(long)]
    pub only: Vec<String>,
    /// Machine-readable event stream on stdout (one JSON object per line).
    #[arg(long)]
    pub json: bool,
    /// Where stages run (default: the pipeline's `executor:`, else in-process). A stage's own
    /// `executor:` still wins.
    #[arg(long, value_enum)]
    pub executor: Option<ExecutorKind>,
    /// With `--executor ray`: the Ray dashboard address (Jobs API).
    #[arg(long, env = "RAO_RAY_ADDRESS", default_value = "http://127.0.0.1:8265")]
    pub ray_address: String,
    /// Export the run when it ends (besides the file's `tracking:`): an MLflow server URL
    /// (`http://127.0.0.1:5000`) or `tensorboard:DIR`. A failed export is only a warning.
    #[arg(long, value_name = "URL")]
    pub track: Vec<String>,
}

pub async fn run(args: RunArgs, registry: Registry) -> anyhow::Result<ExitCode> {
    let RunArgs { p, jobs, gpus, force, from, only, json, executor, ray_address, track } = args;
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
    Ok(match status {
        rao_pipeline::RunStatus::Succeeded => ExitCode::SUCCESS,
        rao_pipeline::RunStatus::Cancelled => ExitCode::from(130),
        _ => ExitCode::FAILURE,
    })
}

#[derive(clap::Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub p: PipelineArgs,
    /// The instance name, e.g. `rollout@3` or `evaluate[band=hard]`.
    pub instance: String,
    /// No progress lines.
    #[arg(long)]
    pub quiet: bool,
    /// Events as JSON lines on stdout instead of progress lines and the manifest (what
    /// `rao run --executor process` reads to show the stage's progress).
    #[arg(long, conflicts_with = "quiet")]
    pub json: bool,
    /// The run this execution belongs to (set by `rao run`'s executors; recorded in the manifest).
    #[arg(long)]
    pub run_id: Option<String>,
}

pub async fn exec(args: ExecArgs, registry: Registry) -> anyhow::Result<ExitCode> {
    let ExecArgs { mut p, instance, quiet, json, run_id } = args;
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
        Err(rao_pipeline::exec::ExecError::Cancelled) => {
            eprintln!("cancelled: {instance}");
            return Ok(ExitCode::from(130));
        }
        r => r?,
    };
    if !quiet && !json {
        println!("{}", serde_json::to_string_pretty(&m)?);
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Copy, Clone, ValueEnum, PartialEq)]
pub enum ExecutorKind {
    /// Run stages inside this process.
    InProcess,
    /// Run each stage as a separate `rao exec` process.
    Process,
    /// Submit each stage as a Ray job (`rao exec` as its entrypoint) through Ray's Jobs API.
    Ray,
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
