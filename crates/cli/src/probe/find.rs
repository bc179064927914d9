//! `autobatch probe --find seq-len --batch 8`: the longest input that fits
//! at a fixed batch, searched and verified like the batch.

use crate::output::{out, outln};
use autobatch::{MemoryMeter, Resizable, plan::SizeRange};
use autobatch_models::trainer::{Model, ReferenceWorkload, Trainer};

use crate::failure::{Failure, Flags};
use crate::model::ModelConfig;
use std::sync::{Arc, Mutex};

use crate::progress::Progress;

use super::context::Run;

/// `--find`: the longest input of the model the flags describe at `batch`,
/// in steps of `granule`, on `device`.
pub fn run(run: &Run, meter: &mut dyn MemoryMeter, batch: usize, granule: usize) -> Result<(), Failure> {
    let Run { model, device, .. } = *run;
    let optimizing = run.request.optimizing;
    match model {
        ModelConfig::Transformer(config) => {
            let range = SizeRange::up_to(config.seq_len).multiple_of(granule);
            check_range(range, "--seq-len")?;
            let trainer = optimizing.apply(config.build(device)?)?;
            let words = SizeWords { word: "seq-len", key: "largest_seq_len", what: "sequence length" };
            find_in(run, trainer, meter, batch, range, words)
        }
        ModelConfig::ConvNet(config) => {
            let range = SizeRange::up_to(config.resolution).multiple_of(granule.max(4));
            check_range(range, "--resolution")?;
            let trainer = optimizing.apply(config.build(device)?)?;
            let words = SizeWords { word: "resolution", key: "largest_resolution", what: "resolution" };
            find_in(run, trainer, meter, batch, range, words)
        }
        ModelConfig::FromConfig(spec) => {
            let (config, training) = spec.as_ref();
            let range = SizeRange::up_to(training.seq_len).multiple_of(granule);
            check_range(range, "--seq-len")?;
            let trainer = optimizing.apply(crate::model::config_model(config, training, device)?.into_trainer()?)?;
            let words = SizeWords { word: "seq-len", key: "largest_seq_len", what: "sequence length" };
            find_in(run, trainer, meter, batch, range, words)
        }
        ModelConfig::Mlp(_) => {
            Err(Failure::usage("--find searches a transformer's or a convnet's input, not an MLP's"))
        }
    }
}

/// What the size is called: the progress column, the JSON key, in words.
struct SizeWords {
    word: &'static str,
    key: &'static str,
    what: &'static str,
}

/// Says what runs, searches `trainer`'s sizes in `range` at `--batch` and
/// prints (and plots) the answer.
fn find_in<M: Model>(
    run: &Run,
    mut trainer: Trainer<M>,
    meter: &mut dyn MemoryMeter,
    batch: usize,
    range: SizeRange,
    words: SizeWords,
) -> Result<(), Failure>
where
    Trainer<M>: Resizable + ReferenceWorkload,
{
    let Run { request, device_words: on, header: say, .. } = *run;
    let description = ReferenceWorkload::description(&trainer);
    say(&format!(
        "probing {description} ({}) for the largest {} at batch {batch}, up to {}, on {on}",
        run.model.parameters_said(trainer.parameter_count()),
        words.what,
        range.largest
    ));
    let progress = Arc::new(Mutex::new(Progress::new(request.json).sizes(words.word)));
    let tuner = request.search.clone().observer(progress);
    let result = tuner.search(&mut trainer, meter).longest(batch, range);
    drop(tuner); // the live rows end before the answer prints
    // the size is named as this model calls it: a sequence length, a resolution
    let longest = result.map_err(|err| Failure::in_flags(err, &Flags { size: words.what, ..Flags::PROBE }))?;
    if let Some(path) = &request.plot {
        let title = format!("{description} at batch {batch} on {on}");
        crate::plot::longest(path, &title, words.word, &longest)?;
    }
    if request.json {
        outln!("{}", crate::hub::annotated(&longest.to_json_named(words.key)));
    } else {
        out!("{}", longest.summary(words.what));
    }
    Ok(())
}

fn check_range(range: SizeRange, flag: &str) -> Result<(), Failure> {
    if range.multiple_of > range.largest {
        return Err(Failure::usage(format!(
            "--multiple-of {} is above {flag} {}: no size to try; lower --multiple-of or raise {flag}",
            range.multiple_of, range.largest
        )));
    }
    Ok(())
}
