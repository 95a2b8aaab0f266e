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

/// How a node ended.
pub mod status {
    pub const FINISHED: &str = "finished";
    pub const STEP_BUDGET: &str = "step_budget";
    pub const CONTEXT_OVERFLOW: &str = "context_overflow";
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NodeRecord {
    pub run: String,
    pub iteration: i32,
    pub env: String,
    /// `recursive` or `flat`: how the tree was run (an evaluation runs the same tasks both ways).
    pub mode: String,
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
    pub status: String,
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
