//! What a training setup is made of (precision, optimizer) and what can change
//! about it, with what a change saves: plain data, a leaf that the error type
//! can carry without depending on the estimate.

use serde::{Deserialize, Serialize};

use crate::units::format_bytes;

/// Byte counts per parameter are exact multiples of 1/32 byte (8-bit Adam's
/// 2 + 2·4/256 = 65/32): counted in 32nds, in integers, so that no count is a
/// rounded float.
pub(super) const PER_PARAMETER_DENOMINATOR: u64 = 32;

/// How weights, gradients and optimizer states are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// Everything in fp32.
    Fp32,
    /// Everything in bf16, no fp32 copy (candle's optimizers on bf16 variables).
    Bf16,
    /// bf16 weights and gradients, fp32 master weights and optimizer states.
    Mixed,
}

impl Precision {
    pub(crate) fn weight_bytes(self) -> u64 {
        match self {
            Precision::Fp32 => 4,
            Precision::Bf16 | Precision::Mixed => 2,
        }
    }

    pub(super) fn state_bytes(self) -> u64 {
        match self {
            Precision::Bf16 => 2,
            Precision::Fp32 | Precision::Mixed => 4,
        }
    }

    pub(super) fn master_bytes(self) -> u64 {
        match self {
            Precision::Mixed => 4,
            Precision::Fp32 | Precision::Bf16 => 0,
        }
    }

    /// The name used on the command line: `fp32`, `bf16`, `mixed`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Mixed => "mixed",
        }
    }
}

/// The optimizer whose state is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    /// Plain SGD: no state.
    Sgd,
    /// SGD with momentum: one state.
    Momentum,
    /// Adam or AdamW: two moments.
    #[serde(rename = "adamw")]
    AdamW,
    /// Adafactor with a factored second moment and no first moment.
    Adafactor,
    /// 8-bit Adam (bitsandbytes, block-wise quantized moments).
    Adam8bit,
    /// Lion: one momentum state.
    Lion,
}

impl OptimizerKind {
    /// Every kind, in the order the command line lists them.
    pub const ALL: [OptimizerKind; 6] = [
        OptimizerKind::Sgd,
        OptimizerKind::Momentum,
        OptimizerKind::AdamW,
        OptimizerKind::Adafactor,
        OptimizerKind::Adam8bit,
        OptimizerKind::Lion,
    ];

    /// Optimizer-state bytes per parameter at `precision`.
    pub fn bytes_per_parameter(self, precision: Precision) -> f64 {
        self.thirty_seconds_per_parameter(precision) as f64 / PER_PARAMETER_DENOMINATOR as f64
    }

    /// Optimizer-state bytes per parameter, in 32nds of a byte.
    pub(super) fn thirty_seconds_per_parameter(self, precision: Precision) -> u64 {
        let state = precision.state_bytes() * PER_PARAMETER_DENOMINATOR;
        match self {
            OptimizerKind::Sgd | OptimizerKind::Adafactor => 0,
            OptimizerKind::Momentum | OptimizerKind::Lion => state,
            OptimizerKind::AdamW => 2 * state,
            // two 8-bit moments plus one fp32 absmax per 256-element block each:
            // 2 · (1 + 4/256) = 65/32
            OptimizerKind::Adam8bit => 65,
        }
    }

    /// Bytes per parameter of one variable that a step holds at its peak
    /// above the state, the variable stored at `precision`: the optimizers
    /// step one variable at a time, so a step holds this much for the largest
    /// variable (and, in mixed precision, an f32 copy of every gradient).
    /// Measured on candle-nn's SGD and AdamW and this crate's optimizers
    /// (docs/optimizers.md, `cargo bench --bench optimizers`); for momentum
    /// SGD, which neither implements, three copies of the variable.
    pub fn step_bytes_per_parameter(self, precision: Precision) -> u64 {
        let fp32 = precision != Precision::Bf16;
        match self {
            OptimizerKind::Sgd => {
                if fp32 {
                    8
                } else {
                    4
                }
            }
            OptimizerKind::Momentum => {
                if fp32 {
                    12
                } else {
                    6
                }
            }
            OptimizerKind::AdamW => {
                if fp32 {
                    56
                } else {
                    28
                }
            }
            OptimizerKind::Lion => {
                if fp32 {
                    16
                } else {
                    8
                }
            }
            OptimizerKind::Adafactor => {
                if fp32 {
                    12
                } else {
                    20
                }
            }
            OptimizerKind::Adam8bit => 21,
        }
    }

    /// The candle type that implements it: candle-nn's, or this crate's
    /// [`optim`](crate::optim).
    pub fn implementation(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "candle_nn::SGD",
            OptimizerKind::Momentum => "none in candle-nn or autobatch",
            OptimizerKind::AdamW => "candle_nn::AdamW",
            OptimizerKind::Adafactor => "autobatch::optim::Adafactor",
            OptimizerKind::Adam8bit => "autobatch::optim::AdamW8bit",
            OptimizerKind::Lion => "autobatch::optim::Lion",
        }
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Momentum => "momentum",
            OptimizerKind::AdamW => "adamw",
            OptimizerKind::Adafactor => "adafactor",
            OptimizerKind::Adam8bit => "adam8bit",
            OptimizerKind::Lion => "lion",
        }
    }
}

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
