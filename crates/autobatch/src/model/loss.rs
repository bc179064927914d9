//! The loss adapters: what a probe step runs to get the loss and the
//! gradients (a loss closure, its own backward pass or not, a forward pass
//! alone, each of a batch or, in a [`BySize`], of a batch and an input size).

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor};

use crate::{BySize, MicroBatch};

/// What a loss closure returns, for [`ModelProbe`](crate::ModelProbe) and
/// [`TrainLoop::step`](crate::TrainLoop::step) alike: the loss (the probe and
/// the loop run its backward pass), or the loss and the variables' gradients
/// its own backward pass computed (gradient checkpointing,
/// [`checkpointed`](super::checkpointed)).
pub trait LossOutput {
    /// Whether the closure computed the gradients (then training scales
    /// them by the micro-step's loss scale as it adds them up).
    const HAS_GRADIENTS: bool;

    /// The loss, and the gradients where the closure computed them.
    fn into_parts(self) -> (Tensor, Option<GradStore>);
}

impl LossOutput for Tensor {
    const HAS_GRADIENTS: bool = false;

    fn into_parts(self) -> (Tensor, Option<GradStore>) {
        (self, None)
    }
}

impl LossOutput for (Tensor, GradStore) {
    const HAS_GRADIENTS: bool = true;

    fn into_parts(self) -> (Tensor, Option<GradStore>) {
        (self.0, Some(self.1))
    }
}

/// What a probe step runs to get the loss and the gradients: a loss closure
/// (whose [`LossOutput`] is the loss, then `loss.backward()`, or the loss and
/// its gradients), a forward pass alone, or a loss type of a model crate
/// ([`ModelProbe::with_loss`](crate::ModelProbe::with_loss)).
pub trait ProbeLoss {
    /// The loss of `batch` samples and the gradients of the variables.
    fn loss_and_gradients(&mut self, batch: usize) -> Result<(Tensor, GradStore)>;

    /// Whether training multiplies this loss's gradients by the micro-step's
    /// loss scale after its backward pass ([`TrainLoop::step`](crate::TrainLoop::step)
    /// does for a closure that returns its gradients, one variable at a
    /// time), so that the accumulating probe step does too. False by
    /// default: a loss closure's scale goes into the graph.
    fn scales_gradients(&self) -> bool {
        false
    }

    /// Whether the step runs a backward pass at all (false for
    /// [`ModelProbe::forward_only`](crate::ModelProbe::forward_only): no gradient check, no update).
    fn computes_gradients(&self) -> bool {
        true
    }
}

/// The loss and gradients of a closure's output: its own, or the loss's backward pass.
fn with_gradients(output: impl LossOutput) -> Result<(Tensor, GradStore)> {
    match output.into_parts() {
        (loss, Some(grads)) => Ok((loss, grads)),
        (loss, None) => {
            let grads = loss.backward()?;
            Ok((loss, grads))
        }
    }
}

impl<F, T> ProbeLoss for F
where
    F: FnMut(MicroBatch) -> Result<T>,
    T: LossOutput,
{
    fn loss_and_gradients(&mut self, batch: usize) -> Result<(Tensor, GradStore)> {
        with_gradients(self(MicroBatch::of(batch))?)
    }

    fn scales_gradients(&self) -> bool {
        T::HAS_GRADIENTS
    }
}

/// A forward pass closure: see [`ModelProbe::forward_only`](crate::ModelProbe::forward_only).
pub struct ForwardOnly<F>(pub(super) F);

impl<F: FnMut(MicroBatch) -> Result<Tensor>> ProbeLoss for ForwardOnly<F> {
    fn loss_and_gradients(&mut self, batch: usize) -> Result<(Tensor, GradStore)> {
        Ok(((self.0)(MicroBatch::of(batch))?, GradStore::default()))
    }

    fn computes_gradients(&self) -> bool {
        false
    }
}

impl<F, T> ProbeLoss for BySize<F>
where
    F: FnMut(MicroBatch, usize) -> Result<T>,
    T: LossOutput,
{
    fn loss_and_gradients(&mut self, batch: usize) -> Result<(Tensor, GradStore)> {
        with_gradients((self.closure)(MicroBatch::of(batch), self.size)?)
    }

    fn scales_gradients(&self) -> bool {
        T::HAS_GRADIENTS
    }
}
