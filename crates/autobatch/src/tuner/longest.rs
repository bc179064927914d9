//! The longest input size that fits at a given batch: the batch search's
//! engine run over the size, the batch held fixed.

use log::info;

use super::{Observer, Search, Settings};
use crate::plan::{LongestSize, Objective, SizeRange, Trial};
use crate::{Error, MemoryMeter, Resizable, Workload};

impl<W: Resizable + ?Sized, M: MemoryMeter + ?Sized> Search<'_, W, M> {
    /// Finds the longest input size in `range` (a sequence length, an image
    /// side, at its granule) whose step at `batch` fits under the ceiling,
    /// exact and verified like the batch search: the answer fits, and
    /// `answer + range.multiple_of` was seen not to (else the range's
    /// longest size is the answer, and the result says so).
    ///
    /// The search is the tuner's own, over the size: [`Strategy::Predictive`](crate::search::Strategy::Predictive)
    /// fits the peaks it measured (memory grows linearly in the length, and
    /// quadratically with attention: its parabola forecast meets both) and
    /// jumps near the answer; warm-up, re-check, [`max_trials`](crate::Tuner::max_trials),
    /// [`time_limit`](crate::Tuner::time_limit), [`steps_per_trial`](crate::Tuner::steps_per_trial),
    /// [`allow_partial_graph`](crate::Tuner::allow_partial_graph) and the ceiling apply as they do to batches.
    /// The batch-only settings (`start`, `max_batch`, `multiple_of`, a target
    /// effective batch, several ranks, [`Objective::Throughput`], a cache) do
    /// not: set one and this fails with [`Error::InvalidSetting`] (its value [`Value::Given`](crate::Value::Given)) rather
    /// than ignore it. The workload is put back at the size it had.
    ///
    /// When even the shortest size does not fit at `batch`, the result is
    /// [`Error::NothingFits`] with the shortest size; a size the workload refuses to take
    /// ([`Resizable::resize`] fails) ends the search with that error.
    ///
    /// ```
    /// use autobatch::memory::simulated::SizedSimulation;
    /// use autobatch::{plan::SizeRange, Tuner};
    ///
    /// // 1 GiB fixed, 4 KiB per token and 1 KiB per token squared, at batch 8
    /// let sim = SizedSimulation::new(16 << 30, 64, |batch, len| {
    ///     (1 << 30) + (batch * len * 4096) as u64 + (batch * len * len * 1024) as u64
    /// });
    /// let (mut workload, mut meter) = sim.build();
    /// let longest = Tuner::new().search(&mut workload, &mut meter).longest(8, SizeRange::up_to(4096).multiple_of(64))?;
    /// assert!(longest.proven_longest);
    /// let peak = |len: u64| (1u64 << 30) + 8 * len * 4096 + 8 * len * len * 1024;
    /// let limit = longest.limit_bytes();
    /// assert!(peak(longest.largest_size as u64) <= limit && peak(longest.largest_size as u64 + 64) > limit);
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn longest(self, batch: usize, range: SizeRange) -> Result<LongestSize, Error> {
        let settings = self.tuner.settings()?;
        let longest = settings.run_longest(&mut *self.workload, self.meter, batch, range, &mut self.tuner.observing());
        let _ = self.workload.free_training_state();
        longest
    }
}

impl Settings {
    /// [`Search::longest`] with these settings.
    pub(super) fn run_longest<W, M, O>(
        &self,
        workload: &mut W,
        meter: &mut M,
        batch: usize,
        range: SizeRange,
        observer: &mut O,
    ) -> Result<LongestSize, Error>
    where
        W: Resizable + ?Sized,
        M: MemoryMeter + ?Sized,
        O: Observer + ?Sized,
    {
        if batch == 0 {
            return Err(Error::zero(crate::Setting::Batch));
        }
        self.check_for_size_search()?;
        let over_sizes = self.over_sizes(&range);
        over_sizes.space()?;
        let original = workload.size();
        observer.size_search_started(batch);
        let mut at_batch = AtBatch { workload: &mut *workload, batch, refused: None };
        let result = over_sizes.search(&mut at_batch, meter, observer);
        let refused = at_batch.refused.take();
        let restored = workload.resize(original);
        let plan = match (result, refused) {
            (_, Some(refused)) => return Err(refused),
            (Err(nothing @ Error::NothingFits { .. }), None) => return Err(nothing.at_fixed_batch(batch)),
            (result, None) => result?,
        };
        restored?;
        info!("longest size at batch {batch}: {}", plan.largest_batch);
        Ok(LongestSize {
            batch,
            largest_size: plan.largest_batch,
            proven_longest: plan.proven_largest(),
            complete_graph: plan.complete_graph(),
            capacity_bytes: plan.capacity_bytes(),
            ceiling: plan.ceiling(),
            stopped_by: plan.stopped_by,
            peak_bytes: plan.peak_bytes,
            range,
            trials: plan.trials.into_iter().map(|trial| Trial { batch, size: Some(trial.batch), ..trial }).collect(),
            warnings: plan.warnings,
        })
    }

    /// The settings of a batch search that mean nothing over sizes.
    fn check_for_size_search(&self) -> Result<(), Error> {
        let default = super::Options::default();
        let given = [
            (crate::Setting::Start, self.options.start != default.start),
            (crate::Setting::MaxBatch, self.options.max_batch.is_some()),
            (crate::Setting::MultipleOf, self.options.multiple_of != default.multiple_of),
            (crate::Setting::TargetEffectiveBatch, self.options.target_effective_batch.is_some()),
            (crate::Setting::WorldSize, self.options.world_size != 1),
            (crate::Setting::Objective, self.options.objective != Objective::LargestBatch),
            (crate::Setting::UnevenRanks, self.options.uneven_ranks),
            (crate::Setting::Cache, self.options.cache_path.is_some()),
        ];
        match given.into_iter().find(|&(_, set)| set) {
            Some((setting, _)) => Err(Error::invalid(
                setting,
                crate::Value::Given,
                "it is a setting of the batch search and does not apply to the search over the input size (the \
                 batch is fixed; the sizes come from the size range): leave it unset",
            )),
            None => Ok(()),
        }
    }
}

/// The workload at a fixed batch, stepped by size.
struct AtBatch<'a, W: ?Sized> {
    workload: &'a mut W,
    batch: usize,
    /// The workload's refusal of a size: ends the search as itself.
    refused: Option<Error>,
}

impl<W: Resizable + ?Sized> Workload for AtBatch<'_, W> {
    fn step(&mut self, size: usize) -> candle_core::Result<()> {
        if let Err(err) = self.workload.resize(size) {
            let message = format!("the workload refused size {size}: {err}");
            self.refused = Some(err);
            return Err(candle_core::Error::Msg(message));
        }
        self.workload.step(self.batch)
    }

    fn diagnose(&mut self) -> Vec<crate::plan::Warning> {
        self.workload.diagnose()
    }

    fn tuning_finished(&mut self) {
        self.workload.tuning_finished();
    }
}
