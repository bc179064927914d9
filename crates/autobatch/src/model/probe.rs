//! `ModelProbe`: a user's model as a probe workload that changes nothing.

use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor, Var};
use candle_nn::{Optimizer, ParamsAdamW};

use super::Variables;
use super::buffers::{Buffers, host_copy};
use super::grads::Accumulator;
use super::loss::{ForwardOnly, LossOutput, ProbeLoss};
use crate::estimate::TrainingSetup;
use crate::optim::{Adafactor, AdamW, AdamW8bit, DryStep, Lion, MixedPrecision, Sgd};
use crate::per_parameter::{OptimizerKind, Precision};
use crate::{BySize, CacheKey, Error, GraphTensor, MicroBatch, Workload, plan::Warning};

/// A test on a variable's name.
type NamePredicate = Box<dyn Fn(&str) -> bool>;

/// Builds a dry optimizer over the probe's variables.
type Rebuild = Box<dyn Fn() -> Result<Box<dyn DryStep>>>;

/// Gradients a backward pass kept for tensors that are not the variables
/// (frozen weights, constants), beside the variables' own.
#[derive(Clone, Debug)]
struct UntrainedGradients {
    /// How many such tensors.
    tensors: usize,
    /// Their gradients' bytes.
    bytes: u64,
    /// The variables' gradients' bytes, beside them.
    trained_bytes: u64,
    /// The largest ones' shapes, largest first (at most four).
    shapes: Vec<Vec<usize>>,
    /// How many have the batch as their first dimension (the input, a target).
    of_the_batch: usize,
}

/// A throwaway optimizer's step over the variables.
type ThrowawayStep = Box<dyn FnMut(&[Var], &GradStore) -> Result<()>>;

/// The update a probe step computes.
enum Update {
    /// None: forward and backward only.
    None,
    /// An optimizer with a dry step (one of [`crate::optim`], AdamW with
    /// candle-nn's numbers among them): its state held, its update computed
    /// and dropped.
    Dry {
        name: String,
        /// `None` once freed ([`Workload::free_training_state`]) until the next step.
        optimizer: Option<Box<dyn DryStep>>,
        /// Builds it again over the same variables, when the probe built it.
        rebuild: Option<Rebuild>,
        kind: Option<OptimizerKind>,
        master_weights: bool,
    },
    /// Any optimizer: a throwaway one per step, the variables restored after.
    General { name: String, step: ThrowawayStep, host: Vec<Tensor> },
}

/// Your model as a probe [`Workload`]: forward (your loss closure), backward
/// and the optimizer's update, with no variable, moment or step count changed.
///
/// `loss(batch)` returns the scalar loss of `batch` samples, built on the
/// device as training builds it. Give the probe the optimizer training uses,
/// so that its state and its update are measured, by its type and
/// configuration: [`optimizer`](Self::optimizer)`::<AdamW>(params)` (every
/// optimizer of [`crate::optim`] steps dry, any other `candle_nn::Optimizer`
/// at the cost of a host copy of the variables), or an optimizer of your own
/// with a [`DryStep`] through [`dry`](Self::dry). Variables the forward pass writes (BatchNorm's statistics) are
/// put back bit for bit, and a variable left without a gradient is named in
/// the plan ([`Warning::MissingGradients`]). When the search ends the probe
/// frees its optimizer's state (built again if it steps again): training can
/// start beside it, with the memory the plan measured. How each is measured
/// and what it costs: the guide, docs/library.md.
///
/// ```
/// #[global_allocator]
/// static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
///
/// use autobatch::{HeapMeter, ModelProbe, Tuner};
/// use candle_core::{DType, Device, Module, Tensor};
/// use candle_nn::{linear, loss, ParamsAdamW, VarBuilder, VarMap};
///
/// let varmap = VarMap::new();
/// let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
/// let model = linear(64, 10, vb.pp("head"))?;
/// let loss = |batch: autobatch::MicroBatch| {
///     let x = Tensor::randn(0f32, 1., (batch.len, 64), &Device::Cpu)?;
///     let y = Tensor::zeros(batch.len, DType::U32, &Device::Cpu)?;
///     loss::cross_entropy(&model.forward(&x)?, &y)
/// };
/// let mut probe = ModelProbe::new(&varmap, loss).optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())?;
/// let plan = Tuner::new().max_batch(512).search(&mut probe, &mut HeapMeter::with_room(4 << 20)?).run()?;
/// assert!(plan.largest_batch() > 0);
/// # Ok::<(), autobatch::Error>(())
/// ```
pub struct ModelProbe<L> {
    vars: Vec<(String, Var)>,
    loss: L,
    update: Update,
    key: CacheKey,
    /// For each variable, whether it got a gradient in the first step that
    /// ran to the end.
    gradients: Option<Vec<bool>>,
    /// Float variables with no gradient that were not seen written (not
    /// buffers), once a step has run to the end.
    missing: Option<Vec<String>>,
    /// Variables the forward pass writes, put back after every step.
    buffers: Buffers,
    /// Run before each step and when tuning ends: clears state the model
    /// keeps between calls (a KV cache).
    reset: Option<Box<dyn FnMut() -> Result<()>>>,
    /// Variables without a gradient taken for buffers read without a graph
    /// (BatchNorm's statistics in evaluation mode, a frozen tensor kept in the
    /// `VarMap`), not for a cut graph: by their names, or as declared.
    read_only: Vec<String>,
    /// What the user declared to be buffers or frozen ([`ModelProbe::buffers_named`]).
    declared: Option<NamePredicate>,
    /// A forward-only step's output recorded a graph.
    graph_recorded: bool,
    /// The most gradient bytes a backward pass kept for tensors that are not
    /// the variables (frozen weights, constants).
    untrained: Option<UntrainedGradients>,
    /// The element counts of the last step's graph, in its sorted order.
    graph_tensors: Option<Vec<GraphTensor>>,
    /// `candle_nn::AdamW`'s parameters where it is the optimizer measured,
    /// and the update parked while this crate's AdamW is measured in its
    /// place ([`Workload::switch_update`]).
    leaner: Option<(ParamsAdamW, Option<Update>)>,
    /// The loss and its forward graph stay alive through the update
    /// (training calls `optimizer.backward_step(&loss)`).
    graph_through_update: bool,
    /// The whole gradient store `loss.backward()` returns stays alive
    /// through the update (training calls `optimizer.step(&grads)` on it).
    grad_store_through_update: bool,
}

impl<L> ModelProbe<L> {
    /// A probe of `vars` (a `&VarMap`, or named variables held elsewhere)
    /// with `loss(batch)`: the scalar loss of the [`MicroBatch`]'s samples
    /// (at batch n the probe gives it [`MicroBatch::of(n)`](MicroBatch::of),
    /// the first n; it runs the backward pass), or the loss and the
    /// variables' gradients of a backward pass of its own (gradient
    /// checkpointing through [`checkpointed`](super::checkpointed); the probe
    /// then holds both through the optimizer's update). The same closure is
    /// what [`TrainLoop::step`](crate::TrainLoop::step) takes: the loss the
    /// probe measured is the loss training runs. No optimizer yet:
    /// add the one training uses ([`optimizer`](Self::optimizer)); for the
    /// forward pass alone, [`forward_only`](Self::forward_only); for a loss of
    /// an input size as well, [`by_size`](ModelProbe::by_size).
    pub fn new<T: LossOutput>(vars: impl Variables, loss: L) -> Self
    where
        L: FnMut(MicroBatch) -> Result<T>,
    {
        ModelProbe::with_loss(vars, loss)
    }
}

impl<F: FnMut(MicroBatch) -> Result<Tensor>> ModelProbe<F> {
    /// This probe of a model's forward pass alone, for serving and evaluation:
    /// its closure runs the model on `batch` samples and returns its
    /// output (or an evaluation loss). No optimizer state is held, no backward
    /// pass runs and no gradient is checked. Build the model it runs from
    /// [`detached`](super::detached)`(&varmap)` so that its forward pass
    /// records no graph and frees each activation once used: an output that
    /// recorded one (computed from the variables themselves) is a
    /// [`Warning::GraphRecorded`], since it held every activation as training
    /// does. Variables the forward pass writes are put back as for training.
    ///
    /// ```
    /// #[global_allocator]
    /// static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
    ///
    /// use autobatch::model::detached;
    /// use autobatch::{HeapMeter, ModelProbe, Tuner};
    /// use candle_core::{DType, Device, Module, Tensor};
    /// use candle_nn::{linear, VarBuilder, VarMap};
    ///
    /// let varmap = VarMap::new();
    /// let _training = linear(64, 10, VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    /// let serving = linear(64, 10, detached(&varmap))?;
    /// let forward = |batch: autobatch::MicroBatch| serving.forward(&Tensor::ones((batch.len, 64), DType::F32, &Device::Cpu)?);
    /// let mut probe = ModelProbe::new(&varmap, forward).forward_only();
    /// let plan = Tuner::new().max_batch(4096).search(&mut probe, &mut HeapMeter::with_room(2 << 20)?).run()?;
    /// assert!(plan.largest_batch() > 0 && plan.warnings().is_empty());
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn forward_only(self) -> ModelProbe<ForwardOnly<F>> {
        self.map_loss(ForwardOnly)
    }
}

impl<F> ModelProbe<BySize<F>> {
    /// A probe whose loss depends on an input size as well as the batch:
    /// `loss(batch, size)` is the scalar loss of `batch` samples of `size`
    /// (tokens, pixels per side), starting at `size`, or that loss and its
    /// gradients, as for [`new`](ModelProbe::new). It is
    /// [`Resizable`](crate::Resizable), for
    /// [`Search::sizes`](crate::Search::sizes).
    ///
    /// ```
    /// #[global_allocator]
    /// static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
    ///
    /// use autobatch::{HeapMeter, ModelProbe, Tuner};
    /// use candle_core::{DType, Device, Module, Tensor};
    /// use candle_nn::{embedding, linear, loss, ParamsAdamW, VarBuilder, VarMap};
    ///
    /// let varmap = VarMap::new();
    /// let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    /// let (embed, head) = (embedding(32, 16, vb.pp("embed"))?, linear(16, 32, vb.pp("head"))?);
    /// let loss = |batch: autobatch::MicroBatch, len: usize| {
    ///     let tokens = Tensor::zeros((batch.len, len), DType::U32, &Device::Cpu)?;
    ///     let logits = head.forward(&embed.forward(&tokens)?)?.reshape((batch.len * len, 32))?;
    ///     loss::cross_entropy(&logits, &tokens.flatten_all()?)
    /// };
    /// let mut probe = ModelProbe::by_size(&varmap, 64, loss).optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())?;
    /// let plan = Tuner::new().max_batch(4096).search(&mut probe, &mut HeapMeter::with_room(4 << 20)?).sizes(&[16, 64])?;
    /// assert!(plan.sizes[&16].largest_batch() > plan.sizes[&64].largest_batch());
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn by_size<T: LossOutput>(vars: impl Variables, size: usize, loss: F) -> Self
    where
        F: FnMut(MicroBatch, usize) -> Result<T>,
    {
        ModelProbe::with_loss(vars, BySize { closure: loss, size })
    }
}

impl<L> crate::Resizable for ModelProbe<BySize<L>>
where
    BySize<L>: ProbeLoss,
{
    fn resize(&mut self, size: usize) -> std::result::Result<(), Error> {
        self.loss.size = size;
        Ok(())
    }

    fn size(&self) -> usize {
        self.loss.size
    }
}

impl<L: ProbeLoss> ModelProbe<L> {
    /// A probe of `vars` with a loss type of a model crate (any
    /// [`ProbeLoss`](super::ProbeLoss)); a closure goes to [`new`](ModelProbe::new).
    pub fn with_loss(vars: impl Variables, loss: L) -> Self {
        let vars = vars.into_named();
        let key = CacheKey::new().variables(vars.iter().map(|(name, var)| (name.as_str(), var)));
        ModelProbe {
            vars,
            loss,
            update: Update::None,
            key,
            gradients: None,
            missing: None,
            untrained: None,
            graph_tensors: None,
            read_only: Vec::new(),
            declared: None,
            buffers: Buffers::default(),
            reset: None,
            graph_recorded: false,
            graph_through_update: false,
            grad_store_through_update: false,
            leaner: None,
        }
    }

    /// The same probe with its loss wrapped (settings, state and key kept).
    fn map_loss<M>(self, wrap: impl FnOnce(L) -> M) -> ModelProbe<M> {
        ModelProbe {
            loss: wrap(self.loss),
            vars: self.vars,
            update: self.update,
            key: self.key,
            gradients: self.gradients,
            missing: self.missing,
            untrained: self.untrained,
            graph_tensors: self.graph_tensors,
            read_only: self.read_only,
            declared: self.declared,
            buffers: self.buffers,
            reset: self.reset,
            graph_recorded: self.graph_recorded,
            graph_through_update: self.graph_through_update,
            grad_store_through_update: self.grad_store_through_update,
            leaner: self.leaner,
        }
    }

    /// Measures an optimizer built over this probe's variables that can
    /// compute its update without applying it ([`DryStep`]): its state is held
    /// for the probe's life, as training holds it, and each probe step runs
    /// its update dry. Build it over [`vars`](Self::vars), in that order.
    pub fn dry<O: DryStep + 'static>(self, optimizer: O) -> Self {
        self.dry_named(std::any::type_name::<O>(), optimizer)
    }

    fn dry_named<O: DryStep + 'static>(mut self, name: &str, optimizer: O) -> Self {
        let (kind, master_weights) = (optimizer.kind(), optimizer.master_weights());
        // the plan cache tells optimizers apart by this name: one type may step several kinds
        let name = match kind {
            Some(kind) => format!("{name} ({}{})", kind.name(), if master_weights { ", mixed precision" } else { "" }),
            None => name.to_owned(),
        };
        let optimizer: Option<Box<dyn DryStep>> = Some(Box::new(optimizer));
        self.update = Update::Dry { name, optimizer, rebuild: None, kind, master_weights };
        self
    }

    /// One of this crate's optimizers, built here so that it can be built
    /// again after [`Workload::free_training_state`].
    fn dry_rebuilt<O>(self, name: &str, config: O::Config) -> std::result::Result<Self, Error>
    where
        O: Optimizer + DryStep + 'static,
        O::Config: Clone + 'static,
    {
        let vars = self.plain_vars();
        let rebuild: Rebuild = Box::new(move || Ok(Box::new(O::new(vars.clone(), config.clone())?)));
        let optimizer = rebuild()?;
        let (kind, master_weights) = (optimizer.kind(), optimizer.master_weights());
        let mut probe = self;
        probe.update = Update::Dry {
            name: name.to_owned(),
            optimizer: Some(optimizer),
            rebuild: Some(rebuild),
            kind,
            master_weights,
        };
        Ok(probe)
    }

    /// The optimizer training uses, by its type and configuration, as
    /// candle-nn builds one (`O::new(vars, config)`): its state is allocated
    /// now, as training holds it, and each probe step computes its update
    /// without writing it.
    ///
    /// Every optimizer of [`crate::optim`] (`AdamW`, `Lion`, `Adafactor`,
    /// `AdamW8bit`, `Sgd`, and `MixedPrecision` of each) steps dry: nothing is
    /// copied, and its state is freed when the search ends and built again
    /// at the next step. Any other `candle_nn::Optimizer` (`candle_nn::AdamW`,
    /// `candle_nn::SGD`, your own) is accepted too, at a cost: a throwaway
    /// optimizer each step and the variables written back from a host copy
    /// of them (the host copy is the cost, in host memory and time). With
    /// `candle_nn::AdamW` the tuner also runs one step of
    /// [`optim::AdamW`](crate::optim::AdamW) (the same numbers, its step a
    /// slice at a time) at the answer, and the plan says what switching saves
    /// ([`Warning::LeanerUpdate`]). Train with the type given here for the
    /// plan to hold. An optimizer of your own with a [`DryStep`] goes through
    /// [`dry`](Self::dry).
    ///
    /// ```
    /// # #[global_allocator]
    /// # static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
    /// use autobatch::optim::{AdamW, Lion, ParamsLion};
    /// use autobatch::ModelProbe;
    /// use candle_core::{DType, Device, Tensor};
    /// use candle_nn::{ParamsAdamW, VarBuilder, VarMap};
    ///
    /// let varmap = VarMap::new();
    /// let weight = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu).get((16, 16), "w")?;
    /// let loss = |b: autobatch::MicroBatch| Tensor::ones((b.len, 16), DType::F32, &Device::Cpu)?.matmul(&weight)?.sum_all();
    /// let adamw = ModelProbe::new(&varmap, loss).optimizer::<AdamW>(ParamsAdamW::default())?;
    /// let lion = ModelProbe::new(&varmap, loss).optimizer::<Lion>(ParamsLion::default())?;
    /// let candle = ModelProbe::new(&varmap, loss).optimizer::<candle_nn::AdamW>(ParamsAdamW::default())?;
    /// # let _ = (adamw, lion, candle);
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn optimizer<O>(mut self, config: O::Config) -> std::result::Result<Self, Error>
    where
        O: Optimizer + 'static,
        O::Config: Clone + 'static,
    {
        // this crate's optimizers step dry, each built here so that it can be built again
        macro_rules! dry {
            ($($ours:ty),* $(,)?) => {$(
                if std::any::TypeId::of::<O>() == std::any::TypeId::of::<$ours>()
                    && let Some(config) = (&config as &dyn std::any::Any).downcast_ref::<<$ours as Optimizer>::Config>()
                {
                    return self.dry_rebuilt::<$ours>(&public_name::<$ours>(), config.clone());
                }
            )*};
        }
        dry!(
            AdamW,
            Lion,
            Adafactor,
            AdamW8bit,
            Sgd,
            MixedPrecision<AdamW>,
            MixedPrecision<Lion>,
            MixedPrecision<Adafactor>,
            MixedPrecision<AdamW8bit>,
            MixedPrecision<Sgd>,
        );
        let host = self.vars.iter().map(|(_, var)| host_copy(var.as_tensor())).collect::<Result<Vec<_>>>()?;
        let config_for_leaner = config.clone();
        let step = move |vars: &[Var], grads: &GradStore| -> Result<()> {
            let mut optimizer = O::new(vars.to_vec(), config.clone())?;
            optimizer.step(grads)
        };
        let name = std::any::type_name::<O>().to_owned();
        self.update = Update::General { name, step: Box::new(step), host };
        // candle-nn's AdamW has a leaner form with the same numbers: the plan says what it saves
        self.leaner = (std::any::TypeId::of::<O>() == std::any::TypeId::of::<candle_nn::AdamW>())
            .then(|| (&config_for_leaner as &dyn std::any::Any).downcast_ref::<ParamsAdamW>().cloned())
            .flatten()
            .map(|params| (params, None));
        Ok(self)
    }

    /// Declares which variables are buffers or frozen tensors kept in the
    /// `VarMap` (read without a gradient, as BatchNorm's statistics are in
    /// evaluation mode), by name: without a gradient, they are no cut graph.
    /// Names checkpoints give buffers (`running_mean`, `running_var`,
    /// `num_batches_tracked`) are taken for buffers without it.
    ///
    /// ```
    /// use autobatch::ModelProbe;
    /// use candle_core::{DType, Device, Tensor};
    /// use candle_nn::{VarBuilder, VarMap};
    ///
    /// let varmap = VarMap::new();
    /// let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    /// let frozen = vb.get((4, 4), "encoder.frozen")?; // kept in the VarMap, never trained
    /// let weight = vb.get((4, 4), "head.weight")?;
    /// let loss = |b: autobatch::MicroBatch| Tensor::ones((b.len, 4), DType::F32, &Device::Cpu)?.matmul(&frozen.detach())?.matmul(&weight)?.sum_all();
    /// let mut probe = ModelProbe::new(&varmap, loss).buffers_named(|name| name.starts_with("encoder."));
    /// autobatch::Workload::step(&mut probe, 2)?;
    /// assert_eq!(probe.read_only_buffers(), ["encoder.frozen"]);
    /// assert_eq!(probe.variables_without_gradient(), Some(&[][..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn buffers_named(mut self, is_buffer: impl Fn(&str) -> bool + 'static) -> Self {
        self.declared = Some(Box::new(is_buffer));
        self
    }

    /// The variables that got no gradient and are taken for buffers read
    /// without a graph (by their names, or [`buffers_named`](Self::buffers_named)),
    /// not for a cut graph: no warning, no demotion. Empty before a step has run.
    pub fn read_only_buffers(&self) -> &[String] {
        &self.read_only
    }

    /// Runs `reset` before and after each probe step and when tuning ends:
    /// for a model that keeps state between calls (a KV cache that grows with
    /// every forward pass, `model.clear_kv_cache()`), so that each trial starts
    /// as training does, its baseline holds no earlier step's state, and
    /// nothing is left held after tuning.
    pub fn with_reset(mut self, reset: impl FnMut() -> Result<()> + 'static) -> Self {
        self.reset = Some(Box::new(reset));
        self
    }

    /// Measures training that keeps the loss, and with it the forward graph's
    /// activations, alive through the optimizer's update: candle-nn's
    /// `optimizer.backward_step(&loss)`, or `let grads = loss.backward()?;
    /// optimizer.step(&grads)?;` with the loss still in scope (the whole
    /// gradient store is then held too, as with
    /// [`grad_store_through_update`](Self::grad_store_through_update)).
    ///
    /// By default the probe holds through the update what
    /// [`TrainLoop`](crate::TrainLoop) holds: the variables' gradients, with
    /// the loss, its graph and every other gradient freed after the backward
    /// pass. The answer is then what that training holds; the idioms above
    /// hold more (up to one activation set), and a plan probed without the
    /// option can run out of memory there.
    pub fn graph_through_update(mut self, held: bool) -> Self {
        self.graph_through_update = held;
        self
    }

    /// Measures training that frees the loss but steps the optimizer with the
    /// whole store `loss.backward()` returned: `let grads = { let loss =
    /// ..; loss.backward()? }; optimizer.step(&grads)?`. candle keeps in that
    /// store, besides the variables' gradients, a gradient for each input
    /// and constant the loss was computed from (the batch's inputs, an
    /// attention mask): batch-sized tensors that [`TrainLoop`](crate::TrainLoop)
    /// drops before the update (4% of a small MLP's step, `cargo bench
    /// --bench train_loop`).
    pub fn grad_store_through_update(mut self, held: bool) -> Self {
        self.grad_store_through_update = held;
        self
    }

    /// Adds a parameter that decides memory to the cache key (a sequence
    /// length, an image size: what the loss closure builds its batch with).
    pub fn key_param(mut self, name: &str, value: impl std::fmt::Display) -> Self {
        self.key = self.key.param(name, value);
        self
    }

    /// The variables, by name.
    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// The float variables that received no gradient in the first probe step
    /// that ran to the end and that the forward pass did not write (a cut
    /// graph, not a buffer); `None` before a step has run to the end.
    pub fn variables_without_gradient(&self) -> Option<&[String]> {
        self.missing.as_deref()
    }

    /// The variables the forward pass writes (candle-nn's BatchNorm running
    /// statistics in training mode, a buffer of your own kept as a `Var`),
    /// by name: those a probe step was seen to change, all of them put back
    /// after every step. `None` before a step has run to the end.
    /// Build an evaluation model that shares them with
    /// [`detached_sharing`](super::detached_sharing).
    pub fn buffers(&self) -> Option<Vec<&str>> {
        Some(self.buffers.written()?.map(|index| self.vars[index].0.as_str()).collect())
    }

    fn plain_vars(&self) -> Vec<Var> {
        self.vars.iter().map(|(_, var)| var.clone()).collect()
    }

    /// The update from `grads`, computed and dropped (or, for a general
    /// optimizer, run and undone).
    fn update(&mut self, grads: &GradStore) -> Result<()> {
        match &mut self.update {
            Update::None => Ok(()),
            Update::Dry { optimizer, rebuild, .. } => {
                if optimizer.is_none() {
                    *optimizer = rebuild.as_ref().map(|rebuild| rebuild()).transpose()?;
                }
                optimizer.as_ref().map_or(Ok(()), |optimizer| optimizer.dry_step(grads))
            }
            Update::General { step, host, .. } => {
                let vars: Vec<Var> = self.vars.iter().map(|(_, var)| var.clone()).collect();
                let stepped = step(&vars, grads);
                // write back what the optimizer can have changed (a variable
                // with a gradient), even when the step failed part way; what the
                // forward pass wrote is put back by `restoring`, which must
                // see it changed to know it for a buffer
                for (var, saved) in vars.iter().zip(host.iter()) {
                    if grads.get(var.as_tensor()).is_some() {
                        var.set(&saved.to_device(var.device())?)?;
                    }
                }
                stepped
            }
        }
    }

    fn check_gradients(&mut self, grads: &GradStore, batch: usize) {
        if self.gradients.is_none() {
            self.gradients = Some(self.vars.iter().map(|(_, var)| grads.get(var.as_tensor()).is_some()).collect());
        }
        // after backward, the store holds the variables' gradients and those
        // of the leaves that are not variables: a frozen weight under candle's
        // matmul, a constant such as an attention mask (the nodes' own are gone)
        let bytes = |tensor: &Tensor| (tensor.elem_count() * tensor.dtype().size_in_bytes()) as u64;
        let trained: std::collections::HashSet<_> = self.vars.iter().map(|(_, var)| var.as_tensor().id()).collect();
        let (mut count, mut held, mut kept) = (0, 0, 0);
        let mut untrained: Vec<(u64, Vec<usize>)> = Vec::new();
        for id in grads.get_ids() {
            let Some(grad) = grads.get_id(*id) else { continue };
            if trained.contains(id) {
                kept += bytes(grad);
            } else {
                count += 1;
                held += bytes(grad);
                untrained.push((bytes(grad), grad.dims().to_vec()));
            }
        }
        if self.untrained.as_ref().is_none_or(|most| held > most.bytes) {
            untrained.sort_by_key(|(bytes, _)| std::cmp::Reverse(*bytes));
            let of_the_batch = untrained.iter().filter(|(_, dims)| dims.first() == Some(&batch)).count();
            let shapes = untrained.into_iter().take(4).map(|(_, dims)| dims).collect();
            let found = UntrainedGradients { tensors: count, bytes: held, trained_bytes: kept, shapes, of_the_batch };
            self.untrained = Some(found);
        }
    }

    fn optimizer_name(&self) -> String {
        match &self.update {
            Update::None => "none".to_owned(),
            Update::Dry { name, .. } => name.clone(),
            Update::General { name, .. } => name.clone(),
        }
    }
}

impl<L: ProbeLoss> ModelProbe<L> {
    /// Runs `step` with the variables the forward pass writes put back after
    /// it, whether it succeeded or not; the first step that runs to the end
    /// tells which they are (and they are no missing gradients).
    fn restoring(&mut self, step: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        if let Some(reset) = &mut self.reset {
            reset()?;
        }
        let saved = self.buffers.save(&self.vars)?;
        let mut result = step(self);
        if let Some(reset) = &mut self.reset {
            // what the step left in the model is not the next trial's baseline
            result = result.and_then(|()| reset());
        }
        if !self.loss.computes_gradients() && self.gradients.is_none() {
            // forward only: no gradient to tell a weight from a buffer; only a write does
            self.gradients = Some(vec![true; self.vars.len()]);
        }
        let gradients = self.gradients.as_deref().filter(|_| result.is_ok());
        self.buffers.restore(&self.vars, saved, gradients)?;
        if let (Some(gradients), Some(written)) = (&self.gradients, self.buffers.written()) {
            let written: Vec<usize> = written.collect();
            let missing =
                self.vars.iter().enumerate().filter(|(index, (_, var))| {
                    var.dtype().is_float() && !gradients[*index] && !written.contains(index)
                });
            let (read_only, cut): (Vec<String>, Vec<String>) =
                missing.map(|(_, (name, _))| name.clone()).partition(|name| self.is_buffer(name));
            self.read_only = read_only;
            self.missing = Some(cut);
        }
        result
    }

    /// Whether a variable with no gradient is a buffer read without a graph
    /// rather than a variable a cut graph left out: declared so, or named as
    /// checkpoints name buffers (a cut graph takes every variable upstream of
    /// the fused op with it, whatever their names).
    fn is_buffer(&self, name: &str) -> bool {
        const BUFFER_NAMES: [&str; 3] = ["running_mean", "running_var", "num_batches_tracked"];
        let last = name.rsplit('.').next().unwrap_or(name);
        BUFFER_NAMES.contains(&last) || self.declared.as_ref().is_some_and(|declared| declared(name))
    }

    /// Forward, backward and the update computed dry.
    fn plain_step(&mut self, batch: usize) -> Result<()> {
        let (loss, grads) = self.loss.loss_and_gradients(batch)?;
        self.graph_tensors = Some(graph_tensors(&loss));
        if !self.loss.computes_gradients() {
            self.graph_recorded |= loss.track_op();
            return Ok(());
        }
        let held = self.graph_through_update.then_some(loss);
        self.check_gradients(&grads, batch);
        // what training steps with: the variables' gradients only (TrainLoop),
        // or the whole store `loss.backward()` returned
        let grads = if self.grad_store_through_update || self.graph_through_update {
            grads
        } else {
            super::grads::keep_variables(grads, &self.plain_vars())
        };
        self.update(&grads)?;
        drop(grads);
        drop(held);
        Ok(())
    }

    /// A micro-step after the first, with the accumulator held.
    fn accumulating_micro_step(&mut self, batch: usize) -> Result<()> {
        let vars = self.plain_vars();
        let mut accumulator = Accumulator::holding_zeros(&vars)?;
        let (loss, grads) = self.loss.loss_and_gradients(batch)?;
        self.graph_tensors = Some(graph_tensors(&loss));
        let held = self.graph_through_update.then_some(loss);
        self.check_gradients(&grads, batch);
        // any scale but 1 allocates what training's does (the value is never used)
        let scale = if self.loss.scales_gradients() { 0.5 } else { 1.0 };
        accumulator.add_scaled(grads, &vars, scale)?;
        let sum = accumulator.take()?;
        self.update(&sum)?;
        drop(sum);
        drop(held);
        Ok(())
    }
}

/// The element count and dtype of every tensor of `loss`'s graph, in
/// candle's sorted order (a loss computed outside a graph has none).
fn graph_tensors(loss: &Tensor) -> Vec<GraphTensor> {
    loss.sorted_nodes()
        .into_iter()
        .map(|node| GraphTensor { elements: node.elem_count() as u64, dtype: node.dtype() })
        .collect()
}

impl<L: ProbeLoss> Workload for ModelProbe<L> {
    /// Forward, backward and the update computed dry. The loss (and with it
    /// the forward graph) is freed after the backward pass and the whole
    /// gradient store stays alive through the update, as in
    /// [`TrainLoop`](crate::TrainLoop) (with
    /// [`graph_through_update`](ModelProbe::graph_through_update), the loss
    /// too, as in `optimizer.backward_step(&loss)`). Variables the forward
    /// pass writes are put back after it.
    fn step(&mut self, batch: usize) -> Result<()> {
        self.restoring(|probe| probe.plain_step(batch))
    }

    /// A micro-step after the first of an accumulating optimizer step: the
    /// accumulator (one gradient per variable) held throughout, this
    /// micro-step's gradients added to it, and the update computed from the sum.
    fn accumulating_step(&mut self, batch: usize) -> Result<()> {
        self.restoring(|probe| probe.accumulating_micro_step(batch))
    }

    fn can_accumulate(&self) -> bool {
        self.loss.computes_gradients()
    }

    fn graph_tensors(&self) -> Option<Vec<GraphTensor>> {
        self.graph_tensors.clone()
    }

    fn diagnose(&mut self) -> Vec<Warning> {
        if self.graph_recorded {
            return vec![Warning::GraphRecorded];
        }
        let mut warnings = Vec::new();
        if let Some(missing) = self.missing.as_ref().filter(|m| !m.is_empty()) {
            let of = self.vars.iter().filter(|(_, var)| var.dtype().is_float()).count();
            warnings.push(Warning::MissingGradients { variables: missing.clone(), of });
        }
        // the tuner keeps them in the plan's memory, and warns where they outweigh the trained ones
        if let Some(UntrainedGradients { tensors, bytes, trained_bytes, shapes, of_the_batch }) =
            self.untrained.clone().filter(|u| u.bytes > 0)
        {
            warnings.push(Warning::UntrainedGradients { tensors, bytes, trained_bytes, shapes, of_the_batch });
        }
        warnings
    }

    /// Frees the optimizer's state (a dry optimizer this probe built: the
    /// moments of an optimizer of [`crate::optim`] given to
    /// [`optimizer`](ModelProbe::optimizer));
    /// the next step builds it again, as it was (a probe never steps it).
    fn free_training_state(&mut self) -> u64 {
        match &mut self.update {
            Update::Dry { optimizer, rebuild: Some(_), .. } => optimizer.take().map_or(0, |o| o.state_bytes()),
            Update::Dry { optimizer: Some(optimizer), rebuild: None, .. } => optimizer.free_state(),
            _ => 0,
        }
    }

    /// `candle_nn::AdamW`, measured through a host copy, switched to this
    /// crate's AdamW (the same numbers, a slice at a time, its moments
    /// allocated for the step measured) and back.
    fn switch_update(&mut self, leaner: bool) -> Option<(String, String)> {
        let vars = self.plain_vars();
        let (params, parked) = self.leaner.as_mut()?;
        match (leaner, parked.take()) {
            (true, None) => {
                let optimizer = AdamW::new(vars, params.clone()).ok()?;
                let lean = Update::Dry {
                    name: "autobatch::optim::AdamW".to_owned(),
                    optimizer: Some(Box::new(optimizer)),
                    rebuild: None,
                    kind: Some(OptimizerKind::AdamW),
                    master_weights: false,
                };
                let mut general = std::mem::replace(&mut self.update, lean);
                // the host copy of the weights is the general path's alone (on the CPU, on
                // the heap measured): freed while the lean update is measured
                if let Update::General { host, .. } = &mut general {
                    *host = Vec::new();
                }
                *parked = Some(general);
            }
            // back: the lean optimizer and its moments dropped here, the host copy made again
            (false, Some(mut update)) => {
                if let Update::General { host, .. } = &mut update {
                    match vars.iter().map(|var| host_copy(var.as_tensor())).collect::<Result<Vec<_>>>() {
                        Ok(copy) => *host = copy,
                        Err(err) => {
                            // without its copy the general update could not put the weights back:
                            // the probe measures none rather than change them
                            log::warn!("the weights could not be copied to the host again ({err}): no update measured");
                            update = Update::None;
                        }
                    }
                }
                self.update = update;
            }
            (_, still) => {
                *parked = still;
                return None;
            }
        }
        Some(("candle_nn::AdamW".to_owned(), "autobatch::optim::AdamW".to_owned()))
    }

    fn tuning_finished(&mut self) {
        if let Some(reset) = &mut self.reset
            && let Err(err) = reset()
        {
            log::warn!("the reset after tuning failed: {}", crate::error::candle_message(&err));
        }
    }

    fn cache_key(&self) -> Option<CacheKey> {
        let step =
            if self.loss.computes_gradients() { self.optimizer_name() } else { "none (forward only)".to_owned() };
        let key = self.key.clone().param("optimizer", step);
        // what the update holds besides the variables' gradients, when more than TrainLoop does
        Some(match (self.graph_through_update, self.grad_store_through_update) {
            (true, _) => key.param("held through the update", "loss, graph and gradient store"),
            (false, true) => key.param("held through the update", "gradient store"),
            (false, false) => key,
        })
    }

    fn profile(&self) -> Option<TrainingSetup> {
        if !self.loss.computes_gradients() {
            // no training state to advise on
            return None;
        }
        let optimizer = match &self.update {
            Update::None => OptimizerKind::Sgd,
            Update::Dry { kind, .. } => (*kind)?,
            // its state is not known from outside
            Update::General { .. } => return None,
        };
        let floats = || self.vars.iter().map(|(_, var)| var).filter(|var| var.dtype().is_float());
        let parameters = floats().map(|var| var.elem_count() as u64).sum();
        let mixed = match &self.update {
            Update::Dry { master_weights, .. } => *master_weights,
            _ => false,
        };
        let precision = match floats().next().map(|var| var.dtype()) {
            Some(DType::BF16 | DType::F16) if mixed => Precision::Mixed,
            Some(DType::BF16 | DType::F16) => Precision::Bf16,
            _ => Precision::Fp32,
        };
        let largest = floats().map(|var| var.elem_count() as u64).max().unwrap_or(0);
        Some(TrainingSetup::new(parameters, precision, optimizer).largest_variable(largest))
    }
}

/// An optimizer of this crate by its public path
/// (`autobatch::optim::MixedPrecision<autobatch::optim::AdamW>`): the name
/// the plan says and its cache tells optimizers apart by.
fn public_name<O>() -> String {
    let mut name = std::any::type_name::<O>().to_owned();
    for module in ["adamw8bit", "adamw", "adafactor", "lion", "sgd", "mixed"] {
        name = name.replace(&format!("autobatch::optim::{module}::"), "autobatch::optim::");
    }
    name
}

impl<L> std::fmt::Debug for ModelProbe<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelProbe").field("variables", &self.vars.len()).field("missing", &self.missing).finish()
    }
}
