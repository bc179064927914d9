//! A plan in JSON: one flat object whose keys are the plan's accessors' names
//! (`micro_batch`, `accumulation_steps`, `ceiling`, …), so that a script reads
//! `plan["micro_batch"]` whatever the split, and plans written before the
//! split was one value read back.

use serde::{Deserialize, Serialize};

use super::{
    Accumulation, CacheHit, Distributed, EvaluationPlan, MeasuredGraph, MemoryModel, Plan, RankSplit, SearchLimit,
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
            ceiling: plan.ceiling(),
            multiple_of: plan.multiple_of(),
            strategy: plan.strategy(),
            proven_largest: plan.proven_largest(),
            measured_graph: plan.measured_graph(),
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
                ceiling: record.ceiling,
                multiple_of: record.multiple_of,
                strategy: record.strategy,
            },
            trials: record.trials,
            warnings: record.warnings,
            memory_model: record.memory_model,
            evaluation: record.evaluation,
            throughput: record.throughput,
            tuning: record.tuning,
            cache: record.cached.then_some(CacheHit { checks: record.cache_checks }),
            distributed,
            device: record.device,
        };
        let read = (
            plan.micro_batch(),
            plan.accumulation_steps(),
            plan.world_size(),
            plan.effective_batch(),
            plan.target_effective_batch(),
            plan.proven_largest(),
            plan.measured_graph(),
        );
        let written = (
            record.micro_batch,
            record.accumulation_steps,
            record.world_size,
            record.effective_batch,
            record.target_effective_batch,
            record.proven_largest,
            record.measured_graph,
        );
        if read != written {
            return Err(format!(
                "the plan's numbers disagree with its split: (micro_batch, accumulation_steps, world_size, \
                 effective_batch, target_effective_batch, proven_largest, measured_graph) are {written:?}, the split \
                 and warnings say {read:?}"
            ));
        }
        Ok(plan)
    }
}
