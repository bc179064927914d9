//! The tuner: its builder, the settings it checks (`settings`) and the one
//! engine that runs every trial (`engine`'s `Engine`: a whole search, or a
//! single trial of a kind for the check of a split or of the batch ranks
//! agreed on). The searches a run makes inside itself vary the checked
//! settings and call the engine: the evaluation step's search in
//! `evaluation`, multi-rank agreement in `distributed`, several input sizes
//! in `sizes`, the longest input in `longest`, accumulation checks in
//! `accumulation`, variants side by side in `compare`, live progress in
//! `observer`.

mod accumulation;
mod compare;
mod distributed;
mod engine;
mod evaluation;
mod longest;
mod observer;
pub(crate) mod search;
mod settings;
mod sizes;

use std::sync::{Arc, Mutex};

use log::warn;

use crate::plan::{Accumulation, Objective, Plan, SearchLimit, Trial, TrialKind, Warning};
use crate::search::Strategy;
use crate::{CacheKey, Error, MemoryMeter, Workload};

pub use compare::{Comparison, ComparisonRow, ModelVariant};
use engine::Engine;
pub use observer::Observer;
use observer::{HeldObserver, Observing};
pub use search::Search;
use settings::{Options, Settings};

/// Finds the largest batch that fits under a utilization ceiling and plans
/// gradient accumulation from it.
///
/// Builder methods take and return `Self`; nothing is checked until
/// [`run`](Search::run) (or [`check`](Tuner::check)), which reports any invalid
/// setting as an [`Error`] before touching the device.
///
/// ```
/// use autobatch::memory::simulated::{MemoryCurve, Simulation};
/// use autobatch::{search::Strategy, Tuner};
///
/// let (mut workload, mut meter) = Simulation::new(80 << 30, MemoryCurve::affine(10 << 30, 300 << 20)).build();
/// let plan = Tuner::new()
///     .ceiling(0.85)
///     .multiple_of(8)
///     .strategy(Strategy::Binary)
///     .target_effective_batch(1024)
///     .world_size(4)
///     .search(&mut workload, &mut meter).run()?;
/// // (0.85 × 80 GiB − 10 GiB) / 300 MiB = 197.97, rounded down to a multiple of 8
/// assert_eq!(plan.largest_batch(), 192);
/// // 1024 = 128 × 2 accumulation steps × 4 ranks
/// assert_eq!((plan.micro_batch(), plan.accumulation_steps(), plan.effective_batch()), (128, 2, 1024));
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Tuner {
    ceiling: f64,
    options: Options,
    observer: Option<HeldObserver>,
}

impl Default for Tuner {
    fn default() -> Self {
        Tuner { ceiling: crate::plan::Ceiling::default().fraction(), options: Options::default(), observer: None }
    }
}

impl Tuner {
    /// A tuner with the defaults: ceiling 0.90, start 1, multiple_of 1, one step
    /// per trial, world size 1, [`Strategy::Predictive`], no batch or trial limit, no
    /// target effective batch, a warm-up step.
    pub fn new() -> Self {
        Self::default()
    }

    /// The most a fitting step may use, as a fraction in (0, 1] of the device's
    /// capacity (device-wide, not of the memory free at start): a fraction
    /// (`0.85`) or a [`Ceiling`](crate::plan::Ceiling) already checked. Default 0.90.
    pub fn ceiling(mut self, ceiling: impl Into<f64>) -> Self {
        self.ceiling = ceiling.into();
        self
    }

    /// The smallest batch to consider (rounded up to `multiple_of`). Default 1.
    pub fn start(mut self, start: usize) -> Self {
        self.options.start = start;
        self
    }

    /// The largest batch to consider (rounded down to `multiple_of`): the search
    /// tries it once when the next doubling would pass it. Default: no limit.
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        self.options.max_batch = Some(max_batch);
        self
    }

    /// Only batches that are multiples of this are tried and returned (8 for
    /// tensor cores, say). Default 1.
    pub fn multiple_of(mut self, multiple_of: usize) -> Self {
        self.options.multiple_of = multiple_of;
        self
    }

    /// Stops after this many search trials with the best batch verified so far,
    /// flagged as not proven largest. Default: no limit.
    pub fn max_trials(mut self, max_trials: usize) -> Self {
        self.options.max_trials = Some(max_trials);
        self
    }

    /// No trial runs a tensor of more than `elements` elements: from the
    /// graphs the fitting trials measured ([`Workload::graph_tensors`]),
    /// each tensor's count is followed as a line in the batch, and the
    /// search stops below the batch where one would pass the limit
    /// ([`SearchLimit::TensorElements`](crate::plan::SearchLimit::TensorElements)).
    /// Default: the meter's ([`MemoryMeter::element_limit`]: 2^32 − 1 on
    /// CUDA, where candle's kernels count elements in 32 bits; none on the
    /// CPU). A workload that does not show its graph (a closure) is not capped.
    ///
    /// ```
    /// let tuner = autobatch::Tuner::new().element_limit(1 << 20);
    /// # let _ = tuner;
    /// ```
    pub fn element_limit(mut self, elements: u64) -> Self {
        self.options.element_limit = Some(elements);
        self
    }

    /// Workload steps per trial; the trial's peak is the highest over them
    /// (use 2 or more when the first step allocates state lazily). Default 1.
    pub fn steps_per_trial(mut self, steps_per_trial: usize) -> Self {
        self.options.steps_per_trial = steps_per_trial;
        self
    }

    /// The search strategy. Default [`Strategy::Predictive`] (the same answer as
    /// [`Strategy::Binary`] in fewer, cheaper trials).
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.options.strategy = strategy;
        self
    }

    /// The effective (global) batch to reach with micro-batches ×
    /// accumulation steps × ranks. Default: none (train at the largest batch).
    pub fn target_effective_batch(mut self, target: usize) -> Self {
        self.options.target_effective_batch = Some(target);
        self
    }

    /// The number of data-parallel ranks. Default 1.
    pub fn world_size(mut self, world_size: usize) -> Self {
        self.options.world_size = world_size;
        self
    }

    /// Demand that the effective batch equals the target exactly: when no split
    /// hits it, [`run`](Search::run) fails with [`Error::InexactTarget`]
    /// instead of returning the nearest batch above. Default false.
    pub fn exact_effective_batch(mut self, exact: bool) -> Self {
        self.options.exact_effective_batch = exact;
        self
    }

    /// Split the target into micro-batches of one size only: more
    /// accumulation steps where micro-batches that differ by one sample (one
    /// `multiple_of`) would reach it exactly in fewer (for a loop that does
    /// not weight each micro-step's loss by its samples, as
    /// [`TrainLoop`](crate::TrainLoop) and [`Guard`](crate::Guard) do).
    /// Default false: the fewest steps ([`Accumulation::plan_aligned`]).
    pub fn equal_micro_batches(mut self, equal: bool) -> Self {
        self.options.equal_micro_batches = equal;
        self
    }

    /// Run one uncounted step at the smallest candidate before the first trial,
    /// so that memory a runtime keeps for good once used (cuBLAS workspaces,
    /// loaded kernels, per-thread scratch buffers) is in the baseline. Default true.
    pub fn warmup(mut self, warmup: bool) -> Self {
        self.options.warmup = warmup;
        self
    }

    /// What the model's training state is made of, for the advice that comes
    /// with [`Error::NothingFits`]; overrides the workload's own
    /// [`Workload::profile`]. Default: the workload's, if any.
    pub fn profile(mut self, profile: crate::estimate::TrainingSetup) -> Self {
        self.options.profile = Some(profile);
        self
    }

    /// Which micro-batch to plan from: the largest that fits (the default), or
    /// the one with the best measured throughput ([`Objective::Throughput`]:
    /// a few extra timed steps near the top, reported in `plan.throughput`).
    pub fn objective(mut self, objective: Objective) -> Self {
        self.options.objective = objective;
        self
    }

    /// Timed runs per candidate for [`Objective::Throughput`] (the median
    /// decides). Default 3.
    pub fn timing_repeats(mut self, repeats: usize) -> Self {
        self.options.timing_repeats = repeats;
        self
    }

    /// With [`across`](Search::across): give each rank a
    /// micro-batch in proportion to what fits on it, instead of every rank the
    /// batch of the smallest device. The global batch (the target effective
    /// batch; without one, the sum of the ranks' largest batches) stays exact,
    /// and `plan.ranks()` ([`RankSplit`](crate::plan::RankSplit)) has every rank's
    /// micro-steps and the loss weights that keep the gradient the global mean.
    /// Default false.
    pub fn uneven_ranks(mut self, uneven: bool) -> Self {
        self.options.uneven_ranks = uneven;
        self
    }

    /// Return a plan whose measured step did not reach every variable's
    /// gradient (a cut graph) demoted (`proven_largest: false`, a
    /// [`complete_graph`](crate::Plan::complete_graph) of false) instead of
    /// refusing it with [`Error::PartialGraph`], which names the switch to
    /// differentiable ops. Default false: a cut graph measures less than
    /// training the whole model needs, and its variables would not learn.
    pub fn allow_partial_graph(mut self, allow: bool) -> Self {
        self.options.allow_partial_graph = allow;
        self
    }

    /// Stops the search once `limit` has passed since [`run`](Search::run)
    /// began (warm-up included), with the largest batch seen to fit: the
    /// plan is not proven largest, and
    /// [`SearchLimit::TimeLimit`](crate::plan::SearchLimit::TimeLimit) says which
    /// batches remain open. The limit is checked between trials: once a
    /// batch has fit, a trial whose expected time (the largest trial's time
    /// per sample, times its batch) would end past the limit is not started;
    /// a trial in progress finishes. The re-check of the answer and the
    /// accumulation check still run, as they keep the answer safe. When no batch was seen
    /// to fit by then, `run` fails with [`Error::TimeLimit`]. A search that
    /// finishes in time is unchanged. Default: no limit.
    ///
    /// ```
    /// use std::time::Duration;
    /// use autobatch::memory::simulated::{MemoryCurve, Simulation};
    /// use autobatch::{plan::SearchLimit, Tuner};
    ///
    /// let (mut workload, mut meter) = Simulation::new(1 << 30, MemoryCurve::affine(0, 1 << 20)).build();
    /// let plan = Tuner::new().time_limit(Duration::ZERO).warmup(false).search(&mut workload, &mut meter).run();
    /// assert!(matches!(plan, Err(autobatch::Error::TimeLimit { .. })));
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn time_limit(mut self, limit: std::time::Duration) -> Self {
        self.options.time_limit = Some(limit);
        self
    }

    /// Keeps plans in a JSON file at `path`: a run whose model, device and
    /// search settings match a stored plan returns it without probing (logged),
    /// any change misses and probes. The target and world size are not part of
    /// the key: the accumulation is planned anew from the stored largest batch,
    /// and when that split accumulates at a micro-batch the stored trials never
    /// showed fitting with the accumulator held, that one micro-step is run
    /// (lowered until it fits) and what it showed is stored. The model's part of the key comes from
    /// [`cache_key`](Tuner::cache_key) or the workload's
    /// [`Workload::cache_key`]; without either, `run` fails with
    /// [`Error::InvalidSetting`] (its value [`Value::Missing`](crate::Value::Missing)). A corrupt, unreadable or foreign file is
    /// ignored with a warning (and never written over); writes are atomic.
    pub fn cache(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.options.cache_path = Some(path.into());
        self
    }

    /// The model's part of the cache key (its variables and the input shapes
    /// that decide memory); overrides the workload's own.
    pub fn cache_key(mut self, key: CacheKey) -> Self {
        self.options.cache_key = Some(key);
        self
    }

    /// Checks every setting without running anything.
    ///
    /// ```
    /// use autobatch::{Error, Tuner, Value};
    /// assert!(Tuner::new().check().is_ok());
    /// let err = Tuner::new().ceiling(1.5).check().unwrap_err();
    /// assert!(matches!(err, Error::InvalidSetting { value: Value::Fraction(_), .. }));
    /// assert_eq!(err.to_string(), "Tuner::ceiling is 1.5: it must be a fraction in (0, 1]: pass e.g. 0.9 for 90% of device memory");
    /// ```
    pub fn check(&self) -> Result<(), Error> {
        self.settings().map(|_| ())
    }

    /// These settings, checked: what every run hands the engine.
    fn settings(&self) -> Result<Settings, Error> {
        Settings::new(self.ceiling, &self.options)
    }

    /// Tells `observer` about every search this tuner runs, as it runs: each
    /// trial as it starts and ends, each size, variant or evaluation search
    /// as it starts. For live progress in a command-line tool or a trainer's
    /// log; keep a clone of the `Arc` to read it after the run.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    ///
    /// use autobatch::memory::simulated::{MemoryCurve, Simulation};
    /// use autobatch::{Observer, search::Strategy, plan::Trial, Tuner};
    ///
    /// struct Rows(Vec<String>);
    /// impl Observer for Rows {
    ///     fn trial_finished(&mut self, trial: &Trial, _capacity_bytes: u64) {
    ///         self.0.push(format!("{} {}", trial.batch, trial.outcome));
    ///     }
    /// }
    /// let (mut workload, mut meter) = Simulation::new(1 << 30, MemoryCurve::affine(0, 100 << 20)).build();
    /// let rows = Arc::new(Mutex::new(Rows(Vec::new())));
    /// Tuner::new().strategy(Strategy::Binary).observer(rows.clone()).search(&mut workload, &mut meter).run()?;
    /// assert_eq!(rows.lock().unwrap().0[..3], ["1 fits", "2 fits", "4 fits"]);
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn observer(mut self, observer: Arc<Mutex<dyn Observer + Send>>) -> Self {
        self.observer = Some(HeldObserver(observer));
        self
    }

    /// The tuner's observer, for a search to tell.
    fn observing(&self) -> Observing<'_> {
        Observing(self.observer.as_ref())
    }
}

impl Tuner {
    /// The ceiling, checked as every search checks it.
    pub(crate) fn checked_ceiling(&self) -> Result<crate::plan::Ceiling, Error> {
        Ok(self.settings()?.ceiling)
    }

    /// A search of another question's numbers (a server's sequences or
    /// context) with this tuner's settings: up to `most` when given, starting
    /// where `expected` (a number, bytes per unit) puts the answer; never
    /// served from or stored in the plan cache, which holds training plans.
    pub(crate) fn search_numbers<W, M>(
        &self,
        workload: &mut W,
        meter: &mut M,
        most: Option<usize>,
        expected: Option<(usize, f64)>,
    ) -> Result<Plan, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
    {
        let mut settings = self.settings()?;
        settings.options.cache_path = None;
        if let Some(most) = most {
            settings = settings.up_to(most);
        }
        if let Some((hint, bytes_per_unit)) = expected {
            settings = settings.hinted_along(hint.max(1), bytes_per_unit);
        }
        settings.search(workload, meter, &mut self.observing())
    }
}

impl Settings {
    /// A whole search with these settings: the stored plan when the cache
    /// has one for them, else the engine's run (stored when cached).
    pub(super) fn search<W, M, O>(&self, workload: &mut W, meter: &mut M, observer: &mut O) -> Result<Plan, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
        O: Observer + ?Sized,
    {
        meter.under_ceiling(self.ceiling);
        let capacity_bytes = meter.capacity()?;
        let cache = match &self.options.cache_path {
            Some(path) => Some((path.clone(), self.full_cache_key(&*workload, &*meter, capacity_bytes)?)),
            None => None,
        };
        // a cached answer that a budget cut short is at most where the search starts
        let mut cached = cache.as_ref().and_then(|(path, key)| {
            let plan = crate::cache::lookup(path, key)?;
            match self.disagreement(&plan, capacity_bytes) {
                None => Some(plan),
                Some(why) => {
                    // the cache's own target: a tool that leaves the plan's warnings to its report still says this
                    warn!(
                        target: "autobatch::cache",
                        "ignoring an entry of the plan cache {} (probing instead): {why}",
                        path.display()
                    );
                    None
                }
            }
        });
        let unproven =
            cached.as_ref().and_then(|plan| Some((plan, plan.stopped_by.clone().filter(SearchLimit::cut_short)?)));
        let resumed = unproven.map(|(plan, stopped_by)| {
            log::info!(
                "the cached batch {} is not proven the largest ({stopped_by}): searching from it",
                plan.largest_batch
            );
            let slope = plan.memory_model.as_ref().map(|model| model.bytes_per_sample);
            (
                self.resumed_from(plan.largest_batch, slope),
                Warning::CachedUnproven { batch: plan.largest_batch, stopped_by },
            )
        });
        if resumed.is_some() {
            cached = None;
        }
        if let Some((path, key)) = &cache
            && let Some(plan) = cached
        {
            if !self.options.allow_partial_graph && !plan.complete_graph() {
                let cut = plan.warnings.iter().find_map(|warning| match warning {
                    crate::plan::Warning::MissingGradients { variables, of } => Some((variables.clone(), *of)),
                    _ => None,
                });
                let (variables, of) = cut.unwrap_or_default();
                return Err(Error::PartialGraph { variables, of });
            }
            let trials = plan.trials.len();
            let plan = self.replan_cached(plan, workload, meter)?;
            if plan.trials.len() > trials {
                // the accumulator was checked: keep what it showed for the next start
                crate::cache::store(path, key, &Plan { cache: None, ..plan.clone() });
            }
            return Ok(plan);
        }
        let (settings, note) = match resumed {
            Some((settings, note)) => (settings, Some(note)),
            None => (self.clone(), None),
        };
        let mut plan = Engine::new(&settings, workload, meter, observer, capacity_bytes).run()?;
        if let Some((path, key)) = &cache {
            crate::cache::store(path, key, &plan);
        }
        // said by this run, not by a later one that reads the stored plan
        plan.warnings.extend(note);
        Ok(plan)
    }
}

impl Settings {
    /// Where a cached plan says it ran under other settings than the key it
    /// is stored under names (an entry edited by hand): what differs.
    fn disagreement(&self, plan: &Plan, capacity_bytes: u64) -> Option<String> {
        let o = &self.options;
        let differs = [
            ("ceiling", plan.ceiling().fraction().to_string(), self.ceiling.fraction().to_string()),
            ("capacity in bytes", plan.capacity_bytes().to_string(), capacity_bytes.to_string()),
            ("granularity", plan.multiple_of().to_string(), o.multiple_of.to_string()),
            ("strategy", plan.strategy().to_string(), o.strategy.to_string()),
        ];
        let said: Vec<String> = differs
            .into_iter()
            .filter(|(_, stored, asked)| stored != asked)
            .map(|(name, stored, asked)| format!("{name} {stored} where its key says {asked}"))
            .collect();
        (!said.is_empty()).then(|| said.join(", "))
    }
}

/// The micro-batch below `micro` that an accumulating step `over_bytes` over
/// the limit should fit at, by the plan's bytes per sample: at least one
/// granule lower, rounded to the granule; `None` below zero. What every check
/// of an accumulating split steps down by.
fn step_down(micro: usize, over_bytes: u64, per_sample: f64, granule: usize) -> Option<usize> {
    let samples = if per_sample > 0.0 { (over_bytes as f64 / per_sample).ceil() as usize } else { 0 };
    micro.checked_sub(samples.div_ceil(granule).max(1).saturating_mul(granule))
}

impl Settings {
    /// One measured trial of `kind` at `batch`, with this tuner's settings
    /// (steps per trial, ceiling) and no search around it: the engine's own
    /// trial, for checks of a split or of a batch the ranks agreed on.
    fn single_trial<W, M>(&self, workload: &mut W, meter: &mut M, batch: usize, kind: TrialKind) -> Result<Trial, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
    {
        meter.under_ceiling(self.ceiling);
        let capacity_bytes = meter.capacity()?;
        Engine::new(self, workload, meter, &mut (), capacity_bytes).single(batch, kind)
    }

    /// How to reach the target (or, without one, the largest batch on every rank) from `largest_batch`.
    fn split(&self, largest_batch: usize) -> Result<crate::plan::Split, Error> {
        match self.options.target_effective_batch {
            Some(target) => {
                let (world_size, multiple_of) = (self.options.world_size, self.options.multiple_of);
                let mut split = if self.options.equal_micro_batches {
                    Accumulation::plan_equal(target, world_size, largest_batch, multiple_of)?
                } else {
                    Accumulation::plan_aligned(target, world_size, largest_batch, multiple_of)?
                };
                if self.options.exact_effective_batch {
                    split = split.require_exact()?;
                }
                if !split.exact {
                    warn!(
                        "effective batch {} is {} above the target {}: no exact split within twice the fewest steps",
                        split.effective_batch, split.deviation, target
                    );
                }
                Ok(crate::plan::Split::Accumulated { accumulation: split, accumulating_peak_bytes: None })
            }
            None => {
                // the effective batch must be a number: refuse a product that overflows
                largest_batch.checked_mul(self.options.world_size).ok_or_else(|| {
                    Error::batch_overflow(largest_batch, &[crate::Setting::WorldSize, crate::Setting::MaxBatch])
                })?;
                Ok(crate::plan::Split::Single { micro_batch: largest_batch, world_size: self.options.world_size })
            }
        }
    }

    /// The model's part of the cache key: the one given, else the workload's.
    fn model_key<W: Workload + ?Sized>(&self, workload: &W) -> Result<CacheKey, Error> {
        self.options.cache_key.clone().or_else(|| workload.cache_key()).ok_or_else(|| {
            Error::invalid(
                crate::Setting::CacheKey,
                crate::Value::Missing,
                "the plan cache needs to know what decides the model's memory: give \
                 Tuner::cache_key(CacheKey::new().variables(..).param(\"seq_len\", ..)) or a workload whose \
                 cache_key() says it",
            )
        })
    }

    /// The whole cache key: the model's (given, or the workload's), the
    /// device's, the search settings and the crate version.
    fn full_cache_key<W, M>(&self, workload: &W, meter: &M, capacity_bytes: u64) -> Result<CacheKey, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
    {
        Ok(self
            .model_key(workload)?
            .param("autobatch.version", env!("CARGO_PKG_VERSION"))
            .param("autobatch.device", meter.device_name())
            .param("autobatch.capacity_bytes", capacity_bytes)
            .param("autobatch.ceiling", self.ceiling.fraction())
            .param("autobatch.multiple_of", self.options.multiple_of)
            .param("autobatch.start", self.options.start)
            .param("autobatch.max_batch", self.options.max_batch.map_or("none".to_owned(), |b| b.to_string()))
            .param("autobatch.steps_per_trial", self.options.steps_per_trial)
            .param("autobatch.strategy", self.options.strategy)
            .param("autobatch.objective", format!("{:?}", self.options.objective)))
    }

    /// A cached plan brought up to this tuner's accumulation settings. When
    /// the new split accumulates at a micro-batch larger than the stored plan
    /// verified with the accumulator held, that micro-step is checked (and
    /// the micro-batch lowered until it fits): the one case where a cache hit
    /// runs a step.
    fn replan_cached<W, M>(&self, mut plan: Plan, workload: &mut W, meter: &mut M) -> Result<Plan, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
    {
        let cap = Self::cap(&plan);
        let stored = plan.trials.len();
        self.verified_replan(&mut plan, cap, workload, meter)?;
        plan.cache = Some(plan.trials.len() - stored);
        plan.tuning = crate::plan::TuningCost::of(&plan.trials[stored..]);
        Ok(plan)
    }

    /// The most a re-plan may give a micro-step: the largest batch, or the
    /// throughput choice below it (with several ranks, the agreed batch).
    fn cap(plan: &Plan) -> usize {
        plan.throughput.as_ref().map_or(plan.largest_batch, |choice| choice.chosen_batch.min(plan.largest_batch))
    }

    /// Sets `plan`'s micro-batch, steps and effective batch from `cap` with
    /// this tuner's target and world size.
    fn apply_split(&self, plan: &mut Plan, cap: usize) -> Result<(), Error> {
        let mut split = self.split(cap)?;
        // an accumulating split keeps the peak its check measured until the check runs again
        if split.accumulation_steps() > 1 {
            split.set_accumulating_peak_bytes(plan.accumulation_peak_bytes());
        }
        plan.split = split;
        Ok(())
    }
}
