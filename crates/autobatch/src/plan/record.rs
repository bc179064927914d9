//! A plan in JSON: one flat object whose keys are the plan's accessors' names
//! (`micro_batch`, `accumulation_steps`, `ceiling`, …), so that a script reads
//! `plan["micro_batch"]` whatever the split, and plans written before the
//! split was one value read back.

use serde::{Deserialize, Serialize};

use super::{
    Accumulation, Distributed, EvaluationPlan, MeasuredGraph, MemoryModel, Plan, RankSplit, SearchLimit,
    SearchSettings, Split, ThroughputChoice, Trial, TuningCost, Warning,
};
use crate::search::Strategy;

/// [`Plan`] as it is written: the split's numbers side by side with the
/// value they come from (`accumulation` or `ranks`), which is what reading
/// it back uses.
#[derive(Serialize, Deserialize)]
pub(super) struct PlanRecord {
    largest_batch: usize,
    micro_batch: usize,
    accumulation_steps: usize,
    world_size: usize,
    effective_batch: usize,
    target_effective_batch: Option<usize>,
    peak_bytes: u64,
    #[serde(default)]
    throughput: Option<ThroughputChoice>,
    capacity_bytes: u64,
    ceiling: f64,
    multiple_of: usize,
    strategy: Strategy,
    proven_largest: bool,
    #[serde(default)]
    stopped_by: Option<SearchLimit>,
    #[serde(default)]
    measured_graph: MeasuredGraph,
    trials: Vec<Trial>,
    accumulation: Option<Accumulation>,
    warnings: Vec<Warning>,
    memory_model: Option<MemoryModel>,
    evaluation: Option<EvaluationPlan>,
    #[serde(default)]
    cached: bool,
    #[serde(default)]
    cache_checks: usize,
    #[serde(default)]
    tuning: TuningCost,
    #[serde(default)]
    rank_largest_batch: Option<usize>,
    #[serde(default)]
    accumulation_peak_bytes: Option<u64>,
    #[serde(default)]
    ranks: Option<RankSplit>,
    #[serde(default)]
    rank: Option<usize>,
    #[serde(default)]
    device: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    untrained_gradient_bytes: u64,
}

fn is_zero(bytes: &u64) -> bool {
    *bytes == 0
}

impl From<Plan> for PlanRecord {
    fn from(plan: Plan) -> PlanRecord {
        PlanRecord {
            largest_batch: plan.largest_batch,
            micro_batch: plan.micro_batch(),
            accumulation_steps: plan.accumulation_steps(),
            world_size: plan.world_size(),
            effective_batch: plan.effective_batch(),
            target_effective_batch: plan.target_effective_batch(),
            peak_bytes: plan.peak_bytes,
            capacity_bytes: plan.capacity_bytes(),
            ceiling: plan.ceiling().fraction(),
            multiple_of: plan.multiple_of(),
            strategy: plan.strategy(),
            proven_largest: plan.proven_largest(),
            measured_graph: MeasuredGraph::of(plan.complete_graph()),
            cached: plan.cached(),
            cache_checks: plan.cache_checks(),
            rank_largest_batch: plan.rank_largest_batch(),
            rank: plan.rank(),
            accumulation_peak_bytes: plan.accumulation_peak_bytes(),
            accumulation: plan.accumulation().cloned(),
            ranks: plan.ranks().cloned(),
            stopped_by: plan.stopped_by,
            throughput: plan.throughput,
            trials: plan.trials,
            warnings: plan.warnings,
            memory_model: plan.memory_model,
            evaluation: plan.evaluation,
            tuning: plan.tuning,
            device: plan.device,
            untrained_gradient_bytes: plan.untrained_gradient_bytes,
        }
    }
}

impl TryFrom<PlanRecord> for Plan {
    type Error = String;

    /// The plan the record describes, when its numbers agree with the split
    /// they come from (a hand-edited record that says two things is refused).
    fn try_from(record: PlanRecord) -> Result<Plan, String> {
        let accumulating_peak_bytes = record.accumulation_peak_bytes;
        let split = match (record.accumulation, record.ranks) {
            (Some(_), Some(_)) => return Err("a plan has an accumulation split or uneven ranks, not both".into()),
            (Some(accumulation), None) => Split::Accumulated { accumulation, accumulating_peak_bytes },
            (None, Some(ranks)) => {
                let to_target = record.target_effective_batch.is_some();
                Split::Uneven { ranks, to_target, accumulating_peak_bytes }
            }
            (None, None) => Split::Single { micro_batch: record.micro_batch, world_size: record.world_size },
        };
        let distributed = match (record.rank, record.rank_largest_batch) {
            (Some(rank), Some(rank_largest_batch)) => Some(Distributed { rank, rank_largest_batch }),
            (None, None) => None,
            _ => return Err("`rank` and `rank_largest_batch` come together".into()),
        };
        let plan = Plan {
            largest_batch: record.largest_batch,
            peak_bytes: record.peak_bytes,
            stopped_by: record.stopped_by,
            split,
            search: SearchSettings {
                capacity_bytes: record.capacity_bytes,
                // the record's key, not the builder: a plan file is read here
                ceiling: crate::plan::Ceiling::new(record.ceiling)
                    .map_err(|_| format!("`ceiling` is {}: it must be a fraction in (0, 1]", record.ceiling))?,
                multiple_of: record.multiple_of,
                strategy: record.strategy,
            },
            trials: record.trials,
            warnings: record.warnings,
            memory_model: record.memory_model,
            evaluation: record.evaluation,
            throughput: record.throughput,
            tuning: record.tuning,
            cache: record.cached.then_some(record.cache_checks),
            distributed,
            device: record.device,
            untrained_gradient_bytes: record.untrained_gradient_bytes,
        };
        let read = [
            ("micro-batch", plan.micro_batch().to_string()),
            ("accumulation steps", plan.accumulation_steps().to_string()),
            ("world size", plan.world_size().to_string()),
            ("effective batch", plan.effective_batch().to_string()),
            ("target effective batch", format!("{:?}", plan.target_effective_batch())),
            ("proven largest", plan.proven_largest().to_string()),
            ("measured graph", format!("{:?}", MeasuredGraph::of(plan.complete_graph()))),
        ];
        let written = [
            record.micro_batch.to_string(),
            record.accumulation_steps.to_string(),
            record.world_size.to_string(),
            record.effective_batch.to_string(),
            format!("{:?}", record.target_effective_batch),
            record.proven_largest.to_string(),
            format!("{:?}", record.measured_graph),
        ];
        let disagreements: Vec<String> = read
            .iter()
            .zip(&written)
            .filter(|((_, read), written)| read != *written)
            .map(|((name, read), written)| format!("{name} {written} (the split says {read})"))
            .collect();
        if !disagreements.is_empty() {
            return Err(format!("the plan's numbers disagree with its split: {}", disagreements.join(", ")));
        }
        check_measured(&plan)?;
        Ok(plan)
    }
}

/// What a plan says it measured, checked against itself: a plan read back (a
/// cache entry, a file edited by hand) is an input like any other, and one
/// that claims what no run could have measured is refused, not served.
fn check_measured(plan: &Plan) -> Result<(), String> {
    let ceiling = plan.ceiling();
    let capacity = plan.capacity_bytes();
    if capacity == 0 {
        return Err("capacity_bytes is 0: a device has some memory".to_owned());
    }
    if plan.largest_batch == 0 || plan.multiple_of() == 0 {
        return Err(format!(
            "largest_batch {} and multiple_of {} must be at least 1",
            plan.largest_batch,
            plan.multiple_of()
        ));
    }
    let limit = ceiling.limit_bytes(capacity);
    if plan.peak_bytes > limit {
        return Err(format!(
            "peak_bytes {} is over the limit it claims to fit under, {limit} ({} of {capacity} bytes)",
            plan.peak_bytes, ceiling
        ));
    }
    let measured = plan
        .trials
        .iter()
        .any(|t| t.batch == plan.largest_batch && t.outcome.fits() && t.peak_bytes == Some(plan.peak_bytes));
    if !measured {
        return Err(format!(
            "no trial of batch {} fits with the peak it claims ({} bytes): the plan was not measured",
            plan.largest_batch, plan.peak_bytes
        ));
    }
    // "proven largest" is a claim about the next batch up: its failed trial is the evidence
    let next = plan.largest_batch.saturating_add(plan.multiple_of());
    let shown = plan.trials.iter().any(|t| t.batch == next && !t.outcome.fits());
    if plan.proven_largest() && !shown {
        return Err(format!(
            "it says batch {} is the proven largest, and no trial of batch {next} failed: a claim without its \
             evidence",
            plan.largest_batch
        ));
    }
    Ok(())
}
