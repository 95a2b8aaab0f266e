//! Long-document aggregation as a task set, and `longdoc_tasks`, the stage kind that draws its
//! tasks (`env.json`, `config.json`, `tasks.parquet`).

use std::sync::Arc;

use futures::future::BoxFuture;
use rao_agent::{Limits, Policy, ScriptedPolicy};
use rao_core::parquet_io::Column;
use rao_envs::grammar::Grammar;
use rao_envs::longdoc::{self, DocConfig, DocExpertConfig, DocTask, Lang, LongDocEpisode, LongDocGrammar};
use rao_envs::{Episode, Tok, Vocab};
use rao_pipeline::{InputArtifact, InputDecl, StageContext, TypedStage};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{ExpertSpec, Split, TaskSet, read_task_column, tasks_table, write_header};
use crate::tasks_io::TASKS_FILE;

const CONFIG_FILE: &str = "config.json";

pub struct LongDocSet {
    pub lang: Arc<Lang>,
    pub tasks: Vec<DocTask>,
}

pub async fn load(ctx: &StageContext, artifacts: &[InputArtifact]) -> anyhow::Result<Arc<dyn TaskSet>> {
    let config: DocConfig = serde_json::from_slice(&ctx.read_input_file(&artifacts[0], CONFIG_FILE).await?)?;
    let mut tasks = Vec::new();
    for a in artifacts {
        tasks.extend(read_task_column::<DocTask>(ctx.read_input_file(a, TASKS_FILE).await?)?);
    }
    Ok(Arc::new(LongDocSet { lang: Arc::new(Lang::new(&config)), tasks }))
}

/// Report group: documents by length, in bands of 80 lines (`160-239 lines`).
fn length_band(lines: usize) -> String {
    let lo = lines / 80 * 80;
    format!("{lo}-{} lines", lo + 79)
}

impl TaskSet for LongDocSet {
    fn name_groups(&self) -> Vec<Vec<Tok>> {
        self.lang.name_groups()
    }
    fn env(&self) -> &'static str {
        "longdoc"
    }
    fn vocab(&self) -> &Vocab {
        &self.lang.vocab
    }
    fn len(&self) -> usize {
        self.tasks.len()
    }
    fn id(&self, i: usize) -> &str {
        &self.tasks[i].id
    }
    fn label(&self, i: usize) -> String {
        length_band(self.tasks[i].lines.len())
    }
    fn label_order(&self) -> Vec<String> {
        let mut sizes: Vec<usize> = self.tasks.iter().map(|t| t.lines.len() / 80).collect();
        sizes.sort();
        sizes.dedup();
        sizes.into_iter().map(|s| length_band(s * 80)).collect()
    }
    fn level(&self, i: usize) -> u32 {
        self.tasks[i].lines.len() as u32
    }
    fn episode(&self, i: usize) -> Arc<dyn Episode> {
        Arc::new(LongDocEpisode::new(self.lang.clone(), self.tasks[i].clone()))
    }
    fn grammar(&self, max_children: usize) -> Arc<dyn Grammar> {
        Arc::new(LongDocGrammar::new(self.lang.clone(), max_children))
    }
    fn expert(&self, spec: ExpertSpec, limits: &Limits) -> Arc<dyn Policy> {
        let cfg = DocExpertConfig {
            max_depth: limits.max_depth,
            max_children: limits.max_children.clamp(2, 9) as u64,
            delegate: spec.delegate,
            noise: spec.noise,
            seed: spec.seed,
        };
        let lang = self.lang.clone();
        Arc::new(ScriptedPolicy(move |ctx: &[Tok], window: usize| longdoc::expert_action(&lang, &cfg, ctx, window)))
    }
}

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LongDocParams {
    /// Document sizes and vocabulary (default: 160–320 lines, six speakers, six spells).
    #[serde(default)]
    pub config: DocConfig,
    /// Tasks to draw (each its own document and question).
    #[serde(default = "default_count")]
    pub count: usize,
    #[serde(default)]
    pub split: Split,
    /// Seed of the draw; default: this instance's seed (fresh in every loop iteration).
    #[serde(default)]
    pub task_seed: Option<u64>,
}

/// Documents at most: up to 999 lines each, 100,000 of them take gigabytes.
const MAX_COUNT: usize = 100_000;

fn default_count() -> usize {
    16
}

pub struct LongDocTasks;

impl TypedStage for LongDocTasks {
    fn code() -> &'static str {
        crate::code::of("envs")
    }
    fn check(p: &LongDocParams, _inputs: &[&str]) -> Vec<rao_pipeline::ParamError> {
        let c = &p.config;
        let bad = |message: String| rao_pipeline::ParamError { key: Some("config".into()), message, help: None };
        let mut out: Vec<_> = crate::rollout::check_count("count", p.count, MAX_COUNT).into_iter().collect();
        if !(c.min_lines >= 1 && c.min_lines <= c.max_lines) {
            out.push(rao_pipeline::ParamError {
                help: Some("make `config.min_lines` at least 1 and at most `config.max_lines`".into()),
                ..bad(format!("config: min_lines {} is not within 1..=max_lines ({})", c.min_lines, c.max_lines))
            });
        }
        if c.max_lines >= 1000 {
            out.push(rao_pipeline::ParamError {
                help: Some("documents hold at most 999 lines (3-digit line numbers)".into()),
                ..bad(format!("config: max_lines {} is too large", c.max_lines))
            });
        }
        out
    }
    type Params = LongDocParams;
    const NAME: &'static str = crate::kinds::LONGDOC_TASKS;
    // 2: the episodes of these tasks changed (a `read` ends with the question), so everything
    // downstream of a task set must be re-keyed: fingerprints do not include code.
    const VERSION: u32 = 2;
    const DESCRIBE: &'static str = "draw long-document aggregation tasks (a transcript many windows long, a counting question)";
    const INPUTS: &'static [InputDecl] = &[];
    const OUTPUTS: &'static [&'static str] = &["tasks"];

    fn run(ctx: StageContext, p: LongDocParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            anyhow::ensure!(
                p.config.min_lines >= 1 && p.config.min_lines <= p.config.max_lines,
                "config: need 1 <= min_lines <= max_lines"
            );
            anyhow::ensure!(p.config.max_lines < 1000, "config: documents hold fewer than 1000 lines (3-digit line numbers)");
            let lang = Lang::new(&p.config);
            let tasks = longdoc::synthesize(&p.config, p.count, p.split == Split::Validation, p.task_seed.unwrap_or(ctx.seed));
            let text = |t: &DocTask| t.lines.iter().map(|l| lang.vocab.text(&lang.line(l))).collect::<Vec<_>>().join("\n");
            let table = tasks_table(
                &tasks,
                vec![
                    ("id", Column::Str(tasks.iter().map(|t| t.id.clone()).collect())),
                    (
                        "question",
                        Column::Str(tasks.iter().map(|t| lang.vocab.text(&lang.goal(&t.question, 0, t.lines.len() as u64)[..4])).collect()),
                    ),
                    ("lines", Column::I64(tasks.iter().map(|t| t.lines.len() as i64).collect())),
                    ("answer", Column::I64(tasks.iter().map(|t| t.question.count(&t.lines) as i64).collect())),
                    ("validation", Column::Bool(tasks.iter().map(|t| t.validation).collect())),
                    ("document", Column::Str(tasks.iter().map(text).collect())),
                ],
            )?;
            ctx.set_metric("tasks", tasks.len() as f64);
            write_header(&ctx, "tasks", "longdoc")?;
            ctx.write_output("tasks", CONFIG_FILE, serde_json::to_string(&p.config)?.as_bytes())?;
            ctx.write_output("tasks", TASKS_FILE, &table)
        })
    }
}
