//! The one error type of the crate.
//!
//! An [`Error`] says what went wrong in the crate's own terms: each variant
//! holds the facts, typed, and its message is written beside it from them,
//! naming a setting by its builder method (`Tuner::multiple_of`). A caller
//! that exposes the settings under other names (a command line's flags)
//! gives its names to [`Error::message`]: each sentence is written once, in
//! `message.rs`.
//!
//! It depends only on leaves: the outcome of a trial, the headroom report, the
//! analytical model's remedies, the optimizer vocabulary and the formatters.

use std::borrow::Cow;

mod message;

pub(crate) use message::BuilderNames;
pub use message::Names;

use crate::estimate::change::Remedy;
use crate::headroom::report::HeadroomReport;
use crate::per_parameter::OptimizerKind;
use crate::search::outcome::Outcome;
use crate::setting::Setting;
use crate::units::format_bytes;

/// The kinds of [`Error`] (see [`Error::kind`]): what decides how to react.
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

/// What would be valid, where an [`Error::InvalidSetting`] refused a value:
/// typed where it names another setting, so that a caller naming settings
/// its own way names that one too (not `non_exhaustive`, as [`Setting`]: a
/// caller matching every form does not compile until it names a new one).
#[derive(Clone, Debug, PartialEq)]
pub enum Valid {
    /// A count of at least 1.
    AtLeastOne,
    /// At least another setting's value (`Tuner::max_batch` at least `Tuner::start`).
    AtLeast {
        /// The other setting.
        setting: Setting,
        /// Its value.
        value: usize,
    },
    /// A multiple of another setting's value (a batch checked, of `Tuner::multiple_of`).
    MultipleOf {
        /// The other setting.
        setting: Setting,
        /// Its value.
        value: usize,
    },
    /// A target of at least one micro-batch of `multiple_of` on each of
    /// `world_size` ranks (the setting `ranks` says how many).
    MicroBatchPerRank {
        /// The setting giving the ranks.
        ranks: Setting,
        /// The ranks.
        world_size: usize,
        /// The granularity ([`Setting::MultipleOf`]).
        multiple_of: usize,
    },
    /// At most one device per parameter: `tensor_parallel` ×
    /// `partitioned` ZeRO ranks sharing `parameters`.
    DevicePerParameter {
        /// Tensor-parallel ranks ([`Setting::TensorParallel`]).
        tensor_parallel: u64,
        /// ZeRO ranks the states are partitioned over ([`Setting::DataParallel`]).
        partitioned: u64,
        /// The model's parameters.
        parameters: u64,
    },
    /// In words that name no other setting.
    Said(Cow<'static, str>),
}

impl std::fmt::Display for Valid {
    /// The settings named by builder method.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message(&BuilderNames))
    }
}

impl From<&'static str> for Valid {
    fn from(words: &'static str) -> Self {
        Valid::Said(words.into())
    }
}

impl From<String> for Valid {
    fn from(words: String) -> Self {
        Valid::Said(words.into())
    }
}

/// The value an [`Error::InvalidSetting`] refused, as a type where it has one.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// A count or size.
    Count(usize),
    /// A fraction, such as a ceiling.
    Fraction(f64),
    /// A dtype.
    Dtype(candle_core::DType),
    /// An optimizer.
    Optimizer(OptimizerKind),
    /// Text as given: a name, a `config.json` value.
    Text(String),
    /// The setting was given where it means nothing.
    Given,
    /// The setting was needed and not given.
    Missing,
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Count(count) => write!(f, "{count}"),
            Value::Fraction(fraction) => write!(f, "{fraction}"),
            Value::Dtype(dtype) => f.write_str(dtype.as_str()),
            Value::Optimizer(kind) => f.write_str(kind.name()),
            Value::Text(text) => f.write_str(text),
            Value::Given => f.write_str("set"),
            Value::Missing => f.write_str("missing"),
        }
    }
}

/// What is wrong with the machine (see [`Error::Device`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceProblem {
    /// [`HeapMeter`](crate::HeapMeter) needs
    /// [`TrackingAllocator`](crate::TrackingAllocator) as the global
    /// allocator, and it is not.
    AllocatorNotInstalled,
    /// A meter cannot read a step's peak on this device (a CUDA device
    /// whose memory pool does not see candle's allocations): refused, since a
    /// peak that reads a constant would call every step a fit.
    PeaksUnreadable {
        /// The device.
        device: String,
        /// Why, and what would work.
        reason: String,
    },
    /// A CUDA device could not be used.
    CudaUnavailable {
        /// The GPU ordinal asked for.
        ordinal: usize,
        /// Why, and what would be valid.
        reason: String,
    },
    /// A CUDA meter was given a device that is not a CUDA device.
    NotCuda {
        /// The device given, as candle prints it.
        device: String,
    },
}

impl std::fmt::Display for DeviceProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceProblem::AllocatorNotInstalled => f.write_str(
                "the tracking allocator is not installed: add \
                 `#[global_allocator] static ALLOCATOR: autobatch::TrackingAllocator = \
                 autobatch::TrackingAllocator::new();` to the binary or test crate",
            ),
            DeviceProblem::PeaksUnreadable { device, reason } => {
                write!(f, "cannot measure peaks on {device}: {reason}")
            }
            DeviceProblem::CudaUnavailable { ordinal, reason } => {
                write!(f, "CUDA device {ordinal} is not available: {reason}")
            }
            DeviceProblem::NotCuda { device } => write!(
                f,
                "{device} is not a CUDA device: CudaMeter measures CUDA devices; build the model on Device::new_cuda(n)"
            ),
        }
    }
}

/// Everything that can go wrong while configuring or running a tuning.
///
/// [`Error::kind`] is the way in: it says whether to fix the request, give
/// the model more memory, fix the model or look at the machine; the variants
/// hold the facts, typed. An invalid setting is one variant,
/// [`Error::InvalidSetting`], naming the setting, the value and what would be
/// valid; [`Error::Workload`] hands the workload's own error back untouched.
/// Its `Debug` form is its message, as with `anyhow`: a `main` that returns
/// `Result<(), autobatch::Error>` prints `Error: the tracking allocator is not
/// installed ...`, not a variant's name.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting, size or model configuration has a value that is not
    /// valid: zero where a count is needed, a ceiling outside (0, 1], a
    /// dtype or optimizer not supported, a target below the ranks, a setting
    /// given where it means nothing.
    #[error("{}", self.message(&BuilderNames))]
    InvalidSetting {
        /// What was set.
        setting: Setting,
        /// What it held.
        value: Value,
        /// What would be valid.
        valid: Valid,
    },

    /// No multiple of the granularity lies between `start` and `max_batch`.
    #[error("{}", self.message(&BuilderNames))]
    NoCandidate {
        /// The smallest batch allowed.
        start: usize,
        /// The largest batch allowed.
        max_batch: usize,
        /// The granularity.
        multiple_of: usize,
    },

    /// Batch arithmetic past what 64 bits hold. Refused, never wrapped or
    /// saturated.
    #[error("{}", self.message(&BuilderNames))]
    BatchOverflow {
        /// The value the arithmetic started from.
        value: usize,
        /// The settings to lower, any of them.
        lower: &'static [Setting],
    },

    /// A byte count of 2^64 (16 EiB) or more. Refused, never wrapped or saturated.
    #[error("{what} is past what 64 bits count: it comes to 2^64 bytes (16 EiB) or more; make the model smaller")]
    ByteOverflow {
        /// What was being counted.
        what: String,
    },

    /// Exactness was demanded and no micro-batch/accumulation split hits the
    /// target (the effective batch of even ranks, the global batch of uneven ones).
    #[error("{}", self.message(&BuilderNames))]
    InexactTarget {
        /// The target.
        target: usize,
        /// The micro-batch granularity.
        multiple_of: usize,
        /// The nearest batch above the target that is possible.
        nearest: usize,
        /// The number of ranks.
        world_size: usize,
        /// The accumulation steps of the nearest split: with even ranks the
        /// fewest at the largest micro-batch, and an exact split may take at
        /// most twice as many (the planner's bound for exactness).
        accumulation_steps: usize,
        /// With even ranks, the largest micro-batch that fits; `None` for
        /// uneven ranks, whose global batch needs only to be a whole number
        /// of granules.
        largest_micro_batch: Option<usize>,
    },

    /// A change that must come before training, asked for after it started.
    #[error("the trainer already ran {steps} training steps: {change} before the first one")]
    AlreadyTrained {
        /// Training steps already run.
        steps: u64,
        /// What must come first, e.g. "choose the optimizer".
        change: &'static str,
    },

    /// Not even the smallest candidate fits under the ceiling: the smallest
    /// batch, or, in a search over the input size at a fixed batch
    /// ([`Search::longest`](crate::Search::longest)), the shortest size.
    #[error("{}", self.message(&BuilderNames))]
    NothingFits {
        /// The smallest batch tried, or the fixed batch of a size search.
        batch: usize,
        /// The shortest size tried, in a search over the input size.
        size: Option<usize>,
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
        /// the analytical model ([`TrainingSetup`](crate::estimate::TrainingSetup)) started
        /// from what the failed trial measured, each total the whole
        /// device's; empty when the workload has no
        /// [`profile`](crate::Workload::profile).
        remedies: Vec<Remedy>,
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

    /// [`Tuner::time_limit`](crate::Tuner::time_limit) passed before any
    /// batch was seen to fit.
    #[error("{}", self.message(&BuilderNames))]
    TimeLimit {
        /// The limit, in milliseconds.
        limit_ms: u64,
        /// Trials run before it passed.
        trials: usize,
    },

    /// The runtime guard ran out of memory with a micro-batch of one sample.
    #[error(
        "out of memory at a micro-batch of 1 (sample {offset} of the step): nothing smaller to try; lower the \
         model's memory (a shorter input, a leaner precision or optimizer, checkpointing)"
    )]
    GuardExhausted {
        /// The sample that did not fit alone.
        offset: usize,
    },

    /// A headroom check failed: the step ran out of memory or left less free
    /// than the minimum.
    #[error("memory headroom regression: {0}")]
    InsufficientHeadroom(Box<HeadroomReport>),

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
        source: candle_core::Error,
    },

    /// The workload's backward pass reached an op candle cannot
    /// differentiate (a max-pool whose kernel is not its stride, a custom op
    /// without a backward, ...): no batch can be measured for training.
    #[error(
        "the backward pass failed at batch {batch}: candle cannot differentiate {op} ({}); probe the forward \
         pass alone (ModelProbe::forward_only) for serving or evaluation, or replace the op with one candle can \
         differentiate",
        candle_message(.source)
    )]
    BackwardUnsupported {
        /// The batch being tried.
        batch: usize,
        /// The op, as candle names it.
        op: String,
        /// candle's error, untouched.
        source: Box<candle_core::Error>,
    },

    /// The measured step did not reach every variable: a cut graph (a fused
    /// op without a backward pass) measures less than training a model that
    /// reaches them needs (refused unless
    /// [`Tuner::allow_partial_graph`](crate::Tuner::allow_partial_graph)).
    /// The `autobatch-models` package's `ops` has differentiable forms of
    /// candle's fused norms, softmax and rotations.
    #[error("{}", self.message(&BuilderNames))]
    PartialGraph {
        /// The variables with no gradient that the forward pass does not write.
        variables: Vec<String>,
        /// The float variables in all.
        of: usize,
    },

    /// candle failed outside a probed step and outside building a model (a
    /// training step, an allocation).
    #[error("candle: {}", candle_message(.0))]
    Candle(#[from] candle_core::Error),

    /// candle refused to build a model from its config or checkpoint (a
    /// tensor's shape or dtype, a quantization its sizes do not allow): a
    /// problem of the model, not of the device.
    #[error("building the model: {}", candle_message(.0))]
    ModelBuild(candle_core::Error),

    /// Tuning at one of several input sizes failed.
    #[error("{}", self.message(&BuilderNames))]
    AtSize {
        /// The input size.
        size: usize,
        /// What went wrong there.
        source: Box<Error>,
    },

    /// The machine cannot be used as asked: no tracking allocator, no CUDA
    /// device, a pool whose peaks cannot be read.
    #[error("{0}")]
    Device(DeviceProblem),

    /// A collective operation between ranks failed.
    #[error("collective: {0}")]
    Collective(String),

    /// Another rank could not tune (nothing fits there, or its workload failed):
    /// its own error is in its log. Every rank stops, so that none trains alone.
    #[error("another rank could not find a batch that fits (see that rank's error); no rank will train")]
    RankFailed,

    /// An input of a package built on this one refused (a model's
    /// configuration): that package's own error, whole, to downcast.
    #[error("{}", self.message(&BuilderNames))]
    Input(Box<dyn std::error::Error + Send + Sync>),

    /// A memory meter could not measure.
    #[error("memory meter: {0}")]
    Meter(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl std::fmt::Debug for Error {
    /// The message, then what caused it, one cause a line; candle's errors
    /// without the backtraces they may carry.
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

/// A candle error's text without the backtrace candle captures when
/// `RUST_BACKTRACE` is set: formatting a backtrace resolves its symbols, which
/// loads the binary's debug info and keeps it on the heap for good (30 MiB
/// measured), where every later heap measurement would count it.
pub(crate) fn candle_message(err: &candle_core::Error) -> String {
    match err {
        candle_core::Error::WithBacktrace { inner, .. } => candle_message(inner),
        candle_core::Error::Context { inner, context } => format!("{context}: {}", candle_message(inner)),
        candle_core::Error::WithPath { inner, path } => format!("{}: {}", path.display(), candle_message(inner)),
        other => other.to_string(),
    }
}

/// How a failed trial failed, for people: `peaked at 9.4 MiB`, `ran out of memory`.
pub(crate) fn describe_failure(outcome: Outcome, peak_bytes: Option<u64>) -> String {
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
            Error::InvalidSetting { .. }
            | Error::NoCandidate { .. }
            | Error::BatchOverflow { .. }
            | Error::ByteOverflow { .. }
            | Error::InexactTarget { .. }
            | Error::AlreadyTrained { .. }
            | Error::Input(_)
            | Error::ModelTooLarge { limit_bytes: None, .. } => ErrorKind::Configuration,
            Error::NothingFits { .. }
            | Error::ModelTooLarge { limit_bytes: Some(_), .. }
            | Error::TimeLimit { .. }
            | Error::GuardExhausted { .. }
            | Error::InsufficientHeadroom(_) => ErrorKind::DoesNotFit,
            Error::Workload { .. }
            | Error::PartialGraph { .. }
            | Error::BackwardUnsupported { .. }
            | Error::ModelBuild(_) => ErrorKind::Model,
            Error::Device(_) | Error::Candle(_) | Error::Collective(_) | Error::RankFailed | Error::Meter(_) => {
                ErrorKind::Device
            }
        }
    }

    /// Whether the error is in what was asked (a setting, a size, a model
    /// configuration) rather than in what happened while running: the command
    /// line reports these as usage errors. `kind() == ErrorKind::Configuration`.
    pub fn is_configuration(&self) -> bool {
        self.kind() == ErrorKind::Configuration
    }

    /// The setting an [`Error::InvalidSetting`] is about, at whatever size.
    ///
    /// ```
    /// use autobatch::search::SearchSpace;
    ///
    /// let err = SearchSpace::new(1, None, 0).unwrap_err();
    /// assert_eq!(err.setting(), Some(autobatch::Setting::MultipleOf));
    /// ```
    pub fn setting(&self) -> Option<Setting> {
        match self {
            Error::InvalidSetting { setting, .. } => Some(*setting),
            Error::AtSize { source, .. } => source.setting(),
            _ => None,
        }
    }

    /// The workload's own error, when the workload failed.
    pub fn workload_error(&self) -> Option<&candle_core::Error> {
        match self {
            Error::Workload { source, .. } => Some(source),
            Error::BackwardUnsupported { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }

    /// [`Error::InvalidSetting`]: `setting` held `value`; `valid` says what
    /// would be valid (words, or a [`Valid`] that names another setting). For
    /// a workload's own refusals, such as a [`Resizable`](crate::Resizable)
    /// size it cannot take.
    ///
    /// ```
    /// use autobatch::{Error, Setting, Value};
    ///
    /// let err = Error::invalid(Setting::Size, Value::Count(600), "it must be at most 512, the longest position");
    /// assert_eq!(err.to_string(), "size is 600: it must be at most 512, the longest position");
    /// ```
    pub fn invalid(setting: Setting, value: Value, valid: impl Into<Valid>) -> Error {
        Error::InvalidSetting { setting, value, valid: valid.into() }
    }

    /// A count that was zero and must be at least 1.
    pub fn zero(setting: Setting) -> Error {
        Error::invalid(setting, Value::Count(0), Valid::AtLeastOne)
    }

    /// A target (the setting `target`) below one micro-batch of `multiple_of`
    /// on each of `world_size` ranks (the setting `ranks`).
    pub(crate) fn target_below_ranks(
        (target, ranks): (Setting, Setting),
        value: usize,
        world_size: usize,
        multiple_of: usize,
    ) -> Error {
        Error::invalid(target, Value::Count(value), Valid::MicroBatchPerRank { ranks, world_size, multiple_of })
    }

    /// Batch arithmetic that would overflow at `value`; `lower` are the
    /// settings to lower.
    pub fn batch_overflow(value: usize, lower: &'static [Setting]) -> Error {
        Error::BatchOverflow { value, lower }
    }

    /// A byte count of `what` of 2^64 or more.
    pub fn byte_overflow(what: impl Into<String>) -> Error {
        Error::ByteOverflow { what: what.into() }
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
            size: None,
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

    /// A search over the input size at `fixed_batch` that found nothing: its
    /// smallest candidate was the shortest size.
    pub(crate) fn at_fixed_batch(mut self, fixed_batch: usize) -> Error {
        if let Error::NothingFits { batch, size, smaller_batch, remedies, .. } = &mut self {
            *size = Some(*batch);
            *batch = fixed_batch;
            (*smaller_batch, *remedies) = (None, Vec::new());
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setting::Setting as S;

    #[test]
    fn each_kind_groups_what_the_caller_does_about_it() {
        let at_size = |source: Error| Error::AtSize { size: 64, source: Box::new(source) };
        let cases = [
            (Error::zero(crate::Setting::Start), ErrorKind::Configuration),
            (
                Error::invalid(crate::Setting::CacheKey, Value::Missing, "give Tuner::cache_key"),
                ErrorKind::Configuration,
            ),
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
            (Error::Device(DeviceProblem::AllocatorNotInstalled), ErrorKind::Device),
            (Error::RankFailed, ErrorKind::Device),
            (at_size(Error::zero(crate::Setting::Start)), ErrorKind::Configuration),
            (at_size(Error::TimeLimit { limit_ms: 10, trials: 1 }), ErrorKind::DoesNotFit),
        ];
        for (err, kind) in cases {
            assert_eq!(err.kind(), kind, "{err}");
            assert_eq!(err.is_configuration(), kind == ErrorKind::Configuration, "{err}");
        }
    }

    #[test]
    fn a_message_names_each_setting_by_its_builder_method() {
        let err = Error::invalid(S::MaxBatch, Value::Count(4), Valid::AtLeast { setting: S::Start, value: 8 });
        assert_eq!(err.to_string(), "Tuner::max_batch is 4: it must be at least Tuner::start, 8");
        let at_size = Error::AtSize { size: 64, source: Box::new(Error::zero(S::MultipleOf)) };
        assert_eq!(at_size.to_string(), "at size 64: Tuner::multiple_of is 0: it must be at least 1");
        assert_eq!(at_size.setting(), Some(S::MultipleOf));
        let overflow = Error::batch_overflow(7, &[S::WorldSize, S::MaxBatch]);
        assert_eq!(
            overflow.to_string(),
            "batch arithmetic at 7 is past what 64 bits count: use a smaller Tuner::world_size or Tuner::max_batch"
        );
        let below = Error::target_below_ranks((S::TargetEffectiveBatch, S::WorldSize), 3, 4, 8);
        assert_eq!(
            below.to_string(),
            "Tuner::target_effective_batch is 3: it must be at least 4 ranks (Tuner::world_size) × \
             Tuner::multiple_of 8 = 32: every rank needs at least one micro-batch"
        );
    }

    #[test]
    fn a_size_search_that_found_nothing_names_the_fixed_batch_and_the_shortest_size() {
        let err = Error::nothing_fits_at(128, Outcome::OverCeiling, Some(3 << 20), (4 << 20, 2 << 20, 0.5))
            .with_advice(Some(64), Vec::new())
            .at_fixed_batch(8);
        assert!(matches!(err, Error::NothingFits { batch: 8, size: Some(128), smaller_batch: None, .. }));
        assert_eq!(
            err.to_string(),
            "nothing fits at batch 8: the shortest size searched, 128, peaked at 3.00 MiB; the ceiling is 50% \
             of 4.00 MiB = 2.00 MiB: use a smaller batch"
        );
    }
}
