//! The runtime guard of a training loop: micro-batches with accumulation that
//! survive an out-of-memory error without changing the effective batch.

use log::{info, warn};

use crate::{Error, MemoryMeter, Plan, is_oom, plan::RankShare};

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
/// let plan = Tuner::new().target_effective_batch(256).search(&mut workload, &mut meter).run()?;
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
    /// The batch a micro-step's loss scale divides by: `batch`, or the global
    /// batch with uneven ranks.
    denominator: usize,
    /// With uneven ranks: this rank's micro-steps as the plan splits them,
    /// followed while the micro-batch is the plan's.
    schedule: Option<RankShare>,
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
    /// Number of samples: 0 for an empty micro-step (see [`Guard::new`]).
    pub len: usize,
    /// `len / step samples`: multiply the micro-batch's mean loss by this
    /// (with uneven ranks, `len / global batch`, the split's
    /// [`loss_weight`](crate::plan::RankSplit::loss_weight): see [`Guard::new`]).
    pub loss_scale: f64,
}

impl MicroBatch {
    /// The first `len` samples, unscaled: what a probe's loss closure is
    /// given at batch `len` (a step of that many samples, in one micro-step).
    ///
    /// ```
    /// let micro = autobatch::MicroBatch::of(8);
    /// assert_eq!((micro.offset, micro.len, micro.loss_scale), (0, 8, 1.0));
    /// ```
    pub fn of(len: usize) -> MicroBatch {
        MicroBatch { offset: 0, len, loss_scale: 1.0 }
    }

    /// Whether it takes no sample (an uneven rank's micro-step past its
    /// samples): there is nothing to compute, and its loss scale is 0.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// What one guarded optimizer step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    /// Samples processed: always the step's whole batch.
    pub samples: usize,
    /// Micro-steps that succeeded, empty ones included.
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
    /// samples per rank, run `micro_batch` at a time; with micro-batches that
    /// differ by a granule ([`Accumulation`](crate::plan::Accumulation)), the
    /// plan's micro-steps in order, each `loss_scale` its samples over the
    /// rank's.
    ///
    /// With uneven ranks ([`Tuner::uneven_ranks`](crate::Tuner::uneven_ranks))
    /// each step runs exactly this rank's share of the plan's split
    /// ([`RankShare`]): the same micro-steps, in the same order and sizes
    /// (`share.micro_batches()`), each with `loss_scale` =
    /// [`split.loss_weight(rank, step)`](crate::plan::RankSplit::loss_weight), its
    /// samples over the *global* batch: sum the ranks' gradients (not
    /// average) and the result is the gradient of the global mean loss. Every
    /// rank then runs the same number of micro-steps. A rank with fewer
    /// samples than micro-steps has empty ones at the end: the guard still
    /// calls the micro-step with `len` 0 and `loss_scale` 0 so that the count
    /// matches, and the micro-step should do nothing
    /// ([`MicroBatch::is_empty`]), or, where the all-reduce runs inside the
    /// backward pass, a step whose loss is multiplied by 0, so that this rank
    /// joins it. After an out-of-memory error the rest of the step runs in
    /// micro-batches of half the size (more micro-steps on this rank only);
    /// the plan's split is followed again once the micro-batch grows back.
    pub fn new(plan: &Plan) -> Result<Self, Error> {
        if let (Some(split), Some(rank)) = (&plan.ranks(), plan.rank()) {
            let share = split.shares.get(rank).ok_or_else(|| {
                Error::invalid(
                    crate::Setting::Rank,
                    crate::Value::Count(rank),
                    format!("the plan's split has ranks 0..{}", split.world_size()),
                )
            })?;
            // (a rank may have no sample at all: then every micro-step is empty)
            let micro_batch = share.micro_batch().max(1);
            return Ok(Guard {
                batch: share.samples,
                denominator: split.global_batch,
                schedule: Some(share.clone()),
                micro_batch,
                max_micro_batch: micro_batch,
                grow_after: None,
                stable_steps: 0,
            });
        }
        if let Some(split) = plan.accumulation().filter(|split| !split.equal_micro_batches()) {
            // micro-steps that differ by a granule: each weighted by its share of the rank's samples
            let samples = split.samples_per_rank();
            let share = RankShare {
                rank: 0,
                largest_micro_batch: split.largest_micro_batch,
                samples,
                offset: 0,
                steps: split.accumulation_steps,
                larger_steps: split.accumulation_steps - split.smaller_steps,
                larger: split.micro_batch,
                smaller: split.micro_batch - split.multiple_of,
            };
            return Ok(Guard {
                batch: samples,
                denominator: samples,
                schedule: Some(share),
                micro_batch: split.micro_batch,
                max_micro_batch: split.micro_batch,
                grow_after: None,
                stable_steps: 0,
            });
        }
        let batch = plan.micro_batch().checked_mul(plan.accumulation_steps()).ok_or_else(|| {
            Error::batch_overflow(plan.micro_batch(), &[crate::Setting::MicroBatch, crate::Setting::AccumulationSteps])
        })?;
        Self::with_batch(batch, plan.micro_batch())
    }

    /// A guard for steps of `batch` samples per rank, run `micro_batch` at a time.
    pub fn with_batch(batch: usize, micro_batch: usize) -> Result<Self, Error> {
        if batch == 0 {
            return Err(Error::zero(crate::Setting::Batch));
        }
        if micro_batch == 0 {
            return Err(Error::zero(crate::Setting::MicroBatch));
        }
        Ok(Guard {
            batch,
            denominator: batch,
            schedule: None,
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

    /// Micro-steps per optimizer step now: the plan's (with uneven ranks,
    /// empty ones included), or `⌈batch / micro_batch⌉` after an
    /// out-of-memory error lowered the micro-batch.
    pub fn accumulation_steps(&self) -> usize {
        match self.following() {
            Some(share) => share.steps,
            None => self.batch.div_ceil(self.micro_batch),
        }
    }

    /// The plan's micro-steps for this rank, while the micro-batch is the plan's.
    fn following(&self) -> Option<&RankShare> {
        self.schedule.as_ref().filter(|_| self.micro_batch >= self.max_micro_batch)
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
        // the plan's micro-steps while none has run out of memory, else
        // chunks of the (lowered) micro-batch
        let mut schedule = self.following().cloned();
        loop {
            let len = match &schedule {
                Some(share) if micro_steps < share.steps => share.micro_batch_at(micro_steps),
                Some(_) => break,
                None if offset < self.batch => self.micro_batch.min(self.batch - offset),
                None => break,
            };
            let loss_scale = len as f64 / self.denominator as f64;
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
                    if len <= 1 {
                        return Err(Error::GuardExhausted { offset });
                    }
                    self.micro_batch = len / 2;
                    schedule = None;
                    warn!(
                        "out of memory at micro-batch {len}: running samples {offset}.. again at {}, {} micro-steps per step",
                        self.micro_batch,
                        self.accumulation_steps()
                    );
                }
                Err(source) => return Err(Error::workload(len, source)),
            }
        }
        if out_of_memory == 0 {
            self.stable_steps += 1;
            if let Some(after) = self.grow_after
                && self.stable_steps >= after
                && self.micro_batch < self.max_micro_batch
            {
                self.micro_batch = (2 * self.micro_batch).min(self.max_micro_batch);
                self.stable_steps = 0;
                info!("{after} steps without running out of memory: micro-batch back up to {}", self.micro_batch);
            }
        }
        Ok(StepReport { samples: offset, micro_steps, out_of_memory, micro_batch: self.micro_batch, loss: None })
    }
}
