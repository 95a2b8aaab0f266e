//! `rao`: validate, plan, run and inspect RAO training pipelines.

mod artifacts;
mod commands;
mod terminal;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "rao", version, about = "Declarative, reproducible pipelines for training recursive agents with RAO")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check a pipeline file; nothing runs.
    Validate(commands::plan::ValidateArgs),
    /// Show the compiled DAG: which stages are cached and which would run, and why.
    Plan(commands::plan::PlanArgs),
    /// Run the pipeline: everything not already in the store.
    Run(commands::run::RunArgs),
    /// Per stage instance: done, stale or missing, with the reason; then the totals.
    Status(commands::plan::StatusArgs),
    /// Run one stage instance by itself (what remote executors call). Its inputs must be done.
    Exec(commands::run::ExecArgs),
    /// Serve the policy of a stage instance's `checkpoint` input, acting in the environment of its
    /// `tasks` input, as an OpenAI-compatible chat-completions API (e.g. `rao serve
    /// pipelines/textcraft-synth.yaml evaluate`). Its inputs must be done.
    Serve(commands::serve::ServeArgs),
    /// Check every manifest of a store and every byte it names (sizes and blake3 hashes).
    Verify(commands::maintenance::VerifyArgs),
    /// Remove what nothing needs: staging of dead runs, attempts no manifest names, files a
    /// killed writer left half-written, lapsed leases — and, given pipeline files, every object none of them references — if it was
    /// written at least --min-age ago. Dry run unless --delete.
    Gc(commands::maintenance::GcArgs),
    /// Print execution trees: goals, actions, receipts and scores, indented by depth.
    Inspect(commands::inspect::InspectArgs),
    /// Print the evaluation summary of the pipeline as written (with its --set overrides), or of
    /// a past run (--run ID), and write the run's HTML page (evaluations, curves, depth, cost).
    Report(commands::report::ReportArgs),
    /// Put pipelines (variants) side by side over seeds: the parameters that differ and every
    /// evaluation metric with 95% intervals and a significance mark against the first pipeline.
    /// Reads the store only; `rao run` produces what is missing (the commands are printed).
    Compare(commands::compare::CompareArgs),
    /// Rewrite the tables of a results document from the store: each `<!-- rao compare ARGS -->`
    /// block gets that comparison's table. --run first runs what the store lacks; --check only
    /// says whether the tables are current.
    Results(commands::results::ResultsArgs),
    /// Print where a finished stage instance's artifacts are (a local path, or a URL in the store).
    Path(commands::plan::PathArgs),
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
    let event_stream = match &cli.command {
        Command::Run(a) => a.json,
        Command::Exec(a) => a.json,
        _ => false,
    };
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

async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let registry = rao_stages::registry();
    match cli.command {
        Command::Validate(a) => commands::plan::validate(a, registry).await,
        Command::Plan(a) => commands::plan::plan(a, registry).await,
        Command::Status(a) => commands::plan::status(a, registry).await,
        Command::Path(a) => commands::plan::path(a, registry).await,
        Command::Run(a) => commands::run::run(a, registry).await,
        Command::Exec(a) => commands::run::exec(a, registry).await,
        Command::Serve(a) => commands::serve::serve(a, registry).await,
        Command::Inspect(a) => commands::inspect::inspect(a, registry).await,
        Command::Report(a) => commands::report::report(a, registry).await,
        Command::Compare(a) => commands::compare::compare(a, registry).await,
        Command::Results(a) => commands::results::results(a, registry).await,
        Command::Verify(a) => commands::maintenance::verify(a, registry).await,
        Command::Gc(a) => commands::maintenance::gc(a, registry).await,
        Command::Schema => {
            print!("{}", rao_plan::schema::pipeline_schema_text(&registry));
            Ok(ExitCode::SUCCESS)
        }
        Command::Kinds { kind, markdown } => {
            let text = match markdown {
                true => rao_plan::kinds_doc::render_markdown(&registry),
                false => rao_plan::kinds_doc::render_text(&registry, kind.as_deref()).map_err(anyhow::Error::msg)?,
            };
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
    }
}
