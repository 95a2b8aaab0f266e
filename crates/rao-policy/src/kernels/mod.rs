//! Fused CPU kernels for the policy's hot spots (attention with rotary positions, linear layers,
//! SwiGLU, RMSNorm, target log-probabilities), each with a handwritten backward pass, plugged
//! into Burn as a backend extension for the Flex CPU backend. Burn's decomposed ops ran these as
//! 5–10 separate passes with a fresh (zeroed, then realigned) buffer each, plus head split/merge
//! copies (what the kernels gain: BENCHMARKS.md, "fused CPU kernels").
//!
//! The functions here pick the path per tensor: the fused kernels on Flex (with or without
//! autodiff), the decomposed Burn ops on every other backend (wgpu) or when [`set_enabled`] (or
//! `RAO_FUSED_KERNELS=0` in the environment) turned them off: benchmarks and tests compare the two
//! in one process.

mod attention;
mod extension;
mod gemm;
pub(crate) mod pointwise;
pub(crate) mod simd;

use std::cell::Cell;

use burn::backend::{DType, Dispatch, DispatchDevice};
use burn::nn::RmsNorm;
use burn::tensor::activation::{log_softmax, silu, softmax};
use burn::tensor::{Int, Tensor};

pub use attention::KvRows;
use extension::FusedOps;

thread_local! {
    static ENABLED: Cell<bool> = Cell::new(std::env::var("RAO_FUSED_KERNELS").map_or(true, |v| v != "0"));
}

/// Turn the fused kernels on or off for forward passes started on this thread.
pub fn set_enabled(on: bool) {
    ENABLED.set(on);
}

/// Whether this thread's forward passes use the fused kernels.
pub fn enabled() -> bool {
    ENABLED.get()
}

/// Whether the fused kernels serve this tensor: f32 on the Flex backend, kernels enabled.
pub(crate) fn fused<const D: usize>(t: &Tensor<D>) -> bool {
    enabled() && t.dtype() == DType::F32 && matches!(t.device().as_dispatch().clone().inner(), DispatchDevice::Flex(_))
}

/// Whether forward passes of f32 tensors on `device` take the fused kernels (and so keep a KV
/// cache as host rows).
pub fn serves(device: &burn::tensor::Device) -> bool {
    enabled() && on_host(device)
}

/// Whether `device` is the CPU (Burn's Flex backend), with or without the fused kernels.
pub fn on_host(device: &burn::tensor::Device) -> bool {
    matches!(device.as_dispatch().clone().inner(), DispatchDevice::Flex(_))
}

/// RMSNorm of the rows of `x: [N, D]` (same as `norm.forward(x)`).
pub fn rms_norm(norm: &RmsNorm, x: Tensor<2>) -> Tensor<2> {
    if !fused(&x) {
        return norm.forward(x);
    }
    rms_norm_with(x, norm.gamma.val(), norm.epsilon)
}

/// RMSNorm of the rows of `x: [N, D]` with gain `gamma: [D]`.
pub fn rms_norm_with(x: Tensor<2>, gamma: Tensor<1>, epsilon: f64) -> Tensor<2> {
    if !fused(&x) {
        // Burn's `RmsNorm::forward`, with a gain that is not a parameter.
        let rms = (x.clone().square().mean_dim(1) + epsilon).sqrt();
        return (x / rms) * gamma.unsqueeze_dim::<2>(0);
    }
    let out = <Dispatch as FusedOps>::rms_norm(x.into_dispatch(), gamma.into_dispatch(), epsilon as f32);
    Tensor::from_dispatch(out)
}

/// `silu(a)·b` for rows `[a, b]` of `gu: [N, 2F]` (gate and up projections side by side);
/// returns `[N, F]`.
pub fn swiglu(gu: Tensor<2>) -> Tensor<2> {
    if !fused(&gu) {
        let [n, f2] = gu.dims();
        let f = f2 / 2;
        return silu(gu.clone().slice([0..n, 0..f])) * gu.slice([0..n, f..f2]);
    }
    Tensor::from_dispatch(<Dispatch as FusedOps>::swiglu(gu.into_dispatch()))
}

/// Multi-head attention over `batch` sequences without a cache, from the projections
/// `qkv: [B·T, Dq + 2·Dkv]` (queries, keys, values side by side; `heads = (query heads,
/// key/value heads)`, each key/value head serving a group of query heads), with rotary positions
/// `x·cos + rot(x)·sin` (`cos`, `sin: [B·T, Dh]`, [`rope`]) and an additive `bias: [B, 1, T, T]`
/// (0 or −∞). Returns the heads merged, `[B·T, Dq]`.
pub fn rope_attention(
    qkv: Tensor<2>,
    (cos, sin): (&Tensor<2>, &Tensor<2>),
    bias: &Tensor<4>,
    batch: usize,
    (heads, kv_heads): (usize, usize),
) -> Tensor<2> {
    let [n, width] = qkv.dims();
    let dh = cos.dims()[1];
    let (dq, dkv, t) = (heads * dh, kv_heads * dh, n / batch);
    assert_eq!(width, dq + 2 * dkv, "qkv must be [B·T, Dq + 2·Dkv]");
    if !fused(&qkv) {
        let [q, k, v] = split_qkv(qkv, dq, dkv);
        let split = |y: Tensor<2>, hs: usize| y.reshape([batch, t, hs, dh]).swap_dims(1, 2);
        let group = heads / kv_heads;
        let k = repeat_kv(split(rope(k, (cos, sin)), kv_heads), group);
        let scores = split(rope(q, (cos, sin)), heads).matmul(k.swap_dims(2, 3)) + bias.clone();
        return softmax(scores, 3).matmul(repeat_kv(split(v, kv_heads), group)).swap_dims(1, 2).reshape([n, dq]);
    }
    let bias = bias.clone().reshape([batch, t, t]);
    let out = <Dispatch as FusedOps>::rope_attention(
        qkv.into_dispatch(),
        cos.clone().into_dispatch(),
        sin.clone().into_dispatch(),
        bias.into_dispatch(),
        heads,
        kv_heads,
    );
    Tensor::from_dispatch(out)
}

/// [`rope_attention`] while decoding on the CPU backend (callers check [`fused`]): rows of `T` new
/// positions per sequence (`qkv: [B·T, Dq + 2·Dkv]`) attend to the positions in `cache` and to
/// themselves, with `bias: [B, 1, T, len + T]`; their rotated keys and values are appended to
/// `cache`. Inference only. Returns `[B·T, Dq]`.
pub fn cached_rope_attention(
    qkv: Tensor<2>,
    (cos, sin): (&Tensor<2>, &Tensor<2>),
    bias: &Tensor<4>,
    batch: usize,
    (heads, kv_heads): (usize, usize),
    cache: &mut KvRows,
) -> Tensor<2> {
    let device = qkv.device();
    let [n, width] = qkv.dims();
    let dh = cos.dims()[1];
    let dims = attention::Dims { batch, t: n / batch, heads, kv_heads, dh };
    assert_eq!(width, dims.width(), "qkv must be [B·T, Dq + 2·Dkv]");
    let host = |t: burn::tensor::TensorData| t.try_into_vec::<f32>().expect("the fused kernels read f32 tensors");
    let (qkv, cos, sin, bias) = (host(qkv.into_data()), host(cos.to_data()), host(sin.to_data()), host(bias.to_data()));
    let out = attention::cached_forward(&attention::Inputs { qkv: &qkv, cos: &cos, sin: &sin, bias: &bias }, dims, cache);
    Tensor::from_data(burn::tensor::TensorData::new(out, [n, dims.dq()]), &device)
}

/// Rotary positions with Burn's ops on rows of heads `x: [N, H·Dh]`: `x·cos + rot(x)·sin` with
/// `cos`, `sin: [N, Dh]` shared by the heads of a row and `rot` each head's halves
/// `[x₁, x₂] → [−x₂, x₁]` (rotate-half), for the decomposed path and the sampler's cached one.
pub fn rope(x: Tensor<2>, (cos, sin): (&Tensor<2>, &Tensor<2>)) -> Tensor<2> {
    let [n, w] = x.dims();
    let dh = cos.dims()[1];
    let (heads, half) = (w / dh, dh / 2);
    let x = x.reshape([n, heads, dh]);
    let rotated = Tensor::cat(vec![x.clone().slice([0..n, 0..heads, half..dh]).neg(), x.clone().slice([0..n, 0..heads, 0..half])], 2);
    (x * cos.clone().unsqueeze_dim::<3>(1) + rotated * sin.clone().unsqueeze_dim::<3>(1)).reshape([n, w])
}

/// `[N, Dq + 2·Dkv]` → queries `[N, Dq]`, keys and values `[N, Dkv]`.
pub fn split_qkv(qkv: Tensor<2>, dq: usize, dkv: usize) -> [Tensor<2>; 3] {
    let [n, _] = qkv.dims();
    [0..dq, dq..dq + dkv, dq + dkv..dq + 2 * dkv].map(|r| qkv.clone().slice([0..n, r]))
}

/// `[B, H_kv, S, Dh]` → `[B, H_kv·group, S, Dh]`: each key/value head repeated for the `group`
/// query heads it serves (query head `h` reads key/value head `h / group`).
pub fn repeat_kv(x: Tensor<4>, group: usize) -> Tensor<4> {
    if group == 1 {
        return x;
    }
    let [b, h, s, dh] = x.dims();
    x.unsqueeze_dim::<5>(2).expand([b, h, group, s, dh]).reshape([b, h * group, s, dh])
}

/// `x·w` for `x: [N, D]`, `w: [D, F]` (the fused path allocates its output without zeroing it,
/// where Flex's matmul zeroes and then copies it to realign it).
pub fn linear(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    if !fused(&x) {
        return x.matmul(w);
    }
    Tensor::from_dispatch(<Dispatch as FusedOps>::linear(x.into_dispatch(), w.into_dispatch()))
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
