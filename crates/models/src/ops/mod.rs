//! The ops a lean training step is made of, for the config models and for
//! your own candle model.
//!
//! **Fused ops.** candle keeps every tensor an op consumed until the graph
//! is dropped, so a norm, a rotation or an MLP activation written as candle
//! ops keeps each intermediate for the backward pass, needed or not
//! (PyTorch keeps only what each backward needs). Each op here is one node
//! of candle's graph: its forward pass runs off the graph (candle's fused
//! kernel where it has one), the graph keeps the node's inputs and output,
//! and its backward pass recomputes the rest. Exact against the eager forms
//! ([`eager`]: outputs and gradients within 1e-5 relative in f32, property-tested):
//!
//! - [`rms_norm`], [`layer_norm`] (candle's fused kernels have no backward
//!   pass and cut the graph: these have one), [`softmax_last_dim`];
//! - [`rope`], [`rope_i`], [`rope_thd`] (the same kernels, rotating the
//!   gradient back);
//! - [`swiglu`], [`geglu`], [`gated`] (the activation between the halves
//!   not kept), [`activation`] (its derivative a block of rows at a time);
//! - [`linear`] (the bias added in the same node), [`residual_linear`] (a
//!   block's output projection added to the stream) and
//!   [`residual_mlp_down`] (an MLP's down projection of its activation added
//!   to the stream: the activation not kept);
//! - [`lora_linear`] (a frozen projection and its LoRA adapters, optionally
//!   added to the stream: neither the base's output nor the adapters' kept).
//!
//! A model file (yours, or a fork of a candle-transformers model) switches
//! by changing an import, the signatures being candle's:
//!
//! ```text
//! - use candle_nn::ops::{rms_norm, softmax_last_dim};
//! - use candle_nn::rotary_emb::rope;
//! + use autobatch_models::ops::{rms_norm, rope, softmax_last_dim};
//! ```
//!
//! and candle-nn's layers the same way, by the same names ([`nn`]):
//!
//! ```text
//! - use candle_nn::{layer_norm, rms_norm, LayerNorm, RmsNorm};
//! + use autobatch_models::ops::nn::{layer_norm, rms_norm, LayerNorm, RmsNorm};
//! ```
//!
//! **Attention and the loss in blocks.** [`BlockedAttention`] never makes
//! the scores whole, [`ChunkedCrossEntropy`] never the logits.
//!
//! **A frozen base.** [`frozen_linear`] and [`quantized_linear`] (a LoRA or
//! QLoRA model's frozen projections, whose backward pass gives the input its
//! gradient and the weight none), [`matmul`], [`add_constant`] and
//! [`mul_constant`] (no gradient kept for an operand outside the graph).

mod activation;
mod adapters;
mod attention;
pub mod eager;
mod linear;
mod loss;
pub mod nn;
mod node;
mod norm;
mod rotary;
mod routed;
mod softmax;
#[cfg(test)]
mod testing;

pub(crate) use activation::ROWS_AT_ONCE;
pub use activation::{Activation, activation, gated, geglu, swiglu};
pub use adapters::lora_linear;
pub use attention::{BlockedAttention, DEFAULT_BLOCK, attention};
pub(crate) use linear::{Weight, mlp_down_of, residual_linear_of, residual_mlp_down_of};
pub use linear::{linear, residual_linear, residual_mlp_down};
pub(crate) use loss::add_rows_in_place;
pub use loss::{
    ChunkedCrossEntropy, FROZEN_HEAD_CHUNK_ELEMENTS, FROZEN_HEAD_CHUNK_ROWS, IGNORE_INDEX, MIN_CHUNK_ROWS,
    default_chunk_rows,
};
pub use norm::{layer_norm, rms_norm};
pub use rotary::{rope, rope_i, rope_thd};
pub(crate) use routed::{routed_sum, routed_sum_eager};
pub use softmax::softmax_last_dim;

use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::{Module, Result, Tensor};

/// `x · weightᵀ (+ bias)` over a frozen weight (and bias): the backward pass
/// gives `x` its gradient and the weight none.
///
/// candle's matmul backward computes both operands' gradients, and a weight
/// that is not a variable is never taken out of the gradient store: every
/// frozen weight of a LoRA model keeps a gradient of its full size until the
/// store is dropped (as much as full fine-tuning's gradients), and the
/// backward pass spends half its matrix work on them. This is the same
/// product as `candle_nn::Linear` (to 1e-6 in f32, tested), computed by
/// candle's own matmul in a custom op whose backward returns the input's
/// gradient only. `x` is `(…, in)`, `weight` `(out, in)`, `bias` `(out)`.
///
/// ```
/// use autobatch_models::ops::frozen_linear;
/// use candle_core::{Device, Tensor, Var};
///
/// let weight = Tensor::ones((3, 4), candle_core::DType::F32, &Device::Cpu)?; // frozen: a plain tensor
/// let x = Var::ones((2, 4), candle_core::DType::F32, &Device::Cpu)?;
/// let y = frozen_linear(x.as_tensor(), &weight, None)?;
/// let grads = y.sum_all()?.backward()?;
/// assert!(grads.get(&x).is_some() && grads.get(&weight).is_none());
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn frozen_linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let (out_features, in_features) = weight.dims2()?;
    let dims = x.dims();
    let Some((&last, lead)) = dims.split_last() else {
        candle_core::bail!("frozen_linear: the input is a scalar; it needs (…, {in_features})")
    };
    if last != in_features {
        candle_core::bail!("frozen_linear: input of {last} features for a weight of {in_features} ({out_features} out)")
    }
    let rows = lead.iter().product::<usize>();
    let flat = x.reshape((rows, in_features))?;
    let product = matmul(&flat, &weight.detach().t()?)?;
    let mut shape = lead.to_vec();
    shape.push(out_features);
    let product = product.reshape(shape)?;
    match bias {
        Some(bias) => add_constant(&product, &bias.detach()),
        None => Ok(product),
    }
}

/// `a · b` as `Tensor::matmul` computes it (batched over leading dimensions,
/// any strides candle's matmul takes), whose backward pass computes a
/// gradient only for an operand that takes part in the graph (a variable,
/// or computed from one).
///
/// candle's matmul backward computes both operands' gradients and keeps the
/// one of an operand outside the graph (a frozen weight, a key computed from
/// frozen layers) in the gradient store until it is dropped; this one keeps
/// none, and does not compute it. The product and the gradients that are
/// computed are candle's own (tested).
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !a.track_op() && !b.track_op() {
        return a.matmul(b);
    }
    a.apply_op2(b, Product)
}

/// `a · b` by candle's matmul; gradients only for operands in the graph.
struct Product;

impl Product {
    /// (batch, m, n, k) of `a` `(…, m, k)` times `b` `(…, k, n)`.
    fn bmnk(l1: &candle_core::Layout, l2: &candle_core::Layout) -> Result<(usize, usize, usize, usize)> {
        let (a, b) = (l1.dims(), l2.dims());
        let rank = a.len();
        if rank < 2 || b.len() != rank || a[rank - 1] != b[rank - 2] || a[..rank - 2] != b[..rank - 2] {
            candle_core::bail!("matmul of {a:?} and {b:?}: the shapes do not multiply")
        }
        Ok((a[..rank - 2].iter().product(), a[rank - 2], b[rank - 1], a[rank - 1]))
    }

    fn shape(l1: &candle_core::Layout, l2: &candle_core::Layout) -> candle_core::Shape {
        let mut dims = l1.dims().to_vec();
        let rank = dims.len();
        dims[rank - 1] = l2.dims()[rank - 1];
        dims.into()
    }

    fn apply<S: candle_core::backend::BackendStorage>(
        s1: &S,
        l1: &candle_core::Layout,
        s2: &S,
        l2: &candle_core::Layout,
    ) -> Result<(S, candle_core::Shape)> {
        Ok((s1.matmul(s2, Self::bmnk(l1, l2)?, l1, l2)?, Self::shape(l1, l2)))
    }
}

impl candle_core::CustomOp2 for Product {
    fn name(&self) -> &'static str {
        "matmul-of-the-graph"
    }

    fn cpu_fwd(
        &self,
        s1: &candle_core::CpuStorage,
        l1: &candle_core::Layout,
        s2: &candle_core::CpuStorage,
        l2: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        Self::apply(s1, l1, s2, l2)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &candle_core::Layout,
        s2: &candle_core::CudaStorage,
        l2: &candle_core::Layout,
    ) -> Result<(candle_core::CudaStorage, candle_core::Shape)> {
        Self::apply(s1, l1, s2, l2)
    }

    fn bwd(&self, a: &Tensor, b: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let ga = if a.track_op() { Some(grad.matmul(&b.t()?)?) } else { None };
        let gb = if b.track_op() { Some(a.t()?.matmul(grad)?) } else { None };
        Ok((ga, gb))
    }
}

/// `x + constant`, the constant broadcast to `x`'s shape (an additive
/// attention mask): the backward pass gives `x` its gradient and the constant
/// none.
///
/// `x.broadcast_add(&mask)` broadcasts the mask to a new tensor of `x`'s
/// shape that candle's backward pass then gives a gradient of its own, kept
/// in the gradient store until it is dropped: for a causal mask, one more
/// tensor the size of the attention scores of every layer (measured on the
/// reference transformer: 896 KiB beside its variables' 536 KiB). The sum is
/// the same (tested).
///
/// ```
/// use autobatch_models::ops::add_constant;
/// use candle_core::{Device, Tensor, Var};
///
/// let scores = Var::ones((2, 3, 3), candle_core::DType::F32, &Device::Cpu)?;
/// let mask = Tensor::zeros((3, 3), candle_core::DType::F32, &Device::Cpu)?;
/// let grads = add_constant(scores.as_tensor(), &mask)?.sum_all()?.backward()?;
/// assert!(grads.get(&scores).is_some());
/// assert_eq!(grads.get_ids().count(), 1); // the scores' gradient only
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn add_constant(x: &Tensor, constant: &Tensor) -> Result<Tensor> {
    x.apply_op2(&constant.detach(), WithConstant::Add)
}

/// `x · constant`, the constant broadcast to `x`'s shape (rotary tables, a
/// fixed scale): the backward pass gives `x` its gradient, `grad · constant`,
/// and the constant none (`broadcast_mul` would keep one of `x`'s size).
pub fn mul_constant(x: &Tensor, constant: &Tensor) -> Result<Tensor> {
    x.apply_op2(&constant.detach(), WithConstant::Mul)
}

/// `x ∘ c`, `c` broadcast to `x`: a constant with no gradient.
#[derive(Clone, Copy)]
enum WithConstant {
    Add,
    Mul,
}

impl WithConstant {
    fn apply<S: candle_core::backend::BackendStorage>(
        self,
        s1: &S,
        l1: &candle_core::Layout,
        s2: &S,
        l2: &candle_core::Layout,
    ) -> Result<(S, candle_core::Shape)> {
        let broadcast = l2.broadcast_as(l1.shape())?;
        let result = match self {
            WithConstant::Add => s1.binary_impl::<candle_core::op::Add>(s2, l1, &broadcast)?,
            WithConstant::Mul => s1.binary_impl::<candle_core::op::Mul>(s2, l1, &broadcast)?,
        };
        Ok((result, l1.shape().clone()))
    }
}

impl candle_core::CustomOp2 for WithConstant {
    fn name(&self) -> &'static str {
        match self {
            WithConstant::Add => "add-constant",
            WithConstant::Mul => "mul-constant",
        }
    }

    fn cpu_fwd(
        &self,
        s1: &candle_core::CpuStorage,
        l1: &candle_core::Layout,
        s2: &candle_core::CpuStorage,
        l2: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        self.apply(s1, l1, s2, l2)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &candle_core::Layout,
        s2: &candle_core::CudaStorage,
        l2: &candle_core::Layout,
    ) -> Result<(candle_core::CudaStorage, candle_core::Shape)> {
        self.apply(s1, l1, s2, l2)
    }

    fn bwd(&self, x: &Tensor, c: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        if !x.track_op() {
            return Ok((None, None));
        }
        match self {
            WithConstant::Add => Ok((Some(grad.clone()), None)),
            WithConstant::Mul => Ok((Some(grad.broadcast_mul(c)?), None)),
        }
    }
}

/// `x · weightᵀ (+ bias)` over a frozen quantized weight (`q8_0`, `q4_0`, any
/// of candle's `GgmlDType`s), whose backward pass gives `x` its gradient,
/// `grad · dequantize(weight)`, and the weight none: QLoRA's frozen base.
///
/// Computed as bitsandbytes computes QLoRA: each product, forward and
/// backward, dequantizes the weight for the moment it multiplies, in the
/// input's dtype, and only the quantized blocks stay. (`QMatMul` records no
/// backward pass, so adapters under it would never learn; and its CPU path
/// keeps a thread-local copy of the largest input it quantized, memory that
/// grows with the batch and is never returned.) So the product equals the
/// one over the dequantized weight, and a step holds one dequantized
/// weight at a time beside its activations. The weight is `(out, in)`, `in`
/// a multiple of the block size (32 for `q8_0` and `q4_0`).
///
/// ```
/// use std::sync::Arc;
/// use autobatch_models::ops::quantized_linear;
/// use candle_core::quantized::{GgmlDType, QTensor};
/// use candle_core::{DType, Device, Tensor, Var};
///
/// let weight = Tensor::ones((8, 64), DType::F32, &Device::Cpu)?;
/// let weight = Arc::new(QTensor::quantize(&weight, GgmlDType::Q8_0)?);
/// let x = Var::ones((2, 3, 64), DType::F32, &Device::Cpu)?;
/// let y = quantized_linear(x.as_tensor(), &weight, None)?;
/// assert_eq!(y.dims(), &[2, 3, 8]);
/// let grads = y.sum_all()?.backward()?;
/// let input_grad = grads.get(&x).unwrap().to_vec3::<f32>()?[0][0][0];
/// assert!((input_grad - 8.0).abs() < 0.01); // 8 outputs of weight 1, as q8_0 holds it
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn quantized_linear(x: &Tensor, weight: &Arc<QTensor>, bias: Option<&Tensor>) -> Result<Tensor> {
    let (out_features, in_features) = weight.shape().dims2()?;
    let dims = x.dims();
    let Some((&last, lead)) = dims.split_last().filter(|&(&last, _)| last == in_features) else {
        candle_core::bail!(
            "quantized_linear: input of shape {dims:?} for a weight of {in_features} features in ({out_features} out): its last dimension must be {in_features}"
        )
    };
    let rows = lead.iter().product::<usize>();
    let product = x.reshape((rows, last))?.apply_op1(QuantizedProduct(weight.clone()))?;
    let mut shape = lead.to_vec();
    shape.push(out_features);
    let product = product.reshape(shape)?;
    match bias {
        Some(bias) => add_constant(&product, &bias.detach()),
        None => Ok(product),
    }
}

/// `x · Wᵀ` over a quantized `W`, dequantized for the product; with the
/// input's gradient.
struct QuantizedProduct(Arc<QTensor>);

impl QuantizedProduct {
    /// `W` as `(out, in)` in `dtype` on `device`, outside any graph.
    fn dequantized(&self, device: &candle_core::Device, dtype: candle_core::DType) -> Result<Tensor> {
        self.0.dequantize(device)?.to_dtype(dtype)
    }

    /// `x · Wᵀ` on one backend: `W` dequantized on `device`, its storage
    /// taken out by `backend`.
    fn apply<S: candle_core::backend::BackendStorage>(
        &self,
        x: &S,
        layout: &candle_core::Layout,
        device: &candle_core::Device,
        backend: impl Fn(&candle_core::Storage) -> Option<&S>,
    ) -> Result<(S, candle_core::Shape)> {
        let weight = self.dequantized(device, x.dtype())?;
        let (storage, weight_layout) = weight.storage_and_layout();
        let Some(weight_storage) = backend(&storage) else {
            candle_core::bail!("a weight dequantized on {device:?} is on another device")
        };
        Product::apply(x, layout, weight_storage, &weight_layout.transpose(0, 1)?)
    }
}

impl candle_core::CustomOp1 for QuantizedProduct {
    fn name(&self) -> &'static str {
        "dequantized-matmul-of-the-graph"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        self.apply(storage, layout, &candle_core::Device::Cpu, |s| match s {
            candle_core::Storage::Cpu(s) => Some(s),
            _ => None,
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &candle_core::Layout,
    ) -> Result<(candle_core::CudaStorage, candle_core::Shape)> {
        use candle_core::backend::BackendStorage;
        let device = candle_core::Device::Cuda(storage.device().clone());
        self.apply(storage, layout, &device, |s| match s {
            candle_core::Storage::Cuda(s) => Some(s),
            _ => None,
        })
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        if !x.track_op() {
            return Ok(None);
        }
        Ok(Some(grad.matmul(&self.dequantized(grad.device(), grad.dtype())?)?))
    }
}

/// A frozen projection's weight: a tensor, or quantized.
#[derive(Clone, Debug)]
enum FrozenWeight {
    Dense(Tensor),
    Quantized(Arc<QTensor>),
}

/// [`frozen_linear`] (or [`quantized_linear`]) as a layer: a
/// `candle_nn::Linear` whose weight and bias are frozen (read from a
/// `VarBuilder` over checkpoint tensors, or detached, or quantized).
#[derive(Clone, Debug)]
pub struct FrozenLinear {
    weight: FrozenWeight,
    bias: Option<Tensor>,
}

impl FrozenLinear {
    /// A frozen layer of `weight` (out, in) and `bias` (out); both are detached.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> FrozenLinear {
        FrozenLinear { weight: FrozenWeight::Dense(weight.detach()), bias: bias.map(|b| b.detach()) }
    }

    /// A frozen layer over a quantized `weight` (out, in) and `bias` (out).
    pub fn quantized(weight: Arc<QTensor>, bias: Option<Tensor>) -> FrozenLinear {
        FrozenLinear { weight: FrozenWeight::Quantized(weight), bias: bias.map(|b| b.detach()) }
    }

    /// The frozen weight, unless it is quantized.
    pub fn weight(&self) -> Option<&Tensor> {
        match &self.weight {
            FrozenWeight::Dense(weight) => Some(weight),
            FrozenWeight::Quantized(_) => None,
        }
    }

    /// The quantized weight, if it is one.
    pub fn quantized_weight(&self) -> Option<&Arc<QTensor>> {
        match &self.weight {
            FrozenWeight::Quantized(weight) => Some(weight),
            FrozenWeight::Dense(_) => None,
        }
    }

    /// The bias, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The input's gradient `(rows, in)` for the output's `grad` `(rows,
    /// out)`: `grad · W` (a quantized weight dequantized for the product).
    pub(crate) fn input_gradient(&self, grad: &Tensor) -> Result<Tensor> {
        match &self.weight {
            FrozenWeight::Dense(weight) => grad.matmul(weight),
            FrozenWeight::Quantized(weight) => {
                grad.matmul(&QuantizedProduct(weight.clone()).dequantized(grad.device(), grad.dtype())?)
            }
        }
    }
}

impl Module for FrozenLinear {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        match &self.weight {
            FrozenWeight::Dense(weight) => frozen_linear(xs, weight, self.bias.as_ref()),
            FrozenWeight::Quantized(weight) => quantized_linear(xs, weight, self.bias.as_ref()),
        }
    }
}

/// `xs + ys`, a residual: a stream still outside the graph (the frozen
/// embeddings of a LoRA model, before the first adapter) gets no gradient.
pub(crate) fn residual(xs: &Tensor, ys: &Tensor) -> Result<Tensor> {
    match (xs.track_op(), ys.track_op()) {
        (false, true) => add_constant(ys, xs),
        (true, false) => add_constant(xs, ys),
        _ => xs + ys,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((seed * 7919 + i * 104_729) % 2003) as f32 / 1001.0) - 1.0).collect()
    }

    fn var(shape: &[usize], seed: usize) -> Var {
        let n = shape.iter().product();
        Var::from_tensor(&Tensor::from_vec(values(n, seed), shape, &Device::Cpu).unwrap()).unwrap()
    }

    /// Largest difference relative to the largest magnitude.
    fn relative(a: &Tensor, b: &Tensor) -> f32 {
        let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        diff / b.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap().max(f32::MIN_POSITIVE)
    }

    /// The forward agrees with the fused op; the fused op gives `x` no
    /// gradient, ours does, and ours matches central differences.
    fn check(name: &str, x: &Var, fused: impl Fn(&Tensor) -> Result<Tensor>, ours: impl Fn(&Tensor) -> Result<Tensor>) {
        let (a, b) = (ours(x.as_tensor()).unwrap(), fused(x.as_tensor()).unwrap());
        assert!(relative(&a, &b) < 1e-5, "{name}: forward differs by {}", relative(&a, &b));
        // a weighted sum makes every output count differently
        let weights = Tensor::from_vec(values(a.elem_count(), 3), a.shape(), &Device::Cpu).unwrap();
        let loss =
            |f: &dyn Fn(&Tensor) -> Result<Tensor>, x: &Tensor| (f(x).unwrap() * &weights).unwrap().sum_all().unwrap();
        assert!(
            loss(&fused, x.as_tensor()).backward().unwrap().get(x).is_none(),
            "{name}: the fused op cuts the graph"
        );
        let grads = loss(&ours, x.as_tensor()).backward().unwrap();
        let grad = grads.get(x).unwrap_or_else(|| panic!("{name}: no gradient")).flatten_all().unwrap();
        let grad = grad.to_vec1::<f32>().unwrap();
        let base = x.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let h = 1e-2f32;
        for index in [0, base.len() / 3, base.len() - 1] {
            let at = |delta: f32| {
                let mut moved = base.clone();
                moved[index] += delta;
                let moved = Tensor::from_vec(moved, x.shape(), &Device::Cpu).unwrap();
                f64::from(loss(&ours, &moved).to_scalar::<f32>().unwrap())
            };
            let numeric = ((at(h) - at(-h)) / (2.0 * f64::from(h))) as f32;
            assert!(
                (numeric - grad[index]).abs() <= 2e-2 * numeric.abs().max(1.0),
                "{name}[{index}]: {numeric} vs {}",
                grad[index]
            );
        }
    }

    #[test]
    fn each_agrees_with_the_fused_op_and_has_a_gradient() {
        let x = var(&[2, 3, 8], 1);
        let (alpha, beta) = (var(&[8], 2), var(&[8], 4));
        check("softmax_last_dim", &x, candle_nn::ops::softmax_last_dim, softmax_last_dim);
        let (a, b) = (alpha.as_tensor().clone(), beta.as_tensor().clone());
        check("layer_norm", &x, |t| candle_nn::ops::layer_norm(t, &a, &b, 1e-5), |t| layer_norm(t, &a, &b, 1e-5));
        check("rms_norm", &x, |t| candle_nn::ops::rms_norm(t, &a, 1e-5), |t| rms_norm(t, &a, 1e-5));
        let (cos, sin) = (var(&[5, 4], 5).as_tensor().cos().unwrap(), var(&[5, 4], 6).as_tensor().sin().unwrap());
        let bhtd = var(&[2, 3, 5, 8], 7);
        check("rope", &bhtd, |t| candle_nn::rotary_emb::rope(t, &cos, &sin), |t| rope(t, &cos, &sin));
        check("rope_i", &bhtd, |t| candle_nn::rotary_emb::rope_i(t, &cos, &sin), |t| rope_i(t, &cos, &sin));
        let bthd = var(&[2, 5, 3, 8], 8);
        check("rope_thd", &bthd, |t| candle_nn::rotary_emb::rope_thd(t, &cos, &sin), |t| rope_thd(t, &cos, &sin));
    }

    #[test]
    fn the_modules_match_candle_nns() {
        let varmap = candle_nn::VarMap::new();
        let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let ours = nn::layer_norm(8, 1e-5, vb.pp("ln")).unwrap();
        let theirs = candle_nn::layer_norm(8, 1e-5, vb.pp("ln")).unwrap();
        let x = var(&[4, 8], 9);
        assert!(relative(&ours.forward(x.as_tensor()).unwrap(), &theirs.forward(x.as_tensor()).unwrap()) < 1e-5);
        let ours = nn::rms_norm(8, 1e-5, vb.pp("rms")).unwrap();
        let theirs = candle_nn::rms_norm(8, 1e-5, vb.pp("rms")).unwrap();
        assert!(relative(&ours.forward(x.as_tensor()).unwrap(), &theirs.forward(x.as_tensor()).unwrap()) < 1e-5);
        // every variable gets a gradient through ours
        let loss = ours.forward(x.as_tensor()).unwrap().sqr().unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        assert!(grads.get(&varmap.data().lock().unwrap()["rms.weight"]).is_some());
    }

    #[test]
    fn a_frozen_linear_is_candles_linear_without_the_weights_gradient() {
        for shape in [vec![5, 8], vec![2, 3, 8]] {
            let x = var(&shape, 11);
            let (weight, bias) = (var(&[7, 8], 12).as_tensor().detach(), var(&[7], 13).as_tensor().detach());
            let plain = candle_nn::Linear::new(weight.clone(), Some(bias.clone()));
            let frozen = FrozenLinear::new(weight.clone(), Some(bias.clone()));
            let (a, b) = (frozen.forward(x.as_tensor()).unwrap(), plain.forward(x.as_tensor()).unwrap());
            assert!(relative(&a, &b) < 1e-6, "{shape:?}: forward differs by {}", relative(&a, &b));
            let weights = Tensor::from_vec(values(a.elem_count(), 14), a.shape(), &Device::Cpu).unwrap();
            let ours = (a * &weights).unwrap().sum_all().unwrap().backward().unwrap();
            let theirs = (b * &weights).unwrap().sum_all().unwrap().backward().unwrap();
            assert!(relative(ours.get(&x).unwrap(), theirs.get(&x).unwrap()) < 1e-6, "{shape:?}: input gradients");
            // candle's plain backward keeps a gradient of the frozen weight's size (for its
            // transposed view); ours keeps none of its size, nor of the bias
            let weight_sized = |grads: &candle_core::backprop::GradStore, size: usize| {
                grads.get_ids().filter_map(|id| grads.get_id(*id)).filter(|g| g.elem_count() == size).count()
            };
            // (no other tensor here has 56 elements: x has 40 or 48, the output 35 or 42)
            assert!(weight_sized(&theirs, 56) >= 1 && weight_sized(&ours, 56) == 0, "{shape:?}");
            assert!(ours.get(&weight).is_none() && ours.get(&bias).is_none());
        }
        let x = var(&[2, 7], 15);
        assert!(frozen_linear(x.as_tensor(), &var(&[3, 8], 16).as_tensor().detach(), None).is_err());
    }

    #[test]
    fn a_quantized_linear_is_the_dequantized_product_with_the_inputs_gradient() {
        use candle_core::quantized::GgmlDType;
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0] {
            for shape in [vec![5, 64], vec![2, 3, 64]] {
                let x = var(&shape, 41);
                let (weight, bias) = (var(&[7, 64], 42).as_tensor().detach(), var(&[7], 43).as_tensor().detach());
                let quantized = Arc::new(QTensor::quantize(&weight, dtype).unwrap());
                let dequantized = quantized.dequantize(&Device::Cpu).unwrap();
                let ours = quantized_linear(x.as_tensor(), &quantized, Some(&bias)).unwrap();
                let dense = frozen_linear(x.as_tensor(), &dequantized, Some(&bias)).unwrap();
                assert!(relative(&ours, &dense) < 1e-6, "{dtype:?} {shape:?}: {}", relative(&ours, &dense));
                // and near the unquantized product: q8_0 within 1%, q4_0 within 15%
                let exact = frozen_linear(x.as_tensor(), &weight, Some(&bias)).unwrap();
                let within = if dtype == GgmlDType::Q8_0 { 0.01 } else { 0.15 };
                assert!(relative(&ours, &exact) < within, "{dtype:?}: {}", relative(&ours, &exact));
                let weights = Tensor::from_vec(values(ours.elem_count(), 44), ours.shape(), &Device::Cpu).unwrap();
                let a = (ours * &weights).unwrap().sum_all().unwrap().backward().unwrap();
                let b = (dense * &weights).unwrap().sum_all().unwrap().backward().unwrap();
                assert!(
                    relative(a.get(&x).unwrap(), b.get(&x).unwrap()) < 1e-6,
                    "{dtype:?} {shape:?}: input gradients"
                );
                // the input's gradient and the weighting's: nothing of the weight's size
                assert!(a.get_ids().filter_map(|id| a.get_id(*id)).all(|g| g.elem_count() != 7 * 64));
            }
            // bf16 input: the product in bf16
            let x = var(&[3, 64], 45).as_tensor().to_dtype(DType::BF16).unwrap();
            let quantized = Arc::new(QTensor::quantize(var(&[7, 64], 42).as_tensor(), dtype).unwrap());
            assert_eq!(quantized_linear(&x, &quantized, None).unwrap().dtype(), DType::BF16);
            let wrong = var(&[3, 32], 46);
            assert!(quantized_linear(wrong.as_tensor(), &quantized, None).is_err());
        }
    }

    #[test]
    fn adding_a_constant_is_broadcast_add_without_the_constants_gradient() {
        let x = var(&[2, 3, 4, 4], 21);
        let mask = var(&[4, 4], 22).as_tensor().detach();
        let (ours, theirs) = (add_constant(x.as_tensor(), &mask).unwrap(), x.as_tensor().broadcast_add(&mask).unwrap());
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(flat(&ours), flat(&theirs));
        let weights = Tensor::from_vec(values(ours.elem_count(), 23), ours.shape(), &Device::Cpu).unwrap();
        let a = (ours * &weights).unwrap().sum_all().unwrap().backward().unwrap();
        let b = (theirs * &weights).unwrap().sum_all().unwrap().backward().unwrap();
        assert_eq!(flat(a.get(&x).unwrap()), flat(b.get(&x).unwrap()));
        // x's gradient and the weighting constant's in both; the broadcast mask's in candle's only
        let sized = |grads: &candle_core::backprop::GradStore| {
            grads.get_ids().filter_map(|id| grads.get_id(*id)).filter(|g| g.elem_count() == 96).count()
        };
        assert_eq!((sized(&b), sized(&a)), (3, 2));
    }

    #[test]
    fn the_graphs_matmul_is_candles_with_gradients_only_in_the_graph() {
        let (a, b) = (var(&[2, 3, 5, 4], 31), var(&[2, 3, 4, 6], 32));
        let frozen = b.as_tensor().detach();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for (rhs, in_graph) in [
            (b.as_tensor().clone(), true),
            (frozen.clone(), false),
            (frozen.t().unwrap().contiguous().unwrap().t().unwrap(), false),
        ] {
            let (ours, theirs) = (matmul(a.as_tensor(), &rhs).unwrap(), a.as_tensor().matmul(&rhs).unwrap());
            assert!(relative(&ours, &theirs) < 1e-6);
            let weights = Tensor::from_vec(values(ours.elem_count(), 33), ours.shape(), &Device::Cpu).unwrap();
            let g1 = (ours * &weights).unwrap().sum_all().unwrap().backward().unwrap();
            let g2 = (theirs * &weights).unwrap().sum_all().unwrap().backward().unwrap();
            assert_eq!(flat(g1.get(&a).unwrap()), flat(g2.get(&a).unwrap()));
            assert_eq!(g1.get(&rhs).is_some(), in_graph, "a gradient for the rhs only when it is in the graph");
            assert!(g2.get(&rhs).is_some(), "candle keeps one either way");
        }
    }
}
