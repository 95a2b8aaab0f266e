//! `rao compare`: pipelines (variants) side by side over seeds.

use super::*;

#[derive(clap::Args)]
pub struct CompareArgs {
    /// Pipeline files; the first is the baseline the others are tested against.
    #[arg(required = true)]
    pub pipelines: Vec<PathBuf>,
    /// An override for every pipeline: `params.lr=0.001`.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<String>,
    /// Seeds to compare over, e.g. `1,2,3` (each pipeline with `--set seed=N`); default: each
    /// file's own seed.
    #[arg(long, value_delimiter = ',')]
    pub seeds: Vec<u64>,
    /// Use this store instead of each pipeline's own.
    #[arg(long)]
    pub store: Option<String>,
    #[arg(long, value_enum, default_value = "markdown")]
    pub format: CompareFormat,
    /// Only these metrics (comma-separated): success, mean_score, mean_depth, mean_nodes,
    /// steps_per_task, tokens_per_task, overflow_rate, seconds_per_task. Default: all.
    #[arg(long, value_delimiter = ',')]
    pub metric: Vec<String>,
}

pub async fn compare(args: CompareArgs, registry: Registry) -> anyhow::Result<ExitCode> {
    let CompareArgs { pipelines, set, seeds, store, format, metric } = args;
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
    Ok(ExitCode::SUCCESS)
}

#[derive(Copy, Clone, ValueEnum)]
pub enum CompareFormat {
    Markdown,
    Csv,
    Json,
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
