//! `rao compare`: pipelines (variants) side by side over seeds.

use super::*;

#[derive(clap::Args)]
pub struct CompareArgs {
    /// Pipeline files; the first is the baseline the others are tested against.
    #[arg(required = true)]
    pub pipelines: Vec<PathBuf>,
    /// An override for every pipeline (`params.lr=0.001`) or, after a pipeline's letter, for that
    /// one only (`B:params.lr=0.001`; the pipelines are A, B, … in the order given, and a file may
    /// be given twice to compare it with itself under other settings).
    #[arg(long = "set", value_name = "[LETTER:]PATH=VALUE")]
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
    /// Markdown's columns: one per pipeline (rows per evaluation, mode and band), one per band
    /// (rows per pipeline, evaluation and mode: the shape of a results table), one per seed and
    /// the mean (rows per pipeline, evaluation, mode and band), or one per loop iteration (rows per
    /// pipeline, evaluation, mode, band and seed: the learning curves of evaluations in a loop).
    #[arg(long, value_enum, default_value = "pipelines")]
    pub columns: Columns,
    /// Only these metrics (comma-separated): success, mean_score, mean_depth, mean_nodes,
    /// steps_per_task, tokens_per_task, overflow_rate, seconds_per_task. Default: all.
    #[arg(long, value_delimiter = ',')]
    pub metric: Vec<String>,
    /// Markdown: the metric tables alone, without the list of pipelines, the parameters that
    /// differ and the legend (for a document whose text says what A, B, … are).
    #[arg(long)]
    pub brief: bool,
    /// What training stages recorded (comma-separated STAGE.METRIC): with `--columns iterations`
    /// a loop stage's curve (`rollout.root_success,update.loss`; a cell its mean over the
    /// iterations since the column before), in the other layouts a value a seed of a stage run
    /// once (`warmstart.steps,warmstart.gate_node_success`).
    #[arg(long, value_delimiter = ',', value_name = "STAGE.METRIC")]
    pub training: Vec<String>,
    /// With `--columns iterations`: a column every N iterations (default: where the evaluations
    /// measured, else every 10th).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub every: Option<u32>,
    /// Only these evaluations (`evaluate` stages, by name; comma-separated; one inside a loop brings
    /// every iteration's). Default: those outside loops, or with `--columns iterations` those inside.
    #[arg(long, value_delimiter = ',')]
    pub evaluation: Vec<String>,
}

pub async fn compare(args: CompareArgs, registry: Registry) -> anyhow::Result<ExitCode> {
    let (format, columns) = (args.format, args.columns);
    if (columns != Columns::Pipelines || args.brief) && !matches!(format, CompareFormat::Markdown) {
        anyhow::bail!("--columns and --brief lay out the Markdown table; CSV and JSON have a row per cell");
    }
    let cmp = gather(&args, std::path::Path::new(""), &registry).await?.comparison;
    print!(
        "{}",
        match format {
            CompareFormat::Markdown => rao_results::compare_out::markdown(&cmp, columns.layout(args.every), args.brief),
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

/// A comparison read from the store, and the pipeline as run (file, overrides, store) of each
/// arm and seed: what `rao run` needs to produce a missing one.
pub(crate) struct Gathered {
    pub comparison: rao_results::compare::Comparison,
    pub runs: Vec<Vec<(u64, PipelineArgs)>>,
}

impl Gathered {
    /// The pipeline whose run a missing entry names.
    pub fn pipeline_of(&self, m: &rao_results::compare::Missing) -> Option<&PipelineArgs> {
        self.runs.get(m.arm)?.iter().find(|(seed, _)| *seed == m.seed).map(|(_, p)| p)
    }
}

/// `args`' comparison; relative pipeline files are read from `base` (shown as written).
pub(crate) async fn gather(args: &CompareArgs, base: &std::path::Path, registry: &Registry) -> anyhow::Result<Gathered> {
    let CompareArgs { pipelines, set, seeds, store, metric, evaluation, training, .. } = args;
    if args.columns != Columns::Iterations && args.every.is_some() {
        anyhow::bail!("--every spaces the columns of curves: give it with --columns iterations");
    }
    // A seed given twice would count one run as two independent ones.
    if let Some(seed) = seeds.iter().enumerate().find_map(|(i, s)| seeds[..i].contains(s).then_some(s)) {
        anyhow::bail!("--seeds: seed {seed} is given twice; each seed counts once (e.g. `--seeds 1,2,3`)");
    }
    let per_arm: Vec<Vec<String>> =
        (0..pipelines.len()).map(|arm| arm_overrides(set, arm, pipelines.len())).collect::<anyhow::Result<_>>()?;
    if !seeds.is_empty()
        && let Some(o) = per_arm.iter().flatten().find(|o| o.split_once('=').is_some_and(|(k, _)| k.trim() == "seed"))
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
    let (mut arms, mut runs) = (Vec::new(), Vec::new());
    for (file, set) in pipelines.iter().zip(&per_arm) {
        let (mut arm, arm_runs) = compare_arm(file, base, set, seeds, store.as_deref(), training, registry).await?;
        select_evaluations(&mut arm, evaluation, args.columns, !training.is_empty())?;
        check_training_layout(&arm, args.columns)?;
        arms.push(arm);
        runs.push(arm_runs);
    }
    Ok(Gathered { comparison: rao_results::compare::compare(&arms, &metrics), runs })
}

/// The overrides of the pipeline at `arm` (of `arms`): those without a letter, and those whose
/// `LETTER:` names it (the letter taken off).
fn arm_overrides(set: &[String], arm: usize, arms: usize) -> anyhow::Result<Vec<String>> {
    let mut own = Vec::new();
    for o in set {
        let Some((letter, rest)) = o.split_once(':').filter(|(l, _)| l.len() == 1 && l.as_bytes()[0].is_ascii_uppercase()) else {
            own.push(o.clone());
            continue;
        };
        let of = (letter.as_bytes()[0] - b'A') as usize;
        if of >= arms {
            let last = (b'A' + arms.min(26) as u8 - 1) as char;
            anyhow::bail!("--set {o}: no pipeline {letter}: {arms} are compared (A to {last}, in the order given)");
        }
        if !rest.contains('=') {
            anyhow::bail!("--set {o}: after `{letter}:` give PATH=VALUE, e.g. `{letter}:params.lr=0.001`");
        }
        if of == arm {
            own.push(rest.to_string());
        }
    }
    Ok(own)
}

/// Keep the evaluations named (stages: one inside a loop brings its every iteration) and what is
/// missing of them; by default those run once, or with `--columns iterations` those inside loops
/// (learning curves; `training`: training curves are asked for as well). A name no seed's
/// pipeline has is an error that lists the ones it has.
fn select_evaluations(arm: &mut rao_results::compare::Arm, names: &[String], columns: Columns, training: bool) -> anyhow::Result<()> {
    use rao_results::compare::{EvalPoint, SeedRun};
    let points = |run: &SeedRun| run.evaluations.iter().map(|(p, _)| p.clone()).chain(run.missing.clone()).collect::<Vec<EvalPoint>>();
    for name in names {
        if let Some(run) = arm.runs.iter().find(|r| !points(r).iter().any(|p| p.stage == *name)) {
            let mut known: Vec<String> =
                points(run).into_iter().map(|p| if p.iteration.is_some() { format!("{} (in a loop)", p.stage) } else { p.stage }).collect();
            known.sort_unstable();
            known.dedup();
            anyhow::bail!("--evaluation {name}: {} has no evaluation of that name; its evaluations: {}", arm.file, known.join(", "));
        }
    }
    let curves = columns == Columns::Iterations;
    if curves {
        let once: Vec<String> = arm.runs.iter().flat_map(points).filter(|p| p.iteration.is_none()).map(|p| p.stage).collect();
        if let Some(name) = names.iter().find(|n| once.contains(n)) {
            anyhow::bail!(
                "--columns iterations: `{name}` of {} runs once, not in a loop; name evaluations inside a loop (learning curves) or lay it out by pipelines, bands or seeds",
                arm.file
            );
        }
        if names.is_empty() && !training && !arm.runs.iter().flat_map(points).any(|p| p.iteration.is_some()) {
            anyhow::bail!("--columns iterations: {} has no evaluation inside a loop (a learning curve) to lay out", arm.file);
        }
    }
    let keep = |p: &EvalPoint| if names.is_empty() { p.iteration.is_some() == curves } else { names.contains(&p.stage) };
    for run in &mut arm.runs {
        run.evaluations.retain(|(p, _)| keep(p));
        run.missing.retain(|p| keep(p));
    }
    Ok(())
}

/// A loop stage's metric is a curve, laid out by iterations; a stage run once has one value a
/// seed, laid out by seeds beside the other layouts' tables.
fn check_training_layout(arm: &rao_results::compare::Arm, columns: Columns) -> anyhow::Result<()> {
    use rao_results::results::StageMetric;
    let curves = columns == Columns::Iterations;
    for (name, metric) in arm.runs.iter().flat_map(|r| &r.training) {
        match metric {
            StageMetric::Curve(_) if !curves => anyhow::bail!(
                "--training {name}: its stage runs in a loop of {}, a curve: give --columns iterations (a stage run once, such as a warm start, has a value a seed in any layout)",
                arm.file
            ),
            StageMetric::Once(_) if curves => anyhow::bail!(
                "--training {name}: its stage runs once in {}, not in a loop: it has no curve; lay it out by pipelines, bands or seeds",
                arm.file
            ),
            _ => {}
        }
    }
    Ok(())
}

#[derive(Copy, Clone, ValueEnum)]
pub enum CompareFormat {
    Markdown,
    Csv,
    Json,
}

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
pub enum Columns {
    Pipelines,
    Bands,
    Seeds,
    Iterations,
}

impl Columns {
    pub fn layout(self, every: Option<u32>) -> rao_results::compare_out::Layout {
        match self {
            Columns::Pipelines => rao_results::compare_out::Layout::Pipelines,
            Columns::Bands => rao_results::compare_out::Layout::Bands,
            Columns::Seeds => rao_results::compare_out::Layout::Seeds,
            Columns::Iterations => rao_results::compare_out::Layout::Iterations { every },
        }
    }
}

/// One pipeline of `rao compare`: its evaluations for every seed, read from the store.
async fn compare_arm(
    file: &std::path::Path,
    base: &std::path::Path,
    set: &[String],
    seeds: &[u64],
    store: Option<&str>,
    training: &[String],
    registry: &Registry,
) -> anyhow::Result<(rao_results::compare::Arm, Vec<(u64, PipelineArgs)>)> {
    let seeds: Vec<Option<u64>> = if seeds.is_empty() { vec![None] } else { seeds.iter().copied().map(Some).collect() };
    let (mut runs, mut pipelines) = (Vec::new(), Vec::new());
    let (mut name, mut resolved) = (String::new(), serde_json::Value::Null);
    for seed in seeds {
        let mut overrides = set.to_vec();
        overrides.extend(seed.map(|s| format!("seed={s}")));
        let p = PipelineArgs { pipeline: base.join(file), set: overrides, store: store.map(str::to_string) };
        let (c, st) = load_read_only(&p, registry)?;
        let (evaluations, missing) = rao_results::results::evaluations(&c, &st).await?;
        let training = rao_results::results::stage_metrics(&c, &st, training).await?;
        if resolved.is_null() {
            (name, resolved) = (c.name.clone(), (*c.resolved).clone());
        }
        let command = run_command(&p);
        let seed = c.resolved["seed"].as_u64().unwrap_or(0);
        runs.push(rao_results::compare::SeedRun { seed, evaluations, missing, command, training });
        pipelines.push((seed, p));
    }
    Ok((rao_results::compare::Arm { file: file.display().to_string(), name, resolved, runs }, pipelines))
}
