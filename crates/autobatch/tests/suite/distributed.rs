//! Several ranks agree on one batch: 1–8 simulated ranks of different capacities.

use autobatch::collective::{Collective, ThreadCollective};
use autobatch::memory::simulated::{MemoryCurve, Simulation};
use autobatch::search::SearchSpace;
use autobatch::{Error, Plan, Tuner};
use proptest::prelude::*;

use crate::common::accumulating::Accumulating;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Runs `tuner` on every rank, each on its own simulated device.
fn on_ranks(tuner: &Tuner, sims: Vec<Simulation>) -> Vec<Result<Plan, Error>> {
    on_ranks_with(tuner, sims.into_iter().map(Simulation::build).collect())
}

/// Runs `tuner` on every rank, each with its own workload and meter.
fn on_ranks_with<W: autobatch::Workload + Send>(
    tuner: &Tuner,
    ranks: Vec<(W, autobatch::memory::simulated::SimulatedMeter)>,
) -> Vec<Result<Plan, Error>> {
    let collective = ThreadCollective::group(ranks.len()).unwrap();
    std::thread::scope(|s| {
        let runs: Vec<_> = collective
            .iter()
            .zip(ranks)
            .map(|(rank, (mut workload, mut meter))| {
                s.spawn(move || tuner.search(&mut workload, &mut meter).across(rank).run())
            })
            .collect();
        runs.into_iter().map(|run| run.join().unwrap()).collect()
    })
}

fn device(capacity_gib: u64) -> Simulation {
    Simulation::new(capacity_gib * GIB, MemoryCurve::affine(6 * GIB, 150 * MIB))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn every_rank_trains_with_the_smallest_largest_batch(
        capacities in prop::collection::vec(16u64..=141, 1..=8),
        target in prop::option::of(64usize..5000),
        multiple_of in prop_oneof![Just(1usize), Just(8)],
    ) {
        let world = capacities.len();
        prop_assume!(target.is_none_or(|t| t >= world * multiple_of));
        let sims: Vec<Simulation> = capacities.iter().map(|&c| device(c)).collect();
        let space = SearchSpace::new(1, None, multiple_of).unwrap();
        let truths: Vec<usize> = sims.iter().map(|s| s.true_largest(0.9, &space, 1 << 20).unwrap()).collect();
        let agreed = *truths.iter().min().unwrap();
        let mut tuner = Tuner::new().multiple_of(multiple_of);
        if let Some(target) = target {
            tuner = tuner.target_effective_batch(target);
        }
        let plans: Vec<Plan> = on_ranks(&tuner, sims).into_iter().map(Result::unwrap).collect();
        for (plan, truth) in plans.iter().zip(&truths) {
            prop_assert_eq!(plan.largest_batch(), agreed);
            prop_assert_eq!(plan.rank_largest_batch(), Some(*truth));
            prop_assert_eq!(plan.world_size(), world);
            let per_rank = plan.accumulation().map_or(plan.micro_batch(), |split| split.micro_batches().sum());
            prop_assert_eq!(per_rank * world, plan.effective_batch());
            prop_assert!(plan.micro_batch() <= agreed);
            prop_assert!(target.is_none_or(|t| plan.effective_batch() >= t));
            // the agreed batch was run and seen to fit on every rank
            prop_assert!(plan.trials().iter().any(|t| t.batch == agreed && t.outcome.fits()));
            prop_assert!(plan.peak_bytes() <= plan.limit_bytes());
        }
        let first = &plans[0];
        prop_assert!(plans.iter().all(|p| (p.micro_batch(), p.accumulation_steps()) == (first.micro_batch(), first.accumulation_steps())));
    }
}

#[test]
fn when_nothing_fits_on_one_rank_no_rank_trains() {
    let sims = vec![device(80), device(4), device(40)];
    let results = on_ranks(&Tuner::new(), sims);
    assert!(matches!(results[1], Err(Error::NothingFits { .. })), "{:?}", results[1]);
    for other in [&results[0], &results[2]] {
        assert!(matches!(other, Err(Error::RankFailed)), "{other:?}");
    }
}

#[test]
fn a_workload_error_on_one_rank_stops_every_rank() {
    let sims = vec![device(80), device(80).error_at(64), device(40), device(24)];
    // Binary doubles through 64, where rank 1's workload fails
    let results = on_ranks(&Tuner::new().strategy(autobatch::search::Strategy::Binary), sims);
    assert!(matches!(results[1], Err(Error::Workload { batch: 64, .. })), "{:?}", results[1]);
    assert!(results.iter().enumerate().filter(|(i, _)| *i != 1).all(|(_, r)| matches!(r, Err(Error::RankFailed))));
}

#[test]
fn an_agreed_batch_that_fails_on_a_rank_is_searched_below() {
    // rank 0: 24 GiB, largest 112; rank 1: 80 GiB, but batch 112 alone needs 60 GiB more
    // (a kernel that picks a workspace-hungry algorithm at that shape)
    let space = SearchSpace::new(1, None, 1).unwrap();
    let small = device(24);
    let truth = small.true_largest(0.9, &space, 1 << 20).unwrap();
    let sims = vec![small, device(80).blip(truth, 60 * GIB)];
    let results: Vec<Plan> = on_ranks(&Tuner::new(), sims).into_iter().map(Result::unwrap).collect();
    for plan in &results {
        assert_eq!(plan.largest_batch(), truth - 1, "{plan}");
        assert!(plan.trials().iter().any(|t| t.batch == truth - 1 && t.outcome.fits()));
    }
}

#[test]
fn a_single_rank_is_a_plain_run() {
    let ranks = ThreadCollective::group(1).unwrap();
    let (mut workload, mut meter) = device(80).build();
    let plan = Tuner::new().search(&mut workload, &mut meter).across(&ranks[0]).run().unwrap();
    let (mut workload, mut meter) = device(80).build();
    assert_eq!(plan.largest_batch(), Tuner::new().search(&mut workload, &mut meter).run().unwrap().largest_batch());
    assert_eq!(ranks[0].world_size(), 1);
}

#[test]
fn a_world_size_that_disagrees_with_the_collective_is_an_error() {
    let ranks = ThreadCollective::group(1).unwrap();
    let (mut workload, mut meter) = device(80).build();
    let err = Tuner::new().world_size(4).search(&mut workload, &mut meter).across(&ranks[0]).run().unwrap_err();
    assert!(
        matches!(&err, Error::InvalidSetting { setting, value: autobatch::Value::Count(4), .. } if *setting == autobatch::Setting::WorldSize),
        "{err}"
    );
    assert!(err.to_string().contains("the collective has 1 ranks"), "{err}");
}

/// Runs `tuner` with uneven ranks on every rank, each with its own workload.
fn on_uneven_ranks<W: autobatch::Workload + Send>(
    tuner: &Tuner,
    ranks: Vec<(W, autobatch::memory::simulated::SimulatedMeter)>,
) -> Vec<Result<Plan, Error>> {
    on_ranks_with(&tuner.clone().uneven_ranks(true), ranks)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Uneven ranks: every rank keeps its own largest batch, the shares add up
    /// to the global batch, each micro-step fits its rank, the shares follow
    /// the capacities, and the loss weights add up to one.
    #[test]
    fn uneven_ranks_share_the_global_batch_by_capacity(
        capacities in prop::collection::vec(16u64..=141, 1..=8),
        target in prop::option::of(1usize..20_000),
        multiple_of in prop_oneof![Just(1usize), Just(8)],
    ) {
        let world = capacities.len();
        prop_assume!(target.is_none_or(|t| t.div_ceil(multiple_of) >= world));
        let sims: Vec<Simulation> = capacities.iter().map(|&c| device(c)).collect();
        let space = SearchSpace::new(1, None, multiple_of).unwrap();
        let truths: Vec<usize> = sims.iter().map(|s| s.true_largest(0.9, &space, 1 << 20).unwrap()).collect();
        let mut tuner = Tuner::new().multiple_of(multiple_of);
        if let Some(target) = target {
            tuner = tuner.target_effective_batch(target);
        }
        let plans: Vec<Plan> =
            on_uneven_ranks(&tuner, sims.into_iter().map(Simulation::build).collect()).into_iter().map(Result::unwrap).collect();
        let split = plans[0].ranks().cloned().unwrap();
        let global = target.map_or(truths.iter().sum(), |t| t.next_multiple_of(multiple_of));
        prop_assert_eq!(split.global_batch, global);
        prop_assert_eq!(split.exact, target.is_none_or(|t| t % multiple_of == 0));
        prop_assert_eq!(split.shares.iter().map(|s| s.samples).sum::<usize>(), global);
        let total: usize = truths.iter().sum();
        prop_assert_eq!(split.accumulation_steps, global.div_ceil(total / multiple_of * multiple_of).max(1));
        let mut weights = 0.0;
        for (rank, (plan, share)) in plans.iter().zip(&split.shares).enumerate() {
            prop_assert_eq!(plan.ranks(), Some(&split));
            prop_assert_eq!(plan.rank(), Some(rank));
            prop_assert_eq!(plan.largest_batch(), truths[rank]);
            prop_assert_eq!(share.largest_micro_batch, truths[rank]);
            prop_assert_eq!(plan.micro_batch(), share.micro_batch());
            prop_assert_eq!(plan.effective_batch(), global);
            prop_assert_eq!(share.steps, split.accumulation_steps);
            prop_assert_eq!(share.micro_batches().sum::<usize>(), share.samples);
            prop_assert!(share.samples >= multiple_of);
            for micro in share.micro_batches() {
                prop_assert!(micro <= truths[rank] && micro % multiple_of == 0);
                prop_assert!(share.micro_batch() - micro <= multiple_of);
            }
            // within two granules of the proportional quota global × mine / Σ
            let quota = global as f64 * truths[rank] as f64 / total as f64;
            prop_assert!((share.samples as f64 - quota).abs() < 2.0 * multiple_of as f64 + 1e-6 * quota,
                "rank {} gets {} for a quota of {}", rank, share.samples, quota);
            weights += (0..split.accumulation_steps).map(|step| split.loss_weight(rank, step)).sum::<f64>();
            guard_runs_the_split(plan)?;
        }
        prop_assert!((weights - 1.0).abs() < 1e-9);
    }
}

/// The guard of an uneven rank's plan runs exactly the rank's share of the
/// split: the same micro-steps in the same sizes and order (empty ones
/// included), at the split's offsets, each scaled by the split's loss weight.
fn guard_runs_the_split(plan: &Plan) -> Result<(), TestCaseError> {
    let (rank, split) = (plan.rank().unwrap(), plan.ranks().unwrap());
    let share = &split.shares[rank];
    let mut guard = autobatch::Guard::new(plan).unwrap();
    let (_, mut meter) = device(80).build();
    for _ in 0..2 {
        let mut calls = Vec::new();
        let report = guard
            .step(&mut meter, |micro| {
                calls.push(micro);
                Ok(())
            })
            .unwrap();
        prop_assert_eq!(calls.len(), share.steps);
        prop_assert_eq!(report.micro_steps, share.steps);
        prop_assert_eq!(report.samples, share.samples);
        prop_assert_eq!(guard.accumulation_steps(), share.steps);
        for (step, micro) in calls.iter().enumerate() {
            prop_assert_eq!(micro.len, share.micro_batch_at(step));
            prop_assert_eq!(
                share.offset + micro.offset..share.offset + micro.offset + micro.len,
                share.micro_range(step)
            );
            prop_assert_eq!(micro.loss_scale.to_bits(), split.loss_weight(rank, step).to_bits());
        }
    }
    Ok(())
}

/// The two cases seen to go wrong: 80 and 40 GiB ranks sharing 1000 samples,
/// and a rank that fits one sample beside one that fits a thousand, with
/// fewer samples than micro-steps (empty micro-steps at the end, run with
/// `len` 0 and `loss_scale` 0).
#[test]
fn the_guard_runs_each_ranks_share_of_the_split() {
    let plans: Vec<Plan> =
        on_uneven_ranks(&Tuner::new().target_effective_batch(1000), vec![device(80).build(), device(40).build()])
            .into_iter()
            .map(Result::unwrap)
            .collect();
    for plan in &plans {
        guard_runs_the_split(plan).unwrap();
    }
    let big = Simulation::new(80 * GIB, MemoryCurve::affine(0, 72 * MIB));
    let tiny = Simulation::new(40 * GIB, MemoryCurve::affine(0, 30 * GIB));
    let plans: Vec<Plan> = on_uneven_ranks(&Tuner::new().target_effective_batch(4500), vec![big.build(), tiny.build()])
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let split = plans[1].ranks().unwrap();
    let share = &split.shares[1];
    assert_eq!(share.largest_micro_batch, 1, "{split}");
    assert!(share.samples < share.steps, "{split}");
    for plan in &plans {
        guard_runs_the_split(plan).unwrap();
    }
    let mut guard = autobatch::Guard::new(&plans[1]).unwrap();
    let (_, mut meter) = device(80).build();
    let mut empty = 0;
    guard
        .step(&mut meter, |micro| {
            if micro.is_empty() {
                assert_eq!(micro.loss_scale, 0.0);
                empty += 1;
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(empty, share.steps - share.samples);
}

#[test]
fn uneven_ranks_demanding_an_exact_global_batch_refuse_a_partial_granule() {
    let sims = vec![device(80).build(), device(40).build()];
    let results =
        on_uneven_ranks(&Tuner::new().multiple_of(8).target_effective_batch(1001).exact_effective_batch(true), sims);
    for result in results {
        assert!(
            matches!(
                result,
                Err(Error::InexactTarget {
                    target: 1001,
                    multiple_of: 8,
                    nearest: 1008,
                    largest_micro_batch: None,
                    ..
                })
            ),
            "{result:?}"
        );
    }
}

#[test]
fn uneven_ranks_when_one_rank_fails_no_rank_trains() {
    let sims = vec![device(80).build(), device(4).build(), device(40).build()];
    let results = on_uneven_ranks(&Tuner::new().target_effective_batch(4096), sims);
    assert!(matches!(results[1], Err(Error::NothingFits { .. })), "{:?}", results[1]);
    assert!(matches!(results[0], Err(Error::RankFailed)) && matches!(results[2], Err(Error::RankFailed)));
}

#[test]
fn uneven_ranks_verify_their_accumulating_micro_steps_and_share_again() {
    let space = SearchSpace::new(1, None, 1).unwrap();
    let capacities = [80, 40, 24];
    let sims = capacities.map(device);
    // the largest b with b + b/4 under the ceiling
    let accumulating: Vec<usize> = sims
        .iter()
        .zip(capacities)
        .map(|(sim, capacity)| {
            let plain = sim.true_largest(0.9, &space, 1 << 20).unwrap();
            Accumulating::largest(sim, plain, (0.9 * (capacity * GIB) as f64) as u64)
        })
        .collect();
    let target = 10_000; // several micro-steps on every rank
    let ranks = sims
        .into_iter()
        .map(|sim| {
            let (workload, meter) = sim.build();
            (Accumulating(workload), meter)
        })
        .collect();
    let plans: Vec<Plan> =
        on_uneven_ranks(&Tuner::new().target_effective_batch(target), ranks).into_iter().map(Result::unwrap).collect();
    let split = plans[0].ranks().cloned().unwrap();
    assert!(split.accumulation_steps > 1 && split.exact);
    // the first share (from the plain largest batches) did not fit: some rank shared again lower
    let truths: Vec<usize> = plans.iter().map(|p| p.largest_batch()).collect();
    let first = autobatch::plan::RankSplit::plan(target, &truths, 1).unwrap();
    assert!(first.shares.iter().zip(&split.shares).any(|(a, b)| b.micro_batch() < a.micro_batch()));
    assert_eq!(split.shares.iter().map(|s| s.samples).sum::<usize>(), target);
    for (rank, plan) in plans.iter().enumerate() {
        assert!(
            plan.micro_batch() <= accumulating[rank],
            "rank {rank}: {} > {}",
            plan.micro_batch(),
            accumulating[rank]
        );
        let checked = plan.trials().iter().rev().find(|t| t.kind == autobatch::plan::TrialKind::Accumulation).unwrap();
        assert_eq!((checked.batch, checked.outcome), (plan.micro_batch(), autobatch::search::Outcome::Fits), "{plan}");
        assert!(plan.accumulation_peak_bytes().unwrap() <= plan.limit_bytes());
        let summary = plan.summary();
        assert!(summary.contains(&format!("plan (rank {rank} of 3, uneven): micro-steps ")), "{summary}");
        assert!(summary.contains(&format!(" × {}", plan.micro_batch())), "{summary}");
        assert!(summary.contains("= global batch 10000 (target 10000, exact)"), "{summary}");
    }
    eprintln!("{}", plans[2].summary());
}

/// Uneven micro-batches with the plan's loss weights give exactly the gradient
/// of the mean loss over the whole global batch, summed (or averaged, with
/// `loss_scale_for_average`) over ranks: a global batch of 1001 that no
/// rank count or micro-batch divides.
#[test]
fn uneven_ranks_loss_weights_give_the_global_mean_gradient() -> candle_core::Result<()> {
    use candle_core::{Device, Tensor, Var};
    let target = 1001;
    let sims = [80, 40, 24].map(|c| device(c).build());
    let plans: Vec<Plan> = on_uneven_ranks(&Tuner::new().target_effective_batch(target), sims.into())
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let dev = Device::Cpu;
    let (features, outputs) = (5, 3);
    let x = Tensor::randn(0f32, 1., (target, features), &dev)?;
    let y = Tensor::randn(0f32, 1., (target, outputs), &dev)?;
    let w = Var::from_tensor(&Tensor::randn(0f32, 1., (features, outputs), &dev)?)?;
    let mean_loss = |rows: std::ops::Range<usize>| -> candle_core::Result<Tensor> {
        let (xs, ys) = (x.narrow(0, rows.start, rows.len())?, y.narrow(0, rows.start, rows.len())?);
        (xs.matmul(w.as_tensor())? - ys)?.sqr()?.mean_all()
    };
    let full = mean_loss(0..target)?.backward()?.get(&w).unwrap().clone();

    let world = plans.len() as f64;
    let (mut summed, mut averaged) = (full.zeros_like()?, full.zeros_like()?);
    let mut seen = 0;
    for plan in &plans {
        let (rank, split) = (plan.rank().unwrap(), plan.ranks().unwrap());
        let share = &split.shares[rank];
        for step in 0..plan.accumulation_steps() {
            let rows = share.micro_range(step);
            if rows.is_empty() {
                continue;
            }
            seen += rows.len();
            let loss = mean_loss(rows)?;
            let weighted = (&loss * split.loss_weight(rank, step))?.backward()?.get(&w).unwrap().clone();
            summed = (summed + weighted)?;
            let scaled = (&loss * split.loss_scale_for_average(rank, step))?.backward()?.get(&w).unwrap().clone();
            averaged = (averaged + (scaled / world)?)?;
        }
    }
    assert_eq!(seen, target);
    // the guard of each rank's plan: its micro-batches, scaled to the global batch
    let mut guarded = full.zeros_like()?;
    let (_, mut meter) = device(80).build();
    for plan in &plans {
        let share = &plan.ranks().unwrap().shares[plan.rank().unwrap()];
        let mut guard = autobatch::Guard::new(plan).unwrap();
        let report = guard
            .step(&mut meter, |micro| {
                if micro.is_empty() {
                    return Ok(());
                }
                let rows = share.offset + micro.offset..share.offset + micro.offset + micro.len;
                let grads = (mean_loss(rows)? * micro.loss_scale)?.backward()?;
                guarded = (&guarded + grads.get(&w).unwrap())?;
                Ok(())
            })
            .unwrap();
        assert_eq!((report.samples, report.micro_steps), (share.samples, plan.accumulation_steps()));
    }
    for gradient in [summed, averaged, guarded] {
        let error = (gradient - &full)?.abs()?.max_all()?.to_scalar::<f32>()?;
        let scale = full.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(error <= 1e-5 * scale, "gradient off by {error} (scale {scale})");
    }
    Ok(())
}

#[test]
fn train_loop_refuses_a_plan_for_uneven_ranks() {
    let sims = vec![device(80).build(), device(40).build()];
    let plans = on_uneven_ranks(&Tuner::new().target_effective_batch(1000), sims);
    let plan = plans[0].as_ref().unwrap();
    let varmap = candle_nn::VarMap::new();
    let optimizer = <candle_nn::SGD as candle_nn::Optimizer>::new(varmap.all_vars(), 0.1).unwrap();
    let err = autobatch::TrainLoop::new(plan, &varmap, optimizer).unwrap_err();
    assert!(matches!(&err, Error::InvalidSetting { setting, .. } if *setting == autobatch::Setting::Plan), "{err}");
    assert!(err.to_string().contains("a global batch shared over 2 uneven ranks"), "{err}");
}

#[test]
fn the_agreed_batch_accumulates_only_where_every_rank_holds_the_accumulator() {
    let space = SearchSpace::new(1, None, 1).unwrap();
    let capacities = [80, 40, 24];
    let sims = capacities.map(device);
    let accumulating = sims
        .iter()
        .zip(capacities)
        .map(|(sim, capacity)| {
            let plain = sim.true_largest(0.9, &space, 1 << 20).unwrap();
            Accumulating::largest(sim, plain, (0.9 * (capacity * GIB) as f64) as u64)
        })
        .min()
        .unwrap();
    let ranks = sims.into_iter().map(|sim| sim.build()).map(|(w, m)| (Accumulating(w), m)).collect();
    let plans: Vec<Plan> =
        on_ranks_with(&Tuner::new().target_effective_batch(6000), ranks).into_iter().map(Result::unwrap).collect();
    let first = &plans[0];
    assert!(first.accumulation_steps() > 1, "{first}");
    assert!(first.micro_batch() <= accumulating, "{} > {accumulating}\n{first}", first.micro_batch());
    for plan in &plans {
        assert_eq!((plan.micro_batch(), plan.accumulation_steps()), (first.micro_batch(), first.accumulation_steps()));
        assert_eq!(plan.accumulation().unwrap().samples_per_rank() * 3, plan.effective_batch());
        assert!(plan.effective_batch() >= 6000);
        assert!(plan.accumulation_peak_bytes().is_some_and(|peak| peak <= plan.limit_bytes()), "{plan}");
    }
    // the smallest rank's agreed batch did not fit with the accumulator: it was lowered
    assert!(first.micro_batch() < first.largest_batch(), "{first}");
}

/// A rank whose share fits keeps offering its whole largest batch when
/// another rank's accumulating share does not fit and all share again.
#[test]
fn uneven_ranks_that_fit_keep_their_capacity_when_another_shares_again() {
    struct Either(autobatch::memory::simulated::SimulatedWorkload, bool);
    impl autobatch::Workload for Either {
        fn step(&mut self, batch: usize) -> candle_core::Result<()> {
            self.0.step(batch)
        }
        fn accumulating_step(&mut self, batch: usize) -> candle_core::Result<()> {
            self.0.step(if self.1 { Accumulating::cost_of(batch) } else { batch })
        }
        fn can_accumulate(&self) -> bool {
            true
        }
    }
    let space = SearchSpace::new(1, None, 1).unwrap();
    let truth = device(80).true_largest(0.9, &space, 1 << 20).unwrap();
    let (plain, plain_meter) = device(80).build();
    let (heavy, heavy_meter) = device(40).build();
    let ranks = vec![(Either(plain, false), plain_meter), (Either(heavy, true), heavy_meter)];
    let plans: Vec<Plan> =
        on_uneven_ranks(&Tuner::new().target_effective_batch(5000), ranks).into_iter().map(Result::unwrap).collect();
    let split = plans[0].ranks().unwrap();
    // rank 1 shared again with less; rank 0 still offered everything it fits
    assert!(split.shares[1].largest_micro_batch < plans[1].largest_batch(), "{split}");
    assert_eq!(split.shares[0].largest_micro_batch, truth, "{split}");
    assert_eq!(split.shares.iter().map(|s| s.samples).sum::<usize>(), 5000);
}

/// The collective's gradient-sized warm-up runs once, before any rank's first
/// step, so that buffers a backend allocates at its first collective (NCCL's)
/// are in every measured baseline.
#[test]
fn the_collective_warms_up_with_the_gradients_size_before_any_step() {
    use std::sync::{Arc, Mutex};
    struct Recording<'a> {
        inner: &'a ThreadCollective,
        events: Arc<Mutex<Vec<String>>>,
    }
    impl Collective for Recording<'_> {
        fn rank(&self) -> usize {
            self.inner.rank()
        }
        fn world_size(&self) -> usize {
            self.inner.world_size()
        }
        fn all_reduce_min(&self, value: u64) -> Result<u64, Error> {
            self.inner.all_reduce_min(value)
        }
        fn all_reduce_max(&self, value: u64) -> Result<u64, Error> {
            self.inner.all_reduce_max(value)
        }
        fn warm_up(&self, bytes: u64) -> Result<(), Error> {
            self.events.lock().unwrap().push(format!("warm-up {bytes}"));
            self.inner.warm_up(bytes)
        }
    }
    let group = ThreadCollective::group(2).unwrap();
    let profile = autobatch::estimate::TrainingSetup::new(
        1_000_000,
        autobatch::estimate::Precision::Mixed,
        autobatch::estimate::OptimizerKind::AdamW,
    );
    let tuner = Tuner::new().profile(profile);
    let logs: Vec<Arc<Mutex<Vec<String>>>> = (0..2).map(|_| Arc::default()).collect();
    std::thread::scope(|s| {
        for (rank, events) in group.iter().zip(&logs) {
            let tuner = &tuner;
            s.spawn(move || {
                let (mut workload, mut meter) = device(40).build();
                let steps = Arc::clone(events);
                let mut step = |batch: usize| {
                    steps.lock().unwrap().push(format!("step {batch}"));
                    autobatch::Workload::step(&mut workload, batch)
                };
                let collective = Recording { inner: rank, events: Arc::clone(events) };
                tuner.search(&mut step, &mut meter).across(&collective).run().unwrap();
            });
        }
    });
    for events in logs {
        let events = events.lock().unwrap();
        // bf16 gradients of a million parameters
        assert_eq!(events[0], "warm-up 2000000", "{events:?}");
        assert_eq!(events.iter().filter(|e| e.starts_with("warm-up")).count(), 1);
        assert!(events.len() > 3);
    }
}

/// An uneven rank's plan says its split once (`Split::Uneven`), writes the
/// numbers a script reads beside it, and reads back as it was.
#[test]
fn an_uneven_ranks_plan_reads_back_from_json() {
    let plans: Vec<Plan> =
        on_uneven_ranks(&Tuner::new().target_effective_batch(1000), vec![device(80).build(), device(40).build()])
            .into_iter()
            .map(Result::unwrap)
            .collect();
    for (rank, plan) in plans.iter().enumerate() {
        let autobatch::plan::Split::Uneven { ranks, to_target: true, .. } = plan.split() else {
            panic!("not an uneven split to a target:\n{plan}");
        };
        assert_eq!((plan.rank(), plan.micro_batch()), (Some(rank), ranks.shares[rank].micro_batch()));
        let json: serde_json::Value = serde_json::from_str(&plan.to_json()).unwrap();
        assert_eq!(json["micro_batch"].as_u64(), Some(plan.micro_batch() as u64));
        assert_eq!((json["rank"].as_u64(), json["effective_batch"].as_u64()), (Some(rank as u64), Some(1000)));
        assert_eq!(json["rank_largest_batch"].as_u64(), Some(plan.largest_batch() as u64));
        assert_eq!(&Plan::from_json(&plan.to_json()).unwrap(), plan);
    }
}
