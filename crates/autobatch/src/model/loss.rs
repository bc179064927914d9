//! The loss adapters: what a probe step runs to get the loss and the
//! gradients (a loss closure, a forward pass alone, a closure with its own
//! backward pass, each of a batch or, in a [`BySize`], of a batch and an
//! input size).

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor};

use crate::BySize;

/// What a probe step runs to get the loss and the gradients: a loss closure
/// (then `loss.backward()`), or a closure that does its own backward pass
/// ([`ModelProbe::with_backward`](crate::ModelProbe::with_backward), e.g. with [`checkpointed`](super::checkpointed)).
pub trait ProbeLoss {
    /// The loss of `batch` samples and the gradients of the variables.
    fn loss_and_gradients(&mut self, batch: usize) -> Result<(Tensor, GradStore)>;

    /// Whether training multiplies this loss's gradients by the micro-step's
    /// loss scale after its backward pass
    /// ([`TrainLoop::step_with_backward`](crate::TrainLoop::step_with_backward)
    /// does, one variable at a time), so that the accumulating probe step does
    /// too. False by default: a loss closure's scale goes into the graph.
    fn scales_gradients(&self) -> bool {
        false
    }

    /// Whether the step runs a backward pass at all (false for
    /// [`ModelProbe::forward_only`](crate::ModelProbe::forward_only): no gradient check, no update).
    fn computes_gradients(&self) -> bool {
        true
    }
}

/// A forward pass closure: see [`ModelProbe::forward_only`](crate::ModelProbe::forward_only).
pub struct ForwardOnly<F>(pub(super) F);

impl<F: FnMut(usize) -> Result<Tensor>> ProbeLoss for ForwardOnly<F> {
    fn loss_and_gradients(&mut self, batch: usize) -> Result<(Tensor, GradStore)> {
        Ok(((self.0)(batch)?, GradStore::default()))
    }

    fn computes_gradients(&self) -> bool {
        false
    }
}

impl<F: FnMut(usize) -> Result<Tensor>> ProbeLoss for F {
    fn loss_and_gradients(&mut self, batch: usize) -> Result<(Tensor, GradStore)> {
        let loss = self(batch)?;
        let grads = loss.backward()?;
        Ok((loss, grads))
    }
}

/// A closure that computes the loss and the gradients itself: see
/// [`ModelProbe::with_backward`](crate::ModelProbe::with_backward) (and, of
/// the batch and an input size in a [`BySize`],
/// [`ModelProbe::by_size_with_backward`](crate::ModelProbe::by_size_with_backward)).
pub struct WithBackward<F>(pub(super) F);

impl<F: FnMut(usize) -> Result<(Tensor, GradStore)>> ProbeLoss for WithBackward<F> {
    fn loss_and_gradients(&mut self, batch: usize) -> Result<(Tensor, GradStore)> {
        (self.0)(batch)
    }

    fn scales_gradients(&self) -> bool {
        true
    }
}

impl<F: FnMut(usize, usize) -> Result<Tensor>> ProbeLoss for BySize<F> {
    fn loss_and_gradients(&mut self, batch: usize) -> Result<(Tensor, GradStore)> {
        let loss = (self.closure)(batch, self.size)?;
        let grads = loss.backward()?;
        Ok((loss, grads))
    }
}

impl<F: FnMut(usize, usize) -> Result<(Tensor, GradStore)>> ProbeLoss for BySize<WithBackward<F>> {
    fn loss_and_gradients(&mut self, batch: usize) -> Result<(Tensor, GradStore)> {
        (self.closure.0)(batch, self.size)
    }

    fn scales_gradients(&self) -> bool {
        true
    }
}
