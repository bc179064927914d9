//! The probe's flags checked together, before anything is built.

use autobatch::estimate::{OptimizerKind, Precision};
use autobatch_models as models;
use autobatch_models::Compute;
use autobatch_models::reference::{ConvNetConfig, TransformerConfig};
use autobatch_models::trainer::Footprint;

use crate::args::{FindArg, ModelKind, ProbeArgs};
use crate::failure::Failure;
use crate::model::{ModelConfig, model_name};
use crate::values::Count;

use super::request::{Question, Request};

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
    check_find(args)?;
    if args.config.weights && args.sizes.layers.is_some() {
        return Err(Failure::usage(
            "--weights loads the checkpoint as saved, with the config's own layers: drop --layers (or --weights: \
             random weights take the same memory)",
        ));
    }
    if let Some(batch) = args.mode.check.map(Count::get) {
        let granule = args.search.multiple_of.get();
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
pub fn check_footprint(request: &Request, footprint: &Footprint, compute: Compute, limit: u64) -> Result<(), Failure> {
    let (batch, size) = match &request.question {
        Question::Find { batch, granule } => (*batch, *granule),
        Question::Check { batch } => (*batch, usize::MAX),
        Question::Lengths(lengths) => (request.first_batch, lengths.iter().copied().max().unwrap_or(usize::MAX)),
        _ => (request.first_batch, usize::MAX),
    };
    let finding = matches!(request.question, Question::Find { .. });
    let at_size = match &request.model {
        ModelConfig::Transformer(c) if size < c.seq_len => {
            ModelConfig::Transformer(TransformerConfig { seq_len: size, ..c.clone() })
        }
        ModelConfig::ConvNet(c) if finding => {
            ModelConfig::ConvNet(ConvNetConfig { resolution: size.max(4).min(c.resolution), ..c.clone() })
        }
        ModelConfig::FromConfig(spec) if size < spec.1.seq_len => {
            let training = models::Training { seq_len: size, ..spec.1.clone() };
            ModelConfig::FromConfig(Box::new((spec.0.clone(), training)))
        }
        _ => return Ok(footprint.check_batch_within(batch, limit)?),
    };
    let first_step = at_size.footprint(request.optimizing, compute)?;
    let first_step = match (finding, &at_size) {
        // a config model's fixed count is its state and the step's widest
        // moment at one sample, which is the length's (its eager scores): the
        // shortest length searched counts its own
        (true, ModelConfig::FromConfig(_)) | (false, _) => first_step,
        // a reference model is built at its largest size (its causal mask, a
        // head over the largest image) and its first step runs at the smallest
        (true, _) => Footprint { min_bytes_per_sample: first_step.min_bytes_per_sample, ..footprint.clone() },
    };
    Ok(first_step.check_batch_within(batch, limit)?)
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

/// `--find`'s flags that depend on their values (clap refuses the batch
/// search's flags under `--find`): the model whose input it searches, and a
/// granule that input sizes can have.
fn check_find(args: &ProbeArgs) -> Result<(), Failure> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn request(line: &[&str]) -> Request {
        let cli = crate::args::Cli::parse_from([&["autobatch", "probe"], line].concat()).unwrap();
        let Some(crate::args::Command::Probe(args)) = cli.command else { panic!("{line:?} is not a probe") };
        Request::of(&args).unwrap()
    }

    /// `--find seq-len` answers a length from the granule up: the pre-check
    /// counts the shortest, never the longest length's eager scores as fixed
    /// bytes (issue 84: refused at 16 MiB where 74 tokens fit).
    #[test]
    fn a_length_search_counts_the_shortest_length_it_may_answer() {
        let dir = std::env::temp_dir().join(format!("autobatch-find-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(
            &path,
            r#"{"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 512, "tie_word_embeddings": true, "torch_dtype": "float32"}"#,
        )
        .unwrap();
        let path = path.to_str().unwrap();
        let flags = ["--config", path, "--layers", "1", "--batch", "8", "--seq-len", "512", "--attention", "eager"];
        let finding = request(&[&flags[..], &["--find", "seq-len"]].concat());
        let full = finding.model.footprint(finding.optimizing, Compute::Cpu).unwrap();
        let shortest = finding.model.with_seq_len(1).unwrap().footprint(finding.optimizing, Compute::Cpu).unwrap();
        let (at_shortest, at_longest) = (
            shortest.fixed_bytes + 8 * shortest.min_bytes_per_sample,
            full.fixed_bytes + 8 * full.min_bytes_per_sample,
        );
        assert!(at_shortest < at_longest / 2, "the eager scores at 512 tokens dominate: {at_shortest} {at_longest}");
        assert!(check_footprint(&finding, &full, Compute::Cpu, at_shortest).is_ok());
        assert!(check_footprint(&finding, &full, Compute::Cpu, at_shortest - 1).is_err(), "a lower bound still");
        // a batch search runs at the longest length: that count holds there
        let batch = request(&[&flags[..1], &flags[1..2], &["--seq-len", "512", "--attention", "eager"]].concat());
        assert!(check_footprint(&batch, &full, Compute::Cpu, at_longest - 8 * full.min_bytes_per_sample).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
