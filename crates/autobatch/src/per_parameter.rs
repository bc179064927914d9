//! The words every layer speaks about a training setup: how its numbers are
//! stored ([`Precision`]) and which optimizer keeps state
//! ([`OptimizerKind`]), with the bytes per parameter each means. A leaf: the
//! estimate, the optimizers, your model's probe and the reference models all
//! use it; its public path is [`estimate`](crate::estimate).

use serde::{Deserialize, Serialize};

/// Byte counts per parameter are exact multiples of 1/32 byte (8-bit Adam's
/// 2 + 2·4/256 = 65/32): counted in 32nds, in integers, so that no count is a
/// rounded float.
pub(crate) const PER_PARAMETER_DENOMINATOR: u64 = 32;

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
    /// Every precision, in the order the command line lists them.
    pub const ALL: [Precision; 3] = [Precision::Fp32, Precision::Bf16, Precision::Mixed];

    pub(crate) fn weight_bytes(self) -> u64 {
        match self {
            Precision::Fp32 => 4,
            Precision::Bf16 | Precision::Mixed => 2,
        }
    }

    pub(crate) fn state_bytes(self) -> u64 {
        match self {
            Precision::Bf16 => 2,
            Precision::Fp32 | Precision::Mixed => 4,
        }
    }

    pub(crate) fn master_bytes(self) -> u64 {
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

/// The most elements of a variable this crate's optimizers update at once
/// (4 MiB in f32): their step's temporaries are bounded by it, not by the
/// largest variable.
pub(crate) const SLICE_ELEMENTS: usize = 1 << 20;

/// AdamW's step, bytes per element of a slice (f32, bf16 variables).
const ADAMW_FP32: u64 = 20;
const ADAMW_BF16: u64 = 10;

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
    pub(crate) fn thirty_seconds_per_parameter(self, precision: Precision) -> u64 {
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
    /// above the state, the variable stored at `precision`: per element of
    /// a slice for the optimizers that update a slice at a time
    /// ([`slice_elements`](Self::slice_elements)), per element of the
    /// largest variable for momentum SGD (three copies of it, as PyTorch's
    /// unfused form makes; neither candle-nn nor this crate implements it).
    /// Measured on this crate's optimizers (docs/optimizers.md, `cargo bench
    /// --bench optimizers`).
    pub fn step_bytes_per_parameter(self, precision: Precision) -> u64 {
        // (f32 or mixed, bf16) variables; mixed precision's f32 masters step
        // from the bf16 gradients cast a slice at a time
        let (fp32, bf16) = match self {
            OptimizerKind::Sgd => (8, 4),
            OptimizerKind::Momentum => (12, 6),
            OptimizerKind::AdamW => (ADAMW_FP32, ADAMW_BF16),
            OptimizerKind::Lion => (16, 8),
            OptimizerKind::Adafactor => (8, 12),
            OptimizerKind::Adam8bit => (21, 21),
        };
        match precision {
            Precision::Bf16 => bf16,
            Precision::Fp32 => fp32,
            // the masters' step on the gradient slice cast to f32 (4 bytes a
            // parameter more, measured: 24 with AdamW)
            Precision::Mixed => fp32 + 4,
        }
    }

    /// The elements of a variable the step's temporaries span at once: a
    /// slice for this crate's optimizers ([`optim`](crate::optim)), which
    /// update in place a slice at a time; `None` for momentum SGD, counted
    /// with whole-variable temporaries as PyTorch's unfused form makes them.
    pub fn slice_elements(self) -> Option<u64> {
        match self {
            OptimizerKind::Momentum => None,
            OptimizerKind::Sgd
            | OptimizerKind::AdamW
            | OptimizerKind::Adafactor
            | OptimizerKind::Adam8bit
            | OptimizerKind::Lion => Some(SLICE_ELEMENTS as u64),
        }
    }

    /// The candle type that implements it: candle-nn's, or this crate's
    /// [`optim`](crate::optim).
    pub fn implementation(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "autobatch::optim::Sgd",
            OptimizerKind::Momentum => "none in candle-nn or autobatch",
            OptimizerKind::AdamW => "autobatch::optim::AdamW",
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
