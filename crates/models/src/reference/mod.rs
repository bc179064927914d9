//! Reference candle models for the binary, tests, benchmarks and examples:
//! a decoder-only [`Transformer`] language model, an [`Mlp`] classifier and a
//! small [`ConvNet`] for images, each trained with AdamW on synthetic data (no
//! downloads).
//!
//! Each model is built as a user builds one: its variables in a `VarMap`, a
//! loss of a synthetic batch. A [`Trainer`](crate::trainer::Trainer) puts it
//! through autobatch's `ModelProbe` and `TrainLoop`, as a user's model goes.
//! This module keeps the models and their configurations; nothing here steps.
//!
//! Tune at the longest sequence (largest image) training will see: activation
//! memory per sample grows with sequence length, quadratically in attention.
//!
//! ```
//! use autobatch_models::reference::TransformerConfig;
//! use candle_core::Device;
//!
//! let mut lm = TransformerConfig::tiny().build(&Device::Cpu)?;
//! let first = lm.train_step(4)?;
//! for _ in 0..20 {
//!     lm.train_step(4)?;
//! }
//! assert!(lm.train_step(4)? < first);
//! # Ok::<(), autobatch::Error>(())
//! ```

mod convnet;
mod mlp;
mod transformer;

use candle_core::{DType, Tensor};

use crate::Error;
pub use convnet::{ConvNet, ConvNetConfig};
pub use mlp::{Mlp, MlpConfig};
pub use transformer::{Transformer, TransformerConfig};

/// The layer with its weights detached: a forward pass that records no graph.
pub(crate) fn detach_linear(layer: &candle_nn::Linear) -> candle_nn::Linear {
    candle_nn::Linear::new(layer.weight().detach(), layer.bias().map(Tensor::detach))
}

/// Checks a model-size setting: at least `min`.
pub(crate) fn at_least(setting: crate::Setting, value: usize, min: usize) -> Result<(), Error> {
    if value < min {
        return Err(Error::invalid(setting, autobatch::Value::Count(value), format!("it must be at least {min}")));
    }
    Ok(())
}

/// Cross-entropy in f32, whatever the model's dtype.
pub(crate) fn cross_entropy(logits: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
    candle_nn::loss::cross_entropy(&logits.to_dtype(DType::F32)?, targets)
}
