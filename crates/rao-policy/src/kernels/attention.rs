//! Causal self-attention with rotary positions, fused: one pass per sequence computes the rotated
//! queries and keys, the scores, their softmax and the weighted values for every head, reading and
//! writing rows in the projections' `[B·T, D]` layout (no head split or merge copies). The
//! backward pass recomputes nothing but the rotation and reuses the saved probabilities.

use rayon::prelude::*;

use super::simd::{exp, simd_fn};

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

/// Inputs of the forward pass, all row-major `[B·T, D]` except `bias: [B, T, T]` (0 or −∞).
pub struct Inputs<'a> {
    pub qa: &'a [f32],
    pub qb: &'a [f32],
    pub ka: &'a [f32],
    pub kb: &'a [f32],
    pub v: &'a [f32],
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    pub bias: &'a [f32],
}

/// What the backward pass needs besides the inputs: the rotated queries and keys (`[B·T, D]`)
/// and the attention probabilities (`[B, H, T, T]`), and the output.
pub struct Saved {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub probs: Vec<f32>,
    pub out: Vec<f32>,
}

/// `out = softmax(q·kᵀ + bias)·v` per head, with `q = qa·cos + qb·sin` and `k = ka·cos + kb·sin`.
pub fn forward(x: &Inputs, dims: Dims) -> Saved {
    let Dims { batch, t, heads, dh } = dims;
    let d = dims.d();
    let rows = batch * t;
    let rotate = |a: &[f32], b: &[f32]| -> Vec<f32> {
        let mut out = vec![0.0; rows * d];
        out.par_chunks_mut(t * d).enumerate().for_each(|(i, o)| {
            let r = i * t * d..(i + 1) * t * d;
            rotate_rows(o, &a[r.clone()], &b[r.clone()], &x.cos[r.clone()], &x.sin[r]);
        });
        out
    };
    let q = rotate(x.qa, x.qb);
    let k = rotate(x.ka, x.kb);
    let mut probs = vec![0.0; batch * heads * t * t];
    let mut out = vec![0.0; rows * d];
    (probs.par_chunks_mut(heads * t * t), out.par_chunks_mut(t * d)).into_par_iter().enumerate().for_each(|(b, (p, o))| {
        let r = b * t * d..(b + 1) * t * d;
        let bias = &x.bias[b * t * t..(b + 1) * t * t];
        let limits = key_limits(bias, t);
        let mut kt = vec![0.0; dh * t];
        for h in 0..heads {
            transpose_head(&k[r.clone()], &mut kt, t, d, h * dh, dh);
            forward_head(&q[r.clone()], &kt, &x.v[r.clone()], bias, &limits, &mut p[h * t * t..(h + 1) * t * t], o, t, d, h * dh, dh);
        }
    });
    Saved { q, k, probs, out }
}

/// Gradients of the five projected inputs.
pub struct Grads {
    pub qa: Vec<f32>,
    pub qb: Vec<f32>,
    pub ka: Vec<f32>,
    pub kb: Vec<f32>,
    pub v: Vec<f32>,
}

/// Backward pass from `grad_out: [B·T, D]`.
pub fn backward(x: &Inputs, saved: &Saved, grad_out: &[f32], dims: Dims) -> Grads {
    let Dims { batch, t, heads, dh } = dims;
    let d = dims.d();
    let rows = batch * t;
    let mut dq = vec![0.0; rows * d];
    let mut dk = vec![0.0; rows * d];
    let mut dv = vec![0.0; rows * d];
    (dq.par_chunks_mut(t * d), dk.par_chunks_mut(t * d), dv.par_chunks_mut(t * d)).into_par_iter().enumerate().for_each(|(b, (dq, dk, dv))| {
        let r = b * t * d..(b + 1) * t * d;
        let limits = key_limits(&x.bias[b * t * t..(b + 1) * t * t], t);
        let mut vt = vec![0.0; dh * t];
        let mut scratch = vec![0.0; t];
        let mut dq_row = vec![0.0; dh];
        for h in 0..heads {
            transpose_head(&x.v[r.clone()], &mut vt, t, d, h * dh, dh);
            let p = &saved.probs[(b * heads + h) * t * t..(b * heads + h + 1) * t * t];
            let head = HeadRef { q: &saved.q[r.clone()], k: &saved.k[r.clone()], out: &saved.out[r.clone()], grad_out: &grad_out[r.clone()], vt: &vt, p, limits: &limits };
            backward_head(&head, dq, dk, dv, &mut scratch, &mut dq_row, t, d, h * dh, dh);
        }
    });
    // Through the rotation: q = qa·cos + qb·sin, so dqa = dq·cos and dqb = dq·sin (same for k).
    let split = |g: &[f32]| -> (Vec<f32>, Vec<f32>) {
        let mut ga = vec![0.0; rows * d];
        let mut gb = vec![0.0; rows * d];
        (ga.par_chunks_mut(t * d), gb.par_chunks_mut(t * d)).into_par_iter().enumerate().for_each(|(i, (ga, gb))| {
            let r = i * t * d..(i + 1) * t * d;
            unrotate_rows(ga, gb, &g[r.clone()], &x.cos[r.clone()], &x.sin[r]);
        });
        (ga, gb)
    };
    let (qa, qb) = split(&dq);
    let (ka, kb) = split(&dk);
    Grads { qa, qb, ka, kb, v: dv }
}

/// One past the last key each query may see (the bias is −∞ beyond it): the loops stop there,
/// which halves the work under a causal mask.
fn key_limits(bias: &[f32], t: usize) -> Vec<usize> {
    (0..t).map(|i| bias[i * t..(i + 1) * t].iter().rposition(|b| b.is_finite()).map_or(0, |s| s + 1)).collect()
}

simd_fn! {
    fn rotate_rows(out: &mut [f32], a: &[f32], b: &[f32], cos: &[f32], sin: &[f32]) {
        for i in 0..out.len() {
            out[i] = a[i] * cos[i] + b[i] * sin[i];
        }
    }
}

simd_fn! {
    fn unrotate_rows(ga: &mut [f32], gb: &mut [f32], g: &[f32], cos: &[f32], sin: &[f32]) {
        for i in 0..g.len() {
            ga[i] = g[i] * cos[i];
            gb[i] = g[i] * sin[i];
        }
    }
}

/// `[T, D]` rows, columns `c0..c0+dh` → `[dh, T]`.
fn transpose_head(x: &[f32], out: &mut [f32], t: usize, d: usize, c0: usize, dh: usize) {
    for s in 0..t {
        for j in 0..dh {
            out[j * t + s] = x[s * d + c0 + j];
        }
    }
}

simd_fn! {
    /// One head of one sequence: probabilities into `p: [T, T]`, weighted values into `o`'s head
    /// columns.
    fn forward_head(q: &[f32], kt: &[f32], v: &[f32], bias: &[f32], limits: &[usize], p: &mut [f32], o: &mut [f32], t: usize, d: usize, c0: usize, dh: usize) {
        for i in 0..t {
            let n = limits[i];
            let row = &mut p[i * t..i * t + n];
            row.copy_from_slice(&bias[i * t..i * t + n]);
            for j in 0..dh {
                let qj = q[i * d + c0 + j];
                let kj = &kt[j * t..j * t + n];
                for s in 0..n {
                    row[s] += qj * kj[s];
                }
            }
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let mut sum = 0.0;
            for x in row.iter_mut() {
                *x = exp(*x - max);
                sum += *x;
            }
            let inv = 1.0 / sum;
            for x in row.iter_mut() {
                *x *= inv;
            }
            let oi = &mut o[i * d + c0..i * d + c0 + dh];
            for s in 0..n {
                let ps = row[s];
                let vs = &v[s * d + c0..s * d + c0 + dh];
                for j in 0..dh {
                    oi[j] += ps * vs[j];
                }
            }
        }
    }
}

struct HeadRef<'a> {
    q: &'a [f32],
    k: &'a [f32],
    out: &'a [f32],
    grad_out: &'a [f32],
    vt: &'a [f32],
    p: &'a [f32],
    limits: &'a [usize],
}

simd_fn! {
    /// Gradients of one head of one sequence, added into the head columns of `dq`, `dk`, `dv`.
    fn backward_head(x: &HeadRef, dq: &mut [f32], dk: &mut [f32], dv: &mut [f32], ds: &mut [f32], dqi: &mut [f32], t: usize, d: usize, c0: usize, dh: usize) {
        for i in 0..t {
            let n = x.limits[i];
            let go = &x.grad_out[i * d + c0..i * d + c0 + dh];
            let oi = &x.out[i * d + c0..i * d + c0 + dh];
            // Σ_s p·dp = dO·O (the softmax backward's row term).
            let mut dot = 0.0;
            for j in 0..dh {
                dot += go[j] * oi[j];
            }
            let ds = &mut ds[..n];
            ds.fill(0.0);
            for j in 0..dh {
                let g = go[j];
                let vj = &x.vt[j * t..j * t + n];
                for s in 0..n {
                    ds[s] += g * vj[s];
                }
            }
            let p = &x.p[i * t..i * t + n];
            for s in 0..n {
                ds[s] = p[s] * (ds[s] - dot);
            }
            let qi = &x.q[i * d + c0..i * d + c0 + dh];
            dqi.fill(0.0);
            for s in 0..n {
                let (w, pw) = (ds[s], p[s]);
                let ks = &x.k[s * d + c0..s * d + c0 + dh];
                for j in 0..dh {
                    dqi[j] += w * ks[j];
                }
                let dks = &mut dk[s * d + c0..s * d + c0 + dh];
                for j in 0..dh {
                    dks[j] += w * qi[j];
                }
                let dvs = &mut dv[s * d + c0..s * d + c0 + dh];
                for j in 0..dh {
                    dvs[j] += pw * go[j];
                }
            }
            dq[i * d + c0..i * d + c0 + dh].copy_from_slice(dqi);
        }
    }
}
