//! The engine: one tuning run (the warm-up, the trials, the re-check and
//! the plan) or one trial of a kind, with checked settings on one device.

use log::{debug, info, warn};

use super::{Observer, Settings};
use crate::estimate::{TrainingSetup, TransformerShape};
use crate::memory::measure::{Measured, measure};
use crate::oom::meter_error_is_oom;
use crate::plan::{
    MemoryModel, Objective, Plan, SearchLimit, SearchSettings, Split, ThroughputChoice, ThroughputPoint, Trial,
    TrialKind, TuningCost, Warning, utilization,
};
use crate::search::{Observation, SearchSpace};
use crate::units::format_bytes;
use crate::{Error, GraphTensor, MemoryMeter, Workload, is_oom, may_be_oom, search::Outcome, search::Strategy};

/// A step whose peak grew by less than a byte per sample while the batch grew
/// this many times over is not using its batch: the search stops there.
const IGNORED_BATCH_SPAN: usize = 1024;

/// The latest measurement of one batch: what the search sees, and the memory
/// in use when it was taken (to tell whether the answer needs a re-check).
#[derive(Clone, Debug)]
struct Record {
    observation: Observation,
    baseline_bytes: u64,
    /// The tensors of a fitting trial's graph, when the workload shows it.
    graph: Option<Vec<GraphTensor>>,
}

/// The state of one tuning run.
pub(super) struct Engine<'a, W: ?Sized, M: ?Sized, O: ?Sized> {
    settings: &'a Settings,
    observer: &'a mut O,
    workload: &'a mut W,
    meter: &'a mut M,
    capacity_bytes: u64,
    limit: u64,
    trials: Vec<Trial>,
    /// One record per batch tried, the latest measurement of each.
    records: Vec<Record>,
    warnings: Vec<Warning>,
    /// Fitting trials in a row that left memory held after they returned.
    held_in_a_row: usize,
    /// Bytes in use before the first trial.
    first_baseline: Option<u64>,
    /// When the run began: what the time limit counts from.
    started: std::time::Instant,
    /// The warm-up step, once run.
    warmup: TuningCost,
    /// The most elements one tensor may have: the settings', else the meter's.
    element_limit: Option<u64>,
    /// Bytes of gradients candle kept for tensors that are not variables.
    untrained_gradient_bytes: u64,
}

/// What a time limit leaves for the next trial.
enum TimeLeft {
    /// It is expected to end in time (or nothing has fit yet to say).
    Enough,
    /// It is expected to end at `end` (since the search began), past the limit.
    Until { end: std::time::Duration },
    /// The limit has passed.
    Passed,
}

impl<'a, W: Workload + ?Sized, M: MemoryMeter + ?Sized, O: Observer + ?Sized> Engine<'a, W, M, O> {
    /// A run with `settings` on a device of `capacity_bytes`: the byte limit
    /// is the ceiling's of it, computed here and nowhere else in a run.
    pub(super) fn new(
        settings: &'a Settings,
        workload: &'a mut W,
        meter: &'a mut M,
        observer: &'a mut O,
        capacity_bytes: u64,
    ) -> Self {
        let element_limit = settings.options.element_limit.or_else(|| meter.element_limit());
        Engine {
            limit: settings.ceiling.limit_bytes(capacity_bytes),
            capacity_bytes,
            settings,
            observer,
            workload,
            meter,
            trials: Vec::new(),
            records: Vec::new(),
            warnings: Vec::new(),
            held_in_a_row: 0,
            first_baseline: None,
            started: std::time::Instant::now(),
            warmup: TuningCost::default(),
            element_limit,
            untrained_gradient_bytes: 0,
        }
    }

    /// One trial of `kind` at `batch`, outside a search (the check of a
    /// split a search did not verify); then the workload hears that tuning
    /// is over.
    pub(super) fn single(mut self, batch: usize, kind: TrialKind) -> Result<Trial, Error> {
        let result = self.trial(batch, kind);
        self.workload.tuning_finished();
        result
    }

    /// A warm-up at `batch`, then a trial at `batch` and one at `next`, no
    /// search around them (`Search::check`); then the workload hears that
    /// tuning is over, whatever the outcome.
    pub(super) fn check(mut self, batch: usize, next: usize) -> Result<[Trial; 2], Error> {
        let result = self.check_trials(batch, next);
        self.workload.tuning_finished();
        result
    }

    fn check_trials(&mut self, batch: usize, next: usize) -> Result<[Trial; 2], Error> {
        if self.settings.options.warmup {
            self.warm_up(batch)?;
        }
        Ok([self.trial(batch, TrialKind::Search)?, self.trial(next, TrialKind::Search)?])
    }

    /// Warm-up, search, re-check, what the workload noticed, plan; then the
    /// workload hears that tuning is over, whatever the outcome.
    pub(super) fn run(mut self) -> Result<Plan, Error> {
        let result = self.settings.space().and_then(|space| {
            let space = space.with_limit(self.limit);
            info!(
                "tuning: {} search, ceiling {} of {} = {}, batches {}..={} in multiples of {}",
                self.settings.options.strategy,
                self.settings.ceiling,
                format_bytes(self.capacity_bytes),
                format_bytes(self.limit),
                space.first(),
                space.last(),
                space.multiple_of()
            );
            self.tune(&space)
        });
        self.workload.tuning_finished();
        let mut plan = result?;
        plan.tuning = self.warmup + TuningCost::of(&plan.trials);
        Ok(plan)
    }

    fn tune(&mut self, space: &SearchSpace) -> Result<Plan, Error> {
        if self.settings.options.warmup {
            self.warm_up(space.first())?;
        }
        let stopped = self.search(space)?;
        let mut stopped_by = self.stopped_by(space, stopped);
        for warning in self.workload.diagnose() {
            if let Warning::UntrainedGradients { bytes, trained_bytes, .. } = warning {
                // part of the plan's memory; worth a warning only where it outweighs the
                // trained gradients (a frozen base under candle's own matmul)
                self.untrained_gradient_bytes = bytes;
                if bytes <= trained_bytes {
                    continue;
                }
            }
            if let Warning::MissingGradients { variables, of } = &warning {
                if !self.settings.options.allow_partial_graph {
                    return Err(Error::PartialGraph { variables: variables.clone(), of: *of });
                }
                // the number understates training: say so where the number is (the
                // warning makes the plan's measured graph partial)
                stopped_by = Some(SearchLimit::PartialGraph { variables: variables.len(), of: *of });
            }
            self.warn(warning);
        }
        if let Some(warning) = self.leaner_update()? {
            self.warn(warning);
        }
        let profile = self.settings.options.profile.clone().or_else(|| self.workload.profile());
        self.make_plan(space, stopped_by, profile)
    }

    /// Where the workload's update has a leaner form with the same numbers:
    /// one step of it at the answer, measured against the answer's peak (not a
    /// trial of the plan: the plan is what the workload runs).
    fn leaner_update(&mut self) -> Result<Option<Warning>, Error> {
        let Some(best) = self.best_index() else { return Ok(None) };
        let Observation { batch, peak_bytes: Some(peak), .. } = self.records[best].observation else {
            return Ok(None);
        };
        let Some((from, to)) = self.workload.switch_update(true) else { return Ok(None) };
        let workload = &mut *self.workload;
        let measured = measure(self.meter, 1, None, || workload.step(batch));
        self.workload.switch_update(false);
        let leaner = match measured {
            Ok(Measured { result: Ok(()), peak: Ok(leaner), .. }) => leaner,
            // a leaner step that fails says nothing about the plan
            Ok(_) => return Ok(None),
            Err(err) => return Err(err),
        };
        let saves_bytes = peak.saturating_sub(leaner);
        Ok((saves_bytes > 0).then_some(Warning::LeanerUpdate { from, to, batch, saves_bytes }))
    }

    fn warm_up(&mut self, batch: usize) -> Result<(), Error> {
        self.observer.warmup_started(batch);
        let workload = &mut *self.workload;
        let warm = measure(self.meter, 1, None, || workload.step(batch))?;
        match warm.result {
            Ok(()) => match warm.settled {
                Err(err) if meter_error_is_oom(&err) => {
                    debug!("warm-up at batch {batch} ran out of memory at synchronize; the first trial will tell")
                }
                settled => settled?,
            },
            Err(err) if is_oom(&err) => debug!("warm-up at batch {batch} ran out of memory; the first trial will tell"),
            Err(source) => return Err(Error::workload(batch, source)),
        }
        debug!("warm-up at batch {batch} took {:?}", warm.duration);
        self.warmup = TuningCost::one_step(warm.duration);
        Ok(())
    }

    /// What the search sees: the latest measurement of each batch.
    fn history(&self) -> Vec<Observation> {
        self.records.iter().map(|r| r.observation).collect()
    }

    /// Whether the fitting trials say the step does not use its batch: over a
    /// span of [`IGNORED_BATCH_SPAN`]× the peak grew by less than a byte per sample.
    fn batch_ignored(&self) -> Option<Warning> {
        let fitting = || self.records.iter().map(|r| r.observation).filter(|o| o.outcome.fits());
        let smallest = fitting().filter(|o| o.peak_bytes.is_some()).min_by_key(|o| o.batch)?;
        let largest = fitting().filter(|o| o.peak_bytes.is_some()).max_by_key(|o| o.batch)?;
        let span = largest.batch / smallest.batch;
        let growth = largest.peak_bytes?.saturating_sub(smallest.peak_bytes?);
        (span >= IGNORED_BATCH_SPAN && growth < (largest.batch - smallest.batch) as u64).then_some(
            Warning::BatchIgnored {
                smallest_batch: smallest.batch,
                largest_batch: largest.batch,
                growth_bytes: growth,
            },
        )
    }

    /// Runs the search to the end; returns what cut it short, if anything
    /// (`max_trials`, a step that ignores its batch).
    fn search(&mut self, space: &SearchSpace) -> Result<Option<SearchLimit>, Error> {
        let mut rechecked = Vec::new();
        loop {
            let stopped = self.search_until_done(space)?;
            // a failed re-check of a proven answer searches again below it;
            // out of trials, the next best verified batch is the answer
            if self.answer_stands(&mut rechecked)? || stopped.is_some() {
                return Ok(stopped);
            }
        }
    }

    /// Trials of the batches the strategy chooses, until it has its answer
    /// (`None`) or a limit stops it.
    fn search_until_done(&mut self, space: &SearchSpace) -> Result<Option<SearchLimit>, Error> {
        let strategy = self.settings.options.strategy;
        loop {
            let space = self.narrowed(space);
            let Some(batch) = strategy.next_batch(&space, &self.history()) else { return Ok(None) };
            let batch = match self.in_time(batch, &space)? {
                Ok(batch) => batch,
                Err(limit) => return Ok(Some(limit)),
            };
            let searched = self.trials.iter().filter(|t| t.kind == TrialKind::Search).count();
            if let Some(max_trials) = self.settings.options.max_trials.filter(|&max| searched >= max) {
                self.warn(Warning::TrialLimit { max_trials });
                return Ok(Some(SearchLimit::MaxTrials { max_trials }));
            }
            let trial = self.trial(batch, TrialKind::Search)?;
            let observation = Observation { batch, outcome: trial.outcome, peak_bytes: trial.peak_bytes };
            let graph = trial.outcome.fits().then(|| self.workload.graph_tensors()).flatten();
            self.records.push(Record { observation, baseline_bytes: trial.baseline_bytes, graph });
            self.keep_two_graphs();
            if let Some(warning) = trial.outcome.fits().then(|| self.batch_ignored()).flatten() {
                self.warn(warning);
                return Ok(Some(SearchLimit::BatchIgnored));
            }
        }
    }

    /// The search space as the trials so far narrow it: above what the
    /// device held before any trial, under the device's element limit, and
    /// an out-of-memory step's failure bounded by its largest tensor.
    fn narrowed(&self, space: &SearchSpace) -> SearchSpace {
        // the least the device held before a trial: what no batch grows
        let held = self.records.iter().map(|r| r.baseline_bytes).min();
        let space = held.map_or(*space, |held| space.with_held_bytes(held));
        // no candidate whose tensors would pass the device's element limit
        let space = self.element_cap().map_or(space, |(cap, _)| space.capped(cap));
        // an out-of-memory step failed at no more than its largest
        // tensor, rounded up to the allocator's granule
        let granule = self.meter.slack_bytes();
        self.largest_tensor().map_or(space, |(fixed, per_sample)| {
            space.with_largest_allocation(fixed.saturating_add(granule), per_sample)
        })
    }

    /// `batch`, or a smaller one that ends before the time limit, or the
    /// limit that stops the search (an error when nothing fit yet).
    fn in_time(&self, batch: usize, space: &SearchSpace) -> Result<Result<usize, SearchLimit>, Error> {
        let Some(limit) = self.settings.options.time_limit else { return Ok(Ok(batch)) };
        let bracket = crate::search::Bracket::of(space, &self.history());
        let left = self.time_left(limit, batch);
        // a smaller batch above the largest fit that ends in time is worth verifying
        let smaller = match left {
            TimeLeft::Until { .. } => self.batch_in_time(limit, space, &bracket, batch),
            _ => None,
        };
        match (left, smaller) {
            (TimeLeft::Enough, _) => Ok(Ok(batch)),
            (TimeLeft::Until { end }, Some(smaller)) => {
                info!("batch {batch} would end at {end:?}, past the time limit: trying {smaller}");
                Ok(Ok(smaller))
            }
            (left, _) => {
                let limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
                let Some(largest_fit) = bracket.fitting else {
                    return Err(Error::TimeLimit { limit_ms, trials: self.trials.len() });
                };
                let expected_end = match left {
                    // rounded up: past the limit, it reads past it
                    TimeLeft::Until { end } => {
                        Some((batch, u64::try_from(end.as_micros().div_ceil(1000)).unwrap_or(u64::MAX)))
                    }
                    _ => None,
                };
                info!("time limit reached after {} trials", self.trials.len());
                let smallest_failure = bracket.failing;
                Ok(Err(SearchLimit::TimeLimit { limit_ms, largest_fit, smallest_failure, expected_end }))
            }
        }
    }

    /// Re-checks the answer once if memory in use rose since it was
    /// measured: whether it stands (no re-check was needed, or it fits
    /// again); a failed re-check is a warning and a record of the failure.
    fn answer_stands(&mut self, rechecked: &mut Vec<usize>) -> Result<bool, Error> {
        let Some(index) = self.best_index() else { return Ok(true) };
        let batch = self.records[index].observation.batch;
        let first_baseline = self.records[index].baseline_bytes;
        let now = self.meter.in_use()?;
        if rechecked.contains(&batch) || now <= first_baseline.saturating_add(self.meter.slack_bytes()) {
            return Ok(true);
        }
        info!(
            "memory in use rose from {} to {} since batch {batch} was measured: re-checking it",
            format_bytes(first_baseline),
            format_bytes(now)
        );
        rechecked.push(batch);
        let trial = self.trial(batch, TrialKind::Recheck)?;
        let observation = Observation { batch, outcome: trial.outcome, peak_bytes: trial.peak_bytes };
        let graph = trial.outcome.fits().then(|| self.workload.graph_tensors()).flatten();
        self.records[index] = Record { observation, baseline_bytes: trial.baseline_bytes, graph };
        self.keep_two_graphs();
        if trial.outcome.fits() {
            return Ok(true);
        }
        self.warn(Warning::RecheckFailed {
            batch,
            first_baseline_bytes: first_baseline,
            recheck_baseline_bytes: trial.baseline_bytes,
        });
        Ok(false)
    }

    /// Why the answer is not proven the largest, or `None` when it is: a
    /// trial of the next batch up was seen not to fit. Otherwise the limit
    /// that cut the search short, the largest candidate, or a strategy that
    /// does not bisect.
    fn stopped_by(&self, space: &SearchSpace, stopped: Option<SearchLimit>) -> Option<SearchLimit> {
        let history = self.history();
        let answer = Observation::best(&history)?.batch;
        let capped = self.element_cap().filter(|&(cap, _)| answer >= cap && cap < space.last());
        let next_failed = |next: usize| history.iter().any(|o| o.batch == next && !o.outcome.fits());
        if let (Some((_, elements)), Some(limit)) = (capped, self.element_limit) {
            let next = answer.saturating_add(space.multiple_of());
            if !next_failed(next) {
                return Some(stopped.unwrap_or(SearchLimit::TensorElements { batch: answer, elements, limit }));
            }
        }
        let Some(next) = answer.checked_add(space.multiple_of()).filter(|_| answer < space.last()) else {
            return Some(stopped.unwrap_or(SearchLimit::MaxBatch { max_batch: space.last() }));
        };
        if history.iter().any(|o| o.batch == next && !o.outcome.fits()) {
            return None;
        }
        Some(stopped.unwrap_or(match self.settings.options.strategy {
            Strategy::Power => SearchLimit::Strategy { strategy: Strategy::Power },
            _ => SearchLimit::NextBatchNotTried { batch: next },
        }))
    }

    /// The largest batch whose graph keeps every tensor within the element
    /// limit, and the most elements one tensor is expected to have a granule
    /// above it (at `cap + 1`: the search space rounds the cap down): each
    /// tensor's count followed as the line through the two largest fitting
    /// batches whose graphs have the same shape. `None` without a limit or
    /// two such graphs.
    fn element_cap(&self) -> Option<(usize, u64)> {
        let limit = self.element_limit?;
        let ((b1, g1), (b2, g2)) = self.two_largest_graphs(|tensor| tensor.elements)?;
        let (g1, g2) = (&g1[..], &g2[..]);
        let (b1, b2, limit) = (b1 as i128, b2 as i128, i128::from(limit));
        // per tensor: the largest batch at which its line stays within the limit
        let mut cap = i128::MAX;
        for (&c1, &c2) in g1.iter().zip(g2) {
            let (c1, c2) = (i128::from(c1), i128::from(c2));
            if c2 <= c1 {
                continue; // it does not grow with the batch
            }
            let (rise, run) = (c2 - c1, b2 - b1);
            let steps = (limit - c2).checked_mul(run).map_or(i128::MAX / 2, |reach| reach.div_euclid(rise));
            cap = cap.min(b2.saturating_add(steps));
        }
        if cap == i128::MAX {
            return None;
        }
        let at = |batch: i128| {
            g1.iter()
                .zip(g2)
                .map(|(&c1, &c2)| {
                    let (c1, c2) = (i128::from(c1), i128::from(c2));
                    if c2 <= c1 {
                        c2
                    } else {
                        ((batch - b2).saturating_mul(c2 - c1).div_euclid(b2 - b1)).saturating_add(c2)
                    }
                })
                .max()
                .unwrap_or(0)
        };
        let next = at(cap + 1).clamp(0, i128::from(u64::MAX)) as u64;
        Some((cap.clamp(0, usize::MAX as i128) as usize, next))
    }

    /// Drops every graph but the two [`two_largest_graphs`](Self::two_largest_graphs)
    /// reads: a graph lists every tensor of a step (thousands for a long
    /// recurrent model), and what the tuner holds on a CPU heap is part of
    /// every later trial's baseline, so holding one per trial would make the
    /// answer depend on how many trials came before.
    fn keep_two_graphs(&mut self) {
        let mut fitting: Vec<(usize, usize)> = self
            .records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.observation.outcome.fits() && r.graph.is_some())
            .map(|(index, r)| (r.observation.batch, index))
            .collect();
        fitting.sort_unstable();
        let Some(&(largest_batch, largest)) = fitting.last() else { return };
        let shape = self.records[largest].graph.as_ref().map_or(0, Vec::len);
        let below = fitting.iter().rev().find(|&&(batch, index)| {
            batch < largest_batch && self.records[index].graph.as_ref().is_some_and(|g| g.len() == shape)
        });
        let keep = [Some(largest), below.map(|&(_, index)| index)];
        for (index, record) in self.records.iter_mut().enumerate() {
            if !keep.contains(&Some(index)) {
                record.graph = None;
            }
        }
    }

    /// The fitting trials' graphs (one measure of each tensor: `measure`), by
    /// batch.
    fn graphs(&self, measure: impl Fn(&GraphTensor) -> u64) -> Vec<(usize, Vec<u64>)> {
        let mut graphs: Vec<(usize, Vec<u64>)> = self
            .records
            .iter()
            .filter(|r| r.observation.outcome.fits())
            .filter_map(|r| Some((r.observation.batch, r.graph.as_ref()?.iter().map(&measure).collect())))
            .collect();
        graphs.sort_by_key(|&(batch, _)| batch);
        graphs
    }

    /// The graphs of the two largest fitting batches whose graphs have the
    /// same shape, smaller first.
    #[allow(clippy::type_complexity)]
    fn two_largest_graphs(
        &self,
        measure: impl Fn(&GraphTensor) -> u64,
    ) -> Option<((usize, Vec<u64>), (usize, Vec<u64>))> {
        let mut graphs = self.graphs(measure);
        let largest = graphs.pop()?;
        let below = graphs.into_iter().rev().find(|(b, g)| *b < largest.0 && g.len() == largest.1.len())?;
        Some((below, largest))
    }

    /// A bound on the step's largest tensor in bytes, `fixed + per_sample ×
    /// batch` at and past the largest fit: through two graphs, each tensor's
    /// line (the largest part that stays and the fastest growth, together);
    /// from one, its largest tensor grown in proportion to the batch (a
    /// tensor grows at most so). `None` when no fitting graph was seen.
    fn largest_tensor(&self) -> Option<(u64, u64)> {
        if let Some(((b1, g1), (b2, g2))) = self.two_largest_graphs(GraphTensor::bytes) {
            let run = (b2 - b1) as u64;
            let (mut fixed, mut per_sample) = (0u64, 0u64);
            for (&c1, &c2) in g1.iter().zip(&g2) {
                let rise = c2.saturating_sub(c1).div_ceil(run);
                per_sample = per_sample.max(rise);
                fixed = fixed.max(c2.saturating_sub(rise.saturating_mul(b2 as u64)));
            }
            return Some((fixed, per_sample));
        }
        let (batch, graph) = self.graphs(GraphTensor::bytes).pop()?;
        let largest = graph.into_iter().max()?;
        Some((0, largest.div_ceil(batch.max(1) as u64)))
    }

    /// Whether `limit` has passed, or a trial at `batch` would end past it
    /// once a batch has been seen to fit: by the time per sample of the
    /// largest trial that ran to the end (a step's time grows at most in
    /// proportion to its batch, so the estimate errs long, and the search
    /// stops early rather than late).
    fn time_left(&self, limit: std::time::Duration, batch: usize) -> TimeLeft {
        let elapsed = self.started.elapsed();
        if elapsed >= limit {
            return TimeLeft::Passed;
        }
        match self.seconds_per_sample() {
            Some(per_sample) => {
                let end = elapsed + std::time::Duration::from_secs_f64(per_sample * (batch * self.steps()) as f64);
                if end > limit { TimeLeft::Until { end } } else { TimeLeft::Enough }
            }
            None => TimeLeft::Enough,
        }
    }

    /// The steps one trial runs.
    fn steps(&self) -> usize {
        self.settings.options.steps_per_trial
    }

    /// The time per sample of the largest trial that ran to the end, once a
    /// batch has been seen to fit.
    fn seconds_per_sample(&self) -> Option<f64> {
        if !self.trials.iter().any(|t| t.outcome.fits()) {
            return None;
        }
        self.trials
            .iter()
            .filter(|t| t.outcome != Outcome::OutOfMemory)
            .max_by_key(|t| t.batch)
            .map(|t| t.duration.as_secs_f64() / (t.batch * t.steps).max(1) as f64)
    }

    /// The largest batch below `batch` and above the largest fit, not tried
    /// yet, whose trial is expected to take at most half the time left before
    /// `limit`: verified in the
    /// time left, it is a better answer than the largest fit. `None` for a
    /// strategy that only doubles (its answer is a power of two).
    fn batch_in_time(
        &self,
        limit: std::time::Duration,
        space: &SearchSpace,
        bracket: &crate::search::Bracket,
        batch: usize,
    ) -> Option<usize> {
        if self.settings.options.strategy == Strategy::Power {
            return None;
        }
        // half the time left: a step's time per sample grows with the batch
        // (measured on the CPU: 7.3 ms at batch 16, 9.2 ms at 388), and the
        // search must end by the limit, not at it
        let left = limit.checked_sub(self.started.elapsed())?.as_secs_f64() / 2.0;
        let per_trial_sample = self.seconds_per_sample()? * self.steps() as f64;
        let granule = space.multiple_of();
        let affordable = (left / per_trial_sample).floor().min(batch as f64) as usize;
        let candidate = affordable - affordable % granule;
        let tried = self.history().iter().any(|o| o.batch == candidate);
        let above_fit = bracket.fitting.is_none_or(|fit| candidate > fit);
        (candidate < batch && candidate >= space.first() && above_fit && !tried).then_some(candidate)
    }

    /// Whether a step at a batch below `batch` ran to the end (fit or went
    /// over the ceiling): the same kernels worked there.
    fn ran_below(&self, batch: usize) -> bool {
        self.trials.iter().any(|t| t.batch < batch && t.outcome != Outcome::OutOfMemory)
    }

    fn best_index(&self) -> Option<usize> {
        let best = Observation::best(&self.history())?.batch;
        self.records.iter().position(|r| r.observation.batch == best)
    }

    /// One measured trial at `batch`.
    fn trial(&mut self, batch: usize, kind: TrialKind) -> Result<Trial, Error> {
        self.observer.trial_started(batch, kind);
        let workload = &mut *self.workload;
        let deadline = self.settings.options.time_limit.map(|limit| self.started + limit);
        let measured = measure(self.meter, self.settings.options.steps_per_trial, deadline, || match kind {
            TrialKind::Accumulation => workload.accumulating_step(batch),
            TrialKind::Search | TrialKind::Recheck | TrialKind::Timing => workload.step(batch),
        })?;
        let (peak, duration, baseline_bytes) = (measured.peak, measured.duration, measured.baseline_bytes);
        let peak_kinds = measured.peak_kinds;
        let outcome = match measured.result {
            Ok(()) => match measured.settled {
                // an asynchronous failure surfaces at the synchronize after the step
                Err(err) if meter_error_is_oom(&err) => {
                    warn!("batch {batch} ran out of memory at the synchronize after its step: {err}");
                    Outcome::OutOfMemory
                }
                Err(err) => return Err(err),
                Ok(()) if peak.as_ref().is_ok_and(|&peak| peak <= self.limit) => Outcome::Fits,
                Ok(()) => Outcome::OverCeiling,
            },
            Err(err) if is_oom(&err) || (may_be_oom(&err) && self.ran_below(batch)) => {
                if !is_oom(&err) {
                    warn!(
                        "batch {batch}: {} where a smaller batch ran the same step: counted as out of memory \
                         (a kernel loaded at the new shape found no memory)",
                        crate::error::candle_message(&err)
                    );
                }
                match measured.settled {
                    Err(failed) if !meter_error_is_oom(&failed) => {
                        // not the memory: the context may be broken; stop rather than go on measuring it
                        return Err(failed);
                    }
                    _ => {}
                }
                Outcome::OutOfMemory
            }
            Err(source) => return Err(Error::workload(batch, source)),
        };
        let peak_bytes = match (peak, outcome) {
            (Ok(peak), _) => Some(peak),
            (Err(err), Outcome::OutOfMemory) => {
                warn!("no peak after the out-of-memory step at batch {batch}: {err}");
                None
            }
            (Err(err), _) => return Err(err),
        };
        let steps = measured.steps;
        if steps < self.settings.options.steps_per_trial && outcome.fits() {
            info!(
                "batch {batch}: {steps} of {} steps ran before the time limit",
                self.settings.options.steps_per_trial
            );
        }
        let trial = Trial { batch, outcome, peak_bytes, duration, baseline_bytes, kind, steps, peak_kinds, size: None };
        self.log_trial(&trial);
        self.observer.trial_finished(&trial, self.capacity_bytes);
        if outcome.fits() {
            self.check_for_state(batch, baseline_bytes)?;
        } else {
            self.check_for_leak(batch, baseline_bytes)?;
        }
        self.trials.push(trial.clone());
        Ok(trial)
    }

    /// A model that keeps state between steps (a KV cache) leaves memory
    /// held after every step that fits; a runtime's one-off workspace, after
    /// one. Fitting trials that each left memory held (more than a step's
    /// noise), two in a row, and together more than the meter's slack since
    /// the first trial, are a warning.
    fn check_for_state(&mut self, batch: usize, baseline_bytes: u64) -> Result<(), Error> {
        /// Heap peaks of a warm step repeat to within about a kilobyte.
        const NOISE: u64 = 4 << 10;
        let after_bytes = self.meter.in_use()?;
        let first = *self.first_baseline.get_or_insert(baseline_bytes);
        if after_bytes <= baseline_bytes.saturating_add(NOISE) {
            self.held_in_a_row = 0;
            return Ok(());
        }
        self.held_in_a_row += 1;
        let risen = after_bytes.saturating_sub(first) > self.meter.slack_bytes();
        if self.held_in_a_row >= 2 && risen && !self.warnings.iter().any(|w| matches!(w, Warning::StateKept { .. })) {
            self.warn(Warning::StateKept { batch, baseline_bytes: first, after_bytes });
        }
        Ok(())
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

    /// The split of the target from `largest_batch`, verified with the
    /// accumulator held when it accumulates and the workload can: the
    /// micro-batch steps down (by what the overshoot says, at least one
    /// granule) until an accumulating micro-step fits. Returns the split and
    /// the verified peak.
    fn verified_split(&mut self, space: &SearchSpace, largest_batch: usize) -> Result<Split, Error> {
        let mut cap = largest_batch;
        loop {
            let mut split = self.settings.split(cap)?;
            if split.accumulation_steps() <= 1 || !self.workload.can_accumulate() {
                return Ok(split);
            }
            let micro = split.micro_batch_of(0);
            let trial = self.trial(micro, TrialKind::Accumulation)?;
            if trial.outcome.fits() {
                split.set_accumulating_peak_bytes(trial.peak_bytes);
                return Ok(split);
            }
            let per_sample = MemoryModel::fit(&self.trials, micro, trial.peak_bytes.unwrap_or(0))
                .map_or(0.0, |model| model.bytes_per_sample_at(micro));
            let over = trial.peak_bytes.map_or(0, |peak| peak.saturating_sub(self.limit));
            match super::step_down(micro, over, per_sample, space.multiple_of()).filter(|&next| next >= space.first()) {
                Some(next) => {
                    info!("accumulating at micro-batch {micro} does not fit: trying at most {next}");
                    cap = next;
                }
                None => {
                    let device = (self.capacity_bytes, self.limit, self.settings.ceiling.fraction());
                    return Err(Error::nothing_fits_at(micro, trial.outcome, trial.peak_bytes, device));
                }
            }
        }
    }

    /// [`Objective::Throughput`]: times the largest batch, ¾ and ½ of it (at the
    /// granularity, fitting candidates only) `timing_repeats` times each, in
    /// rounds so that a slow spell of the machine hits every candidate, and
    /// picks the best median throughput (the larger batch on a tie).
    fn time_candidates(&mut self, space: &SearchSpace, largest: usize) -> Result<ThroughputChoice, Error> {
        let granule = space.multiple_of();
        let mut batches: Vec<usize> = [largest, largest * 3 / 4, largest / 2]
            .into_iter()
            .map(|b| b - b % granule)
            .filter(|&b| b >= space.first())
            .collect();
        batches.sort_unstable();
        batches.dedup();
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); batches.len()];
        let mut extra_steps = 0;
        let (planned, mut timed) = (self.settings.options.timing_repeats * batches.len(), 0);
        'timing: for _ in 0..self.settings.options.timing_repeats {
            for (index, &batch) in batches.iter().enumerate() {
                let late = self
                    .settings
                    .options
                    .time_limit
                    .is_some_and(|limit| !matches!(self.time_left(limit, batch), TimeLeft::Enough));
                if late {
                    self.warn(Warning::TimingCut { timed, planned });
                    break 'timing;
                }
                timed += 1;
                let trial = self.trial(batch, TrialKind::Timing)?;
                extra_steps += trial.steps;
                if let Some(rate) = trial.samples_per_second() {
                    times[index].push(rate);
                }
            }
        }
        let candidates: Vec<ThroughputPoint> = batches
            .iter()
            .zip(times)
            .filter(|(_, rates)| !rates.is_empty())
            .map(|(&batch, mut rates)| {
                rates.sort_by(f64::total_cmp);
                let median = rates[rates.len() / 2];
                let spread = (rates[rates.len() - 1] - rates[0]) / median;
                ThroughputPoint { batch, samples_per_second: median, spread }
            })
            .collect();
        let chosen_batch = candidates
            .iter()
            .max_by(|a, b| a.samples_per_second.total_cmp(&b.samples_per_second).then(a.batch.cmp(&b.batch)))
            .map_or(largest, |p| p.batch);
        // DeepSpeed: from the smallest, move up while the next is ≥ 5% faster
        let mut deepspeed = candidates.first().map_or(largest, |p| p.batch);
        for pair in candidates.windows(2) {
            if pair[1].samples_per_second >= 1.05 * pair[0].samples_per_second {
                deepspeed = pair[1].batch;
            } else {
                break;
            }
        }
        info!("throughput: batch {chosen_batch} is the fastest; {extra_steps} extra steps");
        Ok(ThroughputChoice { candidates, chosen_batch, deepspeed_batch: deepspeed, extra_steps })
    }

    fn make_plan(
        &mut self,
        space: &SearchSpace,
        stopped_by: Option<SearchLimit>,
        profile: Option<TrainingSetup>,
    ) -> Result<Plan, Error> {
        let settings = self.settings;
        let history = self.history();
        let Some(found) = Observation::best(&history).copied() else {
            let smallest = history.iter().min_by_key(|o| o.batch).expect("a search always runs at least one trial");
            let trial = self.trials.iter().rev().find(|t| t.batch == smallest.batch);
            let setup = match (profile, trial) {
                (Some(profile), Some(trial)) => Some(self.measured_setup(&profile, trial)?),
                _ => None,
            };
            let remedies = match &setup {
                Some(setup) => setup.remedies(self.limit)?,
                None => Vec::new(),
            };
            let smaller_batch = trial.and_then(|trial| self.smaller_batch(space, trial, setup.as_ref()));
            let device = (self.capacity_bytes, self.limit, settings.ceiling.fraction());
            let failure = Error::nothing_fits_at(smallest.batch, smallest.outcome, smallest.peak_bytes, device);
            return Err(failure.with_advice(smaller_batch, remedies));
        };
        let largest_batch = found.batch;
        let throughput = match settings.options.objective {
            Objective::Throughput => Some(self.time_candidates(space, largest_batch)?),
            Objective::LargestBatch => None,
        };
        let cap = throughput.as_ref().map_or(largest_batch, |choice| choice.chosen_batch);
        let split = self.verified_split(space, cap)?;
        let peak_bytes = found.peak_bytes.expect("a fitting trial always has a peak");
        let memory_model = MemoryModel::fit(&self.trials, largest_batch, peak_bytes);
        Ok(Plan {
            largest_batch,
            peak_bytes,
            stopped_by,
            split,
            search: SearchSettings {
                capacity_bytes: self.capacity_bytes,
                ceiling: settings.ceiling,
                multiple_of: settings.options.multiple_of,
                strategy: settings.options.strategy,
            },
            trials: std::mem::take(&mut self.trials),
            warnings: std::mem::take(&mut self.warnings),
            memory_model,
            evaluation: None,
            throughput,
            tuning: TuningCost::default(),
            cache: None,
            distributed: None,
            device: self.meter.device_name(),
            untrained_gradient_bytes: self.untrained_gradient_bytes,
        })
    }

    /// The failed trial as the analytical model sees it: its baseline holds
    /// the weights and optimizer state (the rest of it is memory outside the
    /// model), its peak adds the gradients and the activations. The setup's
    /// total is the measured peak.
    fn measured_setup(&self, profile: &TrainingSetup, trial: &Trial) -> Result<TrainingSetup, Error> {
        let setup = TrainingSetup::new(profile.parameters, profile.precision, profile.optimizer)
            .largest_variable(profile.largest_variable);
        let state = setup.state()?;
        let resident = state.weights + state.optimizer_states + state.master_weights;
        let other = trial.baseline_bytes.saturating_sub(resident);
        let transient = state.gradients + setup.step_bytes()?;
        let peak = trial.peak_bytes.unwrap_or(self.capacity_bytes).max(trial.baseline_bytes + transient);
        let activations = peak - trial.baseline_bytes - transient;
        let setup = match profile.transformer {
            Some(shape) => {
                let shape = TransformerShape { batch: trial.batch as u64, ..shape };
                setup.measured_transformer(activations, shape, profile.recompute)?
            }
            None => setup.activations(activations),
        };
        Ok(setup.other(other + resident.saturating_sub(trial.baseline_bytes)))
    }

    /// A batch below the failed smallest candidate that its measurement says
    /// fits: the memory above the fixed bytes (the baseline, and the
    /// gradients when the model is known) taken as proportional to the batch.
    /// An over-estimate per sample when part of it does not grow with the
    /// batch, so the batch found is on the safe side.
    fn smaller_batch(&self, space: &SearchSpace, trial: &Trial, setup: Option<&TrainingSetup>) -> Option<usize> {
        let peak = trial.peak_bytes?;
        let transient = setup.map_or(Ok(0), |setup| Ok::<_, Error>(setup.state()?.gradients + setup.step_bytes()?));
        let fixed = trial.baseline_bytes + transient.unwrap_or(0);
        let per_sample = peak.checked_sub(fixed)? as f64 / trial.batch as f64;
        let room = self.limit.checked_sub(fixed)? as f64;
        let batch = if per_sample > 0.0 { (room / per_sample).floor() as usize } else { trial.batch };
        let granule = space.multiple_of();
        let batch = batch.min(trial.batch - 1) / granule * granule;
        (batch >= granule).then_some(batch)
    }
}
