//! One model of a training run's memory: the state, the activations and
//! whatever else the device holds, and every change the advice can name
//! applied to it. The estimate's total and each piece of advice come from the
//! same [`TrainingSetup::total`], so an advised change, applied, gives the total the
//! advice printed, to the byte.

use serde::{Deserialize, Serialize};

use super::{Change, OptimizerKind, Precision, Recompute, Remedy, Sharding, StaticMemory, TransformerShape};
use crate::Error;

/// A training run's memory on one device, as far as the estimate models it.
///
/// It is also what a [`Workload`](crate::Workload) says of its model
/// ([`Workload::profile`](crate::Workload::profile)): built with
/// [`new`](TrainingSetup::new), [`largest_variable`](TrainingSetup::largest_variable) and, for
/// a transformer, [`transformer`](TrainingSetup::transformer), it lets the tuner
/// advise from a measurement when nothing fits.
///
/// A transformer's layer activations are held at the precision training
/// uses: 4 bytes per value in fp32, 2 in bf16 and mixed precision
/// (Korthikanti et al.'s formula counts 16 bits). Activation bytes given or
/// measured outside those layers stay as they are when the precision changes:
/// candle computes softmax and the loss in f32 whatever the weights' dtype, so
/// halving them would promise more than bf16 gives (on the reference
/// transformer bf16 kept 61% of fp32's step memory, not 50%).
///
/// ```
/// use autobatch::estimate::{Change, OptimizerKind, Precision, Recompute, TrainingSetup, TransformerShape};
///
/// // 7B parameters in fp32 with AdamW, 32 layers of a 4096-wide transformer at 2048 tokens, batch 4
/// let shape = TransformerShape { layers: 32, hidden: 4096, heads: 32, seq_len: 2048, batch: 4 };
/// let setup = TrainingSetup::new(7_000_000_000, Precision::Fp32, OptimizerKind::AdamW).transformer(shape, Recompute::None)?;
/// for remedy in setup.remedies(24_000_000_000)? {
///     // each piece of advice is the total of the setup with that change applied
///     let changed = setup.apply(&remedy.change)?.expect("advice applies");
///     assert_eq!(changed.total()?, remedy.total_bytes);
/// }
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainingSetup {
    /// Trainable parameters.
    pub parameters: u64,
    /// How weights, gradients and optimizer state are stored.
    pub precision: Precision,
    /// The optimizer.
    pub optimizer: OptimizerKind,
    /// How the state (and the activations, by tensor parallelism) is split.
    pub sharding: Sharding,
    /// Activation bytes on one device, at `precision`, outside the
    /// transformer layers the formula counts (all of them when the model is
    /// not a known transformer: logits, loss, a model of unknown shape).
    pub activation_bytes: u64,
    /// The transformer layers' activation bytes on one device, at `precision`
    /// (0 without a transformer): what checkpointing and shorter sequences
    /// scale by the formula's ratios.
    pub layer_bytes: u64,
    /// The transformer the layers are, when known: its sizes (the batch is
    /// the micro-batch the activations are of), which gradient checkpointing
    /// and shorter sequences change by Korthikanti et al.'s formula.
    pub transformer: Option<TransformerShape>,
    /// What the transformer's backward pass recomputes ([`Recompute::None`]
    /// without a transformer).
    pub recompute: Recompute,
    /// Bytes the device holds outside the model: runtime buffers, other
    /// processes. No change touches them.
    pub other_bytes: u64,
    /// A frozen base's bytes (LoRA's): weights without a gradient or
    /// optimizer state, in a dtype of their own. No change touches them.
    #[serde(default)]
    pub frozen_bytes: u64,
    /// Parameters of the largest variable: the optimizer's step holds its
    /// temporaries for one variable at a time
    /// ([`OptimizerKind::step_bytes_per_parameter`]). 0 when unknown: the
    /// step is then not counted, as the papers' model-state figures do not.
    pub largest_variable: u64,
}

/// Bytes per activation value at `precision`.
fn activation_width(precision: Precision) -> u64 {
    match precision {
        Precision::Fp32 => 4,
        Precision::Bf16 | Precision::Mixed => 2,
    }
}

/// `bytes × numerator / denominator`, exact in 128 bits, rounded down.
fn scale(bytes: u64, numerator: u64, denominator: u64, what: &str) -> Result<u64, Error> {
    if denominator == 0 {
        return Ok(0);
    }
    let scaled = u128::from(bytes) * u128::from(numerator) / u128::from(denominator);
    u64::try_from(scaled).map_err(|_| Error::byte_overflow(what.to_owned()))
}

impl TrainingSetup {
    /// `parameters` parameters at `precision` with `optimizer`, unsharded,
    /// with no activations counted yet.
    pub fn new(parameters: u64, precision: Precision, optimizer: OptimizerKind) -> TrainingSetup {
        TrainingSetup {
            parameters,
            precision,
            optimizer,
            sharding: Sharding::NONE,
            activation_bytes: 0,
            layer_bytes: 0,
            transformer: None,
            recompute: Recompute::None,
            other_bytes: 0,
            frozen_bytes: 0,
            largest_variable: 0,
        }
    }

    /// The state sharded as `sharding` says (tensor parallelism splits the
    /// activations of a transformer set after this too).
    pub fn sharded(mut self, sharding: Sharding) -> TrainingSetup {
        self.sharding = sharding;
        self
    }

    /// Activations of `bytes` (measured or given, at the setup's precision),
    /// of a model of unknown shape: no checkpointing or shorter-sequence advice.
    pub fn activations(mut self, bytes: u64) -> TrainingSetup {
        self.activation_bytes = bytes;
        self.layer_bytes = 0;
        self.transformer = None;
        self.recompute = Recompute::None;
        self
    }

    /// A transformer's activations by the formula (Korthikanti et al. 2022),
    /// at the setup's precision and tensor parallelism.
    pub fn transformer(mut self, shape: TransformerShape, recompute: Recompute) -> Result<TrainingSetup, Error> {
        self.layer_bytes = self.formula(shape, recompute)?;
        self.activation_bytes = 0;
        (self.transformer, self.recompute) = (Some(shape), recompute);
        Ok(self)
    }

    /// Measured activations of `bytes` of a transformer of `shape` (its batch
    /// the one measured): the layers' part is what the formula counts at the
    /// setup's precision (at most `bytes`), the rest (logits, loss, a
    /// framework's extra copies) is outside it. Checkpointing scales the
    /// layers' part only, a shorter sequence the layers' part by the formula
    /// and the rest in proportion: an under-estimate of the saving where the
    /// framework keeps more per layer than the formula.
    pub fn measured_transformer(
        mut self,
        bytes: u64,
        shape: TransformerShape,
        recompute: Recompute,
    ) -> Result<TrainingSetup, Error> {
        self.layer_bytes = self.formula(shape, recompute)?.min(bytes);
        self.activation_bytes = bytes - self.layer_bytes;
        (self.transformer, self.recompute) = (Some(shape), recompute);
        Ok(self)
    }

    /// The formula's activation bytes at the setup's precision and tensor parallelism.
    fn formula(&self, shape: TransformerShape, recompute: Recompute) -> Result<u64, Error> {
        let formula = shape.activation_bytes(self.sharding.tensor_parallel, recompute)?;
        scale(formula, activation_width(self.precision), 2, "activations")
    }

    /// Bytes held outside the model (they count in the total; no change moves them).
    pub fn other(mut self, bytes: u64) -> TrainingSetup {
        self.other_bytes = bytes;
        self
    }

    /// A frozen base of `bytes` beside the `parameters` that train (LoRA's
    /// adapters): counted in the total, untouched by every change.
    pub fn frozen(mut self, bytes: u64) -> TrainingSetup {
        self.frozen_bytes = bytes;
        self
    }

    /// All activation bytes on one device: the layers' and the rest.
    pub fn all_activation_bytes(&self) -> Result<u64, Error> {
        self.activation_bytes
            .checked_add(self.layer_bytes)
            .ok_or_else(|| Error::byte_overflow("activations".to_owned()))
    }

    /// The largest variable has `parameters` parameters: the optimizer step's
    /// temporaries count in the total.
    pub fn largest_variable(mut self, parameters: u64) -> TrainingSetup {
        self.largest_variable = parameters;
        self
    }

    /// What the optimizer's step holds above the state at its peak, on one
    /// device: its temporaries for the largest variable (split by tensor
    /// parallelism), or for one slice of it where the optimizer updates a
    /// slice at a time ([`OptimizerKind::slice_elements`]).
    pub fn step_bytes(&self) -> Result<u64, Error> {
        let overflow = || Error::byte_overflow("the optimizer step's temporaries".to_owned());
        if self.largest_variable == 0 {
            return Ok(0);
        }
        let largest = self.largest_variable.div_ceil(self.sharding.tensor_parallel);
        let at_once = self.optimizer.slice_elements().map_or(largest, |slice| slice.min(largest));
        let per_parameter = self.optimizer.step_bytes_per_parameter(self.precision);
        at_once.checked_mul(per_parameter).ok_or_else(overflow)
    }

    /// The training state one device holds.
    pub fn state(&self) -> Result<StaticMemory, Error> {
        self.sharding.check_splits(self.parameters)?;
        Ok(StaticMemory::new(self.parameters, self.precision, self.optimizer)?.per_device(&self.sharding))
    }

    /// State + activations + the optimizer step's temporaries + other bytes,
    /// on one device: the peak of a step that keeps the loss graph alive
    /// through the update (`backward_step`).
    pub fn total(&self) -> Result<u64, Error> {
        let overflow = || Error::byte_overflow(format!("the memory of training {} parameters", self.parameters));
        let total = self.state()?.total_with(self.all_activation_bytes()?)?;
        [self.step_bytes()?, self.other_bytes, self.frozen_bytes]
            .into_iter()
            .try_fold(total, u64::checked_add)
            .ok_or_else(overflow)
    }

    /// The setup with `change` applied, or `None` when it does not apply (it
    /// is so already, or the model has nothing it changes: checkpointing and
    /// shorter sequences need a transformer's shape).
    pub fn apply(&self, change: &Change) -> Result<Option<TrainingSetup>, Error> {
        let mut changed = self.clone();
        match *change {
            Change::Precision { to } => {
                if to == self.precision {
                    return Ok(None);
                }
                let (from, into) = (activation_width(self.precision), activation_width(to));
                changed.layer_bytes = scale(self.layer_bytes, into, from, "activations")?;
                changed.precision = to;
            }
            Change::Optimizer { to } => {
                if to == self.optimizer {
                    return Ok(None);
                }
                changed.optimizer = to;
            }
            Change::GradientCheckpointing => {
                let Some(shape) = self.transformer.filter(|_| self.recompute != Recompute::Full) else {
                    return Ok(None);
                };
                changed.layer_bytes = self.rescaled(shape, Recompute::Full)?;
                changed.recompute = Recompute::Full;
            }
            Change::SequenceLength { seq_len } => {
                let Some(now) = self.transformer.filter(|shape| seq_len > 0 && seq_len != shape.seq_len) else {
                    return Ok(None);
                };
                let shape = TransformerShape { seq_len, ..now };
                changed.layer_bytes = self.rescaled(shape, self.recompute)?;
                changed.activation_bytes = scale(self.activation_bytes, seq_len, now.seq_len, "activations")?;
                changed.transformer = Some(shape);
            }
            Change::Zero { stage, ranks } => {
                if ranks != self.sharding.data_parallel || stage <= self.sharding.zero_stage {
                    return Ok(None);
                }
                changed.sharding = Sharding::new(stage, ranks, self.sharding.tensor_parallel)?;
            }
            // a model's own: what N parameters are made of is not known here
            Change::Lora { .. } | Change::QuantizedBase => return Ok(None),
            Change::Both { ref first, ref second } => {
                let Some(once) = self.apply(first)? else { return Ok(None) };
                return once.apply(second);
            }
        }
        Ok(Some(changed))
    }

    /// The layers' activations scaled by the formula's ratio from the
    /// transformer as it is to `shape` with `recompute` (0 without a transformer).
    fn rescaled(&self, shape: TransformerShape, recompute: Recompute) -> Result<u64, Error> {
        let Some(now) = self.transformer else { return Ok(0) };
        let tensor_parallel = self.sharding.tensor_parallel;
        let from = now.activation_bytes(tensor_parallel, self.recompute)?;
        let to = shape.activation_bytes(tensor_parallel, recompute)?;
        scale(self.layer_bytes, to, from, "activations")
    }

    /// The changes the advice considers, each alone: the other precisions,
    /// this crate's lean optimizers, checkpointing and sequences half as long
    /// for a transformer, and the higher ZeRO stages with several ranks.
    pub fn changes(&self) -> Vec<Change> {
        let mut changes = Vec::new();
        if self.sharding.data_parallel > 1 {
            for stage in self.sharding.zero_stage + 1..=3 {
                changes.push(Change::Zero { stage, ranks: self.sharding.data_parallel });
            }
        }
        for to in [Precision::Bf16, Precision::Mixed] {
            changes.push(Change::Precision { to });
        }
        for to in [OptimizerKind::Adafactor, OptimizerKind::Adam8bit, OptimizerKind::Lion] {
            changes.push(Change::Optimizer { to });
        }
        changes.push(Change::GradientCheckpointing);
        if let Some(shape) = self.transformer.filter(|shape| shape.seq_len >= 2) {
            changes.push(Change::SequenceLength { seq_len: shape.seq_len / 2 });
        }
        changes
    }

    /// What would lower the total, each change alone, largest saving first:
    /// every change of [`changes`](Self::changes) that applies and saves
    /// something, with the total it leads to ([`total`](Self::total) of the
    /// changed setup) and whether that fits in `available_bytes`.
    pub fn remedies(&self, available_bytes: u64) -> Result<Vec<Remedy>, Error> {
        let now = self.total()?;
        let mut advice = Vec::new();
        for change in self.changes() {
            // a changed setup too large to count is one that does not help
            let Some(total) = self.apply(&change)?.and_then(|changed| changed.total().ok()) else { continue };
            // a change that saves under 1% of the total does not help anyone fit
            if total < now && (now - total).saturating_mul(100) >= now {
                advice.push(Remedy {
                    change,
                    saves_bytes: now - total,
                    total_bytes: total,
                    fits: total <= available_bytes,
                    measured: false,
                });
            }
        }
        advice.sort_by_key(|remedy| std::cmp::Reverse(remedy.saves_bytes));
        Ok(advice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BILLION: u64 = 1_000_000_000;

    fn seven_b() -> TrainingSetup {
        let shape = TransformerShape { layers: 32, hidden: 4096, heads: 32, seq_len: 2048, batch: 4 };
        TrainingSetup::new(7 * BILLION, Precision::Fp32, OptimizerKind::AdamW)
            .transformer(shape, Recompute::None)
            .unwrap()
    }

    #[test]
    fn activations_are_held_at_the_precision_training_uses() {
        let fp32 = seven_b();
        let shape = fp32.transformer.unwrap();
        let formula = shape.activation_bytes(1, Recompute::None).unwrap();
        assert_eq!(fp32.layer_bytes, 2 * formula);
        let bf16 = fp32.apply(&Change::Precision { to: Precision::Bf16 }).unwrap().unwrap();
        assert_eq!(bf16.layer_bytes, formula);
        let direct = TrainingSetup::new(7 * BILLION, Precision::Bf16, OptimizerKind::AdamW)
            .transformer(shape, Recompute::None)
            .unwrap();
        assert_eq!(bf16, direct);
    }

    #[test]
    fn every_change_applied_is_the_setup_built_with_it() {
        let fp32 = seven_b();
        let shape = fp32.transformer.unwrap();
        let build = |precision, optimizer, shape: TransformerShape, recompute| {
            TrainingSetup::new(7 * BILLION, precision, optimizer).transformer(shape, recompute).unwrap()
        };
        let cases = [
            (
                Change::Precision { to: Precision::Mixed },
                build(Precision::Mixed, OptimizerKind::AdamW, shape, Recompute::None),
            ),
            (
                Change::Optimizer { to: OptimizerKind::Lion },
                build(Precision::Fp32, OptimizerKind::Lion, shape, Recompute::None),
            ),
            (Change::GradientCheckpointing, build(Precision::Fp32, OptimizerKind::AdamW, shape, Recompute::Full)),
            (
                Change::SequenceLength { seq_len: 1024 },
                build(
                    Precision::Fp32,
                    OptimizerKind::AdamW,
                    TransformerShape { seq_len: 1024, ..shape },
                    Recompute::None,
                ),
            ),
        ];
        for (change, expected) in cases {
            let applied = fp32.apply(&change).unwrap().unwrap();
            assert_eq!(applied.total().unwrap(), expected.total().unwrap(), "{change}");
        }
        for remedy in fp32.remedies(24 * BILLION).unwrap() {
            assert_eq!(fp32.apply(&remedy.change).unwrap().unwrap().total().unwrap(), remedy.total_bytes);
        }
    }

    #[test]
    fn no_advice_for_what_is_so_already_or_does_not_apply() {
        let full = seven_b().apply(&Change::GradientCheckpointing).unwrap().unwrap();
        assert!(full.apply(&Change::GradientCheckpointing).unwrap().is_none());
        assert!(!full.remedies(0).unwrap().iter().any(|r| r.change == Change::GradientCheckpointing));
        let measured = TrainingSetup::new(BILLION, Precision::Fp32, OptimizerKind::AdamW).activations(4 * BILLION);
        let advice = measured.remedies(0).unwrap();
        assert!(
            advice.iter().all(|r| !matches!(r.change, Change::GradientCheckpointing | Change::SequenceLength { .. }))
        );
        assert!(advice.iter().all(|r| r.change != Change::Optimizer { to: OptimizerKind::AdamW }));
    }

    #[test]
    fn other_bytes_count_in_every_total() {
        let setup = TrainingSetup::new(BILLION, Precision::Fp32, OptimizerKind::AdamW)
            .activations(BILLION)
            .other(300)
            .frozen(200);
        assert_eq!(setup.total().unwrap(), 17 * BILLION + 500);
        let advice = setup.remedies(13 * BILLION).unwrap();
        let adafactor = advice.iter().find(|r| r.change == Change::Optimizer { to: OptimizerKind::Adafactor }).unwrap();
        assert_eq!(adafactor.total_bytes, 9 * BILLION + 500);
        assert!(adafactor.fits);
    }
}
