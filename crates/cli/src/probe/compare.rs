//! `--compare`: the model as it is and with each remedy that applies, side by side.

use autobatch::estimate::{OptimizerKind, Precision, StaticMemory};
use autobatch::{Bytes, MemoryMeter};
use autobatch_models as models;
use autobatch_models::trainer::ReferenceWorkload;
use candle_core::DType;

use crate::failure::Failure;
use crate::model::ModelConfig;
use crate::progress::Progress;

use super::context::Run;

/// The model as it is and with each remedy that applies, tuned side by side.
pub fn compare(run: &Run, meter: &mut dyn MemoryMeter) -> Result<(), Failure> {
    let Run { args, tuner, model, device, device_words: on, .. } = *run;
    use autobatch::Variant;
    // what the analytical model expects of each remedy's bytes per sample,
    // relative to the model as it is: bf16 halves activations; full
    // recomputation keeps what the estimate's formula keeps (Korthikanti et
    // al.: 2·s·h of a layer's 34·s·h + 5·a·s² bytes), and holds one layer's
    // whole activations again while the backward pass recomputes it
    const BF16: f64 = 0.5;
    let checkpointing = |(layers, hidden, heads, seq_len): (usize, usize, usize, usize)| {
        let shape = autobatch::estimate::TransformerShape {
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
    };
    let as_is_mixed = args.model.precision() == Precision::Mixed;
    let optimizer = args.model.optimizer;
    let mut configs: Vec<(String, ModelConfig, Option<f64>, bool, OptimizerKind)> =
        vec![("as it is".to_owned(), model.clone(), Some(1.0), as_is_mixed, optimizer)];
    let with_dtype = |dtype| model.with_dtype(dtype);
    let is_f32 = model.dtype() == DType::F32;
    if let Some((checkpointed, shape)) = model.checkpointed() {
        let factor = checkpointing(shape);
        configs.push(("gradient checkpointing".to_owned(), checkpointed.clone(), Some(factor), as_is_mixed, optimizer));
        if is_f32 {
            let both = checkpointed.with_dtype(DType::BF16);
            configs.push(("checkpointing + bf16".to_owned(), both, Some(factor * BF16), false, optimizer));
        }
    }
    // candle's CPU conv2d has no bf16: the convnet's bf16 runs on CUDA only
    let bf16_runs = !(matches!(model, ModelConfig::ConvNet(_)) && device.is_cpu());
    if is_f32 && bf16_runs {
        configs.insert(1, ("bf16".to_owned(), with_dtype(DType::BF16), Some(BF16), false, optimizer));
        // f32 adapters beside a base of its own dtype have no bf16 variables to keep masters of
        if model.lora().is_none_or(|lora| lora.base.is_none()) {
            let mixed = ("mixed precision".to_owned(), with_dtype(DType::BF16), Some(BF16), true, OptimizerKind::AdamW);
            configs.insert(2, mixed);
        }
    }
    // a LoRA model: each other base, the adapters in f32; and without the
    // frozen-gradient fix (candle's own matmul under a dense base)
    if let Some(lora) = model.lora().cloned() {
        for base in models::BaseDtype::ALL.into_iter().filter(|&base| Some(base) != lora.base) {
            if lora.base.is_none() && base.float() == Some(model.dtype()) {
                continue; // the model as it is, but for its adapters' dtype
            }
            let factor = if base == models::BaseDtype::Bf16 && is_f32 { BF16 } else { 1.0 };
            let Some(variant) = model.with_lora(|lora| lora.base = Some(base)) else { continue };
            configs.push((format!("{base} base, f32 adapters"), variant, Some(factor), false, optimizer));
        }
        if lora.base.is_none_or(|base| base.float().is_some()) && !lora.frozen_gradients {
            if let Some(variant) = model.with_lora(|lora| lora.frozen_gradients = true) {
                configs.push((
                    "frozen gradients kept (candle's matmul)".to_owned(),
                    variant,
                    Some(1.0),
                    as_is_mixed,
                    optimizer,
                ));
            }
        }
    }
    // a config model's step the other way: the eager forms beside the lean
    // default (or the lean step beside the eager forms asked for)
    if let Some((name, variant)) = model.other_step() {
        configs.insert(1, (name, variant, None, as_is_mixed, optimizer));
    }
    // the lean optimizers change the state, not the bytes per sample
    if !as_is_mixed {
        for kind in [OptimizerKind::Lion, OptimizerKind::Adafactor, OptimizerKind::Adam8bit]
            .into_iter()
            .filter(|&k| k != optimizer)
        {
            configs.push((format!("{} optimizer", kind.name()), model.clone(), Some(1.0), false, kind));
        }
    }
    // where the change is known to the byte (an optimizer's state, master
    // weights: the same activations, a state the estimate counts), a variant's
    // search starts at the answer an earlier one's measured line predicts
    let parameters = model.build_with(device, as_is_mixed, optimizer)?.parameter_count() as u64;
    let precision = |mixed: bool, config: &ModelConfig| match (mixed, config.dtype()) {
        (true, _) => Precision::Mixed,
        (false, DType::BF16) => Precision::Bf16,
        (false, _) => Precision::Fp32,
    };
    let state = |mixed: bool, config: &ModelConfig, kind: OptimizerKind| {
        StaticMemory::new(parameters, precision(mixed, config), kind).map(|state| state.total() as f64)
    };
    let mut variants = Vec::with_capacity(configs.len());
    for (index, (name, config, _, mixed, kind)) in configs.iter().enumerate() {
        let same_activations_as =
            configs[..index].iter().position(|(_, other, _, _, _)| same_activations(other, config));
        let mut variant =
            Variant::lazy(name.clone(), move || config.build_with(device, *mixed, *kind).map(ReferenceStep));
        if let Some(like) = same_activations_as {
            let (_, like_config, _, like_mixed, like_kind) = &configs[like];
            let change = state(*mixed, config, *kind)? - state(*like_mixed, like_config, *like_kind)?;
            variant = variant.expecting(like, 1.0, change);
        }
        variants.push(variant);
    }
    let tuner = tuner.clone().observer(Progress::shared(args.output.json));
    let compared = tuner.compare(variants, meter);
    drop(tuner); // the live rows end before the table prints
    let mut comparison = compared?;
    let base = comparison.rows.first().and_then(|row| row.memory()).map(|(per_sample, _)| per_sample);
    for (row, (_, _, factor, _, _)) in comparison.rows.iter_mut().zip(&configs).skip(1) {
        row.predicted_bytes_per_sample = base.zip(*factor).map(|(base, factor)| base * factor);
    }
    let nothing_fits = comparison.rows.iter().all(|row| row.plan.is_none());
    if let Some(path) = &args.output.plot {
        let bars: Vec<crate::plot::VariantBar> = comparison
            .rows
            .iter()
            .map(|row| crate::plot::VariantBar {
                name: row.name.clone(),
                largest_batch: row.largest_batch(),
                bytes_per_sample: row.memory().map(|m| m.0),
                estimated_bytes_per_sample: row.predicted_bytes_per_sample,
            })
            .collect();
        let title = format!("remedies for the {} on {on}", model.name());
        crate::plot::compare(path, &title, &bars)?;
    }
    if args.output.json {
        let rows: Vec<serde_json::Value> = comparison
            .rows
            .iter()
            .map(|row| {
                serde_json::json!({
                    "variant": row.name,
                    "largest_batch": row.plan.as_ref().map(|p| p.largest_batch),
                    "bytes_per_sample": row.memory().map(|m| m.0),
                    "fixed_bytes": row.memory().map(|m| m.1),
                    "estimated_bytes_per_sample": row.predicted_bytes_per_sample,
                    "started_at": row.started_at,
                    "steps": row.plan.as_ref().map(|p| p.trials.len()),
                    "step_time_s": row.step_time().map(|t| t.as_secs_f64()),
                    "samples_per_second": row.samples_per_second(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows).expect("plain values serialize"));
    } else {
        print!("{comparison}");
    }
    if nothing_fits {
        return Err(Failure::nothing_fits(format!(
            "nothing fits: not even the smallest batch of any variant stays under the ceiling of {} of {}",
            args.search.ceiling,
            Bytes(meter.capacity()?)
        )));
    }
    Ok(())
}

/// Whether two models run the same activations: the same shape, dtype and
/// checkpointing (they may differ in optimizer or master weights).
fn same_activations(a: &ModelConfig, b: &ModelConfig) -> bool {
    match (a, b) {
        (ModelConfig::Transformer(a), ModelConfig::Transformer(b)) => a == b,
        (ModelConfig::Mlp(a), ModelConfig::Mlp(b)) => a == b,
        (ModelConfig::ConvNet(a), ModelConfig::ConvNet(b)) => a == b,
        (ModelConfig::Pretrained(a), ModelConfig::Pretrained(b)) => a == b,
        _ => false,
    }
}

/// A reference workload as a plain `Workload` for [`Tuner::compare`](autobatch::Tuner::compare).
struct ReferenceStep(Box<dyn ReferenceWorkload>);

impl autobatch::Workload for ReferenceStep {
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        self.0.step(batch)
    }
    fn accumulating_step(&mut self, batch: usize) -> candle_core::Result<()> {
        self.0.accumulating_step(batch)
    }
    fn can_accumulate(&self) -> bool {
        self.0.can_accumulate()
    }
    fn profile(&self) -> Option<autobatch::estimate::Setup> {
        self.0.profile()
    }
    fn graph_tensors(&self) -> Option<Vec<autobatch::GraphTensor>> {
        self.0.graph_tensors()
    }
}
