//! The gradients training keeps: the variables' own, nothing else.
//!
//! `loss.backward()` returns a `GradStore` with a gradient for every tensor on
//! the path from the variables to the loss, constants included (an additive
//! attention mask gets one the size of the attention scores). Accumulating
//! that store holds several times the gradient copy accumulation needs; this
//! keeps one gradient per variable.

use candle_core::backprop::GradStore;
use candle_core::{Result, Var};

/// The variables' gradients out of `grads`, detached; the rest is dropped
/// (freed) here.
///
/// Detached because candle leaves a variable's gradient with the graph of the
/// ops that computed it (`x.matmul(&w)` gives `w` the gradient `xᵀ·g`, which
/// holds `x`, an activation): an accumulator that kept it would keep that
/// micro-step's activations alive through the next one.
pub(crate) fn keep_variables(mut grads: GradStore, vars: &[Var]) -> GradStore {
    let mut kept = GradStore::default();
    for var in vars {
        if let Some(grad) = grads.remove(var.as_tensor()) {
            kept.insert(var.as_tensor(), grad.detach());
        }
    }
    kept
}

/// Gradients summed over the micro-steps of one optimizer step: one tensor per
/// variable, added to one variable at a time, so that accumulating holds one
/// gradient copy and, while adding, one variable's more.
#[derive(Default)]
pub(crate) struct Accumulator {
    sum: Option<GradStore>,
    /// An add failed part way: the sum is neither the old one nor the new.
    broken: bool,
}

impl Accumulator {
    /// Adds the variables' gradients of `grads` (the rest is dropped first).
    /// A failure part way leaves the accumulator unusable: [`take`](Self::take)
    /// then fails rather than hand over a partial sum.
    pub(crate) fn add(&mut self, grads: GradStore, vars: &[Var]) -> Result<()> {
        self.add_scaled(grads, vars, 1.0)
    }

    /// Adds the variables' gradients of `grads` multiplied by `scale` (each
    /// variable's scaled in turn: one more gradient of one variable at a time).
    pub(crate) fn add_scaled(&mut self, grads: GradStore, vars: &[Var], scale: f64) -> Result<()> {
        if self.broken {
            return Err(candle_core::Error::Msg("the gradient accumulator is incomplete".to_owned()));
        }
        let mut grads = keep_variables(grads, vars);
        if scale != 1.0 {
            for var in vars {
                if let Some(grad) = grads.remove(var.as_tensor()) {
                    grads.insert(var.as_tensor(), grad.affine(scale, 0.0)?);
                }
            }
        }
        let Some(sum) = &mut self.sum else {
            self.sum = Some(grads);
            return Ok(());
        };
        for var in vars {
            let Some(grad) = grads.remove(var.as_tensor()) else { continue };
            let next = match sum.get(var.as_tensor()) {
                Some(total) => match total + &grad {
                    Ok(next) => next,
                    Err(err) => {
                        self.broken = true;
                        return Err(err);
                    }
                },
                None => grad,
            };
            sum.insert(var.as_tensor(), next);
        }
        Ok(())
    }

    /// An accumulator as a micro-step after the first finds it: one
    /// gradient-sized tensor (zeros) per float variable. What the tuner's
    /// accumulating probe steps hold.
    pub(crate) fn holding_zeros(vars: &[Var]) -> Result<Accumulator> {
        let mut earlier = GradStore::default();
        for var in vars.iter().filter(|var| var.dtype().is_float()) {
            earlier.insert(var.as_tensor(), var.as_tensor().zeros_like()?);
        }
        let mut accumulator = Accumulator::default();
        accumulator.add(earlier, vars)?;
        Ok(accumulator)
    }

    /// Whether an add failed part way.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// The sum so far (empty before the first add).
    pub(crate) fn take(self) -> Result<GradStore> {
        if self.broken {
            return Err(candle_core::Error::Msg("the gradient accumulator is incomplete".to_owned()));
        }
        Ok(self.sum.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    #[test]
    fn keeps_one_gradient_per_variable_and_sums_them() {
        let device = Device::Cpu;
        let w = Var::from_tensor(&Tensor::new(&[1f32, 2., 3.], &device).unwrap()).unwrap();
        let mask = Tensor::new(&[0f32, 0., 0.], &device).unwrap();
        let x = Tensor::new(&[1f32, 1., 1.], &device).unwrap();
        let loss = |scale: f64| ((w.as_tensor() + &mask).unwrap() * &x).unwrap().sum_all().unwrap() * scale;
        let vars = [w.clone()];
        let first = loss(1.0).unwrap().backward().unwrap();
        assert!(first.get(&mask).is_none() || first.get_ids().count() > 1);
        let mut acc = Accumulator::default();
        acc.add(first, &vars).unwrap();
        acc.add(loss(2.0).unwrap().backward().unwrap(), &vars).unwrap();
        let sum = acc.take().unwrap();
        assert_eq!(sum.get_ids().count(), 1, "only the variable's gradient is kept");
        assert_eq!(sum.get(w.as_tensor()).unwrap().to_vec1::<f32>().unwrap(), [3., 3., 3.]);
    }
}
