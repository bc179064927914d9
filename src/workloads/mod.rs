//! Reference candle models for the binary, tests, benchmarks and examples:
//! a decoder-only [`transformer`] language model, an [`mlp`] classifier and a
//! small [`convnet`] for images, each trained with AdamW on synthetic data (no
//! downloads).
//!
//! A [`Trainer`] holds a model, its variables and its optimizer. As a
//! [`Workload`] its step is a *probe* step: forward, loss, backward and the
//! AdamW update computed in full ([`AdamW::dry_step`](crate::optim::AdamW::dry_step)) but never written, so
//! tuning changes no weight, no moment and not the step count, at no extra
//! memory. [`Trainer::train_step`] is the real thing.
//!
//! Tune at the longest sequence (largest image) training will see: activation
//! memory per sample grows with sequence length, quadratically in attention.
//!
//! ```
//! use autobatch::workloads::TransformerConfig;
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

pub mod convnet;
mod footprint;
pub mod mlp;
mod params;
pub mod transformer;

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};
use candle_nn::{Optimizer, ParamsAdamW};

use crate::optim::AdamW;
pub use convnet::ConvNetConfig;
pub use footprint::Footprint;
pub use mlp::MlpConfig;
pub use transformer::TransformerConfig;

use crate::model::grads::Accumulator;
use crate::{Error, Workload};
use params::{data_seed, Params};

/// A model that can compute its loss on a synthetic batch.
pub trait Model {
    /// A short name with the size, e.g. `transformer(vocab 256, d-model 64, heads 4, layers 2, seq-len 64, f32)`.
    fn describe(&self) -> String;

    /// The scalar f32 loss of `batch` synthetic samples drawn from `data_seed`;
    /// the same seed and batch give the same samples.
    fn loss(&self, batch: usize, data_seed: u64) -> candle_core::Result<Tensor>;

    /// The loss of `batch` samples, times `scale`, and the gradients of that
    /// scaled loss: `loss.backward()` unless the model does its own backward
    /// pass (the transformer with gradient checkpointing). The loss returned is
    /// unscaled.
    fn loss_and_gradients(
        &self,
        batch: usize,
        data_seed: u64,
        scale: f64,
        vars: &[Var],
    ) -> candle_core::Result<(Tensor, GradStore)> {
        let _ = vars;
        backward(self.loss(batch, data_seed)?, scale)
    }

    /// The transformer this model is, when it is one: what the advice weighs
    /// checkpointing and shorter sequences by. `None` by default.
    fn transformer(&self) -> Option<crate::estimate::TransformerActivations> {
        None
    }

    /// The same model over the same weights, detached from the variables: its
    /// forward pass records no graph, so each activation is freed as soon as
    /// the next layer has used it (candle has no `no_grad`; this is its form).
    fn detached(&self) -> Self
    where
        Self: Sized;
}

pub(crate) fn detach_linear(layer: &candle_nn::Linear) -> candle_nn::Linear {
    candle_nn::Linear::new(layer.weight().detach(), layer.bias().map(Tensor::detach))
}

/// A model with its variables and AdamW optimizer: a probe [`Workload`] and a
/// real training loop in one.
pub struct Trainer<M> {
    model: M,
    vars: Vec<(String, Var)>,
    optimizer: TrainerOptimizer,
    dtype: DType,
    seed: u64,
    steps: u64,
}

/// The default AdamW hyper-parameters of the reference workloads.
pub(crate) fn default_adamw() -> ParamsAdamW {
    ParamsAdamW { lr: 3e-3, weight_decay: 0.01, ..ParamsAdamW::default() }
}

impl<M: Model> Trainer<M> {
    fn new(model: M, params: Params, dtype: DType, seed: u64) -> Result<Self, Error> {
        let vars = params.into_vars();
        let optimizer = AdamW::new(vars.iter().map(|(_, var)| var.clone()).collect(), default_adamw())?;
        Ok(Trainer { model, vars, optimizer: TrainerOptimizer::AdamW(optimizer), dtype, seed, steps: 0 })
    }

    /// The same model trained in mixed precision: the bf16 variables stay the
    /// model's, and AdamW runs on f32 master copies with f32 moments
    /// ([`MixedPrecision`](crate::optim::MixedPrecision): 2 + 2 + 12 bytes per
    /// parameter). Fails unless the model was built in bf16 and has not trained yet.
    pub fn into_mixed_precision(mut self) -> Result<Self, Error> {
        if self.dtype != DType::BF16 {
            return Err(Error::UnsupportedDtype {
                dtype: format!("dtype {}", self.dtype.as_str()),
                valid: "bf16 variables for mixed precision (f32 masters are added)",
            });
        }
        if self.steps > 0 {
            return Err(Error::AlreadyTrained { steps: self.steps, change: "switch to mixed precision" });
        }
        self.optimizer = TrainerOptimizer::build(crate::vocabulary::OptimizerKind::AdamW, true, self.plain_vars())?;
        Ok(self)
    }

    /// The same model trained with another optimizer of this crate (its
    /// hyper-parameters at their defaults, the learning rate the reference
    /// AdamW's scaled as each paper advises): `Lion` (lr / 3), `Adafactor`
    /// (relative step) or `AdamW8bit`, or `AdamW` again. Before training only.
    pub fn with_optimizer(mut self, kind: crate::vocabulary::OptimizerKind) -> Result<Self, Error> {
        if self.steps > 0 {
            return Err(Error::AlreadyTrained { steps: self.steps, change: "choose the optimizer" });
        }
        self.optimizer = TrainerOptimizer::build(kind, false, self.plain_vars())?;
        Ok(self)
    }

    /// Whether AdamW runs on f32 master copies ([`into_mixed_precision`](Self::into_mixed_precision)).
    pub fn is_mixed_precision(&self) -> bool {
        matches!(self.optimizer, TrainerOptimizer::Mixed(_))
    }

    /// One real training step on `batch` fresh synthetic samples: forward,
    /// loss, backward, AdamW update. Returns the loss before the update.
    pub fn train_step(&mut self, batch: usize) -> Result<f32, Error> {
        self.train_step_accumulated(batch, 1)
    }

    /// One optimizer step over `accumulation_steps` micro-batches of
    /// `micro_batch` samples each: gradients of the mean loss are summed
    /// before the update, as for one batch of `micro_batch × accumulation_steps`.
    /// Returns the mean loss. Only the variables' gradients are accumulated (one
    /// more copy of the parameters than a single step holds), as
    /// [`TrainLoop`](crate::TrainLoop) does and as the tuner verifies plans.
    pub fn train_step_accumulated(&mut self, micro_batch: usize, accumulation_steps: usize) -> Result<f32, Error> {
        if micro_batch == 0 {
            return Err(Error::Zero { setting: "micro_batch" });
        }
        if accumulation_steps == 0 {
            return Err(Error::Zero { setting: "accumulation_steps" });
        }
        let vars = self.plain_vars();
        let mut accumulated = Accumulator::default();
        let mut total_loss = 0f32;
        for micro_step in 0..accumulation_steps {
            let seed = data_seed(self.seed, Some(self.steps * accumulation_steps as u64 + micro_step as u64));
            let (loss, grads) =
                self.model.loss_and_gradients(micro_batch, seed, 1.0 / accumulation_steps as f64, &vars)?;
            total_loss += loss.to_scalar::<f32>()?;
            drop(loss);
            accumulated.add(grads, &vars)?;
        }
        self.optimizer.built(vars)?.step(&accumulated.take()?)?;
        self.steps += 1;
        Ok(total_loss / accumulation_steps as f32)
    }

    fn plain_vars(&self) -> Vec<Var> {
        self.vars.iter().map(|(_, var)| var.clone()).collect()
    }

    /// The evaluation step as a [`Workload`]: forward and loss over
    /// detached weights, no backward, no optimizer: what
    /// [`Tuner::run_with_eval`](crate::Tuner::run_with_eval) probes for the
    /// evaluation batch.
    pub fn evaluation(&self) -> Evaluation<M> {
        Evaluation { model: self.model.detached(), seed: self.seed }
    }

    /// Optimizer steps taken by training (probing takes none).
    pub fn steps_done(&self) -> u64 {
        self.steps
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    pub(crate) fn model_mut(&mut self) -> &mut M {
        &mut self.model
    }

    /// Named trainable variables, in creation order.
    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// The AdamW optimizer, with its moments (over the f32 master copies in
    /// mixed precision); `None` after [`with_optimizer`](Self::with_optimizer)
    /// chose another.
    pub fn optimizer(&self) -> Option<&AdamW> {
        self.optimizer.adamw()
    }

    /// Bytes of optimizer state (and master copies, in mixed precision).
    pub fn optimizer_state_bytes(&self) -> u64 {
        self.optimizer.as_dry().map_or(0, |optimizer| optimizer.state_bytes())
    }

    /// Number of trainable parameters.
    pub fn parameter_count(&self) -> usize {
        self.vars.iter().map(|(_, var)| var.elem_count()).sum()
    }

    /// Data type of the weights, gradients and optimizer moments.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Bytes of weights, gradients and both AdamW moments: what the model's
    /// state costs before any activation (4 copies of the parameters in candle).
    pub fn state_bytes(&self) -> u64 {
        4 * (self.parameter_count() * self.dtype.size_in_bytes()) as u64
    }

    /// Every weight and both moments of every weight (and, in mixed precision,
    /// the master copies), as raw bit patterns: two trainers are in the same
    /// state exactly when these are equal. With an optimizer other than AdamW
    /// ([`with_optimizer`](Self::with_optimizer)), the weights only.
    pub fn state_bits(&self) -> Result<Vec<Vec<u32>>, Error> {
        let bits = |var: &Var| -> candle_core::Result<Vec<u32>> {
            // bf16 → f32 is exact, so comparing f32 bits compares the original bits
            let values = var.as_tensor().flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
            Ok(values.into_iter().map(f32::to_bits).collect())
        };
        // a freed optimizer as its next step builds it again
        let rebuilt;
        let optimizer = match &self.optimizer {
            TrainerOptimizer::Freed { kind, mixed } => {
                rebuilt = TrainerOptimizer::build(*kind, *mixed, self.plain_vars())?;
                &rebuilt
            }
            built => built,
        };
        let mut state = Vec::new();
        if matches!(optimizer, TrainerOptimizer::Mixed(_)) || optimizer.adamw().is_none() {
            for (_, var) in &self.vars {
                state.push(bits(var)?);
            }
        }
        for s in optimizer.adamw().map_or(&[][..], |adamw| adamw.states()) {
            for var in [&s.var, &s.first_moment, &s.second_moment] {
                state.push(bits(var)?);
            }
        }
        Ok(state)
    }
}

impl<M: Model> Workload for Trainer<M> {
    fn cache_key(&self) -> Option<crate::CacheKey> {
        let vars = self.vars.iter().map(|(name, var)| (name.as_str(), var));
        let key = crate::CacheKey::new().variables(vars).param("model", self.model.describe());
        let optimizer = self.optimizer.kind().map_or("other", |kind| kind.name());
        Some(key.param("mixed_precision", self.is_mixed_precision()).param("optimizer", optimizer))
    }

    fn profile(&self) -> Option<crate::Profile> {
        let precision = match self.dtype {
            DType::BF16 if self.is_mixed_precision() => crate::vocabulary::Precision::Mixed,
            DType::BF16 => crate::vocabulary::Precision::Bf16,
            _ => crate::vocabulary::Precision::Fp32,
        };
        let optimizer = self.optimizer.kind()?;
        let largest = self.vars.iter().map(|(_, var)| var.elem_count() as u64).max().unwrap_or(0);
        let profile =
            crate::Profile::new(self.parameter_count() as u64, precision, optimizer).largest_variable(largest);
        Some(match self.model.transformer() {
            Some(transformer) => profile.transformer(transformer.shape, transformer.recompute),
            None => profile,
        })
    }

    /// A probe step: forward, loss, backward and the full AdamW update
    /// computed but not applied. Changes nothing; uses the memory of a real step.
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        let vars = self.plain_vars();
        let (loss, grads) = self.model.loss_and_gradients(batch, data_seed(self.seed, None), 1.0, &vars)?;
        // the forward graph and the gradients of anything but the variables
        // are freed before the update, as `train_step` does
        drop(loss);
        let grads = crate::model::grads::keep_variables(grads, &vars);
        self.optimizer.built(vars)?.dry_step(&grads)?;
        drop(grads);
        Ok(())
    }

    /// A micro-step after the first of [`train_step_accumulated`](Trainer::train_step_accumulated):
    /// the accumulator held, this micro-step's gradients added, the update
    /// computed dry from the sum.
    fn accumulating_step(&mut self, batch: usize) -> candle_core::Result<()> {
        let vars = self.plain_vars();
        let mut accumulated = Accumulator::holding_zeros(&vars)?;
        let (loss, grads) = self.model.loss_and_gradients(batch, data_seed(self.seed, None), 1.0, &vars)?;
        drop(loss);
        accumulated.add(grads, &vars)?;
        self.optimizer.built(vars)?.dry_step(&accumulated.take()?)?;
        Ok(())
    }

    fn can_accumulate(&self) -> bool {
        true
    }

    /// Frees the optimizer's state (and master copies, in mixed precision)
    /// before the trainer has trained; the next step builds it again, with
    /// zero moments as before. A trainer that has trained keeps its state.
    fn free_training_state(&mut self) -> u64 {
        let Some(kind) = self.optimizer.kind().filter(|_| self.steps == 0) else { return 0 };
        let freed = self.optimizer_state_bytes();
        self.optimizer = TrainerOptimizer::Freed { kind, mixed: self.is_mixed_precision() };
        freed
    }
}

impl<M: Model> std::fmt::Debug for Trainer<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("model", &self.model.describe())
            .field("parameters", &self.parameter_count())
            .field("dtype", &self.dtype)
            .field("steps", &self.steps)
            .finish()
    }
}

/// The reference workloads' optimizer: AdamW in the variables' dtype, or
/// AdamW on f32 master copies of bf16 variables.
enum TrainerOptimizer {
    AdamW(AdamW),
    Mixed(crate::optim::MixedPrecision<AdamW>),
    Lion(crate::optim::Lion),
    Adafactor(crate::optim::Adafactor),
    AdamW8bit(crate::optim::AdamW8bit),
    /// Freed after tuning ([`Workload::free_training_state`]): built again,
    /// as it was before training, at the next step.
    Freed {
        kind: crate::vocabulary::OptimizerKind,
        mixed: bool,
    },
}

impl TrainerOptimizer {
    /// The optimizer of `kind` over `vars` (on f32 master copies when
    /// `mixed`), at the reference hyper-parameters: the learning rate the
    /// reference AdamW's, scaled as each paper advises.
    fn build(kind: crate::vocabulary::OptimizerKind, mixed: bool, vars: Vec<Var>) -> Result<Self, Error> {
        use crate::optim::{Adafactor, AdamW8bit, Lion, ParamsAdafactor, ParamsAdamW8bit, ParamsLion};
        use crate::vocabulary::OptimizerKind;
        let lr = default_adamw().lr;
        Ok(match kind {
            OptimizerKind::AdamW if mixed => {
                TrainerOptimizer::Mixed(crate::optim::MixedPrecision::new(vars, default_adamw())?)
            }
            OptimizerKind::AdamW => TrainerOptimizer::AdamW(AdamW::new(vars, default_adamw())?),
            OptimizerKind::Lion => {
                TrainerOptimizer::Lion(Lion::new(vars, ParamsLion { lr: lr / 3.0, ..ParamsLion::default() })?)
            }
            OptimizerKind::Adafactor => TrainerOptimizer::Adafactor(Adafactor::new(vars, ParamsAdafactor::default())?),
            OptimizerKind::Adam8bit => {
                TrainerOptimizer::AdamW8bit(AdamW8bit::new(vars, ParamsAdamW8bit { lr, ..ParamsAdamW8bit::default() })?)
            }
            other => {
                return Err(Error::UnsupportedOptimizer {
                    optimizer: other.name().to_owned(),
                    valid: "adamw, lion, adafactor or adam8bit (the optimizers with a dry step)",
                })
            }
        })
    }

    /// The AdamW inside, if it is one (over master copies in mixed precision).
    fn adamw(&self) -> Option<&AdamW> {
        match self {
            TrainerOptimizer::AdamW(adamw) => Some(adamw),
            TrainerOptimizer::Mixed(mixed) => Some(mixed.inner()),
            _ => None,
        }
    }

    /// Itself, built again first if it was freed.
    fn built(&mut self, vars: Vec<Var>) -> candle_core::Result<&mut Self> {
        if let TrainerOptimizer::Freed { kind, mixed } = *self {
            *self = Self::build(kind, mixed, vars).map_err(|err| candle_core::Error::Msg(err.to_string()))?;
        }
        Ok(self)
    }

    fn as_dry(&self) -> Option<&dyn crate::optim::DryStep> {
        Some(match self {
            TrainerOptimizer::AdamW(o) => o,
            TrainerOptimizer::Mixed(o) => o,
            TrainerOptimizer::Lion(o) => o,
            TrainerOptimizer::Adafactor(o) => o,
            TrainerOptimizer::AdamW8bit(o) => o,
            TrainerOptimizer::Freed { .. } => return None,
        })
    }

    fn kind(&self) -> Option<crate::vocabulary::OptimizerKind> {
        match self {
            TrainerOptimizer::Freed { kind, .. } => Some(*kind),
            other => other.as_dry()?.kind(),
        }
    }

    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        match self {
            TrainerOptimizer::AdamW(o) => o.step(grads),
            TrainerOptimizer::Mixed(o) => o.step(grads),
            TrainerOptimizer::Lion(o) => o.step(grads),
            TrainerOptimizer::Adafactor(o) => o.step(grads),
            TrainerOptimizer::AdamW8bit(o) => o.step(grads),
            TrainerOptimizer::Freed { .. } => Err(candle_core::Error::Msg("the optimizer was freed".to_owned())),
        }
    }

    fn dry_step(&self, grads: &GradStore) -> candle_core::Result<()> {
        self.as_dry().map_or(Ok(()), |optimizer| optimizer.dry_step(grads))
    }
}

/// Checks a model-size setting: at least `min`.
pub(crate) fn at_least(setting: &'static str, value: usize, min: usize) -> Result<(), Error> {
    if value < min {
        return Err(Error::InvalidModel { setting, value, valid: format!("at least {min}") });
    }
    Ok(())
}

pub(crate) fn check_dtype(dtype: DType) -> Result<(), Error> {
    match dtype {
        DType::F32 | DType::BF16 => Ok(()),
        other => Err(Error::UnsupportedDtype { dtype: format!("dtype {}", other.as_str()), valid: "f32 or bf16" }),
    }
}

/// The loss and the gradients of `loss × scale`: a plain backward pass.
pub(crate) fn backward(loss: Tensor, scale: f64) -> candle_core::Result<(Tensor, GradStore)> {
    let grads = if scale == 1.0 { loss.backward()? } else { (&loss * scale)?.backward()? };
    Ok((loss, grads))
}

/// Cross-entropy in f32, whatever the model's dtype.
pub(crate) fn cross_entropy(logits: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
    candle_nn::loss::cross_entropy(&logits.to_dtype(DType::F32)?, targets)
}

/// The evaluation step of a [`Trainer`]: see [`Trainer::evaluation`].
pub struct Evaluation<M> {
    model: M,
    seed: u64,
}

impl<M: Model> Workload for Evaluation<M> {
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        let loss = self.model.loss(batch, data_seed(self.seed, None))?;
        // read the value back, as an evaluation loop would
        loss.to_scalar::<f32>().map(|_| ())
    }
}

/// A reference workload whose model is chosen at run time (as the probe binary
/// does): a probe [`Workload`] that can describe itself. For the binary and
/// the benchmarks; hidden from the docs.
#[doc(hidden)]
pub trait ReferenceWorkload: Workload {
    /// The model and its size, e.g. `transformer(vocab 256, d-model 64, …)`.
    fn description(&self) -> String;
    /// Number of trainable parameters.
    fn parameter_count(&self) -> usize;
    /// Data type of the weights, gradients and optimizer moments.
    fn dtype(&self) -> DType;
    /// The evaluation step (see [`Trainer::evaluation`]).
    fn evaluation_workload(&self) -> Box<dyn Workload>;
}

impl<M: Model + 'static> ReferenceWorkload for Trainer<M> {
    fn evaluation_workload(&self) -> Box<dyn Workload> {
        Box::new(self.evaluation())
    }

    fn description(&self) -> String {
        self.model.describe()
    }

    fn parameter_count(&self) -> usize {
        Trainer::parameter_count(self)
    }

    fn dtype(&self) -> DType {
        self.dtype
    }
}
