//! Where a probe runs: the CPU under a budget, or a CUDA device, and its meter.

use autobatch::{Bytes, HeapMeter, MemoryMeter};
use autobatch_models::trainer::Footprint;

use crate::args::{DEFAULT_BUDGET, ProbeArgs};
use crate::device_flags::checked_budget;
use crate::failure::Failure;
use crate::model::ModelConfig;

use super::checks::check_footprint;

/// The CPU budget: `--budget`, or the default, checked against every limit
/// the process lives under ([`crate::limits`], [`checked_budget`]). A search can allocate up to
/// about twice the budget (its one over-budget trial): a budget whose search
/// could pass a limit that ends the process (RAM and swap, the cgroup's
/// limit, `ulimit -v` or `-d`) is refused before any trial runs, and one whose
/// search could pass the RAM available is allowed with a warning.
fn cpu_budget(args: &ProbeArgs) -> Result<(u64, &'static str), Failure> {
    checked_budget(args.search.budget.as_deref(), DEFAULT_BUDGET)
}

/// Worker threads past this many (or 8 per core, if more) are refused: each
/// keeps candle's matmul buffer for good (the host's L2 cache per core), and
/// starting them takes longer than any probe.
const MOST_THREADS: usize = 256;

/// `RAYON_NUM_THREADS`, when it asks for more threads than make sense here.
fn check_threads() -> Result<(), Failure> {
    let Ok(text) = std::env::var("RAYON_NUM_THREADS") else { return Ok(()) };
    let Ok(threads) = text.trim().parse::<usize>() else { return Ok(()) };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let most = MOST_THREADS.max(8 * cores);
    if threads > most {
        return Err(Failure::usage(format!(
            "RAYON_NUM_THREADS={threads} asks for more worker threads than this machine can use ({cores} cores): \
             each keeps a matmul buffer the size of the L2 cache per core; use at most {most}"
        )));
    }
    Ok(())
}

/// What runs once the device is chosen: the mode the flags ask for, on the
/// device's meter (the probe's `Run::dispatch`).
pub type Dispatch<'a> = dyn FnOnce(&mut dyn MemoryMeter, &candle_core::Device, &str, &str) -> Result<(), Failure> + 'a;

/// `--device cpu`: the heap meter under the budget.
pub fn on_cpu(args: &ProbeArgs, model: &ModelConfig, footprint: &Footprint, run: Box<Dispatch>) -> Result<(), Failure> {
    check_threads()?;
    let (budget, why) = cpu_budget(args)?;
    let limit = args.search.ceiling.limit_bytes(budget);
    check_footprint(args, model, footprint, limit)?;
    let mut meter = HeapMeter::new(budget)?;
    let (scratch, threads, each) =
        (meter.thread_scratch_bytes(), meter.buffered_threads(), meter.thread_buffer_bytes());
    let blame_scratch = |failure: Failure| match failure.kind {
        // per-thread buffers that take much of the limit are named as what does not fit
        crate::failure::Kind::NothingFits if scratch > limit / 4 => Failure {
            message: format!(
                "{}; {} of the memory in use before each step is the matmul buffer candle keeps on each of \
                 {threads} threads ({} each, this host's L2 cache per core): fewer threads (RAYON_NUM_THREADS) \
                 leave more room",
                failure.message,
                Bytes(scratch),
                Bytes(each),
            ),
            ..failure
        },
        _ => failure,
    };
    let on = format!("the CPU under a {} budget", Bytes(budget));
    run(&mut meter, &candle_core::Device::Cpu, &on, why).map_err(blame_scratch)
}

/// `--device cuda:N` without the `cuda` feature: refused, saying how to build it.
#[cfg(not(feature = "cuda"))]
pub fn on_cuda(_: &ProbeArgs, _: &ModelConfig, _: &Footprint, ordinal: usize, _: Box<Dispatch>) -> Result<(), Failure> {
    Err(Failure::usage(format!(
        "--device cuda:{ordinal} needs an autobatch built with CUDA: cargo build --release --features cuda"
    )))
}

/// `--device cuda:N`: the CUDA meter of that GPU, its capacity the limit's base.
#[cfg(feature = "cuda")]
pub fn on_cuda(
    args: &ProbeArgs,
    model: &ModelConfig,
    footprint: &Footprint,
    ordinal: usize,
    run: Box<Dispatch>,
) -> Result<(), Failure> {
    if args.search.budget.is_some() {
        return Err(Failure::usage("--budget is for --device cpu: a GPU's capacity is its memory"));
    }
    let mut meter = autobatch::CudaMeter::new(ordinal)?;
    check_footprint(args, model, footprint, args.search.ceiling.limit_bytes(meter.capacity()?))?;
    let device = meter.device().clone();
    let on = format!("{} ({})", meter.name(), Bytes(meter.capacity()?));
    run(&mut meter, &device, &on, "--device")
}
