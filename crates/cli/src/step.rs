//! `estimate --config`: the whole training step of a config's model on
//! candle, counted (`Config::bytes_per_sample`: the activations of the lean
//! or the eager step, the head's logits and the loss included), and the
//! question people ask answered: the largest batch on the device under the
//! ceiling, with the accumulation for a target effective batch.

use autobatch::estimate::{Change, Precision, Remedy, TrainingSetup};
use autobatch::{Accumulation, Ceiling};
use autobatch_models::{Attention, Config, Family, Loss, Training};
use candle_core::DType;

use autobatch::estimate::Recompute;

use crate::args::EstimateArgs;
use crate::failure::{Failure, Flags};
use crate::values::Count;

/// The step a config's model trains with, as the flags describe it.
pub struct Step {
    pub config: Config,
    pub training: Training,
    /// Bytes one sample adds.
    pub bytes_per_sample: u64,
    /// The batch the totals are of (`--batch`, else 1).
    pub batch: usize,
}

/// What fits on the device: the largest batch under the ceiling, and the
/// split of a target effective batch.
pub struct Fit {
    pub ceiling: Ceiling,
    /// What the step holds whatever the batch: the state, the optimizer's
    /// step, the chunked loss's one chunk.
    pub fixed_bytes: u64,
    pub limit_bytes: u64,
    /// The largest batch whose total stays under the limit; 0 when none.
    pub largest_batch: u64,
    pub split: Option<Accumulation>,
}

impl Step {
    /// The step of `config` with `lora` (its training, when LoRA) and the
    /// estimate's flags: the sequence length, the dtype, the attention and
    /// loss, checkpointing (`--recompute full`).
    pub fn new(args: &EstimateArgs, config: &Config, lora: Option<Training>) -> Result<Step, Failure> {
        let seq_len = args.activations.seq_len.map_or_else(|| config.max_positions.min(512), Count::get);
        let mut training = match lora {
            Some(training) => training,
            None => {
                let mut training = Training::new(seq_len);
                training.dtype = match (args.state.mixed_precision, args.state.dtype) {
                    (true, _) => Some(DType::BF16),
                    (false, dtype) => dtype.map(crate::model::dtype_of),
                };
                training
            }
        };
        training.attention = args.step.attention;
        training.loss = args.step.loss;
        training.ops = args.step.ops;
        training.checkpointing = match args.activations.recompute {
            Recompute::None => false,
            Recompute::Full if config.family == Family::Bert => {
                return Err(Failure::usage("--recompute full checkpoints a decoder's layers, not BERT's"));
            }
            Recompute::Full => true,
            Recompute::Selective => {
                return Err(Failure::usage(
                    "--recompute selective is the formula's (Korthikanti et al.); a config's model on candle \
                     recomputes whole layers: --recompute full",
                ));
            }
        };
        let bytes_per_sample =
            config.bytes_per_sample(&training).map_err(|err| Failure::in_flags(err, &Flags::ESTIMATE))?;
        Ok(Step {
            config: config.clone(),
            training,
            bytes_per_sample,
            batch: args.activations.batch.map_or(1, Count::get),
        })
    }

    /// The activations at the batch the totals are of.
    pub fn activation_bytes(&self) -> Result<u64, Failure> {
        self.bytes_per_sample
            .checked_mul(self.batch as u64)
            .ok_or_else(|| Failure::usage(format!("--batch {}: the activations pass 64 bits", self.batch)))
    }

    /// The largest batch whose total (`fixed`: the state, the optimizer's
    /// step and the loss's chunk; plus the activations) stays under
    /// `ceiling × capacity`, and the
    /// split of `target` over `ranks` from it.
    pub fn fit(
        &self,
        fixed: u64,
        capacity: u64,
        ceiling: Ceiling,
        target: Option<usize>,
        ranks: usize,
    ) -> Result<Fit, Failure> {
        let limit_bytes = ceiling.limit_bytes(capacity);
        let largest_batch = limit_bytes.saturating_sub(fixed) / self.bytes_per_sample.max(1);
        let split = match (target, usize::try_from(largest_batch).ok().filter(|&b| b > 0)) {
            (Some(target), Some(largest)) => Some(Accumulation::plan(target, ranks, largest).map_err(|err| {
                Failure::in_flags(err, &Flags { largest: "the largest batch that fits", ..Flags::ESTIMATE })
            })?),
            _ => None,
        };
        Ok(Fit { ceiling, fixed_bytes: fixed, limit_bytes, largest_batch, split })
    }

    /// The changes that would help, each alone, from the step itself: bf16
    /// (the state and the activations), checkpointing, the lean step where
    /// the eager one was asked for; `state_only` are the setup's remedies
    /// that do not touch the activations (the optimizer, ZeRO), kept.
    pub fn remedies(
        &self,
        setup: &TrainingSetup,
        available: u64,
        state_only: Vec<Remedy>,
    ) -> Result<Vec<Remedy>, Failure> {
        let now = setup.total()?;
        let mut advice: Vec<Remedy> = state_only
            .into_iter()
            .filter(|remedy| matches!(remedy.change, Change::Optimizer { .. } | Change::Zero { .. }))
            .collect();
        let mut consider = |change: Change, precision: Precision, training: Training| -> Result<(), Failure> {
            let per_sample =
                self.config.bytes_per_sample(&training).map_err(|err| Failure::in_flags(err, &Flags::ESTIMATE))?;
            let mut changed = setup.clone().activations(per_sample.saturating_mul(self.batch as u64));
            changed.precision = precision;
            let total = changed.total()?;
            // a change that saves under 1% of the total does not help anyone fit
            if total < now && (now - total).saturating_mul(100) >= now {
                let fits = total <= available;
                advice.push(Remedy { change, saves_bytes: now - total, total_bytes: total, fits, measured: false });
            }
            Ok(())
        };
        let base = self.training.lora.as_ref().and_then(|lora| lora.base);
        if setup.precision == Precision::Fp32 && base.is_none() {
            consider(
                Change::Precision { to: Precision::Bf16 },
                Precision::Bf16,
                self.training.clone().dtype(DType::BF16),
            )?;
        }
        if !self.training.checkpointing && self.config.family != Family::Bert {
            consider(Change::GradientCheckpointing, setup.precision, self.training.clone().checkpointing())?;
        }
        advice.sort_by_key(|remedy| std::cmp::Reverse(remedy.saves_bytes));
        Ok(advice)
    }

    /// `llama(…, seq-len 2048, bf16), the lean step: 1.23 GB a sample`.
    pub fn describe(&self) -> String {
        let form = match (self.training.attention, self.training.loss) {
            (Attention::Blocked, Loss::Chunked) => "the lean step (blocked attention, the chunked loss)",
            (Attention::Eager, Loss::Full) => "the eager step (scores and logits whole)",
            _ => "a mixed step",
        };
        format!(
            "{}: {form}, {} a sample",
            self.config.describe(&self.training),
            autobatch::Bytes(self.bytes_per_sample).decimal()
        )
    }
}
