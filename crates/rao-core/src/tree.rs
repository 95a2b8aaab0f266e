//! The execution-tree model: one record per agent instance (node).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One policy call of a node and what the environment answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Turn {
    /// Generated tokens (ending with `<eos>` unless the window ran out).
    pub completion_ids: Vec<u32>,
    /// Behaviour log-probs of `completion_ids`, from the distribution actually sampled.
    pub logprobs: Vec<f32>,
    pub action: String,
    /// Observation tokens appended after the action (empty after `finish` or an overflow).
    pub observation_ids: Vec<u32>,
    pub observation: String,
}

/// How a tree was run: recursively (nodes may spawn children) or flat (one node does it all).
/// An evaluation runs the same tasks both ways. Parquet keeps the lowercase name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Recursive,
    Flat,
}

impl Mode {
    pub const ALL: [Mode; 2] = [Mode::Recursive, Mode::Flat];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Recursive => "recursive",
            Mode::Flat => "flat",
        }
    }

    pub fn is_recursive(self) -> bool {
        self == Mode::Recursive
    }

    pub fn from_recursive(recursive: bool) -> Mode {
        if recursive { Mode::Recursive } else { Mode::Flat }
    }
}

/// How a node ended. Parquet keeps the snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    /// The node said `finish` (or its environment's equivalent).
    #[default]
    Finished,
    /// It used up its steps (or its subtree's share of the step budget).
    StepBudget,
    /// Its context reached the window.
    ContextOverflow,
}

impl NodeStatus {
    pub const ALL: [NodeStatus; 3] = [NodeStatus::Finished, NodeStatus::StepBudget, NodeStatus::ContextOverflow];

    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Finished => "finished",
            NodeStatus::StepBudget => "step_budget",
            NodeStatus::ContextOverflow => "context_overflow",
        }
    }
}

/// A name that is not one of an enum's: what it was, and the names allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`{value}` is not a {what} (one of: {allowed})")]
pub struct UnknownName {
    pub what: &'static str,
    pub value: String,
    pub allowed: String,
}

macro_rules! named_enum {
    ($t:ty, $what:literal) => {
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }
        impl std::str::FromStr for $t {
            type Err = UnknownName;
            fn from_str(s: &str) -> Result<Self, UnknownName> {
                <$t>::ALL.into_iter().find(|v| v.as_str() == s).ok_or_else(|| UnknownName {
                    what: $what,
                    value: s.to_string(),
                    allowed: <$t>::ALL.map(|v| v.as_str()).join(", "),
                })
            }
        }
    };
}
named_enum!(Mode, "mode");
named_enum!(NodeStatus, "node status");

/// Which tree a node belongs to. The trees of one iteration, mode and task form a group (RAO's
/// baseline compares them); `group` tells its G trees apart. Ordered by iteration, mode, task,
/// then tree.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TreeKey {
    pub iteration: i32,
    pub mode: Mode,
    pub task_id: String,
    pub group: i32,
}

/// A group of trees: one task's G trees of one iteration and mode.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    pub iteration: i32,
    pub mode: Mode,
    pub task_id: String,
}

impl GroupKey {
    /// Tree `group` of this group.
    pub fn tree(&self, group: i32) -> TreeKey {
        TreeKey { iteration: self.iteration, mode: self.mode, task_id: self.task_id.clone(), group }
    }
}

impl TreeKey {
    pub fn group_key(&self) -> GroupKey {
        GroupKey { iteration: self.iteration, mode: self.mode, task_id: self.task_id.clone() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NodeRecord {
    pub run: String,
    pub iteration: i32,
    pub env: String,
    /// How the tree was run (an evaluation runs the same tasks both ways).
    pub mode: Mode,
    /// The task's report group: TextCraft band, document length, hop count (empty if it has none).
    pub band: String,
    pub task_id: String,
    /// Which of the G trees of its task this node's tree is.
    pub group: i32,
    pub node_id: i32,
    pub parent_id: Option<i32>,
    pub depth: i32,
    pub child_index: i32,
    /// The parent's step at which this node was launched.
    pub spawn_step: Option<i32>,
    pub policy_version: i32,
    pub goal: String,
    pub goal_ids: Vec<u32>,
    pub status: NodeStatus,
    pub score: f64,
    pub judge: Option<String>,
    pub local_reward: Option<f64>,
    pub baseline: Option<f64>,
    pub advantage: Option<f64>,
    pub depth_weight: Option<f64>,
    pub steps: i32,
    /// Whose tokens `prompt_ids`, `completion_ids` and `observation_ids` are: empty for the
    /// environment's own (compact) tokens; for a language model acting in text, `model:` and the
    /// first 16 hex digits of the blake3 of its `tokenizer.json`. A text node's ids are exactly
    /// what the model was fed and sampled (the rendered prompt, each reply with its stop token,
    /// each observation rendered as the chat template continues it), never re-tokenised.
    pub token_space: String,
    pub prompt_ids: Vec<u32>,
    pub turns: Vec<Turn>,
    /// Tokens in the node's context at the end (prompt + actions + observations).
    pub context_tokens: i32,
    pub generated_tokens: i32,
    /// The node's return value, if any.
    pub result: Option<String>,
    /// Environment counters of the node's own actions (e.g. units crafted per item).
    pub counters: BTreeMap<String, i64>,
    pub started_ms: f64,
    pub finished_ms: f64,
}

impl NodeRecord {
    /// The tree this node belongs to.
    pub fn tree_key(&self) -> TreeKey {
        TreeKey { iteration: self.iteration, mode: self.mode, task_id: self.task_id.clone(), group: self.group }
    }

    /// The node's training sequence (prompt, then each completion and observation) with the
    /// loss mask (true on generated tokens) and behaviour log-probs (0 where not generated).
    pub fn sequence(&self) -> (Vec<u32>, Vec<bool>, Vec<f32>) {
        let mut toks = self.prompt_ids.clone();
        let mut mask = vec![false; toks.len()];
        let mut lps = vec![0.0; toks.len()];
        for t in &self.turns {
            toks.extend(&t.completion_ids);
            mask.extend(std::iter::repeat_n(true, t.completion_ids.len()));
            lps.extend(&t.logprobs);
            toks.extend(&t.observation_ids);
            mask.extend(std::iter::repeat_n(false, t.observation_ids.len()));
            lps.extend(std::iter::repeat_n(0.0, t.observation_ids.len()));
        }
        (toks, mask, lps)
    }
}
