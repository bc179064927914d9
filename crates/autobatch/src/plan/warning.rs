//! What a plan warns of, and how much of the graph its step measured.

use serde::{Deserialize, Serialize};

/// How much of the training graph the probe's step measured, as JSON says it
/// (`measured_graph`: `complete` or `partial`); read as
/// [`Plan::complete_graph`](crate::Plan::complete_graph) and
/// [`LongestSize::complete_graph`](crate::plan::LongestSize::complete_graph).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum MeasuredGraph {
    /// Every float variable got a gradient (or the workload does not say).
    #[default]
    Complete,
    /// Some variables got none and the forward pass does not write them: a
    /// fused op without a backward pass cut the graph.
    Partial,
}

impl MeasuredGraph {
    pub(crate) fn of(complete: bool) -> MeasuredGraph {
        if complete { MeasuredGraph::Complete } else { MeasuredGraph::Partial }
    }
}

/// Whether a graph was measured complete, in JSON as a [`MeasuredGraph`].
pub(crate) mod as_measured_graph {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::MeasuredGraph;

    pub(crate) fn serialize<S: Serializer>(complete: &bool, serializer: S) -> Result<S::Ok, S::Error> {
        MeasuredGraph::of(*complete).serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
        Ok(MeasuredGraph::deserialize(deserializer)? == MeasuredGraph::Complete)
    }
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
    /// twentieth of the variables' gradients. `autobatch_models::ops` computes none.
    UntrainedGradients {
        /// Tensors with such a gradient.
        tensors: usize,
        /// Their gradients' bytes.
        bytes: u64,
        /// The trained variables' gradient bytes, beside them.
        trained_bytes: u64,
        /// The largest ones' shapes, largest first (at most four): candle
        /// names no tensor, so they are told by their shapes.
        #[serde(default)]
        shapes: Vec<Vec<usize>>,
        /// How many have the batch as their first dimension: the step's own
        /// input or target, not a frozen weight or a mask.
        #[serde(default)]
        of_the_batch: usize,
    },
    /// The time limit ([`Tuner::time_limit`](crate::Tuner::time_limit))
    /// stopped the throughput timing ([`Objective::Throughput`](crate::plan::Objective::Throughput)) before every
    /// candidate was timed: the choice is among those that were.
    TimingCut {
        /// Timing trials that ran.
        timed: usize,
        /// Timing trials planned: candidates × repeats.
        planned: usize,
    },
    /// The step's update has a leaner form that computes the same numbers
    /// ([`Workload::switch_update`](crate::Workload::switch_update):
    /// `candle_nn::AdamW`, whose step holds several copies of the largest
    /// variable, against `autobatch::optim::AdamW`, a slice at a time): one
    /// step of it at the answer, measured, peaked this much lower.
    LeanerUpdate {
        /// The update the step runs.
        from: String,
        /// The leaner form.
        to: String,
        /// The batch both were measured at: the answer.
        batch: usize,
        /// How much lower the leaner form's step peaked.
        saves_bytes: u64,
    },
    /// The plan cache held an answer for these settings that a budget had cut
    /// short ([`SearchLimit::cut_short`](crate::plan::SearchLimit::cut_short): a
    /// time limit, a trial limit): not proven the largest, so not served as
    /// the answer; the search ran again, starting from it.
    CachedUnproven {
        /// The cached answer's batch.
        batch: usize,
        /// What had stopped the cached search.
        stopped_by: crate::plan::SearchLimit,
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
            Warning::UntrainedGradients { tensors, bytes, trained_bytes, shapes, of_the_batch } => {
                let said: Vec<String> = shapes.iter().map(|dims| format!("{dims:?}")).collect();
                let which = match (said.len(), *tensors) {
                    (0, _) => String::new(),
                    (shown, all) if shown < all => {
                        format!(" (the largest shaped {} and {} more)", said.join(", "), all - shown)
                    }
                    _ => format!(" (shaped {})", said.join(", ")),
                };
                let fix = match *of_the_batch == *tensors {
                    // the batch's own tensors: a frozen projection's fix is no help
                    true => {
                        "each has the batch as its first dimension: the step's input, a target or a mask \
                         built for the batch, whose gradient candle computes though nothing uses it; autobatch's \
                         ops compute none: its matmul for a product with the input, its add-constant op for a \
                         mask (candle's convolutions always compute their input's)"
                    }
                    false => {
                        "candle computes one for every operand outside the graph (a frozen weight, an \
                              attention mask, the input batch read by a matmul); autobatch's ops compute none: \
                              FrozenLinear for a frozen projection, its matmul for a product with the input \
                              batch, its add-constant op for a mask"
                    }
                };
                let kept = match tensors {
                    1 => "1 tensor that is not a trained variable".to_owned(),
                    many => format!("{many} tensors that are not trained variables"),
                };
                write!(
                    f,
                    "the backward pass kept gradients for {kept}{which}, {} \
                     beside the variables' {}, held until the gradient store is dropped (part of the backward \
                     pass's peak, and of the update's where the store lives through it): {fix}",
                    b(*bytes),
                    b(*trained_bytes)
                )
            }
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
            Warning::LeanerUpdate { from, to, batch, saves_bytes } => write!(
                f,
                "{from}'s update holds copies of the largest variable that {to} (the same numbers, a slice at a \
                 time) does not: switching saves {} at batch {batch}, measured, room for more samples (probe with \
                 ModelProbe::optimizer::<{to}> and train with it)",
                b(*saves_bytes)
            ),
            Warning::CachedUnproven { batch, stopped_by } => write!(
                f,
                "the plan cache held batch {batch}, not proven the largest ({stopped_by}): not served as the \
                 answer, the search ran again from it"
            ),
        }
    }
}
