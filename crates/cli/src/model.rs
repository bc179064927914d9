//! The model the probe flags describe (a reference model or a config.json's
//! architecture), built with its optimizer: what `probe` and `--find` both
//! tune.

use autobatch::estimate::OptimizerKind;
use autobatch_models as models;
use autobatch_models::reference::{ConvNetConfig, MlpConfig, TransformerConfig};
use autobatch_models::trainer::{Footprint, Model, ReferenceWorkload, Trainer};
use candle_core::DType;

use autobatch::estimate::Precision;

use crate::args::{ModelKind, ProbeArgs};
use crate::failure::{Failure, Flags};
use crate::values::Count;

pub(crate) fn model_name(model: ModelKind) -> &'static str {
    match model {
        ModelKind::Transformer => "transformer",
        ModelKind::Mlp => "mlp",
        ModelKind::Convnet => "convnet",
    }
}

/// The model the flags describe, not yet built: a reference model, or a
/// config.json's architecture.
#[derive(Clone)]
pub(crate) enum ModelConfig {
    Transformer(TransformerConfig),
    Mlp(MlpConfig),
    ConvNet(ConvNetConfig),
    FromConfig(Box<(models::Config, models::Training)>),
}

impl ModelConfig {
    /// "N parameters", or under LoRA "T trained of N parameters" (the
    /// adapters train; the base's and theirs are the model's).
    pub(crate) fn parameters_said(&self, trained: usize) -> String {
        match self {
            ModelConfig::FromConfig(boxed) if boxed.1.lora.is_some() => {
                let total = boxed.0.parameter_count().saturating_add(trained as u64);
                format!("{trained} trained of {total} parameters")
            }
            _ => format!("{trained} parameters"),
        }
    }

    /// The model of `--config`: its config.json, `--layers`, `--seq-len`,
    /// `--precision` and the LoRA flags.
    pub(crate) fn pretrained(args: &ProbeArgs, path: &std::path::Path) -> Result<Self, Failure> {
        let with_path = |err: models::Error| Failure::of_config(err, path, &Flags::PROBE);
        let source = crate::hub::resolve(path)?;
        let mut config = models::Config::from_file(source.path()).map_err(with_path)?;
        if let Some(unapplied) = config.unapplied() {
            log::warn!("{unapplied}");
        }
        if let Some(layers) = args.sizes.shape.layers {
            config = config.with_layers(layers.get()).map_err(with_path)?;
        }
        let flags = TrainingFlags {
            seq_len: args.seq_len(),
            seed: Some(args.model.seed),
            precision: args.model.precision.asked(),
            checkpointing: args.model.checkpointing.on.then_some("--checkpointing"),
            ..TrainingFlags::of(&args.config.lora, &args.config.step, args.config.base.base_dtype)
        };
        let training = config_training(&config, &flags, path, &Flags::PROBE)?;
        // refused here, before anything is allocated: a length past the
        // positions or the window, an unknown target
        for length in args.seq_lens() {
            if let Err(models::Error::InvalidSetting { valid, .. }) = config.check_seq_len(length) {
                return Err(Failure::usage(format!("--config {}: --seq-lens has {length}: {valid}", path.display())));
            }
        }
        config.check_seq_len(training.seq_len).map_err(with_path)?;
        config.footprint(&training, models::Compute::Cpu).map_err(with_path)?;
        if args.config.weights {
            crate::hub::find_checkpoint(&source)?;
        }
        crate::hub::remember(source);
        Ok(ModelConfig::FromConfig(Box::new((config, training))))
    }

    pub(crate) fn from_args(args: &ProbeArgs) -> Result<Self, Failure> {
        if let Some(path) = &args.config.file.path {
            return ModelConfig::pretrained(args, path);
        }
        Ok(ModelConfig::reference(args))
    }

    pub(crate) fn reference(args: &ProbeArgs) -> Self {
        let dtype = dtype_of(args.model.precision());
        let seed = args.model.seed;
        let sizes = &args.sizes;
        let size = |given: Option<Count>, default: usize| given.map_or(default, Count::get);
        match args.model.kind {
            ModelKind::Transformer => {
                let d = TransformerConfig::default();
                ModelConfig::Transformer(TransformerConfig {
                    vocab: size(sizes.vocab, d.vocab),
                    d_model: size(sizes.d_model, d.d_model),
                    heads: size(sizes.shape.heads, d.heads),
                    layers: size(sizes.shape.layers, d.layers),
                    seq_len: args.seq_len().unwrap_or(d.seq_len),
                    dtype,
                    seed,
                    checkpointing: args.model.checkpointing.on,
                })
            }
            ModelKind::Mlp => {
                let d = MlpConfig::default();
                ModelConfig::Mlp(MlpConfig {
                    inputs: size(sizes.inputs, d.inputs),
                    width: size(sizes.width, d.width),
                    depth: size(sizes.depth, d.depth),
                    classes: size(sizes.classes, d.classes),
                    dtype,
                    seed,
                })
            }
            ModelKind::Convnet => {
                let d = ConvNetConfig::default();
                ModelConfig::ConvNet(ConvNetConfig {
                    channels: size(sizes.channels, d.channels),
                    resolution: size(sizes.resolution, d.resolution),
                    classes: size(sizes.classes, d.classes),
                    dtype,
                    seed,
                    ..d
                })
            }
        }
    }

    /// The model built to step at any length up to its own, when
    /// `--seq-lens` asks for several lengths.
    pub(crate) fn at_lengths(
        &self,
        device: &candle_core::Device,
        optimizing: Optimizing,
    ) -> Option<Result<Box<dyn LengthWorkload>, models::Error>> {
        Some(match self {
            ModelConfig::Transformer(config) => {
                config.build(device).and_then(|trainer| optimizing.apply(trainer)).map(|t| Box::new(t) as _)
            }
            ModelConfig::FromConfig(spec) => config_model(&spec.0, &spec.1, device)
                .and_then(models::ConfigModel::into_trainer)
                .and_then(|trainer| optimizing.apply(trainer))
                .map(|t| Box::new(t) as _),
            _ => return None,
        })
    }

    /// What the model needs before a step on `compute`, trained as
    /// `optimizing` says: checked before anything is allocated.
    pub(crate) fn footprint(
        &self,
        optimizing: Optimizing,
        compute: models::Compute,
    ) -> Result<Footprint, models::Error> {
        let adamw = match self {
            ModelConfig::Transformer(config) => config.footprint(),
            ModelConfig::Mlp(config) => config.footprint(),
            ModelConfig::ConvNet(config) => config.footprint(),
            ModelConfig::FromConfig(spec) => spec.0.footprint(&spec.1, compute),
        }?;
        let precision = if optimizing.mixed { Precision::Mixed } else { adamw.state.precision };
        adamw.trained_with(optimizing.optimizer, precision)
    }

    /// The model with `optimizer`, in mixed precision when `mixed` (the
    /// config's dtype is then bf16).
    pub(crate) fn build_with(
        &self,
        device: &candle_core::Device,
        mixed: bool,
        optimizer: OptimizerKind,
    ) -> Result<Box<dyn ReferenceWorkload>, models::Error> {
        fn finish<M: autobatch_models::trainer::Model + 'static>(
            trainer: autobatch_models::trainer::Trainer<M>,
            mixed: bool,
            optimizer: OptimizerKind,
        ) -> Result<Box<dyn ReferenceWorkload>, models::Error> {
            let trainer =
                if optimizer == OptimizerKind::AdamW { trainer } else { trainer.with_optimizer(optimizer)? };
            Ok(Box::new(if mixed { trainer.into_mixed_precision()? } else { trainer }))
        }
        match self {
            ModelConfig::Transformer(config) => finish(config.build(device)?, mixed, optimizer),
            ModelConfig::Mlp(config) => finish(config.build(device)?, mixed, optimizer),
            ModelConfig::ConvNet(config) => finish(config.build(device)?, mixed, optimizer),
            ModelConfig::FromConfig(spec) => {
                finish(config_model(&spec.0, &spec.1, device)?.into_trainer()?, mixed, optimizer)
            }
        }
    }

    /// The model's dtype as it will be built.
    pub(crate) fn dtype(&self) -> DType {
        match self {
            ModelConfig::Transformer(c) => c.dtype,
            ModelConfig::Mlp(c) => c.dtype,
            ModelConfig::ConvNet(c) => c.dtype,
            ModelConfig::FromConfig(spec) => spec.0.model_dtype(&spec.1).unwrap_or(spec.0.dtype),
        }
    }

    /// A config model's LoRA adapters, if it has them.
    pub(crate) fn lora(&self) -> Option<&models::Lora> {
        match self {
            ModelConfig::FromConfig(spec) => spec.1.lora.as_ref(),
            _ => None,
        }
    }

    /// The same LoRA model with `change` made to its adapters' settings.
    pub(crate) fn with_lora(&self, change: impl FnOnce(&mut models::Lora)) -> Option<ModelConfig> {
        let ModelConfig::FromConfig(spec) = self else { return None };
        let (config, mut training) = spec.as_ref().clone();
        change(training.lora.as_mut()?);
        // a float base is the model's dtype: the dtype follows it
        if let Some(float) = training.lora.as_ref().and_then(|lora| lora.base?.float()) {
            training.dtype = Some(float);
        }
        Some(ModelConfig::FromConfig(Box::new((config, training))))
    }

    /// The same model in `dtype`.
    pub(crate) fn with_dtype(&self, dtype: DType) -> ModelConfig {
        match self {
            ModelConfig::Transformer(c) => ModelConfig::Transformer(TransformerConfig { dtype, ..c.clone() }),
            ModelConfig::Mlp(c) => ModelConfig::Mlp(MlpConfig { dtype, ..c.clone() }),
            ModelConfig::ConvNet(c) => ModelConfig::ConvNet(ConvNetConfig { dtype, ..c.clone() }),
            ModelConfig::FromConfig(spec) => {
                let mut training = spec.1.clone().dtype(dtype);
                // a float base is the model's dtype: it follows
                if let Some(lora) = training.lora.as_mut().filter(|lora| lora.base.is_some_and(|b| b.float().is_some()))
                {
                    lora.base =
                        Some(if dtype == DType::BF16 { models::BaseDtype::Bf16 } else { models::BaseDtype::F32 });
                }
                ModelConfig::FromConfig(Box::new((spec.0.clone(), training)))
            }
        }
    }

    /// The same model at sequences of `seq_len` tokens, where it has a length
    /// (and `seq_len` is within its positions).
    pub(crate) fn with_seq_len(&self, seq_len: usize) -> Option<ModelConfig> {
        match self {
            ModelConfig::Transformer(c) => Some(ModelConfig::Transformer(TransformerConfig { seq_len, ..c.clone() })),
            ModelConfig::FromConfig(spec) => {
                let (config, training) = spec.as_ref();
                config.check_seq_len(seq_len).ok()?;
                let training = models::Training { seq_len, ..training.clone() };
                Some(ModelConfig::FromConfig(Box::new((config.clone(), training))))
            }
            ModelConfig::Mlp(_) | ModelConfig::ConvNet(_) => None,
        }
    }

    /// The same model with gradient checkpointing and its (layers, hidden,
    /// heads, seq_len), when it can checkpoint and does not yet.
    pub(crate) fn checkpointed(&self) -> Option<(ModelConfig, (usize, usize, usize, usize))> {
        match self {
            ModelConfig::Transformer(c) if !c.checkpointing => Some((
                ModelConfig::Transformer(TransformerConfig { checkpointing: true, ..c.clone() }),
                (c.layers, c.d_model, c.heads, c.seq_len),
            )),
            ModelConfig::FromConfig(spec) if !spec.1.checkpointing && spec.0.family.checkpoints() => {
                let (config, training) = spec.as_ref();
                Some((
                    ModelConfig::FromConfig(Box::new((config.clone(), training.clone().checkpointing()))),
                    (config.layers, config.hidden, config.heads, training.seq_len),
                ))
            }
            _ => None,
        }
    }

    /// A config model with its step the other way, named: the eager forms
    /// (`eager attention, full loss`) beside the lean step, or the lean step
    /// beside any eager form.
    pub(crate) fn other_step(&self) -> Option<(String, ModelConfig)> {
        let ModelConfig::FromConfig(spec) = self else { return None };
        let (config, training) = spec.as_ref();
        let lean = training.attention == models::Attention::Blocked && training.loss == models::Loss::Chunked;
        let (name, attention, loss) = if lean {
            ("eager attention, full loss", models::Attention::Eager, models::Loss::Full)
        } else {
            ("blocked attention, chunked loss", models::Attention::Blocked, models::Loss::Chunked)
        };
        let training = training.clone().attention(attention).loss(loss);
        Some((name.to_owned(), ModelConfig::FromConfig(Box::new((config.clone(), training)))))
    }

    /// A mixture of experts probed at the worst routing (the default), with
    /// its tokens routed by its router instead (about even on random
    /// weights): the balanced figure a plan reports beside its answer; the
    /// experts' count and each token's.
    pub(crate) fn routed_by_router(&self) -> Option<(ModelConfig, usize, usize)> {
        let ModelConfig::FromConfig(spec) = self else { return None };
        let (config, training) = spec.as_ref();
        let experts = config.experts.as_ref()?;
        if training.routing != models::Routing::Worst {
            return None;
        }
        let training = training.clone().routing(models::Routing::Router);
        Some((ModelConfig::FromConfig(Box::new((config.clone(), training))), experts.count, experts.per_token))
    }

    /// What the model is called in titles: `transformer`, `llama`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            ModelConfig::Transformer(_) => "transformer",
            ModelConfig::Mlp(_) => "mlp",
            ModelConfig::ConvNet(_) => "convnet",
            ModelConfig::FromConfig(spec) => spec.0.family.model_type(),
        }
    }
}

/// The largest number in `[fit, over)` that `fits`, where `fits(fit)` holds,
/// `over` is past what fits, and `fits` holds up to some number and not
/// after: bisected, one shared loop for every count that grows with it.
pub(crate) fn last_fitting(mut fit: usize, mut over: usize, fits: impl Fn(usize) -> bool) -> usize {
    while over - fit > 1 {
        let middle = fit + (over - fit) / 2;
        if fits(middle) { fit = middle } else { over = middle }
    }
    fit
}

/// A config's model: its checkpoint's weights where `--weights` found one
/// (the shapes a changed model does not share start fresh or are left out),
/// else random ones.
pub(crate) fn config_model(
    config: &models::Config,
    training: &models::Training,
    device: &candle_core::Device,
) -> Result<models::ConfigModel, models::Error> {
    match crate::hub::checkpoint() {
        Some(files) => models::ConfigModel::from_safetensors(config, training, files, device),
        None => models::ConfigModel::build(config, training, device),
    }
}

/// The advice that fits a model the flags can change, never a change the
/// tool would refuse: BERT from `--config` has no `--checkpointing`; a LoRA
/// base of its own dtype (`--base-dtype`) takes no `--precision mixed`, and a
/// float base is the model's dtype, so no other precision either.
pub(crate) fn only_applicable_advice(model: &ModelConfig, mut err: autobatch::Error) -> autobatch::Error {
    use autobatch::estimate::{Change, Precision};
    let ModelConfig::FromConfig(spec) = model else { return err };
    let bert = !spec.0.family.checkpoints();
    let base = spec.1.lora.as_ref().and_then(|lora| lora.base);
    if let autobatch::Error::NothingFits { remedies, .. } = &mut err {
        remedies.retain(|remedy| match remedy.change {
            Change::GradientCheckpointing => !bert,
            Change::Precision { to: Precision::Mixed } => base.is_none(),
            Change::Precision { .. } => base.is_none_or(|base| base.float().is_none()),
            _ => true,
        });
    }
    err
}

/// A model that steps at any length up to its own: what `--seq-lens` and
/// `--find seq-len` search.
pub(crate) trait LengthWorkload: ReferenceWorkload + autobatch::Resizable {}

impl<W: ReferenceWorkload + autobatch::Resizable> LengthWorkload for W {}

/// The dtype a model is built in at `precision` (mixed: bf16 variables).
pub(crate) fn dtype_of(precision: Precision) -> DType {
    match precision {
        Precision::Fp32 => DType::F32,
        Precision::Bf16 | Precision::Mixed => DType::BF16,
    }
}

/// The flags that say how a config's model trains, as every command reads
/// them (`probe`'s and `estimate`'s words made one before they get here).
pub(crate) struct TrainingFlags<'a> {
    /// `--seq-len` (the longest of `--seq-lens`).
    pub seq_len: Option<usize>,
    /// `--seed`.
    pub seed: Option<u64>,
    /// `--precision`.
    pub precision: Option<Precision>,
    /// Checkpointing, and the flag that asked for it (`--checkpointing`,
    /// `--recompute full`).
    pub checkpointing: Option<&'static str>,
    pub attention: Option<models::Attention>,
    pub loss: Option<models::Loss>,
    pub ops: Option<models::Ops>,
    /// `--lora`: the rank.
    pub lora: Option<usize>,
    pub lora_targets: &'a [String],
    pub lora_alpha: Option<f64>,
    pub base_dtype: Option<models::BaseDtype>,
}

impl<'a> TrainingFlags<'a> {
    /// The flag groups every command shares (LoRA's, the step's forms) and
    /// the base's dtype; the length, the seed, the precision and
    /// checkpointing left for the command to say in its words.
    pub(crate) fn of(
        lora: &'a crate::args::LoraFlags,
        step: &crate::args::StepForms,
        base_dtype: Option<models::BaseDtype>,
    ) -> TrainingFlags<'a> {
        TrainingFlags {
            seq_len: None,
            seed: None,
            precision: None,
            checkpointing: None,
            attention: step.attention,
            loss: step.loss,
            ops: step.ops,
            lora: lora.rank.map(Count::get),
            lora_targets: &lora.targets,
            lora_alpha: lora.alpha,
            base_dtype,
        }
    }
}

/// How `config`'s model trains under `flags`: the one conversion every
/// command makes (`--seq-len` [default: the shorter of 512 and the
/// positions], the precision, checkpointing, the step's forms, LoRA), so
/// that `probe` and `estimate` answer for the same training, and refuse the
/// same (a float base of another dtype than the precision asks for, too).
/// `path` names the config in a refusal, `names` the command's flags.
pub(crate) fn config_training(
    config: &models::Config,
    flags: &TrainingFlags,
    path: &std::path::Path,
    names: &Flags,
) -> Result<models::Training, Failure> {
    let what = format!("--config {}", path.display());
    let seq_len = flags.seq_len.unwrap_or_else(|| config.max_positions.min(512));
    let mut training = models::Training::new(seq_len);
    if let Some(seed) = flags.seed {
        training.seed = seed;
    }
    if let Some(flag) = flags.checkpointing {
        if !config.family.checkpoints() {
            return Err(Failure::usage(format!(
                "{what}: {flag} checkpoints a decoder's layers ({}), not {}'s",
                models::Family::listed(models::Family::checkpoints),
                config.family.model_type()
            )));
        }
        training.checkpointing = true;
    }
    training.attention = flags.attention.unwrap_or(training.attention);
    training.loss = flags.loss.unwrap_or(training.loss);
    training.ops = flags.ops.unwrap_or(training.ops);
    training.dtype = flags.precision.map(dtype_of);
    if let Some(rank) = flags.lora {
        let mut lora = models::Lora::new(rank, config.family.lora_targets());
        if !flags.lora_targets.is_empty() {
            lora.targets = flags.lora_targets.to_vec();
        }
        if let Some(alpha) = flags.lora_alpha {
            lora.alpha = alpha;
        }
        if let Some(base) = flags.base_dtype {
            if flags.precision == Some(Precision::Mixed) {
                return Err(Failure::usage(format!(
                    "--precision mixed keeps f32 masters of bf16 variables; with --base-dtype {base} the adapters \
                     are f32 already: drop one of them"
                )));
            }
            lora = lora.base(base);
        }
        training = training.lora(lora);
    }
    config.model_dtype(&training).map_err(|err| Failure::of_config(err, path, names))?;
    Ok(training)
}

/// How the model trains: the optimizer, and whether in mixed precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Optimizing {
    pub optimizer: OptimizerKind,
    /// `--precision mixed`: bf16 variables, f32 masters.
    pub mixed: bool,
}

impl Optimizing {
    /// `trainer` with this optimizer, in mixed precision when asked.
    pub fn apply<M: Model>(self, trainer: Trainer<M>) -> Result<Trainer<M>, models::Error> {
        let trainer = match self.optimizer {
            OptimizerKind::AdamW => trainer,
            other => trainer.with_optimizer(other)?,
        };
        if self.mixed { trainer.into_mixed_precision() } else { Ok(trainer) }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use crate::args::{Cli, Command};

    /// A tiny llama config on disk, for the commands to read: a file of its
    /// own each call (tests run in parallel).
    fn config_path() -> std::path::PathBuf {
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("autobatch-training-flags-{}-{call}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(
            &path,
            r#"{"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 512, "torch_dtype": "float32"}"#,
        )
        .unwrap();
        path
    }

    /// The training `probe` and `estimate` build from the same flags, or
    /// their refusals (`Err` with the message).
    fn both(
        flags: &[String],
    ) -> (Result<autobatch_models::Training, String>, Result<autobatch_models::Training, String>) {
        let path = config_path();
        let config = autobatch_models::Config::from_file(&path).unwrap();
        let line = |command: &str| {
            let mut line =
                vec!["autobatch".to_owned(), command.to_owned(), "--config".to_owned(), path.display().to_string()];
            line.extend(flags.iter().cloned());
            line
        };
        let probe = match Cli::parse_from(line("probe")).map(|cli| cli.command) {
            Ok(Some(Command::Probe(args))) => match super::ModelConfig::from_args(&args) {
                Ok(super::ModelConfig::FromConfig(spec)) => Ok(spec.1),
                Ok(_) => Err("not a config model".to_owned()),
                Err(failure) => Err(failure.message),
            },
            other => Err(format!("{:?}", other.err())),
        };
        let estimate = match Cli::parse_from(line("estimate")).map(|cli| cli.command) {
            Ok(Some(Command::Estimate(args))) => {
                crate::estimate::training(&args, &config).map_err(|failure| failure.message)
            }
            other => Err(format!("{:?}", other.err())),
        };
        (probe, estimate)
    }

    /// The flags both take, taken alike: none, and LoRA in mixed precision
    /// (bf16 in both now), and a refusal in both (mixed beside a base dtype).
    #[test]
    fn the_same_flags_give_the_same_training_or_the_same_refusal() {
        let strings = |flags: &[&str]| flags.iter().map(|flag| (*flag).to_owned()).collect::<Vec<_>>();
        let (probe, estimate) = both(&[]);
        let (probe, estimate) = (probe.unwrap(), estimate.unwrap());
        assert_eq!(probe, autobatch_models::Training { seed: probe.seed, ..estimate });
        let (probe, estimate) = both(&strings(&["--lora", "4", "--precision", "mixed", "--lora-alpha", "8"]));
        let (probe, estimate) = (probe.unwrap(), estimate.unwrap());
        assert_eq!(probe.dtype, Some(candle_core::DType::BF16));
        assert_eq!(probe, autobatch_models::Training { seed: probe.seed, ..estimate });
        let (probe, estimate) = both(&strings(&["--lora", "4", "--precision", "mixed", "--base-dtype", "q4_0"]));
        assert!(probe.is_err() && estimate.is_err(), "{probe:?} {estimate:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Every combination of the training flags: `probe` and `estimate`
        /// build the same training (the seed aside: `estimate` runs no
        /// step), or both refuse it (issue 88: `--lora R --precision mixed`
        /// trained in bf16 in one and in the config's dtype in the other, and
        /// `estimate` took no `--lora-alpha`).
        #[test]
        fn probe_and_estimate_build_the_same_training(
            seq_len in prop::option::of(prop::sample::select(vec![16usize, 64, 512])),
            precision in prop::option::of(prop::sample::select(vec!["fp32", "bf16", "mixed"])),
            checkpointing: bool,
            attention in prop::option::of(prop::sample::select(vec!["blocked", "eager"])),
            loss in prop::option::of(prop::sample::select(vec!["chunked", "full"])),
            ops in prop::option::of(prop::sample::select(vec!["fused", "eager"])),
            lora in prop::option::of(prop::sample::select(vec![4usize, 16])),
            targets in prop::option::of(prop::sample::select(vec!["q_proj", "q_proj,k_proj,v_proj,o_proj"])),
            alpha in prop::option::of(prop::sample::select(vec!["8", "32.5"])),
            base in prop::option::of(prop::sample::select(vec!["bf16", "q8_0", "q4_0"])),
        ) {
            let mut flags: Vec<String> = Vec::new();
            let mut push = |flag: &str, value: Option<String>| {
                if let Some(value) = value {
                    flags.push(flag.to_owned());
                    flags.push(value);
                }
            };
            push("--seq-len", seq_len.map(|s| s.to_string()));
            push("--precision", precision.map(str::to_owned));
            push("--attention", attention.map(str::to_owned));
            push("--loss", loss.map(str::to_owned));
            push("--ops", ops.map(str::to_owned));
            push("--lora", lora.map(|r| r.to_string()));
            if lora.is_some() {
                push("--lora-targets", targets.map(str::to_owned));
                push("--lora-alpha", alpha.map(str::to_owned));
                push("--base-dtype", base.map(str::to_owned));
            }
            if checkpointing {
                flags.push("--checkpointing".to_owned());
            }
            let (probe, estimate) = both(&flags);
            match (probe, estimate) {
                (Ok(probe), Ok(estimate)) => {
                    let estimate = autobatch_models::Training { seed: probe.seed, ..estimate };
                    prop_assert_eq!(probe, estimate, "{:?}", flags);
                }
                (Err(_), Err(_)) => {}
                (probe, estimate) => prop_assert!(false, "{flags:?}: probe {probe:?}, estimate {estimate:?}"),
            }
        }
    }
}
