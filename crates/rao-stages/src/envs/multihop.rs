//! Multi-hop search as a task set, and `multihop_tasks`, the stage kind that draws its chain
//! questions over a seeded knowledge graph (`env.json`, `graph.json`, `tasks.parquet`).

use std::sync::Arc;

use futures::future::BoxFuture;
use rao_agent::{Limits, Policy, ScriptedPolicy};
use rao_core::parquet_io::Column;
use rao_envs::grammar::Grammar;
use rao_envs::multihop::{self, Graph, GraphConfig, HopExpertConfig, HopTask, Lang, MultiHopEpisode, MultiHopGrammar, RELATIONS};
use rao_envs::{Episode, Tok, Vocab};
use rao_pipeline::{InputArtifact, InputDecl, StageContext, TypedStage};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{ExpertSpec, Split, TaskSet, read_task_column, tasks_table, write_header};
use crate::tasks_io::TASKS_FILE;

const GRAPH_FILE: &str = "graph.json";
/// The longest sub-question a `spawn` may ask.
const MAX_HOPS: usize = 8;

pub struct MultiHopSet {
    pub lang: Arc<Lang>,
    pub tasks: Vec<HopTask>,
}

pub async fn load(ctx: &StageContext, artifacts: &[InputArtifact]) -> anyhow::Result<Arc<dyn TaskSet>> {
    let graph: Graph = serde_json::from_slice(&ctx.read_input_file(&artifacts[0], GRAPH_FILE).await?)?;
    let mut tasks = Vec::new();
    for a in artifacts {
        tasks.extend(read_task_column::<HopTask>(ctx.read_input_file(a, TASKS_FILE).await?)?);
    }
    Ok(Arc::new(MultiHopSet { lang: Arc::new(Lang::new(graph)), tasks }))
}

impl TaskSet for MultiHopSet {
    fn name_groups(&self) -> Vec<Vec<Tok>> {
        self.lang.name_groups()
    }
    fn env(&self) -> &'static str {
        "multihop"
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
        format!("{} hops", self.tasks[i].hops())
    }
    fn label_order(&self) -> Vec<String> {
        let mut hops: Vec<usize> = self.tasks.iter().map(|t| t.hops()).collect();
        hops.sort();
        hops.dedup();
        hops.into_iter().map(|k| format!("{k} hops")).collect()
    }
    fn level(&self, i: usize) -> u32 {
        self.tasks[i].hops() as u32
    }
    fn episode(&self, i: usize) -> Arc<dyn Episode> {
        Arc::new(MultiHopEpisode::new(self.lang.clone(), self.tasks[i].clone()))
    }
    fn grammar(&self, _max_children: usize) -> Arc<dyn Grammar> {
        Arc::new(MultiHopGrammar::new(self.lang.clone(), MAX_HOPS))
    }
    fn expert(&self, spec: ExpertSpec, limits: &Limits) -> Arc<dyn Policy> {
        let cfg = HopExpertConfig { max_depth: limits.max_depth, delegate: spec.delegate, noise: spec.noise, seed: spec.seed };
        let lang = self.lang.clone();
        Arc::new(ScriptedPolicy(move |ctx: &[Tok], _window: usize| multihop::expert_action(&lang, &cfg, ctx)))
    }
}

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MultiHopParams {
    /// Graph size and page length (default: 48 entities, 8 relations, 7 distractors per page: the entity's other facts).
    #[serde(default)]
    pub graph: GraphConfig,
    /// Seed of the graph: keep it fixed so every iteration asks about the same graph.
    #[serde(default)]
    pub graph_seed: u64,
    /// Chain lengths to draw, inclusive.
    #[serde(default = "default_hops")]
    pub hops: [usize; 2],
    /// Questions per chain length.
    #[serde(default = "default_per_hops")]
    pub per_hops: usize,
    /// `validation` questions start from entities training questions never start from.
    #[serde(default)]
    pub split: Split,
    /// Seed of the draw; default: this instance's seed (fresh in every loop iteration).
    #[serde(default)]
    pub task_seed: Option<u64>,
}

fn default_hops() -> [usize; 2] {
    [2, 4]
}
/// Questions per chain length at most (far past it, their memory was asked for at once).
const MAX_PER_HOPS: usize = 1_000_000;

fn default_per_hops() -> usize {
    8
}

pub struct MultiHopTasks;

impl TypedStage for MultiHopTasks {
    fn code() -> &'static str {
        crate::code::of("envs")
    }
    /// Caught by `rao validate` (they were found only when the stage ran).
    fn check(p: &MultiHopParams, _inputs: &[&str]) -> Vec<rao_pipeline::ParamError> {
        let bad =
            |key: &str, message: String, help: &str| rao_pipeline::ParamError { key: Some(key.into()), message, help: Some(help.into()) };
        let [lo, hi] = p.hops;
        let mut out: Vec<_> = crate::rollout::check_count("per_hops", p.per_hops, MAX_PER_HOPS).into_iter().collect();
        if !(1 <= lo && lo <= hi && hi <= MAX_HOPS) {
            out.push(bad(
                "hops",
                format!("hops [{lo}, {hi}] is not a range [min, max] within 1–{MAX_HOPS}"),
                "give `hops: [min, max]` with 1 ≤ min ≤ max",
            ));
        }
        if p.graph.relations > RELATIONS.len() {
            out.push(bad(
                "graph",
                format!("graph.relations is {}: at most {}", p.graph.relations, RELATIONS.len()),
                "lower `graph.relations`",
            ));
        }
        if !(4..4900).contains(&p.graph.entities) {
            out.push(bad("graph", format!("graph.entities is {}: between 4 and 4899", p.graph.entities), "change `graph.entities`"));
        }
        out
    }
    type Params = MultiHopParams;
    const NAME: &'static str = crate::kinds::MULTIHOP_TASKS;
    const VERSION: u32 = 3; // 2: entity pages (one-key lookup), 8 relations; 3: pages end on the query
    const DESCRIBE: &'static str = "draw multi-hop chain questions over a seeded knowledge graph";
    const INPUTS: &'static [InputDecl] = &[];
    const OUTPUTS: &'static [&'static str] = &["tasks"];

    fn run(ctx: StageContext, p: MultiHopParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            if let Some(e) = Self::check(&p, &[]).into_iter().next() {
                anyhow::bail!(e.message);
            }
            let [lo, hi] = p.hops;
            let graph = multihop::generate(&p.graph, p.graph_seed);
            let tasks = multihop::synthesize(&graph, (lo, hi), p.per_hops, p.split == Split::Validation, p.task_seed.unwrap_or(ctx.seed));
            let lang = Lang::new(graph.clone());
            let table = tasks_table(
                &tasks,
                vec![
                    ("id", Column::Str(tasks.iter().map(|t| t.id.clone()).collect())),
                    ("question", Column::Str(tasks.iter().map(|t| lang.vocab.text(&lang.goal(t.entity, &t.relations))).collect())),
                    ("hops", Column::I64(tasks.iter().map(|t| t.hops() as i64).collect())),
                    ("answer", Column::Str(tasks.iter().map(|t| graph.names[graph.follow(t.entity, &t.relations)].clone()).collect())),
                    ("validation", Column::Bool(tasks.iter().map(|t| t.validation).collect())),
                ],
            )?;
            ctx.set_metric("tasks", tasks.len() as f64);
            write_header(&ctx, "tasks", "multihop")?;
            ctx.write_output("tasks", GRAPH_FILE, serde_json::to_string(&graph)?.as_bytes())?;
            ctx.write_output("tasks", TASKS_FILE, &table)
        })
    }
}
