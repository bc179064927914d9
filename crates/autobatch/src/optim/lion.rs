//! Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"):
//! one moment and a sign update. State: 4 bytes per parameter in f32.

use candle_core::{Result, Tensor, Var};
use candle_nn::Optimizer;

use super::{States, part, write_part};
use crate::per_parameter::OptimizerKind;

/// Lion's hyper-parameters. The defaults are the paper's: β₁ 0.9, β₂ 0.99,
/// and a learning rate 3–10× below AdamW's (1e-4 here).
#[derive(Clone, Debug, PartialEq)]
pub struct ParamsLion {
    /// Learning rate.
    pub lr: f64,
    /// Interpolation between the moment and the gradient for the update.
    pub beta1: f64,
    /// Decay of the moment.
    pub beta2: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
}

impl Default for ParamsLion {
    fn default() -> Self {
        ParamsLion { lr: 1e-4, beta1: 0.9, beta2: 0.99, weight_decay: 0.0 }
    }
}

/// Lion: `c = β₁·m + (1−β₁)·g; θ ← θ − lr·(sign(c) + λ·θ); m ← β₂·m + (1−β₂)·g`.
///
/// ```
/// use autobatch::optim::{DryStep, Lion, ParamsLion};
/// use candle_core::{Device, Tensor, Var};
/// use candle_nn::Optimizer;
///
/// let w = Var::from_tensor(&Tensor::new(&[1f32, -2.0], &Device::Cpu)?)?;
/// let mut lion = Lion::new(vec![w.clone()], ParamsLion { lr: 0.1, ..Default::default() })?;
/// assert_eq!(lion.state_bytes(), 8);
/// lion.backward_step(&w.as_tensor().sqr()?.sum_all()?)?;
/// assert_eq!(w.as_tensor().to_vec1::<f32>()?, [0.9, -1.9]); // a step of exactly lr
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Debug)]
pub struct Lion {
    states: States<(Var, Var)>,
    params: ParamsLion,
}

impl Lion {
    /// The hyper-parameters.
    pub fn params(&self) -> &ParamsLion {
        &self.params
    }

    /// The next weights and moment of `var` (moment `m`) for gradient `g`.
    /// Every input is detached, so no op records a graph, and each
    /// intermediate is replaced as soon as the next exists (`x = x.op()?`
    /// frees the old `x`): the step's temporaries stay at a few copies of the
    /// variable, for real and dry steps alike.
    /// The next weights and moment of one slice.
    fn next(&self, theta: Tensor, m: Tensor, g: Tensor) -> Result<(Tensor, Tensor)> {
        let ParamsLion { lr, beta1, beta2, weight_decay } = self.params;
        let mut next_m = m.affine(beta2, 0.0)?;
        next_m = (next_m + g.affine(1.0 - beta2, 0.0)?)?;
        let mut c = m.affine(beta1, 0.0)?;
        drop(m);
        c = (c + g.affine(1.0 - beta1, 0.0)?)?;
        drop(g);
        c = c.sign()?;
        c = c.affine(lr, 0.0)?;
        let mut next_theta = theta.affine(1.0 - lr * weight_decay, 0.0)?;
        drop(theta);
        next_theta = (next_theta - c)?;
        Ok((next_theta, next_m))
    }
}

impl Optimizer for Lion {
    type Config = ParamsLion;

    fn new(vars: Vec<Var>, params: ParamsLion) -> Result<Self> {
        let states = States::new(vars, |var| {
            let m = Var::zeros(var.shape(), var.dtype(), var.device())?;
            Ok((var, m))
        })?;
        Ok(Lion { states, params })
    }

    shared_step_and_learning_rate!();
}

impl super::PerVariable for Lion {
    /// A variable and its moment.
    type State = (Var, Var);

    fn states(&self) -> &States<(Var, Var)> {
        &self.states
    }

    fn states_mut(&mut self) -> &mut States<(Var, Var)> {
        &mut self.states
    }

    /// Lion's update does not depend on the step.
    fn update(&self, (var, m): &(Var, Var), grad: &Tensor, _step: u64, write: bool) -> Result<()> {
        let grad = super::whole_gradient(grad)?;
        for range in super::slices(var.elem_count(), 1) {
            // a master's gradient comes in its variable's dtype (MixedPrecision)
            let g = part(&grad, &range)?.to_dtype(var.dtype())?;
            let (next_theta, next_m) = self.next(part(var, &range)?, part(m, &range)?, g)?;
            if write {
                write_part(m, &range, &next_m)?;
                write_part(var, &range, &next_theta)?;
            }
        }
        Ok(())
    }

    fn held_bytes(&self) -> u64 {
        self.states.each.iter().map(|(_, m)| super::var_bytes(m)).sum()
    }

    fn optimizer_kind(&self) -> OptimizerKind {
        OptimizerKind::Lion
    }
}
