//! Hearing about a tuning run as it happens.

use crate::plan::{Trial, TrialKind, Warning};

/// Hears about a tuning run as it happens (see [`Tuner::run_observed`](crate::Tuner::run_observed)).
///
/// Calls come from the thread running the tuner, between the meter's
/// measurements: [`trial_started`](Observer::trial_started) before the
/// trial's baseline is read, so that with a heap meter what an observer holds
/// is part of the baseline. An observer that allocates on another thread while
/// a trial runs is measured with the trial. Every method does nothing by default; `()` observes nothing.
pub trait Observer {
    /// The uncounted warm-up step at `batch` is about to run.
    fn warmup_started(&mut self, batch: usize) {
        let _ = batch;
    }
    /// The evaluation step's own search is about to start at `start` (see
    /// [`Tuner::run_with_eval_observed`](crate::Tuner::run_with_eval_observed));
    /// its trials follow.
    fn evaluation_started(&mut self, start: usize) {
        let _ = start;
    }
    /// The evaluation step's search alone is about to start at `start`, the
    /// training workload having freed `freed_bytes` of optimizer state (see
    /// [`Tuner::run_with_eval_observed`](crate::Tuner::run_with_eval_observed));
    /// its trials follow.
    fn evaluation_alone_started(&mut self, start: usize, freed_bytes: u64) {
        let _ = (start, freed_bytes);
    }
    /// The search at input size `size` is about to start (see
    /// [`Tuner::run_sizes_observed`](crate::Tuner::run_sizes_observed)); its
    /// trials follow.
    fn size_started(&mut self, size: usize) {
        let _ = size;
    }
    /// A search over the input size at `batch` is about to start (see
    /// [`Tuner::run_longest_observed`](crate::Tuner::run_longest_observed)):
    /// in the trials that follow, `batch` is the input size tried.
    fn size_search_started(&mut self, batch: usize) {
        let _ = batch;
    }
    /// The variant `name` of a comparison is about to be tuned (see
    /// [`Tuner::compare_observed`](crate::Tuner::compare_observed)); its trials follow.
    fn variant_started(&mut self, name: &str) {
        let _ = name;
    }
    /// The variant `name` of a comparison was tuned: its largest batch, or
    /// `None` when nothing fit.
    fn variant_finished(&mut self, name: &str, largest_batch: Option<usize>) {
        let _ = (name, largest_batch);
    }
    /// A trial at `batch` is about to run.
    fn trial_started(&mut self, batch: usize, kind: TrialKind) {
        let _ = (batch, kind);
    }
    /// A trial ended; `capacity_bytes` is the device capacity, for utilization.
    fn trial_finished(&mut self, trial: &Trial, capacity_bytes: u64) {
        let _ = (trial, capacity_bytes);
    }
    /// A warning was added to the plan.
    fn warning(&mut self, warning: &Warning) {
        let _ = warning;
    }
}

impl Observer for () {}
