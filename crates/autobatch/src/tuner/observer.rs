//! Hearing about a tuning run as it happens.

use std::sync::{Arc, Mutex, PoisonError};

use crate::plan::{Trial, TrialKind, Warning};

/// Hears about a tuning run as it happens: give it to a tuner with
/// [`Tuner::observer`](crate::Tuner::observer), and every search that tuner
/// runs tells it about each trial.
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
    /// [`Search::evaluating`](crate::Search::evaluating));
    /// its trials follow.
    fn evaluation_started(&mut self, start: usize) {
        let _ = start;
    }
    /// The evaluation step's search alone is about to start at `start`, the
    /// training workload having freed `freed_bytes` of optimizer state (see
    /// [`Search::evaluating`](crate::Search::evaluating));
    /// its trials follow.
    fn evaluation_alone_started(&mut self, start: usize, freed_bytes: u64) {
        let _ = (start, freed_bytes);
    }
    /// The search at input size `size` is about to start (see
    /// [`Search::sizes`](crate::Search::sizes)); its
    /// trials follow.
    fn size_started(&mut self, size: usize) {
        let _ = size;
    }
    /// A search over the input size at `batch` is about to start (see
    /// [`Search::longest`](crate::Search::longest)):
    /// in the trials that follow, `batch` is the input size tried.
    fn size_search_started(&mut self, batch: usize) {
        let _ = batch;
    }
    /// The variant `name` of a comparison is about to be tuned (see
    /// [`Search::compare`](crate::Search::compare)); its trials follow.
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

/// The observer a [`Tuner`](crate::Tuner) holds: shared, so that the tuner
/// stays `Clone` and its caller can keep a handle to read it, and locked per
/// call, so that ranks on threads can run one tuner's searches at once.
#[derive(Clone)]
pub(crate) struct HeldObserver(pub(crate) Arc<Mutex<dyn Observer + Send>>);

impl std::fmt::Debug for HeldObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeldObserver")
    }
}

impl PartialEq for HeldObserver {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// What a search tells: the tuner's observer, when it holds one.
pub(crate) struct Observing<'a>(pub(crate) Option<&'a HeldObserver>);

impl Observing<'_> {
    fn with(&mut self, call: impl FnOnce(&mut dyn Observer)) {
        if let Some(held) = self.0 {
            call(&mut *held.0.lock().unwrap_or_else(PoisonError::into_inner));
        }
    }
}

impl Observer for Observing<'_> {
    fn warmup_started(&mut self, batch: usize) {
        self.with(|o| o.warmup_started(batch));
    }
    fn evaluation_started(&mut self, start: usize) {
        self.with(|o| o.evaluation_started(start));
    }
    fn evaluation_alone_started(&mut self, start: usize, freed_bytes: u64) {
        self.with(|o| o.evaluation_alone_started(start, freed_bytes));
    }
    fn size_started(&mut self, size: usize) {
        self.with(|o| o.size_started(size));
    }
    fn size_search_started(&mut self, batch: usize) {
        self.with(|o| o.size_search_started(batch));
    }
    fn variant_started(&mut self, name: &str) {
        self.with(|o| o.variant_started(name));
    }
    fn variant_finished(&mut self, name: &str, largest_batch: Option<usize>) {
        self.with(|o| o.variant_finished(name, largest_batch));
    }
    fn trial_started(&mut self, batch: usize, kind: TrialKind) {
        self.with(|o| o.trial_started(batch, kind));
    }
    fn trial_finished(&mut self, trial: &Trial, capacity_bytes: u64) {
        self.with(|o| o.trial_finished(trial, capacity_bytes));
    }
    fn warning(&mut self, warning: &Warning) {
        self.with(|o| o.warning(warning));
    }
}
