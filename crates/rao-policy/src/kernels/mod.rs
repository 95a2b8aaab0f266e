//! Fused CPU kernels for the policy's hot spots (attention with rotary positions, SwiGLU,
//! RMSNorm, target log-probabilities), each with a handwritten backward pass, plugged into Burn
//! as a backend extension for the Flex CPU backend. Burn's decomposed ops ran these as 5–10
//! separate passes with a fresh buffer each, plus head split/merge copies (BENCHMARKS.md, issue 4).
//!
//! The functions here pick the path per tensor: the fused kernels on Flex (with or without
//! autodiff), the decomposed Burn ops on every other backend (wgpu) or when [`set_enabled`] (or
//! `RAO_FUSED_KERNELS=0` in the environment) turned them off: benchmarks and tests compare the two
//! in one process.

mod attention;
mod gemm;
mod extension;
pub(crate) mod pointwise;
pub(crate) mod simd;

use std::cell::Cell;

use burn::backend::{DType, Dispatch, DispatchDevice};
use burn::nn::RmsNorm;
use burn::tensor::activation::{log_softmax, silu, softmax};
use burn::tensor::{Int, Tensor};

use extension::FusedOps;

thread_local! {
    static ENABLED: Cell<bool> = Cell::new(std::env::var("RAO_FUSED_KERNELS").map_or(true, |v| v != "0"));
}

/// Turn the fused kernels on or off for forward passes started on this thread.
pub fn set_enabled(on: bool) {
    ENABLED.set(on);
}

/// Whether the fused kernels serve this tensor: f32 on the Flex backend, kernels enabled.
fn fused<const D: usize>(t: &Tensor<D>) -> bool {
    ENABLED.get() && t.dtype() == DType::F32 && matches!(t.device().as_dispatch().clone().inner(), DispatchDevice::Flex(_))
}

/// RMSNorm of the rows of `x: [N, D]` (same as `norm.forward(x)`).
pub fn rms_norm(norm: &RmsNorm, x: Tensor<2>) -> Tensor<2> {
    if !fused(&x) {
        return norm.forward(x);
    }
    let out = <Dispatch as FusedOps>::rms_norm(x.into_dispatch(), norm.gamma.val().into_dispatch(), norm.epsilon as f32);
    Tensor::from_dispatch(out)
}

/// `silu(a)·b`.
pub fn swiglu(a: Tensor<2>, b: Tensor<2>) -> Tensor<2> {
    if !fused(&a) {
        return silu(a) * b;
    }
    Tensor::from_dispatch(<Dispatch as FusedOps>::swiglu(a.into_dispatch(), b.into_dispatch()))
}

/// Rows of rotated projections for one attention layer, `[B·T, D]` each: queries and keys before
/// the rotary rotation (`a·cos + b·sin`), and values.
pub struct Projections {
    pub qa: Tensor<2>,
    pub qb: Tensor<2>,
    pub ka: Tensor<2>,
    pub kb: Tensor<2>,
    pub v: Tensor<2>,
}

/// Multi-head attention over `batch` sequences without a cache: `bias: [B, 1, T, T]` (0 or −∞),
/// rotary tables `cos`, `sin: [B·T, D]`. Returns the heads merged, `[B·T, D]`.
pub fn rope_attention(p: Projections, (cos, sin): (&Tensor<2>, &Tensor<2>), bias: &Tensor<4>, batch: usize, heads: usize) -> Tensor<2> {
    let [n, d] = p.qa.dims();
    let t = n / batch;
    if !fused(&p.qa) {
        let q = p.qa * cos.clone() + p.qb * sin.clone();
        let k = p.ka * cos.clone() + p.kb * sin.clone();
        let split = |y: Tensor<2>| y.reshape([batch, t, heads, d / heads]).swap_dims(1, 2);
        let scores = split(q).matmul(split(k).swap_dims(2, 3)) + bias.clone();
        return softmax(scores, 3).matmul(split(p.v)).swap_dims(1, 2).reshape([n, d]);
    }
    let bias = bias.clone().reshape([batch, t, t]);
    let out = <Dispatch as FusedOps>::rope_attention(
        p.qa.into_dispatch(),
        p.qb.into_dispatch(),
        p.ka.into_dispatch(),
        p.kb.into_dispatch(),
        p.v.into_dispatch(),
        cos.clone().into_dispatch(),
        sin.clone().into_dispatch(),
        bias.into_dispatch(),
        heads,
    );
    Tensor::from_dispatch(out)
}

/// Log-probabilities `[B, T]` of `targets` under `softmax(logits / temperature + mask)`, with
/// `logits` and `mask: [B, T, V]`. `target_ids` holds the same targets, row-major, for the fused
/// kernel (which reads them on the host).
pub fn token_logprobs(logits: Tensor<3>, mask: Tensor<3>, targets: &Tensor<2, Int>, target_ids: &[usize], temperature: f64) -> Tensor<2> {
    let [b, t, v] = logits.dims();
    if !fused(&logits) {
        let z = logits / temperature + mask;
        return log_softmax(z, 2).gather(2, targets.clone().unsqueeze_dim::<3>(2)).squeeze_dim::<2>(2);
    }
    let out = <Dispatch as FusedOps>::token_logprobs(
        logits.reshape([b * t, v]).into_dispatch(),
        mask.reshape([b * t, v]).into_dispatch(),
        target_ids.to_vec(),
        (1.0 / temperature) as f32,
    );
    Tensor::<1>::from_dispatch(out).reshape([b, t])
}
