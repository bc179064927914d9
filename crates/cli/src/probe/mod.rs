//! `autobatch probe`: tune a built-in reference model, or a model from its
//! `config.json`, on a device.

mod advice;
mod checks;
mod compare;
mod context;
mod device;
mod find;
mod modes;

use crate::output::{errln, outln};
use autobatch::{MemoryMeter, Tuner};

use crate::args::ProbeArgs;
use crate::failure::Failure;
use crate::model::{ModelConfig, search_tuner};

use crate::device_flags::{DeviceSpec, parse_device};
use context::Run;

pub fn run(args: &ProbeArgs) -> Result<(), Failure> {
    checks::check_flags(args)?;
    let tuner = tuner(args);
    tuner.check()?;
    let say = |line: &str| if args.output.json { errln!("{line}") } else { outln!("{line}") };
    let model = ModelConfig::from_args(args)?;
    let footprint = model.footprint()?;
    let run = |meter: &mut dyn MemoryMeter, device: &candle_core::Device, on: &str, why: &str| {
        Run { args, tuner: &tuner, model: &model, device, device_words: on, size_from: why, header: &say }
            .dispatch(meter)
    };
    match parse_device(&args.search.device)? {
        DeviceSpec::Cpu => device::on_cpu(args, &model, &footprint, Box::new(run)),
        DeviceSpec::Cuda(ordinal) => device::on_cuda(args, &model, &footprint, ordinal, Box::new(run)),
    }
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
