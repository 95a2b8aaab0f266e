//! `textcraft_minecraft`: a stand-in for the RAO authors' TextCraft files, made from Minecraft's
//! own crafting recipes (the public `minecraft-data` package's `recipes.json` and `items.json`
//! of one game version, given as a `dataset`; `scripts/minecraft-data` fetches them). It writes
//! the authors' layout — `recipes/*.json`, `textcraft_train.jsonl`, `textcraft_val.jsonl` — as
//! its `data` output, which `textcraft_files` then reads exactly as it reads the authors' copy.
//! Kept out of rao-envs on purpose: a data builder that no other kind reaches, so adding it
//! changed no other kind's code version (no cached artifact went stale).

pub mod tasks;
pub mod vanilla;

use futures::future::BoxFuture;
use rao_pipeline::{InputDecl, StageContext, TypedStage};
use schemars::JsonSchema;
use serde::Deserialize;

use self::tasks::StandinConfig;

/// The kind's name, as pipeline files write it after `kind:`.
pub const NAME: &str = "textcraft_minecraft";

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TextCraftMinecraftParams {
    /// The package's recipe file, relative to the dataset.
    #[serde(default = "default_recipes")]
    pub recipes: String,
    /// The package's item list (ids → names), relative to the dataset.
    #[serde(default = "default_items")]
    pub items: String,
    /// Training tasks to write.
    #[serde(default = "default_train")]
    pub train: usize,
    /// Validation tasks to write (their targets are items no training task asks for).
    #[serde(default = "default_validation")]
    pub validation: usize,
    /// Seed of the split and the tasks: the data set's identity, not the run's seed.
    #[serde(default = "default_data_seed")]
    pub data_seed: u64,
    /// Share of each tier's craftable items held out for validation targets.
    #[serde(default = "default_holdout")]
    pub holdout: f64,
    /// The step budget written into every task (`max_steps`, as the authors' files carry).
    #[serde(default = "default_max_steps")]
    pub max_steps: u32,
}

fn default_recipes() -> String {
    "recipes.json".into()
}
fn default_items() -> String {
    "items.json".into()
}
fn default_train() -> usize {
    StandinConfig::default().train
}
fn default_validation() -> usize {
    StandinConfig::default().validation
}
fn default_data_seed() -> u64 {
    StandinConfig::default().seed
}
fn default_holdout() -> f64 {
    StandinConfig::default().holdout
}
fn default_max_steps() -> u32 {
    StandinConfig::default().max_steps
}

/// Largest package file read (the real ones are a few hundred KB).
const MAX_BYTES: u64 = 64 << 20;
/// Most tasks of either split (each task is one line; the authors ship 1,000 and 100).
const MAX_TASKS: usize = 1_000_000;

pub struct TextCraftMinecraft;

impl TypedStage for TextCraftMinecraft {
    fn code() -> &'static str {
        crate::code::of("textcraft_minecraft")
    }
    type Params = TextCraftMinecraftParams;
    const NAME: &'static str = NAME;
    const VERSION: u32 = 1;
    const DESCRIBE: &'static str = "a stand-in for the authors' TextCraft files (recipes/*.json + JSONL tasks with gold) made from Minecraft's recipes in the minecraft-data package";
    const INPUTS: &'static [InputDecl] = &[InputDecl { name: "dataset", required: true }];
    const OUTPUTS: &'static [&'static str] = &["data"];

    fn run(ctx: StageContext, p: TextCraftMinecraftParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            anyhow::ensure!(p.train <= MAX_TASKS && p.validation <= MAX_TASKS, "`train` and `validation` may be at most {MAX_TASKS}");
            anyhow::ensure!((0.0..1.0).contains(&p.holdout), "`holdout` is a share from 0 up to (not including) 1, not {}", p.holdout);
            let data = match ctx.input("dataset")? {
                [a] => a.clone(),
                _ => anyhow::bail!("input `dataset` takes exactly one dataset"),
            };
            let mut texts = Vec::new();
            for path in [&p.recipes, &p.items] {
                let Some(entry) = data.files.iter().find(|f| f.path == *path) else {
                    let json: Vec<&str> = data.files.iter().map(|f| f.path.as_str()).filter(|f| f.ends_with(".json")).take(20).collect();
                    anyhow::bail!(
                        "`{path}`: no such file in the dataset (run scripts/minecraft-data to fetch minecraft-data's files; the dataset's .json files: {})",
                        if json.is_empty() { "none".into() } else { json.join(", ") }
                    );
                };
                let shown = crate::textcraft_files::shown(&data, path);
                anyhow::ensure!(entry.size <= MAX_BYTES, "{shown}: {} bytes; at most {MAX_BYTES} are read", entry.size);
                let bytes = ctx.read_input_file(&data, path).await?;
                texts.push(
                    String::from_utf8(bytes.to_vec())
                        .map_err(|e| anyhow::anyhow!("{shown}: not UTF-8 (byte {})", e.utf8_error().valid_up_to()))?,
                );
            }
            let cfg =
                StandinConfig { train: p.train, validation: p.validation, seed: p.data_seed, holdout: p.holdout, max_steps: p.max_steps };
            // A package file's error names the file where the user keeps it.
            let standin = tasks::build(&texts[0], &texts[1], &cfg).map_err(|e| match e {
                tasks::StandinError::Data(d) => {
                    let path = match d.file {
                        vanilla::PackageFile::Recipes => &p.recipes,
                        vanilla::PackageFile::Items => &p.items,
                    };
                    anyhow::anyhow!("{}: {}", crate::textcraft_files::shown(&data, path), d.message)
                }
                other => other.into(),
            })?;
            let recipes = standin.files.iter().filter(|(n, _)| n.starts_with("recipes/")).count();
            eprintln!(
                "[{}] {recipes} recipe files; craftable items per tier {:?}; tasks by deepest target tier: train {:?}, validation {:?}",
                ctx.instance, standin.items_per_tier, standin.train_tiers, standin.validation_tiers
            );
            ctx.set_metric("recipe_files", recipes as f64);
            for (name, text) in &standin.files {
                ctx.write_output("data", name, text.as_bytes())?;
            }
            Ok(())
        })
    }
}
