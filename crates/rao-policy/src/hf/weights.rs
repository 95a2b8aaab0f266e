//! Hugging Face tensor names ↔ the model's parameters, and reading/writing them as safetensors.
//! [`tensor_layout`] is the one table both directions use.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use super::files::read_json;
use crate::model::ModelConfig;

/// How a parameter sits in the checkpoint: as the model holds it, or transposed (PyTorch's
/// linear layers store `[out, in]`, the model `[in, out]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    AsIs,
    Transposed,
}

/// One checkpoint tensor: its name, its shape in the file, and its layout.
#[derive(Debug, Clone)]
pub struct HfTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub layout: Layout,
}

/// The checkpoint tensors of a model, in the visit order of its parameters
/// ([`crate::params::read_params`]).
pub fn tensor_layout(cfg: &ModelConfig) -> Vec<HfTensor> {
    let (d, f, v, dh) = (cfg.d_model, cfg.d_ff, cfg.vocab, cfg.head_dim());
    let (dq, dkv) = cfg.attention_widths();
    let t = |name: String, shape: Vec<usize>, layout| HfTensor { name, shape, layout };
    let mut out = vec![t("model.embed_tokens.weight".into(), vec![v, d], Layout::AsIs)];
    for i in 0..cfg.n_layers {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        out.push(t(p("input_layernorm.weight"), vec![d], Layout::AsIs));
        for (proj, width) in [("q_proj", dq), ("k_proj", dkv), ("v_proj", dkv)] {
            out.push(t(p(&format!("self_attn.{proj}.weight")), vec![width, d], Layout::Transposed));
            if cfg.qkv_bias {
                out.push(t(p(&format!("self_attn.{proj}.bias")), vec![width], Layout::AsIs));
            }
        }
        out.push(t(p("self_attn.o_proj.weight"), vec![d, dq], Layout::Transposed));
        out.push(t(p("post_attention_layernorm.weight"), vec![d], Layout::AsIs));
        out.push(t(p("mlp.gate_proj.weight"), vec![f, d], Layout::Transposed));
        out.push(t(p("mlp.up_proj.weight"), vec![f, d], Layout::Transposed));
        out.push(t(p("mlp.down_proj.weight"), vec![d, f], Layout::Transposed));
        if cfg.qk_norm {
            out.push(t(p("self_attn.q_norm.weight"), vec![dh], Layout::AsIs));
            out.push(t(p("self_attn.k_norm.weight"), vec![dh], Layout::AsIs));
        }
    }
    out.push(t("model.norm.weight".into(), vec![d], Layout::AsIs));
    if cfg.untied_head {
        out.push(t("lm_head.weight".into(), vec![v, d], Layout::Transposed));
    }
    out
}

/// `model.safetensors.index.json`: which shard holds each tensor.
#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

/// The safetensors files of a checkpoint directory: `model.safetensors`, or the shards its index
/// names.
fn weight_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let (idx, _): (ShardIndex, _) = read_json(&index)?;
        let mut files: Vec<&String> = idx.weight_map.values().collect();
        files.sort();
        files.dedup();
        return files
            .into_iter()
            .map(|f| {
                // A shard is a file beside the index, never a path elsewhere.
                anyhow::ensure!(
                    !f.is_empty() && !f.contains(['/', '\\']) && f != ".." && f.ends_with(".safetensors"),
                    "{}: shard `{f}` must be a `.safetensors` file name in the same directory",
                    index.display()
                );
                Ok(dir.join(f))
            })
            .collect();
    }
    let single = dir.join("model.safetensors");
    anyhow::ensure!(single.exists(), "{}: no model.safetensors and no model.safetensors.index.json", dir.display());
    Ok(vec![single])
}

/// Tensors that checkpoints may hold and the model has no use for.
fn ignorable(name: &str, cfg: &ModelConfig) -> bool {
    name.ends_with(".rotary_emb.inv_freq") || (!cfg.untied_head && name == "lm_head.weight")
}

/// Every parameter of the model `cfg` describes, in visit order, read from the checkpoint's
/// safetensors files (f32, bf16 or f16) as f32. Shapes are checked against `config.json` from the
/// files' headers before any tensor is converted; unknown tensors are errors (a tensor the model
/// would ignore, e.g. a bias, means the model is not the one the file holds).
pub fn read_weights(dir: &Path, cfg: &ModelConfig) -> anyhow::Result<Vec<Vec<f32>>> {
    let layout = tensor_layout(cfg);
    let slot: HashMap<&str, usize> = layout.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
    let mut values: Vec<Option<Vec<f32>>> = vec![None; layout.len()];
    for file in weight_files(dir)? {
        let bytes = std::fs::read(&file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        let st =
            SafeTensors::deserialize(&bytes).map_err(|e| anyhow::anyhow!("{}: not a readable safetensors file ({e})", file.display()))?;
        let mut names = st.names();
        names.sort();
        for name in names {
            let view = st.tensor(name).map_err(|e| anyhow::anyhow!("{}: tensor `{name}`: {e}", file.display()))?;
            let Some(&i) = slot.get(name) else {
                anyhow::ensure!(
                    ignorable(name, cfg),
                    "{}: tensor `{name}` is not part of the model config.json describes (check model_type, attention_bias, tie_word_embeddings)",
                    file.display()
                );
                continue;
            };
            let want = &layout[i];
            anyhow::ensure!(
                view.shape() == want.shape.as_slice(),
                "{}: tensor `{name}` has shape {:?}, config.json implies {:?}",
                file.display(),
                view.shape(),
                want.shape
            );
            anyhow::ensure!(values[i].is_none(), "{}: tensor `{name}` appears in more than one file", file.display());
            let flat = to_f32(view.dtype(), view.data()).map_err(|e| anyhow::anyhow!("{}: tensor `{name}`: {e}", file.display()))?;
            values[i] = Some(match want.layout {
                Layout::AsIs => flat,
                Layout::Transposed => transpose(&flat, want.shape[0], want.shape[1]),
            });
        }
    }
    let missing: Vec<&str> = layout.iter().zip(&values).filter(|(_, v)| v.is_none()).map(|(t, _)| t.name.as_str()).collect();
    anyhow::ensure!(
        missing.is_empty(),
        "{}: the checkpoint lacks {} tensor(s) config.json implies, e.g. `{}`",
        dir.display(),
        missing.len(),
        missing[0]
    );
    Ok(values.into_iter().map(|v| v.expect("checked above")).collect())
}

/// Little-endian f32, bf16 or f16 values as f32.
fn to_f32(dtype: Dtype, data: &[u8]) -> Result<Vec<f32>, String> {
    Ok(match dtype {
        Dtype::F32 => data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::BF16 => data.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::F16 => data.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        other => return Err(format!("dtype {other:?} is not supported (f32, bf16 or f16)")),
    })
}

/// A row-major `[rows, cols]` matrix transposed.
pub(crate) fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = m[r * cols + c];
        }
    }
    out
}

/// Writes parameters (visit order) as one `model.safetensors` in the checkpoint layout, in f32.
pub fn write_weights(path: &Path, cfg: &ModelConfig, values: &[Vec<f32>]) -> anyhow::Result<()> {
    let layout = tensor_layout(cfg);
    anyhow::ensure!(layout.len() == values.len(), "{} parameters for {} checkpoint tensors", values.len(), layout.len());
    let tensors = layout
        .into_iter()
        .zip(values)
        .map(|(t, v)| {
            let v = match t.layout {
                Layout::AsIs => v.clone(),
                // The model holds `[in, out]` = the file's `[out, in]` transposed.
                Layout::Transposed => transpose(v, t.shape[1], t.shape[0]),
            };
            (t.name, t.shape, v)
        })
        .collect::<Vec<_>>();
    write_safetensors(path, &tensors)
}

/// Writes named f32 tensors `(name, shape, row-major values)` as a safetensors file (PyTorch's
/// metadata, as transformers and peft write them).
pub(crate) fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) -> anyhow::Result<()> {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| Ok((name.clone(), safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), b)?)))
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(metadata), path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposes_round_trip() {
        let m: Vec<f32> = (0..6).map(|x| x as f32).collect();
        let t = transpose(&m, 2, 3);
        assert_eq!(t, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert_eq!(transpose(&t, 3, 2), m);
    }
}
