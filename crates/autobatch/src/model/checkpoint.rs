//! Gradient checkpointing for candle models built as a sequence of blocks.
//!
//! candle records a graph whenever a variable takes part, and keeps every
//! activation of it until the loss is dropped. Checkpointing keeps only the
//! blocks' boundaries instead: the forward pass runs each block over detached
//! weights (no graph), and the backward pass runs each block again, last first,
//! over the real variables from its saved input, and backpropagates the
//! gradient of its output through it with the surrogate `sum(y ⊙ g)`, whose
//! gradient is exactly `Jᵀg`. One block's graph is alive at a time: a
//! transformer layer keeps its input (`s·b·h` values) instead of all its
//! activations (Korthikanti et al. 2022: `34·s·b·h + 5·a·s²·b` bytes at 16 bits),
//! for one more forward pass of each block.
//!
//! ```
//! use autobatch::model::{checkpointed, detached};
//! use candle_core::{DType, Device, Module, Tensor};
//! use candle_nn::{linear, Linear, VarBuilder, VarMap};
//!
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
//! let blocks: Vec<Linear> = (0..4).map(|i| linear(16, 16, vb.pp(i))).collect::<Result<_, _>>()?;
//! // the same blocks over the same storage, detached: built from `detached(&varmap)`
//! let frozen: Vec<Linear> = (0..4).map(|i| linear(16, 16, detached(&varmap).pp(i))).collect::<Result<_, _>>()?;
//! let x = Tensor::ones((8, 16), DType::F32, &Device::Cpu)?;
//!
//! let (loss, grads) = checkpointed(&varmap.all_vars(), &x, &blocks, &frozen, |h| h.sqr()?.mean_all())?;
//! // the same gradients as the plain backward pass
//! let plain = blocks.iter().try_fold(x.clone(), |h, b| b.forward(&h))?.sqr()?.mean_all()?;
//! let plain_grads = plain.backward()?;
//! for var in varmap.all_vars() {
//!     let (a, b) = (grads.get(&var).unwrap(), plain_grads.get(&var).unwrap());
//!     assert!((a - b)?.abs()?.max_all()?.to_scalar::<f32>()? < 1e-6);
//! }
//! assert_eq!(loss.to_scalar::<f32>()?, plain.to_scalar::<f32>()?);
//! # Ok::<(), candle_core::Error>(())
//! ```

use candle_core::backprop::GradStore;
use candle_core::{Module, Result, Tensor, Var};

use super::grads::Accumulator;

/// The loss and the variables' gradients of `head(blocks(input))`, with
/// gradient checkpointing over `blocks`.
///
/// - `vars`: the variables whose gradients to keep (all of them: those of the
///   blocks, of the head, and of whatever computed `input`);
/// - `input`: the first block's input, with its graph (an embedding lookup, say);
/// - `blocks`: the blocks over the variables; `detached_blocks`: the same blocks
///   built over detached weights ([`detached`](super::detached)), run in the
///   forward pass so that it records no graph;
/// - `head`: from the last block's output to the scalar loss (the mean loss:
///   [`TrainLoop::step`](crate::TrainLoop::step)
///   scales it and its gradients for accumulation).
///
/// Returns the loss (detached) and the gradients of `vars`. The gradients
/// are those of `loss.backward()`: the same operations run in the same order
/// inside each block, and the surrogate passes the upstream gradient through
/// unchanged (its backward multiplies it by ones), so they came out
/// bit-identical on the GPT of `crates/models/tests/measured/your_model.rs`. A variable used in
/// several blocks (tied weights) sums its parts in another order, which can
/// differ in the last bits; the tests allow 1e-5 of the largest gradient.
pub fn checkpointed<B: Module>(
    vars: &[Var],
    input: &Tensor,
    blocks: &[B],
    detached_blocks: &[B],
    head: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<(Tensor, GradStore)> {
    if blocks.len() != detached_blocks.len() {
        candle_core::bail!(
            "checkpointing needs each block twice: {} blocks over the variables, {} detached",
            blocks.len(),
            detached_blocks.len()
        );
    }
    // forward: the boundaries only
    let mut boundaries = Vec::with_capacity(blocks.len() + 1);
    boundaries.push(input.detach());
    for block in detached_blocks {
        let next = block.forward(boundaries.last().expect("one boundary per block and the input"))?;
        boundaries.push(next.detach());
    }
    // the head, over a variable standing for the last boundary
    let last = Var::from_tensor(boundaries.pop().as_ref().expect("the input is a boundary"))?;
    let loss = head(last.as_tensor())?;
    let mut grads = loss.backward()?;
    // gradients are computed with ordinary ops over the variables, so they
    // carry a graph of their own: detach them, or the next backward pass would
    // run through it and count the later blocks' weights again
    let mut upstream = grads.remove(last.as_tensor()).map(|g| g.detach());
    drop(last);
    // one gradient per variable, summed where a variable is used in several
    // places (as one backward pass sums it)
    let mut total = Accumulator::default();
    total.add(grads, vars)?;
    let loss = loss.detach();
    // backward: each block again, last first, from its saved input
    for block in blocks.iter().rev() {
        let saved = boundaries.pop().expect("one boundary per block");
        let Some(gradient) = upstream.take() else { break };
        let start = Var::from_tensor(&saved)?;
        drop(saved);
        let output = block.forward(start.as_tensor())?;
        let mut grads = (output * gradient)?.sum_all()?.backward()?;
        upstream = grads.remove(start.as_tensor()).map(|g| g.detach());
        total.add(grads, vars)?;
    }
    // and whatever computed the input
    if let Some(gradient) = upstream {
        let grads = (input * gradient)?.sum_all()?.backward()?;
        total.add(grads, vars)?;
    }
    Ok((loss, total.take()?))
}
