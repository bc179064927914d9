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
mod shared;

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

pub use adafactor::{Adafactor, ParamsAdafactor};
pub use adamw::{AdamW, AdamWState};
pub use adamw8bit::{AdamW8bit, ParamsAdamW8bit};
pub use lion::{Lion, ParamsLion};
pub use mixed::MixedPrecision;
pub(crate) use shared::{ByKind, Shared};

use crate::vocabulary::OptimizerKind;

/// What every optimizer here is made of: a state per float variable and an
/// update that computes a variable's next values (weights and state) from
/// its gradient. [`step`] writes them, [`dry_step`] computes and drops them,
/// one variable at a time, so that both allocate the same temporaries.
pub(crate) trait PerVariable {
    /// A variable and its state.
    type State;
    /// A variable's next weights and state.
    type Next;

    /// The states, one per float variable.
    fn states(&self) -> &[Self::State];

    /// The variable a state belongs to.
    fn variable(state: &Self::State) -> &Var;

    /// Steps taken so far (0 for an optimizer that does not count them).
    fn steps_taken(&self) -> u64;

    /// Counts one more step, before its update is computed.
    fn count_step(&mut self);

    /// The next weights and state of `state`'s variable for `grad`, at step `step` (from 1).
    fn next(&self, state: &Self::State, grad: &Tensor, step: u64) -> Result<Self::Next>;

    /// Writes `next` into the variable and its state.
    fn write(state: &Self::State, next: Self::Next) -> Result<()>;
}

/// One optimizer step: each variable with a gradient updated in turn.
pub(crate) fn step<O: PerVariable>(optimizer: &mut O, grads: &GradStore) -> Result<()> {
    optimizer.count_step();
    let optimizer = &*optimizer;
    let step = optimizer.steps_taken();
    for state in optimizer.states() {
        if let Some(grad) = grads.get(O::variable(state).as_tensor()) {
            O::write(state, optimizer.next(state, grad, step)?)?;
        }
    }
    Ok(())
}

/// The next step's updates computed one variable at a time and dropped.
pub(crate) fn dry_step<O: PerVariable>(optimizer: &O, grads: &GradStore) -> Result<()> {
    let step = optimizer.steps_taken() + 1;
    for state in optimizer.states() {
        if let Some(grad) = grads.get(O::variable(state).as_tensor()) {
            drop(optimizer.next(state, grad, step)?);
        }
    }
    Ok(())
}

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
