//! The value types of the command line's flags: counts, the library's own
//! enums by their names, fractions, seeds.

use std::ffi::OsStr;
use std::fmt;
use std::str::FromStr;

use autobatch::estimate::{OptimizerKind, Precision, Recompute};
use autobatch::{Objective, Strategy};
use autobatch_models::{Attention, Loss, Ops};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

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

/// A library enum as a flag's value: its variants by the names the library
/// gives them, each with a line of help.
pub trait Choice: Copy + Send + Sync + 'static {
    /// Every variant, in the order help lists them.
    const ALL: &'static [Self];
    /// The name the library gives it.
    fn name(self) -> &'static str;
    /// One line of `--help`.
    fn help(self) -> &'static str;
    /// Other names it is also known by.
    fn aliases(self) -> &'static [&'static str] {
        &[]
    }
}

/// A flag taking any variant of `T`.
pub fn choice<T: Choice>() -> ChoiceParser<T> {
    among(T::ALL)
}

/// A flag taking the variants of `T` that `allowed` lists (the others do
/// not apply to the command).
pub fn among<T: Choice>(allowed: &'static [T]) -> ChoiceParser<T> {
    ChoiceParser { allowed }
}

/// Parses a [`Choice`] by name; unknown names get clap's message, which lists
/// the valid ones and suggests the nearest.
#[derive(Clone)]
pub struct ChoiceParser<T: 'static> {
    allowed: &'static [T],
}

impl<T: Choice> ChoiceParser<T> {
    fn possible(&self) -> impl Iterator<Item = (T, PossibleValue)> + '_ {
        self.allowed.iter().map(|&variant| {
            (
                variant,
                PossibleValue::new(variant.name()).help(variant.help()).aliases(variant.aliases().iter().copied()),
            )
        })
    }
}

impl<T: Choice> TypedValueParser for ChoiceParser<T> {
    type Value = T;

    fn parse_ref(&self, cmd: &clap::Command, arg: Option<&clap::Arg>, value: &OsStr) -> Result<T, clap::Error> {
        let ignore_case = arg.is_some_and(|arg| arg.is_ignore_case_set());
        let named =
            value.to_str().and_then(|text| self.possible().find(|(_, possible)| possible.matches(text, ignore_case)));
        match named {
            Some((variant, _)) => Ok(variant),
            None => {
                // clap's own message for a value that is none of the names
                let names = PossibleValuesParser::new(self.possible().map(|(_, possible)| possible));
                Err(match names.parse_ref(cmd, arg, value) {
                    Err(err) => err,
                    Ok(_) => clap::Error::new(clap::error::ErrorKind::InvalidValue).with_cmd(cmd),
                })
            }
        }
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(self.possible().map(|(_, possible)| possible)))
    }
}

impl Choice for Strategy {
    const ALL: &'static [Strategy] = &Strategy::ALL;
    fn name(self) -> &'static str {
        Strategy::name(self)
    }
    fn help(self) -> &'static str {
        match self {
            Strategy::Predictive => {
                "Fit the memory curve on small trials, jump near the answer, verify: the same answer as binary in \
                 fewer, cheaper trials"
            }
            Strategy::Binary => "Double, then bisect to the exact largest batch",
            Strategy::Power => "Double only: the largest fitting power of two",
            _ => "",
        }
    }
}

impl Choice for Objective {
    const ALL: &'static [Objective] = &Objective::ALL;
    fn name(self) -> &'static str {
        Objective::name(self)
    }
    fn help(self) -> &'static str {
        match self {
            Objective::LargestBatch => "The largest batch that fits",
            Objective::Throughput => "The best measured samples per second near the top",
            _ => "",
        }
    }
}

impl Choice for Precision {
    const ALL: &'static [Precision] = &Precision::ALL;
    fn name(self) -> &'static str {
        Precision::name(self)
    }
    fn help(self) -> &'static str {
        match self {
            Precision::Fp32 => "32-bit floats",
            Precision::Bf16 => "bfloat16 weights, gradients, activations and optimizer state",
            Precision::Mixed => {
                "bf16 weights, gradients and activations; f32 master weights and optimizer state (2 + 2 + 12 \
                 bytes per parameter under AdamW)"
            }
        }
    }
    fn aliases(self) -> &'static [&'static str] {
        match self {
            Precision::Fp32 => &["f32"],
            Precision::Bf16 | Precision::Mixed => &[],
        }
    }
}

impl Choice for OptimizerKind {
    const ALL: &'static [OptimizerKind] = &OptimizerKind::ALL;
    fn name(self) -> &'static str {
        OptimizerKind::name(self)
    }
    fn help(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "Plain SGD: no state",
            OptimizerKind::Momentum => "SGD with momentum: one state",
            OptimizerKind::AdamW => "AdamW: two moments",
            OptimizerKind::Adafactor => "Adafactor: a factored second moment, no first",
            OptimizerKind::Adam8bit => "8-bit Adam: two moments in blocks of bytes",
            OptimizerKind::Lion => "Lion: one momentum",
        }
    }
}

impl Choice for Recompute {
    const ALL: &'static [Recompute] = &Recompute::ALL;
    fn name(self) -> &'static str {
        Recompute::name(self)
    }
    fn help(self) -> &'static str {
        match self {
            Recompute::None => "Keep every activation",
            Recompute::Selective => "Recompute the attention's softmax and score-times-value parts",
            Recompute::Full => "Recompute every layer from its input (gradient checkpointing)",
        }
    }
}

impl Choice for Attention {
    const ALL: &'static [Attention] = &Attention::ALL;
    fn name(self) -> &'static str {
        Attention::name(self)
    }
    fn help(self) -> &'static str {
        match self {
            Attention::Blocked => "In blocks, nothing of heads × s × s kept",
            Attention::Eager => "The scores made whole and kept for the backward pass",
        }
    }
}

impl Choice for Ops {
    const ALL: &'static [Ops] = &Ops::ALL;
    fn name(self) -> &'static str {
        Ops::name(self)
    }
    fn help(self) -> &'static str {
        match self {
            Ops::Fused => "Each one node keeping its inputs and output",
            Ops::Eager => "Written as candle ops, every intermediate kept",
        }
    }
}

impl Choice for Loss {
    const ALL: &'static [Loss] = &Loss::ALL;
    fn name(self) -> &'static str {
        Loss::name(self)
    }
    fn help(self) -> &'static str {
        match self {
            Loss::Chunked => "The head and the loss fused in chunks of tokens",
            Loss::Full => "Every position's logits made whole",
        }
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
pub fn ceiling(text: &str) -> Result<autobatch::Ceiling, String> {
    let text = text.trim();
    let (number, scale) = match text.strip_suffix('%') {
        Some(percent) => (percent.trim_end(), 100.0),
        None => (text, 1.0),
    };
    match number.parse::<f64>() {
        // what would be valid, in words: clap names the flag and the value
        Ok(value) if value.is_finite() => autobatch::Ceiling::new(value / scale).map_err(|err| match err {
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
    fn a_count_is_a_whole_number_of_at_least_one() {
        assert_eq!("8".parse::<Count>(), Ok(Count(8)));
        assert_eq!(" 1e6 ".parse::<Count>(), Ok(Count(1_000_000)));
        assert_eq!("0".parse::<Count>(), Err("must be at least 1".to_owned()));
        assert!("-3".parse::<Count>().unwrap_err().contains("must not be negative"));
        assert!("2.5".parse::<Count>().unwrap_err().contains("whole number"));
    }

    fn every_name_parses_back<T: Choice + PartialEq + fmt::Debug>() {
        let cmd = clap::Command::new("test");
        for &variant in T::ALL {
            for name in std::iter::once(variant.name()).chain(variant.aliases().iter().copied()) {
                assert_eq!(choice::<T>().parse_ref(&cmd, None, OsStr::new(name)).unwrap(), variant, "{name}");
            }
            assert!(!variant.help().is_empty(), "{variant:?} has no help");
        }
        assert!(choice::<T>().parse_ref(&cmd, None, OsStr::new("no-such-name")).is_err());
    }

    #[test]
    fn every_library_choice_parses_by_its_names() {
        every_name_parses_back::<Strategy>();
        every_name_parses_back::<Objective>();
        every_name_parses_back::<Precision>();
        every_name_parses_back::<OptimizerKind>();
        every_name_parses_back::<Recompute>();
        every_name_parses_back::<Attention>();
        every_name_parses_back::<Ops>();
        every_name_parses_back::<Loss>();
    }

    #[test]
    fn a_subset_refuses_the_others() {
        let cmd = clap::Command::new("test");
        let two = among(&[Precision::Fp32, Precision::Bf16]);
        assert_eq!(two.parse_ref(&cmd, None, OsStr::new("f32")).unwrap(), Precision::Fp32);
        assert!(two.parse_ref(&cmd, None, OsStr::new("mixed")).is_err());
    }
}
