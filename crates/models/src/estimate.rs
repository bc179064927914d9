//! What a training run holds, counted without running it: the state of N
//! parameters (with activations given, or a transformer's counted by
//! formula), or a config's whole candle step; against a device, whether it
//! fits under the ceiling, the largest batch that does, the split of an
//! effective batch, and the single changes that would make it fit. What
//! `autobatch estimate` prints, as a value a trainer can read.
//!
//! ```
//! use autobatch::plan::Ceiling;
//! use autobatch_models::estimate::Estimator;
//! use autobatch_models::{Config, Training};
//!
//! let config = Config::from_json(r#"{
//!     "model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
//!     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2
//! }"#)?;
//! let estimate = Estimator::step(config, Training::new(128))
//!     .on_device(64 << 20, Ceiling::new(0.9)?)
//!     .target_effective_batch(256, 1)
//!     .count()?;
//! let fit = estimate.fit().expect("a config's step on a device has a largest batch");
//! assert!(fit.largest_batch >= 1);
//! assert_eq!(fit.split.as_ref().map(|split| split.effective_batch), Some(256));
//! # Ok::<(), autobatch_models::Error>(())
//! ```

use autobatch::estimate::{
    Change, OptimizerKind, Precision, Recompute, Remedy, Sharding, StaticMemory, TrainingSetup, TransformerShape,
};
use autobatch::{Bytes, plan::Accumulation, plan::Ceiling};
use candle_core::DType;

use crate::{Attention, BaseDtype, Compute, Config, Error, Lora, Loss, Setting, StepMemory, Training};

/// The activations beside N parameters' state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activations {
    /// Not known: the estimate says whether the state leaves room for them.
    #[default]
    Unknown,
    /// Measured (by a probe) at the batch you want.
    Bytes(u64),
    /// A transformer's, by the activation formula (Korthikanti et al. 2022).
    Transformer {
        /// Its sizes and the micro-batch.
        shape: TransformerShape,
        /// What the backward pass recomputes instead of keeping.
        recompute: Recompute,
    },
}

/// What an [`Estimator`] counts: N parameters' state beside their activations.
#[derive(Clone, Debug)]
pub struct OfParameters {
    parameters: u64,
    activations: Activations,
}

/// What an [`Estimator`] counts: a config's whole training step on candle.
#[derive(Clone, Debug)]
pub struct OfStep {
    config: Config,
    training: Training,
    compute: Compute,
    batch: usize,
    target: Option<(usize, usize)>,
}

/// The request: what is counted (`S`: [`OfParameters`] or [`OfStep`], each
/// with its own options), how its state is stored and spread, and the device.
#[derive(Clone, Debug)]
pub struct Estimator<S> {
    subject: S,
    precision: Option<Precision>,
    optimizer: OptimizerKind,
    sharding: Sharding,
    device: Option<(u64, Ceiling)>,
}

impl<S> Estimator<S> {
    fn of(subject: S) -> Self {
        Estimator {
            subject,
            precision: None,
            optimizer: OptimizerKind::AdamW,
            sharding: Sharding::default(),
            device: None,
        }
    }

    /// How what trains is stored [default: f32 for parameters; a config's
    /// `torch_dtype` for its step, f32 adapters beside a LoRA base of its own dtype].
    pub fn precision(mut self, precision: Precision) -> Self {
        self.precision = Some(precision);
        self
    }

    /// The optimizer whose state is counted [default: AdamW].
    pub fn optimizer(mut self, optimizer: OptimizerKind) -> Self {
        self.optimizer = optimizer;
        self
    }

    /// ZeRO, data and tensor parallelism: the state (and activations) per device.
    pub fn sharded(mut self, sharding: Sharding) -> Self {
        self.sharding = sharding;
        self
    }

    /// The device it should fit on: its capacity, and the ceiling (the
    /// probe's) the total must stay under.
    pub fn on_device(mut self, capacity_bytes: u64, ceiling: Ceiling) -> Self {
        self.device = Some((capacity_bytes, ceiling));
        self
    }

    fn setup(&self, parameters: u64, default_precision: Precision, frozen_bytes: u64) -> TrainingSetup {
        TrainingSetup::new(parameters, self.precision.unwrap_or(default_precision), self.optimizer)
            .sharded(self.sharding)
            .frozen(frozen_bytes)
    }
}

impl Estimator<OfParameters> {
    /// The training state of `parameters` trainable parameters.
    pub fn parameters(parameters: u64) -> Self {
        Estimator::of(OfParameters { parameters, activations: Activations::Unknown })
    }

    /// The activations beside the state [default: unknown].
    pub fn activations(mut self, activations: Activations) -> Self {
        self.subject.activations = activations;
        self
    }

    /// Counts it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] for no parameters; the core's overflow
    /// where a count passes `u64`.
    pub fn count(&self) -> Result<Estimate, Error> {
        let OfParameters { parameters, activations } = self.subject;
        if parameters == 0 {
            return Err(Error::InvalidSetting {
                setting: Setting::Parameters,
                value: autobatch::Value::Count(0),
                valid: "it must be at least 1".into(),
            });
        }
        let setup = self.setup(parameters, Precision::Fp32, 0);
        let setup = match activations {
            Activations::Unknown => setup,
            Activations::Bytes(bytes) => setup.activations(bytes),
            Activations::Transformer { shape, recompute } => setup.transformer(shape, recompute)?,
        };
        let counts_a_batch = setup.all_activation_bytes()? > 0;
        let device = match self.device {
            Some((capacity_bytes, ceiling)) => {
                let limit_bytes = ceiling.limit_bytes(capacity_bytes);
                let mut remedies = setup.remedies(limit_bytes)?;
                if !counts_a_batch {
                    // what a change leaves for activations is not a batch that fits
                    remedies.iter_mut().for_each(|remedy| remedy.fits = false);
                }
                Some(OnDevice { capacity_bytes, ceiling, limit_bytes, remedies, fit: None })
            }
            None => None,
        };
        Estimate::new(setup, None, counts_a_batch, device)
    }
}

impl Estimator<OfStep> {
    /// The whole training step of `config` as `training` describes it (its
    /// length, dtype, attention, loss, LoRA, checkpointing), at a batch of 1
    /// on an accelerator unless said otherwise.
    pub fn step(config: Config, training: Training) -> Self {
        Estimator::of(OfStep { config, training, compute: Compute::Accelerator, batch: 1, target: None })
    }

    /// Where the step runs: an accelerator, or the CPU (which widens 16-bit
    /// products to f32) [default: an accelerator].
    pub fn compute(mut self, compute: Compute) -> Self {
        self.subject.compute = compute;
        self
    }

    /// The batch the totals are of [default: 1]; the largest batch on the
    /// device is found whatever it is.
    pub fn batch(mut self, batch: usize) -> Self {
        self.subject.batch = batch;
        self
    }

    /// With a device: split `effective` samples into micro-batch ×
    /// accumulation × `ranks` from the largest batch that fits.
    pub fn target_effective_batch(mut self, effective: usize, ranks: usize) -> Self {
        self.subject.target = Some((effective, ranks));
        self
    }

    /// Counts it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] for a precision other than f32 beside a LoRA
    /// base of its own dtype (its adapters train in f32), a training the
    /// config cannot take, or a target the largest batch cannot split; the
    /// core's overflow where a count passes `u64`.
    pub fn count(&self) -> Result<Estimate, Error> {
        let OfStep { config, training, compute, batch, target } = &self.subject;
        let own_base = training.lora.as_ref().and_then(|lora| lora.base).is_some();
        if let Some(precision) = self.precision.filter(|precision| own_base && *precision != Precision::Fp32) {
            return Err(Error::InvalidSetting {
                setting: Setting::Precision,
                value: autobatch::Value::Text(precision.name().to_owned()),
                valid: "beside a LoRA base of its own dtype (Lora::base) the adapters train in f32: fp32".into(),
            });
        }
        let stored = config.training_setup(training)?;
        let setup = self.setup(stored.parameters, stored.precision, stored.frozen_bytes);
        let memory = config.step_memory(training, *compute)?;
        let step = StepEstimate {
            config: config.clone(),
            training: training.clone(),
            bytes_per_sample: memory.bytes_per_sample(),
            memory,
            batch: *batch,
        };
        let gradients = setup.state()?.gradients;
        // the step's widest moment at the batch: its activations, the vocabulary-sized tensors
        let setup = setup.activations(step.held_bytes(gradients)?);
        let device = match self.device {
            Some((capacity_bytes, ceiling)) => {
                let limit_bytes = ceiling.limit_bytes(capacity_bytes);
                let base = setup.clone().activations(0).total()?;
                let fit = step.fit(base, gradients, limit_bytes, *target)?;
                let remedies = self.remedies(setup.total()?, limit_bytes)?;
                Some(OnDevice { capacity_bytes, ceiling, limit_bytes, remedies, fit: Some(fit) })
            }
            None => None,
        };
        Estimate::new(setup, Some(step), true, device)
    }
}

/// The LoRA rank advised where every weight trains: the PEFT examples' 16.
const ADVISED_LORA_RANK: usize = 16;

/// The ranks a ZeRO stage is weighed over on one device's count: the
/// fewest of these at which it fits.
const ZERO_RANKS: [u64; 7] = [2, 4, 8, 16, 32, 64, 128];

impl Estimator<OfStep> {
    /// The changes that would help a fine-tuner, each alone, largest saving
    /// first: the optimizers, ZeRO (over the ranks given, else the fewest
    /// ranks at which stage 3 fits), bf16, checkpointing, LoRA where every
    /// weight trains, a 4-bit base where LoRA's is not, the longest length
    /// that fits (else half the length); each counted as this request counts
    /// its step. Where no single change fits, the pairs of them that do,
    /// least total first (at most three).
    fn remedies(&self, now: u64, available: u64) -> Result<Vec<Remedy>, Error> {
        let singles = self.single_changes(available);
        let mut advice = Vec::new();
        for change in &singles {
            let Some(total) = self.total_with(change) else { continue };
            // a change that saves under 1% of the total helps only one that is that close
            let fits = total <= available;
            if total < now && ((now - total).saturating_mul(100) >= now || fits) {
                advice.push(Remedy {
                    change: change.clone(),
                    saves_bytes: now - total,
                    total_bytes: total,
                    fits,
                    measured: false,
                });
            }
        }
        // on this one device: ZeRO needs more of them
        let one_device = |change: &Change| !matches!(change, Change::Zero { .. });
        if !advice.iter().any(|remedy| remedy.fits && one_device(&remedy.change)) {
            let mut helping: Vec<Change> =
                advice.iter().map(|remedy| remedy.change.clone()).filter(|change| one_device(change)).collect();
            if self.subject.training.lora.is_none() {
                // with LoRA, its base in 4 bits: QLoRA for a full fine-tune
                helping.push(Change::QuantizedBase);
            }
            let mut pairs = Vec::new();
            for (i, first) in helping.iter().enumerate() {
                for second in &helping[i + 1..] {
                    if same_kind(first, second) {
                        continue;
                    }
                    let both = Change::Both { first: Box::new(first.clone()), second: Box::new(second.clone()) };
                    if let Some(total) = self.total_with(&both).filter(|&total| total <= available) {
                        pairs.push(Remedy {
                            change: both,
                            saves_bytes: now.saturating_sub(total),
                            total_bytes: total,
                            fits: true,
                            measured: false,
                        });
                    }
                }
            }
            pairs.sort_by_key(|remedy| remedy.total_bytes);
            advice.extend(pairs.into_iter().take(3));
        }
        advice.sort_by_key(|remedy| (!remedy.fits, std::cmp::Reverse(remedy.saves_bytes)));
        Ok(advice)
    }

    /// The single changes that apply to this request.
    fn single_changes(&self, available: u64) -> Vec<Change> {
        let OfStep { config, training, .. } = &self.subject;
        let mut changes = Vec::new();
        for to in [OptimizerKind::Sgd, OptimizerKind::Adafactor, OptimizerKind::Adam8bit, OptimizerKind::Lion] {
            if to != self.optimizer {
                changes.push(Change::Optimizer { to });
            }
        }
        let base = training.lora.as_ref().and_then(|lora| lora.base);
        let stored = config.training_setup(training).map(|setup| self.precision.unwrap_or(setup.precision));
        if stored.is_ok_and(|precision| precision == Precision::Fp32) && base.is_none() {
            changes.push(Change::Precision { to: Precision::Bf16 });
        }
        if !training.checkpointing && config.family.checkpoints() {
            changes.push(Change::GradientCheckpointing);
        }
        match &training.lora {
            None => changes.push(Change::Lora { rank: ADVISED_LORA_RANK as u64 }),
            Some(lora) if lora.base != Some(BaseDtype::Q4_0) => changes.push(Change::QuantizedBase),
            Some(_) => {}
        }
        // ZeRO partitions what trains: nothing to gain beside LoRA's adapters
        if training.lora.is_none() {
            let sharding = self.sharding;
            match sharding.data_parallel {
                1 => {
                    let fewest = ZERO_RANKS.into_iter().find(|&ranks| {
                        self.total_with(&Change::Zero { stage: 3, ranks }).is_some_and(|total| total <= available)
                    });
                    changes.extend(fewest.map(|ranks| Change::Zero { stage: 3, ranks }));
                }
                ranks => changes.extend((sharding.zero_stage + 1..=3).map(|stage| Change::Zero { stage, ranks })),
            }
        }
        if let Some(seq_len) =
            self.longest_fitting(available).or((training.seq_len >= 2).then_some(training.seq_len / 2))
        {
            changes.push(Change::SequenceLength { seq_len: seq_len as u64 });
        }
        changes
    }

    /// The longest sequence below this request's whose step alone fits with
    /// a twentieth of the limit to spare: a length chosen at the edge of the
    /// count would be said to fit where the count's few percent decide.
    fn longest_fitting(&self, available: u64) -> Option<usize> {
        let current = self.subject.training.seq_len;
        let room = available - available / 20;
        let fits = |seq_len: usize| {
            self.total_with(&Change::SequenceLength { seq_len: seq_len as u64 }).is_some_and(|total| total <= room)
        };
        if current < 2 || !fits(1) {
            return None;
        }
        Some(crate::config::last_fitting(1, current, fits))
    }

    /// The total of this request with `change` made, counted as this request
    /// counts; `None` where it does not apply or the model refuses it.
    fn total_with(&self, change: &Change) -> Option<u64> {
        let mut changed = self.clone();
        changed.device = None;
        changed.subject.target = None;
        changed.change(change)?;
        changed.count().ok().map(|estimate| estimate.total_bytes())
    }

    /// This request with `change` made; `None` where it does not apply.
    fn change(&mut self, change: &Change) -> Option<()> {
        let training = &mut self.subject.training;
        match change {
            Change::Optimizer { to } => self.optimizer = *to,
            Change::Precision { to: Precision::Bf16 } => {
                *training = training.clone().dtype(DType::BF16);
                self.precision = Some(Precision::Bf16);
            }
            Change::Precision { .. } => return None,
            Change::GradientCheckpointing => *training = training.clone().checkpointing(),
            Change::SequenceLength { seq_len } => training.seq_len = usize::try_from(*seq_len).ok()?,
            Change::Zero { stage, ranks } => {
                self.sharding = Sharding::new(*stage, *ranks, self.sharding.tensor_parallel).ok()?;
            }
            Change::Lora { rank } => {
                let targets = self.subject.config.family.lora_targets();
                *training = training.clone().lora(Lora::new(usize::try_from(*rank).ok()?, targets));
            }
            Change::QuantizedBase => {
                let lora = training.lora.clone()?;
                *training = training.clone().lora(lora.base(BaseDtype::Q4_0));
                // the adapters beside a base of its own dtype train in f32
                self.precision = None;
                training.dtype = None;
            }
            Change::Both { first, second } => {
                self.change(first)?;
                self.change(second)?;
            }
            _ => return None,
        }
        Some(())
    }
}

/// Two changes of one kind (two optimizers, two lengths) are not a pair.
fn same_kind(first: &Change, second: &Change) -> bool {
    std::mem::discriminant(first) == std::mem::discriminant(second)
}

/// What an [`Estimator`] counted.
#[derive(Clone, Debug)]
pub struct Estimate {
    setup: TrainingSetup,
    state: StaticMemory,
    activation_bytes: u64,
    total_bytes: u64,
    counts_a_batch: bool,
    step: Option<StepEstimate>,
    device: Option<OnDevice>,
}

/// The estimate against the device it was asked about.
#[derive(Clone, Debug)]
pub struct OnDevice {
    /// The device's memory.
    pub capacity_bytes: u64,
    /// The share of it that may be used.
    pub ceiling: Ceiling,
    /// What the total must stay under: `ceiling × capacity`, as the probe counts it.
    pub limit_bytes: u64,
    /// The single changes that would help, each alone, largest saving first.
    pub remedies: Vec<Remedy>,
    /// A config's step: the largest batch under the limit.
    pub fit: Option<StepFit>,
}

impl Estimate {
    fn new(
        setup: TrainingSetup,
        step: Option<StepEstimate>,
        counts_a_batch: bool,
        device: Option<OnDevice>,
    ) -> Result<Estimate, Error> {
        Ok(Estimate {
            state: setup.state()?,
            activation_bytes: setup.all_activation_bytes()?,
            total_bytes: setup.total()?,
            setup,
            counts_a_batch,
            step,
            device,
        })
    }

    /// What was counted: the parameters, precision, optimizer, sharding, the
    /// frozen base and the activations.
    pub fn setup(&self) -> &TrainingSetup {
        &self.setup
    }

    /// Trainable parameters (under LoRA, the adapters').
    pub fn parameters(&self) -> u64 {
        self.setup.parameters
    }

    /// The state per device: weights, gradients, optimizer states, masters.
    pub fn state(&self) -> &StaticMemory {
        &self.state
    }

    /// Activations per device (a config's step: what it holds beside its
    /// state at its widest moment).
    pub fn activation_bytes(&self) -> u64 {
        self.activation_bytes
    }

    /// Everything per device.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Whether the total counts a batch's activations (a config's step, or
    /// activations given or counted): only then can it say a batch fits.
    pub fn counts_a_batch(&self) -> bool {
        self.counts_a_batch
    }

    /// A config's step, as counted.
    pub fn step(&self) -> Option<&StepEstimate> {
        self.step.as_ref()
    }

    /// The verdict on the device asked about.
    pub fn on_device(&self) -> Option<&OnDevice> {
        self.device.as_ref()
    }

    /// A config's step on the device: the largest batch, the split.
    pub fn fit(&self) -> Option<&StepFit> {
        self.device.as_ref()?.fit.as_ref()
    }

    /// Whether it fits under `limit_bytes` (see [`Verdict`]).
    pub fn fits_under(&self, limit_bytes: u64) -> Verdict {
        match (self.total_bytes <= limit_bytes, self.counts_a_batch) {
            (false, _) => Verdict::DoesNotFit,
            (true, true) => Verdict::Fits,
            // nothing left for a single activation is no fit either
            (true, false) if self.total_bytes == limit_bytes => Verdict::DoesNotFit,
            (true, false) => Verdict::StateFits,
        }
    }

    /// [`fits_under`](Self::fits_under) the device's limit, where a device was given.
    pub fn fits(&self) -> Option<Verdict> {
        self.device.as_ref().map(|device| self.fits_under(device.limit_bytes))
    }
}

/// Whether an [`Estimate`] fits under a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A batch of at least one sample is counted and the total stays under it.
    Fits,
    /// The total does not stay under it, or leaves nothing for an activation.
    DoesNotFit,
    /// The state stays under it, and the activations are not counted: whether
    /// a batch fits is not known (give them, or count a config's step).
    StateFits,
}

impl Verdict {
    /// `Some(fits)` where it is known, `None` where only the state was
    /// counted (JSON's `fits`: `true`, `false` or `null`).
    pub fn known(self) -> Option<bool> {
        match self {
            Verdict::Fits => Some(true),
            Verdict::DoesNotFit => Some(false),
            Verdict::StateFits => None,
        }
    }
}

/// A config's step as counted.
#[derive(Clone, Debug)]
pub struct StepEstimate {
    /// The model.
    pub config: Config,
    /// How it trains.
    pub training: Training,
    /// What the step holds beside its state, moment by moment.
    pub memory: StepMemory,
    /// Bytes one sample adds once the batch is large.
    pub bytes_per_sample: u64,
    /// The batch the totals are of.
    pub batch: usize,
}

/// A config's step on the device: the largest batch under the limit, and
/// the split of a target effective batch.
#[derive(Clone, Debug)]
pub struct StepFit {
    /// What the step holds at a batch of none: the state, the optimizer's
    /// step, the widest of the vocabulary-sized moments.
    pub fixed_bytes: u64,
    /// The largest batch whose total stays under the limit; 0 when none.
    pub largest_batch: u64,
    /// The bytes a sample adds around the largest batch (around 1 where
    /// none fits): the slope a probe measures there, steeper than the step's
    /// [`bytes_per_sample`](StepEstimate::bytes_per_sample) until the batch
    /// fills the chunked loss's chunk.
    pub bytes_per_sample_there: u64,
    /// The target's micro-batch × accumulation × ranks.
    pub split: Option<Accumulation>,
    /// Counted for an accelerator in a 16-bit dtype: the same step on the
    /// CPU, which widens it (its largest batch, and how many times the
    /// accelerator's bytes beside the state it holds at the largest batch).
    pub on_the_cpu: Option<(u64, f64)>,
}

impl StepEstimate {
    /// What the step holds beside its state at its batch: the widest
    /// moment's activations and other tensors, the parameters'
    /// `gradient_bytes` left out (the state counts them).
    pub fn held_bytes(&self, gradient_bytes: u64) -> Result<u64, Error> {
        held_bytes(&self.memory, gradient_bytes, self.batch as u64)
    }

    /// The largest batch whose total (`base`: the state with its
    /// `gradient_bytes`, the frozen base, the optimizer's step; plus what
    /// the step holds at its widest moment) stays under `limit_bytes`, and
    /// the split of `target` (effective batch, ranks) from it.
    fn fit(
        &self,
        base: u64,
        gradient_bytes: u64,
        limit_bytes: u64,
        target: Option<(usize, usize)>,
    ) -> Result<StepFit, Error> {
        // the moments that hold the gradients count them; the others do not
        let without_gradients = base.saturating_sub(gradient_bytes);
        let largest_under_limit = |memory: &StepMemory| match limit_bytes.checked_sub(without_gradients) {
            Some(room) => memory.largest_batch(gradient_bytes, room),
            None => 0,
        };
        let largest_batch = largest_under_limit(&self.memory);
        let fixed_bytes = without_gradients.saturating_add(self.memory.peak_bytes(gradient_bytes, 0)?);
        let bytes_per_sample_there = self.memory.bytes_per_sample_at(gradient_bytes, largest_batch.max(1))?;
        let split = match (target, usize::try_from(largest_batch).ok().filter(|&b| b > 0)) {
            (Some((effective, ranks)), Some(largest)) => Some(Accumulation::plan(effective, ranks, largest)?),
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
        Ok(StepFit { fixed_bytes, largest_batch, bytes_per_sample_there, split, on_the_cpu })
    }

    /// The step counted on the CPU where it was counted for an accelerator in
    /// a 16-bit dtype (candle's CPU matmul widens it to f32): why a probe on
    /// the CPU finds another batch.
    fn on_the_cpu(&self) -> Result<Option<StepMemory>, Error> {
        let dtype = self.config.model_dtype(&self.training)?;
        if self.memory.compute == Compute::Cpu || dtype == DType::F32 {
            return Ok(None);
        }
        Ok(Some(self.config.step_memory(&self.training, Compute::Cpu)?))
    }

    /// `llama(…, seq-len 2048, bf16): the lean step (…) on an accelerator, 1.23 GB a sample`.
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
            "{}: {form} {on}, {} a sample once the batch is large",
            self.config.describe(&self.training),
            Bytes(self.bytes_per_sample).decimal()
        )
    }
}

/// What `memory` holds beside the state at `batch`: its widest moment, the
/// parameters' `gradient_bytes` (which the state counts) left out.
fn held_bytes(memory: &StepMemory, gradient_bytes: u64, batch: u64) -> Result<u64, Error> {
    Ok(memory.peak_bytes(gradient_bytes, batch)?.saturating_sub(gradient_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama() -> Config {
        Config::from_json(
            r#"{
            "model_type": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2
        }"#,
        )
        .unwrap()
    }

    fn on_device(capacity: u64) -> Estimator<OfStep> {
        Estimator::step(llama(), Training::new(64)).on_device(capacity, Ceiling::new(0.9).unwrap())
    }

    /// The total at `batch` of the same request: what the largest batch's claim is checked by.
    fn total_at(request: &Estimator<OfStep>, batch: usize) -> u64 {
        let mut at = request.clone();
        at.device = None;
        at.batch(batch).count().unwrap().total_bytes()
    }

    #[test]
    fn the_largest_batch_fits_and_the_next_does_not() {
        for capacity in [24 << 20, 64 << 20, 300 << 20] {
            let request = on_device(capacity);
            let estimate = request.count().unwrap();
            let (fit, limit) = (estimate.fit().unwrap(), estimate.on_device().unwrap().limit_bytes);
            let largest = fit.largest_batch as usize;
            assert!(largest >= 1, "{capacity}: nothing fits");
            assert!(total_at(&request, largest) <= limit, "{capacity}: batch {largest} is over {limit}");
            assert!(total_at(&request, largest + 1) > limit, "{capacity}: batch {} fits too", largest + 1);
        }
    }

    #[test]
    fn the_split_reaches_the_target_from_the_largest_batch() {
        let estimate = on_device(64 << 20).target_effective_batch(1000, 4).count().unwrap();
        let fit = estimate.fit().unwrap();
        let split = fit.split.as_ref().unwrap();
        assert_eq!(split.effective_batch, 1000);
        assert!(split.micro_batch as u64 <= fit.largest_batch);
    }

    #[test]
    fn an_advised_change_applied_gives_the_total_it_said() {
        // a device the step does not fit at batch 64: checkpointing and bf16 are advised
        let request = on_device(8 << 20).batch(64);
        let estimate = request.count().unwrap();
        let remedies = &estimate.on_device().unwrap().remedies;
        let checkpointing = remedies.iter().find(|remedy| remedy.change == Change::GradientCheckpointing).unwrap();
        let applied = Estimator::step(llama(), Training::new(64).checkpointing()).batch(64).count().unwrap();
        assert_eq!(applied.total_bytes(), checkpointing.total_bytes);
        assert_eq!(estimate.total_bytes() - applied.total_bytes(), checkpointing.saves_bytes);
        let bf16 = remedies.iter().find(|remedy| matches!(remedy.change, Change::Precision { .. })).unwrap();
        let applied = Estimator::step(llama(), Training::new(64).dtype(DType::BF16))
            .precision(Precision::Bf16)
            .batch(64)
            .count()
            .unwrap();
        assert_eq!(applied.total_bytes(), bf16.total_bytes);
    }

    /// `change` made by hand through the public request, counted: what an
    /// advised remedy's total is checked against.
    fn applied(config: &Config, training: &Training, change: &Change) -> Estimator<OfStep> {
        let mut training = training.clone();
        let mut steps = vec![change.clone()];
        let (mut optimizer, mut sharding, mut precision) = (OptimizerKind::AdamW, Sharding::default(), None);
        while let Some(change) = steps.pop() {
            match change {
                Change::Both { first, second } => steps.extend([*second, *first]),
                Change::Optimizer { to } => optimizer = to,
                Change::Zero { stage, ranks } => sharding = Sharding::new(stage, ranks, 1).unwrap(),
                Change::Precision { to } => {
                    training = training.dtype(DType::BF16);
                    precision = Some(to);
                }
                Change::GradientCheckpointing => training = training.checkpointing(),
                Change::SequenceLength { seq_len } => training.seq_len = seq_len as usize,
                Change::Lora { rank } => {
                    training = training.lora(Lora::new(rank as usize, config.family.lora_targets()))
                }
                Change::QuantizedBase => {
                    let lora = training.lora.clone().unwrap().base(BaseDtype::Q4_0);
                    training = training.lora(lora);
                    training.dtype = None;
                }
                other => panic!("{other:?}"),
            }
        }
        let mut built = Estimator::step(config.clone(), training).optimizer(optimizer).sharded(sharding);
        if let Some(precision) = precision {
            built = built.precision(precision);
        }
        built
    }

    fn published(name: &str) -> Config {
        let json = match name {
            "mistral" => include_str!("../tests/configs/mistral-7b-v0.1.json"),
            "llama" => include_str!("../tests/configs/llama-3.2-1b.json"),
            other => panic!("{other}"),
        };
        Config::from_json(json).unwrap()
    }

    /// The changes a fine-tuner weighs (issue 84): QLoRA beside LoRA, LoRA
    /// and ZeRO beside a full fine-tune, the longest length that fits, and
    /// the pairs that fit where no single change on one device does; each
    /// applied by hand gives the total it said, and "fits" fits.
    #[test]
    fn the_advice_weighs_what_a_fine_tuner_would_and_each_total_holds() {
        let gib = 1u64 << 30;
        let cases = [
            (
                "mistral",
                Training::new(2048).lora(Lora::new(16, crate::Family::named("mistral").unwrap().lora_targets())),
                16 * gib,
            ),
            ("mistral", Training::new(2048), 24 * gib),
            ("llama", Training::new(2048), 4 * gib),
        ];
        for (name, training, capacity) in cases {
            let config = published(name);
            let estimate = Estimator::step(config.clone(), training.clone())
                .on_device(capacity, Ceiling::new(0.9).unwrap())
                .count()
                .unwrap();
            let device = estimate.on_device().unwrap();
            assert_eq!(estimate.fits(), Some(Verdict::DoesNotFit), "{name}: a case where nothing fits as it is");
            for remedy in &device.remedies {
                let total = applied(&config, &training, &remedy.change).count().unwrap().total_bytes();
                assert_eq!(total, remedy.total_bytes, "{name}: {} applied", remedy.change);
                assert_eq!(remedy.fits, total <= device.limit_bytes, "{name}: {}", remedy.change);
            }
            let has = |wanted: fn(&Change) -> bool| device.remedies.iter().any(|remedy| wanted(&remedy.change));
            match (name, training.lora.is_some()) {
                ("mistral", true) => {
                    assert!(has(|change| *change == Change::QuantizedBase), "QLoRA beside LoRA: {:?}", device.remedies);
                    assert!(has(|change| matches!(change, Change::SequenceLength { .. })));
                }
                ("mistral", false) => {
                    assert!(has(|change| matches!(change, Change::Lora { rank: 16 })), "{:?}", device.remedies);
                    assert!(has(|change| matches!(change, Change::Zero { stage: 3, .. })), "{:?}", device.remedies);
                }
                _ => {
                    let pair = device.remedies.iter().find(|remedy| matches!(remedy.change, Change::Both { .. }));
                    assert!(
                        pair.is_some_and(|pair| pair.fits),
                        "a pair where no single change fits: {:?}",
                        device.remedies
                    );
                }
            }
        }
    }

    /// A change that saves under 1% of the total is still advised where it
    /// is enough: a step a few megabytes over.
    #[test]
    fn a_small_saving_that_is_enough_is_advised() {
        let config = llama();
        let training = Training::new(64);
        let total = Estimator::step(config.clone(), training.clone()).count().unwrap().total_bytes();
        let sgd =
            applied(&config, &training, &Change::Optimizer { to: OptimizerKind::Sgd }).count().unwrap().total_bytes();
        // a limit between the two: the saving is what makes it fit
        let limit = sgd + (total - sgd) / 2;
        let capacity = (limit as f64 / 0.9).floor() as u64;
        let estimate =
            Estimator::step(config, training).on_device(capacity, Ceiling::new(0.9).unwrap()).count().unwrap();
        let remedies = &estimate.on_device().unwrap().remedies;
        assert!(
            remedies.iter().any(|remedy| remedy.change == Change::Optimizer { to: OptimizerKind::Sgd } && remedy.fits),
            "{remedies:?}"
        );
    }

    #[test]
    fn a_lora_step_trains_the_adapters_beside_a_frozen_base() {
        let config = llama();
        let training = Training::new(64).lora(Lora::new(8, config.family.lora_targets()));
        let full = Estimator::step(config.clone(), Training::new(64)).count().unwrap();
        let lora = Estimator::step(config.clone(), training).count().unwrap();
        assert!(lora.parameters() < full.parameters() / 10);
        assert_eq!(lora.setup().frozen_bytes, config.parameter_count() * 4);
        assert!(lora.total_bytes() < full.total_bytes());
    }

    /// What trains is stored in the dtype the step runs in: `Training::dtype`
    /// over the config's `torch_dtype`, as the footprint counts it.
    #[test]
    fn the_state_is_the_footprints_in_the_dtype_the_step_runs_in() {
        let bf16 = Config { dtype: DType::BF16, ..llama() };
        for (training, precision) in [
            (Training::new(64), Precision::Bf16),
            (Training::new(64).dtype(DType::F32), Precision::Fp32),
            (Training::new(64).lora(Lora::new(8, &["q_proj"])), Precision::Bf16),
            (Training::new(64).lora(Lora::new(8, &["q_proj"]).base(crate::BaseDtype::Q8_0)), Precision::Fp32),
        ] {
            let estimate = Estimator::step(bf16.clone(), training.clone()).count().unwrap();
            assert_eq!(estimate.setup().precision, precision, "{training:?}");
            let footprint = bf16.footprint(&training, Compute::Cpu).unwrap();
            assert_eq!(estimate.state(), &footprint.state, "{training:?}");
            assert_eq!(estimate.setup().frozen_bytes, bf16.frozen_bytes(&training).unwrap());
        }
    }

    /// The footprint counts the step where it runs: the CPU holds more
    /// (16-bit products widened to f32, its own temporaries), so a GPU
    /// probe's pre-check counts less than the CPU's, the state the same.
    #[test]
    fn the_footprint_counts_the_step_where_it_runs() {
        let bf16 = Config { dtype: DType::BF16, ..llama() };
        for training in [Training::new(256), Training::new(256).dtype(DType::F32)] {
            let cpu = bf16.footprint(&training, Compute::Cpu).unwrap();
            let accelerator = bf16.footprint(&training, Compute::Accelerator).unwrap();
            assert_eq!(cpu.state, accelerator.state);
            assert!(accelerator.fixed_bytes < cpu.fixed_bytes, "{accelerator:?} {cpu:?}");
            assert!(accelerator.min_bytes_per_sample <= cpu.min_bytes_per_sample, "{accelerator:?} {cpu:?}");
        }
    }

    #[test]
    fn bad_requests_are_refused_with_the_setting() {
        let err = Estimator::parameters(0).count().unwrap_err();
        assert!(err.to_string().starts_with("Estimator::parameters is 0"), "{err}");
        let config = llama();
        let own_base = Lora::new(8, config.family.lora_targets()).base(crate::BaseDtype::Q8_0);
        let err =
            Estimator::step(config, Training::new(64).lora(own_base)).precision(Precision::Mixed).count().unwrap_err();
        assert!(err.to_string().starts_with("Estimator::precision is mixed"), "{err}");
    }

    #[test]
    fn parameters_alone_say_no_batch_fits_until_their_activations_are_counted() {
        let state_only = Estimator::parameters(1_000_000).on_device(1 << 30, Ceiling::default()).count().unwrap();
        assert_eq!(state_only.fits(), Some(Verdict::StateFits));
        assert!(state_only.on_device().unwrap().remedies.iter().all(|remedy| !remedy.fits));
        let with = Estimator::parameters(1_000_000)
            .activations(Activations::Bytes(100 << 20))
            .on_device(1 << 30, Ceiling::default())
            .count()
            .unwrap();
        assert_eq!(with.fits(), Some(Verdict::Fits));
        assert_eq!(with.fits_under(with.total_bytes() - 1), Verdict::DoesNotFit);
        assert_eq!(with.total_bytes(), 16_000_000 + (100 << 20));
    }
}
