//! Projections as single nodes: `x · Wᵀ + b` (candle's graph keeps the
//! product and the sum), the same added to a residual stream (it keeps the
//! projection and the sum), and an MLP's down projection of its activation
//! added to the residual (it keeps the activation too). Each backward pass
//! gives every input in the graph its gradient; an activation is recomputed
//! there a block of rows at a time.

use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::{DType, Result, Tensor};

use super::activation::{Activation, by_rows, gated_gradients};
use super::node::{Backward, node};

/// The weight a fused projection multiplies by.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Weight<'a> {
    /// A tensor, trained or frozen: an input of the node.
    Dense(&'a Tensor),
    /// A frozen quantized weight: no input of the node, dequantized for
    /// each product and let go after it, never kept by the graph.
    Quantized(&'a Arc<QTensor>),
}

impl Weight<'_> {
    /// `(out, in)`.
    fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Weight::Dense(weight) => weight.dims2(),
            Weight::Quantized(weight) => weight.shape().dims2(),
        }
    }

    /// The weight as a tensor outside the graph, in `like`'s dtype where
    /// it is dequantized.
    fn value(&self, like: &Tensor) -> Result<Tensor> {
        match self {
            Weight::Dense(weight) => Ok(weight.detach()),
            Weight::Quantized(weight) => dequantized(weight, like),
        }
    }

    fn quantized(&self) -> Option<Arc<QTensor>> {
        match self {
            Weight::Dense(_) => None,
            Weight::Quantized(weight) => Some(Arc::clone(weight)),
        }
    }
}

/// `weight` as `(out, in)` in `like`'s dtype on its device.
fn dequantized(weight: &QTensor, like: &Tensor) -> Result<Tensor> {
    weight.dequantize(like.device())?.to_dtype(like.dtype())
}

/// `x · weightᵀ + bias`, one node whose backward pass gives each of `x`,
/// `weight` and `bias` that takes part in the graph its gradient (a frozen
/// weight gets none, nor is one computed). `x` is `(…, in)`, `weight`
/// `(out, in)` (any layout: a transposed view of an `(in, out)` weight
/// too), `bias` `(out)`.
///
/// ```
/// use autobatch_models::ops::linear;
/// use candle_core::{DType, Device, Module, Tensor, Var};
///
/// let x = Var::randn(0f32, 1.0, (2, 3, 4), &Device::Cpu)?;
/// let (w, b) = (Var::randn(0f32, 1.0, (5, 4), &Device::Cpu)?, Var::zeros(5, DType::F32, &Device::Cpu)?);
/// let theirs = candle_nn::Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone())).forward(x.as_tensor())?;
/// let ours = linear(x.as_tensor(), w.as_tensor(), Some(b.as_tensor()))?;
/// assert!((&ours - theirs)?.abs()?.max_all()?.to_scalar::<f32>()? < 1e-6);
/// let grads = ours.sum_all()?.backward()?;
/// assert!([&x, &w, &b].iter().all(|v| grads.get(v).is_some()));
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let shapes = Shapes::of(x, weight.dims2()?, bias, "linear")?;
    match bias {
        // one product: candle's matmul node, gradients only for operands in the graph
        None => super::matmul(&x.reshape((shapes.rows, shapes.input))?, &weight.t()?)?.reshape(shapes.output(x)),
        Some(bias) => {
            let value = product(&x.detach(), &weight.detach(), Some(&bias.detach()), &shapes)?;
            node(&[x, weight, bias], value, Projection { shapes, residual: false, activation: None, quantized: None })
        }
    }
}

/// `residual + x · weightᵀ + bias`, one node: a block's output projection
/// added to the stream it reads. Shapes as [`linear`]'s; `residual` is the
/// output's.
pub fn residual_linear(residual: &Tensor, x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    residual_linear_of(residual, x, Weight::Dense(weight), bias)
}

/// [`residual_linear`] over a dense or a quantized weight.
pub(crate) fn residual_linear_of(
    residual: &Tensor,
    x: &Tensor,
    weight: Weight,
    bias: Option<&Tensor>,
) -> Result<Tensor> {
    let shapes = Shapes::of(x, weight.dims()?, bias, "residual linear")?;
    shapes.check_residual(residual, x)?;
    let x_ = x.detach();
    let value = {
        let w = weight.value(&x_)?;
        (residual.detach() + product(&x_, &w, bias.map(Tensor::detach).as_ref(), &shapes)?)?
    };
    let mut inputs = vec![residual, x];
    inputs.extend(weight_input(&weight));
    inputs.extend(bias);
    node(&inputs, value, Projection { shapes, residual: true, activation: None, quantized: weight.quantized() })
}

/// The weight as an input of the node: a dense one only.
fn weight_input<'a>(weight: &Weight<'a>) -> Option<&'a Tensor> {
    match *weight {
        Weight::Dense(weight) => Some(weight),
        Weight::Quantized(_) => None,
    }
}

/// `residual + activation(gate) [· up] · weightᵀ + bias`, one node: an
/// MLP's down projection of its activation (gated by `up` for SwiGLU and
/// GeGLU; `gate` alone for GPT-2's and BERT's GELU), added to the stream.
/// The graph keeps `gate` and `up`, not the activation: the backward pass
/// recomputes it. `gate` and `up` are `(…, in)`; shapes otherwise as
/// [`residual_linear`]'s.
///
/// ```
/// use autobatch_models::ops::{residual_mlp_down, Activation};
/// use candle_core::{Device, Var};
///
/// let x = Var::randn(0f32, 1.0, (6, 4), &Device::Cpu)?;
/// let (gate, up) = (Var::randn(0f32, 1.0, (6, 16), &Device::Cpu)?, Var::randn(0f32, 1.0, (6, 16), &Device::Cpu)?);
/// let down = Var::randn(0f32, 1.0, (4, 16), &Device::Cpu)?;
/// let eager = (x.as_tensor() + (gate.as_tensor().silu()? * up.as_tensor())?.matmul(&down.as_tensor().t()?)?)?;
/// let fused = residual_mlp_down(x.as_tensor(), Activation::Silu, gate.as_tensor(), Some(up.as_tensor()), down.as_tensor(), None)?;
/// assert!((&fused - eager)?.abs()?.max_all()?.to_scalar::<f32>()? < 1e-5);
/// let grads = fused.sum_all()?.backward()?;
/// assert!([&x, &gate, &up, &down].iter().all(|v| grads.get(v).is_some()));
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn residual_mlp_down(
    residual: &Tensor,
    activation: Activation,
    gate: &Tensor,
    up: Option<&Tensor>,
    weight: &Tensor,
    bias: Option<&Tensor>,
) -> Result<Tensor> {
    residual_mlp_down_of(residual, activation, gate, up, Weight::Dense(weight), bias)
}

/// [`residual_mlp_down`] over a dense or a quantized weight.
pub(crate) fn residual_mlp_down_of(
    residual: &Tensor,
    activation: Activation,
    gate: &Tensor,
    up: Option<&Tensor>,
    weight: Weight,
    bias: Option<&Tensor>,
) -> Result<Tensor> {
    mlp_down_of(Some(residual), activation, gate, up, weight, bias)
}

/// `activation(gate) [· up] · weightᵀ + bias`, one node, the activation
/// recomputed in the backward pass: an MLP's down projection whose output is
/// normed before it joins the stream (OLMo 2's and Gemma's norms after the MLP).
pub(crate) fn mlp_down_of(
    residual: Option<&Tensor>,
    activation: Activation,
    gate: &Tensor,
    up: Option<&Tensor>,
    weight: Weight,
    bias: Option<&Tensor>,
) -> Result<Tensor> {
    let shapes = Shapes::of(gate, weight.dims()?, bias, "MLP down projection")?;
    if let Some(residual) = residual {
        shapes.check_residual(residual, gate)?;
    }
    if let Some(up) = up
        && up.dims() != gate.dims()
    {
        candle_core::bail!("MLP down projection: a gate of {:?} and an up projection of {:?}", gate.dims(), up.dims())
    }
    let (gate_, up_) = (gate.detach(), up.map(Tensor::detach));
    let (w, b) = (weight.value(&gate_)?, bias.map(Tensor::detach));
    // the product a block of rows at a time: the activation never whole
    let mut inputs = vec![&gate_];
    inputs.extend(up_.as_ref());
    let dtype = residual.map_or(gate.dtype(), Tensor::dtype);
    let value = by_rows(&inputs, &[shapes.out], dtype, |block| {
        let rows = block[0].dim(0)?;
        let activated = activated(activation, &block[0], block.get(1))?;
        let shapes = Shapes { rows, ..shapes };
        product(&activated, &w, b.as_ref(), &shapes).map(|p| vec![p])
    })?
    .remove(0);
    drop(w);
    let value = match residual {
        Some(residual) => {
            let flat_residual = residual.detach().reshape((shapes.rows, shapes.out))?;
            (flat_residual + value)?.reshape(residual.shape())?
        }
        None => value.reshape(shapes.output(gate))?,
    };
    let mut graph_inputs: Vec<&Tensor> = residual.into_iter().collect();
    graph_inputs.push(gate);
    graph_inputs.extend(up);
    graph_inputs.extend(weight_input(&weight));
    graph_inputs.extend(bias);
    let activation = Some((activation, up.is_some()));
    let projection = Projection { shapes, residual: residual.is_some(), activation, quantized: weight.quantized() };
    node(&graph_inputs, value, projection)
}

/// `activation(gate) · up`, or `activation(gate)` without `up`.
fn activated(activation: Activation, gate: &Tensor, up: Option<&Tensor>) -> Result<Tensor> {
    let value = activation.apply(gate)?;
    match up {
        Some(up) => value * up,
        None => Ok(value),
    }
}

/// The sizes of a projection, checked.
#[derive(Clone, Copy, Debug)]
struct Shapes {
    /// Rows of the input: the product of its leading dimensions.
    rows: usize,
    input: usize,
    out: usize,
    bias: bool,
}

impl Shapes {
    fn of(x: &Tensor, (out, input): (usize, usize), bias: Option<&Tensor>, op: &str) -> Result<Shapes> {
        let Some((&last, lead)) = x.dims().split_last() else {
            candle_core::bail!("{op}: the input is a scalar; it needs (…, {input})")
        };
        if last != input {
            candle_core::bail!("{op}: an input of {:?} for a weight of ({out}, {input})", x.dims())
        }
        if let Some(bias) = bias
            && bias.dims() != [out]
        {
            candle_core::bail!("{op}: a bias of {:?} for a weight of ({out}, {input})", bias.dims())
        }
        Ok(Shapes { rows: lead.iter().product(), input, out, bias: bias.is_some() })
    }

    /// The output's shape for an input of `x`'s: its last dimension `out`.
    fn output(&self, x: &Tensor) -> Vec<usize> {
        let mut dims = x.dims().to_vec();
        *dims.last_mut().expect("checked: not a scalar") = self.out;
        dims
    }

    fn check_residual(&self, residual: &Tensor, x: &Tensor) -> Result<()> {
        if residual.dims() != self.output(x) {
            candle_core::bail!("a residual of {:?} for a projection to {:?}", residual.dims(), self.output(x))
        }
        Ok(())
    }
}

/// `x · weightᵀ + bias` off the graph, `x`'s leading dimensions kept.
fn product(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, shapes: &Shapes) -> Result<Tensor> {
    let product = x.reshape((shapes.rows, shapes.input))?.matmul(&weight.t()?)?;
    let product = match bias {
        Some(bias) => product.broadcast_add(bias)?,
        None => product,
    };
    product.reshape(Shapes { ..*shapes }.output(x))
}

/// The backward pass of the three projections. Inputs in order: the
/// residual (with `residual`), `x` or the activation's gate (and `up`), the
/// weight (unless it is `quantized`), the bias (with `shapes.bias`).
struct Projection {
    shapes: Shapes,
    residual: bool,
    /// The activation `x` goes through first, and whether it is gated.
    activation: Option<(Activation, bool)>,
    /// A frozen quantized weight, outside the inputs: dequantized for the
    /// input's gradient, let go after it.
    quantized: Option<Arc<QTensor>>,
}

impl Backward for Projection {
    fn name(&self) -> &'static str {
        match (self.residual, self.activation) {
            (false, None) => "fused-linear",
            (false, Some(_)) => "fused-mlp-down-projection-unadded",
            (true, None) => "fused-residual-linear",
            (true, Some(_)) => "fused-mlp-down-projection",
        }
    }

    fn backward(&self, inputs: &[Tensor], wanted: &[bool], _: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let Shapes { rows, input, out, bias } = self.shapes;
        let first = usize::from(self.residual);
        let gated = matches!(self.activation, Some((_, true)));
        let weight_at = first + 1 + usize::from(gated);
        let weight_wanted = self.quantized.is_none() && wanted[weight_at];
        let bias_at = weight_at + usize::from(self.quantized.is_none());
        let weight = match &self.quantized {
            Some(quantized) => &dequantized(quantized, grad)?,
            None => &inputs[weight_at],
        };
        let g = grad.reshape((rows, out))?;
        let mut grads = vec![None; inputs.len()];
        if self.residual && wanted[0] {
            grads[0] = Some(grad.clone());
        }
        if bias && wanted[bias_at] {
            let summed = g.to_dtype(DType::F32)?.sum(0)?;
            grads[bias_at] = Some(summed.to_dtype(inputs[bias_at].dtype())?);
        }
        let Some((activation, _)) = self.activation else {
            let x = inputs[first].reshape((rows, input))?;
            if weight_wanted {
                grads[weight_at] = Some(g.t()?.matmul(&x)?);
            }
            if wanted[first] {
                grads[first] = Some(g.matmul(weight)?.reshape(inputs[first].shape())?);
            }
            return Ok(grads);
        };
        // the weight's gradient from the activation recomputed whole (one
        // product, let go before the halves' gradients exist), then the halves'
        // gradients a block of rows at a time
        let (gate, up) = (&inputs[first], gated.then(|| &inputs[first + 1]));
        let flat = |t: &Tensor| t.reshape((rows, input));
        if weight_wanted {
            let activated = activated(activation, &flat(gate)?, up.map(flat).transpose()?.as_ref())?;
            grads[weight_at] = Some(g.t()?.matmul(&activated)?);
        }
        let mut halves = vec![gate];
        halves.extend(up);
        halves.push(grad);
        let widths = if gated { vec![input, input] } else { vec![input] };
        let half_grads = by_rows(&halves, &widths, gate.dtype(), |block| {
            let (gate, up, g) = (&block[0], gated.then(|| &block[1]), &block[block.len() - 1]);
            let g_activated = g.matmul(weight)?;
            match up {
                Some(up) => {
                    let (g_gate, g_up) = gated_gradients(activation, gate, up, &g_activated)?;
                    Ok(vec![g_gate, g_up])
                }
                None => {
                    let (_, derivative) = activation.with_derivative(gate)?;
                    Ok(vec![(g_activated * derivative)?])
                }
            }
        })?;
        for (index, half) in half_grads.into_iter().enumerate() {
            if wanted[first + index] {
                grads[first + index] = Some(half.reshape(inputs[first + index].shape())?);
            }
        }
        Ok(grads)
    }
}

/// Rows a test needs for the blocks to matter.
#[cfg(test)]
const BLOCKED_ROWS: usize = super::activation::ROWS_AT_ONCE + 5;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::activation::tests::exact;
    use crate::ops::testing::{agree, var};
    use proptest::prelude::*;

    fn eager_linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
        crate::ops::eager::linear(x, w, b)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

        /// Each projection's output and every gradient equal the same
        /// written as candle ops (matmul, broadcast add, the activation),
        /// within 1e-5 relative in f32: with and without a bias, 2-d and 3-d
        /// inputs, a weight stored transposed, on either side of the blocks
        /// of rows.
        #[test]
        fn the_fused_projections_equal_the_eager_ones(
            rows in prop::sample::select(vec![1usize, 6, BLOCKED_ROWS]),
            input in 1usize..20,
            out in 1usize..12,
            with_bias: bool,
            three_d: bool,
            transposed: bool,
            seed in 0usize..1000,
        ) {
            let lead = if three_d && rows % 2 == 0 { vec![2, rows / 2] } else { vec![rows] };
            let dims = |last: usize| lead.iter().copied().chain([last]).collect::<Vec<_>>();
            let x = var(&dims(input), seed, 1.0);
            let up = var(&dims(input), seed + 1, 1.0);
            let residual = var(&dims(out), seed + 2, 1.0);
            let stored = if transposed { var(&[input, out], seed + 3, 0.5) } else { var(&[out, input], seed + 3, 0.5) };
            let bias = var(&[out], seed + 4, 1.0);
            let weight = |t: &Tensor| if transposed { t.t() } else { Ok(t.clone()) };
            let b = |t: &[&Tensor]| with_bias.then(|| t[t.len() - 1].clone());
            let vars = [&x, &stored, &bias];
            let agreement = agree(
                &vars,
                |t| linear(t[0], &weight(t[1])?, b(t).as_ref()),
                |t| eager_linear(t[0], &weight(t[1])?, b(t).as_ref()),
            );
            prop_assert!(agreement.holds(), "linear off by {agreement}");
            let vars = [&residual, &x, &stored, &bias];
            let agreement = agree(
                &vars,
                |t| residual_linear(t[0], t[1], &weight(t[2])?, b(t).as_ref()),
                |t| t[0] + eager_linear(t[1], &weight(t[2])?, b(t).as_ref())?,
            );
            prop_assert!(agreement.holds(), "residual linear off by {agreement}");
            for activation in [Activation::Silu, Activation::Gelu, Activation::GeluErf] {
                let vars = [&residual, &x, &up, &stored, &bias];
                let agreement = agree(
                    &vars,
                    |t| residual_mlp_down(t[0], activation, t[1], Some(t[2]), &weight(t[3])?, b(t).as_ref()),
                    |t| t[0] + eager_linear(&(exact(activation, t[1])? * t[2])?, &weight(t[3])?, b(t).as_ref())?,
                );
                prop_assert!(agreement.holds(), "{activation:?} gated down off by {agreement}");
                let vars = [&residual, &x, &stored, &bias];
                let agreement = agree(
                    &vars,
                    |t| residual_mlp_down(t[0], activation, t[1], None, &weight(t[2])?, b(t).as_ref()),
                    |t| t[0] + eager_linear(&exact(activation, t[1])?, &weight(t[2])?, b(t).as_ref())?,
                );
                prop_assert!(agreement.holds(), "{activation:?} down off by {agreement}");
            }
        }
    }

    /// Over a quantized weight the fused projections equal the same over
    /// its dequantized copy as a frozen tensor (output and every gradient,
    /// within 1e-5), the weight no input of the graph.
    #[test]
    fn a_quantized_weight_fuses_as_its_dequantized_copy() {
        use candle_core::quantized::GgmlDType;
        let (rows, input, out) = (BLOCKED_ROWS, 64, 8);
        let weight = var(&[out, input], 3, 0.5).as_tensor().detach();
        let quantized = Arc::new(QTensor::quantize(&weight, GgmlDType::Q8_0).unwrap());
        let dense = quantized.dequantize(&candle_core::Device::Cpu).unwrap();
        let like = |t: &Tensor| dense.to_dtype(t.dtype());
        let (x, up, residual, bias) =
            (var(&[rows, input], 1, 1.0), var(&[rows, input], 2, 1.0), var(&[rows, out], 4, 1.0), var(&[out], 5, 1.0));
        let frozen_bias = bias.as_tensor().detach();
        let b = |t: &Tensor| frozen_bias.to_dtype(t.dtype());
        let q = Weight::Quantized(&quantized);
        let agreement = agree(
            &[&residual, &x],
            |t| residual_linear_of(t[0], t[1], q, Some(&b(t[0])?)),
            |t| t[0] + eager_linear(t[1], &like(t[1])?, Some(&b(t[0])?))?,
        );
        assert!(agreement.holds(), "quantized residual linear off by {agreement}");
        for activation in [Activation::Silu, Activation::Gelu] {
            let agreement = agree(
                &[&residual, &x, &up],
                |t| residual_mlp_down_of(t[0], activation, t[1], Some(t[2]), q, None),
                |t| t[0] + eager_linear(&(exact(activation, t[1])? * t[2])?, &like(t[1])?, None)?,
            );
            assert!(agreement.holds(), "{activation:?} quantized gated down off by {agreement}");
        }
    }

    #[test]
    fn a_frozen_weight_gets_no_gradient_and_wrong_shapes_are_refused() {
        let (x, residual) = (var(&[3, 4], 1, 1.0), var(&[3, 5], 2, 1.0));
        let frozen = var(&[5, 4], 3, 1.0).as_tensor().detach();
        let out = residual_linear(residual.as_tensor(), x.as_tensor(), &frozen, None).unwrap();
        let grads = out.sum_all().unwrap().backward().unwrap();
        assert!(grads.get(&x).is_some() && grads.get(&residual).is_some() && grads.get(&frozen).is_none());
        assert!(linear(x.as_tensor(), &var(&[5, 3], 4, 1.0), None).is_err());
        assert!(linear(x.as_tensor(), &frozen, Some(&var(&[4], 5, 1.0))).is_err());
        assert!(residual_linear(&var(&[3, 4], 6, 1.0), x.as_tensor(), &frozen, None).is_err());
        let up = var(&[3, 3], 7, 1.0);
        assert!(
            residual_mlp_down(
                residual.as_tensor(),
                Activation::Silu,
                x.as_tensor(),
                Some(up.as_tensor()),
                &frozen,
                None
            )
            .is_err()
        );
    }
}
