//! Hugging Face causal language models as policies: a checkpoint directory as published
//! (`config.json`, `model.safetensors` or shards with their index, `tokenizer.json`,
//! `tokenizer_config.json`, `generation_config.json`) loads into a [`Policy`] of the same
//! arithmetic as transformers (tests/hf.rs compares logits, greedy decodes and token ids with the
//! reference implementation), and a policy exports as such a directory again.

pub mod chat;
pub mod config;
pub mod constraint;
pub mod files;
pub mod tokenizer;
pub mod weights;

use std::path::Path;

use serde::Deserialize;

pub use config::{Family, HfConfig, read_config};
pub use tokenizer::{TextTokenizer, TokenizerFiles};

use burn::module::Module;

use crate::params::read_params;
use crate::policy::{Backend, Policy};

/// The fields of `generation_config.json` read here.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GenerationConfig {
    pub eos_token_id: Option<config::TokenIds>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<usize>,
}

/// A loaded checkpoint: the policy (model, stop tokens), its family, tokenizer and generation
/// defaults.
pub struct Pretrained {
    pub family: Family,
    pub policy: Policy,
    /// Absent when the directory has no `tokenizer.json`.
    pub tokenizer: Option<TextTokenizer>,
    pub generation: GenerationConfig,
}

/// Loads a checkpoint directory onto `backend` (weights computed in f32).
pub fn load(dir: &Path, backend: Backend) -> anyhow::Result<Pretrained> {
    anyhow::ensure!(dir.is_dir(), "{}: not a directory (a Hugging Face checkpoint directory is expected)", dir.display());
    let HfConfig { family, model, eos } = read_config(dir)?;
    let generation_path = dir.join("generation_config.json");
    let generation: GenerationConfig =
        if generation_path.exists() { files::read_json(&generation_path)?.0 } else { GenerationConfig::default() };
    let tokenizer = if dir.join("tokenizer.json").exists() { Some(TextTokenizer::load(dir)?) } else { None };
    // Stop tokens: generation_config.json's, else config.json's, else the tokenizer's eos token.
    let mut stop: Vec<u32> = generation.eos_token_id.as_ref().map(|e| e.ids()).unwrap_or(eos);
    if stop.is_empty() {
        stop.extend(tokenizer.as_ref().and_then(|t| t.eos_token.as_deref().and_then(|e| t.token_id(e))));
    }
    anyhow::ensure!(!stop.is_empty(), "{}: no end-of-sequence token (set eos_token_id in generation_config.json)", dir.display());
    anyhow::ensure!(
        stop.iter().all(|&t| (t as usize) < model.vocab),
        "{}: an end-of-sequence id of {stop:?} lies outside the vocabulary of {}",
        dir.display(),
        model.vocab
    );
    let values = weights::read_weights(dir, &model)?;
    let policy = Policy::from_values(model, backend, values, stop)?;
    Ok(Pretrained { family, policy, tokenizer, generation })
}

/// Tokenizer files copied along on export, when the source directory has them.
const TOKENIZER_FILES: [&str; 4] = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"];

/// Writes `policy` as a Hugging Face checkpoint directory (`config.json`,
/// `generation_config.json`, `model.safetensors` in f32) that transformers loads as the same
/// model (LoRA adapters merged in); the tokenizer files of `tokenizer_dir` are copied along.
pub fn export(policy: &Policy, tokenizer_dir: Option<&Path>, out: &Path) -> anyhow::Result<()> {
    let cfg = &policy.cfg;
    anyhow::ensure!(!cfg.prev_token, "a model with prev_token has no Hugging Face equivalent");
    std::fs::create_dir_all(out).map_err(|e| anyhow::anyhow!("{}: {e}", out.display()))?;
    let write = |name: &str, v: serde_json::Value| -> anyhow::Result<()> {
        let path = out.join(name);
        std::fs::write(&path, serde_json::to_string_pretty(&v)? + "\n").map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    };
    write("config.json", config::config_json(cfg, &policy.stop_tokens))?;
    write("generation_config.json", serde_json::json!({ "eos_token_id": policy.stop_tokens }))?;
    // Adapters, if any, merged into the weights they adapt.
    weights::write_weights(&out.join("model.safetensors"), cfg, &read_params(&policy.model.clone().materialize()))?;
    if let Some(src) = tokenizer_dir {
        for name in TOKENIZER_FILES {
            let from = src.join(name);
            if from.exists() {
                std::fs::copy(&from, out.join(name)).map_err(|e| anyhow::anyhow!("{} → {}: {e}", from.display(), out.display()))?;
            }
        }
    }
    Ok(())
}
