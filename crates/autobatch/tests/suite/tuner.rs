//! The tuner against simulated devices: what the contract promises, case by case.

use autobatch::memory::simulated::{MemoryCurve, Simulation};
use autobatch::search::SearchSpace;
use autobatch::{Error, MemoryMeter, Plan, Tuner, plan::TrialKind, plan::Warning, search::Outcome, search::Strategy};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn run(tuner: &Tuner, sim: Simulation) -> Result<Plan, Error> {
    let (mut workload, mut meter) = sim.build();
    tuner.search(&mut workload, &mut meter).run()
}

/// The largest candidate that brute force finds fitting, and checks that the
/// plan found exactly it and that every invariant of the plan holds.
fn assert_exact(tuner: &Tuner, sim: Simulation, ceiling: f64, start: usize, multiple_of: usize) -> Plan {
    let space = SearchSpace::new(start, None, multiple_of).unwrap();
    let truth = sim.true_largest(ceiling, &space, 1 << 16).expect("the case has a fitting batch");
    let plan = run(tuner, sim.clone()).unwrap();
    assert_eq!(plan.largest_batch(), truth, "{sim:?}\n{plan}");
    assert!(plan.proven_largest());
    assert!(plan.peak_bytes() <= plan.limit_bytes());
    assert_eq!(plan.peak_bytes(), sim.device_peak(truth));
    let trial = plan.trials().iter().rev().find(|t| t.batch == truth).unwrap();
    assert_eq!(trial.outcome, Outcome::Fits);
    plan
}

#[test]
fn affine_curve_gives_the_exact_largest_batch() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB));
    let plan = assert_exact(&Tuner::new(), sim, 0.9, 1, 1);
    // (0.9 × 16 GiB − 2 GiB) / 100 MiB = 126.9
    assert_eq!(plan.largest_batch(), 126);
    assert_eq!((plan.micro_batch(), plan.accumulation_steps(), plan.effective_batch()), (126, 1, 126));
}

#[test]
fn quadratic_and_rounded_curves_are_exact() {
    let quadratic = Simulation::new(8 * GIB, MemoryCurve::quadratic(GIB, 20 * MIB, MIB / 4));
    assert_exact(&Tuner::new(), quadratic, 0.9, 1, 1);
    let rounded = Simulation::new(8 * GIB, MemoryCurve::affine(GIB + 12345, 7 * MIB + 333)).rounding(2 * MIB);
    assert_exact(&Tuner::new().ceiling(0.75), rounded, 0.75, 1, 1);
    let granular = Simulation::new(40 * GIB, MemoryCurve::affine(3 * GIB, 37 * MIB));
    let plan = assert_exact(&Tuner::new().multiple_of(8).start(3), granular, 0.9, 3, 8);
    assert_eq!(plan.largest_batch() % 8, 0);
    assert!(plan.trials().iter().all(|t| t.batch % 8 == 0));
}

#[test]
fn ceiling_is_a_fraction_of_the_whole_device_including_other_processes() {
    let alone = run(&Tuner::new(), Simulation::new(16 * GIB, MemoryCurve::affine(GIB, 100 * MIB))).unwrap();
    let shared =
        run(&Tuner::new(), Simulation::new(16 * GIB, MemoryCurve::affine(GIB, 100 * MIB)).other_process(4 * GIB))
            .unwrap();
    // 4 GiB held elsewhere leave 40.96 fewer samples of 100 MiB.
    assert_eq!(alone.largest_batch() - shared.largest_batch(), 41);
    assert!(shared.peak_bytes() >= 4 * GIB);
}

#[test]
fn a_real_out_of_memory_below_the_ceiling_is_a_failure() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(GIB, 10 * MIB)).oom_from(300);
    let plan = run(&Tuner::new(), sim).unwrap();
    assert_eq!(plan.largest_batch(), 299);
    assert!(plan.trials().iter().any(|t| t.outcome == Outcome::OutOfMemory));
    assert!(plan.trials().iter().filter(|t| t.batch >= 300).all(|t| t.outcome == Outcome::OutOfMemory));
}

#[test]
fn physical_out_of_memory_and_over_ceiling_are_told_apart() {
    // capacity reached above batch 100; ceiling 50% reached above batch 50
    let sim = Simulation::new(1000 * MIB, MemoryCurve::affine(0, 10 * MIB));
    let plan = run(&Tuner::new().strategy(Strategy::Binary).ceiling(0.5), sim).unwrap();
    assert_eq!(plan.largest_batch(), 50);
    let outcome_of = |b: usize| plan.trials().iter().find(|t| t.batch == b).map(|t| t.outcome);
    assert_eq!(outcome_of(64), Some(Outcome::OverCeiling));
    assert_eq!(outcome_of(128), None, "bisects after the first failure");
    let plan = run(
        &Tuner::new().strategy(Strategy::Binary).ceiling(1.0),
        Simulation::new(1000 * MIB, MemoryCurve::affine(0, 10 * MIB)),
    )
    .unwrap();
    assert_eq!(plan.largest_batch(), 100);
    assert_eq!(plan.trials().iter().find(|t| t.batch == 128).map(|t| t.outcome), Some(Outcome::OutOfMemory));
}

#[test]
fn nothing_fits_is_an_error_with_the_measured_peak_and_capacity() {
    let sim = Simulation::new(8 * GIB, MemoryCurve::affine(7 * GIB + 600 * MIB, 100 * MIB));
    let err = run(&Tuner::new(), sim).unwrap_err();
    match &err {
        Error::NothingFits { batch, outcome, peak_bytes, capacity_bytes, .. } => {
            assert_eq!(*batch, 1);
            assert_eq!(*outcome, Outcome::OverCeiling);
            assert_eq!(*peak_bytes, Some(7 * GIB + 700 * MIB));
            assert_eq!(*capacity_bytes, 8 * GIB);
        }
        other => panic!("expected NothingFits, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("7.68 GiB") && text.contains("8.00 GiB"), "{text}");
}

#[test]
fn a_nothing_fits_search_with_a_larger_start_reports_that_start() {
    let sim = Simulation::new(8 * GIB, MemoryCurve::affine(GIB, MIB)).oom_from(16);
    let err = run(&Tuner::new().start(16), sim).unwrap_err();
    assert!(matches!(err, Error::NothingFits { batch: 16, outcome: Outcome::OutOfMemory, .. }), "{err:?}");
}

#[test]
fn other_workload_errors_end_the_run_untouched_and_are_not_retried() {
    let (mut workload, mut meter) = Simulation::new(16 * GIB, MemoryCurve::affine(GIB, 10 * MIB)).error_at(64).build();
    let err = Tuner::new().strategy(Strategy::Binary).search(&mut workload, &mut meter).run().unwrap_err();
    let Error::Workload { batch, source } = &err else { panic!("expected a workload error, got {err:?}") };
    assert_eq!(*batch, 64);
    assert!(source.to_string().contains("simulated failure at batch 64"), "{source}");
    assert!(!autobatch::is_oom(source));
    // warm-up at 1, then 1, 2, 4, 8, 16, 32, 64 and nothing after it
    assert_eq!(workload.steps(), 8);

    // the same with a closure: the very error value comes back
    let mut calls = 0;
    let mut step = |batch: usize| -> candle_core::Result<()> {
        calls += 1;
        if batch >= 4 { Err(candle_core::Error::Msg(format!("bad shape at {batch}"))) } else { Ok(()) }
    };
    let (_, mut meter) = Simulation::new(GIB, MemoryCurve::affine(0, 1)).build();
    let err = Tuner::new().strategy(Strategy::Binary).warmup(false).search(&mut step, &mut meter).run().unwrap_err();
    assert!(matches!(err.workload_error(), Some(candle_core::Error::Msg(m)) if m == "bad shape at 4"));
    assert_eq!(calls, 3);
}

#[test]
fn max_batch_caps_the_search_and_is_tried_once() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(GIB, MIB));
    let plan = run(&Tuner::new().max_batch(1000), sim.clone()).unwrap();
    assert_eq!(plan.largest_batch(), 1000);
    // batch 1001 would fit: the cap is not proven the largest
    assert!(!plan.proven_largest());
    assert_eq!(plan.stopped_by(), Some(&autobatch::plan::SearchLimit::MaxBatch { max_batch: 1000 }));
    assert_eq!(plan.trials().iter().filter(|t| t.batch == 1000).count(), 1);
    let plan = run(&Tuner::new().max_batch(1000).multiple_of(64), sim).unwrap();
    assert_eq!(plan.largest_batch(), 960);
}

#[test]
fn max_trials_returns_the_best_verified_batch_flagged_unproven() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(GIB, 10 * MIB));
    let full = run(&Tuner::new().strategy(Strategy::Binary), sim.clone()).unwrap();
    let cut = run(&Tuner::new().strategy(Strategy::Binary).max_trials(5), sim).unwrap();
    assert_eq!(cut.trials().len(), 5);
    assert_eq!(cut.largest_batch(), 16);
    assert!(!cut.proven_largest() && full.proven_largest());
    assert!(cut.warnings().contains(&Warning::TrialLimit { max_trials: 5 }));
    assert!(cut.to_string().contains("not proven largest"));
}

#[test]
fn max_trials_equal_to_what_the_search_needs_is_proven() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(GIB, 10 * MIB));
    let full = run(&Tuner::new(), sim.clone()).unwrap();
    let exact = run(&Tuner::new().max_trials(full.trials().len()), sim).unwrap();
    assert!(exact.proven_largest());
    assert_eq!(exact.largest_batch(), full.largest_batch());
}

#[test]
fn no_batch_is_tried_twice_and_every_trial_is_in_the_space() {
    let sim = Simulation::new(64 * GIB, MemoryCurve::quadratic(5 * GIB, 3 * MIB, 5000)).rounding(2 * MIB);
    let plan = run(&Tuner::new().start(5).multiple_of(4).max_batch(5000), sim).unwrap();
    let mut batches: Vec<usize> = plan.trials().iter().map(|t| t.batch).collect();
    assert!(batches.iter().all(|b| b % 4 == 0 && (8..=5000).contains(b)));
    batches.sort_unstable();
    batches.dedup();
    assert_eq!(batches.len(), plan.trials().len());
}

#[test]
fn steps_per_trial_and_warmup_decide_how_many_steps_run() {
    let (mut workload, mut meter) = Simulation::new(GIB, MemoryCurve::affine(0, 10 * MIB)).build();
    let plan =
        Tuner::new().ceiling(0.5).steps_per_trial(3).warmup(false).search(&mut workload, &mut meter).run().unwrap();
    assert_eq!(workload.steps(), 3 * plan.trials().len());
    let (mut workload, mut meter) = Simulation::new(GIB, MemoryCurve::affine(0, 10 * MIB)).build();
    let plan = Tuner::new().search(&mut workload, &mut meter).run().unwrap();
    assert_eq!(workload.steps(), plan.trials().len() + 1);
}

#[test]
fn a_failed_trial_that_leaks_is_reported_and_the_answer_stays_safe() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(GIB, 100 * MIB)).oom_from(100).leak_on_failure(512 * MIB);
    let (mut workload, mut meter) = sim.build();
    let plan = Tuner::new().strategy(Strategy::Binary).search(&mut workload, &mut meter).run().unwrap();
    let leaks: Vec<_> = plan.warnings().iter().filter(|w| matches!(w, Warning::Leak { .. })).collect();
    assert!(!leaks.is_empty(), "{plan}");
    assert!(
        matches!(leaks[0], Warning::Leak { batch: 128, after_bytes, baseline_bytes, .. } if after_bytes - baseline_bytes == 512 * MIB)
    );
    assert!(plan.to_string().contains("warning: memory leaked by the failed trial at batch 128"));
    // the answer fits with the leaked memory still held
    assert!(plan.peak_bytes() <= plan.limit_bytes());
    assert!(meter.in_use().unwrap() > 0);
    assert!(plan.largest_batch() < 100);
}

#[test]
fn slack_the_meter_explains_is_not_a_leak() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(GIB, 100 * MIB)).leak_on_failure(MIB).slack(2 * MIB);
    let plan = run(&Tuner::new(), sim).unwrap();
    assert!(plan.warnings().is_empty(), "{plan}");
}

#[test]
fn the_answer_is_rechecked_when_the_baseline_rises_after_it_was_measured() {
    // b* = 126 at first; after step 12 the process holds 1 GiB more for good,
    // so 126 no longer fits when training starts. Steps: warm-up, 1..128 (8), 256, 192,
    // 160, 144 (12th: rise), 136, 132, 130, 128, 127.
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)).baseline_rise(12, GIB);
    let (mut workload, mut meter) = sim.clone().build();
    let plan = Tuner::new().strategy(Strategy::Binary).search(&mut workload, &mut meter).run().unwrap();
    let rechecks: Vec<_> = plan.trials().iter().filter(|t| t.kind == TrialKind::Recheck).collect();
    assert!(!rechecks.is_empty(), "{plan}");
    // (0.9 × 16 − 3) GiB / 100 MiB = 116.7
    assert_eq!(plan.largest_batch(), 116, "{plan}");
    assert!(plan.warnings().iter().any(|w| matches!(w, Warning::RecheckFailed { .. })));
    assert!(plan.peak_bytes() <= plan.limit_bytes());
    assert!(plan.to_string().contains("(re-check)"));
}

#[test]
fn accumulation_reaches_the_target_with_one_to_eight_ranks() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)); // b* = 126
    for world_size in 1..=8 {
        for target in [world_size, 64, 100, 126, 256, 257, 1000, 1024, 4099] {
            if target < world_size {
                continue;
            }
            let tuner = Tuner::new().target_effective_batch(target).world_size(world_size);
            let plan = run(&tuner, sim.clone()).unwrap();
            assert_eq!(plan.largest_batch(), 126);
            let split = plan.accumulation().unwrap();
            assert_eq!(split.samples_per_rank() * world_size, plan.effective_batch());
            assert_eq!(split.micro_batches().sum::<usize>(), split.samples_per_rank());
            assert!(plan.micro_batch() <= 126);
            assert!(plan.effective_batch() >= target);
            assert_eq!(split.exact, plan.effective_batch() == target);
            if target % world_size == 0 {
                // micro-batches that differ by one: exact in the fewest steps
                assert!(split.exact, "{plan}");
                assert_eq!(plan.accumulation_steps(), target.div_ceil(world_size * 126), "{plan}");
            }
        }
    }
    let plan = run(&Tuner::new().target_effective_batch(268).max_batch(133), sim.clone()).unwrap();
    assert_eq!((plan.largest_batch(), plan.micro_batch(), plan.accumulation_steps()), (126, 90, 3));
    let plan = run(&Tuner::new().target_effective_batch(257), sim.clone()).unwrap();
    assert_eq!((plan.micro_batch(), plan.accumulation_steps(), plan.effective_batch()), (86, 3, 257));
    assert_eq!(plan.accumulation().unwrap().micro_steps_summary(), "2 × 86 + 1 × 85");
    assert!(plan.to_string().contains("target 257, exact"), "{plan}");
    // equal micro-batches, on request: the same steps and the nearest batch above
    let equal = Tuner::new().target_effective_batch(257).equal_micro_batches(true);
    let plan = run(&equal, sim.clone()).unwrap();
    assert_eq!((plan.micro_batch(), plan.accumulation_steps(), plan.effective_batch()), (86, 3, 258));
    assert!(plan.to_string().contains("target 257, +1"), "{plan}");
    let plan = run(&Tuner::new().target_effective_batch(268).max_batch(133).equal_micro_batches(true), sim).unwrap();
    assert_eq!((plan.micro_batch(), plan.accumulation_steps()), (67, 4));
}

#[test]
fn exactness_can_be_demanded() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB));
    let exact = Tuner::new().target_effective_batch(257).exact_effective_batch(true);
    // micro-batches that differ by one reach 257 exactly; equal ones cannot
    assert_eq!(run(&exact, sim.clone()).unwrap().effective_batch(), 257);
    let err = run(&exact.equal_micro_batches(true), sim.clone()).unwrap_err();
    assert!(
        matches!(err, Error::InexactTarget { target: 257, nearest: 258, largest_micro_batch: Some(_), .. }),
        "{err:?}"
    );
    let plan = run(&Tuner::new().target_effective_batch(256).exact_effective_batch(true), sim).unwrap();
    assert_eq!(plan.effective_batch(), 256);
}

#[test]
fn every_invalid_configuration_is_an_error_before_any_step() {
    let cases: Vec<(Tuner, &str)> = vec![
        (Tuner::new().ceiling(0.0), "ceiling is 0:"),
        (Tuner::new().ceiling(-0.5), "ceiling is -0.5:"),
        (Tuner::new().ceiling(1.0001), "ceiling is 1.0001:"),
        (Tuner::new().ceiling(f64::NAN), "ceiling is NaN:"),
        (Tuner::new().ceiling(f64::INFINITY), "ceiling is inf:"),
        (Tuner::new().start(0), "start is 0"),
        (Tuner::new().multiple_of(0), "multiple_of is 0"),
        (Tuner::new().max_batch(4).start(8), "Tuner::max_batch is 4: it must be at least Tuner::start, 8"),
        (
            Tuner::new().max_batch(7).multiple_of(8),
            "no multiple of Tuner::multiple_of 8 lies in [Tuner::start 1, Tuner::max_batch 7]",
        ),
        (Tuner::new().world_size(0), "world_size is 0"),
        (Tuner::new().target_effective_batch(0), "target_effective_batch is 0"),
        (Tuner::new().max_trials(0), "max_trials is 0"),
        (Tuner::new().steps_per_trial(0), "steps_per_trial is 0"),
        (
            Tuner::new().target_effective_batch(6).world_size(8),
            "Tuner::target_effective_batch is 6: it must be at least 8 ranks (Tuner::world_size)",
        ),
        (
            Tuner::new().target_effective_batch(60).world_size(8).multiple_of(8),
            "= 64: every rank needs at least one micro-batch",
        ),
    ];
    for (tuner, message) in cases {
        let (mut workload, mut meter) = Simulation::new(GIB, MemoryCurve::affine(0, MIB)).build();
        let err = tuner.search(&mut workload, &mut meter).run().expect_err(message);
        assert!(err.to_string().contains(message), "want {message:?} in {err}");
        assert_eq!(workload.steps(), 0, "{message}: no step may run");
    }
}

#[test]
fn power_returns_the_largest_fitting_power_of_two() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)); // b* = 126
    let plan = run(&Tuner::new().strategy(Strategy::Power), sim.clone()).unwrap();
    assert_eq!(plan.largest_batch(), 64);
    assert_eq!(plan.trials().len(), 8);
    let plan = run(&Tuner::new().strategy(Strategy::Power).multiple_of(3), sim).unwrap();
    assert_eq!(plan.largest_batch(), 96);
}

#[test]
fn plan_serializes_to_json_and_back() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)).oom_from(120);
    let plan = run(&Tuner::new().target_effective_batch(1000).world_size(2), sim).unwrap();
    let json = plan.to_json();
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["largest_batch"], 119);
    assert_eq!(value["strategy"], "predictive");
    assert_eq!(value["world_size"], 2);
    assert_eq!(value["trials"][0]["outcome"], "fits");
    assert!(value["trials"].as_array().unwrap().iter().any(|t| t["outcome"] == "out_of_memory"));
    assert!(value["trials"][0]["duration_s"].is_f64());
    assert_eq!(value["accumulation"]["target_effective_batch"], 1000);
    // the split's numbers are written beside the split they come from
    assert_eq!((value["micro_batch"].as_u64(), value["accumulation_steps"].as_u64()), (Some(100), Some(5)));
    assert_eq!((value["effective_batch"].as_u64(), value["ceiling"].as_f64()), (Some(1000), Some(0.9)));
    assert_eq!((value["proven_largest"].as_bool(), value["cached"].as_bool()), (Some(true), Some(false)));
    assert!(value.get("split").is_none() && value.get("search").is_none(), "{json}");
    let back = Plan::from_json(&json).unwrap();
    assert_eq!(back.trials().len(), plan.trials().len());
    assert_eq!(back.accumulation(), plan.accumulation());
    // everything reads back as it was, the durations' nanoseconds through float seconds included
    assert_eq!(back, plan);
}

#[test]
fn a_plan_whose_numbers_disagree_with_its_split_is_refused() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB));
    let plan = run(&Tuner::new().target_effective_batch(1000).world_size(2), sim).unwrap();
    let json: serde_json::Value = serde_json::from_str(&plan.to_json()).unwrap();
    let edited = |key: &str, value: serde_json::Value| {
        let mut json = json.clone();
        json[key] = value;
        Plan::from_json(&json.to_string())
    };
    assert!(edited("micro_batch", 7.into()).unwrap_err().to_string().contains("disagree with its split"));
    assert!(edited("proven_largest", false.into()).is_err());
    assert!(
        edited("ranks", serde_json::to_value(autobatch::plan::RankSplit::plan(1000, &[200, 90], 1).unwrap()).unwrap())
            .is_err()
    );
    assert!(edited("rank", 1.into()).unwrap_err().to_string().contains("come together"));
    assert_eq!(edited("micro_batch", plan.micro_batch().into()).unwrap(), Plan::from_json(&plan.to_json()).unwrap());
}

#[test]
fn report_shows_each_trial_and_the_plan() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB));
    let plan = run(&Tuner::new().target_effective_batch(256), sim).unwrap();
    let report = plan.to_string();
    let lines: Vec<&str> = report.lines().collect();
    assert!(lines[0].contains("batch") && lines[0].contains("outcome") && lines[0].contains("util"));
    assert_eq!(lines.len(), 1 + plan.trials().len() + 5, "{report}");
    assert!(report.contains("\nmeasured on simulated device\n"), "{report}");
    assert!(lines[lines.len() - 2].starts_with("memory: "), "{report}");
    let trials = plan.trials().len();
    let said = format!("tuning took {} steps (a warm-up step, then {trials} trials)", trials + 1);
    assert!(lines.last().unwrap().starts_with(&said), "each step said, the table's and the warm-up: {report}");
    assert!(lines[1].contains("fits") && lines[1].contains('%'));
    assert!(report.contains("over ceiling"));
    assert!(report.contains("largest batch 126 (proven largest)"), "{report}");
    assert!(
        report.contains(
            "micro-batches 1 × 86 + 2 × 85 (3 accumulation steps that differ by one sample, each loss weighted by \
             its samples) × 1 rank = effective batch 256"
        ),
        "{report}"
    );
    assert!(report.contains("(target 256, exact)"), "{report}");
}

#[test]
fn the_plan_carries_a_memory_model_checked_at_the_chosen_batch() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)).other_process(GIB);
    for strategy in [Strategy::Binary, Strategy::Predictive] {
        let plan = run(&Tuner::new().strategy(strategy), sim.clone()).unwrap();
        let model = plan.memory_model().expect("several batches were measured");
        assert!((model.bytes_per_sample - (100 * MIB) as f64).abs() < 1.0, "{model:?}");
        assert!((model.fixed_bytes - (3 * GIB) as f64).abs() < 1024.0, "{model:?}");
        assert!(model.prediction_error.abs() < 1e-6);
        assert!(!model.fitted_batches.contains(&plan.largest_batch()));
        assert!(plan.to_string().contains("per sample"), "{plan}");
    }
}

#[test]
fn a_step_of_two_rising_phases_is_planned_with_both_lines() {
    // issue 89's step at 256 tokens on the CPU (SmolLM2 cut to 2 layers, AdamW): 792.5 MB + 16.0 MB a
    // sample while the update peaks, 563 MB + 23.13 MB a sample past batch 32 where the backward pass does
    let curve = |b: usize| (792.5e6 + 16.0e6 * b as f64).max(563.0e6 + 23.13e6 * b as f64) as u64;
    let sim = Simulation::new(2 * GIB, MemoryCurve::custom(curve));
    for strategy in [Strategy::Binary, Strategy::Predictive] {
        let plan = run(&Tuner::new().strategy(strategy), sim.clone()).unwrap();
        let limit = plan.limit_bytes();
        let truth = (1..1000).filter(|&b| curve(b) <= limit).max().unwrap();
        assert_eq!((plan.largest_batch(), truth), (59, 59), "{plan}");
        let model = plan.memory_model().expect("several batches were measured");
        // the slope past the crossing, not the first line's nor a line through both
        assert!((model.bytes_per_sample - 23.13e6).abs() < 1.0, "{strategy:?}: {model:?}");
        assert!(model.prediction_error.abs() < 1e-6, "{strategy:?}: {model:?}");
        assert_eq!(model.largest_under(limit), Some(truth), "{strategy:?}: {model:?}");
        assert_eq!(model.phases.len(), 2, "{strategy:?}: {model:?}");
        assert!((model.phases[0].bytes_per_sample - 16.0e6).abs() < 1.0, "{strategy:?}: {model:?}");
        let crossing = model.phases[1].crossover.unwrap();
        assert!((crossing - 229.5 / 7.13).abs() < 1e-6, "{strategy:?}: {model:?}");
        assert!(model.phases.iter().all(|phase| phase.confirmed()), "{strategy:?}: {model:?}");
        assert!(plan.to_string().contains("; then from batch 32.2: "), "{plan}");
    }
}

#[test]
fn predictive_finds_the_same_batch_in_fewer_trials() {
    let sim = Simulation::new(80 * GIB, MemoryCurve::affine(6 * GIB, 17 * MIB)).rounding(2 * MIB).other_process(GIB);
    let binary = run(&Tuner::new().strategy(Strategy::Binary), sim.clone()).unwrap();
    let predictive = run(&Tuner::new().strategy(Strategy::Predictive), sim).unwrap();
    assert_eq!(predictive.largest_batch(), binary.largest_batch());
    assert!(predictive.proven_largest());
    assert!(predictive.trials().len() * 2 <= binary.trials().len(), "{predictive}\n{binary}");
}

#[test]
fn nothing_fits_says_what_would_help_when_the_model_is_known() {
    use autobatch::estimate::{Change, OptimizerKind, Precision};
    // 1e9 fp32 parameters with AdamW on a 16 GiB device: 4 GB of weights and 8 GB of
    // moments resident, 4 GB of gradients and 1 GB of activations in the step.
    let state = 12_000_000_000;
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(state + 4_000_000_000, 1_000_000_000)).resident(state);
    let profile = autobatch::estimate::TrainingSetup::new(1_000_000_000, Precision::Fp32, OptimizerKind::AdamW);
    let err = run(&Tuner::new().profile(profile), sim).unwrap_err();
    let Error::NothingFits { remedies, .. } = &err else { panic!("{err:?}") };
    let find = |change: Change| {
        remedies.iter().find(|r| r.change == change).unwrap_or_else(|| panic!("{change:?} in {remedies:?}"))
    };
    let adafactor = find(Change::Optimizer { to: OptimizerKind::Adafactor });
    assert_eq!(adafactor.saves_bytes, 8_000_000_000);
    assert!(adafactor.fits);
    // every total is the whole device's: the measured peak less what the change saves
    let Error::NothingFits { peak_bytes: Some(peak), .. } = &err else { panic!("{err:?}") };
    assert!(remedies.iter().all(|r| r.total_bytes + r.saves_bytes == *peak), "{remedies:?}");
    // the model's shape is not known: no checkpointing or shorter sequences to advise
    assert!(
        !remedies.iter().any(|r| matches!(r.change, Change::GradientCheckpointing | Change::SequenceLength { .. }))
    );
    assert!(err.to_string().contains("what would help"), "{err}");
}

#[test]
fn noisy_curves_below_one_sample_of_noise_are_still_exact() {
    for seed in 0..20 {
        let sim = Simulation::new(40 * GIB, MemoryCurve::affine(3 * GIB, 37 * MIB)).noise(30 * MIB, seed);
        let space = SearchSpace::new(1, None, 1).unwrap();
        let truth = sim.true_largest(0.9, &space, 1 << 16).unwrap();
        for strategy in [Strategy::Binary, Strategy::Predictive] {
            let plan = run(&Tuner::new().strategy(strategy), sim.clone()).unwrap();
            assert_eq!(plan.largest_batch(), truth, "seed {seed}, {strategy}");
        }
    }
}

#[test]
fn a_step_that_ignores_its_batch_stops_the_search_with_a_warning() {
    // the peak never grows: a step that builds its inputs without the batch size
    for strategy in [Strategy::Predictive, Strategy::Binary, Strategy::Power] {
        let sim = Simulation::new(16 * GIB, MemoryCurve::affine(GIB, 0));
        let plan = run(&Tuner::new().strategy(strategy), sim).unwrap();
        assert!(!plan.proven_largest(), "{plan}");
        assert!(plan.largest_batch() >= 1024 && plan.largest_batch() <= 4096, "{plan}");
        assert!(plan.trials().len() <= 16, "{plan}");
        assert!(plan.warnings().iter().any(|w| matches!(w, Warning::BatchIgnored { smallest_batch: 1, .. })), "{plan}");
        assert!(plan.to_string().contains("seems not to use its batch"), "{plan}");
    }
    // a step that uses even a few bytes per sample is searched to the end
    let sim = Simulation::new(GIB, MemoryCurve::affine(GIB / 2, 64));
    let plan = run(&Tuner::new(), sim).unwrap();
    assert!(plan.proven_largest() && plan.warnings().is_empty(), "{plan}");
}

/// A simulated device whose steps take `time(batch)`: throughput measured for real.
fn timed(
    sim: Simulation,
    time: fn(usize) -> std::time::Duration,
) -> (impl autobatch::Workload, autobatch::memory::simulated::SimulatedMeter) {
    let (mut workload, meter) = sim.build();
    let step = move |batch: usize| -> candle_core::Result<()> {
        autobatch::Workload::step(&mut workload, batch)?;
        std::thread::sleep(time(batch));
        Ok(())
    };
    (step, meter)
}

#[test]
fn the_throughput_objective_picks_the_fastest_batch_near_the_top() {
    use autobatch::plan::Objective;
    // 100 fits; above 60 samples each step costs twice as much per sample
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(GIB, 137 * MIB));
    let slow_above_60 = |b: usize| std::time::Duration::from_micros(if b <= 60 { 50 } else { 100 } * b as u64);
    let (mut step, mut meter) = timed(sim.clone(), slow_above_60);
    let tuner = Tuner::new().strategy(Strategy::Binary).objective(Objective::Throughput).target_effective_batch(400);
    let plan = tuner.search(&mut step, &mut meter).run().unwrap();
    let choice = plan.throughput().expect("the throughput was measured");
    assert_eq!(plan.largest_batch(), 100, "{plan}");
    assert_eq!(choice.candidates.iter().map(|p| p.batch).collect::<Vec<_>>(), [50, 75, 100]);
    assert_eq!(choice.chosen_batch, 50, "{plan}");
    assert_eq!(choice.deepspeed_batch, 50, "the next candidate is not 5% faster");
    assert!(plan.micro_batch() <= 50 && plan.micro_batch() * plan.accumulation_steps() >= 400, "{plan}");
    assert_eq!(choice.extra_steps, 9, "3 candidates × 3 timed runs");
    assert_eq!(plan.trials().iter().filter(|t| t.kind == TrialKind::Timing).count(), 9);
    assert!(plan.to_string().contains("throughput: batch 50 is the fastest"), "{plan}");

    // when bigger is faster, the choice is the largest, or within the noise it measured
    let fixed_cost = |b: usize| std::time::Duration::from_micros(3000 + 20 * b as u64);
    let (mut step, mut meter) = timed(sim, fixed_cost);
    let plan = Tuner::new().objective(Objective::Throughput).search(&mut step, &mut meter).run().unwrap();
    let choice = plan.throughput().unwrap();
    let rate = |batch: usize| choice.candidates.iter().find(|p| p.batch == batch).unwrap();
    let (chosen, largest) = (rate(choice.chosen_batch), rate(plan.largest_batch()));
    assert!(
        chosen.samples_per_second >= largest.samples_per_second * (1.0 - largest.spread.max(chosen.spread)),
        "{plan}"
    );
    assert_eq!(plan.micro_batch(), choice.chosen_batch);
    // every fitting trial reports its samples per second
    assert!(plan.trials().iter().filter(|t| t.outcome.fits()).all(|t| t.samples_per_second().is_some_and(|r| r > 0.0)));
    assert!(matches!(
        Tuner::new().timing_repeats(0).check(),
        Err(Error::InvalidSetting {
            setting: autobatch::Setting::TimingRepeats,
            value: autobatch::Value::Count(0),
            ..
        })
    ));
}

/// A simulated device whose step at `slow_batch` takes `pause`: the time
/// limit passes there, whatever the machine's speed.
fn run_with_pause(
    tuner: &Tuner,
    sim: Simulation,
    slow_batch: usize,
    pause: std::time::Duration,
) -> Result<Plan, Error> {
    let (mut workload, mut meter) = sim.build();
    let mut step = |batch: usize| {
        if batch == slow_batch {
            std::thread::sleep(pause);
        }
        autobatch::Workload::step(&mut workload, batch)
    };
    tuner.search(&mut step, &mut meter).run()
}

#[test]
fn a_time_limit_stops_with_the_largest_batch_seen_to_fit_and_says_what_is_open() {
    use autobatch::plan::SearchLimit;
    use std::time::Duration;
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)); // answer 126
    let tuner = Tuner::new().strategy(Strategy::Binary).time_limit(Duration::from_millis(200));

    // no failure seen yet: everything above the largest fit is open
    let plan = run_with_pause(&tuner, sim.clone(), 4, Duration::from_millis(300)).unwrap();
    assert_eq!(plan.trials().iter().map(|t| t.batch).collect::<Vec<_>>(), [1, 2, 4]);
    assert_eq!(plan.largest_batch(), 4);
    assert!(!plan.proven_largest());
    let limit = SearchLimit::TimeLimit { limit_ms: 200, largest_fit: 4, smallest_failure: None, expected_end: None };
    assert_eq!(plan.stopped_by(), Some(&limit));
    assert!(
        plan.summary()
            .contains("not proven largest: stopped at the 0.200 s time limit: batches above 4 were not tried"),
        "{}",
        plan.summary()
    );
    let json: serde_json::Value = serde_json::from_str(&plan.to_json()).unwrap();
    assert_eq!(json["stopped_by"]["reason"], "time_limit");
    assert_eq!(json["stopped_by"]["largest_fit"], 4);

    // after a failure: the bracket between the largest fit and it is open
    let small = Simulation::new(16 * GIB, MemoryCurve::affine(0, 2 * GIB)); // 0.9 × 16 / 2: answer 7
    let plan = run_with_pause(&tuner, small, 8, Duration::from_millis(300)).unwrap();
    assert_eq!(plan.trials().iter().map(|t| t.batch).collect::<Vec<_>>(), [1, 2, 4, 8]);
    let limit = SearchLimit::TimeLimit { limit_ms: 200, largest_fit: 4, smallest_failure: Some(8), expected_end: None };
    assert_eq!(plan.stopped_by(), Some(&limit));
    assert!(plan.summary().contains("batches 5..=7 are open (batch 8 does not fit)"), "{}", plan.summary());

    // too short to see anything fit: an error, not a guess
    let err = run_with_pause(&tuner, sim.clone(), 1, Duration::from_millis(300)).unwrap_err();
    assert!(matches!(err, Error::TimeLimit { limit_ms: 200, .. }), "{err}");
}

#[test]
fn a_search_that_finishes_within_its_time_limit_is_unchanged() {
    for sim in [
        Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)),
        Simulation::new(80 * GIB, MemoryCurve::quadratic(3 * GIB, 40 * MIB, 3 * MIB)).oom_from(150),
    ] {
        let unlimited = run(&Tuner::new(), sim.clone()).unwrap();
        let limited = run(&Tuner::new().time_limit(std::time::Duration::from_secs(3600)), sim).unwrap();
        let batches = |plan: &Plan| plan.trials().iter().map(|t| (t.batch, t.outcome)).collect::<Vec<_>>();
        assert_eq!(batches(&limited), batches(&unlimited));
        assert_eq!((limited.largest_batch(), limited.proven_largest()), (unlimited.largest_batch(), true));
        assert_eq!(limited.stopped_by(), None);
    }
}

/// A step that fails with cuBLAS's execution failure above batch `from`, the
/// way a kernel loaded lazily at a larger shape reports a lack of memory.
#[test]
fn a_cublas_execution_failure_above_a_batch_that_ran_counts_as_out_of_memory() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)); // answer 126
    let (mut workload, mut meter) = sim.build();
    let mut step = |batch: usize| {
        if batch > 100 {
            return Err(candle_core::Error::Msg("CublasError(CUBLAS_STATUS_EXECUTION_FAILED)".into()));
        }
        autobatch::Workload::step(&mut workload, batch)
    };
    let plan = Tuner::new().search(&mut step, &mut meter).run().unwrap();
    assert_eq!(plan.largest_batch(), 100, "{plan}");
    assert!(plan.proven_largest());
    assert!(plan.trials().iter().any(|t| t.batch == 101 && t.outcome == Outcome::OutOfMemory), "{plan}");

    // at the very first batch nothing ran before: it is the error it says
    let (mut workload, mut meter) = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)).build();
    let mut step = |batch: usize| {
        let _ = autobatch::Workload::step(&mut workload, batch);
        Err::<(), _>(candle_core::Error::Msg("CublasError(CUBLAS_STATUS_EXECUTION_FAILED)".into()))
    };
    let err = Tuner::new().warmup(false).search(&mut step, &mut meter).run().unwrap_err();
    assert!(matches!(err, Error::Workload { batch: 1, .. }), "{err}");
}

/// A meter whose synchronize reports the device's out-of-memory error (an
/// asynchronous failure surfacing after the step returned) when told to.
struct SyncFails<M> {
    meter: M,
    fail_next_sync: std::rc::Rc<std::cell::Cell<Option<&'static str>>>,
}

impl<M: MemoryMeter> MemoryMeter for SyncFails<M> {
    fn capacity(&self) -> Result<u64, Error> {
        self.meter.capacity()
    }
    fn in_use(&self) -> Result<u64, Error> {
        self.meter.in_use()
    }
    fn reset_peak(&mut self) -> Result<(), Error> {
        self.meter.reset_peak()
    }
    fn peak(&self) -> Result<u64, Error> {
        self.meter.peak()
    }
    fn synchronize(&mut self) -> Result<(), Error> {
        match self.fail_next_sync.take() {
            Some(text) => Err(Error::meter(text)),
            None => self.meter.synchronize(),
        }
    }
}

#[test]
fn an_out_of_memory_error_at_the_synchronize_after_a_step_is_a_failed_trial() {
    let (mut workload, meter) = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)).build();
    let flag = std::rc::Rc::new(std::cell::Cell::new(None));
    let mut meter = SyncFails { meter, fail_next_sync: flag.clone() };
    let mut step = |batch: usize| {
        if batch > 90 {
            flag.set(Some("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"));
        }
        autobatch::Workload::step(&mut workload, batch)
    };
    let plan = Tuner::new().search(&mut step, &mut meter).run().unwrap();
    assert_eq!(plan.largest_batch(), 90, "{plan}");
    assert!(plan.trials().iter().any(|t| t.batch == 91 && t.outcome == Outcome::OutOfMemory), "{plan}");

    // any other failure there is the device's, and ends the run
    let (mut workload, meter) = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)).build();
    let flag = std::rc::Rc::new(std::cell::Cell::new(None));
    let mut meter = SyncFails { meter, fail_next_sync: flag.clone() };
    let mut step = |batch: usize| {
        if batch > 90 {
            flag.set(Some("DriverError(CUDA_ERROR_ILLEGAL_ADDRESS, \"an illegal memory access\")"));
        }
        autobatch::Workload::step(&mut workload, batch)
    };
    let err = Tuner::new().search(&mut step, &mut meter).run().unwrap_err();
    assert!(matches!(err, Error::Meter(_)) && err.to_string().contains("ILLEGAL_ADDRESS"), "{err}");
}

/// A meter that reads several kinds of peak (as a CUDA pool's used and
/// reserved bytes and the device-wide use): each trial keeps them, and the
/// plan says which binds.
#[test]
fn the_kinds_of_peak_a_meter_reads_are_kept_and_said() {
    struct Kinds<M>(M);
    impl<M: MemoryMeter> MemoryMeter for Kinds<M> {
        fn capacity(&self) -> Result<u64, Error> {
            self.0.capacity()
        }
        fn in_use(&self) -> Result<u64, Error> {
            self.0.in_use()
        }
        fn reset_peak(&mut self) -> Result<(), Error> {
            self.0.reset_peak()
        }
        fn peak(&self) -> Result<u64, Error> {
            Ok(self.peak_kinds()?.unwrap().binding())
        }
        fn peak_kinds(&self) -> Result<Option<autobatch::plan::PeakKinds>, Error> {
            // fragmentation reserves 2% above the live bytes
            let used = self.0.peak()?;
            Ok(Some(autobatch::plan::PeakKinds { used, reserved: used + used / 50, device: used / 2 }))
        }
    }
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB));
    let (mut workload, meter) = sim.build();
    let plan = Tuner::new().search(&mut workload, &mut Kinds(meter)).run().unwrap();
    // the reserved bytes bind: (0.9 × 16 GiB) / 1.02 − 2 GiB, per 100 MiB
    let limit = plan.limit_bytes() as f64;
    let expected = ((limit / 1.02 - (2 * GIB) as f64) / (100 * MIB) as f64).floor() as usize;
    assert!(plan.largest_batch().abs_diff(expected) <= 1, "{} vs {expected}", plan.largest_batch());
    let answer = plan.trials().iter().rev().find(|t| t.batch == plan.largest_batch()).unwrap();
    let kinds = answer.peak_kinds.unwrap();
    assert_eq!((answer.peak_bytes, kinds.binding_name()), (Some(kinds.reserved), "reserved"));
    assert!(plan.summary().contains("(reserved binds)"), "{}", plan.summary());
    let json: serde_json::Value = serde_json::from_str(&plan.to_json()).unwrap();
    assert!(json["trials"][0]["peak_kinds"]["reserved"].is_u64(), "{json}");
}

/// Once a batch has fit, a trial expected to end past the time limit (by the
/// largest trial's time per sample) is not started.
#[test]
fn a_trial_expected_to_end_past_the_time_limit_is_not_started() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)); // answer 126
    let (mut workload, mut meter) = sim.build();
    // a millisecond a sample: the jump near 126 would take over 100 ms
    let mut step = |batch: usize| {
        std::thread::sleep(std::time::Duration::from_millis(batch as u64));
        autobatch::Workload::step(&mut workload, batch)
    };
    let tuner = Tuner::new().warmup(false).time_limit(std::time::Duration::from_millis(60));
    let plan = tuner.search(&mut step, &mut meter).run().unwrap();
    // nothing started that could not end in time: at most 60 samples once one fit
    assert!(plan.trials().iter().all(|t| t.batch <= 60), "{plan}");
    let Some(autobatch::plan::SearchLimit::TimeLimit { expected_end, largest_fit, .. }) = plan.stopped_by().cloned()
    else {
        panic!("{plan}")
    };
    assert_eq!(largest_fit, plan.largest_batch());
    // the search stopped before the limit when the trial it wanted was expected to end past it, and said so
    if let Some((batch, end_ms)) = expected_end {
        assert!(end_ms > 60 && batch > largest_fit, "batch {batch} expected to end at {end_ms} ms\n{plan}");
        let text = plan.summary();
        assert!(
            text.contains(&format!("stopped before the 0.060 s time limit: a trial of batch {batch} was expected")),
            "{text}"
        );
    }
}

/// A trial of many steps stops at the time limit after the step it is in,
/// and says how many ran: the limit holds whatever `steps_per_trial` asks.
#[test]
fn a_time_limit_cuts_a_long_trial_after_the_step_it_is_in() {
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB));
    let (mut workload, mut meter) = sim.build();
    let mut step = |batch: usize| {
        std::thread::sleep(std::time::Duration::from_millis(2));
        autobatch::Workload::step(&mut workload, batch)
    };
    let tuner = Tuner::new().warmup(false).steps_per_trial(1_000_000).time_limit(std::time::Duration::from_millis(50));
    let plan = tuner.search(&mut step, &mut meter).run().unwrap();
    assert_eq!(plan.trials().len(), 1, "{plan}");
    assert!(plan.trials()[0].steps < 1_000, "{plan}");
    assert!(matches!(plan.stopped_by(), Some(autobatch::plan::SearchLimit::TimeLimit { .. })), "{plan}");
}

#[test]
fn the_plan_counts_every_step_tuning_ran() {
    // warm-up, search, and the re-check memory that rose after the answer asks for
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)).baseline_rise(6, 64 * MIB);
    let (mut workload, mut meter) = sim.build();
    let plan = Tuner::new().search(&mut workload, &mut meter).run().unwrap();
    assert!(plan.trials().iter().any(|t| t.kind == TrialKind::Recheck), "{plan}");
    assert_eq!(plan.tuning_steps(), workload.steps(), "{plan}");
    assert_eq!(plan.tuning_steps(), plan.trials().len() + 1, "the warm-up is a step too");
    let seconds: f64 = plan.trials().iter().map(|t| t.duration.as_secs_f64()).sum();
    assert!(plan.tuning_seconds() >= seconds);
    assert!(plan.to_string().contains(&format!("tuning took {} steps", workload.steps())), "{plan}");
}

#[test]
fn a_cached_plan_costs_only_the_steps_it_ran_now() {
    let dir = std::env::temp_dir().join(format!("autobatch-tuning-cost-{}", std::process::id()));
    let cache = dir.join("plans.json");
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB));
    let tuner = Tuner::new().cache(&cache).cache_key(autobatch::CacheKey::new().param("model", "simulated"));
    let first = run(&tuner, sim.clone()).unwrap();
    assert!(first.tuning_steps() > 0 && !first.cached());
    let (mut workload, mut meter) = sim.build();
    let second = tuner.search(&mut workload, &mut meter).run().unwrap();
    assert!(second.cached());
    assert_eq!((second.tuning_steps(), workload.steps()), (0, 0));
    assert!(!second.to_string().contains("tuning took"), "{second}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A variant whose change is known (an optimizer's state: the same
/// activations, less held) starts its search where the earlier variant's
/// measured peaks, moved by that change, reach the limit: two steps, the
/// answer and the batch above it, where a search from scratch takes more;
/// a wrong expectation costs steps, never the answer.
#[test]
fn compare_starts_a_variant_where_its_expectation_puts_it_and_stays_exact() {
    use autobatch::ModelVariant;
    let (per_sample, fixed, lean) = (40u64 << 20, 6u64 << 30, 4u64 << 30);
    let curve = |fixed| MemoryCurve::affine(fixed, per_sample);
    let scratch = {
        let (mut workload, mut meter) = Simulation::new(16 << 30, curve(lean)).build();
        Tuner::new().search(&mut workload, &mut meter).run().unwrap()
    };
    for (change, share, exact_start) in [(-2.0 * (1u64 << 30) as f64, 1.0, true), (0.0, 0.5, false)] {
        let (plain, mut meter) = Simulation::new(16 << 30, curve(fixed)).build();
        let leaner = Simulation::new(16 << 30, curve(lean)).build_on(&meter);
        let mut variants =
            vec![ModelVariant::new("as it is", plain), ModelVariant::new("leaner", leaner).expecting(0, share, change)];
        let rows = Tuner::new().search(&mut variants, &mut meter).compare().unwrap().rows;
        let (row, plan) = (&rows[1], rows[1].plan.as_ref().unwrap());
        assert_eq!(plan.largest_batch(), scratch.largest_batch(), "share {share}");
        assert!(plan.proven_largest());
        assert!(rows[0].started_at.is_none());
        let started = row.started_at.unwrap();
        assert_eq!(plan.trials()[0].batch, started);
        if exact_start {
            assert_eq!(started, scratch.largest_batch());
            assert_eq!(plan.trials().len(), 2, "{:?}", plan.trials());
            assert!(plan.trials().len() < scratch.trials().len());
            // the line carried from the first variant, through the peak measured here
            let (bytes_per_sample, fixed_bytes) = row.memory().unwrap();
            assert!((bytes_per_sample - per_sample as f64).abs() < 1.0, "{bytes_per_sample}");
            assert!((fixed_bytes - lean as f64).abs() < per_sample as f64, "{fixed_bytes}");
        } else {
            // twice too far (past the device: the failed steps read what the
            // device held when they stopped, less than their peak), then along
            // the slope it expected and along the failures' readings down to a
            // fit, the chord to the answer and the batch above: no more steps
            // than a search from scratch
            assert!(started > 3 * scratch.largest_batch() / 2, "{started}");
            let tried: Vec<usize> = plan.trials().iter().map(|t| t.batch).collect();
            assert!(tried.len() <= scratch.trials().len(), "{tried:?} against {}", scratch.trials().len());
        }
    }
}

#[test]
fn an_expectation_that_cannot_be_used_is_refused_before_any_trial() {
    use autobatch::ModelVariant;
    let variant = |share: f64, change: f64, like: usize| {
        let (workload, _meter) = Simulation::new(16 << 30, MemoryCurve::affine(1 << 30, 1 << 20)).build();
        ModelVariant::new("lean", workload).expecting(like, share, change)
    };
    for (mut variants, what) in [
        (vec![variant(1.0, 0.0, 0)], autobatch::Setting::Like),
        (vec![variant(1.0, 0.0, 0), variant(1.0, 0.0, 1)], autobatch::Setting::Like),
        (vec![variant(1.0, 0.0, 0).predicted(1.0), variant(0.0, 0.0, 0)], autobatch::Setting::Like),
    ] {
        let (_, mut meter) = Simulation::new(16 << 30, MemoryCurve::affine(1 << 30, 1 << 20)).build();
        match Tuner::new().search(&mut variants, &mut meter).compare() {
            Err(err) if err.is_configuration() => {
                assert_eq!(err.setting(), Some(what), "{err}");
                assert_eq!(err.kind(), autobatch::ErrorKind::Configuration);
                assert_eq!(meter.peak().unwrap(), 0, "no trial ran");
            }
            other => panic!("{:?}", other.map(|c| c.rows.len())),
        }
    }
    for (share, change, what) in [
        (0.0, 0.0, autobatch::Setting::BytesPerSampleShare),
        (f64::NAN, 0.0, autobatch::Setting::BytesPerSampleShare),
        (1.0, f64::INFINITY, autobatch::Setting::FixedBytesChange),
    ] {
        let (first, mut meter) = Simulation::new(16 << 30, MemoryCurve::affine(1 << 30, 1 << 20)).build();
        let mut variants = vec![autobatch::ModelVariant::new("as it is", first), variant(share, change, 0)];
        let err = Tuner::new().search(&mut variants, &mut meter).compare().unwrap_err();
        assert!(matches!(&err, Error::InvalidSetting { setting, .. } if *setting == what), "{err}");
        assert!(err.to_string().contains("lean") && err.to_string().contains("must be"), "{err}");
    }
}

/// The throughput timing keeps to the time limit too: once it has passed no
/// timing trial starts, the plan says so and trains at the largest batch.
#[test]
fn a_time_limit_stops_the_throughput_timing() {
    use autobatch::{plan::Objective, plan::Warning};
    let sim = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)); // answer 126
    let (mut workload, mut meter) = sim.build();
    let mut step = |batch: usize| {
        std::thread::sleep(std::time::Duration::from_millis(5));
        autobatch::Workload::step(&mut workload, batch)
    };
    let tuner = Tuner::new()
        .warmup(false)
        .objective(Objective::Throughput)
        .strategy(Strategy::Binary)
        .time_limit(std::time::Duration::from_millis(20));
    let plan = tuner.search(&mut step, &mut meter).run().unwrap();
    let timed = plan.trials().iter().filter(|t| t.kind == autobatch::plan::TrialKind::Timing).count();
    let cut = plan.warnings().iter().find_map(|w| match w {
        Warning::TimingCut { timed, planned } => Some((*timed, *planned)),
        _ => None,
    });
    let (said, planned) = cut.unwrap_or_else(|| panic!("no timing cut:\n{plan}"));
    assert!(said == timed && timed < planned, "{plan}");
    let throughput = plan.throughput().unwrap();
    let chosen = throughput.chosen_batch;
    assert!(chosen == plan.largest_batch() || throughput.candidates.iter().any(|c| c.batch == chosen), "{plan}");
    assert!(plan.to_string().contains("the time limit"), "{plan}");
}

/// A workload that hides its graph: a closure's, as the tuner sees one.
struct Unseen(autobatch::memory::simulated::SimulatedWorkload);

impl autobatch::Workload for Unseen {
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        self.0.step(batch)
    }
}

#[test]
fn the_largest_tensor_bounds_the_search_above_an_out_of_memory_reading() {
    // the ceiling allows ~4000, the device ends at 2999; a step of 256 equal
    // allocations, which its graph shows
    let sim = Simulation::new(80 * GIB, MemoryCurve::affine(8 * GIB, 16 * MIB)).resident(8 * GIB).allocations(256);
    let sim = sim.oom_from(3000);
    let tuner = Tuner::new();
    let seen = assert_exact(&tuner, sim.clone(), 0.9, 1, 1);
    let (workload, mut meter) = sim.build();
    let unseen = tuner.search(&mut Unseen(workload), &mut meter).run().unwrap();
    assert_eq!(unseen.largest_batch(), seen.largest_batch());
    assert!(seen.proven_largest() && unseen.proven_largest());
    // past the first failure, the graph's largest tensor (a 256th of the step)
    // keeps every trial within one allocation of the batch the reading reaches
    let first_failure = seen.trials().iter().position(|t| t.outcome == Outcome::OutOfMemory).unwrap();
    let window = seen.trials()[first_failure].batch.div_ceil(256) + 1;
    let after: Vec<usize> = seen.trials()[first_failure + 1..].iter().map(|t| t.batch).collect();
    assert!(after.iter().all(|&b| b + window >= 2999 && b <= 3000 + window), "{after:?}");
    let cost = |plan: &Plan| plan.trials().iter().map(|t| t.batch + 4).sum::<usize>();
    println!(
        "graph seen: {} trials, cost {}; unseen: {} trials, cost {}",
        seen.trials().len(),
        cost(&seen),
        unseen.trials().len(),
        cost(&unseen)
    );
    assert!(cost(&seen) < cost(&unseen), "{} against {} without the graph", cost(&seen), cost(&unseen));
}

/// A search's options go with the question they belong to: the evaluation
/// step and the ranks are options of `run`, one at a time, and not of the
/// searches over the input size. They are in the search's type (the
/// combinations do not compile: `Search`'s `compile_fail` doctests); what
/// each option's search answers is tested beside it.
#[test]
fn a_search_takes_the_options_its_question_takes() {
    use autobatch::collective::ThreadCollective;
    use autobatch::memory::simulated::{MemoryCurve, Simulation, SizedSimulation};
    use autobatch::plan::SizeRange;

    let ranks = ThreadCollective::group(1).unwrap();
    let sim = || Simulation::new(16 << 30, MemoryCurve::affine(1 << 30, 64 << 20)).build();
    let (mut training, mut meter) = sim();
    let (mut evaluation, _) = sim();
    let tuner = Tuner::new();
    let alone = tuner.search(&mut training, &mut meter).run().unwrap();
    let evaluating = tuner.search(&mut training, &mut meter).evaluating(&mut evaluation).run().unwrap();
    let across = tuner.search(&mut training, &mut meter).across(&ranks[0]).run().unwrap();
    assert_eq!(evaluating.largest_batch(), alone.largest_batch());
    assert!(evaluating.evaluation().is_some() && alone.evaluation().is_none());
    assert_eq!(across.largest_batch(), alone.largest_batch(), "one rank agrees with itself");

    let sized = SizedSimulation::new(16 << 30, 64, |batch, len| (1 << 30) + (batch * len * 4096) as u64);
    let (mut workload, mut meter) = sized.build();
    assert!(tuner.search(&mut workload, &mut meter).sizes(&[64, 128]).is_ok());
    assert!(tuner.search(&mut workload, &mut meter).longest(8, SizeRange::up_to(512)).is_ok());
}
