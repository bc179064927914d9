//! `autobatch probe --find seq-len --batch 8`: the longest input that fits
//! at a fixed batch, searched and verified like the batch.

use crate::output::{out, outln};
use autobatch::{MemoryMeter, Resizable, plan::SizeRange};
use autobatch_models::ConfigModel;
use autobatch_models::trainer::{Model, ReferenceWorkload, Trainer};

use crate::args::{FindArg, ModelKind, ProbeArgs};
use crate::failure::{Failure, Flags};
use crate::model::{ModelConfig, with_optimizer};
use std::sync::{Arc, Mutex};

use crate::progress::Progress;

use super::context::Run;

/// `--find`'s flags that depend on their values (clap refuses the batch
/// search's flags under `--find`): the model whose input it searches, and a
/// granule that input sizes can have.
pub fn check_flags(args: &ProbeArgs) -> Result<(), Failure> {
    let Some(find) = args.mode.find else { return Ok(()) };
    let (flag, model) = match find {
        FindArg::SeqLen => ("--find seq-len", ModelKind::Transformer),
        FindArg::Resolution => ("--find resolution", ModelKind::Convnet),
    };
    if args.config.path.is_some() && find == FindArg::Resolution {
        return Err(Failure::usage(
            "--find resolution searches the convnet's image side: a --config model takes --find seq-len",
        ));
    }
    if args.model.kind != model && args.config.path.is_none() {
        let name = if model == ModelKind::Transformer { "transformer" } else { "convnet" };
        return Err(Failure::usage(format!("{flag} searches a --model {name}'s input: add --model {name}")));
    }
    let granule = args.search.multiple_of.get();
    if find == FindArg::Resolution && granule > 1 && !granule.is_multiple_of(4) {
        return Err(Failure::usage(format!(
            "--multiple-of {granule} is not a multiple of 4: --find resolution tries image sides that are (4, 8, 12, ...)"
        )));
    }
    Ok(())
}

/// `--find`: the longest input of the model the flags describe, on `device`.
pub fn run(run: &Run, meter: &mut dyn MemoryMeter) -> Result<(), Failure> {
    let Run { args, model, device, .. } = *run;
    match model {
        ModelConfig::Transformer(config) => {
            let range = SizeRange::up_to(config.seq_len).multiple_of(args.search.multiple_of.get());
            check_range(range, "--seq-len")?;
            let trainer = with_optimizer(args, config.build(device)?)?;
            let words = SizeWords { word: "seq-len", key: "largest_seq_len", what: "sequence length" };
            find_in(run, trainer, meter, range, words)
        }
        ModelConfig::ConvNet(config) => {
            let range = SizeRange::up_to(config.resolution).multiple_of(args.search.multiple_of.get().max(4));
            check_range(range, "--resolution")?;
            let trainer = with_optimizer(args, config.build(device)?)?;
            let words = SizeWords { word: "resolution", key: "largest_resolution", what: "resolution" };
            find_in(run, trainer, meter, range, words)
        }
        ModelConfig::FromConfig(spec) => {
            let (config, training) = spec.as_ref();
            let range = SizeRange::up_to(training.seq_len).multiple_of(args.search.multiple_of.get());
            check_range(range, "--seq-len")?;
            let trainer = with_optimizer(args, ConfigModel::build(config, training, device)?.into_trainer()?)?;
            let words = SizeWords { word: "seq-len", key: "largest_seq_len", what: "sequence length" };
            find_in(run, trainer, meter, range, words)
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
    range: SizeRange,
    words: SizeWords,
) -> Result<(), Failure>
where
    Trainer<M>: Resizable + ReferenceWorkload,
{
    let Run { args, device_words: on, header: say, .. } = *run;
    let batch = args.mode.batch.ok_or_else(|| Failure::usage("--find holds a --batch fixed: add --batch N"))?.get();
    let description = ReferenceWorkload::description(&trainer);
    say(&format!(
        "probing {description} ({}) for the largest {} at batch {batch}, up to {}, on {on}",
        run.model.parameters_said(trainer.parameter_count()),
        words.what,
        range.largest
    ));
    let progress = Arc::new(Mutex::new(Progress::new(args.output.json).sizes(words.word)));
    let tuner = crate::model::search_tuner(args).observer(progress);
    let result = tuner.search(&mut trainer, meter).longest(batch, range);
    drop(tuner); // the live rows end before the answer prints
    // the size is named as this model calls it: a sequence length, a resolution
    let longest = result.map_err(|err| Failure::in_flags(err, &Flags { size: words.what, ..Flags::PROBE }))?;
    if let Some(path) = &args.output.plot {
        let title = format!("{description} at batch {batch} on {on}");
        crate::plot::longest(path, &title, words.word, &longest)?;
    }
    if args.output.json {
        outln!("{}", longest.to_json_named(words.key));
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
