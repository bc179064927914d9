//! `autobatch probe`: tune a built-in reference model on a device.

use autobatch::estimate::{OptimizerKind, Precision, StaticMemory};
use autobatch::models;
use autobatch::workloads::{ConvNetConfig, Footprint, ReferenceWorkload, TransformerConfig};
use autobatch::{format_bytes, HeapMeter, MemoryMeter, Tuner};
use candle_core::DType;

use crate::args::{DtypeArg, ModelKind, ObjectiveArg, ProbeArgs, ProbeOptimizerArg, DEFAULT_BUDGET};
use crate::failure::Failure;
use crate::model::{model_name, only_applicable_advice, optimizer_kind, search_tuner, LengthWorkload, ModelConfig};
use crate::parse::parse_bytes;
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

/// The flags of `--config`: the model's own size flags do not apply, the
/// LoRA flags need it.
fn check_config_flags(args: &ProbeArgs) -> Result<(), Failure> {
    if args.config.is_none() {
        return match args.lora {
            Some(_) => Err(Failure::usage("--lora adapts a model from --config: add --config path/to/config.json")),
            None => Ok(()),
        };
    }
    if args.model != ModelKind::Transformer {
        return Err(Failure::usage(format!(
            "--config builds the model its config.json describes: drop --model {}",
            model_name(args.model)
        )));
    }
    let refused = [
        ("--vocab", args.vocab.is_some()),
        ("--d-model", args.d_model.is_some()),
        ("--heads", args.heads.is_some()),
        ("--inputs", args.inputs.is_some()),
        ("--width", args.width.is_some()),
        ("--depth", args.depth.is_some()),
        ("--channels", args.channels.is_some()),
        ("--resolution", args.resolution.is_some()),
        ("--classes", args.classes.is_some()),
    ];
    if let Some((flag, _)) = refused.iter().find(|(_, given)| *given) {
        return Err(Failure::usage(format!(
            "{flag} does not apply to --config: the config.json sizes the model (--layers, --seq-len and \
             --seq-lens do apply)"
        )));
    }
    Ok(())
}

/// Size flags and the models they apply to.
fn check_size_flags(args: &ProbeArgs) -> Result<(), Failure> {
    check_config_flags(args)?;
    if args.config.is_some() {
        return Ok(());
    }
    use ModelKind::*;
    let flags: [(&str, bool, &[ModelKind]); 13] = [
        ("--seq-lens", !args.seq_lens.is_empty(), &[Transformer]),
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
        ("--checkpointing", args.checkpointing, &[Transformer]),
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

/// The batch search's tuner: [`search_tuner`] and the batch flags.
fn tuner(args: &ProbeArgs) -> Tuner {
    let mut tuner = search_tuner(args)
        .start(args.start)
        .multiple_of(args.multiple_of)
        .world_size(args.world_size)
        .exact_effective_batch(args.exact)
        .objective(match args.objective {
            ObjectiveArg::Largest => autobatch::Objective::LargestBatch,
            ObjectiveArg::Throughput => autobatch::Objective::Throughput,
        });
    if let Some(max_batch) = args.max_batch {
        tuner = tuner.max_batch(max_batch);
    }
    if let Some(target) = args.target_effective_batch {
        tuner = tuner.target_effective_batch(target);
    }
    if let Some(path) = &args.cache {
        tuner = tuner.cache(path);
    }
    tuner
}

/// Refuses a model whose first step cannot fit under `limit` before anything
/// is allocated: the smallest batch at the longest size probed (`--seq-lens`,
/// else the configured size), or under `--find` `--batch` at the shortest
/// size searched. A lower bound where the model is built for a longer size
/// than a step runs at: the search measures the rest and says when nothing fits.
fn check_footprint(args: &ProbeArgs, model: &ModelConfig, footprint: &Footprint, limit: u64) -> Result<(), Failure> {
    let (batch, size) = match (args.find, args.batch) {
        (Some(_), Some(batch)) => (batch, args.multiple_of),
        _ => (smallest_batch(args)?, args.seq_lens.iter().max().copied().unwrap_or(usize::MAX)),
    };
    let at_size = match model {
        ModelConfig::Transformer(c) if size < c.seq_len => {
            ModelConfig::Transformer(TransformerConfig { seq_len: size, ..c.clone() })
        }
        ModelConfig::ConvNet(c) if args.find.is_some() => {
            ModelConfig::ConvNet(ConvNetConfig { resolution: size.max(4).min(c.resolution), ..c.clone() })
        }
        ModelConfig::Pretrained(spec) if size < spec.1.seq_len => {
            let training = models::Training { seq_len: size, ..spec.1.clone() };
            ModelConfig::Pretrained(Box::new((spec.0.clone(), training)))
        }
        _ => return Ok(footprint.check_batch_within(batch, limit)?),
    };
    let at_size = at_size.footprint()?;
    let first_step = match args.find {
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
    Ok(autobatch::search::SearchSpace::new(args.start, args.max_batch, args.multiple_of)?.first())
}

/// Address space each worker thread may reserve beyond what it allocates (an
/// allocator arena and a stack): counted against `ulimit -v` and `ulimit -d`.
const PER_THREAD_RESERVE: u64 = 66 << 20;

/// The CPU budget: `--budget`, or the default, checked against every limit
/// the process lives under ([`crate::limits`]). A search can allocate up to
/// about twice the budget (its one over-budget trial): a budget whose search
/// could pass a limit that ends the process (RAM and swap, the cgroup's
/// limit, `ulimit -v` or `-d`) is refused before any trial runs, and one whose
/// search could pass the RAM available is allowed with a warning.
fn cpu_budget(args: &ProbeArgs) -> Result<(u64, &'static str), Failure> {
    let (text, why) = match &args.budget {
        Some(text) => (text.as_str(), "--budget"),
        None => (DEFAULT_BUDGET, "the default; set --budget"),
    };
    let budget = parse_bytes(text).map_err(|err| Failure::usage(format!("--budget: {err}")))?;
    if budget == 0 {
        return Err(Failure::usage("--budget is 0: give the memory the step may use, e.g. 256MiB"));
    }
    let search = budget.saturating_mul(2);
    let twice = match budget.checked_mul(2) {
        Some(bytes) => format_bytes(bytes),
        None => "more than 16 EiB".to_owned(),
    };
    let threads = rayon::current_num_threads() as u64 + 1;
    // the limits that end the process first: a budget refused is not also warned about
    let mut rooms = crate::limits::rooms();
    rooms.sort_by_key(|room| !room.hard);
    for room in rooms {
        let reserve = if room.what.contains("ulimit") { threads * PER_THREAD_RESERVE } else { 0 };
        let needed = search.saturating_add(reserve);
        if needed <= room.bytes {
            continue;
        }
        let most = room.bytes.saturating_sub(reserve) / 2;
        if room.hard {
            let advice = if most >= 1 << 20 {
                format!("use at most --budget {}", crate::parse::flag_bytes(most))
            } else {
                format!("that leaves no room for a probe beside its {threads} threads: raise the limit")
            };
            return Err(Failure::usage(format!(
                "--budget {}: a search can allocate about twice the budget ({twice}), and this process may use only {} \
                 more under {}; {advice}",
                format_bytes(budget),
                format_bytes(room.bytes),
                room.what,
            )));
        }
        log::warn!(
            "--budget {}: a search can allocate about twice the budget ({twice}), more than the {} of {}: it may swap",
            format_bytes(budget),
            format_bytes(room.bytes),
            room.what
        );
    }
    Ok((budget, why))
}

/// Worker threads past this many (or 8 per core, if more) are refused: each
/// keeps candle's matmul buffer for good (the host's L2 cache per core), and
/// starting them takes longer than any probe.
const MOST_THREADS: usize = 256;

/// `RAYON_NUM_THREADS`, when it asks for more threads than make sense here.
fn check_threads() -> Result<(), Failure> {
    let Ok(text) = std::env::var("RAYON_NUM_THREADS") else { return Ok(()) };
    let Ok(threads) = text.trim().parse::<usize>() else { return Ok(()) };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let most = MOST_THREADS.max(8 * cores);
    if threads > most {
        return Err(Failure::usage(format!(
            "RAYON_NUM_THREADS={threads} asks for more worker threads than this machine can use ({cores} cores): \
             each keeps a matmul buffer the size of the L2 cache per core; use at most {most}"
        )));
    }
    Ok(())
}

/// `--compare` tunes each variant for its largest batch: flags that ask for
/// something else of the search are refused rather than ignored.
fn check_compare(args: &ProbeArgs) -> Result<(), Failure> {
    if !args.compare {
        return Ok(());
    }
    let refused = [
        ("--eval", args.eval),
        ("--objective throughput", args.objective == ObjectiveArg::Throughput),
        ("--target-effective-batch", args.target_effective_batch.is_some()),
        ("--world-size", args.world_size > 1),
        ("--exact", args.exact),
        ("--cache", args.cache.is_some()),
    ];
    match refused.iter().find(|(_, given)| *given) {
        Some((flag, _)) => Err(Failure::usage(format!(
            "{flag} does not go with --compare, which compares each variant's largest batch: run it without --compare"
        ))),
        None => Ok(()),
    }
}

/// `--seq-lens` goes with a plain probe of a transformer that takes the longest.
fn check_seq_lens(args: &ProbeArgs) -> Result<(), Failure> {
    let Some(&longest) = args.seq_lens.iter().max() else { return Ok(()) };
    if let Some(twice) =
        args.seq_lens.iter().enumerate().find_map(|(i, len)| args.seq_lens[..i].contains(len).then_some(len))
    {
        return Err(Failure::usage(format!("--seq-lens: {twice} is given twice; list each length once")));
    }
    for (flag, given) in [("--eval", args.eval), ("--compare", args.compare)] {
        if given {
            return Err(Failure::usage(format!("{flag} does not go with --seq-lens: probe one length at a time")));
        }
    }
    match args.seq_len {
        Some(seq_len) if seq_len < longest => Err(Failure::usage(format!(
            "--seq-len {seq_len} is shorter than the longest of --seq-lens, {longest}: the model must take every \
             length probed; drop --seq-len or make it at least {longest}"
        ))),
        _ => Ok(()),
    }
}

pub fn run(args: &ProbeArgs) -> Result<(), Failure> {
    check_size_flags(args)?;
    check_compare(args)?;
    if args.precision() == DtypeArg::Mixed && args.optimizer != ProbeOptimizerArg::Adamw {
        return Err(Failure::usage(
            "--precision mixed runs AdamW on f32 master weights: drop --optimizer, or use --precision f32 or bf16",
        ));
    }
    check_seq_lens(args)?;
    crate::find::check_flags(args)?;
    crate::paths::check(args)?;
    let tuner = tuner(args);
    tuner.check()?;
    let say = |line: &str| if args.json { eprintln!("{line}") } else { println!("{line}") };

    let model = ModelConfig::from_args(args)?;
    let footprint = model.footprint()?;
    match parse_device(&args.device)? {
        DeviceSpec::Cpu => {
            check_threads()?;
            let (budget, why) = cpu_budget(args)?;
            let limit = args.ceiling.limit_bytes(budget);
            check_footprint(args, &model, &footprint, limit)?;
            let mut meter = HeapMeter::new(budget)?;
            let (scratch, threads, each) =
                (meter.thread_scratch_bytes(), meter.buffered_threads(), meter.thread_buffer_bytes());
            let blame_scratch = |failure: Failure| match failure.kind {
                // per-thread buffers that take much of the limit are named as what does not fit
                crate::failure::Kind::NothingFits if scratch > limit / 4 => Failure {
                    message: format!(
                        "{}; {} of the memory in use before each step is the matmul buffer candle keeps on each \
                         of {threads} threads ({} each, this host's L2 cache per core): fewer threads \
                         (RAYON_NUM_THREADS) leave more room",
                        failure.message,
                        format_bytes(scratch),
                        format_bytes(each),
                    ),
                    ..failure
                },
                _ => failure,
            };
            let on = format!("the CPU under a {} budget", format_bytes(budget));
            let run =
                Run { args, tuner: &tuner, model: &model, device: &candle_core::Device::Cpu, on: &on, why, say: &say };
            run.dispatch(&mut meter).map_err(blame_scratch)
        }
        DeviceSpec::Cuda(ordinal) => {
            if args.budget.is_some() {
                return Err(Failure::usage("--budget is for --device cpu: a GPU's capacity is its memory"));
            }
            cuda(args, &tuner, &model, &footprint, ordinal, &say)
        }
    }
}

/// The model as it is and with each remedy that applies, tuned side by side.
fn compare(
    args: &ProbeArgs,
    tuner: &Tuner,
    model: &ModelConfig,
    device: &candle_core::Device,
    meter: &mut dyn MemoryMeter,
    on: &str,
) -> Result<(), Failure> {
    use autobatch::Variant;
    // what the analytical model expects of each remedy's bytes per sample,
    // relative to the model as it is: bf16 halves activations; full
    // recomputation keeps what the estimate's formula keeps (Korthikanti et
    // al.: 2·s·h of a layer's 34·s·h + 5·a·s² bytes), and holds one layer's
    // whole activations again while the backward pass recomputes it
    const BF16: f64 = 0.5;
    let checkpointing = |(layers, hidden, heads, seq_len): (usize, usize, usize, usize)| {
        let shape = autobatch::estimate::TransformerShape {
            layers: layers as u64,
            hidden: hidden as u64,
            heads: heads as u64,
            seq_len: seq_len as u64,
            batch: 1,
        };
        let bytes = |recompute| shape.activation_bytes(1, recompute).map(|bytes| bytes as f64);
        match (bytes(autobatch::estimate::Recompute::None), bytes(autobatch::estimate::Recompute::Full)) {
            (Ok(kept), Ok(recomputed)) if kept > 0.0 => (recomputed + kept / layers as f64) / kept,
            _ => 1.0,
        }
    };
    let as_is_mixed = args.precision() == DtypeArg::Mixed;
    let optimizer = optimizer_kind(args.optimizer);
    let mut configs: Vec<(String, ModelConfig, f64, bool, OptimizerKind)> =
        vec![("as it is".to_owned(), model.clone(), 1.0, as_is_mixed, optimizer)];
    let with_dtype = |dtype| model.with_dtype(dtype);
    let is_f32 = model.dtype() == DType::F32;
    if let Some((checkpointed, shape)) = model.checkpointed() {
        let factor = checkpointing(shape);
        configs.push(("gradient checkpointing".to_owned(), checkpointed.clone(), factor, as_is_mixed, optimizer));
        if is_f32 {
            let both = checkpointed.with_dtype(DType::BF16);
            configs.push(("checkpointing + bf16".to_owned(), both, factor * BF16, false, optimizer));
        }
    }
    // candle's CPU conv2d has no bf16: the convnet's bf16 runs on CUDA only
    let bf16_runs = !(matches!(model, ModelConfig::ConvNet(_)) && device.is_cpu());
    if is_f32 && bf16_runs {
        configs.insert(1, ("bf16".to_owned(), with_dtype(DType::BF16), BF16, false, optimizer));
        // f32 adapters beside a base of its own dtype have no bf16 variables to keep masters of
        if model.lora().is_none_or(|lora| lora.base.is_none()) {
            let mixed = ("mixed precision".to_owned(), with_dtype(DType::BF16), BF16, true, OptimizerKind::AdamW);
            configs.insert(2, mixed);
        }
    }
    // a LoRA model: each other base, the adapters in f32; and without the
    // frozen-gradient fix (candle's own matmul under a dense base)
    if let Some(lora) = model.lora().cloned() {
        for base in models::BaseDtype::ALL.into_iter().filter(|&base| Some(base) != lora.base) {
            if lora.base.is_none() && base.float() == Some(model.dtype()) {
                continue; // the model as it is, but for its adapters' dtype
            }
            let factor = if base == models::BaseDtype::Bf16 && is_f32 { BF16 } else { 1.0 };
            let Some(variant) = model.with_lora(|lora| lora.base = Some(base)) else { continue };
            configs.push((format!("{base} base, f32 adapters"), variant, factor, false, optimizer));
        }
        if lora.base.is_none_or(|base| base.float().is_some()) && !lora.frozen_gradients {
            if let Some(variant) = model.with_lora(|lora| lora.frozen_gradients = true) {
                configs.push((
                    "frozen gradients kept (candle's matmul)".to_owned(),
                    variant,
                    1.0,
                    as_is_mixed,
                    optimizer,
                ));
            }
        }
    }
    // the lean optimizers change the state, not the bytes per sample
    if !as_is_mixed {
        for kind in [OptimizerKind::Lion, OptimizerKind::Adafactor, OptimizerKind::Adam8bit]
            .into_iter()
            .filter(|&k| k != optimizer)
        {
            configs.push((format!("{} optimizer", kind.name()), model.clone(), 1.0, false, kind));
        }
    }
    // where the change is known to the byte (an optimizer's state, master
    // weights: the same activations, a state the estimate counts), a variant's
    // search starts at the answer an earlier one's measured line predicts
    let parameters = model.build_with(device, as_is_mixed, optimizer)?.parameter_count() as u64;
    let precision = |mixed: bool, config: &ModelConfig| match (mixed, config.dtype()) {
        (true, _) => Precision::Mixed,
        (false, DType::BF16) => Precision::Bf16,
        (false, _) => Precision::Fp32,
    };
    let state = |mixed: bool, config: &ModelConfig, kind: OptimizerKind| {
        StaticMemory::new(parameters, precision(mixed, config), kind).map(|state| state.total() as f64)
    };
    let mut variants = Vec::with_capacity(configs.len());
    for (index, (name, config, _, mixed, kind)) in configs.iter().enumerate() {
        let same_activations_as =
            configs[..index].iter().position(|(_, other, _, _, _)| same_activations(other, config));
        let mut variant =
            Variant::lazy(name.clone(), move || config.build_with(device, *mixed, *kind).map(ReferenceStep));
        if let Some(like) = same_activations_as {
            let (_, like_config, _, like_mixed, like_kind) = &configs[like];
            let change = state(*mixed, config, *kind)? - state(*like_mixed, like_config, *like_kind)?;
            variant = variant.expecting(like, 1.0, change);
        }
        variants.push(variant);
    }
    let mut progress = Progress::new(args.json);
    let compared = tuner.compare_observed(variants, meter, &mut progress);
    drop(progress);
    let mut comparison = compared?;
    let base = comparison.rows.first().and_then(|row| row.memory()).map(|(per_sample, _)| per_sample);
    for (row, (_, _, factor, _, _)) in comparison.rows.iter_mut().zip(&configs).skip(1) {
        row.predicted_bytes_per_sample = base.map(|base| base * factor);
    }
    let nothing_fits = comparison.rows.iter().all(|row| row.plan.is_none());
    if let Some(path) = &args.plot {
        let bars: Vec<crate::plot::VariantBar> = comparison
            .rows
            .iter()
            .map(|row| crate::plot::VariantBar {
                name: row.name.clone(),
                largest_batch: row.largest_batch(),
                bytes_per_sample: row.memory().map(|m| m.0),
                estimated_bytes_per_sample: row.predicted_bytes_per_sample,
            })
            .collect();
        let title = format!("remedies for the {} on {on}", model.name());
        crate::plot::compare(path, &title, &bars)?;
    }
    if args.json {
        let rows: Vec<serde_json::Value> = comparison
            .rows
            .iter()
            .map(|row| {
                serde_json::json!({
                    "variant": row.name,
                    "largest_batch": row.plan.as_ref().map(|p| p.largest_batch),
                    "bytes_per_sample": row.memory().map(|m| m.0),
                    "fixed_bytes": row.memory().map(|m| m.1),
                    "estimated_bytes_per_sample": row.predicted_bytes_per_sample,
                    "started_at": row.started_at,
                    "steps": row.plan.as_ref().map(|p| p.trials.len()),
                    "step_time_s": row.step_time().map(|t| t.as_secs_f64()),
                    "samples_per_second": row.samples_per_second(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows).expect("plain values serialize"));
    } else {
        print!("{comparison}");
    }
    if nothing_fits {
        return Err(Failure::nothing_fits(format!(
            "nothing fits: not even the smallest batch of any variant stays under the ceiling of {} of {}",
            args.ceiling,
            format_bytes(meter.capacity()?)
        )));
    }
    Ok(())
}

/// Whether two models run the same activations: the same shape, dtype and
/// checkpointing (they may differ in optimizer or master weights).
fn same_activations(a: &ModelConfig, b: &ModelConfig) -> bool {
    match (a, b) {
        (ModelConfig::Transformer(a), ModelConfig::Transformer(b)) => a == b,
        (ModelConfig::Mlp(a), ModelConfig::Mlp(b)) => a == b,
        (ModelConfig::ConvNet(a), ModelConfig::ConvNet(b)) => a == b,
        (ModelConfig::Pretrained(a), ModelConfig::Pretrained(b)) => a == b,
        _ => false,
    }
}

/// A reference workload as a plain `Workload` for [`Tuner::compare`].
struct ReferenceStep(Box<dyn ReferenceWorkload>);

impl autobatch::Workload for ReferenceStep {
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        self.0.step(batch)
    }
    fn accumulating_step(&mut self, batch: usize) -> candle_core::Result<()> {
        self.0.accumulating_step(batch)
    }
    fn can_accumulate(&self) -> bool {
        self.0.can_accumulate()
    }
    fn profile(&self) -> Option<autobatch::Profile> {
        self.0.profile()
    }
    fn graph_tensors(&self) -> Option<Vec<autobatch::TensorSize>> {
        self.0.graph_tensors()
    }
}

fn tune(
    args: &ProbeArgs,
    tuner: &Tuner,
    model: &ModelConfig,
    workload: &mut dyn ReferenceWorkload,
    meter: &mut dyn MemoryMeter,
    on: &str,
) -> Result<(), Failure> {
    let mut progress = Progress::new(args.json);
    let result = if args.eval {
        let mut evaluation = workload.evaluation_workload();
        tuner.run_with_eval_observed(workload, &mut *evaluation, meter, &mut progress)
    } else {
        tuner.run_observed(workload, meter, &mut progress)
    };
    drop(progress);
    let plan = result.map_err(|err| only_applicable_advice(model, err))?;
    if plan.cached() {
        if let Some(path) = &args.cache {
            log::info!("the plan came from the cache {}", path.display());
        }
    }
    if args.json {
        println!("{}", plan.to_json());
    } else {
        println!("{}", plan.summary());
    }
    if let Some(path) = &args.plot {
        crate::plot::plan(path, &format!("{} on {on}", workload.description()), &plan)?;
    }
    Ok(())
}

/// `--seq-lens`: the model tuned at each length, and the plan across them.
fn tune_lengths(
    args: &ProbeArgs,
    tuner: &Tuner,
    model: &ModelConfig,
    trainer: &mut dyn LengthWorkload,
    meter: &mut dyn MemoryMeter,
    on: &str,
    say: &dyn Fn(&str),
) -> Result<(), Failure> {
    say(&format!(
        "probing {} ({} parameters) at sequence lengths {:?} on {on}",
        trainer.description(),
        trainer.parameter_count(),
        args.seq_lens
    ));
    let mut progress = Progress::new(args.json);
    let result = tuner.run_sizes_observed(trainer, meter, &args.seq_lens, &mut progress);
    drop(progress);
    let plan = result.map_err(|err| only_applicable_advice(model, err))?;
    if let Some(path) = &args.plot {
        let title = format!("{} on {on}", trainer.description());
        crate::plot::sizes(path, &title, &plan)?;
    }
    if args.json {
        println!("{}", plan.to_json());
        return Ok(());
    }
    println!("{plan}");
    let lengths: Vec<usize> = plan.sizes.iter().map(|entry| entry.size).collect();
    let mut between: Vec<String> = Vec::new();
    for pair in lengths.windows(2) {
        let middle = (pair[0] + pair[1]) / 2;
        if middle > pair[0] {
            let predicted = plan.batch_for(middle)?;
            between.push(format!("{} → {} ({})", middle, predicted.batch, predicted.basis));
        }
    }
    if !between.is_empty() {
        println!("between probed lengths: {}", between.join(", "));
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn cuda(
    _: &ProbeArgs,
    _: &Tuner,
    _: &ModelConfig,
    _: &Footprint,
    ordinal: usize,
    _: &dyn Fn(&str),
) -> Result<(), Failure> {
    Err(Failure::usage(format!(
        "--device cuda:{ordinal} needs an autobatch built with CUDA: cargo build --release --features cuda"
    )))
}

#[cfg(feature = "cuda")]
fn cuda(
    args: &ProbeArgs,
    tuner: &Tuner,
    model: &ModelConfig,
    footprint: &Footprint,
    ordinal: usize,
    say: &dyn Fn(&str),
) -> Result<(), Failure> {
    let mut meter = autobatch::CudaMeter::new(ordinal)?;
    check_footprint(args, model, footprint, args.ceiling.limit_bytes(meter.capacity()?))?;
    let device = meter.device().clone();
    let on = format!("{} ({})", meter.name(), format_bytes(meter.capacity()?));
    let why = "--device";
    Run { args, tuner, model, device: &device, on: &on, why, say }.dispatch(&mut meter)
}

/// One probe command on a chosen device: the same modes on the CPU and a GPU.
struct Run<'a> {
    args: &'a ProbeArgs,
    tuner: &'a Tuner,
    model: &'a ModelConfig,
    device: &'a candle_core::Device,
    /// The device in words, for the header and the chart.
    on: &'a str,
    /// Where the device's size came from (`--budget`, the default).
    why: &'a str,
    say: &'a dyn Fn(&str),
}

impl Run<'_> {
    /// The mode the flags ask for, on `meter`: `--compare`, `--find`,
    /// `--seq-lens`, or one probe (with `--eval`, a target, ranks...).
    fn dispatch(&self, meter: &mut dyn MemoryMeter) -> Result<(), Failure> {
        let Run { args, tuner, model, device, on, why, say } = *self;
        if args.compare {
            say(&format!("comparing remedies on {on} ({why})"));
            return compare(args, tuner, model, device, meter, on);
        }
        if args.find.is_some() {
            return crate::find::run(args, model, device, meter, on, say);
        }
        if let Some(workload) = model.at_lengths(args, device) {
            return tune_lengths(args, tuner, model, &mut *workload?, meter, on, say);
        }
        let mut workload = model.build(device, args)?;
        say(&format!("probing {} ({} parameters) on {on} ({why})", workload.description(), workload.parameter_count()));
        tune(args, tuner, model, &mut *workload, meter, on)
    }
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
