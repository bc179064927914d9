//! What a reference model needs before it runs a step, computed from its
//! configuration alone: so that a model too large for the budget is refused
//! before it allocates (an allocation that fails on the CPU aborts the process).

use autobatch::Bytes;
use autobatch::estimate::{OptimizerKind, Precision, StaticMemory};
use candle_core::DType;

use crate::Error;

/// The memory of a reference model known from its configuration: its fixed
/// tensors, and a lower bound on what one sample adds to a training step.
///
/// ```
/// use autobatch::estimate::{OptimizerKind, Precision};
/// use autobatch_models::reference::TransformerConfig;
///
/// let footprint = TransformerConfig::default().footprint()?;
/// // f32 weights, gradients and AdamW's two moments, beside the causal mask
/// assert_eq!(footprint.state.total(), 4 * 4 * footprint.state.parameters);
/// assert!(footprint.fixed_bytes > footprint.state.total());
/// assert!(footprint.check_within(256 << 20).is_ok());
/// // plain SGD keeps no moments: half the state
/// let sgd = footprint.trained_with(OptimizerKind::Sgd, Precision::Fp32)?;
/// assert_eq!(footprint.fixed_bytes - sgd.fixed_bytes, footprint.state.total() / 2);
/// let long = TransformerConfig { seq_len: 100_000, ..TransformerConfig::default() };
/// assert!(long.footprint()?.check_within(256 << 20).is_err()); // a 40 GB causal mask
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// The model and its size, as [`Model::describe`](super::Model::describe) says it.
    pub model: String,
    /// The training state of what trains: its weights, gradients and
    /// optimizer state (AdamW's two moments in the weights' dtype unless
    /// [`trained_with`](Self::trained_with) says otherwise), as the estimate
    /// counts it ([`StaticMemory`]). Part of `fixed_bytes`.
    pub state: StaticMemory,
    /// Bytes held whatever the batch: the state, a frozen base (LoRA's), the
    /// model's constant inputs (a causal mask, a teacher matrix) and what a
    /// step surely holds beside them.
    pub fixed_bytes: u64,
    /// Bytes one sample adds at least: its inputs and the activations the
    /// training step surely keeps (attention scores, logits). The real figure is
    /// larger; this one only decides when not even the smallest batch can fit.
    pub min_bytes_per_sample: u64,
}

impl Footprint {
    /// The same model trained with `optimizer` at `precision`: the state
    /// counted again, the rest of `fixed_bytes` as it is. What decides, before
    /// a probe allocates, for a model that does not train with AdamW in its
    /// weights' dtype (`Precision::Mixed` adds f32 masters and f32 moments to
    /// bf16 weights).
    ///
    /// # Errors
    ///
    /// The core's byte overflow where the state passes `u64`.
    pub fn trained_with(&self, optimizer: OptimizerKind, precision: Precision) -> Result<Footprint, Error> {
        let state = StaticMemory::new(self.state.parameters, precision, optimizer)?;
        // what is fixed beside the state (none, for a footprint made by hand with less than its state)
        let fixed_bytes = self
            .fixed_bytes
            .saturating_sub(self.state.total())
            .checked_add(state.total())
            .ok_or_else(|| Error::byte_overflow(format!("the fixed tensors of {}", self.model)))?;
        Ok(Footprint { state, fixed_bytes, ..self.clone() })
    }

    /// `fixed_bytes + min_bytes_per_sample`: what batch 1 needs at least.
    pub fn min_step_bytes(&self) -> u64 {
        self.fixed_bytes.saturating_add(self.min_bytes_per_sample)
    }

    /// [`autobatch::Error::ModelTooLarge`] when not even batch 1 can stay within
    /// `limit_bytes` (the ceiling × the capacity).
    pub fn check_within(&self, limit_bytes: u64) -> Result<(), Error> {
        self.check_batch_within(1, limit_bytes)
    }

    /// [`autobatch::Error::ModelTooLarge`] when a step at `batch` (the smallest batch the
    /// search will try) surely goes over `limit_bytes`: refused before the
    /// first step allocates what the machine may not have.
    pub fn check_batch_within(&self, batch: usize, limit_bytes: u64) -> Result<(), Error> {
        let samples = self.min_bytes_per_sample.checked_mul(batch as u64);
        if samples.and_then(|bytes| bytes.checked_add(self.fixed_bytes)).is_some_and(|total| total <= limit_bytes) {
            return Ok(());
        }
        let per_samples = match samples {
            Some(bytes) => format!("at least {}", Bytes(bytes)),
            None => "more than 16 EiB".to_owned(),
        };
        Err(autobatch::Error::ModelTooLarge {
            model: self.model.clone(),
            // a count, not a measurement: said as one, so that no budget is sized from it
            needs: format!(
                "{} of fixed tensors and {per_samples} for {batch} {} (counted from its configuration before any \
                 step: a lower bound, the step itself holds more)",
                Bytes(self.fixed_bytes),
                if batch == 1 { "sample" } else { "samples" }
            ),
            batch,
            limit_bytes: Some(limit_bytes),
        }
        .into())
    }
}

/// Byte arithmetic on model sizes that reports overflow as
/// [`autobatch::Error::ModelTooLarge`] instead of wrapping or panicking.
pub(crate) struct Sizes {
    pub(crate) model: String,
}

impl Sizes {
    fn too_large(&self) -> Error {
        autobatch::Error::ModelTooLarge {
            model: self.model.clone(),
            needs: "more than 2^64 bytes".to_owned(),
            batch: 1,
            limit_bytes: None,
        }
        .into()
    }

    /// The product of `factors`, checked.
    pub(crate) fn product(&self, factors: &[u64]) -> Result<u64, Error> {
        factors.iter().try_fold(1u64, |acc, &f| acc.checked_mul(f)).ok_or_else(|| self.too_large())
    }

    /// The sum of `terms`, checked.
    pub(crate) fn sum(&self, terms: &[u64]) -> Result<u64, Error> {
        terms.iter().try_fold(0u64, |acc, &t| acc.checked_add(t)).ok_or_else(|| self.too_large())
    }

    /// The footprint of `state` beside `other_fixed_bytes`, refused when this
    /// process could not even address it.
    pub(crate) fn footprint(
        self,
        state: StaticMemory,
        other_fixed_bytes: u64,
        min_bytes_per_sample: u64,
    ) -> Result<Footprint, Error> {
        let fixed_bytes = self.sum(&[state.total(), other_fixed_bytes])?;
        let footprint = Footprint { model: self.model, state, fixed_bytes, min_bytes_per_sample };
        if footprint.min_step_bytes() > isize::MAX as u64 {
            return Err(autobatch::Error::ModelTooLarge {
                needs: format!("at least {}", Bytes(footprint.min_step_bytes())),
                model: footprint.model,
                batch: 1,
                limit_bytes: None,
            }
            .into());
        }
        Ok(footprint)
    }
}

/// The state of `parameters` trained in `dtype` with AdamW, its moments in
/// that dtype (as the library's AdamW keeps them): what a model built here
/// holds before any step.
pub(crate) fn adamw_state(parameters: u64, dtype: DType) -> Result<StaticMemory, Error> {
    super::check_dtype(dtype)?;
    let precision = if dtype == DType::BF16 { Precision::Bf16 } else { Precision::Fp32 };
    Ok(StaticMemory::new(parameters, precision, OptimizerKind::AdamW)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Trained again, a footprint keeps what is fixed beside its state and
    /// counts the new state; one made by hand with less than its state gets
    /// the new state alone, and a state past `u64` is an error, never a panic.
    #[test]
    fn another_optimizer_replaces_the_state_alone() {
        let state = adamw_state(1000, DType::F32).unwrap();
        let footprint =
            Footprint { model: "m".into(), fixed_bytes: state.total() + 123, state, min_bytes_per_sample: 7 };
        let sgd = footprint.trained_with(OptimizerKind::Sgd, Precision::Fp32).unwrap();
        assert_eq!((sgd.fixed_bytes, sgd.min_bytes_per_sample), (8000 + 123, 7));
        let mixed = footprint.trained_with(OptimizerKind::AdamW, Precision::Mixed).unwrap();
        assert_eq!(mixed.fixed_bytes, 16_000 + 123);
        let by_hand = Footprint { fixed_bytes: 10, ..footprint.clone() };
        assert_eq!(by_hand.trained_with(OptimizerKind::Sgd, Precision::Fp32).unwrap().fixed_bytes, 8000);
        let sgd_state = StaticMemory::new(u64::MAX / 17, Precision::Fp32, OptimizerKind::Sgd).unwrap();
        let huge = Footprint { fixed_bytes: sgd_state.total() + u64::MAX / 4, state: sgd_state, ..footprint };
        assert!(huge.trained_with(OptimizerKind::AdamW, Precision::Fp32).is_err());
    }
}
