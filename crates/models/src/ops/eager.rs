//! The fused ops' computations written as candle's differentiable ops, one
//! op a step: what the fused ops equal (their tests compare against these),
//! and what a config model runs with [`Ops::Eager`](crate::Ops::Eager).
//! candle's graph keeps every intermediate of these until it is dropped.

use candle_core::{D, Result, Tensor};

use super::mul_constant;

/// Softmax over the last dimension: `candle_nn::ops::softmax(xs, D::Minus1)`.
pub fn softmax_last_dim(xs: &Tensor) -> Result<Tensor> {
    candle_nn::ops::softmax(xs, D::Minus1)
}

/// Layer norm over the last dimension: `candle_nn::ops::layer_norm_slow`.
pub fn layer_norm(xs: &Tensor, alpha: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
    candle_nn::ops::layer_norm_slow(xs, alpha, beta, eps)
}

/// RMS norm over the last dimension: `candle_nn::ops::rms_norm_slow`.
pub fn rms_norm(xs: &Tensor, alpha: &Tensor, eps: f32) -> Result<Tensor> {
    candle_nn::ops::rms_norm_slow(xs, alpha, eps)
}

/// Rotary embedding of `xs` `(b, heads, t, d)`, halves rotated: `x · cos +
/// rotate_half(x) · sin`, the tables multiplied as constants ([`mul_constant`]:
/// `rope_slow`'s `broadcast_mul` would keep a gradient of `xs`'s size for each).
pub fn rope(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = xs.dim(D::Minus1)? / 2;
    let cos = Tensor::cat(&[cos, cos], D::Minus1)?;
    let sin = Tensor::cat(&[sin, sin], D::Minus1)?;
    let rotated =
        Tensor::cat(&[&xs.narrow(D::Minus1, half, half)?.neg()?, &xs.narrow(D::Minus1, 0, half)?], D::Minus1)?;
    mul_constant(xs, &cos)? + mul_constant(&rotated, &sin)?
}

/// Rotary embedding of `xs` `(b, heads, t, d)`, pairs interleaved: `candle_nn::rotary_emb::rope_i_slow`.
pub fn rope_i(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    candle_nn::rotary_emb::rope_i_slow(xs, cos, sin)
}

/// Rotary embedding of `xs` `(b, t, heads, d)`, halves rotated: [`rope`] of the transpose.
pub fn rope_thd(xs: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    rope(&xs.transpose(1, 2)?, cos, sin)?.transpose(1, 2)?.contiguous()
}

/// `x · weightᵀ + bias` by candle's own matmul and broadcast add, as
/// `candle_nn::Linear` computes it: both operands get a gradient (a frozen
/// weight's too, kept until the gradients are dropped).
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let (out, input) = weight.dims2()?;
    let lead = &x.dims()[..x.rank().saturating_sub(1)];
    let rows = lead.iter().product::<usize>();
    let product = x.reshape((rows, input))?.matmul(&weight.t()?)?;
    let mut shape = lead.to_vec();
    shape.push(out);
    let product = product.reshape(shape)?;
    match bias {
        Some(bias) => product.broadcast_add(bias),
        None => Ok(product),
    }
}
