//! Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with
//! Sublinear Memory Cost"), with the defaults most implementations use
//! (fairseq, Hugging Face): factored second moment, no first moment, relative
//! step size `min(1e-2, 1/√t)` scaled by the parameter's RMS, update clipping
//! at 1.0, decay `β₂ₜ = 1 − t^−0.8`.
//!
//! State, kept in f32: for each matrix (and each tensor of two or more
//! dimensions, factored over its last two) a row and a column vector,
//! `4·(rows + cols)` bytes; for each vector, `4` bytes per value; with
//! `beta1`, one more f32 moment (4 bytes per parameter).

use candle_core::backprop::GradStore;
use candle_core::{D, DType, Result, Tensor, Var};
use candle_nn::Optimizer;

use super::{States, VariableState};
use crate::per_parameter::OptimizerKind;

/// Adafactor's hyper-parameters; the defaults are the paper's as commonly used.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamsAdafactor {
    /// A fixed learning rate; `None` (the default) for the relative step
    /// `min(1e-2, 1/√t)`.
    pub lr: Option<f64>,
    /// Regularizes the squared gradient (ε₁ = 1e-30).
    pub eps1: f64,
    /// The smallest parameter scale (ε₂ = 1e-3).
    pub eps2: f64,
    /// Updates with an RMS above this are scaled down to it (d = 1.0).
    pub clip_threshold: f64,
    /// `β₂ₜ = 1 − t^decay_rate` (−0.8).
    pub decay_rate: f64,
    /// A first moment with this decay; `None` (the default) keeps none.
    pub beta1: Option<f64>,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Scale the step by the parameter's RMS (true).
    pub scale_parameter: bool,
}

impl Default for ParamsAdafactor {
    fn default() -> Self {
        ParamsAdafactor {
            lr: None,
            eps1: 1e-30,
            eps2: 1e-3,
            clip_threshold: 1.0,
            decay_rate: -0.8,
            beta1: None,
            weight_decay: 0.0,
            scale_parameter: true,
        }
    }
}

/// The second-moment estimate of one variable.
#[derive(Debug)]
enum SecondMoment {
    /// Row and column means of the squared gradient over the last two dimensions.
    Factored { row: Var, col: Var },
    /// The full estimate, for vectors.
    Full(Var),
}

#[derive(Debug)]
pub(crate) struct State {
    var: Var,
    second: SecondMoment,
    first: Option<Var>,
}

/// Adafactor (Shazeer & Stern 2018): factored second moment, no first moment, relative step size
/// `min(1e-2, 1/√t)` scaled by the parameter's RMS, update clipping at 1.0, decay `1 − t^−0.8`;
/// state `4·(rows + cols)` bytes per matrix, 4 per value of a vector (see [`crate::optim`]).
///
/// ```
/// use autobatch::optim::{Adafactor, DryStep, ParamsAdafactor};
/// use candle_core::{DType, Device, Var};
/// use candle_nn::Optimizer;
///
/// let matrix = Var::ones((512, 256), DType::F32, &Device::Cpu)?;
/// let bias = Var::ones(512, DType::F32, &Device::Cpu)?;
/// let adafactor = Adafactor::new(vec![matrix, bias], ParamsAdafactor::default())?;
/// // 4·(512 + 256) for the matrix, 4·512 for the vector; AdamW would hold 8·(131072 + 512)
/// assert_eq!(adafactor.state_bytes(), 4 * (512 + 256) + 4 * 512);
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Debug)]
pub struct Adafactor {
    states: States<State>,
    params: ParamsAdafactor,
}

/// √(mean(x²)), as a number.
fn rms(x: &Tensor) -> Result<f64> {
    Ok(f64::from(x.sqr()?.mean_all()?.sqrt()?.to_dtype(DType::F32)?.to_scalar::<f32>()?))
}

impl Adafactor {
    /// Optimizer steps taken.
    pub fn step_count(&self) -> u64 {
        self.states.taken
    }

    /// The hyper-parameters.
    pub fn params(&self) -> &ParamsAdafactor {
        &self.params
    }

    /// The next weights, second moment(s) and first moment of `state` at step `t`.
    fn update(&self, state: &State, grad: &Tensor, t: u64) -> Result<(Tensor, Vec<Tensor>, Option<Tensor>)> {
        let p = &self.params;
        // detached: a chain of ops on tensors with a graph keeps every intermediate alive
        let theta = state.var.as_tensor().detach().to_dtype(DType::F32)?;
        let grad = grad.detach().to_dtype(DType::F32)?;
        let relative = p.lr.unwrap_or_else(|| (1e-2f64).min(1.0 / (t as f64).sqrt()));
        let lr = if p.scale_parameter { relative * p.eps2.max(rms(&theta)?) } else { relative };
        let beta2t = 1.0 - (t as f64).powf(p.decay_rate);
        let squared = (grad.sqr()? + p.eps1)?;
        let (update, second) = match &state.second {
            SecondMoment::Factored { row, col } => {
                let next_row = ((row.as_tensor().detach() * beta2t)? + (squared.mean(D::Minus1)? * (1.0 - beta2t))?)?;
                let next_col = ((col.as_tensor().detach() * beta2t)? + (squared.mean(D::Minus2)? * (1.0 - beta2t))?)?;
                let row_factor = next_row.broadcast_div(&next_row.mean_keepdim(D::Minus1)?)?.sqrt()?.recip()?;
                let col_factor = next_col.sqrt()?.recip()?;
                let update = row_factor.unsqueeze(D::Minus1)?.broadcast_mul(&col_factor.unsqueeze(D::Minus2)?)?;
                ((update * &grad)?, vec![next_row, next_col])
            }
            SecondMoment::Full(v) => {
                let next_v = ((v.as_tensor().detach() * beta2t)? + (squared * (1.0 - beta2t))?)?;
                ((next_v.sqrt()?.recip()? * &grad)?, vec![next_v])
            }
        };
        let clip = (rms(&update)? / p.clip_threshold).max(1.0);
        let mut update = (update * (lr / clip))?;
        let first = match (&state.first, p.beta1) {
            (Some(m), Some(beta1)) => {
                let next_m = ((m.as_tensor().detach() * beta1)? + (update * (1.0 - beta1))?)?;
                update = next_m.clone();
                Some(next_m)
            }
            _ => None,
        };
        let decayed = if p.weight_decay != 0.0 { (&theta * (1.0 - p.weight_decay * lr))? } else { theta };
        let next_theta = (decayed - update)?.to_dtype(state.var.dtype())?;
        Ok((next_theta, second, first))
    }
}

impl Optimizer for Adafactor {
    type Config = ParamsAdafactor;

    fn new(vars: Vec<Var>, params: ParamsAdafactor) -> Result<Self> {
        let states = States::new(vars, |var| {
            let dims = var.dims().to_vec();
            let device = var.device().clone();
            let second = if dims.len() >= 2 {
                let (lead, last) = dims.split_at(dims.len() - 1);
                let row_shape = lead.to_vec();
                let mut col_shape = dims[..dims.len() - 2].to_vec();
                col_shape.push(last[0]);
                SecondMoment::Factored {
                    row: Var::zeros(row_shape, DType::F32, &device)?,
                    col: Var::zeros(col_shape, DType::F32, &device)?,
                }
            } else {
                SecondMoment::Full(Var::zeros(var.shape(), DType::F32, &device)?)
            };
            let first = match params.beta1 {
                Some(_) => Some(Var::zeros(var.shape(), DType::F32, &device)?),
                None => None,
            };
            Ok(State { var, second, first })
        })?;
        Ok(Adafactor { states, params })
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        super::step(self, grads)
    }

    fn learning_rate(&self) -> f64 {
        self.params.lr.unwrap_or_else(|| (1e-2f64).min(1.0 / ((self.states.taken + 1) as f64).sqrt()))
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.params.lr = Some(lr);
    }
}

impl super::PerVariable for Adafactor {
    type State = State;
    /// The weights, the second moment's tensors (row and column, or full), the first moment.
    type Next = (Tensor, Vec<Tensor>, Option<Tensor>);

    fn states(&self) -> &States<State> {
        &self.states
    }

    fn states_mut(&mut self) -> &mut States<State> {
        &mut self.states
    }

    fn next(&self, state: &State, grad: &Tensor, step: u64) -> Result<Self::Next> {
        self.update(state, grad, step)
    }

    fn write(state: &State, (theta, second, first): Self::Next) -> Result<()> {
        match (&state.second, second.as_slice()) {
            (SecondMoment::Factored { row, col }, [next_row, next_col]) => {
                row.set(next_row)?;
                col.set(next_col)?;
            }
            (SecondMoment::Full(v), [next_v]) => v.set(next_v)?,
            _ => unreachable!("update returns the moments of the state's kind"),
        }
        if let (Some(m), Some(next_m)) = (&state.first, first) {
            m.set(&next_m)?;
        }
        state.var.set(&theta)
    }

    fn held_bytes(&self) -> u64 {
        let bytes = super::var_bytes;
        let held = |s: &State| {
            let second = match &s.second {
                SecondMoment::Factored { row, col } => bytes(row) + bytes(col),
                SecondMoment::Full(v) => bytes(v),
            };
            second + s.first.as_ref().map_or(0, bytes)
        };
        self.states.each.iter().map(held).sum()
    }

    fn optimizer_kind(&self) -> OptimizerKind {
        OptimizerKind::Adafactor
    }
}

impl VariableState for State {
    fn variable(&self) -> &Var {
        &self.var
    }
}
