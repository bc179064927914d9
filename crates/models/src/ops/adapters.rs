//! A frozen projection and its LoRA adapters as one node: `residual + x ·
//! Wᵀ + b + scale · (x · Aᵀ) · Bᵀ`. candle's graph keeps the input and the
//! output; written as ops it keeps the base's output, the input cast to the
//! adapters' dtype, `x · Aᵀ` and its scaling, the update, its cast back and
//! the sum. The backward pass recomputes `x · Aᵀ` (rank `r`: cheap).

use candle_core::{Module, Result, Tensor};

use super::FrozenLinear;
use super::node::{Backward, node};

/// `[residual +] base(x) + scale · (x · aᵀ) · bᵀ`, one node whose backward
/// pass gives `x`, `a`, `b` and `residual` (those in the graph) their
/// gradients and the frozen base none. `x` is `(…, in)`, `a` `(r, in)`, `b`
/// `(out, r)`, `residual` of the output's shape; the adapters may have a
/// dtype of their own (f32 beside a bf16 or quantized base): `x` is cast to
/// it for their product and their update back to `x`'s.
///
/// ```
/// use autobatch_models::ops::{lora_linear, FrozenLinear};
/// use candle_core::{DType, Device, Tensor, Var};
///
/// let base = FrozenLinear::new(Tensor::randn(0f32, 1.0, (6, 4), &Device::Cpu)?, None);
/// let x = Var::randn(0f32, 1.0, (3, 4), &Device::Cpu)?;
/// let (a, b) = (Var::randn(0f32, 1.0, (2, 4), &Device::Cpu)?, Var::randn(0f32, 1.0, (6, 2), &Device::Cpu)?);
/// let y = lora_linear(None, x.as_tensor(), &base, a.as_tensor(), b.as_tensor(), 2.0)?;
/// let grads = y.sum_all()?.backward()?;
/// assert!([&x, &a, &b].iter().all(|v| grads.get(v).is_some()));
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn lora_linear(
    residual: Option<&Tensor>,
    x: &Tensor,
    base: &FrozenLinear,
    a: &Tensor,
    b: &Tensor,
    scale: f64,
) -> Result<Tensor> {
    let (rank, input) = a.dims2()?;
    let (out, b_rank) = b.dims2()?;
    let Some((&last, lead)) = x.dims().split_last() else {
        candle_core::bail!("lora linear: the input is a scalar; it needs (…, {input})")
    };
    if last != input || b_rank != rank {
        candle_core::bail!("lora linear: an input of {:?} for adapters of {:?} and {:?}", x.dims(), a.dims(), b.dims())
    }
    let rows: usize = lead.iter().product();
    let flat = x.detach().reshape((rows, input))?;
    let mut value = (base.forward(&flat)? + update(&flat, &a.detach(), &b.detach(), scale)?)?;
    if value.dim(1)? != out {
        candle_core::bail!("lora linear: adapters to {out} features beside a base to {}", value.dim(1)?)
    }
    let mut shape = lead.to_vec();
    shape.push(out);
    if let Some(residual) = residual {
        value = (value + residual.detach().reshape((rows, out))?)?;
    }
    let value = value.reshape(shape)?;
    let mut inputs = vec![x, a, b];
    inputs.extend(residual);
    node(&inputs, value, Adapted { base: base.clone(), scale, rows })
}

/// `scale · (x · aᵀ) · bᵀ` in the adapters' dtype, back in `x`'s.
fn update(x: &Tensor, a: &Tensor, b: &Tensor, scale: f64) -> Result<Tensor> {
    let down = (x.to_dtype(a.dtype())?.matmul(&a.t()?)? * scale)?;
    down.matmul(&b.t()?)?.to_dtype(x.dtype())
}

/// The backward pass: inputs `x`, `a`, `b` and the residual, if any.
struct Adapted {
    base: FrozenLinear,
    scale: f64,
    rows: usize,
}

impl Backward for Adapted {
    fn name(&self) -> &'static str {
        "fused-lora-linear"
    }

    fn backward(&self, inputs: &[Tensor], wanted: &[bool], _: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (x, a, b) = (&inputs[0], &inputs[1], &inputs[2]);
        let (rows, input, out) = (self.rows, a.dim(1)?, b.dim(0)?);
        let g = grad.reshape((rows, out))?;
        let x_a = x.reshape((rows, input))?.to_dtype(a.dtype())?;
        let g_a = g.to_dtype(a.dtype())?;
        // u = scale · x · aᵀ; y = … + u · bᵀ
        let down = (x_a.matmul(&a.t()?)? * self.scale)?;
        let mut grads = vec![None; inputs.len()];
        if wanted[2] {
            grads[2] = Some(g_a.t()?.matmul(&down)?);
        }
        drop(down);
        let g_down = (g_a.matmul(b)? * self.scale)?;
        if wanted[1] {
            grads[1] = Some(g_down.t()?.matmul(&x_a)?);
        }
        if wanted[0] {
            let through_adapters = g_down.matmul(a)?.to_dtype(x.dtype())?;
            grads[0] = Some((self.base.input_gradient(&g)? + through_adapters)?.reshape(x.shape())?);
        }
        if inputs.len() == 4 && wanted[3] {
            grads[3] = Some(grad.clone());
        }
        Ok(grads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{agree, var};
    use crate::ops::{eager, frozen_linear};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

        /// The output and the gradients of the input, the adapters and the
        /// residual equal the same written as candle ops (the base's product,
        /// the adapters' two, the sums); the base gets none.
        #[test]
        fn the_fused_adapters_equal_the_eager_ones(
            rows in 1usize..9,
            input in 1usize..12,
            out in 1usize..10,
            rank in 1usize..4,
            with_bias: bool,
            with_residual: bool,
            seed in 0usize..1000,
        ) {
            let (x, a, b) = (var(&[2, rows, input], seed, 1.0), var(&[rank, input], seed + 1, 1.0), var(&[out, rank], seed + 2, 1.0));
            let residual = var(&[2, rows, out], seed + 3, 1.0);
            let (weight, bias) = (var(&[out, input], seed + 4, 1.0).as_tensor().detach(), var(&[out], seed + 5, 1.0).as_tensor().detach());
            let bias = with_bias.then_some(bias);
            let base = FrozenLinear::new(weight.clone(), bias.clone());
            let vars = [&x, &a, &b, &residual];
            let agreement = agree(
                &vars,
                |t| lora_linear(with_residual.then_some(t[3]), t[0], &base, t[1], t[2], 1.5),
                |t| {
                    let dtype = t[0].dtype();
                    let (w, bias) = (weight.to_dtype(dtype)?, bias.as_ref().map(|b| b.to_dtype(dtype)).transpose()?);
                    let frozen = frozen_linear(t[0], &w, bias.as_ref())?;
                    let update = eager::linear(&(eager::linear(t[0], t[1], None)? * 1.5)?, t[2], None)?;
                    let sum = (frozen + update)?;
                    if with_residual { sum + t[3] } else { Ok(sum) }
                },
            );
            prop_assert!(agreement.holds(), "off by {agreement}");
        }
    }
}
