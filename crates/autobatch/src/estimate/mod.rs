//! The analytical memory model: what a model's training state costs before any
//! activation, and which changes would make it fit.
//!
//! Bytes per parameter, as the mixed-precision training recipe (Micikevicius et
//! al. 2018, "Mixed Precision Training") and the ZeRO paper (Rajbhandari et al.
//! 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
//! section 3.1: 2 + 2 + 12 bytes per parameter for mixed-precision Adam) give them,
//! with 8-bit Adam as in Dettmers et al. 2022 ("8-bit Optimizers via Block-wise
//! Quantization", blocks of 256) and Adafactor as in Shazeer & Stern 2018:
//!
//! | state | fp32 | bf16 (pure) | mixed precision |
//! |---|---|---|---|
//! | weights | 4 | 2 | 2 (+4 fp32 master copy) |
//! | gradients | 4 | 2 | 2 |
//! | SGD / momentum / Lion | 0 / 4 / 4 | 0 / 2 / 2 | 0 / 4 / 4 |
//! | Adam, AdamW | 8 | 4 | 8 |
//! | 8-bit Adam (block 256) | 2.03 | 2.03 | 2.03 |
//! | Adafactor (factored) | ≈0 | ≈0 | ≈0 |
//!
//! Optimizer states are kept in the weights' dtype when training purely in bf16
//! (as candle's optimizers do) and in fp32 otherwise. Adafactor's factored second
//! moment is `4·(rows + cols)` bytes per matrix: about nothing per parameter for
//! the matrices that hold almost all parameters, which is what this model counts.
//!
//! ```
//! use autobatch::estimate::{OptimizerKind, Precision, StaticMemory};
//!
//! let adamw = StaticMemory::new(1_000_000_000, Precision::Fp32, OptimizerKind::AdamW)?;
//! assert_eq!((adamw.weights, adamw.gradients, adamw.optimizer_states), (4e9 as u64, 4e9 as u64, 8e9 as u64));
//! assert_eq!(adamw.total(), 16_000_000_000);
//! assert!(!adamw.fits(12 << 30));
//! // byte counts never wrap: past 2^64 bytes it is an error
//! assert!(StaticMemory::new(10_000_000_000_000_000_000, Precision::Fp32, OptimizerKind::AdamW).is_err());
//! # Ok::<(), autobatch::Error>(())
//! ```

use serde::{Deserialize, Serialize};

mod accelerators;
mod activations;
pub(crate) mod change;
mod setup;
mod sharding;

use crate::Error;

pub use accelerators::Accelerator;
pub use activations::{Recompute, TransformerShape};
use change::PER_PARAMETER_DENOMINATOR;
pub use change::{Change, OptimizerKind, Precision, Remedy};
pub use setup::TrainingSetup;
pub use sharding::Sharding;

/// The training state of a model before any activation, in bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaticMemory {
    /// Trainable parameters.
    pub parameters: u64,
    /// How they are stored.
    pub precision: Precision,
    /// The optimizer.
    pub optimizer: OptimizerKind,
    /// Weight bytes.
    pub weights: u64,
    /// Gradient bytes (same dtype as the weights).
    pub gradients: u64,
    /// Optimizer-state bytes.
    pub optimizer_states: u64,
    /// fp32 master-weight bytes (mixed precision only).
    pub master_weights: u64,
}

impl StaticMemory {
    /// The state of `parameters` parameters trained at `precision` with
    /// `optimizer`. Every byte count is exact (rounded to the nearest byte only
    /// for 8-bit Adam's fractional bytes per parameter); a state of 2^64 bytes
    /// or more is [`Error::ByteOverflow`], never a wrapped or saturated number.
    pub fn new(parameters: u64, precision: Precision, optimizer: OptimizerKind) -> Result<Self, Error> {
        let overflow = || {
            Error::byte_overflow(format!(
                "the training state of {parameters} parameters ({}, {})",
                precision.name(),
                optimizer.name()
            ))
        };
        let bytes = |thirty_seconds: u64| -> Result<u64, Error> {
            let exact = u128::from(parameters) * u128::from(thirty_seconds);
            let denominator = u128::from(PER_PARAMETER_DENOMINATOR);
            u64::try_from((exact + denominator / 2) / denominator).map_err(|_| overflow())
        };
        let state = StaticMemory {
            parameters,
            precision,
            optimizer,
            weights: bytes(precision.weight_bytes() * PER_PARAMETER_DENOMINATOR)?,
            gradients: bytes(precision.weight_bytes() * PER_PARAMETER_DENOMINATOR)?,
            optimizer_states: bytes(optimizer.thirty_seconds_per_parameter(precision))?,
            master_weights: bytes(precision.master_bytes() * PER_PARAMETER_DENOMINATOR)?,
        };
        [state.gradients, state.optimizer_states, state.master_weights]
            .into_iter()
            .try_fold(state.weights, u64::checked_add)
            .ok_or_else(overflow)?;
        Ok(state)
    }

    /// Weights + gradients + optimizer states + master weights (checked to fit
    /// in a `u64` when the state was made).
    pub fn total(&self) -> u64 {
        self.weights + self.gradients + self.optimizer_states + self.master_weights
    }

    /// [`total`](Self::total) plus `activation_bytes`, or
    /// [`Error::ByteOverflow`] past 2^64 − 1 bytes.
    pub fn total_with(&self, activation_bytes: u64) -> Result<u64, Error> {
        self.total().checked_add(activation_bytes).ok_or_else(|| {
            Error::byte_overflow(format!(
                "the training state of {} parameters plus {activation_bytes} bytes of activations",
                self.parameters
            ))
        })
    }

    /// Whether the state alone fits in `capacity` bytes.
    pub fn fits(&self, capacity: u64) -> bool {
        self.total() <= capacity
    }

    /// Bytes per parameter of the whole state.
    pub fn bytes_per_parameter(&self) -> f64 {
        if self.parameters == 0 { 0.0 } else { self.total() as f64 / self.parameters as f64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BILLION: u64 = 1_000_000_000;

    #[test]
    fn classic_numbers() {
        let cases = [
            (Precision::Fp32, OptimizerKind::AdamW, 16.0),
            (Precision::Mixed, OptimizerKind::AdamW, 16.0), // ZeRO: 2 + 2 + 12
            (Precision::Bf16, OptimizerKind::AdamW, 8.0),   // candle: moments in bf16
            (Precision::Fp32, OptimizerKind::Sgd, 8.0),
            (Precision::Fp32, OptimizerKind::Momentum, 12.0),
            (Precision::Fp32, OptimizerKind::Lion, 12.0),
            (Precision::Fp32, OptimizerKind::Adafactor, 8.0),
            (Precision::Fp32, OptimizerKind::Adam8bit, 10.03125),
        ];
        for (precision, optimizer, per_parameter) in cases {
            let state = StaticMemory::new(BILLION, precision, optimizer).unwrap();
            assert_eq!(state.total(), (per_parameter * 1e9) as u64, "{precision:?} {optimizer:?}");
        }
        let mixed = StaticMemory::new(BILLION, Precision::Mixed, OptimizerKind::AdamW).unwrap();
        assert_eq!(
            (mixed.weights, mixed.gradients, mixed.optimizer_states, mixed.master_weights),
            (2 * BILLION, 2 * BILLION, 8 * BILLION, 4 * BILLION)
        );
    }

    #[test]
    fn byte_counts_never_wrap() {
        // 16 bytes per parameter: the largest count whose state fits in a u64
        let most = u64::MAX / 16;
        let state = StaticMemory::new(most, Precision::Fp32, OptimizerKind::AdamW).unwrap();
        assert_eq!(state.total(), most * 16);
        assert!(matches!(
            StaticMemory::new(most + 1, Precision::Fp32, OptimizerKind::AdamW),
            Err(Error::ByteOverflow { .. })
        ));
        for parameters in [2_000_000_000_000_000_000u64, 10_000_000_000_000_000_000, u64::MAX] {
            for optimizer in OptimizerKind::ALL {
                for precision in [Precision::Fp32, Precision::Bf16, Precision::Mixed] {
                    if let Ok(state) = StaticMemory::new(parameters, precision, optimizer) {
                        let sum = [state.weights, state.gradients, state.optimizer_states, state.master_weights]
                            .iter()
                            .map(|&b| u128::from(b))
                            .sum::<u128>();
                        assert_eq!(u128::from(state.total()), sum);
                    }
                }
            }
        }
        assert!(state.total_with(u64::MAX).is_err());
        assert!(TrainingSetup::new(most, Precision::Fp32, OptimizerKind::AdamW).activations(u64::MAX).total().is_err());
    }

    #[test]
    fn eight_bit_adam_counts_its_block_scales_exactly() {
        let state = StaticMemory::new(256, Precision::Fp32, OptimizerKind::Adam8bit).unwrap();
        assert_eq!(state.optimizer_states, 2 * 256 + 2 * 4);
    }
}
