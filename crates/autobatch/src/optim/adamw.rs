//! AdamW with its state in the open, and a dry-run step for probing: the
//! optimizer [`ModelProbe::adamw`](crate::ModelProbe::adamw) measures.
//! State: two moments in the variables' dtype, 8 bytes per parameter in f32.

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};
use candle_nn::{Optimizer, ParamsAdamW};

use super::{DryStep, States, VariableState};
use crate::per_parameter::OptimizerKind;

/// One variable and its two moments.
#[derive(Debug)]
pub(crate) struct AdamWState {
    /// The parameter.
    var: Var,
    /// First moment (running mean of gradients).
    first_moment: Var,
    /// Second moment (running mean of squared gradients).
    second_moment: Var,
}

/// AdamW, computed exactly as `candle_nn::AdamW` 0.11 computes it (same tensor
/// operations in the same order, bit-identical results), with two additions the
/// probe needs: the moments are readable, and [`dry_step`](AdamW::dry_step) runs
/// the whole update, allocating every temporary the real step allocates, without
/// writing anything.
///
/// That is how the reference workloads probe with the optimizer step measured and
/// still change nothing: no snapshot of weights and moments (which would cost 3×
/// the parameter bytes during probing and inflate every measured peak), no
/// throwaway optimizer (2× the parameter bytes of extra moments, and the weights
/// would still move). `Var::set` copies into existing storage, so skipping it
/// changes no allocation.
#[derive(Debug)]
pub struct AdamW {
    states: States<AdamWState>,
    params: ParamsAdamW,
}

impl AdamW {
    /// Every float variable with its two moments, in the order given:
    /// `(variable, first moment, second moment)`, the running means of the
    /// gradients and of their squares. What a test reads to see that
    /// probing changed none of them.
    ///
    /// ```
    /// use autobatch::optim::AdamW;
    /// use candle_core::{Device, Tensor, Var};
    /// use candle_nn::{Optimizer, ParamsAdamW};
    ///
    /// let w = Var::from_tensor(&Tensor::new(&[1f32, -2.0], &Device::Cpu)?)?;
    /// let mut adamw = AdamW::new(vec![w.clone()], ParamsAdamW::default())?;
    /// adamw.backward_step(&w.as_tensor().sqr()?.sum_all()?)?;
    /// let (var, first, second) = adamw.moments().next().unwrap();
    /// assert_eq!(var.id(), w.id());
    /// // after one step m = (1 − β₁)·g and v = (1 − β₂)·g², with g = 2w
    /// let (m, v) = (first.to_vec1::<f32>()?, second.to_vec1::<f32>()?);
    /// assert!((m[0] - 0.2).abs() < 1e-6 && (m[1] + 0.4).abs() < 1e-6);
    /// assert!((v[0] - 0.004).abs() < 1e-8 && (v[1] - 0.016).abs() < 1e-8);
    /// # Ok::<(), candle_core::Error>(())
    /// ```
    pub fn moments(&self) -> impl ExactSizeIterator<Item = (&Var, &Var, &Var)> {
        self.states.each.iter().map(|state| (&state.var, &state.first_moment, &state.second_moment))
    }

    /// Optimizer steps taken.
    pub fn step_count(&self) -> usize {
        self.states.taken as usize
    }

    /// The hyper-parameters.
    pub fn params(&self) -> &ParamsAdamW {
        &self.params
    }

    /// Runs the update that [`step`](Optimizer::step) would run for step `step_t + 1`,
    /// one variable at a time, and drops the results: the memory of an optimizer
    /// step with no effect on any variable, moment or the step count.
    pub fn dry_step(&self, grads: &GradStore) -> Result<()> {
        DryStep::dry_step(self, grads)
    }
}

impl super::PerVariable for AdamW {
    type State = AdamWState;
    type Next = (Tensor, Tensor, Tensor);

    fn states(&self) -> &States<AdamWState> {
        &self.states
    }

    fn states_mut(&mut self) -> &mut States<AdamWState> {
        &mut self.states
    }

    fn next(&self, state: &AdamWState, grad: &Tensor, step: u64) -> Result<Self::Next> {
        self.update(state, grad, step as usize)
    }

    fn write(state: &AdamWState, (next_m, next_v, next_theta): Self::Next) -> Result<()> {
        state.first_moment.set(&next_m)?;
        state.second_moment.set(&next_v)?;
        state.var.set(&next_theta)
    }

    fn held_bytes(&self) -> u64 {
        let moments = |s: &AdamWState| super::var_bytes(&s.first_moment) + super::var_bytes(&s.second_moment);
        self.states.each.iter().map(moments).sum()
    }

    fn optimizer_kind(&self) -> OptimizerKind {
        OptimizerKind::AdamW
    }
}

impl VariableState for AdamWState {
    fn variable(&self) -> &Var {
        &self.var
    }
}

impl AdamW {
    fn update(&self, state: &AdamWState, g: &Tensor, step_t: usize) -> Result<(Tensor, Tensor, Tensor)> {
        let ParamsAdamW { lr, beta1, beta2, eps, weight_decay } = self.params;
        let scale_m = 1f64 / (1f64 - beta1.powi(step_t as i32));
        let scale_v = 1f64 / (1f64 - beta2.powi(step_t as i32));
        let next_m = ((state.first_moment.as_tensor() * beta1)? + (g * (1.0 - beta1))?)?;
        let next_v = ((state.second_moment.as_tensor() * beta2)? + (g.sqr()? * (1.0 - beta2))?)?;
        let m_hat = (&next_m * scale_m)?;
        let v_hat = (&next_v * scale_v)?;
        let next_theta = (state.var.as_tensor() * (1f64 - lr * weight_decay))?;
        let adjusted_grad = (m_hat / (v_hat.sqrt()? + eps)?)?;
        let next_theta = (next_theta - (adjusted_grad * lr)?)?;
        Ok((next_m, next_v, next_theta))
    }
}

impl Optimizer for AdamW {
    type Config = ParamsAdamW;

    fn new(vars: Vec<Var>, params: ParamsAdamW) -> Result<Self> {
        let states = States::new(vars, |var| {
            let first_moment = Var::zeros(var.shape(), var.dtype(), var.device())?;
            let second_moment = Var::zeros(var.shape(), var.dtype(), var.device())?;
            Ok(AdamWState { var, first_moment, second_moment })
        })?;
        Ok(AdamW { states, params })
    }

    shared_step_and_learning_rate!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn vars() -> Vec<Var> {
        let device = Device::Cpu;
        let a = Tensor::arange(0f32, 12., &device).unwrap().reshape((3, 4)).unwrap();
        let b = Tensor::new(&[0.5f32, -1.5, 2.0], &device).unwrap();
        vec![Var::from_tensor(&a).unwrap(), Var::from_tensor(&b).unwrap()]
    }

    fn loss(vars: &[Var]) -> Tensor {
        let x = Tensor::new(&[[1f32, -2., 3., 0.25]], &Device::Cpu).unwrap();
        let y = x.matmul(&vars[0].as_tensor().t().unwrap()).unwrap();
        (y.squeeze(0).unwrap() * vars[1].as_tensor()).unwrap().sqr().unwrap().sum_all().unwrap()
    }

    fn values(var: &Var) -> Vec<f32> {
        var.as_tensor().flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1().unwrap()
    }

    #[test]
    fn matches_candle_nn_adamw_bit_for_bit() {
        let params = ParamsAdamW { lr: 0.01, weight_decay: 0.1, ..Default::default() };
        let (ours_vars, theirs_vars) = (vars(), vars());
        let mut ours = AdamW::new(ours_vars.clone(), params.clone()).unwrap();
        let mut theirs = candle_nn::AdamW::new(theirs_vars.clone(), params).unwrap();
        for _ in 0..5 {
            ours.step(&loss(&ours_vars).backward().unwrap()).unwrap();
            theirs.step(&loss(&theirs_vars).backward().unwrap()).unwrap();
        }
        for (a, b) in ours_vars.iter().zip(&theirs_vars) {
            assert_eq!(values(a), values(b));
        }
        assert_eq!(ours.step_count(), 5);
    }

    #[test]
    fn dry_step_changes_nothing() {
        let vars = vars();
        let mut optimizer = AdamW::new(vars.clone(), ParamsAdamW::default()).unwrap();
        optimizer.step(&loss(&vars).backward().unwrap()).unwrap();
        let before: Vec<_> = optimizer.moments().flat_map(|(v, m, s)| [values(v), values(m), values(s)]).collect();
        optimizer.dry_step(&loss(&vars).backward().unwrap()).unwrap();
        let after: Vec<_> = optimizer.moments().flat_map(|(v, m, s)| [values(v), values(m), values(s)]).collect();
        assert_eq!(before, after);
        assert_eq!(optimizer.step_count(), 1);
    }
}
