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

use std::ops::Range;

use candle_core::backprop::GradStore;
use candle_core::{D, DType, Result, Tensor, Var};
use candle_nn::Optimizer;

use super::{States, VariableState, part, write_part};
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
    let n = x.elem_count().max(1);
    let mut sum = 0f64;
    for range in super::slices(x.elem_count(), 1) {
        sum += sum_sq(&f32_part(x, &range)?)?;
    }
    Ok((sum / n as f64).sqrt())
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

    /// One variable's update, in slices of whole rows: the statistics of
    /// `g² + ε₁` (each row's mean, each matrix's column means) gathered over
    /// the slices, then the update's RMS (for clipping), then the update
    /// applied; each pass recomputes a slice rather than keeping the whole
    /// update, so that no temporary is larger than a slice (and the row and
    /// column vectors).
    fn update_sliced(&self, state: &State, grad: &Tensor, t: u64, write: bool) -> Result<()> {
        let p = &self.params;
        let n = state.var.elem_count();
        if n == 0 {
            return Ok(());
        }
        let grad = super::whole_gradient(grad)?;
        let relative = p.lr.unwrap_or_else(|| (1e-2f64).min(1.0 / (t as f64).sqrt()));
        let lr = if p.scale_parameter { relative * p.eps2.max(rms(&state.var)?) } else { relative };
        let beta2t = 1.0 - (t as f64).powf(p.decay_rate);
        let squared = |range: &Range<usize>| f32_part(&grad, range)?.sqr()? + p.eps1;
        match &state.second {
            SecondMoment::Factored { row, col } => {
                let dims = state.var.dims();
                let (rows, cols) = (dims[dims.len() - 2], dims[dims.len() - 1]);
                let matrices = n / (rows * cols);
                let (mut row_means, mut col_means) = (Vec::new(), Vec::new());
                for matrix in 0..matrices {
                    let mut col_sum: Option<Tensor> = None;
                    for range in matrix_slices(matrix, rows, cols) {
                        let sq = squared(&range)?.reshape((range.len() / cols, cols))?;
                        row_means.push(sq.mean(D::Minus1)?);
                        let sum = sq.sum(D::Minus2)?;
                        col_sum = Some(match col_sum {
                            None => sum,
                            Some(before) => (before + sum)?,
                        });
                    }
                    if let Some(sum) = col_sum {
                        col_means.push((sum / rows as f64)?);
                    }
                }
                let row_means = Tensor::cat(&row_means, 0)?.reshape(row.shape())?;
                let col_means = Tensor::stack(&col_means, 0)?.reshape(col.shape())?;
                let next_row = ((row.as_tensor().detach() * beta2t)? + (row_means * (1.0 - beta2t))?)?;
                let next_col = ((col.as_tensor().detach() * beta2t)? + (col_means * (1.0 - beta2t))?)?;
                let row_factor = next_row.broadcast_div(&next_row.mean_keepdim(D::Minus1)?)?.sqrt()?.recip()?;
                let (row_factor, col_factor) =
                    (row_factor.flatten_all()?, next_col.sqrt()?.recip()?.reshape((matrices, cols))?);
                let update_of = |matrix: usize, range: &Range<usize>| -> Result<Tensor> {
                    let count = range.len() / cols;
                    let r = row_factor.narrow(0, range.start / cols, count)?.unsqueeze(1)?;
                    let c = col_factor.narrow(0, matrix, 1)?;
                    (r.broadcast_mul(&c)? * f32_part(&grad, range)?.reshape((count, cols))?)?.flatten_all()
                };
                let each = || (0..matrices).flat_map(|m| matrix_slices(m, rows, cols).map(move |range| (m, range)));
                let mut sum_of_squares = 0f64;
                for (matrix, range) in each() {
                    sum_of_squares += sum_sq(&update_of(matrix, &range)?)?;
                }
                let clip = ((sum_of_squares / n as f64).sqrt() / p.clip_threshold).max(1.0);
                for (matrix, range) in each() {
                    self.apply(state, &range, (update_of(matrix, &range)? * (lr / clip))?, lr, write)?;
                }
                if write {
                    row.set(&next_row)?;
                    col.set(&next_col)?;
                }
            }
            SecondMoment::Full(v) => {
                let next_v_of =
                    |range: &Range<usize>| (part(v, range)? * beta2t)? + (squared(range)? * (1.0 - beta2t))?;
                let mut sum_of_squares = 0f64;
                for range in super::slices(n, 1) {
                    let update = (next_v_of(&range)?.sqrt()?.recip()? * f32_part(&grad, &range)?)?;
                    sum_of_squares += sum_sq(&update)?;
                }
                let clip = ((sum_of_squares / n as f64).sqrt() / p.clip_threshold).max(1.0);
                for range in super::slices(n, 1) {
                    let next_v = next_v_of(&range)?;
                    let update = (next_v.sqrt()?.recip()? * f32_part(&grad, &range)?)?;
                    if write {
                        write_part(v, &range, &next_v)?;
                    }
                    drop(next_v);
                    self.apply(state, &range, (update * (lr / clip))?, lr, write)?;
                }
            }
        }
        Ok(())
    }

    /// A slice's scaled update applied: through the first moment where there
    /// is one, then to the weights (decayed first).
    fn apply(&self, state: &State, range: &Range<usize>, mut update: Tensor, lr: f64, write: bool) -> Result<()> {
        let p = &self.params;
        if let (Some(m), Some(beta1)) = (&state.first, p.beta1) {
            let next_m = ((part(m, range)? * beta1)? + (update * (1.0 - beta1))?)?;
            if write {
                write_part(m, range, &next_m)?;
            }
            update = next_m;
        }
        let theta = f32_part(&state.var, range)?;
        let decayed = if p.weight_decay != 0.0 { (theta * (1.0 - p.weight_decay * lr))? } else { theta };
        let next_theta = (decayed - update)?.to_dtype(state.var.dtype())?;
        if write {
            write_part(&state.var, range, &next_theta)?;
        }
        Ok(())
    }
}

/// `range` of `tensor`'s elements in f32.
fn f32_part(tensor: &Tensor, range: &Range<usize>) -> Result<Tensor> {
    part(tensor, range)?.to_dtype(DType::F32)
}

/// The sum of `x`'s squares.
fn sum_sq(x: &Tensor) -> Result<f64> {
    Ok(f64::from(x.sqr()?.sum_all()?.to_dtype(DType::F32)?.to_scalar::<f32>()?))
}

/// The slices of whole rows of the `matrix`-th `rows × cols` matrix of a
/// variable (its last two dimensions), as ranges of the variable's elements.
fn matrix_slices(matrix: usize, rows: usize, cols: usize) -> impl Iterator<Item = Range<usize>> {
    let base = matrix * rows * cols;
    super::slices(rows * cols, cols).map(move |range| base + range.start..base + range.end)
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

    fn states(&self) -> &States<State> {
        &self.states
    }

    fn states_mut(&mut self) -> &mut States<State> {
        &mut self.states
    }

    fn update(&self, state: &State, grad: &Tensor, step: u64, write: bool) -> Result<()> {
        self.update_sliced(state, grad, step, write)
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
