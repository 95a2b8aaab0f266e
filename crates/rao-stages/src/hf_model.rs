//! `hf_model`: a Hugging Face causal language model as published — a `dataset` of its directory
//! (`config.json`, safetensors weights, `tokenizer.json`, `tokenizer_config.json` with the chat
//! template, `generation_config.json`), from a local folder or a bucket — as a checkpoint the RL
//! stages take. `rollout` and `evaluate` with `policy: checkpoint` then act in text through its
//! chat template and the environment's grammar over its vocabulary; `update` fine-tunes it on its
//! own trees (every weight, in f32: for models that fit a CPU's memory several times over).

use futures::future::BoxFuture;
use rao_pipeline::{InputDecl, ParamError, StageContext, TypedStage, Upstream};
use rao_policy::Backend;
use rao_policy::hf;
use rao_policy::lora::LoraConfig;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::neural::write_checkpoint;

#[derive(Debug, Deserialize, serde::Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HfModelParams {
    /// Where the weights are read into (the checkpoint is the same either way).
    #[serde(default)]
    pub backend: Backend,
    /// Train LoRA adapters instead of every weight: the checkpoint (and every later one) holds
    /// the adapters and their optimiser state only, and the stages that load it take the base
    /// model's files as input `base` (this stage's `files`). Initialised from the run's seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
}

pub struct HfModel;

impl TypedStage for HfModel {
    fn code() -> &'static str {
        crate::code::of("hf_model")
    }
    type Params = HfModelParams;
    const NAME: &'static str = crate::kinds::HF_MODEL;
    const VERSION: u32 = 1;
    const DESCRIBE: &'static str = "a Hugging Face causal LM directory (a dataset's files) as a checkpoint that acts in text";
    const INPUTS: &'static [InputDecl] = &[InputDecl { name: "files", required: true }];
    const OUTPUTS: &'static [&'static str] = &["checkpoint"];

    /// A model folder read from a local path is checked before anything runs: a family rao
    /// loads, a tokenizer with a chat template, and weights.
    fn check_upstream(_p: &HfModelParams, upstream: &dyn Fn() -> Vec<Upstream>) -> Vec<ParamError> {
        let ups = upstream();
        let Some(files) = ups.iter().find(|u| u.kind == rao_pipeline::dataset::Dataset::NAME) else { return Vec::new() };
        let Some(url) = files.params.get("url").and_then(serde_json::Value::as_str).filter(|u| !u.contains("://")) else {
            return Vec::new();
        };
        let dir = files.base_dir.join(url);
        if !dir.is_dir() {
            return Vec::new(); // the dataset stage says what is wrong with its path
        }
        match model_folder_problem(&dir) {
            None => Vec::new(),
            Some(problem) => vec![ParamError {
                key: None,
                message: format!("the model folder `{url}` (dataset `{}`): {problem}", files.stage),
                help: Some(
                    "give a Hugging Face causal LM folder as published: config.json (llama, qwen2 or qwen3), tokenizer.json with a chat template, model.safetensors or its shards and index".into(),
                ),
            }],
        }
    }

    fn run(ctx: StageContext, p: HfModelParams) -> BoxFuture<'static, anyhow::Result<()>> {
        Box::pin(async move {
            let files = ctx.input("files")?.first().ok_or_else(|| anyhow::anyhow!("input `files` is empty"))?.clone();
            let dir = ctx.input_dir(&files).await?;
            let mut model = hf::load(&dir, p.backend)?;
            if let Some(lora) = p.lora {
                model.policy.add_lora(lora, ctx.seed)?;
            }
            let tokenizer = model.tokenizer.ok_or_else(|| {
                anyhow::anyhow!("the model directory has no tokenizer.json: a model that acts in text needs its tokenizer")
            })?;
            anyhow::ensure!(
                tokenizer.chat.is_some(),
                "the model's tokenizer has no chat template (tokenizer_config.json's `chat_template` or chat_template.jinja): \
                 rao renders each node's conversation through it"
            );
            let cfg = &model.policy.cfg;
            ctx.set_metric("trainable_parameters", model.policy.trainable_params().iter().map(|p| p.len()).sum::<usize>() as f64);
            ctx.set_metric("vocabulary", cfg.vocab as f64);
            ctx.note(format!("{:?}: {} layers, width {}, {} ids", model.family, cfg.n_layers, cfg.d_model, cfg.vocab));
            write_checkpoint(&ctx, "checkpoint", &model.policy.checkpoint(), Some(&tokenizer))
        })
    }
}

/// What makes `dir` not a model rao loads, read from its small files only.
fn model_folder_problem(dir: &std::path::Path) -> Option<String> {
    if let Err(e) = hf::read_config(dir) {
        return Some(format!("{e:#}"));
    }
    if !dir.join("tokenizer.json").is_file() {
        return Some("no tokenizer.json: a model that acts in text needs its tokenizer".into());
    }
    let chat = dir.join("chat_template.jinja").is_file()
        || std::fs::read_to_string(dir.join("tokenizer_config.json")).is_ok_and(|t| t.contains("\"chat_template\""));
    if !chat {
        return Some("no chat template (tokenizer_config.json's `chat_template` or chat_template.jinja)".into());
    }
    if !(dir.join("model.safetensors").is_file() || dir.join("model.safetensors.index.json").is_file()) {
        return Some("no weights: neither model.safetensors nor model.safetensors.index.json".into());
    }
    None
}
