//! One search, set up by [`Tuner::search`]: a workload on a meter, its
//! options, and the question that ends it.

use super::engine::Engine;
use super::{Observer, Settings, Tuner};
use crate::collective::Collective;
use crate::plan::BatchCheck;
use crate::{Error, MemoryMeter, Plan, Setting, Valid, Value, Workload};

/// A search of one subject on one meter: the one way a tuner runs. What it
/// answers is the method that ends it, and the subject's type says which
/// there are. Of a [`Workload`] (a model's step): [`run`](Search::run), the
/// largest batch and the plan; [`sizes`](Search::sizes), the largest batch
/// at each input size; [`longest`](Search::longest), the longest input at a
/// batch; its options [`evaluating`](Search::evaluating) the evaluation step
/// too and [`across`](Search::across) the ranks of a data-parallel job. Of
/// variants (a `Vec` of [`ModelVariant`](crate::ModelVariant)):
/// [`compare`](Search::compare), each tuned side by side. Of a
/// [`Server`](crate::serve::Server): [`sequences`](Search::sequences),
/// [`context`](Search::context), [`measure`](Search::measure) (see
/// [`Scheduling`](crate::serve::Scheduling)). The tuner's settings, its
/// ceiling and its [`observer`](Tuner::observer) apply to all.
///
/// An option is part of the search's type (`O`: `Alone`, `Evaluating` or
/// `Across`, which you need not name), so a search no question takes does
/// not compile: one option
/// at a time, and the searches over the input size take none (the
/// evaluation step is searched on one rank; a size search is of the
/// training step on one device).
///
/// ```compile_fail
/// # use autobatch::memory::simulated::{MemoryCurve, Simulation};
/// # use autobatch::collective::ThreadCollective;
/// # let ranks = ThreadCollective::group(1)?;
/// # let (mut training, mut meter) = Simulation::new(1 << 30, MemoryCurve::affine(0, 1 << 20)).build();
/// # let (mut evaluation, _) = Simulation::new(1 << 30, MemoryCurve::affine(0, 1 << 20)).build();
/// // the evaluation step across ranks: no such search
/// autobatch::Tuner::new().search(&mut training, &mut meter).evaluating(&mut evaluation).across(&ranks[0]).run()?;
/// # Ok::<(), autobatch::Error>(())
/// ```
///
/// ```compile_fail
/// # use autobatch::memory::simulated::{MemoryCurve, SizedSimulation};
/// # use autobatch::collective::ThreadCollective;
/// # let ranks = ThreadCollective::group(1)?;
/// # let (mut workload, mut meter) = SizedSimulation::new(1 << 30, 64, |b, s| (b * s) as u64).build();
/// // a size search across ranks: no such search
/// autobatch::Tuner::new().search(&mut workload, &mut meter).across(&ranks[0]).sizes(&[32, 64])?;
/// # Ok::<(), autobatch::Error>(())
/// ```
///
/// ```
/// use autobatch::memory::simulated::{MemoryCurve, Simulation};
/// use autobatch::Tuner;
///
/// let (mut workload, mut meter) = Simulation::new(16 << 30, MemoryCurve::affine(2 << 30, 64 << 20)).build();
/// let tuner = Tuner::new();
/// let plan = tuner.search(&mut workload, &mut meter).run()?;
/// assert!(plan.proven_largest());
/// # Ok::<(), autobatch::Error>(())
/// ```
#[must_use = "a search runs when run, sizes or longest ends it"]
pub struct Search<'a, W: ?Sized, M: ?Sized, O = Alone> {
    pub(super) tuner: &'a Tuner,
    pub(super) workload: &'a mut W,
    pub(super) meter: &'a mut M,
    option: O,
}

/// A [`Search`] without an option: [`run`](Search::run),
/// [`sizes`](Search::sizes) and [`longest`](Search::longest) end it.
pub struct Alone;

/// A [`Search`] of the evaluation step too ([`Search::evaluating`]):
/// [`run`](Search::run) ends it.
pub struct Evaluating<'a>(&'a mut dyn Workload);

/// A [`Search`] on every rank ([`Search::across`]): [`run`](Search::run) ends it.
pub struct Across<'a>(&'a dyn Collective);

impl Tuner {
    /// A search of `workload` on `meter` with this tuner's settings, to be
    /// given its options and ended by its question (see [`Search`]).
    pub fn search<'a, W: ?Sized, M: ?Sized>(&'a self, workload: &'a mut W, meter: &'a mut M) -> Search<'a, W, M> {
        Search { tuner: self, workload, meter, option: Alone }
    }
}

impl<'a, W: ?Sized, M: ?Sized> Search<'a, W, M, Alone> {
    /// The tuner, the subject and the meter: for a question asked in another
    /// module (a server's).
    pub(crate) fn parts(self) -> (&'a Tuner, &'a mut W, &'a mut M) {
        (self.tuner, self.workload, self.meter)
    }

    /// Also find the evaluation step's own largest batch (forward only:
    /// usually larger), from the training answer: with the training state
    /// held, as between training steps, then alone when the workload can free
    /// its optimizer's state ([`Workload::free_training_state`]). The plan's
    /// [`evaluation`](Plan::evaluation) holds both; docs/library.md tells more.
    ///
    /// ```
    /// # #[global_allocator]
    /// # static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
    /// use autobatch::{HeapMeter, ModelProbe, Tuner};
    /// use candle_core::{DType, Device, Module, Tensor};
    /// use candle_nn::{linear, loss, ParamsAdamW, VarBuilder, VarMap};
    ///
    /// let varmap = VarMap::new();
    /// let model = linear(256, 256, VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    /// let input = |samples: usize| Tensor::ones((samples, 256), DType::F32, &Device::Cpu);
    /// let mut training = ModelProbe::new(&varmap, |batch| loss::mse(&model.forward(&input(batch.len)?)?, &input(batch.len)?))
    ///     .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())?;
    /// let mut evaluation = ModelProbe::new(&varmap, |batch| model.forward(&input(batch.len)?)).forward_only();
    /// let mut meter = HeapMeter::with_room(4 << 20)?;
    /// let plan = Tuner::new().search(&mut training, &mut meter).evaluating(&mut evaluation).run()?;
    /// let evaluation = plan.evaluation().unwrap();
    /// let during = evaluation.during_training.as_ref().unwrap();
    /// assert!(evaluation.largest_batch >= during.largest_batch && during.largest_batch > plan.largest_batch());
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn evaluating(self, evaluation: &'a mut dyn Workload) -> Search<'a, W, M, Evaluating<'a>> {
        Search { tuner: self.tuner, workload: self.workload, meter: self.meter, option: Evaluating(evaluation) }
    }

    /// Search on every rank of a data-parallel job and agree on one batch:
    /// the smallest of the ranks' largest, verified on every rank, the
    /// accumulation planned for the collective's world size; with
    /// [`uneven_ranks`](Tuner::uneven_ranks), each rank's own batch and the
    /// global batch shared in proportion ([`RankSplit::plan`](crate::plan::RankSplit::plan)).
    /// When a rank cannot tune, every rank fails ([`Error::RankFailed`] on the
    /// others), so that none trains alone.
    ///
    /// ```
    /// use autobatch::collective::ThreadCollective;
    /// use autobatch::memory::simulated::{MemoryCurve, Simulation};
    /// use autobatch::Tuner;
    ///
    /// let ranks = ThreadCollective::group(2)?;
    /// let capacities = [80u64 << 30, 40 << 30];
    /// let plans = std::thread::scope(|s| {
    ///     let runs: Vec<_> = ranks
    ///         .iter()
    ///         .zip(capacities)
    ///         .map(|(rank, capacity)| {
    ///             s.spawn(move || {
    ///                 let (mut step, mut meter) = Simulation::new(capacity, MemoryCurve::affine(8 << 30, 256 << 20)).build();
    ///                 Tuner::new().target_effective_batch(512).search(&mut step, &mut meter).across(rank).run()
    ///             })
    ///         })
    ///         .collect();
    ///     runs.into_iter().map(|r| r.join().unwrap()).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(plans[0].largest_batch(), plans[1].largest_batch()); // the 40 GiB rank decides
    /// assert_eq!(plans[0].effective_batch(), 512); // the target, over both ranks
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn across(self, ranks: &'a dyn Collective) -> Search<'a, W, M, Across<'a>> {
        Search { tuner: self.tuner, workload: self.workload, meter: self.meter, option: Across(ranks) }
    }
}

impl<'a, W: Workload + ?Sized, M: MemoryMeter + ?Sized, O> Search<'a, W, M, O> {
    /// Runs `search` with the tuner's settings and observer, then frees the
    /// workload's training state (no ritual before training).
    fn finish(
        self,
        search: impl FnOnce(&Settings, &mut W, &mut M, O, &mut dyn Observer) -> Result<Plan, Error>,
    ) -> Result<Plan, Error> {
        let settings = self.tuner.settings()?;
        let mut observer = self.tuner.observing();
        let plan = search(&settings, &mut *self.workload, &mut *self.meter, self.option, &mut observer);
        let _ = self.workload.free_training_state();
        plan
    }
}

impl<W: Workload + ?Sized, M: MemoryMeter + ?Sized> Search<'_, W, M, Alone> {
    /// Probes the workload on the device the meter watches: the largest
    /// batch that fits under the ceiling, and the plan from it.
    ///
    /// Every trial resets the meter's peak, runs the step
    /// `steps_per_trial` times, synchronizes, reads the peak and releases cached
    /// memory. Out-of-memory errors (see [`is_oom`](crate::is_oom)) and peaks over the ceiling
    /// are failed trials; any other workload error ends the run as
    /// [`Error::Workload`]. When even the smallest candidate fails the result is
    /// [`Error::NothingFits`], never a default.
    ///
    /// Memory that does not come back after a failed trial is reported as a
    /// [`Warning::Leak`](crate::plan::Warning::Leak) in the plan rather than an error: the trials after it
    /// ran with less memory, so the answer stays safe, and the caller decides
    /// whether a leaking workload is acceptable. When memory in use rose after the
    /// chosen batch was measured, the batch is run again (a
    /// [`TrialKind::Recheck`](crate::plan::TrialKind::Recheck) trial) so that the answer fits the memory as it is now.
    /// The workload's training state is freed after the search
    /// ([`Workload::free_training_state`]): training starts beside nothing of it.
    pub fn run(self) -> Result<Plan, Error> {
        self.finish(|settings, workload, meter, Alone, observer| settings.search(workload, meter, observer))
    }
}

impl<W: Workload + ?Sized, M: MemoryMeter + ?Sized> Search<'_, W, M, Alone> {
    /// Whether `batch` fits, and whether it is the largest that does: a
    /// warm-up step, then `batch` and the next candidate up (one
    /// [`multiple_of`](Tuner::multiple_of) more) each run as a trial, with no
    /// search and no plan. The question "does N fit, and N + 1 not?" in two
    /// trials where a search bounded to N would call N + 1 nothing fitting.
    /// The workload's training state is freed after, as after a search.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] for a batch of 0 or one that is not a
    /// multiple of [`Tuner::multiple_of`]; the tuner's own settings' errors;
    /// a workload's error other than running out of memory.
    pub fn check(self, batch: usize) -> Result<BatchCheck, Error> {
        let settings = self.tuner.settings()?;
        let granule = settings.options.multiple_of;
        if batch == 0 {
            return Err(Error::zero(Setting::Batch));
        }
        if !batch.is_multiple_of(granule) {
            return Err(Error::invalid(
                Setting::Batch,
                Value::Count(batch),
                Valid::MultipleOf { setting: Setting::MultipleOf, value: granule },
            ));
        }
        let next = batch.checked_add(granule).ok_or(Error::batch_overflow(batch, &[Setting::Batch]))?;
        self.meter.under_ceiling(settings.ceiling);
        let capacity_bytes = self.meter.capacity()?;
        let mut observer = self.tuner.observing();
        let engine = Engine::new(&settings, &mut *self.workload, &mut *self.meter, &mut observer, capacity_bytes);
        let trials = engine.check(batch, next);
        let _ = self.workload.free_training_state();
        Ok(BatchCheck { batch, trials: trials?, capacity_bytes, ceiling: settings.ceiling })
    }
}

impl<W: Workload + ?Sized, M: MemoryMeter + ?Sized> Search<'_, W, M, Evaluating<'_>> {
    /// The largest training batch and the plan from it, with the evaluation
    /// step's own largest batch ([`Plan::evaluation`]).
    pub fn run(self) -> Result<Plan, Error> {
        self.finish(|settings, workload, meter, Evaluating(evaluation), observer| {
            settings.run_with_eval(workload, evaluation, meter, observer)
        })
    }
}

impl<W: Workload + ?Sized, M: MemoryMeter + ?Sized> Search<'_, W, M, Across<'_>> {
    /// The batch every rank agreed on, and the plan from it over the ranks.
    pub fn run(self) -> Result<Plan, Error> {
        self.finish(|settings, workload, meter, Across(ranks), observer| {
            settings.run_distributed(workload, meter, ranks, observer)
        })
    }
}
