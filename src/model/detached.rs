//! The same weights with no graph: for the evaluation step of your own model.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};

/// A `VarBuilder` over the variables of `varmap`, detached: a model built from
/// it shares every weight's storage (no copy) but records no graph, so its
/// forward pass frees each activation once the next layer has used it. candle
/// has no `no_grad`; this is its form. Build your model a second time from it
/// and probe the evaluation step with
/// [`Tuner::run_with_eval`](crate::Tuner::run_with_eval):
///
/// ```
/// use autobatch::model::detached;
/// use candle_core::{DType, Device, Module, Tensor};
/// use candle_nn::{linear, VarBuilder, VarMap};
///
/// let varmap = VarMap::new();
/// let train = linear(8, 2, VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
/// let eval = linear(8, 2, detached(&varmap))?;
/// let x = Tensor::ones((4, 8), DType::F32, &Device::Cpu)?;
/// assert_eq!(train.forward(&x)?.to_vec2::<f32>()?, eval.forward(&x)?.to_vec2::<f32>()?);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn detached(varmap: &VarMap) -> VarBuilder<'static> {
    let vars = super::named_vars(varmap);
    let (dtype, device) =
        vars.first().map_or((DType::F32, Device::Cpu), |(_, var)| (var.dtype(), var.device().clone()));
    let tensors: HashMap<String, Tensor> =
        vars.into_iter().map(|(name, var)| (name, var.as_tensor().detach())).collect();
    VarBuilder::from_tensors(tensors, dtype, &device)
}
