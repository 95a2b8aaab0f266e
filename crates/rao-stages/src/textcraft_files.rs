//! `textcraft_files`: the original TextCraft files — a directory of Minecraft recipe JSON files and
//! a JSONL task file with gold trajectories, as the RAO authors publish them — from a `dataset`
//! input (a local copy or a bucket), read as the authors' code reads them. What cannot be loaded
//! is reported, located in the user's files, and skipped (or, with `strict`, fails the stage).

use futures::future::BoxFuture;
use rao_envs::rng::Rng;
use rao_envs::textcraft::original::{self, LoadReport, SourceFile};
use rao_envs::textcraft::{GoalCheck, ItemNames};
use rao_pipeline::{InputArtifact, InputDecl, StageContext, TypedStage};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::envs::Split;

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TextCraftFilesParams {
    /// The directory of recipe files, relative to the dataset: every `*.json` directly in it.
    #[serde(default = "default_recipes")]
    pub recipes: String,
    /// The task file (JSONL), relative to the dataset, e.g. `textcraft_val.jsonl`.
    pub tasks: String,
    /// `train` or `validation` tasks (validation tasks are the ones evaluations report).
    #[serde(default)]
    pub split: Split,
    /// Fail on any unreadable recipe file, bad task line or task that cannot be done, instead of
    /// loading the rest and reporting them.
    #[serde(default)]
    pub strict: bool,
    /// Keep this many of the tasks, drawn at random (without repeats) with `task_seed`; all if absent.
    #[serde(default)]
    pub sample: Option<usize>,
    /// Seed of `sample`; default: this instance's seed (fresh in every loop iteration).
    #[serde(default)]
    pub task_seed: Option<u64>,
    /// Which item names an agent's actions may use: `world` (any of the world's) or
    /// `seen_words` (those whose every word is in the node's context). Every stage that trains
    /// or samples on these tasks uses their world's rule.
    #[serde(default)]
    pub item_names: ItemNames,
    /// When a goal counts as reached: `held` (the original's rule: its units are in the shared
    /// inventory when the node finishes) or `held_and_made` (and the node's subtree made them,
    /// so a sub-agent spawned for items already there does not succeed by finishing).
    #[serde(default)]
    pub goal_check: GoalCheck,
}

fn default_recipes() -> String {
    "recipes".into()
}

/// What the stage writes next to `world.json` and `tasks.parquet`.
pub const REPORT_FILE: &str = "load_report.json";

/// Largest recipe file and task file read (bigger ones are refused, not loaded into memory).
const MAX_RECIPE_BYTES: u64 = 1 << 20;
const MAX_TASK_BYTES: u64 = 256 << 20;
const MAX_RECIPE_FILES: usize = 50_000;

pub struct TextCraftFiles;

impl TypedStage for TextCraftFiles {
    fn code() -> &'static str {
        crate::code::of("textcraft_files")
    }
    type Params = TextCraftFilesParams;
    const NAME: &'static str = crate::kinds::TEXTCRAFT_FILES;
    const VERSION: u32 = 1;
    const DESCRIBE: &'static str =
        "the original TextCraft files (Minecraft recipes + JSONL tasks with gold) from a dataset, read as the original code reads them";
    const INPUTS: &'static [InputDecl] = &[InputDecl { name: "dataset", required: true }];
    const OUTPUTS: &'static [&'static str] = &["tasks"];

    fn run(ctx: StageContext, p: TextCraftFilesParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            let data = match ctx.input("dataset")? {
                [a] => a.clone(),
                _ => anyhow::bail!("input `dataset` takes exactly one dataset"),
            };
            let (recipes, tasks) = read_files(&ctx, &data, &p).await?;
            let group = p.tasks.rsplit('/').next().unwrap_or(&p.tasks).trim_end_matches(".jsonl").to_string();
            let mut loaded = original::load(&recipes, &tasks, &group).map_err(|e| anyhow::anyhow!("{}: {e}", shown(&data, &p.recipes)))?;
            let report = &loaded.report;
            for line in report.summary() {
                eprintln!("[{}] {line}", ctx.instance);
            }
            if let Some(note) = tags_folder_note(&data, &p.recipes) {
                eprintln!("[{}] {note}", ctx.instance);
            }
            if p.strict && !report.problems.is_empty() {
                anyhow::bail!("{} (strict: true; without it these are reported and skipped)", problems(report));
            }
            anyhow::ensure!(!loaded.tasks.is_empty(), "no task of {} could be loaded: {}", tasks.name, problems(report));
            if let Some(k) = p.sample.filter(|k| *k < loaded.tasks.len()) {
                let mut rng = Rng::derive(p.task_seed.unwrap_or(ctx.seed), "textcraft_files/sample");
                let mut keep: Vec<usize> = (0..loaded.tasks.len()).collect();
                rng.shuffle(&mut keep);
                keep.truncate(k);
                keep.sort();
                loaded.tasks = keep.into_iter().map(|i| loaded.tasks[i].clone()).collect();
            }
            for t in &mut loaded.tasks {
                t.validation = p.split == Split::Validation;
            }
            loaded.world.names = p.item_names;
            loaded.world.goal_check = p.goal_check;
            let r = &loaded.report;
            for (name, v) in [
                ("tasks_skipped", r.tasks_skipped),
                ("recipes_loaded", r.crafting_recipes.values().sum()),
                ("recipe_files_skipped", r.skipped_by_type.values().sum::<usize>() + r.malformed_recipes),
                ("gold_tasks", r.gold.with_gold),
                ("gold_reaching_success", r.gold.reaching_success),
            ] {
                ctx.set_metric(name, v as f64);
            }
            ctx.write_output("tasks", REPORT_FILE, serde_json::to_string_pretty(&loaded.report)?.as_bytes())?;
            crate::synthesize::write_tasks(&ctx, &loaded.world, &loaded.tasks)
        })
    }
}

/// Every problem, one per line (at most 50).
fn problems(report: &LoadReport) -> String {
    let mut lines: Vec<String> = report.problems.iter().take(50).map(|p| format!("\n  {p}")).collect();
    if report.problems.len() > 50 {
        lines.push(format!("\n  … and {} more", report.problems.len() - 50));
    }
    format!("{} problem(s):{}", report.problems.len(), lines.concat())
}

/// The name a user knows a dataset file by: the dataset's URL (or path) and the file's path in it.
pub(crate) fn shown(data: &InputArtifact, rel: &str) -> String {
    let url = data.params.get("url").and_then(|u| u.as_str()).unwrap_or(&data.instance).trim_end_matches('/');
    // A dataset of one object is that object.
    if data.files.len() == 1 && data.files[0].path == rel && url.rsplit('/').next() == Some(rel) {
        return url.to_string();
    }
    format!("{url}/{rel}")
}

fn dir_prefix(dir: &str) -> String {
    let d = dir.trim_matches('/');
    if d.is_empty() || d == "." { String::new() } else { format!("{d}/") }
}

/// The recipe files (directly in `recipes`) and the task file, named as the user knows them.
async fn read_files(ctx: &StageContext, data: &InputArtifact, p: &TextCraftFilesParams) -> anyhow::Result<(Vec<SourceFile>, SourceFile)> {
    let prefix = dir_prefix(&p.recipes);
    let in_dir: Vec<_> = data.files.iter().filter(|f| f.path.starts_with(&prefix) && !f.path[prefix.len()..].contains('/')).collect();
    let json: Vec<_> = in_dir.iter().filter(|f| f.path.ends_with(".json")).collect();
    if json.is_empty() {
        let top: std::collections::BTreeSet<&str> = data.files.iter().map(|f| f.path.split('/').next().unwrap_or("")).collect();
        anyhow::bail!(
            "{}: no recipe files (`*.json`) there; `recipes` names a directory of the dataset, which holds: {}",
            shown(data, p.recipes.trim_matches('/')),
            top.into_iter().take(20).collect::<Vec<_>>().join(", ")
        );
    }
    anyhow::ensure!(
        json.len() <= MAX_RECIPE_FILES,
        "{}: {} recipe files; at most {MAX_RECIPE_FILES} are read",
        shown(data, &p.recipes),
        json.len()
    );
    let mut recipes = Vec::with_capacity(json.len());
    for f in json {
        let name = shown(data, &f.path);
        anyhow::ensure!(f.size <= MAX_RECIPE_BYTES, "{name}: {} bytes; a recipe file may have at most {MAX_RECIPE_BYTES}", f.size);
        recipes.push(SourceFile { text: text_of(ctx, data, &f.path, &name).await?, name });
    }
    let task_path = p.tasks.trim_start_matches("./");
    let name = shown(data, task_path);
    let Some(entry) = data.files.iter().find(|f| f.path == task_path) else {
        let jsonl: Vec<&str> = data.files.iter().map(|f| f.path.as_str()).filter(|f| f.ends_with(".jsonl")).collect();
        anyhow::bail!(
            "{name}: no such file in the dataset (its .jsonl files: {})",
            if jsonl.is_empty() { "none".into() } else { jsonl.join(", ") }
        );
    };
    anyhow::ensure!(entry.size <= MAX_TASK_BYTES, "{name}: {} bytes; a task file may have at most {MAX_TASK_BYTES}", entry.size);
    let tasks = SourceFile { text: text_of(ctx, data, task_path, &name).await?, name };
    Ok((recipes, tasks))
}

async fn text_of(ctx: &StageContext, data: &InputArtifact, path: &str, name: &str) -> anyhow::Result<String> {
    let bytes = ctx.read_input_file(data, path).await.map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    String::from_utf8(bytes.to_vec()).map_err(|e| anyhow::anyhow!("{name}: not UTF-8 text (byte {})", e.utf8_error().valid_up_to()))
}

/// A `tags` folder is not read: say so where one is present.
fn tags_folder_note(data: &InputArtifact, recipes: &str) -> Option<String> {
    let parent = recipes.trim_matches('/').rsplit_once('/').map(|(p, _)| format!("{p}/")).unwrap_or_default();
    let candidates = [format!("{}tags/", dir_prefix(recipes)), format!("{parent}tags/")];
    let found = candidates.iter().find(|c| data.files.iter().any(|f| f.path.starts_with(c.as_str())))?;
    Some(format!(
        "{} is not read: as in the original, a tag is satisfied by the items whose names match it",
        shown(data, found.trim_end_matches('/'))
    ))
}
