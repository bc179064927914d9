//! Property tests for every invariant of the search and the accumulation arithmetic.

use autobatch::memory::simulated::{MemoryCurve, Simulation};
use autobatch::search::{Observation, SearchSpace};
use autobatch::{Error, Tuner, plan::Accumulation, plan::RankSplit, search::Outcome, search::Strategy};
use proptest::prelude::*;
use proptest::strategy::Strategy as _;

/// Runs a strategy to the end against an outcome function; panics on a repeat.
fn search(strategy: Strategy, space: &SearchSpace, outcome: impl Fn(usize) -> Outcome) -> Vec<Observation> {
    let mut history: Vec<Observation> = Vec::new();
    while let Some(batch) = strategy.next_batch(space, &history) {
        assert!(history.iter().all(|o| o.batch != batch), "batch {batch} proposed twice");
        assert!(space.contains(batch), "batch {batch} is outside {space:?}");
        assert!(history.len() < 10_000, "search does not end");
        history.push(Observation { batch, outcome: outcome(batch), peak_bytes: None });
    }
    history
}

fn search_with_peaks(
    strategy: Strategy,
    space: &SearchSpace,
    measure: impl Fn(usize) -> (Outcome, Option<u64>),
) -> Vec<Observation> {
    let mut history: Vec<Observation> = Vec::new();
    while let Some(batch) = strategy.next_batch(space, &history) {
        assert!(history.iter().all(|o| o.batch != batch), "batch {batch} proposed twice");
        assert!(space.contains(batch), "batch {batch} is outside {space:?}");
        assert!(history.len() < 10_000, "search does not end");
        let (outcome, peak_bytes) = measure(batch);
        history.push(Observation { batch, outcome, peak_bytes });
    }
    history
}

/// A monotone memory curve: affine + quadratic, plus per-batch noise smaller
/// than one sample's bytes, rounded up to allocator granules, with a real
/// out-of-memory error from some batch on.
#[derive(Clone, Debug)]
struct Curve {
    fixed: u64,
    per_sample: u64,
    quadratic: u64,
    noise: u64,
    seed: u64,
    granule: u64,
    oom_from: Option<usize>,
    limit: u64,
}

impl Curve {
    fn peak(&self, b: usize) -> u64 {
        let b64 = b as u64;
        let noise =
            if self.noise == 0 { 0 } else { (b64 ^ self.seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) % self.noise };
        let raw = self
            .fixed
            .saturating_add(self.per_sample.saturating_mul(b64))
            .saturating_add(self.quadratic.saturating_mul(b64).saturating_mul(b64))
            .saturating_add(noise);
        raw.div_ceil(self.granule).saturating_mul(self.granule)
    }

    fn measure(&self, b: usize) -> (Outcome, Option<u64>) {
        let peak = self.peak(b);
        if self.oom_from.is_some_and(|from| b >= from) {
            (Outcome::OutOfMemory, Some(peak.min(self.limit + self.limit / 8)))
        } else if peak <= self.limit {
            (Outcome::Fits, Some(peak))
        } else {
            (Outcome::OverCeiling, Some(peak))
        }
    }
}

fn curve_strategy() -> impl proptest::strategy::Strategy<Value = Curve> {
    (
        0u64..(8 << 30),
        1u64..(64 << 20),
        prop_oneof![Just(0u64), 1u64..100, 1u64..50_000],
        0.0f64..1.0,
        any::<u64>(),
        prop_oneof![Just(1u64), Just(2 << 20), 1u64..(4 << 20)],
        prop::option::of(1usize..20_000),
        (1u64 << 30)..(160u64 << 30),
    )
        .prop_map(|(fixed, per_sample, quadratic, noise_share, seed, granule, oom_from, limit)| Curve {
            fixed,
            per_sample,
            quadratic,
            noise: (per_sample as f64 * noise_share) as u64,
            seed,
            granule,
            oom_from,
            limit,
        })
}

fn threshold(largest_fit: usize) -> impl Fn(usize) -> Outcome {
    move |b| if b <= largest_fit { Outcome::Fits } else { Outcome::OverCeiling }
}

fn ceil_log2(x: usize) -> u32 {
    x.next_power_of_two().trailing_zeros()
}

fn space_strategy() -> impl proptest::strategy::Strategy<Value = (usize, Option<usize>, usize)> {
    (1usize..200, prop::option::of(1usize..100_000), 1usize..64)
        .prop_filter_map("valid space", |(start, max, g)| SearchSpace::new(start, max, g).ok().map(|_| (start, max, g)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// On a monotone curve, Binary returns exactly the largest fitting candidate,
    /// within 2·⌈log2(b*/g)⌉ + 3 trials.
    #[test]
    fn binary_is_exact_on_monotone_curves((start, max, g) in space_strategy(), truth in 0usize..200_000) {
        let space = SearchSpace::new(start, max, g).unwrap();
        let history = search(Strategy::Binary, &space, threshold(truth));
        let expected = (space.first()..=space.last().min(truth)).rev().find(|b| b % g == 0);
        let found = Observation::best(&history).map(|o| o.batch);
        prop_assert_eq!(found, expected);
        if let Some(found) = found {
            let bound = 2 * ceil_log2(found / g) as usize + 3;
            prop_assert!(history.len() <= bound, "{} trials for b* = {found}, g = {g}: bound {bound}", history.len());
        } else {
            prop_assert_eq!(history.len(), 1, "nothing fits is known after the first candidate");
        }
    }

    /// Whatever the outcomes (non-monotone, random), a strategy never returns a
    /// failing or untried batch, never tries a batch twice, never leaves the space.
    #[test]
    fn never_returns_a_failing_or_untried_batch(
        (start, max, g) in space_strategy(),
        seed in any::<u64>(),
        fit_share in 0u64..=100,
        strategy in prop_oneof![Just(Strategy::Binary), Just(Strategy::Power), Just(Strategy::Predictive)],
        peak_seed in any::<u64>(),
    ) {
        let space = SearchSpace::new(start, max, g).unwrap().with_limit(1 << 40);
        let outcome = |b: usize| {
            let h = (b as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33;
            match h % 100 {
                x if x < fit_share => Outcome::Fits,
                x if x % 2 == 0 => Outcome::OutOfMemory,
                _ => Outcome::OverCeiling,
            }
        };
        // peaks that agree with nothing in particular, to feed Predictive's model garbage
        let peak = |b: usize| Some((b as u64 ^ peak_seed).wrapping_mul(0x2545_F491_4F6C_DD1D) >> 23);
        let history = search_with_peaks(strategy, &space, |b| (outcome(b), peak(b)));
        if let Some(found) = Observation::best(&history) {
            prop_assert_eq!(found.outcome, Outcome::Fits);
            prop_assert!(history.iter().any(|o| o.batch == found.batch));
            prop_assert!(found.batch <= space.last());
            prop_assert!(max.is_none_or(|m| found.batch <= m));
        }
    }

    /// Predictive returns exactly what Binary returns on monotone curves
    /// (affine, quadratic, stepped, noisy, OOM below the ceiling), never a
    /// failing batch, within the space; and usually in far fewer trials.
    #[test]
    fn predictive_returns_what_binary_returns(curve in curve_strategy(), (start, max, g) in space_strategy()) {
        let space = SearchSpace::new(start, max, g).unwrap().with_limit(curve.limit);
        let binary = search_with_peaks(Strategy::Binary, &space, |b| curve.measure(b));
        let predictive = search_with_peaks(Strategy::Predictive, &space, |b| curve.measure(b));
        let answer = |h: &[Observation]| Observation::best(h).map(|o| o.batch);
        prop_assert_eq!(answer(&predictive), answer(&binary), "{:?}", curve);
        if let Some(found) = Observation::best(&predictive) {
            prop_assert!(curve.peak(found.batch) <= curve.limit);
            // bisection is the fallback: never much worse than Binary
            prop_assert!(predictive.len() <= binary.len() + 6, "{} vs {} trials", predictive.len(), binary.len());
        }
    }

    /// Started from a hint, with or without the slope expected there (right or
    /// off by up to threefold), Predictive returns what Binary returns.
    #[test]
    fn a_hinted_search_returns_what_binary_returns(
        curve in curve_strategy(),
        (start, max, g) in space_strategy(),
        hint in 1usize..50_000,
        slope_share in prop_oneof![Just(None), (0.33f64..3.0).prop_map(Some)],
    ) {
        let plain = SearchSpace::new(start, max, g).unwrap().with_limit(curve.limit);
        let mut hinted = plain.with_hint(hint);
        if let Some(share) = slope_share {
            hinted = hinted.with_hint_slope(curve.per_sample as f64 * share);
        }
        let binary = search_with_peaks(Strategy::Binary, &plain, |b| curve.measure(b));
        let predictive = search_with_peaks(Strategy::Predictive, &hinted, |b| curve.measure(b));
        prop_assert_eq!(Observation::best(&predictive).map(|o| o.batch), Observation::best(&binary).map(|o| o.batch), "{:?}", curve);
    }

    /// Power returns the largest fitting first·2^j (g·2^j from start 1).
    #[test]
    fn power_returns_the_largest_fitting_power_of_two(g in 1usize..64, max in prop::option::of(1usize..100_000), truth in 0usize..200_000) {
        prop_assume!(SearchSpace::new(1, max, g).is_ok());
        let space = SearchSpace::new(1, max, g).unwrap();
        let history = search(Strategy::Power, &space, threshold(truth));
        let limit = truth.min(space.last());
        let expected = (0..40).map(|j| g << j).take_while(|&b| b <= limit).last();
        prop_assert_eq!(Observation::best(&history).map(|o| o.batch), expected);
    }

    /// The whole tuner on simulated affine, quadratic and rounded curves with
    /// other processes on the device: exactly the brute-force answer, under the
    /// ceiling, never above max_batch.
    #[test]
    fn tuner_matches_brute_force_on_simulated_curves(
        capacity_mib in 1_000u64..100_000,
        fixed_share in 0.0f64..0.6,
        other_share in 0.0f64..0.2,
        per_sample_kib in 64u64..50_000,
        quadratic_bytes in prop_oneof![Just(0u64), 1u64..20_000],
        rounding in prop_oneof![Just(1u64), Just(2 << 20), 1u64..5_000_000],
        ceiling in 0.3f64..=1.0,
        g in prop_oneof![Just(1usize), Just(8), 1usize..17],
        max in prop::option::of(1usize..3000),
        predictive in any::<bool>(),
    ) {
        let capacity = capacity_mib << 20;
        let fixed = (capacity as f64 * fixed_share) as u64;
        let curve = MemoryCurve::quadratic(fixed, per_sample_kib << 10, quadratic_bytes);
        let sim = Simulation::new(capacity, curve).rounding(rounding).other_process((capacity as f64 * other_share) as u64);
        let strategy = if predictive { Strategy::Predictive } else { Strategy::Binary };
        let mut tuner = Tuner::new().ceiling(ceiling).multiple_of(g).strategy(strategy);
        if let Some(max) = max {
            prop_assume!(max >= g);
            tuner = tuner.max_batch(max);
        }
        let space = SearchSpace::new(1, max, g).unwrap();
        let truth = sim.true_largest(ceiling, &space, 1 << 20);
        let (mut workload, mut meter) = sim.clone().build();
        match (tuner.search(&mut workload, &mut meter).run(), truth) {
            (Ok(plan), Some(truth)) => {
                prop_assert_eq!(plan.largest_batch(), truth);
                prop_assert!(plan.peak_bytes() <= plan.limit_bytes());
                prop_assert!(max.is_none_or(|m| plan.largest_batch() <= m));
                // proven exactly when the next batch up is a candidate (and was seen not to fit)
                prop_assert_eq!(plan.proven_largest(), truth < space.last());
                let stopped = (truth == space.last()).then_some(autobatch::plan::SearchLimit::MaxBatch { max_batch: space.last() });
                prop_assert_eq!(plan.stopped_by(), stopped.as_ref());
                if plan.proven_largest() {
                    prop_assert!(plan.trials().iter().any(|t| t.batch == truth + g && !t.outcome.fits()));
                }
                prop_assert!(plan.warnings().is_empty());
            }
            (Err(Error::NothingFits { batch, capacity_bytes, .. }), None) => {
                prop_assert_eq!(batch, g);
                prop_assert_eq!(capacity_bytes, capacity);
            }
            (result, truth) => prop_assert!(false, "tuner {:?} but brute force {:?}", result.map(|p| p.largest_batch()), truth),
        }
    }

    /// A device that runs out of memory below the ceiling, read as a pool reads
    /// it (a failed step holds the allocations before its failing one): the
    /// tuner returns exactly the brute-force answer, proven by a failure at the
    /// next candidate, in no more steps than Binary takes plus four.
    #[test]
    fn tuner_is_exact_when_the_device_runs_out_below_the_ceiling(
        per_sample_kib in 1_024u64..50_000,
        fixed_share in 0.0f64..0.5,
        resident in any::<bool>(),
        quadratic_bytes in prop_oneof![Just(0u64), 1u64..20_000],
        allocations in prop_oneof![Just(64u64), 1u64..2_000],
        oom_share in 0.05f64..1.0,
        rounding in prop_oneof![Just(1u64), Just(2 << 20)],
        noise_share in prop_oneof![Just(0.0f64), 0.0f64..1.0],
        seed in any::<u64>(),
        g in prop_oneof![Just(1usize), Just(8), 1usize..17],
    ) {
        let capacity = 80u64 << 30;
        let fixed = (capacity as f64 * fixed_share) as u64;
        let curve = MemoryCurve::quadratic(fixed, per_sample_kib << 10, quadratic_bytes);
        let space = SearchSpace::new(1, None, g).unwrap();
        let Some(ceiling_batch) = Simulation::new(capacity, curve.clone()).true_largest(0.9, &space, 100_000) else {
            return Ok(());
        };
        let oom_from = ((ceiling_batch as f64 * oom_share) as usize).max(1);
        let noise = ((per_sample_kib << 10) as f64 * noise_share) as u64;
        let mut sim = Simulation::new(capacity, curve)
            .rounding(rounding)
            .noise(noise, seed)
            .allocations(allocations)
            .oom_from(oom_from);
        if resident {
            sim = sim.resident(fixed);
        }
        let truth = sim.true_largest(0.9, &space, 100_000);
        let (mut workload, mut meter) = sim.clone().build();
        let (mut binary_workload, mut binary_meter) = sim.build();
        let tuner = Tuner::new().multiple_of(g);
        let binary = tuner.clone().strategy(Strategy::Binary).search(&mut binary_workload, &mut binary_meter).run();
        match (tuner.search(&mut workload, &mut meter).run(), truth) {
            (Ok(plan), Some(truth)) => {
                prop_assert_eq!(plan.largest_batch(), truth);
                prop_assert!(plan.proven_largest());
                prop_assert!(plan.trials().iter().any(|t| t.batch == truth + g && !t.outcome.fits()));
                let binary_steps = binary.map(|p| p.trials().len()).unwrap_or(usize::MAX);
                prop_assert!(plan.trials().len() <= binary_steps + 4, "{} vs Binary's {}: {:?}", plan.trials().len(), binary_steps, plan.trials().iter().map(|t| (t.batch, t.outcome)).collect::<Vec<_>>());
            }
            (Err(Error::NothingFits { .. }), None) => {}
            (result, truth) => prop_assert!(false, "tuner {:?} but brute force {:?}", result.map(|p| p.largest_batch()), truth),
        }
    }

    /// Noise and blips make curves non-monotone: the answer still fits as measured.
    #[test]
    fn tuner_is_safe_on_noisy_and_blipped_curves(
        noise_mib in 0u64..200,
        seed in any::<u64>(),
        blips in prop::collection::vec((1usize..600, 1u64..4_000), 0..6),
        oom_from in prop::option::of(1usize..600),
    ) {
        let mut sim = Simulation::new(16 << 30, MemoryCurve::affine(2 << 30, 30 << 20)).noise(noise_mib << 20, seed);
        for (batch, extra_mib) in blips {
            sim = sim.blip(batch, extra_mib << 20);
        }
        if let Some(b) = oom_from {
            sim = sim.oom_from(b);
        }
        let (mut workload, mut meter) = sim.build();
        match Tuner::new().search(&mut workload, &mut meter).run() {
            Ok(plan) => {
                let chosen = plan.trials().iter().rev().find(|t| t.batch == plan.largest_batch()).unwrap();
                prop_assert_eq!(chosen.outcome, Outcome::Fits);
                prop_assert_eq!(chosen.peak_bytes, Some(plan.peak_bytes()));
                prop_assert!(plan.peak_bytes() <= plan.limit_bytes());
                prop_assert!(oom_from.is_none_or(|b| plan.largest_batch() < b));
            }
            // blips and noise stay far below the ceiling at batch 1: only a real OOM there leaves nothing
            Err(Error::NothingFits { batch: 1, .. }) => prop_assert_eq!(oom_from, Some(1)),
            Err(other) => prop_assert!(false, "unexpected error {other}"),
        }
    }

    /// Micro-batches that differ (the default): the rank's micro-steps add up
    /// to effective / W ≥ target, each fits (≤ largest, a multiple of g, at
    /// least g) and they differ by one granule at most; the effective batch is
    /// the first multiple of W·g at or above the target (the target itself
    /// where W·g divides it), reached in k₀ steps, the fewest any split can
    /// take, and never in more steps than equal micro-batches take.
    #[test]
    fn accumulation_arithmetic(target in 1usize..1_000_000, world in 1usize..=8, largest in 1usize..5_000, g in prop_oneof![Just(1usize), Just(8), 1usize..16]) {
        let (Ok(split), Ok(equal)) =
            (Accumulation::plan_aligned(target, world, largest, g), Accumulation::plan_equal(target, world, largest, g))
        else {
            prop_assert_eq!(
                Accumulation::plan_aligned(target, world, largest, g).is_err(),
                Accumulation::plan_equal(target, world, largest, g).is_err()
            );
            return Ok(());
        };
        let usable = largest - largest % g;
        let sizes: Vec<usize> = split.micro_batches().collect();
        prop_assert_eq!(sizes.len(), split.accumulation_steps);
        prop_assert_eq!(sizes.iter().sum::<usize>() * world, split.effective_batch);
        prop_assert_eq!(split.samples_per_rank() * world, split.effective_batch);
        prop_assert!(split.effective_batch >= target);
        prop_assert!(sizes.iter().all(|&m| m >= g && m <= usable && m % g == 0), "{sizes:?}");
        prop_assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= g, "{sizes:?}");
        prop_assert_eq!(split.micro_batch, sizes[0]);
        prop_assert!(split.accumulation_steps <= equal.accumulation_steps);
        let k0 = target.div_ceil(world * usable);
        prop_assert_eq!(split.accumulation_steps, k0);
        prop_assert_eq!(split.effective_batch, target.div_ceil(world * g) * world * g);
        prop_assert!(split.effective_batch <= equal.effective_batch || equal.accumulation_steps > k0);
        prop_assert_eq!(split.exact, split.effective_batch == target);
        prop_assert_eq!(split.deviation, split.effective_batch - target);
    }

    /// The default split against every split there is, enumerated: each rank
    /// runs the same number of micro-steps of any sizes that fit (multiples
    /// of g from g to the largest); among the fewest steps that reach the
    /// target, the smallest effective batch at or above it. The planner must
    /// name those steps and that batch.
    #[test]
    fn the_split_is_the_nearest_batch_in_the_fewest_steps_of_all_splits(
        target in 1usize..400,
        world in 1usize..=4,
        largest in 1usize..48,
        g in 1usize..6,
    ) {
        let usable = largest - largest % g;
        let Ok(split) = Accumulation::plan_aligned(target, world, largest, g) else {
            prop_assert!(usable == 0 || target < world * g);
            return Ok(());
        };
        // sums[s] after k rounds: whether k micro-steps of allowed sizes add up to s samples
        let sizes: Vec<usize> = (1..=usable / g).map(|granules| granules * g).collect();
        let mut sums = vec![false; target + usable + 1];
        sums[0] = true;
        let mut steps = 0;
        let best = loop {
            let mut next = vec![false; sums.len()];
            for (sum, _) in sums.iter().enumerate().filter(|(_, reached)| **reached) {
                for size in &sizes {
                    if let Some(slot) = next.get_mut(sum + size) {
                        *slot = true;
                    }
                }
            }
            sums = next;
            steps += 1;
            if let Some(per_rank) = (0..sums.len()).find(|&per_rank| sums[per_rank] && per_rank * world >= target) {
                break per_rank * world;
            }
        };
        prop_assert_eq!(split.accumulation_steps, steps);
        prop_assert_eq!(split.effective_batch, best);
    }

    /// Equal micro-batches: m·k·W = effective ≥ target, m ≤ largest and a
    /// multiple of g, k₀ ≤ k ≤ 2k₀, and k is the smallest exact one, or k₀
    /// with the nearest batch above when no k is exact.
    #[test]
    fn accumulation_arithmetic_of_equal_micro_batches(target in 1usize..1_000_000, world in 1usize..=8, largest in 1usize..5_000, g in prop_oneof![Just(1usize), Just(8), 1usize..16]) {
        let result = Accumulation::plan_equal(target, world, largest, g);
        let usable = largest - largest % g;
        if usable == 0 {
            prop_assert!(matches!(result, Err(Error::NoCandidate { .. })), "{result:?}");
            return Ok(());
        }
        if target < world * g {
            prop_assert!(
                matches!(&result, Err(err @ Error::InvalidSetting { .. }) if err.to_string().contains("every rank needs")),
                "{result:?}"
            );
            return Ok(());
        }
        let split = result.unwrap();
        let (m, k) = (split.micro_batch, split.accumulation_steps);
        prop_assert!(split.equal_micro_batches());
        prop_assert_eq!(m * k * world, split.effective_batch);
        prop_assert!(split.effective_batch >= target);
        prop_assert!(m >= 1 && m <= usable && m % g == 0);
        let k0 = target.div_ceil(world * usable);
        prop_assert!(k0 == 1 || (k0 - 1) * world * usable < target, "k₀ is the fewest steps");
        let exact_at = |k: usize| target % (world * k * g) == 0;
        let first_exact = (k0..=2 * k0).find(|&k| exact_at(k));
        prop_assert_eq!(split.exact, split.effective_batch == target);
        prop_assert_eq!(split.deviation, split.effective_batch - target);
        match first_exact {
            Some(k_exact) => {
                prop_assert!(split.exact);
                prop_assert_eq!(k, k_exact);
            }
            None => {
                prop_assert!(!split.exact);
                prop_assert_eq!(k, k0);
                // nearest above with k₀ steps: one granule less per rank would fall short
                prop_assert!((m - g) * k * world < target);
                prop_assert!((split.lr_scale - split.effective_batch as f64 / target as f64).abs() < 1e-12);
            }
        }
    }

    /// Uneven ranks: the shares add up to the global batch (the target rounded
    /// up to a granule), every micro-step fits its rank and is a multiple of
    /// the granule, the steps are the fewest that hold the global batch, the
    /// shares are proportional to within two granules, the ranks' samples lie
    /// side by side, and the loss weights add up to 1.
    #[test]
    fn uneven_rank_arithmetic(
        target in 1usize..1_000_000,
        largest in prop::collection::vec(1usize..5_000, 1..=8),
        g in prop_oneof![Just(1usize), Just(8), 1usize..16],
    ) {
        let result = RankSplit::plan(target, &largest, g);
        if largest.iter().any(|&l| l < g) {
            prop_assert!(matches!(result, Err(Error::NoCandidate { .. })), "{result:?}");
            return Ok(());
        }
        let granules = target.div_ceil(g);
        if granules < largest.len() {
            prop_assert!(
                matches!(&result, Err(err @ Error::InvalidSetting { .. }) if err.to_string().contains("every rank needs")),
                "{result:?}"
            );
            return Ok(());
        }
        let split = result.unwrap();
        prop_assert_eq!(split.global_batch, granules * g);
        prop_assert_eq!(split.exact, target % g == 0);
        let capacity: usize = largest.iter().map(|l| l / g).sum();
        let k = split.accumulation_steps;
        prop_assert!(k * capacity >= granules && (k - 1) * capacity < granules, "k is the fewest steps");
        let mut offset = 0;
        let mut weights = 0.0;
        for (rank, share) in split.shares.iter().enumerate() {
            prop_assert_eq!(share.offset, offset);
            offset += share.samples;
            prop_assert_eq!(share.steps, k);
            prop_assert_eq!(share.micro_batches().sum::<usize>(), share.samples);
            prop_assert!(share.samples >= g);
            for (step, micro) in share.micro_batches().enumerate() {
                prop_assert!(micro <= largest[rank] && micro % g == 0);
                prop_assert!(share.micro_batch() - micro <= g);
                prop_assert_eq!(share.micro_range(step).len(), micro);
            }
            let quota = split.global_batch as f64 * (largest[rank] / g) as f64 / capacity as f64;
            prop_assert!((share.samples as f64 - quota).abs() < 2.0 * g as f64 + 1e-9 * quota);
            weights += (0..k).map(|step| split.loss_weight(rank, step)).sum::<f64>();
        }
        prop_assert_eq!(offset, split.global_batch);
        prop_assert!((weights - 1.0).abs() < 1e-9);
    }

    /// On affine curves (a step's peak grows at most in proportion to its
    /// batch) Predictive never runs a trial that needs more than twice the
    /// limit, as a doubling search never does: on the CPU such a trial
    /// allocates in full before it is classified.
    #[test]
    fn predictive_never_asks_for_more_than_twice_the_limit(
        fixed in 0u64..(8 << 30),
        held_share in prop_oneof![Just(None), (0.0f64..=1.0).prop_map(Some)],
        per_sample in 1u64..(1 << 30),
        limit_samples in prop_oneof![1u64..64, 64u64..100_000],
        (start, max, g) in space_strategy(),
    ) {
        let limit = fixed + per_sample * limit_samples + per_sample / 2;
        let mut space = SearchSpace::new(start, max, g).unwrap().with_limit(limit);
        // what the device held before each step: at most the fixed bytes
        if let Some(share) = held_share {
            space = space.with_held_bytes((fixed as f64 * share) as u64);
        }
        let peak = |b: usize| fixed + per_sample * b as u64;
        let history = search_with_peaks(Strategy::Predictive, &space, |b| {
            let p = peak(b);
            (if p <= limit { Outcome::Fits } else { Outcome::OverCeiling }, Some(p))
        });
        // the first trial is the caller's start; every later one is the search's choice
        for o in history.iter().skip(1) {
            prop_assert!(peak(o.batch) <= 2 * limit, "batch {} needs {} of a {} limit: {:?}", o.batch, peak(o.batch), limit,
                history.iter().map(|o| o.batch).collect::<Vec<_>>());
        }
    }

    /// Every invalid configuration is an error, and every valid one is accepted.
    #[test]
    fn invalid_configurations_are_errors(
        ceiling in prop_oneof![Just(f64::NAN), Just(0.0), Just(1.0), -1.0f64..2.0],
        start in 0usize..20,
        max in prop::option::of(0usize..40),
        g in 0usize..10,
        world in 0usize..10,
        target in prop::option::of(0usize..100),
        max_trials in prop::option::of(0usize..5),
        steps in 0usize..3,
    ) {
        let mut tuner = Tuner::new().ceiling(ceiling).start(start).multiple_of(g).world_size(world).steps_per_trial(steps);
        if let Some(max) = max { tuner = tuner.max_batch(max); }
        if let Some(target) = target { tuner = tuner.target_effective_batch(target); }
        if let Some(max_trials) = max_trials { tuner = tuner.max_trials(max_trials); }
        let valid = ceiling > 0.0 && ceiling <= 1.0
            && start > 0 && g > 0 && world > 0 && steps > 0
            && max_trials != Some(0)
            && max.is_none_or(|m| m >= start && start.next_multiple_of(g) <= m - m % g)
            && target.is_none_or(|t| t >= world * g);
        prop_assert_eq!(tuner.check().is_ok(), valid, "{:?}", tuner.check());
        let (mut workload, mut meter) = Simulation::new(1 << 30, MemoryCurve::affine(0, 1 << 20)).build();
        let result = tuner.search(&mut workload, &mut meter).run();
        if !valid {
            prop_assert!(result.is_err());
            prop_assert_eq!(workload.steps(), 0);
        }
    }
}

/// A device that ends below the ceiling, whose step is made of allocations
/// in the proportions `shares` (in that order) on top of what stays resident:
/// a step that does not fit fails with out-of-memory, read as a pool reads it
/// (the allocations handed out before the failing one) or not read at all.
#[derive(Clone, Debug)]
struct PiecewiseStep {
    resident: u64,
    step_fixed: u64,
    per_sample: u64,
    shares: Vec<u64>,
    room: u64,
    limit: u64,
    quadratic: u64,
}

impl PiecewiseStep {
    fn step_bytes(&self, b: usize) -> u64 {
        self.step_fixed + self.per_sample * b as u64 + self.quadratic * (b * b) as u64
    }

    fn measure(&self, b: usize, read_failures: bool) -> (Outcome, Option<u64>) {
        let peak = self.resident + self.step_bytes(b);
        if peak > self.room {
            let total: u64 = self.shares.iter().sum();
            let mut handed_out = self.resident;
            for &share in &self.shares {
                let piece = (u128::from(self.step_bytes(b)) * u128::from(share) / u128::from(total)) as u64;
                if handed_out + piece > self.room {
                    break;
                }
                handed_out += piece;
            }
            (Outcome::OutOfMemory, read_failures.then_some(handed_out))
        } else if peak <= self.limit {
            (Outcome::Fits, Some(peak))
        } else {
            (Outcome::OverCeiling, Some(peak))
        }
    }

    /// The step's largest allocation at `b` is at most `fixed + per_sample × b`
    /// for every batch the search may try (its peak within twice the limit: a
    /// step that grows with b² is bounded by its slope there).
    fn largest_allocation(&self) -> (u64, u64) {
        let total: u64 = self.shares.iter().sum();
        let largest = *self.shares.iter().max().unwrap();
        let share = |bytes: u64| (u128::from(bytes) * u128::from(largest)).div_ceil(u128::from(total)) as u64;
        let widest = (1..=1usize << 24).take_while(|&b| self.resident + self.step_bytes(b) <= 2 * self.limit).last();
        let slope = self.per_sample + self.quadratic * widest.unwrap_or(1) as u64;
        (share(self.step_fixed), share(slope))
    }
}

/// Step time ∝ b + 4 (a fixed overhead worth four samples), as the search bench counts it.
fn cost(history: &[Observation]) -> u64 {
    history.iter().map(|o| o.batch as u64 + 4).sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The pool's reading at an out-of-memory failure, with the step's largest
    /// allocation known, never makes the search cost more than the same search
    /// told nothing at a failure, for steps of 2 to 2000 allocations, equal or
    /// not, straight or growing with b² as attention's scores do: the
    /// device's end lies within one allocation above the reading.
    /// Nor does a reading with the allocation unknown (it bounds the end from
    /// below only). Every answer is the brute-force one, proven by a failure
    /// at the next candidate.
    #[test]
    fn an_out_of_memory_reading_never_costs_more_than_none(
        per_sample_kib in 64u64..50_000,
        resident_share in 0.0f64..0.5,
        step_fixed_share in 0.0f64..0.2,
        (equal, shares) in (any::<bool>(), prop::collection::vec(1u64..1_000, 2..2_000)),
        end_share in 0.05f64..0.95,
        g in prop_oneof![Just(1usize), Just(8), 1usize..17],
        quadratic in 0u64..20_000,
    ) {
        let limit = 72u64 << 30;
        let resident = (limit as f64 * resident_share) as u64;
        let step_fixed = (limit as f64 * step_fixed_share) as u64;
        let per_sample = per_sample_kib << 10;
        let shares = if equal { vec![1; shares.len()] } else { shares };
        let room = resident + step_fixed + ((limit - resident - step_fixed) as f64 * end_share) as u64;
        let device = PiecewiseStep { resident, step_fixed, per_sample, shares, room, limit, quadratic };
        let space = SearchSpace::new(1, None, g).unwrap().with_limit(limit);
        let truth = (g..=1 << 24).step_by(g).take_while(|&b| device.measure(b, false).0.fits()).last();
        let (fixed, slope) = device.largest_allocation();
        let told = space.with_largest_allocation(fixed, slope);
        let read = search_with_peaks(Strategy::Predictive, &told, |b| device.measure(b, true));
        let read_untold = search_with_peaks(Strategy::Predictive, &space, |b| device.measure(b, true));
        let unread = search_with_peaks(Strategy::Predictive, &space, |b| device.measure(b, false));
        let tried = |h: &[Observation]| h.iter().map(|o| (o.batch, o.outcome)).collect::<Vec<_>>();
        for history in [&read, &read_untold, &unread] {
            prop_assert_eq!(Observation::best(history).map(|o| o.batch), truth, "{:?}", tried(history));
            // proven: the batch above the answer was run and failed
            if let Some(truth) = truth {
                prop_assert!(history.iter().any(|o| o.batch == truth + g && !o.outcome.fits()), "{:?}", tried(history));
            }
        }
        // the largest allocation unknown, the reading still bounds the end from below
        for with_reading in [&read, &read_untold] {
            prop_assert!(cost(with_reading) <= cost(&unread), "read {} > unread {}:\n{:?}\n{:?}", cost(with_reading), cost(&unread), tried(with_reading), tried(&unread));
        }
    }
}
