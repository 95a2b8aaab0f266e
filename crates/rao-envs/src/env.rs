//! What the recursive runtime needs from an environment. One trait for every environment:
//! adding one means implementing it (plus a scripted expert), nothing in the runtime changes.

use std::collections::BTreeMap;

use crate::node::NodeView;
use crate::vocab::{Tok, Vocab};

/// What an action does.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Show this observation (it starts with `<obs>`) and continue.
    Observe(Vec<Tok>),
    /// Launch one sub-agent per goal (token sequences); they run concurrently.
    Spawn(Vec<Vec<Tok>>),
    /// The node is done.
    Finish,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    pub step: Step,
    /// Counters this action adds to the acting node (e.g. units crafted), used by the verifier.
    pub counters: Vec<(String, i64)>,
    /// The node's return value, if this action sets it (e.g. an answer).
    pub result: Option<String>,
}

impl StepOutput {
    pub fn observe(obs: Vec<Tok>) -> Self {
        StepOutput { step: Step::Observe(obs), counters: vec![], result: None }
    }
}

/// Why a launch was refused (shown to the agent as an observation; never a crash).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Depth,
    Children,
    Nodes,
    SelfSpawn,
    NotRecursive,
}

/// One episode (one execution tree): the shared world state of every node of the tree.
pub trait Episode: Send + Sync {
    fn vocab(&self) -> &Vocab;
    fn root_goal(&self) -> Vec<Tok>;
    /// The prompt of a node: `<bos>`, mode, depth, goal.
    fn prompt(&self, goal: &[Tok], depth: u32, recursive: bool) -> Vec<Tok>;
    /// A node's context split into goal and turns (`None`: not a node's context).
    fn view(&self, ctx: &[Tok]) -> Option<NodeView>;
    /// What a language model is told about the task, its actions and what they answer
    /// (`text::conversation` puts it first).
    fn instructions(&self, recursive: bool) -> String;
    /// Apply one action (without its `<eos>`) of a node whose goal is `goal`.
    fn step(&self, goal: &[Tok], action: &[Tok], recursive: bool) -> StepOutput;
    /// `step` for actions that read the results of the node's finished children, which the
    /// runtime holds for it as variables (in launch order; `None`: the child set none). Only
    /// environments with such actions (e.g. `answer sum`) override it.
    fn step_with_results(&self, goal: &[Tok], action: &[Tok], recursive: bool, _children: &[Option<String>]) -> StepOutput {
        self.step(goal, action, recursive)
    }
    /// The receipt tokens for one finished child (its result stays in the parent's variables).
    fn receipt(&self, score: f64, result: Option<&str>) -> Vec<Tok>;
    /// The observation for a refused launch.
    fn refusal(&self, why: Refusal) -> Vec<Tok>;
    /// Exact score of a node from its goal, whether it finished, its result, and the counters
    /// of its whole subtree.
    fn verify(&self, goal: &[Tok], finished: bool, result: Option<&str>, subtree: &BTreeMap<String, i64>) -> f64;
}
