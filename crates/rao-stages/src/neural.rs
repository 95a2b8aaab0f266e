//! The learned policy as the runtime's policy, and checkpoints as artifacts.

use std::sync::Arc;

use futures::future::BoxFuture;
use rao_agent::{Policy as RuntimePolicy, Request, Response};
use rao_envs::grammar::Grammar;
use rao_envs::{Tok, Vocab};
use rao_pipeline::{InputArtifact, StageContext};
use rao_policy::policy::CheckpointMeta;
use rao_policy::{Backend, Checkpoint, Policy, SampleRequest};

pub const META_FILE: &str = "checkpoint.json";
pub const PARAMS_FILE: &str = "model.bpk";
pub const OPTIM_FILE: &str = "optim.bin";

pub fn write_checkpoint(ctx: &StageContext, output: &str, ck: &Checkpoint) -> anyhow::Result<()> {
    ctx.write_output(output, META_FILE, serde_json::to_string_pretty(&ck.meta)?.as_bytes())?;
    ctx.write_output(output, PARAMS_FILE, &ck.params)?;
    ctx.write_output(output, OPTIM_FILE, &ck.optim)?;
    Ok(())
}

pub async fn read_checkpoint(ctx: &StageContext, a: &InputArtifact) -> anyhow::Result<Checkpoint> {
    let meta: CheckpointMeta = serde_json::from_slice(&ctx.read_input_file(a, META_FILE).await?)?;
    Ok(Checkpoint {
        meta,
        params: ctx.read_input_file(a, PARAMS_FILE).await?.to_vec(),
        optim: ctx.read_input_file(a, OPTIM_FILE).await?.to_vec(),
    })
}

pub async fn load_policy(ctx: &StageContext, input: &str, backend: Backend) -> anyhow::Result<Policy> {
    let a = ctx.input(input)?.first().ok_or_else(|| anyhow::anyhow!("input `{input}` is empty"))?.clone();
    Policy::from_checkpoint(&read_checkpoint(ctx, &a).await?, backend)
}

/// The sampler's view of a runtime request (a node's mode is the second token of its context).
fn sample_request(r: Request, rec: Tok) -> SampleRequest {
    SampleRequest { recursive: r.context.get(1) == Some(&rec), context: r.context, max_new_tokens: r.max_new_tokens, seed: r.seed }
}

/// Serves a round's batch with one batched, constrained, KV-cached sampling pass.
pub struct NeuralPolicy {
    pub policy: Arc<Policy>,
    pub grammar: Arc<dyn Grammar>,
    /// The `<rec>` token: a node's mode is the second token of its context.
    pub rec: Tok,
    pub temperature: f64,
}

impl NeuralPolicy {
    pub fn new(policy: Arc<Policy>, grammar: Arc<dyn Grammar>, vocab: &Vocab, temperature: f64) -> Self {
        NeuralPolicy { policy, grammar, rec: vocab.id("<rec>"), temperature }
    }
}

impl RuntimePolicy for NeuralPolicy {
    fn act(&self, batch: Vec<Request>) -> BoxFuture<'_, Vec<Response>> {
        let reqs: Vec<SampleRequest> = batch.into_iter().map(|r| sample_request(r, self.rec)).collect();
        let (policy, grammar, temperature) = (self.policy.clone(), self.grammar.clone(), self.temperature);
        Box::pin(async move {
            let out =
                tokio::task::spawn_blocking(move || policy.sample(&reqs, grammar.as_ref(), temperature)).await.expect("sampling panicked");
            out.into_iter().map(|(tokens, logprobs)| Response { tokens, logprobs, model: None }).collect()
        })
    }
    fn version(&self) -> i32 {
        self.policy.version
    }
}

/// The scripted expert's actions, decoded token by token through the learned model (teacher
/// forcing, `Policy::force`): the expert's behaviour at the model's compute cost. Flat and
/// recursive runs then compare wall clock at equal behaviour, which the learned policy alone
/// cannot give where one mode fails.
pub struct PacedExpert {
    pub expert: Arc<dyn RuntimePolicy>,
    pub model: Arc<Policy>,
    pub rec: Tok,
}

impl RuntimePolicy for PacedExpert {
    fn act(&self, batch: Vec<Request>) -> BoxFuture<'_, Vec<Response>> {
        let reqs: Vec<SampleRequest> = batch.iter().map(|r| sample_request(r.clone(), self.rec)).collect();
        Box::pin(async move {
            let actions: Vec<Vec<Tok>> = self.expert.act(batch).await.into_iter().map(|r| r.tokens).collect();
            let model = self.model.clone();
            let out = tokio::task::spawn_blocking(move || model.force(&reqs, &actions)).await.expect("forced decoding panicked");
            out.into_iter().map(|(tokens, logprobs)| Response { tokens, logprobs, model: None }).collect()
        })
    }
}
