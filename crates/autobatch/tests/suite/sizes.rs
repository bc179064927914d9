//! Plans across input sizes on simulated devices whose memory grows with the
//! batch, the tokens and tokens × length: every probed size's batch fits and
//! the next does not, predicted batches stay within their verified
//! neighbours (and under the ceiling), the token budget holds at every
//! length, and the plan cache keeps sizes apart.

use autobatch::memory::simulated::SizedSimulation;
use autobatch::search::SearchSpace;
use autobatch::{Error, Resizable, Tuner, Workload, plan::BatchSource, plan::SizePlan};
use proptest::prelude::*;

use crate::common::token_curve::{Curve, GIB};

fn curve_strategy() -> impl Strategy<Value = Curve> {
    (8u64..=141, 0u64..4 * GIB, 1u64..=64 << 10, 0u64..=512).prop_map(
        |(capacity_gib, fixed, per_token, per_token_length)| Curve { capacity_gib, fixed, per_token, per_token_length },
    )
}

fn run(tuner: &Tuner, curve: Curve, sizes: &[usize]) -> Result<SizePlan, Error> {
    let (mut workload, mut meter) = curve.simulation(sizes[0]).build();
    let plan = tuner.search(&mut workload, &mut meter).sizes(sizes);
    assert_eq!(workload.size(), sizes[0], "the workload is put back at its size");
    plan
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn every_probed_size_fits_and_the_next_batch_does_not(
        curve in curve_strategy(),
        sizes in prop::collection::btree_set(16usize..=4096, 1..=4),
        multiple_of in prop_oneof![Just(1usize), Just(8)],
    ) {
        let sizes: Vec<usize> = sizes.into_iter().collect();
        let longest = *sizes.last().unwrap();
        prop_assume!(curve.bytes(multiple_of, longest) <= curve.limit(0.9));
        let tuner = Tuner::new().multiple_of(multiple_of);
        let plan = run(&tuner, curve, &sizes).unwrap();
        let limit = curve.limit(0.9);
        prop_assert_eq!(plan.sizes.keys().copied().collect::<Vec<_>>(), sizes.clone());
        for (&size, at_size) in &plan.sizes {
            let b = at_size.largest_batch();
            prop_assert!(at_size.proven_largest());
            prop_assert!(b.is_multiple_of(multiple_of));
            prop_assert!(curve.bytes(b, size) <= limit, "size {} batch {} does not fit", size, b);
            prop_assert!(curve.bytes(b + multiple_of, size) > limit, "size {} batch {} is not the largest", size, b);
            prop_assert!(at_size.trials().iter().any(|t| t.batch == b && t.outcome.fits()));
            prop_assert_eq!(plan.batch_for(size).unwrap().source, BatchSource::Verified);
        }
        // the token budget: any batch padded to any length up to the longest fits
        for len in [1, 2, 7, sizes[0], (sizes[0] + longest) / 2, longest] {
            let batch = plan.token_budget / len;
            prop_assert!(batch == 0 || curve.bytes(batch, len) <= limit, "{} tokens at length {} do not fit", plan.token_budget, len);
        }
        let past = plan.batch_for(longest + 1);
        prop_assert!(matches!(past, Err(Error::InvalidSetting { value: autobatch::Value::Count(_), .. })), "{:?}", past);
    }

    #[test]
    fn predicted_sizes_stay_within_their_verified_neighbours(
        curve in curve_strategy(),
        sizes in prop::collection::btree_set(16usize..=4096, 2..=4),
        multiple_of in prop_oneof![Just(1usize), Just(8)],
    ) {
        let sizes: Vec<usize> = sizes.into_iter().collect();
        prop_assume!(curve.bytes(multiple_of, *sizes.last().unwrap()) <= curve.limit(0.9));
        let plan = run(&Tuner::new().multiple_of(multiple_of), curve, &sizes).unwrap();
        let model = plan.model.clone().expect("several sizes determine the model");
        prop_assert!(model.max_error < 1e-6, "the model is exact on these curves: {:?}", model);
        let limit = curve.limit(0.9);
        let probed: Vec<(usize, &autobatch::Plan)> = plan.sizes.iter().map(|(&size, plan)| (size, plan)).collect();
        for pair in probed.windows(2) {
            let ((short_size, short), (long_size, long)) = (pair[0], pair[1]);
            let step = ((long_size - short_size) / 7).max(1);
            for len in (short_size + 1..long_size).step_by(step) {
                let predicted = plan.batch_for(len).unwrap();
                prop_assert_eq!(predicted.source, BatchSource::Predicted);
                prop_assert!(predicted.batch <= short.largest_batch(), "len {}: {} above the shorter neighbour's {}", len, predicted.batch, short.largest_batch());
                prop_assert!(predicted.batch >= long.largest_batch());
                prop_assert!(predicted.batch.is_multiple_of(multiple_of));
                // an exact model predicts a batch that fits
                prop_assert!(curve.bytes(predicted.batch, len) <= limit, "len {} batch {} does not fit", len, predicted.batch);
            }
        }
        let below = plan.batch_for(sizes[0] - 1).unwrap();
        prop_assert_eq!((below.source, below.batch), (BatchSource::Bound, plan.sizes[&sizes[0]].largest_batch()));
    }
}

#[test]
fn the_model_recovers_the_curve_from_the_trials() {
    let curve = Curve { capacity_gib: 80, fixed: 3 * GIB, per_token: 24 << 10, per_token_length: 96 };
    let plan = run(&Tuner::new(), curve, &[512, 1024, 2048, 4096]).unwrap();
    let model = plan.model.clone().unwrap();
    let close = |fitted: f64, truth: u64| (fitted - truth as f64).abs() <= 1e-6 * truth as f64 + 1.0;
    assert!(close(model.fixed_bytes, curve.fixed), "{model:?}");
    assert!(close(model.bytes_per_token, curve.per_token), "{model:?}");
    assert!(close(model.bytes_per_token_length, curve.per_token_length), "{model:?}");
    // a length between probes gets the model's answer, close to the truth
    let space = SearchSpace::new(1, None, 1).unwrap();
    let truth = curve.simulation(3000).true_largest(0.9, 3000, &space, 1 << 20).unwrap();
    let predicted = plan.batch_for(3000).unwrap();
    assert!(predicted.batch <= truth && predicted.batch + 1 >= truth, "{predicted:?} vs {truth}");
}

#[test]
fn bucketing_pads_to_the_next_probed_size() {
    let curve = Curve { capacity_gib: 24, fixed: GIB, per_token: 16 << 10, per_token_length: 64 };
    let plan = run(&Tuner::new(), curve, &[64, 128, 256]).unwrap();
    let bucket = plan.bucket_for(100).unwrap();
    assert_eq!((bucket.size, bucket.batch), (128, plan.plan_for(128).unwrap().largest_batch()));
    assert_eq!(plan.bucket_for(64).unwrap().size, 64);
    assert!(matches!(plan.bucket_for(257), Err(Error::InvalidSetting { value: autobatch::Value::Count(257), .. })));
    assert!(plan.bucket_for(257).unwrap_err().to_string().contains("at most the longest size probed, 256"));
    let text = plan.to_string();
    assert!(text.contains("token budget") && text.contains("per token"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&plan.to_json()).unwrap();
    assert_eq!(json["sizes"].as_array().unwrap().len(), 3);
    // each probed size is {size, plan}, shortest first, and reads back as the plan written
    assert_eq!(json["sizes"][1]["size"], 128);
    assert_eq!(json["sizes"][1]["plan"]["largest_batch"], plan.sizes[&128].largest_batch());
    let read: autobatch::plan::SizePlan = serde_json::from_str(&plan.to_json()).unwrap();
    assert_eq!(read, plan);
    let twice = json.to_string().replace("\"size\":128", "\"size\":64");
    assert!(
        serde_json::from_str::<autobatch::plan::SizePlan>(&twice).unwrap_err().to_string().contains("probed twice")
    );
}

#[test]
fn bad_sizes_are_errors() {
    let curve = Curve { capacity_gib: 24, fixed: GIB, per_token: 16 << 10, per_token_length: 64 };
    let (mut workload, mut meter) = curve.simulation(64).build();
    let tuner = Tuner::new();
    assert!(matches!(
        tuner.search(&mut workload, &mut meter).sizes(&[]),
        Err(Error::InvalidSetting { setting: autobatch::Setting::Sizes, value: autobatch::Value::Count(0), .. })
    ));
    assert!(matches!(
        tuner.search(&mut workload, &mut meter).sizes(&[64, 0]),
        Err(Error::InvalidSetting { setting: autobatch::Setting::Size, value: autobatch::Value::Count(0), .. })
    ));
    assert_eq!(workload.steps(), 0, "nothing ran");
    // a size where nothing fits says which
    let err = tuner.search(&mut workload, &mut meter).sizes(&[64, 1 << 20]).unwrap_err();
    assert!(
        matches!(&err, Error::AtSize { size, source } if *size == 1 << 20 && matches!(**source, Error::NothingFits { .. })),
        "{err}"
    );
    assert!(err.to_string().starts_with("at size 1048576: nothing fits"), "{err}");
}

#[test]
fn the_plan_cache_keeps_sizes_apart() {
    let dir = std::env::temp_dir().join(format!("autobatch-sizes-cache-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plans.json");
    let _ = std::fs::remove_file(&path);
    let curve = Curve { capacity_gib: 40, fixed: 2 * GIB, per_token: 32 << 10, per_token_length: 128 };
    let key = autobatch::CacheKey::new().param("model", "simulated lm");
    let tuner = Tuner::new().cache(&path).cache_key(key);
    let (mut workload, mut meter) = curve.simulation(128).build();
    let first = tuner.search(&mut workload, &mut meter).sizes(&[128, 512]).unwrap();
    let steps = workload.steps();
    assert!(!first.cached());
    let second = tuner.search(&mut workload, &mut meter).sizes(&[128, 512]).unwrap();
    assert_eq!(workload.steps(), steps, "a cached size runs no step");
    assert!(second.cached());
    for ((a_size, a), (b_size, b)) in first.sizes.iter().zip(&second.sizes) {
        assert_eq!((a_size, a.largest_batch()), (b_size, b.largest_batch()));
    }
    assert_ne!(first.sizes[&128].largest_batch(), first.sizes[&512].largest_batch());
    // a new size probes only itself
    let third = tuner.search(&mut workload, &mut meter).sizes(&[128, 256, 512]).unwrap();
    assert!(workload.steps() > steps);
    assert!(third.sizes[&128].cached() && !third.sizes[&256].cached() && third.sizes[&512].cached());
    // the cache needs a key
    let (mut workload, mut meter) = curve.simulation(128).build();
    let err = Tuner::new().cache(&path).search(&mut workload, &mut meter).sizes(&[128]).unwrap_err();
    assert!(matches!(err, Error::InvalidSetting { value: autobatch::Value::Missing, .. }), "{err}");
    assert!(err.to_string().starts_with("Tuner::cache_key is missing: the plan cache needs"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_closure_workload_runs_at_each_size() {
    let mut seen = Vec::new();
    let mut workload = autobatch::BySize::new(32, |batch, len| {
        seen.push((batch, len));
        Ok(())
    });
    workload.resize(8).unwrap();
    workload.step(3).unwrap();
    assert_eq!(workload.size(), 8);
    assert_eq!(seen, [(3, 8)]);
}

/// With memory per sample that does not depend on the length (a
/// classification head, per-sample buffers), memory per token falls with the
/// length before attention makes it rise: the token budget still holds at
/// every length between the shortest and the longest probed.
#[test]
fn the_token_budget_holds_between_probed_sizes_with_a_per_sample_term() {
    let per_sample = 24u64 << 20;
    let curve = move |b: usize, s: usize| {
        let (b, s) = (b as u64, s as u64);
        (2u64 << 30) + b * per_sample + b * s * (16 << 10) + b * s * s * 96
    };
    let (mut workload, mut meter) = SizedSimulation::new(40 * GIB, 64, curve).build();
    let sizes = [64, 256, 1024, 2048];
    let plan = Tuner::new().search(&mut workload, &mut meter).sizes(&sizes).unwrap();
    let limit = plan.limit_bytes;
    for len in 64..=2048 {
        let batch = plan.token_budget / len;
        assert!(
            batch == 0 || curve(batch, len) <= limit,
            "{} tokens at length {len}: batch {batch}",
            plan.token_budget
        );
    }
    // every predicted batch between probes fits too (the model's margin covers the term it lacks)
    for len in (65..2048).step_by(37) {
        let predicted = plan.batch_for(len).unwrap();
        assert!(curve(predicted.batch, len) <= limit, "{predicted:?}\n{plan}");
    }
}
/// Two probed sizes fit any two of the model's terms exactly, and the forms
/// differ between them: here `per_sample + per_token_length` fits as well as
/// the true `per_token + per_token_length` and would put too many samples
/// between the sizes. Predictions there take the chord, which is safe for any
/// curve convex in the size. (Found by the property test above.)
#[test]
fn with_two_sizes_predictions_are_safe_whatever_form_the_fit_took() {
    let curve = Curve { capacity_gib: 69, fixed: 566_607_442, per_token: 56_054, per_token_length: 12 };
    let plan = run(&Tuner::new().multiple_of(8), curve, &[1017, 1697]).unwrap();
    let limit = curve.limit(0.9);
    for len in (1018..1697).step_by(7) {
        let predicted = plan.batch_for(len).unwrap();
        assert!(curve.bytes(predicted.batch, len) <= limit, "{predicted:?} does not fit\n{plan}");
    }
}
