//! Softmax over the last dimension as a single node: the forward pass is
//! candle's fused kernel, the backward pass needs the output alone
//! (`dx = y · (g − Σ g · y)`, PyTorch's). Written as candle ops
//! (exponentials, their sum, the quotient) the graph keeps three tensors of
//! the input's size.

use candle_core::{D, DType, Result, Tensor};

use super::node::{Backward, node};

/// Softmax over the last dimension, one node whose backward pass gives `xs`
/// its gradient (`candle_nn::ops::softmax_last_dim`'s signature; its fused
/// kernel has no backward pass).
pub fn softmax_last_dim(xs: &Tensor) -> Result<Tensor> {
    let value = candle_nn::ops::softmax_last_dim(&xs.detach().contiguous()?)?;
    node(&[xs], value, Softmax)
}

struct Softmax;

impl Backward for Softmax {
    fn name(&self) -> &'static str {
        "fused-softmax"
    }

    fn backward(&self, inputs: &[Tensor], _: &[bool], output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (y, g) = (output.to_dtype(DType::F32)?, grad.to_dtype(DType::F32)?);
        let dot = (&g * &y)?.sum_keepdim(D::Minus1)?;
        let dx = (g.broadcast_sub(&dot)? * &y)?;
        // each row's gradient sums to 0; where a row saturates, its largest
        // entry's `g − Σ g·y` cancels to rounding, so it takes minus the sum
        // of the others instead (as the softmax's autograd through its max does)
        let largest = y.broadcast_eq(&y.max_keepdim(D::Minus1)?)?.to_dtype(DType::F32)?;
        let excess = (dx.sum_keepdim(D::Minus1)? / largest.sum_keepdim(D::Minus1)?)?;
        let dx = (dx - largest.broadcast_mul(&excess)?)?;
        Ok(vec![Some(dx.to_dtype(inputs[0].dtype())?)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{agree, var};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        #[test]
        fn the_fused_softmax_equals_the_eager_one(rows in 1usize..6, width in 1usize..40, scale in 0.1f32..20.0, seed in 0usize..1000) {
            let x = var(&[2, rows, width], seed, scale);
            let agreement = agree(&[&x], |t| softmax_last_dim(t[0]), |t| crate::ops::eager::softmax_last_dim(t[0]));
            prop_assert!(agreement.holds(), "off by {agreement}");
        }
    }
}
