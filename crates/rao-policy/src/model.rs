//! A small decoder-only transformer: RMSNorm, rotary positions, causal self-attention,
//! gated (SwiGLU) MLP, tied input/output embeddings.

use burn::module::{Module, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig, SwiGlu, SwiGluConfig};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

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
}

fn default_theta() -> f64 {
    10_000.0
}

impl ModelConfig {
    pub fn tiny() -> Self {
        ModelConfig { vocab: 0, d_model: 64, n_layers: 2, n_heads: 4, d_ff: 192, rope_theta: default_theta() }
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
}

/// Per-layer keys and values of everything seen so far: `[B, H, S, Dh]`.
#[derive(Default)]
pub struct KvCache {
    pub layers: Vec<Option<(Tensor<4>, Tensor<4>)>>,
}

/// Rotary tables for explicit positions `[B, T]`: cos and sin of shape `[B, 1, T, Dh/2]`.
pub fn rope_tables(positions: &[Vec<usize>], head_dim: usize, theta: f64, device: &Device) -> (Tensor<4>, Tensor<4>) {
    let b = positions.len();
    let t = positions.first().map(|p| p.len()).unwrap_or(0);
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(b * t * half);
    let mut sin = Vec::with_capacity(b * t * half);
    for row in positions {
        for &p in row {
            for i in 0..half {
                let freq = 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64);
                let a = p as f64 * freq;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
    }
    let mk = |v: Vec<f32>| Tensor::<4>::from_data(TensorData::new(v, [b, 1, t, half]), device);
    (mk(cos), mk(sin))
}

/// Rotate-half rotary embedding of `x: [B, H, T, Dh]`.
fn apply_rope(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
    let [b, h, t, d] = x.dims();
    let half = d / 2;
    let x1 = x.clone().slice([0..b, 0..h, 0..t, 0..half]);
    let x2 = x.slice([0..b, 0..h, 0..t, half..d]);
    let r1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
    let r2 = x1 * sin.clone() + x2 * cos.clone();
    Tensor::cat(vec![r1, r2], 3)
}

impl Block {
    /// `x: [B, T, D]`, `bias: [B, 1, T, S]` additive attention bias (0 or very negative).
    fn forward(
        &self,
        x: Tensor<3>,
        cos: &Tensor<4>,
        sin: &Tensor<4>,
        bias: &Tensor<4>,
        cache: Option<&mut Option<(Tensor<4>, Tensor<4>)>>,
    ) -> Tensor<3> {
        let [b, t, d] = x.dims();
        let h = self.n_heads;
        let dh = d / h;
        let hx = self.norm_attn.forward(x.clone());
        let split = |y: Tensor<3>| y.reshape([b, t, h, dh]).swap_dims(1, 2);
        let q = apply_rope(split(self.wq.forward(hx.clone())), cos, sin);
        let mut k = apply_rope(split(self.wk.forward(hx.clone())), cos, sin);
        let mut v = split(self.wv.forward(hx));
        if let Some(slot) = cache {
            if let Some((pk, pv)) = slot.take() {
                k = Tensor::cat(vec![pk, k], 2);
                v = Tensor::cat(vec![pv, v], 2);
            }
            *slot = Some((k.clone(), v.clone()));
        }
        let scores = q.matmul(k.swap_dims(2, 3)) / (dh as f64).sqrt() + bias.clone();
        let attn = softmax(scores, 3).matmul(v);
        let merged = attn.swap_dims(1, 2).reshape([b, t, d]);
        let x = x + self.wo.forward(merged);
        let m = self.down.forward(self.mlp.forward(self.norm_mlp.forward(x.clone())));
        x + m
    }
}

impl Transformer {
    pub fn new(cfg: &ModelConfig, device: &Device) -> Transformer {
        assert!(cfg.d_model % cfg.n_heads == 0 && cfg.head_dim() % 2 == 0, "d_model must split into heads of even size");
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
        }
    }

    /// Logits `[B, T, V]` for `tokens: [B, T]` at explicit `positions`, with an additive attention
    /// `bias: [B, 1, T, S]` (S = cached + T). With a cache, keys/values are appended to it.
    pub fn forward(&self, tokens: Tensor<2, Int>, positions: &[Vec<usize>], bias: Tensor<4>, mut cache: Option<&mut KvCache>) -> Tensor<3> {
        let device = tokens.device();
        let (cos, sin) = rope_tables(positions, self.d_model / self.n_heads, self.rope_theta, &device);
        let mut x = self.embed.forward(tokens);
        if let Some(c) = cache.as_deref_mut() {
            if c.layers.is_empty() {
                c.layers = (0..self.blocks.len()).map(|_| None).collect();
            }
        }
        for (i, block) in self.blocks.iter().enumerate() {
            let slot = cache.as_deref_mut().map(|c| &mut c.layers[i]);
            x = block.forward(x, &cos, &sin, &bias, slot);
        }
        let x = self.norm.forward(x);
        let [b, t, d] = x.dims();
        // Tied embeddings: logits = h · Eᵀ.
        let w = self.embed.weight.val();
        let vocab = w.dims()[0];
        x.reshape([b * t, d]).matmul(w.transpose()).reshape([b, t, vocab])
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
