//! Mixed-precision training (Micikevicius et al. 2018, "Mixed Precision
//! Training"): the model's variables in bf16 (weights, activations and
//! gradients at 2 bytes), an f32 master copy of every weight that the optimizer
//! updates, with its state in f32, and the update cast back to bf16. Per
//! parameter with Adam: 2 (bf16 weights) + 2 (bf16 gradients) + 4 (master) + 8
//! (moments) = 16 bytes, the ZeRO paper's 2 + 2 + 12. bf16 has f32's exponent
//! range, so no loss scaling is needed (fp16 would need it).

use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Var};
use candle_nn::Optimizer;

use super::DryStep;
use crate::per_parameter::OptimizerKind;

/// An optimizer `O` run on f32 master copies of low-precision variables.
///
/// ```
/// use autobatch::optim::{AdamW, DryStep, MixedPrecision};
/// use candle_core::{DType, Device, Var};
/// use candle_nn::{Optimizer, ParamsAdamW};
///
/// let w = Var::ones((256, 256), DType::BF16, &Device::Cpu)?;
/// let mut mixed = MixedPrecision::<AdamW>::new(vec![w.clone()], ParamsAdamW::default())?;
/// // 4 bytes of master weight and 8 of AdamW moments per parameter, in f32
/// assert_eq!(mixed.state_bytes(), 12 * 256 * 256);
/// mixed.backward_step(&w.as_tensor().to_dtype(DType::F32)?.sqr()?.sum_all()?)?;
/// assert_eq!(w.dtype(), DType::BF16);
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Debug)]
pub struct MixedPrecision<O> {
    /// (model variable, its f32 master copy); f32 variables are their own master.
    pairs: Vec<(Var, Var)>,
    optimizer: O,
}

impl<O: Optimizer> MixedPrecision<O> {
    /// The wrapped optimizer (over the master copies).
    pub fn inner(&self) -> &O {
        &self.optimizer
    }

    /// The f32 master copies: the `Var`s the optimizer steps.
    pub fn masters(&self) -> Vec<Var> {
        self.pairs.iter().map(|(_, master)| master.clone()).collect()
    }

    /// The model's gradients as the masters' (the same tensors, not copies:
    /// each optimizer here casts a slice at a time to its variable's dtype).
    fn master_grads(&self, grads: &GradStore) -> GradStore {
        let mut master_grads = GradStore::default();
        for (var, master) in &self.pairs {
            if let Some(grad) = grads.get(var.as_tensor()) {
                master_grads.insert(master.as_tensor(), grad.clone());
            }
        }
        master_grads
    }

    /// Each master rounded to its variable's dtype a slice at a time, written
    /// into the variable (`write`) or dropped.
    fn round_back(&self, write: bool) -> Result<()> {
        for (var, master) in &self.pairs {
            if var.dtype() == DType::F32 {
                continue;
            }
            for range in super::slices(var.elem_count(), 1) {
                let rounded = super::part(master, &range)?.to_dtype(var.dtype())?;
                if write {
                    super::write_part(var, &range, &rounded)?;
                }
            }
        }
        Ok(())
    }
}

/// Over this crate's optimizers ([`DryStep`]s), which take a master's
/// gradient in its variable's dtype and cast it a slice at a time: no f32 copy
/// of the gradients is made (a candle-nn optimizer would need one).
impl<O: Optimizer + DryStep> Optimizer for MixedPrecision<O> {
    type Config = O::Config;

    fn new(vars: Vec<Var>, config: O::Config) -> Result<Self> {
        let pairs = vars
            .into_iter()
            .filter(|var| var.dtype().is_float())
            .map(|var| {
                let master = if var.dtype() == DType::F32 {
                    var.clone()
                } else {
                    Var::from_tensor(&var.as_tensor().to_dtype(DType::F32)?)?
                };
                Ok((var, master))
            })
            .collect::<Result<Vec<_>>>()?;
        let optimizer = O::new(pairs.iter().map(|(_, master)| master.clone()).collect(), config)?;
        Ok(MixedPrecision { pairs, optimizer })
    }

    /// Steps the masters with the model's gradients (cast to f32), then
    /// writes each master back into its variable, rounded to the variable's dtype.
    fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.optimizer.step(&self.master_grads(grads))?;
        self.round_back(true)
    }

    fn learning_rate(&self) -> f64 {
        self.optimizer.learning_rate()
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.optimizer.set_learning_rate(lr)
    }
}

impl<O: Optimizer + DryStep> DryStep for MixedPrecision<O> {
    fn dry_step(&self, grads: &GradStore) -> Result<()> {
        self.optimizer.dry_step(&self.master_grads(grads))?;
        self.round_back(false)
    }

    fn state_bytes(&self) -> u64 {
        let masters: u64 = self
            .pairs
            .iter()
            .filter(|(var, _)| var.dtype() != DType::F32)
            .map(|(_, master)| super::var_bytes(master))
            .sum();
        masters + self.optimizer.state_bytes()
    }

    fn kind(&self) -> Option<OptimizerKind> {
        self.optimizer.kind()
    }

    fn master_weights(&self) -> bool {
        true
    }
}
