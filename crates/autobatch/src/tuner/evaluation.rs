//! The evaluation step's own largest batch.

use log::info;

use super::{Observer, Settings};
use crate::plan::EvaluationPlan;
use crate::{Error, MemoryMeter, Plan, Workload};

impl Settings {
    /// [`Search::run`](crate::Search::run) with these settings.
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
