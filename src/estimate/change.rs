//! What a training setup is made of (precision, optimizer) and what can change
//! about it, with what a change saves: plain data, a leaf that the error type
//! can carry without depending on the estimate.

use serde::{Deserialize, Serialize};

use crate::units::format_bytes;

pub(super) use crate::vocabulary::PER_PARAMETER_DENOMINATOR;
pub use crate::vocabulary::{OptimizerKind, Precision};

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
        }
    }
}

/// A change with what it is estimated to save.
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
}

impl Remedy {
    /// `change: saves ~X, total ~Y (fits)`, with byte counts written by `bytes`
    /// (one unit family on the line: [`format_bytes`](crate::format_bytes)
    /// or [`format_bytes_decimal`](crate::format_bytes_decimal)).
    pub fn describe(&self, bytes: fn(u64) -> String) -> String {
        format!(
            "{}: saves ~{}, total ~{}{}",
            self.change,
            bytes(self.saves_bytes),
            bytes(self.total_bytes),
            if self.fits { " (fits)" } else { "" }
        )
    }
}

impl std::fmt::Display for Remedy {
    /// [`describe`](Self::describe) in binary units (MiB, GiB), as the tuner's
    /// limits are written.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe(format_bytes))
    }
}
