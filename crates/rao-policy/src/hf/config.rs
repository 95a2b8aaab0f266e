//! `config.json` of a Hugging Face causal LM → [`ModelConfig`], and back for export. Reads both
//! the layout transformers 4 writes (`rope_theta`, `rope_scaling`) and transformers 5's
//! (`rope_parameters`); refuses, naming the key, what the model here does not implement.

use std::path::Path;

use serde::Deserialize;
use serde_json::json;

use super::files::{locate, read_json};
use crate::model::{ModelConfig, RopeScaling};

/// The model families loaded; each is a variation of one decoder (RMSNorm, rotary positions,
/// grouped-query attention, SwiGLU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Llama 2/3, SmolLM2, TinyLlama.
    Llama,
    /// Qwen2, Qwen2.5: biases on the query, key and value projections.
    Qwen2,
    /// Qwen3: per-head RMSNorm of queries and keys.
    Qwen3,
}

impl Family {
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
        }
    }

    fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    /// The family a model config describes (for export): the features only one family has.
    pub fn of(cfg: &ModelConfig) -> Family {
        if cfg.qk_norm {
            Family::Qwen3
        } else if cfg.qkv_bias {
            Family::Qwen2
        } else {
            Family::Llama
        }
    }
}

/// The fields of `config.json` read here (others are ignored).
#[derive(Deserialize)]
struct RawConfig {
    model_type: String,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<RawRope>,
    rope_parameters: Option<RawRope>,
    tie_word_embeddings: Option<bool>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default)]
    use_sliding_window: bool,
    hidden_act: Option<String>,
    eos_token_id: Option<TokenIds>,
}

/// `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5).
#[derive(Deserialize)]
struct RawRope {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    old_type: Option<String>,
    rope_theta: Option<f64>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
}

/// A token id or a list of them (`eos_token_id` is either).
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    pub fn ids(&self) -> Vec<u32> {
        match self {
            TokenIds::One(t) => vec![*t],
            TokenIds::Many(v) => v.clone(),
        }
    }
}

/// What `config.json` says.
pub struct HfConfig {
    pub family: Family,
    pub model: ModelConfig,
    /// End-of-sequence ids named in `config.json` (generation_config.json usually names them too).
    pub eos: Vec<u32>,
}

/// Sizes past these are not a real model's; refusing them early keeps products from overflowing.
const MAX_DIM: usize = 1 << 24;

/// Reads `config.json` from a checkpoint directory.
pub fn read_config(dir: &Path) -> anyhow::Result<HfConfig> {
    let path = dir.join("config.json");
    let (raw, text): (RawConfig, String) = read_json(&path)?;
    let at = |key: &str| locate(&path, &text, key);
    let family = match raw.model_type.as_str() {
        "llama" => Family::Llama,
        "qwen2" => Family::Qwen2,
        "qwen3" => Family::Qwen3,
        other => {
            anyhow::bail!("{}: model_type `{other}` is not supported; rao loads `llama`, `qwen2` and `qwen3` models", at("model_type"))
        }
    };
    if let Some(act) = &raw.hidden_act {
        anyhow::ensure!(act == "silu", "{}: hidden_act `{act}` is not supported (these families use `silu`)", at("hidden_act"));
    }
    anyhow::ensure!(!raw.mlp_bias, "{}: biases on the MLP projections are not supported", at("mlp_bias"));
    anyhow::ensure!(
        family == Family::Qwen2 || !raw.attention_bias,
        "{}: biases on the attention projections are not supported for {} models",
        at("attention_bias"),
        family.model_type()
    );
    anyhow::ensure!(!raw.use_sliding_window, "{}: sliding-window attention is not supported", at("use_sliding_window"));
    for (key, v) in [
        ("vocab_size", raw.vocab_size),
        ("hidden_size", raw.hidden_size),
        ("intermediate_size", raw.intermediate_size),
        ("num_hidden_layers", raw.num_hidden_layers),
        ("num_attention_heads", raw.num_attention_heads),
        ("num_key_value_heads", raw.num_key_value_heads.unwrap_or(1)),
        ("head_dim", raw.head_dim.unwrap_or(2)),
    ] {
        anyhow::ensure!((1..=MAX_DIM).contains(&v), "{}: {key} = {v} is out of range (1 to {MAX_DIM})", at(key));
    }
    let rope = raw.rope_parameters.as_ref().or(raw.rope_scaling.as_ref());
    let rope_key = if raw.rope_parameters.is_some() { "rope_parameters" } else { "rope_scaling" };
    let rope_theta = rope.and_then(|r| r.rope_theta).or(raw.rope_theta).unwrap_or(10_000.0);
    let rope_scaling = match rope {
        None => None,
        Some(r) => rope_scaling(r).map_err(|e| anyhow::anyhow!("{}: {rope_key}: {e}", at(rope_key)))?,
    };
    let head_dim = raw.head_dim.unwrap_or(raw.hidden_size / raw.num_attention_heads);
    let model = ModelConfig {
        vocab: raw.vocab_size,
        d_model: raw.hidden_size,
        n_layers: raw.num_hidden_layers,
        n_heads: raw.num_attention_heads,
        d_ff: raw.intermediate_size,
        rope_theta,
        prev_token: false,
        n_kv_heads: Some(raw.num_key_value_heads.unwrap_or(raw.num_attention_heads)),
        head_dim: Some(head_dim),
        qkv_bias: family == Family::Qwen2,
        qk_norm: family == Family::Qwen3,
        untied_head: !raw.tie_word_embeddings.unwrap_or(false),
        norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
        rope_scaling,
    };
    model.check().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(HfConfig { family, model, eos: raw.eos_token_id.map(|e| e.ids()).unwrap_or_default() })
}

fn rope_scaling(r: &RawRope) -> Result<Option<RopeScaling>, String> {
    let kind = r.rope_type.as_deref().or(r.old_type.as_deref()).unwrap_or("default");
    let need =
        |v: Option<f64>, name: &str| v.filter(|x| x.is_finite() && *x > 0.0).ok_or(format!("rope type `{kind}` needs a positive `{name}`"));
    match kind {
        "default" => Ok(None),
        "linear" => Ok(Some(RopeScaling::Linear { factor: need(r.factor, "factor")? })),
        "llama3" => {
            let (low, high) = (need(r.low_freq_factor, "low_freq_factor")?, need(r.high_freq_factor, "high_freq_factor")?);
            if high <= low {
                return Err("llama3 rope scaling needs high_freq_factor > low_freq_factor".into());
            }
            Ok(Some(RopeScaling::Llama3 {
                factor: need(r.factor, "factor")?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: r
                    .original_max_position_embeddings
                    .filter(|n| *n > 0)
                    .ok_or("llama3 rope scaling needs a positive `original_max_position_embeddings`")?,
            }))
        }
        other => Err(format!("rope type `{other}` is not supported (rao implements `default`, `linear` and `llama3`)")),
    }
}

/// `config.json` for a model config, readable by transformers 4 and 5 (and the tools that read
/// the transformers 4 keys).
pub fn config_json(cfg: &ModelConfig, eos: &[u32]) -> serde_json::Value {
    let family = Family::of(cfg);
    let (rope_scaling, mut rope_parameters) = match &cfg.rope_scaling {
        None => (serde_json::Value::Null, json!({"rope_type": "default"})),
        Some(s) => {
            let v = serde_json::to_value(s).expect("rope scaling serialises");
            (v.clone(), v)
        }
    };
    rope_parameters["rope_theta"] = json!(cfg.rope_theta);
    json!({
        "architectures": [family.architecture()],
        "model_type": family.model_type(),
        "vocab_size": cfg.vocab,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.kv_heads(),
        "head_dim": cfg.head_dim(),
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": rope_scaling,
        "rope_parameters": rope_parameters,
        "tie_word_embeddings": !cfg.untied_head,
        "attention_bias": false,
        "use_sliding_window": false,
        "eos_token_id": if eos.len() == 1 { json!(eos[0]) } else { json!(eos) },
        "dtype": "float32",
        "torch_dtype": "float32",
    })
}
