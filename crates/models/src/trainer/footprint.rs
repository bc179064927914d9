//! What a reference model needs before it runs a step, computed from its
//! configuration alone: so that a model too large for the budget is refused
//! before it allocates (an allocation that fails on the CPU aborts the process).

use crate::Error;
use autobatch::Bytes;

/// The memory of a reference model known from its configuration: its fixed
/// tensors, and a lower bound on what one sample adds to a training step.
///
/// ```
/// use autobatch_models::reference::TransformerConfig;
///
/// let footprint = TransformerConfig::default().footprint()?;
/// assert!(footprint.fixed_bytes > 4 * 4 * footprint.parameters);
/// assert!(footprint.check_within(256 << 20).is_ok());
/// let long = TransformerConfig { seq_len: 100_000, ..TransformerConfig::default() };
/// assert!(long.footprint()?.check_within(256 << 20).is_err()); // a 40 GB causal mask
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// The model and its size, as [`Model::describe`](super::Model::describe) says it.
    pub model: String,
    /// Trainable parameters.
    pub parameters: u64,
    /// Bytes held whatever the batch: weights, gradients and both AdamW moments
    /// (4 copies of the parameters), and the model's constant inputs (a causal
    /// mask, a teacher matrix).
    pub fixed_bytes: u64,
    /// Bytes one sample adds at least: its inputs and the activations the
    /// training step surely keeps (attention scores, logits). The real figure is
    /// larger; this one only decides when not even the smallest batch can fit.
    pub min_bytes_per_sample: u64,
}

impl Footprint {
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

    /// The footprint, refused when this process could not even address it.
    pub(crate) fn footprint(
        self,
        parameters: u64,
        fixed_bytes: u64,
        min_bytes_per_sample: u64,
    ) -> Result<Footprint, Error> {
        let footprint = Footprint { model: self.model, parameters, fixed_bytes, min_bytes_per_sample };
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
