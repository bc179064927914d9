//! The throughput objective: samples per second near the largest batch.

use serde::{Deserialize, Serialize};

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

impl Objective {
    /// Every objective, in the order the command line lists them.
    pub const ALL: [Objective; 2] = [Objective::LargestBatch, Objective::Throughput];

    /// The name used on the command line: `largest`, `throughput`.
    pub fn name(self) -> &'static str {
        match self {
            Objective::LargestBatch => "largest",
            Objective::Throughput => "throughput",
        }
    }
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
