//! A mixture of experts' outputs summed back into the tokens they came
//! from: each row of the experts' outputs, weighted by its router weight,
//! added to its token's row of the residual stream, in one node.
//!
//! Written as candle ops (`rows · weights`, then `index_add`), the graph
//! keeps the weighted rows beside the rows; this node keeps neither more
//! than its inputs and its output, and its backward pass gathers the
//! output's gradient back to the rows.

use candle_core::{D, Result, Tensor};

use super::node::{Backward, node};

/// `residual` `(tokens, h)` with `weights[r] · rows[r]` added to row
/// `tokens[r]` for every row `r` of `rows` `(n, h)` (`weights` `(n)`,
/// `tokens` `(n)` of u32), in the order of the rows. `residual`, `rows` and
/// `weights` each get their gradient where they take part in the graph.
pub(crate) fn routed_sum(residual: &Tensor, rows: &Tensor, weights: &Tensor, tokens: &Tensor) -> Result<Tensor> {
    let (n, h) = rows.dims2()?;
    let (_, width) = residual.dims2()?;
    if width != h || weights.dims() != [n] || tokens.dims() != [n] {
        candle_core::bail!(
            "routed sum: rows {:?}, weights {:?} and tokens {:?} into a residual of {:?}",
            rows.dims(),
            weights.dims(),
            tokens.dims(),
            residual.dims()
        )
    }
    let weighted = rows.detach().broadcast_mul(&weights.detach().unsqueeze(1)?)?;
    let value = residual.detach().index_add(tokens, &weighted, 0)?;
    drop(weighted);
    node(&[residual, rows, weights], value, Routed { tokens: tokens.clone() })
}

/// [`routed_sum`] as candle's differentiable ops: the reference.
pub(crate) fn routed_sum_eager(residual: &Tensor, rows: &Tensor, weights: &Tensor, tokens: &Tensor) -> Result<Tensor> {
    residual.index_add(tokens, &rows.broadcast_mul(&weights.unsqueeze(1)?)?, 0)
}

struct Routed {
    tokens: Tensor,
}

impl Backward for Routed {
    fn name(&self) -> &'static str {
        "fused-routed-sum"
    }

    fn backward(&self, inputs: &[Tensor], wanted: &[bool], _: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (rows, weights) = (&inputs[1], &inputs[2]);
        let gathered = grad.index_select(&self.tokens, 0)?;
        let rows_grad = if wanted[1] { Some(gathered.broadcast_mul(&weights.unsqueeze(1)?)?) } else { None };
        let weights_grad = if wanted[2] { Some((&gathered * rows)?.sum(D::Minus1)?) } else { None };
        Ok(vec![wanted[0].then(|| grad.clone()), rows_grad, weights_grad])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn the_fused_sum_equals_candles_ops_and_their_gradients() {
        let device = Device::Cpu;
        let residual = Var::randn(0f32, 1.0, (5, 3), &device).unwrap();
        let rows = Var::randn(0f32, 1.0, (7, 3), &device).unwrap();
        let weights = Var::randn(0f32, 1.0, 7, &device).unwrap();
        // a token several rows go to, one none go to
        let tokens = Tensor::new(&[0u32, 2, 2, 4, 1, 0, 2], &device).unwrap();
        let probe = Tensor::randn(0f32, 1.0, (5, 3), &device).unwrap();
        let run = |sum: fn(&Tensor, &Tensor, &Tensor, &Tensor) -> Result<Tensor>| {
            let out = sum(residual.as_tensor(), rows.as_tensor(), weights.as_tensor(), &tokens).unwrap();
            let grads = (&out * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let mut all = vec![out];
            all.extend([&residual, &rows, &weights].map(|v| grads.get(v).unwrap().clone()));
            all
        };
        for (fused, eager) in run(routed_sum).iter().zip(run(routed_sum_eager)) {
            let gap = (fused - eager).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(gap < 1e-6, "{gap}");
        }
    }

    #[test]
    fn mismatched_shapes_are_refused() {
        let device = Device::Cpu;
        let residual = Tensor::zeros((4, 3), candle_core::DType::F32, &device).unwrap();
        let rows = Tensor::zeros((2, 3), candle_core::DType::F32, &device).unwrap();
        let tokens = Tensor::new(&[0u32, 1], &device).unwrap();
        let weights = Tensor::zeros(3, candle_core::DType::F32, &device).unwrap();
        assert!(routed_sum(&residual, &rows, &weights, &tokens).is_err());
    }
}
