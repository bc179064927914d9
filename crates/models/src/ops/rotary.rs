//! Rotary embeddings as single nodes: the forward pass is candle's fused
//! kernel, the backward pass the same kernel rotating the gradient back
//! (a rotation's transpose is the rotation by the opposite angle: the
//! tables `cos` and `−sin`). The graph keeps the input and the output,
//! where the rotation written as ops keeps a negated half, the halves
//! joined, two products and their sum.

use candle_core::{Result, Tensor};

use super::node::{Backward, node};

/// Which of candle's three rotary kernels.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// `(b, heads, t, d)`, the halves rotated.
    Halves,
    /// `(b, heads, t, d)`, pairs interleaved.
    Interleaved,
    /// `(b, t, heads, d)`, the halves rotated.
    HalvesThd,
}

impl Kind {
    fn apply(self, xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        match self {
            Kind::Halves => candle_nn::rotary_emb::rope(xs, cos, sin),
            Kind::Interleaved => candle_nn::rotary_emb::rope_i(xs, cos, sin),
            Kind::HalvesThd => candle_nn::rotary_emb::rope_thd(xs, cos, sin),
        }
    }
}

/// Rotary embedding of `xs` `(b, heads, t, d)`, halves rotated, by the
/// tables `cos` and `sin` `(t, d / 2)`, one node whose backward pass gives
/// `xs` its gradient (`candle_nn::rotary_emb::rope`'s signature, any
/// layout of `xs`). The tables are constants: they get no gradient.
///
/// ```
/// use autobatch_models::ops::rope;
/// use candle_core::{Device, Tensor, Var};
///
/// let q = Var::randn(0f32, 1.0, (1, 2, 5, 8), &Device::Cpu)?;
/// let angles = Tensor::arange(0f32, 20.0, &Device::Cpu)?.reshape((5, 4))?;
/// let rotated = rope(q.as_tensor(), &angles.cos()?, &angles.sin()?)?;
/// // a rotation keeps each pair's length
/// let norm = |t: &Tensor| t.sqr()?.sum_all()?.to_scalar::<f32>();
/// assert!((norm(&rotated)? - norm(q.as_tensor())?).abs() < 1e-3);
/// assert!(rotated.sum_all()?.backward()?.get(&q).is_some());
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn rope(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    rotate(Kind::Halves, xs, cos, sin)
}

/// Rotary embedding of `xs` `(b, heads, t, d)`, pairs interleaved, one node
/// (`candle_nn::rotary_emb::rope_i`'s signature).
pub fn rope_i(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    rotate(Kind::Interleaved, xs, cos, sin)
}

/// Rotary embedding of `xs` `(b, t, heads, d)`, halves rotated, one node
/// (`candle_nn::rotary_emb::rope_thd`'s signature): a projection's output
/// reshaped to heads, rotated without a copy made contiguous first.
pub fn rope_thd(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    rotate(Kind::HalvesThd, xs, cos, sin)
}

fn rotate(kind: Kind, xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (cos, sin) = (cos.detach().contiguous()?, sin.detach().contiguous()?);
    let value = kind.apply(&xs.detach().contiguous()?, &cos, &sin)?;
    node(&[xs], value, Rotation { kind, cos, sin })
}

/// The backward pass: the gradient rotated back.
struct Rotation {
    kind: Kind,
    cos: Tensor,
    sin: Tensor,
}

impl Backward for Rotation {
    fn name(&self) -> &'static str {
        "fused-rotary-embedding"
    }

    fn backward(&self, _: &[Tensor], _: &[bool], _: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(self.kind.apply(&grad.contiguous()?, &self.cos, &self.sin.neg()?)?)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::eager;
    use crate::ops::testing::{agree, var};
    use proptest::prelude::*;

    /// `f` of `x` by the tables in `x`'s dtype (the exact answer's in f64).
    fn in_dtype(
        f: fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<Tensor> {
        f(x, &cos.to_dtype(x.dtype())?, &sin.to_dtype(x.dtype())?)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

        /// Output and gradient equal the rotations written as candle ops,
        /// for the three layouts, contiguous or a transposed view.
        #[test]
        fn the_fused_rotations_equal_the_eager_ones(
            t in 1usize..12,
            half in 1usize..9,
            heads in 1usize..4,
            seed in 0usize..1000,
        ) {
            let d = 2 * half;
            let angles = var(&[t, half], seed, 3.0).as_tensor().detach();
            let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
            let bhtd = var(&[2, heads, t, d], seed + 1, 1.0);
            let agreement = agree(&[&bhtd], |x| rope(x[0], &cos, &sin), |x| in_dtype(eager::rope, x[0], &cos, &sin));
            prop_assert!(agreement.holds(), "rope off by {agreement}");
            let agreement = agree(&[&bhtd], |x| rope_i(x[0], &cos, &sin), |x| in_dtype(eager::rope_i, x[0], &cos, &sin));
            prop_assert!(agreement.holds(), "rope_i off by {agreement}");
            let bthd = var(&[2, t, heads, d], seed + 2, 1.0);
            let agreement = agree(&[&bthd], |x| rope_thd(x[0], &cos, &sin), |x| in_dtype(eager::rope_thd, x[0], &cos, &sin));
            prop_assert!(agreement.holds(), "rope_thd off by {agreement}");
            // a (b, t, heads, d) tensor seen as (b, heads, t, d): a strided view
            let agreement = agree(
                &[&bthd],
                |x| rope(&x[0].transpose(1, 2)?, &cos, &sin),
                |x| in_dtype(eager::rope, &x[0].transpose(1, 2)?.contiguous()?, &cos, &sin),
            );
            prop_assert!(agreement.holds(), "rope of a view off by {agreement}");
        }
    }
}
