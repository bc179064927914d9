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
//! | [`Sgd`] | 0 | Robbins & Monro 1951 |
//!
//! [`MixedPrecision`] runs any of them on f32 master copies of bf16 variables
//! (2 + 2 + 12 bytes per parameter with AdamW, as the ZeRO paper counts).
//!
//! These are the optimizers the estimate's advice names
//! ([`estimate::OptimizerKind`](crate::estimate::OptimizerKind)).

/// The `candle_nn::Optimizer` methods the optimizers here write alike: the
/// shared [`step`], and the learning rate kept in `self.params.lr`.
macro_rules! shared_step_and_learning_rate {
    () => {
        fn step(&mut self, grads: &candle_core::backprop::GradStore) -> candle_core::Result<()> {
            super::step(self, grads)
        }

        fn learning_rate(&self) -> f64 {
            self.params.lr
        }

        fn set_learning_rate(&mut self, lr: f64) {
            self.params.lr = lr;
        }
    };
}

mod adafactor;
mod adamw;
mod adamw8bit;
mod lion;
mod mixed;
mod sgd;

use std::ops::Range;

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

pub use adafactor::{Adafactor, ParamsAdafactor};
pub use adamw::AdamW;
pub use adamw8bit::AdamW8bit;
pub use lion::{Lion, ParamsLion};
pub use mixed::MixedPrecision;
pub use sgd::Sgd;

use crate::per_parameter::OptimizerKind;

/// The state of each float variable an optimizer steps, in the order given,
/// and the steps it has taken: what every optimizer here keeps besides its
/// hyper-parameters.
#[derive(Debug)]
pub(crate) struct States<S> {
    pub(crate) each: Vec<S>,
    pub(crate) taken: u64,
}

impl<S> States<S> {
    /// `state(var)` for each float variable of `vars` (the others are not stepped).
    pub(crate) fn new(vars: Vec<Var>, state: impl FnMut(Var) -> Result<S>) -> Result<Self> {
        let each = vars.into_iter().filter(|var| var.dtype().is_float()).map(state).collect::<Result<Vec<_>>>()?;
        Ok(States { each, taken: 0 })
    }
}

/// A variable's state, which knows its variable.
pub(crate) trait VariableState {
    fn variable(&self) -> &Var;
}

/// A variable and one moment (Lion's state).
impl VariableState for (Var, Var) {
    fn variable(&self) -> &Var {
        &self.0
    }
}

/// What every optimizer here is made of: a state per float variable and an
/// update that computes a variable's next values (weights and state) from
/// its gradient a slice at a time ([`slices`]), writing each slice into the
/// variable and its state in place ([`step`]) or dropping it
/// ([`DryStep::dry_step`]): the same temporaries either way, none larger than
/// a slice, so that a step's transient is bounded by the slice, not by the
/// largest variable (as `torch.optim.AdamW`'s foreach and fused forms update
/// in place). Every one of them is a [`DryStep`] through this.
pub(crate) trait PerVariable {
    /// A variable and its state.
    type State: VariableState;

    fn states(&self) -> &States<Self::State>;

    fn states_mut(&mut self) -> &mut States<Self::State>;

    /// Computes the next weights and state of `state`'s variable for `grad`
    /// at step `step` (from 1), slice by slice, writing each (`write`) or
    /// dropping it.
    fn update(&self, state: &Self::State, grad: &Tensor, step: u64, write: bool) -> Result<()>;

    /// Bytes of state held between steps ([`DryStep::state_bytes`]).
    fn held_bytes(&self) -> u64;

    /// The kind the estimate knows it as ([`DryStep::kind`]).
    fn optimizer_kind(&self) -> OptimizerKind;
}

/// The most elements of a variable an update computes at once: 4 MiB in
/// f32, so that an update's temporaries (about five slices at their peak)
/// stay near 20 MiB whatever the variable (a 151,936-row embedding, an
/// untied head), and a slice is still large enough that its kernels, not
/// their launches, take the time.
pub(crate) use crate::per_parameter::SLICE_ELEMENTS;

/// The slices of a variable of `elements` elements (flattened, row-major):
/// ranges of at most [`SLICE_ELEMENTS`] (at least one `granule`), each a
/// whole number of `granule`s but the last.
pub(crate) fn slices(elements: usize, granule: usize) -> impl Iterator<Item = Range<usize>> {
    let granule = granule.max(1);
    let width = (SLICE_ELEMENTS / granule).max(1) * granule;
    (0..elements).step_by(width).map(move |start| start..(start + width).min(elements))
}

/// `range` of `tensor`'s elements, flattened and detached: a view of a
/// contiguous tensor (a chain of ops on a tensor with a graph would keep
/// every intermediate alive until the result is dropped).
pub(crate) fn part(tensor: &Tensor, range: &Range<usize>) -> Result<Tensor> {
    tensor.detach().flatten_all()?.narrow(0, range.start, range.len())
}

/// Writes `values` over `range` of `var`'s elements, in place (no copy of
/// the variable: `Tensor::slice_set` into its storage, on the CPU and CUDA alike).
pub(crate) fn write_part(var: &Var, range: &Range<usize>, values: &Tensor) -> Result<()> {
    var.as_tensor().detach().flatten_all()?.slice_set(&values.flatten_all()?.contiguous()?, 0, range.start)
}

/// A gradient its slices can be views of: contiguous, detached (a copy only
/// where backward left it strided).
pub(crate) fn whole_gradient(grad: &Tensor) -> Result<Tensor> {
    grad.detach().contiguous()
}

/// One optimizer step: each variable with a gradient updated in turn.
pub(crate) fn step<O: PerVariable>(optimizer: &mut O, grads: &GradStore) -> Result<()> {
    optimizer.states_mut().taken += 1;
    let optimizer = &*optimizer;
    let step = optimizer.states().taken;
    for state in &optimizer.states().each {
        if let Some(grad) = grads.get(state.variable().as_tensor()) {
            optimizer.update(state, grad, step, true)?;
        }
    }
    Ok(())
}

impl<O: PerVariable> DryStep for O {
    /// The next step's updates computed one variable at a time and dropped.
    fn dry_step(&self, grads: &GradStore) -> Result<()> {
        let step = self.states().taken + 1;
        for state in &self.states().each {
            if let Some(grad) = grads.get(state.variable().as_tensor()) {
                self.update(state, grad, step, false)?;
            }
        }
        Ok(())
    }

    fn state_bytes(&self) -> u64 {
        self.held_bytes()
    }

    fn kind(&self) -> Option<OptimizerKind> {
        Some(self.optimizer_kind())
    }
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

    /// Frees the state between trials when it can be built again as it was
    /// (an optimizer that has taken no real step, shared with a training
    /// loop): the bytes freed. The default frees nothing.
    fn free_state(&self) -> u64 {
        0
    }
}
