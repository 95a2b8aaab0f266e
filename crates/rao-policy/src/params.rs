//! Parameters as flat f32 vectors in a fixed (visit) order: the checkpoint format and what the
//! optimiser works on. Bit-exact and independent of Burn's random parameter ids.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{Tensor, TensorData};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::model::Transformer;

/// Every float parameter's values, in visit order.
pub fn read_params(model: &Transformer) -> Vec<Vec<f32>> {
    read_params_where(model, None)
}

/// The values of the parameters `mask` selects (all when `None`), in visit order.
pub fn read_params_where(model: &Transformer, mask: Option<&[bool]>) -> Vec<Vec<f32>> {
    struct Reader<'a> {
        mask: Option<&'a [bool]>,
        next: usize,
        out: Vec<Vec<f32>>,
    }
    impl ModuleVisitor for Reader<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if selected(self.mask, self.next) {
                self.out.push(param.val().into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 parameters"));
            }
            self.next += 1;
        }
    }
    let mut r = Reader { mask, next: 0, out: Vec::new() };
    model.visit(&mut r);
    r.out
}

fn selected(mask: Option<&[bool]>, i: usize) -> bool {
    mask.is_none_or(|m| m[i])
}

/// Shapes of the parameters, in visit order.
pub fn param_shapes(model: &Transformer) -> Vec<Vec<usize>> {
    struct Shapes(Vec<Vec<usize>>);
    impl ModuleVisitor for Shapes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.val().dims().to_vec());
        }
    }
    let mut s = Shapes(Vec::new());
    model.visit(&mut s);
    s.0
}

/// Replace every parameter's values (same order and sizes as [`read_params`]).
pub fn write_params(model: Transformer, values: &[Vec<f32>]) -> Transformer {
    write_params_where(model, None, values)
}

/// Replace the values of the parameters `mask` selects (all when `None`), given in visit order;
/// each keeps its id and whether it is trained.
pub fn write_params_where(model: Transformer, mask: Option<&[bool]>, values: &[Vec<f32>]) -> Transformer {
    struct Writer<'a> {
        mask: Option<&'a [bool]>,
        values: &'a [Vec<f32>],
        index: usize,
        next: usize,
    }
    impl ModuleMapper for Writer<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let i = self.index;
            self.index += 1;
            if !selected(self.mask, i) {
                return param;
            }
            let t = param.val();
            let (shape, device) = (t.shape(), t.device());
            let v = self.values[self.next].clone();
            assert_eq!(v.len(), shape.num_elements(), "parameter {i} has the wrong size");
            self.next += 1;
            let fresh = Tensor::<D>::from_data(TensorData::new(v, shape), &device);
            let mut p = Param::from_tensor(fresh).set_require_grad(param.is_require_grad());
            p.id = param.id;
            p
        }
    }
    model.map(&mut Writer { mask, values, index: 0, next: 0 })
}

/// Gradients of the parameters `mask` selects (all when `None`; zeros where a parameter got
/// none), in visit order.
pub fn read_grads_where(model: &Transformer, grads: &burn::tensor::Gradients, mask: Option<&[bool]>) -> Vec<Vec<f32>> {
    struct Grads<'a> {
        grads: &'a burn::tensor::Gradients,
        mask: Option<&'a [bool]>,
        next: usize,
        out: Vec<Vec<f32>>,
    }
    impl ModuleVisitor for Grads<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let i = self.next;
            self.next += 1;
            if !selected(self.mask, i) {
                return;
            }
            let t = param.val();
            let n = t.shape().num_elements();
            let g = t
                .grad(self.grads)
                .map(|g| g.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 gradients"))
                .unwrap_or_else(|| vec![0.0; n]);
            self.out.push(g);
        }
    }
    let mut v = Grads { grads, mask, next: 0, out: Vec::new() };
    model.visit(&mut v);
    v.out
}

/// Gradients of every parameter (zeros where a parameter got none), in visit order.
pub fn read_grads(model: &Transformer, grads: &burn::tensor::Gradients) -> Vec<Vec<f32>> {
    read_grads_where(model, grads, None)
}

/// AdamW with global gradient-norm clipping, on flat vectors.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AdamW {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Clip the global L2 norm of all gradients to this (0 = no clipping).
    pub clip_norm: f64,
    pub step: u64,
    #[serde(skip)]
    pub m: Vec<Vec<f32>>,
    #[serde(skip)]
    pub v: Vec<Vec<f32>>,
}

impl AdamW {
    pub fn new(clip_norm: f64, weight_decay: f64) -> Self {
        AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay, clip_norm, step: 0, m: vec![], v: vec![] }
    }

    /// One update of `params` with `grads`; returns the gradient norm before clipping.
    pub fn update(&mut self, params: &mut [Vec<f32>], grads: &[Vec<f32>], lr: f64) -> f64 {
        if self.m.is_empty() {
            self.m = params.iter().map(|p| vec![0.0; p.len()]).collect();
            self.v = params.iter().map(|p| vec![0.0; p.len()]).collect();
        }
        // One accumulator in parameter order (the same bits on any number of threads).
        let mut sum_sq = 0.0f64;
        for g in grads {
            for &x in g {
                sum_sq += (x as f64) * (x as f64);
            }
        }
        let norm = sum_sq.sqrt();
        let scale = if self.clip_norm > 0.0 && norm > self.clip_norm { self.clip_norm / norm } else { 1.0 };
        self.step += 1;
        let (b1, b2, eps, wd) = (self.beta1, self.beta2, self.eps, self.weight_decay);
        let c1 = 1.0 - b1.powi(self.step as i32);
        let c2 = 1.0 - b2.powi(self.step as i32);
        // Element-wise, so chunks on all threads give the same bits as one loop.
        const CHUNK: usize = 1 << 14;
        for (k, (p, g)) in params.iter_mut().zip(grads).enumerate() {
            let (m, v) = (&mut self.m[k], &mut self.v[k]);
            (p.par_chunks_mut(CHUNK), g.par_chunks(CHUNK), m.par_chunks_mut(CHUNK), v.par_chunks_mut(CHUNK)).into_par_iter().for_each(
                |(p, g, m, v)| {
                    for i in 0..p.len() {
                        let gi = g[i] as f64 * scale;
                        let mi = b1 * m[i] as f64 + (1.0 - b1) * gi;
                        let vi = b2 * v[i] as f64 + (1.0 - b2) * gi * gi;
                        m[i] = mi as f32;
                        v[i] = vi as f32;
                        let update = (mi / c1) / ((vi / c2).sqrt() + eps) + wd * p[i] as f64;
                        p[i] = (p[i] as f64 - lr * update) as f32;
                    }
                },
            );
        }
        norm
    }
}

pub fn f32s_to_bytes(v: &[Vec<f32>]) -> Vec<u8> {
    v.iter().flatten().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn bytes_to_f32s(bytes: &[u8], sizes: &[usize]) -> anyhow::Result<Vec<Vec<f32>>> {
    let total: usize = sizes.iter().sum();
    anyhow::ensure!(bytes.len() == total * 4, "expected {} bytes of parameters, found {}", total * 4, bytes.len());
    let mut out = Vec::with_capacity(sizes.len());
    let mut off = 0;
    for &n in sizes {
        out.push(bytes[off..off + 4 * n].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect());
        off += 4 * n;
    }
    Ok(out)
}

/// Id of the `index`-th parameter in visit order. Burn draws ids at random; a fixed id makes the
/// Burn record of a checkpoint (which stores ids) a function of the parameters alone.
pub fn param_id(index: usize) -> burn::module::ParamId {
    burn::module::ParamId::from(index as u64 + 1)
}
