//! How a command fails: one line on stderr and a documented exit code.

use std::process::ExitCode;

/// A failed command: what to say and which exit code (see `args::EXIT_CODES`).
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Runtime,
    Usage,
    NothingFits,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Self {
        Failure { message: message.into(), kind: Kind::Usage }
    }

    pub fn runtime(message: impl Into<String>) -> Self {
        Failure { message: message.into(), kind: Kind::Runtime }
    }

    pub fn nothing_fits(message: impl Into<String>) -> Self {
        Failure { message: message.into(), kind: Kind::NothingFits }
    }

    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self.kind {
            Kind::Runtime => 1,
            Kind::Usage => 2,
            Kind::NothingFits => 3,
        })
    }
}

impl From<autobatch::Error> for Failure {
    fn from(err: autobatch::Error) -> Self {
        use autobatch::Error;
        if let Error::AtSize { size, source } = err {
            // one length of --seq-lens: what went wrong there, as for one length
            let inner = Failure::from(*source);
            // under --seq-lens the length is set by that list, not by --seq-len
            let message = inner
                .message
                .replace(": --seq-len ", ": --seq-lens up to ")
                .replace("; --seq-len ", "; --seq-lens up to ");
            return Failure { message: format!("at sequence length {size}: {message}"), kind: inner.kind };
        }
        let kind = match err.kind() {
            autobatch::ErrorKind::Configuration => Kind::Usage,
            autobatch::ErrorKind::DoesNotFit => Kind::NothingFits,
            _ => Kind::Runtime,
        };
        let message = match &err {
            Error::Workload { batch, source } => {
                format!("the workload failed at batch {batch}: {}", autobatch::candle_message(source))
            }
            Error::Candle(source) => format!("candle: {}", autobatch::candle_message(source)),
            // the library names its settings; the user typed flags
            Error::NoSizeFits { batch, size, outcome, peak_bytes, capacity_bytes, limit_bytes } => format!(
                "nothing fits at --batch {batch}: the shortest size searched, {size}, {} ({}); the limit is {} \
                 ({:.0}% of {}): {}",
                if *outcome == autobatch::Outcome::OutOfMemory { "ran out of memory" } else { "went over the ceiling" },
                peak_bytes
                    .map_or_else(|| "no peak read".to_owned(), |p| format!("peak {}", autobatch::format_bytes(p))),
                autobatch::format_bytes(*limit_bytes),
                100.0 * *limit_bytes as f64 / (*capacity_bytes).max(1) as f64,
                autobatch::format_bytes(*capacity_bytes),
                if *batch > 1 {
                    "use a smaller --batch"
                } else {
                    "raise --budget, or make the model smaller (--d-model, --layers, --channels)"
                }
            ),
            Error::TimeLimit { limit_ms, trials } => format!(
                "--time-limit {} passed after {trials} trials with no batch seen to fit: nothing is verified; \
                 allow more time",
                crate::parse::format_millis(*limit_ms)
            ),
            Error::Zero { setting } => format!("{} is 0: it must be at least 1", flag(setting)),
            Error::InvalidModel { setting, value, valid } => {
                format!("{} {value} is invalid: it must be {valid}", flag(setting))
            }
            Error::MaxBatchBelowStart { max_batch, start } => format!(
                "--max-batch {max_batch} is below --start {start}: the search space is empty; \
                 use --max-batch >= --start"
            ),
            Error::NoCandidate { start, max_batch, multiple_of } => format!(
                "no multiple of --multiple-of {multiple_of} lies in [--start {start}, --max-batch {max_batch}]: \
                 lower --multiple-of, lower --start or raise --max-batch"
            ),
            Error::NothingFits {
                batch,
                outcome,
                peak_bytes,
                capacity_bytes,
                limit_bytes,
                ceiling,
                smaller_batch,
                remedies,
            } => nothing_fits(
                *batch,
                *outcome,
                *peak_bytes,
                (*capacity_bytes, *limit_bytes, *ceiling),
                *smaller_batch,
                remedies,
            ),
            err @ (Error::Overflow { .. }
            | Error::TargetBelowWorldSize { .. }
            | Error::InexactEffectiveBatch { .. }) => split_error(err, &SplitFlags::PROBE),
            Error::UnsupportedDtype { dtype, valid } => {
                format!("--precision: {dtype} is not supported here: use {valid}")
            }
            Error::UnsupportedOptimizer { optimizer, valid } => {
                format!("--optimizer {optimizer} is not supported here: use {valid}")
            }
            other => other.to_string(),
        };
        Failure { message: one_line(&message), kind }
    }
}

/// The flags a command takes the split's numbers from.
pub struct SplitFlags {
    /// The target: `--target-effective-batch`, `--target`.
    pub target: &'static str,
    /// The number of ranks: `--world-size`, or `--uneven` (a number per rank).
    pub ranks: &'static str,
    /// The largest micro-batch, when a flag gives it (`--largest`).
    pub largest: Option<&'static str>,
    /// The flags whose size makes the arithmetic overflow.
    pub overflow: &'static str,
}

impl SplitFlags {
    pub const PROBE: SplitFlags = SplitFlags {
        target: "--target-effective-batch",
        ranks: "--world-size",
        largest: None,
        overflow: "--start, --multiple-of or --target-effective-batch",
    };
}

/// A split's error (overflow, a target below the ranks, no exact split) in
/// the flags of the command that asked for it.
pub fn split_error(err: &autobatch::Error, flags: &SplitFlags) -> String {
    use autobatch::Error;
    let ranks = |world_size: usize| match flags.ranks {
        "--uneven" => format!("the {world_size} ranks of --uneven"),
        flag => format!("{flag} {world_size}"),
    };
    let target = flags.target;
    match err {
        Error::Overflow { value } => {
            format!("batch arithmetic overflows at {value}: use a smaller {}", flags.overflow)
        }
        Error::TargetBelowWorldSize { target: asked, world_size, multiple_of, smallest } => format!(
            "{target} {asked} is below {} × --multiple-of {multiple_of} = {smallest}: every rank needs at least \
             one micro-batch; use {target} {smallest} or more",
            ranks(*world_size)
        ),
        Error::InexactEffectiveBatch {
            target: asked,
            world_size,
            multiple_of,
            largest_micro_batch,
            max_steps,
            nearest,
            unit,
        } => {
            let largest = flags.largest.map_or(String::new(), |flag| format!("{flag} "));
            format!(
                "--exact: no split hits {target} {asked} exactly with {}, micro-batches that are multiples of \
                 --multiple-of {multiple_of} and at most {largest}{largest_micro_batch}, and at most {max_steps} \
                 accumulation steps; the nearest above is {nearest}: drop --exact to accept it{}",
                ranks(*world_size),
                divisible_by(*unit)
            )
        }
        other => other.to_string(),
    }
}

/// `, or use a target divisible by N`, when that helps (N > 1).
pub fn divisible_by(unit: usize) -> String {
    if unit > 1 {
        format!(", or use a target divisible by {unit}")
    } else {
        String::new()
    }
}

/// `probe`'s nothing-fits message: what was measured, a smaller `--start`
/// when the measurement says one fits, and the advice with the flag that
/// applies each change, in binary units throughout.
fn nothing_fits(
    batch: usize,
    outcome: autobatch::Outcome,
    peak_bytes: Option<u64>,
    (capacity_bytes, limit_bytes, ceiling): (u64, u64, f64),
    smaller_batch: Option<usize>,
    remedies: &[autobatch::estimate::Remedy],
) -> String {
    use autobatch::format_bytes;
    let failure = autobatch::describe_failure(outcome, peak_bytes);
    let mut message = format!(
        "nothing fits: batch {batch} (the smallest --start and --multiple-of allow) {failure}; the ceiling is \
         {:.0}% of {} = {}",
        ceiling * 100.0,
        format_bytes(capacity_bytes),
        format_bytes(limit_bytes)
    );
    if let Some(smaller) = smaller_batch {
        message += &format!("; batch {smaller} would fit by the measured bytes per sample: use --start {smaller}");
    }
    if !remedies.is_empty() {
        let advice: Vec<String> = remedies
            .iter()
            .map(|remedy| {
                let described = remedy.describe(format_bytes);
                match change_flag(&remedy.change) {
                    Some(flag) => format!("{flag}: {described}"),
                    None => described,
                }
            })
            .collect();
        message += &format!("; what would help, each alone (estimated from the measurement): {}", advice.join("; "));
    }
    message
}

/// The `probe` flag that makes `change`, when there is one.
fn change_flag(change: &autobatch::estimate::Change) -> Option<String> {
    use autobatch::estimate::{Change, Precision};
    Some(match change {
        Change::Precision { to: Precision::Mixed } => "--precision mixed".to_owned(),
        Change::Precision { to: Precision::Bf16 } => "--precision bf16".to_owned(),
        Change::Precision { to: Precision::Fp32 } => "--precision f32".to_owned(),
        Change::Optimizer { to } => format!("--optimizer {}", to.name()),
        Change::GradientCheckpointing => "--checkpointing".to_owned(),
        Change::SequenceLength { seq_len } => format!("--seq-len {seq_len}"),
        _ => return None,
    })
}

/// The command-line flag of a library setting: `multiple_of` → `--multiple-of`.
fn flag(setting: &str) -> String {
    match setting {
        "budget_bytes" => "--budget".to_owned(),
        "largest_micro_batch" => "--largest".to_owned(),
        other => format!("--{}", other.replace('_', "-")),
    }
}

/// Folds a multi-line message into one line.
pub fn one_line(message: &str) -> String {
    message.lines().map(str::trim).filter(|line| !line.is_empty()).collect::<Vec<_>>().join("; ")
}

/// A clap error as one line: what is wrong and what would be valid, without the
/// usage block (`--help` has it).
pub fn clap_message(err: &clap::Error) -> String {
    let rendered = err.to_string();
    let kept: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("Usage:") && !line.starts_with("For more information"))
        .collect();
    kept.join(" ").trim_start_matches("error: ").to_owned()
}
