//! The evaluation step's own largest batch.

use log::info;

use super::{Observer, Tuner};
use crate::plan::EvaluationPlan;
use crate::{Error, MemoryMeter, Plan, Workload};

impl Tuner {
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
        // cached under the training step's model key, marked as the evaluation step
        let cache_key =
            self.cache_key.clone().or_else(|| train.cache_key()).map(|key| key.param("autobatch.step", "evaluation"));
        let from_training = Tuner {
            start: plan.largest_batch.max(self.start),
            target_effective_batch: None,
            world_size: 1,
            exact_effective_batch: false,
            cache_path: self.cache_path.clone().filter(|_| cache_key.is_some()),
            cache_key,
            ..self.clone()
        };
        info!("evaluation step: searching from batch {}", from_training.start);
        observer.evaluation_started(from_training.start);
        let evaluated = match from_training.run_observed(eval, meter, observer) {
            // an evaluation step bigger than the training step at the same batch
            Err(Error::NothingFits { .. }) => {
                observer.evaluation_started(self.start);
                Tuner { start: self.start, ..from_training }.run_observed(eval, meter, observer)?
            }
            other => other?,
        };
        plan.warnings.extend(evaluated.warnings);
        plan.tuning = plan.tuning + evaluated.tuning;
        plan.evaluation = Some(EvaluationPlan {
            largest_batch: evaluated.largest_batch,
            peak_bytes: evaluated.peak_bytes,
            proven_largest: evaluated.proven_largest,
            stopped_by: evaluated.stopped_by,
            trials: evaluated.trials,
        });
        Ok(plan)
    }
}
