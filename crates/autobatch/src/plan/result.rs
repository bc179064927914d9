//! The result of a tuning run: [`Plan`], what it was searched with, what it cost.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::*;
use crate::search::Strategy;

/// The result of a tuning run: the largest batch seen to fit and the training
/// split derived from it.
///
/// `micro_batch() × accumulation_steps() × world_size() = effective_batch()`
/// holds, except for uneven ranks ([`Tuner::uneven_ranks`](crate::Tuner::uneven_ranks)):
/// there [`ranks`](Plan::ranks) says what each rank runs, and their samples
/// add up to `effective_batch()`. The split is one value, [`split`](Plan::split);
/// the accessors read it. In JSON ([`to_json`](Plan::to_json)) a plan is one
/// flat object whose keys are the accessors' names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(into = "record::PlanRecord", try_from = "record::PlanRecord")]
#[non_exhaustive]
pub struct Plan {
    /// The search result: the largest batch that was run and seen to fit.
    /// With [`Search::across`](crate::Search::across): the
    /// one every rank agreed on.
    pub(crate) largest_batch: usize,
    /// Measured device-wide peak at `largest_batch`.
    pub(crate) peak_bytes: u64,
    /// What stopped the search before it proved `largest_batch` the largest
    /// fitting candidate (a trial of `largest_batch + multiple_of` seen not
    /// to fit); `None` when it did ([`proven_largest`](Plan::proven_largest)).
    pub(crate) stopped_by: Option<SearchLimit>,
    /// How training reaches its effective batch: one step, accumulated
    /// micro-steps, or shares of uneven ranks.
    pub(crate) split: Split,
    /// What was searched: the device's capacity, the ceiling, the
    /// granularity and the strategy (read them through
    /// [`capacity_bytes`](Plan::capacity_bytes), [`ceiling`](Plan::ceiling),
    /// [`multiple_of`](Plan::multiple_of), [`strategy`](Plan::strategy)).
    pub(crate) search: SearchSettings,
    /// Every trial, in the order run.
    pub(crate) trials: Vec<Trial>,
    /// Things worth knowing; each was also logged.
    pub(crate) warnings: Vec<Warning>,
    /// A straight line through the measured peaks, when two or more batches
    /// besides the chosen one were measured in full.
    pub(crate) memory_model: Option<MemoryModel>,
    /// The evaluation step's own largest batch, when it was probed
    /// ([`Search::evaluating`](crate::Search::evaluating)).
    pub(crate) evaluation: Option<EvaluationPlan>,
    /// With [`Objective::Throughput`]: the candidates timed and the choice.
    pub(crate) throughput: Option<ThroughputChoice>,
    /// What finding this plan cost ([`tuning_steps`](Plan::tuning_steps),
    /// [`tuning_seconds`](Plan::tuning_seconds)): every step the tuner ran for it (the
    /// warm-up, the search, re-checks, accumulation checks, timings, an
    /// evaluation search) and the time they took; on a cache hit, only the
    /// checks run now.
    pub(crate) tuning: TuningCost,
    /// When this plan came from the plan cache instead of probing (its
    /// trials are those of the run that stored it): the trials run now
    /// ([`cached`](Plan::cached), [`cache_checks`](Plan::cache_checks)).
    pub(crate) cache: Option<usize>,
    /// With [`Search::across`](crate::Search::across): the
    /// rank this plan is for and its own largest batch.
    pub(crate) distributed: Option<Distributed>,
    /// The device the trials ran on, as its meter names it
    /// ([`MemoryMeter::device_name`](crate::MemoryMeter::device_name)): a
    /// GPU's name, or the CPU heap with the matmul buffer each of its threads
    /// holds (the host's L2 cache per core, part of every baseline).
    pub(crate) device: String,
    /// Bytes of the gradients candle's backward pass kept for tensors that
    /// are not variables (read through [`untrained_gradient_bytes`](Plan::untrained_gradient_bytes)).
    pub(crate) untrained_gradient_bytes: u64,
}

/// What a search ran under: read through [`Plan::capacity_bytes`] and the
/// other accessors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SearchSettings {
    /// Device capacity: what 100% utilization means.
    pub(crate) capacity_bytes: u64,
    /// The utilization ceiling, a fraction of `capacity_bytes`.
    pub(crate) ceiling: Ceiling,
    /// The granularity batches were searched at.
    pub(crate) multiple_of: usize,
    /// The search strategy used.
    pub(crate) strategy: Strategy,
}

/// One rank's part of a distributed run: read through [`Plan::rank`] and
/// [`Plan::rank_largest_batch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Distributed {
    /// The rank this plan is for.
    pub(crate) rank: usize,
    /// This rank's own largest batch; the plan's `largest_batch` is the one
    /// all ranks agreed on (with uneven ranks, each rank keeps its own).
    pub(crate) rank_largest_batch: usize,
}

/// The largest batch of an evaluation step (forward only, no gradients): bigger
/// than training's, and the batch an evaluation loop should use so that it
/// does not run out of memory where training did not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvaluationPlan {
    /// The largest evaluation batch seen to fit.
    pub largest_batch: usize,
    /// Its measured device-wide peak.
    pub peak_bytes: u64,
    /// Whether the search proved it the largest (the next batch up was seen
    /// not to fit).
    pub proven_largest: bool,
    /// What stopped the search before it proved its answer the largest.
    #[serde(default)]
    pub stopped_by: Option<SearchLimit>,
    /// This search's trials, in the order run.
    #[serde(default)]
    pub trials: Vec<Trial>,
    /// Bytes of optimizer state the training workload held during this
    /// search and freed after it: 0 for evaluation alone, and where the
    /// workload cannot free its state.
    #[serde(default)]
    pub state_bytes: u64,
    /// When the training workload freed its optimizer's state for the
    /// search above (evaluation alone, as a separate evaluation or serving
    /// process runs it): the evaluation step's own search with that state
    /// held, as in a training loop that evaluates between steps (its
    /// [`state_bytes`](EvaluationPlan::state_bytes) say how much).
    #[serde(default)]
    pub during_training: Option<Box<EvaluationPlan>>,
}

/// The steps a tuning run ran and the time they took (see [`Plan::tuning_steps`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct TuningCost {
    /// Steps run, the warm-up included.
    pub(crate) steps: usize,
    /// Their time, in seconds.
    pub(crate) seconds: f64,
}

impl TuningCost {
    /// The steps of `trials` and their time.
    pub(crate) fn of(trials: &[Trial]) -> Self {
        let steps = trials.iter().map(|t| t.steps).sum();
        TuningCost { steps, seconds: trials.iter().map(|t| t.duration.as_secs_f64()).sum() }
    }

    /// One step that took `duration`: a warm-up.
    pub(crate) fn one_step(duration: Duration) -> Self {
        TuningCost { steps: 1, seconds: duration.as_secs_f64() }
    }
}

impl std::ops::Add for TuningCost {
    type Output = TuningCost;

    fn add(self, other: TuningCost) -> TuningCost {
        TuningCost { steps: self.steps + other.steps, seconds: self.seconds + other.seconds }
    }
}

impl Plan {
    /// The search result: the largest batch that was run and seen to fit
    /// (with [`Search::across`](crate::Search::across), the one every rank agreed on).
    pub fn largest_batch(&self) -> usize {
        self.largest_batch
    }

    /// The measured device-wide peak at [`largest_batch`](Plan::largest_batch).
    pub fn peak_bytes(&self) -> u64 {
        self.peak_bytes
    }

    /// What stopped the search before it proved the largest batch the
    /// largest fitting candidate; `None` when it did
    /// ([`proven_largest`](Plan::proven_largest)).
    pub fn stopped_by(&self) -> Option<&SearchLimit> {
        self.stopped_by.as_ref()
    }

    /// How training reaches its effective batch: one step, accumulated
    /// micro-steps, or shares of uneven ranks.
    pub fn split(&self) -> &Split {
        &self.split
    }

    /// Every trial, in the order run.
    pub fn trials(&self) -> &[Trial] {
        &self.trials
    }

    /// Things worth knowing; each was also logged.
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }

    /// A straight line through the measured peaks, when two or more batches
    /// besides the chosen one were measured in full.
    pub fn memory_model(&self) -> Option<&MemoryModel> {
        self.memory_model.as_ref()
    }

    /// The evaluation step's own largest batch, when it was probed
    /// ([`Search::evaluating`](crate::Search::evaluating)).
    pub fn evaluation(&self) -> Option<&EvaluationPlan> {
        self.evaluation.as_ref()
    }

    /// With [`Objective::Throughput`]: the candidates timed and the choice.
    pub fn throughput(&self) -> Option<&ThroughputChoice> {
        self.throughput.as_ref()
    }

    /// The device the trials ran on, as its meter names it.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// The batch to train with on each rank: `≤ largest_batch`, equal to it
    /// without a target. With uneven ranks: this rank's largest micro-step.
    pub fn micro_batch(&self) -> usize {
        self.split.micro_batch_of(self.rank().unwrap_or(0))
    }

    /// Micro-batches accumulated per optimizer step.
    pub fn accumulation_steps(&self) -> usize {
        self.split.accumulation_steps()
    }

    /// Number of data-parallel ranks.
    pub fn world_size(&self) -> usize {
        self.split.world_size()
    }

    /// Samples per optimizer step over all ranks: `micro_batch ×
    /// accumulation_steps × world_size` with even ranks.
    pub fn effective_batch(&self) -> usize {
        self.split.effective_batch()
    }

    /// The effective batch asked for, if any.
    pub fn target_effective_batch(&self) -> Option<usize> {
        self.split.target_effective_batch()
    }

    /// The accumulation arithmetic, when a target was set for even ranks.
    pub fn accumulation(&self) -> Option<&Accumulation> {
        match &self.split {
            Split::Accumulated { accumulation, .. } => Some(accumulation),
            _ => None,
        }
    }

    /// When the plan accumulates and the workload can run an accumulating
    /// micro-step: its measured peak at `micro_batch`, the accumulator held.
    pub fn accumulation_peak_bytes(&self) -> Option<u64> {
        self.split.accumulating_peak_bytes()
    }

    /// With [`Tuner::uneven_ranks`](crate::Tuner::uneven_ranks): every rank's
    /// share of the global batch, its micro-steps and loss weights.
    pub fn ranks(&self) -> Option<&RankSplit> {
        match &self.split {
            Split::Uneven { ranks, .. } => Some(ranks),
            _ => None,
        }
    }

    /// With [`Search::across`](crate::Search::across): the rank this plan is for.
    pub fn rank(&self) -> Option<usize> {
        self.distributed.map(|distributed| distributed.rank)
    }

    /// With [`Search::across`](crate::Search::across): this
    /// rank's own largest batch.
    pub fn rank_largest_batch(&self) -> Option<usize> {
        self.distributed.map(|distributed| distributed.rank_largest_batch)
    }

    /// Device capacity: what 100% utilization means.
    pub fn capacity_bytes(&self) -> u64 {
        self.search.capacity_bytes
    }

    /// The utilization ceiling, a fraction of `capacity_bytes`.
    pub fn ceiling(&self) -> Ceiling {
        self.search.ceiling
    }

    /// The granularity batches were searched at.
    pub fn multiple_of(&self) -> usize {
        self.search.multiple_of
    }

    /// The search strategy used.
    pub fn strategy(&self) -> Strategy {
        self.search.strategy
    }

    /// Whether the search proved `largest_batch` the largest fitting
    /// candidate: a trial of the next batch up was seen not to fit. When
    /// not, [`stopped_by`](Plan::stopped_by) says why.
    pub fn proven_largest(&self) -> bool {
        self.stopped_by.is_none()
    }

    /// Whether the measured step computed every variable's gradient; false
    /// when a cut graph left some out: the answer then understates training
    /// the whole model, and a [`Warning::MissingGradients`] says which. In
    /// JSON: `measured_graph`, `complete` or `partial`.
    pub fn complete_graph(&self) -> bool {
        !self.warnings.iter().any(|warning| matches!(warning, Warning::MissingGradients { .. }))
    }

    /// Bytes of the gradients candle's backward pass kept, at the measured
    /// step, for tensors that are not variables (a constant mask, the input
    /// batch, a frozen weight under candle's own matmul): part of every
    /// peak. A [`Warning::UntrainedGradients`] says so, with the change that
    /// removes them, where they outweigh the variables' own gradients.
    pub fn untrained_gradient_bytes(&self) -> u64 {
        self.untrained_gradient_bytes
    }

    /// The steps finding this plan ran: the warm-up, the search, re-checks,
    /// accumulation checks, timings, an evaluation search (on a cache hit,
    /// only the checks run now).
    pub fn tuning_steps(&self) -> usize {
        self.tuning.steps
    }

    /// The time those steps took, in seconds.
    pub fn tuning_seconds(&self) -> f64 {
        self.tuning.seconds
    }

    /// Whether this plan came from the plan cache instead of probing (its
    /// trials are then those of the run that stored it).
    pub fn cached(&self) -> bool {
        self.cache.is_some()
    }

    /// On a cache hit: the trials run now, accumulating micro-steps that
    /// check a split the stored trials never verified (they are the last of
    /// the plan's trials); 0 when no step ran or the plan was not cached.
    pub fn cache_checks(&self) -> usize {
        self.cache.unwrap_or(0)
    }

    /// `ceiling × capacity` in bytes: the most a fitting step may use.
    pub fn limit_bytes(&self) -> u64 {
        self.search.ceiling.limit_bytes(self.search.capacity_bytes)
    }

    /// Peak at `largest_batch` as a fraction of capacity.
    pub fn utilization(&self) -> f64 {
        utilization(self.peak_bytes, self.search.capacity_bytes)
    }

    /// Serializes the plan as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a plan always serializes: it holds no maps with non-string keys")
    }

    /// Reads a plan back from JSON.
    pub fn from_json(json: &str) -> Result<Plan, serde_json::Error> {
        serde_json::from_str(json)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// A plan read back from JSON is the plan written: trial durations to the
    /// nanosecond and every float to the bit (serde_json's `float_roundtrip`).
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Timed(#[serde(with = "super::seconds")] Duration);

    #[test]
    fn seconds_read_back_from_json_to_the_bit() {
        for nanos in [1, 999, 412_839_123, 59_999_999_999, 123_456_789_012, 3_600_000_000_001] {
            let timed = Timed(Duration::from_nanos(nanos));
            let json = serde_json::to_string(&timed).unwrap();
            assert_eq!(serde_json::from_str::<Timed>(&json).unwrap(), timed, "{json}");
        }
        // a sum of simulated step times that serde_json's fast float parser read back one bit off
        let tuning = super::TuningCost { steps: 7, seconds: 3.5099999999999995e-7 };
        assert_eq!(
            serde_json::from_str::<super::TuningCost>(&serde_json::to_string(&tuning).unwrap()).unwrap(),
            tuning
        );
    }
}
