//! Several ranks agree on one batch: 1–8 simulated ranks of different capacities.

use autobatch::collective::{Collective, ThreadCollective};
use autobatch::memory::simulated::{MemoryCurve, Simulation};
use autobatch::search::SearchSpace;
use autobatch::{Error, Plan, Tuner};
use proptest::prelude::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Runs `tuner` on every rank, each on its own simulated device.
fn on_ranks(tuner: &Tuner, sims: Vec<Simulation>) -> Vec<Result<Plan, Error>> {
    let ranks = ThreadCollective::group(sims.len()).unwrap();
    std::thread::scope(|s| {
        let runs: Vec<_> = ranks
            .iter()
            .zip(sims)
            .map(|(rank, sim)| {
                s.spawn(move || {
                    let (mut workload, mut meter) = sim.build();
                    tuner.run_distributed(&mut workload, &mut meter, rank)
                })
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
            prop_assert_eq!(plan.largest_batch, agreed);
            prop_assert_eq!(plan.rank_largest_batch, Some(*truth));
            prop_assert_eq!(plan.world_size, world);
            prop_assert_eq!(plan.micro_batch * plan.accumulation_steps * world, plan.effective_batch);
            prop_assert!(plan.micro_batch <= agreed);
            prop_assert!(target.is_none_or(|t| plan.effective_batch >= t));
            // the agreed batch was run and seen to fit on every rank
            prop_assert!(plan.trials.iter().any(|t| t.batch == agreed && t.outcome.fits()));
            prop_assert!(plan.peak_bytes <= plan.limit_bytes());
        }
        let first = &plans[0];
        prop_assert!(plans.iter().all(|p| (p.micro_batch, p.accumulation_steps) == (first.micro_batch, first.accumulation_steps)));
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
    let results = on_ranks(&Tuner::new().strategy(autobatch::Strategy::Binary), sims);
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
        assert_eq!(plan.largest_batch, truth - 1, "{plan}");
        assert!(plan.trials.iter().any(|t| t.batch == truth - 1 && t.outcome.fits()));
    }
}

#[test]
fn a_single_rank_is_a_plain_run() {
    let ranks = ThreadCollective::group(1).unwrap();
    let (mut workload, mut meter) = device(80).build();
    let plan = Tuner::new().run_distributed(&mut workload, &mut meter, &ranks[0]).unwrap();
    let (mut workload, mut meter) = device(80).build();
    assert_eq!(plan.largest_batch, Tuner::new().run(&mut workload, &mut meter).unwrap().largest_batch);
    assert_eq!(ranks[0].world_size(), 1);
}

#[test]
fn a_world_size_that_disagrees_with_the_collective_is_an_error() {
    let ranks = ThreadCollective::group(1).unwrap();
    let (mut workload, mut meter) = device(80).build();
    let err = Tuner::new().world_size(4).run_distributed(&mut workload, &mut meter, &ranks[0]).unwrap_err();
    assert!(matches!(err, Error::WorldSizeMismatch { tuner: 4, collective: 1 }), "{err}");
}
