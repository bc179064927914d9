//! A multi-layer perceptron classifier on a synthetic teacher task.

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::Linear;

use super::{at_least, cross_entropy, detach_linear};
use crate::Error;
use crate::params::Params;
use crate::splitmix::Rng;
use crate::trainer::footprint::{Sizes, adamw_state};
use crate::trainer::{Footprint, Model, Trainer, check_dtype};

/// Size of an [`Mlp`]: `depth` hidden layers of `width` with GELU.
#[derive(Clone, Debug, PartialEq)]
pub struct MlpConfig {
    /// Input features.
    pub inputs: usize,
    /// Hidden width.
    pub width: usize,
    /// Hidden layers.
    pub depth: usize,
    /// Output classes.
    pub classes: usize,
    /// Dtype of weights, gradients and optimizer state: f32 or bf16.
    pub dtype: DType,
    /// Seed of the weights and the synthetic data.
    pub seed: u64,
}

impl Default for MlpConfig {
    /// 64 inputs, 3 hidden layers of 256, 10 classes, f32.
    fn default() -> Self {
        MlpConfig { inputs: 64, width: 256, depth: 3, classes: 10, dtype: DType::F32, seed: 0 }
    }
}

impl MlpConfig {
    /// Checks the sizes.
    pub fn check(&self) -> Result<(), Error> {
        at_least(crate::Setting::Inputs, self.inputs, 1)?;
        at_least(crate::Setting::Width, self.width, 1)?;
        at_least(crate::Setting::Depth, self.depth, 1)?;
        at_least(crate::Setting::Classes, self.classes, 2)?;
        check_dtype(self.dtype)
    }

    /// The model's name and size, as its [`Model::describe`] says it.
    fn describe(&self) -> String {
        let c = self;
        format!(
            "mlp(inputs {}, width {}, depth {}, classes {}, {})",
            c.inputs,
            c.width,
            c.depth,
            c.classes,
            c.dtype.as_str()
        )
    }

    /// What the model needs before a step, from its sizes alone (checked:
    /// sizes too large for 64-bit byte counts are an error).
    pub fn footprint(&self) -> Result<Footprint, Error> {
        self.check()?;
        let n = Sizes { model: self.describe() };
        let [inputs, w, depth, classes] = [self.inputs, self.width, self.depth, self.classes].map(|x| x as u64);
        let dtype = self.dtype.size_in_bytes() as u64;
        let hidden = n.sum(&[n.product(&[w, w])?, w])?;
        let parameters = n.sum(&[
            n.product(&[inputs, w])?,
            w,
            n.product(&[depth - 1, hidden])?,
            n.product(&[w, classes])?,
            classes,
        ])?;
        let state = adamw_state(parameters, self.dtype)?;
        let teacher = n.product(&[inputs, classes, 4])?;
        let min_bytes_per_sample = n.sum(&[n.product(&[inputs, 4])?, n.product(&[depth, w, dtype])?])?;
        n.footprint(state, teacher, min_bytes_per_sample)
    }

    /// Builds the model and its AdamW optimizer on `device`.
    pub fn build(&self, device: &Device) -> Result<Trainer<Mlp>, Error> {
        self.footprint()?;
        let mut params = Params::new(self.seed, device, self.dtype);
        let mut layers = Vec::with_capacity(self.depth + 1);
        let mut fan_in = self.inputs;
        for (index, outputs) in std::iter::repeat_n(self.width, self.depth).chain([self.classes]).enumerate() {
            layers.push(params.linear(&format!("layers.{index}"), fan_in, outputs)?);
            fan_in = outputs;
        }
        let mut rng = Rng::new(self.seed ^ 0x7EAC);
        let teacher =
            Tensor::from_vec(rng.normals(self.inputs * self.classes, 1.0), (self.inputs, self.classes), device)?;
        let model = Mlp { config: self.clone(), layers, teacher };
        Trainer::new(model, params, self.dtype, self.seed)
    }
}

/// The classifier. Built by [`MlpConfig::build`]. Labels come from a fixed
/// random linear teacher: `argmax(x · W)`.
pub struct Mlp {
    config: MlpConfig,
    layers: Vec<Linear>,
    teacher: Tensor,
}

impl Model for Mlp {
    fn detached(&self) -> Self {
        Mlp {
            config: self.config.clone(),
            layers: self.layers.iter().map(detach_linear).collect(),
            teacher: self.teacher.clone(),
        }
    }

    fn describe(&self) -> String {
        self.config.describe()
    }

    fn loss(&self, batch: usize, data_seed: u64) -> candle_core::Result<Tensor> {
        let device = self.teacher.device();
        let x = Tensor::from_vec(
            Rng::new(data_seed).normals(batch * self.config.inputs, 1.0),
            (batch, self.config.inputs),
            device,
        )?;
        let labels = x.matmul(&self.teacher)?.argmax(1)?;
        let mut h = x.to_dtype(self.config.dtype)?;
        for (index, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h)?;
            if index + 1 < self.layers.len() {
                h = h.gelu()?;
            }
        }
        cross_entropy(&h, &labels)
    }
}
