//! The probe's flags checked together, before anything is built: what the
//! flags alone say (the request is made from them after, in `request`).

use crate::args::{FindArg, ModelKind, ProbeArgs};
use crate::failure::Failure;
use crate::model::model_name;
use crate::values::Count;
use autobatch::estimate::{OptimizerKind, Precision};

/// The checks of the flags alone that depend on their values (clap's rules
/// refuse the flags that never go together): the reference models' sizes,
/// `--precision mixed`, `--seq-lens`, `--find` and the output paths.
pub fn check_flags(args: &ProbeArgs) -> Result<(), Failure> {
    check_size_flags(args)?;
    if args.model.precision() == Precision::Mixed && args.model.optimizer.kind != OptimizerKind::AdamW {
        return Err(Failure::usage(
            "--precision mixed runs AdamW on f32 master weights: drop --optimizer, or use --precision fp32 or bf16",
        ));
    }
    // the one optimizer estimate counts that no probe steps
    if args.model.optimizer.kind == OptimizerKind::Momentum {
        return Err(Failure::usage(
            "--optimizer momentum is counted by `autobatch estimate`; the probe runs adamw, lion, adafactor, \
             adam8bit or sgd",
        ));
    }
    check_seq_lens(args)?;
    check_find(args)?;
    if args.config.weights && args.sizes.shape.layers.is_some() {
        return Err(Failure::usage(
            "--weights loads the checkpoint as saved, with the config's own layers: drop --layers (or --weights: \
             random weights take the same memory)",
        ));
    }
    if let Some(batch) = args.mode.check.n.map(Count::get) {
        let granule = args.search.granule.multiple_of.get();
        if !batch.is_multiple_of(granule) {
            let (below, above) = (batch / granule * granule, batch.div_ceil(granule).saturating_mul(granule));
            let instead = match below {
                0 => format!("check {above}"),
                _ => format!("check {below} or {above}"),
            };
            return Err(Failure::usage(format!(
                "--check {batch} is not a multiple of --multiple-of {granule}: {instead}"
            )));
        }
    }
    crate::paths::check(args)
}

/// Size flags and the reference models they apply to; a config's flags
/// only with `--config`.
fn check_size_flags(args: &ProbeArgs) -> Result<(), Failure> {
    if args.config.file.path.is_some() {
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

/// `--seq-lens`: each length once, the model taking the longest.
fn check_seq_lens(args: &ProbeArgs) -> Result<(), Failure> {
    let lengths = args.seq_lens();
    let Some(&longest) = lengths.iter().max() else { return Ok(()) };
    if let Some(twice) = lengths.iter().enumerate().find_map(|(i, len)| lengths[..i].contains(len).then_some(len)) {
        return Err(Failure::usage(format!("--seq-lens: {twice} is given twice; list each length once")));
    }
    match args.sizes.shape.seq_len.map(Count::get) {
        Some(seq_len) if seq_len < longest => Err(Failure::usage(format!(
            "--seq-len {seq_len} is shorter than the longest of --seq-lens, {longest}: the model must take every \
             length probed; drop --seq-len or make it at least {longest}"
        ))),
        _ => Ok(()),
    }
}

/// `--find`'s flags that depend on their values (clap refuses the batch
/// search's flags under `--find`): the model whose input it searches, and a
/// granule that input sizes can have.
fn check_find(args: &ProbeArgs) -> Result<(), Failure> {
    let Some(find) = args.mode.find else { return Ok(()) };
    let (flag, model) = match find {
        FindArg::SeqLen => ("--find seq-len", ModelKind::Transformer),
        FindArg::Resolution => ("--find resolution", ModelKind::Convnet),
    };
    if args.config.file.path.is_some() && find == FindArg::Resolution {
        return Err(Failure::usage(
            "--find resolution searches the convnet's image side: a --config model takes --find seq-len",
        ));
    }
    if args.model.kind != model && args.config.file.path.is_none() {
        let name = if model == ModelKind::Transformer { "transformer" } else { "convnet" };
        return Err(Failure::usage(format!("{flag} searches a --model {name}'s input: add --model {name}")));
    }
    let granule = args.search.granule.multiple_of.get();
    if find == FindArg::Resolution && granule > 1 && !granule.is_multiple_of(4) {
        return Err(Failure::usage(format!(
            "--multiple-of {granule} is not a multiple of 4: --find resolution tries image sides that are (4, 8, 12, ...)"
        )));
    }
    Ok(())
}
