//! `autobatch estimate` and `autobatch plan`: arithmetic, no device.

use autobatch::estimate::{
    remedies_sharded, OptimizerKind, Precision, Recompute, Sharding, StaticMemory, TransformerShape,
    CANDLE_F32_ACTIVATION_RATIO,
};
use autobatch::{format_bytes, format_bytes_decimal, plan_accumulation_aligned};

use crate::args::{EstimateArgs, OptimizerArg, PlanArgs, PrecisionArg, RecomputeArg};
use crate::failure::Failure;
use crate::parse::{parse_bytes, parse_count};

pub fn estimate(args: &EstimateArgs) -> Result<(), Failure> {
    let parameters = parse_count(&args.params).map_err(|err| Failure::usage(format!("--params: {err}")))?;
    if parameters == 0 {
        return Err(Failure::usage("--params is 0: give the number of trainable parameters, e.g. 125M"));
    }
    let precision = match (args.mixed_precision, args.dtype) {
        (true, _) => Precision::Mixed,
        (false, PrecisionArg::F32) => Precision::Fp32,
        (false, PrecisionArg::Bf16) => Precision::Bf16,
    };
    let optimizer = match args.optimizer {
        OptimizerArg::Sgd => OptimizerKind::Sgd,
        OptimizerArg::Momentum => OptimizerKind::Momentum,
        OptimizerArg::Adamw => OptimizerKind::AdamW,
        OptimizerArg::Adafactor => OptimizerKind::Adafactor,
        OptimizerArg::Adam8bit => OptimizerKind::Adam8bit,
        OptimizerArg::Lion => OptimizerKind::Lion,
    };
    let size = |flag: &str, text: &Option<String>| {
        text.as_deref().map(parse_bytes).transpose().map_err(|err| Failure::usage(format!("{flag}: {err}")))
    };
    let capacity = size("--capacity", &args.capacity)?;
    let sharding = Sharding::new(args.zero, args.ranks as u64, args.tensor_parallel as u64)?;
    if args.zero > 0 && args.ranks == 1 {
        return Err(Failure::usage(format!("--zero {} partitions over --ranks: give more than 1 rank", args.zero)));
    }
    let (activations, candle) = activation_bytes(args, &sharding)?;
    let model = StaticMemory::new(parameters, precision, optimizer)?;
    let state = model.per_device(&sharding);
    let total = state.total_with(activations)?;
    let advice = match capacity {
        Some(capacity) => remedies_sharded(&model, &sharding, activations, capacity)?,
        None => Vec::new(),
    };

    if args.json {
        let json = serde_json::json!({
            "sharding": sharding,
            "state": state,
            "activation_bytes": activations,
            "candle_f32_activation_bytes": candle,
            "total_bytes": total,
            "capacity_bytes": capacity,
            "fits": capacity.map(|c| total <= c),
            "remedies": advice,
        });
        println!("{}", serde_json::to_string_pretty(&json).expect("plain values serialize"));
        return Ok(());
    }

    println!(
        "training state of {parameters:.3e} parameters ({}, {} optimizer){}{}",
        precision.name(),
        optimizer.name(),
        describe_sharding(&sharding),
        if activations > 0 { "" } else { ", before activations" }
    );
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
    rows.push(("total", total));
    for (name, bytes) in rows {
        println!("  {name:<17} {:>10}  {:>6.2} B/param", format_bytes_decimal(bytes), per_parameter(bytes));
    }
    if let Some(candle) = candle {
        println!(
            "  (a candle f32 step keeps up to {CANDLE_F32_ACTIVATION_RATIO}× the f32 formula, measured: ~{} of activations; \
             docs/activations.md)",
            format_bytes_decimal(candle)
        );
    }
    if let Some(capacity) = capacity {
        let device = format!("{} ({})", format_bytes(capacity), format_bytes_decimal(capacity));
        if total <= capacity {
            println!("fits in {device}, with {} to spare", format_bytes_decimal(capacity - total));
        } else {
            println!("does not fit in {device}: {} over", format_bytes_decimal(total - capacity));
            if advice.is_empty() {
                println!("no single change considered here makes it fit");
            } else {
                println!("changes, each alone:");
                for remedy in &advice {
                    println!("  {remedy}");
                }
            }
        }
    }
    Ok(())
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

/// `--activations`, or the transformer activation model when its five sizes
/// are given (never both); with the model, also what a candle f32 step keeps
/// by the measured ratio.
fn activation_bytes(args: &EstimateArgs, sharding: &Sharding) -> Result<(u64, Option<u64>), Failure> {
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
        return Ok((given.map_err(|err| Failure::usage(format!("--activations: {err}")))?.unwrap_or(0), None));
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
    let candle = match (recompute, sharding.tensor_parallel) {
        (Recompute::None, 1) => Some(shape.candle_f32_activation_bytes()?),
        _ => None, // measured without recomputation or tensor parallelism only
    };
    Ok((shape.activation_bytes(sharding.tensor_parallel, recompute)?, candle))
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
    let mut split = plan_accumulation_aligned(args.target, args.world_size, largest, args.multiple_of)?;
    if args.exact {
        split = split.require_exact()?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&split).expect("plain values serialize"));
    } else {
        println!("{split}");
    }
    Ok(())
}

/// `plan --uneven 200,90`: the target shared among ranks of uneven capacity.
fn plan_uneven(args: &PlanArgs) -> Result<(), Failure> {
    if let Some(rank) = args.uneven.iter().position(|&largest| largest < args.multiple_of) {
        return Err(Failure::usage(format!(
            "--uneven: rank {rank}'s largest micro-batch {} is below --multiple-of {}: it cannot take one",
            args.uneven[rank], args.multiple_of
        )));
    }
    let split = autobatch::plan_ranks(args.target, &args.uneven, args.multiple_of)?;
    if args.exact && !split.exact {
        return Err(autobatch::Error::InexactGlobalBatch {
            target: args.target,
            multiple_of: args.multiple_of,
            nearest: split.global_batch,
        }
        .into());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&split).expect("plain values serialize"));
    } else {
        println!("{split}");
    }
    Ok(())
}
