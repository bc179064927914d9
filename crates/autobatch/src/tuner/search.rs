//! One search, set up by [`Tuner::search`]: a workload on a meter, its
//! options, and the question that ends it.

use super::Tuner;
use crate::collective::Collective;
use crate::setting::Setting;
use crate::{Error, MemoryMeter, Plan, Value, Workload};

/// A search of one workload on one meter. What it answers is the method that
/// ends it: [`run`](Search::run), the largest batch and the plan;
/// [`sizes`](Search::sizes), the largest batch at each input size;
/// [`longest`](Search::longest), the longest input at a batch. What else it
/// does are its options: [`evaluating`](Search::evaluating) the evaluation
/// step too, [`across`](Search::across) the ranks of a data-parallel job.
/// The tuner's settings and its [`observer`](Tuner::observer) apply to all.
///
/// ```
/// use autobatch::memory::simulated::{MemoryCurve, Simulation};
/// use autobatch::Tuner;
///
/// let (mut workload, mut meter) = Simulation::new(16 << 30, MemoryCurve::affine(2 << 30, 64 << 20)).build();
/// let tuner = Tuner::new();
/// let plan = tuner.search(&mut workload, &mut meter).run()?;
/// assert_eq!(plan.largest_batch(), tuner.run(&mut workload, &mut meter)?.largest_batch());
/// # Ok::<(), autobatch::Error>(())
/// ```
#[must_use = "a search runs when run, sizes or longest ends it"]
pub struct Search<'a, W: ?Sized, M: ?Sized> {
    pub(super) tuner: &'a Tuner,
    pub(super) workload: &'a mut W,
    pub(super) meter: &'a mut M,
    evaluation: Option<&'a mut dyn Workload>,
    ranks: Option<&'a dyn Collective>,
}

impl Tuner {
    /// A search of `workload` on `meter` with this tuner's settings, to be
    /// given its options and ended by its question (see [`Search`]).
    /// `tuner.run(w, m)` is `tuner.search(w, m).run()`.
    pub fn search<'a, W: ?Sized, M: ?Sized>(&'a self, workload: &'a mut W, meter: &'a mut M) -> Search<'a, W, M> {
        Search { tuner: self, workload, meter, evaluation: None, ranks: None }
    }
}

impl<'a, W: ?Sized, M: ?Sized> Search<'a, W, M> {
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
    /// let mut training = ModelProbe::new(&varmap, |samples| loss::mse(&model.forward(&input(samples)?)?, &input(samples)?))
    ///     .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())?;
    /// let mut evaluation = ModelProbe::new(&varmap, |samples| model.forward(&input(samples)?)).forward_only();
    /// let mut meter = HeapMeter::with_room(4 << 20)?;
    /// let plan = Tuner::new().search(&mut training, &mut meter).evaluating(&mut evaluation).run()?;
    /// let evaluation = plan.evaluation().unwrap();
    /// let during = evaluation.during_training.as_ref().unwrap();
    /// assert!(evaluation.largest_batch >= during.largest_batch && during.largest_batch > plan.largest_batch());
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn evaluating(mut self, evaluation: &'a mut dyn Workload) -> Self {
        self.evaluation = Some(evaluation);
        self
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
    pub fn across(mut self, ranks: &'a dyn Collective) -> Self {
        self.ranks = Some(ranks);
        self
    }

    /// Refuses the options that [`run`](Search::run) alone takes: the
    /// searches over the input size are of one step on one device.
    pub(super) fn batches_only(&self) -> Result<(), Error> {
        if self.evaluation.is_some() {
            return Err(Error::invalid(
                Setting::Evaluation,
                Value::Given,
                "a search over the input size is of the training step: search the evaluation step with `run`",
            ));
        }
        if self.ranks.is_some() {
            return Err(Error::invalid(
                Setting::Ranks,
                Value::Given,
                "a search over the input size runs on one rank: search the ranks' batch with `run`",
            ));
        }
        Ok(())
    }
}

impl<W: Workload + ?Sized, M: MemoryMeter + ?Sized> Search<'_, W, M> {
    /// The largest batch that fits under the ceiling, and the plan from it
    /// (what [`Tuner::run`] answers); with [`evaluating`](Search::evaluating)
    /// the evaluation step's too, [`across`](Search::across) the ranks' agreed
    /// one. The evaluation step is searched on one rank: both options at once
    /// are refused.
    pub fn run(self) -> Result<Plan, Error> {
        let settings = self.tuner.settings()?;
        let mut observer = self.tuner.observing();
        let Search { workload, meter, evaluation, ranks, .. } = self;
        let plan = match (evaluation, ranks) {
            (None, None) => settings.search(workload, meter, &mut observer),
            (Some(evaluation), None) => settings.run_with_eval(workload, evaluation, meter, &mut observer),
            (None, Some(ranks)) => settings.run_distributed(workload, meter, ranks, &mut observer),
            (Some(_), Some(_)) => Err(Error::invalid(
                Setting::Evaluation,
                Value::Given,
                "the evaluation step is searched on one rank: search it without `across`",
            )),
        };
        let _ = workload.free_training_state();
        plan
    }
}
