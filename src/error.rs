//! The one error type of the crate.
//!
//! It depends only on leaves: the outcome of a trial, the headroom report, the
//! analytical model's remedies and the byte formatter.

use crate::estimate::change::Remedy;
use crate::headroom::report::HeadroomReport;
use crate::search::outcome::Outcome;
use crate::units::format_bytes;

/// The kinds of [`Error`] (see [`Error::kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// What was asked is invalid (a setting, a size, a model configuration,
    /// a combination): fix the request; nothing ran, or nothing that counts.
    Configuration,
    /// The request is valid but the model does not fit as asked (nothing
    /// fits, time ran out before anything fit, a headroom check failed):
    /// give it more memory or change the model; the error says how.
    DoesNotFit,
    /// The model's own step failed, or the probe cannot measure it whole
    /// (a cut graph under `strict`, an op with no backward pass).
    Model,
    /// The machine: the allocator, the device, its memory meter, the
    /// collective between ranks.
    Device,
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while configuring or running a tuning.
///
/// Each configuration variant names the offending value and what would be valid;
/// [`Error::Workload`] hands the workload's own error back untouched. Its
/// `Debug` form is its message, as with `anyhow`: a `main` that returns
/// `Result<(), autobatch::Error>` prints `Error: the tracking allocator is not
/// installed ...`, not a variant's name; match on the variants for the facts.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The utilization ceiling is not a fraction in (0, 1].
    #[error("ceiling {ceiling} is not a fraction in (0, 1]: pass e.g. 0.9 for 90% of device memory")]
    InvalidCeiling {
        /// The value given.
        ceiling: f64,
    },

    /// A setting that counts something was zero.
    #[error("{setting} is 0: it must be at least 1")]
    Zero {
        /// The builder method or argument that was zero, e.g. `multiple_of`.
        setting: &'static str,
    },

    /// `max_batch` is below `start`.
    #[error("max_batch {max_batch} is below start {start}: the search space is empty; use max_batch >= start")]
    MaxBatchBelowStart {
        /// The largest batch allowed.
        max_batch: usize,
        /// The smallest batch allowed.
        start: usize,
    },

    /// No multiple of the granularity lies between `start` and `max_batch`.
    #[error(
        "no multiple of {multiple_of} lies in [{start}, {max_batch}]: \
         lower multiple_of, lower start or raise max_batch"
    )]
    NoCandidate {
        /// The smallest batch allowed.
        start: usize,
        /// The largest batch allowed.
        max_batch: usize,
        /// The granularity.
        multiple_of: usize,
    },

    /// A batch size too large to double or multiply without overflowing `usize`.
    #[error("batch arithmetic overflows at {value}: use a smaller start, granularity or target")]
    Overflow {
        /// The value whose next step would overflow.
        value: usize,
    },

    /// The target effective batch cannot give every rank at least one
    /// micro-batch of the required granularity.
    #[error(
        "target effective batch {target} is below {world_size} ranks x a granularity of {multiple_of} = {smallest}: \
         every rank needs at least one micro-batch; use a target of at least {smallest}"
    )]
    TargetBelowWorldSize {
        /// The target effective batch.
        target: usize,
        /// The number of ranks.
        world_size: usize,
        /// The micro-batch granularity.
        multiple_of: usize,
        /// The smallest effective batch that is possible.
        smallest: usize,
    },

    /// Exactness was demanded and no micro-batch/accumulation split hits the target.
    #[error(
        "no split hits target effective batch {target} exactly with {world_size} ranks, \
         micro-batches that are multiples of {multiple_of} and at most {largest_micro_batch}, and at most \
         {max_steps} accumulation steps; the nearest above is {nearest}: accept it or use a target divisible by \
         ranks x granularity = {unit}"
    )]
    InexactEffectiveBatch {
        /// The target effective batch.
        target: usize,
        /// The number of ranks.
        world_size: usize,
        /// The micro-batch granularity.
        multiple_of: usize,
        /// The largest micro-batch that fits.
        largest_micro_batch: usize,
        /// Twice the fewest accumulation steps: the most the planner accepts for exactness.
        max_steps: usize,
        /// The nearest effective batch above the target that is possible.
        nearest: usize,
        /// world_size x multiple_of.
        unit: usize,
    },

    /// Exactness was demanded of uneven ranks and the global batch is not a
    /// whole number of granules.
    #[error(
        "global batch {target} cannot be shared exactly in micro-batches that are multiples of {multiple_of}; \
         the nearest above is {nearest}: accept it or use a global batch divisible by {multiple_of}"
    )]
    InexactGlobalBatch {
        /// The global batch asked for.
        target: usize,
        /// The micro-batch granularity.
        multiple_of: usize,
        /// The nearest global batch above the target that is possible.
        nearest: usize,
    },

    /// Not even the smallest candidate batch fits under the ceiling.
    #[error(
        "nothing fits: batch {batch} (the smallest candidate) {}; the ceiling is {} of {} = {}{}{}",
        describe_failure(*.outcome, *.peak_bytes),
        crate::units::format_percent(*.ceiling),
        format_bytes(*.capacity_bytes),
        format_bytes(*.limit_bytes),
        describe_smaller_batch(*.smaller_batch),
        describe_remedies(.remedies)
    )]
    NothingFits {
        /// The smallest batch tried.
        batch: usize,
        /// How it failed.
        outcome: Outcome,
        /// Its measured device-wide peak, where the meter could read one.
        peak_bytes: Option<u64>,
        /// The device capacity.
        capacity_bytes: u64,
        /// ceiling x capacity, in bytes.
        limit_bytes: u64,
        /// The utilization ceiling.
        ceiling: f64,
        /// A batch below the smallest candidate that the failed trial's
        /// measurement says would fit (the step's memory above the fixed
        /// bytes taken as proportional to the batch), when there is one: a
        /// lower `start` finds it.
        smaller_batch: Option<usize>,
        /// What would make the smallest candidate fit, largest saving first:
        /// the analytical model ([`Setup`](crate::estimate::Setup)) started
        /// from what the failed trial measured, each total the whole
        /// device's; empty when the workload has no [`Profile`](crate::Profile).
        remedies: Vec<Remedy>,
    },

    /// The workload failed with an error that is not an out-of-memory error.
    /// The search stops at once; the workload's error is `source`, untouched.
    #[error(
        "the workload failed at batch {batch} with an error that is not out-of-memory: {}",
        candle_message(.source)
    )]
    Workload {
        /// The batch being tried.
        batch: usize,
        /// The workload's own error.
        #[source]
        source: candle_core::Error,
    },

    /// [`Tuner::strict`](crate::Tuner::strict) and the measured step did not
    /// reach every variable: a cut graph (a fused op without a backward pass)
    /// measured less than training a model that reaches them needs.
    #[error(
        "the measured step did not reach the gradients of {} of {of} variables ({}): its largest batch \
         understates training; make the graph whole (autobatch's ops module has differentiable forms of candle's \
         fused ops) or drop strict",
        .variables.len(),
        first_names(.variables)
    )]
    PartialGraph {
        /// The variables with no gradient that the forward pass does not write.
        variables: Vec<String>,
        /// The float variables in all.
        of: usize,
    },

    /// The workload's backward pass reached an op candle cannot
    /// differentiate (a max-pool whose kernel is not its stride, a custom op
    /// without a backward, ...): no batch can be measured for training.
    #[error(
        "the backward pass failed at batch {batch}: candle cannot differentiate {op} ({}); probe the forward \
         pass alone (ModelProbe::forward_only) for serving or evaluation, or replace the op with one candle \
         can differentiate",
        candle_message(.source)
    )]
    BackwardUnsupported {
        /// The batch being tried.
        batch: usize,
        /// The op, as candle names it.
        op: String,
        /// candle's error, untouched.
        #[source]
        source: Box<candle_core::Error>,
    },

    /// [`HeapMeter`](crate::HeapMeter) needs [`TrackingAllocator`](crate::TrackingAllocator)
    /// as the global allocator, and it is not.
    #[error(
        "the tracking allocator is not installed: add \
         `#[global_allocator] static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();` \
         to the binary or test crate"
    )]
    AllocatorNotInstalled,

    /// A plan for uneven ranks names a rank its split does not have (a plan
    /// edited by hand, or from another job).
    #[error("the plan is for rank {rank}, but its split has ranks 0..{world_size}")]
    RankOutOfRange {
        /// The plan's rank.
        rank: usize,
        /// The ranks in its split.
        world_size: usize,
    },

    /// [`TrainLoop`](crate::TrainLoop) was given a plan for uneven ranks: its
    /// losses are scaled to the global batch, which only an all-reduce over the
    /// ranks makes whole, and the loop has none.
    #[error(
        "this plan shares a global batch over {world_size} uneven ranks: its micro-batch losses are scaled to the \
         global batch and need the gradients summed over ranks before the update; TrainLoop has no all-reduce: \
         drive each rank with Guard::new(&plan) and your collective"
    )]
    UnevenPlanNeedsAllReduce {
        /// The ranks of the plan's split.
        world_size: usize,
    },

    /// A batch was asked for an input size past the longest one probed.
    #[error(
        "size {size} is past the longest size probed, {longest}: probe it (or a longer one) to get a batch for it"
    )]
    SizeOutOfRange {
        /// The size asked about.
        size: usize,
        /// The longest size probed.
        longest: usize,
    },

    /// Tuning at one of several input sizes failed.
    #[error("at size {size}: {source}")]
    AtSize {
        /// The input size.
        size: usize,
        /// What went wrong there.
        source: Box<Error>,
    },

    /// A model's `config.json` asks for something not computed here, or is
    /// not one ([`models::Config`](crate::models::Config)): the field, what it
    /// held, what would be valid.
    #[error("config field {field} = {value} is not supported: use {valid}")]
    UnsupportedConfig {
        /// The field, e.g. `model_type` or `rope_scaling.rope_type`.
        field: String,
        /// What it held.
        value: String,
        /// What would be valid.
        valid: String,
    },

    /// A reference model's size setting is out of range.
    #[error("model setting {setting} = {value} is invalid: it must be {valid}")]
    InvalidModel {
        /// The setting, e.g. `heads`.
        setting: &'static str,
        /// The value given.
        value: usize,
        /// What would be valid.
        valid: String,
    },

    /// A byte count past what 64 bits hold (16 EiB): an estimate of an absurd
    /// model, never a wrapped number.
    #[error("{what} comes to 2^64 bytes (16 EiB) or more, past what this tool counts")]
    ByteOverflow {
        /// What was being counted.
        what: String,
    },

    /// A sharding of the training state that does not exist.
    #[error("{what} is not a sharding: use {valid}")]
    InvalidSharding {
        /// What was asked for.
        what: String,
        /// What would be valid.
        valid: &'static str,
    },

    /// A reference model too large to build: not even the smallest batch
    /// could stay under the limit, or its sizes do not fit in this machine's
    /// numbers. Refused before anything is allocated.
    #[error(
        "{}{model} needs {needs}{}",
        if .limit_bytes.is_some() { "nothing fits: " } else { "" },
        describe_limit(*.limit_bytes, *.batch)
    )]
    ModelTooLarge {
        /// The model and its size.
        model: String,
        /// What it needs, in words.
        needs: String,
        /// The smallest batch the check was for.
        batch: usize,
        /// The limit (ceiling × capacity) it was checked against; `None` when
        /// no machine could hold it.
        limit_bytes: Option<u64>,
    },

    /// A reference model was asked for a dtype it does not train in.
    #[error("{dtype} is not supported here: use {valid}")]
    UnsupportedDtype {
        /// The dtype asked for.
        dtype: String,
        /// The dtypes that work.
        valid: &'static str,
    },

    /// [`Tuner::time_limit`](crate::Tuner::time_limit) passed before any
    /// batch was seen to fit.
    #[error(
        "the {limit_ms} ms time limit passed after {trials} trials with no batch seen to fit: \
         allow more time (the first trials include the warm-up)"
    )]
    TimeLimit {
        /// The limit, in milliseconds.
        limit_ms: u64,
        /// Trials run before it passed.
        trials: usize,
    },

    /// A batch-search setting given to a search over the input size
    /// ([`Tuner::run_longest`](crate::Tuner::run_longest)), where it means nothing.
    #[error(
        "{setting} is a setting of the batch search and does not apply to the search over the input size \
         (the batch is fixed; the sizes come from the size range): leave it unset"
    )]
    NotForSizeSearch {
        /// The builder method that was set, e.g. `target_effective_batch`.
        setting: &'static str,
    },

    /// Even the shortest input size does not fit at the batch asked for
    /// ([`Tuner::run_longest`](crate::Tuner::run_longest)).
    #[error(
        "nothing fits at batch {batch}: the shortest size, {size}, {} ({}); the limit is {} ({:.0}% of {}): {}",
        match outcome { Outcome::OutOfMemory => "ran out of memory", _ => "went over the ceiling" },
        peak_bytes.map_or_else(|| "no peak read".to_owned(), |p| format!("peak {}", format_bytes(p))),
        format_bytes(*limit_bytes),
        100.0 * (*limit_bytes as f64) / (*capacity_bytes).max(1) as f64,
        format_bytes(*capacity_bytes),
        if *batch > 1 { "use a smaller batch" } else { "make the model smaller or raise the capacity" }
    )]
    NoSizeFits {
        /// The batch every step ran at.
        batch: usize,
        /// The shortest size tried.
        size: usize,
        /// How its step ended.
        outcome: Outcome,
        /// Its peak, when read.
        peak_bytes: Option<u64>,
        /// The device's capacity.
        capacity_bytes: u64,
        /// The limit (ceiling × capacity).
        limit_bytes: u64,
    },

    /// A meter that cannot read a step's peak on this device (a CUDA device
    /// whose memory pool does not see candle's allocations): refused, since a
    /// peak that reads a constant would call every step a fit.
    #[error("cannot measure peaks on {device}: {reason}")]
    PeakUnreadable {
        /// The device.
        device: String,
        /// Why, and what would work.
        reason: String,
    },

    /// An optimizer a reference model cannot be probed with (no dry step).
    #[error("optimizer {optimizer} is not supported here: use {valid}")]
    UnsupportedOptimizer {
        /// The optimizer asked for.
        optimizer: String,
        /// The optimizers that work.
        valid: &'static str,
    },

    /// A change that must come before training, asked for after it started.
    #[error("the trainer already ran {steps} training steps: {change} before the first one")]
    AlreadyTrained {
        /// Training steps already run.
        steps: u64,
        /// What must come first, e.g. "choose the optimizer".
        change: &'static str,
    },

    /// An accelerator name [`estimate::accelerator`](crate::estimate::accelerator) does not know.
    #[error("unknown accelerator '{name}': known names are {known} (or give its memory, e.g. 80GB)")]
    UnknownAccelerator {
        /// The name asked for.
        name: String,
        /// The names that are known, comma-separated.
        known: String,
    },

    /// candle failed outside a probed step (building a model, a training step).
    #[error("candle: {}", candle_message(.0))]
    Candle(#[from] candle_core::Error),

    /// A plan cache was asked for without a way to fingerprint the model.
    #[error(
        "the plan cache needs to know what decides the model's memory: give Tuner::cache_key(CacheKey::new()\
         .variables(..).param(\"seq_len\", ..)) or a workload whose cache_key() says it"
    )]
    CacheKeyMissing,

    /// The runtime guard ran out of memory with a micro-batch of one sample.
    #[error("out of memory at a micro-batch of 1 (sample {offset} of the step): nothing smaller to try; lower the model's memory (see `autobatch estimate`)")]
    GuardExhausted {
        /// The sample that did not fit alone.
        offset: usize,
    },

    /// A collective operation between ranks failed.
    #[error("collective: {0}")]
    Collective(String),

    /// Another rank could not tune (nothing fits there, or its workload failed):
    /// its own error is in its log. Every rank stops, so that none trains alone.
    #[error("another rank could not find a batch that fits (see that rank's error); no rank will train")]
    RankFailed,

    /// The tuner's world size differs from the collective's.
    #[error(
        "world_size {tuner} differs from the collective's {collective}: leave world_size unset for run_distributed"
    )]
    WorldSizeMismatch {
        /// The tuner's setting.
        tuner: usize,
        /// The collective's world size.
        collective: usize,
    },

    /// A comparison variant's expectation that cannot be used.
    #[error("variant '{variant}' expects {what} = {value}: it must be {valid}")]
    InvalidExpectation {
        /// The variant's name.
        variant: String,
        /// Which part of the expectation.
        what: &'static str,
        /// The value given.
        value: String,
        /// What would be valid.
        valid: String,
    },

    /// A headroom minimum outside [0, 1).
    #[error(
        "minimum headroom {min_headroom} is not a fraction in [0, 1): pass e.g. 0.1 to keep 10% of the device free"
    )]
    InvalidHeadroom {
        /// The value given.
        min_headroom: f64,
    },

    /// A headroom check failed: the step ran out of memory or left less free
    /// than the minimum.
    #[error("memory headroom regression: {0}")]
    InsufficientHeadroom(Box<HeadroomReport>),

    /// A CUDA device could not be used.
    #[error("CUDA device {ordinal} is not available: {reason}")]
    CudaUnavailable {
        /// The GPU ordinal asked for.
        ordinal: usize,
        /// Why, and what would be valid.
        reason: String,
    },

    /// A CUDA meter was given a device that is not a CUDA device.
    #[error("{device} is not a CUDA device: CudaMeter measures CUDA devices; build the model on Device::new_cuda(n)")]
    NotCuda {
        /// The device given, as candle prints it.
        device: String,
    },

    /// A memory meter could not measure.
    #[error("memory meter: {0}")]
    Meter(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The first few of `names` and how many more: a line people can read.
pub(crate) fn first_names(names: &[String]) -> String {
    const SHOWN: usize = 8;
    let mut text = names.iter().take(SHOWN).map(String::as_str).collect::<Vec<_>>().join(", ");
    if names.len() > SHOWN {
        text += &format!(" and {} more", names.len() - SHOWN);
    }
    text
}

/// The op candle says it cannot differentiate, when that is `err`:
/// `Error::BackwardNotSupported` (custom ops, `ceil`, transposed 1-d
/// convolutions) or the text `backward not supported for OP ...` (pooling whose
/// kernel is not its stride, non-integer upsampling).
fn unsupported_backward(err: &candle_core::Error) -> Option<String> {
    match err {
        candle_core::Error::WithBacktrace { inner, .. } | candle_core::Error::Context { inner, .. } => {
            unsupported_backward(inner)
        }
        candle_core::Error::BackwardNotSupported { op } => Some((*op).to_owned()),
        candle_core::Error::Msg(text) => {
            let rest = text.strip_prefix("backward not supported for ")?;
            Some(rest.split_whitespace().next().unwrap_or(rest).to_owned())
        }
        _ => None,
    }
}

impl std::fmt::Debug for Error {
    /// The message, then what caused it, one cause a line; candle's errors
    /// without their backtraces (see [`candle_message`]).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let message = self.to_string();
        f.write_str(&message)?;
        let mut cause = std::error::Error::source(self);
        while let Some(err) = cause {
            let text = match err.downcast_ref::<candle_core::Error>() {
                Some(candle) => candle_message(candle),
                None => err.to_string(),
            };
            // most messages already end with their cause's
            if !message.contains(&text) {
                write!(f, "\ncaused by: {text}")?;
            }
            cause = err.source();
        }
        Ok(())
    }
}

/// A candle error's text without the backtrace candle captures when
/// `RUST_BACKTRACE` is set: formatting a backtrace resolves its symbols, which
/// loads the binary's debug info and keeps it on the heap for good (30 MiB
/// measured), where every later heap measurement would count it.
#[doc(hidden)]
pub fn candle_message(err: &candle_core::Error) -> String {
    match err {
        candle_core::Error::WithBacktrace { inner, .. } => candle_message(inner),
        candle_core::Error::Context { inner, context } => format!("{context}: {}", candle_message(inner)),
        candle_core::Error::WithPath { inner, path } => format!("{}: {}", path.display(), candle_message(inner)),
        other => other.to_string(),
    }
}

/// How a failed trial failed, for people: `peaked at 9.4 MiB`, `ran out of memory`.
#[doc(hidden)]
pub fn describe_failure(outcome: Outcome, peak_bytes: Option<u64>) -> String {
    let peak = peak_bytes.map(format_bytes);
    match (outcome, peak) {
        (Outcome::OutOfMemory, Some(peak)) => format!("ran out of memory (peak seen {peak})"),
        (Outcome::OutOfMemory, None) => "ran out of memory".to_owned(),
        (_, Some(peak)) => format!("peaked at {peak}"),
        (_, None) => "went over the ceiling".to_owned(),
    }
}

fn describe_limit(limit_bytes: Option<u64>, batch: usize) -> String {
    match limit_bytes {
        Some(limit) => format!(
            ", more than the limit of {} (ceiling × capacity): not even batch {batch} can fit; \
             make the model or the smallest batch smaller, or raise the capacity",
            format_bytes(limit)
        ),
        None => ": more than this machine can address; make the model smaller".to_owned(),
    }
}

fn describe_smaller_batch(smaller_batch: Option<usize>) -> String {
    match smaller_batch {
        Some(batch) => format!("; batch {batch} would fit by the measured bytes per sample (lower the start)"),
        None => String::new(),
    }
}

fn describe_remedies(remedies: &[Remedy]) -> String {
    if remedies.is_empty() {
        return String::new();
    }
    let listed: Vec<String> = remedies.iter().map(|r| r.to_string()).collect();
    format!("; what would help, each alone: {}", listed.join("; "))
}

impl Error {
    /// Wraps a meter's failure: for [`MemoryMeter`](crate::MemoryMeter) implementations.
    ///
    /// ```
    /// let err = autobatch::Error::meter("pool attribute unavailable");
    /// assert_eq!(err.to_string(), "memory meter: pool attribute unavailable");
    /// ```
    pub fn meter(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Error::Meter(err.into())
    }

    /// What kind of failure this is: what decides how to react (fix the
    /// request, give the model more memory, fix the model, look at the
    /// machine). An exhaustive match: a new variant must be given a kind.
    ///
    /// ```
    /// use autobatch::search::SearchSpace;
    /// use autobatch::ErrorKind;
    ///
    /// let err = SearchSpace::new(0, None, 1).unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::Configuration);
    /// assert!(err.is_configuration());
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::AtSize { source, .. } => source.kind(),
            Error::InvalidCeiling { .. }
            | Error::Zero { .. }
            | Error::MaxBatchBelowStart { .. }
            | Error::NoCandidate { .. }
            | Error::Overflow { .. }
            | Error::ByteOverflow { .. }
            | Error::InvalidSharding { .. }
            | Error::TargetBelowWorldSize { .. }
            | Error::InexactEffectiveBatch { .. }
            | Error::InexactGlobalBatch { .. }
            | Error::RankOutOfRange { .. }
            | Error::SizeOutOfRange { .. }
            | Error::UnevenPlanNeedsAllReduce { .. }
            | Error::InvalidModel { .. }
            | Error::UnsupportedConfig { .. }
            | Error::UnsupportedDtype { .. }
            | Error::UnknownAccelerator { .. }
            | Error::UnsupportedOptimizer { .. }
            | Error::AlreadyTrained { .. }
            | Error::NotForSizeSearch { .. }
            | Error::InvalidHeadroom { .. }
            | Error::InvalidExpectation { .. }
            | Error::CacheKeyMissing
            | Error::WorldSizeMismatch { .. }
            | Error::ModelTooLarge { limit_bytes: None, .. } => ErrorKind::Configuration,
            Error::NothingFits { .. }
            | Error::NoSizeFits { .. }
            | Error::ModelTooLarge { limit_bytes: Some(_), .. }
            | Error::TimeLimit { .. }
            | Error::GuardExhausted { .. }
            | Error::InsufficientHeadroom(_) => ErrorKind::DoesNotFit,
            Error::Workload { .. } | Error::PartialGraph { .. } | Error::BackwardUnsupported { .. } => ErrorKind::Model,
            Error::AllocatorNotInstalled
            | Error::PeakUnreadable { .. }
            | Error::Candle(_)
            | Error::Collective(_)
            | Error::RankFailed
            | Error::CudaUnavailable { .. }
            | Error::NotCuda { .. }
            | Error::Meter(_) => ErrorKind::Device,
        }
    }

    /// Whether the error is in what was asked (a setting, a size, a model
    /// configuration) rather than in what happened while running: the command
    /// line reports these as usage errors. `kind() == ErrorKind::Configuration`.
    pub fn is_configuration(&self) -> bool {
        self.kind() == ErrorKind::Configuration
    }

    /// [`Error::NothingFits`] at `batch` with no advice: what a check of an
    /// accumulating micro-step reports when even the smallest one fails.
    pub(crate) fn nothing_fits_at(
        batch: usize,
        outcome: Outcome,
        peak_bytes: Option<u64>,
        (capacity_bytes, limit_bytes, ceiling): (u64, u64, f64),
    ) -> Error {
        Error::NothingFits {
            batch,
            outcome,
            peak_bytes,
            capacity_bytes,
            limit_bytes,
            ceiling,
            smaller_batch: None,
            remedies: Vec::new(),
        }
    }

    /// [`Error::NothingFits`] with what would fit: a smaller batch, remedies.
    pub(crate) fn with_advice(mut self, smaller: Option<usize>, advice: Vec<Remedy>) -> Error {
        if let Error::NothingFits { smaller_batch, remedies, .. } = &mut self {
            (*smaller_batch, *remedies) = (smaller, advice);
        }
        self
    }

    /// The error of a workload step at `batch` that is not out of memory:
    /// [`Error::BackwardUnsupported`] when candle cannot differentiate an op
    /// the step uses, else [`Error::Workload`].
    pub(crate) fn workload(batch: usize, source: candle_core::Error) -> Error {
        match unsupported_backward(&source) {
            Some(op) => Error::BackwardUnsupported { batch, op, source: Box::new(source) },
            None => Error::Workload { batch, source },
        }
    }

    /// The workload's own error, when this is [`Error::Workload`].
    pub fn workload_error(&self) -> Option<&candle_core::Error> {
        match self {
            Error::Workload { source, .. } => Some(source),
            Error::BackwardUnsupported { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_groups_what_the_caller_does_about_it() {
        let at_size = |source: Error| Error::AtSize { size: 64, source: Box::new(source) };
        let cases = [
            (Error::Zero { setting: "start" }, ErrorKind::Configuration),
            (Error::CacheKeyMissing, ErrorKind::Configuration),
            (
                Error::ModelTooLarge { model: "m".into(), needs: "1 TiB".into(), batch: 1, limit_bytes: None },
                ErrorKind::Configuration,
            ),
            (
                Error::ModelTooLarge { model: "m".into(), needs: "1 TiB".into(), batch: 1, limit_bytes: Some(1) },
                ErrorKind::DoesNotFit,
            ),
            (Error::TimeLimit { limit_ms: 10, trials: 1 }, ErrorKind::DoesNotFit),
            (Error::GuardExhausted { offset: 3 }, ErrorKind::DoesNotFit),
            (Error::PartialGraph { variables: vec!["ln.weight".into()], of: 2 }, ErrorKind::Model),
            (Error::AllocatorNotInstalled, ErrorKind::Device),
            (Error::RankFailed, ErrorKind::Device),
            (at_size(Error::Zero { setting: "start" }), ErrorKind::Configuration),
            (at_size(Error::TimeLimit { limit_ms: 10, trials: 1 }), ErrorKind::DoesNotFit),
        ];
        for (err, kind) in cases {
            assert_eq!(err.kind(), kind, "{err}");
            assert_eq!(err.is_configuration(), kind == ErrorKind::Configuration, "{err}");
        }
    }
}
