//! `rao validate`, `plan`, `status` and `path`: what a pipeline is and what the store holds of it.

use super::*;

#[derive(clap::Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub p: PipelineArgs,
}

pub async fn validate(args: ValidateArgs, registry: Registry) -> anyhow::Result<ExitCode> {
    let ValidateArgs { p } = args;
    let c = compile(&p, &registry)?;
    warn_unused_params(&c, &p);
    let count = |n: usize, one: &str| format!("{n} {one}{}", if n == 1 { "" } else { "s" });
    println!("{}: ok ({}, {})", p.pipeline.display(), count(c.instances.len(), "stage instance"), count(c.loops.len(), "loop"));
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub p: PipelineArgs,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// One node per stage entry instead of per instance (loops and matrices folded).
    #[arg(long)]
    pub folded: bool,
}

pub async fn plan(args: PlanArgs, registry: Registry) -> anyhow::Result<ExitCode> {
    let PlanArgs { p, format, folded } = args;
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
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub p: PipelineArgs,
    /// One JSON object per instance (instance, stage, kind, state, fingerprint, reasons).
    #[arg(long)]
    pub json: bool,
    /// One line per stage entry (loops and matrices folded) with its counts.
    #[arg(long)]
    pub folded: bool,
}

pub async fn status(args: StatusArgs, registry: Registry) -> anyhow::Result<ExitCode> {
    let StatusArgs { p, json, folded } = args;
    let (c, store) = load_read_only(&p, &registry)?;
    let rows = rao_pipeline::plan::rows(&c, &store).await?;
    match (json, folded) {
        (true, true) => println!("{}", serde_json::to_string_pretty(&rao_pipeline::plan::folded_json(&c, &rows))?),
        (true, false) => println!("{}", serde_json::to_string_pretty(&rows)?),
        (false, _) => print!("{}", rao_pipeline::events::terminal_safe(&rao_pipeline::plan::render_status(&c, &rows, folded))),
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
pub struct PathArgs {
    #[command(flatten)]
    pub p: PipelineArgs,
    /// The instance (`evaluate`, `rollout@60`, `evaluate[window=64]`), or a stage name: its
    /// last finished instance.
    pub instance: String,
    /// A file of it: `OUTPUT/PATH` or a file name (`trees.parquet`). Without it: the output
    /// directory (or the instance's directory when it has several outputs).
    pub file: Option<String>,
}

pub async fn path(args: PathArgs, registry: Registry) -> anyhow::Result<ExitCode> {
    let PathArgs { p, instance, file } = args;
    let (c, store) = load_read_only(&p, &registry)?;
    let rows = rao_pipeline::plan::rows(&c, &store).await?;
    let row = artifacts::find_instance(&c, &rows, &instance)?;
    let manifest = artifacts::finished(&store, row, &run_command(&p)).await?;
    println!("{}", artifacts::locate(&store, &manifest, file.as_deref())?);
    Ok(ExitCode::SUCCESS)
}

#[derive(Copy, Clone, ValueEnum)]
pub enum Format {
    Text,
    Dot,
    Mermaid,
    Json,
}
