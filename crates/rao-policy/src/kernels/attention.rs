//! Causal self-attention with rotary positions, fused: one pass per sequence computes the rotated
//! queries and keys, the scores, their softmax and the weighted values for every head, reading and
//! writing rows in the projections' `[B·T, D]` layout (no head split or merge copies). The
//! backward pass recomputes nothing but the rotation and reuses the saved probabilities.

use rayon::prelude::*;

use super::gemm::{View, matmul};
use super::simd::{dot, exp_shifted, max, simd_fn};

/// Shapes: `batch` sequences of `t` rows each, `heads` query heads and `kv_heads` key/value heads
/// (each serving `heads / kv_heads` query heads) of `dh` columns.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub batch: usize,
    pub t: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub dh: usize,
}

impl Dims {
    /// Width of the queries (and of the output).
    pub fn dq(&self) -> usize {
        self.heads * self.dh
    }
    /// Width of the keys and of the values.
    pub fn dkv(&self) -> usize {
        self.kv_heads * self.dh
    }
    /// Width of a `qkv` row.
    pub fn width(&self) -> usize {
        self.dq() + 2 * self.dkv()
    }
    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
}

/// Inputs of the forward pass: `qkv: [B·T, Dq + 2·Dkv]` (queries, keys, values side by side, as
/// one projection makes them), rotary tables `cos`, `sin: [B·T, Dh]` (shared by a row's heads),
/// `bias: [B, T, T]` (0 or −∞).
pub struct Inputs<'a> {
    pub qkv: &'a [f32],
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    pub bias: &'a [f32],
}

/// What the backward pass needs besides the inputs and the output: the rotated queries
/// (`[B·T, Dq]`) and keys (`[B·T, Dkv]`) and the attention probabilities, per sequence `b` a
/// `[H, T, S_b]` block (`S_b = keys[b]`, the keys any of its queries sees), one after the other.
pub struct Saved {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub probs: Vec<f32>,
    pub keys: Vec<usize>,
}

/// Each sequence's key limits ([`key_limits`]) and the number of keys its queries see at most:
/// keys past that (a padded sequence's tail) get probability 0, so the products stop there.
fn visible_keys(bias: &[f32], batch: usize, t: usize) -> (Vec<Vec<usize>>, Vec<usize>) {
    let limits: Vec<Vec<usize>> = (0..batch).map(|b| key_limits(&bias[b * t * t..(b + 1) * t * t], t)).collect();
    let keys = limits.iter().map(|l| l.iter().copied().max().unwrap_or(0)).collect();
    (limits, keys)
}

/// `data` cut into consecutive blocks of the given sizes.
fn blocks(mut data: &mut [f32], sizes: impl Iterator<Item = usize>) -> Vec<&mut [f32]> {
    sizes
        .map(|n| {
            let (head, tail) = std::mem::take(&mut data).split_at_mut(n);
            data = tail;
            head
        })
        .collect()
}

/// `out = softmax(q̃·k̃ᵀ + bias)·v` per query head (keys and values of its group's head), with
/// rotary positions `q̃ = q·cos + rot(q)·sin` (`rot`: each head's halves `[x₁, x₂] → [−x₂, x₁]`),
/// the same for `k̃`. Returns `out` (`[B·T, Dq]`) and what the backward pass needs.
pub fn forward(x: &Inputs, dims: Dims) -> (Vec<f32>, Saved) {
    let Dims { batch, t, heads, dh, .. } = dims;
    let (dq, dkv, w, group) = (dims.dq(), dims.dkv(), dims.width(), dims.group());
    let rotate = |offset: usize, width: usize| -> Vec<f32> {
        let mut out = vec![0.0; batch * t * width];
        out.par_chunks_mut(t * width).enumerate().for_each(|(b, o)| {
            let r = b * t * dh..(b + 1) * t * dh;
            rotate_rows(o, &x.qkv[b * t * w..(b + 1) * t * w], offset, width, w, &x.cos[r.clone()], &x.sin[r], dh);
        });
        out
    };
    let (q, k) = (rotate(0, dq), rotate(dq, dkv));
    let (limits, keys) = visible_keys(x.bias, batch, t);
    let mut probs = vec![0.0; heads * t * keys.iter().sum::<usize>()];
    let mut out = vec![0.0; batch * t * dq];
    (blocks(&mut probs, keys.iter().map(|&s| heads * t * s)), out.par_chunks_mut(t * dq)).into_par_iter().enumerate().for_each(
        |(b, (p, o))| {
            let (bias, limits, s) = (&x.bias[b * t * t..(b + 1) * t * t], &limits[b], keys[b]);
            if s == 0 {
                return; // no query sees a key: the output stays 0
            }
            let (q, k, v) =
                (&q[b * t * dq..(b + 1) * t * dq], &k[b * t * dkv..(b + 1) * t * dkv], &x.qkv[b * t * w + dq + dkv..(b + 1) * t * w]);
            let (head_q, head_k, head_v, scores) =
                (View::rows(t, dh, dq), View::rows(s, dh, dkv), View::rows(s, dh, w), View::rows(t, s, s));
            for h in 0..heads {
                let (cq, ck, p) = (h * dh, (h / group) * dh, &mut p[h * t * s..(h + 1) * t * s]);
                matmul(p, scores, false, &q[cq..], head_q, &k[ck..], head_k.t());
                softmax_rows(p, bias, limits, t, s);
                matmul(&mut o[cq..], head_q, false, p, scores, &v[ck..], head_v);
            }
        },
    );
    (out, Saved { q, k, probs, keys })
}

simd_fn! {
    /// Scores `[T, S]` → probabilities, adding the bias (`[T, T]`); keys past each row's limit get 0.
    fn softmax_rows(p: &mut [f32], bias: &[f32], limits: &[usize], t: usize, s: usize) {
        for (i, &n) in limits.iter().enumerate() {
            let row = &mut p[i * s..(i + 1) * s];
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

/// Backward pass from the forward's output `out` and its gradient `grad_out` (both `[B·T, Dq]`):
/// the gradient of `qkv`, `[B·T, Dq + 2·Dkv]`.
pub fn backward(x: &Inputs, saved: &Saved, out: &[f32], grad_out: &[f32], dims: Dims) -> Vec<f32> {
    let Dims { batch, t, heads, dh, .. } = dims;
    let (dq, dkv, w, group) = (dims.dq(), dims.dkv(), dims.width(), dims.group());
    let offsets: Vec<usize> = saved.keys.iter().scan(0, |at, &s| Some(std::mem::replace(at, *at + heads * t * s))).collect();
    let mut grad = vec![0.0; batch * t * w];
    grad.par_chunks_mut(t * w).enumerate().for_each(|(b, grad)| {
        let (rq, rk, rt) = (b * t * dq..(b + 1) * t * dq, b * t * dkv..(b + 1) * t * dkv, b * t * dh..(b + 1) * t * dh);
        let s = saved.keys[b];
        if s == 0 {
            return;
        }
        let limits = key_limits(&x.bias[b * t * t..(b + 1) * t * t], t);
        let v = &x.qkv[b * t * w + dq + dkv..(b + 1) * t * w];
        let (q, k, out, go) = (&saved.q[rq.clone()], &saved.k[rk], &out[rq.clone()], &grad_out[rq]);
        let (head_q, head_k, head_v, scores) = (View::rows(t, dh, dq), View::rows(s, dh, dkv), View::rows(s, dh, w), View::rows(t, s, s));
        // Keys past `s` get no gradient: their rows of `dks` and of the value columns stay 0.
        let (mut ds, mut dqs, mut dks) = (vec![0.0; t * s], vec![0.0; t * dq], vec![0.0; t * dkv]);
        for h in 0..heads {
            let (cq, ck) = (h * dh, (h / group) * dh);
            // The heads of a group add up into their key/value head's gradient.
            let later_in_group = h % group != 0;
            let p = &saved.probs[offsets[b] + h * t * s..offsets[b] + (h + 1) * t * s];
            matmul(&mut ds, scores, false, &go[cq..], head_q, &v[ck..], head_v.t());
            softmax_grad_rows(&mut ds, p, &go[cq..], &out[cq..], &limits, s, dq, dh);
            matmul(&mut dqs[cq..], head_q, false, &ds, scores, &k[ck..], head_k);
            matmul(&mut dks[ck..], head_k, later_in_group, &ds, scores.t(), &q[cq..], head_q);
            matmul(&mut grad[dq + dkv + ck..], head_v, later_in_group, p, scores.t(), &go[cq..], head_q);
        }
        // Back through the rotation, into the query and key columns.
        unrotate_rows(grad, 0, dq, w, &dqs, &x.cos[rt.clone()], &x.sin[rt.clone()], dh);
        unrotate_rows(grad, dq, dkv, w, &dks, &x.cos[rt.clone()], &x.sin[rt], dh);
    });
    grad
}

/// One past the last key each query may see (the bias is −∞ beyond it): the loops stop there,
/// which halves the work under a causal mask.
fn key_limits(bias: &[f32], t: usize) -> Vec<usize> {
    (0..t).map(|i| bias[i * t..(i + 1) * t].iter().rposition(|b| b.is_finite()).map_or(0, |s| s + 1)).collect()
}

simd_fn! {
    /// `out = x·cos + rot(x)·sin` on rows of heads of `dh` columns; `x` holds the `width` columns
    /// at `offset` of rows `stride` wide (the `qkv` layout); `cos`, `sin` hold one `dh` row per row.
    fn rotate_rows(out: &mut [f32], qkv: &[f32], offset: usize, width: usize, stride: usize, cos: &[f32], sin: &[f32], dh: usize) {
        let half = dh / 2;
        for (((o, x), c), s) in out.chunks_exact_mut(width).zip(qkv.chunks_exact(stride)).zip(cos.chunks_exact(dh)).zip(sin.chunks_exact(dh)) {
            let x = &x[offset..offset + width];
            let ((c_lo, c_hi), (s_lo, s_hi)) = (c.split_at(half), s.split_at(half));
            for (o, x) in o.chunks_exact_mut(dh).zip(x.chunks_exact(dh)) {
                let (o_lo, o_hi) = o.split_at_mut(half);
                let (x_lo, x_hi) = x.split_at(half);
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
    /// output, written at the `width` columns at `offset` of the `stride`-wide rows of `out`.
    fn unrotate_rows(out: &mut [f32], offset: usize, width: usize, stride: usize, g: &[f32], cos: &[f32], sin: &[f32], dh: usize) {
        let half = dh / 2;
        for (((o, g), c), s) in out.chunks_exact_mut(stride).zip(g.chunks_exact(width)).zip(cos.chunks_exact(dh)).zip(sin.chunks_exact(dh)) {
            let o = &mut o[offset..offset + width];
            let ((c_lo, c_hi), (s_lo, s_hi)) = (c.split_at(half), s.split_at(half));
            for (o, g) in o.chunks_exact_mut(dh).zip(g.chunks_exact(dh)) {
                let (o_lo, o_hi) = o.split_at_mut(half);
                let (g_lo, g_hi) = g.split_at(half);
                for j in 0..half {
                    o_lo[j] = g_lo[j] * c_lo[j] + g_hi[j] * s_hi[j];
                    o_hi[j] = g_hi[j] * c_hi[j] - g_lo[j] * s_lo[j];
                }
            }
        }
    }
}

simd_fn! {
    /// `dp: [T, S]` (gradient of the probabilities) → gradient of the scores,
    /// `p·(dp − dO·O)` row by row (`dO·O = Σ_s p·dp`); 0 past each row's limit.
    fn softmax_grad_rows(dp: &mut [f32], p: &[f32], go: &[f32], out: &[f32], limits: &[usize], s: usize, d: usize, dh: usize) {
        for (i, &n) in limits.iter().enumerate() {
            let row_term = dot(&go[i * d..i * d + dh], &out[i * d..i * d + dh]);
            let (row, pr) = (&mut dp[i * s..(i + 1) * s], &p[i * s..(i + 1) * s]);
            for (x, &p) in row[..n].iter_mut().zip(&pr[..n]) {
                *x = p * (*x - row_term);
            }
            row[n..].fill(0.0);
        }
    }
}

/// Keys (rotated) and values of every position decoded so far, on the host: per sequence `cap`
/// rows of `Dkv` columns, the first `len` filled. Grows by doubling, so appending one position
/// per step costs no copy of what is there (a concatenation would copy it all every step).
#[derive(Default)]
pub struct KvRows {
    k: Vec<f32>,
    v: Vec<f32>,
    len: usize,
    cap: usize,
    batch: usize,
    dkv: usize,
}

impl KvRows {
    fn reserve(&mut self, batch: usize, dkv: usize, extra: usize) {
        if self.cap == 0 {
            (self.batch, self.dkv) = (batch, dkv);
        }
        assert_eq!((self.batch, self.dkv), (batch, dkv), "a KV cache serves one batch of one width");
        if self.len + extra <= self.cap {
            return;
        }
        let cap = (2 * self.cap).max(self.len + extra).max(16);
        let grow = |old: &[f32]| {
            let mut new = vec![0.0; batch * cap * dkv];
            for b in 0..batch {
                new[b * cap * dkv..(b * cap + self.len) * dkv].copy_from_slice(&old[b * self.cap * dkv..(b * self.cap + self.len) * dkv]);
            }
            new
        };
        (self.k, self.v, self.cap) = (grow(&self.k), grow(&self.v), cap);
    }

    /// A cache of `prefixes.len()` sequences holding `len` positions each, sequence `b`'s first
    /// ones being `prefixes[b]` (keys, values: `n_b · dkv` floats each, `n_b ≤ len`); the
    /// positions past `n_b` are zeros that the caller's bias must hide. Room for `extra` more.
    pub fn from_prefixes(prefixes: &[(&[f32], &[f32])], len: usize, dkv: usize, extra: usize) -> KvRows {
        let (batch, cap) = (prefixes.len(), (len + extra).max(16));
        let mut rows = KvRows { k: vec![0.0; batch * cap * dkv], v: vec![0.0; batch * cap * dkv], len, cap, batch, dkv };
        for (b, (k, v)) in prefixes.iter().enumerate() {
            assert!(k.len() == v.len() && k.len() <= len * dkv, "a prefix longer than the cache");
            rows.k[b * cap * dkv..][..k.len()].copy_from_slice(k);
            rows.v[b * cap * dkv..][..v.len()].copy_from_slice(v);
        }
        rows
    }

    /// Sequence `b`'s keys and values at the positions of `ranges`, one after another.
    pub fn gather(&self, b: usize, ranges: &[std::ops::Range<usize>]) -> (Vec<f32>, Vec<f32>) {
        let base = b * self.cap * self.dkv;
        let pick = |all: &[f32]| ranges.iter().flat_map(|r| &all[base + r.start * self.dkv..base + r.end * self.dkv]).copied().collect();
        (pick(&self.k), pick(&self.v))
    }

    /// Positions held per sequence.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Decoding attention: `t` new rows per sequence (`x.qkv: [B·T, Dq + 2·Dkv]`, rotary tables for
/// their positions) attend to the cached positions and to themselves. Appends the new rows'
/// rotated keys and values to `cache`, then `out = softmax(q̃·K̃ᵀ + bias)·V` per query head over the
/// `S = len + T` keys, with `x.bias: [B, T, S]` (0 or −∞). Returns `out`, `[B·T, Dq]`. Inference
/// only (no backward): the sampler's prefill and each decoded token.
pub fn cached_forward(x: &Inputs, dims: Dims, cache: &mut KvRows) -> Vec<f32> {
    let Dims { batch, t, heads, dh, .. } = dims;
    let (dq, dkv, w, group) = (dims.dq(), dims.dkv(), dims.width(), dims.group());
    cache.reserve(batch, dkv, t);
    let (len, cap) = (cache.len, cache.cap);
    let s = len + t;
    assert_eq!(x.bias.len(), batch * t * s, "bias must be [B, T, len + T]");
    let mut out = vec![0.0; batch * t * dq];
    (out.par_chunks_mut(t * dq), cache.k.par_chunks_mut(cap * dkv), cache.v.par_chunks_mut(cap * dkv))
        .into_par_iter()
        .enumerate()
        .for_each(|(b, (o, kc, vc))| {
            let rows = &x.qkv[b * t * w..(b + 1) * t * w];
            let r = b * t * dh..(b + 1) * t * dh;
            let (cos, sin) = (&x.cos[r.clone()], &x.sin[r]);
            let mut q = vec![0.0; t * dq];
            rotate_rows(&mut q, rows, 0, dq, w, cos, sin, dh);
            rotate_rows(&mut kc[len * dkv..], rows, dq, dkv, w, cos, sin, dh);
            for (dst, src) in vc[len * dkv..].chunks_exact_mut(dkv).zip(rows.chunks_exact(w)) {
                dst.copy_from_slice(&src[dq + dkv..]);
            }
            let bias = &x.bias[b * t * s..(b + 1) * t * s];
            let (head_q, keys, scores) = (View::rows(t, dh, dq), View::rows(s, dh, dkv), View::rows(t, s, s));
            let (kc, vc) = (&mut kc[..s * dkv], &mut vc[..s * dkv]);
            let mut p = vec![0.0; t * s];
            for h in 0..heads {
                let (cq, ck) = (h * dh, (h / group) * dh);
                matmul(&mut p, scores, false, &q[cq..], head_q, &kc[ck..], keys.t());
                softmax_biased_rows(&mut p, bias, s);
                matmul(&mut o[cq..], head_q, false, &p, scores, &vc[ck..], keys);
            }
        });
    cache.len = s;
    out
}

simd_fn! {
    /// Scores → probabilities over rows of `s` keys, adding the bias (a row that sees no key
    /// gets zeros, not NaN).
    fn softmax_biased_rows(p: &mut [f32], bias: &[f32], s: usize) {
        for (row, b) in p.chunks_exact_mut(s).zip(bias.chunks_exact(s)) {
            for (x, b) in row.iter_mut().zip(b) {
                *x += b;
            }
            let m = max(row);
            if m == f32::NEG_INFINITY {
                row.fill(0.0);
                continue;
            }
            let inv = 1.0 / exp_shifted(row, m);
            for x in row.iter_mut() {
                *x *= inv;
            }
        }
    }
}
