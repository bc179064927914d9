//! The value types of the command line's flags: counts, the library's own
//! enums by their names (clap's `ValueEnum`, made the library's type as
//! parsed), fractions, seeds.

use std::fmt;
use std::str::FromStr;

use autobatch::estimate::{OptimizerKind, Precision, Recompute};
use autobatch::{plan::Objective, search::Strategy};
use autobatch_models::{Attention, Loss, Ops};
use clap::ValueEnum;
use clap::builder::TypedValueParser;

/// A count of at least 1: a batch, a size, a number of ranks, steps or
/// trials. Written as a whole number, also with an exponent (`1e6`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Count(usize);

impl Count {
    pub const ONE: Count = Count(1);

    pub fn get(self) -> usize {
        self.0
    }
}

impl FromStr for Count {
    type Err = String;

    fn from_str(text: &str) -> Result<Count, String> {
        if text.trim_start().starts_with('-') {
            return Err("must not be negative: use a whole number of at least 1".to_owned());
        }
        let text = text.trim();
        let exponent = text.contains(['e', 'E']) && text.bytes().all(|b| b.is_ascii_digit() || b".eE+".contains(&b));
        let value = match text.parse::<usize>() {
            Ok(value) => Some(value),
            Err(_) if exponent => crate::parse::parse_count(text).ok().and_then(|v| usize::try_from(v).ok()),
            Err(_) => None,
        };
        match value {
            Some(0) => Err("must be at least 1".to_owned()),
            Some(value) => Ok(Count(value)),
            None => Err(format!("must be a whole number from 1 to {} (e.g. 8, 1024 or 1e6)", usize::MAX)),
        }
    }
}

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The counts of a list flag (`--seq-lens 64,128`), as numbers.
pub fn counts(list: &[Count]) -> Vec<usize> {
    list.iter().map(|count| count.get()).collect()
}

/// A flag's value parsed by clap's derive (`ValueEnum`: the names, their help
/// from each variant's doc comment, the nearest suggested for a typo), then
/// made the library's type: typed at parse time.
pub fn typed<A, T>() -> impl TypedValueParser<Value = T>
where
    A: ValueEnum + Clone + Send + Sync + 'static,
    T: From<A> + Clone + Send + Sync + 'static,
{
    clap::builder::EnumValueParser::<A>::new().map(T::from)
}

/// `--strategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StrategyArg {
    /// Fit the memory curve on small trials, jump near the answer, verify: the same answer as binary in fewer,
    /// cheaper trials
    Predictive,
    /// Double, then bisect to the exact largest batch
    Binary,
    /// Double only: the largest fitting power of two
    Power,
}

impl From<StrategyArg> for Strategy {
    fn from(arg: StrategyArg) -> Strategy {
        match arg {
            StrategyArg::Predictive => Strategy::Predictive,
            StrategyArg::Binary => Strategy::Binary,
            StrategyArg::Power => Strategy::Power,
        }
    }
}

/// `--objective`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ObjectiveArg {
    /// The largest batch that fits
    #[value(name = "largest")]
    LargestBatch,
    /// The best measured samples per second near the top
    Throughput,
}

impl From<ObjectiveArg> for Objective {
    fn from(arg: ObjectiveArg) -> Objective {
        match arg {
            ObjectiveArg::LargestBatch => Objective::LargestBatch,
            ObjectiveArg::Throughput => Objective::Throughput,
        }
    }
}

/// `--precision`, in every command that trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    /// 32-bit floats
    #[value(alias = "f32")]
    Fp32,
    /// bfloat16 weights, gradients, activations and optimizer state
    Bf16,
    /// bf16 weights, gradients and activations; f32 master weights and optimizer state (2 + 2 + 12 bytes per
    /// parameter under AdamW)
    Mixed,
}

impl From<PrecisionArg> for Precision {
    fn from(arg: PrecisionArg) -> Precision {
        match arg {
            PrecisionArg::Fp32 => Precision::Fp32,
            PrecisionArg::Bf16 => Precision::Bf16,
            PrecisionArg::Mixed => Precision::Mixed,
        }
    }
}

/// `estimate --optimizer`: every optimizer whose state is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OptimizerArg {
    /// Plain SGD: no state
    Sgd,
    /// SGD with momentum: one state
    Momentum,
    /// AdamW: two moments
    #[value(name = "adamw")]
    AdamW,
    /// Adafactor: a factored second moment, no first
    Adafactor,
    /// 8-bit Adam: two moments in blocks of bytes
    #[value(name = "adam8bit")]
    Adam8bit,
    /// Lion: one momentum
    Lion,
}

impl From<OptimizerArg> for OptimizerKind {
    fn from(arg: OptimizerArg) -> OptimizerKind {
        match arg {
            OptimizerArg::Sgd => OptimizerKind::Sgd,
            OptimizerArg::Momentum => OptimizerKind::Momentum,
            OptimizerArg::AdamW => OptimizerKind::AdamW,
            OptimizerArg::Adafactor => OptimizerKind::Adafactor,
            OptimizerArg::Adam8bit => OptimizerKind::Adam8bit,
            OptimizerArg::Lion => OptimizerKind::Lion,
        }
    }
}

/// `--recompute`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RecomputeArg {
    /// Keep every activation
    None,
    /// Recompute the attention's softmax and score-times-value parts
    Selective,
    /// Recompute every layer from its input (gradient checkpointing)
    Full,
}

impl From<RecomputeArg> for Recompute {
    fn from(arg: RecomputeArg) -> Recompute {
        match arg {
            RecomputeArg::None => Recompute::None,
            RecomputeArg::Selective => Recompute::Selective,
            RecomputeArg::Full => Recompute::Full,
        }
    }
}

/// `--attention`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AttentionArg {
    /// In blocks, nothing of heads × s × s kept
    Blocked,
    /// The scores made whole and kept for the backward pass
    Eager,
}

impl From<AttentionArg> for Attention {
    fn from(arg: AttentionArg) -> Attention {
        match arg {
            AttentionArg::Blocked => Attention::Blocked,
            AttentionArg::Eager => Attention::Eager,
        }
    }
}

/// `--ops`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OpsArg {
    /// Each one node keeping its inputs and output
    Fused,
    /// Written as candle ops, every intermediate kept
    Eager,
}

impl From<OpsArg> for Ops {
    fn from(arg: OpsArg) -> Ops {
        match arg {
            OpsArg::Fused => Ops::Fused,
            OpsArg::Eager => Ops::Eager,
        }
    }
}

/// `--loss`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LossArg {
    /// The head and the loss fused in chunks of tokens
    Chunked,
    /// Every position's logits made whole
    Full,
}

impl From<LossArg> for Loss {
    fn from(arg: LossArg) -> Loss {
        match arg {
            LossArg::Chunked => Loss::Chunked,
            LossArg::Full => Loss::Full,
        }
    }
}

/// `--budget`: a byte size of at least one byte.
pub fn budget(text: &str) -> Result<u64, String> {
    match crate::parse::parse_bytes(text) {
        Ok(0) => Err("is 0: give the memory the step may use, e.g. 256MiB".to_owned()),
        Ok(bytes) => Ok(bytes),
        Err(err) => Err(err.to_string()),
    }
}

/// `--params`: a count of at least one, with a suffix (`125M`, `7B`) or an exponent.
pub fn parameters(text: &str) -> Result<u64, String> {
    match crate::parse::parse_count(text) {
        Ok(0) => Err("is 0: give the number of trainable parameters, e.g. 125M".to_owned()),
        Ok(count) => Ok(count),
        Err(err) => Err(err.to_string()),
    }
}

/// A byte size (`--activations`): a number and a unit.
pub fn bytes(text: &str) -> Result<u64, String> {
    crate::parse::parse_bytes(text).map_err(|err| err.to_string())
}

/// `--capacity`: a device's memory, given or a card's.
#[derive(Clone, Copy, Debug)]
pub struct Capacity {
    pub bytes: u64,
    /// The card named, when one was.
    pub card: Option<&'static autobatch::estimate::Accelerator>,
}

/// `--capacity`: a size (`80GB`, `24GiB`) or a card's name (`h100`).
pub fn capacity(text: &str) -> Result<Capacity, String> {
    use autobatch::estimate::Accelerator;
    let bare_number = !text.trim().is_empty() && text.trim().bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if bare_number {
        let card = match Accelerator::nearest(text) {
            Some(card) => format!("did you mean {} ({})? ", card.name, card.description),
            None => String::new(),
        };
        return Err(format!(
            "a number without a unit; {card}give a card's name, or the memory with its unit (e.g. 80GB or 24GiB)"
        ));
    }
    if text.trim_start().starts_with(|c: char| c.is_ascii_digit() || c == '.' || c == '-' || c == '+') {
        return match crate::parse::parse_bytes(text).map_err(|err| err.to_string())? {
            0 => Err("is 0: give the device's memory, e.g. 80GB or 24GiB".to_owned()),
            bytes => Ok(Capacity { bytes, card: None }),
        };
    }
    match Accelerator::named(text) {
        Ok(card) => Ok(Capacity { bytes: card.memory_bytes, card: Some(card) }),
        // what would be valid, in words: clap names the flag and the value
        Err(autobatch::Error::InvalidSetting { valid, .. }) => Err(valid.to_string()),
        Err(other) => Err(other.to_string()),
    }
}

/// `--device`: where a command runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu,
    Cuda(usize),
}

/// `cpu`, `cuda` (GPU 0) or `cuda:N`.
pub fn device(text: &str) -> Result<DeviceSpec, String> {
    let invalid = || "use cpu, cuda or cuda:N (N a GPU ordinal)".to_owned();
    match text {
        "cpu" => Ok(DeviceSpec::Cpu),
        "cuda" => Ok(DeviceSpec::Cuda(0)),
        other => match other.strip_prefix("cuda:") {
            Some(ordinal) => ordinal.parse().map(DeviceSpec::Cuda).map_err(|_| invalid()),
            None => Err(invalid()),
        },
    }
}

/// LoRA's alpha: a positive number.
pub fn lora_alpha(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(alpha) if alpha.is_finite() && alpha > 0.0 => Ok(alpha),
        _ => Err("must be a positive number, e.g. 16".to_owned()),
    }
}

/// A LoRA base's dtype: f32, bf16, q8_0 or q4_0.
pub fn base_dtype(text: &str) -> Result<autobatch_models::BaseDtype, String> {
    text.trim().parse().map_err(|_| "must be f32, bf16, q8_0 or q4_0".to_owned())
}

/// A module name LoRA targets: not empty, no spaces.
pub fn module_name(text: &str) -> Result<String, String> {
    let name = text.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err("must be module names separated by commas, e.g. q_proj,v_proj".to_owned());
    }
    Ok(name.to_owned())
}

/// A seed: any whole number that fits in 64 bits.
pub fn seed(text: &str) -> Result<u64, String> {
    text.trim().parse::<u64>().map_err(|_| format!("must be a whole number from 0 to {}", u64::MAX))
}

/// A fraction as a number (`0.9`) or a percentage (`90%`); whether it is in
/// range is the tuner's to say.
pub fn ceiling(text: &str) -> Result<autobatch::plan::Ceiling, String> {
    let text = text.trim();
    let (number, scale) = match text.strip_suffix('%') {
        Some(percent) => (percent.trim_end(), 100.0),
        None => (text, 1.0),
    };
    match number.parse::<f64>() {
        // what would be valid, in words: clap names the flag and the value
        Ok(value) if value.is_finite() => autobatch::plan::Ceiling::new(value / scale).map_err(|err| match err {
            autobatch::Error::InvalidSetting { valid, .. } => valid.to_string(),
            other => other.to_string(),
        }),
        _ => Err("must be a fraction in (0, 1], e.g. 0.9 or 90%".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices() {
        assert_eq!(device("cpu").unwrap(), DeviceSpec::Cpu);
        assert_eq!(device("cuda").unwrap(), DeviceSpec::Cuda(0));
        assert_eq!(device("cuda:3").unwrap(), DeviceSpec::Cuda(3));
        for bad in ["gpu", "cuda:", "cuda:x", "CPU", "cuda:-1"] {
            assert!(device(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_count_is_a_whole_number_of_at_least_one() {
        assert_eq!("8".parse::<Count>(), Ok(Count(8)));
        assert_eq!(" 1e6 ".parse::<Count>(), Ok(Count(1_000_000)));
        assert_eq!("0".parse::<Count>(), Err("must be at least 1".to_owned()));
        assert!("-3".parse::<Count>().unwrap_err().contains("must not be negative"));
        assert!("2.5".parse::<Count>().unwrap_err().contains("whole number"));
    }

    /// Every name of `A` parses to the library's variant of that name, and
    /// every variant of the library's `all` has one.
    fn each_name_is_the_librarys<A, T>(all: &[T], name: impl Fn(T) -> &'static str)
    where
        A: ValueEnum + Clone + Send + Sync + 'static,
        T: From<A> + Clone + Copy + Send + Sync + PartialEq + fmt::Debug + 'static,
    {
        let cmd = clap::Command::new("test");
        let parser = typed::<A, T>();
        for arg in A::value_variants() {
            let value = arg.to_possible_value().unwrap();
            assert!(value.get_help().is_some(), "{} has no help", value.get_name());
            let parsed = parser.parse_ref(&cmd, None, std::ffi::OsStr::new(value.get_name())).unwrap();
            assert_eq!(name(parsed), value.get_name());
        }
        for &variant in all {
            assert!(A::value_variants().iter().any(|arg| T::from(arg.clone()) == variant), "{variant:?} has no name");
        }
        assert!(parser.parse_ref(&cmd, None, std::ffi::OsStr::new("no-such-name")).is_err());
    }

    #[test]
    fn every_library_choice_parses_by_its_names() {
        each_name_is_the_librarys::<StrategyArg, _>(&Strategy::ALL, Strategy::name);
        each_name_is_the_librarys::<ObjectiveArg, _>(&Objective::ALL, Objective::name);
        each_name_is_the_librarys::<PrecisionArg, _>(&Precision::ALL, Precision::name);
        each_name_is_the_librarys::<OptimizerArg, _>(&OptimizerKind::ALL, OptimizerKind::name);
        each_name_is_the_librarys::<RecomputeArg, _>(&Recompute::ALL, Recompute::name);
        each_name_is_the_librarys::<AttentionArg, _>(&Attention::ALL, Attention::name);
        each_name_is_the_librarys::<OpsArg, _>(&Ops::ALL, Ops::name);
        each_name_is_the_librarys::<LossArg, _>(&Loss::ALL, Loss::name);
    }

    #[test]
    fn old_spellings_parse_and_others_are_refused() {
        let cmd = clap::Command::new("test");
        let precision = typed::<PrecisionArg, Precision>();
        assert_eq!(precision.parse_ref(&cmd, None, std::ffi::OsStr::new("f32")).unwrap(), Precision::Fp32);
        assert_eq!(precision.parse_ref(&cmd, None, std::ffi::OsStr::new("mixed")).unwrap(), Precision::Mixed);
        assert!(precision.parse_ref(&cmd, None, std::ffi::OsStr::new("fp8")).is_err());
    }
}
