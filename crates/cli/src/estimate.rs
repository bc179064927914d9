//! `autobatch estimate`: the training state of N parameters (or of a
//! config's model, its whole step counted), whether it fits, and what would
//! make it. Counted first ([`Estimate::of`]), then said ([`Estimate::print`],
//! [`Estimate::json`]).

use crate::output::outln;
use autobatch::Bytes;
use autobatch::estimate::{
    Accelerator, Change, Precision, Recompute, Remedy, Sharding, StaticMemory, TrainingSetup, TransformerShape,
};
use autobatch_models as models;
use autobatch_models::trainer::Footprint;
use autobatch_models::{Compute, Config, Training};
use candle_core::DType;

use crate::args::{ActivationArgs, EstimateArgs, ShardingArgs};
use crate::failure::{Failure, Flags};
use crate::step::{Fit, Step};
use crate::values::Count;

/// `autobatch estimate`.
pub fn run(args: &EstimateArgs) -> Result<(), Failure> {
    if let (true, Some(path)) = (args.serving.serve, &args.state.config) {
        let capacity = args.device.capacity.map(|capacity| capacity.bytes);
        return crate::serve::estimate(
            path,
            &args.serving.settings,
            capacity,
            args.device.ceiling,
            args.device.on_cpu,
            args.json,
        );
    }
    if args.device.on_cpu && args.state.config.is_none() {
        // clap counts a switch's default as given: its `requires` is checked here
        return Err(Failure::usage("--on-cpu counts a config's step on the CPU heap: add --config"));
    }
    if args.serving.settings != crate::args::ServingArgs::default() {
        return Err(Failure::usage(
            "--max-model-len, --max-num-batched-tokens, --block-size, --weights and --kv-cache-dtype count serving: add --serve",
        ));
    }
    let estimate = Estimate::of(args)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&estimate.json()).expect("plain values serialize"));
    } else {
        estimate.print();
    }
    Ok(())
}

/// A config's model as the flags make it: `--layers`' copy, LoRA.
struct FlaggedConfig {
    config: Config,
    /// The config's own layers, when `--layers` made a copy with other.
    layers_of_config: Option<usize>,
    lora: Option<LoraTraining>,
}

/// `--lora`: the training, what trains (the adapters), the frozen base's bytes.
struct LoraTraining {
    training: Training,
    footprint: Footprint,
    frozen_bytes: u64,
}

/// What `estimate` counted.
struct Estimate {
    parameters: u64,
    model: Option<FlaggedConfig>,
    step: Option<Step>,
    setup: TrainingSetup,
    state: StaticMemory,
    activations: u64,
    total: u64,
    /// The device's memory, and the card it was named by.
    capacity: Option<(u64, Option<&'static Accelerator>)>,
    /// What the total must stay under: the ceiling's share of the capacity
    /// (as the probe counts it).
    room: Option<u64>,
    /// Whether the total counts a batch's activations (a config's step,
    /// `--activations`, or the transformer's sizes): only then can it say
    /// that a batch fits.
    counts_a_batch: bool,
    advice: Vec<Remedy>,
    fit: Option<Fit>,
    which_gpus: bool,
    ceiling: autobatch::Ceiling,
}

impl Estimate {
    /// Counts what the flags describe.
    fn of(args: &EstimateArgs) -> Result<Estimate, Failure> {
        let model = config_model(args)?;
        let parameters = parameters(args, model.as_ref())?;
        let precision = precision(args, model.as_ref())?;
        let capacity = args.device.capacity.map(|capacity| (capacity.bytes, capacity.card));
        let sharding = sharding(args)?;
        let frozen = model.as_ref().and_then(|model| model.lora.as_ref()).map_or(0, |lora| lora.frozen_bytes);
        let setup = TrainingSetup::new(parameters, precision, args.state.optimizer).sharded(sharding).frozen(frozen);
        // a config's model: its whole candle step counted; otherwise the formula's activations
        let step = match &model {
            Some(model) => Some(Step::new(
                args,
                &model.config,
                model.lora.as_ref().map(|lora| lora.training.clone()),
                if args.device.on_cpu { Compute::Cpu } else { Compute::Accelerator },
            )?),
            None => None,
        };
        let setup = match &step {
            Some(_) if args.activations.bytes.is_some() => {
                return Err(Failure::usage("--activations and --config both say the activations: give one"));
            }
            // the step's widest moment at the batch: its activations, the vocabulary-sized tensors
            Some(step) => {
                let gradients = setup.state()?.gradients;
                setup.activations(step.held_bytes(gradients)?)
            }
            None => with_activations(args, setup, activation_precision(args, model.as_ref())?)?,
        };
        let total = setup.total()?;
        // the probe's ceiling, with or without a config
        let room = capacity.map(|(bytes, _)| args.device.ceiling.limit_bytes(bytes));
        let counts_a_batch = step.is_some() || setup.all_activation_bytes()? > 0;
        let fit = match (&step, capacity) {
            (Some(step), Some((bytes, _))) => {
                let base = setup.clone().activations(0).total()?;
                let gradients = setup.state()?.gradients;
                let target = args.device.target_effective_batch.map(Count::get);
                Some(step.fit(base, gradients, bytes, args.device.ceiling, target, args.sharding.ranks.get())?)
            }
            _ => None,
        };
        let mut advice = advice(args, &setup, step.as_ref(), room)?;
        if !counts_a_batch {
            // what a change leaves for activations is not a batch that fits
            advice.iter_mut().for_each(|remedy| remedy.fits = false);
        }
        Ok(Estimate {
            parameters,
            state: setup.state()?,
            activations: setup.all_activation_bytes()?,
            total,
            model,
            step,
            setup,
            capacity,
            room,
            counts_a_batch,
            advice,
            fit,
            which_gpus: args.device.which_gpus,
            ceiling: args.device.ceiling,
        })
    }

    /// Whether it fits under `limit`: `Some(true)` only where a batch of at
    /// least one sample is counted and the total stays under it; `Some(false)`
    /// where the total does not; `None` where the state alone stays under
    /// it and the activations are not counted (then no one knows).
    fn fits_under(&self, limit: u64) -> Option<bool> {
        match (self.total <= limit, self.counts_a_batch) {
            (false, _) => Some(false),
            (true, true) => Some(true),
            // nothing left for a single activation is no fit either
            (true, false) if self.total == limit => Some(false),
            (true, false) => None,
        }
    }

    fn frozen_bytes(&self) -> u64 {
        self.setup.frozen_bytes
    }

    /// The estimate as JSON.
    fn json(&self) -> serde_json::Value {
        let (capacity, card) = (self.capacity.map(|(bytes, _)| bytes), self.capacity.and_then(|(_, card)| card));
        let mut json = serde_json::json!({
            "sharding": self.setup.sharding,
            "state": self.state,
            "activation_bytes": self.activations,
            "bytes_per_sample": self.step.as_ref().map(|step| step.bytes_per_sample),
            "batch": self.step.as_ref().map(|step| step.batch),
            "frozen_bytes": self.frozen_bytes(),
            "total_bytes": self.total,
            "capacity_bytes": capacity,
            "fits": self.room.map(|room| self.fits_under(room)),
            "activations_counted": self.counts_a_batch,
            "remedies": self.advice.iter().map(|remedy| {
                let mut row = serde_json::to_value(remedy).expect("plain values serialize");
                row["flag"] = change_flag(&remedy.change).into();
                if let Some(room) = self.room.filter(|_| !self.counts_a_batch) {
                    row["left_for_activations"] = room.saturating_sub(remedy.total_bytes).into();
                }
                row
            }).collect::<Vec<_>>(),
        });
        if let Some(room) = self.room {
            json["ceiling"] = self.ceiling.fraction().into();
            json["limit_bytes"] = room.into();
            json["left_for_activations"] = room.saturating_sub(self.total.saturating_sub(self.activations)).into();
        }
        if let Some(card) = card {
            json["capacity_name"] = card.name.into();
        }
        if let Some(fit) = &self.fit {
            json["ceiling"] = fit.ceiling.fraction().into();
            json["limit_bytes"] = fit.limit_bytes.into();
            json["fixed_bytes"] = fit.fixed_bytes.into();
            json["largest_batch"] = fit.largest_batch.into();
            json["on_cpu"] = self.step.as_ref().is_some_and(|step| step.memory.compute == Compute::Cpu).into();
            if let Some((largest, factor)) = fit.on_the_cpu {
                json["on_the_cpu"] = serde_json::json!({ "largest_batch": largest, "factor": factor });
            }
            if let Some(split) = &fit.split {
                json["split"] = serde_json::to_value(split).expect("plain values serialize");
            }
        }
        if self.which_gpus {
            let cards = Accelerator::ALL.iter().map(|card| {
                serde_json::json!({
                    "name": card.name,
                    "description": card.description,
                    "memory_bytes": card.memory_bytes,
                    "fits": self.fits_under(self.ceiling.limit_bytes(card.memory_bytes)),
                })
            });
            json["which_gpus"] = cards.collect::<Vec<_>>().into();
        }
        json
    }

    /// The estimate as text: what was counted, the table of bytes, and with
    /// a capacity whether it fits and what would make it.
    fn print(&self) {
        self.print_what();
        self.print_table();
        if self.which_gpus {
            self.print_which_gpus();
        }
        if let Some((capacity, card)) = self.capacity {
            self.print_verdict(capacity, card);
        }
    }

    /// `training state of … parameters (…)` and what the count is of.
    fn print_what(&self) {
        let setup = &self.setup;
        let at = match &self.step {
            Some(step) => format!(", at batch {}", step.batch),
            None if self.activations > 0 => String::new(),
            None => ", before activations".to_owned(),
        };
        outln!(
            "training state of {:.3e} parameters ({}, {} optimizer){}{at}",
            self.parameters,
            setup.precision.name(),
            setup.optimizer.name(),
            describe_sharding(&setup.sharding),
        );
        if let Some(step) = &self.step {
            outln!("  {}", step.describe());
        }
        let Some(model) = &self.model else { return };
        if let Some(of) = model.layers_of_config {
            outln!(
                "  a copy of the config with {} of its {of} layers (--layers): parameters and activations",
                model.config.layers
            );
        }
        if let Some(lora) = &model.lora {
            outln!("  {}: {} frozen parameters", model.config.describe(&lora.training), model.config.parameter_count());
        }
    }

    /// Each part's bytes, and per parameter.
    fn print_table(&self) {
        let state = &self.state;
        let mut rows = vec![
            ("weights", state.weights),
            ("gradients", state.gradients),
            ("optimizer states", state.optimizer_states),
            ("master weights", state.master_weights),
        ];
        match (&self.step, self.activations) {
            (Some(_), bytes) => rows.push(("step's tensors", bytes)),
            (None, 1..) => rows.push(("activations", self.activations)),
            (None, 0) => {}
        }
        if self.setup.other_bytes > 0 {
            rows.push(("loss chunk", self.setup.other_bytes));
        }
        if let (Some(model), frozen @ 1..) = (&self.model, self.frozen_bytes()) {
            // per frozen parameter: the base's own dtype
            let per_frozen = frozen as f64 / model.config.parameter_count() as f64;
            outln!("  {:<17} {:>10}  {per_frozen:>6.2} B/frozen param", "frozen base", Bytes(frozen).decimal());
        }
        rows.push(("total", self.total));
        for (name, bytes) in rows {
            let per_parameter = bytes as f64 / self.parameters as f64;
            outln!("  {name:<17} {:>10}  {per_parameter:>6.2} B/param", Bytes(bytes).decimal());
        }
    }

    /// Against the capacity: the largest batch (a config's step), whether
    /// the total fits, and the changes that would make it.
    fn print_verdict(&self, capacity: u64, card: Option<&Accelerator>) {
        let device = match card {
            Some(card) => format!("{} (reports {}, {})", card.name, Bytes(capacity), Bytes(capacity).decimal()),
            None => format!("{} ({})", Bytes(capacity), Bytes(capacity).decimal()),
        };
        let room = self.room.unwrap_or(capacity);
        if let Some(fit) = &self.fit {
            self.print_fit(fit, &device);
        }
        let under = format!("under {} of {device}", self.ceiling);
        match self.fits_under(room) {
            Some(true) => {
                outln!("fits {under}, with {} to spare", Bytes(room - self.total).decimal());
                return;
            }
            None => {
                outln!(
                    "the training state fits {under}, leaving {} for activations; whether a batch fits depends on \
                     them: give --config, --activations, or the transformer's --layers, --hidden, --heads, --seq-len \
                     and --batch",
                    Bytes(room - self.total).decimal()
                );
                return;
            }
            Some(false) if self.total <= room => {
                outln!("does not fit {under}: the training state alone takes all {}", Bytes(room).decimal());
            }
            Some(false) => outln!("does not fit {under}: {} over", Bytes(self.total - room).decimal()),
        }
        if self.advice.is_empty() {
            outln!("no single change considered here makes it fit");
        } else {
            // counted, not run: said so, and for which device a config's step was counted
            let counted = match &self.step {
                Some(step) if step.memory.compute == Compute::Cpu => "counted for the CPU",
                Some(_) => "counted for an accelerator",
                None => "counted",
            };
            outln!("changes, each alone, {counted} (the flag that applies it):");
            for remedy in &self.advice {
                match self.counts_a_batch {
                    true => outln!("  {} ({})", remedy.decimal(), change_flag(&remedy.change)),
                    false => {
                        let left = match room.checked_sub(remedy.total_bytes).filter(|&left| left > 0) {
                            Some(left) => format!("leaves {} for activations", Bytes(left).decimal()),
                            None => "still over".to_owned(),
                        };
                        outln!("  {}, {left} ({})", remedy.decimal(), change_flag(&remedy.change));
                    }
                }
            }
        }
    }

    /// A config's step on the device: the largest batch, the target's split.
    fn print_fit(&self, fit: &Fit, device: &str) {
        match fit.largest_batch {
            0 => outln!(
                "largest batch under {} of {device}: none ({} held whatever the batch and {} a sample, against {})",
                fit.ceiling,
                Bytes(fit.fixed_bytes).decimal(),
                Bytes(self.step.as_ref().map_or(0, |step| step.bytes_per_sample)).decimal(),
                Bytes(fit.limit_bytes).decimal()
            ),
            largest => outln!("largest batch under {} of {device}: {largest}", fit.ceiling),
        }
        if let Some((largest, factor)) = fit.on_the_cpu {
            outln!(
                "  on the CPU (probe's default device) candle widens bf16 products to f32: the step holds {factor:.2}x \
                 these bytes beside its state, largest batch {largest} there (--on-cpu counts it)"
            );
        }
        if let Some(split) = &fit.split {
            outln!("plan: {split}");
        }
    }
}

/// `--zero`, `--ranks` and `--tensor-parallel`.
fn sharding(args: &EstimateArgs) -> Result<Sharding, Failure> {
    let ShardingArgs { zero, ranks, tensor_parallel } = args.sharding;
    if zero > 0 && ranks == Count::ONE {
        return Err(Failure::usage(format!("--zero {zero} partitions over --ranks: give more than 1 rank")));
    }
    Ok(Sharding::new(zero, ranks.get() as u64, tensor_parallel.get() as u64)?)
}

/// `--config`: the model, a copy with `--layers`, its LoRA training; the
/// lengths checked against its positions.
fn config_model(args: &EstimateArgs) -> Result<Option<FlaggedConfig>, Failure> {
    let Some(path) = &args.state.config else { return Ok(None) };
    let with_path = |err: models::Error| Failure::of_config(err, path, &Flags::ESTIMATE);
    let mut config = Config::from_file(path).map_err(with_path)?;
    if let Some(unapplied) = config.unapplied() {
        log::warn!("{unapplied}");
    }
    // --layers makes a shallower (or deeper) copy: its parameters and its activations
    let mut layers_of_config = None;
    if let Some(layers) = args.activations.layers {
        layers_of_config = Some(config.layers);
        config = config.with_layers(layers.get()).map_err(with_path)?;
    }
    // the lengths the step runs at: at most the positions, within a sliding window
    if let Some(seq_len) = args.activations.seq_len {
        config.check_seq_len(seq_len.get()).map_err(with_path)?;
    }
    let lora = match args.lora.rank {
        Some(rank) => Some(lora_training(args, &config, rank.get())?),
        None => None,
    };
    Ok(Some(FlaggedConfig { config, layers_of_config, lora }))
}

/// What trains: `--params`, a config's parameters, or under LoRA its adapters'.
fn parameters(args: &EstimateArgs, model: Option<&FlaggedConfig>) -> Result<u64, Failure> {
    let parameters = match (model, &args.state.params) {
        (Some(FlaggedConfig { lora: Some(lora), .. }), _) => lora.footprint.parameters,
        (Some(model), _) => model.config.parameter_count(),
        (None, Some(params)) => *params,
        (None, None) => return Err(Failure::usage("give --params N or --config path/to/config.json")),
    };
    if parameters == 0 {
        return Err(Failure::usage("--params is 0: give the number of trainable parameters, e.g. 125M"));
    }
    Ok(parameters)
}

/// How what trains is stored: `--mixed-precision`, `--dtype`, else the
/// config's torch_dtype; f32 adapters beside a base of its own dtype.
fn precision(args: &EstimateArgs, model: Option<&FlaggedConfig>) -> Result<Precision, Failure> {
    let own_base = model.and_then(|model| model.lora.as_ref()?.training.lora.as_ref()?.base).is_some();
    if own_base && args.state.mixed_precision {
        return Err(Failure::usage(
            "--mixed-precision keeps f32 masters of bf16 variables; with --base-dtype the adapters are f32 already: drop one of them",
        ));
    }
    if args.state.mixed_precision {
        return Ok(Precision::Mixed);
    }
    let from_config = model.map(|model| match model.config.dtype {
        DType::BF16 => Precision::Bf16,
        _ => Precision::Fp32,
    });
    Ok(match (own_base, args.state.dtype) {
        (true, _) => Precision::Fp32,
        (false, Some(dtype)) => dtype,
        (false, None) => from_config.unwrap_or(Precision::Fp32),
    })
}

/// The activations' precision where it is not what trains: a LoRA base of
/// its own dtype keeps the activations in the model's dtype, as the probe
/// measures them.
fn activation_precision(args: &EstimateArgs, model: Option<&FlaggedConfig>) -> Result<Option<Precision>, Failure> {
    let Some((config, lora)) = model.and_then(|model| Some((&model.config, model.lora.as_ref()?))) else {
        return Ok(None);
    };
    if args.lora.base_dtype.is_none() {
        return Ok(None);
    }
    let dtype = config.model_dtype(&lora.training).map_err(|err| Failure::in_flags(err, &Flags::ESTIMATE))?;
    Ok(Some(if dtype == DType::BF16 { Precision::Bf16 } else { Precision::Fp32 }))
}

/// The changes that would make it fit under `room`, each alone.
fn advice(
    args: &EstimateArgs,
    setup: &TrainingSetup,
    step: Option<&Step>,
    room: Option<u64>,
) -> Result<Vec<Remedy>, Failure> {
    let Some(room) = room else { return Ok(Vec::new()) };
    let mut advice = match step {
        Some(step) => step.remedies(setup, room, setup.remedies(room)?)?,
        None => setup.remedies(room)?,
    };
    // with --base-dtype the adapters are f32 whatever --dtype says: no precision advice
    if args.lora.base_dtype.is_some() {
        advice.retain(|remedy| !matches!(remedy.change, Change::Precision { .. }));
    }
    Ok(advice)
}

/// `--lora`: the LoRA training of the config the flags describe, its
/// footprint (the adapters that train) and its frozen base's bytes.
fn lora_training(args: &EstimateArgs, config: &Config, rank: usize) -> Result<LoraTraining, Failure> {
    use autobatch_models::Lora;
    let mut lora = Lora::new(rank, config.family.lora_targets());
    if !args.lora.targets.is_empty() {
        lora.targets = args.lora.targets.clone();
    }
    if let Some(base) = args.lora.base_dtype {
        lora = lora.base(base);
    }
    let seq_len = args.activations.seq_len.map_or_else(|| config.max_positions.min(512), Count::get);
    let mut training = Training::new(seq_len).lora(lora);
    training.dtype = args.state.dtype.map(crate::model::dtype_of);
    let path = args.state.config.as_deref().unwrap_or(std::path::Path::new(""));
    let with_path = |err: models::Error| Failure::of_config(err, path, &Flags::ESTIMATE);
    let footprint = config.footprint(&training).map_err(with_path)?;
    let frozen_bytes = config.frozen_bytes(&training).map_err(with_path)?;
    Ok(LoraTraining { training, footprint, frozen_bytes })
}

impl Estimate {
    /// `--which-gpus`: every named card, whether the total per device fits
    /// under the ceiling of it (or, activations not counted, leaves them room).
    fn print_which_gpus(&self) {
        let verdicts: Vec<(&Accelerator, u64, Option<bool>)> = Accelerator::ALL
            .iter()
            .map(|card| {
                let limit = self.ceiling.limit_bytes(card.memory_bytes);
                (card, limit, self.fits_under(limit))
            })
            .collect();
        // where a batch fits, or (activations not counted) where the state leaves them room
        let (wanted, word) = match self.counts_a_batch {
            true => (Some(true), "fits on"),
            false => (None, "the training state fits on"),
        };
        let fitting: Vec<&str> =
            verdicts.iter().filter(|(_, _, fits)| *fits == wanted).map(|(card, _, _)| card.name).collect();
        let under = format!("under {} of each", self.ceiling);
        match fitting.is_empty() {
            true => outln!(
                "{word} none of the named cards {under} (the largest reports {})",
                Bytes(Accelerator::ALL.last().map_or(0, |c| c.memory_bytes))
            ),
            false if self.counts_a_batch => outln!("{word}: {} ({under})", fitting.join(", ")),
            false => outln!("{word}: {} ({under}; activations not counted)", fitting.join(", ")),
        }
        for (card, limit, fits) in verdicts {
            let verdict = match fits {
                Some(true) => format!("fits, {} to spare", Bytes(limit - self.total).decimal()),
                None => format!("leaves {} for activations", Bytes(limit - self.total).decimal()),
                Some(false) if self.total <= limit => "the state alone takes it all".to_owned(),
                Some(false) => format!("{} over", Bytes(self.total - limit).decimal()),
            };
            outln!("  {:<10} {:>10}  {:<30} {verdict}", card.name, Bytes(card.memory_bytes), card.description);
        }
    }
}

/// `, per device: ZeRO stage 1 over 64 ranks, tensor parallel 2`, or nothing.
fn describe_sharding(sharding: &Sharding) -> String {
    let mut parts = Vec::new();
    if sharding.zero_stage > 0 {
        parts.push(format!("ZeRO stage {} over {} ranks", sharding.zero_stage, sharding.data_parallel));
    }
    if sharding.tensor_parallel > 1 {
        parts.push(format!("tensor parallel {}", sharding.tensor_parallel));
    }
    if parts.is_empty() { String::new() } else { format!(", per device: {}", parts.join(", ")) }
}

/// The flags that apply `change` (the one map every command advises with),
/// or the change in words where no flag applies it.
fn change_flag(change: &Change) -> String {
    Flags::ESTIMATE.remedy(change).unwrap_or_else(|| change.to_string())
}

/// `--activations`, or the transformer activation model when its five sizes
/// are given (never both), at the precision training uses; with the model, also
/// what a candle f32 step keeps by the measured ratio.
fn with_activations(
    args: &EstimateArgs,
    setup: TrainingSetup,
    activation_precision: Option<Precision>,
) -> Result<TrainingSetup, Failure> {
    let Some(shape) = transformer_shape(&args.activations, args.sharding.tensor_parallel.get())? else {
        if args.activations.recompute != Recompute::None {
            return Err(Failure::usage(
                "--recompute needs the transformer's --layers, --hidden, --heads, --seq-len and --batch",
            ));
        }
        return Ok(setup.activations(args.activations.bytes.unwrap_or(0)));
    };
    let recompute = args.activations.recompute;
    match activation_precision.filter(|precision| *precision != setup.precision) {
        Some(precision) => {
            let at_model_dtype = TrainingSetup::new(setup.parameters, precision, setup.optimizer)
                .sharded(setup.sharding)
                .transformer(shape, recompute)?
                .all_activation_bytes()?;
            Ok(setup.measured_transformer(at_model_dtype, shape, recompute)?)
        }
        None => Ok(setup.transformer(shape, recompute)?),
    }
}

/// The transformer the five sizes describe, when any is given (then all
/// must be, and not `--activations` too).
fn transformer_shape(given: &ActivationArgs, tensor_parallel: usize) -> Result<Option<TransformerShape>, Failure> {
    let sizes = [given.layers, given.hidden, given.heads, given.seq_len, given.batch].map(|size| size.map(Count::get));
    let named = ["--layers", "--hidden", "--heads", "--seq-len", "--batch"];
    if sizes.iter().all(Option::is_none) {
        return Ok(None);
    }
    if given.bytes.is_some() {
        return Err(Failure::usage(
            "--activations and the transformer sizes (--layers …) both say the activations: give one",
        ));
    }
    let [Some(layers), Some(hidden), Some(heads), Some(seq_len), Some(batch)] = sizes else {
        let missing: Vec<&str> = named.iter().zip(sizes).filter(|(_, v)| v.is_none()).map(|(n, _)| *n).collect();
        return Err(Failure::usage(format!("the activation model needs {} too", missing.join(", "))));
    };
    if hidden % heads != 0 {
        return Err(Failure::usage(format!(
            "--heads {heads} does not divide --hidden {hidden}: each head takes hidden / heads dimensions"
        )));
    }
    if heads % tensor_parallel != 0 {
        return Err(Failure::usage(format!(
            "--tensor-parallel {tensor_parallel} does not divide --heads {heads}: each device takes whole heads"
        )));
    }
    let [layers, hidden, heads, seq_len, batch] = [layers, hidden, heads, seq_len, batch].map(|size| size as u64);
    Ok(Some(TransformerShape { layers, hidden, heads, seq_len, batch }))
}
