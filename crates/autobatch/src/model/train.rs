//! `TrainLoop`: training with a plan, the way the plan was measured.

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};
use candle_nn::Optimizer;

use super::grads::Accumulator;
use super::{LossOutput, Variables};
use crate::{Error, Guard, MemoryMeter, MicroBatch, Plan, StepReport};

/// Trains with a [`Plan`]: each optimizer step runs the plan's
/// `micro_batch × accumulation_steps` samples as micro-batches through a
/// [`Guard`] (a micro-step that runs out of memory runs again at half the size,
/// on the same samples), scales each micro-batch's mean loss by
/// `micro.loss_scale`, accumulates the variables' gradients (one copy per
/// variable, never the whole gradient store: that also holds gradients of
/// constants such as an attention mask), then runs the optimizer's step. This
/// is the accumulation the tuner verified the plan with.
///
/// It runs one process's share: it has no all-reduce. With a plan for
/// uneven ranks ([`Tuner::uneven_ranks`](crate::Tuner::uneven_ranks)) the
/// micro-batch losses are scaled to the *global* batch, so the gradients must
/// be summed over ranks before the update: `new` refuses such a plan
/// ([`Error::InvalidSetting`]); drive the ranks with a [`Guard`] and
/// your own all-reduce instead.
///
/// ```
/// # #[global_allocator]
/// # static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
/// use autobatch::{HeapMeter, ModelProbe, TrainLoop, Tuner};
/// use candle_core::{DType, Device, Module, Tensor};
/// use autobatch::optim::AdamW;
/// use candle_nn::{linear, loss, Optimizer, ParamsAdamW, VarBuilder, VarMap};
///
/// let varmap = VarMap::new();
/// let model = linear(16, 4, VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
/// // one loss for the probe and for training: of a micro-batch's samples
/// let batch = |micro: autobatch::MicroBatch| -> candle_core::Result<Tensor> {
///     let x = Tensor::ones((micro.len, 16), DType::F32, &Device::Cpu)?;
///     loss::cross_entropy(&model.forward(&x)?, &Tensor::zeros(micro.len, DType::U32, &Device::Cpu)?)
/// };
/// let mut meter = HeapMeter::with_room(2 << 20)?; // 2 MiB for the step, on any host
/// let mut probe = ModelProbe::new(&varmap, batch).optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())?;
/// let plan = Tuner::new().max_batch(64).target_effective_batch(256).search(&mut probe, &mut meter).run()?;
///
/// let optimizer = AdamW::new(varmap.all_vars(), ParamsAdamW::default())?;
/// let mut training = TrainLoop::new(&plan, &varmap, optimizer)?;
/// let report = training.step(&mut meter, batch)?;
/// assert_eq!(report.samples, 256);
/// assert!(report.loss.is_some());
/// # Ok::<(), autobatch::Error>(())
/// ```
pub struct TrainLoop<O> {
    guard: Guard,
    grow_back_after: Option<usize>,
    vars: Vec<Var>,
    optimizer: O,
}

impl<O: Optimizer> TrainLoop<O> {
    /// A loop over `vars` (a `&VarMap`, or named variables held elsewhere:
    /// those `optimizer` was built over, as the probe takes them), with the
    /// plan's micro-batch and accumulation steps.
    pub fn new(plan: &Plan, vars: impl Variables, optimizer: O) -> Result<Self, Error> {
        let vars = vars.into_named().into_iter().map(|(_, var)| var);
        Ok(TrainLoop {
            guard: Self::guard_for(plan)?,
            grow_back_after: None,
            vars: vars.into_iter().collect(),
            optimizer,
        })
    }

    /// A loop over `vars` whose steps `guard` divides.
    pub fn with_guard(guard: Guard, vars: Vec<Var>, optimizer: O) -> Self {
        TrainLoop { guard, grow_back_after: None, vars, optimizer }
    }

    /// Doubles the micro-batch back after `steps` optimizer steps without an
    /// out-of-memory error (see [`Guard::grow_back_after`]).
    pub fn grow_back_after(mut self, steps: usize) -> Self {
        self.guard = self.guard.grow_back_after(steps);
        self.grow_back_after = Some(steps);
        self
    }

    /// Trains the following steps with `plan`'s micro-batches and
    /// accumulation, keeping the optimizer and its state: for length-bucketed
    /// training, the plan of the bucket the next batch comes from
    /// ([`SizePlan::plan_for`](crate::plan::SizePlan::plan_for)).
    pub fn switch_plan(&mut self, plan: &Plan) -> Result<(), Error> {
        let guard = Self::guard_for(plan)?;
        self.guard = match self.grow_back_after {
            Some(steps) => guard.grow_back_after(steps),
            None => guard,
        };
        Ok(())
    }

    fn guard_for(plan: &Plan) -> Result<Guard, Error> {
        if let Some(split) = plan.ranks().filter(|split| split.world_size() > 1) {
            return Err(Error::invalid(
                crate::Setting::Plan,
                crate::Value::Text(format!("a global batch shared over {} uneven ranks", split.world_size())),
                "its micro-batch losses are scaled to the global batch and need the gradients summed over ranks \
                 before the update; TrainLoop has no all-reduce: drive each rank with Guard::new(&plan) and your \
                 collective",
            ));
        }
        Guard::new(plan)
    }

    /// One optimizer step. `micro_step(micro)` returns the mean loss of the
    /// step's samples `micro.offset .. micro.offset + micro.len` (the loop
    /// scales it, runs backward and accumulates), or that loss and the
    /// variables' gradients of a backward pass of its own (gradient
    /// checkpointing, [`checkpointed`](super::checkpointed): the loop scales
    /// both by `micro.loss_scale`, the gradients as it adds them up, one
    /// variable at a time): what the probe's closure returns. After the last
    /// micro-step it applies the optimizer, so the step's gradient is the
    /// gradient of its mean loss whatever the split. The report's `loss` is
    /// the step's mean loss.
    ///
    /// An out-of-memory micro-step is run again smaller (the guard); any other
    /// error is returned with the optimizer not stepped. A failure while
    /// adding gradients is not retried (the sum would be partial): it comes
    /// back as [`Error::Workload`].
    pub fn step<M, F, T>(&mut self, meter: &mut M, mut micro_step: F) -> Result<StepReport, Error>
    where
        M: MemoryMeter + ?Sized,
        F: FnMut(MicroBatch) -> candle_core::Result<T>,
        T: LossOutput,
    {
        self.run(meter, |micro| match micro_step(micro)?.into_parts() {
            (loss, None) => {
                let scaled = (loss * micro.loss_scale)?;
                let grads = scaled.backward()?;
                Ok((scaled.detach(), grads, 1.0))
            }
            (loss, Some(grads)) => Ok(((loss.detach() * micro.loss_scale)?, grads, micro.loss_scale)),
        })
    }

    /// The guarded micro-steps, each giving its scaled loss (a scalar on the
    /// device, no graph), its gradients and the factor they still need,
    /// accumulated, then the optimizer's step. The losses are summed on the
    /// device and read back once per optimizer step: on a GPU a read is a
    /// synchronisation, which per micro-step would stall the queue.
    fn run<M, F>(&mut self, meter: &mut M, mut micro_step: F) -> Result<StepReport, Error>
    where
        M: MemoryMeter + ?Sized,
        F: FnMut(MicroBatch) -> candle_core::Result<(Tensor, GradStore, f64)>,
    {
        let mut accumulator = Accumulator::default();
        let mut mean_loss: Option<Tensor> = None;
        let vars = &self.vars;
        let report = self.guard.step(meter, |micro| {
            if accumulator.is_broken() {
                return Err(candle_core::Error::Msg("the gradient accumulator is incomplete".to_owned()));
            }
            let (scaled_loss, grads, gradient_scale) = micro_step(micro)?;
            match accumulator.add_scaled(grads, vars, gradient_scale) {
                Ok(()) => {
                    // the gradients are in: a failure now must not be retried as out of memory
                    let added = scaled_loss.to_dtype(DType::F32).and_then(|loss| match mean_loss.take() {
                        Some(sum) => sum + loss,
                        None => Ok(loss),
                    });
                    match added {
                        Ok(sum) => {
                            mean_loss = Some(sum);
                            Ok(())
                        }
                        Err(err) => Err(candle_core::Error::Msg(format!(
                            "adding the micro-step's loss failed: {}",
                            crate::error::candle_message(&err)
                        ))),
                    }
                }
                // not an out-of-memory error: the guard must not retry a partial sum
                Err(err) => Err(candle_core::Error::Msg(format!(
                    "adding the micro-step's gradients failed: {}",
                    crate::error::candle_message(&err)
                ))),
            }
        })?;
        let sum = accumulator.take()?;
        self.optimizer.step(&sum)?;
        let loss = mean_loss.map(|sum| sum.to_scalar::<f32>()).transpose()?.map(f64::from);
        Ok(StepReport { loss, ..report })
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &O {
        &self.optimizer
    }

    /// The optimizer, e.g. to set its learning rate.
    pub fn optimizer_mut(&mut self) -> &mut O {
        &mut self.optimizer
    }

    /// The guard: the micro-batch now, and how many micro-steps a step takes.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }
}

impl<O> std::fmt::Debug for TrainLoop<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainLoop").field("guard", &self.guard).field("variables", &self.vars.len()).finish()
    }
}
