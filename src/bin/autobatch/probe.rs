//! `autobatch probe`: tune a built-in reference model on a device.

use autobatch::workloads::{ConvNetConfig, MlpConfig, ReferenceWorkload, TransformerConfig};
use autobatch::{format_bytes, parse_bytes, HeapMeter, MemoryMeter, Strategy, Tuner};
use candle_core::DType;

use crate::args::{DtypeArg, ModelKind, ProbeArgs, StrategyArg};
use crate::failure::Failure;
use crate::progress::Progress;

/// Where to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeviceSpec {
    Cpu,
    Cuda(usize),
}

fn parse_device(text: &str) -> Result<DeviceSpec, Failure> {
    let invalid = || Failure::usage(format!("invalid device {text:?}: use cpu, cuda or cuda:N (N a GPU ordinal)"));
    match text {
        "cpu" => Ok(DeviceSpec::Cpu),
        "cuda" => Ok(DeviceSpec::Cuda(0)),
        other => match other.strip_prefix("cuda:") {
            Some(ordinal) => ordinal.parse().map(DeviceSpec::Cuda).map_err(|_| invalid()),
            None => Err(invalid()),
        },
    }
}

/// Size flags and the models they apply to.
fn check_size_flags(args: &ProbeArgs) -> Result<(), Failure> {
    use ModelKind::*;
    let flags: [(&str, bool, &[ModelKind]); 11] = [
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

fn model_name(model: ModelKind) -> &'static str {
    match model {
        ModelKind::Transformer => "transformer",
        ModelKind::Mlp => "mlp",
        ModelKind::Convnet => "convnet",
    }
}

fn build_workload(args: &ProbeArgs, device: &candle_core::Device) -> Result<Box<dyn ReferenceWorkload>, Failure> {
    let dtype = match args.dtype {
        DtypeArg::F32 => DType::F32,
        DtypeArg::Bf16 => DType::BF16,
    };
    let seed = args.seed;
    Ok(match args.model {
        ModelKind::Transformer => {
            let d = TransformerConfig::default();
            let config = TransformerConfig {
                vocab: args.vocab.unwrap_or(d.vocab),
                d_model: args.d_model.unwrap_or(d.d_model),
                heads: args.heads.unwrap_or(d.heads),
                layers: args.layers.unwrap_or(d.layers),
                seq_len: args.seq_len.unwrap_or(d.seq_len),
                dtype,
                seed,
            };
            Box::new(config.build(device)?)
        }
        ModelKind::Mlp => {
            let d = MlpConfig::default();
            let config = MlpConfig {
                inputs: args.inputs.unwrap_or(d.inputs),
                width: args.width.unwrap_or(d.width),
                depth: args.depth.unwrap_or(d.depth),
                classes: args.classes.unwrap_or(d.classes),
                dtype,
                seed,
            };
            Box::new(config.build(device)?)
        }
        ModelKind::Convnet => {
            let d = ConvNetConfig::default();
            let config = ConvNetConfig {
                channels: args.channels.unwrap_or(d.channels),
                resolution: args.resolution.unwrap_or(d.resolution),
                classes: args.classes.unwrap_or(d.classes),
                dtype,
                seed,
                ..d
            };
            Box::new(config.build(device)?)
        }
    })
}

fn tuner(args: &ProbeArgs) -> Tuner {
    let mut tuner = Tuner::new()
        .ceiling(args.ceiling)
        .start(args.start)
        .multiple_of(args.multiple_of)
        .steps_per_trial(args.steps_per_trial)
        .world_size(args.world_size)
        .exact_effective_batch(args.exact)
        .strategy(match args.strategy {
            StrategyArg::Binary => Strategy::Binary,
            StrategyArg::Power => Strategy::Power,
        });
    if let Some(max_batch) = args.max_batch {
        tuner = tuner.max_batch(max_batch);
    }
    if let Some(max_trials) = args.max_trials {
        tuner = tuner.max_trials(max_trials);
    }
    if let Some(target) = args.target_effective_batch {
        tuner = tuner.target_effective_batch(target);
    }
    if let Some(path) = &args.cache {
        tuner = tuner.cache(path);
    }
    tuner
}

/// A quarter of the available RAM: the over-budget trial of a doubling search
/// allocates up to about twice the budget, which then stays under half of it.
fn default_budget() -> Result<(u64, String), Failure> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| Failure::usage(format!("cannot read /proc/meminfo for a default budget ({e}): pass --budget")))?;
    let available_kib = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| Failure::usage("no MemAvailable in /proc/meminfo for a default budget: pass --budget"))?;
    let available = available_kib * 1024;
    Ok((available / 4, format!("a quarter of the {} of RAM available; set --budget", format_bytes(available))))
}

pub fn run(args: &ProbeArgs, embedded_budget: Option<u64>) -> Result<(), Failure> {
    check_size_flags(args)?;
    let tuner = tuner(args);
    tuner.check()?;
    let say = |line: &str| if args.json { eprintln!("{line}") } else { println!("{line}") };

    match parse_device(&args.device)? {
        DeviceSpec::Cpu => {
            let (budget, why) = match (&args.budget, embedded_budget) {
                (Some(text), _) => (parse_bytes(text)?, "--budget".to_owned()),
                (None, Some(budget)) => (budget, "the embedded default; set --budget".to_owned()),
                (None, None) => default_budget()?,
            };
            let mut meter = HeapMeter::new(budget)?;
            let mut workload = build_workload(args, &candle_core::Device::Cpu)?;
            say(&format!(
                "probing {} ({} parameters) on the CPU under a {} budget ({why})",
                workload.description(),
                workload.parameter_count(),
                format_bytes(budget)
            ));
            tune(args, &tuner, &mut *workload, &mut meter)
        }
        DeviceSpec::Cuda(ordinal) => {
            if args.budget.is_some() {
                return Err(Failure::usage("--budget is for --device cpu: a GPU's capacity is its memory"));
            }
            cuda(args, &tuner, ordinal, &say)
        }
    }
}

fn tune(
    args: &ProbeArgs,
    tuner: &Tuner,
    workload: &mut dyn ReferenceWorkload,
    meter: &mut dyn MemoryMeter,
) -> Result<(), Failure> {
    let mut progress = Progress::new(args.json);
    let result = if args.eval {
        let mut evaluation = workload.evaluation_workload();
        tuner.run_with_eval_observed(workload, &mut *evaluation, meter, &mut progress)
    } else {
        tuner.run_observed(workload, meter, &mut progress)
    };
    drop(progress);
    let plan = result?;
    if args.json {
        println!("{}", plan.to_json());
    } else {
        println!("{}", plan.summary());
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn cuda(_: &ProbeArgs, _: &Tuner, ordinal: usize, _: &dyn Fn(&str)) -> Result<(), Failure> {
    Err(Failure::usage(format!(
        "--device cuda:{ordinal} needs an autobatch built with CUDA: cargo build --release --features cuda"
    )))
}

#[cfg(feature = "cuda")]
fn cuda(args: &ProbeArgs, tuner: &Tuner, ordinal: usize, say: &dyn Fn(&str)) -> Result<(), Failure> {
    let mut meter = autobatch::CudaMeter::new(ordinal)?;
    let device = meter.device().clone();
    let mut workload = build_workload(args, &device)?;
    say(&format!(
        "probing {} ({} parameters) on {} ({})",
        workload.description(),
        workload.parameter_count(),
        meter.name(),
        format_bytes(meter.capacity()?)
    ));
    tune(args, tuner, &mut *workload, &mut meter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices() {
        assert_eq!(parse_device("cpu").unwrap(), DeviceSpec::Cpu);
        assert_eq!(parse_device("cuda").unwrap(), DeviceSpec::Cuda(0));
        assert_eq!(parse_device("cuda:3").unwrap(), DeviceSpec::Cuda(3));
        for bad in ["gpu", "cuda:", "cuda:x", "CPU", "cuda:-1"] {
            assert!(parse_device(bad).is_err(), "{bad}");
        }
    }
}
