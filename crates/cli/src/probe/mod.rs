//! `autobatch probe`: tune a built-in reference model, or a model from its
//! `config.json`, on a device.

mod advice;
mod checks;
mod compare;
mod context;
mod find;
mod modes;

use crate::output::{errln, outln};
use autobatch::Tuner;

use crate::args::{DEFAULT_BUDGET, ProbeArgs};
use crate::device_flags::on_device;
use crate::failure::Failure;
use crate::model::{ModelConfig, search_tuner};

use context::Run;

pub fn run(args: &ProbeArgs) -> Result<(), Failure> {
    checks::check_flags(args)?;
    let tuner = tuner(args);
    tuner.check()?;
    let say = |line: &str| if args.output.json { errln!("{line}") } else { outln!("{line}") };
    let model = ModelConfig::from_args(args)?;
    let footprint = model.footprint()?;
    let mut on = on_device(args.search.device, args.search.budget, DEFAULT_BUDGET)?;
    let limit = args.search.ceiling.limit_bytes(on.meter.capacity()?);
    checks::check_footprint(args, &model, &footprint, limit)?;
    let run = Run {
        args,
        tuner: &tuner,
        model: &model,
        device: &on.device,
        device_words: &on.words,
        size_from: on.size_from,
        header: &say,
    };
    let answered = run.dispatch(on.meter.as_mut());
    answered.map_err(|failure| on.blame_thread_buffers(failure, limit))
}

/// The batch search's tuner: [`search_tuner`] and the batch flags.
fn tuner(args: &ProbeArgs) -> Tuner {
    let (search, plan) = (&args.search, &args.plan);
    let mut tuner = search_tuner(args)
        .start(search.start.get())
        .multiple_of(search.multiple_of.get())
        .world_size(plan.world_size.get())
        .exact_effective_batch(plan.exact)
        .equal_micro_batches(plan.equal_micro_batches)
        .objective(plan.objective);
    if let Some(max_batch) = search.max_batch {
        tuner = tuner.max_batch(max_batch.get());
    }
    if let Some(target) = plan.target_effective_batch {
        tuner = tuner.target_effective_batch(target.get());
    }
    if let Some(path) = &plan.cache {
        tuner = tuner.cache(path);
    }
    tuner
}
