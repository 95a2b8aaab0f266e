//! `synthesize`: a task set (world + tasks) from TextCraft-Synth or the original TextCraft files.

use futures::future::BoxFuture;
use rao_envs::textcraft::{self, Band, SynthConfig};
use rao_pipeline::{InputDecl, StageContext, TypedStage};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::tasks_io::{TASKS_FILE, WORLD_FILE, tasks_to_parquet};

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum WorldSpec {
    /// `small` (3 domains, tiers 0–7, compact) or `full` (5 domains, tiers 0–12).
    Preset(String),
    Config(SynthConfig),
}

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Validation,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SynthesizeParams {
    /// The synthetic world (ignored with `textcraft_dir`).
    #[serde(default = "default_world")]
    pub world: WorldSpec,
    /// Seed of the world: keep it fixed so every iteration plays in the same world.
    #[serde(default)]
    pub world_seed: u64,
    /// Original TextCraft: a directory of Minecraft recipe JSON files (relative to the pipeline).
    #[serde(default)]
    pub textcraft_dir: Option<String>,
    /// Original TextCraft: the JSONL task file (with `textcraft_dir`).
    #[serde(default)]
    pub textcraft_tasks: Option<String>,
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
                SynthConfig::preset(p).ok_or_else(|| anyhow::anyhow!("unknown world preset `{p}`: use `small` or `full`"))
            }
            WorldSpec::Config(c) => Ok(c.clone()),
        }
    }
}

pub struct Synthesize;

impl TypedStage for Synthesize {
    type Params = SynthesizeParams;
    const NAME: &'static str = "synthesize";
    const VERSION: u32 = 1;
    const DESCRIBE: &'static str = "draw TextCraft tasks by difficulty band (synthetic world or original TextCraft files)";
    const INPUTS: &'static [InputDecl] = &[];
    const OUTPUTS: &'static [&'static str] = &["tasks"];

    fn run(ctx: StageContext, p: SynthesizeParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            let (world, tasks) = match (&p.textcraft_dir, &p.textcraft_tasks) {
                (Some(dir), Some(tasks)) => textcraft::minecraft::load(&ctx.base_dir.join(dir), &ctx.base_dir.join(tasks))?,
                (None, None) => {
                    let world = textcraft::generate(&p.world.config()?, p.world_seed);
                    let seed = p.task_seed.unwrap_or(ctx.seed);
                    let mut tasks = Vec::new();
                    let validation = p.split == Split::Validation;
                    match p.tiers {
                        Some([lo, hi]) => {
                            tasks = textcraft::synthesize_tiers(&world, &format!("tiers{lo}-{hi}"), (lo, hi), 3, p.per_band, validation, seed)
                        }
                        None => {
                            for &band in &p.bands {
                                tasks.extend(textcraft::synthesize(&world, band, p.per_band, validation, seed));
                            }
                        }
                    }
                    anyhow::ensure!(
                        !tasks.is_empty(),
                        "no tasks: the world has no {} targets in {}",
                        if validation { "held-out" } else { "training" },
                        match p.tiers {
                            Some([lo, hi]) => format!("tiers {lo}..={hi}"),
                            None => format!("bands {:?}", p.bands),
                        }
                    );
                    (world, tasks)
                }
                _ => anyhow::bail!("give both `textcraft_dir` and `textcraft_tasks`, or neither"),
            };
            for t in &tasks {
                anyhow::ensure!(textcraft::is_solvable(&world, t), "task {} is not solvable from its inventory", t.id);
            }
            ctx.set_metric("tasks", tasks.len() as f64);
            ctx.write_output("tasks", WORLD_FILE, serde_json::to_string(&world)?.as_bytes())?;
            ctx.write_output("tasks", TASKS_FILE, &tasks_to_parquet(&world, &tasks)?)?;
            Ok(())
        })
    }
}
