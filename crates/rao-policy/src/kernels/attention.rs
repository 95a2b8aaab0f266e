//! Causal self-attention with rotary positions, fused: one pass per sequence computes the rotated
//! queries and keys, the scores, their softmax and the weighted values for every head, reading and
//! writing rows in the projections' `[B·T, D]` layout (no head split or merge copies). The
//! backward pass recomputes nothing but the rotation and reuses the saved probabilities.

use rayon::prelude::*;

use super::gemm::{View, matmul};
use super::simd::{dot, exp_shifted, max, simd_fn};

/// Shapes: `batch` sequences of `t` rows each, `heads` heads of `dh` columns (`D = heads·dh`),
/// keys `s` per query (`s = t` here: no cache).
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub batch: usize,
    pub t: usize,
    pub heads: usize,
    pub dh: usize,
}

impl Dims {
    fn d(&self) -> usize {
        self.heads * self.dh
    }
}

/// Inputs of the forward pass: `qkv: [B·T, 3D]` (queries, keys, values side by side, as one
/// projection makes them), rotary tables `cos`, `sin: [B·T, D]`, `bias: [B, T, T]` (0 or −∞).
pub struct Inputs<'a> {
    pub qkv: &'a [f32],
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    pub bias: &'a [f32],
}

/// What the backward pass needs besides the inputs and the output: the rotated queries and keys
/// (`[B·T, D]`) and the attention probabilities (`[B, H, T, T]`).
pub struct Saved {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub probs: Vec<f32>,
}

/// `out = softmax(q̃·k̃ᵀ + bias)·v` per head, with rotary positions `q̃ = q·cos + rot(q)·sin`
/// (`rot`: each head's halves `[x₁, x₂] → [−x₂, x₁]`), the same for `k̃`. Returns `out`
/// (`[B·T, D]`) and what the backward pass needs.
pub fn forward(x: &Inputs, dims: Dims) -> (Vec<f32>, Saved) {
    let Dims { batch, t, heads, dh } = dims;
    let d = dims.d();
    let rotate = |offset: usize| -> Vec<f32> {
        let mut out = vec![0.0; batch * t * d];
        out.par_chunks_mut(t * d).enumerate().for_each(|(b, o)| {
            let (r, r3) = (b * t * d..(b + 1) * t * d, b * t * 3 * d..(b + 1) * t * 3 * d);
            rotate_rows(o, &x.qkv[r3], offset, &x.cos[r.clone()], &x.sin[r], d, dh);
        });
        out
    };
    let (q, k) = (rotate(0), rotate(d));
    let mut probs = vec![0.0; batch * heads * t * t];
    let mut out = vec![0.0; batch * t * d];
    (probs.par_chunks_mut(heads * t * t), out.par_chunks_mut(t * d)).into_par_iter().enumerate().for_each(|(b, (p, o))| {
        let r = b * t * d..(b + 1) * t * d;
        let bias = &x.bias[b * t * t..(b + 1) * t * t];
        let limits = key_limits(bias, t);
        let (q, k, v) = (&q[r.clone()], &k[r], &x.qkv[b * t * 3 * d + 2 * d..(b + 1) * t * 3 * d]);
        let (head, head_v, square) = (View::rows(t, dh, d), View::rows(t, dh, 3 * d), View::rows(t, t, t));
        for h in 0..heads {
            let (c0, p) = (h * dh, &mut p[h * t * t..(h + 1) * t * t]);
            matmul(p, square, false, &q[c0..], head, &k[c0..], head.t());
            softmax_rows(p, bias, &limits, t);
            matmul(&mut o[c0..], head, false, p, square, &v[c0..], head_v);
        }
    });
    (out, Saved { q, k, probs })
}

simd_fn! {
    /// Scores `[T, T]` → probabilities, adding the bias; keys past each row's limit get 0.
    fn softmax_rows(p: &mut [f32], bias: &[f32], limits: &[usize], t: usize) {
        for (i, &n) in limits.iter().enumerate() {
            let row = &mut p[i * t..(i + 1) * t];
            let (seen, unseen) = row.split_at_mut(n);
            for (x, b) in seen.iter_mut().zip(&bias[i * t..i * t + n]) {
                *x += b;
            }
            let m = max(seen);
            let inv = 1.0 / exp_shifted(seen, m);
            for x in seen.iter_mut() {
                *x *= inv;
            }
            unseen.fill(0.0);
        }
    }
}

/// Backward pass from the forward's output `out` and its gradient `grad_out` (both `[B·T, D]`):
/// the gradient of `qkv`, `[B·T, 3D]`.
pub fn backward(x: &Inputs, saved: &Saved, out: &[f32], grad_out: &[f32], dims: Dims) -> Vec<f32> {
    let Dims { batch, t, heads, dh } = dims;
    let d = dims.d();
    let mut grad = vec![0.0; batch * t * 3 * d];
    grad.par_chunks_mut(t * 3 * d).enumerate().for_each(|(b, grad)| {
        let r = b * t * d..(b + 1) * t * d;
        let limits = key_limits(&x.bias[b * t * t..(b + 1) * t * t], t);
        let v = &x.qkv[b * t * 3 * d + 2 * d..(b + 1) * t * 3 * d];
        let (q, k, out, go) = (&saved.q[r.clone()], &saved.k[r.clone()], &out[r.clone()], &grad_out[r.clone()]);
        let (head, head_v, square) = (View::rows(t, dh, d), View::rows(t, dh, 3 * d), View::rows(t, t, t));
        let (mut ds, mut dq, mut dk) = (vec![0.0; t * t], vec![0.0; t * d], vec![0.0; t * d]);
        for h in 0..heads {
            let c0 = h * dh;
            let p = &saved.probs[(b * heads + h) * t * t..(b * heads + h + 1) * t * t];
            matmul(&mut ds, square, false, &go[c0..], head, &v[c0..], head_v.t());
            softmax_grad_rows(&mut ds, p, &go[c0..], &out[c0..], &limits, t, d, dh);
            matmul(&mut dq[c0..], head, false, &ds, square, &k[c0..], head);
            matmul(&mut dk[c0..], head, false, &ds, square.t(), &q[c0..], head);
            matmul(&mut grad[2 * d + c0..], head_v, false, p, square.t(), &go[c0..], head);
        }
        // Back through the rotation, into the query and key columns.
        unrotate_rows(grad, 0, &dq, &x.cos[r.clone()], &x.sin[r.clone()], d, dh);
        unrotate_rows(grad, d, &dk, &x.cos[r.clone()], &x.sin[r], d, dh);
    });
    grad
}

/// One past the last key each query may see (the bias is −∞ beyond it): the loops stop there,
/// which halves the work under a causal mask.
fn key_limits(bias: &[f32], t: usize) -> Vec<usize> {
    (0..t).map(|i| bias[i * t..(i + 1) * t].iter().rposition(|b| b.is_finite()).map_or(0, |s| s + 1)).collect()
}

simd_fn! {
    /// `out = x·cos + rot(x)·sin` on rows of heads of `dh` columns; `x` holds the rows at
    /// column `offset` of rows three times as wide (the `qkv` layout).
    fn rotate_rows(out: &mut [f32], qkv: &[f32], offset: usize, cos: &[f32], sin: &[f32], d: usize, dh: usize) {
        let half = dh / 2;
        for (((o, x), c), s) in out.chunks_exact_mut(d).zip(qkv.chunks_exact(3 * d)).zip(cos.chunks_exact(d)).zip(sin.chunks_exact(d)) {
            let x = &x[offset..offset + d];
            for (((o, x), c), s) in o.chunks_exact_mut(dh).zip(x.chunks_exact(dh)).zip(c.chunks_exact(dh)).zip(s.chunks_exact(dh)) {
                let (o_lo, o_hi) = o.split_at_mut(half);
                let ((x_lo, x_hi), (c_lo, c_hi), (s_lo, s_hi)) = (x.split_at(half), c.split_at(half), s.split_at(half));
                for j in 0..half {
                    o_lo[j] = x_lo[j] * c_lo[j] - x_hi[j] * s_lo[j];
                    o_hi[j] = x_hi[j] * c_hi[j] + x_lo[j] * s_hi[j];
                }
            }
        }
    }
}

simd_fn! {
    /// The transpose of [`rotate_rows`]: the gradient of its input from the gradient `g` of its
    /// output, written at column `offset` of the `qkv`-layout rows of `out`.
    fn unrotate_rows(out: &mut [f32], offset: usize, g: &[f32], cos: &[f32], sin: &[f32], d: usize, dh: usize) {
        let half = dh / 2;
        for (((o, g), c), s) in out.chunks_exact_mut(3 * d).zip(g.chunks_exact(d)).zip(cos.chunks_exact(d)).zip(sin.chunks_exact(d)) {
            let o = &mut o[offset..offset + d];
            for (((o, g), c), s) in o.chunks_exact_mut(dh).zip(g.chunks_exact(dh)).zip(c.chunks_exact(dh)).zip(s.chunks_exact(dh)) {
                let (o_lo, o_hi) = o.split_at_mut(half);
                let ((g_lo, g_hi), (c_lo, c_hi), (s_lo, s_hi)) = (g.split_at(half), c.split_at(half), s.split_at(half));
                for j in 0..half {
                    o_lo[j] = g_lo[j] * c_lo[j] + g_hi[j] * s_hi[j];
                    o_hi[j] = g_hi[j] * c_hi[j] - g_lo[j] * s_lo[j];
                }
            }
        }
    }
}

simd_fn! {
    /// `dp: [T, T]` (gradient of the probabilities) → gradient of the scores,
    /// `p·(dp − dO·O)` row by row (`dO·O = Σ_s p·dp`); 0 past each row's limit.
    fn softmax_grad_rows(dp: &mut [f32], p: &[f32], go: &[f32], out: &[f32], limits: &[usize], t: usize, d: usize, dh: usize) {
        for (i, &n) in limits.iter().enumerate() {
            let row_term = dot(&go[i * d..i * d + dh], &out[i * d..i * d + dh]);
            let (row, pr) = (&mut dp[i * t..(i + 1) * t], &p[i * t..(i + 1) * t]);
            for (x, &p) in row[..n].iter_mut().zip(&pr[..n]) {
                *x = p * (*x - row_term);
            }
            row[n..].fill(0.0);
        }
    }
}
