//! The policy seam: given node contexts, return the next action's tokens and their log-probs.
//! One call serves a whole batch — every live node of every tree in flight — so a neural
//! policy can answer with one forward pass.

use std::sync::Arc;

use futures::future::BoxFuture;
use rao_core::tree::Mode;
use rao_envs::rng::Rng;
use rao_envs::textcraft::{self, ExpertConfig, World};
use rao_envs::vocab::{EOS, Tok};

#[derive(Debug, Clone)]
pub struct Request {
    /// The node's whole context so far (prompt, actions, observations).
    pub context: Vec<Tok>,
    /// Tokens left in the node's window: generating past this is a context overflow.
    pub max_new_tokens: usize,
    /// Deterministic per-request seed (tree, node, step), for sampling.
    pub seed: u64,
    /// How the node's tree runs: what the policy acts as (its prompt says the same in the
    /// environment's words; policies read it here, never from the tokens).
    pub mode: Mode,
    /// A text policy's context in its model's own tokens: everything it was fed and sampled for
    /// this node so far, exactly (its earlier `ModelTokens`). Empty for the first action and for
    /// policies acting on the environment's tokens.
    pub model_context: Vec<u32>,
}

/// What a policy acting in text fed its model and sampled for one action, in the model's own
/// tokens. The node's record keeps these ids (token in, token out), so training reads exactly
/// what acting produced.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelTokens {
    /// Whose tokens these are (`model:` + the tokenizer's hash): the record's `token_space`.
    pub space: std::sync::Arc<str>,
    /// Tokens appended to the model's context before sampling: the rendered prompt for the
    /// first action, then what the chat template adds for the observation since the last one.
    pub fed: Vec<u32>,
    /// The sampled reply, ending with the model's stop token unless the window ran out.
    pub sampled: Vec<u32>,
    /// Behaviour log-prob of each sampled token.
    pub logprobs: Vec<f32>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Response {
    /// The action's tokens, ending with `<eos>` unless the window ran out.
    pub tokens: Vec<Tok>,
    /// Behaviour log-prob of each token, from the distribution actually sampled.
    pub logprobs: Vec<f32>,
    /// For a policy acting in text: its model's tokens for this action. The runtime records
    /// these instead of the environment's tokens, and `token_space` names them.
    pub model: Option<ModelTokens>,
}

pub trait Policy: Send + Sync {
    /// Answer every request (same order).
    fn act(&self, batch: Vec<Request>) -> BoxFuture<'_, Vec<Response>>;
    /// The checkpoint version recorded with every node.
    fn version(&self) -> i32 {
        0
    }
    /// What the policy counted while acting, as stage metrics (e.g. an endpoint's requests and
    /// failures); most policies count nothing.
    fn counters(&self) -> Vec<(&'static str, f64)> {
        vec![]
    }
    /// True for a policy that counts a node's window in its own model's tokens (a language model
    /// acting in text) and ends the node itself when it runs out: the runtime then does not
    /// count the environment's tokens against the window.
    fn counts_own_window(&self) -> bool {
        false
    }
    /// After acting: why the trees cannot stand as a measurement of this policy, if they cannot
    /// (e.g. an endpoint that answered none of its requests: its trees would measure the
    /// failures, not a model). The stage then fails with this message.
    fn unusable(&self) -> Option<String> {
        None
    }
}

/// Cut an action to the window and close it with `<eos>` if it fits.
pub fn finish_action(mut action: Vec<Tok>, max_new_tokens: usize, logprob: f32) -> Response {
    action.push(EOS);
    action.truncate(max_new_tokens);
    let n = action.len();
    Response { tokens: action, logprobs: vec![logprob; n], model: None }
}

/// The scripted TextCraft expert as a policy (deterministic: log-probs 0).
pub struct ScriptedExpert {
    pub world: Arc<World>,
    pub config: ExpertConfig,
}

impl Policy for ScriptedExpert {
    fn act(&self, batch: Vec<Request>) -> BoxFuture<'_, Vec<Response>> {
        let out = batch
            .into_iter()
            .map(|r| finish_action(textcraft::expert_action(&self.world, &self.config, &r.context), r.max_new_tokens, 0.0))
            .collect();
        Box::pin(async move { out })
    }
}

/// Any environment's scripted expert as a policy: a function from a node's context and window
/// to its next action (deterministic: log-probs 0).
pub struct ScriptedPolicy<F>(pub F);

impl<F: Fn(&[Tok], usize) -> Vec<Tok> + Send + Sync> Policy for ScriptedPolicy<F> {
    fn act(&self, batch: Vec<Request>) -> BoxFuture<'_, Vec<Response>> {
        let out = batch
            .into_iter()
            .map(|r| finish_action((self.0)(&r.context, r.context.len() + r.max_new_tokens), r.max_new_tokens, 0.0))
            .collect();
        Box::pin(async move { out })
    }
}

/// Uniformly random well-formed actions (a floor to compare against).
pub struct UniformRandom {
    pub world: Arc<World>,
}

impl Policy for UniformRandom {
    fn act(&self, batch: Vec<Request>) -> BoxFuture<'_, Vec<Response>> {
        let out = batch
            .into_iter()
            .map(|r| {
                let mut rng = Rng::new(r.seed);
                let recursive = r.mode.is_recursive();
                // Log-prob of the verb choice; the rest of a uniform action is not tracked per token.
                let verbs = if recursive { 5.0f32 } else { 4.0 };
                finish_action(textcraft::expert::random_action(&self.world, recursive, &mut rng), r.max_new_tokens, -(verbs.ln()))
            })
            .collect();
        Box::pin(async move { out })
    }
}
