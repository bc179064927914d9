//! A mixture of experts' outputs summed back into the tokens they came
//! from: each row of the experts' outputs, weighted by its router weight,
//! added to its token's row of the residual stream, in one node.
//!
//! Written as candle ops (the experts' outputs joined, weighted, then
//! `index_add`), the graph keeps the joined rows and the weighted ones
//! beside the experts' outputs; this node keeps its inputs (the outputs as
//! they are) and its output, and its backward pass gathers the output's
//! gradient back to each expert's rows.

use candle_core::{D, Result, Tensor};

use super::node::{Backward, node};

/// `residual` `(tokens, h)` with `weights[r] · rows[r]` added to row
/// `tokens[r]` for every row `r` of the experts' outputs `pieces` (each
/// `(n_e, h)`, their rows one after the other; `weights` and `tokens` `(n)`
/// for their `n` rows, `tokens` of u32), in the order of the rows. The
/// pieces are the node's inputs as they are: never joined in the graph.
/// `residual`, `weights` and each piece get their gradient where they take
/// part in the graph.
pub(crate) fn routed_sum(residual: &Tensor, pieces: &[Tensor], weights: &Tensor, tokens: &Tensor) -> Result<Tensor> {
    let (_, h) = residual.dims2()?;
    let mut n = 0;
    for piece in pieces {
        let (rows, width) = piece.dims2()?;
        if width != h {
            candle_core::bail!("routed sum: an expert's rows of {width} into a residual of {h}")
        }
        n += rows;
    }
    if pieces.is_empty() || weights.dims() != [n] || tokens.dims() != [n] {
        candle_core::bail!(
            "routed sum: {n} rows in {} pieces, weights {:?} and tokens {:?}",
            pieces.len(),
            weights.dims(),
            tokens.dims()
        )
    }
    let value = {
        let rows = joined(pieces)?;
        let weighted = rows.broadcast_mul(&weights.detach().unsqueeze(1)?)?;
        residual.detach().index_add(tokens, &weighted, 0)?
    };
    let mut inputs = vec![residual, weights];
    inputs.extend(pieces);
    node(&inputs, value, Routed { tokens: tokens.clone() })
}

/// The pieces' rows one after the other, off the graph.
fn joined(pieces: &[Tensor]) -> Result<Tensor> {
    let detached: Vec<Tensor> = pieces.iter().map(Tensor::detach).collect();
    Tensor::cat(&detached, 0)
}

/// [`routed_sum`] as candle's differentiable ops: the reference.
pub(crate) fn routed_sum_eager(
    residual: &Tensor,
    pieces: &[Tensor],
    weights: &Tensor,
    tokens: &Tensor,
) -> Result<Tensor> {
    residual.index_add(tokens, &Tensor::cat(pieces, 0)?.broadcast_mul(&weights.unsqueeze(1)?)?, 0)
}

struct Routed {
    tokens: Tensor,
}

impl Backward for Routed {
    fn name(&self) -> &'static str {
        "fused-routed-sum"
    }

    fn backward(&self, inputs: &[Tensor], wanted: &[bool], _: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (weights, pieces) = (&inputs[1], &inputs[2..]);
        let gathered = grad.index_select(&self.tokens, 0)?;
        let weights_grad = if wanted[1] { Some((&gathered * joined(pieces)?)?.sum(D::Minus1)?) } else { None };
        let mut grads = vec![wanted[0].then(|| grad.clone()), weights_grad];
        let mut start = 0;
        for (piece, &wanted) in pieces.iter().zip(&wanted[2..]) {
            let rows = piece.dim(0)?;
            grads.push(if wanted {
                Some(gathered.narrow(0, start, rows)?.broadcast_mul(&weights.narrow(0, start, rows)?.unsqueeze(1)?)?)
            } else {
                None
            });
            start += rows;
        }
        Ok(grads)
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
        // three experts' rows: 3, 1 and 3 of them
        let pieces: Vec<Var> = [3, 1, 3].map(|rows| Var::randn(0f32, 1.0, (rows, 3), &device).unwrap()).to_vec();
        let weights = Var::randn(0f32, 1.0, 7, &device).unwrap();
        // a token several rows go to, one none go to
        let tokens = Tensor::new(&[0u32, 2, 2, 4, 1, 0, 2], &device).unwrap();
        let probe = Tensor::randn(0f32, 1.0, (5, 3), &device).unwrap();
        type Sum = fn(&Tensor, &[Tensor], &Tensor, &Tensor) -> Result<Tensor>;
        let run = |sum: Sum| {
            let pieces_: Vec<Tensor> = pieces.iter().map(|piece| piece.as_tensor().clone()).collect();
            let out = sum(residual.as_tensor(), &pieces_, weights.as_tensor(), &tokens).unwrap();
            let grads = (&out * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let mut all = vec![out];
            all.extend([&residual, &weights].into_iter().chain(&pieces).map(|v| grads.get(v).unwrap().clone()));
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
        assert!(routed_sum(&residual, std::slice::from_ref(&rows), &weights, &tokens).is_err());
        assert!(routed_sum(&residual, &[], &weights, &tokens).is_err());
        let wide = Tensor::zeros((2, 4), candle_core::DType::F32, &device).unwrap();
        let two = Tensor::zeros(2, candle_core::DType::F32, &device).unwrap();
        assert!(routed_sum(&residual, &[wide], &two, &tokens).is_err());
    }
}
