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
        let kind = match &err {
            Error::NothingFits { .. } | Error::ModelTooLarge { limit_bytes: Some(_), .. } => Kind::NothingFits,
            Error::ModelTooLarge { limit_bytes: None, .. } => Kind::Usage,
            err if err.is_configuration() => Kind::Usage,
            _ => Kind::Runtime,
        };
        let message = match &err {
            Error::Workload { batch, source } => {
                format!("the workload failed at batch {batch}: {}", candle_message(source))
            }
            Error::Candle(source) => format!("candle: {}", candle_message(source)),
            // the library names its settings; the user typed flags
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
            Error::InvalidCeiling { ceiling } => {
                format!("--ceiling {ceiling} is not a fraction in (0, 1]: pass e.g. 0.9 for 90% of device memory")
            }
            other => other.to_string(),
        };
        Failure { message: one_line(&message), kind }
    }
}

/// The command-line flag of a library setting: `multiple_of` → `--multiple-of`.
fn flag(setting: &str) -> String {
    match setting {
        "budget_bytes" => "--budget".to_owned(),
        "largest_micro_batch" => "--largest".to_owned(),
        other => format!("--{}", other.replace('_', "-")),
    }
}

/// A candle error's text without the backtraces candle attaches when
/// RUST_BACKTRACE is set.
fn candle_message(err: &candle_core::Error) -> String {
    match err {
        candle_core::Error::WithBacktrace { inner, .. } => candle_message(inner),
        candle_core::Error::Context { inner, context } => format!("{context}: {}", candle_message(inner)),
        other => other.to_string(),
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
