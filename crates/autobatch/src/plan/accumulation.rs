//! Gradient accumulation arithmetic: micro-batch × steps × ranks = effective batch.

use serde::{Deserialize, Serialize};

use crate::Error;

/// How to reach a target effective batch with micro-batches that fit.
///
/// Each rank runs `accumulation_steps` micro-steps per optimizer step: the
/// first of `micro_batch` samples, the last `smaller_steps` of one granule
/// (`multiple_of`) less, so that `samples_per_rank() × world_size =
/// effective_batch` and `micro_batch ≤ largest_micro_batch`. With equal
/// micro-batches (`smaller_steps` 0) that is `micro_batch × accumulation_steps
/// × world_size`. Micro-batches that differ by a granule reach the target
/// exactly in the fewest steps wherever the ranks and the granule divide it
/// (52 + 4 × 51 = 256 in 5 steps where equal ones need 8 of 32); each
/// micro-step's mean loss is then weighted by its share of the rank's samples
/// ([`MicroBatch::loss_scale`](crate::MicroBatch::loss_scale)), so that the
/// gradient is the one of the whole batch. When `exact` is false the effective
/// batch is the nearest one above the target that `k₀` accumulation steps allow,
/// and `deviation` and `lr_scale` say by how much and what would compensate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Accumulation {
    /// The effective (global) batch asked for.
    pub target_effective_batch: usize,
    /// Samples per micro-step on each rank: the largest micro-step, the one
    /// the device must hold.
    pub micro_batch: usize,
    /// Micro-steps accumulated per optimizer step.
    pub accumulation_steps: usize,
    /// How many of the micro-steps, the last ones, take `multiple_of` samples
    /// fewer than `micro_batch`: 0 for equal micro-batches.
    #[serde(default)]
    pub smaller_steps: usize,
    /// Number of data-parallel ranks.
    pub world_size: usize,
    /// `samples_per_rank() × world_size`.
    pub effective_batch: usize,
    /// The largest micro-batch that fits (the search result).
    pub largest_micro_batch: usize,
    /// The granularity micro-batches are kept to.
    pub multiple_of: usize,
    /// Whether `effective_batch == target_effective_batch`.
    pub exact: bool,
    /// `effective_batch − target_effective_batch` (never negative).
    pub deviation: usize,
    /// Learning-rate factor that compensates the deviation under the linear
    /// scaling rule (`effective / target`; 1.0 when exact). For Adam-style
    /// optimizers the square-root rule, `lr_scale.sqrt()`, is the usual choice.
    pub lr_scale: f64,
}

impl Accumulation {
    /// The size of micro-step `step` on each rank (0 past the last).
    ///
    /// ```
    /// use autobatch::plan::Accumulation;
    ///
    /// // 256 samples where 57 fit: 5 micro-steps, not 8 of 32
    /// let split = Accumulation::plan(256, 1, 57)?;
    /// assert_eq!(split.micro_batches().collect::<Vec<_>>(), [52, 51, 51, 51, 51]);
    /// assert_eq!((split.micro_batch_at(0), split.micro_batch_at(4), split.micro_batch_at(5)), (52, 51, 0));
    /// assert_eq!(split.micro_steps_summary(), "1 × 52 + 4 × 51");
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn micro_batch_at(&self, step: usize) -> usize {
        match step {
            step if step + self.smaller_steps < self.accumulation_steps => self.micro_batch,
            step if step < self.accumulation_steps => self.micro_batch - self.multiple_of,
            _ => 0,
        }
    }

    /// The sizes of a rank's micro-steps, in order.
    pub fn micro_batches(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.accumulation_steps).map(|step| self.micro_batch_at(step))
    }

    /// Whether every micro-step takes `micro_batch` samples.
    pub fn equal_micro_batches(&self) -> bool {
        self.smaller_steps == 0
    }

    /// Samples per optimizer step on each rank.
    pub fn samples_per_rank(&self) -> usize {
        self.effective_batch / self.world_size
    }

    /// A rank's micro-steps in short: `1 × 52 + 4 × 51`, or `8 × 32`.
    pub fn micro_steps_summary(&self) -> String {
        let larger = self.accumulation_steps - self.smaller_steps;
        let runs =
            [(larger, self.micro_batch), (self.smaller_steps, self.micro_batch.saturating_sub(self.multiple_of))];
        let parts: Vec<String> =
            runs.iter().filter(|(count, _)| *count > 0).map(|(count, size)| format!("{count} × {size}")).collect();
        parts.join(" + ")
    }

    /// Turns an inexact split into [`Error::InexactTarget`], for callers
    /// that must train at exactly the target.
    ///
    /// ```
    /// use autobatch::plan::Accumulation;
    /// assert!(Accumulation::plan(268, 1, 133).unwrap().require_exact().is_ok());
    /// // two ranks cannot share 257 samples alike
    /// assert!(Accumulation::plan(257, 2, 133).unwrap().require_exact().is_err());
    /// ```
    pub fn require_exact(self) -> Result<Self, Error> {
        if self.exact {
            return Ok(self);
        }
        Err(Error::InexactTarget {
            target: self.target_effective_batch,
            multiple_of: self.multiple_of,
            nearest: self.effective_batch,
            world_size: self.world_size,
            accumulation_steps: self.accumulation_steps,
            largest_micro_batch: Some(self.largest_micro_batch),
        })
    }
}

impl Accumulation {
    /// Splits a target effective batch over `world_size` ranks with micro-batches of
    /// at most `largest_micro_batch`, in the fewest accumulation steps.
    ///
    /// With `k₀ = ⌈E / (W·m*)⌉` the fewest accumulation steps, `k₀`
    /// micro-steps that differ by at most one sample reach the nearest
    /// effective batch at or above `E` that `W` ranks can share alike: `E`
    /// itself where `W` divides it, else the next multiple of `W`, said so
    /// (equal micro-steps where `k₀` divides the rank's samples). With
    /// [`plan_equal`](Self::plan_equal), equal micro-batches: the smallest `k`
    /// in `[k₀, 2·k₀]` that `W·k` divides, or `k₀` steps and the nearest
    /// effective batch above `E`, said so.
    ///
    /// ```
    /// use autobatch::plan::Accumulation;
    ///
    /// let split = Accumulation::plan(268, 1, 133)?;
    /// assert_eq!((split.micro_batch, split.accumulation_steps, split.exact), (90, 3, true));
    /// assert_eq!(split.micro_steps_summary(), "1 × 90 + 2 × 89");
    ///
    /// let split = Accumulation::plan(257, 2, 133)?; // two ranks cannot share 257 samples alike
    /// assert_eq!((split.micro_batch, split.accumulation_steps), (129, 1));
    /// assert_eq!((split.effective_batch, split.deviation), (258, 1));
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn plan(
        target_effective_batch: usize,
        world_size: usize,
        largest_micro_batch: usize,
    ) -> Result<Accumulation, Error> {
        Accumulation::plan_aligned(target_effective_batch, world_size, largest_micro_batch, 1)
    }

    /// [`Accumulation::plan`] with micro-batches kept to multiples of `multiple_of`
    /// (e.g. 8 for tensor cores), differing by at most one multiple. Exactness
    /// then needs `W·multiple_of` to divide the target; where it does not, the
    /// split reaches the next multiple of `W·multiple_of` in the same fewest
    /// steps (543 over 4 ranks in multiples of 8 where 37 fit: 544, in 5 steps).
    ///
    /// ```
    /// use autobatch::plan::Accumulation;
    ///
    /// let split = Accumulation::plan_aligned(1024, 4, 100, 8)?;
    /// assert_eq!((split.micro_batch, split.accumulation_steps, split.world_size), (88, 3, 4));
    /// assert_eq!(split.micro_steps_summary(), "2 × 88 + 1 × 80"); // 256 samples a rank
    ///
    /// let split = Accumulation::plan_aligned(543, 4, 37, 8)?;
    /// assert_eq!((split.effective_batch, split.accumulation_steps, split.deviation), (544, 5, 1));
    /// assert_eq!(split.micro_steps_summary(), "2 × 32 + 3 × 24"); // 136 samples a rank
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn plan_aligned(
        target_effective_batch: usize,
        world_size: usize,
        largest_micro_batch: usize,
        multiple_of: usize,
    ) -> Result<Accumulation, Error> {
        Accumulation::plan_as(target_effective_batch, world_size, largest_micro_batch, multiple_of, false)
    }

    /// [`Accumulation::plan_aligned`] with equal micro-batches only: more
    /// steps where micro-batches that differ would reach the target in fewer
    /// (for a loop that cannot weight its micro-steps' losses).
    ///
    /// ```
    /// use autobatch::plan::Accumulation;
    ///
    /// let split = Accumulation::plan_equal(256, 1, 57, 1)?;
    /// assert_eq!((split.micro_batch, split.accumulation_steps, split.exact), (32, 8, true));
    /// assert!(split.equal_micro_batches());
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn plan_equal(
        target_effective_batch: usize,
        world_size: usize,
        largest_micro_batch: usize,
        multiple_of: usize,
    ) -> Result<Accumulation, Error> {
        Accumulation::plan_as(target_effective_batch, world_size, largest_micro_batch, multiple_of, true)
    }

    fn plan_as(
        target_effective_batch: usize,
        world_size: usize,
        largest_micro_batch: usize,
        multiple_of: usize,
        equal: bool,
    ) -> Result<Accumulation, Error> {
        let target = target_effective_batch;
        for (setting, value) in [
            (crate::Setting::TargetEffectiveBatch, target),
            (crate::Setting::WorldSize, world_size),
            (crate::Setting::LargestMicroBatch, largest_micro_batch),
            (crate::Setting::MultipleOf, multiple_of),
        ] {
            if value == 0 {
                return Err(Error::zero(setting));
            }
        }
        let largest = largest_micro_batch - largest_micro_batch % multiple_of;
        if largest == 0 {
            return Err(Error::NoCandidate { start: 1, max_batch: largest_micro_batch, multiple_of });
        }
        let unit = world_size.checked_mul(multiple_of).ok_or_else(|| {
            Error::batch_overflow(
                world_size,
                &[crate::Setting::TargetEffectiveBatch, crate::Setting::LargestMicroBatch, crate::Setting::WorldSize],
            )
        })?;
        if target < unit {
            return Err(Error::target_below_ranks(
                (crate::Setting::TargetEffectiveBatch, crate::Setting::WorldSize),
                target,
                world_size,
                multiple_of,
            ));
        }
        // k₀ = ⌈E / (W·m*)⌉; W·m* may overflow only when one step already holds the target.
        let min_steps = match world_size.checked_mul(largest) {
            Some(per_step) => target.div_ceil(per_step),
            None => 1,
        };

        if !equal {
            // micro-batches that differ by a granule reach every whole number of
            // granules per rank from k₀ to k₀·m*/g in k₀ steps: the nearest
            // effective batch at or above the target is the next multiple of W·g
            let reachable = target.div_ceil(unit).checked_mul(unit).ok_or_else(|| {
                Error::batch_overflow(
                    target,
                    &[crate::Setting::TargetEffectiveBatch, crate::Setting::WorldSize, crate::Setting::MultipleOf],
                )
            })?;
            let split = balanced(reachable, world_size, largest_micro_batch, multiple_of, min_steps);
            return Ok(Accumulation {
                target_effective_batch: target,
                exact: reachable == target,
                deviation: reachable - target,
                lr_scale: reachable as f64 / target as f64,
                ..split
            });
        }
        let exact_steps = fewest_exact_steps(target, unit, min_steps);
        let (micro_batch, accumulation_steps) = match exact_steps {
            Some(steps) => (target / (world_size * steps), steps),
            None => {
                let per_step = world_size.checked_mul(min_steps).ok_or_else(|| {
                    Error::batch_overflow(
                        target,
                        &[
                            crate::Setting::TargetEffectiveBatch,
                            crate::Setting::LargestMicroBatch,
                            crate::Setting::WorldSize,
                        ],
                    )
                })?;
                let per_rank = target.div_ceil(per_step);
                (per_rank.next_multiple_of(multiple_of), min_steps)
            }
        };
        let effective_batch = micro_batch
            .checked_mul(accumulation_steps)
            .and_then(|samples| samples.checked_mul(world_size))
            .ok_or_else(|| {
                Error::batch_overflow(
                    target,
                    &[
                        crate::Setting::TargetEffectiveBatch,
                        crate::Setting::LargestMicroBatch,
                        crate::Setting::WorldSize,
                    ],
                )
            })?;
        debug_assert!(micro_batch <= largest && effective_batch >= target);
        Ok(Accumulation {
            target_effective_batch: target,
            micro_batch,
            accumulation_steps,
            smaller_steps: 0,
            world_size,
            effective_batch,
            largest_micro_batch,
            multiple_of,
            exact: effective_batch == target,
            deviation: effective_batch - target,
            lr_scale: effective_batch as f64 / target as f64,
        })
    }
}

/// `target`, a multiple of `W·g`, exactly in `steps` micro-steps per rank that
/// differ by one granule `g` at most: `r` steps of `(q + 1)·g` and `steps − r`
/// of `q·g`, for the rank's `q·steps + r` granules. With `steps = k₀ = ⌈E /
/// (W·m*)⌉` and `target` the first multiple of `W·g` at or above `E` (at most
/// `k₀·W·m*`, itself such a multiple), `q ≥ 1` and `q + 1 ≤ m*/g` wherever
/// `r > 0`: every micro-step fits.
fn balanced(target: usize, world_size: usize, largest: usize, g: usize, steps: usize) -> Accumulation {
    let granules = target / (world_size * g);
    let (whole, rest) = (granules / steps, granules % steps);
    let micro_batch = (whole + usize::from(rest > 0)) * g;
    debug_assert!(target.is_multiple_of(world_size * g) && whole >= 1 && micro_batch <= largest);
    Accumulation {
        target_effective_batch: target,
        micro_batch,
        accumulation_steps: steps,
        smaller_steps: if rest > 0 { steps - rest } else { 0 },
        world_size,
        effective_batch: target,
        largest_micro_batch: largest,
        multiple_of: g,
        exact: true,
        deviation: 0,
        lr_scale: 1.0,
    }
}

/// The smallest `k` in `[k₀, 2·k₀]` such that `unit·k` divides `target`, where
/// `unit = W·g`. Looks at whichever is shorter: the candidate steps `k`, or the
/// candidate quotients `target / (unit·k)`; either way `O(√(target/unit))` at most.
fn fewest_exact_steps(target: usize, unit: usize, min_steps: usize) -> Option<usize> {
    if !target.is_multiple_of(unit) {
        return None;
    }
    let units = target / unit; // exact k are the divisors of `units`
    let max_steps = min_steps.saturating_mul(2).min(units);
    if min_steps > max_steps {
        return None;
    }
    let steps_range = max_steps - min_steps;
    let (quotient_low, quotient_high) = (units.div_ceil(max_steps), units / min_steps);
    if steps_range <= quotient_high.saturating_sub(quotient_low) {
        (min_steps..=max_steps).find(|&k| units.is_multiple_of(k))
    } else {
        // the smallest k is the largest quotient q = units / k
        (quotient_low..=quotient_high).rev().find(|&q| units.is_multiple_of(q)).map(|q| units / q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn design_examples() {
        let split = Accumulation::plan_equal(268, 1, 133, 1).unwrap();
        assert_eq!((split.micro_batch, split.accumulation_steps, split.effective_batch), (67, 4, 268));
        assert!(split.exact);
        assert_eq!(split.lr_scale, 1.0);

        let split = Accumulation::plan_equal(257, 1, 133, 1).unwrap();
        assert_eq!((split.micro_batch, split.accumulation_steps, split.effective_batch), (129, 2, 258));
        assert!(!split.exact);
        assert_eq!(split.deviation, 1);
        assert_eq!(split.lr_scale, 258.0 / 257.0);

        // micro-batches that differ by one: the same targets in fewer steps, exactly
        let split = Accumulation::plan(268, 1, 133).unwrap();
        assert_eq!((split.micro_batch, split.accumulation_steps, split.smaller_steps), (90, 3, 2));
        let split = Accumulation::plan(257, 1, 133).unwrap();
        assert_eq!(split.micro_batches().collect::<Vec<_>>(), [129, 128]);
        assert!(split.exact && split.lr_scale == 1.0);
        // the issue's case: 57 fit, 256 wanted
        let split = Accumulation::plan(256, 1, 57).unwrap();
        assert_eq!((split.micro_batch, split.accumulation_steps, split.samples_per_rank()), (52, 5, 256));
    }

    #[test]
    fn one_step_when_the_target_fits_in_one_micro_batch_per_rank() {
        let split = Accumulation::plan(256, 8, 64).unwrap();
        assert_eq!((split.micro_batch, split.accumulation_steps, split.effective_batch), (32, 1, 256));
    }

    #[test]
    fn prefers_exactness_up_to_twice_the_fewest_steps() {
        // k₀ = ⌈96 / 40⌉ = 3 and 3 divides 96: 32 × 3.
        assert_eq!(Accumulation::plan(96, 1, 40).unwrap().accumulation_steps, 3);
        assert!(Accumulation::plan(96, 1, 40).unwrap().equal_micro_batches());
        // k₀ = ⌈98 / 40⌉ = 3; 98 = 2·7²: no divisor in [3, 6] → inexact with 3 steps.
        let split = Accumulation::plan_equal(98, 1, 40, 1).unwrap();
        assert_eq!((split.micro_batch, split.accumulation_steps, split.effective_batch), (33, 3, 99));
        // k₀ = ⌈98 / 20⌉ = 5; 7 divides 98 and lies in [5, 10].
        let split = Accumulation::plan_equal(98, 1, 20, 1).unwrap();
        assert_eq!((split.micro_batch, split.accumulation_steps), (14, 7));
        // differing by one: 98 in k₀ steps either way
        assert_eq!(Accumulation::plan(98, 1, 40).unwrap().micro_steps_summary(), "2 × 33 + 1 × 32");
        assert_eq!(Accumulation::plan(98, 1, 20).unwrap().micro_steps_summary(), "3 × 20 + 2 × 19");
    }

    #[test]
    fn aligned_micro_batches_are_multiples_of_the_granularity() {
        let split = Accumulation::plan_aligned(1000, 2, 100, 8).unwrap();
        assert!(split.micro_batches().all(|m| m % 8 == 0 && m <= 96));
        // 1000 is not a multiple of 2·8: never exact; 1008 is the next one, in the fewest steps
        assert!(!split.exact);
        assert_eq!((split.micro_batch, split.accumulation_steps, split.effective_batch), (88, 6, 1008));
        assert_eq!(split.micro_steps_summary(), "3 × 88 + 3 × 80");
        // equal micro-batches cannot: 6 × 88 a rank
        let equal = Accumulation::plan_equal(1000, 2, 100, 8).unwrap();
        assert_eq!((equal.micro_batch, equal.accumulation_steps, equal.effective_batch), (88, 6, 1056));
    }

    #[test]
    fn zero_and_inconsistent_inputs_are_errors() {
        let zero = |result: Result<Accumulation, Error>| match result {
            Err(Error::InvalidSetting { setting: name, value: crate::Value::Count(0), .. }) => name,
            other => panic!("{other:?}"),
        };
        assert_eq!(zero(Accumulation::plan(0, 1, 8)), crate::Setting::TargetEffectiveBatch);
        assert_eq!(zero(Accumulation::plan(8, 0, 8)), crate::Setting::WorldSize);
        assert_eq!(zero(Accumulation::plan(8, 1, 0)), crate::Setting::LargestMicroBatch);
        assert_eq!(zero(Accumulation::plan_aligned(8, 1, 8, 0)), crate::Setting::MultipleOf);
        assert!(matches!(
            Accumulation::plan(3, 4, 8),
            Err(Error::InvalidSetting { value: crate::Value::Count(3), .. })
        ));
        let below = Accumulation::plan(3, 4, 8).unwrap_err().to_string();
        assert!(
            below.starts_with("Tuner::target_effective_batch is 3: it must be at least 4 ranks (Tuner::world_size)"),
            "{below}"
        );
        assert!(matches!(
            Accumulation::plan_aligned(64, 1, 7, 8),
            Err(Error::NoCandidate { max_batch: 7, multiple_of: 8, .. })
        ));
    }

    #[test]
    fn require_exact_reports_the_nearest_possible_batch() {
        let err = Accumulation::plan_equal(257, 1, 133, 1).unwrap().require_exact().unwrap_err();
        assert!(matches!(err, Error::InexactTarget { target: 257, nearest: 258, largest_micro_batch: Some(133), .. }));
        assert!(err.to_string().contains("258"), "{err}");
    }

    #[test]
    fn an_inexact_target_names_twice_the_fewest_steps_as_its_bound() {
        // equal micro-batches miss a target W·g divides within 2·k₀ steps
        for (target, world_size, largest, granule) in [(98, 1, 40, 1), (196, 2, 40, 1), (294, 1, 120, 3)] {
            let split = Accumulation::plan_equal(target, world_size, largest, granule).unwrap();
            let err = split.clone().require_exact().unwrap_err();
            let bound = format!("equal micro-batches that are multiples of Tuner::multiple_of {granule}");
            assert!(err.to_string().contains(&bound), "{bound} in {err}");
            let bound = format!("at most {} accumulation steps", 2 * split.accumulation_steps);
            assert!(err.to_string().contains(&bound), "{bound} in {err}");
            assert!(Accumulation::plan_aligned(target, world_size, largest, granule).unwrap().exact);
        }
    }

    #[test]
    fn a_target_the_ranks_and_granule_do_not_divide_says_so_in_any_number_of_steps() {
        for (target, world_size, largest, granule) in
            [(257, 2, 133, 1), (1001, 4, 100, 8), (999, 2, 7, 3), (usize::MAX - 1, 3, usize::MAX / 2, 1)]
        {
            let split = Accumulation::plan_aligned(target, world_size, largest, granule).unwrap();
            assert_eq!(split.effective_batch, target.div_ceil(world_size * granule) * world_size * granule);
            let err = split.clone().require_exact().unwrap_err().to_string();
            let unit = world_size * granule;
            assert!(err.contains(&format!("so the effective batch is a multiple of {unit}")), "{err}");
            assert!(err.contains(&format!("the nearest above is {}", split.effective_batch)), "{err}");
        }
    }

    #[test]
    fn the_issues_targets_reach_the_nearest_batch_in_the_fewest_steps() {
        // issue 84: equal micro-batches overshot to 640, 270 and 12
        for (target, world_size, largest, granule, nearest, steps) in
            [(543, 4, 37, 8, 544, 5), (256, 1, 57, 3, 258, 5), (9, 2, 4, 1, 10, 2)]
        {
            let split = Accumulation::plan_aligned(target, world_size, largest, granule).unwrap();
            assert_eq!((split.effective_batch, split.accumulation_steps), (nearest, steps), "{target}");
            assert_eq!(split.micro_batches().sum::<usize>() * world_size, nearest);
        }
    }

    #[test]
    fn huge_targets_do_not_overflow_or_hang() {
        let split = Accumulation::plan(usize::MAX / 2, 3, usize::MAX / 4).unwrap();
        assert!(split.micro_batch <= usize::MAX / 4);
        let split = Accumulation::plan(1 << 60, 1, 1).unwrap();
        assert_eq!((split.micro_batch, split.accumulation_steps), (1, 1 << 60));
    }
}
