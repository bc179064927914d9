//! candle-nn's norm layers by candle-nn's names, differentiable: a model
//! file switches by its `use` line (candle's own `LayerNorm` and `RmsNorm`
//! run a fused kernel with no backward pass on contiguous input, and cut the
//! graph).
//!
//! ```
//! # #[global_allocator]
//! # static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
//! use autobatch_models::ops::nn::{layer_norm, LayerNorm}; // was: use candle_nn::{layer_norm, LayerNorm};
//! use candle_core::{DType, Device, Module, Tensor};
//! use candle_nn::{VarBuilder, VarMap};
//!
//! let varmap = VarMap::new();
//! let norm: LayerNorm = layer_norm(8, 1e-5, VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
//! let loss = norm.forward(&Tensor::ones((2, 8), DType::F32, &Device::Cpu)?)?.sum_all()?;
//! let grads = loss.backward()?;
//! assert!(varmap.all_vars().iter().all(|var| grads.get(var).is_some())); // candle_nn's would give none
//! # Ok::<(), candle_core::Error>(())
//! ```

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

/// `candle_nn::LayerNorm` (weight and bias, mean removed), differentiable.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f32,
}

impl LayerNorm {
    /// A layer norm of `weight` and `bias`.
    pub fn new(weight: Tensor, bias: Tensor, eps: f32) -> LayerNorm {
        LayerNorm { weight, bias, eps }
    }
}

impl Module for LayerNorm {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        crate::ops::layer_norm(xs, &self.weight, &self.bias, self.eps)
    }
}

/// `candle_nn::RmsNorm`, differentiable.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    /// An RMS norm of `weight`.
    pub fn new(weight: Tensor, eps: f32) -> RmsNorm {
        RmsNorm { weight, eps }
    }
}

impl Module for RmsNorm {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        crate::ops::rms_norm(xs, &self.weight, self.eps)
    }
}

/// [`LayerNorm`] of `size` features from `vb` (`weight` initialized to 1,
/// `bias` to 0), as `candle_nn::layer_norm` builds it: `config` an eps, or a
/// `candle_nn::LayerNormConfig` that removes the mean and has weight and bias.
pub fn layer_norm(size: usize, config: impl Into<candle_nn::LayerNormConfig>, vb: VarBuilder) -> Result<LayerNorm> {
    let config = config.into();
    if !config.remove_mean || !config.affine {
        candle_core::bail!(
            "layer_norm: a LayerNormConfig without the mean removed or without weight and bias; use rms_norm"
        )
    }
    let weight = vb.get_with_hints(size, "weight", candle_nn::Init::Const(1.))?;
    let bias = vb.get_with_hints(size, "bias", candle_nn::Init::Const(0.))?;
    Ok(LayerNorm::new(weight, bias, config.eps as f32))
}

/// [`RmsNorm`] of `size` features from `vb` (`weight` initialized to 1), as
/// `candle_nn::rms_norm(size, eps, vb)` builds it.
pub fn rms_norm(size: usize, eps: f64, vb: VarBuilder) -> Result<RmsNorm> {
    let weight = vb.get_with_hints(size, "weight", candle_nn::Init::Const(1.))?;
    Ok(RmsNorm::new(weight, eps as f32))
}
