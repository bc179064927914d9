//! Nothing fits before any step: the pre-check refused the model (its count
//! at the first batch is over the limit), and says what would help. Each
//! change alone, with the first batch's total counted as `estimate` counts it
//! (a reference model: as the pre-check counts it); a change the count fits is
//! run at that batch before it is said to fit, and one that cannot be run is
//! said so; then the smallest budget at which the first batch fits, measured
//! where the CPU can hold the step, else counted.

use autobatch::estimate::{Change, OptimizerKind, Precision};
use autobatch::{Bytes, HeapMeter, MemoryMeter};
use autobatch_models as models;
use autobatch_models::Compute;
use candle_core::DType;
use serde_json::json;

use crate::failure::{Failure, Flags};
use crate::model::{ModelConfig, Optimizing};

use super::context::Run;

/// The tail of the core's refusal, which said only what kind of change helps.
const GENERIC: &str = "; make the model or the smallest batch smaller, or raise the capacity";

/// The most a CPU step is run with room (beside what the process holds):
/// past it a total is counted, not measured.
const MEASURED_UP_TO: u64 = 4 << 30;

/// A change is run only where its count is within this many times the
/// limit: one twice over is over whatever the count's few percent say, and
/// running it (a thousand layers under 32 MiB) would cost minutes to say so.
const RUN_WITHIN: u64 = 2;

/// Whether a step counted at `counted` is run with room under `limit`.
fn worth_running(counted: u64, limit: u64) -> bool {
    counted <= MEASURED_UP_TO && counted <= limit.saturating_mul(RUN_WITHIN)
}

/// LoRA's rank where full fine-tuning does not fit: the PEFT examples' 16.
const LORA_RANK: usize = 16;

/// One change of the flags, and the model and training it makes.
struct Changed {
    flags: String,
    model: ModelConfig,
    optimizing: Optimizing,
    /// The batch it runs at (`--start K` changes it).
    batch: usize,
}

/// What one change comes to.
struct Weighed {
    flags: String,
    batch: usize,
    /// The first batch's total, counted, with what the process holds.
    counted: u64,
    /// Where the count fit it: the step run at its batch, its peak and
    /// whether it fit; or why it could not run.
    run: Option<Result<(u64, bool), String>>,
}

impl Weighed {
    fn fits(&self) -> bool {
        matches!(self.run, Some(Ok((_, true))))
    }

    fn measured_peak(&self) -> Option<u64> {
        match self.run {
            Some(Ok((peak, _))) => Some(peak),
            _ => None,
        }
    }

    fn said(&self) -> String {
        let counted = format!("counted {} at batch {}", Bytes(self.counted), self.batch);
        match &self.run {
            Some(Ok((peak, fits))) => {
                let verdict = if *fits { "fits" } else { "still over" };
                format!("{}: {counted}, run: peak {} ({verdict})", self.flags, Bytes(*peak))
            }
            Some(Err(why)) => format!("{}: {counted} (not run: {why})", self.flags),
            None => format!("{}: {counted} (still over by the count, not run)", self.flags),
        }
    }

    fn json(&self) -> serde_json::Value {
        let (peak, fits, not_run) = match &self.run {
            Some(Ok((peak, fits))) => (Some(*peak), Some(*fits), None),
            Some(Err(why)) => (None, None, Some(why.clone())),
            None => (None, Some(false), None),
        };
        json!({
            "flags": self.flags,
            "batch": self.batch,
            "counted_bytes": self.counted,
            "measured_peak_bytes": peak,
            "fits": fits,
            "not_run": not_run,
        })
    }
}

/// `failure`, the pre-check's refusal at `batch` under `limit`, with what
/// would help; in `--json` the same as a document on stdout. `held` is what
/// the process holds that the count does not (on the CPU, past the matmul
/// buffers the count has).
pub fn advised(
    run: &Run,
    meter: &mut dyn MemoryMeter,
    compute: Compute,
    (limit, held): (u64, u64),
    batch: usize,
    failure: Failure,
) -> Failure {
    // on the CPU a step the count puts under MEASURED_UP_TO runs with room,
    // so that every total said is measured where it can be
    let mut roomy = match run.device.is_cpu() {
        true => HeapMeter::new(MEASURED_UP_TO * 4).ok(),
        false => None,
    };
    let mut weighed: Vec<Weighed> = Vec::new();
    for change in changes(run, compute, limit, held, batch) {
        let Some(total) = count(&change.model, change.optimizing, compute, change.batch) else { continue };
        let counted = held.saturating_add(total);
        let on: Option<&mut dyn MemoryMeter> = match roomy.as_mut() {
            // every total said is a measurement where the CPU can hold the step
            Some(roomy) if worth_running(counted, limit) => Some(roomy),
            Some(_) => None,
            // a device's own memory: only what the count fits is run there
            None => (counted <= limit).then_some(&mut *meter),
        };
        let ran = on.map(|on| {
            let Optimizing { mixed, optimizer } = change.optimizing;
            match super::measure::peak_at(run, on, &change.model, mixed, optimizer, change.batch) {
                Some((peak, _)) => Ok((peak, peak <= limit)),
                None => Err("the changed model did not build or step here".to_owned()),
            }
        });
        weighed.push(Weighed { flags: change.flags, batch: change.batch, counted, run: ran });
    }
    weighed.sort_by_key(|w| (!w.fits(), w.measured_peak().unwrap_or(w.counted)));
    let smallest = smallest_budget(run, roomy.as_mut(), compute, (limit, held), batch);
    let mut message = failure.message.strip_suffix(GENERIC).unwrap_or(&failure.message).to_owned();
    if weighed.is_empty() {
        message.push_str("; no single change of the flags applies here");
    } else {
        let said: Vec<String> = weighed.iter().map(Weighed::said).collect();
        let how = match run.device.is_cpu() {
            true => {
                "each counted as `autobatch estimate` counts it, then run at its batch with room where the count \
                     is within twice the limit"
            }
            false => "each counted as `autobatch estimate` counts it; each the count fits run before it is said to fit",
        };
        message.push_str(&format!("; what would help, each alone ({how}): {}", said.join("; ")));
    }
    if let Some(budget) = &smallest {
        message.push_str(&format!("; {}", budget.said(run, batch)));
    }
    let mut failure = Failure { message, ..failure };
    if run.request.json {
        failure.json = Some(json!({
            "nothing_fits": {
                "before_any_step": true,
                "batch": batch,
                "limit_bytes": limit,
                "held_bytes": held,
                "changes": weighed.iter().map(Weighed::json).collect::<Vec<_>>(),
                "smallest_budget": smallest.as_ref().map(SmallestBudget::json),
                "message": failure.message,
            }
        }));
    }
    failure
}

/// The changes a user of the flags would weigh, each alone, that apply to
/// this model and are not made already.
fn changes(run: &Run, compute: Compute, limit: u64, held: u64, batch: usize) -> Vec<Changed> {
    let model = run.model;
    let optimizing = run.request.optimizing;
    let same = |flags: String, model: ModelConfig, optimizing: Optimizing| Changed { flags, model, optimizing, batch };
    let mut changes: Vec<Changed> =
        alone(model, optimizing).into_iter().map(|(flags, model, optimizing)| same(flags, model, optimizing)).collect();
    // the longest sequence the count fits, where the model has one
    if let Some(longest) = longest_fitting(model, optimizing, compute, limit, held, batch) {
        let flags = Flags::PROBE.remedy(&Change::SequenceLength { seq_len: longest as u64 }).unwrap_or_default();
        if let Some(shorter) = model.with_seq_len(longest) {
            changes.push(same(flags, shorter, optimizing));
        }
    }
    // a smaller first batch, where the search starts above one sample
    if batch > 1 && run.request.granule == 1 {
        let fits = |b: usize| count(model, optimizing, compute, b).is_some_and(|t| held.saturating_add(t) <= limit);
        if fits(1) {
            let fit = crate::model::last_fitting(1, batch, fits);
            // the flag that sets the first batch: --check's own, else --start
            let flag = if matches!(run.request.question, super::request::Question::Check { .. }) {
                "--check"
            } else {
                "--start"
            };
            changes.push(Changed { flags: format!("{flag} {fit}"), model: model.clone(), optimizing, batch: fit });
        }
    }
    changes
}

/// The changes of the flags that apply to this model whatever its length
/// and batch, each alone, with the model and training it makes: the other
/// optimizers, bf16, checkpointing, LoRA or a q4_0 base, the lean step in
/// place of eager forms.
pub(super) fn alone(model: &ModelConfig, optimizing: Optimizing) -> Vec<(String, ModelConfig, Optimizing)> {
    let mut changes = Vec::new();
    if !optimizing.mixed {
        for to in [OptimizerKind::Sgd, OptimizerKind::Lion, OptimizerKind::Adafactor, OptimizerKind::Adam8bit] {
            if to != optimizing.optimizer {
                let flags = Flags::PROBE.remedy(&Change::Optimizer { to }).unwrap_or_default();
                changes.push((flags, model.clone(), Optimizing { optimizer: to, ..optimizing }));
            }
        }
    }
    let own_float_base = model.lora().and_then(|lora| lora.base).is_some_and(|base| base.float().is_some());
    let f32_only = matches!(model, ModelConfig::ConvNet(_));
    if model.dtype() == DType::F32 && !optimizing.mixed && !own_float_base && !f32_only {
        let flags = Flags::PROBE.remedy(&Change::Precision { to: Precision::Bf16 }).unwrap_or_default();
        changes.push((flags, model.with_dtype(DType::BF16), optimizing));
    }
    if let Some((checkpointed, _)) = model.checkpointed() {
        changes.push(("--checkpointing".to_owned(), checkpointed, optimizing));
    }
    for (flags, adapted) in adapter_changes(model, optimizing) {
        changes.push((flags, adapted, optimizing));
    }
    if let Some((flags, lean)) = lean_step(model) {
        changes.push((flags, lean, optimizing));
    }
    changes
}

/// A config model that runs an eager form (`--attention eager`, `--loss
/// full`, `--ops eager`): the lean step, with the flags that make it.
pub(super) fn lean_step(model: &ModelConfig) -> Option<(String, ModelConfig)> {
    let ModelConfig::FromConfig(spec) = model else { return None };
    let (config, training) = spec.as_ref();
    let mut flags = Vec::new();
    if training.attention != models::Attention::Blocked {
        flags.push("--attention blocked");
    }
    if training.loss != models::Loss::Chunked {
        flags.push("--loss chunked");
    }
    if training.ops != models::Ops::Fused {
        flags.push("--ops fused");
    }
    if flags.is_empty() {
        return None;
    }
    let lean =
        training.clone().attention(models::Attention::Blocked).loss(models::Loss::Chunked).ops(models::Ops::Fused);
    Some((flags.join(" "), ModelConfig::FromConfig(Box::new((config.clone(), lean)))))
}

/// What a fine-tuner weighs for a config model beside the core's remedies:
/// LoRA (rank 16 on the family's targets) where every weight trains, a q4_0
/// base (QLoRA) where LoRA's base is not quantized yet; each with its flags.
pub(super) fn adapter_changes(model: &ModelConfig, optimizing: Optimizing) -> Vec<(String, ModelConfig)> {
    let ModelConfig::FromConfig(spec) = model else { return Vec::new() };
    let (config, training) = spec.as_ref();
    match &training.lora {
        None => {
            let lora = models::Lora::new(LORA_RANK, config.family.lora_targets());
            let adapted = ModelConfig::FromConfig(Box::new((config.clone(), training.clone().lora(lora))));
            vec![(format!("--lora {LORA_RANK}"), adapted)]
        }
        Some(lora) if lora.base != Some(models::BaseDtype::Q4_0) && !optimizing.mixed => model
            .with_lora(|lora| lora.base = Some(models::BaseDtype::Q4_0))
            .map(|quantized| ("--base-dtype q4_0".to_owned(), quantized))
            .into_iter()
            .collect(),
        Some(_) => Vec::new(),
    }
}

/// The budget (rounded up to a MiB) whose ceiling holds a step of `peak` bytes.
pub(super) fn budget_for(peak: u64, ceiling: autobatch::plan::Ceiling) -> u64 {
    let needed = (peak as f64 / ceiling.fraction()).ceil() as u64;
    needed.div_ceil(1 << 20).saturating_mul(1 << 20)
}

/// The longest sequence length below the model's whose count at `batch`
/// fits, where the model has a length and one does.
fn longest_fitting(
    model: &ModelConfig,
    optimizing: Optimizing,
    compute: Compute,
    limit: u64,
    held: u64,
    batch: usize,
) -> Option<usize> {
    let current = match model {
        ModelConfig::Transformer(c) => c.seq_len,
        ModelConfig::FromConfig(spec) => spec.1.seq_len,
        _ => return None,
    };
    // a twentieth of the limit to spare: a length at the count's edge would
    // be decided by the count's few percent
    let room = limit - limit / 20;
    let fits = |len: usize| {
        model
            .with_seq_len(len)
            .and_then(|shorter| count(&shorter, optimizing, compute, batch))
            .is_some_and(|total| held.saturating_add(total) <= room)
    };
    if current <= 1 || !fits(1) {
        return None;
    }
    Some(crate::model::last_fitting(1, current, fits))
}

/// A step's total at `batch`, counted: a config's step as `estimate` counts
/// it, a reference model as the pre-check does; `None` where the change is
/// refused by the model (a quantized base over projections it cannot take).
fn count(model: &ModelConfig, optimizing: Optimizing, compute: Compute, batch: usize) -> Option<u64> {
    match model {
        ModelConfig::FromConfig(spec) => {
            let (config, training) = spec.as_ref();
            let mut estimator = models::estimate::Estimator::step(config.clone(), training.clone())
                .compute(compute)
                .batch(batch)
                .optimizer(optimizing.optimizer);
            if optimizing.mixed {
                estimator = estimator.precision(Precision::Mixed);
            }
            estimator.count().ok().map(|estimate| estimate.total_bytes())
        }
        _ => {
            let footprint = model.footprint(optimizing, compute).ok()?;
            footprint.min_bytes_per_sample.checked_mul(batch as u64)?.checked_add(footprint.fixed_bytes)
        }
    }
}

/// The smallest budget (or device) at which the first batch fits as asked.
pub(super) struct SmallestBudget {
    bytes: u64,
    /// The first batch's measured peak, where the CPU ran it; else counted.
    measured_peak: Option<u64>,
}

impl SmallestBudget {
    pub(super) fn measured(peak: u64, ceiling: autobatch::plan::Ceiling) -> SmallestBudget {
        SmallestBudget { bytes: budget_for(peak, ceiling), measured_peak: Some(peak) }
    }

    pub(super) fn said(&self, run: &Run, batch: usize) -> String {
        let budget = crate::parse::flag_bytes(self.bytes);
        let (what, how) = match self.measured_peak {
            Some(peak) => ("", format!("its step measured: peak {}", Bytes(peak))),
            None => ("at least ", "counted, not run".to_owned()),
        };
        match run.device.is_cpu() {
            true => format!("the smallest budget at which batch {batch} fits: {what}--budget {budget} ({how})"),
            false => format!("batch {batch} fits on a device of {what}{} ({how})", Bytes(self.bytes)),
        }
    }

    pub(super) fn json(&self) -> serde_json::Value {
        json!({ "bytes": self.bytes, "measured_peak_bytes": self.measured_peak })
    }
}

/// The budget whose ceiling holds the first batch: its peak run on the CPU
/// with room (`roomy`) where the count is small enough to run here, else its
/// count beside what the process holds.
fn smallest_budget(
    run: &Run,
    roomy: Option<&mut HeapMeter>,
    compute: Compute,
    (limit, held): (u64, u64),
    batch: usize,
) -> Option<SmallestBudget> {
    let optimizing = run.request.optimizing;
    let counted = held.saturating_add(count(run.model, optimizing, compute, batch)?);
    let budget_for = |bytes: u64| budget_for(bytes, run.request.ceiling);
    // the smallest budget is measured where the step is small enough to run here quickly
    let measured = roomy.filter(|_| worth_running(counted, limit.saturating_mul(2))).and_then(|roomy| {
        super::measure::peak_at(run, roomy, run.model, optimizing.mixed, optimizing.optimizer, batch)
            .map(|(peak, _)| peak)
    });
    Some(match measured {
        Some(peak) => SmallestBudget { bytes: budget_for(peak), measured_peak: Some(peak) },
        None => SmallestBudget { bytes: budget_for(counted), measured_peak: None },
    })
}
