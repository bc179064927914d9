//! How a command fails: one line on stderr and a documented exit code.

use std::borrow::Cow;
use std::process::ExitCode;

use autobatch_models as models;

/// A failed command: what to say and which exit code (see `args::EXIT_CODES`).
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub kind: Kind,
    /// Under `--json`, the failure as a document for stdout (a refusal's
    /// advice), beside the line on stderr.
    pub json: Option<serde_json::Value>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Runtime,
    Usage,
    NothingFits,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Self {
        Failure { message: message.into(), kind: Kind::Usage, json: None }
    }

    pub fn runtime(message: impl Into<String>) -> Self {
        Failure { message: message.into(), kind: Kind::Runtime, json: None }
    }

    pub fn nothing_fits(message: impl Into<String>) -> Self {
        Failure { message: message.into(), kind: Kind::NothingFits, json: None }
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
    /// The library's failure in `probe`'s flags (under `--seq-lens` when it
    /// failed at one of its lengths).
    fn from(err: autobatch::Error) -> Self {
        let sizes = matches!(err, autobatch::Error::AtSize { .. });
        Failure::in_flags(err, &Flags { sizes, ..Flags::PROBE })
    }
}

impl From<models::Error> for Failure {
    /// The models' failure in `probe`'s flags.
    fn from(err: models::Error) -> Self {
        Failure::in_flags(err, &Flags::PROBE)
    }
}

impl Failure {
    /// The library's failure said in `flags`, with the exit code of its kind.
    pub fn in_flags(err: impl Into<models::Error>, flags: &Flags) -> Self {
        let err = err.into();
        let kind = match err.kind() {
            autobatch::ErrorKind::Configuration => Kind::Usage,
            autobatch::ErrorKind::DoesNotFit => Kind::NothingFits,
            _ => Kind::Runtime,
        };
        Failure { message: one_line(&flags.line(&err)), kind, json: None }
    }

    /// The same failure, said to be about `what` (`--config PATH`).
    pub fn about(mut self, what: impl std::fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }

    /// A failure of the model `--config path` describes, in `flags`: said to
    /// be about the config, unless it names the file itself already.
    pub fn of_config(err: impl Into<models::Error>, path: &std::path::Path, flags: &Flags) -> Self {
        let err = err.into();
        let names_the_file = matches!(&err, models::Error::InvalidSetting { setting: models::Setting::ConfigFile, .. });
        let failure = Failure::in_flags(err, flags);
        if names_the_file { failure } else { failure.about(format!("--config {}", path.display())) }
    }
}

/// A setting of the core or of the models, for [`Flags::flag`].
#[derive(Clone, Copy, Debug)]
pub enum Named<'a> {
    Core(autobatch::Setting),
    Model(&'a models::Setting),
}

impl From<autobatch::Setting> for Named<'_> {
    fn from(setting: autobatch::Setting) -> Self {
        Named::Core(setting)
    }
}

impl<'a> From<&'a models::Setting> for Named<'a> {
    fn from(setting: &'a models::Setting) -> Self {
        Named::Model(setting)
    }
}

/// The command line's names for the library's settings: the flags a command
/// sets them with, and its lines for the library's failures in those flags.
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
}

impl Flags {
    pub const PROBE: Flags = Flags {
        target: "--target-effective-batch",
        ranks: "--world-size",
        largest: "the largest that fits",
        sizes: false,
        size: "sequence length",
    };

    pub const ESTIMATE: Flags = Flags { largest: "the largest batch that fits", ..Flags::PROBE };

    /// What sets `setting` (the core's or the models') on the command line:
    /// one match, one arm a setting, so that a setting added to either
    /// package does not compile here until it has its flag (or its words,
    /// where no flag sets it).
    pub fn flag<'a>(&self, setting: impl Into<Named<'a>>) -> String {
        use autobatch::Setting as S;
        use models::Setting as M;
        let flag = match setting.into() {
            Named::Core(S::TargetEffectiveBatch | S::TargetGlobalBatch) => self.target,
            Named::Core(S::WorldSize | S::Ranks) => self.ranks,
            Named::Core(S::LargestMicroBatch) => self.largest,
            Named::Core(S::Size) => self.size,
            Named::Core(S::Ceiling) => "--ceiling",
            Named::Core(S::Start) => "--start",
            Named::Core(S::MultipleOf) => "--multiple-of",
            Named::Core(S::MaxBatch) => "--max-batch",
            Named::Core(S::TimeLimit) => "--time-limit",
            Named::Core(S::AllowPartialGraph) => "--allow-partial-graph",
            Named::Core(S::Objective) => "--objective",
            Named::Core(S::Cache) => "--cache",
            Named::Core(S::Evaluation) => "--eval",
            Named::Core(S::MaxTrials) => "--max-trials",
            Named::Core(S::StepsPerTrial) => "--steps-per-trial",
            Named::Core(S::ExactEffectiveBatch) => "--exact",
            Named::Core(S::Batch) => "--batch",
            Named::Core(S::Sizes) => "--seq-lens",
            Named::Core(S::BudgetBytes | S::Capacity) => "--budget",
            Named::Core(S::Accelerator) => "--capacity",
            Named::Core(S::ZeroStage) => "--zero",
            Named::Core(S::DataParallel) => "--ranks",
            Named::Core(S::TensorParallel) => "--tensor-parallel",
            Named::Core(S::MaxModelLen) => "--max-model-len",
            Named::Core(S::MaxNumBatchedTokens) => "--max-num-batched-tokens",
            Named::Core(S::Sequences) => "--concurrency",
            Named::Model(M::ConfigFile) => "--config",
            Named::Model(M::ConfigKey(key)) => return format!("config field {key}"),
            Named::Model(M::CheckpointTensor(name)) => return format!("checkpoint tensor {name}"),
            Named::Model(M::LoraRank) => "--lora",
            Named::Model(M::LoraTargets) => "--lora-targets",
            Named::Model(M::BaseDtype) => "--base-dtype",
            Named::Model(M::Dtype) => "--precision",
            Named::Model(M::Optimizer) => "--optimizer",
            Named::Model(M::SeqLen) => self.seq_len(),
            Named::Model(M::Layers) => "--layers",
            Named::Model(M::Heads) => "--heads",
            Named::Model(M::DModel) => "--d-model",
            Named::Model(M::Vocab) => "--vocab",
            Named::Model(M::Width) => "--width",
            Named::Model(M::Depth) => "--depth",
            Named::Model(M::Inputs) => "--inputs",
            Named::Model(M::Classes) => "--classes",
            Named::Model(M::Channels) => "--channels",
            Named::Model(M::Resolution) => "--resolution",
            Named::Model(M::BlockSize) => "--block-size",
            Named::Model(M::Parameters) => "--params",
            Named::Model(M::Precision) => "--precision",
            // set by no flag: a library caller's, named as the library names it
            Named::Core(
                setting @ (S::Rank
                | S::MicroBatch
                | S::AccumulationSteps
                | S::Steps
                | S::Plan
                | S::MinHeadroom
                | S::CacheKey
                | S::BytesPerSampleShare
                | S::FixedBytesChange
                | S::Like
                | S::UnevenRanks
                | S::TimingRepeats),
            ) => setting.as_str(),
            Named::Model(
                setting @ (M::InChannels | M::KvCacheBlocks | M::KvCacheDtype | M::Sequence | M::Chunk | M::Labels),
            ) => return setting.to_string(),
        };
        flag.to_owned()
    }

    /// The flag the sequence length is set with.
    fn seq_len(&self) -> &'static str {
        if self.sizes { "--seq-lens up to" } else { "--seq-len" }
    }

    /// The flags that apply `change`, the same in every command that advises
    /// (`probe`'s nothing-fits, `estimate`'s table): one map; `None` where no
    /// flag does.
    pub fn remedy(&self, change: &autobatch::estimate::Change) -> Option<String> {
        use autobatch::estimate::Change;
        Some(match change {
            Change::Precision { to } => format!("--precision {}", to.name()),
            Change::Optimizer { to } => format!("--optimizer {}", to.name()),
            Change::GradientCheckpointing => "--checkpointing".to_owned(),
            Change::SequenceLength { seq_len } => format!("{} {seq_len}", self.seq_len()),
            Change::Zero { stage, ranks } => format!("--ranks {ranks} --zero {stage}"),
            Change::Lora { rank } => format!("--lora {rank}"),
            Change::QuantizedBase => "--base-dtype q4_0".to_owned(),
            Change::Both { first, second } => format!("{} {}", self.remedy(first)?, self.remedy(second)?),
            _ => return None,
        })
    }

    /// The line for `err`: the library's message, its settings named by
    /// their flags (the core and the models write each sentence; this names).
    pub fn line(&self, err: &models::Error) -> String {
        let line = err.message(self);
        match err.core() {
            // the command line has a command that says what a step keeps
            Some(autobatch::Error::GuardExhausted { .. }) => format!("{line}; see `autobatch estimate`"),
            _ => line,
        }
    }
}

impl autobatch::Names for Flags {
    fn setting(&self, setting: autobatch::Setting) -> Cow<'static, str> {
        self.flag(setting).into()
    }

    fn change(&self, change: &autobatch::estimate::Change) -> Option<String> {
        self.remedy(change)
    }

    /// The models' own error, in flags too.
    fn input(&self, err: &(dyn std::error::Error + Send + Sync + 'static)) -> String {
        match err.downcast_ref::<models::Error>() {
            Some(own) => own.message(self),
            None => err.to_string(),
        }
    }
}

impl models::Names for Flags {
    fn model_setting(&self, setting: &models::Setting) -> Cow<'static, str> {
        self.flag(setting).into()
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

    /// The library's sentences are the library's: the command line names
    /// the settings in them (issue 88), and says a variant the way the
    /// library does, its flags in place of the builder methods.
    #[test]
    fn each_message_is_the_librarys_in_flags() {
        use autobatch::{Setting as S, Valid, Value};
        let source = include_str!("failure.rs");
        let code = source.split("#[cfg(test)]").next().unwrap();
        for sentence in ["what would help", "the nearest above is", "no split hits", "64 bits count", "nothing fits"] {
            assert!(!code.contains(sentence), "failure.rs writes the library's \"{sentence}\" itself");
        }
        let cases = [
            autobatch::Error::invalid(S::MaxBatch, Value::Count(4), Valid::AtLeast { setting: S::Start, value: 8 }),
            autobatch::Error::batch_overflow(7, &[S::WorldSize, S::MaxBatch]),
            autobatch::Error::AtSize { size: 64, source: Box::new(autobatch::Error::zero(S::MultipleOf)) },
        ];
        let lines: Vec<String> = cases.into_iter().map(|err| Failure::from(err).message).collect();
        assert_eq!(
            lines,
            [
                "--max-batch is 4: it must be at least --start, 8",
                "batch arithmetic at 7 is past what 64 bits count: use a smaller --world-size or --max-batch",
                "at sequence length 64: --multiple-of is 0: it must be at least 1",
            ]
        );
        // the models' own error, inside the core's, in flags too
        let own = models::Error::InvalidSetting {
            setting: models::Setting::LoraRank,
            value: Value::Count(0),
            valid: "it must be at least 1".into(),
        };
        let inside = autobatch::Error::from(own);
        assert_eq!(Failure::from(inside).message, "--lora is 0: it must be at least 1");
    }

    #[test]
    fn every_flag_a_setting_is_named_by_exists() {
        let cli = crate::args::command();
        let flags: Vec<String> = cli
            .get_subcommands()
            .flat_map(|command| command.get_arguments())
            .filter_map(|arg| arg.get_long().map(|long| format!("--{long}")))
            .collect();
        use models::Setting as M;
        let model_settings = [
            M::ConfigFile,
            M::ConfigKey("model_type".into()),
            M::CheckpointTensor("lm_head.weight".into()),
            M::LoraRank,
            M::LoraTargets,
            M::BaseDtype,
            M::Dtype,
            M::Optimizer,
            M::SeqLen,
            M::Layers,
            M::Heads,
            M::DModel,
            M::Vocab,
            M::Width,
            M::Depth,
            M::Inputs,
            M::Classes,
            M::Channels,
            M::InChannels,
            M::Resolution,
            M::BlockSize,
            M::KvCacheBlocks,
            M::KvCacheDtype,
            M::Sequence,
            M::Chunk,
            M::Labels,
            M::Parameters,
            M::Precision,
        ];
        for flags_of in [&Flags::PROBE, &Flags::ESTIMATE] {
            let core = autobatch::Setting::ALL.iter().map(|&setting| (format!("{setting:?}"), flags_of.flag(setting)));
            let own = model_settings.iter().map(|setting| (format!("{setting:?}"), flags_of.flag(setting)));
            for (setting, named) in core.chain(own) {
                let Some(flag) = named.strip_prefix("--").map(|rest| rest.split(' ').next().unwrap_or(rest)) else {
                    continue;
                };
                assert!(flags.contains(&format!("--{flag}")), "{setting} is named {named}, not a flag");
            }
        }
    }

    #[test]
    fn each_advised_change_is_said_by_flags_every_command_takes() {
        use autobatch::estimate::{Change, OptimizerKind, Precision};
        let cli = crate::args::command();
        let takes = |command: &str, flag: &str| {
            let command = cli.find_subcommand(command).unwrap();
            command.get_arguments().any(|arg| arg.get_long() == flag.strip_prefix("--"))
        };
        let changes = [
            Change::Precision { to: Precision::Mixed },
            Change::Precision { to: Precision::Bf16 },
            Change::Precision { to: Precision::Fp32 },
            Change::Optimizer { to: OptimizerKind::Lion },
            Change::GradientCheckpointing,
            Change::SequenceLength { seq_len: 64 },
        ];
        for change in changes {
            let said = Flags::PROBE.remedy(&change).unwrap();
            let flag = said.split(' ').next().unwrap();
            assert!(takes("probe", flag) && takes("estimate", flag), "{said}: not a flag of both commands");
        }
        assert_eq!(Flags::ESTIMATE.remedy(&Change::Precision { to: Precision::Mixed }).unwrap(), "--precision mixed");
        assert_eq!(Flags::ESTIMATE.remedy(&Change::GradientCheckpointing).unwrap(), "--checkpointing");
        let under_sizes = Flags { sizes: true, ..Flags::PROBE };
        assert_eq!(under_sizes.remedy(&Change::SequenceLength { seq_len: 89 }).unwrap(), "--seq-lens up to 89");
    }

    #[test]
    fn each_library_failure_keeps_its_facts_in_flags() {
        use autobatch::{Error, Setting as S, Valid, Value};
        let line = |err: Error| Failure::from(err).message;
        assert_eq!(
            line(Error::invalid(S::MaxBatch, Value::Count(4), Valid::AtLeast { setting: S::Start, value: 8 })),
            "--max-batch is 4: it must be at least --start, 8"
        );
        assert_eq!(
            line(Error::NoCandidate { start: 1, max_batch: 7, multiple_of: 8 }),
            "no multiple of --multiple-of 8 lies in [--start 1, --max-batch 7]: lower --multiple-of, lower --start \
             or raise --max-batch"
        );
        assert_eq!(
            line(Error::batch_overflow(9, &[S::Start, S::MultipleOf])),
            "batch arithmetic at 9 is past what 64 bits count: use a smaller --start or --multiple-of"
        );
        let inexact = line(Error::InexactTarget {
            target: 100,
            multiple_of: 8,
            nearest: 104,
            world_size: 1,
            accumulation_steps: 2,
            largest_micro_batch: Some(56),
        });
        assert!(inexact.starts_with("no split hits --target-effective-batch 100 exactly"), "{inexact}");
        assert!(inexact.contains("the nearest above is 104: accept it (drop --exact)"), "{inexact}");
        assert!(line(Error::TimeLimit { limit_ms: 2000, trials: 3 }).starts_with("the time limit (--time-limit 2 s)"));
        let zero = Error::zero(S::MultipleOf);
        assert_eq!(zero.to_string(), "Tuner::multiple_of is 0: it must be at least 1", "the library's words");
        assert_eq!(line(zero), "--multiple-of is 0: it must be at least 1", "the command line's");
        // a models error that went through the core comes back in flags
        let rank: Error = models::Config::from_json(
            r#"{"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
                "num_hidden_layers": 1, "num_attention_heads": 2}"#,
        )
        .unwrap()
        .footprint(&models::Training::new(8).lora(models::Lora::new(0, &["q_proj"])), models::Compute::Cpu)
        .unwrap_err()
        .into();
        assert!(matches!(rank, Error::Input(_)));
        assert_eq!(line(rank), "--lora is 0: it must be at least 1");
    }

    fn nothing_fits_at_a_size(size: usize) -> autobatch::Error {
        autobatch::Error::NothingFits {
            batch: 8,
            size: Some(size),
            outcome: autobatch::search::Outcome::OverCeiling,
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
