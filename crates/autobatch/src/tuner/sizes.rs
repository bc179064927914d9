//! Tuning at several input sizes: one verified search per size, and the
//! plan across them.

use log::info;

use super::{Observer, Search, Settings};
use crate::plan::SizePlan;
use crate::{Error, MemoryMeter, Resizable};

impl<W: Resizable + ?Sized, M: MemoryMeter + ?Sized> Search<'_, W, M> {
    /// Tunes `workload` at each input size in `sizes` (sequence lengths, image
    /// sides) and returns the [`SizePlan`]: every size's largest batch, found
    /// and verified by its own search (longest size first), a memory model in
    /// batch and size fitted to all the measurements, the token budget per
    /// micro-batch, and [`SizePlan::batch_for`] for sizes in between.
    ///
    /// Each size is a full [`run`](crate::Search::run) with this tuner's settings
    /// (target, accumulation check, objective); with a [`cache`](crate::Tuner::cache)
    /// each size is stored under the model's key plus the size. The workload
    /// is left at the size it had. The sizes must be non-zero; duplicates
    /// count once. A failure at one size is [`Error::AtSize`].
    pub fn sizes(self, sizes: &[usize]) -> Result<SizePlan, Error> {
        let plan =
            self.tuner.settings()?.run_sizes(&mut *self.workload, self.meter, sizes, &mut self.tuner.observing());
        let _ = self.workload.free_training_state();
        plan
    }
}

impl Settings {
    /// [`Search::sizes`] with these settings.
    pub(super) fn run_sizes<W, M, O>(
        &self,
        workload: &mut W,
        meter: &mut M,
        sizes: &[usize],
        observer: &mut O,
    ) -> Result<SizePlan, Error>
    where
        W: Resizable + ?Sized,
        M: MemoryMeter + ?Sized,
        O: Observer + ?Sized,
    {
        if sizes.is_empty() {
            return Err(Error::zero(crate::Setting::Sizes));
        }
        if sizes.contains(&0) {
            return Err(Error::zero(crate::Setting::Size));
        }
        let mut sizes = sizes.to_vec();
        sizes.sort_unstable();
        sizes.dedup();
        let key = match &self.options.cache_path {
            Some(_) => Some(self.model_key(&*workload)?),
            None => None,
        };
        let original = workload.size();
        let mut plans = std::collections::BTreeMap::new();
        // the longest first: the worst case fails fast
        for &size in sizes.iter().rev() {
            observer.size_started(size);
            let at_size = self.keyed(key.clone().map(|k| k.param("autobatch.size", size)));
            let result = workload.resize(size).and_then(|()| at_size.search(workload, meter, observer));
            match result {
                Ok(plan) => {
                    info!("size {size}: largest batch {}", plan.largest_batch);
                    plans.insert(size, plan);
                }
                Err(err) => {
                    // put the workload back, but report the size's failure, not this
                    let _ = workload.resize(original);
                    return Err(Error::AtSize { size, source: Box::new(err) });
                }
            }
        }
        workload.resize(original)?;
        let plan = SizePlan::new(plans)?;
        for ((shorter, short), (longer, long)) in plan.sizes.iter().zip(plan.sizes.iter().skip(1)) {
            if long.largest_batch > short.largest_batch {
                log::warn!(
                    "size {longer} fits batch {} but the shorter size {shorter} only {}: memory does not grow with \
                     size here",
                    long.largest_batch,
                    short.largest_batch
                );
            }
        }
        Ok(plan)
    }
}
