//! What stopped a search short of proving its answer the largest.

use serde::{Deserialize, Serialize};

use crate::search::Strategy;

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
    /// The step did not seem to use its batch ([`Warning::BatchIgnored`](crate::plan::Warning::BatchIgnored)).
    BatchIgnored,
    /// The measured step did not reach the gradients of `variables` of `of`
    /// variables ([`Warning::MissingGradients`](crate::plan::Warning::MissingGradients)): a cut graph, so the batch
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
        /// was expected to end past it: `(batch, end_ms)`, that trial's batch
        /// and when it was expected to end, in milliseconds since the search
        /// began (in JSON, `{"batch", "end_ms"}`).
        #[serde(default, skip_serializing_if = "Option::is_none", with = "expected_end")]
        expected_end: Option<(usize, u64)>,
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

impl SearchLimit {
    /// Whether a budget of the run cut the search short (a time limit, a
    /// trial limit, a re-check that left the next batch untried): another
    /// run with the same settings may prove a larger answer. The other limits
    /// are the settings' own (the largest batch allowed, a strategy that does
    /// not bisect, the step as measured): the same search stops there again.
    pub fn cut_short(&self) -> bool {
        matches!(
            self,
            SearchLimit::MaxTrials { .. } | SearchLimit::TimeLimit { .. } | SearchLimit::NextBatchNotTried { .. }
        )
    }
}

/// The trial a search under a time limit did not start, in JSON.
mod expected_end {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct ExpectedEnd {
        batch: usize,
        end_ms: u64,
    }

    pub(super) fn serialize<S: Serializer>(end: &Option<(usize, u64)>, serializer: S) -> Result<S::Ok, S::Error> {
        end.map(|(batch, end_ms)| ExpectedEnd { batch, end_ms }).serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<(usize, u64)>, D::Error> {
        Ok(Option::<ExpectedEnd>::deserialize(deserializer)?.map(|end| (end.batch, end.end_ms)))
    }
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
                    Some((batch, end_ms)) => write!(
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

#[cfg(test)]
mod tests {
    use super::SearchLimit;

    #[test]
    fn a_trial_expected_to_end_past_the_limit_is_an_object_in_json() {
        let expected = SearchLimit::TimeLimit {
            limit_ms: 60,
            largest_fit: 40,
            smallest_failure: None,
            expected_end: Some((120, 130)),
        };
        let json = serde_json::to_value(&expected).unwrap();
        assert_eq!(json["reason"], "time_limit");
        assert_eq!(json["expected_end"], serde_json::json!({"batch": 120, "end_ms": 130}));
        assert_eq!(serde_json::from_value::<SearchLimit>(json).unwrap(), expected);
        let reached =
            SearchLimit::TimeLimit { limit_ms: 60, largest_fit: 40, smallest_failure: Some(64), expected_end: None };
        let json = serde_json::to_value(&reached).unwrap();
        assert!(json.get("expected_end").is_none(), "{json}");
        assert_eq!(serde_json::from_value::<SearchLimit>(json).unwrap(), reached);
    }
}
