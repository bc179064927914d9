//! The same weights with no graph: for the evaluation step of your own model.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};

/// A `VarBuilder` over the variables of `varmap` for a model that records no
/// graph: built from it, your model shares the storage of every variable of
/// `varmap` (no copy), so it sees training's weights and statistics as they
/// change, and its forward pass frees each activation once the next layer has
/// used it. candle has no `no_grad`; this is its form. Build your model a
/// second time from it and probe the evaluation step with
/// [`Search::evaluating`](crate::Search::evaluating), or evaluate with it
/// while training.
///
/// What is shared, exactly:
/// - every variable is handed out detached (same storage, no graph), except
/// - candle-nn's BatchNorm running statistics (variables whose name ends in
///   `running_mean` or `running_var`), handed out as the variables themselves:
///   `BatchNorm` keeps them as `Var`s, and `Var::from_tensor` copies a tensor
///   that is not a variable, which would freeze the statistics at their value
///   when the model was built. Evaluation mode reads them detached, so no
///   graph is recorded either way.
///
/// For buffers of your own that a layer keeps as a `Var`, use
/// [`detached_sharing`] (a probe's [`buffers`](crate::ModelProbe::buffers)
/// names the variables its forward pass writes).
///
/// ```
/// use autobatch::model::detached;
/// use candle_core::{DType, Device, Module, ModuleT, Tensor};
/// use candle_nn::{batch_norm, linear, BatchNormConfig, VarBuilder, VarMap};
///
/// let varmap = VarMap::new();
/// let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
/// let (train, train_norm) = (linear(8, 2, vb.pp("fc"))?, batch_norm(2, BatchNormConfig::default(), vb.pp("bn"))?);
/// let eval_vb = detached(&varmap);
/// let (eval, eval_norm) = (linear(8, 2, eval_vb.pp("fc"))?, batch_norm(2, BatchNormConfig::default(), eval_vb.pp("bn"))?);
/// let x = Tensor::arange(0f32, 32., &Device::Cpu)?.reshape((4, 8))?;
/// // training mode moves the running statistics; the evaluation model sees them
/// train_norm.forward_t(&train.forward(&x)?, true)?;
/// let trained = train_norm.forward_t(&train.forward(&x)?, false)?;
/// let evaluated = eval_norm.forward_t(&eval.forward(&x)?, false)?;
/// assert_eq!(trained.to_vec2::<f32>()?, evaluated.to_vec2::<f32>()?);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn detached(varmap: &VarMap) -> VarBuilder<'static> {
    detached_sharing(varmap, is_batch_norm_statistic)
}

/// [`detached`], with the variables for which `shared_as_variable(name)`
/// holds handed out as the variables themselves (for a layer that keeps them
/// as `Var`s and writes them, like BatchNorm's running statistics, which are
/// not shared unless `shared_as_variable` says so). A model built from it
/// records a graph through those variables only.
///
/// ```
/// use autobatch::model::detached_sharing;
/// use candle_core::{DType, Device, Var};
/// use candle_nn::{Init, VarMap};
///
/// let varmap = VarMap::new();
/// let counter = varmap.get(2, "seen", Init::Const(0.), DType::F32, &Device::Cpu)?;
/// let vb = detached_sharing(&varmap, |name| name == "seen");
/// let shared = Var::from_tensor(&vb.get(2, "seen")?)?; // no copy: the same variable
/// shared.set(&candle_core::Tensor::new(&[1f32, 2.], &Device::Cpu)?)?;
/// assert_eq!(counter.to_vec1::<f32>()?, [1., 2.]);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn detached_sharing(varmap: &VarMap, shared_as_variable: impl Fn(&str) -> bool) -> VarBuilder<'static> {
    let vars = super::named_vars(varmap);
    let (dtype, device) =
        vars.first().map_or((DType::F32, Device::Cpu), |(_, var)| (var.dtype(), var.device().clone()));
    let tensors: HashMap<String, Tensor> = vars
        .into_iter()
        .map(|(name, var)| {
            let tensor = if shared_as_variable(&name) { var.as_tensor().clone() } else { var.as_tensor().detach() };
            (name, tensor)
        })
        .collect();
    VarBuilder::from_tensors(tensors, dtype, &device)
}

/// Whether `name` is one of candle-nn's BatchNorm running statistics.
fn is_batch_norm_statistic(name: &str) -> bool {
    name.ends_with("running_mean") || name.ends_with("running_var")
}
