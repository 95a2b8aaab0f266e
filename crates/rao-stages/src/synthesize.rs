//! `synthesize`: a task set (world + tasks) from TextCraft-Synth, or from a task file in rao's
//! format — local, or the files of a `dataset` input (e.g. read from a bucket). The original
//! TextCraft files are read by `textcraft_files`.

use futures::future::BoxFuture;
use rao_envs::textcraft::{self, Band, SynthConfig};
use rao_pipeline::{InputDecl, StageContext, TypedStage};
use schemars::JsonSchema;
use serde::Deserialize;

use rao_envs::textcraft::{Task, World};

use crate::tasks_io::{TASKS_FILE, WORLD_FILE, read_task_file, tasks_to_parquet};

#[derive(Debug, Clone, Deserialize, serde::Serialize, JsonSchema)]
#[serde(untagged)]
pub enum WorldSpec {
    /// `small` (3 domains, tiers 0–7, compact), `small-deep` (the same with tiers 8–9, its
    /// Extreme band: evaluation beyond the tiers trained on) or `full` (5 domains, tiers 0–12).
    Preset(String),
    Config(SynthConfig),
}

#[derive(Debug, Clone, Copy, Deserialize, serde::Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Validation,
}

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SynthesizeParams {
    /// The synthetic world.
    #[serde(default = "default_world")]
    pub world: WorldSpec,
    /// Seed of the world: keep it fixed so every iteration plays in the same world.
    #[serde(default)]
    pub world_seed: u64,
    /// A task file (relative to the files of the `dataset` input) in rao's format, in the world of `world`/`world_seed` (or of a `world.json`
    /// next to it): `tasks.parquet` as this stage writes it, or `.jsonl` with one
    /// `{"target": …, "count": …, "inventory": [[item, units], …]}` per line (`id` optional).
    /// Every task is kept; `split` marks them training or validation.
    #[serde(default)]
    pub tasks_file: Option<String>,
    /// Difficulty bands to draw from.
    #[serde(default = "default_bands")]
    pub bands: Vec<Band>,
    /// Instead of bands: targets of these tiers, inclusive (`[1, 2]`: the shallow sub-tasks that
    /// leaves of a recursive tree solve). Tasks drawn this way have no band.
    #[serde(default)]
    pub tiers: Option<[u32; 2]>,
    /// Tasks per band (or in the tier range).
    #[serde(default = "default_per_band")]
    pub per_band: usize,
    /// `train` targets, or held-out `validation` targets.
    #[serde(default = "default_split")]
    pub split: Split,
    /// Seed of the draw; default: this instance's seed (fresh in every loop iteration).
    #[serde(default)]
    pub task_seed: Option<u64>,
}

fn default_world() -> WorldSpec {
    WorldSpec::Preset("small".into())
}
fn default_bands() -> Vec<Band> {
    vec![Band::Medium]
}
/// Tasks per band at most: a million tasks is a large data set; far past it, the tasks' memory
/// was asked for at once and the allocation aborted rao.
const MAX_PER_BAND: usize = 1_000_000;

fn default_per_band() -> usize {
    16
}
fn default_split() -> Split {
    Split::Train
}

impl WorldSpec {
    pub fn config(&self) -> anyhow::Result<SynthConfig> {
        match self {
            WorldSpec::Preset(p) => {
                SynthConfig::preset(p).ok_or_else(|| anyhow::anyhow!("unknown world preset `{p}`: use `small`, `small-deep` or `full`"))
            }
            WorldSpec::Config(c) => Ok(c.clone()),
        }
    }
}

pub struct Synthesize;

impl TypedStage for Synthesize {
    /// A misspelt preset is caught by `rao validate`, not when the stage runs.
    fn check(p: &SynthesizeParams, _inputs: &[&str]) -> Vec<rao_pipeline::ParamError> {
        let mut out: Vec<rao_pipeline::ParamError> =
            crate::rollout::check_count("per_band", p.per_band, MAX_PER_BAND).into_iter().collect();
        let config = match p.world.config() {
            Ok(config) => config,
            Err(e) => {
                out.push(rao_pipeline::ParamError {
                    key: Some("world".into()),
                    message: e.to_string(),
                    help: Some("or give the world's shape itself as a map (`domains`, `max_tier`, `base_per_domain`, …: `SynthConfig` in the JSON Schema)".into()),
                });
                return out;
            }
        };
        if let Some([lo, hi]) = p.tiers
            && (lo > hi || hi > config.max_tier)
        {
            out.push(rao_pipeline::ParamError {
                key: Some("tiers".into()),
                message: format!("tiers [{lo}, {hi}] is not a range [min, max] of this world's tiers 0–{}", config.max_tier),
                help: Some(format!("give `tiers: [min, max]` with min ≤ max ≤ {}", config.max_tier)),
            });
        }
        out
    }
    fn code() -> &'static str {
        crate::code::of("synthesize")
    }
    type Params = SynthesizeParams;
    const NAME: &'static str = crate::kinds::SYNTHESIZE;
    const VERSION: u32 = 1;
    const DESCRIBE: &'static str = "draw TextCraft tasks by difficulty band, or read them from a task file or the original TextCraft files";
    const INPUTS: &'static [InputDecl] = &[InputDecl { name: "dataset", required: false }];
    const OUTPUTS: &'static [&'static str] = &["tasks"];

    fn run(ctx: StageContext, p: SynthesizeParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            // Files named by params come only from the dataset input, whose fingerprint covers
            // their content (a local path read directly would not re-run when edited).
            let root = match ctx.inputs.get("dataset").map(Vec::as_slice) {
                Some([artifact]) => Some(ctx.input_dir(artifact).await?),
                Some(_) => anyhow::bail!("input `dataset` takes exactly one dataset"),
                None => None,
            };
            let (Some(root), Some(name)) = (root, p.tasks_file.as_deref()) else {
                anyhow::ensure!(
                    p.tasks_file.is_none(),
                    "task files are read from a `dataset` input, so that editing them re-runs this stage: add a stage \
                     `{{kind: dataset, params: {{url: PATH_OR_BUCKET_URL}}}}` and `inputs: {{dataset: THAT_STAGE.data}}`"
                );
                anyhow::ensure!(
                    !ctx.inputs.contains_key("dataset"),
                    "with a `dataset` input, name the file that holds the tasks: `tasks_file` (the original TextCraft files are read by the `textcraft_files` kind)"
                );
                let (world, tasks) = synthetic(&p, ctx.seed)?;
                return write_tasks(&ctx, &world, &tasks);
            };
            let path = root.join(name);
            let world = match path.parent().map(|d| d.join(WORLD_FILE)).filter(|w| w.is_file()) {
                Some(w) => World::from_json(&std::fs::read_to_string(w)?)?,
                None => textcraft::generate(&p.world.config()?, p.world_seed),
            };
            let mut tasks = read_task_file(&world, &path)?;
            tasks.iter_mut().for_each(|t| t.validation = p.split == Split::Validation);
            write_tasks(&ctx, &world, &tasks)
        })
    }
}

pub(crate) fn write_tasks(ctx: &StageContext, world: &World, tasks: &[Task]) -> anyhow::Result<()> {
    for t in tasks {
        anyhow::ensure!(textcraft::is_solvable(world, t), "task {} is not solvable from its inventory", t.id);
    }
    ctx.set_metric("tasks", tasks.len() as f64);
    ctx.write_output("tasks", WORLD_FILE, serde_json::to_string(world)?.as_bytes())?;
    ctx.write_output("tasks", TASKS_FILE, &tasks_to_parquet(world, tasks)?)?;
    Ok(())
}

/// Tasks drawn from the synthetic world by band (or tier range).
fn synthetic(p: &SynthesizeParams, instance_seed: u64) -> anyhow::Result<(World, Vec<Task>)> {
    let world = textcraft::generate(&p.world.config()?, p.world_seed);
    let seed = p.task_seed.unwrap_or(instance_seed);
    let validation = p.split == Split::Validation;
    let tasks = match p.tiers {
        Some([lo, hi]) => textcraft::synthesize_tiers(&world, &format!("tiers{lo}-{hi}"), (lo, hi), 3, p.per_band, validation, seed),
        None => p.bands.iter().flat_map(|&band| textcraft::synthesize(&world, band, p.per_band, validation, seed)).collect(),
    };
    anyhow::ensure!(
        !tasks.is_empty(),
        "no tasks: the world has no {} targets in {}",
        if validation { "held-out" } else { "training" },
        match p.tiers {
            Some([lo, hi]) => format!("tiers {lo}..={hi}"),
            None => format!("bands {:?}", p.bands),
        }
    );
    Ok((world, tasks))
}
