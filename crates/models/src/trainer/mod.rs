//! The engine that trains a model here as a user's model is trained: its
//! variables in a `VarMap`, a [`ModelProbe`] as its [`Workload`] (forward,
//! loss, backward and the optimizer's update computed in full but never
//! written, so tuning changes no weight, no moment and not the step count)
//! and a [`TrainLoop`] for its training ([`Trainer::train_step`]), the two
//! holding one optimizer. A [`Model`] is what it runs: the
//! [`reference`](crate::reference) models and a config's
//! [`ConfigModel`](crate::ConfigModel) alike.
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

pub(crate) mod footprint;
mod optimizer;

use std::cell::RefCell;
use std::rc::Rc;

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};
use candle_nn::{ParamsAdamW, VarMap};

use autobatch::estimate::OptimizerKind;
use autobatch::model::{ForwardOnly, ProbeLoss};
use autobatch::optim::{AdamW, DryStep};
use autobatch::{Guard, MemoryMeter, MicroBatch, ModelProbe, TrainLoop};
pub use footprint::Footprint;
use optimizer::{OptimizerChoice, Shared};

use crate::params::{Params, data_seed};
use autobatch::Workload;

use crate::Error;

/// A model that can compute its loss on a synthetic batch.
pub trait Model {
    /// A short name with the size, e.g. `transformer(vocab 256, d-model 64, heads 4, layers 2, seq-len 64, f32)`.
    fn describe(&self) -> String;

    /// The scalar f32 loss of `batch` synthetic samples drawn from `data_seed`;
    /// the same seed and batch give the same samples.
    fn loss(&self, batch: usize, data_seed: u64) -> candle_core::Result<Tensor>;

    /// The loss of `batch` samples and the gradients of the variables:
    /// `loss.backward()` unless the model does its own backward pass (the
    /// transformer with gradient checkpointing, which says so in
    /// [`computes_own_gradients`](Model::computes_own_gradients)).
    fn loss_and_gradients(
        &self,
        batch: usize,
        data_seed: u64,
        vars: &[Var],
    ) -> candle_core::Result<(Tensor, GradStore)> {
        let _ = vars;
        let loss = self.loss(batch, data_seed)?;
        let grads = loss.backward()?;
        Ok((loss, grads))
    }

    /// Whether [`loss_and_gradients`](Model::loss_and_gradients) runs its own
    /// backward pass: training then scales its gradients, not its loss
    /// ([`TrainLoop::step`](autobatch::TrainLoop::step), its closure returning the gradients).
    /// False by default.
    fn computes_own_gradients(&self) -> bool {
        false
    }

    /// The transformer this model is, when it is one: what the advice weighs
    /// checkpointing and shorter sequences by. `None` by default.
    fn transformer(&self) -> Option<(autobatch::estimate::TransformerShape, autobatch::estimate::Recompute)> {
        None
    }

    /// The same model over the same weights, detached from the variables: its
    /// forward pass records no graph, so each activation is freed as soon as
    /// the next layer has used it (candle has no `no_grad`; this is its form).
    fn detached(&self) -> Self
    where
        Self: Sized;
}

/// A reference model as a user's model: its variables in a `VarMap`, probed
/// by a [`ModelProbe`] and trained by a [`TrainLoop`], the two holding one
/// optimizer (AdamW by default), so that the state trained is the state
/// measured. A [`Workload`] (the probe's steps: nothing changes) and a
/// training loop in one.
pub struct Trainer<M> {
    model: Rc<RefCell<M>>,
    varmap: VarMap,
    vars: Vec<(String, Var)>,
    optimizer: Shared,
    probe: ModelProbe<ReferenceLoss<M>>,
    dtype: DType,
    seed: u64,
    steps: u64,
}

/// A reference model's loss on its probe batch: what its probe steps run.
struct ReferenceLoss<M> {
    model: Rc<RefCell<M>>,
    vars: Vec<Var>,
    seed: u64,
}

impl<M: Model> ProbeLoss for ReferenceLoss<M> {
    fn loss_and_gradients(&mut self, batch: usize) -> candle_core::Result<(Tensor, GradStore)> {
        self.model.borrow().loss_and_gradients(batch, data_seed(self.seed, None), &self.vars)
    }

    fn scales_gradients(&self) -> bool {
        self.model.borrow().computes_own_gradients()
    }
}

/// A meter that measures nothing: the reference models' own training steps
/// watch no memory. Its out-of-memory retries release no cache.
struct Unmetered;

impl MemoryMeter for Unmetered {
    fn capacity(&self) -> Result<u64, autobatch::Error> {
        Ok(u64::MAX)
    }

    fn in_use(&self) -> Result<u64, autobatch::Error> {
        Ok(0)
    }

    fn reset_peak(&mut self) -> Result<(), autobatch::Error> {
        Ok(())
    }

    fn peak(&self) -> Result<u64, autobatch::Error> {
        Ok(0)
    }
}

/// The variables of `varmap` by name, in name order (as `ModelProbe::new` takes them).
fn named_vars(varmap: &VarMap) -> Vec<(String, Var)> {
    let data = varmap.data().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut vars: Vec<(String, Var)> = data.iter().map(|(name, var)| (name.clone(), var.clone())).collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}

/// The default AdamW hyper-parameters of the reference workloads.
pub(crate) fn default_adamw() -> ParamsAdamW {
    ParamsAdamW { lr: 3e-3, weight_decay: 0.01, ..ParamsAdamW::default() }
}

impl<M: Model> Trainer<M> {
    pub(crate) fn new(model: M, params: Params, dtype: DType, seed: u64) -> Result<Self, Error> {
        Trainer::from_varmap(model, params.into_varmap(), dtype, seed)
    }

    /// A trainer of `model` whose trained variables are those of `varmap`.
    pub(crate) fn from_varmap(model: M, varmap: VarMap, dtype: DType, seed: u64) -> Result<Self, Error> {
        let vars = named_vars(&varmap);
        let choice = OptimizerChoice { kind: OptimizerKind::AdamW, mixed: false, adamw: default_adamw() };
        let optimizer = Shared::build(choice, vars.iter().map(|(_, var)| var.clone()).collect())?;
        let model = Rc::new(RefCell::new(model));
        let probe = Self::probe(&model, &vars, seed, optimizer.clone());
        Ok(Trainer { model, varmap, vars, optimizer, probe, dtype, seed, steps: 0 })
    }

    fn probe(
        model: &Rc<RefCell<M>>,
        vars: &[(String, Var)],
        seed: u64,
        optimizer: Shared,
    ) -> ModelProbe<ReferenceLoss<M>> {
        let loss =
            ReferenceLoss { model: model.clone(), vars: vars.iter().map(|(_, var)| var.clone()).collect(), seed };
        ModelProbe::with_loss(vars.to_vec(), loss).dry(optimizer)
    }

    /// Probes and trains with the optimizer `choice` from now on.
    fn set_optimizer(&mut self, choice: OptimizerChoice, change: &'static str) -> Result<(), Error> {
        if self.steps > 0 {
            return Err(autobatch::Error::AlreadyTrained { steps: self.steps, change }.into());
        }
        self.optimizer = Shared::build(choice, self.plain_vars())?;
        self.probe = Self::probe(&self.model, &self.vars, self.seed, self.optimizer.clone());
        Ok(())
    }

    /// The same model trained in mixed precision: the bf16 variables stay the
    /// model's, and AdamW runs on f32 master copies with f32 moments
    /// ([`MixedPrecision`](autobatch::optim::MixedPrecision): 2 + 2 + 12 bytes per
    /// parameter). Fails unless the model was built in bf16 and has not trained yet.
    pub fn into_mixed_precision(mut self) -> Result<Self, Error> {
        if self.dtype != DType::BF16 {
            return Err(Error::invalid(
                crate::Setting::Dtype,
                autobatch::Value::Dtype(self.dtype),
                "use bf16 variables for mixed precision (f32 masters are added)",
            ));
        }
        let choice = OptimizerChoice { kind: OptimizerKind::AdamW, mixed: true, adamw: default_adamw() };
        self.set_optimizer(choice, "switch to mixed precision")?;
        Ok(self)
    }

    /// The same model trained with another optimizer of this crate (its
    /// hyper-parameters at their defaults, the learning rate the reference
    /// AdamW's scaled as each paper advises): `Lion` (lr / 3), `Adafactor`
    /// (relative step) or `AdamW8bit`, or `AdamW` again. Before training only.
    pub fn with_optimizer(mut self, kind: OptimizerKind) -> Result<Self, Error> {
        self.set_optimizer(OptimizerChoice { kind, mixed: false, adamw: default_adamw() }, "choose the optimizer")?;
        Ok(self)
    }

    /// Whether AdamW runs on f32 master copies ([`into_mixed_precision`](Self::into_mixed_precision)).
    pub fn is_mixed_precision(&self) -> bool {
        self.optimizer.choice().mixed
    }

    /// One real training step on `batch` fresh synthetic samples: forward,
    /// loss, backward, the optimizer's update. Returns the loss before the update.
    pub fn train_step(&mut self, batch: usize) -> Result<f32, Error> {
        self.train_step_accumulated(batch, 1)
    }

    /// One optimizer step over `accumulation_steps` micro-batches of
    /// `micro_batch` fresh samples each, through a [`TrainLoop`]: the
    /// variables' gradients of the mean loss summed before the update, as
    /// for one batch of `micro_batch × accumulation_steps`, and as the tuner
    /// verifies plans. Returns the mean loss.
    pub fn train_step_accumulated(&mut self, micro_batch: usize, accumulation_steps: usize) -> Result<f32, Error> {
        if accumulation_steps == 0 {
            return Err(autobatch::Error::zero(autobatch::Setting::AccumulationSteps).into());
        }
        let batch = micro_batch.checked_mul(accumulation_steps).ok_or_else(|| {
            autobatch::Error::batch_overflow(
                micro_batch,
                &[autobatch::Setting::MicroBatch, autobatch::Setting::AccumulationSteps],
            )
        })?;
        self.step_guarded(Guard::with_batch(batch, micro_batch)?, accumulation_steps)
    }

    /// One optimizer step as `plan` splits it, through a [`TrainLoop`]: its
    /// micro-steps in order (micro-batches that differ by one sample each
    /// weighted by its samples), the gradient that of the plan's effective
    /// batch at once. Returns the mean loss.
    pub fn train_step_planned(&mut self, plan: &autobatch::Plan) -> Result<f32, Error> {
        self.step_guarded(Guard::new(plan)?, plan.accumulation_steps())
    }

    fn step_guarded(&mut self, guard: Guard, accumulation_steps: usize) -> Result<f32, Error> {
        let vars = self.plain_vars();
        let mut training = TrainLoop::with_guard(guard, vars.clone(), self.optimizer.clone());
        let model = self.model.borrow();
        // every micro-batch its own samples: the micro-steps of all steps so far, then its index
        // (a micro-step run again smaller after running out of memory starts where it did)
        let first = self.steps * accumulation_steps as u64;
        let mut starts: Vec<usize> = Vec::new();
        let mut seed = |micro: MicroBatch| {
            if starts.last() != Some(&micro.offset) {
                starts.push(micro.offset);
            }
            data_seed(self.seed, Some(first + (starts.len() - 1) as u64))
        };
        let mut unmetered = Unmetered;
        let report = if model.computes_own_gradients() {
            training.step(&mut unmetered, |micro| model.loss_and_gradients(micro.len, seed(micro), &vars))
        } else {
            training.step(&mut unmetered, |micro| model.loss(micro.len, seed(micro)))
        }?;
        drop(model);
        self.steps += 1;
        Ok(report.loss.map_or(f32::NAN, |loss| loss as f32))
    }

    fn plain_vars(&self) -> Vec<Var> {
        self.vars.iter().map(|(_, var)| var.clone()).collect()
    }

    /// The evaluation step as a [`Workload`]: a forward-only [`ModelProbe`]
    /// of the model detached from its variables (no graph, no backward, no
    /// optimizer), the loss read back as an evaluation loop reads it: what
    /// [`Search::evaluating`](autobatch::Search::evaluating) probes for the
    /// evaluation batch.
    pub fn evaluation(
        &self,
    ) -> ModelProbe<ForwardOnly<impl FnMut(autobatch::MicroBatch) -> candle_core::Result<Tensor> + use<M>>> {
        let (model, seed) = (self.model.borrow().detached(), self.seed);
        ModelProbe::new(&self.varmap, move |batch| {
            let loss = model.loss(batch.len, data_seed(seed, None))?;
            loss.to_scalar::<f32>()?;
            Ok(loss)
        })
        .forward_only()
    }

    /// Optimizer steps taken by training (probing takes none).
    pub fn steps_done(&self) -> u64 {
        self.steps
    }

    /// The model.
    pub fn model(&self) -> std::cell::Ref<'_, M> {
        self.model.borrow()
    }

    pub(crate) fn model_mut(&mut self) -> std::cell::RefMut<'_, M> {
        self.model.borrow_mut()
    }

    /// The variables, as a user's model keeps them.
    pub fn varmap(&self) -> &VarMap {
        &self.varmap
    }

    /// Named trainable variables, by name.
    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// The steps AdamW has counted (over master copies in mixed precision);
    /// `None` after [`with_optimizer`](Self::with_optimizer) chose another.
    pub fn adamw_steps(&self) -> Result<Option<usize>, Error> {
        Ok(self.optimizer.with_adamw(AdamW::step_count)?)
    }

    /// Bytes of optimizer state (and master copies, in mixed precision).
    pub fn optimizer_state_bytes(&self) -> u64 {
        self.optimizer.state_bytes()
    }

    /// Number of trainable parameters.
    pub fn parameter_count(&self) -> usize {
        self.vars.iter().map(|(_, var)| var.elem_count()).sum()
    }

    /// Data type of the weights, gradients and optimizer moments.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The training state: weights, gradients and the optimizer's state (and
    /// in mixed precision the f32 masters), counted as the estimate and the
    /// footprint count it ([`StaticMemory`](autobatch::estimate::StaticMemory)) for
    /// this trainer's optimizer and precision. What the model's state costs
    /// before any activation: with AdamW, 4 copies of the parameters.
    ///
    /// # Errors
    ///
    /// The core's byte overflow where the count passes `u64`.
    pub fn state(&self) -> Result<autobatch::estimate::StaticMemory, Error> {
        let choice = self.optimizer.choice();
        let stored = footprint::adamw_state(self.parameter_count() as u64, self.dtype)?;
        let precision = if choice.mixed { autobatch::estimate::Precision::Mixed } else { stored.precision };
        Ok(autobatch::estimate::StaticMemory::new(stored.parameters, precision, choice.kind)?)
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
        let moments = self.optimizer.with_adamw(|adamw| -> candle_core::Result<Vec<Vec<u32>>> {
            adamw.moments().flat_map(|(var, first, second)| [var, first, second]).map(bits).collect()
        })?;
        let mut state = Vec::new();
        if self.is_mixed_precision() || moments.is_none() {
            for (_, var) in &self.vars {
                state.push(bits(var)?);
            }
        }
        state.extend(moments.transpose()?.unwrap_or_default());
        Ok(state)
    }
}

/// The probe's steps (a [`ModelProbe`] of the model with its optimizer), its
/// cache key with the model's description added and its profile with the
/// transformer's shape.
impl<M: Model> Workload for Trainer<M> {
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        self.probe.step(batch)
    }

    fn accumulating_step(&mut self, batch: usize) -> candle_core::Result<()> {
        self.probe.accumulating_step(batch)
    }

    fn can_accumulate(&self) -> bool {
        self.probe.can_accumulate()
    }

    fn diagnose(&mut self) -> Vec<autobatch::plan::Warning> {
        self.probe.diagnose()
    }

    fn graph_tensors(&self) -> Option<Vec<autobatch::GraphTensor>> {
        self.probe.graph_tensors()
    }

    fn tuning_finished(&mut self) {
        self.probe.tuning_finished();
    }

    /// Frees the optimizer's state (and master copies, in mixed precision)
    /// before the trainer has trained; the next step builds it again, with
    /// zero moments as before. A trainer that has trained keeps its state.
    fn free_training_state(&mut self) -> u64 {
        self.probe.free_training_state()
    }

    fn cache_key(&self) -> Option<autobatch::CacheKey> {
        Some(self.probe.cache_key()?.param("model", self.model.borrow().describe()))
    }

    fn profile(&self) -> Option<autobatch::estimate::TrainingSetup> {
        let profile = self.probe.profile()?;
        Some(match self.model.borrow().transformer() {
            // a shape too large to count leaves out the advice it would add, not the rest
            Some((shape, recompute)) => profile.clone().transformer(shape, recompute).unwrap_or(profile),
            None => profile,
        })
    }
}

impl<M: Model> std::fmt::Debug for Trainer<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("model", &self.model.borrow().describe())
            .field("parameters", &self.parameter_count())
            .field("dtype", &self.dtype)
            .field("steps", &self.steps)
            .finish()
    }
}

pub(crate) fn check_dtype(dtype: DType) -> Result<(), Error> {
    match dtype {
        DType::F32 | DType::BF16 => Ok(()),
        other => Err(Error::invalid(crate::Setting::Dtype, autobatch::Value::Dtype(other), "use f32 or bf16")),
    }
}

/// A reference model chosen at run time (as `autobatch probe --model` does):
/// a [`Workload`] that says what it is and gives its evaluation step, behind
/// one `Box<dyn ReferenceWorkload>` whichever model it is.
///
/// ```
/// use autobatch_models::reference::MlpConfig;
/// use autobatch_models::trainer::ReferenceWorkload;
/// use candle_core::Device;
///
/// let chosen: Box<dyn ReferenceWorkload> = Box::new(MlpConfig::default().build(&Device::Cpu)?);
/// assert!(chosen.description().starts_with("mlp("));
/// assert!(chosen.parameter_count() > 0);
/// # Ok::<(), autobatch::Error>(())
/// ```
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
        self.model.borrow().describe()
    }

    fn parameter_count(&self) -> usize {
        Trainer::parameter_count(self)
    }

    fn dtype(&self) -> DType {
        self.dtype
    }
}
