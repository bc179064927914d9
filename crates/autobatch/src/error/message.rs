//! Each message of an [`Error`] written once, from its variant's facts, with
//! every setting named the caller's way ([`Names`]): the crate's `Display`
//! names them by builder method (`BuilderNames`), a command line by flag.

use std::borrow::Cow;
use std::fmt::Write as _;

use super::{Error, Valid, describe_failure, first_names};
use crate::estimate::change::{Change, Remedy};
use crate::setting::Setting;
use crate::setting::Setting as S;
use crate::units::{format_bytes, format_millis, format_percent};

/// How a caller names the crate's settings in its messages: the one thing a
/// caller that exposes them under its own names (a command line's flags)
/// supplies to [`Error::message`], so that each sentence is written once.
///
/// ```
/// use std::borrow::Cow;
/// use autobatch::{Error, Names, Setting, Valid, Value};
///
/// struct Flags;
/// impl Names for Flags {
///     fn setting(&self, setting: Setting) -> Cow<'static, str> {
///         match setting {
///             Setting::MaxBatch => "--max-batch".into(),
///             Setting::Start => "--start".into(),
///             other => other.as_str().into(),
///         }
///     }
/// }
///
/// let err = Error::invalid(Setting::MaxBatch, Value::Count(4), Valid::AtLeast { setting: Setting::Start, value: 8 });
/// assert_eq!(err.message(&Flags), "--max-batch is 4: it must be at least --start, 8");
/// assert_eq!(err.to_string(), "Tuner::max_batch is 4: it must be at least Tuner::start, 8");
/// ```
pub trait Names {
    /// What sets `setting`, as the caller's users know it.
    fn setting(&self, setting: Setting) -> Cow<'static, str>;

    /// How the caller applies `change` (`--lora 8`), said before the
    /// remedy's own words; `None` (the default) where nothing of the
    /// caller's does.
    fn change(&self, change: &Change) -> Option<String> {
        let _ = change;
        None
    }

    /// The message of an [`Error::Input`] (another package's error, whole):
    /// its own `Display` by default; a caller that knows the package renders
    /// it with the same names.
    fn input(&self, err: &(dyn std::error::Error + Send + Sync + 'static)) -> String {
        err.to_string()
    }
}

/// The crate's own names: each setting by its builder method
/// (`Tuner::multiple_of`), as [`Error`]'s `Display` writes them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BuilderNames;

impl Names for BuilderNames {
    fn setting(&self, setting: Setting) -> Cow<'static, str> {
        setting.as_str().into()
    }
}

impl Error {
    /// The error's message with its settings named by `names`: what its
    /// `Display` writes with the builder methods' names, a command line with
    /// its flags.
    /// A variant that names no setting says the same to every caller.
    pub fn message(&self, names: &dyn Names) -> String {
        let name = |setting| names.setting(setting);
        match self {
            Error::InvalidSetting { setting, value, valid } => {
                format!("{} is {value}: {}", name(*setting), valid.message(names))
            }
            Error::NoCandidate { start, max_batch, multiple_of } => {
                let [m, s, b] = [S::MultipleOf, S::Start, S::MaxBatch].map(name);
                format!(
                    "no multiple of {m} {multiple_of} lies in [{s} {start}, {b} {max_batch}]: lower {m}, lower {s} or \
                     raise {b}"
                )
            }
            Error::BatchOverflow { value, lower } => {
                format!(
                    "batch arithmetic at {value} is past what 64 bits count: use a smaller {}",
                    either(names, lower)
                )
            }
            Error::InexactTarget {
                target,
                multiple_of,
                nearest,
                world_size,
                accumulation_steps,
                largest_micro_batch,
            } => format!(
                "{}; the nearest above is {nearest}: accept it (drop {}){}",
                inexact(names, *target, *multiple_of, *world_size, *accumulation_steps, *largest_micro_batch),
                name(S::ExactEffectiveBatch),
                exact_instead(*multiple_of, *world_size, largest_micro_batch.is_some())
            ),
            Error::NothingFits {
                batch,
                size,
                outcome,
                peak_bytes,
                capacity_bytes,
                limit_bytes,
                ceiling,
                smaller_batch,
                remedies,
            } => {
                let failed = describe_failure(*outcome, *peak_bytes);
                let smallest = match size {
                    Some(size) => {
                        format!(
                            " at {} {batch}: the shortest {} searched, {size}, {failed}",
                            name(S::Batch),
                            name(S::Size)
                        )
                    }
                    None => format!(
                        ": batch {batch} (the smallest {} and {} allow) {failed}",
                        name(S::Start),
                        name(S::MultipleOf)
                    ),
                };
                format!(
                    "nothing fits{smallest}; the ceiling is {} of {} = {}{}",
                    format_percent(*ceiling),
                    format_bytes(*capacity_bytes),
                    format_bytes(*limit_bytes),
                    what_would_help(names, *batch, *size, *smaller_batch, remedies)
                )
            }
            Error::TimeLimit { limit_ms, trials } => format!(
                "the time limit ({} {}) passed after {trials} trials with no batch seen to fit: nothing is verified; \
                 allow more time (the first trials include the warm-up)",
                name(S::TimeLimit),
                format_millis(*limit_ms)
            ),
            Error::PartialGraph { variables, of } => format!(
                "the measured step did not reach the gradients of {} of {of} variables ({}): an op without a backward \
                 pass cut the graph (candle's fused LayerNorm, RmsNorm, ops::softmax_last_dim, rotary_emb::rope), so \
                 they would not learn and the batch found would be larger than training the whole model allows; \
                 write those ops from differentiable tensor ops (a layer norm from mean, sub, sqr and div; a softmax \
                 from exp and sum) in place of candle_nn's fused ones (a buffer the forward pass reads without a \
                 graph is none: name it with ModelProbe::buffers_named), or take the partial answer with {}",
                variables.len(),
                first_names(variables),
                name(S::AllowPartialGraph)
            ),
            Error::AtSize { size, source } => format!("at {} {size}: {}", name(S::Size), source.message(names)),
            Error::Input(source) => names.input(source.as_ref()),
            // the rest name no setting: their `Display` is the message
            Error::ByteOverflow { .. }
            | Error::AlreadyTrained { .. }
            | Error::ModelTooLarge { .. }
            | Error::GuardExhausted { .. }
            | Error::InsufficientHeadroom(_)
            | Error::Workload { .. }
            | Error::BackwardUnsupported { .. }
            | Error::Candle(_)
            | Error::ModelBuild(_)
            | Error::Device(_)
            | Error::Collective(_)
            | Error::RankFailed
            | Error::Meter(_) => self.to_string(),
        }
    }
}

impl Valid {
    /// What would be valid, the settings it names named by `names`.
    pub(crate) fn message(&self, names: &dyn Names) -> String {
        let name = |setting| names.setting(setting);
        match self {
            Valid::AtLeastOne => "it must be at least 1".to_owned(),
            Valid::AtLeast { setting, value } => format!("it must be at least {}, {value}", name(*setting)),
            Valid::MultipleOf { setting, value } => format!("it must be a multiple of {}, {value}", name(*setting)),
            Valid::MicroBatchPerRank { ranks, world_size, multiple_of } => format!(
                "it must be at least {world_size} ranks ({}) × {} {multiple_of} = {}: every rank needs at least one \
                 micro-batch",
                name(*ranks),
                name(S::MultipleOf),
                world_size.saturating_mul(*multiple_of)
            ),
            Valid::DevicePerParameter { tensor_parallel, partitioned, parameters } => format!(
                "there must be at most one device per parameter: {} {tensor_parallel} × {partitioned} ZeRO ranks ({}) \
                 share {parameters} parameters",
                name(S::TensorParallel),
                name(S::DataParallel)
            ),
            Valid::Said(words) => words.to_string(),
        }
    }
}

/// [`Error::InexactTarget`]'s first half: what no split hits.
fn inexact(
    names: &dyn Names,
    target: usize,
    multiple_of: usize,
    world_size: usize,
    accumulation_steps: usize,
    largest_micro_batch: Option<usize>,
) -> String {
    let name = |setting| names.setting(setting);
    let m = name(S::MultipleOf);
    // a target that W·g divides is missed only by equal micro-batches
    let unit = world_size.saturating_mul(multiple_of);
    match (largest_micro_batch, target.is_multiple_of(unit)) {
        (Some(largest), true) => format!(
            "no split hits {} {target} exactly with {world_size} ranks ({}), equal micro-batches that are multiples \
             of {m} {multiple_of} and at most {largest} ({}), and at most {} accumulation steps",
            name(S::TargetEffectiveBatch),
            name(S::WorldSize),
            name(S::LargestMicroBatch),
            accumulation_steps.saturating_mul(2),
        ),
        (Some(_), false) => format!(
            "no split hits {} {target} exactly with {world_size} ranks ({}) and micro-batches that are multiples of \
             {m} {multiple_of}: every rank takes a whole number of them, so the effective batch is a multiple of {unit}",
            name(S::TargetEffectiveBatch),
            name(S::WorldSize),
        ),
        (None, _) => format!(
            "{} {target} cannot be shared exactly in micro-batches that are multiples of {m} {multiple_of}",
            name(S::TargetGlobalBatch),
        ),
    }
}

/// [`Error::InexactTarget`]'s other way out: a target that does divide.
fn exact_instead(multiple_of: usize, world_size: usize, even_ranks: bool) -> String {
    let unit = world_size.saturating_mul(multiple_of);
    match even_ranks {
        true if unit > 1 => format!(", or use a target divisible by ranks × granularity = {unit}"),
        true => String::new(),
        false => format!(" or use a global batch divisible by {multiple_of}"),
    }
}

/// [`Error::NothingFits`]: what would make it fit, each remedy with how the
/// caller applies it.
fn what_would_help(
    names: &dyn Names,
    batch: usize,
    size: Option<usize>,
    smaller_batch: Option<usize>,
    remedies: &[Remedy],
) -> String {
    if size.is_some() {
        return match batch {
            1 => format!(": make the model smaller or raise {}", names.setting(S::Capacity)),
            _ => format!(": use a smaller {}", names.setting(S::Batch)),
        };
    }
    let mut help = String::new();
    if let Some(smaller) = smaller_batch {
        let _ = write!(
            help,
            "; batch {smaller} would fit by the measured bytes per sample: use {} {smaller}",
            names.setting(S::Start)
        );
    }
    if !remedies.is_empty() {
        let advice: Vec<String> = remedies
            .iter()
            .map(|remedy| match names.change(&remedy.change) {
                Some(how) => format!("{how}: {remedy}"),
                None => remedy.to_string(),
            })
            .collect();
        let measured = remedies.iter().filter(|remedy| remedy.measured).count();
        let how = match measured {
            0 => "estimated from the measurement".to_owned(),
            all if all == remedies.len() => format!("each run at batch {batch}"),
            _ => format!("run at batch {batch} where measured, else estimated"),
        };
        let _ = write!(help, "; what would help, each alone ({how}): {}", advice.join("; "));
    }
    help
}

/// `settings` as alternatives: `Tuner::start or Tuner::multiple_of`.
fn either(names: &dyn Names, settings: &[Setting]) -> String {
    let named: Vec<Cow<'static, str>> = settings.iter().map(|&setting| names.setting(setting)).collect();
    match named.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}
