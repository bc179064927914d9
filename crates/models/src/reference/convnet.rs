//! A small convolutional image classifier on a synthetic brightness task.

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Conv2d, Conv2dConfig, Linear};

use super::{at_least, cross_entropy, detach_linear};
use crate::Error;
use crate::params::Params;
use crate::splitmix::Rng;
use crate::trainer::footprint::{Sizes, adamw_state};
use crate::trainer::{Footprint, Model, Trainer, check_dtype};

/// Size of a [`ConvNet`]: two 3×3 convolutions (`channels`, then
/// `2 × channels`), each followed by ReLU and 2×2 max-pooling, then a linear
/// classifier.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvNetConfig {
    /// Image channels (3 for RGB).
    pub in_channels: usize,
    /// Channels of the first convolution.
    pub channels: usize,
    /// Image height and width; a multiple of 4. Memory per sample grows with its square.
    pub resolution: usize,
    /// Output classes; at most `in_channels` (the task: which channel is brightest).
    pub classes: usize,
    /// Dtype of weights, gradients and optimizer state: f32 or bf16.
    pub dtype: DType,
    /// Seed of the weights and the synthetic data.
    pub seed: u64,
}

impl Default for ConvNetConfig {
    /// RGB 32×32, 16 then 32 channels, 3 classes, f32.
    fn default() -> Self {
        ConvNetConfig { in_channels: 3, channels: 16, resolution: 32, classes: 3, dtype: DType::F32, seed: 0 }
    }
}

impl ConvNetConfig {
    /// Checks the sizes.
    pub fn check(&self) -> Result<(), Error> {
        at_least(crate::Setting::InChannels, self.in_channels, 2)?;
        at_least(crate::Setting::Channels, self.channels, 1)?;
        at_least(crate::Setting::Resolution, self.resolution, 4)?;
        if !self.resolution.is_multiple_of(4) {
            return Err(Error::invalid(
                crate::Setting::Resolution,
                autobatch::Value::Count(self.resolution),
                "it must be a multiple of 4 (two 2×2 poolings)",
            ));
        }
        if self.classes < 2 || self.classes > self.in_channels {
            return Err(Error::invalid(
                crate::Setting::Classes,
                autobatch::Value::Count(self.classes),
                format!("it must be between 2 and the input channels, {}", self.in_channels),
            ));
        }
        check_dtype(self.dtype)
    }

    /// The model's name and size, as its [`Model::describe`] says it.
    fn describe(&self) -> String {
        let c = self;
        format!(
            "convnet(in-channels {}, channels {}, resolution {}, classes {}, {})",
            c.in_channels,
            c.channels,
            c.resolution,
            c.classes,
            c.dtype.as_str()
        )
    }

    /// What the model needs before a step, from its sizes alone (checked:
    /// sizes too large for 64-bit byte counts are an error).
    pub fn footprint(&self) -> Result<Footprint, Error> {
        self.check()?;
        let n = Sizes { model: self.describe() };
        let [c_in, c, r, classes] = [self.in_channels, self.channels, self.resolution, self.classes].map(|x| x as u64);
        let dtype = self.dtype.size_in_bytes() as u64;
        let features = n.product(&[2, c, r / 4, r / 4])?;
        let parameters = n.sum(&[
            n.product(&[c_in, c, 9])?,
            c,
            n.product(&[c, 2, c, 9])?,
            n.product(&[2, c])?,
            n.product(&[classes, features])?,
            classes,
        ])?;
        let state = adamw_state(parameters, self.dtype)?;
        // the image in f32 and the first convolution's output
        let min_bytes_per_sample = n.sum(&[n.product(&[c_in, r, r, 4])?, n.product(&[c, r, r, dtype])?])?;
        n.footprint(state, 0, min_bytes_per_sample)
    }

    /// Builds the model and its AdamW optimizer on `device`.
    pub fn build(&self, device: &Device) -> Result<Trainer<ConvNet>, Error> {
        self.footprint()?;
        if device.is_cpu() && self.dtype == DType::BF16 {
            return Err(Error::invalid(
                crate::Setting::Dtype,
                autobatch::Value::Dtype(DType::BF16),
                "use f32 on the CPU (candle 0.11's CPU conv2d has no bf16 matmul); bf16 works on CUDA",
            ));
        }
        let mut params = Params::new(self.seed, device, self.dtype);
        let model = ConvNet::new(self, &mut params)?;
        Trainer::new(model, params, self.dtype, self.seed)
    }
}

/// The classifier. Built by [`ConvNetConfig::build`].
pub struct ConvNet {
    config: ConvNetConfig,
    conv1: Conv2d,
    conv2: Conv2d,
    head: Linear,
    device: Device,
    /// The image side steps run at: up to the configured resolution, which
    /// the head is sized for (a smaller image reads the head's first features).
    resolution: usize,
}

impl ConvNet {
    /// The image side steps run at.
    pub fn resolution(&self) -> usize {
        self.resolution
    }

    fn new(config: &ConvNetConfig, params: &mut Params) -> candle_core::Result<Self> {
        let same = Conv2dConfig { padding: 1, ..Default::default() };
        let mut conv = |name: &str, inputs: usize, outputs: usize| -> candle_core::Result<Conv2d> {
            let weight = params.weight(format!("{name}.weight"), (outputs, inputs, 3, 3), inputs * 9)?;
            let bias = params.constant(format!("{name}.bias"), outputs, 0.0)?;
            Ok(Conv2d::new(weight, Some(bias), same))
        };
        let conv1 = conv("conv1", config.in_channels, config.channels)?;
        let conv2 = conv("conv2", config.channels, 2 * config.channels)?;
        let features = 2 * config.channels * (config.resolution / 4).pow(2);
        let head = params.linear("head", features, config.classes)?;
        let device = head.weight().device().clone();
        Ok(ConvNet { config: config.clone(), conv1, conv2, head, device, resolution: config.resolution })
    }

    /// Images with one channel (the label) brighter on average.
    fn sample(&self, batch: usize, data_seed: u64) -> candle_core::Result<(Tensor, Tensor)> {
        let c = &self.config;
        let mut rng = Rng::new(data_seed);
        let side = self.resolution;
        let plane = side * side;
        let mut pixels = Vec::with_capacity(batch * c.in_channels * plane);
        let mut labels = Vec::with_capacity(batch);
        for _ in 0..batch {
            let label = rng.below(c.classes);
            labels.push(label as u32);
            for channel in 0..c.in_channels {
                let shift = if channel == label { 0.5 } else { 0.0 };
                pixels.extend((0..plane).map(|_| rng.normal() + shift));
            }
        }
        let images = Tensor::from_vec(pixels, (batch, c.in_channels, side, side), &self.device)?;
        Ok((images.to_dtype(c.dtype)?, Tensor::from_vec(labels, batch, &self.device)?))
    }
}

impl Model for ConvNet {
    fn detached(&self) -> Self {
        let conv = |c: &Conv2d| Conv2d::new(c.weight().detach(), c.bias().map(Tensor::detach), *c.config());
        ConvNet {
            config: self.config.clone(),
            conv1: conv(&self.conv1),
            conv2: conv(&self.conv2),
            head: detach_linear(&self.head),
            device: self.device.clone(),
            resolution: self.resolution,
        }
    }

    fn describe(&self) -> String {
        self.config.describe()
    }

    fn loss(&self, batch: usize, data_seed: u64) -> candle_core::Result<Tensor> {
        let (images, labels) = self.sample(batch, data_seed)?;
        let x = self.conv1.forward(&images)?.relu()?.max_pool2d(2)?;
        let x = self.conv2.forward(&x)?.relu()?.max_pool2d(2)?;
        let features = x.flatten_from(1)?;
        let logits = if self.resolution == self.config.resolution {
            self.head.forward(&features)?
        } else {
            // a smaller image has fewer features: the head's first ones
            let weight = self.head.weight().narrow(1, 0, features.dim(1)?)?;
            let logits = features.matmul(&weight.t()?)?;
            match self.head.bias() {
                Some(bias) => logits.broadcast_add(bias)?,
                None => logits,
            }
        };
        cross_entropy(&logits, &labels)
    }
}

/// Steps at any image side that is a multiple of 4 from 4 to the configured
/// `resolution` (the head, sized for the configured side, reads the features
/// a smaller image has).
impl autobatch::Resizable for Trainer<ConvNet> {
    fn resize(&mut self, size: usize) -> Result<(), autobatch::Error> {
        let largest = self.model().config.resolution;
        if size < 4 || size > largest || !size.is_multiple_of(4) {
            return Err(autobatch::Error::invalid(
                autobatch::Setting::Size,
                autobatch::Value::Count(size),
                format!("it must be a multiple of 4 from 4 to the model's resolution, {largest}"),
            ));
        }
        self.model_mut().resolution = size;
        Ok(())
    }

    fn size(&self) -> usize {
        self.model().resolution
    }
}
