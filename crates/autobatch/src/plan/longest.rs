//! The longest input size that fits at a given batch: what
//! [`Search::longest`](crate::Search::longest) finds.

use serde::{Deserialize, Serialize};

use super::{SearchLimit, Trial, Warning};
use crate::units::format_bytes;

/// The sizes a search over the input size may try: multiples of
/// `multiple_of` from `smallest` (rounded up) to `largest` (rounded down),
/// `largest` being the longest the workload takes (a transformer's positions).
///
/// ```
/// use autobatch::plan::SizeRange;
///
/// let range = SizeRange::up_to(2048).multiple_of(64);
/// assert_eq!((range.smallest, range.largest, range.multiple_of), (64, 2048, 64));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeRange {
    /// The shortest size to try (rounded up to `multiple_of`).
    pub smallest: usize,
    /// The longest size the workload takes (rounded down to `multiple_of`).
    pub largest: usize,
    /// Only sizes that are multiples of this are tried.
    pub multiple_of: usize,
}

impl SizeRange {
    /// Sizes up to `largest`, from 1, every one of them.
    pub fn up_to(largest: usize) -> Self {
        SizeRange { smallest: 1, largest, multiple_of: 1 }
    }

    /// Only multiples of `granule` (the smallest size becomes one granule
    /// when it was below it).
    pub fn multiple_of(mut self, granule: usize) -> Self {
        self.multiple_of = granule;
        self.smallest = self.smallest.max(granule);
        self
    }

    /// The shortest size to try.
    pub fn from(mut self, smallest: usize) -> Self {
        self.smallest = smallest;
        self
    }
}

/// The longest input size that fits at one batch, verified like a batch
/// search: a step at `largest_size` fits under the ceiling, and (when
/// `proven_longest`) a step one granule longer was seen not to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LongestSize {
    /// The batch every step ran at.
    pub batch: usize,
    /// The longest size seen to fit.
    pub largest_size: usize,
    /// Whether `largest_size + multiple_of` was seen not to fit.
    pub proven_longest: bool,
    /// Why it is not proven, when it is not. [`SearchLimit::MaxBatch`] here
    /// means the range's longest size (the workload takes no longer one).
    pub stopped_by: Option<SearchLimit>,
    /// The peak of the step at `largest_size`.
    pub peak_bytes: u64,
    /// The device's capacity.
    pub capacity_bytes: u64,
    /// The utilization ceiling.
    pub ceiling: crate::plan::Ceiling,
    /// The sizes searched.
    pub range: SizeRange,
    /// Whether the measured step reached every variable's gradient (in
    /// JSON: `measured_graph`, `complete` or `partial`).
    #[serde(rename = "measured_graph", with = "super::as_measured_graph")]
    pub complete_graph: bool,
    /// Every measured step, in order.
    pub trials: Vec<Trial>,
    /// What the tuner or the workload noticed.
    pub warnings: Vec<Warning>,
}

impl LongestSize {
    /// The most a fitting step may use: ceiling × capacity.
    pub fn limit_bytes(&self) -> u64 {
        self.ceiling.limit_bytes(self.capacity_bytes)
    }

    /// The result as pretty JSON, `largest_size` under the name `key`
    /// (`largest_seq_len`, `largest_resolution`) as well.
    pub fn to_json_named(&self, key: &str) -> String {
        let mut json = serde_json::to_value(self).expect("plain values serialize");
        json[key] = self.largest_size.into();
        serde_json::to_string_pretty(&json).expect("plain values serialize")
    }

    /// What stopped the search, in words about sizes (`what`: "sequence
    /// length", "resolution").
    pub fn describe_limit(&self, what: &str) -> Option<String> {
        Some(match self.stopped_by.as_ref()? {
            SearchLimit::MaxBatch { max_batch } => {
                format!("{max_batch} is the largest {what} searched (the model's range): larger ones were not tried")
            }
            SearchLimit::MaxTrials { max_trials } => format!("stopped after {max_trials} search trials"),
            SearchLimit::NextBatchNotTried { batch } => format!("{what} {batch} was not tried"),
            SearchLimit::TimeLimit { limit_ms, largest_fit, smallest_failure, expected_end } => {
                let limit = crate::units::format_millis(*limit_ms);
                let stopped = match expected_end {
                    Some((size, end_ms)) => format!(
                        "stopped before the {limit} time limit: a trial at {what} {size} was expected to end at {}",
                        crate::units::format_millis(*end_ms)
                    ),
                    None => format!("stopped at the {limit} time limit"),
                };
                match smallest_failure {
                    Some(failure) => format!(
                        "{stopped}: {what}s {}..={} are open ({failure} does not fit)",
                        largest_fit + 1,
                        failure - 1
                    ),
                    None => format!("{stopped}: {what}s above {largest_fit} were not tried"),
                }
            }
            other => other.to_string(),
        })
    }

    /// The summary in words: `what` names the size ("sequence length").
    pub fn summary(&self, what: &str) -> String {
        let proof = match self.describe_limit(what) {
            None => "proven largest".to_owned(),
            Some(limit) => format!("not proven largest: {limit}"),
        };
        let granule = if self.range.multiple_of > 1 {
            format!(", multiples of {}", self.range.multiple_of)
        } else {
            String::new()
        };
        let mut out = format!(
            "largest {what} at batch {}: {} ({proof}{granule}), peak {} = {:.1}% of {} (ceiling {})\n",
            self.batch,
            self.largest_size,
            format_bytes(self.peak_bytes),
            100.0 * super::utilization(self.peak_bytes, self.capacity_bytes),
            format_bytes(self.capacity_bytes),
            self.ceiling
        );
        for warning in &self.warnings {
            out += &format!("warning: {warning}\n");
        }
        out
    }
}
