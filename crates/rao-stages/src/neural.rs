//! The learned policy as the runtime's policy, and checkpoints as artifacts.

use std::sync::Arc;

use futures::future::BoxFuture;
use rao_agent::{Limits, Policy as RuntimePolicy, Request, Response};
use rao_envs::Tok;
use rao_envs::grammar::Grammar;
use rao_pipeline::{InputArtifact, StageContext};
use rao_policy::hf::{TextTokenizer, TokenizerFiles};
use rao_policy::policy::CheckpointMeta;
use rao_policy::{Backend, Checkpoint, Policy, SampleRequest};

use crate::envs::TaskSet;
use crate::text_policy::{TextPolicy, text_grammar};

pub const META_FILE: &str = "checkpoint.json";
pub const PARAMS_FILE: &str = "model.bpk";
pub const OPTIM_FILE: &str = "optim.bin";
/// The input that gives a stage the base model of a checkpoint of LoRA adapters.
pub const BASE_INPUT: &str = "base";

/// Writes a checkpoint; a language model's tokenizer files go along (what makes it act in text).
pub fn write_checkpoint(ctx: &StageContext, output: &str, ck: &Checkpoint, tokenizer: Option<&TextTokenizer>) -> anyhow::Result<()> {
    ctx.write_output(output, META_FILE, serde_json::to_string_pretty(&ck.meta)?.as_bytes())?;
    ctx.write_output(output, PARAMS_FILE, &ck.params)?;
    ctx.write_output(output, OPTIM_FILE, &ck.optim)?;
    for (name, text) in tokenizer.map(|t| t.files().named()).unwrap_or_default() {
        ctx.write_output(output, name, text.as_bytes())?;
    }
    Ok(())
}

/// A checkpoint as loaded: the model and, for a language model acting in text, its tokenizer.
pub struct LoadedModel {
    pub policy: Policy,
    pub tokenizer: Option<Arc<TextTokenizer>>,
}

/// The checkpoint of input `input`, with its tokenizer when it has one.
pub async fn load_model(ctx: &StageContext, input: &str, backend: Backend) -> anyhow::Result<LoadedModel> {
    let a = ctx.input(input)?.first().ok_or_else(|| anyhow::anyhow!("input `{input}` is empty"))?.clone();
    let ck = read_checkpoint(ctx, &a).await?;
    let policy = match ck.meta.lora {
        None => Policy::from_checkpoint(&ck, backend)?,
        // Adapters only: onto the base model they were made for, read once from its files.
        Some(_) => {
            let base = ctx.input(BASE_INPUT).ok().and_then(|b| b.first().cloned()).ok_or_else(|| {
                anyhow::anyhow!(
                    "the `{input}` checkpoint holds LoRA adapters only: give this stage the base model's files as input \
                     `{BASE_INPUT}` (the dataset that `hf_model` read, e.g. `{BASE_INPUT}: model_files.data`)"
                )
            })?;
            let mut policy = rao_policy::hf::load(&ctx.input_dir(&base).await?, backend)?.policy;
            policy
                .load_adapters(&ck)
                .map_err(|e| anyhow::anyhow!("the `{input}` checkpoint's adapters on the `{BASE_INPUT}` model: {e}"))?;
            policy
        }
    };
    let read = async |name: &str| -> anyhow::Result<Option<String>> {
        match a.files.iter().any(|f| f.path == name) {
            true => Ok(Some(String::from_utf8(ctx.read_input_file(&a, name).await?.to_vec())?)),
            false => Ok(None),
        }
    };
    let Some(tokenizer) = read("tokenizer.json").await? else { return Ok(LoadedModel { policy, tokenizer: None }) };
    let files =
        TokenizerFiles { tokenizer, config: read("tokenizer_config.json").await?, chat_template: read("chat_template.jinja").await? };
    let tokenizer = TextTokenizer::from_files(files, &|name| format!("{input} checkpoint: {name}"))?;
    Ok(LoadedModel { policy, tokenizer: Some(Arc::new(tokenizer)) })
}

/// The runtime's policy for a loaded checkpoint: in text through its tokenizer and chat template
/// when it has one (with a prefix cache of `prefix_cache_bytes`), else in the environment's tokens.
pub fn acting_policy(
    model: LoadedModel,
    set: &dyn TaskSet,
    limits: &Limits,
    temperature: f64,
    prefix_cache_bytes: usize,
) -> anyhow::Result<Arc<dyn RuntimePolicy>> {
    let grammar = set.grammar(limits.max_children as usize);
    Ok(match model.tokenizer {
        Some(tokenizer) => Arc::new(
            TextPolicy::new(Arc::new(model.policy), tokenizer, grammar.as_ref(), set.episode(0), temperature, limits.window)?
                .with_prefix_cache(prefix_cache_bytes),
        ),
        None => Arc::new(NeuralPolicy::new(Arc::new(model.policy), grammar, temperature)),
    })
}

/// The grammar an update scores a checkpoint's tokens under: the environment's own, or its text
/// form over the language model's vocabulary.
pub fn training_grammar(model: &LoadedModel, set: &dyn TaskSet, max_children: usize) -> anyhow::Result<Arc<dyn Grammar>> {
    let grammar = set.grammar(max_children);
    Ok(match &model.tokenizer {
        Some(tokenizer) => Arc::new(text_grammar(&model.policy, tokenizer, grammar.as_ref())?),
        None => grammar,
    })
}

pub async fn read_checkpoint(ctx: &StageContext, a: &InputArtifact) -> anyhow::Result<Checkpoint> {
    let meta: CheckpointMeta = serde_json::from_slice(&ctx.read_input_file(a, META_FILE).await?)?;
    Ok(Checkpoint {
        meta,
        params: ctx.read_input_file(a, PARAMS_FILE).await?.to_vec(),
        optim: ctx.read_input_file(a, OPTIM_FILE).await?.to_vec(),
    })
}

/// The model of a checkpoint that acts in the environment's tokens (refusing a language model's).
pub async fn load_policy(ctx: &StageContext, input: &str, backend: Backend) -> anyhow::Result<Policy> {
    let model = load_model(ctx, input, backend).await?;
    anyhow::ensure!(
        model.tokenizer.is_none(),
        "the `{input}` checkpoint is a language model acting in text; this stage works in the environment's tokens"
    );
    Ok(model.policy)
}

/// The sampler's view of a runtime request.
fn sample_request(r: Request) -> SampleRequest {
    SampleRequest { recursive: r.mode.is_recursive(), context: r.context, max_new_tokens: r.max_new_tokens, seed: r.seed }
}

/// Serves a round's batch with one batched, constrained, KV-cached sampling pass.
pub struct NeuralPolicy {
    pub policy: Arc<Policy>,
    pub grammar: Arc<dyn Grammar>,
    pub temperature: f64,
}

impl NeuralPolicy {
    pub fn new(policy: Arc<Policy>, grammar: Arc<dyn Grammar>, temperature: f64) -> Self {
        NeuralPolicy { policy, grammar, temperature }
    }
}

impl RuntimePolicy for NeuralPolicy {
    fn act(&self, batch: Vec<Request>) -> BoxFuture<'_, Vec<Response>> {
        let reqs: Vec<SampleRequest> = batch.into_iter().map(sample_request).collect();
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
}

impl RuntimePolicy for PacedExpert {
    fn act(&self, batch: Vec<Request>) -> BoxFuture<'_, Vec<Response>> {
        let reqs: Vec<SampleRequest> = batch.iter().map(|r| sample_request(r.clone())).collect();
        Box::pin(async move {
            let actions: Vec<Vec<Tok>> = self.expert.act(batch).await.into_iter().map(|r| r.tokens).collect();
            let model = self.model.clone();
            let out = tokio::task::spawn_blocking(move || model.force(&reqs, &actions)).await.expect("forced decoding panicked");
            out.into_iter().map(|(tokens, logprobs)| Response { tokens, logprobs, model: None }).collect()
        })
    }
}
