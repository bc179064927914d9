//! AdamW with its state in the open, and a dry-run step for probing: the
//! optimizer [`ModelProbe::optimizer`](crate::ModelProbe::optimizer)`::<AdamW>` measures.
//! State: two moments in the variables' dtype, 8 bytes per parameter in f32.

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};
use candle_nn::{Optimizer, ParamsAdamW};

use super::{DryStep, States, VariableState, part, write_part};
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

/// AdamW with `candle_nn::AdamW` 0.11's numbers (the same elementwise
/// operations, bit-identical results) and a bounded step: each variable is
/// updated a slice of 2^20 elements at a time, written in place
/// (`Tensor::slice_set`), so the step's temporaries stay about 20 MiB in f32
/// whatever the largest variable, where candle-nn's make several copies of
/// it (56 bytes a parameter: 1.5 GB for a 28M-parameter embedding). Two
/// additions the probe needs: the moments are readable, and
/// [`dry_step`](AdamW::dry_step) runs the whole update, allocating every
/// temporary the real step allocates, without writing anything.
///
/// That is how the reference workloads probe with the optimizer step measured and
/// still change nothing: no snapshot of weights and moments (which would cost 3×
/// the parameter bytes during probing and inflate every measured peak), no
/// throwaway optimizer (2× the parameter bytes of extra moments, and the weights
/// would still move). A slice written in place allocates nothing, so skipping
/// the write changes no allocation. Train with this type where the probe
/// measured it ([`ModelProbe::optimizer`](crate::ModelProbe::optimizer)).
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

    fn states(&self) -> &States<AdamWState> {
        &self.states
    }

    fn states_mut(&mut self) -> &mut States<AdamWState> {
        &mut self.states
    }

    fn update(&self, state: &AdamWState, grad: &Tensor, step: u64, write: bool) -> Result<()> {
        let AdamWState { var, first_moment, second_moment } = state;
        let grad = super::whole_gradient(grad)?;
        for range in super::slices(var.elem_count(), 1) {
            let [theta, m, v] = [var.as_tensor(), first_moment, second_moment].map(|t| part(t, &range));
            // a master's gradient comes in its variable's dtype (MixedPrecision)
            let g = part(&grad, &range)?.to_dtype(var.dtype())?;
            let (next_m, next_v, next_theta) = self.next(&theta?, &m?, &v?, &g, step as usize)?;
            if write {
                write_part(first_moment, &range, &next_m)?;
                write_part(second_moment, &range, &next_v)?;
                write_part(var, &range, &next_theta)?;
            }
        }
        Ok(())
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
    /// The next first and second moments and weights of one slice: candle-nn's
    /// operations in candle-nn's order, so the result is bit-identical.
    fn next(
        &self,
        theta: &Tensor,
        m: &Tensor,
        v: &Tensor,
        g: &Tensor,
        step_t: usize,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let ParamsAdamW { lr, beta1, beta2, eps, weight_decay } = self.params;
        let scale_m = 1f64 / (1f64 - beta1.powi(step_t as i32));
        let scale_v = 1f64 / (1f64 - beta2.powi(step_t as i32));
        // each intermediate freed as soon as the next exists (a temporary
        // lives to the end of its statement; an operator on an owned tensor
        // frees it): the values are candle-nn's, the same elementwise operations
        let next_m = ((m * beta1)? + (g * (1.0 - beta1))?)?;
        let squared = g.sqr()?;
        let squared = (squared * (1.0 - beta2))?;
        let next_v = ((v * beta2)? + squared)?;
        let m_hat = (&next_m * scale_m)?;
        let v_hat = (&next_v * scale_v)?;
        let root = v_hat.sqrt()?;
        drop(v_hat);
        let adjusted_grad = (m_hat / (root + eps)?)?;
        let step = (adjusted_grad * lr)?;
        let next_theta = ((theta * (1f64 - lr * weight_decay))? - step)?;
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
