//! `estimate --config`: the whole training step of a config's model on
//! candle, counted (`Config::bytes_per_sample`: the activations of the lean
//! or the eager step, the head's logits and the loss included), and the
//! question people ask answered: the largest batch on the device under the
//! ceiling, with the accumulation for a target effective batch.

use autobatch::estimate::{Change, Precision, Remedy, TrainingSetup};
use autobatch::{Accumulation, Ceiling};
use autobatch_models::{Attention, Compute, Config, Family, Loss, StepMemory, Training};
use candle_core::DType;

use autobatch::estimate::Recompute;

use crate::args::EstimateArgs;
use crate::failure::{Failure, Flags};
use crate::values::Count;

/// The step a config's model trains with, as the flags describe it.
pub struct Step {
    pub config: Config,
    pub training: Training,
    /// What the step holds beside its state, moment by moment.
    pub memory: StepMemory,
    /// Bytes one sample adds once the batch is large.
    pub bytes_per_sample: u64,
    /// The batch the totals are of (`--batch`, else 1).
    pub batch: usize,
}

/// What fits on the device: the largest batch under the ceiling, and the
/// split of a target effective batch.
pub struct Fit {
    pub ceiling: Ceiling,
    /// What the step holds at a batch of none: the state, the optimizer's
    /// step, the widest of the vocabulary-sized moments.
    pub fixed_bytes: u64,
    pub limit_bytes: u64,
    /// The largest batch whose total stays under the limit; 0 when none.
    pub largest_batch: u64,
    pub split: Option<Accumulation>,
    /// Counted for an accelerator in a 16-bit dtype: the same step on the
    /// CPU, which widens it (its largest batch, and how many times the
    /// accelerator's bytes beside the state it holds at the largest batch).
    pub on_the_cpu: Option<(u64, f64)>,
}

impl Step {
    /// The step of `config` with `lora` (its training, when LoRA) and the
    /// estimate's flags: the sequence length, the dtype, the attention and
    /// loss, checkpointing (`--recompute full`).
    pub fn new(
        args: &EstimateArgs,
        config: &Config,
        lora: Option<Training>,
        compute: Compute,
    ) -> Result<Step, Failure> {
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
        let memory = config.step_memory(&training, compute).map_err(|err| Failure::in_flags(err, &Flags::ESTIMATE))?;
        Ok(Step {
            config: config.clone(),
            training,
            bytes_per_sample: memory.bytes_per_sample(),
            memory,
            batch: args.activations.batch.map_or(1, Count::get),
        })
    }

    /// What the step holds beside its state at the batch the totals are
    /// of: the widest moment's activations and other tensors, the
    /// parameters' `gradient_bytes` left out (the state counts them).
    pub fn held_bytes(&self, gradient_bytes: u64) -> Result<u64, Failure> {
        held_bytes(&self.memory, gradient_bytes, self.batch as u64)
    }

    /// The largest batch whose total (`base`: the state with its
    /// `gradient_bytes`, the frozen base, the optimizer's step; plus what
    /// the step holds at its widest moment) stays under
    /// `ceiling × capacity`, and the split of `target` over `ranks` from it.
    pub fn fit(
        &self,
        base: u64,
        gradient_bytes: u64,
        capacity: u64,
        ceiling: Ceiling,
        target: Option<usize>,
        ranks: usize,
    ) -> Result<Fit, Failure> {
        let limit_bytes = ceiling.limit_bytes(capacity);
        // the moments that hold the gradients count them; the others do not
        let without_gradients = base.saturating_sub(gradient_bytes);
        let largest_under_limit = |memory: &StepMemory| match limit_bytes.checked_sub(without_gradients) {
            Some(room) => memory.largest_batch(gradient_bytes, room),
            None => 0,
        };
        let largest_batch = largest_under_limit(&self.memory);
        let fixed_bytes = without_gradients.saturating_add(
            self.memory.peak_bytes(gradient_bytes, 0).map_err(|err| Failure::in_flags(err, &Flags::ESTIMATE))?,
        );
        let split = match (target, usize::try_from(largest_batch).ok().filter(|&b| b > 0)) {
            (Some(target), Some(largest)) => Some(Accumulation::plan(target, ranks, largest).map_err(|err| {
                Failure::in_flags(err, &Flags { largest: "the largest batch that fits", ..Flags::ESTIMATE })
            })?),
            _ => None,
        };
        let on_the_cpu = match self.on_the_cpu()? {
            Some(cpu) => {
                let largest = largest_under_limit(&cpu);
                let at = largest_batch.max(1);
                let widened = held_bytes(&cpu, gradient_bytes, at)? as f64;
                Some((largest, widened / held_bytes(&self.memory, gradient_bytes, at)?.max(1) as f64))
            }
            None => None,
        };
        Ok(Fit { ceiling, fixed_bytes, limit_bytes, largest_batch, split, on_the_cpu })
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
            let memory = self
                .config
                .step_memory(&training, self.memory.compute)
                .map_err(|err| Failure::in_flags(err, &Flags::ESTIMATE))?;
            let mut changed = setup.clone();
            changed.precision = precision;
            let gradients = changed.state()?.gradients;
            let changed = changed.activations(held_bytes(&memory, gradients, self.batch as u64)?);
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

    /// The step counted on the CPU where it was counted for an accelerator in
    /// a 16-bit dtype (candle's CPU matmul widens it to f32): for the line
    /// that says why `probe` on the CPU finds another batch.
    fn on_the_cpu(&self) -> Result<Option<StepMemory>, Failure> {
        let dtype = self.config.model_dtype(&self.training).map_err(|err| Failure::in_flags(err, &Flags::ESTIMATE))?;
        if self.memory.compute == Compute::Cpu || dtype == DType::F32 {
            return Ok(None);
        }
        let memory = self
            .config
            .step_memory(&self.training, Compute::Cpu)
            .map_err(|err| Failure::in_flags(err, &Flags::ESTIMATE))?;
        Ok(Some(memory))
    }

    /// `llama(…, seq-len 2048, bf16), the lean step: 1.23 GB a sample`.
    pub fn describe(&self) -> String {
        let form = match (self.training.attention, self.training.loss) {
            (Attention::Blocked, Loss::Chunked) => "the lean step (blocked attention, the chunked loss)",
            (Attention::Eager, Loss::Full) => "the eager step (scores and logits whole)",
            _ => "a mixed step",
        };
        let on = match self.memory.compute {
            Compute::Accelerator => "on an accelerator",
            Compute::Cpu => "on the CPU",
        };
        format!(
            "{}: {form} {on}, {} a sample",
            self.config.describe(&self.training),
            autobatch::Bytes(self.bytes_per_sample).decimal()
        )
    }
}

/// What `memory` holds beside the state at `batch`: its widest moment, the
/// parameters' `gradient_bytes` (which the state counts) left out.
pub fn held_bytes(memory: &StepMemory, gradient_bytes: u64, batch: u64) -> Result<u64, Failure> {
    let peak = memory.peak_bytes(gradient_bytes, batch).map_err(|err| Failure::in_flags(err, &Flags::ESTIMATE))?;
    Ok(peak.saturating_sub(gradient_bytes))
}
