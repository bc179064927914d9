//! A probe command's flags, converted once: the question it asks, the model
//! and how it trains, the searches' settings, the device and the output.
//! [`Request::of`] is the one function that reads the flags (after the
//! checks between them); the modes read the request.

use std::path::PathBuf;

use autobatch::Tuner;
use autobatch::estimate::Precision;
use autobatch::plan::Ceiling;

use crate::args::ProbeArgs;
use crate::failure::Failure;
use crate::model::{ModelConfig, Optimizing};
use crate::values::{Count, DeviceSpec};

/// What a probe command asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Question {
    /// The largest batch (with `--eval`, the evaluation step's too).
    Batch { eval: bool },
    /// `--seq-lens`: the batch at each length, and the plan across them.
    Lengths(Vec<usize>),
    /// `--find`: the longest input at `batch`, in steps of `granule`.
    Find { batch: usize, granule: usize },
    /// `--compare`: the model as it is and with each remedy, side by side.
    Compare,
    /// `--check N`: N and the next batch up run, no search.
    Check { batch: usize },
}

impl Question {
    /// The question of the flags, of which clap lets at most one through.
    pub fn of(args: &ProbeArgs) -> Result<Question, Failure> {
        let mode = &args.mode;
        if let Some(batch) = mode.check.n {
            return Ok(Question::Check { batch: batch.get() });
        }
        Ok(match (mode.compare, mode.find, args.seq_lens()) {
            (true, _, _) => Question::Compare,
            (false, Some(_), _) => {
                let Some(batch) = mode.batch.size else {
                    return Err(Failure::usage("--find holds a --batch fixed: add --batch N"));
                };
                Question::Find { batch: batch.get(), granule: args.search.granule.multiple_of.get() }
            }
            (false, None, lengths) if !lengths.is_empty() => Question::Lengths(lengths),
            (false, None, _) => Question::Batch { eval: args.plan.eval },
        })
    }
}

/// A probe command's flags, converted.
pub struct Request {
    pub question: Question,
    pub model: ModelConfig,
    pub optimizing: Optimizing,
    /// Any search's settings (the ceiling, how trials run, the strategy, when
    /// to stop): `--find`'s, the advice's and the comparison's.
    pub search: Tuner,
    /// The batch search's: `search` and the batch flags (start, granule,
    /// target, ranks, cache).
    pub tuner: Tuner,
    /// The first batch the batch search runs (its warm-up).
    pub first_batch: usize,
    /// What every batch is a multiple of (`--multiple-of`).
    pub granule: usize,
    pub device: DeviceSpec,
    pub budget: Option<u64>,
    pub ceiling: Ceiling,
    /// `--json`: the answer as JSON on stdout, the rest on stderr.
    pub json: bool,
    pub plot: Option<PathBuf>,
    pub cache: Option<PathBuf>,
}

impl Request {
    /// The flags checked together, then converted.
    pub fn of(args: &ProbeArgs) -> Result<Request, Failure> {
        super::checks::check_flags(args)?;
        let search = search_tuner(args);
        let tuner = batch_tuner(args, search.clone());
        tuner.check()?;
        let space = &args.search;
        let first_batch = autobatch::search::SearchSpace::new(
            space.start.get(),
            space.max_batch.map(Count::get),
            space.granule.multiple_of.get(),
        )?
        .first();
        Ok(Request {
            question: Question::of(args)?,
            model: ModelConfig::from_args(args)?,
            optimizing: Optimizing {
                optimizer: args.model.optimizer.kind,
                mixed: args.model.precision() == Precision::Mixed,
            },
            search,
            tuner,
            first_batch,
            granule: space.granule.multiple_of.get(),
            device: space.on.device,
            budget: space.on.budget,
            ceiling: space.ceiling.fraction,
            json: args.output.json.on,
            plot: args.output.plot.path.clone(),
            cache: args.plan.cache.clone(),
        })
    }
}

/// The settings of any search, over batches or over sizes: the ceiling, how
/// trials run, the strategy and when to stop.
fn search_tuner(args: &ProbeArgs) -> Tuner {
    let search = &args.search;
    let mut tuner = Tuner::new()
        .ceiling(search.ceiling.fraction)
        .steps_per_trial(search.steps_per_trial.get())
        .allow_partial_graph(args.plan.allow_partial_graph)
        .strategy(search.strategy);
    if let Some(max_trials) = search.max_trials {
        tuner = tuner.max_trials(max_trials.get());
    }
    if let Some(limit) = search.time_limit {
        tuner = tuner.time_limit(limit);
    }
    tuner
}

/// The batch search's tuner: `search` and the batch flags.
fn batch_tuner(args: &ProbeArgs, search: Tuner) -> Tuner {
    let (space, plan) = (&args.search, &args.plan);
    let mut tuner = search
        .start(space.start.get())
        .multiple_of(space.granule.multiple_of.get())
        .world_size(plan.split.world_size.get())
        .exact_effective_batch(plan.split.exact)
        .equal_micro_batches(plan.split.equal_micro_batches)
        .objective(plan.objective);
    if let Some(max_batch) = space.max_batch {
        tuner = tuner.max_batch(max_batch.get());
    }
    if let Some(target) = plan.target.batch {
        tuner = tuner.target_effective_batch(target.get());
    }
    if let Some(path) = &plan.cache {
        tuner = tuner.cache(path);
    }
    tuner
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question(line: &[&str]) -> Question {
        let cli = crate::args::Cli::parse_from([&["autobatch", "probe"], line].concat()).unwrap();
        let Some(crate::args::Command::Probe(args)) = cli.command else { panic!("{line:?} is not a probe") };
        Question::of(&args).unwrap()
    }

    /// The question `dispatch` runs on every meter, CPU and CUDA alike: one
    /// function, so a mode cannot be missing from one device's copy.
    #[test]
    fn each_question_is_asked_by_its_flag() {
        assert_eq!(question(&[]), Question::Batch { eval: false });
        assert_eq!(question(&["--eval"]), Question::Batch { eval: true });
        assert_eq!(question(&["--compare"]), Question::Compare);
        assert_eq!(question(&["--compare", "--device", "cuda"]), Question::Compare);
        assert_eq!(question(&["--find", "seq-len", "--batch", "4"]), Question::Find { batch: 4, granule: 1 });
        let on_gpu = question(&["--find", "seq-len", "--batch", "4", "--multiple-of", "8", "--device", "cuda:1"]);
        assert_eq!(on_gpu, Question::Find { batch: 4, granule: 8 });
        assert_eq!(question(&["--seq-lens", "64,128"]), Question::Lengths(vec![64, 128]));
        assert_eq!(question(&["--seq-lens", "64,128", "--device", "cuda"]), Question::Lengths(vec![64, 128]));
        assert_eq!(question(&["--check", "12"]), Question::Check { batch: 12 });
    }
}
