//! What a tuning run produces: the trials it ran and the plan it derived.

mod accumulation;
mod longest;
mod ranks;
mod record;
mod report;
mod sizes;
mod split;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use accumulation::{plan_accumulation, plan_accumulation_aligned, Accumulation};
pub use longest::{LongestSize, SizeRange, SizeTrial};
pub use ranks::{plan_ranks, RankShare, RankSplit};
pub use sizes::{Basis, SizeBatch, SizeModel, SizePlan, SizedPlan};
pub use split::Split;

use crate::search::{LinearFit, Outcome, Strategy};

/// Why a trial was run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrialKind {
    /// Proposed by the search strategy. Counts against `max_trials`.
    #[default]
    Search,
    /// The chosen batch run again because memory in use rose after it was first
    /// measured: the answer must fit in memory as it is when training starts.
    Recheck,
    /// A timed run of a fitting batch, for [`Objective::Throughput`].
    Timing,
    /// A micro-step of gradient accumulation, the accumulator held: verifies
    /// the plan's micro-batch when it accumulates
    /// ([`Workload::accumulating_step`](crate::Workload::accumulating_step)).
    Accumulation,
}

/// The kinds of peak a meter reads in one measured step, device-wide bytes
/// (a CUDA pool's, read by `CudaMeter::peaks` with the `cuda` feature); the trial's peak
/// is the highest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PeakKinds {
    /// Bytes in use at the start plus the pool's live-bytes high-water mark
    /// since: what PyTorch calls `max_memory_allocated`.
    pub used: u64,
    /// Bytes in use at the start plus the pool's reserved high-water mark
    /// since: live bytes plus what fragmentation kept reserved around them.
    pub reserved: u64,
    /// Bytes in use device-wide after the step (before the pool's cache is
    /// released): memory taken outside the pool during the step and kept
    /// (cuBLAS workspaces, kernel modules at a new shape) shows here.
    pub device: u64,
}

impl PeakKinds {
    /// The peak the limit is checked against: the highest of the three, as
    /// any of them can be what runs out.
    pub fn binding(&self) -> u64 {
        self.used.max(self.reserved).max(self.device)
    }

    /// Which of the three binds: `used`, `reserved` or `device`.
    pub fn binding_name(&self) -> &'static str {
        let binding = self.binding();
        if binding == self.used {
            "used"
        } else if binding == self.reserved {
            "reserved"
        } else {
            "device"
        }
    }
}

/// One measured run of the workload at one batch size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    /// The batch size tried.
    pub batch: usize,
    /// How it ended.
    pub outcome: Outcome,
    /// The device-wide peak the meter read after the step (for an out-of-memory
    /// trial, the peak reached before the failure), or `None` when it could not be read.
    pub peak_bytes: Option<u64>,
    /// Wall-clock time of the trial's steps, synchronization included.
    #[serde(rename = "duration_s", with = "seconds")]
    pub duration: Duration,
    /// Device-wide bytes in use just before the trial.
    pub baseline_bytes: u64,
    /// Why the trial was run.
    #[serde(default)]
    pub kind: TrialKind,
    /// Workload steps the trial ran (the tuner's `steps_per_trial`).
    #[serde(default = "one")]
    pub steps: usize,
    /// The kinds of peak the meter read, where it reads several (CUDA: the
    /// pool's used and reserved bytes and the device-wide use; `peak_bytes`
    /// is their highest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_kinds: Option<PeakKinds>,
}

fn one() -> usize {
    1
}

impl Trial {
    /// Samples per second of the trial's steps, when it ran to the end.
    pub fn samples_per_second(&self) -> Option<f64> {
        let seconds = self.duration.as_secs_f64();
        (self.outcome.fits() && seconds > 0.0).then(|| (self.batch * self.steps) as f64 / seconds)
    }
}

/// Which micro-batch the tuner plans from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Objective {
    /// The largest batch that fits (the default).
    #[default]
    LargestBatch,
    /// The fitting batch with the best measured samples per second, among
    /// candidates near the top (the largest, ¾ and ½ of it), each timed
    /// `Tuner::timing_repeats` times and compared by the median.
    Throughput,
}

/// One candidate of a throughput choice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThroughputPoint {
    /// The batch.
    pub batch: usize,
    /// Median samples per second over its timed trials.
    pub samples_per_second: f64,
    /// Relative spread of its timings: (slowest − fastest) / median.
    pub spread: f64,
}

/// What [`Objective::Throughput`] measured and chose.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThroughputChoice {
    /// The candidates, smallest batch first.
    pub candidates: Vec<ThroughputPoint>,
    /// The batch with the best median throughput: the plan's micro-batch cap.
    pub chosen_batch: usize,
    /// What DeepSpeed's autotuner rule picks on the same measurements: walk up
    /// from the smallest candidate while the next is at least 5% faster.
    pub deepspeed_batch: usize,
    /// Workload steps the timing took beyond the search.
    pub extra_steps: usize,
}

/// Why a search's answer is not proven the largest: what stopped the search
/// before a trial of the next batch up (the answer + one granule) was seen not
/// to fit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SearchLimit {
    /// The answer is the largest batch the search may try
    /// ([`Tuner::max_batch`](crate::Tuner::max_batch), rounded down to the
    /// granularity): larger ones were not tried, and may fit.
    MaxBatch {
        /// The largest candidate.
        max_batch: usize,
    },
    /// The search ran [`Tuner::max_trials`](crate::Tuner::max_trials) trials.
    MaxTrials {
        /// The limit.
        max_trials: usize,
    },
    /// The strategy does not bisect ([`Strategy::Power`]): it stops at the
    /// first failure after doubling, and batches between were not tried.
    Strategy {
        /// The strategy.
        strategy: Strategy,
    },
    /// The step did not seem to use its batch ([`Warning::BatchIgnored`]).
    BatchIgnored,
    /// The measured step did not reach the gradients of `variables` of `of`
    /// variables ([`Warning::MissingGradients`]): a cut graph, so the batch
    /// that fits it understates what training a whole graph needs.
    PartialGraph {
        /// Variables cut off.
        variables: usize,
        /// Float variables in all.
        of: usize,
    },
    /// The search reached [`Tuner::time_limit`](crate::Tuner::time_limit):
    /// the batches between the answer and the smallest seen not to fit (or,
    /// with none seen, every batch above the answer) were not tried.
    TimeLimit {
        /// The limit, in milliseconds.
        limit_ms: u64,
        /// The largest batch seen to fit: the answer.
        largest_fit: usize,
        /// The smallest batch seen not to fit above it, if any: the top of
        /// what remains open.
        smallest_failure: Option<usize>,
        /// When the search stopped before the limit because its next trial
        /// was expected to end past it: that trial's batch and the time since
        /// the search began at which it was expected to end, in milliseconds.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expected_end: Option<ExpectedEnd>,
    },
    /// The next batch up would run a tensor of more elements than the
    /// device's kernels count ([`Tuner::element_limit`](crate::Tuner::element_limit):
    /// candle's CUDA kernels count elements in 32 bits, and past 2^32 a
    /// launch loops for ever or fails): the search stopped below it.
    TensorElements {
        /// The largest batch whose every tensor stays under the limit: the answer.
        batch: usize,
        /// The most elements one tensor of the step was expected to have at
        /// the next batch up, from the graphs the trials measured.
        elements: u64,
        /// The limit.
        limit: u64,
    },
    /// The next batch up was not tried for another reason (a re-check that
    /// failed moved the answer down).
    NextBatchNotTried {
        /// The batch that was not tried.
        batch: usize,
    },
}

/// The trial a search under a time limit did not start because it was
/// expected to end past the limit (see [`SearchLimit::TimeLimit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectedEnd {
    /// The batch of the trial not started.
    pub batch: usize,
    /// When it was expected to end, in milliseconds since the search began.
    pub end_ms: u64,
}

impl std::fmt::Display for SearchLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SearchLimit::MaxBatch { max_batch } => {
                write!(f, "stopped at the largest batch allowed, {max_batch}: larger ones were not tried")
            }
            SearchLimit::MaxTrials { max_trials } => write!(f, "stopped after {max_trials} search trials"),
            SearchLimit::Strategy { strategy } => {
                write!(f, "the {strategy} strategy stops at the first failure without bisecting")
            }
            SearchLimit::BatchIgnored => f.write_str("the step seems not to use its batch"),
            SearchLimit::PartialGraph { variables, of } => write!(
                f,
                "the measured step reached the gradients of {} of {of} variables (a cut graph): training the \
                 whole model needs more",
                of - variables
            ),
            SearchLimit::TimeLimit { limit_ms, largest_fit, smallest_failure, expected_end } => {
                let limit = crate::units::format_millis(*limit_ms);
                match expected_end {
                    Some(ExpectedEnd { batch, end_ms }) => write!(
                        f,
                        "stopped before the {limit} time limit: a trial of batch {batch} was expected to end at {}",
                        crate::units::format_millis(*end_ms)
                    )?,
                    None => write!(f, "stopped at the {limit} time limit")?,
                }
                match smallest_failure {
                    Some(failure) => write!(
                        f,
                        ": batches {}..={} are open (batch {failure} does not fit)",
                        largest_fit + 1,
                        failure - 1
                    ),
                    None => write!(f, ": batches above {largest_fit} were not tried"),
                }
            }
            SearchLimit::NextBatchNotTried { batch } => write!(f, "batch {batch} was not tried"),
            SearchLimit::TensorElements { batch, elements, limit } => write!(
                f,
                "stopped at batch {batch}: the next batch up would run a tensor of {elements} elements, past the \
                 {limit} the device's kernels count"
            ),
        }
    }
}

/// How much of the training graph the probe's step measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MeasuredGraph {
    /// Every float variable got a gradient (or the workload does not say).
    #[default]
    Complete,
    /// Some variables got none and the forward pass does not write them: a
    /// fused op without a backward pass cut the graph.
    Partial,
}

/// Something the caller should know about a plan that is still valid.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Warning {
    /// After a failed trial, memory in use did not come back to the pre-trial
    /// baseline: the workload holds on to something it allocated in the failed step.
    /// Later trials ran with less free memory, so the answer is conservative, but
    /// the leaked memory stays unavailable to training.
    Leak {
        /// The failed trial's batch.
        batch: usize,
        /// Bytes in use before the trial.
        baseline_bytes: u64,
        /// Bytes in use after the trial and the cache release.
        after_bytes: u64,
        /// The slack the meter allows (see [`MemoryMeter::slack_bytes`](crate::MemoryMeter::slack_bytes)).
        slack_bytes: u64,
    },
    /// The search stopped at `max_trials` before proving its answer is the largest.
    TrialLimit {
        /// The limit that was reached.
        max_trials: usize,
    },
    /// The step's peak grew by less than a byte per sample while the batch grew
    /// a thousandfold: it does not seem to use its batch (a step that ignores
    /// its argument, a loader that caps the batch). The search stopped there,
    /// and the answer is not proven largest.
    BatchIgnored {
        /// The smallest fitting batch measured.
        smallest_batch: usize,
        /// The largest fitting batch measured.
        largest_batch: usize,
        /// How much the peak grew between them.
        growth_bytes: u64,
    },
    /// Float variables that received no gradient in the probe step and that
    /// the forward pass did not write (a variable it writes, such as
    /// BatchNorm's running statistics, is a buffer, not a missing gradient).
    /// In candle that is most often a fused op without a backward pass
    /// (`candle_nn::LayerNorm` on a contiguous input, `RmsNorm`,
    /// `ops::softmax_last_dim`), which cuts the graph silently: the variables
    /// before the cut will not learn, and the peak measured is that of the cut
    /// graph; the model written with differentiable ops needs more.
    MissingGradients {
        /// The variables, by name.
        variables: Vec<String>,
        /// How many float variables there are in all.
        of: usize,
    },
    /// A forward-only probe's output recorded a graph: the forward pass ran
    /// on the variables themselves and held every activation, as training's
    /// does, so the batch found is smaller than evaluation needs. Build the
    /// evaluation model from [`detached`](crate::model::detached).
    GraphRecorded,
    /// Memory in use stayed above the baseline after a step that fit and
    /// returned: the model keeps state between steps (a KV cache is the usual
    /// cause). Later trials ran with less room, and the state stays held
    /// after tuning unless it is cleared
    /// ([`ModelProbe::with_reset`](crate::ModelProbe::with_reset)).
    StateKept {
        /// The batch whose step left memory held.
        batch: usize,
        /// Bytes in use before the first trial.
        baseline_bytes: u64,
        /// Bytes in use after this step.
        after_bytes: u64,
    },
    /// The chosen batch no longer fit when re-checked after memory in use rose;
    /// the search went on below it.
    RecheckFailed {
        /// The batch that fit at first and failed on re-check.
        batch: usize,
        /// Bytes in use when it first fit.
        first_baseline_bytes: u64,
        /// Bytes in use at the re-check.
        recheck_baseline_bytes: u64,
    },
    /// The backward pass kept gradients for tensors that are not trained
    /// variables, held until the gradient store is dropped: candle computes a
    /// gradient for every operand outside the graph (a frozen weight under
    /// its matmul, an attention mask added with `broadcast_add`, the input
    /// batch a first matmul reads). Memory the step needs only because candle
    /// computes it; the largest seen in a trial, said once it reaches a
    /// twentieth of the variables' gradients. [`crate::ops`] computes none.
    UntrainedGradients {
        /// Tensors with such a gradient.
        tensors: usize,
        /// Their gradients' bytes.
        bytes: u64,
        /// The trained variables' gradient bytes, beside them.
        trained_bytes: u64,
    },
    /// The time limit ([`Tuner::time_limit`](crate::Tuner::time_limit))
    /// stopped the throughput timing ([`Objective::Throughput`]) before every
    /// candidate was timed: the choice is among those that were.
    TimingCut {
        /// Timing trials that ran.
        timed: usize,
        /// Timing trials planned: candidates × repeats.
        planned: usize,
    },
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::units::format_bytes as b;
        match self {
            Warning::Leak { batch, baseline_bytes, after_bytes, slack_bytes } => write!(
                f,
                "memory leaked by the failed trial at batch {batch}: {} in use after it, {} before (slack {})",
                b(*after_bytes),
                b(*baseline_bytes),
                b(*slack_bytes)
            ),
            Warning::TrialLimit { max_trials } => write!(
                f,
                "stopped after {max_trials} search trials (the trial limit): the batch is verified to fit but not \
                 proven the largest"
            ),
            Warning::BatchIgnored { smallest_batch, largest_batch, growth_bytes } => write!(
                f,
                "the step seems not to use its batch: its peak grew by {} from batch {smallest_batch} to batch \
                 {largest_batch}; stopped there (check that the step builds its inputs from the batch size)",
                b(*growth_bytes)
            ),
            Warning::MissingGradients { variables, of } => {
                let names = crate::error::first_names(variables);
                write!(
                    f,
                    "no gradient reached {} of {of} variables ({names}), and the forward pass does not write \
                     them: likely a candle fused op without a backward pass (candle_nn::LayerNorm or RmsNorm on a \
                     contiguous input, ops::softmax_last_dim) cut the graph, so they will not learn; the peak \
                     measured is that of the cut graph, and the model written with differentiable ops \
                     (autobatch's ops module has forms of each) needs more (variables named as checkpoints name \
                     buffers, running_mean, running_var and num_batches_tracked, and those declared with \
                     ModelProbe's buffers_named are read-only buffers, not counted here)",
                    variables.len()
                )
            }
            Warning::GraphRecorded => f.write_str(
                "the forward-only step recorded a graph (its output was computed from the variables): it held \
                 every activation as training does, so the batch found is below what evaluation needs; build the \
                 evaluation model from model::detached",
            ),
            Warning::StateKept { batch, baseline_bytes, after_bytes } => write!(
                f,
                "steps kept memory held after they returned, {} by the step at batch {batch} ({} in use before \
                 the first trial, {} after it): the model likely keeps state between calls (a KV cache); clear it before each step (a reset hook) \
                 or the answer shrinks with each trial and the state stays held after tuning",
                b(after_bytes - baseline_bytes),
                b(*baseline_bytes),
                b(*after_bytes)
            ),
            Warning::RecheckFailed { batch, first_baseline_bytes, recheck_baseline_bytes } => write!(
                f,
                "batch {batch} fit with {} in use but not when re-checked with {} in use",
                b(*first_baseline_bytes),
                b(*recheck_baseline_bytes)
            ),
            Warning::UntrainedGradients { tensors, bytes, trained_bytes } => write!(
                f,
                "the backward pass kept gradients for {tensors} tensors that are not trained variables, {} \
                 beside the variables' {}, held until the gradient store is dropped (part of the backward \
                 pass's peak, and of the update's where the store lives through it): candle computes one for \
                 every operand outside the graph (a frozen weight, an attention mask, the input batch read by a \
                 matmul); autobatch's ops compute none: FrozenLinear for a frozen projection, its matmul for a \
                 product with the input batch, its add-constant op for a mask",
                b(*bytes),
                b(*trained_bytes)
            ),
            Warning::TimingCut { timed: 0, planned } => write!(
                f,
                "the time limit came before the throughput timing ({planned} timing trials): the plan trains at \
                 the largest batch"
            ),
            Warning::TimingCut { timed, planned } => write!(
                f,
                "the time limit stopped the throughput timing after {timed} of {planned} timing trials: \
                 the choice is among the batches timed"
            ),
        }
    }
}

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
    /// With [`Tuner::run_distributed`](crate::Tuner::run_distributed): the
    /// one every rank agreed on.
    pub largest_batch: usize,
    /// Measured device-wide peak at `largest_batch`.
    pub peak_bytes: u64,
    /// What stopped the search before it proved `largest_batch` the largest
    /// fitting candidate (a trial of `largest_batch + multiple_of` seen not
    /// to fit); `None` when it did ([`proven_largest`](Plan::proven_largest)).
    pub stopped_by: Option<SearchLimit>,
    /// How training reaches its effective batch: one step, accumulated
    /// micro-steps, or shares of uneven ranks.
    pub split: Split,
    /// What was searched: the device's capacity, the ceiling, the
    /// granularity and the strategy.
    pub search: SearchSettings,
    /// Every trial, in the order run.
    pub trials: Vec<Trial>,
    /// Things worth knowing; each was also logged.
    pub warnings: Vec<Warning>,
    /// A straight line through the measured peaks, when two or more batches
    /// besides the chosen one were measured in full.
    pub memory_model: Option<MemoryModel>,
    /// The evaluation step's own largest batch, when it was probed
    /// ([`Tuner::run_with_eval`](crate::Tuner::run_with_eval)).
    pub evaluation: Option<EvaluationPlan>,
    /// With [`Objective::Throughput`]: the candidates timed and the choice.
    pub throughput: Option<ThroughputChoice>,
    /// What finding this plan cost: every step the tuner ran for it (the
    /// warm-up, the search, re-checks, accumulation checks, timings, an
    /// evaluation search) and the time they took; on a cache hit, only the
    /// checks run now.
    pub tuning: TuningCost,
    /// When this plan came from the plan cache instead of probing (its
    /// trials are those of the run that stored it): what was run now.
    pub cache: Option<CacheHit>,
    /// With [`Tuner::run_distributed`](crate::Tuner::run_distributed): the
    /// rank this plan is for and its own largest batch.
    pub distributed: Option<Distributed>,
    /// The device the trials ran on, as its meter names it
    /// ([`MemoryMeter::device_name`](crate::MemoryMeter::device_name)): a
    /// GPU's name, or the CPU heap with the matmul buffer each of its threads
    /// holds (the host's L2 cache per core, part of every baseline).
    pub device: String,
}

/// What a search ran under (see [`Plan::search`]).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct SearchSettings {
    /// Device capacity: what 100% utilization means.
    pub capacity_bytes: u64,
    /// The utilization ceiling, a fraction of `capacity_bytes`.
    pub ceiling: f64,
    /// The granularity batches were searched at.
    pub multiple_of: usize,
    /// The search strategy used.
    pub strategy: Strategy,
}

/// A plan read from the plan cache (see [`Plan::cache`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheHit {
    /// The trials run now: accumulating micro-steps that check a split the
    /// stored trials never verified (they are the last of the plan's
    /// trials); 0 when no step ran.
    pub checks: usize,
}

/// One rank's part of a distributed run (see [`Plan::distributed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Distributed {
    /// The rank this plan is for.
    pub rank: usize,
    /// This rank's own largest batch; the plan's `largest_batch` is the one
    /// all ranks agreed on (with uneven ranks, each rank keeps its own).
    pub rank_largest_batch: usize,
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
    /// The evaluation trials, in the order run.
    pub trials: Vec<Trial>,
    /// When the training workload freed its optimizer's state for the
    /// search above (evaluation alone, as a separate evaluation or serving
    /// process runs it): the largest evaluation batch with that state held,
    /// as in a training loop that evaluates between steps.
    #[serde(default)]
    pub during_training: Option<DuringTraining>,
}

/// The evaluation step's largest batch beside training's optimizer state
/// (see [`EvaluationPlan::during_training`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DuringTraining {
    /// The largest evaluation batch seen to fit with the state held.
    pub largest_batch: usize,
    /// Its measured peak.
    pub peak_bytes: u64,
    /// Whether the search proved it the largest.
    pub proven_largest: bool,
    /// Bytes of optimizer state the training workload held (and freed
    /// after this search).
    pub state_bytes: u64,
}

/// The steps a tuning run ran and the time they took (see [`Plan::tuning`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TuningCost {
    /// Steps run, the warm-up included.
    pub steps: usize,
    /// Their time, in seconds.
    pub seconds: f64,
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

/// `peak(b) ≈ fixed + per_sample·b`, fitted (least squares) to every trial that
/// ran to the end except those at the chosen batch, so that its peak there is a
/// prediction that the measurement then checks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryModel {
    /// The fitted line: bytes at batch 0 (weights, gradients, optimizer state,
    /// other processes) and bytes each sample adds.
    #[serde(flatten)]
    pub line: LinearFit,
    /// The batches the line was fitted to.
    pub fitted_batches: Vec<usize>,
    /// The line's peak at the chosen batch.
    pub predicted_peak_bytes: u64,
    /// `(predicted − measured) / measured` at the chosen batch: negative when
    /// the line under-estimates (the dangerous direction).
    pub prediction_error: f64,
}

impl MemoryModel {
    /// The line's peak at `batch`, in bytes.
    pub fn predict(&self, batch: usize) -> f64 {
        self.line.predict(batch)
    }

    /// Fits the line to `trials` (the last measurement of each batch that ran
    /// to the end) except `chosen`, and checks it against `measured` there.
    pub(crate) fn fit(trials: &[Trial], chosen: usize, measured: u64) -> Option<MemoryModel> {
        let mut latest: Vec<(usize, u64)> = Vec::new();
        for trial in trials.iter().rev() {
            if trial.batch == chosen
                || matches!(trial.kind, TrialKind::Accumulation | TrialKind::Timing)
                || trial.outcome == Outcome::OutOfMemory
                || latest.iter().any(|&(b, _)| b == trial.batch)
            {
                continue;
            }
            if let Some(peak) = trial.peak_bytes {
                latest.push((trial.batch, peak));
            }
        }
        latest.sort_unstable();
        let line = LinearFit::through(&latest)?;
        let predicted = line.predict(chosen).max(0.0);
        // JSON has no NaN or infinity: a model that cannot be checked is no model
        if measured == 0 || !(line.is_finite() && predicted.is_finite()) {
            return None;
        }
        Some(MemoryModel {
            line,
            fitted_batches: latest.iter().map(|&(b, _)| b).collect(),
            predicted_peak_bytes: predicted.round() as u64,
            prediction_error: (predicted - measured as f64) / measured as f64,
        })
    }
}

impl Plan {
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

    /// With [`Tuner::run_distributed`](crate::Tuner::run_distributed): the rank this plan is for.
    pub fn rank(&self) -> Option<usize> {
        self.distributed.map(|distributed| distributed.rank)
    }

    /// With [`Tuner::run_distributed`](crate::Tuner::run_distributed): this
    /// rank's own largest batch.
    pub fn rank_largest_batch(&self) -> Option<usize> {
        self.distributed.map(|distributed| distributed.rank_largest_batch)
    }

    /// Device capacity: what 100% utilization means.
    pub fn capacity_bytes(&self) -> u64 {
        self.search.capacity_bytes
    }

    /// The utilization ceiling, a fraction of `capacity_bytes`.
    pub fn ceiling(&self) -> f64 {
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

    /// Whether the measured step computed every variable's gradient
    /// (`complete`), or a cut graph left some out (`partial`: the answer
    /// understates training the whole model; a [`Warning::MissingGradients`] says which).
    pub fn measured_graph(&self) -> MeasuredGraph {
        if self.warnings.iter().any(|warning| matches!(warning, Warning::MissingGradients { .. })) {
            MeasuredGraph::Partial
        } else {
            MeasuredGraph::Complete
        }
    }

    /// Whether this plan came from the plan cache instead of probing.
    pub fn cached(&self) -> bool {
        self.cache.is_some()
    }

    /// On a cache hit: the trials run now (see [`CacheHit::checks`]); 0 otherwise.
    pub fn cache_checks(&self) -> usize {
        self.cache.map_or(0, |hit| hit.checks)
    }

    /// `ceiling × capacity` in bytes: the most a fitting step may use.
    pub fn limit_bytes(&self) -> u64 {
        limit_bytes(self.search.ceiling, self.search.capacity_bytes)
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

/// A utilization ceiling: the most a fitting step may use, as a fraction in
/// (0, 1] of a device's capacity. Checked once, turned into bytes one way.
///
/// ```
/// use autobatch::Ceiling;
///
/// let ceiling = Ceiling::new(0.9)?;
/// assert_eq!(ceiling.limit_bytes(1000), 900);
/// assert!(Ceiling::new(1.5).is_err() && Ceiling::new(0.0).is_err() && Ceiling::new(f64::NAN).is_err());
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ceiling(f64);

impl Ceiling {
    /// `fraction` as a ceiling, or [`Error::InvalidCeiling`](crate::Error::InvalidCeiling)
    /// when it is not in (0, 1].
    pub fn new(fraction: f64) -> Result<Ceiling, crate::Error> {
        if fraction > 0.0 && fraction <= 1.0 {
            Ok(Ceiling(fraction))
        } else {
            Err(crate::Error::InvalidCeiling { ceiling: fraction })
        }
    }

    /// The fraction.
    pub fn fraction(self) -> f64 {
        self.0
    }

    /// `ceiling × capacity`, rounded down to whole bytes: a peak `p` is under
    /// the ceiling exactly when `p <= limit_bytes(capacity)`.
    pub fn limit_bytes(self, capacity_bytes: u64) -> u64 {
        (self.0 * capacity_bytes as f64).floor() as u64
    }
}

/// `ceiling × capacity`, rounded down to whole bytes, for a ceiling already
/// checked (or read back from a plan).
pub(crate) fn limit_bytes(ceiling: f64, capacity_bytes: u64) -> u64 {
    Ceiling(ceiling).limit_bytes(capacity_bytes)
}

pub(crate) fn utilization(bytes: u64, capacity_bytes: u64) -> f64 {
    if capacity_bytes == 0 {
        0.0
    } else {
        bytes as f64 / capacity_bytes as f64
    }
}

/// Durations as fractional seconds in JSON.
mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(duration.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(deserializer)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
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
