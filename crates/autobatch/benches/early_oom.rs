//! The search when the device runs out of memory below the ceiling (another
//! process, fragmentation): what it costs with the failed step's reading and
//! without, with the step's graph known and with a closure that shows none.
//!
//! ```text
//! cargo bench --bench early_oom            # writes its section of docs/benchmarks.md
//! cargo bench --bench early_oom -- trace   # the batches a few cases run
//! ```
//!
//! Simulated devices of 80 GiB whose memory ends at 60% of it (another process
//! holds the rest), under the default 90% ceiling: the out-of-memory error is
//! what binds. Each step holds 5, 10, 15 or 25% of the device whatever the
//! batch (by case, so that the device's end falls at different places inside
//! the allocation that fails) and a share per sample chosen so that the largest batch that runs spreads over
//! 10 … 4096 (log-spaced); it allocates in 2, 12, 64, 300 or 2000 equal
//! pieces, and a failed step's reading is the pool's high-water mark: the
//! pieces handed out before the one that found no room. Each case is searched
//! by `Tuner` (the default predictive strategy) as a workload that shows its
//! graph (`Workload::graph_tensors`: the pieces) and as a closure that shows
//! none, with the reading and without it (the meter reads no peak after a
//! failed step). Cost: the time of every step run (the warm-up included), a
//! step's time taken as its batch plus four samples' worth, in steps at the
//! answer, `T(b*)`.

use std::cell::Cell;
use std::fmt::Write as _;
use std::rc::Rc;

use autobatch::memory::simulated::{MemoryCurve, Simulation};
use autobatch::search::SearchSpace;
use autobatch::{Error, MemoryMeter, Tuner, Workload};

const GIB: u64 = 1 << 30;
const CAPACITY: u64 = 80 * GIB;
const CEILING: f64 = 0.9;
const PIECES: [u64; 5] = [2, 12, 64, 300, 2000];
const CASES: usize = 16;

fn step_time(batch: usize) -> f64 {
    batch as f64 + 4.0
}

/// The simulated step as a closure would show it: no graph.
struct Closure<W> {
    inner: W,
}

impl<W: Workload> Workload for Closure<W> {
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        self.inner.step(batch)
    }
}

/// Every step run, and whether the last one failed.
struct Recorded<W> {
    inner: W,
    steps: Vec<usize>,
    failed: Rc<Cell<bool>>,
}

impl<W: Workload> Workload for Recorded<W> {
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        self.steps.push(batch);
        let result = self.inner.step(batch);
        self.failed.set(result.is_err());
        result
    }

    fn graph_tensors(&self) -> Option<Vec<autobatch::GraphTensor>> {
        self.inner.graph_tensors()
    }
}

/// A meter that reads no peak after a failed step: no reading.
struct Unread<M> {
    inner: M,
    failed: Rc<Cell<bool>>,
}

impl<M: MemoryMeter> MemoryMeter for Unread<M> {
    fn capacity(&self) -> Result<u64, Error> {
        self.inner.capacity()
    }
    fn in_use(&self) -> Result<u64, Error> {
        self.inner.in_use()
    }
    fn reset_peak(&mut self) -> Result<(), Error> {
        self.inner.reset_peak()
    }
    fn peak(&self) -> Result<u64, Error> {
        if self.failed.get() {
            return Err(Error::meter("no reading after an out-of-memory error"));
        }
        self.inner.peak()
    }
    fn slack_bytes(&self) -> u64 {
        self.inner.slack_bytes()
    }
}

/// The share of the device each case's step holds whatever the batch, by
/// case: the failed jump's batch against the answer varies with it (1.55 …
/// 1.86), and with it where the device's end falls inside the allocation
/// that failed (with one share the end would sit at the same place in it in
/// every case).
const HELD_SHARES: [f64; 4] = [0.05, 0.10, 0.15, 0.25];

/// Case `index` with `pieces` allocations a step and its largest batch near
/// `target`: the device's memory ends at 60% of what it reports, so the
/// first batch whose step needs more fails with out-of-memory.
fn case(target: f64, pieces: u64, index: usize) -> Simulation {
    let fixed = (CAPACITY as f64 * HELD_SHARES[index % HELD_SHARES.len()]) as u64;
    let end = CAPACITY * 6 / 10;
    let per_sample = ((end - fixed) as f64 / (target + 0.5)) as u64;
    let fails_from = ((end - fixed) / per_sample + 1) as usize;
    Simulation::new(CAPACITY, MemoryCurve::affine(fixed, per_sample))
        .resident(fixed)
        .allocations(pieces)
        .oom_from(fails_from)
}

/// The answer and the cost in steps at it, or `None` when the search failed.
fn search(sim: &Simulation, graph: bool, reading: bool) -> Option<(usize, f64, usize)> {
    let (workload, meter) = sim.clone().build();
    let failed = Rc::new(Cell::new(false));
    let plan = if graph {
        let mut recorded = Recorded { inner: workload, steps: Vec::new(), failed: failed.clone() };
        let plan = run(&mut recorded, meter, reading, failed);
        plan.map(|plan| (plan, recorded.steps))
    } else {
        let mut recorded = Recorded { inner: Closure { inner: workload }, steps: Vec::new(), failed: failed.clone() };
        let plan = run(&mut recorded, meter, reading, failed);
        plan.map(|plan| (plan, recorded.steps))
    };
    let (answer, steps) = plan?;
    let cost = steps.iter().map(|&b| step_time(b)).sum::<f64>() / step_time(answer);
    Some((answer, cost, steps.len()))
}

fn run<W: Workload, M: MemoryMeter>(
    workload: &mut W,
    meter: M,
    reading: bool,
    failed: Rc<Cell<bool>>,
) -> Option<usize> {
    let tuner = Tuner::new().ceiling(CEILING);
    let plan = if reading {
        let mut meter = meter;
        tuner.search(workload, &mut meter).run()
    } else {
        tuner.search(workload, &mut Unread { inner: meter, failed }).run()
    };
    plan.ok().map(|plan| plan.largest_batch())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 }
}

fn main() {
    // `cargo bench --bench early_oom -- trace`: the batches a few cases run
    let targets: Vec<f64> = (0..CASES).map(|i| 10.0 * (4096.0f64 / 10.0).powf(i as f64 / (CASES - 1) as f64)).collect();
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|arg| arg == "trace") {
        // `-- trace PIECES graph|closure`: every case of one row
        let pieces = args.get(at + 1).and_then(|p| p.parse().ok());
        let graph = args.get(at + 2).map(|kind| kind != "closure");
        if let (Some(pieces), Some(graph)) = (pieces, graph) {
            for (index, &target) in targets.iter().enumerate() {
                trace(target, pieces, index, graph, true);
            }
            return;
        }
        for (graph, reading) in [(true, true), (false, true), (true, false)] {
            trace(300.0, 12, 1, graph, reading);
            trace(40.0, 2, 1, graph, reading);
        }
        return;
    }
    let space = SearchSpace::new(1, None, 1).unwrap();
    let mut section = String::from(
        "## Out of memory below the ceiling\n\n`cargo bench --bench early_oom`: simulated 80 GiB devices whose \
         memory ends at 60% of it, the step allocating in 2 to 2000 pieces and holding 5 to 25% of the device whatever the batch, each case searched by the predictive \
         strategy with the failed step's reading (the pool's high-water mark) and without, for a workload that \
         shows its graph and for a closure that shows none. Cost in steps at the answer, T(b*) (a step's time its \
         batch plus four samples' worth, every step counted, the warm-up too); 16 cases a row, largest batches \
         10 … 4096.\n\n| workload | pieces | median, reading | worst, reading | median, none | worst, none | \
         above none | exact |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mut totals = [(Vec::new(), Vec::new()), (Vec::new(), Vec::new())];
    for (kind, graph) in [("graph", true), ("closure", false)] {
        for pieces in PIECES {
            let (mut with, mut without) = (Vec::new(), Vec::new());
            let (mut above, mut exact) = (0, 0);
            for (index, &target) in targets.iter().enumerate() {
                let sim = case(target, pieces, index);
                let truth = sim.true_largest(CEILING, &space, 1 << 20).expect("a batch runs");
                let read = search(&sim, graph, true);
                let unread = search(&sim, graph, false);
                if let (Some((a, cost, _)), Some((b, plain, _))) = (read, unread) {
                    exact += usize::from(a == truth && b == truth);
                    above += usize::from(cost > plain + 1e-9);
                    with.push(cost);
                    without.push(plain);
                }
            }
            let worst = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
            let (worst_with, worst_without) = (worst(&with), worst(&without));
            let row = format!(
                "| {kind} | {pieces} | {:.2} | {worst_with:.2} | {:.2} | {worst_without:.2} | {above} | {exact} of {} |",
                median(&mut with.clone()),
                median(&mut without.clone()),
                targets.len()
            );
            eprintln!("{row}");
            section += &row;
            section.push('\n');
            let slot = &mut totals[usize::from(!graph)];
            slot.0.extend(with);
            slot.1.extend(without);
        }
    }
    for (kind, (with, without)) in ["graph", "closure"].iter().zip(totals.iter_mut()) {
        let _ = writeln!(
            section,
            "\nOver every {kind} case: median {:.2} T(b*) with the reading ({:.2} without), worst {:.2}.",
            median(with),
            median(without),
            with.iter().copied().fold(0.0, f64::max)
        );
    }
    let path = shared::replace("early-oom", &shared::with_host(&section)).unwrap();
    eprintln!("wrote {}", path.display());
}

use autobatch_testkit::docs as shared;

/// The batches one case runs, and its answer.
fn trace(target: f64, pieces: u64, index: usize, graph: bool, reading: bool) {
    let sim = case(target, pieces, index);
    let (workload, meter) = sim.clone().build();
    let failed = Rc::new(Cell::new(false));
    let steps = if graph {
        let mut recorded = Recorded { inner: workload, steps: Vec::new(), failed: failed.clone() };
        run(&mut recorded, meter, reading, failed);
        recorded.steps
    } else {
        let mut recorded = Recorded { inner: Closure { inner: workload }, steps: Vec::new(), failed: failed.clone() };
        run(&mut recorded, meter, reading, failed);
        recorded.steps
    };
    let space = SearchSpace::new(1, None, 1).unwrap();
    let truth = sim.true_largest(CEILING, &space, 1 << 20).unwrap();
    let cost = steps.iter().map(|&b| step_time(b)).sum::<f64>() / step_time(truth);
    eprintln!(
        "target {target:.0} pieces {pieces} graph {graph} reading {reading}: truth {truth}, cost {cost:.2}, steps {steps:?}"
    );
}
