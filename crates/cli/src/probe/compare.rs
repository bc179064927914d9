//! `--compare`: the model as it is and with each remedy that applies, side by side.

use crate::output::{out, outln};
use autobatch::estimate::{OptimizerKind, Precision, StaticMemory, TransformerShape};
use autobatch::{Bytes, Comparison, MemoryMeter, ModelVariant};
use autobatch_models as models;
use candle_core::DType;

use crate::failure::Failure;
use crate::model::ModelConfig;
use crate::progress::Progress;

use super::context::Run;
use super::measure::ReferenceStep;
use crate::model::Optimizing;

/// What the analytical model expects of bf16's bytes per sample, relative
/// to f32: half.
const BF16: f64 = 0.5;

/// One variant the comparison tunes: a model and how it trains.
struct Candidate {
    name: String,
    config: ModelConfig,
    /// What the estimate expects of its bytes per sample, relative to the
    /// model as it is (none where the estimate has no word for it).
    factor: Option<f64>,
    mixed: bool,
    optimizer: OptimizerKind,
}

/// The model as it is and with each remedy that applies, tuned side by side.
pub fn compare(run: &Run, meter: &mut dyn MemoryMeter) -> Result<(), Failure> {
    let Run { request, model, device, device_words: on, .. } = *run;
    let candidates = candidates(request.optimizing, model, device);
    let mut variants = variants(&candidates, model, device, request.optimizing)?;
    let tuner = request.tuner.clone().observer(Progress::shared(request.json));
    let compared = tuner.search(&mut variants, meter).compare();
    drop(tuner); // the live rows end before the table prints
    let mut comparison = compared?;
    let base = comparison.rows.first().and_then(|row| row.memory()).map(|(per_sample, _)| per_sample);
    for (row, candidate) in comparison.rows.iter_mut().zip(&candidates).skip(1) {
        row.predicted_bytes_per_sample = base.zip(candidate.factor).map(|(base, factor)| base * factor);
    }
    if let Some(path) = &request.plot {
        crate::plot::compare(path, &format!("remedies for the {} on {on}", model.name()), &bars(&comparison))?;
    }
    if request.json {
        outln!("{}", serde_json::to_string_pretty(&json(&comparison)).expect("plain values serialize"));
    } else {
        out!("{comparison}");
    }
    if comparison.rows.iter().all(|row| row.plan.is_none()) {
        return Err(Failure::nothing_fits(format!(
            "nothing fits: not even the smallest batch of any variant stays under the ceiling of {} of {}",
            request.ceiling,
            Bytes(meter.capacity()?)
        )));
    }
    Ok(())
}

/// The model as it is, then each remedy that applies to it: the other step
/// of a config model, bf16 and mixed precision, checkpointing, the other
/// LoRA bases, the lean optimizers.
fn candidates(optimizing: Optimizing, model: &ModelConfig, device: &candle_core::Device) -> Vec<Candidate> {
    let Optimizing { mixed, optimizer } = optimizing;
    let candidate = |name: &str, config: ModelConfig, factor: Option<f64>, mixed: bool, optimizer: OptimizerKind| {
        Candidate { name: name.to_owned(), config, factor, mixed, optimizer }
    };
    let mut candidates = vec![candidate("as it is", model.clone(), Some(1.0), mixed, optimizer)];
    // a config model's step the other way: the eager forms beside the lean
    // default (or the lean step beside the eager forms asked for)
    if let Some((name, variant)) = model.other_step() {
        candidates.push(candidate(&name, variant, None, mixed, optimizer));
    }
    let is_f32 = model.dtype() == DType::F32;
    // candle's CPU conv2d has no bf16: the convnet's bf16 runs on CUDA only
    let bf16_runs = !(matches!(model, ModelConfig::ConvNet(_)) && device.is_cpu());
    if is_f32 && bf16_runs {
        candidates.push(candidate("bf16", model.with_dtype(DType::BF16), Some(BF16), false, optimizer));
        // f32 adapters beside a base of its own dtype have no bf16 variables to keep masters of
        if model.lora().is_none_or(|lora| lora.base.is_none()) {
            let bf16 = model.with_dtype(DType::BF16);
            candidates.push(candidate("mixed precision", bf16, Some(BF16), true, OptimizerKind::AdamW));
        }
    }
    if let Some((checkpointed, shape)) = model.checkpointed() {
        let factor = counted_factor(model, &checkpointed).unwrap_or_else(|| checkpointing_factor(shape));
        candidates.push(candidate("gradient checkpointing", checkpointed.clone(), Some(factor), mixed, optimizer));
        if is_f32 {
            let both = checkpointed.with_dtype(DType::BF16);
            candidates.push(candidate("checkpointing + bf16", both, Some(factor * BF16), false, optimizer));
        }
    }
    candidates.extend(lora_candidates(model, mixed, optimizer));
    // the lean optimizers change the state, not the bytes per sample
    if !mixed {
        let lean = [OptimizerKind::Lion, OptimizerKind::Adafactor, OptimizerKind::Adam8bit];
        for kind in lean.into_iter().filter(|&kind| kind != optimizer) {
            candidates.push(candidate(&format!("{} optimizer", kind.name()), model.clone(), Some(1.0), false, kind));
        }
    }
    candidates
}

/// A LoRA model's remedies: each other base, the adapters in f32; and the
/// base's gradients kept (candle's own matmul under a dense base), to show
/// what the frozen-gradient fix saves.
fn lora_candidates(model: &ModelConfig, mixed: bool, optimizer: OptimizerKind) -> Vec<Candidate> {
    let Some(lora) = model.lora().cloned() else { return Vec::new() };
    let is_f32 = model.dtype() == DType::F32;
    let mut candidates = Vec::new();
    for base in models::BaseDtype::ALL.into_iter().filter(|&base| Some(base) != lora.base) {
        if lora.base.is_none() && base.float() == Some(model.dtype()) {
            continue; // the model as it is, but for its adapters' dtype
        }
        let factor = if base == models::BaseDtype::Bf16 && is_f32 { BF16 } else { 1.0 };
        let Some(config) = model.with_lora(|lora| lora.base = Some(base)) else { continue };
        let name = format!("{base} base, f32 adapters");
        candidates.push(Candidate { name, config, factor: Some(factor), mixed: false, optimizer });
    }
    if lora.base.is_none_or(|base| base.float().is_some())
        && !lora.frozen_gradients
        && let Some(config) = model.with_lora(|lora| lora.frozen_gradients = true)
    {
        let name = "frozen gradients kept (candle's matmul)".to_owned();
        candidates.push(Candidate { name, config, factor: Some(1.0), mixed, optimizer });
    }
    candidates
}

/// For a config's model, what `changed` keeps of its bytes per sample by the
/// config's own count of its step (the lean step's ops, not the textbook
/// transformer's activations).
fn counted_factor(model: &ModelConfig, changed: &ModelConfig) -> Option<f64> {
    let (ModelConfig::FromConfig(base), ModelConfig::FromConfig(changed)) = (model, changed) else { return None };
    let per_sample = |(config, training): &(models::Config, models::Training)| config.bytes_per_sample(training).ok();
    let (base, changed) = (per_sample(base)?, per_sample(changed)?);
    (base > 0).then(|| changed as f64 / base as f64)
}

/// What full recomputation keeps of the activations, by the estimate's
/// formula (Korthikanti et al.: 2·s·h of a layer's 34·s·h + 5·a·s² bytes),
/// plus one layer's whole activations held again while the backward pass
/// recomputes it.
fn checkpointing_factor((layers, hidden, heads, seq_len): (usize, usize, usize, usize)) -> f64 {
    let shape = TransformerShape {
        layers: layers as u64,
        hidden: hidden as u64,
        heads: heads as u64,
        seq_len: seq_len as u64,
        batch: 1,
    };
    let bytes = |recompute| shape.activation_bytes(1, recompute).map(|bytes| bytes as f64);
    match (bytes(autobatch::estimate::Recompute::None), bytes(autobatch::estimate::Recompute::Full)) {
        (Ok(kept), Ok(recomputed)) if kept > 0.0 => (recomputed + kept / layers as f64) / kept,
        _ => 1.0,
    }
}

/// The candidates as the tuner's variants, built when their turn comes.
/// Where the change is known to the byte (an optimizer's state, master
/// weights: the same activations, a state the estimate counts), a variant's
/// search starts at the answer an earlier one's measured line predicts.
fn variants<'a>(
    candidates: &'a [Candidate],
    model: &ModelConfig,
    device: &'a candle_core::Device,
    optimizing: Optimizing,
) -> Result<Vec<ModelVariant<'a>>, Failure> {
    let parameters = model.build_with(device, optimizing.mixed, optimizing.optimizer)?.parameter_count() as u64;
    let state = |candidate: &Candidate| {
        let precision = match (candidate.mixed, candidate.config.dtype()) {
            (true, _) => Precision::Mixed,
            (false, DType::BF16) => Precision::Bf16,
            (false, _) => Precision::Fp32,
        };
        StaticMemory::new(parameters, precision, candidate.optimizer).map(|state| state.total() as f64)
    };
    let mut variants = Vec::with_capacity(candidates.len());
    for (index, candidate) in candidates.iter().enumerate() {
        let Candidate { name, config, mixed, optimizer, .. } = candidate;
        let mut variant =
            ModelVariant::lazy(name.clone(), move || config.build_with(device, *mixed, *optimizer).map(ReferenceStep));
        if let Some(like) = candidates[..index].iter().position(|other| same_activations(&other.config, config)) {
            variant = variant.expecting(like, 1.0, state(candidate)? - state(&candidates[like])?);
        }
        variants.push(variant);
    }
    Ok(variants)
}

/// Each variant's bar of the `--plot` chart.
fn bars(comparison: &Comparison) -> Vec<crate::plot::VariantBar> {
    comparison
        .rows
        .iter()
        .map(|row| crate::plot::VariantBar {
            name: row.name.clone(),
            largest_batch: row.largest_batch(),
            bytes_per_sample: row.memory().map(|m| m.0),
            estimated_bytes_per_sample: row.predicted_bytes_per_sample,
        })
        .collect()
}

/// The comparison as JSON: a row a variant.
fn json(comparison: &Comparison) -> serde_json::Value {
    comparison
        .rows
        .iter()
        .map(|row| {
            serde_json::json!({
                "variant": row.name,
                "largest_batch": row.plan.as_ref().map(|p| p.largest_batch()),
                "bytes_per_sample": row.memory().map(|m| m.0),
                "fixed_bytes": row.memory().map(|m| m.1),
                "estimated_bytes_per_sample": row.predicted_bytes_per_sample,
                "started_at": row.started_at,
                "steps": row.plan.as_ref().map(|p| p.trials().len()),
                "step_time_s": row.step_time().map(|t| t.as_secs_f64()),
                "samples_per_second": row.samples_per_second(),
            })
        })
        .collect()
}

/// Whether two models run the same activations: the same shape, dtype and
/// checkpointing (they may differ in optimizer or master weights).
fn same_activations(a: &ModelConfig, b: &ModelConfig) -> bool {
    match (a, b) {
        (ModelConfig::Transformer(a), ModelConfig::Transformer(b)) => a == b,
        (ModelConfig::Mlp(a), ModelConfig::Mlp(b)) => a == b,
        (ModelConfig::ConvNet(a), ModelConfig::ConvNet(b)) => a == b,
        (ModelConfig::FromConfig(a), ModelConfig::FromConfig(b)) => a == b,
        _ => false,
    }
}
