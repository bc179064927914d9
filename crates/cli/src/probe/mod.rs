//! `autobatch probe`: tune a built-in reference model, or a model from its
//! `config.json`, on a device.

mod advice;
mod checks;
mod compare;
mod context;
mod find;
mod footprint;
mod measure;
mod modes;
mod refusal;
mod request;

use crate::output::{errln, outln};

use crate::args::{DEFAULT_BUDGET, ProbeArgs};
use crate::device_flags::on_device;
use crate::failure::Failure;
use crate::values::DeviceSpec;
use autobatch_models::Compute;

use context::Run;
use request::{Question, Request};

/// `autobatch probe`: the flags converted once into a [`Request`], run on
/// the device it names.
pub fn run(args: &ProbeArgs) -> Result<(), Failure> {
    let request = Request::of(args)?;
    let say = |line: &str| if request.json { errln!("{line}") } else { outln!("{line}") };
    if let Some(said) = crate::hub::source().and_then(crate::hub::ConfigSource::said) {
        say(&said);
    }
    let compute = match request.device {
        DeviceSpec::Cpu => Compute::Cpu,
        DeviceSpec::Cuda(_) => Compute::Accelerator,
    };
    let footprint = request.model.footprint(request.optimizing, compute)?;
    let mut on = on_device(request.device, request.budget, DEFAULT_BUDGET, request.ceiling)?;
    let limit = on.limit;
    let run = Run {
        request: &request,
        model: &request.model,
        device: &on.device,
        device_words: &on.words,
        size_from: on.size_from,
        header: &say,
    };
    if let Err(refused) = footprint::check_footprint(&request, &footprint, compute, limit) {
        let failure = match (refused.kind, &request.question) {
            // a batch search's refusal says what would help; a size search's is at its shortest size
            (crate::failure::Kind::NothingFits, Question::Batch { .. } | Question::Check { .. }) => {
                let batch = match request.question {
                    Question::Check { batch } => batch,
                    _ => request.first_batch,
                };
                // a CPU step's count has the matmul buffers the threads keep; not the rest
                let buffers = on.thread_buffers.map_or(0, |buffers| buffers.bytes);
                let held = on.meter.in_use()?.saturating_sub(buffers);
                refusal::advised(&run, on.meter.as_mut(), compute, (limit, held), batch, refused)
            }
            _ => refused,
        };
        return Err(on.blame_thread_buffers(failure));
    }
    let answered = run.dispatch(on.meter.as_mut());
    answered.map_err(|failure| on.blame_thread_buffers(failure))
}
