//! RMS norm and layer norm over the last dimension as single nodes: the
//! forward pass is candle's fused kernel, the backward pass recomputes each
//! row's statistics from the input. The graph keeps the input and the
//! output, where the norm written as ops keeps six tensors of the input's
//! size.

use candle_core::{D, DType, Result, Tensor};

use super::node::{Backward, node};

/// RMS norm over the last dimension, `x / √(mean(x²) + eps) · alpha`, one
/// node whose backward pass gives `xs` and `alpha` (where they take part in
/// the graph) their gradients (`candle_nn::ops::rms_norm`'s signature; its
/// fused kernel has no backward pass).
///
/// ```
/// use autobatch_models::ops::rms_norm;
/// use candle_core::{Device, Tensor, Var};
///
/// let x = Var::randn(0f32, 1.0, (2, 3, 8), &Device::Cpu)?;
/// let alpha = Var::ones(8, candle_core::DType::F32, &Device::Cpu)?;
/// let y = rms_norm(x.as_tensor(), alpha.as_tensor(), 1e-5)?;
/// let grads = y.sqr()?.sum_all()?.backward()?;
/// assert!(grads.get(&x).is_some() && grads.get(&alpha).is_some());
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn rms_norm(xs: &Tensor, alpha: &Tensor, eps: f32) -> Result<Tensor> {
    width(xs, &[alpha], "rms norm")?;
    let value = candle_nn::ops::rms_norm(&xs.detach().contiguous()?, &alpha.detach(), eps)?;
    node(&[xs, alpha], value, Norm { eps, centered: false })
}

/// Layer norm over the last dimension, `(x − mean) / √(var + eps) · alpha +
/// beta`, one node whose backward pass gives `xs`, `alpha` and `beta` their
/// gradients (`candle_nn::ops::layer_norm`'s signature).
pub fn layer_norm(xs: &Tensor, alpha: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
    width(xs, &[alpha, beta], "layer norm")?;
    let value = candle_nn::ops::layer_norm(&xs.detach().contiguous()?, &alpha.detach(), &beta.detach(), eps)?;
    node(&[xs, alpha, beta], value, Norm { eps, centered: true })
}

/// Every one of `params` is a vector as wide as `xs`'s last dimension.
fn width(xs: &Tensor, params: &[&Tensor], op: &str) -> Result<()> {
    let width = xs.dim(D::Minus1)?;
    for param in params {
        if param.dims() != [width] {
            candle_core::bail!("{op}: a weight of {:?} for an input of {:?}", param.dims(), xs.dims())
        }
    }
    Ok(())
}

/// The backward pass of both norms (`centered`: the layer norm's mean removed).
struct Norm {
    eps: f32,
    centered: bool,
}

impl Backward for Norm {
    fn name(&self) -> &'static str {
        if self.centered { "fused-layer-norm" } else { "fused-rms-norm" }
    }

    /// With `x̂` the normalized input, `r` each row's reciprocal deviation and
    /// `gα = grad · alpha`: `dx = r · (gα − mean(gα) − x̂ · mean(gα · x̂))`
    /// (no `mean(gα)` for the RMS norm), `dalpha = Σ grad · x̂`, `dbeta = Σ grad`,
    /// in f32 for a 16-bit input.
    fn backward(&self, inputs: &[Tensor], wanted: &[bool], _: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (x, alpha) = (&inputs[0], &inputs[1]);
        let f32 = |t: &Tensor| t.to_dtype(DType::F32);
        let mut xf = f32(x)?;
        if self.centered {
            xf = xf.broadcast_sub(&xf.mean_keepdim(D::Minus1)?)?;
        }
        let r = (xf.sqr()?.mean_keepdim(D::Minus1)? + f64::from(self.eps))?.sqrt()?.recip()?;
        let normed = xf.broadcast_mul(&r)?;
        drop(xf);
        let g = f32(grad)?;
        let rows_summed = |t: &Tensor| -> Result<Tensor> {
            let width = t.dim(D::Minus1)?;
            t.reshape(((), width))?.sum(0)
        };
        let mut grads = vec![None; inputs.len()];
        if wanted[1] {
            grads[1] = Some(rows_summed(&(&g * &normed)?)?.to_dtype(alpha.dtype())?);
        }
        if self.centered && wanted[2] {
            grads[2] = Some(rows_summed(&g)?.to_dtype(inputs[2].dtype())?);
        }
        if wanted[0] {
            let scaled = g.broadcast_mul(&f32(alpha)?)?;
            drop(g);
            let projection = (&scaled * &normed)?.mean_keepdim(D::Minus1)?;
            let mut dx = (scaled - normed.broadcast_mul(&projection)?)?;
            if self.centered {
                dx = dx.broadcast_sub(&dx.mean_keepdim(D::Minus1)?)?;
            }
            grads[0] = Some(dx.broadcast_mul(&r)?.to_dtype(x.dtype())?);
        }
        Ok(grads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::eager;
    use crate::ops::testing::{agree, var};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Output and every gradient equal the norms written as candle ops,
        /// within 1e-5 relative in f32, over shapes and scales.
        #[test]
        fn the_fused_norms_equal_the_eager_ones(
            rows in 1usize..9,
            width in 1usize..70,
            scale in 0.01f32..100.0,
            seed in 0usize..1000,
        ) {
            let x = var(&[rows, width], seed, scale);
            let (alpha, beta) = (var(&[width], seed + 1, 1.0), var(&[width], seed + 2, 1.0));
            let vars = [&x, &alpha, &beta];
            let agreement = agree(&vars[..2], |t| rms_norm(t[0], t[1], 1e-5), |t| eager::rms_norm(t[0], t[1], 1e-5));
            prop_assert!(agreement.holds(), "rms norm off by {agreement}");
            let agreement = agree(&vars, |t| layer_norm(t[0], t[1], t[2], 1e-5), |t| eager::layer_norm(t[0], t[1], t[2], 1e-5));
            prop_assert!(agreement.holds(), "layer norm off by {agreement}");
        }
    }

    #[test]
    fn a_frozen_weight_gets_no_gradient_and_a_wrong_one_is_refused() {
        let x = var(&[3, 4, 8], 1, 1.0);
        let alpha = var(&[8], 2, 1.0).as_tensor().detach();
        let grads = rms_norm(x.as_tensor(), &alpha, 1e-5).unwrap().sum_all().unwrap().backward().unwrap();
        assert!(grads.get(&x).is_some() && grads.get(&alpha).is_none());
        assert!(rms_norm(x.as_tensor(), &var(&[7], 3, 1.0), 1e-5).is_err());
        let beta = var(&[8], 4, 1.0);
        assert!(layer_norm(x.as_tensor(), &alpha, &var(&[4], 5, 1.0), 1e-5).is_err());
        assert!(layer_norm(x.as_tensor(), &alpha, &beta, 1e-5).is_ok());
    }

    #[test]
    fn in_bf16_within_bf16s_tolerance() {
        let x = var(&[4, 64], 7, 3.0);
        let alpha = var(&[64], 8, 1.0);
        let bf16 = |v: &candle_core::Var| v.as_tensor().to_dtype(DType::BF16).unwrap();
        let (ours, theirs) = (
            rms_norm(&bf16(&x), &bf16(&alpha), 1e-5).unwrap(),
            eager::rms_norm(&bf16(&x), &bf16(&alpha), 1e-5).unwrap(),
        );
        assert_eq!(ours.dtype(), DType::BF16);
        let error =
            crate::ops::testing::relative(&ours.to_dtype(DType::F32).unwrap(), &theirs.to_dtype(DType::F32).unwrap());
        assert!(error < 2e-2, "{error}");
    }
}
