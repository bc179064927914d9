//! Trials: what each one ran, why, and what its peak was made of.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::search::Outcome;

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
    /// A timed run of a fitting batch, for [`Objective::Throughput`](crate::plan::Objective::Throughput).
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

/// One measured run of the workload at one batch size (and, in a search over
/// the input size, at one size).
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
    #[serde(rename = "duration_s", with = "super::seconds")]
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
    /// The input size tried, in a search over the size at one batch
    /// ([`LongestSize::trials`](crate::plan::LongestSize::trials)); `None` in a
    /// search over the batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<usize>,
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
