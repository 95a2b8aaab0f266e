//! Environments as the RL stages see them. A `tasks` artifact names its environment in
//! `env.json`; loading it gives a [`TaskSet`]: episodes, the grammar of its action language,
//! its scripted expert and its report groups. Rollout, judge, update, warm start and evaluation
//! are written against this trait only.
//!
//! Adding an environment: one module here (its `TaskSet`, and a stage kind that writes its tasks
//! artifact), one line in [`load`] and one in [`register`], plus its module in rao-envs (episode,
//! verifier, grammar, expert). See `longdoc.rs` for a small complete example.

use std::sync::Arc;

use arrow::array::AsArray;
use rao_agent::{Limits, Policy};
use rao_core::parquet_io::{Column, read_batches, table_to_parquet};
use rao_envs::grammar::Grammar;
use rao_envs::rng::Rng;
use rao_envs::{Episode, Tok, Vocab};
use rao_pipeline::{Registry, StageContext, Typed};
use rao_policy::Sequence;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod longdoc;
pub mod multihop;
pub mod textcraft;

/// Names the environment of a `tasks` artifact (TextCraft artifacts from before it existed
/// have none: a missing file means TextCraft).
pub const ENV_FILE: &str = "env.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EnvHeader {
    pub env: String,
}

/// How a scripted expert should behave (demonstrations, baselines, evaluation ceilings).
#[derive(Debug, Clone, Copy)]
pub struct ExpertSpec {
    /// Probability that a node delegates where delegating is possible.
    pub delegate: f64,
    /// Probability of a useless action at each step.
    pub noise: f64,
    pub seed: u64,
}

/// A loaded task set of one environment.
pub trait TaskSet: Send + Sync {
    fn env(&self) -> &'static str;
    fn vocab(&self) -> &Vocab;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn id(&self, i: usize) -> &str;
    /// Every task's index.
    fn all(&self) -> Vec<usize> {
        (0..self.len()).collect()
    }
    /// The group task `i` is reported under (a band, a tier range, a hop count).
    fn label(&self, i: usize) -> String;
    /// Report groups in the order a table should list them.
    fn label_order(&self) -> Vec<String> {
        let mut seen: Vec<String> = Vec::new();
        for i in 0..self.len() {
            let l = self.label(i);
            if !seen.contains(&l) {
                seen.push(l);
            }
        }
        seen.sort();
        seen
    }
    /// A difficulty level (tier, hops, …): demonstrations can be limited to easy tasks.
    fn level(&self, i: usize) -> u32;
    /// Task `i`'s gold trajectory as action tokens ending with the environment's finish, where
    /// its data ships one (the original TextCraft files do).
    fn gold(&self, _i: usize) -> Option<Vec<Vec<Tok>>> {
        None
    }
    /// A fresh episode (one execution tree) of task `i`.
    fn episode(&self, i: usize) -> Arc<dyn Episode>;
    /// The action language's constrained decoding (`max_children`: the most a spawn may launch).
    fn grammar(&self, max_children: usize) -> Arc<dyn Grammar>;
    fn expert(&self, spec: ExpertSpec, limits: &Limits) -> Arc<dyn Policy>;
    /// Uniformly random well-formed actions, where the environment has them.
    fn random_policy(&self) -> Option<Arc<dyn Policy>> {
        None
    }
    /// Groups of interchangeable single-token names (speakers, entities, …) that `augment`
    /// permutes; none by default.
    fn name_groups(&self) -> Vec<Vec<Tok>> {
        Vec::new()
    }
    /// A demonstration varied for training, so that the policy learns to read and copy names
    /// rather than memorise them: by default its `name_groups` permuted consistently within the
    /// sequence (TextCraft, whose names span several tokens, renames items instead).
    fn augment(&self, s: &Sequence, _shift: bool, rng: &mut Rng) -> Sequence {
        let groups = self.name_groups();
        if groups.is_empty() {
            return s.clone();
        }
        Sequence { tokens: rao_envs::node::permute_names(&s.tokens, &groups, rng), ..s.clone() }
    }
}

/// Load the task set of a `tasks` artifact (every artifact of the input, concatenated; they
/// must be of one environment and one world).
pub async fn load(ctx: &StageContext, input: &str) -> anyhow::Result<Arc<dyn TaskSet>> {
    let artifacts = ctx.input(input)?;
    let first = artifacts.first().ok_or_else(|| anyhow::anyhow!("input `{input}` is empty"))?;
    let env = match first.files.iter().any(|f| f.path == ENV_FILE) {
        true => serde_json::from_slice::<EnvHeader>(&ctx.read_input_file(first, ENV_FILE).await?)?.env,
        false => "textcraft".to_string(),
    };
    match env.as_str() {
        "textcraft" => textcraft::load(ctx, artifacts).await,
        "longdoc" => longdoc::load(ctx, artifacts).await,
        "multihop" => multihop::load(ctx, artifacts).await,
        other => anyhow::bail!("input `{input}` holds tasks of environment `{other}`, which this build of rao does not know"),
    }
}

/// The stage kinds that write each environment's tasks.
pub fn register(r: &mut Registry) {
    r.register(Arc::new(Typed::<longdoc::LongDocTasks>::default()));
    r.register(Arc::new(Typed::<multihop::MultiHopTasks>::default()));
}

/// Write the `env.json` of a tasks artifact.
pub fn write_header(ctx: &StageContext, output: &str, env: &str) -> anyhow::Result<()> {
    ctx.write_output(output, ENV_FILE, serde_json::to_string(&EnvHeader { env: env.into() })?.as_bytes())
}

/// Tasks as Parquet: the columns a person or DuckDB reads, plus `task`, the whole task as JSON
/// (what [`read_task_column`] loads back).
pub fn tasks_table<T: Serialize>(tasks: &[T], mut readable: Vec<(&str, Column)>) -> anyhow::Result<bytes::Bytes> {
    let json = tasks.iter().map(serde_json::to_string).collect::<Result<Vec<_>, _>>()?;
    readable.push(("task", Column::Str(json)));
    Ok(table_to_parquet(readable)?)
}

pub fn read_task_column<T: serde::de::DeserializeOwned>(bytes: bytes::Bytes) -> anyhow::Result<Vec<T>> {
    let mut out = Vec::new();
    for b in read_batches(bytes)? {
        let col = b.column_by_name("task").ok_or_else(|| anyhow::anyhow!("tasks.parquet lacks column `task`"))?;
        let col = col.as_string::<i32>();
        for r in 0..b.num_rows() {
            out.push(serde_json::from_str(col.value(r))?);
        }
    }
    Ok(out)
}

/// `train` or `validation` tasks.
#[derive(Debug, Clone, Copy, Deserialize, serde::Serialize, JsonSchema, PartialEq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    #[default]
    Train,
    Validation,
}
