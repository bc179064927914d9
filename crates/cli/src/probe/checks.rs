//! The probe's flags checked together, before anything is built.

use autobatch::estimate::{OptimizerKind, Precision};
use autobatch_models as models;
use autobatch_models::reference::{ConvNetConfig, TransformerConfig};
use autobatch_models::trainer::Footprint;

use crate::args::ProbeArgs;
use crate::failure::Failure;
use crate::model::{ModelConfig, model_name};
use crate::values::Count;

/// The checks of the flags alone that depend on their values (clap's rules
/// refuse the flags that never go together): the reference models' sizes,
/// `--precision mixed`, `--seq-lens`, `--find` and the output paths.
pub fn check_flags(args: &ProbeArgs) -> Result<(), Failure> {
    check_size_flags(args)?;
    if args.model.precision() == Precision::Mixed && args.model.optimizer != OptimizerKind::AdamW {
        return Err(Failure::usage(
            "--precision mixed runs AdamW on f32 master weights: drop --optimizer, or use --precision fp32 or bf16",
        ));
    }
    check_seq_lens(args)?;
    super::find::check_flags(args)?;
    crate::paths::check(args)
}

/// Size flags and the reference models they apply to; a config's flags
/// only with `--config`.
fn check_size_flags(args: &ProbeArgs) -> Result<(), Failure> {
    if args.config.path.is_some() {
        return Ok(());
    }
    if let Some((flag, _)) = args.config.config_only_flags().into_iter().find(|(_, given)| *given) {
        return Err(Failure::usage(format!(
            "{flag} applies to a model from a config.json, and --model {} is a reference model: give --config \
             PATH, or drop {flag}",
            model_name(args.model.kind)
        )));
    }
    let model = args.model.kind;
    for (flag, given, models) in args.reference_model_flags() {
        if given && !models.contains(&model) {
            let names: Vec<String> = models.iter().map(|m| format!("--model {}", model_name(*m))).collect();
            return Err(Failure::usage(format!(
                "{flag} does not apply to --model {}: it sizes {}",
                model_name(model),
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
    let (batch, size) = match (args.mode.find, args.mode.batch) {
        (Some(_), Some(batch)) => (batch.get(), args.search.multiple_of.get()),
        _ => (smallest_batch(args)?, args.seq_lens().into_iter().max().unwrap_or(usize::MAX)),
    };
    let at_size = match model {
        ModelConfig::Transformer(c) if size < c.seq_len => {
            ModelConfig::Transformer(TransformerConfig { seq_len: size, ..c.clone() })
        }
        ModelConfig::ConvNet(c) if args.mode.find.is_some() => {
            ModelConfig::ConvNet(ConvNetConfig { resolution: size.max(4).min(c.resolution), ..c.clone() })
        }
        ModelConfig::FromConfig(spec) if size < spec.1.seq_len => {
            let training = models::Training { seq_len: size, ..spec.1.clone() };
            ModelConfig::FromConfig(Box::new((spec.0.clone(), training)))
        }
        _ => return Ok(footprint.check_batch_within(batch, limit)?),
    };
    let at_size = at_size.footprint()?;
    let first_step = match args.mode.find {
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
    let search = &args.search;
    let max_batch = search.max_batch.map(Count::get);
    Ok(autobatch::search::SearchSpace::new(search.start.get(), max_batch, search.multiple_of.get())?.first())
}

/// `--seq-lens`: each length once, the model taking the longest.
fn check_seq_lens(args: &ProbeArgs) -> Result<(), Failure> {
    let lengths = args.seq_lens();
    let Some(&longest) = lengths.iter().max() else { return Ok(()) };
    if let Some(twice) = lengths.iter().enumerate().find_map(|(i, len)| lengths[..i].contains(len).then_some(len)) {
        return Err(Failure::usage(format!("--seq-lens: {twice} is given twice; list each length once")));
    }
    match args.sizes.seq_len.map(Count::get) {
        Some(seq_len) if seq_len < longest => Err(Failure::usage(format!(
            "--seq-len {seq_len} is shorter than the longest of --seq-lens, {longest}: the model must take every \
             length probed; drop --seq-len or make it at least {longest}"
        ))),
        _ => Ok(()),
    }
}
