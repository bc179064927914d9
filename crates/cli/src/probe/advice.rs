//! Nothing fits: each change the advice names, made and run at the smallest
//! batch, so that what the tool advises is what the change does on this
//! model (an estimate of a config model's lean step, of an optimizer's update
//! or of checkpointing can be far from the step's measured peak).

use autobatch::estimate::{Change, OptimizerKind, Precision};
use autobatch::{Bytes, MemoryMeter};
use candle_core::DType;

use crate::failure::{Failure, Flags};
use crate::model::{ModelConfig, Optimizing};
use serde_json::json;

use super::context::Run;
use super::measure::peak_at;

/// `err`, a probe's failure, with its advice measured where it is a
/// nothing-fits at a batch (not at a size): each remedy's total the peak of
/// the changed model's step at that batch, largest saving first; for a
/// config model that runs an eager form, the lean step measured too.
pub fn measured(run: &Run, meter: &mut dyn MemoryMeter, err: autobatch::Error) -> Failure {
    let mut err = crate::model::only_applicable_advice(run.model, err);
    let autobatch::Error::NothingFits { batch, size: None, peak_bytes: Some(peak), limit_bytes, remedies, .. } =
        &mut err
    else {
        return Failure::from(err);
    };
    let (batch, peak, limit) = (*batch, *peak, *limit_bytes);
    for remedy in remedies.iter_mut() {
        let Some((config, mixed, optimizer)) = changed(run, &remedy.change) else { continue };
        if let Some((total, fits)) = peak_at(run, meter, &config, mixed, optimizer, batch) {
            remedy.total_bytes = total;
            remedy.saves_bytes = peak.saturating_sub(total);
            remedy.fits = fits && total <= limit;
            remedy.measured = true;
        }
    }
    remedies.sort_by_key(|remedy| (!remedy.fits, std::cmp::Reverse(remedy.saves_bytes)));
    let mut changes: Vec<serde_json::Value> = remedies
        .iter()
        .map(|remedy| {
            json!({
                "flags": Flags::PROBE.remedy(&remedy.change),
                "change": remedy.change.to_string(),
                "total_bytes": remedy.total_bytes,
                "measured": remedy.measured,
                "fits": remedy.fits,
            })
        })
        .collect();
    let advised: Vec<String> = remedies.iter().filter_map(|remedy| Flags::PROBE.remedy(&remedy.change)).collect();
    let mut failure = Failure::from(err);
    if let Some(lean) = lean_step(run, meter, batch, peak, limit) {
        failure.message.push_str(&lean);
    }
    // every other change a user of the flags weighs, each alone, run alike:
    // the estimate's remedies leave some out (LoRA, a quantized base, and
    // any whose counted saving was small)
    let lean = super::refusal::lean_step(run.model).map(|(flags, _)| flags);
    for (flags, changed, Optimizing { mixed, optimizer }) in super::refusal::alone(run.model, run.request.optimizing) {
        if advised.contains(&flags) || lean.as_ref() == Some(&flags) {
            continue;
        }
        let Some((total, fits)) = peak_at(run, meter, &changed, mixed, optimizer, batch) else { continue };
        let fits = fits && total <= limit;
        let verdict = if fits { "fits" } else { "still over" };
        failure.message.push_str(&format!(
            "; {flags}: measured {} at batch {batch}, saves {} ({verdict})",
            Bytes(total),
            Bytes(peak.saturating_sub(total))
        ));
        changes.push(json!({ "flags": flags, "total_bytes": total, "measured": true, "fits": fits }));
    }
    let smallest = super::refusal::SmallestBudget::measured(peak, run.request.ceiling);
    failure.message.push_str(&format!("; {}", smallest.said(run, batch)));
    if run.request.json {
        failure.json = Some(json!({
            "nothing_fits": {
                "before_any_step": false,
                "batch": batch,
                "peak_bytes": peak,
                "limit_bytes": limit,
                "changes": changes,
                "smallest_budget": smallest.json(),
                "message": failure.message,
            }
        }));
    }
    failure
}

/// The model `change` makes, with its master weights and optimizer; `None`
/// where one device cannot run it (ZeRO's ranks).
fn changed(run: &Run, change: &Change) -> Option<(ModelConfig, bool, OptimizerKind)> {
    let model = run.model;
    let Optimizing { mixed, optimizer } = run.request.optimizing;
    Some(match change {
        Change::Precision { to: Precision::Mixed } => (model.with_dtype(DType::BF16), true, OptimizerKind::AdamW),
        Change::Precision { to: Precision::Bf16 } => (model.with_dtype(DType::BF16), false, optimizer),
        Change::Precision { to: Precision::Fp32 } => (model.with_dtype(DType::F32), false, optimizer),
        Change::Optimizer { to } => (model.clone(), false, *to),
        Change::GradientCheckpointing => (model.checkpointed()?.0, mixed, optimizer),
        Change::SequenceLength { seq_len } => (model.with_seq_len(usize::try_from(*seq_len).ok()?)?, mixed, optimizer),
        _ => return None,
    })
}

/// For a config model that runs an eager form (`--attention eager`, `--loss
/// full`, `--ops eager`): the lean step, measured, said as the flags that
/// make it.
fn lean_step(run: &Run, meter: &mut dyn MemoryMeter, batch: usize, peak: u64, limit: u64) -> Option<String> {
    let (flags, model) = super::refusal::lean_step(run.model)?;
    let Optimizing { mixed, optimizer } = run.request.optimizing;
    let (total, fits) = peak_at(run, meter, &model, mixed, optimizer, batch)?;
    let verdict = if fits && total <= limit { "fits" } else { "still over" };
    Some(format!(
        "; the lean step instead of the eager forms ({flags}): measured {} at batch {batch}, saves {} ({verdict})",
        Bytes(total),
        Bytes(peak.saturating_sub(total)),
    ))
}
