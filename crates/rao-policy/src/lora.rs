//! LoRA: low-rank adapters on the attention and MLP projections, through Burn's own LoRA
//! reparameterisation (`Module::apply_lora`): an adapted weight reads as `W + (α/r)·A·B` with `W`
//! frozen, so the model code (and the fused kernels, which take the composed weight) is
//! unchanged. Only the factors are trained, kept in the optimiser and checkpointed; they export
//! in PEFT's format (`adapter_config.json` + `adapter_model.safetensors`) or merged into the base.

use std::path::Path;

use burn::module::{Lora, Module, ModuleMapper, ModuleVisitor, Param, ParamGroup};
use burn::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::hf::weights::{tensor_layout, transpose, write_safetensors};
use crate::model::{ModelConfig, Transformer};
use crate::params::param_id;

/// Adapter settings (PEFT's names and meaning: the update is `(alpha / rank)·B·A·x`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    pub rank: usize,
    pub alpha: f64,
    /// The projections that get adapters.
    pub targets: Vec<LoraTarget>,
    /// Dropout on the adapters' input while training. Only 0 is supported: dropout would make
    /// the log-probs a training step computes differ from those recorded while sampling.
    #[serde(default)]
    pub dropout: f64,
}

/// A projection of every block, by its Hugging Face / PEFT module name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LoraTarget {
    QProj,
    KProj,
    VProj,
    OProj,
    GateProj,
    UpProj,
    DownProj,
}

impl LoraTarget {
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::QProj,
        LoraTarget::KProj,
        LoraTarget::VProj,
        LoraTarget::OProj,
        LoraTarget::GateProj,
        LoraTarget::UpProj,
        LoraTarget::DownProj,
    ];

    /// The module name (`q_proj`, …) PEFT's `target_modules` lists.
    pub fn module_name(self) -> &'static str {
        match self {
            LoraTarget::QProj => "q_proj",
            LoraTarget::KProj => "k_proj",
            LoraTarget::VProj => "v_proj",
            LoraTarget::OProj => "o_proj",
            LoraTarget::GateProj => "gate_proj",
            LoraTarget::UpProj => "up_proj",
            LoraTarget::DownProj => "down_proj",
        }
    }

    /// Whether a checkpoint tensor name is this projection's weight.
    fn is_weight(self, tensor: &str) -> bool {
        tensor.ends_with(&format!(".{}.weight", self.module_name()))
    }
}

impl LoraConfig {
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.rank >= 1, "LoRA rank must be at least 1");
        anyhow::ensure!(self.alpha.is_finite() && self.alpha > 0.0, "LoRA alpha must be positive");
        anyhow::ensure!(!self.targets.is_empty(), "LoRA needs at least one target projection");
        anyhow::ensure!(
            self.dropout == 0.0,
            "LoRA dropout {} is not supported: with dropout the training log-probs differ from the sampled ones (set it to 0)",
            self.dropout
        );
        Ok(())
    }
}

/// What each parameter of an adapted model is, in visit order: a (frozen) base weight with its
/// index among the base parameters, or an adapter factor of the base weight at that index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    Base(usize),
    A(usize),
    B(usize),
}

/// The visit order of `cfg`'s model with adapters on `targets` (Burn visits an adapted weight,
/// then its `A`, then its `B`).
pub fn slots(cfg: &ModelConfig, lora: &LoraConfig) -> Vec<Slot> {
    let mut out = Vec::new();
    for (i, t) in tensor_layout(cfg).iter().enumerate() {
        out.push(Slot::Base(i));
        if lora.targets.iter().any(|x| x.is_weight(&t.name)) {
            out.extend([Slot::A(i), Slot::B(i)]);
        }
    }
    out
}

/// Adds adapters to `model` (whose parameter ids are the fixed visit-order ids,
/// [`param_id`]): every base parameter frozen, `A` drawn as PEFT draws it (uniform in
/// ±1/√in, from `seed`), `B = 0` (so the model computes what it did), ids renumbered in visit
/// order.
pub fn apply(model: Transformer, cfg: &ModelConfig, lora: &LoraConfig, seed: u64) -> anyhow::Result<Transformer> {
    lora.check()?;
    anyhow::ensure!(!cfg.prev_token, "LoRA is for the Hugging Face families (a model without prev_token)");
    let slots = slots(cfg, lora);
    let targets: Vec<_> = slots.iter().filter_map(|s| if let Slot::A(i) = s { Some(param_id(*i)) } else { None }).collect();
    let mut rng = rao_envs::rng::Rng::new(seed);
    let model = model.apply_lora(Lora::new(lora.rank, lora.alpha).set_param_group(ParamGroup::from_ids(targets)));
    Ok(map_slots(model, &slots, |slot, [d_in, d_out], device| match slot {
        Slot::A(_) => {
            let bound = 1.0 / (d_in as f64).sqrt();
            let v: Vec<f32> = (0..d_in * d_out).map(|_| ((rng.f64() * 2.0 - 1.0) * bound) as f32).collect();
            Tensor::from_data(TensorData::new(v, [d_in, d_out]), device)
        }
        _ => Tensor::zeros([d_in, d_out], device),
    }))
}

/// Every adapter factor replaced by a fresh trainable tensor `f(slot, shape, device)`; base
/// parameters keep their values and frozen state; all ids set to the visit order.
fn map_slots(model: Transformer, slots: &[Slot], f: impl FnMut(Slot, [usize; 2], &burn::tensor::Device) -> Tensor<2>) -> Transformer {
    struct Map<'a, F> {
        slots: &'a [Slot],
        f: F,
        next: usize,
    }
    impl<F: FnMut(Slot, [usize; 2], &burn::tensor::Device) -> Tensor<2>> ModuleMapper for Map<'_, F> {
        fn map_float<const D: usize>(&mut self, mut param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let slot = self.slots[self.next];
            let id = param_id(self.next);
            self.next += 1;
            if !matches!(slot, Slot::Base(_)) {
                let t = param.val();
                let (dims, device) = (t.dims(), t.device());
                assert_eq!(D, 2, "adapter factors are matrices");
                let fresh = (self.f)(slot, [dims[0], dims[1]], &device);
                param = Param::from_tensor(fresh.reshape(dims));
            }
            param.id = id;
            param
        }
    }
    model.map(&mut Map { slots, f, next: 0 })
}

/// Which parameters (visit order) are trained: all of a plain model, the factors of an adapted
/// one.
pub fn trainable(model: &Transformer) -> Vec<bool> {
    struct Trainable(Vec<bool>);
    impl ModuleVisitor for Trainable {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.is_require_grad());
        }
    }
    let mut v = Trainable(Vec::new());
    model.visit(&mut v);
    v.0
}

/// Writes the adapters of `values` (the trainable parameters, visit order: each target's `A`
/// `[in, r]` then `B` `[r, out]`) as a PEFT adapter directory that `peft` loads onto the base
/// checkpoint `base` (its `base_model_name_or_path`).
pub fn export_peft(cfg: &ModelConfig, lora: &LoraConfig, factors: &[Vec<f32>], base: &str, out: &Path) -> anyhow::Result<()> {
    let layout = tensor_layout(cfg);
    let pairs: Vec<usize> = slots(cfg, lora).iter().filter_map(|s| if let Slot::A(i) = s { Some(*i) } else { None }).collect();
    anyhow::ensure!(factors.len() == 2 * pairs.len(), "{} factor tensors for {} adapters", factors.len(), pairs.len());
    std::fs::create_dir_all(out).map_err(|e| anyhow::anyhow!("{}: {e}", out.display()))?;
    let mut tensors = Vec::new();
    for (k, &i) in pairs.iter().enumerate() {
        // The checkpoint weight is `[out, in]`; PEFT's A is `[r, in]` (= our `[in, r]` transposed),
        // B is `[out, r]` (= our `[r, out]` transposed).
        let (d_out, d_in) = (layout[i].shape[0], layout[i].shape[1]);
        let module = layout[i].name.strip_suffix(".weight").expect("weights end in .weight");
        tensors.push((
            format!("base_model.model.{module}.lora_A.weight"),
            vec![lora.rank, d_in],
            transpose(&factors[2 * k], d_in, lora.rank),
        ));
        tensors.push((
            format!("base_model.model.{module}.lora_B.weight"),
            vec![d_out, lora.rank],
            transpose(&factors[2 * k + 1], lora.rank, d_out),
        ));
    }
    write_safetensors(&out.join("adapter_model.safetensors"), &tensors)?;
    let config = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": lora.targets.iter().map(|t| t.module_name()).collect::<Vec<_>>(),
        "bias": "none",
        "fan_in_fan_out": false,
        "use_rslora": false,
        "inference_mode": true,
    });
    let path = out.join("adapter_config.json");
    std::fs::write(&path, serde_json::to_string_pretty(&config)? + "\n").map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Bytes of a checkpoint of adapters (factors and their two AdamW moments, f32) for a model of
/// `cfg`'s sizes: what [`crate::policy::Policy::checkpoint`] writes for an adapted policy.
pub fn checkpoint_bytes(cfg: &ModelConfig, lora: &LoraConfig) -> usize {
    let layout = tensor_layout(cfg);
    let factors: usize = slots(cfg, lora)
        .iter()
        .filter_map(|s| if let Slot::A(i) = s { Some(lora.rank * (layout[*i].shape[0] + layout[*i].shape[1])) } else { None })
        .sum();
    3 * 4 * factors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapter_checkpoint_of_a_half_billion_parameter_base() {
        // Qwen2.5-0.5B's shapes; rank 32 on every projection (the RAO authors' LoRA rank).
        let cfg = ModelConfig {
            vocab: 151_936,
            d_model: 896,
            n_layers: 24,
            n_heads: 14,
            d_ff: 4864,
            n_kv_heads: Some(2),
            head_dim: Some(64),
            qkv_bias: true,
            ..ModelConfig::tiny()
        };
        let lora = LoraConfig { rank: 32, alpha: 64.0, targets: LoraTarget::ALL.to_vec(), dropout: 0.0 };
        let bytes = checkpoint_bytes(&cfg, &lora);
        // 24 layers × 32 × (q 896+896, k 896+128, v 896+128, o 896+896, gate/up 896+4864 each,
        // down 4864+896) = 17.6M factors; with AdamW's two moments, f32.
        assert_eq!(bytes, 3 * 4 * 24 * 32 * (1792 + 1024 + 1024 + 1792 + 3 * 5760));
        println!("LoRA r=32 checkpoint of a Qwen2.5-0.5B base: {:.1} MB", bytes as f64 / 1e6);
    }
}
