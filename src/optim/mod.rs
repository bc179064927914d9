//! Optimizers for candle with small state, each a `candle_nn::Optimizer` with
//! a dry step, so that [`ModelProbe`](crate::ModelProbe) measures its state
//! and its update's temporaries without changing anything:
//!
//! | optimizer | state, bytes per parameter (f32 variables) | paper |
//! |---|---|---|
//! | [`AdamW`] | 8: two moments | Loshchilov & Hutter 2019 |
//! | [`Lion`] | 4: one moment | Chen et al. 2023 |
//! | [`Adafactor`] | ≈0 for matrices (`4·(rows + cols)` per matrix), 4 for vectors | Shazeer & Stern 2018 |
//! | [`AdamW8bit`] | ≈2.03: two 8-bit moments, one f32 scale per 256 values each; tensors under 4096 values keep f32 moments | Dettmers et al. 2022 |
//!
//! [`MixedPrecision`] runs any of them on f32 master copies of bf16 variables
//! (2 + 2 + 12 bytes per parameter with AdamW, as the ZeRO paper counts).
//!
//! These are the optimizers the estimate's advice names
//! ([`estimate::OptimizerKind`](crate::estimate::OptimizerKind)).

mod adafactor;
mod adamw;
mod adamw8bit;
mod lion;
mod mixed;

use candle_core::backprop::GradStore;
use candle_core::Result;

pub use adafactor::{Adafactor, ParamsAdafactor};
pub use adamw::{AdamW, AdamWState};
pub use adamw8bit::{AdamW8bit, ParamsAdamW8bit};
pub use lion::{Lion, ParamsLion};
pub use mixed::MixedPrecision;

use crate::estimate::OptimizerKind;

/// Bytes a variable's tensor holds.
pub(crate) fn var_bytes(var: &candle_core::Var) -> u64 {
    (var.elem_count() * var.dtype().size_in_bytes()) as u64
}

/// An optimizer whose update can be computed without being applied: what a
/// probe step runs, so that it measures the update's memory and changes no
/// variable, no state and no step count.
pub trait DryStep {
    /// Computes the update [`step`](candle_nn::Optimizer::step) would apply
    /// next, allocating every temporary it allocates, and drops it.
    fn dry_step(&self, grads: &GradStore) -> Result<()>;

    /// Bytes of optimizer state held between steps.
    fn state_bytes(&self) -> u64;

    /// The kind the analytical estimate knows it as, if any.
    fn kind(&self) -> Option<OptimizerKind>;

    /// Whether it keeps f32 master copies of low-precision weights
    /// ([`MixedPrecision`]): the estimate then counts mixed precision.
    fn master_weights(&self) -> bool {
        false
    }
}
