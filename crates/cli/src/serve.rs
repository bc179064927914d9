//! `autobatch serve` and `autobatch estimate --serve`: how many sequences of
//! a context a model serves at once beside their KV caches, measured and
//! counted.

use std::path::Path;

use autobatch::serve::{Scheduling, ServePlan, ServeTrial};
use autobatch::{Bytes, MemoryMeter, Tuner, plan::Ceiling};
use autobatch_models::{BaseDtype, Config, KvCache, Serving, ServingBytes, ServingShape};
use candle_core::DType;
use serde_json::json;

use crate::args::{ServeArgs, ServingArgs};
use crate::device_flags::OnDevice;
use crate::failure::{Failure, Flags};
use crate::output::{errln, out, outln};
use crate::values::Count;

/// The longest context `serve` takes when `--max-model-len` is not given.
const DEFAULT_CONTEXT: usize = 4096;

/// `--max-num-batched-tokens` when not given: vLLM's for online serving,
/// as `Scheduling::new` takes it.
const DEFAULT_CHUNK: usize = 2048;

/// The CPU budget of `serve` when none is given.
const DEFAULT_BUDGET: u64 = 1 << 30;

/// What `serve` and `estimate --serve` settle before measuring or counting.
struct Settled {
    config: Config,
    shape: ServingShape,
}

impl ServingArgs {
    /// The settings for `config`, checked against it, its weights stored as
    /// `base_dtype` says.
    fn settle(&self, base_dtype: Option<BaseDtype>, config: Config, path: &Path) -> Result<Settled, Failure> {
        let longest = config.max_positions;
        let context = self.max_model_len.map_or(DEFAULT_CONTEXT.min(longest), Count::get);
        if context > longest {
            return Err(Failure::usage(format!(
                "--max-model-len {context}: the model at {} takes at most {longest} tokens, its \
                 max_position_embeddings",
                path.display()
            )));
        }
        let weights = base_dtype.unwrap_or(if config.dtype == DType::F32 { BaseDtype::F32 } else { BaseDtype::Bf16 });
        let dtype = weights.float().unwrap_or(if config.dtype == DType::F32 { DType::F32 } else { DType::BF16 });
        let chunk = self.max_num_batched_tokens.map_or(DEFAULT_CHUNK, Count::get);
        let shape = ServingShape {
            context,
            chunk: chunk.min(context),
            block_size: self.block_size.map_or(autobatch_models::DEFAULT_BLOCK_SIZE, Count::get),
            weights,
            dtype,
            cache_dtype: self.kv_cache_dtype.map_or(dtype, DType::from),
            on_cpu: false,
        };
        Ok(Settled { config, shape })
    }
}

fn load(path: &Path, flags: &Flags) -> Result<Config, Failure> {
    let source = crate::hub::resolve(path)?;
    let config = Config::from_file(source.path()).map_err(|err| Failure::of_config(err, path, flags))?;
    crate::hub::remember(source);
    if let Some(unapplied) = config.unapplied() {
        log::warn!("{unapplied}");
    }
    Ok(config)
}

/// What `serve` asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Question {
    /// How many sequences of `--max-model-len` fit.
    Sequences,
    /// `--concurrency N`: the longest context N sequences hold.
    LongestContext(usize),
    /// `--check N`: N and N + 1 sequences run, each said to fit or not.
    Check(usize),
}

/// `serve`'s flags, converted once ([`Request::of`]): past it nothing reads a flag.
struct Request {
    path: std::path::PathBuf,
    settled: Settled,
    question: Question,
    device: crate::values::DeviceSpec,
    budget: Option<u64>,
    ceiling: autobatch::plan::Ceiling,
    json: bool,
    plot: Option<std::path::PathBuf>,
}

impl Request {
    fn of(args: &ServeArgs) -> Result<Request, Failure> {
        // clap requires serve's --config (args::command)
        let Some(path) = &args.config.path else { return Err(Failure::usage("serve needs --config")) };
        if let Some(plot) = &args.plot.path {
            crate::paths::check_serve(path, plot)?;
        }
        let config = load(path, &Flags::PROBE)?;
        let question = match (args.concurrency, args.check.n) {
            (_, Some(sequences)) => Question::Check(sequences.get()),
            (Some(sequences), None) => Question::LongestContext(sequences.get()),
            (None, None) => Question::Sequences,
        };
        Ok(Request {
            settled: args.serving.settle(args.base.base_dtype, config, path)?,
            path: path.clone(),
            question,
            device: args.on.device,
            budget: args.on.budget,
            ceiling: args.ceiling.fraction,
            json: args.json.on,
            plot: args.plot.path.clone(),
        })
    }
}

/// `autobatch serve`: the probe on the CPU (or a GPU).
/// Says where the config came from, where it was not a plain path: on
/// stdout beside the answer, on stderr under `--json`.
fn say_source(json: bool) {
    if let Some(said) = crate::hub::source().and_then(crate::hub::ConfigSource::said) {
        if json { errln!("{said}") } else { outln!("{said}") }
    }
}

pub fn run(args: &ServeArgs) -> Result<(), Failure> {
    let mut request = Request::of(args)?;
    say_source(request.json);
    let mut on = crate::device_flags::on_device(request.device, request.budget, DEFAULT_BUDGET, request.ceiling)?;
    // counted for where it runs: the CPU's matmul widens bf16
    request.settled.shape.on_cpu = on.device.is_cpu();
    serve_on(&request, &mut on)
}

/// The model built on the device, then `--check`, or the search and its report.
fn serve_on(request: &Request, on: &mut OnDevice) -> Result<(), Failure> {
    let (meter, device, limit) = (on.meter.as_mut(), &on.device, on.limit);
    let Settled { config, shape } = &request.settled;
    let counted = config.serving_bytes(shape)?;
    let (concurrency, check) = match request.question {
        Question::Sequences => (None, None),
        Question::LongestContext(sequences) => (Some(sequences), None),
        Question::Check(sequences) => (None, Some(sequences)),
    };
    if let Some(sequences) = check {
        check_count_is_countable(sequences, &counted)?;
    }
    // what the process holds before the model: what the count adds the weights to
    let held_before = meter.in_use()?;
    match concurrency {
        // the longest context at N sequences is searched from one token: its count is the shortest's
        Some(sequences) => {
            let shortest = ServingShape { context: 1, chunk: 1, ..*shape };
            let at_shortest = config.serving_bytes(&shortest)?;
            refuse_before_building(config, shape, &at_shortest, held_before, limit, Asked::Concurrency(sequences))?
        }
        None => refuse_before_building(config, shape, &counted, held_before, limit, Asked::of(check))?,
    }
    let weights_dtype = shape.weights.float().is_none().then_some(shape.dtype);
    let server = Serving::build(config, shape.weights, weights_dtype, device)?;
    let mut server = server.block_size(shape.block_size)?.cache_dtype(shape.cache_dtype)?;
    let scheduling = Scheduling::new(shape.context).max_num_batched_tokens(shape.chunk);
    let tuner = Tuner::new().ceiling(request.ceiling);
    if let Some(sequences) = check {
        let held = meter.in_use()?;
        let trials = [
            tuner.search(&mut server, meter).measure(sequences, &scheduling)?,
            tuner.search(&mut server, meter).measure(sequences + 1, &scheduling)?,
        ];
        return report_check(request, limit, held, &trials);
    }
    let plan = match concurrency {
        Some(sequences) => tuner.search(&mut server, meter).context(sequences, &scheduling).map_err(|err| {
            let nothing_fits = matches!(err, autobatch::Error::NothingFits { .. });
            let failure = Failure::from(err);
            match nothing_fits {
                true => Failure {
                    message: format!(
                        "{}; what would help: {}",
                        failure.message,
                        fewer_sequences(config, shape, held_before, limit, sequences)
                    ),
                    ..failure
                },
                false => failure,
            }
        })?,
        None => {
            // the count says where to start: the answer is the same
            let expected = counted.max_sequences(limit, meter.in_use()?.saturating_sub(counted.weight_bytes));
            let slope = (counted.cache_bytes_per_sequence + counted.step_bytes_per_sequence) as f64;
            tuner
                .search(&mut server, meter)
                .sequences(&scheduling.expect(expected.max(1), slope))
                .map_err(|err| measured_nothing_fits(err, config, shape, &counted, held_before))?
        }
    };
    report_plan(request, &plan, &counted)
}

/// `--check N` runs N and N + 1 sequences: both must be counts whose caches
/// can be counted in bytes at all (a usage error, with the range, if not).
fn check_count_is_countable(sequences: usize, counted: &ServingBytes) -> Result<(), Failure> {
    let per_sequence = counted.cache_bytes_per_sequence.saturating_add(counted.step_bytes_per_sequence).max(1);
    let most = (u64::MAX - counted.weight_bytes) / per_sequence - 1;
    let most = usize::try_from(most).unwrap_or(usize::MAX - 1);
    if sequences <= most {
        return Ok(());
    }
    Err(Failure::usage(format!(
        "--check {sequences}: {sequences} and one more sequences' caches of {} tokens are past what 64 bits of bytes \
         count; give 1 to {most}",
        counted.context
    )))
}

/// Nothing is built when the weights and the caches of the fewest sequences
/// asked for pass the limit beside what the process holds: a model of
/// gigabytes is not made to be refused. Only what surely is allocated counts
/// here (a lower bound); the step's own bytes are the measurement's to settle,
/// so a count near the limit never refuses what would fit.
fn refuse_before_building(
    config: &Config,
    shape: &ServingShape,
    counted: &ServingBytes,
    held: u64,
    limit: u64,
    asked: Asked,
) -> Result<(), Failure> {
    let fewest = asked.sequences();
    let needed = counted.least_bytes_at(fewest, held);
    if needed <= limit {
        return Ok(());
    }
    let mut help = advice(config, shape, held, limit, fewest, 0);
    if let Asked::Concurrency(sequences) = asked {
        help = format!("{}; {help}", fewer_sequences(config, shape, held, limit, sequences));
    }
    Err(Failure::nothing_fits(format!(
        "nothing fits: the weights ({}) and {fewest} sequence's cache of {} ({}) beside the {} the process \
         holds need at least {} before any step's own bytes, over the {} limit; what would help: {}",
        Bytes(counted.weight_bytes),
        if counted.context == 1 { "1 token".to_owned() } else { format!("{} tokens", counted.context) },
        Bytes(counted.cache_bytes_per_sequence.saturating_mul(fewest as u64)),
        Bytes(held),
        Bytes(needed),
        Bytes(limit),
        help,
    )))
}

/// The sequences a serve command asks for before anything is built.
#[derive(Clone, Copy, Debug)]
enum Asked {
    /// The most sequences (at least one), or `--check N`'s N.
    Sequences(usize),
    /// `--concurrency N`: the longest context at N sequences, from one token.
    Concurrency(usize),
}

impl Asked {
    fn of(check: Option<usize>) -> Asked {
        Asked::Sequences(check.unwrap_or(1))
    }

    fn sequences(self) -> usize {
        match self {
            Asked::Sequences(sequences) | Asked::Concurrency(sequences) => sequences,
        }
    }
}

/// `--concurrency` smaller: the most sequences whose caches at the context
/// asked for fit by the count with room, else at one block of tokens.
fn fewer_sequences(config: &Config, shape: &ServingShape, held: u64, limit: u64, asked: usize) -> String {
    let most = |shape: &ServingShape| {
        config.serving_bytes(shape).map_or(0, |counted| {
            let room = limit.saturating_sub(counted.step_bytes_at(1) / 4);
            counted.max_sequences(room, held)
        })
    };
    let at_context = most(shape).min(asked.saturating_sub(1));
    if at_context > 0 {
        return format!(
            "--concurrency {at_context} (the most whose caches of --max-model-len {} fit by the count, with room)",
            shape.context
        );
    }
    let block = ServingShape { context: shape.block_size, chunk: shape.chunk.min(shape.block_size), ..*shape };
    match most(&block).min(asked.saturating_sub(1)) {
        0 => "not even one sequence fits by the count: a smaller --concurrency does not help".to_owned(),
        fewer => format!(
            "--concurrency {fewer} (the most whose caches of one block, {} tokens, fit by the count)",
            block.context
        ),
    }
}

/// The fewest sequences measured over the limit, though the count fit them:
/// said in serving's words, with advice that leaves room for what the count
/// missed.
fn measured_nothing_fits(
    err: autobatch::Error,
    config: &Config,
    shape: &ServingShape,
    counted: &ServingBytes,
    held: u64,
) -> Failure {
    let autobatch::Error::NothingFits { batch, peak_bytes: Some(peak), limit_bytes, ceiling, capacity_bytes, .. } = err
    else {
        return Failure::from(err);
    };
    let under_count = peak.saturating_sub(counted.bytes_at(batch, held));
    Failure::nothing_fits(format!(
        "nothing fits: {batch} sequence of {} tokens peaked at {} (the count said {}), over the {} limit ({:.0}% of {}); \
         what would help: {}",
        shape.context,
        Bytes(peak),
        Bytes(counted.bytes_at(batch, held)),
        Bytes(limit_bytes),
        ceiling * 100.0,
        Bytes(capacity_bytes),
        advice(config, shape, held, limit_bytes, batch, under_count),
    ))
}

/// What would make `fewest` sequences fit, each change only where it is not
/// already set and said with whether the count fits it: the count runs under
/// a measured step by up to about a sixth of the step's own bytes (what
/// building the model allocates beside its weights, the step's temporaries),
/// so a change fits only with a quarter of the step to spare, or with what a
/// measurement showed the count missed (`under_count`) where that is more.
fn advice(config: &Config, shape: &ServingShape, held: u64, limit: u64, fewest: usize, under_count: u64) -> String {
    let fits = |shape: &ServingShape| {
        config.serving_bytes(shape).is_ok_and(|c| {
            let room = (c.step_bytes_at(fewest) / 4).max(under_count);
            c.bytes_at(fewest, held).saturating_add(room) <= limit
        })
    };
    let said = |change: &str, shape: &ServingShape| {
        format!("{change} ({})", if fits(shape) { "fits by the count, with room" } else { "still over by the count" })
    };
    let mut advice = Vec::new();
    let shorter = |context: usize| ServingShape { context, chunk: shape.chunk.min(context), ..*shape };
    // the longest context that fits: the count grows with it
    let fit = crate::model::last_fitting(0, shape.context, |middle| fits(&shorter(middle)));
    if fit > 0 {
        advice.push(format!("--max-model-len {fit} (the longest that fits by the count, with room)"));
    }
    if shape.weights != BaseDtype::Q4_0 {
        advice.push(said("--base-dtype q4_0", &ServingShape { weights: BaseDtype::Q4_0, ..*shape }));
    }
    if shape.cache_dtype != KvCache::INT8 {
        advice.push(said("--kv-cache-dtype int8", &ServingShape { cache_dtype: KvCache::INT8, ..*shape }));
    }
    advice.push("more memory (--budget on the CPU)".to_owned());
    advice.join("; ")
}

/// `--check`'s two trials, in words or JSON.
fn report_check(request: &Request, limit: u64, held: u64, trials: &[ServeTrial]) -> Result<(), Failure> {
    let shape = &request.settled.shape;
    if request.json {
        let report = json!({
            "config": request.path,
            "context": shape.context,
            "limit_bytes": limit,
            "held_bytes": held,
            "trials": trials,
        });
        outln!("{}", serde_json::to_string_pretty(&crate::hub::annotate(report)).expect("plain values serialize"));
        return Ok(());
    }
    for trial in trials {
        let peak = trial.peak_bytes.map_or("not read".to_owned(), |bytes| Bytes(bytes).to_string());
        let verdict = if trial.fits { "fits" } else { "does not fit" };
        outln!(
            "{} sequences of {} tokens: peak {peak} against a {} limit: {verdict}",
            trial.number,
            shape.context,
            Bytes(limit)
        );
    }
    Ok(())
}

/// The plan in words or JSON, and its chart.
fn report_plan(request: &Request, plan: &ServePlan, counted: &ServingBytes) -> Result<(), Failure> {
    let Settled { config, shape } = &request.settled;
    let other_held = plan.held_bytes.saturating_sub(counted.weight_bytes);
    if request.json {
        let report = json!({
            "config": request.path,
            "weights": shape.weights.name(),
            "dtype": dtype_name(shape.dtype),
            "kv_cache_dtype": dtype_name(shape.cache_dtype),
            "plan": plan,
            "counted": counted,
            "counted_max_sequences": counted.max_sequences(plan.limit_bytes, other_held),
            "vllm_blocks": counted.vllm_blocks(plan.limit_bytes, other_held),
            "vllm_max_concurrency": counted.vllm_concurrency(plan.limit_bytes, other_held),
        });
        outln!("{}", serde_json::to_string_pretty(&crate::hub::annotate(report)).expect("plain values serialize"));
    } else {
        let by_context = matches!(request.question, Question::LongestContext(_));
        out!("{}", describe(&request.path, shape, plan, counted, by_context));
    }
    if let Some(path) = &request.plot {
        crate::plot::serving(path, &chart_title(&request.path, config, shape), plan, counted)?;
    }
    Ok(())
}

/// The serving chart's title: the model by name (its config's file, or the
/// folder of a `config.json`), its family and size, and how it is served.
fn chart_title(path: &Path, config: &Config, shape: &ServingShape) -> String {
    let stem = path.file_stem().and_then(|stem| stem.to_str()).unwrap_or("the model");
    let name = match (stem, path.parent().and_then(Path::file_name).and_then(|dir| dir.to_str())) {
        ("config", Some(folder)) if !folder.is_empty() => folder,
        _ => stem,
    };
    format!(
        "Serving {name} ({}, {} layers, hidden {}): {} weights, KV cache {}, {} tokens",
        config.family.model_type(),
        config.layers,
        config.hidden,
        shape.weights.name(),
        dtype_name(shape.cache_dtype),
        shape.context
    )
}

fn dtype_name(dtype: DType) -> &'static str {
    if dtype == autobatch_models::KvCache::INT8 { "int8" } else { dtype.as_str() }
}

/// The plan in words.
fn describe(path: &Path, shape: &ServingShape, plan: &ServePlan, counted: &ServingBytes, by_context: bool) -> String {
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line(format!(
        "serving {}: weights {} ({}), computing in {}, KV cache {} in blocks of {} tokens",
        path.display(),
        shape.weights.name(),
        Bytes(counted.weight_bytes),
        dtype_name(shape.dtype),
        dtype_name(shape.cache_dtype),
        shape.block_size,
    ));
    line(format!(
        "worst step: one sequence prefills {} tokens while every other decodes one, every cache full",
        plan.chunk
    ));
    let proof =
        if plan.proven { "; one more was run and does not fit" } else { "; the next one up was not shown to fail" };
    if by_context {
        line(format!("longest context: {} tokens for {} sequences{proof}", plan.context, plan.max_sequences));
    } else {
        line(format!("largest concurrency: {} sequences of {} tokens{proof}", plan.max_sequences, plan.context));
    }
    out.push_str(&memory_table(plan, counted));
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    if let (Some(blocks), Some(tokens)) = (plan.kv_blocks, plan.block_tokens) {
        line(format!(
            "KV blocks the limit holds beside the worst step: {blocks} ({} tokens; vLLM's \"# GPU blocks\", measured)",
            blocks * tokens as u64
        ));
    }
    let other_held = plan.held_bytes.saturating_sub(counted.weight_bytes);
    if !by_context {
        line(format!(
            "counted from the config: {} sequences (the step's own {}); vLLM's formula: {} blocks, maximum concurrency {:.2}x",
            counted.max_sequences(plan.limit_bytes, other_held),
            Bytes(counted.step_bytes_at(plan.max_sequences)),
            counted.vllm_blocks(plan.limit_bytes, other_held),
            counted.vllm_concurrency(plan.limit_bytes, other_held),
        ));
    }
    let seconds: f64 = plan.trials.iter().map(|t| t.seconds).sum();
    let tried: Vec<String> = plan.trials.iter().map(|t| t.number.to_string()).collect();
    line(format!("probe: {} trials ({}), {seconds:.2} s, on {}", plan.trials.len(), tried.join(", "), plan.device));
    out
}

/// Where the peak went: what was held, the caches, the worst step's own.
fn memory_table(plan: &ServePlan, counted: &ServingBytes) -> String {
    let held = Bytes(plan.held_bytes);
    let per_token = Bytes(plan.cache_bytes_per_token.round() as u64);
    let share = percent(plan.limit_bytes, plan.capacity_bytes);
    [
        format!("  held before the trials  {held:>10}  (weights {})", Bytes(counted.weight_bytes)),
        format!("  KV caches               {:>10}  ({per_token} per token)", Bytes(plan.cache_bytes)),
        format!("  the worst step's own    {:>10}", Bytes(plan.step_bytes)),
        format!(
            "  peak                    {:>10}  of a {} limit ({share} of {})",
            Bytes(plan.peak_bytes),
            Bytes(plan.limit_bytes),
            Bytes(plan.capacity_bytes)
        ),
    ]
    .map(|row| row + "\n")
    .concat()
}

fn percent(part: u64, whole: u64) -> String {
    format!("{:.0}%", 100.0 * part as f64 / whole.max(1) as f64)
}

/// `autobatch estimate --config … --serve`: the count alone (`main` routes
/// the estimate of serving here; the training estimate knows nothing of it).
pub fn estimate(args: &crate::args::EstimateArgs) -> Result<(), Failure> {
    let Some(path) = args.state.config.path.as_deref() else {
        return Err(Failure::usage("--serve counts a config's serving: add --config"));
    };
    let (serving, base_dtype, ceiling) =
        (&args.serving.settings, args.base.base.base_dtype, args.device.ceiling.fraction);
    let (capacity, on_cpu, json) =
        (args.device.capacity.map(|capacity| capacity.bytes), args.device.on_cpu, args.json.on);
    let config = load(path, &Flags::ESTIMATE)?;
    say_source(json);
    let Settled { config, shape } = serving.settle(base_dtype, config, path)?;
    let shape = ServingShape { on_cpu, ..shape };
    let counted = config.serving_bytes(&shape)?;
    let limit = capacity.map(|capacity| ceiling.limit_bytes(capacity));
    // on the CPU the process holds the matmul buffers of its threads before
    // any step (what `serve` measures as held before the trials)
    let held = if on_cpu { autobatch::HeapMeter::host_scratch_bytes() } else { 0 };
    if json {
        let report = json!({
            "config": path,
            "weights": shape.weights.name(),
            "dtype": dtype_name(shape.dtype),
            "kv_cache_dtype": dtype_name(shape.cache_dtype),
            "counted": counted,
            "capacity_bytes": capacity,
            "limit_bytes": limit,
            "held_bytes": held,
            "max_sequences": limit.map(|limit| counted.max_sequences(limit, held)),
            "vllm_blocks": limit.map(|limit| counted.vllm_blocks(limit, held)),
            "vllm_max_concurrency": limit.map(|limit| counted.vllm_concurrency(limit, held)),
        });
        outln!("{}", serde_json::to_string_pretty(&crate::hub::annotate(report)).expect("plain values serialize"));
        return Ok(());
    }
    out!("{}", describe_count(path, &config, &shape, &counted));
    match (capacity, limit) {
        (Some(capacity), Some(limit)) => {
            out!("{}", describe_concurrency(&shape, &counted, capacity, ceiling, (limit, held)))
        }
        _ => outln!("give --capacity (e.g. h100 or 24GiB) for the concurrency it holds"),
    }
    Ok(())
}

/// The blocks one sequence holds at the context: every layer's, or, with
/// sliding layers, those of the layers that keep every key and the window's.
fn sequence_blocks(config: &Config, shape: &ServingShape) -> String {
    let blocks = shape.context.div_ceil(shape.block_size);
    let sliding = (0..config.layers).filter(|&layer| config.window_of(layer).is_some()).count();
    if sliding == 0 {
        return format!("{blocks} blocks");
    }
    let window = KvCache::window_blocks_for(config, shape.block_size, shape.context - 1, 1);
    match config.layers - sliding {
        0 => format!("{window} blocks: every layer keeps its window of {}", config.sliding_window.unwrap_or(0)),
        full => format!(
            "{blocks} blocks in {full} layers, {window} in the {sliding} that keep a window of {}",
            config.sliding_window.unwrap_or(0)
        ),
    }
}

/// `estimate --serve`: the weights, the cache per token and per sequence,
/// the worst step's own bytes, as counted.
fn describe_count(path: &Path, config: &Config, shape: &ServingShape, counted: &ServingBytes) -> String {
    format!(
        "serving {} at {} tokens: weights {} ({}), KV cache {} in blocks of {} tokens\n\
         \x20 KV cache per token       {:>10}  (2 × {} layers × {} kv heads × {} dims × {} bytes)\n\
         \x20 per sequence             {:>10}  ({})\n\
         \x20 the worst step's own     {:>10}  with one sequence (a {}-token prefill), + {} per other sequence\n",
        path.display(),
        shape.context,
        shape.weights.name(),
        Bytes(counted.weight_bytes),
        dtype_name(shape.cache_dtype),
        shape.block_size,
        Bytes(counted.cache_bytes_per_token),
        config.layers,
        config.kv_heads,
        config.head_dim,
        shape.cache_dtype.size_in_bytes(),
        Bytes(counted.cache_bytes_per_sequence),
        sequence_blocks(config, shape),
        Bytes(counted.step_bytes),
        shape.chunk,
        Bytes(counted.step_bytes_per_sequence)
    )
}

/// `estimate --serve --capacity`: the sequences the limit holds, and what
/// vLLM's formula gives for the same settings.
fn describe_concurrency(
    shape: &ServingShape,
    counted: &ServingBytes,
    capacity: u64,
    ceiling: Ceiling,
    (limit, held): (u64, u64),
) -> String {
    let beside = match held {
        0 => String::new(),
        held => format!(" beside the {} the CPU's matmul buffers hold before any step", Bytes(held)),
    };
    format!(
        "largest concurrency under {ceiling} of {}{beside}: {} sequences of {} tokens\n\
         vLLM's formula for the same settings: {} blocks ({} tokens), maximum concurrency {:.2}x (the limit less \
         the weights and a profile run of the chunk without cache, over the block's bytes; it counts no decoding \
         sequence's own bytes and no block rounding)\n",
        Bytes(capacity),
        counted.max_sequences(limit, held),
        shape.context,
        counted.vllm_blocks(limit, held),
        counted.vllm_blocks(limit, held) * shape.block_size as u64,
        counted.vllm_concurrency(limit, held)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A check by count refuses only what surely cannot fit: the weights and
    /// the caches over the limit; a full count (with the step's own bytes)
    /// over it by a byte is a measurement's to settle (issue 84: `serve
    /// --check 412` refused before any step where 412 was proven to fit).
    #[test]
    fn the_count_before_building_refuses_only_by_a_lower_bound() {
        let config = Config::from_json(
            r#"{"model_type": "gpt2", "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4,
                "n_positions": 128, "activation_function": "gelu_new"}"#,
        )
        .unwrap();
        let shape = ServingShape {
            context: 128,
            chunk: 128,
            block_size: 16,
            weights: BaseDtype::F32,
            dtype: DType::F32,
            cache_dtype: DType::F32,
            on_cpu: true,
        };
        let counted = config.serving_bytes(&shape).unwrap();
        let (held, sequences) = (6 << 20, 400);
        let full = counted.bytes_at(sequences, held);
        let least = counted.least_bytes_at(sequences, held);
        assert!(least < full && counted.step_bytes_at(sequences) > 0);
        let refused =
            |limit| refuse_before_building(&config, &shape, &counted, held, limit, Asked::Sequences(sequences));
        assert!(refused(full - 1).is_ok(), "the step's own bytes are measured, not refused by count");
        assert!(refused(least).is_ok());
        let failure = refused(least - 1).unwrap_err();
        assert!(failure.message.contains("need at least"), "{}", failure.message);
    }
}
