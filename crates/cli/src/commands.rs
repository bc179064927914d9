//! `autobatch estimate` and `autobatch plan`: arithmetic, no device.

use autobatch::estimate::{
    Accelerator, Change, OptimizerKind, Precision, Recompute, Setup, Sharding, TransformerShape,
};
use autobatch::{Accumulation, Bytes};

use crate::args::{EstimateArgs, OptimizerArg, PlanArgs, PrecisionArg, RecomputeArg};
use crate::failure::{Failure, Flags};
use crate::parse::{parse_bytes, parse_count};
use crate::step::Step;

pub fn estimate(args: &EstimateArgs) -> Result<(), Failure> {
    if let (true, Some(path)) = (args.serve, &args.config) {
        let capacity = args.capacity.as_deref().map(parse_capacity).transpose()?.map(|(bytes, _)| bytes);
        return crate::serve::estimate(path, &args.serving, capacity, args.ceiling, args.on_cpu, args.json);
    }
    if args.serving != crate::serve::ServingArgs::default() {
        return Err(Failure::usage(
            "--max-model-len, --max-num-batched-tokens, --block-size, --weights and --kv-cache-dtype count serving: add --serve",
        ));
    }
    let mut layers_of_config = None;
    let config = match &args.config {
        Some(path) => {
            let with_path = |err: autobatch::Error| Failure::of_config(err, path, &Flags::ESTIMATE);
            let mut config = autobatch_models::Config::from_file(path).map_err(with_path)?;
            if let Some(unapplied) = config.unapplied() {
                log::warn!("{unapplied}");
            }
            // --layers makes a shallower (or deeper) copy: its parameters and its activations
            if let Some(layers) = args.layers {
                layers_of_config = Some(config.layers);
                config = config.with_layers(layers).map_err(with_path)?;
            }
            // the lengths the probe steps at: at most the positions, within a sliding window
            if let Some(seq_len) = args.seq_len {
                config.check_seq_len(seq_len).map_err(with_path)?;
            }
            Some(config)
        }
        None => None,
    };
    let lora = match (&config, args.lora) {
        (Some(config), Some(rank)) => Some(lora_training(args, config, rank)?),
        _ => None,
    };
    let parameters = match (&config, &args.params) {
        (Some(config), _) => match &lora {
            Some((_, footprint, _)) => footprint.parameters,
            None => config.parameter_count(),
        },
        (None, Some(params)) => parse_count(params).map_err(|err| Failure::usage(format!("--params: {err}")))?,
        (None, None) => return Err(Failure::usage("give --params N or --config path/to/config.json")),
    };
    if parameters == 0 {
        return Err(Failure::usage("--params is 0: give the number of trainable parameters, e.g. 125M"));
    }
    // the config's torch_dtype, unless --dtype (or --mixed-precision) says otherwise
    let from_config = config.as_ref().filter(|_| !args.mixed_precision).map(|config| match config.dtype {
        candle_core::DType::BF16 => PrecisionArg::Bf16,
        _ => PrecisionArg::F32,
    });
    // adapters beside a base of its own dtype are f32
    let from_config = match lora.as_ref().and_then(|(training, _, _)| training.lora.as_ref()?.base) {
        Some(_) if args.mixed_precision => {
            return Err(Failure::usage(
                "--mixed-precision keeps f32 masters of bf16 variables; with --base-dtype the adapters are f32 already: drop one of them",
            ))
        }
        Some(_) => Some(PrecisionArg::F32),
        None => from_config,
    };
    let precision = match (args.mixed_precision, args.dtype.filter(|_| args.base_dtype.is_none()).or(from_config)) {
        (true, Some(dtype)) => {
            return Err(Failure::usage(format!(
                "--mixed-precision keeps bf16 weights and gradients with f32 master weights: --dtype {} does not \
                 apply; drop one of them",
                if dtype == PrecisionArg::F32 { "f32" } else { "bf16" }
            )))
        }
        (true, None) => Precision::Mixed,
        (false, None | Some(PrecisionArg::F32)) => Precision::Fp32,
        (false, Some(PrecisionArg::Bf16)) => Precision::Bf16,
    };
    let optimizer = match args.optimizer {
        OptimizerArg::Sgd => OptimizerKind::Sgd,
        OptimizerArg::Momentum => OptimizerKind::Momentum,
        OptimizerArg::Adamw => OptimizerKind::AdamW,
        OptimizerArg::Adafactor => OptimizerKind::Adafactor,
        OptimizerArg::Adam8bit => OptimizerKind::Adam8bit,
        OptimizerArg::Lion => OptimizerKind::Lion,
    };
    let capacity = args.capacity.as_deref().map(parse_capacity).transpose()?;
    let (capacity, card) = (capacity.map(|(bytes, _)| bytes), capacity.and_then(|(_, card)| card));
    if capacity == Some(0) {
        return Err(Failure::usage("--capacity is 0: give the device's memory, e.g. 80GB or 24GiB"));
    }
    let sharding = Sharding::new(args.zero, args.ranks as u64, args.tensor_parallel as u64)?;
    if args.zero > 0 && args.ranks == 1 {
        return Err(Failure::usage(format!("--zero {} partitions over --ranks: give more than 1 rank", args.zero)));
    }
    let frozen = lora.as_ref().map_or(0, |(_, _, frozen)| *frozen);
    let setup = Setup::new(parameters, precision, optimizer).sharded(sharding).frozen(frozen);
    // a LoRA base of its own dtype: the adapters (what trains) are f32, the
    // activations in the model's dtype, as the probe measures them
    let activation_precision = match (&config, &lora) {
        (Some(config), Some((training, _, _))) if args.base_dtype.is_some() => {
            match config.model_dtype(training).map_err(|err| Failure::in_flags(err, &Flags::ESTIMATE))? {
                candle_core::DType::BF16 => Some(Precision::Bf16),
                _ => Some(Precision::Fp32),
            }
        }
        _ => None,
    };
    // a config's model: its whole candle step counted; otherwise the formula's activations
    let step = match &config {
        Some(config) => Some(Step::new(args, config, lora.as_ref().map(|(training, _, _)| training.clone()))?),
        None => None,
    };
    let setup = match &step {
        Some(step) => {
            if args.activations.is_some() {
                return Err(Failure::usage("--activations and --config both say the activations: give one"));
            }
            // the chunked loss's one chunk is held whatever the batch
            setup.activations(step.activation_bytes()?).other(step.config.loss_chunk_bytes(&step.training))
        }
        None => with_activations(args, setup, activation_precision)?,
    };
    let state = setup.state()?;
    let activations = setup.all_activation_bytes()?;
    let total = setup.total()?;
    // what a step may hold: with a config's step, the ceiling's share of the
    // capacity (as the probe counts it); the formula's total, the whole capacity
    let room = match (&step, capacity) {
        (Some(_), Some(capacity)) => Some(args.ceiling.limit_bytes(capacity)),
        _ => capacity,
    };
    let mut advice = match (room, &step) {
        (Some(room), Some(step)) => step.remedies(&setup, room, setup.remedies(room)?)?,
        (Some(room), None) => setup.remedies(room)?,
        (None, _) => Vec::new(),
    };
    // the largest batch under the ceiling, and the target's split from it
    let fit = match (&step, capacity) {
        (Some(step), Some(capacity)) => {
            let fixed = setup.clone().activations(0).total()?;
            Some(step.fit(fixed, capacity, args.ceiling, args.target_effective_batch, args.ranks)?)
        }
        _ => None,
    };
    // with --base-dtype the adapters are f32 whatever --dtype says: no precision advice
    if args.base_dtype.is_some() {
        advice.retain(|remedy| !matches!(remedy.change, Change::Precision { .. }));
    }

    if args.json {
        let json = serde_json::json!({
            "sharding": sharding,
            "state": state,
            "activation_bytes": activations,
            "bytes_per_sample": step.as_ref().map(|step| step.bytes_per_sample),
            "batch": step.as_ref().map(|step| step.batch),
            "frozen_bytes": frozen,
            "total_bytes": total,
            "capacity_bytes": capacity,
            "fits": room.map(|room| total <= room),
            "remedies": advice.iter().map(|remedy| {
                let mut row = serde_json::to_value(remedy).expect("plain values serialize");
                row["flag"] = change_flag(&remedy.change).into();
                row
            }).collect::<Vec<_>>(),
        });
        let mut json = json;
        if let Some(card) = card {
            json["capacity_name"] = card.name.into();
        }
        if let Some(fit) = &fit {
            json["ceiling"] = fit.ceiling.fraction().into();
            json["limit_bytes"] = fit.limit_bytes.into();
            json["fixed_bytes"] = fit.fixed_bytes.into();
            json["largest_batch"] = fit.largest_batch.into();
            if let Some(split) = &fit.split {
                json["split"] = serde_json::to_value(split).expect("plain values serialize");
            }
        }
        if args.which_gpus {
            json["which_gpus"] = Accelerator::ALL
                .iter()
                .map(|card| {
                    serde_json::json!({
                        "name": card.name,
                        "description": card.description,
                        "memory_bytes": card.memory_bytes,
                        "fits": total <= card.memory_bytes,
                    })
                })
                .collect::<Vec<_>>()
                .into();
        }
        println!("{}", serde_json::to_string_pretty(&json).expect("plain values serialize"));
        return Ok(());
    }

    println!(
        "training state of {parameters:.3e} parameters ({}, {} optimizer){}{}",
        precision.name(),
        optimizer.name(),
        describe_sharding(&sharding),
        match &step {
            Some(step) => format!(", at batch {}", step.batch),
            None if activations > 0 => String::new(),
            None => ", before activations".to_owned(),
        }
    );
    if let Some(step) = &step {
        println!("  {}", step.describe());
    }
    if let (Some(config), Some(of)) = (&config, layers_of_config) {
        println!(
            "  a copy of the config with {} of its {of} layers (--layers): parameters and activations",
            config.layers
        );
    }
    if let (Some(config), Some((training, _, _))) = (&config, &lora) {
        println!("  {}: {} frozen parameters", config.describe(training), config.parameter_count());
    }
    let per_parameter = |bytes: u64| bytes as f64 / parameters as f64;
    let mut rows = vec![
        ("weights", state.weights),
        ("gradients", state.gradients),
        ("optimizer states", state.optimizer_states),
        ("master weights", state.master_weights),
    ];
    if activations > 0 {
        rows.push(("activations", activations));
    }
    if setup.other_bytes > 0 {
        rows.push(("loss chunk", setup.other_bytes));
    }
    if let (Some(config), true) = (&config, frozen > 0) {
        // per frozen parameter: the base's own dtype
        let per_frozen = frozen as f64 / config.parameter_count() as f64;
        println!("  {:<17} {:>10}  {per_frozen:>6.2} B/frozen param", "frozen base", Bytes(frozen).decimal());
    }
    rows.push(("total", total));
    for (name, bytes) in rows {
        println!("  {name:<17} {:>10}  {:>6.2} B/param", Bytes(bytes).decimal(), per_parameter(bytes));
    }
    if args.which_gpus {
        print_which_gpus(total);
    }
    if let Some(capacity) = capacity {
        let bytes = format!("{} ({})", Bytes(capacity), Bytes(capacity).decimal());
        let device = match card {
            Some(card) => {
                format!("{} (reports {}, {})", card.name, Bytes(capacity), Bytes(capacity).decimal())
            }
            None => bytes,
        };
        let (room, under) = match &fit {
            Some(fit) => {
                match fit.largest_batch {
                    0 => println!(
                        "largest batch under {} of {device}: none ({} held whatever the batch and {} a sample, \
                         against {})",
                        fit.ceiling,
                        Bytes(fit.fixed_bytes).decimal(),
                        Bytes(step.as_ref().map_or(0, |step| step.bytes_per_sample)).decimal(),
                        Bytes(fit.limit_bytes).decimal()
                    ),
                    largest => println!("largest batch under {} of {device}: {largest}", fit.ceiling),
                }
                if let Some(split) = &fit.split {
                    println!("plan: {split}");
                }
                (fit.limit_bytes, format!("under {} of {device}", fit.ceiling))
            }
            None => (capacity, format!("in {device}")),
        };
        if total <= room {
            println!("fits {under}, with {} to spare", Bytes(room - total).decimal());
        } else {
            println!("does not fit {under}: {} over", Bytes(total - room).decimal());
            if advice.is_empty() {
                println!("no single change considered here makes it fit");
            } else {
                println!("changes, each alone (the flag that applies it):");
                for remedy in &advice {
                    println!("  {} ({})", remedy.decimal(), change_flag(&remedy.change));
                }
            }
        }
    }
    Ok(())
}

/// `--lora`: the LoRA training of the config the flags describe, its
/// footprint (the adapters that train) and its frozen base's bytes.
fn lora_training(
    args: &EstimateArgs,
    config: &autobatch_models::Config,
    rank: usize,
) -> Result<(autobatch_models::Training, autobatch_models::trainer::Footprint, u64), Failure> {
    use autobatch_models::{Lora, Training};
    let mut lora = Lora::new(rank, config.family.lora_targets());
    if !args.lora_targets.is_empty() {
        lora.targets = args.lora_targets.clone();
    }
    if let Some(base) = args.base_dtype {
        lora = lora.base(base);
    }
    let mut training = Training::new(args.seq_len.unwrap_or_else(|| config.max_positions.min(512))).lora(lora);
    training.dtype = match args.dtype {
        Some(PrecisionArg::F32) => Some(candle_core::DType::F32),
        Some(PrecisionArg::Bf16) => Some(candle_core::DType::BF16),
        None => None,
    };
    let path = args.config.as_deref().unwrap_or(std::path::Path::new(""));
    let with_path = |err: autobatch::Error| Failure::of_config(err, path, &Flags::ESTIMATE);
    let footprint = config.footprint(&training).map_err(with_path)?;
    let frozen = config.frozen_bytes(&training).map_err(with_path)?;
    Ok((training, footprint, frozen))
}

/// `--capacity`: a size (`80GB`, `24GiB`) or a card's name (`h100`), with the card.
fn parse_capacity(text: &str) -> Result<(u64, Option<&'static Accelerator>), Failure> {
    let bare_number = !text.trim().is_empty() && text.trim().bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if bare_number {
        let card = match Accelerator::nearest(text) {
            Some(card) => format!("did you mean {} ({})? ", card.name, card.description),
            None => String::new(),
        };
        return Err(Failure::usage(format!(
            "--capacity {}: a number without a unit; {card}give a card's name, or the memory with its unit \
             (e.g. 80GB or 24GiB)",
            text.trim(),
        )));
    }
    if text.trim_start().starts_with(|c: char| c.is_ascii_digit() || c == '.' || c == '-' || c == '+') {
        let bytes = parse_bytes(text).map_err(|err| Failure::usage(format!("--capacity: {err}")))?;
        return Ok((bytes, None));
    }
    let card = Accelerator::named(text)?;
    Ok((card.memory_bytes, Some(card)))
}

/// `--which-gpus`: every named card, whether `total` bytes per device fit on it.
fn print_which_gpus(total: u64) {
    let fitting: Vec<&str> =
        Accelerator::ALL.iter().filter(|card| total <= card.memory_bytes).map(|card| card.name).collect();
    if fitting.is_empty() {
        println!(
            "fits on none of the named cards (the largest reports {})",
            Bytes(Accelerator::ALL.last().map_or(0, |c| c.memory_bytes))
        );
    } else {
        println!("fits on: {}", fitting.join(", "));
    }
    for card in Accelerator::ALL {
        let verdict = if total <= card.memory_bytes {
            format!("fits, {} to spare", Bytes(card.memory_bytes - total).decimal())
        } else {
            format!("{} over", Bytes(total - card.memory_bytes).decimal())
        };
        println!("  {:<10} {:>10}  {:<30} {verdict}", card.name, Bytes(card.memory_bytes), card.description);
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
    if parts.is_empty() {
        String::new()
    } else {
        format!(", per device: {}", parts.join(", "))
    }
}

/// The `estimate` flag that makes `change`.
fn change_flag(change: &Change) -> String {
    match change {
        Change::Precision { to: Precision::Mixed } => "--mixed-precision".to_owned(),
        Change::Precision { to } => format!("--dtype {}", if *to == Precision::Fp32 { "f32" } else { "bf16" }),
        Change::Optimizer { to } => format!("--optimizer {}", to.name()),
        Change::GradientCheckpointing => "--recompute full".to_owned(),
        Change::SequenceLength { seq_len } => format!("--seq-len {seq_len}"),
        Change::Zero { stage, .. } => format!("--zero {stage}"),
        other => other.to_string(),
    }
}

/// `--activations`, or the transformer activation model when its five sizes
/// are given (never both), at the precision training uses; with the model, also
/// what a candle f32 step keeps by the measured ratio.
fn with_activations(
    args: &EstimateArgs,
    setup: Setup,
    activation_precision: Option<Precision>,
) -> Result<Setup, Failure> {
    let sizes = [args.layers, args.hidden, args.heads, args.seq_len, args.batch];
    let named = ["--layers", "--hidden", "--heads", "--seq-len", "--batch"];
    let given: Vec<&str> = named.iter().zip(sizes).filter(|(_, v)| v.is_some()).map(|(n, _)| *n).collect();
    if given.is_empty() {
        if args.recompute != RecomputeArg::None {
            return Err(Failure::usage(
                "--recompute needs the transformer's --layers, --hidden, --heads, --seq-len and --batch",
            ));
        }
        let given = args.activations.as_deref().map(crate::parse::parse_bytes).transpose();
        let bytes = given.map_err(|err| Failure::usage(format!("--activations: {err}")))?.unwrap_or(0);
        return Ok(setup.activations(bytes));
    }
    if args.activations.is_some() {
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
    let tensor_parallel = args.tensor_parallel;
    if heads % tensor_parallel != 0 {
        return Err(Failure::usage(format!(
            "--tensor-parallel {tensor_parallel} does not divide --heads {heads}: each device takes whole heads"
        )));
    }
    let shape = TransformerShape {
        layers: layers as u64,
        hidden: hidden as u64,
        heads: heads as u64,
        seq_len: seq_len as u64,
        batch: batch as u64,
    };
    let recompute = match args.recompute {
        RecomputeArg::None => Recompute::None,
        RecomputeArg::Selective => Recompute::Selective,
        RecomputeArg::Full => Recompute::Full,
    };
    match activation_precision.filter(|precision| *precision != setup.precision) {
        Some(precision) => {
            let at_model_dtype = Setup::new(setup.parameters, precision, setup.optimizer)
                .sharded(setup.sharding)
                .transformer(shape, recompute)?
                .all_activation_bytes()?;
            Ok(setup.measured_transformer(at_model_dtype, shape, recompute)?)
        }
        None => Ok(setup.transformer(shape, recompute)?),
    }
}

pub fn plan(args: &PlanArgs) -> Result<(), Failure> {
    let Some(largest) = args.largest else { return plan_uneven(args) };
    if largest < args.multiple_of {
        return Err(Failure::usage(format!(
            "--largest {} is below --multiple-of {}: no micro-batch that is a multiple of {} fits; \
             lower --multiple-of to at most {}",
            largest, args.multiple_of, args.multiple_of, largest
        )));
    }
    let planned = Accumulation::plan_aligned(args.target, args.world_size, largest, args.multiple_of);
    let mut split = planned.map_err(|err| plan_error(err, "--world-size"))?;
    if args.exact {
        split = split.require_exact().map_err(|err| plan_error(err, "--world-size"))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&split).expect("plain values serialize"));
    } else {
        println!("{split}");
    }
    Ok(())
}

/// `plan`'s errors in its own flags (`ranks`: `--world-size`, or `--uneven`
/// with one number per rank).
fn plan_error(err: autobatch::Error, ranks: &'static str) -> Failure {
    Failure::in_flags(err, &Flags { target: "--target", ranks, largest: "--largest", ..Flags::PROBE })
}

/// `plan --uneven 200,90`: the target shared among ranks of uneven capacity.
fn plan_uneven(args: &PlanArgs) -> Result<(), Failure> {
    if let Some(rank) = args.uneven.iter().position(|&largest| largest < args.multiple_of) {
        return Err(Failure::usage(format!(
            "--uneven: rank {rank}'s largest micro-batch {} is below --multiple-of {}: it cannot take one",
            args.uneven[rank], args.multiple_of
        )));
    }
    let mut split = autobatch::RankSplit::plan(args.target, &args.uneven, args.multiple_of)
        .map_err(|err| plan_error(err, "--uneven"))?;
    if args.exact {
        split = split.require_exact().map_err(|err| plan_error(err, "--uneven"))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&split).expect("plain values serialize"));
    } else {
        println!("{split}");
    }
    Ok(())
}
