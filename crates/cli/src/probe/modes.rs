//! One probe command on a chosen meter: the mode the flags ask for, the same
//! on the CPU and on a GPU.

use crate::output::outln;
use autobatch::MemoryMeter;
use autobatch_models::trainer::ReferenceWorkload;

use crate::args::ProbeArgs;
use crate::failure::Failure;
use crate::model::{LengthWorkload, only_applicable_advice};
use crate::progress::Progress;

use super::context::Run;

/// What a probe command does, from its flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `--compare`: the model as it is and with each remedy, side by side.
    Compare,
    /// `--find`: the longest input at a fixed batch.
    Find,
    /// `--seq-lens`: the batch at each length, and the plan across them.
    Lengths,
    /// One probe: the largest batch (with `--eval`, a target, ranks...).
    Batch,
}

impl Mode {
    /// The mode of the flags, of which clap lets at most one through.
    pub fn of(args: &ProbeArgs) -> Mode {
        let mode = &args.mode;
        match (mode.compare, mode.find, mode.seq_lens.is_empty()) {
            (true, _, _) => Mode::Compare,
            (false, Some(_), _) => Mode::Find,
            (false, None, false) => Mode::Lengths,
            (false, None, true) => Mode::Batch,
        }
    }
}

impl Run<'_> {
    /// The mode the flags ask for, on `meter`: every mode on every meter.
    pub fn dispatch(&self, meter: &mut dyn MemoryMeter) -> Result<(), Failure> {
        match Mode::of(self.args) {
            Mode::Compare => {
                (self.header)(&format!("comparing remedies on {} ({})", self.device_words, self.size_from));
                super::compare::compare(self, meter)
            }
            Mode::Find => super::find::run(self, meter),
            Mode::Lengths => match self.model.at_lengths(self.args, self.device) {
                Some(workload) => self.tune_lengths(&mut *workload?, meter),
                None => Err(Failure::usage("--seq-lens needs a model with a sequence length")),
            },
            Mode::Batch => {
                let workload = self.model.build(self.device, self.args)?;
                (self.header)(&format!(
                    "probing {} ({}) on {} ({})",
                    workload.description(),
                    self.model.parameters_said(workload.parameter_count()),
                    self.device_words,
                    self.size_from
                ));
                self.tune(workload, meter)
            }
        }
    }

    /// One probe of `workload`: its plan, printed (and drawn with `--plot`);
    /// where nothing fits, the advice measured once the model is dropped.
    fn tune(&self, mut workload: Box<dyn ReferenceWorkload>, meter: &mut dyn MemoryMeter) -> Result<(), Failure> {
        let args = self.args;
        let tuner = self.tuner.clone().observer(Progress::shared(args.output.json));
        let result = if args.plan.eval {
            let mut evaluation = workload.evaluation_workload();
            tuner.search(&mut *workload, meter).evaluating(&mut *evaluation).run()
        } else {
            tuner.run(&mut *workload, meter)
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
            && let Some(path) = &args.plan.cache
        {
            log::info!("the plan came from the cache {}", path.display());
        }
        if args.output.json {
            outln!("{}", plan.to_json());
        } else {
            outln!("{}", plan.summary());
        }
        if let Some(path) = &args.output.plot {
            crate::plot::plan(path, &format!("{description} on {}", self.device_words), &plan)?;
        }
        Ok(())
    }

    /// `--seq-lens`: the model tuned at each length, and the plan across them.
    fn tune_lengths(&self, trainer: &mut dyn LengthWorkload, meter: &mut dyn MemoryMeter) -> Result<(), Failure> {
        let args = self.args;
        (self.header)(&format!(
            "probing {} ({}) at sequence lengths {:?} on {}",
            trainer.description(),
            self.model.parameters_said(trainer.parameter_count()),
            args.seq_lens(),
            self.device_words
        ));
        let tuner = self.tuner.clone().observer(Progress::shared(args.output.json));
        let result = tuner.search(trainer, meter).sizes(&args.seq_lens());
        drop(tuner); // the live rows end before the plan prints
        let plan = result.map_err(|err| only_applicable_advice(self.model, err))?;
        if let Some(path) = &args.output.plot {
            let title = format!("{} on {}", trainer.description(), self.device_words);
            crate::plot::sizes(path, &title, &plan)?;
        }
        if args.output.json {
            outln!("{}", plan.to_json());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(line: &[&str]) -> Mode {
        let cli = crate::args::Cli::parse_from([&["autobatch", "probe"], line].concat()).unwrap();
        let Some(crate::args::Command::Probe(args)) = cli.command else { panic!("{line:?} is not a probe") };
        Mode::of(&args)
    }

    /// The table `dispatch` runs on every meter, CPU and CUDA alike: one
    /// function, so a mode cannot be missing from one device's copy.
    #[test]
    fn each_mode_is_chosen_by_its_flag() {
        assert_eq!(mode(&[]), Mode::Batch);
        assert_eq!(mode(&["--eval"]), Mode::Batch);
        assert_eq!(mode(&["--compare"]), Mode::Compare);
        assert_eq!(mode(&["--compare", "--device", "cuda"]), Mode::Compare);
        assert_eq!(mode(&["--find", "seq-len", "--batch", "4"]), Mode::Find);
        assert_eq!(mode(&["--find", "seq-len", "--batch", "4", "--device", "cuda:1"]), Mode::Find);
        assert_eq!(mode(&["--seq-lens", "64,128"]), Mode::Lengths);
        assert_eq!(mode(&["--seq-lens", "64,128", "--device", "cuda"]), Mode::Lengths);
    }
}
