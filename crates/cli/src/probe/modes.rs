//! One probe command on a chosen meter: the question its request asks, the
//! same on the CPU and on a GPU.

use crate::output::outln;
use autobatch::MemoryMeter;
use autobatch_models::trainer::ReferenceWorkload;

use crate::failure::Failure;
use crate::model::{LengthWorkload, only_applicable_advice};
use crate::progress::Progress;

use super::context::Run;
use super::request::Question;
use crate::model::Optimizing;

impl Run<'_> {
    /// The mode the flags ask for, on `meter`: every mode on every meter.
    pub fn dispatch(&self, meter: &mut dyn MemoryMeter) -> Result<(), Failure> {
        match &self.request.question {
            Question::Compare => {
                (self.header)(&format!("comparing remedies on {} ({})", self.device_words, self.size_from));
                super::compare::compare(self, meter)
            }
            Question::Find { batch, granule } => super::find::run(self, meter, *batch, *granule),
            Question::Lengths(lengths) => match self.model.at_lengths(self.device, self.request.optimizing) {
                Some(workload) => self.tune_lengths(&mut *workload?, meter, lengths),
                None => Err(Failure::usage("--seq-lens needs a model with a sequence length")),
            },
            Question::Check { batch } => self.check(meter, *batch),
            Question::Batch { eval } => {
                let workload = self.built("probing")?;
                self.tune(workload, meter, *eval)
            }
        }
    }

    /// One probe of `workload`: its plan, printed (and drawn with `--plot`);
    /// where nothing fits, the advice measured once the model is dropped.
    fn tune(
        &self,
        mut workload: Box<dyn ReferenceWorkload>,
        meter: &mut dyn MemoryMeter,
        eval: bool,
    ) -> Result<(), Failure> {
        let request = self.request;
        let tuner = request.tuner.clone().observer(Progress::shared(request.json));
        let result = if eval {
            let mut evaluation = workload.evaluation_workload();
            tuner.search(&mut *workload, meter).evaluating(&mut *evaluation).run()
        } else {
            tuner.search(&mut *workload, meter).run()
        };
        drop(tuner); // the live rows end before the plan prints
        let description = workload.description();
        let plan = match result {
            Ok(plan) => plan,
            Err(err @ autobatch::Error::NothingFits { .. }) => {
                drop(workload); // the changes are measured in the memory the model held
                return Err(super::advice::measured(self, meter, err));
            }
            Err(err) => return Err(Failure::from(only_applicable_advice(self.model, err))),
        };
        if plan.cached()
            && let Some(path) = &request.cache
        {
            log::info!("the plan came from the cache {}", path.display());
        }
        if request.json {
            outln!("{}", crate::hub::annotated(&plan.to_json()));
        } else {
            outln!("{}", plan.summary());
        }
        if let Some(path) = &request.plot {
            crate::plot::plan(path, &format!("{description} on {}", self.device_words), &plan)?;
        }
        Ok(())
    }

    /// The model built with its optimizer, and the header that says what
    /// runs where: `{doing} model (parameters) on device (where its size came from)`.
    fn built(&self, doing: &str) -> Result<Box<dyn ReferenceWorkload>, Failure> {
        let Optimizing { mixed, optimizer } = self.request.optimizing;
        let workload = self.model.build_with(self.device, mixed, optimizer)?;
        (self.header)(&format!(
            "{doing} {} ({}) on {} ({})",
            workload.description(),
            self.model.parameters_said(workload.parameter_count()),
            self.device_words,
            self.size_from
        ));
        Ok(workload)
    }

    /// `--check N`: N and the next batch up, run; the verdict, no search and
    /// no advice (exit 3 where N does not fit).
    fn check(&self, meter: &mut dyn MemoryMeter, batch: usize) -> Result<(), Failure> {
        let request = self.request;
        let mut workload = self.built(&format!("checking batch {batch} of"))?;
        let tuner = request.tuner.clone().observer(Progress::shared(request.json));
        let result = tuner.search(&mut *workload, meter).check(batch);
        drop(tuner); // the live rows end before the verdict prints
        let check = result.map_err(Failure::from)?;
        let limit_bytes = check.ceiling.limit_bytes(check.capacity_bytes);
        match request.json {
            true => {
                let value = serde_json::json!({
                    "batch": batch,
                    "fits": check.fits(),
                    "largest": check.is_largest(),
                    "capacity_bytes": check.capacity_bytes,
                    "ceiling": check.ceiling,
                    "limit_bytes": limit_bytes,
                    "trials": check.trials,
                });
                let value = crate::hub::annotate(value);
                outln!("{}", serde_json::to_string_pretty(&value).expect("plain values serialize"));
            }
            false => outln!("{}", check.summary()),
        }
        if !check.fits() {
            return Err(Failure::nothing_fits(format!(
                "batch {batch} does not fit under the ceiling ({} limit)",
                autobatch::Bytes(limit_bytes)
            )));
        }
        Ok(())
    }

    /// `--seq-lens`: the model tuned at each length, and the plan across them.
    fn tune_lengths(
        &self,
        trainer: &mut dyn LengthWorkload,
        meter: &mut dyn MemoryMeter,
        lengths: &[usize],
    ) -> Result<(), Failure> {
        let request = self.request;
        (self.header)(&format!(
            "probing {} ({}) at sequence lengths {:?} on {}",
            trainer.description(),
            self.model.parameters_said(trainer.parameter_count()),
            lengths,
            self.device_words
        ));
        let tuner = request.tuner.clone().observer(Progress::shared(request.json));
        let result = tuner.search(trainer, meter).sizes(lengths);
        drop(tuner); // the live rows end before the plan prints
        let plan = result.map_err(|err| only_applicable_advice(self.model, err))?;
        if let Some(path) = &request.plot {
            let title = format!("{} on {}", trainer.description(), self.device_words);
            crate::plot::sizes(path, &title, &plan)?;
        }
        if request.json {
            outln!("{}", crate::hub::annotated(&plan.to_json()));
            return Ok(());
        }
        outln!("{plan}");
        let lengths: Vec<usize> = plan.sizes.keys().copied().collect();
        let mut between: Vec<String> = Vec::new();
        for pair in lengths.windows(2) {
            let middle = (pair[0] + pair[1]) / 2;
            if middle > pair[0] {
                let predicted = plan.batch_for(middle)?;
                between.push(format!("{} → {} ({})", middle, predicted.batch, predicted.source));
            }
        }
        if !between.is_empty() {
            outln!("between probed lengths: {}", between.join(", "));
        }
        Ok(())
    }
}
