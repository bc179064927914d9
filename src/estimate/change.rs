//! What a training setup is made of (precision, optimizer) and what can change
//! about it, with what a change saves: plain data, a leaf that the error type
//! can carry without depending on the estimate.

use serde::{Deserialize, Serialize};

use crate::units::format_bytes_decimal;

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
    pub(super) fn weight_bytes(self) -> u64 {
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
    /// (keeps about `2·s·b·h` bytes per transformer layer instead of `34·s·b·h`).
    GradientCheckpointing,
    /// Train on shorter sequences or smaller images.
    ShorterInputs {
        /// The factor the input length is divided by.
        factor: u32,
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
            Change::Optimizer { to } => write!(f, "{} optimizer ({})", to.name(), to.implementation()),
            Change::GradientCheckpointing => f.write_str("gradient checkpointing"),
            Change::ShorterInputs { factor } => write!(f, "inputs {factor}× shorter (sequence length or image side)"),
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

impl std::fmt::Display for Remedy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: saves ~{}, total ~{}{}",
            self.change,
            format_bytes_decimal(self.saves_bytes),
            format_bytes_decimal(self.total_bytes),
            if self.fits { " (fits)" } else { "" }
        )
    }
}
