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
        drop(workload); // the balanced routing's model is measured alone
        let routing = if eval { None } else { self.balanced_routing(meter, plan.largest_batch())? };
        if request.json {
            let mut json = plan.to_json();
            if let Some(routing) = &routing {
                let mut value: serde_json::Value = serde_json::from_str(&json).expect("a plan's own JSON reads back");
                value["routing"] = routing.to_json();
                json = serde_json::to_string_pretty(&value).expect("plain values serialize");
            }
            outln!("{}", crate::hub::annotated(&json));
        } else {
            outln!("{}", plan.summary());
            if let Some(routing) = &routing {
                outln!("{routing}");
            }
        }
        if let Some(path) = &request.plot {
            crate::plot::plan(path, &format!("{description} on {}", self.device_words), &plan)?;
        }
        Ok(())
    }

    /// A mixture of experts' answer beside the one its router's own choice
    /// gives (about even on random weights): the probe measures the worst
    /// routing, so that the answer holds whatever the data does; the gap is
    /// what a balanced measurement would have promised too much. `None` for
    /// a model without experts.
    fn balanced_routing(&self, meter: &mut dyn MemoryMeter, largest: usize) -> Result<Option<Routed>, Failure> {
        let Some((balanced, experts, per_token)) = self.model.routed_by_router() else { return Ok(None) };
        let Optimizing { mixed, optimizer } = self.request.optimizing;
        let mut workload = balanced.build_with(self.device, mixed, optimizer)?;
        (self.header)("probing the same model with its tokens routed by its router, for the balanced figure");
        // an expert the router sends no token to has no gradient: not a cut graph
        let tuner = self.request.tuner.clone().allow_partial_graph(true).observer(Progress::shared(self.request.json));
        let result = tuner.search(&mut *workload, meter).run();
        drop(tuner);
        let balanced = match result {
            Ok(plan) => Some(plan.largest_batch()),
            Err(err) => {
                log::warn!("the balanced routing's probe: {err}");
                None
            }
        };
        Ok(Some(Routed { experts, per_token, largest, balanced }))
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

/// What a mixture of experts' plan says of its routing.
struct Routed {
    experts: usize,
    per_token: usize,
    /// The largest batch at the worst routing: the answer.
    largest: usize,
    /// The largest batch with the router's own choice, where its probe ran.
    balanced: Option<usize>,
}

impl Routed {
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "measured": "worst",
            "experts": self.experts,
            "experts_per_token": self.per_token,
            "largest_batch": self.largest,
            "balanced_largest_batch": self.balanced,
            "largest_batch_either_routing": self.balanced.map_or(self.largest, |balanced| balanced.min(self.largest)),
        })
    }
}

impl std::fmt::Display for Routed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "routing: measured with every token sent to the same {} of {} experts (the worst routing: \
             each other expert a token), so that {} holds whatever the data routes",
            self.per_token, self.experts, self.largest
        )?;
        match self.balanced {
            Some(balanced) if balanced > self.largest => write!(
                f,
                "; routed by the router (about even on random weights) {balanced} fit: {} more than a batch \
                 routed the worst way holds",
                balanced - self.largest
            ),
            Some(balanced) if balanced == self.largest => {
                write!(f, "; routed by the router (about even on random weights) {balanced} fit too")
            }
            // the step's own tensors are the same under any routing to a few bytes; on the
            // CPU the matmul threads' buffers follow the experts' shapes
            Some(balanced) => write!(
                f,
                "; routed by the router (about even on random weights) only {balanced} fit (buffers sized by \
                 the experts' shapes): take {balanced}, which holds either way"
            ),
            None => write!(f, "; the router's own routing was not measured"),
        }
    }
}
