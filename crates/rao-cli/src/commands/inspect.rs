//! `rao inspect`: execution trees printed for people.

use super::*;

#[derive(clap::Args)]
pub struct InspectArgs {
    /// A trees Parquet file (a path, or a key inside --store), or a pipeline file followed by
    /// a stage instance (`rao inspect P evaluate`, `rao inspect P rollout@60`).
    pub trees: String,
    /// With a pipeline file: the instance whose trees to print (a stage name: its last one).
    pub instance: Option<String>,
    /// With a pipeline file: overrides, as for `run`.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<String>,
    /// Read from this store (URL or path) instead of the local filesystem / the file's store.
    #[arg(long)]
    pub store: Option<String>,
    /// Only the trees of this task id.
    #[arg(long)]
    pub task: Option<String>,
    /// Only this tree of each task (its index in the task's group).
    #[arg(long)]
    pub group: Option<i32>,
    /// Only the recursive or the flat trees.
    #[arg(long, value_enum)]
    pub mode: Option<ModeArg>,
    /// A report group: `easy`, `160-239 lines`, `3 hops`, …
    #[arg(long)]
    pub band: Option<String>,
    /// Trees with a node that ended this way.
    #[arg(long, value_enum)]
    pub status: Option<StatusArg>,
    /// Only trees whose root did not fully succeed.
    #[arg(long)]
    pub failed: bool,
    /// Trees to print.
    #[arg(long, default_value_t = 3)]
    pub limit: usize,
}

pub async fn inspect(args: InspectArgs, registry: Registry) -> anyhow::Result<ExitCode> {
    let InspectArgs { trees, instance, set, store, task, group, mode, band, status, failed, limit } = args;
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
            anyhow::bail!("`{trees}` is a pipeline file: name the instance whose trees to print, e.g. `rao inspect {trees} evaluate`")
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
    Ok(ExitCode::SUCCESS)
}

#[derive(Copy, Clone, ValueEnum)]
pub enum ModeArg {
    Recursive,
    Flat,
}

#[derive(Copy, Clone, ValueEnum)]
pub enum StatusArg {
    Finished,
    StepBudget,
    ContextOverflow,
}
