//! How a command fails: one line on stderr and a documented exit code.

use std::process::ExitCode;

use autobatch::SettingName;

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
    /// The library's message in `probe`'s flags (under `--seq-lens` when it
    /// failed at one of its lengths).
    fn from(err: autobatch::Error) -> Self {
        let sizes = matches!(err, autobatch::Error::AtSize { .. });
        Failure::in_flags(err, &Flags { sizes, ..Flags::PROBE })
    }
}

impl Failure {
    /// The library's message with its settings named by `flags`, and the
    /// exit code of its kind.
    pub fn in_flags(err: autobatch::Error, flags: &Flags) -> Self {
        let kind = match err.kind() {
            autobatch::ErrorKind::Configuration => Kind::Usage,
            autobatch::ErrorKind::DoesNotFit => Kind::NothingFits,
            _ => Kind::Runtime,
        };
        Failure { message: one_line(&err.render(flags)), kind }
    }

    /// The same failure, said to be about `what` (`--config PATH`).
    pub fn about(mut self, what: impl std::fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }

    /// A failure of the model `--config path` describes, in `flags`: said to
    /// be about the config, unless it names the file itself already.
    pub fn of_config(err: autobatch::Error, path: &std::path::Path, flags: &Flags) -> Self {
        let names_the_file = matches!(&err, autobatch::Error::InvalidSetting { setting, .. } if *setting == *"config");
        let failure = Failure::in_flags(err, flags);
        if names_the_file { failure } else { failure.about(format!("--config {}", path.display())) }
    }
}

/// The command line's names for the library's settings: the flags a command
/// sets them with.
pub struct Flags {
    /// The target: `--target-effective-batch`, or `plan`'s `--target`.
    pub target: &'static str,
    /// The ranks: `--world-size`, or `plan`'s `--uneven` (a number per rank).
    pub ranks: &'static str,
    /// The largest micro-batch: measured by `probe`, `--largest` of `plan`.
    pub largest: &'static str,
    /// Whether the lengths come from `--seq-lens` rather than `--seq-len`.
    pub sizes: bool,
    /// What the input size is, in words: a sequence length, a resolution.
    pub size: &'static str,
    /// The flag of the model's dtype: `probe`'s `--precision`, `estimate`'s `--dtype`.
    pub dtype: &'static str,
}

impl Flags {
    pub const PROBE: Flags = Flags {
        target: "--target-effective-batch",
        ranks: "--world-size",
        largest: "the largest that fits",
        sizes: false,
        size: "sequence length",
        dtype: "--precision",
    };

    pub const ESTIMATE: Flags = Flags { dtype: "--dtype", ..Flags::PROBE };

    fn seq_len(&self) -> &'static str {
        if self.sizes { "--seq-lens up to" } else { "--seq-len" }
    }
}

impl autobatch::Names for Flags {
    /// Every setting the library can name, matched one by one: a setting
    /// added there does not compile here until it has its flag.
    fn setting(&self, setting: SettingName) -> String {
        use SettingName as S;
        match setting {
            S::TargetEffectiveBatch | S::TargetGlobalBatch => self.target.to_owned(),
            S::WorldSize | S::Ranks => self.ranks.to_owned(),
            S::LargestMicroBatch => self.largest.to_owned(),
            S::Size => self.size.to_owned(),
            S::SeqLen => self.seq_len().to_owned(),
            S::Dtype => self.dtype.to_owned(),
            S::BudgetBytes | S::Capacity => "--budget".to_owned(),
            S::ExactEffectiveBatch => "--exact".to_owned(),
            S::Evaluation => "--eval".to_owned(),
            S::LoraRank => "--lora".to_owned(),
            S::ZeroStage => "--zero".to_owned(),
            S::DataParallel => "--ranks".to_owned(),
            S::Accelerator => "--capacity".to_owned(),
            S::Sizes => "--seq-lens".to_owned(),
            S::Sequences => "--concurrency".to_owned(),
            // a flag of the setting's own name
            S::Ceiling
            | S::Start
            | S::MultipleOf
            | S::MaxBatch
            | S::StepsPerTrial
            | S::TimeLimit
            | S::MaxTrials
            | S::Objective
            | S::Cache
            | S::AllowPartialGraph
            | S::Optimizer
            | S::TensorParallel
            | S::Config
            | S::LoraTargets
            | S::BaseDtype
            | S::Layers
            | S::Heads
            | S::DModel
            | S::Vocab
            | S::Width
            | S::Depth
            | S::Inputs
            | S::Classes
            | S::Channels
            | S::Resolution
            | S::Batch
            | S::MaxModelLen
            | S::MaxNumBatchedTokens
            | S::BlockSize => format!("--{}", setting.as_str().replace('_', "-")),
            // set by no flag: a library caller's, named as the library names it
            S::Rank
            | S::MicroBatch
            | S::AccumulationSteps
            | S::Steps
            | S::Plan
            | S::MinHeadroom
            | S::CacheKey
            | S::BytesPerSampleShare
            | S::FixedBytesChange
            | S::Like
            | S::InChannels
            | S::UnevenRanks
            | S::TimingRepeats => setting.as_str().to_owned(),
        }
    }

    fn change(&self, change: &autobatch::estimate::Change) -> Option<String> {
        use autobatch::estimate::{Change, Precision};
        Some(match change {
            Change::Precision { to: Precision::Mixed } => "--precision mixed".to_owned(),
            Change::Precision { to: Precision::Bf16 } => "--precision bf16".to_owned(),
            Change::Precision { to: Precision::Fp32 } => "--precision f32".to_owned(),
            Change::Optimizer { to } => format!("--optimizer {}", to.name()),
            Change::GradientCheckpointing => "--checkpointing".to_owned(),
            Change::SequenceLength { seq_len } => format!("{} {seq_len}", self.seq_len()),
            _ => return None,
        })
    }
}

/// Folds a multi-line message into one line.
pub fn one_line(message: &str) -> String {
    message.lines().map(str::trim).filter(|line| !line.is_empty()).collect::<Vec<_>>().join("; ")
}

/// A clap error as one line: what is wrong and what would be valid, without the
/// usage block (`--help` has it).
pub fn clap_message(err: &clap::Error) -> String {
    if let Some(conflict) = conflict(err) {
        return conflict;
    }
    let rendered = err.to_string();
    // the message and its tips: the usage (one line or several) and the
    // pointer to --help come after them
    let kept: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .take_while(|line| !line.starts_with("Usage:") && !line.starts_with("For more information"))
        .filter(|line| !line.is_empty())
        .collect();
    kept.join(" ").trim_start_matches("error: ").to_owned()
}

/// Two flags that clap's rules keep apart, said as the tool says it: `--eval
/// does not go with --compare, which …: drop one of them`, against the flag
/// whose rule it is.
fn conflict(err: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    if err.kind() != clap::error::ErrorKind::ArgumentConflict {
        return None;
    }
    // `--cache <CACHE>`: the flag alone
    let flag = |kind| {
        let said = match err.get(kind)? {
            ContextValue::String(said) => said.as_str(),
            ContextValue::Strings(said) => said.first()?.as_str(),
            _ => return None,
        };
        Some(said.split([' ', '=']).next().unwrap_or(said).to_owned())
    };
    let (later, earlier) = (flag(ContextKind::InvalidArg)?, flag(ContextKind::PriorArg)?);
    if later == earlier {
        return Some(format!("{later} is given twice: give it once"));
    }
    let (other, flag, why) = match (why_alone(&later), why_alone(&earlier)) {
        (_, Some(why)) => (later, earlier, why),
        (Some(why), None) => (earlier, later, why),
        (None, None) => return Some(format!("{later} does not go with {earlier}: drop one of them")),
    };
    Some(format!("{other} does not go with {flag}, {why}: drop one of them"))
}

/// Why a flag takes some others away.
fn why_alone(flag: &str) -> Option<&'static str> {
    Some(match flag {
        "--compare" => "which compares each variant's largest batch",
        "--find" => "which holds --batch fixed and searches the input size",
        "--seq-lens" => "which tunes each length for its largest batch",
        "--config" => "whose config.json sizes the model (--layers, --seq-len and --seq-lens do apply)",
        "--params" => "which counts parameters alone (--config counts a model's step)",
        "--mixed-precision" => "which keeps bf16 weights and gradients with f32 master weights",
        "--serve" => {
            "which counts serving (the KV caches and a forward step, sized by the serving flags), not training"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_a_setting_is_named_by_exists() {
        let cli = crate::args::command();
        let flags: Vec<String> = cli
            .get_subcommands()
            .flat_map(|command| command.get_arguments())
            .filter_map(|arg| arg.get_long().map(|long| format!("--{long}")))
            .collect();
        for flags_of in [&Flags::PROBE, &Flags::ESTIMATE] {
            for setting in SettingName::ALL {
                let named = autobatch::Names::setting(flags_of, *setting);
                let Some(flag) = named.strip_prefix("--").map(|rest| rest.split(' ').next().unwrap_or(rest)) else {
                    continue;
                };
                assert!(flags.contains(&format!("--{flag}")), "{setting:?} is named {named}, not a flag");
            }
        }
    }

    fn nothing_fits_at_a_size(size: usize) -> autobatch::Error {
        autobatch::Error::NothingFits {
            batch: 8,
            size: Some(size),
            outcome: autobatch::Outcome::OverCeiling,
            peak_bytes: Some(3 << 20),
            capacity_bytes: 4 << 20,
            limit_bytes: 2 << 20,
            ceiling: 0.5,
            smaller_batch: None,
            remedies: Vec::new(),
        }
    }

    #[test]
    fn a_size_search_names_its_flags_and_the_size_as_the_model_does() {
        let resolution = Failure::in_flags(nothing_fits_at_a_size(32), &Flags { size: "resolution", ..Flags::PROBE });
        assert_eq!(resolution.kind, Kind::NothingFits);
        assert!(
            resolution.message.starts_with("nothing fits at --batch 8: the shortest resolution searched, 32,"),
            "{}",
            resolution.message
        );
        assert!(resolution.message.ends_with("use a smaller --batch"), "{}", resolution.message);
        let lengths =
            Failure::from(autobatch::Error::AtSize { size: 128, source: Box::new(nothing_fits_at_a_size(64)) });
        assert!(
            lengths.message.starts_with("at sequence length 128: nothing fits at --batch 8"),
            "{}",
            lengths.message
        );
    }
}
