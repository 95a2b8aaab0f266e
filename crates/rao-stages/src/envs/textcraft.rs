//! TextCraft(-Synth) as a task set: a world and tasks (`world.json`, `tasks.parquet`, written by
//! `synthesize`).

use std::sync::Arc;

use rao_agent::{Limits, Policy, ScriptedExpert, UniformRandom};
use rao_envs::grammar::Grammar;
use rao_envs::rng::Rng;
use rao_envs::textcraft::expert::items_in;
use rao_envs::textcraft::grammar::TextCraftGrammar;
use rao_envs::textcraft::{Band, ExpertConfig, Rules, Task, TextCraftEpisode, World};
use rao_envs::{Episode, Vocab};
use rao_pipeline::{InputArtifact, StageContext};
use rao_policy::Sequence;

use super::{ExpertSpec, TaskSet};
use crate::tasks_io::{TASKS_FILE, WORLD_FILE, tasks_from_parquet};

pub struct TextCraftTasks {
    pub world: Arc<World>,
    pub tasks: Vec<Task>,
}

/// A task set from a world and tasks built in code (examples, tests).
pub fn task_set(world: &Arc<World>, tasks: &[Task]) -> TextCraftTasks {
    TextCraftTasks { world: world.clone(), tasks: tasks.to_vec() }
}

pub async fn load(ctx: &StageContext, artifacts: &[InputArtifact]) -> anyhow::Result<Arc<dyn TaskSet>> {
    let world = Arc::new(World::from_json(std::str::from_utf8(&ctx.read_input_file(&artifacts[0], WORLD_FILE).await?)?)?);
    let mut tasks = Vec::new();
    for a in artifacts {
        tasks.extend(tasks_from_parquet(&world, ctx.read_input_file(a, TASKS_FILE).await?)?);
    }
    Ok(Arc::new(TextCraftTasks { world, tasks }))
}

/// The row a task is reported under: its band, its group (the original TextCraft's task file),
/// or for tasks drawn by tier range the label of the draw (ids are `{label}-{split}-{k}`).
pub fn task_group(task: &Task) -> String {
    match (task.band, &task.group) {
        (Some(b), _) => b.name().to_string(),
        (None, Some(g)) => g.clone(),
        (None, None) => task.id.rsplitn(3, '-').last().unwrap_or(&task.id).to_string(),
    }
}

impl TaskSet for TextCraftTasks {
    fn env(&self) -> &'static str {
        "textcraft"
    }
    fn vocab(&self) -> &Vocab {
        &self.world.vocab
    }
    fn len(&self) -> usize {
        self.tasks.len()
    }
    fn id(&self, i: usize) -> &str {
        &self.tasks[i].id
    }
    fn label(&self, i: usize) -> String {
        task_group(&self.tasks[i])
    }
    /// Bands in difficulty order, then other labels sorted.
    fn label_order(&self) -> Vec<String> {
        let present: std::collections::BTreeSet<String> = self.tasks.iter().map(task_group).collect();
        let mut out: Vec<String> = Band::ALL.iter().map(|b| b.name().to_string()).filter(|b| present.contains(b)).collect();
        out.extend(present.into_iter().filter(|g| Band::parse(g).is_none()));
        out
    }
    fn level(&self, i: usize) -> u32 {
        self.tasks[i].targets.iter().map(|(t, _)| self.world.item(*t).tier).max().unwrap_or(0)
    }
    /// The task's gold actions, then `finish`.
    fn gold(&self, i: usize) -> Option<Vec<Vec<rao_envs::Tok>>> {
        let gold = &self.tasks[i].gold;
        (!gold.is_empty()).then(|| gold.iter().map(String::as_str).chain(["finish"]).map(|a| self.world.vocab.ids(a)).collect())
    }
    fn episode(&self, i: usize) -> Arc<dyn Episode> {
        Arc::new(TextCraftEpisode::new(self.world.clone(), self.tasks[i].clone()))
    }
    fn grammar(&self, max_children: usize) -> Arc<dyn Grammar> {
        Arc::new(TextCraftGrammar::new(&self.world, max_children))
    }
    fn expert(&self, spec: ExpertSpec, limits: &Limits) -> Arc<dyn Policy> {
        let config = ExpertConfig { max_depth: limits.max_depth, delegate: spec.delegate, noise: spec.noise, seed: spec.seed };
        Arc::new(ScriptedExpert { world: self.world.clone(), config })
    }
    fn random_policy(&self) -> Option<Arc<dyn Policy>> {
        Some(Arc::new(UniformRandom { world: self.world.clone() }))
    }
    /// Items renamed at random, consistently within the sequence (names keep their token counts,
    /// so masks still line up); with `shift`, every name also moves up by a random number of
    /// tiers (order kept), so the policy learns to copy tier tokens no demonstration reaches.
    /// Worlds of the original TextCraft rename within a tier and word count and never shift
    /// (their tiers differ in size; see [`World::random_renaming_same_shape`]).
    fn augment(&self, s: &Sequence, shift: bool, rng: &mut Rng) -> Sequence {
        let world = &self.world;
        if world.rules == Rules::Original {
            let map = world.random_renaming_same_shape(rng);
            return Sequence { tokens: world.rename_tokens(&s.tokens, &map), ..s.clone() };
        }
        let shift = if shift {
            let top = world.items.iter().map(|i| i.tier).max().unwrap_or(0);
            let highest = items_in(world, &s.tokens).iter().map(|&i| world.item(i).tier).max().unwrap_or(0);
            rng.below((top - highest.min(top)) as usize + 1) as u32
        } else {
            0
        };
        let map = world.random_renaming_shifted(rng, shift);
        let tokens = world.rename_tokens(&s.tokens, &map);
        debug_assert_eq!(tokens.len(), s.tokens.len());
        Sequence { tokens, ..s.clone() }
    }
}
