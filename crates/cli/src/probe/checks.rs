//! The probe's flags checked together, before anything is built.

use autobatch_models as models;
use autobatch_models::reference::{ConvNetConfig, TransformerConfig};
use autobatch_models::trainer::Footprint;

use crate::args::{DtypeArg, ModelKind, ObjectiveArg, ProbeArgs, ProbeOptimizerArg};
use crate::failure::Failure;
use crate::model::{model_name, ModelConfig};

/// The flags of `--config`: the model's own size flags do not apply, the
/// LoRA flags need it.
/// Every check of the flags alone: sizes, `--compare`, `--precision mixed`,
/// `--seq-lens`, `--find` and the output paths.
pub fn check_flags(args: &ProbeArgs) -> Result<(), Failure> {
    check_size_flags(args)?;
    check_compare(args)?;
    if args.precision() == DtypeArg::Mixed && args.optimizer != ProbeOptimizerArg::Adamw {
        return Err(Failure::usage(
            "--precision mixed runs AdamW on f32 master weights: drop --optimizer, or use --precision f32 or bf16",
        ));
    }
    check_seq_lens(args)?;
    super::find::check_flags(args)?;
    crate::paths::check(args)
}

fn check_config_flags(args: &ProbeArgs) -> Result<(), Failure> {
    if args.config.is_none() {
        return match args.lora {
            Some(_) => Err(Failure::usage("--lora adapts a model from --config: add --config path/to/config.json")),
            None => Ok(()),
        };
    }
    if args.model != ModelKind::Transformer {
        return Err(Failure::usage(format!(
            "--config builds the model its config.json describes: drop --model {}",
            model_name(args.model)
        )));
    }
    let refused = [
        ("--vocab", args.vocab.is_some()),
        ("--d-model", args.d_model.is_some()),
        ("--heads", args.heads.is_some()),
        ("--inputs", args.inputs.is_some()),
        ("--width", args.width.is_some()),
        ("--depth", args.depth.is_some()),
        ("--channels", args.channels.is_some()),
        ("--resolution", args.resolution.is_some()),
        ("--classes", args.classes.is_some()),
    ];
    if let Some((flag, _)) = refused.iter().find(|(_, given)| *given) {
        return Err(Failure::usage(format!(
            "{flag} does not apply to --config: the config.json sizes the model (--layers, --seq-len and \
             --seq-lens do apply)"
        )));
    }
    Ok(())
}

/// Size flags and the models they apply to.
fn check_size_flags(args: &ProbeArgs) -> Result<(), Failure> {
    check_config_flags(args)?;
    if args.config.is_some() {
        return Ok(());
    }
    use ModelKind::*;
    let flags: [(&str, bool, &[ModelKind]); 13] = [
        ("--seq-lens", !args.seq_lens.is_empty(), &[Transformer]),
        ("--vocab", args.vocab.is_some(), &[Transformer]),
        ("--d-model", args.d_model.is_some(), &[Transformer]),
        ("--heads", args.heads.is_some(), &[Transformer]),
        ("--layers", args.layers.is_some(), &[Transformer]),
        ("--seq-len", args.seq_len.is_some(), &[Transformer]),
        ("--inputs", args.inputs.is_some(), &[Mlp]),
        ("--width", args.width.is_some(), &[Mlp]),
        ("--depth", args.depth.is_some(), &[Mlp]),
        ("--channels", args.channels.is_some(), &[Convnet]),
        ("--resolution", args.resolution.is_some(), &[Convnet]),
        ("--classes", args.classes.is_some(), &[Mlp, Convnet]),
        ("--checkpointing", args.checkpointing, &[Transformer]),
    ];
    for (flag, given, models) in flags {
        if given && !models.contains(&args.model) {
            let names: Vec<String> = models.iter().map(|m| format!("--model {}", model_name(*m))).collect();
            return Err(Failure::usage(format!(
                "{flag} does not apply to --model {}: it sizes {}",
                model_name(args.model),
                names.join(" or ")
            )));
        }
    }
    Ok(())
}

/// Refuses a model whose first step cannot fit under `limit` before anything
/// is allocated: the smallest batch at the longest size probed (`--seq-lens`,
/// else the configured size), or under `--find` `--batch` at the shortest
/// size searched. A lower bound where the model is built for a longer size
/// than a step runs at: the search measures the rest and says when nothing fits.
pub fn check_footprint(
    args: &ProbeArgs,
    model: &ModelConfig,
    footprint: &Footprint,
    limit: u64,
) -> Result<(), Failure> {
    let (batch, size) = match (args.find, args.batch) {
        (Some(_), Some(batch)) => (batch, args.multiple_of),
        _ => (smallest_batch(args)?, args.seq_lens.iter().max().copied().unwrap_or(usize::MAX)),
    };
    let at_size = match model {
        ModelConfig::Transformer(c) if size < c.seq_len => {
            ModelConfig::Transformer(TransformerConfig { seq_len: size, ..c.clone() })
        }
        ModelConfig::ConvNet(c) if args.find.is_some() => {
            ModelConfig::ConvNet(ConvNetConfig { resolution: size.max(4).min(c.resolution), ..c.clone() })
        }
        ModelConfig::Pretrained(spec) if size < spec.1.seq_len => {
            let training = models::Training { seq_len: size, ..spec.1.clone() };
            ModelConfig::Pretrained(Box::new((spec.0.clone(), training)))
        }
        _ => return Ok(footprint.check_batch_within(batch, limit)?),
    };
    let at_size = at_size.footprint()?;
    let first_step = match args.find {
        // the model is built at its largest size (its positions, its causal mask,
        // a head over the largest image) and its first step runs at the smallest
        Some(_) => Footprint { min_bytes_per_sample: at_size.min_bytes_per_sample, ..footprint.clone() },
        None => at_size,
    };
    Ok(first_step.check_batch_within(batch, limit)?)
}

/// The first batch the search will run (the warm-up's): `--start` rounded up
/// to `--multiple-of`.
fn smallest_batch(args: &ProbeArgs) -> Result<usize, autobatch::Error> {
    Ok(autobatch::search::SearchSpace::new(args.start, args.max_batch, args.multiple_of)?.first())
}

/// `--compare` tunes each variant for its largest batch: flags that ask for
/// something else of the search are refused rather than ignored.
fn check_compare(args: &ProbeArgs) -> Result<(), Failure> {
    if !args.compare {
        return Ok(());
    }
    let refused = [
        ("--eval", args.eval),
        ("--objective throughput", args.objective == ObjectiveArg::Throughput),
        ("--target-effective-batch", args.target_effective_batch.is_some()),
        ("--world-size", args.world_size > 1),
        ("--exact", args.exact),
        ("--cache", args.cache.is_some()),
    ];
    match refused.iter().find(|(_, given)| *given) {
        Some((flag, _)) => Err(Failure::usage(format!(
            "{flag} does not go with --compare, which compares each variant's largest batch: run it without --compare"
        ))),
        None => Ok(()),
    }
}

/// `--seq-lens` goes with a plain probe of a transformer that takes the longest.
fn check_seq_lens(args: &ProbeArgs) -> Result<(), Failure> {
    let Some(&longest) = args.seq_lens.iter().max() else { return Ok(()) };
    if let Some(twice) =
        args.seq_lens.iter().enumerate().find_map(|(i, len)| args.seq_lens[..i].contains(len).then_some(len))
    {
        return Err(Failure::usage(format!("--seq-lens: {twice} is given twice; list each length once")));
    }
    for (flag, given) in [("--eval", args.eval), ("--compare", args.compare)] {
        if given {
            return Err(Failure::usage(format!("{flag} does not go with --seq-lens: probe one length at a time")));
        }
    }
    match args.seq_len {
        Some(seq_len) if seq_len < longest => Err(Failure::usage(format!(
            "--seq-len {seq_len} is shorter than the longest of --seq-lens, {longest}: the model must take every \
             length probed; drop --seq-len or make it at least {longest}"
        ))),
        _ => Ok(()),
    }
}
