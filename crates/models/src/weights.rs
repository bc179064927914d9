//! A model's tensors by their checkpoint names: listed once per family (the
//! parameter count and the build read the same list), filled with
//! deterministic values, and split into the variables that train and the
//! frozen tensors that do not.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;

use crate::splitmix::Rng;

/// How a tensor starts (memory does not depend on the values; training
/// from them should still work).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Init {
    /// N(0, std²).
    Normal(f32),
    /// All ones (norm weights).
    Ones,
    /// All zeros (biases, LoRA's B).
    Zeros,
}

/// One tensor of a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TensorSpec {
    pub(crate) name: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) init: Init,
}

impl TensorSpec {
    pub(crate) fn new(name: impl Into<String>, shape: &[usize], init: Init) -> TensorSpec {
        TensorSpec { name: name.into(), shape: shape.to_vec(), init }
    }

    /// Its elements; `None` past 64 bits.
    pub(crate) fn elements(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |product, &d| product.checked_mul(d as u64))
    }
}

/// The tensors of a built model by name: trained ones are variables (in the
/// `VarMap` the probe and training see), frozen ones plain tensors or
/// quantized.
pub(crate) struct Weights {
    tensors: HashMap<String, Tensor>,
    quantized: HashMap<String, Arc<QTensor>>,
    pub(crate) varmap: VarMap,
}

impl Weights {
    /// Fills `specs` from `seed`, each in the dtype `dtype` gives it, on
    /// `device`; those `trained` says become variables of the `VarMap`.
    pub(crate) fn build(
        specs: &[TensorSpec],
        seed: u64,
        dtype: impl Fn(&str) -> DType,
        device: &Device,
        trained: impl Fn(&str) -> bool,
    ) -> candle_core::Result<Weights> {
        let mut rng = Rng::new(seed);
        let generated = |spec: &TensorSpec| -> candle_core::Result<Tensor> {
            let count = spec.shape.iter().product::<usize>();
            match spec.init {
                Init::Normal(std) => Tensor::from_vec(rng.normals(count, std), spec.shape.as_slice(), device),
                Init::Ones => Tensor::ones(spec.shape.as_slice(), DType::F32, device),
                Init::Zeros => Tensor::zeros(spec.shape.as_slice(), DType::F32, device),
            }
        };
        Weights::from_source(specs, dtype, generated, trained)
    }

    /// The tensors `source` gives for `specs` (checked against their shapes),
    /// each in the dtype `dtype` gives it; those `trained` says become variables.
    pub(crate) fn from_source(
        specs: &[TensorSpec],
        dtype: impl Fn(&str) -> DType,
        mut source: impl FnMut(&TensorSpec) -> candle_core::Result<Tensor>,
        trained: impl Fn(&str) -> bool,
    ) -> candle_core::Result<Weights> {
        let varmap = VarMap::new();
        let mut tensors = HashMap::with_capacity(specs.len());
        for spec in specs {
            let values = source(spec)?;
            if values.dims() != spec.shape.as_slice() {
                candle_core::bail!(
                    "tensor {} has shape {:?}; the config says {:?}",
                    spec.name,
                    values.dims(),
                    spec.shape
                )
            }
            let values = values.to_dtype(dtype(&spec.name))?;
            let tensor = if trained(&spec.name) {
                let var = Var::from_tensor(&values)?;
                let tensor = var.as_tensor().clone();
                varmap.data().lock().expect("a new VarMap is not poisoned").insert(spec.name.clone(), var);
                tensor
            } else {
                values.detach()
            };
            tensors.insert(spec.name.clone(), tensor);
        }
        Ok(Weights { tensors, quantized: HashMap::new(), varmap })
    }

    /// Replaces the frozen weight `name` by its quantization to `dtype`, as
    /// `(out, in)` (`transposed`: stored `(in, out)`, GPT-2's `Conv1D`).
    pub(crate) fn quantize(&mut self, name: &str, transposed: bool, dtype: GgmlDType) -> candle_core::Result<()> {
        let stored = self.get(name)?;
        let weight = if transposed { stored.t()?.contiguous()? } else { stored };
        let quantized = Arc::new(QTensor::quantize(&weight, dtype)?);
        self.tensors.remove(name);
        self.quantized.insert(name.to_owned(), quantized);
        Ok(())
    }

    /// The bytes every tensor takes, quantized ones as stored.
    pub(crate) fn bytes(&self) -> u64 {
        let dense: u64 = self.tensors.values().map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64).sum();
        let quantized: u64 = self.quantized.values().map(|q| q.storage_size_in_bytes() as u64).sum();
        dense + quantized
    }

    /// The quantized weight `name`, if it is one.
    pub(crate) fn quantized(&self, name: &str) -> Option<Arc<QTensor>> {
        self.quantized.get(name).cloned()
    }

    /// The tensor `name`.
    pub(crate) fn get(&self, name: &str) -> candle_core::Result<Tensor> {
        self.tensors.get(name).cloned().ok_or_else(|| candle_core::Error::Msg(format!("no tensor {name}")))
    }

    /// The tensor `name`, if the model has one.
    pub(crate) fn maybe(&self, name: &str) -> Option<Tensor> {
        self.tensors.get(name).cloned()
    }

    /// Whether `name` trains (is a variable).
    pub(crate) fn is_trained(&self, name: &str) -> bool {
        self.varmap.data().lock().expect("the VarMap is not poisoned").contains_key(name)
    }

    /// The same weights detached from the variables (an evaluation copy).
    pub(crate) fn detached(&self) -> Weights {
        let tensors = self.tensors.iter().map(|(name, tensor)| (name.clone(), tensor.detach())).collect();
        Weights { tensors, quantized: self.quantized.clone(), varmap: self.varmap.clone() }
    }
}
