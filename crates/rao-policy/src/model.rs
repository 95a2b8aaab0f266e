//! A small decoder-only transformer: RMSNorm, rotary positions, causal self-attention,
//! gated (SwiGLU) MLP, tied input/output embeddings.

use burn::module::{Module, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig, SwiGlu, SwiGluConfig};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::kernels;

/// Sizes of the policy (set from the pipeline file, or read from a Hugging Face `config.json`).
/// The fields after `prev_token` describe the Llama/Qwen families; left out, they give rao's own
/// small model (one head width `d_model / n_heads`, as many key/value heads as query heads, no
/// biases, tied output layer), and they are left out of serialised configs so its checkpoints
/// and fingerprints do not change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Vocabulary size (taken from the environment; 0 in a pipeline file means "from the world").
    #[serde(default)]
    pub vocab: usize,
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub d_ff: usize,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// Add a learned projection of the previous token's embedding to each position's input (a
    /// one-token "shift", as in RWKV's token shift or the smeared keys of the induction-head
    /// literature), so one attention layer can find "the token after X". Looking a fact up on a
    /// page is that step; without it a two-layer model did not learn it (README, multi-hop).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prev_token: bool,
    /// Key/value heads (grouped-query attention; each serves `n_heads / n_kv_heads` query heads).
    /// Absent: as many as query heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_kv_heads: Option<usize>,
    /// Width of one head. Absent: `d_model / n_heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Biases on the query, key and value projections (Qwen2).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qkv_bias: bool,
    /// An RMSNorm over each head of the queries and keys before the rotation (Qwen3).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm: bool,
    /// An output layer of its own instead of the transposed input embedding.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub untied_head: bool,
    /// The RMSNorms' epsilon.
    #[serde(default = "default_eps", skip_serializing_if = "is_default_eps")]
    pub norm_eps: f64,
    /// How rotary frequencies are rescaled for long contexts (Hugging Face's `rope_scaling`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
}

/// Rotary frequency rescaling, as Hugging Face's `rope_scaling` / `rope_parameters` name it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "rope_type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RopeScaling {
    /// Every frequency divided by `factor` (position interpolation).
    Linear { factor: f64 },
    /// Llama 3.1's: low frequencies divided by `factor`, high ones kept, a smooth blend between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: usize },
}

fn default_theta() -> f64 {
    10_000.0
}

fn default_eps() -> f64 {
    1e-6
}

fn is_default_eps(eps: &f64) -> bool {
    *eps == default_eps()
}

impl ModelConfig {
    pub fn tiny() -> Self {
        ModelConfig {
            vocab: 0,
            d_model: 64,
            n_layers: 2,
            n_heads: 4,
            d_ff: 192,
            rope_theta: default_theta(),
            prev_token: false,
            n_kv_heads: None,
            head_dim: None,
            qkv_bias: false,
            qk_norm: false,
            untied_head: false,
            norm_eps: default_eps(),
            rope_scaling: None,
        }
    }
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.d_model / self.n_heads.max(1))
    }
    pub fn kv_heads(&self) -> usize {
        self.n_kv_heads.unwrap_or(self.n_heads)
    }
    /// Width of the queries (`n_heads · head_dim`) and of the keys and values.
    pub fn attention_widths(&self) -> (usize, usize) {
        (self.n_heads * self.head_dim(), self.kv_heads() * self.head_dim())
    }

    /// The sizes are usable: heads split evenly, even head widths, nothing zero.
    pub fn check(&self) -> Result<(), String> {
        let (h, kv, dh) = (self.n_heads, self.kv_heads(), self.head_dim());
        if self.d_model == 0 || self.n_layers == 0 || h == 0 || self.d_ff == 0 || kv == 0 || dh == 0 {
            return Err("d_model, n_layers, n_heads, n_kv_heads, head_dim and d_ff must all be at least 1".into());
        }
        if self.head_dim.is_none() && !self.d_model.is_multiple_of(h) {
            return Err(format!("d_model {} does not split into {h} heads", self.d_model));
        }
        if dh % 2 != 0 {
            return Err(format!("the head width {dh} must be even (rotary positions rotate pairs)"));
        }
        if h % kv != 0 {
            return Err(format!("{h} query heads do not split into groups of {kv} key/value heads"));
        }
        let theta_ok = self.rope_theta.is_finite() && self.rope_theta > 0.0;
        let eps_ok = self.norm_eps.is_finite() && self.norm_eps >= 0.0;
        if !theta_ok || !eps_ok {
            return Err("rope_theta must be positive and the norm epsilon non-negative".into());
        }
        Ok(())
    }

    /// Rotary inverse frequencies, one per pair of a head's dimensions.
    pub fn inv_freq(&self) -> Vec<f64> {
        let dh = self.head_dim();
        let base: Vec<f64> = (0..dh / 2).map(|i| 1.0 / self.rope_theta.powf(2.0 * i as f64 / dh as f64)).collect();
        match &self.rope_scaling {
            None => base,
            Some(RopeScaling::Linear { factor }) => base.iter().map(|f| f / factor).collect(),
            Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => base
                .iter()
                .map(|&f| {
                    let old = *original_max_position_embeddings as f64;
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < old / high_freq_factor {
                        f
                    } else if wavelen > old / low_freq_factor {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect(),
        }
    }
}

#[derive(Module, Debug)]
pub struct Block {
    pub norm_attn: RmsNorm,
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    pub wo: Linear,
    pub norm_mlp: RmsNorm,
    pub mlp: SwiGlu,
    pub down: Linear,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Per-head RMSNorms of the queries and keys (config `qk_norm`).
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
}

#[derive(Module, Debug)]
pub struct Transformer {
    pub embed: Embedding,
    pub blocks: Vec<Block>,
    pub norm: RmsNorm,
    pub n_heads: usize,
    pub d_model: usize,
    pub rope_theta: f64,
    /// `[D, D]`: the previous token's embedding, projected, joins each input (config `prev_token`).
    pub prev_mix: Option<Linear>,
    /// `[D, V]`: the output layer when it is not the transposed embedding (config `untied_head`).
    pub lm_head: Option<Linear>,
    /// Rotary inverse frequencies ([`ModelConfig::inv_freq`]).
    #[module(skip)]
    pub inv_freq: Vec<f64>,
}

/// Per-layer keys and values of everything seen so far.
#[derive(Default)]
pub struct KvCache {
    pub layers: Vec<Option<LayerKv>>,
}

/// One layer's cached keys and values: tensors `[B, H_kv, S, Dh]` on any backend, or host rows
/// for the fused CPU kernel.
pub enum LayerKv {
    /// Keys and values (boxed: two tensors are large next to the host rows).
    Tensors(Box<(Tensor<4>, Tensor<4>)>),
    Rows(kernels::KvRows),
}

/// Rotary tables for explicit positions, one row `[Dh]` per projected row (each pair's angle twice:
/// rotate-half pairs dimension `j` with `j + Dh/2`); every head of a row shares it.
pub fn rope_tables(positions: &[Vec<usize>], inv_freq: &[f64], device: &Device) -> (Tensor<2>, Tensor<2>) {
    let rows: usize = positions.iter().map(|p| p.len()).sum();
    let half = inv_freq.len();
    let dh = 2 * half;
    // Angles once per distinct position (the rows of a batch share positions 0..T).
    let mut by_pos: std::collections::HashMap<usize, (Vec<f32>, Vec<f32>)> = Default::default();
    let mut cos = Vec::with_capacity(rows * dh);
    let mut sin = Vec::with_capacity(rows * dh);
    for &p in positions.iter().flatten() {
        let (c, s) = by_pos.entry(p).or_insert_with(|| {
            let angle = |i: usize| p as f64 * inv_freq[i % half];
            ((0..dh).map(|i| angle(i).cos() as f32).collect(), (0..dh).map(|i| angle(i).sin() as f32).collect())
        });
        cos.extend_from_slice(c);
        sin.extend_from_slice(s);
    }
    let mk = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, [rows, dh]), device);
    (mk(cos), mk(sin))
}

/// A block's projection weights side by side, so each of its two input projections is one
/// matrix product (and one gradient) instead of three or two; built once per forward call (or
/// once per sampling call). The fused kernels read the wide products in place.
pub struct FusedBlock {
    /// `[Wq·s, Wk, Wv]`: `[D, Dq + 2·Dkv]` (s = 1/√Dh, the attention scale; with q/k norms the
    /// scale goes into the query norm's gain instead, since a norm undoes any scale before it).
    qkv: Tensor<2>,
    /// `[bq·s, bk, bv]` (config `qkv_bias`).
    qkv_bias: Option<Tensor<1>>,
    /// The query norm's gain times s (config `qk_norm`).
    q_gain: Option<Tensor<1>>,
    /// `[W_gate, W_up]`: `[D, 2F]`.
    gate_up: Tensor<2>,
}

/// Per-block folded weights (see [`FusedBlock`]).
pub struct Fused {
    blocks: Vec<FusedBlock>,
}

impl Block {
    fn scale(&self) -> f64 {
        1.0 / (self.head_dim as f64).sqrt()
    }

    fn fuse(&self) -> FusedBlock {
        let s = self.scale();
        let q_scale = if self.q_norm.is_some() { 1.0 } else { s };
        let bias = |l: &Linear| l.bias.as_ref().map(|b| b.val());
        FusedBlock {
            qkv: Tensor::cat(vec![self.wq.weight.val() * q_scale, self.wk.weight.val(), self.wv.weight.val()], 1),
            qkv_bias: match (bias(&self.wq), bias(&self.wk), bias(&self.wv)) {
                (Some(q), Some(k), Some(v)) => Some(Tensor::cat(vec![q * q_scale, k, v], 0)),
                _ => None,
            },
            q_gain: self.q_norm.as_ref().map(|n| n.gamma.val() * s),
            gate_up: Tensor::cat(vec![self.mlp.linear_inner.weight.val(), self.mlp.linear_outer.weight.val()], 1),
        }
    }

    /// The `[N, Dq + 2·Dkv]` projections of `hx: [N, D]`: biases added, queries and keys normed
    /// per head (config `qk_norm`).
    fn project_qkv(&self, fused: &FusedBlock, hx: Tensor<2>) -> Tensor<2> {
        let mut qkv = kernels::linear(hx, fused.qkv.clone());
        if let Some(b) = &fused.qkv_bias {
            qkv = qkv + b.clone().unsqueeze_dim::<2>(0);
        }
        if let (Some(q_gain), Some(k_norm)) = (&fused.q_gain, &self.k_norm) {
            let [n, _] = qkv.dims();
            let dh = self.head_dim;
            let [q, k, v] = kernels::split_qkv(qkv, self.n_heads * dh, self.n_kv_heads * dh);
            let per_head = |x: Tensor<2>, gain: &Tensor<1>, heads: usize| {
                kernels::rms_norm_with(x.reshape([n * heads, dh]), gain.clone(), k_norm.epsilon).reshape([n, heads * dh])
            };
            qkv = Tensor::cat(vec![per_head(q, q_gain, self.n_heads), per_head(k, &k_norm.gamma.val(), self.n_kv_heads), v], 1);
        }
        qkv
    }

    /// `x: [B·T, D]` (rows of `b` sequences), `bias: [B, 1, T, S]` additive attention bias
    /// (0 or −∞), `cos`/`sin: [B·T, Dh]`.
    fn forward(
        &self,
        fused: &FusedBlock,
        x: Tensor<2>,
        b: usize,
        rope: (&Tensor<2>, &Tensor<2>),
        bias: &Tensor<4>,
        cache: Option<&mut Option<LayerKv>>,
    ) -> Tensor<2> {
        let [n, _] = x.dims();
        let (t, h, kvh, dh) = (n / b, self.n_heads, self.n_kv_heads, self.head_dim);
        let hx = kernels::rms_norm(&self.norm_attn, x.clone());
        let qkv = self.project_qkv(fused, hx);
        let merged = match cache {
            None => kernels::rope_attention(qkv, rope, bias, b, (h, kvh)),
            Some(slot) if kernels::fused(&qkv) => {
                let rows = match slot.get_or_insert_with(|| LayerKv::Rows(kernels::KvRows::default())) {
                    LayerKv::Rows(rows) => rows,
                    LayerKv::Tensors(..) => panic!("a KV cache filled on another backend"),
                };
                kernels::cached_rope_attention(qkv, rope, bias, b, (h, kvh), rows)
            }
            Some(slot) => {
                let [q, k, v] = kernels::split_qkv(qkv, h * dh, kvh * dh);
                let heads = |y: Tensor<2>, hs: usize| y.reshape([b, t, hs, dh]).swap_dims(1, 2);
                let (q, mut k, mut v) = (heads(kernels::rope(q, rope), h), heads(kernels::rope(k, rope), kvh), heads(v, kvh));
                match slot.take() {
                    Some(LayerKv::Tensors(prev)) => {
                        let (pk, pv) = *prev;
                        k = Tensor::cat(vec![pk, k], 2);
                        v = Tensor::cat(vec![pv, v], 2);
                    }
                    Some(LayerKv::Rows(_)) => panic!("a KV cache filled by the fused kernel"),
                    None => {}
                }
                *slot = Some(LayerKv::Tensors(Box::new((k.clone(), v.clone()))));
                let (k, v) = (kernels::repeat_kv(k, h / kvh), kernels::repeat_kv(v, h / kvh));
                let scores = q.matmul(k.swap_dims(2, 3)) + bias.clone();
                softmax(scores, 3).matmul(v).swap_dims(1, 2).reshape([n, h * dh])
            }
        };
        let x = x + kernels::linear(merged, self.wo.weight.val());
        let hm = kernels::rms_norm(&self.norm_mlp, x.clone());
        let gated = kernels::swiglu(kernels::linear(hm, fused.gate_up.clone()));
        x + kernels::linear(gated, self.down.weight.val())
    }
}

impl Transformer {
    /// A model of these sizes; its parameters come from Burn's initialisers (see [`init_params`]
    /// for seeded ones, [`crate::params::write_params`] to set them).
    pub fn new(cfg: &ModelConfig, device: &Device) -> Transformer {
        if let Err(e) = cfg.check() {
            panic!("invalid model config: {e}");
        }
        let (dq, dkv) = cfg.attention_widths();
        let lin = |i, o| LinearConfig::new(i, o).with_bias(false).init(device);
        let qkv_lin = |o| LinearConfig::new(cfg.d_model, o).with_bias(cfg.qkv_bias).init(device);
        let norm = |d| RmsNormConfig::new(d).with_epsilon(cfg.norm_eps).init(device);
        Transformer {
            embed: EmbeddingConfig::new(cfg.vocab, cfg.d_model).init(device),
            blocks: (0..cfg.n_layers)
                .map(|_| Block {
                    norm_attn: norm(cfg.d_model),
                    wq: qkv_lin(dq),
                    wk: qkv_lin(dkv),
                    wv: qkv_lin(dkv),
                    wo: lin(dq, cfg.d_model),
                    norm_mlp: norm(cfg.d_model),
                    mlp: SwiGluConfig::new(cfg.d_model, cfg.d_ff).with_bias(false).init(device),
                    down: lin(cfg.d_ff, cfg.d_model),
                    n_heads: cfg.n_heads,
                    n_kv_heads: cfg.kv_heads(),
                    head_dim: cfg.head_dim(),
                    q_norm: cfg.qk_norm.then(|| norm(cfg.head_dim())),
                    k_norm: cfg.qk_norm.then(|| norm(cfg.head_dim())),
                })
                .collect(),
            norm: norm(cfg.d_model),
            n_heads: cfg.n_heads,
            d_model: cfg.d_model,
            rope_theta: cfg.rope_theta,
            prev_mix: cfg.prev_token.then(|| lin(cfg.d_model, cfg.d_model)),
            lm_head: cfg.untied_head.then(|| lin(cfg.d_model, cfg.vocab)),
            inv_freq: cfg.inv_freq(),
        }
    }

    /// The fused projection weights (see [`FusedBlock`]); pass them to [`Transformer::forward_fused`]
    /// when calling forward many times with the same parameters.
    pub fn fuse(&self) -> Fused {
        Fused { blocks: self.blocks.iter().map(Block::fuse).collect() }
    }

    /// Logits `[B, T, V]` for `tokens: [B, T]` at explicit `positions`, with an additive attention
    /// `bias: [B, 1, T, S]` (S = cached + T; 0 or −∞). `prev: [B, T]` holds the token before each
    /// one (`PAD` at the start; read only with `prev_token`). With a cache, keys/values are
    /// appended to it.
    pub fn forward(
        &self,
        tokens: Tensor<2, Int>,
        prev: Tensor<2, Int>,
        positions: &[Vec<usize>],
        bias: Tensor<4>,
        cache: Option<&mut KvCache>,
    ) -> Tensor<3> {
        self.forward_fused(&self.fuse(), tokens, prev, positions, bias, cache)
    }

    pub fn forward_fused(
        &self,
        fused: &Fused,
        tokens: Tensor<2, Int>,
        prev: Tensor<2, Int>,
        positions: &[Vec<usize>],
        bias: Tensor<4>,
        cache: Option<&mut KvCache>,
    ) -> Tensor<3> {
        let [b, t] = tokens.dims();
        let logits = self.head(self.hidden_fused(fused, tokens, prev, positions, bias, cache));
        let vocab = logits.dims()[1];
        logits.reshape([b, t, vocab])
    }

    /// The last block's output `[B·T, D]` (row `i·T + j`: row `i`, position `j`) before the
    /// final norm; [`Transformer::head`] turns any selection of its rows into logits (sampling
    /// needs only each prompt's last position, not `[B, T, V]` logits).
    pub fn hidden_fused(
        &self,
        fused: &Fused,
        tokens: Tensor<2, Int>,
        prev: Tensor<2, Int>,
        positions: &[Vec<usize>],
        bias: Tensor<4>,
        mut cache: Option<&mut KvCache>,
    ) -> Tensor<2> {
        let device = tokens.device();
        let [b, t] = tokens.dims();
        let d = self.d_model;
        let rope = rope_tables(positions, &self.inv_freq, &device);
        let mut x = self.embed.forward(tokens).reshape([b * t, d]);
        if let Some(mix) = &self.prev_mix {
            x = x + kernels::linear(self.embed.forward(prev).reshape([b * t, d]), mix.weight.val());
        }
        if let Some(c) = cache.as_deref_mut()
            && c.layers.is_empty()
        {
            c.layers = (0..self.blocks.len()).map(|_| None).collect();
        }
        for (i, (block, f)) in self.blocks.iter().zip(&fused.blocks).enumerate() {
            let slot = cache.as_deref_mut().map(|c| &mut c.layers[i]);
            x = block.forward(f, x, b, (&rope.0, &rope.1), &bias, slot);
        }
        x
    }

    /// Logits `[N, V]` of hidden rows `[N, D]` ([`Transformer::hidden_fused`]): final norm, output layer.
    pub fn head(&self, hidden: Tensor<2>) -> Tensor<2> {
        let h = kernels::rms_norm(&self.norm, hidden);
        let w = match &self.lm_head {
            Some(head) => head.weight.val(),
            // Tied embeddings: logits = h · Eᵀ.
            None => self.embed.weight.val().transpose(),
        };
        kernels::linear(h, w)
    }

    pub fn num_params(&self) -> usize {
        Module::num_params(self)
    }
}

/// Replace every parameter with a deterministic draw from our own RNG (Burn's initialisers
/// draw from a global generator; ours makes checkpoints a function of the seed alone).
pub fn init_params(model: Transformer, seed: u64) -> Transformer {
    let mut rng = rao_envs::rng::Rng::new(seed);
    assign_params(model, |_, dims| {
        let n = dims.iter().product();
        if dims.len() == 1 {
            vec![1.0; n] // norm gains
        } else {
            (0..n).map(|_| (rng.normal() * 0.02) as f32).collect()
        }
    })
}

/// A model whose parameters are `values`, in visit order ([`crate::params::read_params`]); each
/// must have its parameter's size.
pub fn model_from_values(cfg: &ModelConfig, device: &Device, mut values: Vec<Vec<f32>>) -> anyhow::Result<Transformer> {
    let model = Transformer::new(cfg, device);
    let shapes = crate::params::param_shapes(&model);
    anyhow::ensure!(shapes.len() == values.len(), "the model has {} parameters, {} were given", shapes.len(), values.len());
    for (i, (shape, v)) in shapes.iter().zip(&values).enumerate() {
        let n: usize = shape.iter().product();
        anyhow::ensure!(n == v.len(), "parameter {i} has shape {shape:?} ({n} values), {} were given", v.len());
    }
    Ok(assign_params(model, |i, _| std::mem::take(&mut values[i])))
}

/// Every parameter set to `values(index, shape)` (in visit order), with the fixed ids of
/// [`crate::params::param_id`] so that Burn records depend on the values alone.
fn assign_params(model: Transformer, values: impl FnMut(usize, &[usize]) -> Vec<f32>) -> Transformer {
    struct Assign<F> {
        values: F,
        next: usize,
    }
    impl<F: FnMut(usize, &[usize]) -> Vec<f32>> burn::module::ModuleMapper for Assign<F> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let t = param.val();
            let (shape, device) = (t.shape(), t.device());
            let v = (self.values)(self.next, &shape.dims::<D>());
            let mut p = Param::from_tensor(Tensor::<D>::from_data(TensorData::new(v, shape), &device));
            p.id = crate::params::param_id(self.next);
            self.next += 1;
            p
        }
    }
    model.map(&mut Assign { values, next: 0 })
}
