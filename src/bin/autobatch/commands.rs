//! `autobatch estimate` and `autobatch plan`: arithmetic, no device.

use autobatch::estimate::{remedies, OptimizerKind, Precision, StaticMemory};
use autobatch::{format_bytes, format_bytes_decimal, plan_accumulation_aligned};

use crate::args::{EstimateArgs, OptimizerArg, PlanArgs, PrecisionArg};
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
    let activations = size("--activations", &args.activations)?.unwrap_or(0);
    let state = StaticMemory::new(parameters, precision, optimizer)?;
    let total = state.total_with(activations)?;
    let advice = match capacity {
        Some(capacity) => remedies(&state, activations, capacity)?,
        None => Vec::new(),
    };

    if args.json {
        let json = serde_json::json!({
            "state": state,
            "activation_bytes": activations,
            "total_bytes": total,
            "capacity_bytes": capacity,
            "fits": capacity.map(|c| total <= c),
            "remedies": advice,
        });
        println!("{}", serde_json::to_string_pretty(&json).expect("plain values serialize"));
        return Ok(());
    }

    println!(
        "training state of {parameters:.3e} parameters ({}, {} optimizer){}",
        precision.name(),
        optimizer.name(),
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

pub fn plan(args: &PlanArgs) -> Result<(), Failure> {
    if args.largest < args.multiple_of {
        return Err(Failure::usage(format!(
            "--largest {} is below --multiple-of {}: no micro-batch that is a multiple of {} fits; \
             lower --multiple-of to at most {}",
            args.largest, args.multiple_of, args.multiple_of, args.largest
        )));
    }
    let mut split = plan_accumulation_aligned(args.target, args.world_size, args.largest, args.multiple_of)?;
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
