//! `autobatch estimate`: the training state of N parameters (or of a
//! config's model, its whole step counted), whether it fits, and what would
//! make it. The flags are converted once into the library's request
//! ([`count`]: an `Estimator` of `autobatch_models::estimate`), which counts;
//! this module only says the typed result ([`Counted::print`], [`Counted::json`]).

use crate::output::outln;
use autobatch::estimate::{Accelerator, Change, Precision, Recompute, Remedy, Sharding, TransformerShape};
use autobatch::{Bytes, plan::Ceiling};
use autobatch_models as models;
use autobatch_models::estimate::{Activations, Estimate, Estimator, OnDevice, StepFit, Verdict};
use autobatch_models::{Compute, Config, Training};

use crate::args::{ActivationArgs, EstimateArgs, ShardingArgs};
use crate::failure::{Failure, Flags};
use crate::values::Count;

/// `autobatch estimate`.
pub fn run(args: &EstimateArgs) -> Result<(), Failure> {
    if args.device.on_cpu && args.state.config.path.is_none() {
        // clap counts a switch's default as given: its `requires` is checked here
        return Err(Failure::usage("--on-cpu counts a config's step on the CPU heap: add --config"));
    }
    if args.serving.settings != crate::args::ServingArgs::default() {
        return Err(Failure::usage(
            "--max-model-len, --max-num-batched-tokens, --block-size and --kv-cache-dtype count serving: add --serve",
        ));
    }
    if args.base.base.base_dtype.is_some() && args.lora.rank.is_none() {
        // one flag for the frozen weights: LoRA's base, or with --serve every weight
        return Err(Failure::usage(
            "--base-dtype is the frozen weights' dtype: add --lora RANK (a frozen base), or --serve",
        ));
    }
    let counted = count(args)?;
    if args.json.on {
        let json = crate::hub::annotate(counted.json());
        outln!("{}", serde_json::to_string_pretty(&json).expect("plain values serialize"));
    } else {
        if let Some(said) = crate::hub::source().and_then(crate::hub::ConfigSource::said) {
            outln!("{said}");
        }
        counted.print();
    }
    Ok(())
}

/// What the words say beside the library's estimate: what only the flags know.
struct Counted {
    estimate: Estimate,
    /// The config's own layers, when `--layers` made a copy with other.
    layers_of_config: Option<usize>,
    /// The card `--capacity` named.
    card: Option<&'static Accelerator>,
    which_gpus: bool,
    ceiling: Ceiling,
}

/// The flags converted once into the library's request, and counted.
fn count(args: &EstimateArgs) -> Result<Counted, Failure> {
    let sharding = sharding(args)?;
    let capacity = args.device.capacity.map(|capacity| capacity.bytes);
    let ceiling = args.device.ceiling.fraction;
    let (estimate, layers_of_config) = match &args.state.config.path {
        Some(path) => {
            let with_path = |err: models::Error| Failure::of_config(err, path, &Flags::ESTIMATE);
            let (config, layers_of_config) = config_model(args, path)?;
            // Megatron and vLLM split attention by whole heads, keys and values too
            let tensor_parallel = args.sharding.tensor_parallel.get();
            for (field, heads) in [("num_attention_heads", config.heads), ("num_key_value_heads", config.kv_heads)] {
                if !heads.is_multiple_of(tensor_parallel) {
                    return Err(Failure::usage(format!(
                        "--tensor-parallel {tensor_parallel} does not divide the config's {field}, {heads}: each \
                         device takes whole heads; use a divisor of {heads}"
                    )));
                }
            }
            let training = training(args, &config)?;
            let own_base = training.lora.as_ref().and_then(|lora| lora.base).is_some();
            if args.activations.bytes.is_some() {
                return Err(Failure::usage("--activations and --config both say the activations: give one"));
            }
            let mut request = Estimator::step(config, training)
                .optimizer(args.state.optimizer.kind)
                .sharded(sharding)
                .compute(if args.device.on_cpu { Compute::Cpu } else { Compute::Accelerator })
                .batch(args.activations.batch.size.map_or(1, Count::get));
            if let Some(precision) = precision(args, own_base)? {
                request = request.precision(precision);
            }
            if let Some(capacity) = capacity {
                request = request.on_device(capacity, ceiling);
            }
            if let Some(target) = args.device.target.batch {
                request = request.target_effective_batch(target.get(), args.sharding.ranks.get());
            }
            (request.count().map_err(with_path)?, layers_of_config)
        }
        None => {
            let Some(parameters) = args.state.params else {
                return Err(Failure::usage("give --params N or --config path/to/config.json"));
            };
            if parameters == 0 {
                return Err(Failure::usage("--params is 0: give the number of trainable parameters, e.g. 125M"));
            }
            let mut request = Estimator::parameters(parameters)
                .activations(activations(args)?)
                .optimizer(args.state.optimizer.kind)
                .sharded(sharding);
            if let Some(precision) = precision(args, false)? {
                request = request.precision(precision);
            }
            if let Some(capacity) = capacity {
                request = request.on_device(capacity, ceiling);
            }
            (request.count().map_err(|err| Failure::in_flags(err, &Flags::ESTIMATE))?, None)
        }
    };
    let card = args.device.capacity.and_then(|capacity| capacity.card);
    Ok(Counted { estimate, layers_of_config, card, which_gpus: args.device.which_gpus, ceiling })
}

impl Counted {
    /// The named cards a capacity given in bytes is a little under (up to
    /// 10%): `24GB` is 22.4 GiB, where an RTX 4090 sold as "24 GB" reports
    /// 24.0 GiB, and the answer can differ by a batch.
    fn near_cards(&self, capacity: u64) -> Vec<&'static Accelerator> {
        if self.card.is_some() {
            return Vec::new();
        }
        Accelerator::ALL
            .iter()
            .filter(|card| card.memory_bytes > capacity && card.memory_bytes <= capacity + capacity / 10)
            .collect()
    }

    fn room(&self) -> Option<u64> {
        self.estimate.on_device().map(|device| device.limit_bytes)
    }

    fn advice(&self) -> &[Remedy] {
        self.estimate.on_device().map_or(&[], |device| &device.remedies)
    }

    fn fits_under(&self, limit: u64) -> Option<bool> {
        self.estimate.fits_under(limit).known()
    }

    /// The estimate as JSON.
    fn json(&self) -> serde_json::Value {
        let (capacity, card) = (self.estimate.on_device().map(|device| device.capacity_bytes), self.card);
        let mut json = serde_json::json!({
            "sharding": self.estimate.setup().sharding,
            "state": self.estimate.state(),
            "activation_bytes": self.estimate.activation_bytes(),
            "bytes_per_sample": self.estimate.step().map(|step| step.bytes_per_sample),
            "batch": self.estimate.step().map(|step| step.batch),
            "frozen_bytes": self.estimate.setup().frozen_bytes,
            "total_bytes": self.estimate.total_bytes(),
            "capacity_bytes": capacity,
            "fits": self.estimate.fits().map(Verdict::known),
            "activations_counted": self.estimate.counts_a_batch(),
            "remedies": self.advice().iter().map(|remedy| {
                let mut row = serde_json::to_value(remedy).expect("plain values serialize");
                row["flag"] = change_flag(&remedy.change).into();
                if let Some(room) = self.room().filter(|_| !self.estimate.counts_a_batch()) {
                    row["left_for_activations"] = room.saturating_sub(remedy.total_bytes).into();
                }
                row
            }).collect::<Vec<_>>(),
        });
        let (total, activations) = (self.estimate.total_bytes(), self.estimate.activation_bytes());
        if let Some(room) = self.room() {
            json["ceiling"] = self.ceiling.fraction().into();
            json["limit_bytes"] = room.into();
            json["left_for_activations"] = room.saturating_sub(total.saturating_sub(activations)).into();
        }
        if let Some(card) = card {
            json["capacity_name"] = card.name.into();
        }
        if let Some(capacity) = capacity {
            let near: Vec<&str> = self.near_cards(capacity).iter().map(|card| card.name).collect();
            if !near.is_empty() {
                json["cards_a_little_larger"] = near.into();
            }
        }
        if let Some(experts) = self.estimate.step().and_then(experts_counted) {
            json["experts"] = experts.to_json();
        }
        if let Some(fit) = self.estimate.fit() {
            json["fixed_bytes"] = fit.fixed_bytes.into();
            json["largest_batch"] = fit.largest_batch.into();
            json["bytes_per_sample_there"] = fit.bytes_per_sample_there.into();
            json["on_cpu"] = self.estimate.step().is_some_and(|step| step.memory.compute == Compute::Cpu).into();
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
        if let Some(device) = self.estimate.on_device() {
            self.print_verdict(device);
        }
    }

    /// `training state of … parameters (…)` and what the count is of.
    fn print_what(&self) {
        let setup = self.estimate.setup();
        let step = self.estimate.step();
        let at = match step {
            Some(step) => format!(", at batch {}", step.batch),
            None if self.estimate.activation_bytes() > 0 => String::new(),
            None => ", before activations".to_owned(),
        };
        outln!(
            "training state of {:.3e} parameters ({}, {} optimizer){}{at}",
            self.estimate.parameters(),
            setup.precision.name(),
            setup.optimizer.name(),
            describe_sharding(&setup.sharding),
        );
        let Some(step) = step else { return };
        outln!("  {}", step.describe());
        if let Some(of) = self.layers_of_config {
            outln!(
                "  a copy of the config with {} of its {of} layers (--layers): parameters and activations",
                step.config.layers
            );
        }
        if step.training.lora.is_some() {
            outln!("  {}: {} frozen parameters", step.config.describe(&step.training), step.config.parameter_count());
        }
        if let Some(experts) = experts_said(step) {
            outln!("  {experts}");
        }
    }

    /// Each part's bytes, and per parameter.
    fn print_table(&self) {
        let (estimate, setup) = (&self.estimate, self.estimate.setup());
        let state = estimate.state();
        let mut rows = vec![
            ("weights", state.weights),
            ("gradients", state.gradients),
            ("optimizer states", state.optimizer_states),
            ("master weights", state.master_weights),
        ];
        match (estimate.step(), estimate.activation_bytes()) {
            (Some(_), bytes) => rows.push(("step's tensors", bytes)),
            (None, bytes @ 1..) => rows.push(("activations", bytes)),
            (None, 0) => {}
        }
        if setup.other_bytes > 0 {
            rows.push(("loss chunk", setup.other_bytes));
        }
        if let (Some(step), frozen @ 1..) = (estimate.step(), setup.frozen_bytes) {
            // per frozen parameter: the base's own dtype
            let per_frozen = frozen as f64 / step.config.parameter_count() as f64;
            outln!("  {:<17} {:>10}  {per_frozen:>6.2} B/frozen param", "frozen base", Bytes(frozen).decimal());
        }
        rows.push(("total", estimate.total_bytes()));
        for (name, bytes) in rows {
            let per_parameter = bytes as f64 / estimate.parameters() as f64;
            outln!("  {name:<17} {:>10}  {per_parameter:>6.2} B/param", Bytes(bytes).decimal());
        }
    }

    /// Against the capacity: the largest batch (a config's step), whether
    /// the total fits, and the changes that would make it.
    fn print_verdict(&self, on_device: &OnDevice) {
        let capacity = on_device.capacity_bytes;
        let device = match self.card {
            Some(card) => format!("{} (reports {}, {})", card.name, Bytes(capacity), Bytes(capacity).decimal()),
            None => format!("{} ({})", Bytes(capacity), Bytes(capacity).decimal()),
        };
        let (room, total) = (on_device.limit_bytes, self.estimate.total_bytes());
        let near = self.near_cards(capacity);
        if !near.is_empty() {
            let named: Vec<String> =
                near.iter().map(|card| format!("{} {}", card.name, Bytes(card.memory_bytes))).collect();
            outln!(
                "note: {} is {}, a little under what cards sold near that size report ({}): to count one as it reports \
                 itself, name it (--capacity {})",
                Bytes(capacity).decimal(),
                Bytes(capacity),
                named.join(", "),
                near[0].name
            );
        }
        if let Some(fit) = &on_device.fit {
            self.print_fit(fit, on_device, &device);
        }
        let under = format!("under {} of {device}", on_device.ceiling);
        match self.fits_under(room) {
            Some(true) => {
                outln!("fits {under}, with {} to spare", Bytes(room - total).decimal());
                return;
            }
            None => {
                outln!(
                    "the training state fits {under}, leaving {} for activations; whether a batch fits depends on \
                     them: give --config, --activations, or the transformer's --layers, --hidden, --heads, --seq-len \
                     and --batch",
                    Bytes(room - total).decimal()
                );
                return;
            }
            Some(false) if total <= room => {
                outln!("does not fit {under}: the training state alone takes all {}", Bytes(room).decimal());
            }
            Some(false) => outln!("does not fit {under}: {} over", Bytes(total - room).decimal()),
        }
        if on_device.remedies.is_empty() {
            outln!("no single change considered here makes it fit");
        } else {
            // counted, not run: said so, and for which device a config's step was counted
            let counted = match self.estimate.step() {
                Some(step) if step.memory.compute == Compute::Cpu => "counted for the CPU",
                Some(_) => "counted for an accelerator",
                None => "counted",
            };
            let pairs = on_device.remedies.iter().any(|remedy| matches!(remedy.change, Change::Both { .. }));
            let which = match pairs {
                true => "each alone, and in pairs where no single change fits on one device",
                false => "each alone",
            };
            outln!("changes, {which}, {counted} (the flags that apply it):");
            for remedy in &on_device.remedies {
                match self.estimate.counts_a_batch() {
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
        if !self.which_gpus && self.fits_under(on_device.limit_bytes) == Some(false) {
            // a larger card is a change too: the smallest named one it fits on as it is
            let fits_on = Accelerator::ALL
                .iter()
                .filter(|card| self.fits_under(self.ceiling.limit_bytes(card.memory_bytes)) == Some(true))
                .min_by_key(|card| card.memory_bytes);
            match fits_on {
                Some(card) => outln!(
                    "as it is, the smallest named card it fits on is {} ({}) under {} (--capacity {}; --which-gpus lists every card)",
                    card.name,
                    Bytes(card.memory_bytes),
                    self.ceiling,
                    card.name
                ),
                None => outln!("as it is, it fits on none of the named cards (--which-gpus lists them)"),
            }
        }
    }

    /// A config's step on the device: the largest batch, the target's split.
    fn print_fit(&self, fit: &StepFit, on_device: &OnDevice, device: &str) {
        match fit.largest_batch {
            0 => outln!(
                "largest batch under {} of {device}: none ({} held whatever the batch and {} a sample at batch 1, \
                 against {})",
                on_device.ceiling,
                Bytes(fit.fixed_bytes).decimal(),
                Bytes(fit.bytes_per_sample_there).decimal(),
                Bytes(on_device.limit_bytes).decimal()
            ),
            largest => outln!(
                "largest batch under {} of {device}: {largest} ({} a sample there)",
                on_device.ceiling,
                Bytes(fit.bytes_per_sample_there).decimal()
            ),
        }
        // about another device than the one counted: said so, and only where
        // it tells something (none fits here: none fits on the CPU either)
        if let Some((largest, factor)) =
            fit.on_the_cpu.filter(|&(cpu, _)| fit.largest_batch > 0 && cpu != fit.largest_batch)
        {
            outln!(
                "  aside, about the CPU rather than this device: `probe` on the CPU (its default) would find batch \
                 {largest}, as candle's CPU matmul widens bf16 products to f32 ({factor:.2}x these bytes beside the \
                 state; --on-cpu counts it)"
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

/// `--config`: the model, or a copy with `--layers` (and the config's own
/// layers then); the length checked against its positions.
fn config_model(args: &EstimateArgs, path: &std::path::Path) -> Result<(Config, Option<usize>), Failure> {
    let with_path = |err: models::Error| Failure::of_config(err, path, &Flags::ESTIMATE);
    let source = crate::hub::resolve(path)?;
    let mut config = Config::from_file(source.path()).map_err(with_path)?;
    crate::hub::remember(source);
    if let Some(unapplied) = config.unapplied() {
        log::warn!("{unapplied}");
    }
    // --layers makes a shallower (or deeper) copy: its parameters and its activations
    let mut layers_of_config = None;
    if let Some(layers) = args.activations.shape.layers {
        layers_of_config = Some(config.layers);
        config = config.with_layers(layers.get()).map_err(with_path)?;
    }
    // the lengths the step runs at: at most the positions, within a sliding window
    if let Some(seq_len) = args.activations.shape.seq_len {
        config.check_seq_len(seq_len.get()).map_err(with_path)?;
    }
    Ok((config, layers_of_config))
}

/// How the config's model trains: the flags made one with probe's
/// ([`config_training`](crate::model::config_training), the one conversion),
/// `--recompute full` its checkpointing.
pub(crate) fn training(args: &EstimateArgs, config: &Config) -> Result<Training, Failure> {
    if args.activations.recompute() == Recompute::Selective {
        return Err(Failure::usage(
            "--recompute selective is the formula's (Korthikanti et al.); a config's model on candle \
             recomputes whole layers: --recompute full",
        ));
    }
    let precision = args.state.precision.asked();
    let flags = crate::model::TrainingFlags {
        seq_len: args.activations.shape.seq_len.map(Count::get),
        seed: None,
        precision,
        checkpointing: match (args.activations.checkpointing.on, args.activations.recompute()) {
            (true, _) => Some("--checkpointing"),
            (false, Recompute::Full) => Some("--recompute full"),
            (false, _) => None,
        },
        ..crate::model::TrainingFlags::of(&args.lora, &args.step, args.base.base.base_dtype)
    };
    let path = args.state.config.path.as_deref().unwrap_or(std::path::Path::new(""));
    crate::model::config_training(config, &flags, path, &Flags::ESTIMATE)
}

/// How what trains is stored: `--precision`, else the library's default
/// (the config's torch_dtype); nothing beside a LoRA base of its own dtype,
/// whose adapters train in f32 (`--precision` is the model's there).
fn precision(args: &EstimateArgs, own_base: bool) -> Result<Option<Precision>, Failure> {
    match (own_base, args.state.precision.asked()) {
        (true, Some(Precision::Mixed)) => Err(Failure::usage(
            "--precision mixed keeps f32 masters of bf16 variables; with --base-dtype the adapters are f32 already: drop one of them",
        )),
        (true, _) => Ok(None),
        (false, precision) => Ok(precision),
    }
}

impl Counted {
    /// `--which-gpus`: every named card, whether the total per device fits
    /// under the ceiling of it (or, activations not counted, leaves them room).
    fn print_which_gpus(&self) {
        let total = self.estimate.total_bytes();
        let verdicts: Vec<(&Accelerator, u64, Option<bool>)> = Accelerator::ALL
            .iter()
            .map(|card| {
                let limit = self.ceiling.limit_bytes(card.memory_bytes);
                (card, limit, self.fits_under(limit))
            })
            .collect();
        // where a batch fits, or (activations not counted) where the state leaves them room
        let (wanted, word) = match self.estimate.counts_a_batch() {
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
            false if self.estimate.counts_a_batch() => outln!("{word}: {} ({under})", fitting.join(", ")),
            false => outln!("{word}: {} ({under}; activations not counted)", fitting.join(", ")),
        }
        for (card, limit, fits) in verdicts {
            let verdict = match fits {
                Some(true) => format!("fits, {} to spare", Bytes(limit - total).decimal()),
                None => format!("leaves {} for activations", Bytes(limit - total).decimal()),
                Some(false) if total <= limit => "the state alone takes it all".to_owned(),
                Some(false) => format!("{} over", Bytes(total - limit).decimal()),
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
/// are given (never both).
fn activations(args: &EstimateArgs) -> Result<Activations, Failure> {
    let recompute = args.activations.recompute();
    match transformer_shape(&args.activations, args.sharding.tensor_parallel.get())? {
        Some(shape) => Ok(Activations::Transformer { shape, recompute }),
        None if recompute != Recompute::None => Err(Failure::usage(
            "--recompute needs the transformer's --layers, --hidden, --heads, --seq-len and --batch",
        )),
        None => Ok(args.activations.bytes.map_or(Activations::Unknown, Activations::Bytes)),
    }
}

/// The transformer the five sizes describe, when any is given (then all
/// must be, and not `--activations` too).
fn transformer_shape(given: &ActivationArgs, tensor_parallel: usize) -> Result<Option<TransformerShape>, Failure> {
    let sizes = [given.shape.layers, given.hidden, given.shape.heads, given.shape.seq_len, given.batch.size]
        .map(|size| size.map(Count::get));
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

/// A mixture of experts' counts: its parameters, those in the experts and
/// those a token passes through, and a sample's bytes at the worst routing
/// (what the estimate counts, as the probe measures it) and routed evenly.
struct ExpertsCounted {
    count: usize,
    per_token: usize,
    parameters: u64,
    in_experts: u64,
    active: u64,
    worst_bytes_per_sample: u64,
    balanced_bytes_per_sample: Option<u64>,
}

impl ExpertsCounted {
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "experts": self.count,
            "experts_per_token": self.per_token,
            "parameters": self.parameters,
            "expert_parameters": self.in_experts,
            "active_parameters": self.active,
            "routing": "worst",
            "bytes_per_sample": self.worst_bytes_per_sample,
            "balanced_bytes_per_sample": self.balanced_bytes_per_sample,
        })
    }
}

fn experts_counted(step: &autobatch_models::estimate::StepEstimate) -> Option<ExpertsCounted> {
    let experts = step.config.experts.as_ref()?;
    let (in_experts, active) = step.config.expert_parameter_counts();
    let balanced = step.training.clone().routing(autobatch_models::Routing::Router);
    Some(ExpertsCounted {
        count: experts.count,
        per_token: experts.per_token,
        parameters: step.config.parameter_count(),
        in_experts,
        active,
        worst_bytes_per_sample: step.bytes_per_sample,
        balanced_bytes_per_sample: step
            .config
            .step_memory(&balanced, step.memory.compute)
            .ok()
            .map(|memory| memory.bytes_per_sample()),
    })
}

/// A mixture of experts in words: what is counted of it, and at which routing.
fn experts_said(step: &autobatch_models::estimate::StepEstimate) -> Option<String> {
    let counted = experts_counted(step)?;
    let share = counted.in_experts as f64 / counted.parameters.max(1) as f64 * 100.0;
    let balanced = match counted.balanced_bytes_per_sample {
        Some(bytes) => format!(", {} routed evenly", Bytes(bytes)),
        None => String::new(),
    };
    Some(format!(
        "a mixture of {} experts, {} a token: {} parameters, {:.1}% in the experts, {} active a token; \
         a sample's bytes counted at the worst routing (every token to the same {} experts, as the probe \
         measures): {}{balanced}",
        counted.count,
        counted.per_token,
        counted.parameters,
        share,
        counted.active,
        counted.per_token,
        Bytes(counted.worst_bytes_per_sample)
    ))
}
