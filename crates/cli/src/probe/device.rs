//! Where a probe runs: the CPU under a budget, or a CUDA device, and its meter.

use autobatch::{Bytes, HeapMeter, MemoryMeter};
use autobatch_models::trainer::Footprint;

use crate::args::{ProbeArgs, DEFAULT_BUDGET};
use crate::failure::Failure;
use crate::model::ModelConfig;
use crate::parse::parse_bytes;

use super::checks::check_footprint;

/// Where to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu,
    Cuda(usize),
}

pub fn parse_device(text: &str) -> Result<DeviceSpec, Failure> {
    let invalid = || Failure::usage(format!("invalid device {text:?}: use cpu, cuda or cuda:N (N a GPU ordinal)"));
    match text {
        "cpu" => Ok(DeviceSpec::Cpu),
        "cuda" => Ok(DeviceSpec::Cuda(0)),
        other => match other.strip_prefix("cuda:") {
            Some(ordinal) => ordinal.parse().map(DeviceSpec::Cuda).map_err(|_| invalid()),
            None => Err(invalid()),
        },
    }
}

/// The CPU budget: `--budget`, or the default, checked against every limit
/// the process lives under ([`crate::limits`]). A search can allocate up to
/// about twice the budget (its one over-budget trial): a budget whose search
/// could pass a limit that ends the process (RAM and swap, the cgroup's
/// limit, `ulimit -v` or `-d`) is refused before any trial runs, and one whose
/// search could pass the RAM available is allowed with a warning.
fn cpu_budget(args: &ProbeArgs) -> Result<(u64, &'static str), Failure> {
    checked_budget(args.search.budget.as_deref(), DEFAULT_BUDGET)
}

/// `--budget` (or `default`) read and checked against every limit the
/// process lives under, as [`cpu_budget`] says; with where it came from.
pub fn checked_budget(given: Option<&str>, default: &'static str) -> Result<(u64, &'static str), Failure> {
    let (text, why) = match given {
        Some(text) => (text, "--budget"),
        None => (default, "the default; set --budget"),
    };
    let budget = parse_bytes(text).map_err(|err| Failure::usage(format!("--budget: {err}")))?;
    if budget == 0 {
        return Err(Failure::usage("--budget is 0: give the memory the step may use, e.g. 256MiB"));
    }
    let search = budget.saturating_mul(2);
    let twice = match budget.checked_mul(2) {
        Some(bytes) => Bytes(bytes).to_string(),
        None => "more than 16 EiB".to_owned(),
    };
    let threads = rayon::current_num_threads() as u64 + 1;
    // the limits that end the process first: a budget refused is not also warned about
    let mut rooms = crate::limits::rooms();
    rooms.sort_by_key(|room| !room.hard);
    for room in rooms {
        let reserve = if room.what.contains("ulimit") { threads * PER_THREAD_RESERVE } else { 0 };
        let needed = search.saturating_add(reserve);
        if needed <= room.bytes {
            continue;
        }
        let most = room.bytes.saturating_sub(reserve) / 2;
        if room.hard {
            let advice = if most >= 1 << 20 {
                format!("use at most --budget {}", crate::parse::flag_bytes(most))
            } else {
                format!("that leaves no room for a probe beside its {threads} threads: raise the limit")
            };
            return Err(Failure::usage(format!(
                "--budget {}: a search can allocate about twice the budget ({twice}), and this process may use only {} \
                 more under {}; {advice}",
                Bytes(budget),
                Bytes(room.bytes),
                room.what,
            )));
        }
        log::warn!(
            "--budget {}: a search can allocate about twice the budget ({twice}), more than the {} of {}: it may swap",
            Bytes(budget),
            Bytes(room.bytes),
            room.what
        );
    }
    Ok((budget, why))
}

/// Address space each worker thread may reserve beyond what it allocates (an
/// allocator arena and a stack): counted against `ulimit -v` and `ulimit -d`.
const PER_THREAD_RESERVE: u64 = 66 << 20;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices() {
        assert_eq!(parse_device("cpu").unwrap(), DeviceSpec::Cpu);
        assert_eq!(parse_device("cuda").unwrap(), DeviceSpec::Cuda(0));
        assert_eq!(parse_device("cuda:3").unwrap(), DeviceSpec::Cuda(3));
        for bad in ["gpu", "cuda:", "cuda:x", "CPU", "cuda:-1"] {
            assert!(parse_device(bad).is_err(), "{bad}");
        }
    }
}
