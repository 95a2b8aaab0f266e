//! The fused kernels as a Burn backend extension: implemented for the Flex CPU backend and, with
//! handwritten backward passes, for autodiff over Flex. Other backends (wgpu) never call these:
//! the wrappers in [`super`] send them to the decomposed ops instead.

use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, DType, Flex, Shape, TensorData, TensorMetadata, backend_extension};

use super::attention::{self, Dims};
use super::gemm::{View, product};
use super::pointwise;

#[backend_extension(Flex, Autodiff)]
pub trait FusedOps: Backend {
    /// See [`attention::forward`]: `qkv: [B·T, Dq + 2·Dkv]`, `cos`, `sin: [B·T, Dh]`,
    /// `bias: [B, T, T]`; returns `[B·T, Dq]`.
    fn rope_attention(
        qkv: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        heads: usize,
        kv_heads: usize,
    ) -> FloatTensor<Self>;
    /// `silu(a)·b` for rows `[a, b]` of `gu: [N, 2F]`; returns `[N, F]`.
    fn swiglu(gu: FloatTensor<Self>) -> FloatTensor<Self>;
    /// RMSNorm of the rows of `x: [N, D]` with gain `gamma: [D]`.
    fn rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, eps: f32) -> FloatTensor<Self>;
    /// `x·w` for `x: [N, D]`, `w: [D, F]`.
    fn linear(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self>;
    /// `[N]` log-probabilities of `targets` under `softmax(logits·scale + mask)`, rows `[N, V]`.
    fn token_logprobs(logits: FloatTensor<Self>, mask: FloatTensor<Self>, targets: Vec<usize>, scale: f32) -> FloatTensor<Self>;
}

/// A contiguous f32 view (copies only a strided or offset tensor).
fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.as_slice::<f32>().is_some() { t } else { t.to_contiguous() }
}

/// A 2-D f32 tensor as a strided matrix over its storage, when its strides are non-negative.
fn matrix(t: &FlexTensor) -> Option<(&[f32], View)> {
    let layout = t.layout();
    let (rows, cols, rs, cs) = layout.as_2d_strides()?;
    if t.dtype() != DType::F32 || rs < 0 || cs < 0 {
        return None;
    }
    Some((&t.storage::<f32>()[layout.start_offset()..], View { rows, cols, rs: rs as usize, cs: cs as usize }))
}

/// A tensor gemm reads as it is: a transposed or strided matrix (a tied embedding read as the
/// output layer, `Eᵀ`: 25 MB copied per decoded token for a 16k × 384 table) goes to gemm with
/// its strides; anything else is made contiguous.
fn gemm_operand(t: FlexTensor) -> FlexTensor {
    if matrix(&t).is_some() { t } else { t.to_contiguous() }
}

fn matrix_of(t: &FlexTensor) -> (&[f32], View) {
    matrix(t).expect("gemm operands are strided f32 matrices (gemm_operand)")
}

fn values(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("fused kernels take contiguous f32 tensors")
}

fn tensor(v: Vec<f32>, shape: Shape) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(v, shape))
}

/// The attention inputs, made contiguous, in [`attention::Inputs`] order.
#[derive(Clone)]
struct AttentionArgs {
    tensors: [FlexTensor; 4],
    dims: Dims,
}

impl AttentionArgs {
    fn new(t: [FlexTensor; 4], heads: usize, kv_heads: usize) -> Self {
        let tensors = t.map(contiguous);
        let [rows, dh] = tensors[1].shape().dims::<2>();
        let [batch, t, _] = tensors[3].shape().dims::<3>();
        let dims = Dims { batch, t, heads, kv_heads, dh };
        assert!(kv_heads > 0 && heads.is_multiple_of(kv_heads), "{heads} query heads in groups of {kv_heads} key/value heads");
        assert_eq!(tensors[0].shape().dims::<2>(), [rows, dims.width()], "qkv must be [B·T, Dq + 2·Dkv]");
        assert_eq!(batch * t, rows, "attention bias must be [B, T, T] for [B·T, ·] rows");
        AttentionArgs { tensors, dims }
    }

    fn inputs(&self) -> attention::Inputs<'_> {
        let [qkv, cos, sin, bias] = self.tensors.each_ref().map(values);
        attention::Inputs { qkv, cos, sin, bias }
    }

    /// `[B·T, Dq]`, the output's shape.
    fn out_shape(&self) -> Shape {
        Shape::from(vec![self.dims.batch * self.dims.t, self.dims.dq()])
    }
}

impl FusedOps for Flex {
    fn rope_attention(qkv: FlexTensor, cos: FlexTensor, sin: FlexTensor, bias: FlexTensor, heads: usize, kv_heads: usize) -> FlexTensor {
        let args = AttentionArgs::new([qkv, cos, sin, bias], heads, kv_heads);
        tensor(attention::forward(&args.inputs(), args.dims).0, args.out_shape())
    }

    fn swiglu(gu: FlexTensor) -> FlexTensor {
        let gu = contiguous(gu);
        let [n, f2] = gu.shape().dims::<2>();
        tensor(pointwise::swiglu_forward(values(&gu), f2 / 2), Shape::from(vec![n, f2 / 2]))
    }

    fn rms_norm(x: FlexTensor, gamma: FlexTensor, eps: f32) -> FlexTensor {
        let (x, gamma) = (contiguous(x), contiguous(gamma));
        tensor(pointwise::rms_norm_forward(values(&x), values(&gamma), eps).0, x.shape())
    }

    fn linear(x: FlexTensor, w: FlexTensor) -> FlexTensor {
        let (x, w) = (gemm_operand(x), gemm_operand(w));
        let ((xs, xv), (ws, wv)) = (matrix_of(&x), matrix_of(&w));
        tensor(product(xs, xv, ws, wv), Shape::from(vec![xv.rows, wv.cols]))
    }

    fn token_logprobs(logits: FlexTensor, mask: FlexTensor, targets: Vec<usize>, scale: f32) -> FlexTensor {
        let (logits, mask) = (contiguous(logits), contiguous(mask));
        let n = targets.len();
        tensor(pointwise::token_logprob_forward(values(&logits), values(&mask), &targets, scale).0, Shape::from(vec![n]))
    }
}

/// Backward state: what the forward pass computed or read, behind an `Arc` (the autodiff graph
/// clones states).
struct Saved<T>(Arc<T>);

impl<T> Clone for Saved<T> {
    fn clone(&self) -> Self {
        Saved(Arc::clone(&self.0))
    }
}

impl<T> std::fmt::Debug for Saved<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Saved")
    }
}

impl<C: CheckpointStrategy> FusedOps for Autodiff<Flex, C> {
    fn rope_attention(
        qkv: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        heads: usize,
        kv_heads: usize,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct RopeAttention;
        impl Backward<Flex, 1> for RopeAttention {
            type State = Saved<(AttentionArgs, attention::Saved, FlexTensor)>;
            fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
                let (args, saved, out) = &*ops.state.0;
                let g = contiguous(grads.consume::<Flex>(&ops.node));
                let [parent] = ops.parents;
                if let Some(node) = parent {
                    let grad = attention::backward(&args.inputs(), saved, values(out), values(&g), args.dims);
                    grads.register::<Flex>(node.id, tensor(grad, args.tensors[0].shape()));
                }
            }
        }
        // cos, sin and bias are constants (rotary tables, mask): no gradient flows to them.
        let prims = [&qkv, &cos, &sin, &bias].map(|t| t.primitive().clone());
        let args = AttentionArgs::new(prims, heads, kv_heads);
        let (out, saved) = attention::forward(&args.inputs(), args.dims);
        let out = tensor(out, args.out_shape());
        match RopeAttention.prepare::<C>([qkv.node()]).compute_bound().stateful() {
            // The state shares the output's buffer (a FlexTensor clone is a reference count).
            OpsKind::Tracked(prep) => prep.finish(Saved(Arc::new((args, saved, out.clone()))), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn swiglu(gu: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Swiglu;
        impl Backward<Flex, 1> for Swiglu {
            type State = Saved<FlexTensor>;
            fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
                let gu = &*ops.state.0;
                let g = contiguous(grads.consume::<Flex>(&ops.node));
                let [parent] = ops.parents;
                if let Some(node) = parent {
                    let f = gu.shape().dims::<2>()[1] / 2;
                    grads.register::<Flex>(node.id, tensor(pointwise::swiglu_backward(values(gu), f, values(&g)), gu.shape()));
                }
            }
        }
        let pgu = contiguous(gu.primitive().clone());
        let [n, f2] = pgu.shape().dims::<2>();
        let out = tensor(pointwise::swiglu_forward(values(&pgu), f2 / 2), Shape::from(vec![n, f2 / 2]));
        match Swiglu.prepare::<C>([gu.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(Saved(Arc::new(pgu)), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, eps: f32) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct RmsNorm;
        impl Backward<Flex, 2> for RmsNorm {
            type State = Saved<(FlexTensor, FlexTensor, Vec<f32>)>;
            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
                let (x, gamma, inv) = &*ops.state.0;
                let g = contiguous(grads.consume::<Flex>(&ops.node));
                let (dx, dgamma) = pointwise::rms_norm_backward(values(x), values(gamma), inv, values(&g));
                let [px, pg] = ops.parents;
                if let Some(node) = px {
                    grads.register::<Flex>(node.id, tensor(dx, x.shape()));
                }
                if let Some(node) = pg {
                    grads.register::<Flex>(node.id, tensor(dgamma, gamma.shape()));
                }
            }
        }
        let (px, pg) = (contiguous(x.primitive().clone()), contiguous(gamma.primitive().clone()));
        let (y, inv) = pointwise::rms_norm_forward(values(&px), values(&pg), eps);
        let out = tensor(y, px.shape());
        match RmsNorm.prepare::<C>([x.node(), gamma.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(Saved(Arc::new((px, pg, inv))), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn linear(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Linear;
        impl Backward<Flex, 2> for Linear {
            type State = Saved<(FlexTensor, FlexTensor)>;
            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
                let (x, w) = &*ops.state.0;
                let g = contiguous(grads.consume::<Flex>(&ops.node));
                let ((xs, xv), (ws, wv)) = (matrix_of(x), matrix_of(w));
                let gv = View::rows(xv.rows, wv.cols, wv.cols);
                let [px, pw] = ops.parents;
                if let Some(node) = px {
                    // dx = g·wᵀ
                    let dx = product(values(&g), gv, ws, wv.t());
                    grads.register::<Flex>(node.id, tensor(dx, x.shape()));
                }
                if let Some(node) = pw {
                    // dw = xᵀ·g
                    let dw = product(xs, xv.t(), values(&g), gv);
                    grads.register::<Flex>(node.id, tensor(dw, w.shape()));
                }
            }
        }
        let (px, pw) = (gemm_operand(x.primitive().clone()), gemm_operand(w.primitive().clone()));
        let out = <Flex as FusedOps>::linear(px.clone(), pw.clone());
        match Linear.prepare::<C>([x.node(), w.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(Saved(Arc::new((px, pw))), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn token_logprobs(logits: FloatTensor<Self>, mask: FloatTensor<Self>, targets: Vec<usize>, scale: f32) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct TokenLogprobs;
        impl Backward<Flex, 1> for TokenLogprobs {
            type State = Saved<(Vec<f32>, Vec<usize>, Shape, f32)>;
            fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
                let (probs, targets, shape, scale) = &*ops.state.0;
                let g = contiguous(grads.consume::<Flex>(&ops.node));
                let [parent] = ops.parents;
                if let Some(node) = parent {
                    let dz = pointwise::token_logprob_backward(probs, targets, values(&g), *scale);
                    grads.register::<Flex>(node.id, tensor(dz, shape.clone()));
                }
            }
        }
        // The mask is a constant (the grammar): no gradient flows to it.
        let (pz, pm) = (contiguous(logits.primitive().clone()), contiguous(mask.primitive().clone()));
        let (lp, probs) = pointwise::token_logprob_forward(values(&pz), values(&pm), &targets, scale);
        let out = tensor(lp, Shape::from(vec![targets.len()]));
        match TokenLogprobs.prepare::<C>([logits.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(Saved(Arc::new((probs, targets, pz.shape(), scale))), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}
