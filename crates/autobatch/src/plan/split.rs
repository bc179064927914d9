//! How a plan trains: one value that says the split once.

use serde::{Deserialize, Serialize};

use super::{Accumulation, RankSplit};

/// How a plan reaches its effective batch: what each rank runs per optimizer
/// step. The plan's [`micro_batch`](super::Plan::micro_batch),
/// [`accumulation_steps`](super::Plan::accumulation_steps),
/// [`world_size`](super::Plan::world_size) and
/// [`effective_batch`](super::Plan::effective_batch) are read from it.
///
/// ```
/// use autobatch::{plan::Accumulation, plan::Split};
///
/// let split = Split::Accumulated { accumulation: Accumulation::plan(268, 1, 133)?, accumulating_peak_bytes: None };
/// assert_eq!((split.accumulation_steps(), split.effective_batch()), (3, 268));
/// assert_eq!(Split::Single { micro_batch: 96, world_size: 2 }.effective_batch(), 192);
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// No target: one step of `micro_batch` (the largest batch, or the
    /// throughput choice) per optimizer step on each of `world_size` ranks.
    Single {
        /// Samples per step on each rank.
        micro_batch: usize,
        /// Number of data-parallel ranks.
        world_size: usize,
    },
    /// A target effective batch reached by accumulating micro-batches that
    /// fit on every rank alike (one micro-step when one is enough).
    Accumulated {
        /// The arithmetic: micro-batch, steps, ranks, how near the target.
        accumulation: Accumulation,
        /// When it accumulates and the workload can run an accumulating
        /// micro-step: that step's measured peak at the micro-batch, the
        /// accumulator held (the micro-batch was stepped down until it fit).
        accumulating_peak_bytes: Option<u64>,
    },
    /// The global batch shared among ranks of uneven capacity
    /// ([`Tuner::uneven_ranks`](crate::Tuner::uneven_ranks)): every rank's
    /// share, micro-steps and loss weights.
    Uneven {
        /// Every rank's share.
        ranks: RankSplit,
        /// Whether the global batch was asked for (else it is the ranks'
        /// largest batches summed).
        to_target: bool,
        /// When it accumulates: this rank's accumulating micro-step's
        /// measured peak, the accumulator held.
        accumulating_peak_bytes: Option<u64>,
    },
}

impl Split {
    /// The largest micro-batch rank `rank` runs: the same on every rank with
    /// even ranks; with uneven ranks its share's
    /// ([`RankShare::micro_batch`](crate::plan::RankShare::micro_batch)), 0 for a
    /// rank the split does not have.
    pub fn micro_batch_of(&self, rank: usize) -> usize {
        match self {
            Split::Single { micro_batch, .. } => *micro_batch,
            Split::Accumulated { accumulation, .. } => accumulation.micro_batch,
            Split::Uneven { ranks, .. } => ranks.shares.get(rank).map_or(0, |share| share.micro_batch()),
        }
    }

    /// Micro-steps accumulated per optimizer step.
    pub fn accumulation_steps(&self) -> usize {
        match self {
            Split::Single { .. } => 1,
            Split::Accumulated { accumulation, .. } => accumulation.accumulation_steps,
            Split::Uneven { ranks, .. } => ranks.accumulation_steps,
        }
    }

    /// Number of data-parallel ranks.
    pub fn world_size(&self) -> usize {
        match self {
            Split::Single { world_size, .. } => *world_size,
            Split::Accumulated { accumulation, .. } => accumulation.world_size,
            Split::Uneven { ranks, .. } => ranks.world_size(),
        }
    }

    /// Samples per optimizer step over all ranks.
    pub fn effective_batch(&self) -> usize {
        match self {
            Split::Single { micro_batch, world_size } => micro_batch.saturating_mul(*world_size),
            Split::Accumulated { accumulation, .. } => accumulation.effective_batch,
            Split::Uneven { ranks, .. } => ranks.global_batch,
        }
    }

    /// The effective batch asked for, if any.
    pub fn target_effective_batch(&self) -> Option<usize> {
        match self {
            Split::Single { .. } => None,
            Split::Accumulated { accumulation, .. } => Some(accumulation.target_effective_batch),
            Split::Uneven { ranks, to_target, .. } => to_target.then_some(ranks.target_global_batch),
        }
    }

    /// Whether the effective batch is the one asked for (true without a target).
    pub fn exact(&self) -> bool {
        match self {
            Split::Single { .. } => true,
            Split::Accumulated { accumulation, .. } => accumulation.exact,
            Split::Uneven { ranks, to_target, .. } => !to_target || ranks.exact,
        }
    }

    /// The accumulating micro-step's measured peak, when one was run.
    pub fn accumulating_peak_bytes(&self) -> Option<u64> {
        match self {
            Split::Single { .. } => None,
            Split::Accumulated { accumulating_peak_bytes, .. } | Split::Uneven { accumulating_peak_bytes, .. } => {
                *accumulating_peak_bytes
            }
        }
    }

    /// Records the accumulating micro-step's measured peak (a single step has none).
    pub(crate) fn set_accumulating_peak_bytes(&mut self, peak: Option<u64>) {
        if let Split::Accumulated { accumulating_peak_bytes, .. } | Split::Uneven { accumulating_peak_bytes, .. } = self
        {
            *accumulating_peak_bytes = peak;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{plan::Accumulation, plan::RankSplit};

    #[test]
    fn every_split_reads_its_own_arithmetic() {
        let single = Split::Single { micro_batch: 96, world_size: 4 };
        assert_eq!((single.accumulation_steps(), single.world_size(), single.effective_batch()), (1, 4, 384));
        assert_eq!((single.micro_batch_of(3), single.target_effective_batch(), single.exact()), (96, None, true));

        let accumulation = Accumulation::plan_equal(257, 1, 133, 1).unwrap();
        let accumulated = Split::Accumulated { accumulation, accumulating_peak_bytes: Some(7) };
        assert_eq!(
            (accumulated.micro_batch_of(0), accumulated.accumulation_steps(), accumulated.effective_batch()),
            (129, 2, 258)
        );
        assert_eq!((accumulated.target_effective_batch(), accumulated.exact()), (Some(257), false));
        let mut unchecked = accumulated.clone();
        unchecked.set_accumulating_peak_bytes(None);
        assert_eq!((accumulated.accumulating_peak_bytes(), unchecked.accumulating_peak_bytes()), (Some(7), None));

        let ranks = RankSplit::plan(1001, &[200, 90], 8).unwrap();
        let given = Split::Uneven { ranks: ranks.clone(), to_target: true, accumulating_peak_bytes: None };
        assert_eq!((given.world_size(), given.target_effective_batch(), given.exact()), (2, Some(1001), false));
        assert_eq!((given.micro_batch_of(0), given.micro_batch_of(1), given.micro_batch_of(2)), (176, 80, 0));
        assert!(given.micro_batch_of(0) == ranks.shares[0].larger && given.micro_batch_of(1) == ranks.shares[1].larger);
        let summed = Split::Uneven { ranks, to_target: false, accumulating_peak_bytes: None };
        assert_eq!((summed.target_effective_batch(), summed.exact()), (None, true));
    }
}
