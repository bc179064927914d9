//! The evaluation step's own largest batch.

use log::info;

use super::{Observer, Settings, Tuner};
use crate::plan::EvaluationPlan;
use crate::{Error, MemoryMeter, Plan, Workload};

impl Tuner {
    /// [`run`](Tuner::run) for the training step, then the evaluation
    /// step's own largest batch (forward only: usually larger), searched from
    /// the training answer: first with the training workload's state held, as
    /// in a loop that evaluates between training steps, then, when the
    /// workload can free its optimizer's state
    /// ([`Workload::free_training_state`]: [`ModelProbe`](crate::ModelProbe)
    /// with one of its optimizers, the reference models), alone, as a
    /// separate evaluation or serving process runs it, starting where the
    /// freed bytes say. The plan's [`evaluation`](Plan::evaluation) gives the
    /// answer alone, and the one beside training's state in
    /// [`during_training`](crate::EvaluationPlan::during_training). The
    /// training workload builds its state again at its next step.
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
    ///     .adamw(ParamsAdamW::default())?;
    /// let mut evaluation = ModelProbe::forward_only(&varmap, |samples| model.forward(&input(samples)?));
    /// let mut meter = HeapMeter::with_room(4 << 20, 0.9)?;
    /// let plan = Tuner::new().run_with_eval(&mut training, &mut evaluation, &mut meter)?;
    /// let evaluation = plan.evaluation.unwrap();
    /// let during = evaluation.during_training.unwrap();
    /// assert!(evaluation.largest_batch >= during.largest_batch && during.largest_batch > plan.largest_batch);
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn run_with_eval<W, E, M>(&self, train: &mut W, eval: &mut E, meter: &mut M) -> Result<Plan, Error>
    where
        W: Workload + ?Sized,
        E: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
    {
        self.settings()?.run_with_eval(train, eval, meter, &mut self.observing())
    }
}

impl Settings {
    /// [`Tuner::run_with_eval`] with these settings.
    pub(super) fn run_with_eval<W, E, M, O>(
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
        let mut plan = self.search(train, meter, observer)?;
        // cached under the training step's model key, marked as the evaluation step
        let key = self.options.cache_key.clone().or_else(|| train.cache_key());
        let from_training = self
            .single_rank()
            .starting_at(plan.largest_batch.max(self.options.start))
            .keyed(key.clone().map(|key| key.param("autobatch.step", "evaluation")));
        info!("evaluation step: searching from batch {}", from_training.options.start);
        observer.evaluation_started(from_training.options.start);
        let during = match from_training.search(eval, meter, observer) {
            // an evaluation step bigger than the training step at the same batch
            Err(Error::NothingFits { .. }) => {
                observer.evaluation_started(self.options.start);
                from_training.starting_at(self.options.start).search(eval, meter, observer)?
            }
            other => other?,
        };
        plan.warnings.extend(during.warnings.iter().cloned());
        plan.tuning = plan.tuning + during.tuning;
        let held = meter.in_use()?;
        let state_bytes = train.free_training_state();
        let alone = if state_bytes == 0 {
            None
        } else {
            let freed = held.saturating_sub(meter.in_use()?);
            let per_sample = during.memory_model.as_ref().map_or(0.0, |model| model.bytes_per_sample);
            let more = if per_sample > 0.0 { (freed as f64 / per_sample) as usize } else { 0 };
            let alone = from_training
                .starting_at(during.largest_batch)
                .hinted(during.largest_batch.saturating_add(more))
                .keyed(key.map(|key| key.param("autobatch.step", "evaluation alone")));
            info!("evaluation alone: {} of optimizer state freed, searching from batch {}", freed, alone.options.start);
            observer.evaluation_alone_started(alone.options.start, freed);
            let found = alone.search(eval, meter, observer)?;
            for warning in &found.warnings {
                if !plan.warnings.contains(warning) {
                    plan.warnings.push(warning.clone());
                }
            }
            plan.tuning = plan.tuning + found.tuning;
            Some(found)
        };
        plan.evaluation = Some(match alone {
            Some(alone) => EvaluationPlan {
                during_training: Some(Box::new(EvaluationPlan { state_bytes, ..evaluation(during) })),
                ..evaluation(alone)
            },
            None => evaluation(during),
        });
        Ok(plan)
    }
}

/// The evaluation step's answer from its search's plan.
fn evaluation(searched: Plan) -> EvaluationPlan {
    EvaluationPlan {
        largest_batch: searched.largest_batch,
        peak_bytes: searched.peak_bytes,
        proven_largest: searched.proven_largest(),
        stopped_by: searched.stopped_by,
        trials: searched.trials,
        state_bytes: 0,
        during_training: None,
    }
}
