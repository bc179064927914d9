//! The tuner: configuration, the trial loop, and the plan at the end.

use std::time::Instant;

use log::{debug, info, warn};

use crate::plan::{
    limit_bytes, plan_accumulation_aligned, utilization, EvaluationPlan, MemoryModel, Plan, Trial, TrialKind, Warning,
};
use crate::search::{best, next_batch, Next, Observation, SearchSpace, Strategy};
use crate::units::format_bytes;
use crate::{is_oom, CacheKey, Error, MemoryMeter, Outcome, Workload};

/// Finds the largest batch that fits under a utilization ceiling and plans
/// gradient accumulation from it.
///
/// Builder methods take and return `Self`; nothing is checked until
/// [`run`](Tuner::run) (or [`check`](Tuner::check)), which reports any invalid
/// setting as an [`Error`] before touching the device.
///
/// ```
/// use autobatch::memory::simulated::{MemoryCurve, Simulation};
/// use autobatch::{Strategy, Tuner};
///
/// let (mut workload, mut meter) = Simulation::new(80 << 30, MemoryCurve::affine(10 << 30, 300 << 20)).build();
/// let plan = Tuner::new()
///     .ceiling(0.85)
///     .multiple_of(8)
///     .strategy(Strategy::Binary)
///     .target_effective_batch(1024)
///     .world_size(4)
///     .run(&mut workload, &mut meter)?;
/// // (0.85 × 80 GiB − 10 GiB) / 300 MiB = 197.97, rounded down to a multiple of 8
/// assert_eq!(plan.largest_batch, 192);
/// // 1024 = 128 × 2 accumulation steps × 4 ranks
/// assert_eq!((plan.micro_batch, plan.accumulation_steps, plan.effective_batch), (128, 2, 1024));
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Tuner {
    ceiling: f64,
    start: usize,
    max_batch: Option<usize>,
    multiple_of: usize,
    max_trials: Option<usize>,
    steps_per_trial: usize,
    strategy: Strategy,
    target_effective_batch: Option<usize>,
    world_size: usize,
    exact_effective_batch: bool,
    warmup: bool,
    profile: Option<crate::Profile>,
    cache_path: Option<std::path::PathBuf>,
    cache_key: Option<CacheKey>,
}

impl Default for Tuner {
    fn default() -> Self {
        Tuner {
            ceiling: 0.90,
            start: 1,
            max_batch: None,
            multiple_of: 1,
            max_trials: None,
            steps_per_trial: 1,
            strategy: Strategy::Binary,
            target_effective_batch: None,
            world_size: 1,
            exact_effective_batch: false,
            warmup: true,
            profile: None,
            cache_path: None,
            cache_key: None,
        }
    }
}

impl Tuner {
    /// A tuner with the defaults: ceiling 0.90, start 1, multiple_of 1, one step
    /// per trial, world size 1, [`Strategy::Binary`], no batch or trial limit, no
    /// target effective batch, a warm-up step.
    pub fn new() -> Self {
        Self::default()
    }

    /// The most a fitting step may use, as a fraction in (0, 1] of the device's
    /// capacity (device-wide, not of the memory free at start). Default 0.90.
    pub fn ceiling(mut self, ceiling: f64) -> Self {
        self.ceiling = ceiling;
        self
    }

    /// The smallest batch to consider (rounded up to `multiple_of`). Default 1.
    pub fn start(mut self, start: usize) -> Self {
        self.start = start;
        self
    }

    /// The largest batch to consider (rounded down to `multiple_of`): the search
    /// tries it once when the next doubling would pass it. Default: no limit.
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = Some(max_batch);
        self
    }

    /// Only batches that are multiples of this are tried and returned (8 for
    /// tensor cores, say). Default 1.
    pub fn multiple_of(mut self, multiple_of: usize) -> Self {
        self.multiple_of = multiple_of;
        self
    }

    /// Stops after this many search trials with the best batch verified so far,
    /// flagged as not proven largest. Default: no limit.
    pub fn max_trials(mut self, max_trials: usize) -> Self {
        self.max_trials = Some(max_trials);
        self
    }

    /// Workload steps per trial; the trial's peak is the highest over them
    /// (use 2 or more when the first step allocates state lazily). Default 1.
    pub fn steps_per_trial(mut self, steps_per_trial: usize) -> Self {
        self.steps_per_trial = steps_per_trial;
        self
    }

    /// The search strategy. Default [`Strategy::Binary`].
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// The effective (global) batch to reach with micro-batches ×
    /// accumulation steps × ranks. Default: none (train at the largest batch).
    pub fn target_effective_batch(mut self, target: usize) -> Self {
        self.target_effective_batch = Some(target);
        self
    }

    /// The number of data-parallel ranks. Default 1.
    pub fn world_size(mut self, world_size: usize) -> Self {
        self.world_size = world_size;
        self
    }

    /// Demand that the effective batch equals the target exactly: when no split
    /// hits it, [`run`](Tuner::run) fails with [`Error::InexactEffectiveBatch`]
    /// instead of returning the nearest batch above. Default false.
    pub fn exact_effective_batch(mut self, exact: bool) -> Self {
        self.exact_effective_batch = exact;
        self
    }

    /// Run one uncounted step at the smallest candidate before the first trial,
    /// so that memory a runtime keeps for good once used (cuBLAS workspaces,
    /// loaded kernels, per-thread scratch buffers) is in the baseline. Default true.
    pub fn warmup(mut self, warmup: bool) -> Self {
        self.warmup = warmup;
        self
    }

    /// What the model's training state is made of, for the advice that comes
    /// with [`Error::NothingFits`]; overrides the workload's own
    /// [`Workload::profile`]. Default: the workload's, if any.
    pub fn profile(mut self, profile: crate::Profile) -> Self {
        self.profile = Some(profile);
        self
    }

    /// Keeps plans in a JSON file at `path`: a run whose model, device and
    /// search settings match a stored plan returns it without probing (logged),
    /// any change misses and probes. The model's part of the key comes from
    /// [`cache_key`](Tuner::cache_key) or the workload's
    /// [`Workload::cache_key`]; without either, `run` fails with
    /// [`Error::CacheKeyMissing`]. A corrupt, unreadable or foreign file is
    /// ignored with a warning (and never written over); writes are atomic.
    pub fn cache(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.cache_path = Some(path.into());
        self
    }

    /// The model's part of the cache key (its variables and the input shapes
    /// that decide memory); overrides the workload's own.
    pub fn cache_key(mut self, key: CacheKey) -> Self {
        self.cache_key = Some(key);
        self
    }

    /// Checks every setting without running anything.
    ///
    /// ```
    /// use autobatch::{Error, Tuner};
    /// assert!(Tuner::new().check().is_ok());
    /// assert!(matches!(Tuner::new().ceiling(1.5).check(), Err(Error::InvalidCeiling { .. })));
    /// ```
    pub fn check(&self) -> Result<(), Error> {
        self.search_space().map(|_| ())
    }

    fn search_space(&self) -> Result<SearchSpace, Error> {
        if !(self.ceiling > 0.0 && self.ceiling <= 1.0) {
            return Err(Error::InvalidCeiling { ceiling: self.ceiling });
        }
        for (setting, value) in [
            ("steps_per_trial", Some(self.steps_per_trial)),
            ("world_size", Some(self.world_size)),
            ("max_trials", self.max_trials),
            ("target_effective_batch", self.target_effective_batch),
        ] {
            if value == Some(0) {
                return Err(Error::Zero { setting });
            }
        }
        let space = SearchSpace::new(self.start, self.max_batch, self.multiple_of)?;
        if let Some(target) = self.target_effective_batch {
            let smallest =
                self.world_size.checked_mul(self.multiple_of).ok_or(Error::Overflow { value: self.world_size })?;
            if target < smallest {
                return Err(Error::TargetBelowWorldSize {
                    target,
                    world_size: self.world_size,
                    multiple_of: self.multiple_of,
                    smallest,
                });
            }
        }
        Ok(space)
    }

    /// Probes `workload` on the device `meter` watches and returns the plan.
    ///
    /// Every trial resets the meter's peak, runs the step
    /// `steps_per_trial` times, synchronizes, reads the peak and releases cached
    /// memory. Out-of-memory errors (see [`is_oom`]) and peaks over the ceiling
    /// are failed trials; any other workload error ends the run as
    /// [`Error::Workload`]. When even the smallest candidate fails the result is
    /// [`Error::NothingFits`], never a default.
    ///
    /// Memory that does not come back after a failed trial is reported as a
    /// [`Warning::Leak`] in the plan rather than an error: the trials after it
    /// ran with less memory, so the answer stays safe, and the caller decides
    /// whether a leaking workload is acceptable. When memory in use rose after the
    /// chosen batch was measured, the batch is run again (a
    /// [`TrialKind::Recheck`] trial) so that the answer fits the memory as it is now.
    pub fn run<W, M>(&self, workload: &mut W, meter: &mut M) -> Result<Plan, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
    {
        self.run_observed(workload, meter, &mut ())
    }

    /// [`run`](Tuner::run) on every rank of a data-parallel job, then
    /// agreement: the batch every rank trains with is the smallest of the ranks'
    /// largest batches (mixed GPUs, uneven free memory), verified on every rank
    /// that has not run it, and the accumulation is planned for the
    /// collective's world size. When any rank cannot tune, every rank fails
    /// ([`Error::RankFailed`] on the others), so that no rank trains alone.
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
    ///                 Tuner::new().target_effective_batch(512).run_distributed(&mut step, &mut meter, rank)
    ///             })
    ///         })
    ///         .collect();
    ///     runs.into_iter().map(|r| r.join().unwrap()).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// assert_eq!(plans[0].largest_batch, plans[1].largest_batch); // the 40 GiB rank decides
    /// assert_eq!(plans[0].micro_batch * plans[0].accumulation_steps * 2, 512);
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn run_distributed<W, M, C>(&self, workload: &mut W, meter: &mut M, collective: &C) -> Result<Plan, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
        C: crate::collective::Collective + ?Sized,
    {
        let world_size = collective.world_size();
        if self.world_size != 1 && self.world_size != world_size {
            return Err(Error::WorldSizeMismatch { tuner: self.world_size, collective: world_size });
        }
        let local = Tuner { world_size: 1, target_effective_batch: None, exact_effective_batch: false, ..self.clone() };
        let mut result = local.run(workload, meter);
        // A few rounds: agree on the smallest answer; every rank that has not
        // seen it fit runs it; when one fails there, all search below it.
        for _ in 0..4 {
            let mine = result.as_ref().map_or(0, |plan| plan.largest_batch as u64);
            let agreed = collective.all_reduce_min(mine)? as usize;
            let mut plan = match (result, agreed) {
                (Err(err), _) => return Err(err),
                (Ok(_), 0) => return Err(Error::RankFailed),
                (Ok(plan), _) => plan,
            };
            let seen = plan.trials.iter().rev().find(|t| t.batch == agreed).map(|t| t.outcome.fits());
            let verified = match seen {
                Some(fits) => Ok(fits),
                None => {
                    let check = Tuner {
                        start: agreed,
                        max_batch: Some(agreed),
                        max_trials: Some(1),
                        warmup: false,
                        ..local.clone()
                    };
                    match check.run(workload, meter) {
                        Ok(checked) => {
                            plan.trials.extend(checked.trials);
                            plan.peak_bytes = checked.peak_bytes;
                            Ok(true)
                        }
                        Err(Error::NothingFits { .. }) => Ok(false),
                        Err(err) => Err(err),
                    }
                }
            };
            // 2: fits here; 1: does not fit here; 0: failed here (everyone stops)
            let status = match verified {
                Ok(true) => 2,
                Ok(false) => 1,
                Err(_) => 0,
            };
            let everywhere = collective.all_reduce_min(status)?;
            verified?;
            if everywhere == 0 {
                return Err(Error::RankFailed);
            }
            if everywhere == 2 {
                if let Some(trial) = plan.trials.iter().rev().find(|t| t.batch == agreed) {
                    plan.peak_bytes = trial.peak_bytes.unwrap_or(plan.peak_bytes);
                }
                plan.rank_largest_batch = Some(plan.largest_batch);
                plan.largest_batch = agreed;
                let with_ranks = Tuner { world_size, ..self.clone() };
                let (micro_batch, accumulation_steps, effective_batch, accumulation) = with_ranks.split(agreed)?;
                plan.world_size = world_size;
                plan.target_effective_batch = self.target_effective_batch;
                (plan.micro_batch, plan.accumulation_steps, plan.effective_batch, plan.accumulation) =
                    (micro_batch, accumulation_steps, effective_batch, accumulation);
                return Ok(plan);
            }
            // some rank cannot run the agreed batch: everyone searches below it
            let below = agreed.saturating_sub(self.multiple_of);
            result = if below < self.start {
                Err(Error::RankFailed)
            } else {
                Tuner { max_batch: Some(below), ..local.clone() }.run(workload, meter)
            };
        }
        Err(Error::Collective("the ranks did not agree on a batch in 4 rounds".to_owned()))
    }

    /// [`run`](Tuner::run) for the training step, then a search for the
    /// evaluation step's own largest batch (forward only: usually larger),
    /// starting from the training answer. The plan's
    /// [`evaluation`](Plan::evaluation) says it.
    ///
    /// ```
    /// # #[global_allocator]
    /// # static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
    /// use autobatch::workloads::TransformerConfig;
    /// use autobatch::{HeapMeter, Tuner};
    ///
    /// let mut model = TransformerConfig::tiny().build(&candle_core::Device::Cpu)?;
    /// let mut evaluation = model.evaluation();
    /// let mut meter = HeapMeter::new(16 << 20)?;
    /// let plan = Tuner::new().run_with_eval(&mut model, &mut evaluation, &mut meter)?;
    /// assert!(plan.evaluation.unwrap().largest_batch > plan.largest_batch);
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn run_with_eval<W, E, M>(&self, train: &mut W, eval: &mut E, meter: &mut M) -> Result<Plan, Error>
    where
        W: Workload + ?Sized,
        E: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
    {
        self.run_with_eval_observed(train, eval, meter, &mut ())
    }

    /// [`run_with_eval`](Tuner::run_with_eval) with an [`Observer`] of both searches.
    pub fn run_with_eval_observed<W, E, M, O>(
        &self,
        train: &mut W,
        eval: &mut E,
        meter: &mut M,
        observer: &mut O,
    ) -> Result<Plan, Error>
    where
        W: Workload + ?Sized,
        E: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
        O: Observer + ?Sized,
    {
        let mut plan = self.run_observed(train, meter, observer)?;
        let from_training = Tuner {
            start: plan.largest_batch.max(self.start),
            target_effective_batch: None,
            world_size: 1,
            exact_effective_batch: false,
            ..self.clone()
        };
        info!("evaluation step: searching from batch {}", from_training.start);
        let evaluated = match from_training.run(eval, meter) {
            // an evaluation step bigger than the training step at the same batch
            Err(Error::NothingFits { .. }) => Tuner { start: self.start, ..from_training }.run(eval, meter)?,
            other => other?,
        };
        plan.warnings.extend(evaluated.warnings);
        plan.evaluation = Some(EvaluationPlan {
            largest_batch: evaluated.largest_batch,
            peak_bytes: evaluated.peak_bytes,
            proven_largest: evaluated.proven_largest,
            trials: evaluated.trials,
        });
        Ok(plan)
    }

    /// [`run`](Tuner::run), telling `observer` about each trial as it starts and
    /// ends: for live progress in a command-line tool or a trainer's log.
    ///
    /// ```
    /// use autobatch::memory::simulated::{MemoryCurve, Simulation};
    /// use autobatch::{Observer, Trial, Tuner};
    ///
    /// struct Rows(Vec<String>);
    /// impl Observer for Rows {
    ///     fn trial_finished(&mut self, trial: &Trial, _capacity_bytes: u64) {
    ///         self.0.push(format!("{} {}", trial.batch, trial.outcome));
    ///     }
    /// }
    /// let (mut workload, mut meter) = Simulation::new(1 << 30, MemoryCurve::affine(0, 100 << 20)).build();
    /// let mut rows = Rows(Vec::new());
    /// Tuner::new().run_observed(&mut workload, &mut meter, &mut rows)?;
    /// assert_eq!(rows.0[..3], ["1 fits", "2 fits", "4 fits"]);
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn run_observed<W, M, O>(&self, workload: &mut W, meter: &mut M, observer: &mut O) -> Result<Plan, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
        O: Observer + ?Sized,
    {
        let space = self.search_space()?;
        let capacity_bytes = meter.capacity()?;
        let limit = limit_bytes(self.ceiling, capacity_bytes);
        let space = space.with_limit(limit);
        let cache = match &self.cache_path {
            Some(path) => Some((path.clone(), self.full_cache_key(&*workload, &*meter, capacity_bytes)?)),
            None => None,
        };
        if let Some((path, key)) = &cache {
            if let Some(plan) = crate::cache::lookup(path, key) {
                return self.replan_cached(plan);
            }
        }
        info!(
            "tuning: {} search, ceiling {:.0}% of {} = {}, batches {}..={} in multiples of {}",
            self.strategy,
            self.ceiling * 100.0,
            format_bytes(capacity_bytes),
            format_bytes(limit),
            space.first(),
            space.last(),
            space.multiple_of()
        );
        let mut probe = Probe {
            tuner: self,
            workload,
            meter,
            capacity_bytes,
            limit,
            trials: Vec::new(),
            history: Vec::new(),
            baselines: Vec::new(),
            warnings: Vec::new(),
            observer,
        };
        if self.warmup {
            probe.warm_up(space.first())?;
        }
        let proven_largest = probe.search(&space)?;
        let profile = self.profile.or_else(|| probe.workload.profile());
        let plan = probe.into_plan(proven_largest, profile)?;
        if let Some((path, key)) = &cache {
            crate::cache::store(path, key, &plan);
        }
        Ok(plan)
    }
}

type Split = (usize, usize, usize, Option<crate::Accumulation>);

impl Tuner {
    /// micro-batch, accumulation steps, effective batch and the split, from the largest batch.
    fn split(&self, largest_batch: usize) -> Result<Split, Error> {
        match self.target_effective_batch {
            Some(target) => {
                let mut split = plan_accumulation_aligned(target, self.world_size, largest_batch, self.multiple_of)?;
                if self.exact_effective_batch {
                    split = split.require_exact()?;
                }
                if !split.exact {
                    warn!(
                        "effective batch {} is {} above the target {}: no exact split within twice the fewest steps",
                        split.effective_batch, split.deviation, target
                    );
                }
                Ok((split.micro_batch, split.accumulation_steps, split.effective_batch, Some(split)))
            }
            None => {
                let effective =
                    largest_batch.checked_mul(self.world_size).ok_or(Error::Overflow { value: largest_batch })?;
                Ok((largest_batch, 1, effective, None))
            }
        }
    }

    /// The whole cache key: the model's (given, or the workload's), the
    /// device's, the search settings and the crate version.
    fn full_cache_key<W, M>(&self, workload: &W, meter: &M, capacity_bytes: u64) -> Result<CacheKey, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
    {
        let model = self.cache_key.clone().or_else(|| workload.cache_key()).ok_or(Error::CacheKeyMissing)?;
        Ok(model
            .param("autobatch.version", env!("CARGO_PKG_VERSION"))
            .param("autobatch.device", meter.device_name())
            .param("autobatch.capacity_bytes", capacity_bytes)
            .param("autobatch.ceiling", self.ceiling)
            .param("autobatch.multiple_of", self.multiple_of)
            .param("autobatch.start", self.start)
            .param("autobatch.max_batch", self.max_batch.map_or("none".to_owned(), |b| b.to_string()))
            .param("autobatch.steps_per_trial", self.steps_per_trial)
            .param("autobatch.strategy", self.strategy))
    }

    /// A cached plan brought up to this tuner's accumulation settings.
    fn replan_cached(&self, mut plan: Plan) -> Result<Plan, Error> {
        let (micro_batch, accumulation_steps, effective_batch, accumulation) = self.split(plan.largest_batch)?;
        plan.micro_batch = micro_batch;
        plan.accumulation_steps = accumulation_steps;
        plan.effective_batch = effective_batch;
        plan.accumulation = accumulation;
        plan.world_size = self.world_size;
        plan.target_effective_batch = self.target_effective_batch;
        plan.cached = true;
        Ok(plan)
    }
}

/// The state of one tuning run.
struct Probe<'a, W: ?Sized, M: ?Sized, O: ?Sized> {
    tuner: &'a Tuner,
    observer: &'a mut O,
    workload: &'a mut W,
    meter: &'a mut M,
    capacity_bytes: u64,
    limit: u64,
    trials: Vec<Trial>,
    /// What the search sees: one entry per batch, the latest measurement.
    history: Vec<Observation>,
    /// Bytes in use before each `history` entry was measured.
    baselines: Vec<u64>,
    warnings: Vec<Warning>,
}

impl<W: Workload + ?Sized, M: MemoryMeter + ?Sized, O: Observer + ?Sized> Probe<'_, W, M, O> {
    fn warm_up(&mut self, batch: usize) -> Result<(), Error> {
        self.observer.warmup_started(batch);
        let started = Instant::now();
        let result = self.workload.step(batch);
        let settled = self.meter.synchronize().and_then(|()| self.meter.release_cached());
        match result {
            Ok(()) => settled?,
            Err(err) if is_oom(&err) => debug!("warm-up at batch {batch} ran out of memory; the first trial will tell"),
            Err(source) => return Err(Error::Workload { batch, source }),
        }
        debug!("warm-up at batch {batch} took {:?}", started.elapsed());
        Ok(())
    }

    /// Runs the search to the end; returns whether the answer is proven largest.
    fn search(&mut self, space: &SearchSpace) -> Result<bool, Error> {
        let strategy = self.tuner.strategy;
        let mut rechecked = Vec::new();
        loop {
            let proven = loop {
                let batch = match next_batch(strategy, space, &self.history) {
                    Next::Done => break true,
                    Next::Try(batch) => batch,
                };
                let searched = self.trials.iter().filter(|t| t.kind == TrialKind::Search).count();
                if let Some(max_trials) = self.tuner.max_trials.filter(|&max| searched >= max) {
                    self.warn(Warning::TrialLimit { max_trials });
                    break false;
                }
                let trial = self.trial(batch, TrialKind::Search)?;
                self.history.push(Observation { batch, outcome: trial.outcome, peak_bytes: trial.peak_bytes });
                self.baselines.push(trial.baseline_bytes);
            };
            // Re-check the answer once if memory in use rose since it was measured.
            let Some(index) = self.best_index() else { return Ok(proven) };
            let batch = self.history[index].batch;
            let first_baseline = self.baselines[index];
            let now = self.meter.in_use()?;
            if rechecked.contains(&batch) || now <= first_baseline.saturating_add(self.meter.slack_bytes()) {
                return Ok(proven);
            }
            info!(
                "memory in use rose from {} to {} since batch {batch} was measured: re-checking it",
                format_bytes(first_baseline),
                format_bytes(now)
            );
            rechecked.push(batch);
            let trial = self.trial(batch, TrialKind::Recheck)?;
            self.history[index] = Observation { batch, outcome: trial.outcome, peak_bytes: trial.peak_bytes };
            self.baselines[index] = trial.baseline_bytes;
            if trial.outcome.fits() {
                return Ok(proven);
            }
            self.warn(Warning::RecheckFailed {
                batch,
                first_baseline_bytes: first_baseline,
                recheck_baseline_bytes: trial.baseline_bytes,
            });
            if !proven {
                // Out of trials: fall back to the next best verified batch, if any.
                return Ok(false);
            }
        }
    }

    fn best_index(&self) -> Option<usize> {
        let best = best(&self.history)?;
        self.history.iter().position(|o| o.batch == best.batch)
    }

    /// One measured trial at `batch`.
    fn trial(&mut self, batch: usize, kind: TrialKind) -> Result<Trial, Error> {
        self.observer.trial_started(batch, kind);
        let baseline_bytes = self.meter.in_use()?;
        self.meter.reset_peak()?;
        let started = Instant::now();
        let mut result = Ok(());
        for _ in 0..self.tuner.steps_per_trial {
            result = self.workload.step(batch);
            if result.is_err() {
                break;
            }
        }
        let synced = self.meter.synchronize();
        let duration = started.elapsed();
        let peak = self.meter.peak();
        let released = self.meter.release_cached();

        let outcome = match result {
            Ok(()) => {
                synced?;
                released?;
                if peak.as_ref().is_ok_and(|&peak| peak <= self.limit) {
                    Outcome::Fits
                } else {
                    Outcome::OverCeiling
                }
            }
            Err(err) if is_oom(&err) => {
                for failed in [synced.err(), released.err()].into_iter().flatten() {
                    warn!("after the out-of-memory step at batch {batch}: {failed}");
                }
                Outcome::OutOfMemory
            }
            Err(source) => return Err(Error::Workload { batch, source }),
        };
        let peak_bytes = match (peak, outcome) {
            (Ok(peak), _) => Some(peak),
            (Err(err), Outcome::OutOfMemory) => {
                warn!("no peak after the out-of-memory step at batch {batch}: {err}");
                None
            }
            (Err(err), _) => return Err(err),
        };
        let trial = Trial { batch, outcome, peak_bytes, duration, baseline_bytes, kind };
        self.log_trial(&trial);
        self.observer.trial_finished(&trial, self.capacity_bytes);
        if !outcome.fits() {
            self.check_for_leak(batch, baseline_bytes)?;
        }
        self.trials.push(trial.clone());
        Ok(trial)
    }

    fn check_for_leak(&mut self, batch: usize, baseline_bytes: u64) -> Result<(), Error> {
        let after_bytes = self.meter.in_use()?;
        let slack_bytes = self.meter.slack_bytes();
        if after_bytes > baseline_bytes.saturating_add(slack_bytes) {
            self.warn(Warning::Leak { batch, baseline_bytes, after_bytes, slack_bytes });
        }
        Ok(())
    }

    fn log_trial(&self, trial: &Trial) {
        let peak = trial.peak_bytes.map_or_else(
            || "no peak".to_owned(),
            |peak| format!("peak {} ({:.1}%)", format_bytes(peak), 100.0 * utilization(peak, self.capacity_bytes)),
        );
        info!("trial {}: batch {} {}, {peak}, {:?}", self.trials.len() + 1, trial.batch, trial.outcome, trial.duration);
    }

    fn warn(&mut self, warning: Warning) {
        warn!("{warning}");
        self.observer.warning(&warning);
        self.warnings.push(warning);
    }

    fn into_plan(self, proven_largest: bool, profile: Option<crate::Profile>) -> Result<Plan, Error> {
        let tuner = self.tuner;
        let Some(found) = best(&self.history).copied() else {
            let smallest =
                self.history.iter().min_by_key(|o| o.batch).expect("a search always runs at least one trial");
            let trial = self.trials.iter().rev().find(|t| t.batch == smallest.batch);
            let remedies = match (profile, trial) {
                (Some(profile), Some(trial)) => self.remedies(profile, trial),
                _ => Vec::new(),
            };
            return Err(Error::NothingFits {
                batch: smallest.batch,
                outcome: smallest.outcome,
                peak_bytes: smallest.peak_bytes,
                capacity_bytes: self.capacity_bytes,
                limit_bytes: self.limit,
                ceiling: tuner.ceiling,
                remedies,
            });
        };
        let largest_batch = found.batch;
        let world_size = tuner.world_size;
        let (micro_batch, accumulation_steps, effective_batch, accumulation) = tuner.split(largest_batch)?;
        let peak_bytes = found.peak_bytes.expect("a fitting trial always has a peak");
        let memory_model = MemoryModel::fit(&self.trials, largest_batch, peak_bytes);
        Ok(Plan {
            largest_batch,
            micro_batch,
            accumulation_steps,
            world_size,
            effective_batch,
            target_effective_batch: tuner.target_effective_batch,
            peak_bytes,
            capacity_bytes: self.capacity_bytes,
            ceiling: tuner.ceiling,
            multiple_of: tuner.multiple_of,
            strategy: tuner.strategy,
            proven_largest,
            trials: self.trials,
            accumulation,
            warnings: self.warnings,
            memory_model,
            evaluation: None,
            cached: false,
            rank_largest_batch: None,
        })
    }

    /// What would make the smallest batch fit, from the analytical model: the
    /// failed trial's baseline holds the weights and optimizer state (and
    /// whatever else is on the device); its peak adds gradients and activations.
    fn remedies(&self, profile: crate::Profile, trial: &Trial) -> Vec<crate::estimate::Remedy> {
        let state = crate::estimate::StaticMemory::new(profile.parameters, profile.precision, profile.optimizer);
        let resident = state.weights + state.optimizer_states + state.master_weights;
        let elsewhere = trial.baseline_bytes.saturating_sub(resident);
        let peak = trial.peak_bytes.unwrap_or(self.capacity_bytes);
        let activations = peak.saturating_sub(trial.baseline_bytes).saturating_sub(state.gradients);
        crate::estimate::remedies(&state, activations, self.limit.saturating_sub(elsewhere))
    }
}

/// Hears about a tuning run as it happens (see [`Tuner::run_observed`]).
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
