//! `text_model`: a new small language model for an environment, made here — no weights to
//! download. A byte-level BPE tokenizer is trained (Hugging Face's `tokenizers`) on the text of
//! the environment's conversations (the scripted expert's, recursive and flat, on the `tasks`
//! input, rendered with a ChatML template), and a Qwen3-family model of the given shape starts
//! from random weights. The checkpoint acts in text like `hf_model`'s, and `hf_export` writes it
//! as a directory transformers loads.

use futures::future::BoxFuture;
use rao_agent::RunMeta;
use rao_envs::text::conversation;
use rao_pipeline::{InputDecl, StageContext, TypedStage};
use rao_policy::hf::{TextTokenizer, TokenizerFiles};
use rao_policy::{Backend, ModelConfig, Policy};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::envs::{self, ExpertSpec};
use crate::neural::write_checkpoint;
use crate::rollout::{LimitParams, Mode, rollout_trees};

/// ChatML, as Qwen writes it: each message `<|im_start|>ROLE\nCONTENT<|im_end|>\n`.
const CHAT_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
const SPECIAL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelShape {
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention); absent: as many as query heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_kv_heads: Option<usize>,
    pub d_ff: usize,
}

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TextModelParams {
    pub model: ModelShape,
    /// The rotary base: Qwen3's own 1,000,000 suits its 128-wide heads over long contexts; a
    /// small model's narrow heads see positions a few hundred tokens apart better with 10,000.
    #[serde(default = "rope_theta")]
    pub rope_theta: f64,
    /// Tokens of the BPE vocabulary (its three special tokens included).
    #[serde(default = "vocab_size")]
    pub vocab_size: usize,
    /// Whether the tokenizer's merges stay within words (as GPT-2's and Qwen's do) or may cross
    /// them, so that the instructions every conversation repeats take a few tokens.
    #[serde(default)]
    pub merges: Merges,
    /// Limits of the expert's trees whose conversations make the tokenizer's corpus.
    #[serde(default)]
    pub limits: LimitParams,
    #[serde(default)]
    pub backend: Backend,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Merges {
    #[default]
    WithinWords,
    AcrossWords,
}

fn rope_theta() -> f64 {
    1e6
}

fn vocab_size() -> usize {
    1024
}

pub struct TextModelKind;

impl TypedStage for TextModelKind {
    fn check(p: &TextModelParams, _inputs: &[&str]) -> Vec<rao_pipeline::ParamError> {
        p.limits.check("limits")
    }
    fn code() -> &'static str {
        crate::code::of("text_model")
    }
    fn machine_profile(p: &Self::Params) -> String {
        rao_policy::machine_profile(p.backend)
    }
    type Params = TextModelParams;
    const NAME: &'static str = crate::kinds::TEXT_MODEL;
    const VERSION: u32 = 1;
    const DESCRIBE: &'static str = "a new small Qwen3-family model with a BPE tokenizer trained on the environment's conversations";
    const INPUTS: &'static [InputDecl] = &[InputDecl { name: "tasks", required: true }];
    const OUTPUTS: &'static [&'static str] = &["checkpoint"];

    fn run(ctx: StageContext, p: TextModelParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            let set = envs::load(&ctx, "tasks").await?;
            let episode = set.episode(0);
            // The corpus: every node's whole conversation, as the template renders it.
            let expert = set.expert(ExpertSpec { delegate: 0.5, noise: 0.05, seed: ctx.seed }, &p.limits.limits(Mode::Recursive));
            let template = rao_policy::hf::chat::ChatTemplate::new(CHAT_TEMPLATE.into(), None, Some("<|im_end|>".into()))
                .map_err(|e| anyhow::anyhow!(e))?;
            let mut corpus = Vec::new();
            for mode in [Mode::Recursive, Mode::Flat] {
                let trees =
                    rollout_trees(set.as_ref(), &set.all(), expert.clone(), mode, 1, p.limits.limits(mode), RunMeta::default(), ctx.seed)
                        .await;
                for n in trees.iter().flatten() {
                    let (tokens, _, _) = n.sequence();
                    if let Some(messages) = conversation(episode.as_ref(), &tokens) {
                        corpus.push(template.render(&serde_json::to_value(&messages)?, false)?);
                    }
                }
            }
            anyhow::ensure!(!corpus.is_empty(), "the expert made no conversations on these tasks to train a tokenizer on");
            let config = serde_json::json!({
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": null,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": CHAT_TEMPLATE,
            });
            let files = TokenizerFiles::train_bpe(&corpus, p.vocab_size, &SPECIAL, config, p.merges == Merges::AcrossWords)?;
            let tokenizer = TextTokenizer::from_files(files, &|name| format!("the trained {name}"))?;
            let stop = tokenizer.token_id("<|im_end|>").ok_or_else(|| anyhow::anyhow!("the tokenizer lost its <|im_end|>"))?;
            let cfg = ModelConfig {
                vocab: tokenizer.vocab_size(),
                d_model: p.model.d_model,
                n_layers: p.model.n_layers,
                n_heads: p.model.n_heads,
                d_ff: p.model.d_ff,
                n_kv_heads: p.model.n_kv_heads,
                qk_norm: true,
                norm_eps: 1e-6,
                rope_theta: p.rope_theta,
                ..ModelConfig::tiny()
            };
            let mut policy = Policy::new(cfg, p.backend, ctx.seed)?;
            policy.stop_tokens = vec![stop];
            ctx.set_metric("corpus_conversations", corpus.len() as f64);
            ctx.set_metric("vocabulary", tokenizer.vocab_size() as f64);
            ctx.set_metric("parameters", policy.model.num_params() as f64);
            write_checkpoint(&ctx, "checkpoint", &policy.checkpoint(), Some(&tokenizer))
        })
    }
}
