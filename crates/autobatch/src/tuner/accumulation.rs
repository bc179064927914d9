//! Plans that accumulate, checked with the accumulator held when the plan was
//! not derived by a search that checked it: a cached plan asked for another
//! target, the batch several ranks agreed on, an uneven rank's share.

use log::info;

use super::Settings;
use crate::plan::TrialKind;
use crate::{Error, MemoryMeter, Plan, Workload};

/// Rounds of split → check → lower before giving up: each failed check lowers
/// the cap by what the measured overshoot says, so one or two settle it.
const CHECK_ROUNDS: usize = 6;

/// What `plan`'s trials showed of the accumulating micro-step: the largest
/// micro-batch seen to fit with the accumulator held, and the smallest seen
/// not to.
fn accumulation_seen(plan: &Plan) -> (usize, Option<usize>) {
    let checks = plan.trials.iter().filter(|t| t.kind == TrialKind::Accumulation);
    let fits = checks.clone().filter(|t| t.outcome.fits()).map(|t| t.batch).max().unwrap_or(0);
    let fails = checks.filter(|t| !t.outcome.fits()).map(|t| t.batch).min();
    (fits, fails)
}

impl Settings {
    /// Runs the accumulating micro-step at `micro` (one trial, the
    /// accumulator held): `micro` when it fits, else a smaller capacity from
    /// how far over the ceiling it went and the plan's bytes per sample. The
    /// trial goes into the plan either way: a re-plan later knows what fit
    /// with the accumulator and what did not.
    pub(super) fn accumulating_capacity<W, M>(
        &self,
        workload: &mut W,
        meter: &mut M,
        plan: &mut Plan,
        micro: usize,
    ) -> Result<usize, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
    {
        let trial = self.single_trial(workload, meter, micro, TrialKind::Accumulation)?;
        plan.trials.push(trial.clone());
        if trial.outcome.fits() {
            plan.split.set_accumulating_peak_bytes(trial.peak_bytes);
            return Ok(micro);
        }
        let per_sample = plan.memory_model.as_ref().map_or(0.0, |model| model.bytes_per_sample_at(micro));
        let over = trial.peak_bytes.map_or(0, |peak| peak.saturating_sub(plan.limit_bytes()));
        match super::step_down(micro, over, per_sample, self.options.multiple_of)
            .filter(|&lower| lower >= self.options.start.max(self.options.multiple_of))
        {
            Some(lower) => {
                info!("accumulating at micro-batch {micro} does not fit: sharing again with at most {lower}");
                Ok(lower)
            }
            None => {
                let device = (plan.capacity_bytes(), plan.limit_bytes(), plan.ceiling().fraction());
                Err(Error::nothing_fits_at(micro, trial.outcome, trial.peak_bytes, device))
            }
        }
    }

    /// Sets `plan`'s split from `cap` (this tuner's target and world size),
    /// lowering the cap until the accumulating micro-step fits, when the split
    /// accumulates and the workload can run that step. What the plan's trials
    /// already showed is not run again: a micro-batch no larger than one that
    /// fit with the accumulator passes, one no smaller than one that did not
    /// lowers the cap at once.
    pub(super) fn verified_replan<W, M>(
        &self,
        plan: &mut Plan,
        mut cap: usize,
        workload: &mut W,
        meter: &mut M,
    ) -> Result<(), Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
    {
        let too_small = |plan: &Plan, batch: usize| {
            let device = (plan.capacity_bytes(), plan.limit_bytes(), plan.ceiling().fraction());
            Error::nothing_fits_at(batch, crate::search::Outcome::OverCeiling, None, device)
        };
        for _ in 0..CHECK_ROUNDS {
            self.apply_split(plan, cap)?;
            let micro = plan.micro_batch();
            if plan.accumulation_steps() <= 1 || !workload.can_accumulate() {
                return Ok(());
            }
            let (fits, fails) = accumulation_seen(plan);
            if micro <= fits {
                return Ok(());
            }
            if let Some(failed) = fails.filter(|&failed| micro >= failed) {
                let below = failed - failed % self.options.multiple_of;
                let below = if below == failed { below.saturating_sub(self.options.multiple_of) } else { below };
                if below < self.options.start.max(self.options.multiple_of) {
                    return Err(too_small(plan, micro));
                }
                cap = below;
                continue;
            }
            let fits = self.accumulating_capacity(workload, meter, plan, micro)?;
            if fits == micro {
                return Ok(());
            }
            cap = fits;
        }
        Err(too_small(plan, plan.micro_batch()))
    }
}
