//! A small decoder-only transformer: RMSNorm, rotary positions, causal self-attention,
//! gated (SwiGLU) MLP, tied input/output embeddings.

use burn::module::{Module, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig, SwiGlu, SwiGluConfig};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::kernels;

/// Sizes of the policy (set from the pipeline file).
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
}

fn default_theta() -> f64 {
    10_000.0
}

impl ModelConfig {
    pub fn tiny() -> Self {
        ModelConfig { vocab: 0, d_model: 64, n_layers: 2, n_heads: 4, d_ff: 192, rope_theta: default_theta(), prev_token: false }
    }
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
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
}

/// Per-layer keys and values of everything seen so far: `[B, H, S, Dh]`.
#[derive(Default)]
pub struct KvCache {
    pub layers: Vec<Option<(Tensor<4>, Tensor<4>)>>,
}

/// Rotary tables for explicit positions, laid out like the projected rows `[B·T, D]`: each head's
/// `Dh/2` angles twice (rotate-half pairs dimension `j` with `j + Dh/2`).
pub fn rope_tables(positions: &[Vec<usize>], n_heads: usize, head_dim: usize, theta: f64, device: &Device) -> (Tensor<2>, Tensor<2>) {
    let rows: usize = positions.iter().map(|p| p.len()).sum();
    let half = head_dim / 2;
    let d = n_heads * head_dim;
    let inv_freq: Vec<f64> = (0..half).map(|i| 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)).collect();
    // Angles once per distinct position (the rows of a batch share positions 0..T).
    let mut by_pos: std::collections::HashMap<usize, (Vec<f32>, Vec<f32>)> = Default::default();
    let mut cos = Vec::with_capacity(rows * d);
    let mut sin = Vec::with_capacity(rows * d);
    for &p in positions.iter().flatten() {
        let (c, s) = by_pos.entry(p).or_insert_with(|| {
            let angle = |i: usize| p as f64 * inv_freq[i % half];
            ((0..d).map(|i| angle(i % head_dim).cos() as f32).collect(), (0..d).map(|i| angle(i % head_dim).sin() as f32).collect())
        });
        cos.extend_from_slice(c);
        sin.extend_from_slice(s);
    }
    let mk = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, [rows, d]), device);
    (mk(cos), mk(sin))
}

/// `R` with `x·R` = rotate-half of every head of `x: [.., D]` (`[x1, x2] → [−x2, x1]`), so that
/// rotary positions become `x·cos + (x·R)·sin` and `R` folds into the projection weights.
fn rotate_half_matrix(n_heads: usize, head_dim: usize, device: &Device) -> Tensor<2> {
    let d = n_heads * head_dim;
    let half = head_dim / 2;
    let mut r = vec![0.0f32; d * d];
    for h in 0..n_heads {
        for j in 0..half {
            let (lo, hi) = (h * head_dim + j, h * head_dim + j + half);
            r[hi * d + lo] = -1.0; // out[lo] = −x[hi]
            r[lo * d + hi] = 1.0; // out[hi] = x[lo]
        }
    }
    Tensor::<2>::from_data(TensorData::new(r, [d, d]), device)
}

/// A block's projection weights side by side, so each of its two input projections is one
/// matrix product (and one gradient) instead of three or two; built once per forward call (or
/// once per sampling call). The fused kernels read the wide products in place.
pub struct FusedBlock {
    /// `[Wq·s, Wk, Wv]`: `[D, 3D]` (s = 1/√Dh, the attention scale).
    qkv: Tensor<2>,
    /// `[W_gate, W_up]`: `[D, 2F]`.
    gate_up: Tensor<2>,
}

/// Per-block folded weights (see [`FusedBlock`]) and the rotate-half matrix `R`
/// ([`rotate_half_matrix`]): rotary positions are `x·cos + (x·R)·sin`.
pub struct Fused {
    blocks: Vec<FusedBlock>,
    rotate: Tensor<2>,
}

impl Block {
    fn fuse(&self) -> FusedBlock {
        let d = self.wq.weight.dims()[0];
        let scale = 1.0 / ((d / self.n_heads) as f64).sqrt();
        FusedBlock {
            qkv: Tensor::cat(vec![self.wq.weight.val() * scale, self.wk.weight.val(), self.wv.weight.val()], 1),
            gate_up: Tensor::cat(vec![self.mlp.linear_inner.weight.val(), self.mlp.linear_outer.weight.val()], 1),
        }
    }

    /// `x: [B·T, D]` (rows of `b` sequences), `bias: [B, 1, T, S]` additive attention bias
    /// (0 or −∞), `cos`/`sin: [B·T, D]`.
    #[expect(clippy::too_many_arguments, reason = "one block's inputs, each a different tensor; a struct would only rename them")]
    fn forward(
        &self,
        fused: &FusedBlock,
        rotate: &Tensor<2>,
        x: Tensor<2>,
        b: usize,
        (cos, sin): (&Tensor<2>, &Tensor<2>),
        bias: &Tensor<4>,
        cache: Option<&mut Option<(Tensor<4>, Tensor<4>)>>,
    ) -> Tensor<2> {
        let [n, d] = x.dims();
        let (t, h) = (n / b, self.n_heads);
        let dh = d / h;
        let hx = kernels::rms_norm(&self.norm_attn, x.clone());
        let qkv = kernels::linear(hx, fused.qkv.clone());
        let merged = match cache {
            None => kernels::rope_attention(qkv, rotate, (cos, sin), bias, b, h),
            Some(slot) => {
                let [q, k, v] = kernels::split_qkv(qkv);
                let heads = |y: Tensor<2>| y.reshape([b, t, h, dh]).swap_dims(1, 2);
                let (q, mut k, mut v) =
                    (heads(kernels::rope(q, rotate, (cos, sin))), heads(kernels::rope(k, rotate, (cos, sin))), heads(v));
                if let Some((pk, pv)) = slot.take() {
                    k = Tensor::cat(vec![pk, k], 2);
                    v = Tensor::cat(vec![pv, v], 2);
                }
                *slot = Some((k.clone(), v.clone()));
                let scores = q.matmul(k.swap_dims(2, 3)) + bias.clone();
                softmax(scores, 3).matmul(v).swap_dims(1, 2).reshape([n, d])
            }
        };
        let x = x + kernels::linear(merged, self.wo.weight.val());
        let hm = kernels::rms_norm(&self.norm_mlp, x.clone());
        let gated = kernels::swiglu(kernels::linear(hm, fused.gate_up.clone()));
        x + kernels::linear(gated, self.down.weight.val())
    }
}

impl Transformer {
    pub fn new(cfg: &ModelConfig, device: &Device) -> Transformer {
        assert!(cfg.d_model.is_multiple_of(cfg.n_heads) && cfg.head_dim().is_multiple_of(2), "d_model must split into heads of even size");
        let lin = |i, o| LinearConfig::new(i, o).with_bias(false).init(device);
        Transformer {
            embed: EmbeddingConfig::new(cfg.vocab, cfg.d_model).init(device),
            blocks: (0..cfg.n_layers)
                .map(|_| Block {
                    norm_attn: RmsNormConfig::new(cfg.d_model).with_epsilon(1e-6).init(device),
                    wq: lin(cfg.d_model, cfg.d_model),
                    wk: lin(cfg.d_model, cfg.d_model),
                    wv: lin(cfg.d_model, cfg.d_model),
                    wo: lin(cfg.d_model, cfg.d_model),
                    norm_mlp: RmsNormConfig::new(cfg.d_model).with_epsilon(1e-6).init(device),
                    mlp: SwiGluConfig::new(cfg.d_model, cfg.d_ff).with_bias(false).init(device),
                    down: lin(cfg.d_ff, cfg.d_model),
                    n_heads: cfg.n_heads,
                })
                .collect(),
            norm: RmsNormConfig::new(cfg.d_model).with_epsilon(1e-6).init(device),
            n_heads: cfg.n_heads,
            d_model: cfg.d_model,
            rope_theta: cfg.rope_theta,
            prev_mix: cfg.prev_token.then(|| lin(cfg.d_model, cfg.d_model)),
        }
    }

    /// The fused projection weights (see [`FusedBlock`]); pass them to [`Transformer::forward_fused`]
    /// when calling forward many times with the same parameters.
    pub fn fuse(&self) -> Fused {
        let dh = self.d_model / self.n_heads;
        Fused {
            blocks: self.blocks.iter().map(Block::fuse).collect(),
            rotate: rotate_half_matrix(self.n_heads, dh, &self.embed.weight.device()),
        }
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
        mut cache: Option<&mut KvCache>,
    ) -> Tensor<3> {
        let device = tokens.device();
        let [b, t] = tokens.dims();
        let d = self.d_model;
        let rope = rope_tables(positions, self.n_heads, d / self.n_heads, self.rope_theta, &device);
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
            x = block.forward(f, &fused.rotate, x, b, (&rope.0, &rope.1), &bias, slot);
        }
        // Tied embeddings: logits = h · Eᵀ.
        let w = self.embed.weight.val();
        let vocab = w.dims()[0];
        kernels::linear(kernels::rms_norm(&self.norm, x), w.transpose()).reshape([b, t, vocab])
    }

    pub fn num_params(&self) -> usize {
        Module::num_params(self)
    }
}

/// Replace every parameter with a deterministic draw from our own RNG (Burn's initialisers
/// draw from a global generator; ours makes checkpoints a function of the seed alone).
pub fn init_params(model: Transformer, seed: u64) -> Transformer {
    struct Init {
        rng: rao_envs::rng::Rng,
        next: usize,
    }
    impl burn::module::ModuleMapper for Init {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let t = param.val();
            let shape = t.shape();
            let device = t.device();
            let n = shape.num_elements();
            let values: Vec<f32> = if D == 1 {
                vec![1.0; n] // norm gains
            } else {
                (0..n).map(|_| (self.rng.normal() * 0.02) as f32).collect()
            };
            let mut p = Param::from_tensor(Tensor::<D>::from_data(TensorData::new(values, shape), &device));
            p.id = crate::params::param_id(self.next);
            self.next += 1;
            p
        }
    }
    model.map(&mut Init { rng: rao_envs::rng::Rng::new(seed), next: 0 })
}
