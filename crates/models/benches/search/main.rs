//! The side-by-side benchmark: our strategies against faithful
//! re-implementations of the anchors' algorithms, on 55 simulated memory curves
//! and on the real CPU reference workloads at three sizes each.
//!
//! ```text
//! cargo bench --bench search          # writes docs/benchmarks.md
//! ```
//!
//! Per algorithm: trials; probe time in units of T(b*), one step at the true
//! largest batch; found / true largest; unsafe picks (a returned batch that
//! does not fit). Medians and worst cases.

#[global_allocator]
static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();

mod baselines;
#[path = "cases.rs"]
mod cases;

use cases::{CEILING, MIB, real_cases};

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use autobatch::memory::simulated::{MemoryCurve, Simulation};
use autobatch::search::SearchSpace;
use autobatch::{HeapMeter, MemoryMeter, TrackingAllocator, Tuner, Workload, search::Outcome, search::Strategy};
use autobatch_models::trainer::ReferenceWorkload;
use baselines::Algorithm;

const GIB: u64 = 1 << 30;
const OOM_KIND: &str = "oom below ceiling";
/// Allocations per simulated step (the simulation's default).
const DEFAULT_PIECES: u64 = 64;

fn algorithms() -> Vec<Algorithm> {
    vec![
        Algorithm::Ours(Strategy::Binary),
        Algorithm::Ours(Strategy::Predictive),
        Algorithm::Ours(Strategy::Power),
        Algorithm::LightningPower,
        Algorithm::LightningBinsearch,
        Algorithm::Accelerate,
        Algorithm::Ultralytics { fraction: 0.6 },
        Algorithm::Ultralytics { fraction: 0.9 },
    ]
}

/// One algorithm on one case.
struct Result {
    trials: usize,
    cost: f64,
    ratio: f64,
    exact: bool,
    unsafe_pick: bool,
}

#[derive(Default)]
struct Summary {
    results: Vec<Result>,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 }
}

impl Summary {
    fn row(&self, name: &str) -> String {
        let r = &self.results;
        let trials: Vec<f64> = r.iter().map(|x| x.trials as f64).collect();
        let cost: Vec<f64> = r.iter().map(|x| x.cost).collect();
        let ratio: Vec<f64> = r.iter().map(|x| x.ratio).collect();
        let max = |v: &[f64]| v.iter().cloned().fold(f64::MIN, f64::max);
        let min = |v: &[f64]| v.iter().cloned().fold(f64::MAX, f64::min);
        format!(
            "| {name} | {:.0} | {:.0} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} | {:.0}% | {} |",
            median(trials.clone()),
            max(&trials),
            median(cost.clone()),
            max(&cost),
            median(ratio.clone()),
            min(&ratio),
            max(&ratio),
            100.0 * r.iter().filter(|x| x.exact).count() as f64 / r.len() as f64,
            r.iter().filter(|x| x.unsafe_pick).count()
        )
    }
}

const TABLE_HEAD: &str = "| algorithm | steps (median) | steps (worst) | cost in T(b*) (median) | cost (worst) | found / true (median) | found / true (worst low) | found / true (worst high) | exact | unsafe picks |\n|---|---|---|---|---|---|---|---|---|---|";

/// A workload that notes every step the tuner runs (warm-up and re-checks
/// included): the batch and how long it took.
struct Recorded<'a, W: ?Sized> {
    inner: &'a mut W,
    steps: Vec<(usize, f64)>,
}

impl<W: Workload + ?Sized> Workload for Recorded<'_, W> {
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        let started = Instant::now();
        let result = self.inner.step(batch);
        self.steps.push((batch, started.elapsed().as_secs_f64()));
        result
    }

    fn graph_tensors(&self) -> Option<Vec<autobatch::GraphTensor>> {
        self.inner.graph_tensors()
    }
}

/// Our strategy through the tuner, as a user runs it: the answer and every
/// step run (batch, seconds).
fn through_tuner<W: Workload + ?Sized, M: MemoryMeter + ?Sized>(
    strategy: Strategy,
    workload: &mut W,
    meter: &mut M,
) -> (Option<usize>, Vec<(usize, f64)>) {
    let (plan, steps) = plan_through_tuner(strategy, workload, meter);
    (plan.map(|plan| plan.largest_batch()), steps)
}

fn plan_through_tuner<W: Workload + ?Sized, M: MemoryMeter + ?Sized>(
    strategy: Strategy,
    workload: &mut W,
    meter: &mut M,
) -> (Option<autobatch::Plan>, Vec<(usize, f64)>) {
    let mut recorded = Recorded { inner: workload, steps: Vec::new() };
    let plan = Tuner::new().ceiling(CEILING).strategy(strategy).search(&mut recorded, meter).run();
    (plan.ok(), recorded.steps)
}

/// A simulated case: the curve, its capacity, and the step-time model.
struct SimCase {
    kind: &'static str,
    sim: Simulation,
    capacity: u64,
}

fn simulated_cases() -> Vec<SimCase> {
    let capacity = 80 * GIB;
    let limit = (CEILING * capacity as f64) as u64;
    // largest batches spread over 10 … 4096, log-spaced
    let targets =
        |n: usize| -> Vec<f64> { (0..n).map(|i| 10f64 * (4096f64 / 10.0).powf(i as f64 / (n - 1) as f64)).collect() };
    let mut cases = Vec::new();
    for (i, b) in targets(15).into_iter().enumerate() {
        let fixed = capacity / 20 * (1 + i as u64 % 6);
        let per_sample = ((limit - fixed) as f64 / (b + 0.37)) as u64;
        cases.push(SimCase {
            kind: "affine",
            sim: Simulation::new(capacity, MemoryCurve::affine(fixed, per_sample)),
            capacity,
        });
    }
    for (i, b) in targets(10).into_iter().enumerate() {
        // a quarter to three quarters of the activations grow with b²
        let fixed = capacity / 10;
        let share = 0.25 + 0.05 * i as f64;
        let budget = (limit - fixed) as f64;
        let per_sample = (budget * (1.0 - share) / b) as u64;
        let quadratic = (budget * share / (b * b)) as u64;
        cases.push(SimCase {
            kind: "quadratic",
            sim: Simulation::new(capacity, MemoryCurve::quadratic(fixed, per_sample, quadratic.max(1))),
            capacity,
        });
    }
    for (i, b) in targets(10).into_iter().enumerate() {
        let fixed = capacity / 8 + 12_345;
        let per_sample = ((limit - fixed) as f64 / (b + 0.61)) as u64;
        let granule = [2 * MIB, 20 * MIB, 64 * MIB][i % 3];
        cases.push(SimCase {
            kind: "stepped",
            sim: Simulation::new(capacity, MemoryCurve::affine(fixed, per_sample)).rounding(granule),
            capacity,
        });
    }
    for (i, b) in targets(10).into_iter().enumerate() {
        let fixed = capacity / 6;
        let per_sample = ((limit - fixed) as f64 / (b + 0.5)) as u64;
        let noise = (per_sample as f64 * (0.2 + 0.07 * i as f64)) as u64;
        cases.push(SimCase {
            kind: "noisy",
            sim: Simulation::new(capacity, MemoryCurve::affine(fixed, per_sample)).noise(noise, 7 + i as u64),
            capacity,
        });
    }
    for (i, b) in targets(10).into_iter().enumerate() {
        let fixed = capacity / 10;
        let per_sample = ((limit - fixed) as f64 / (b + 0.5)) as u64;
        let oom_from = ((b * (0.6 + 0.035 * i as f64)) as usize).max(2);
        cases.push(SimCase {
            kind: OOM_KIND,
            // weights and optimizer state are held between steps; a failed step
            // has handed out the allocations before its failing one
            sim: Simulation::new(capacity, MemoryCurve::affine(fixed, per_sample))
                .resident(fixed)
                .allocations(DEFAULT_PIECES)
                .oom_from(oom_from),
            capacity,
        });
    }
    cases
}

/// The step time model of simulated cases: proportional to the batch plus a
/// fixed overhead worth four samples.
fn sim_time(batch: usize) -> f64 {
    batch as f64 + 4.0
}

fn simulated(report: &mut String) {
    let cases = simulated_cases();
    let mut summaries: Vec<Summary> = algorithms().iter().map(|_| Summary::default()).collect();
    let mut oom_summaries: Vec<Summary> = algorithms().iter().map(|_| Summary::default()).collect();
    let mut predictive_small = Vec::new();
    for case in &cases {
        let summaries = if case.kind == OOM_KIND { &mut oom_summaries } else { &mut summaries };
        let limit = (CEILING * case.capacity as f64) as u64;
        let space = SearchSpace::new(1, None, 1).unwrap();
        let truth = case.sim.true_largest(CEILING, &space, 1 << 20).expect("every case has a fitting batch");
        let measure_sim = |b: usize| -> (Outcome, Option<u64>) {
            let peak = case.sim.device_peak(b);
            if let Some(held) = case.sim.peak_before_failure(b) {
                (Outcome::OutOfMemory, Some(held))
            } else if peak <= limit {
                (Outcome::Fits, Some(peak))
            } else {
                (Outcome::OverCeiling, Some(peak))
            }
        };
        for (algorithm, summary) in algorithms().iter().zip(summaries.iter_mut()) {
            let (answer, tried) = match *algorithm {
                Algorithm::Ours(strategy) => {
                    let (mut workload, mut meter) = case.sim.clone().build();
                    let (answer, steps) = through_tuner(strategy, &mut workload, &mut meter);
                    (answer, steps.into_iter().map(|(batch, _)| batch).collect())
                }
                _ => algorithm.run(limit, case.capacity, &mut { measure_sim }),
            };
            let fits = |b: usize| measure_sim(b).0.fits();
            let cost = tried.iter().map(|&b| sim_time(b)).sum::<f64>() / sim_time(truth);
            let found = answer.unwrap_or(0);
            summary.results.push(Result {
                trials: tried.len(),
                cost,
                ratio: found as f64 / truth as f64,
                exact: found == truth,
                unsafe_pick: answer.is_some_and(|b| !fits(b)),
            });
            if matches!(algorithm, Algorithm::Ours(Strategy::Predictive)) {
                predictive_small.push((case.kind, truth, tried.len(), cost));
                if std::env::var("AUTOBATCH_BENCH_TRACE").is_ok() {
                    eprintln!("{} b*={truth} cost {cost:.2}: {tried:?}", case.kind);
                }
            }
        }
    }
    let _ = writeln!(report, "## Simulated curves\n");
    let _ = writeln!(
        report,
        "{} curves on an 80 GiB device, ceiling {:.0}%, true largest batches from 10 to 4096: {} affine, {} quadratic \
         (25–70% of activations growing with b²), {} stepped (2, 20 and 64 MiB allocator granules), {} noisy (per-batch \
         noise of 20–83% of a sample's bytes), {} with a real out-of-memory error below the ceiling (at 60–92% of the \
         ceiling's batch). Step time model: T(b) ∝ b + 4. Every algorithm starts from scratch; ours run through \
         the tuner, and every step it runs is counted (the warm-up, re-checks).\n",
        cases.len(),
        CEILING * 100.0,
        cases.iter().filter(|c| c.kind == "affine").count(),
        cases.iter().filter(|c| c.kind == "quadratic").count(),
        cases.iter().filter(|c| c.kind == "stepped").count(),
        cases.iter().filter(|c| c.kind == "noisy").count(),
        cases.iter().filter(|c| c.kind == OOM_KIND).count(),
    );
    let _ = writeln!(report, "Every curve but those with an out-of-memory error below the ceiling:\n\n{TABLE_HEAD}");
    for (algorithm, summary) in algorithms().iter().zip(&summaries) {
        let _ = writeln!(report, "{}", summary.row(&algorithm.name()));
    }
    let _ = writeln!(
        report,
        "\nThe curves where the device runs out of memory below the ceiling (the ceiling is not the binding limit; \
         a failed step, of {DEFAULT_PIECES} allocations, reads those it made before the failing one, as a pool's \
         high-water mark does):\n\n{TABLE_HEAD}"
    );
    for (algorithm, summary) in algorithms().iter().zip(&oom_summaries) {
        let _ = writeln!(report, "{}", summary.row(&algorithm.name()));
    }
    let _ = writeln!(report, "\nautobatch predictive by kind of curve (steps and cost in T(b*)):\n");
    let _ = writeln!(
        report,
        "| curve | cases | steps (median) | steps (worst) | cost (median) | cost (worst) |\n|---|---|---|---|---|---|"
    );
    for kind in ["affine", "quadratic", "stepped", "noisy", OOM_KIND] {
        let rows: Vec<_> = predictive_small.iter().filter(|r| r.0 == kind).collect();
        let _ = writeln!(
            report,
            "| {kind} | {} | {:.1} | {} | {:.2} | {:.2} |",
            rows.len(),
            median(rows.iter().map(|r| r.2 as f64).collect()),
            rows.iter().map(|r| r.2).max().unwrap_or(0),
            median(rows.iter().map(|r| r.3).collect()),
            rows.iter().map(|r| r.3).fold(0.0, f64::max),
        );
    }
    let _ = writeln!(report);
}

fn step_peak(workload: &mut dyn ReferenceWorkload, batch: usize) -> (u64, Duration) {
    TrackingAllocator::reset_peak();
    let started = Instant::now();
    workload.step(batch).expect("reference workloads do not fail on the CPU");
    (TrackingAllocator::peak_bytes(), started.elapsed())
}

fn real(report: &mut String) {
    let mut summaries: Vec<Summary> = algorithms().iter().map(|_| Summary::default()).collect();
    let mut accuracy = Vec::new();
    let mut rows = String::new();
    for (name, build, budget) in real_cases() {
        let mut workload = build();
        let limit = (CEILING * budget as f64) as u64;
        let mut meter = HeapMeter::new(budget).unwrap();
        // the truth: the default search through the tuner, verified by brute force
        // (it fits, the next does not); the same run is Predictive's row below
        let (predictive_plan, predictive_steps) = plan_through_tuner(Strategy::Predictive, &mut *workload, &mut meter);
        let predictive_plan = predictive_plan.expect("the reference models fit under their budgets");
        let truth = predictive_plan.largest_batch();
        // three steps at the answer (its peak and T(b*), their median time) and one above it
        let at_truth: Vec<(u64, Duration)> = (0..3).map(|_| step_peak(&mut *workload, truth)).collect();
        let fits_peak = at_truth.iter().map(|&(peak, _)| peak).max().unwrap_or(0);
        let (next_peak, next_time) = step_peak(&mut *workload, truth + 1);
        assert!(fits_peak <= limit + 4096 && next_peak > limit.saturating_sub(4096), "{name}: brute force disagrees");
        let t_star = median(at_truth.iter().map(|&(_, time)| time.as_secs_f64()).collect());
        let plan_error = predictive_plan.memory_model().map(|m| m.prediction_error);
        // the anchors' algorithms run each batch's step once, shared: a heap
        // peak repeats to the byte, and its time is the first measured
        let mut measured: std::collections::HashMap<usize, (u64, Duration)> =
            [(truth, at_truth[0]), (truth + 1, (next_peak, next_time))].into_iter().collect();
        for (algorithm, summary) in algorithms().iter().zip(&mut summaries) {
            let mut durations = Vec::new();
            let mut peaks = Vec::new();
            let (answer, tried) = match *algorithm {
                Algorithm::Ours(strategy) => {
                    let (plan, steps) = match strategy {
                        Strategy::Predictive => (Some(predictive_plan.clone()), predictive_steps.clone()),
                        _ => plan_through_tuner(strategy, &mut *workload, &mut meter),
                    };
                    durations.extend(steps.iter().map(|&(_, seconds)| seconds));
                    let trials = plan.iter().flat_map(|plan| plan.trials());
                    peaks.extend(trials.filter_map(|trial| Some((trial.batch, trial.peak_bytes?))));
                    (plan.map(|plan| plan.largest_batch()), steps.into_iter().map(|(batch, _)| batch).collect())
                }
                _ => {
                    let mut measure = |b: usize| -> (Outcome, Option<u64>) {
                        let (peak, elapsed) = *measured.entry(b).or_insert_with(|| step_peak(&mut *workload, b));
                        durations.push(elapsed.as_secs_f64());
                        peaks.push((b, peak));
                        (if peak <= limit { Outcome::Fits } else { Outcome::OverCeiling }, Some(peak))
                    };
                    algorithm.run(limit, budget, &mut measure)
                }
            };
            let unsafe_pick =
                answer.is_some_and(|b| measured.entry(b).or_insert_with(|| step_peak(&mut *workload, b)).0 > limit);
            let found = answer.unwrap_or(0);
            summary.results.push(Result {
                trials: tried.len(),
                cost: durations.iter().sum::<f64>() / t_star,
                ratio: found as f64 / truth as f64,
                exact: found == truth,
                unsafe_pick,
            });
            if matches!(algorithm, Algorithm::Ours(Strategy::Predictive)) {
                // the line through the cheap trials (under half the answer), as Predictive jumps with it
                let small: Vec<(usize, u64)> =
                    peaks.iter().copied().filter(|&(b, p)| 2 * b < truth && p <= limit).collect();
                let tail = &small[small.len().saturating_sub(3)..];
                let predicted =
                    baselines::straight_line(tail).map(|(fixed, per_sample)| fixed + per_sample * truth as f64);
                let error = predicted.map(|p| (p - fits_peak as f64) / fits_peak as f64);
                accuracy.push((name.clone(), error, plan_error));
                let _ = writeln!(
                    rows,
                    "| {name} | {} | {truth} | {:.1} ms | {} | {:.2} | {} | {} |",
                    autobatch::Bytes(budget),
                    t_star * 1e3,
                    tried.len(),
                    durations.iter().sum::<f64>() / t_star,
                    error.map_or("-".to_owned(), |e| format!("{:+.2}%", 100.0 * e)),
                    plan_error.map_or("-".to_owned(), |e| format!("{:+.2}%", 100.0 * e)),
                );
            }
        }
        eprintln!("{name}: b* = {truth}");
    }
    let _ = writeln!(report, "## Real CPU workloads\n");
    let _ = writeln!(
        report,
        "The reference models, three sizes each, probed with real forward/backward/AdamW steps and measured by the \
         tracking allocator under a budget (ceiling {:.0}%). The true largest batch is the default search's answer, checked \
         by brute force (it fits, the next does not). Costs are measured step times over T(b*), the median of three steps at b*; ours run through the tuner, every step counted (the warm-up, re-checks); the anchors' algorithms share one measured step per batch (its peak repeats to the byte).\n",
        CEILING * 100.0
    );
    let _ = writeln!(report, "{TABLE_HEAD}");
    for (algorithm, summary) in algorithms().iter().zip(&summaries) {
        let _ = writeln!(report, "{}", summary.row(&algorithm.name()));
    }
    let _ = writeln!(
        report,
        "\n### autobatch predictive, case by case\n\n\
         Every step the tuner ran (the warm-up included) and their time in steps at b*: what finding the \
         batch costs in training steps (the plan reports it as `tuning took N steps`). Prediction error at b*: \
         the line through the cheap trials (batches under b*/2, the three largest) that \
         Predictive jumps with, and the plan's memory model (all full trials but b*'s), against the measured peak.\n"
    );
    let _ = writeln!(
        report,
        "| workload | budget | b* | T(b*) | steps run | tuning cost in T(b*) | jump line error | plan model error \
         |\n|---|---|---|---|---|---|---|---|"
    );
    report.push_str(&rows);
    let errors: Vec<f64> = accuracy.iter().filter_map(|a| a.1).collect();
    let plan_errors: Vec<f64> = accuracy.iter().filter_map(|a| a.2).collect();
    let under = |v: &[f64]| v.iter().filter(|&&e| e < 0.0).count();
    let _ = writeln!(
        report,
        "\nJump line: median |error| {:.2}%, worst {:.2}%, under-estimates {} of {}. Plan model: median |error| {:.2}%, \
         worst {:.2}%, under-estimates {} of {}.\n",
        100.0 * median(errors.iter().map(|e| e.abs()).collect()),
        100.0 * errors.iter().map(|e| e.abs()).fold(0.0, f64::max),
        under(&errors),
        errors.len(),
        100.0 * median(plan_errors.iter().map(|e| e.abs()).collect()),
        100.0 * plan_errors.iter().map(|e| e.abs()).fold(0.0, f64::max),
        under(&plan_errors),
        plan_errors.len(),
    );
}

use autobatch_testkit::docs;

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs this too: keep that quick
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let started = Instant::now();
    let mut report = String::from(
        "# Benchmarks: finding the largest batch\n\nGenerated by `cargo bench --bench search` (benches/search/main.rs); \
         the anchors' algorithms are in benches/search/baselines.rs. Ours: `autobatch binary`, `autobatch predictive`, \
         `autobatch power`.\n\n",
    );
    simulated(&mut report);
    // AUTOBATCH_BENCH=simulated: the simulated half only, in a second (nothing is written)
    if std::env::var("AUTOBATCH_BENCH").as_deref() == Ok("simulated") {
        print!("{report}");
        return;
    }
    real(&mut report);
    let _ = writeln!(
        report,
        "Run on {} CPU threads in {:.0} s.",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        started.elapsed().as_secs_f64()
    );
    print!("{report}");
    // the sections other benches own (benches/lengths.rs) stay
    report += &docs::owned_sections();
    let path = docs::benchmarks_md();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let report = docs::with_host(&report);
    std::fs::write(&path, &report).unwrap();
    eprintln!("wrote {}", path.display());
}
