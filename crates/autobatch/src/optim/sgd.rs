//! Plain SGD, `θ ← θ − lr·g`, with candle-nn's `SGD` numbers and a bounded
//! step. State: none.

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};
use candle_nn::Optimizer;

use super::{States, part, write_part};
use crate::per_parameter::OptimizerKind;

/// Plain SGD with `candle_nn::SGD`'s numbers (the same two operations,
/// bit-identical results; its config is the learning rate, as candle-nn's)
/// and a bounded step: each variable is updated a slice of 2^20 elements at
/// a time, written in place, where candle-nn's makes two whole copies of
/// every variable (`lr·g`, then `θ − lr·g`) before it sets it: 226 MB for a
/// 28M-parameter f32 embedding, 8 MiB here.
///
/// ```
/// use autobatch::optim::{DryStep, Sgd};
/// use candle_core::{Device, Tensor, Var};
/// use candle_nn::Optimizer;
///
/// let w = Var::from_tensor(&Tensor::new(&[1f32, -2.0], &Device::Cpu)?)?;
/// let mut sgd = Sgd::new(vec![w.clone()], 0.25)?;
/// assert_eq!(sgd.state_bytes(), 0);
/// sgd.backward_step(&w.as_tensor().sqr()?.sum_all()?)?;
/// assert_eq!(w.as_tensor().to_vec1::<f32>()?, [0.5, -1.0]); // θ − 0.25·2θ
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Debug)]
pub struct Sgd {
    states: States<Var>,
    lr: f64,
}

impl Sgd {
    /// Over `vars`' float variables, with learning rate `lr`: what
    /// [`Optimizer::new`] builds, without a `Result` (there is no state to allocate).
    pub(crate) fn over(vars: Vec<Var>, lr: f64) -> Sgd {
        let each = vars.into_iter().filter(|var| var.dtype().is_float()).collect();
        Sgd { states: States { each, taken: 0 }, lr }
    }
}

impl Optimizer for Sgd {
    type Config = f64;

    fn new(vars: Vec<Var>, lr: f64) -> Result<Self> {
        Ok(Sgd::over(vars, lr))
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        super::step(self, grads)
    }

    fn learning_rate(&self) -> f64 {
        self.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.lr = lr;
    }
}

impl super::VariableState for Var {
    fn variable(&self) -> &Var {
        self
    }
}

impl super::PerVariable for Sgd {
    /// The variable alone.
    type State = Var;

    fn states(&self) -> &States<Var> {
        &self.states
    }

    fn states_mut(&mut self) -> &mut States<Var> {
        &mut self.states
    }

    fn update(&self, var: &Var, grad: &Tensor, _step: u64, write: bool) -> Result<()> {
        let grad = super::whole_gradient(grad)?;
        for range in super::slices(var.elem_count(), 1) {
            // a master's gradient comes in its variable's dtype (MixedPrecision)
            let g = part(&grad, &range)?.to_dtype(var.dtype())?;
            // candle-nn's `var.sub(&(grad * lr))`, a slice of it
            let scaled = g.affine(self.lr, 0.0)?;
            drop(g);
            let next = part(var, &range)?.sub(&scaled)?;
            drop(scaled);
            if write {
                write_part(var, &range, &next)?;
            }
        }
        Ok(())
    }

    fn held_bytes(&self) -> u64 {
        0
    }

    fn optimizer_kind(&self) -> OptimizerKind {
        OptimizerKind::Sgd
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::DryStep;
    use candle_core::{DType, Device};

    /// A dry step changes nothing; a real one steps the float variables
    /// alone (candle-nn's equality, over shapes and rates:
    /// tests/suite/optim_slices.rs).
    #[test]
    fn a_dry_step_changes_nothing_and_integers_are_not_stepped() {
        let w = Var::from_tensor(&Tensor::new(&[1f32, -2.0, 3.0], &Device::Cpu).unwrap()).unwrap();
        let int = Var::zeros(3, DType::U32, &Device::Cpu).unwrap();
        let mut sgd = Sgd::new(vec![w.clone(), int], 0.5).unwrap();
        assert_eq!(sgd.states.each.len(), 1, "an integer variable is not stepped");
        let grads = w.as_tensor().sum_all().unwrap().backward().unwrap();
        sgd.dry_step(&grads).unwrap();
        assert_eq!(w.as_tensor().to_vec1::<f32>().unwrap(), [1.0, -2.0, 3.0]);
        sgd.step(&grads).unwrap();
        assert_eq!(w.as_tensor().to_vec1::<f32>().unwrap(), [0.5, -2.5, 2.5]);
    }
}
