//! Your own candle model: probed as it is, trained with the plan.
//!
//! - [`ModelProbe`](crate::ModelProbe) turns a `VarMap` and a loss closure (or
//!   another [`ProbeLoss`]) into a [`Workload`](crate::Workload)
//!   that runs forward, backward and the optimizer's update without changing a
//!   variable, names the variables that got no gradient, and gives the tuner its
//!   cache key and memory profile;
//! - [`TrainLoop`](crate::TrainLoop) trains with a plan: each optimizer step as guarded
//!   micro-batches with scaled losses, the variables' gradients accumulated
//!   (nothing else), then the optimizer's step;
//! - [`detached`] builds a model a second time over the same weights with no
//!   graph, for the evaluation probe and for checkpointing;
//! - [`checkpointed`] is gradient checkpointing for a model built as a sequence
//!   of blocks: boundaries kept, each block recomputed in the backward pass.

mod buffers;
mod checkpoint;
mod detached;
pub(crate) mod grads;
mod loss;
pub(crate) mod probe;
pub(crate) mod train;

pub use checkpoint::checkpointed;
pub use detached::{detached, detached_sharing};
pub use loss::{ForwardOnly, LossOutput, ProbeLoss};

use candle_core::Var;

/// The variables a [`ModelProbe`](crate::ModelProbe) measures: a
/// `&VarMap`'s (by name, sorted, so that every run sees the same order), or
/// named variables held elsewhere (`Vec<(String, Var)>`).
pub trait Variables {
    /// The variables, by name.
    fn into_named(self) -> Vec<(String, Var)>;
}

impl Variables for &candle_nn::VarMap {
    fn into_named(self) -> Vec<(String, Var)> {
        named_vars(self)
    }
}

/// A reference to any of them (`&&VarMap` in a loop over models).
impl<V: Variables + Copy> Variables for &V {
    fn into_named(self) -> Vec<(String, Var)> {
        (*self).into_named()
    }
}

impl Variables for Vec<(String, Var)> {
    fn into_named(self) -> Vec<(String, Var)> {
        self
    }
}

/// The variables of a `VarMap`, by name (sorted, so that every run sees the
/// same order).
pub(crate) fn named_vars(varmap: &candle_nn::VarMap) -> Vec<(String, Var)> {
    let data = varmap.data().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut vars: Vec<(String, Var)> = data.iter().map(|(name, var)| (name.clone(), var.clone())).collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}
