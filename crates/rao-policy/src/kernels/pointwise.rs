//! Row-wise kernels with their backward passes, each one pass over memory where Burn's decomposed
//! ops made five to ten: SwiGLU's gate, RMSNorm, and the log-probability of target tokens under
//! the grammar-masked, tempered softmax.

use rayon::prelude::*;

use super::simd::{dot, exp_shifted, max, sigmoid, simd_fn};

/// Rows per parallel task: large enough that the hand-off costs little next to the work.
const CHUNK_ROWS: usize = 64;

/// `silu(a)·b` for rows `[a, b]` of `gu: [N, 2F]` (gate and up projections side by side, as one
/// projection makes them); returns `[N, F]`.
pub fn swiglu_forward(gu: &[f32], f: usize) -> Vec<f32> {
    let mut out = vec![0.0; gu.len() / 2];
    (out.par_chunks_mut(CHUNK_ROWS * f), gu.par_chunks(CHUNK_ROWS * 2 * f)).into_par_iter().for_each(|(o, gu)| {
        for (o, gu) in o.chunks_exact_mut(f).zip(gu.chunks_exact(2 * f)) {
            let (a, b) = gu.split_at(f);
            swiglu_row(o, a, b);
        }
    });
    out
}

simd_fn! {
    fn swiglu_row(o: &mut [f32], a: &[f32], b: &[f32]) {
        for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
            *o = a * sigmoid(a) * b;
        }
    }
}

/// Gradient of [`swiglu_forward`] with respect to `gu`, from the output's gradient `g: [N, F]`.
pub fn swiglu_backward(gu: &[f32], f: usize, g: &[f32]) -> Vec<f32> {
    let mut dgu = vec![0.0; gu.len()];
    (dgu.par_chunks_mut(CHUNK_ROWS * 2 * f), gu.par_chunks(CHUNK_ROWS * 2 * f), g.par_chunks(CHUNK_ROWS * f)).into_par_iter().for_each(
        |(dgu, gu, g)| {
            for ((dgu, gu), g) in dgu.chunks_exact_mut(2 * f).zip(gu.chunks_exact(2 * f)).zip(g.chunks_exact(f)) {
                let (da, db) = dgu.split_at_mut(f);
                let (a, b) = gu.split_at(f);
                swiglu_grad_row(da, db, a, b, g);
            }
        },
    );
    dgu
}

simd_fn! {
    fn swiglu_grad_row(da: &mut [f32], db: &mut [f32], a: &[f32], b: &[f32], g: &[f32]) {
        for ((da, db), ((&a, &b), &g)) in da.iter_mut().zip(db.iter_mut()).zip(a.iter().zip(b).zip(g)) {
            let s = sigmoid(a);
            *db = g * a * s;
            // d silu / da = s·(1 + a·(1 − s)).
            *da = g * b * s * (1.0 + a * (1.0 - s));
        }
    }
}

/// RMSNorm over rows of `d`: `y = x / sqrt(mean(x²) + eps) · gamma`; also returns each row's
/// `1 / sqrt(mean(x²) + eps)` for the backward pass.
pub fn rms_norm_forward(x: &[f32], gamma: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>) {
    let d = gamma.len();
    let rows = x.len() / d;
    let mut y = vec![0.0; x.len()];
    let mut inv = vec![0.0; rows];
    (y.par_chunks_mut(CHUNK_ROWS * d), inv.par_chunks_mut(CHUNK_ROWS), x.par_chunks(CHUNK_ROWS * d))
        .into_par_iter()
        .for_each(|(y, inv, x)| rms_norm_rows(y, inv, x, gamma, eps));
    (y, inv)
}

simd_fn! {
    fn rms_norm_rows(y: &mut [f32], inv: &mut [f32], x: &[f32], gamma: &[f32], eps: f32) {
        let d = gamma.len();
        for (r, inv) in inv.iter_mut().enumerate() {
            let xr = &x[r * d..(r + 1) * d];
            let ms = dot(xr, xr) / d as f32;
            *inv = 1.0 / (ms + eps).sqrt();
            let yr = &mut y[r * d..(r + 1) * d];
            for ((y, &x), &g) in yr.iter_mut().zip(xr).zip(gamma) {
                *y = x * *inv * g;
            }
        }
    }
}

/// Gradients of RMSNorm: `dx` and `dgamma`. `dgamma` sums fixed chunks of rows, then the chunks
/// in order, so the result does not depend on the thread count.
pub fn rms_norm_backward(x: &[f32], gamma: &[f32], inv: &[f32], g: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let d = gamma.len();
    let mut dx = vec![0.0; x.len()];
    let partial: Vec<Vec<f32>> =
        (dx.par_chunks_mut(CHUNK_ROWS * d), x.par_chunks(CHUNK_ROWS * d), g.par_chunks(CHUNK_ROWS * d), inv.par_chunks(CHUNK_ROWS))
            .into_par_iter()
            .map(|(dx, x, g, inv)| {
                let mut dgamma = vec![0.0; d];
                rms_norm_grad_rows(dx, &mut dgamma, x, g, inv, gamma);
                dgamma
            })
            .collect();
    let mut dgamma = vec![0.0; d];
    for p in &partial {
        for (s, v) in dgamma.iter_mut().zip(p) {
            *s += v;
        }
    }
    (dx, dgamma)
}

simd_fn! {
    fn rms_norm_grad_rows(dx: &mut [f32], dgamma: &mut [f32], x: &[f32], g: &[f32], inv: &[f32], gamma: &[f32]) {
        let d = gamma.len();
        for (r, &inv) in inv.iter().enumerate() {
            let (xr, gr) = (&x[r * d..(r + 1) * d], &g[r * d..(r + 1) * d]);
            // With x̂ = x·inv and u = g·gamma: dx = inv·(u − x̂·mean(u·x̂)).
            for ((dg, &g), &x) in dgamma.iter_mut().zip(gr).zip(xr) {
                *dg += g * x * inv;
            }
            let dxr = &mut dx[r * d..(r + 1) * d];
            for ((u, &g), &gm) in dxr.iter_mut().zip(gr).zip(gamma) {
                *u = g * gm;
            }
            let m = dot(dxr, xr) * inv / d as f32;
            for (u, &x) in dxr.iter_mut().zip(xr) {
                *u = inv * (*u - x * inv * m);
            }
        }
    }
}

/// Log-probability of `targets[n]` under `softmax(logits[n]·scale + mask[n])`, rows of `v`; also
/// returns the softmax rows for the backward pass.
pub fn token_logprob_forward(logits: &[f32], mask: &[f32], targets: &[usize], scale: f32) -> (Vec<f32>, Vec<f32>) {
    let v = logits.len() / targets.len();
    let mut probs = vec![0.0; logits.len()];
    let mut lp = vec![0.0; targets.len()];
    (
        probs.par_chunks_mut(CHUNK_ROWS * v),
        lp.par_chunks_mut(CHUNK_ROWS),
        logits.par_chunks(CHUNK_ROWS * v),
        mask.par_chunks(CHUNK_ROWS * v),
        targets.par_chunks(CHUNK_ROWS),
    )
        .into_par_iter()
        .for_each(|(p, lp, z, m, tg)| logprob_rows(p, lp, z, m, tg, scale, v));
    (lp, probs)
}

simd_fn! {
    fn logprob_rows(p: &mut [f32], lp: &mut [f32], z: &[f32], m: &[f32], targets: &[usize], scale: f32, v: usize) {
        for (r, &target) in targets.iter().enumerate() {
            let pr = &mut p[r * v..(r + 1) * v];
            let (zr, mr) = (&z[r * v..(r + 1) * v], &m[r * v..(r + 1) * v]);
            for j in 0..v {
                pr[j] = zr[j] * scale + mr[j];
            }
            let m = max(pr);
            let sum = exp_shifted(pr, m);
            lp[r] = zr[target] * scale + mr[target] - m - sum.ln();
            let inv = 1.0 / sum;
            for x in pr.iter_mut() {
                *x *= inv;
            }
        }
    }
}

/// Gradient of the log-probabilities with respect to the logits: `g·scale·(onehot − p)`.
pub fn token_logprob_backward(probs: &[f32], targets: &[usize], g: &[f32], scale: f32) -> Vec<f32> {
    let v = probs.len() / targets.len();
    let mut dz = vec![0.0; probs.len()];
    (dz.par_chunks_mut(CHUNK_ROWS * v), probs.par_chunks(CHUNK_ROWS * v), targets.par_chunks(CHUNK_ROWS), g.par_chunks(CHUNK_ROWS))
        .into_par_iter()
        .for_each(|(dz, p, tg, g)| {
            for (r, (&target, &gr)) in tg.iter().zip(g).enumerate() {
                let w = gr * scale;
                for (o, &pj) in dz[r * v..(r + 1) * v].iter_mut().zip(&p[r * v..(r + 1) * v]) {
                    *o = -w * pj;
                }
                dz[r * v + target] += w;
            }
        });
    dz
}
