//! Seeded parameters and synthetic data for the models the trainer runs.

use candle_core::{DType, Device, Result, Shape, Tensor, Var};
use candle_nn::Linear;

use crate::splitmix::Rng;

/// The data seed of training step `step`, and the one probing uses: a pure
/// function, so probing never moves the training data stream.
pub(crate) fn data_seed(model_seed: u64, step: Option<u64>) -> u64 {
    let salt = match step {
        Some(step) => step.wrapping_add(1),
        None => 0x0050_524F_4245, // "PROBE"
    };
    Rng::new(model_seed ^ salt.wrapping_mul(0x2545_F491_4F6C_DD1D)).next_u64()
}

/// Collects the named variables of a model as it is built.
pub(crate) struct Params {
    vars: Vec<(String, Var)>,
    rng: Rng,
    device: Device,
    dtype: DType,
}

impl Params {
    pub(crate) fn new(seed: u64, device: &Device, dtype: DType) -> Self {
        Params { vars: Vec::new(), rng: Rng::new(seed), device: device.clone(), dtype }
    }

    /// A variable drawn from N(0, std²).
    pub(crate) fn normal(&mut self, name: impl Into<String>, shape: impl Into<Shape>, std: f32) -> Result<Tensor> {
        let shape = shape.into();
        let values = self.rng.normals(shape.elem_count(), std);
        self.add(name.into(), Tensor::from_vec(values, shape, &self.device)?)
    }

    /// A variable filled with `value`.
    pub(crate) fn constant(&mut self, name: impl Into<String>, shape: impl Into<Shape>, value: f32) -> Result<Tensor> {
        let tensor = Tensor::full(value, shape, &self.device)?;
        self.add(name.into(), tensor)
    }

    /// Weights of a fan-in-scaled linear or convolution layer.
    pub(crate) fn weight(&mut self, name: impl Into<String>, shape: impl Into<Shape>, fan_in: usize) -> Result<Tensor> {
        self.normal(name, shape, (1.0 / fan_in as f32).sqrt())
    }

    /// A linear layer `name.weight` (fan-in-scaled) with a zero `name.bias`.
    pub(crate) fn linear(&mut self, name: &str, inputs: usize, outputs: usize) -> Result<Linear> {
        let weight = self.weight(format!("{name}.weight"), (outputs, inputs), inputs)?;
        let bias = self.constant(format!("{name}.bias"), outputs, 0.0)?;
        Ok(Linear::new(weight, Some(bias)))
    }

    fn add(&mut self, name: String, values: Tensor) -> Result<Tensor> {
        let var = Var::from_tensor(&values.to_dtype(self.dtype)?)?;
        let tensor = var.as_tensor().clone();
        self.vars.push((name, var));
        Ok(tensor)
    }

    /// The variables in a `VarMap`, as a model built with candle-nn keeps them.
    pub(crate) fn into_varmap(self) -> candle_nn::VarMap {
        let varmap = candle_nn::VarMap::new();
        {
            let mut data = varmap.data().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            data.extend(self.vars);
        }
        varmap
    }
}
