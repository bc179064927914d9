//! The runtime guard of a training loop: micro-batches with accumulation that
//! survive an out-of-memory error without changing the effective batch.

use log::{info, warn};

use crate::{is_oom, Error, MemoryMeter, Plan};

/// Runs each optimizer step's samples as micro-batches; when a micro-step runs
/// out of memory, releases what it can, halves the micro-batch (so the
/// accumulation steps double) and runs the same samples again, so that the
/// step still sees every sample exactly once and the accumulated gradient is
/// the same up to floating point. Optionally grows back after a number of
/// steps without an out-of-memory error, never above the plan's micro-batch.
///
/// The micro-step closure gets a [`MicroBatch`]: which samples of the step to
/// take and the factor to scale their (mean) loss by, so that the sum of the
/// micro-batches' gradients is the gradient of the step's mean loss whatever
/// the split. It must be all or nothing: add its gradients to the accumulator
/// only once its backward pass has succeeded (in candle, after
/// `loss.backward()?` returns), so that a micro-step that fails leaves nothing
/// behind.
///
/// ```
/// use autobatch::memory::simulated::{MemoryCurve, Simulation};
/// use autobatch::{Guard, Tuner};
///
/// let (mut workload, mut meter) = Simulation::new(16 << 30, MemoryCurve::affine(2 << 30, 100 << 20)).build();
/// let plan = Tuner::new().target_effective_batch(256).run(&mut workload, &mut meter)?;
/// let mut guard = Guard::new(&plan)?.grow_back_after(100);
/// let mut seen = vec![0u32; 256];
/// let report = guard.step(&mut meter, |micro| {
///     // forward + backward on samples micro.offset..micro.offset + micro.len,
///     // loss scaled by micro.loss_scale, gradients added to the accumulator
///     for sample in micro.offset..micro.offset + micro.len {
///         seen[sample] += 1;
///     }
///     Ok(())
/// })?;
/// assert!(seen.iter().all(|&n| n == 1));
/// assert_eq!(report.samples, 256);
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Guard {
    batch: usize,
    /// This rank's samples over the global batch with uneven ranks, else 1.
    share_of_global: f64,
    micro_batch: usize,
    max_micro_batch: usize,
    grow_after: Option<usize>,
    stable_steps: usize,
}

/// The samples one micro-step takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MicroBatch {
    /// Index of the first sample, within the step's samples.
    pub offset: usize,
    /// Number of samples.
    pub len: usize,
    /// `len / step samples`: multiply the micro-batch's mean loss by this
    /// (with uneven ranks, `len / global batch`: see [`Guard::new`]).
    pub loss_scale: f64,
}

/// What one guarded optimizer step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    /// Samples processed: always the step's whole batch.
    pub samples: usize,
    /// Micro-steps that succeeded.
    pub micro_steps: usize,
    /// Micro-steps that ran out of memory and were run again smaller.
    pub out_of_memory: usize,
    /// The micro-batch at the end of the step.
    pub micro_batch: usize,
    /// The step's mean loss, when the step computed it
    /// ([`TrainLoop::step`](crate::TrainLoop::step) does; [`Guard::step`] does not see losses).
    pub loss: Option<f64>,
}

impl Guard {
    /// A guard for a plan: each step has `micro_batch × accumulation_steps`
    /// samples per rank, run `micro_batch` at a time.
    ///
    /// With uneven ranks ([`Tuner::uneven_ranks`](crate::Tuner::uneven_ranks))
    /// each step has this rank's share of the global batch, and a
    /// micro-batch's `loss_scale` is its samples over the *global* batch: sum
    /// the ranks' gradients (not average) and the result is the gradient of
    /// the global mean loss.
    pub fn new(plan: &Plan) -> Result<Self, Error> {
        if let (Some(split), Some(rank)) = (&plan.ranks, plan.rank) {
            let share = split.shares.get(rank).ok_or(Error::RankOutOfRange { rank, world_size: split.world_size() })?;
            let mut guard = Self::with_batch(share.samples, share.micro_batch())?;
            guard.share_of_global = share.samples as f64 / split.global_batch as f64;
            return Ok(guard);
        }
        let batch =
            plan.micro_batch.checked_mul(plan.accumulation_steps).ok_or(Error::Overflow { value: plan.micro_batch })?;
        Self::with_batch(batch, plan.micro_batch)
    }

    /// A guard for steps of `batch` samples per rank, run `micro_batch` at a time.
    pub fn with_batch(batch: usize, micro_batch: usize) -> Result<Self, Error> {
        if batch == 0 {
            return Err(Error::Zero { setting: "batch" });
        }
        if micro_batch == 0 {
            return Err(Error::Zero { setting: "micro_batch" });
        }
        Ok(Guard {
            batch,
            share_of_global: 1.0,
            micro_batch: micro_batch.min(batch),
            max_micro_batch: micro_batch.min(batch),
            grow_after: None,
            stable_steps: 0,
        })
    }

    /// Doubles the micro-batch back (up to the first one) after `steps`
    /// optimizer steps in a row without an out-of-memory error. Default: never
    /// (as Composer), since a batch that ran out of memory once may again.
    pub fn grow_back_after(mut self, steps: usize) -> Self {
        self.grow_after = Some(steps.max(1));
        self
    }

    /// Samples per optimizer step (per rank).
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The micro-batch now.
    pub fn micro_batch(&self) -> usize {
        self.micro_batch
    }

    /// Micro-steps per optimizer step now: `⌈batch / micro_batch⌉`.
    pub fn accumulation_steps(&self) -> usize {
        self.batch.div_ceil(self.micro_batch)
    }

    /// Runs one optimizer step's micro-steps (the caller then applies the
    /// accumulated gradients). An out-of-memory micro-step is run again at
    /// half the size after `meter` releases cached memory; at a micro-batch of
    /// 1 that is [`Error::GuardExhausted`]. Any other error is returned as
    /// [`Error::Workload`], the micro-steps before it already accumulated.
    pub fn step<M, F>(&mut self, meter: &mut M, mut micro_step: F) -> Result<StepReport, Error>
    where
        M: MemoryMeter + ?Sized,
        F: FnMut(MicroBatch) -> candle_core::Result<()>,
    {
        let (mut offset, mut micro_steps, mut out_of_memory) = (0, 0, 0);
        while offset < self.batch {
            let len = self.micro_batch.min(self.batch - offset);
            let loss_scale = len as f64 / self.batch as f64 * self.share_of_global;
            let micro = MicroBatch { offset, len, loss_scale };
            match micro_step(micro) {
                Ok(()) => {
                    offset += len;
                    micro_steps += 1;
                }
                Err(err) if is_oom(&err) => {
                    out_of_memory += 1;
                    self.stable_steps = 0;
                    if let Err(release) = meter.synchronize().and_then(|()| meter.release_cached()) {
                        warn!("after an out-of-memory micro-step: {release}");
                    }
                    if len == 1 {
                        return Err(Error::GuardExhausted { offset });
                    }
                    self.micro_batch = len / 2;
                    warn!(
                        "out of memory at micro-batch {len}: running samples {offset}.. again at {}, {} micro-steps per step",
                        self.micro_batch,
                        self.accumulation_steps()
                    );
                }
                Err(source) => return Err(Error::Workload { batch: len, source }),
            }
        }
        if out_of_memory == 0 {
            self.stable_steps += 1;
            if let Some(after) = self.grow_after {
                if self.stable_steps >= after && self.micro_batch < self.max_micro_batch {
                    self.micro_batch = (2 * self.micro_batch).min(self.max_micro_batch);
                    self.stable_steps = 0;
                    info!("{after} steps without running out of memory: micro-batch back up to {}", self.micro_batch);
                }
            }
        }
        Ok(StepReport { samples: offset, micro_steps, out_of_memory, micro_batch: self.micro_batch, loss: None })
    }
}
