//! The longest input size at a fixed batch on simulated devices whose memory
//! grows with the tokens and tokens × length: the answer fits and one granule
//! longer does not (brute force), or the range's end is the answer and the
//! result says so; Predictive needs fewer trials than bisection; bad settings
//! and refusals are errors.

use autobatch::search::SearchSpace;
use autobatch::{
    Error, Resizable, Setting, Tuner, Value, plan::LongestSize, plan::SearchLimit, plan::SizeRange, search::Outcome,
    search::Strategy as Search,
};
use proptest::prelude::*;

use crate::common::token_curve::{Curve, GIB};

/// The longest multiple of the granule in `range` that fits at `batch`, by scanning.
fn brute_force(curve: Curve, batch: usize, range: SizeRange) -> Option<usize> {
    let space = SearchSpace::new(range.smallest, Some(range.largest), range.multiple_of).unwrap();
    (space.first()..=space.last())
        .step_by(range.multiple_of)
        .take_while(|&len| curve.bytes(batch, len) <= curve.limit(0.9))
        .last()
}

fn curve_strategy() -> impl Strategy<Value = Curve> {
    (8u64..=141, 0u64..4 * GIB, 1u64..=64 << 10, 0u64..=4096).prop_map(
        |(capacity_gib, fixed, per_token, per_token_length)| Curve { capacity_gib, fixed, per_token, per_token_length },
    )
}

fn run(tuner: &Tuner, curve: Curve, batch: usize, range: SizeRange) -> Result<LongestSize, Error> {
    let (mut workload, mut meter) = curve.simulation(7).build();
    let result = tuner.search(&mut workload, &mut meter).longest(batch, range);
    assert_eq!(workload.size(), 7, "the workload is put back at its size");
    result
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_longest_size_fits_and_one_granule_longer_does_not(
        curve in curve_strategy(),
        batch in 1usize..=64,
        largest in 64usize..=1 << 17,
        granule in prop_oneof![Just(1usize), Just(8), Just(64)],
        strategy in prop_oneof![Just(Search::Predictive), Just(Search::Binary)],
    ) {
        let range = SizeRange::up_to(largest).multiple_of(granule);
        let truth = brute_force(curve, batch, range);
        let result = run(&Tuner::new().strategy(strategy), curve, batch, range);
        let Some(truth) = truth else {
            prop_assert!(
                matches!(result, Err(Error::NothingFits { batch: b, size: Some(_), .. }) if b == batch),
                "{:?}",
                result
            );
            return Ok(());
        };
        let longest = result.unwrap();
        prop_assert_eq!(longest.largest_size, truth, "{:?}", longest.trials);
        prop_assert_eq!(longest.peak_bytes, curve.bytes(batch, truth));
        prop_assert!(longest.trials.iter().any(|t| t.size == Some(truth) && t.outcome == Outcome::Fits));
        let last = largest / granule * granule;
        if truth == last {
            prop_assert!(!longest.proven_longest);
            prop_assert_eq!(longest.stopped_by, Some(SearchLimit::MaxBatch { max_batch: last }));
        } else {
            prop_assert!(longest.proven_longest);
            prop_assert!(longest.trials.iter().any(|t| t.size == Some(truth + granule) && !t.outcome.fits()));
        }
    }
}

/// Memory quadratic in the length (attention) with a long range: the
/// predictive search reaches the same answer in fewer steps than bisection.
#[test]
fn predictive_finds_the_length_in_fewer_trials_than_bisection() {
    let mut trials = [0usize; 2];
    let cases =
        [(80, GIB, 16 << 10, 2048), (24, 0, 4 << 10, 64), (141, 2 * GIB, 1 << 10, 512), (16, GIB / 2, 64 << 10, 0)];
    for (capacity_gib, fixed, per_token, per_token_length) in cases {
        let curve = Curve { capacity_gib, fixed, per_token, per_token_length };
        let range = SizeRange::up_to(1 << 20).multiple_of(16);
        for (index, strategy) in [Search::Predictive, Search::Binary].into_iter().enumerate() {
            let longest = run(&Tuner::new().strategy(strategy), curve, 8, range).unwrap();
            assert_eq!(Some(longest.largest_size), brute_force(curve, 8, range));
            trials[index] += longest.trials.len();
        }
    }
    assert!(trials[0] * 2 <= trials[1], "predictive {} trials, binary {}", trials[0], trials[1]);
}

#[test]
fn batch_search_settings_are_refused_not_ignored() {
    let curve = Curve { capacity_gib: 16, fixed: 0, per_token: 1 << 10, per_token_length: 0 };
    let range = SizeRange::up_to(4096);
    for (tuner, setting) in [
        (Tuner::new().target_effective_batch(64), autobatch::Setting::TargetEffectiveBatch),
        (Tuner::new().world_size(2), autobatch::Setting::WorldSize),
        (Tuner::new().max_batch(8), autobatch::Setting::MaxBatch),
        (Tuner::new().multiple_of(8), autobatch::Setting::MultipleOf),
        (Tuner::new().objective(autobatch::plan::Objective::Throughput), autobatch::Setting::Objective),
        (Tuner::new().cache("/tmp/never-written.json"), autobatch::Setting::Cache),
    ] {
        let err = run(&tuner, curve, 4, range).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidSetting { setting: s, value: Value::Given, .. } if *s == setting),
            "{err}"
        );
        assert!(err.is_configuration());
    }
    assert!(matches!(
        run(&Tuner::new(), curve, 0, range),
        Err(Error::InvalidSetting { setting: Setting::Batch, value: Value::Count(0), .. })
    ));
    let err = run(&Tuner::new(), curve, 4, SizeRange::up_to(100).from(200)).unwrap_err();
    assert!(matches!(&err, Error::InvalidSetting { setting: Setting::MaxBatch, .. }), "{err}");
}

/// A size the workload cannot take ends the search with the workload's own error.
#[test]
fn a_refused_size_is_the_workloads_error() {
    struct Positions {
        size: usize,
        max: usize,
    }
    impl autobatch::Workload for Positions {
        fn step(&mut self, _batch: usize) -> candle_core::Result<()> {
            Ok(())
        }
    }
    impl Resizable for Positions {
        fn resize(&mut self, size: usize) -> Result<(), autobatch::Error> {
            if size > self.max {
                return Err(Error::invalid(
                    autobatch::Setting::Size,
                    Value::Count(size),
                    format!("it must be at most {}", self.max),
                ));
            }
            self.size = size;
            Ok(())
        }
        fn size(&self) -> usize {
            self.size
        }
    }
    let mut workload = Positions { size: 32, max: 512 };
    let mut meter =
        autobatch::memory::simulated::Simulation::new(GIB, autobatch::memory::simulated::MemoryCurve::affine(0, 1))
            .build()
            .1;
    let err = Tuner::new().search(&mut workload, &mut meter).longest(4, SizeRange::up_to(4096)).unwrap_err();
    assert!(matches!(err, Error::InvalidSetting { value: Value::Count(size), .. } if size > 512), "{err}");
    assert!(err.to_string().ends_with("it must be at most 512"), "{err}");
    assert_eq!(workload.size, 32);
}
