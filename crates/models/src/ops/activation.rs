//! Gated MLP activations as single nodes (SwiGLU, GeGLU): the graph keeps
//! the two halves and the product, not the activation between them; the
//! backward pass recomputes it, a block of rows at a time.

use candle_core::{D, DType, Result, Tensor};

use super::node::{Backward, node};

/// An MLP's activation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x · σ(x)` (SiLU, Swish): Llama's, Mistral's and Qwen's MLPs.
    Silu,
    /// GELU, the tanh approximation (`gelu_new`, `gelu_pytorch_tanh`): GPT-2's, Gemma's.
    Gelu,
    /// GELU, the exact erf form (`gelu`): BERT's.
    GeluErf,
}

impl Activation {
    /// The activation of `xs`.
    pub fn apply(self, xs: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Silu => xs.silu(),
            Activation::Gelu => xs.gelu(),
            Activation::GeluErf => xs.gelu_erf(),
        }
    }

    /// The activation of `xs` and its derivative there, in `xs`'s dtype
    /// (computed in f32 for a 16-bit `xs`).
    pub(crate) fn with_derivative(self, xs: &Tensor) -> Result<(Tensor, Tensor)> {
        let x = if matches!(xs.dtype(), DType::F16 | DType::BF16) { xs.to_dtype(DType::F32)? } else { xs.clone() };
        let (value, derivative) = match self {
            Activation::Silu => {
                let sigmoid = candle_nn::ops::sigmoid(&x)?;
                let value = (&x * &sigmoid)?;
                // σ + x·σ·(1 − σ) = σ + value·(1 − σ)
                let derivative = (&sigmoid + (&value * (1.0 - &sigmoid)?)?)?;
                (value, derivative)
            }
            Activation::Gelu => {
                // 0.5·x·(1 + tanh(u)), u = c·(x + 0.044715·x³), c = √(2/π)
                let c = (2.0 / std::f64::consts::PI).sqrt();
                let x2 = x.sqr()?;
                let tanh = ((&x2 * 0.044715)? + 1.0)?.mul(&x)?.affine(c, 0.0)?.tanh()?;
                let half = ((&tanh + 1.0)? * 0.5)?;
                let value = (&x * &half)?;
                // 0.5·(1 + tanh) + 0.5·x·(1 − tanh²)·c·(1 + 3·0.044715·x²)
                let du = ((x2 * (3.0 * 0.044715 * c))? + c)?;
                let slope = ((1.0 - tanh.sqr()?)? * 0.5)?.mul(&x)?.mul(&du)?;
                (value, (half + slope)?)
            }
            Activation::GeluErf => {
                // Φ(x) + x·φ(x)
                let cdf = (((&x / std::f64::consts::SQRT_2)?.erf()? + 1.0)? * 0.5)?;
                let value = (&x * &cdf)?;
                let pdf = ((x.sqr()? * -0.5)?.exp()? / (2.0 * std::f64::consts::PI).sqrt())?;
                (value, (cdf + (x * pdf)?)?)
            }
        };
        Ok((value.to_dtype(xs.dtype())?, derivative.to_dtype(xs.dtype())?))
    }
}

/// `silu(gate) · up`, the SwiGLU MLP's activation, one node: the graph
/// keeps `gate`, `up` and the product, not `silu(gate)`.
///
/// ```
/// use autobatch_models::ops::swiglu;
/// use candle_core::{Device, Var};
///
/// let gate = Var::randn(0f32, 1.0, (4, 16), &Device::Cpu)?;
/// let up = Var::randn(0f32, 1.0, (4, 16), &Device::Cpu)?;
/// let eager = (gate.as_tensor().silu()? * up.as_tensor())?;
/// let fused = swiglu(gate.as_tensor(), up.as_tensor())?;
/// assert!((fused - eager)?.abs()?.max_all()?.to_scalar::<f32>()? < 1e-6);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gated(Activation::Silu, gate, up)
}

/// `gelu(gate) · up` (the tanh approximation), the GeGLU MLP's activation, one node.
pub fn geglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gated(Activation::Gelu, gate, up)
}

/// `activation(gate) · up`, one node.
pub fn gated(activation: Activation, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if gate.dims() != up.dims() {
        candle_core::bail!("gated activation: a gate of {:?} and an up projection of {:?}", gate.dims(), up.dims())
    }
    let value = (activation.apply(&gate.detach())? * up.detach())?;
    node(&[gate, up], value, Gated { activation })
}

/// `activation(xs)` (GELU, SiLU), one node whose backward pass computes the
/// derivative a block of rows at a time (candle's own GELU backward holds
/// some ten temporaries of `xs`'s size at once).
pub fn activation(activation: Activation, xs: &Tensor) -> Result<Tensor> {
    let value = activation.apply(&xs.detach())?;
    node(&[xs], value, Ungated { activation })
}

/// The backward pass of [`activation`].
struct Ungated {
    activation: Activation,
}

impl Backward for Ungated {
    fn name(&self) -> &'static str {
        "fused-activation"
    }

    fn backward(&self, inputs: &[Tensor], _: &[bool], _: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let x = &inputs[0];
        let width = x.dim(D::Minus1)?;
        let mut grads = by_rows(&[x, grad], &[width], x.dtype(), |block| {
            let (_, derivative) = self.activation.with_derivative(&block[0])?;
            Ok(vec![(&block[1] * derivative)?])
        })?;
        Ok(vec![Some(grads.remove(0).reshape(x.shape())?)])
    }
}

/// Rows of an activation's backward pass computed at once: its temporaries
/// are a few of these blocks (`64 × intermediate` values each), whatever
/// the batch.
pub(crate) const ROWS_AT_ONCE: usize = 64;

/// `f` over blocks of [`ROWS_AT_ONCE`] rows of `inputs` (each `(…, width)`,
/// the same leading dimensions), the results of each block written into
/// tensors of `widths` columns for all the rows: `(rows, width)` each.
pub(crate) fn by_rows(
    inputs: &[&Tensor],
    widths: &[usize],
    dtype: DType,
    mut f: impl FnMut(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    let flat: Vec<Tensor> = inputs
        .iter()
        .map(|t| {
            let width = t.dim(D::Minus1)?;
            t.reshape(((), width))
        })
        .collect::<Result<_>>()?;
    let rows = flat[0].dim(0)?;
    if rows <= ROWS_AT_ONCE {
        return f(&flat);
    }
    let device = flat[0].device();
    let outputs: Vec<Tensor> =
        widths.iter().map(|&w| Tensor::zeros((rows, w), dtype, device)).collect::<Result<_>>()?;
    for start in (0..rows).step_by(ROWS_AT_ONCE) {
        let len = ROWS_AT_ONCE.min(rows - start);
        let block: Vec<Tensor> = flat.iter().map(|t| t.narrow(0, start, len)).collect::<Result<_>>()?;
        for (output, part) in outputs.iter().zip(f(&block)?) {
            output.slice_set(&part.contiguous()?, 0, start)?;
        }
    }
    Ok(outputs)
}

/// The gradients of a gated activation's halves for the gradient `grad` of
/// `activation(gate) · up`, a block of rows at a time: `(rows, width)` each.
pub(crate) fn gated_gradients(
    activation: Activation,
    gate: &Tensor,
    up: &Tensor,
    grad: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let width = gate.dim(D::Minus1)?;
    let mut grads = by_rows(&[gate, up, grad], &[width, width], gate.dtype(), |block| {
        let (value, derivative) = activation.with_derivative(&block[0])?;
        let g_up = (&block[2] * value)?;
        let g_gate = ((&block[2] * &block[1])? * derivative)?;
        Ok(vec![g_gate, g_up])
    })?;
    let g_up = grads.pop().expect("two gradients");
    Ok((grads.pop().expect("two gradients"), g_up))
}

/// The backward pass of [`gated`].
struct Gated {
    activation: Activation,
}

impl Backward for Gated {
    fn name(&self) -> &'static str {
        "fused-gated-activation"
    }

    fn backward(&self, inputs: &[Tensor], _: &[bool], _: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (gate, up) = (&inputs[0], &inputs[1]);
        let (g_gate, g_up) = gated_gradients(self.activation, gate, up, grad)?;
        Ok(vec![Some(g_gate.reshape(gate.shape())?), Some(g_up.reshape(up.shape())?)])
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ops::testing::{agree, var};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Output and both gradients equal `activation(gate) · up` written as
        /// candle ops, within 1e-5 relative in f32, on either side of the
        /// blocks of rows the backward pass takes.
        #[test]
        fn the_fused_gates_equal_the_eager_ones(
            rows in prop::sample::select(vec![1usize, 7, ROWS_AT_ONCE, ROWS_AT_ONCE + 3, 2 * ROWS_AT_ONCE + 1]),
            width in 1usize..24,
            scale in 0.1f32..6.0,
            seed in 0usize..1000,
        ) {
            let (gate, up) = (var(&[rows, width], seed, scale), var(&[rows, width], seed + 1, 1.0));
            for kind in [Activation::Silu, Activation::Gelu, Activation::GeluErf] {
                let agreement = agree(&[&gate], |t| activation(kind, t[0]), |t| exact(kind, t[0]));
                prop_assert!(agreement.holds(), "{kind:?} alone off by {agreement}");
                let activation = kind;
                let agreement = agree(
                    &[&gate, &up],
                    |t| gated(activation, t[0], t[1]),
                    |t| exact(activation, t[0])? * t[1],
                );
                prop_assert!(agreement.holds(), "{activation:?} off by {agreement}");
            }
        }
    }

    /// The activation written as candle's elementary ops, whose backward
    /// passes are exact (candle's own GELU backward rounds √(2/π) and
    /// 1/√(2π) to six digits: a relative error of 1e-4 where the derivative
    /// is small).
    pub(crate) fn exact(activation: Activation, x: &Tensor) -> Result<Tensor> {
        match activation {
            Activation::Silu => x / (x.neg()?.exp()? + 1.0)?,
            Activation::Gelu => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                let inner = ((x.sqr()? * 0.044715)? + 1.0)?.mul(x)?.affine(c, 0.0)?;
                (x * 0.5)?.mul(&(inner.tanh()? + 1.0)?)
            }
            Activation::GeluErf => (x * 0.5)?.mul(&((x / std::f64::consts::SQRT_2)?.erf()? + 1.0)?),
        }
    }

    #[test]
    fn halves_of_different_shapes_are_refused() {
        assert!(swiglu(var(&[2, 4], 1, 1.0).as_tensor(), var(&[2, 5], 2, 1.0).as_tensor()).is_err());
    }
}
