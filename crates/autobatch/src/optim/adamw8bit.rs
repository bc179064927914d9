//! AdamW with 8-bit moments, quantized block-wise (Dettmers et al. 2022,
//! "8-bit Optimizers via Block-wise Quantization"): each moment is stored as one
//! byte per value plus one f32 scale (the block's largest magnitude) per block
//! of 256 values, about 2.03 bytes per parameter for both moments. As in
//! bitsandbytes, tensors under 4096 values keep f32 moments (their bytes do not
//! matter and small tensors such as norms are the most sensitive).
//!
//! The code maps (our choice, and why):
//! - first moment: signed linear, `m ≈ scale · q / 127`, `q ∈ [−127, 127]`. The
//!   first moment of a block has one sign pattern and magnitudes within a few
//!   octaves of each other; a value under 1/254 of the block's largest rounds to
//!   zero, which only means no step for that value.
//! - second moment: its square root, on a logarithmic code,
//!   `√v ≈ scale · 2^((q − 255)/8)`, `q ∈ [0, 255]`: 32 octaves at 9% steps (4.5%
//!   error on √v, the quantity the update divides by). A linear code would
//!   round the small second moments of a block to zero, and an update divided
//!   by `0 + ε` explodes; bitsandbytes' dynamic code avoids that the same way,
//!   by spending its bits on exponents.

use std::ops::Range;

use candle_core::{D, DType, Device, Result, Tensor, Var};
use candle_nn::{Optimizer, ParamsAdamW};

use super::{States, VariableState, part, write_part};
use crate::per_parameter::OptimizerKind;

/// Values per quantization block.
pub const BLOCK: usize = 256;
/// Tensors with fewer values keep their moments in f32.
pub const MIN_QUANTIZED: usize = 4096;
/// Steps of the second moment's logarithmic code per octave.
const STEPS_PER_OCTAVE: f64 = 8.0;

/// A moment stored as 8-bit codes with one f32 scale per block.
#[derive(Debug)]
struct Quantized {
    codes: Var,
    scales: Var,
}

#[derive(Debug)]
enum Moments {
    Full { m: Var, v: Var },
    Quantized { m: Quantized, v: Quantized },
}

#[derive(Debug)]
pub(crate) struct State {
    var: Var,
    moments: Moments,
}

/// AdamW with block-wise 8-bit moments (Dettmers et al. 2022): one byte per value plus one f32
/// scale per block of 256 values for each moment, about 2.03 bytes per parameter; tensors under
/// 4096 values keep f32 moments; the second moment is stored as its square root on a
/// logarithmic code, so that small values do not round to zero (see [`crate::optim`]).
/// Configured as `candle_nn::AdamW` is, with `candle_nn::ParamsAdamW`: a drop-in for it.
///
/// ```
/// use autobatch::optim::{AdamW8bit, DryStep};
/// use candle_core::{DType, Device, Var};
/// use candle_nn::{Optimizer, ParamsAdamW};
///
/// let big = Var::ones((1024, 1024), DType::F32, &Device::Cpu)?;
/// let adam = AdamW8bit::new(vec![big], ParamsAdamW::default())?;
/// // two bytes per value and two f32 scales per 256 values: 2.03 bytes per parameter
/// assert_eq!(adam.state_bytes(), 2 * 1024 * 1024 + 2 * 4 * (1024 * 1024 / 256));
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Debug)]
pub struct AdamW8bit {
    states: States<State>,
    params: ParamsAdamW,
}

/// `x` flattened, padded with zeros to whole blocks, as (blocks, BLOCK).
fn blocks(x: &Tensor) -> Result<Tensor> {
    let n = x.elem_count();
    let flat = x.flatten_all()?;
    let padded = match n % BLOCK {
        0 => flat,
        rest => Tensor::cat(&[&flat, &Tensor::zeros(BLOCK - rest, flat.dtype(), flat.device())?], 0)?,
    };
    padded.reshape((n.div_ceil(BLOCK), BLOCK))
}

/// The first `n` values of `blocks`, shaped like `like`.
#[cfg(test)]
fn unblocks(blocks: &Tensor, like: &Tensor) -> Result<Tensor> {
    blocks.flatten_all()?.narrow(0, 0, like.elem_count())?.reshape(like.shape())
}

/// Per-block largest magnitude, never zero (a block of zeros codes to zeros).
fn scales_of(blocks: &Tensor) -> Result<Tensor> {
    blocks.abs()?.max_keepdim(D::Minus1)?.clamp(f32::MIN_POSITIVE, f32::MAX)
}

// The codecs below take detached tensors and replace each intermediate as soon
// as the next exists (`x = x.op()?` frees the old `x`), so that quantizing a
// moment holds two f32 copies of it at most: a chain of ops on a tensor with a
// graph would keep every intermediate alive until the result is dropped.

/// Signed linear code of the first moment: q = round(127 · m / scale) + 127, as u8.
fn encode_linear(blocks: &Tensor, scales: &Tensor) -> Result<Tensor> {
    let mut q = blocks.broadcast_div(scales)?;
    q = q.affine(127.0, 127.0)?;
    q = q.round()?;
    q = q.clamp(0f32, 254f32)?;
    q.to_dtype(DType::U8)
}

fn decode_linear(codes: &Tensor, scales: &Tensor) -> Result<Tensor> {
    let mut m = codes.to_dtype(DType::F32)?;
    m = m.affine(1.0 / 127.0, -1.0)?;
    m.broadcast_mul(scales)
}

/// Logarithmic code of a non-negative block (√v): q = 255 + 8·log2(x / scale).
fn encode_log(blocks: &Tensor, scales: &Tensor) -> Result<Tensor> {
    let mut q = blocks.broadcast_div(scales)?;
    q = q.clamp(f32::MIN_POSITIVE, 1f32)?;
    q = q.log()?;
    q = q.affine(STEPS_PER_OCTAVE / std::f64::consts::LN_2, 255.0)?;
    q = q.round()?;
    q = q.clamp(0f32, 255f32)?;
    q.to_dtype(DType::U8)
}

fn decode_log(codes: &Tensor, scales: &Tensor) -> Result<Tensor> {
    let mut x = codes.to_dtype(DType::F32)?;
    x = x.affine(std::f64::consts::LN_2 / STEPS_PER_OCTAVE, -255.0 * std::f64::consts::LN_2 / STEPS_PER_OCTAVE)?;
    x = x.exp()?;
    x.broadcast_mul(scales)
}

/// `x` quantized: its codes and per-block scales.
fn quantize(x: &Tensor, encode: fn(&Tensor, &Tensor) -> Result<Tensor>) -> Result<(Tensor, Tensor)> {
    let blocks = blocks(x)?;
    let scales = scales_of(&blocks)?;
    Ok((encode(&blocks, &scales)?, scales))
}

impl Quantized {
    fn zeros(n: usize, code: u8, device: &Device) -> Result<Quantized> {
        let blocks = n.div_ceil(BLOCK);
        Ok(Quantized {
            codes: Var::from_tensor(&Tensor::full(code, (blocks, BLOCK), device)?)?,
            scales: Var::from_tensor(&Tensor::full(f32::MIN_POSITIVE, (blocks, 1), device)?)?,
        })
    }

    fn bytes(&self) -> u64 {
        (self.codes.elem_count() + 4 * self.scales.elem_count()) as u64
    }
}

/// A step's results for one variable: the weights and the moments' new form.
pub(crate) struct Next {
    theta: Tensor,
    moments: NextMoments,
}

/// The moments after a step: in f32, or as (codes, scales).
enum NextMoments {
    Full { m: Tensor, v: Tensor },
    Quantized { m: (Tensor, Tensor), v: (Tensor, Tensor) },
}

impl AdamW8bit {
    /// Optimizer steps taken.
    pub fn step_count(&self) -> usize {
        self.states.taken as usize
    }

    /// The first and second moments of `state`, in f32, detached.
    /// The moments of `range` of the variable, in f32 (a quantized state's
    /// blocks decoded, the range a whole number of blocks from a block's start).
    fn moments(&self, state: &State, range: &Range<usize>) -> Result<(Tensor, Tensor)> {
        match &state.moments {
            Moments::Full { m, v } => Ok((part(m, range)?, part(v, range)?)),
            Moments::Quantized { m, v } => {
                let (first, count) = (range.start / BLOCK, range.len().div_ceil(BLOCK));
                let rows = |q: &Quantized| -> Result<(Tensor, Tensor)> {
                    Ok((
                        q.codes.as_tensor().detach().narrow(0, first, count)?,
                        q.scales.as_tensor().detach().narrow(0, first, count)?,
                    ))
                };
                let within = |blocks: Tensor| blocks.flatten_all()?.narrow(0, 0, range.len());
                let (codes, scales) = rows(m)?;
                let m = within(decode_linear(&codes, &scales)?)?;
                let (codes, scales) = rows(v)?;
                let sqrt_v = within(decode_log(&codes, &scales)?)?;
                Ok((m, sqrt_v.sqr()?))
            }
        }
    }

    /// The next weights and moments of one slice (`theta`, its gradient `g`
    /// in f32), the moments quantized again where the state is.
    fn next(&self, state: &State, theta: Tensor, (m, v): (Tensor, Tensor), g: Tensor, t: usize) -> Result<Next> {
        let ParamsAdamW { lr, beta1, beta2, eps, weight_decay } = self.params;
        // m ← β₁·m + (1 − β₁)·g
        let mut next_m = m.affine(beta1, 0.0)?;
        drop(m);
        next_m = (next_m + g.affine(1.0 - beta1, 0.0)?)?;
        // v ← β₂·v + (1 − β₂)·g²
        let mut next_v = v.affine(beta2, 0.0)?;
        drop(v);
        let mut g2 = g.sqr()?;
        g2 = g2.affine(1.0 - beta2, 0.0)?;
        next_v = (next_v + g2)?;
        drop(g);
        let sqrt_v = next_v.sqrt()?;
        // a quantized state keeps √v (its code is logarithmic in it), a full one v
        let moments = match &state.moments {
            Moments::Full { .. } => NextMoments::Full { m: next_m.clone(), v: next_v },
            Moments::Quantized { .. } => {
                drop(next_v);
                NextMoments::Quantized { m: quantize(&next_m, encode_linear)?, v: quantize(&sqrt_v, encode_log)? }
            }
        };
        // θ ← θ·(1 − lr·λ) − lr · m̂ / (√v̂ + ε), with m̂ = m / (1 − β₁ᵗ), √v̂ = √v / √(1 − β₂ᵗ)
        let bias_m = 1.0 / (1.0 - beta1.powi(t as i32));
        let bias_v = 1.0 / (1.0 - beta2.powi(t as i32));
        let mut step = next_m.affine(lr * bias_m, 0.0)?;
        drop(next_m);
        let denominator = sqrt_v.affine(bias_v.sqrt(), eps)?;
        drop(sqrt_v);
        step = (step / denominator)?;
        let dtype = theta.dtype();
        let theta = theta.to_dtype(DType::F32)?;
        let mut next_theta = theta.affine(1.0 - lr * weight_decay, 0.0)?;
        drop(theta);
        next_theta = (next_theta - step)?;
        let theta = next_theta.to_dtype(dtype)?;
        Ok(Next { theta, moments })
    }

    /// Writes one slice's next weights and moments.
    fn write(state: &State, range: &Range<usize>, Next { theta, moments }: Next) -> Result<()> {
        match (moments, &state.moments) {
            (NextMoments::Full { m, v }, Moments::Full { m: m_var, v: v_var }) => {
                write_part(m_var, range, &m)?;
                write_part(v_var, range, &v)?;
            }
            (NextMoments::Quantized { m, v }, Moments::Quantized { m: m_q, v: v_q }) => {
                let (first, count) = (range.start / BLOCK, range.len().div_ceil(BLOCK));
                let (codes, scales) = (first * BLOCK..(first + count) * BLOCK, first..first + count);
                write_part(&m_q.codes, &codes, &m.0)?;
                write_part(&m_q.scales, &scales, &m.1)?;
                write_part(&v_q.codes, &codes, &v.0)?;
                write_part(&v_q.scales, &scales, &v.1)?;
            }
            _ => unreachable!("next returns the moments of the state's kind"),
        }
        write_part(&state.var, range, &theta)
    }
}

impl Optimizer for AdamW8bit {
    type Config = ParamsAdamW;

    fn new(vars: Vec<Var>, params: ParamsAdamW) -> Result<Self> {
        let states = States::new(vars, |var| {
            let n = var.elem_count();
            let moments = if n < MIN_QUANTIZED {
                Moments::Full {
                    m: Var::zeros(var.shape(), DType::F32, var.device())?,
                    v: Var::zeros(var.shape(), DType::F32, var.device())?,
                }
            } else {
                // zero codes: 127 is m = 0; 0 is √v = 2^-31.9 · the scale
                Moments::Quantized {
                    m: Quantized::zeros(n, 127, var.device())?,
                    v: Quantized::zeros(n, 0, var.device())?,
                }
            };
            Ok(State { var, moments })
        })?;
        Ok(AdamW8bit { states, params })
    }

    shared_step_and_learning_rate!();
}

impl super::PerVariable for AdamW8bit {
    type State = State;

    fn states(&self) -> &States<State> {
        &self.states
    }

    fn states_mut(&mut self) -> &mut States<State> {
        &mut self.states
    }

    fn update(&self, state: &State, grad: &Tensor, step: u64, write: bool) -> Result<()> {
        let grad = super::whole_gradient(grad)?;
        // a quantized state's slices are whole blocks
        let granule = if matches!(state.moments, Moments::Quantized { .. }) { BLOCK } else { 1 };
        for range in super::slices(state.var.elem_count(), granule) {
            let moments = self.moments(state, &range)?;
            let g = part(&grad, &range)?.to_dtype(DType::F32)?;
            let next = self.next(state, part(&state.var, &range)?, moments, g, step as usize)?;
            if write {
                Self::write(state, &range, next)?;
            }
        }
        Ok(())
    }

    fn held_bytes(&self) -> u64 {
        let bytes = super::var_bytes;
        let held = |s: &State| match &s.moments {
            Moments::Full { m, v } => bytes(m) + bytes(v),
            Moments::Quantized { m, v } => m.bytes() + v.bytes(),
        };
        self.states.each.iter().map(held).sum()
    }

    fn optimizer_kind(&self) -> OptimizerKind {
        OptimizerKind::Adam8bit
    }
}

impl VariableState for State {
    fn variable(&self) -> &Var {
        &self.var
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_within_their_resolution() {
        let device = Device::Cpu;
        let values: Vec<f32> = (0..512).map(|i| ((i as f32) - 256.0) * 0.37).collect();
        let x = Tensor::from_vec(values.clone(), 512, &device).unwrap();
        let b = blocks(&x).unwrap();
        let s = scales_of(&b).unwrap();
        let back = unblocks(&decode_linear(&encode_linear(&b, &s).unwrap(), &s).unwrap(), &x).unwrap();
        let max = 256.0 * 0.37;
        for (a, b) in values.iter().zip(back.to_vec1::<f32>().unwrap()) {
            assert!((a - b).abs() <= max / 254.0 + 1e-5, "{a} {b}");
        }
        // the log code: 9% steps over 32 octaves
        let wide: Vec<f32> = (0..256).map(|i| 2f32.powf(-(i as f32) / 8.0)).collect();
        let x = Tensor::from_vec(wide.clone(), 256, &device).unwrap();
        let b = blocks(&x).unwrap();
        let s = scales_of(&b).unwrap();
        let back = unblocks(&decode_log(&encode_log(&b, &s).unwrap(), &s).unwrap(), &x).unwrap();
        for (a, b) in wide.iter().zip(back.to_vec1::<f32>().unwrap()) {
            assert!((a / b - 1.0).abs() < 0.05, "{a} {b}");
        }
    }
}
