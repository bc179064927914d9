//! What a training setup is made of (precision, optimizer) and what can change
//! about it, with what a change saves: plain data, a leaf that the error type
//! can carry without depending on the estimate.

use serde::{Deserialize, Serialize};

use crate::units::Bytes;

pub(super) use crate::per_parameter::PER_PARAMETER_DENOMINATOR;
pub use crate::per_parameter::{OptimizerKind, Precision};

/// One change that lowers training memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Change {
    /// Store weights, gradients and optimizer state at another precision.
    Precision {
        /// The precision to switch to.
        to: Precision,
    },
    /// Use another optimizer.
    Optimizer {
        /// The optimizer to switch to.
        to: OptimizerKind,
    },
    /// Recompute activations in the backward pass instead of keeping them
    /// (full recomputation: each transformer layer keeps its input, `2·s·b·h`
    /// bytes at 16 bits, instead of `s·b·h·(34 + 5·a·s/h)`).
    GradientCheckpointing,
    /// Train on sequences of this many tokens.
    SequenceLength {
        /// Tokens per sample.
        seq_len: u64,
    },
    /// Partition the training state across the data-parallel ranks (ZeRO).
    Zero {
        /// The ZeRO stage: 1 optimizer states, 2 + gradients, 3 + weights.
        stage: u8,
        /// The data-parallel ranks.
        ranks: u64,
    },
    /// Train low-rank adapters of this rank beside a frozen base (LoRA)
    /// instead of every weight.
    Lora {
        /// The adapters' rank.
        rank: u64,
    },
    /// Keep LoRA's frozen base in 4-bit blocks (QLoRA's base).
    QuantizedBase,
    /// Two changes made together, where no single one fits.
    Both {
        /// The first change.
        first: Box<Change>,
        /// The second change.
        second: Box<Change>,
    },
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Precision { to: Precision::Bf16 } => f.write_str("bf16 weights, gradients and optimizer states"),
            Change::Precision { to: Precision::Mixed } => f.write_str("mixed precision (bf16 weights and gradients)"),
            Change::Precision { to: Precision::Fp32 } => f.write_str("fp32 everywhere"),
            Change::Optimizer { to } => write!(f, "{} optimizer", to.name()),
            Change::GradientCheckpointing => f.write_str("gradient checkpointing"),
            Change::SequenceLength { seq_len } => write!(f, "sequences of {seq_len} tokens"),
            Change::Zero { stage, ranks } => {
                let what = [
                    "",
                    "optimizer states",
                    "optimizer states and gradients",
                    "optimizer states, gradients and weights",
                ];
                write!(f, "ZeRO stage {stage}: {} partitioned over {ranks} ranks", what[usize::from(*stage).min(3)])
            }
            Change::Lora { rank } => write!(f, "LoRA adapters of rank {rank}, the base frozen"),
            Change::QuantizedBase => f.write_str("a 4-bit frozen base (QLoRA)"),
            Change::Both { first, second } => write!(f, "{first}, with {second}"),
        }
    }
}

/// A change with what it is estimated (or was measured) to save.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Remedy {
    /// The change.
    pub change: Change,
    /// Estimated bytes saved.
    pub saves_bytes: u64,
    /// Estimated total afterwards (state plus activations).
    pub total_bytes: u64,
    /// Whether the total afterwards fits the available bytes.
    pub fits: bool,
    /// Whether the total is a measurement of the change made (a step run
    /// with it) rather than an estimate: then `total_bytes` is the step's
    /// measured peak and `fits` what the limit said of it.
    #[serde(default)]
    pub measured: bool,
}

impl Remedy {
    /// The remedy with its byte counts in decimal units (GB), as the
    /// estimate's rules of thumb are written; its `Display` writes binary
    /// units (GiB), as the tuner's limits are.
    pub fn decimal(&self) -> impl std::fmt::Display + '_ {
        InUnits { remedy: self, decimal: true }
    }
}

impl std::fmt::Display for Remedy {
    /// `change: saves ~X, total ~Y (fits)`, in binary units (MiB, GiB).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        InUnits { remedy: self, decimal: false }.fmt(f)
    }
}

/// A remedy written in one family of units.
struct InUnits<'a> {
    remedy: &'a Remedy,
    decimal: bool,
}

impl std::fmt::Display for InUnits<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes =
            |count: u64| if self.decimal { Bytes(count).decimal().to_string() } else { Bytes(count).to_string() };
        let Remedy { change, saves_bytes, total_bytes, fits, measured } = self.remedy;
        if *measured {
            // a measurement says whether it fits either way
            let verdict = if *fits { "fits" } else { "still over" };
            return match saves_bytes {
                0 => write!(f, "{change}: measured {}, saves nothing ({verdict})", bytes(*total_bytes)),
                saved => write!(f, "{change}: measured {}, saves {} ({verdict})", bytes(*total_bytes), bytes(*saved)),
            };
        }
        write!(f, "{change}: saves ~{}, total ~{}", bytes(*saves_bytes), bytes(*total_bytes))?;
        if *fits {
            f.write_str(" (fits)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remedy_writes_one_unit_family_per_line() {
        let change = Change::GradientCheckpointing;
        let fits =
            Remedy { change: change.clone(), saves_bytes: 3 << 30, total_bytes: 12 << 30, fits: true, measured: false };
        let binary = fits.to_string();
        assert_eq!(binary, format!("{change}: saves ~3.00 GiB, total ~12.0 GiB (fits)"));
        let over = Remedy { fits: false, saves_bytes: 8_000_000_000, total_bytes: 30_000_000_000, ..fits };
        assert_eq!(over.decimal().to_string(), format!("{change}: saves ~8.00 GB, total ~30.0 GB"));
    }
}
