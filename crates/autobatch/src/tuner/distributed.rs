//! Several data-parallel ranks agree on one batch.

use super::Settings;
use crate::collective::Collective;
use crate::plan::Distributed;
use crate::plan::{RankSplit, TrialKind};
use crate::{Error, MemoryMeter, Plan, Workload, plan::Split};

/// What each rank reports about the agreed batch; the all-reduced minimum is
/// what every rank then acts on (one failure outranks everything).
const FAILED_HERE: u64 = 0;
const DOES_NOT_FIT_HERE: u64 = 1;
const FITS_HERE: u64 = 2;

/// Rounds of agree → verify → search below before giving up: each round that
/// fails moves every rank's bound down, and mixed devices settle in one or two.
const AGREEMENT_ROUNDS: usize = 4;

impl Settings {
    /// [`Search::run`](crate::Search::run) with these settings.
    pub(super) fn run_distributed<W, M, C, O>(
        &self,
        workload: &mut W,
        meter: &mut M,
        collective: &C,
        observer: &mut O,
    ) -> Result<Plan, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
        C: crate::collective::Collective + ?Sized,
        O: super::Observer + ?Sized,
    {
        let world_size = collective.world_size();
        if self.options.world_size != 1 && self.options.world_size != world_size {
            return Err(Error::invalid(
                crate::Setting::WorldSize,
                crate::Value::Count(self.options.world_size),
                format!("the collective has {world_size} ranks: leave it unset for a search across ranks"),
            ));
        }
        let local = self.single_rank();
        // the collective's lazily allocated buffers are held from the first
        // measured step on, as they will be in training
        let profile = self.options.profile.clone().or_else(|| workload.profile());
        let gradient_bytes = profile.map_or(0, |p| p.parameters.saturating_mul(p.precision.weight_bytes()));
        collective.warm_up(gradient_bytes)?;
        let mut result = local.search(workload, meter, observer);
        if self.options.uneven_ranks {
            return self.share_unevenly(result, workload, meter, collective);
        }
        // A few rounds: agree on the smallest answer; every rank that has not
        // seen it fit runs it; when one fails there, all search below it.
        for _ in 0..AGREEMENT_ROUNDS {
            let mine = result.as_ref().map_or(0, |plan| plan.largest_batch as u64);
            let agreed = collective.all_reduce_min(mine)? as usize;
            let mut plan = match (result, agreed) {
                (Err(err), _) => return Err(err),
                (Ok(_), 0) => return Err(Error::RankFailed),
                (Ok(plan), _) => plan,
            };
            let verified = local.fits_here(&mut plan, agreed, workload, meter);
            let status = match verified {
                Ok(true) => FITS_HERE,
                Ok(false) => DOES_NOT_FIT_HERE,
                Err(_) => FAILED_HERE,
            };
            let everywhere = collective.all_reduce_min(status)?;
            verified?;
            if everywhere == FAILED_HERE {
                return Err(Error::RankFailed);
            }
            if everywhere == FITS_HERE {
                return self.settle(plan, agreed, workload, meter, collective);
            }
            // some rank cannot run the agreed batch: everyone searches below it
            let below = agreed.saturating_sub(self.options.multiple_of);
            result = if below < self.options.start {
                Err(Error::RankFailed)
            } else {
                local.up_to(below).search(workload, meter, observer)
            };
        }
        Err(Error::Collective(format!("the ranks did not agree on a batch in {AGREEMENT_ROUNDS} rounds")))
    }

    /// Whether `agreed` fits on this rank: as its own search saw it, or by a
    /// trial run here (kept in `plan`, its peak the plan's when it fits).
    fn fits_here<W, M>(&self, plan: &mut Plan, agreed: usize, workload: &mut W, meter: &mut M) -> Result<bool, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
    {
        if let Some(seen) = plan.trials.iter().rev().find(|t| t.batch == agreed) {
            return Ok(seen.outcome.fits());
        }
        let trial = self.single_trial(workload, meter, agreed, TrialKind::Search)?;
        let fits = trial.outcome.fits();
        if fits {
            plan.peak_bytes = trial.peak_bytes.unwrap_or(plan.peak_bytes);
        }
        plan.trials.push(trial);
        Ok(fits)
    }

    /// The plan at the batch every rank agreed on and ran: its peak there,
    /// this rank's own answer kept beside it, the accumulation planned for
    /// the collective's world size.
    fn settle<W, M, C>(
        &self,
        mut plan: Plan,
        agreed: usize,
        workload: &mut W,
        meter: &mut M,
        collective: &C,
    ) -> Result<Plan, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
        C: Collective + ?Sized,
    {
        if let Some(trial) = plan.trials.iter().rev().find(|t| t.batch == agreed) {
            plan.peak_bytes = trial.peak_bytes.unwrap_or(plan.peak_bytes);
        }
        plan.distributed = Some(Distributed { rank: collective.rank(), rank_largest_batch: plan.largest_batch });
        plan.largest_batch = agreed;
        self.across(collective.world_size()).agree_on_accumulation(&mut plan, workload, meter, collective)?;
        Ok(plan)
    }

    /// The uneven form of [`across`](crate::Search::across), after
    /// the local run: share, verify the accumulating micro-steps, share again
    /// while some rank's does not fit.
    fn share_unevenly<W, M, C>(
        &self,
        result: Result<Plan, Error>,
        workload: &mut W,
        meter: &mut M,
        collective: &C,
    ) -> Result<Plan, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
        C: Collective + ?Sized,
    {
        let mine = result.as_ref().map_or(0, |plan| plan.micro_batch() as u64);
        let everyone_tuned = collective.all_reduce_min(mine)? != 0;
        let mut plan = result?;
        if !everyone_tuned {
            return Err(Error::RankFailed);
        }
        let rank = collective.rank();
        // with the throughput objective the local micro-batch is the chosen one
        let mut capacity = plan.micro_batch();
        // the largest micro-batch seen to fit with the accumulator held: smaller ones need no new check
        let mut accumulating_fits = 0;
        for _ in 0..AGREEMENT_ROUNDS {
            let capacities: Vec<usize> =
                collective.all_gather(capacity as u64)?.into_iter().map(|c| c as usize).collect();
            let target = match self.options.target_effective_batch {
                Some(target) => target,
                None => capacities.iter().try_fold(0usize, |sum, &c| sum.checked_add(c)).ok_or_else(|| {
                    Error::batch_overflow(capacity, &[crate::Setting::WorldSize, crate::Setting::MaxBatch])
                })?,
            };
            // every rank computes the same split from the same numbers: an error is everyone's
            let mut split = RankSplit::plan(target, &capacities, self.options.multiple_of)?;
            if self.options.exact_effective_batch {
                split = split.require_exact()?;
            }
            let micro = split.shares[rank].micro_batch();
            let steps = split.accumulation_steps;
            let (fits, everywhere) =
                self.check_everywhere(workload, meter, collective, &mut plan, (micro, steps), &mut accumulating_fits)?;
            if fits != micro {
                // only what did not fit lowers the capacity: a share that fit says nothing of the rest
                capacity = fits;
            }
            if everywhere == FITS_HERE {
                plan.distributed = Some(Distributed { rank, rank_largest_batch: plan.largest_batch });
                // the last accumulating micro-step seen to fit here (this rank's share or a larger one)
                let checked = plan.trials.iter().rev().find(|t| t.kind == TrialKind::Accumulation && t.outcome.fits());
                let accumulating_peak_bytes =
                    checked.and_then(|t| t.peak_bytes).filter(|_| split.accumulation_steps > 1);
                let to_target = self.options.target_effective_batch.is_some();
                plan.split = Split::Uneven { ranks: split, to_target, accumulating_peak_bytes };
                return Ok(plan);
            }
        }
        Err(Error::Collective(format!("the ranks did not share the global batch in {AGREEMENT_ROUNDS} rounds")))
    }

    /// The agreed batch's accumulation: every rank plans the same split from
    /// the same cap; when it accumulates, every rank checks the micro-step with
    /// the accumulator held, and when one does not fit, all plan again from
    /// the smallest capacity any rank found.
    fn agree_on_accumulation<W, M, C>(
        &self,
        plan: &mut Plan,
        workload: &mut W,
        meter: &mut M,
        collective: &C,
    ) -> Result<(), Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
        C: Collective + ?Sized,
    {
        let mut cap = Self::cap(plan);
        let mut accumulating_fits = 0;
        for _ in 0..AGREEMENT_ROUNDS {
            self.apply_split(plan, cap)?;
            let (micro, steps) = (plan.micro_batch(), plan.accumulation_steps());
            let (fits, everywhere) =
                self.check_everywhere(workload, meter, collective, plan, (micro, steps), &mut accumulating_fits)?;
            if everywhere == FITS_HERE {
                return Ok(());
            }
            // a rank that fits keeps the cap; one that does not offers what it found
            let mine = if fits == micro { cap } else { fits };
            cap = collective.all_reduce_min(mine as u64)? as usize;
        }
        Err(Error::Collective(format!(
            "the ranks did not agree on an accumulating micro-batch in {AGREEMENT_ROUNDS} rounds"
        )))
    }

    /// Checks this rank's accumulating micro-step at `micro` when the plan
    /// takes `steps` > 1 of them and the workload can (a micro-batch up to
    /// `seen_fit`, already seen to fit, passes unchecked), and tells every
    /// rank how it went. Returns what fits here (`micro`, or the lower
    /// capacity the check found) and the worst status over the ranks; when
    /// any rank failed, this rank's own error or [`Error::RankFailed`].
    fn check_everywhere<W, M, C>(
        &self,
        workload: &mut W,
        meter: &mut M,
        collective: &C,
        plan: &mut Plan,
        (micro, steps): (usize, usize),
        seen_fit: &mut usize,
    ) -> Result<(usize, u64), Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
        C: Collective + ?Sized,
    {
        let verified = if steps > 1 && workload.can_accumulate() && micro > *seen_fit {
            self.accumulating_capacity(workload, meter, plan, micro)
        } else {
            Ok(micro)
        };
        let status = match verified {
            Ok(fits) if fits == micro => FITS_HERE,
            Ok(_) => DOES_NOT_FIT_HERE,
            Err(_) => FAILED_HERE,
        };
        let everywhere = collective.all_reduce_min(status)?;
        let fits = verified?;
        if everywhere == FAILED_HERE {
            return Err(Error::RankFailed);
        }
        if fits == micro && steps > 1 {
            *seen_fit = (*seen_fit).max(micro);
        }
        Ok((fits, everywhere))
    }
}
