//! One global batch over ranks of uneven capacity: each rank's share in
//! proportion to what fits on it, the global batch exact, and the loss weights
//! that keep the gradient the global mean.

use serde::{Deserialize, Serialize};

use crate::Error;

/// How one optimizer step's global batch is shared by data-parallel ranks
/// whose devices hold different batches (an 80 GB card beside a 40 GB one).
///
/// Every rank runs the same number of micro-steps, `accumulation_steps`, so
/// that the gradients are all-reduced once per optimizer step as usual; the
/// sizes of the micro-steps differ by rank (and by at most one granule within a
/// rank). The shares add up to `global_batch` exactly.
///
/// **Loss scaling.** With unequal micro-batches the mean of the ranks' mean
/// losses is not the global mean. Scale each micro-step's mean loss by
/// [`loss_weight`](Self::loss_weight) (its samples over the global batch) and
/// *sum* the gradients over ranks: the result is the gradient of the mean loss
/// over the whole global batch. Frameworks that *average* over ranks (DDP's
/// all-reduce divides by the world size) need
/// [`loss_scale_for_average`](Self::loss_scale_for_average) instead.
///
/// ```
/// use autobatch::plan::RankSplit;
///
/// // an 80 GB rank fits 200, a 40 GB one fits 90: 1000 samples per optimizer step
/// let split = RankSplit::plan(1000, &[200, 90], 1)?;
/// assert_eq!(split.accumulation_steps, 4); // ⌈1000 / 290⌉
/// assert_eq!(split.shares[0].samples + split.shares[1].samples, 1000);
/// assert_eq!(split.shares[0].samples, 690); // 1000 × 200/290 = 689.7
/// assert_eq!(split.shares[0].micro_batches().collect::<Vec<_>>(), [173, 173, 172, 172]);
/// assert_eq!(split.shares[1].micro_steps_summary(), "2 × 78 + 2 × 77");
/// let weights: f64 = (0..2).flat_map(|r| (0..4).map(move |s| (r, s))).map(|(r, s)| split.loss_weight(r, s)).sum();
/// assert!((weights - 1.0).abs() < 1e-12);
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RankSplit {
    /// The global batch asked for.
    pub target_global_batch: usize,
    /// Samples per optimizer step over all ranks: the target, or the nearest
    /// multiple of `multiple_of` above it.
    pub global_batch: usize,
    /// Micro-steps every rank runs per optimizer step.
    pub accumulation_steps: usize,
    /// The granularity every micro-step is kept to.
    pub multiple_of: usize,
    /// Whether `global_batch == target_global_batch`.
    pub exact: bool,
    /// Each rank's share, by rank.
    pub shares: Vec<RankShare>,
}

/// One rank's part of a [`RankSplit`]: `larger_steps` micro-steps of
/// `larger` samples, then `steps − larger_steps` of `smaller` (one granule
/// less), `samples` in all.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RankShare {
    /// The rank.
    pub rank: usize,
    /// The largest micro-batch that fits on it.
    pub largest_micro_batch: usize,
    /// Its samples per optimizer step.
    pub samples: usize,
    /// Where its samples start in the global batch: the ranks' samples lie in
    /// rank order, `offset..offset + samples`.
    pub offset: usize,
    /// Its micro-steps per optimizer step (the split's accumulation steps).
    pub steps: usize,
    /// How many of them, the first ones, take `larger` samples.
    pub larger_steps: usize,
    /// The larger micro-step size (`smaller` when `larger_steps` is 0): at
    /// most `largest_micro_batch`.
    pub larger: usize,
    /// The size of the other micro-steps. A rank with fewer granules than
    /// micro-steps has micro-steps of 0, which it skips (its gradient weight
    /// there is 0).
    pub smaller: usize,
}

impl RankShare {
    /// Its largest micro-step: the batch its device must hold.
    pub fn micro_batch(&self) -> usize {
        self.larger
    }

    /// The size of micro-step `step` (0 past the last).
    pub fn micro_batch_at(&self, step: usize) -> usize {
        match step {
            step if step < self.larger_steps => self.larger,
            step if step < self.steps => self.smaller,
            _ => 0,
        }
    }

    /// The sizes of its micro-steps, in order.
    pub fn micro_batches(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.steps).map(|step| self.micro_batch_at(step))
    }

    /// Its micro-steps in short: `2 × 173 + 2 × 172`.
    pub fn micro_steps_summary(&self) -> String {
        let runs = [(self.larger_steps, self.larger), (self.steps - self.larger_steps, self.smaller)];
        let parts: Vec<String> =
            runs.iter().filter(|(count, _)| *count > 0).map(|(count, size)| format!("{count} × {size}")).collect();
        parts.join(" + ")
    }

    /// The global indices of micro-step `step`'s samples (empty past the last step).
    pub fn micro_range(&self, step: usize) -> std::ops::Range<usize> {
        let step = step.min(self.steps);
        let larger = step.min(self.larger_steps);
        // within the rank's samples: no overflow
        let before = larger * self.larger + (step - larger) * self.smaller;
        let len = self.micro_batch_at(step);
        self.offset + before..self.offset + before + len
    }
}

impl RankSplit {
    /// This split when its global batch is the target, else
    /// [`Error::InexactTarget`] with the nearest global batch above, as
    /// [`Accumulation::require_exact`](crate::plan::Accumulation::require_exact) is for even ranks.
    ///
    /// ```
    /// use autobatch::plan::RankSplit;
    ///
    /// assert!(RankSplit::plan(1000, &[200, 90], 1).unwrap().require_exact().is_ok());
    /// assert!(RankSplit::plan(1001, &[200, 90], 8).unwrap().require_exact().is_err());
    /// ```
    pub fn require_exact(self) -> Result<Self, crate::Error> {
        if self.exact {
            return Ok(self);
        }
        Err(crate::Error::InexactTarget {
            target: self.target_global_batch,
            multiple_of: self.multiple_of,
            nearest: self.global_batch,
            world_size: self.shares.len(),
            accumulation_steps: self.accumulation_steps,
            largest_micro_batch: None,
        })
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.shares.len()
    }

    /// The weight of rank `rank`'s micro-step `step` when gradients are summed
    /// over ranks: its samples over the global batch (0 for a rank or step that
    /// does not exist). Multiply that micro-step's *mean* loss by it; the
    /// weights of all micro-steps of all ranks add up to 1.
    pub fn loss_weight(&self, rank: usize, step: usize) -> f64 {
        let samples = self.shares.get(rank).map_or(0, |share| share.micro_batch_at(step));
        samples as f64 / self.global_batch as f64
    }

    /// [`loss_weight`](Self::loss_weight) × world size: the factor for a mean
    /// loss when the all-reduce *averages* gradients over ranks (as DDP does).
    pub fn loss_scale_for_average(&self, rank: usize, step: usize) -> f64 {
        self.loss_weight(rank, step) * self.world_size() as f64
    }
}

impl std::fmt::Display for RankSplit {
    /// ```text
    /// global batch 1000 (target 1000, exact) over 2 ranks, 4 accumulation steps each
    /// rank 0 (fits 200): 690 samples (0..690) in micro-steps 2 × 173 + 2 × 172
    /// rank 1 (fits 90): 310 samples (690..1000) in micro-steps 2 × 78 + 2 × 77
    /// loss weights: scale each micro-step's mean loss by its samples / 1000 and sum the gradients over ranks (× 2 when the all-reduce averages)
    /// ```
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let exactness = if self.exact {
            "exact".to_owned()
        } else {
            format!(
                "{} above, the nearest multiple of {}",
                self.global_batch - self.target_global_batch,
                self.multiple_of
            )
        };
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        writeln!(
            f,
            "global batch {} (target {}, {exactness}) over {} rank{}, {} accumulation step{} each",
            self.global_batch,
            self.target_global_batch,
            self.world_size(),
            plural(self.world_size()),
            self.accumulation_steps,
            plural(self.accumulation_steps)
        )?;
        for share in &self.shares {
            // counted, not iterated: a rank can have 2^63 micro-steps
            let empty = if share.smaller == 0 { share.steps - share.larger_steps } else { 0 };
            writeln!(
                f,
                "rank {} (fits {}): {} sample{} ({}..{}) in micro-steps {}{}",
                share.rank,
                share.largest_micro_batch,
                share.samples,
                plural(share.samples),
                share.offset,
                share.offset + share.samples,
                share.micro_steps_summary(),
                match empty {
                    0 => String::new(),
                    n => format!(
                        " ({n} empty micro-step{}: fewer samples than steps; nothing to run, loss weight 0)",
                        plural(n)
                    ),
                }
            )?;
        }
        write!(
            f,
            "loss weights: scale each micro-step's mean loss by its samples / {} and sum the gradients over ranks \
             (× {} when the all-reduce averages)",
            self.global_batch,
            self.world_size()
        )
    }
}

impl RankSplit {
    /// Shares a global batch of `target_global_batch` samples per optimizer step
    /// among ranks whose largest micro-batches are `largest_micro_batches` (one per
    /// rank), in proportion to them.
    ///
    /// Works in granules of `multiple_of` samples: `G` granules of the global batch
    /// (the target rounded up; exact when `multiple_of` divides it), `Lᵣ` of rank
    /// `r`. The fewest accumulation steps is `k = ⌈G / ΣL⌉`. Rank `r` gets its
    /// proportional quota `G·Lᵣ/ΣL` rounded by largest remainder, at least one
    /// granule and at most `k·Lᵣ`, spread over its `k` micro-steps as evenly as
    /// granules allow: every micro-step fits on its rank.
    ///
    /// Errors: a zero target, granularity or rank list; a rank that cannot hold one
    /// granule ([`Error::NoCandidate`]); fewer granules than ranks
    /// ([`Error::InvalidSetting`]).
    pub fn plan(
        target_global_batch: usize,
        largest_micro_batches: &[usize],
        multiple_of: usize,
    ) -> Result<RankSplit, Error> {
        let target = target_global_batch;
        for (setting, value) in [
            (crate::Setting::TargetGlobalBatch, target),
            (crate::Setting::MultipleOf, multiple_of),
            (crate::Setting::Ranks, largest_micro_batches.len()),
        ] {
            if value == 0 {
                return Err(Error::zero(setting));
            }
        }
        let world_size = largest_micro_batches.len();
        let capacity: Vec<u128> = largest_micro_batches.iter().map(|&l| (l / multiple_of) as u128).collect();
        if let Some(rank) = capacity.iter().position(|&c| c == 0) {
            return Err(Error::NoCandidate { start: 1, max_batch: largest_micro_batches[rank], multiple_of });
        }
        let granules = target.div_ceil(multiple_of) as u128;
        if granules < world_size as u128 {
            world_size.checked_mul(multiple_of).ok_or_else(|| {
                Error::batch_overflow(
                    world_size,
                    &[crate::Setting::TargetGlobalBatch, crate::Setting::Ranks, crate::Setting::MultipleOf],
                )
            })?;
            return Err(Error::target_below_ranks(
                (crate::Setting::TargetGlobalBatch, crate::Setting::Ranks),
                target,
                world_size,
                multiple_of,
            ));
        }
        let total: u128 = capacity.iter().sum();
        let steps = granules.div_ceil(total);
        let samples = apportion(granules, &capacity, steps);

        let mut offset = 0;
        let mut shares = Vec::with_capacity(world_size);
        for (rank, (&granted, &largest)) in samples.iter().zip(largest_micro_batches).enumerate() {
            let (base, extra) = (granted / steps, granted % steps);
            // each micro-step ≤ ⌈granted / steps⌉ ≤ capacity, since granted ≤ steps·capacity;
            // granted ≤ ⌈target / multiple_of⌉: only a target within a granule of usize::MAX overflows
            let overflow = || {
                Error::batch_overflow(
                    target,
                    &[crate::Setting::TargetGlobalBatch, crate::Setting::Ranks, crate::Setting::MultipleOf],
                )
            };
            let granules = |count: u128| (count as usize).checked_mul(multiple_of).ok_or_else(overflow);
            let rank_samples = granules(granted)?;
            shares.push(RankShare {
                rank,
                largest_micro_batch: largest,
                samples: rank_samples,
                offset,
                steps: steps as usize,
                larger_steps: extra as usize,
                // with no step larger than the rest, `larger` is their size too
                larger: granules(base + u128::from(extra > 0))?,
                smaller: granules(base)?,
            });
            offset = offset.checked_add(rank_samples).ok_or_else(overflow)?;
        }
        Ok(RankSplit {
            target_global_batch: target,
            global_batch: offset,
            accumulation_steps: steps as usize,
            multiple_of,
            exact: offset == target,
            shares,
        })
    }
}

/// `granules` shared in proportion to `capacity` (largest remainder), each
/// share in `[1, steps·capacity]`. Needs `ranks ≤ granules ≤ steps·Σcapacity`.
fn apportion(granules: u128, capacity: &[u128], steps: u128) -> Vec<u128> {
    let total: u128 = capacity.iter().sum();
    let cap = |rank: usize| steps.saturating_mul(capacity[rank]);
    // (granules and capacities are at most usize::MAX: their product fits in 128 bits)
    let mut shares: Vec<u128> =
        capacity.iter().map(|&c| (granules * c / total).clamp(1, steps.saturating_mul(c))).collect();
    // a share's surplus over its quota `granules·c / total` (positive: above),
    // ordered exactly with no product of `total`: whole granules first, then
    // the quota's fraction (a larger remainder, a smaller surplus)
    let surplus = |rank: usize, share: u128| {
        let quota = granules * capacity[rank];
        (share as i128 - (quota / total) as i128, std::cmp::Reverse(quota % total))
    };
    let mut granted: u128 = shares.iter().sum();
    // the floors leave fewer than `ranks` granules over, the clamp to 1 at most
    // `ranks` too many: a few passes of one granule each
    while granted < granules {
        let rank = (0..shares.len())
            .filter(|&r| shares[r] < cap(r))
            .min_by_key(|&r| surplus(r, shares[r]))
            .expect("Σ steps·capacity ≥ granules leaves room");
        shares[rank] += 1;
        granted += 1;
    }
    while granted > granules {
        let rank = (0..shares.len())
            .filter(|&r| shares[r] > 1)
            .max_by_key(|&r| (surplus(r, shares[r]), std::cmp::Reverse(r)))
            .expect("granules ≥ ranks leaves a share above 1");
        shares[rank] -= 1;
        granted -= 1;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the command-line fuzz test: the largest-remainder comparison
    /// once multiplied a share by the capacities' total past 128 bits.
    #[test]
    fn capacities_near_usize_max_share_without_overflow() {
        let split = RankSplit::plan(usize::MAX, &[2, usize::MAX], 1).unwrap();
        let samples: Vec<usize> = split.shares.iter().map(|share| share.samples).collect();
        assert_eq!(samples, [2, usize::MAX - 2], "in proportion: rank 0's quota is just under 2 samples");
        assert!(split.exact && split.global_batch == usize::MAX);
        let split = RankSplit::plan(usize::MAX, &[usize::MAX, usize::MAX], 1).unwrap();
        assert_eq!(split.shares[0].samples + split.shares[1].samples, usize::MAX);
        assert!(split.shares[0].samples.abs_diff(split.shares[1].samples) <= 1);
    }

    #[test]
    fn equal_ranks_split_evenly() {
        let split = RankSplit::plan(512, &[100, 100, 100, 100], 1).unwrap();
        assert_eq!(split.accumulation_steps, 2);
        for share in &split.shares {
            assert_eq!(share.micro_batches().collect::<Vec<_>>(), [64, 64]);
        }
        assert!(split.exact);
    }

    #[test]
    fn a_global_batch_that_does_not_divide_is_still_exact() {
        // 1001 over capacities 3:1 → quotas 750.75 and 250.25
        let split = RankSplit::plan(1001, &[300, 100], 1).unwrap();
        assert_eq!(split.accumulation_steps, 3);
        assert_eq!((split.shares[0].samples, split.shares[1].samples), (751, 250));
        assert_eq!(split.shares[0].micro_batches().collect::<Vec<_>>(), [251, 250, 250]);
        assert_eq!(split.shares[1].micro_batches().collect::<Vec<_>>(), [84, 83, 83]);
        assert_eq!((split.shares[1].offset, split.shares[1].micro_range(1)), (751, 835..918));
        assert_eq!(split.global_batch, 1001);
    }

    #[test]
    fn granules_round_the_global_batch_up_and_say_so() {
        let split = RankSplit::plan(100, &[64, 32], 8).unwrap();
        assert_eq!(split.global_batch, 104);
        assert!(!split.exact);
        for share in &split.shares {
            assert!(share.micro_batches().all(|m| m % 8 == 0 && m <= share.largest_micro_batch));
        }
    }

    #[test]
    fn a_tiny_rank_still_gets_a_granule() {
        let split = RankSplit::plan(10, &[1000, 1], 1).unwrap();
        assert_eq!((split.shares[0].samples, split.shares[1].samples), (9, 1));
    }

    #[test]
    fn more_micro_steps_than_samples_leaves_empty_steps() {
        let split = RankSplit::plan(3, &[1, 1], 1).unwrap();
        assert_eq!(split.accumulation_steps, 2);
        assert_eq!(split.shares[0].micro_batches().collect::<Vec<_>>(), [1, 1]);
        assert_eq!(split.shares[1].micro_batches().collect::<Vec<_>>(), [1, 0]);
        assert_eq!(split.shares[1].micro_steps_summary(), "1 × 1 + 1 × 0");
        assert_eq!(split.loss_weight(1, 1), 0.0);
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(matches!(
            RankSplit::plan(0, &[1], 1),
            Err(Error::InvalidSetting {
                setting: crate::Setting::TargetGlobalBatch,
                value: crate::Value::Count(0),
                ..
            })
        ));
        assert!(matches!(
            RankSplit::plan(8, &[], 1),
            Err(Error::InvalidSetting { setting: crate::Setting::Ranks, value: crate::Value::Count(0), .. })
        ));
        assert!(matches!(
            RankSplit::plan(8, &[8], 0),
            Err(Error::InvalidSetting { setting: crate::Setting::MultipleOf, value: crate::Value::Count(0), .. })
        ));
        assert!(matches!(RankSplit::plan(64, &[16, 4], 8), Err(Error::NoCandidate { max_batch: 4, .. })));
        let below = RankSplit::plan(2, &[8, 8, 8], 1).unwrap_err();
        assert!(below.to_string().ends_with("= 3: every rank needs at least one micro-batch"), "{below}");
    }

    #[test]
    fn a_huge_number_of_micro_steps_costs_nothing() {
        let split = RankSplit::plan(usize::MAX, &[1, 1], 1).unwrap();
        assert_eq!(split.accumulation_steps, usize::MAX / 2 + 1);
        assert_eq!(split.shares[1].micro_steps_summary(), format!("{} × 1 + 1 × 0", usize::MAX / 2));
        assert_eq!(split.shares[1].micro_range(usize::MAX / 2), usize::MAX..usize::MAX);
        assert_eq!((split.shares[0].larger, split.shares[0].smaller, split.shares[0].larger_steps), (1, 1, 0));
    }

    #[test]
    fn huge_batches_do_not_overflow() {
        let split = RankSplit::plan(usize::MAX / 2, &[usize::MAX / 8, 1 << 40], 1).unwrap();
        assert_eq!(split.shares.iter().map(|s| s.samples as u128).sum::<u128>(), (usize::MAX / 2) as u128);
    }
}
