//! `--device` and `--budget`, read and checked the same way for `probe` and
//! `serve`: where a command runs, with the meter that measures it (chosen
//! once, [`on_device`]), and the CPU budget against every limit the process
//! lives under.

use autobatch::plan::Ceiling;
use autobatch::{Bytes, HeapMeter, MemoryMeter};

use crate::failure::Failure;
use crate::values::DeviceSpec;

/// `--budget` (or `default`) read and checked against every limit the
/// process lives under, as the probe's CPU budget says; with where it came from.
pub fn checked_budget(given: Option<u64>, default: u64) -> Result<(u64, &'static str), Failure> {
    let (budget, why) = match given {
        Some(bytes) => (bytes, "--budget"),
        None => (default, "the default; set --budget"),
    };
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

/// The device a command runs on, with the meter that measures it: the CPU's
/// heap under the budget, or a GPU's memory. Past [`on_device`] one path runs,
/// whichever it is.
pub struct OnDevice {
    pub meter: Box<dyn MemoryMeter>,
    pub device: candle_core::Device,
    /// The device in words, for the header and the chart: `the CPU under a
    /// 256 MiB budget`, `NVIDIA H100 80GB HBM3 (79.2 GiB)`.
    pub words: String,
    /// Where its size came from: `--budget`, the default, `--device`.
    pub size_from: &'static str,
    /// On the CPU, the matmul buffers its worker threads keep for good.
    pub thread_buffers: Option<ThreadBuffers>,
    /// The most a step may use: the ceiling × the device's capacity.
    pub limit: u64,
}

/// The matmul buffers candle's CPU threads keep: in use before any step.
#[derive(Clone, Copy, Debug)]
pub struct ThreadBuffers {
    pub bytes: u64,
    pub threads: usize,
    pub each: u64,
}

/// `--device` (and on the CPU `--budget`, or `default_budget`), checked, with
/// its meter and the limit `ceiling` puts on it: the one place a command's
/// limit is computed.
pub fn on_device(
    device: DeviceSpec,
    budget: Option<u64>,
    default_budget: u64,
    ceiling: Ceiling,
) -> Result<OnDevice, Failure> {
    let mut on = match device {
        DeviceSpec::Cpu => {
            check_threads()?;
            let (budget, size_from) = checked_budget(budget, default_budget)?;
            let meter = HeapMeter::new(budget)?;
            let thread_buffers = ThreadBuffers {
                bytes: meter.thread_scratch_bytes(),
                threads: meter.buffered_threads(),
                each: meter.thread_buffer_bytes(),
            };
            OnDevice {
                meter: Box::new(meter),
                device: candle_core::Device::Cpu,
                words: format!("the CPU under a {} budget", Bytes(budget)),
                size_from,
                thread_buffers: Some(thread_buffers),
                limit: 0,
            }
        }
        DeviceSpec::Cuda(ordinal) => on_cuda(ordinal, budget)?,
    };
    on.limit = ceiling.limit_bytes(on.meter.capacity()?);
    Ok(on)
}

/// `--device cuda:N`: the CUDA meter of that GPU, its capacity the limit's base.
#[cfg(feature = "cuda")]
fn on_cuda(ordinal: usize, budget: Option<u64>) -> Result<OnDevice, Failure> {
    if budget.is_some() {
        return Err(Failure::usage("--budget is for --device cpu: a GPU's capacity is its memory"));
    }
    let meter = autobatch::CudaMeter::new(ordinal)?;
    let device = meter.device().clone();
    let words = format!("{} ({})", meter.name(), Bytes(meter.capacity()?));
    Ok(OnDevice { meter: Box::new(meter), device, words, size_from: "--device", thread_buffers: None, limit: 0 })
}

/// `--device cuda:N` without the `cuda` feature: refused, saying how to build it.
#[cfg(not(feature = "cuda"))]
fn on_cuda(ordinal: usize, _: Option<u64>) -> Result<OnDevice, Failure> {
    Err(Failure::usage(format!(
        "--device cuda:{ordinal} needs an autobatch built with CUDA: cargo build --release --features cuda"
    )))
}

impl OnDevice {
    /// `failure`, where nothing fits and the CPU threads' matmul buffers take
    /// much of the limit, naming them as what does not fit.
    pub fn blame_thread_buffers(&self, failure: Failure) -> Failure {
        match (failure.kind, self.thread_buffers) {
            (crate::failure::Kind::NothingFits, Some(buffers)) if buffers.bytes > self.limit / 4 => Failure {
                message: format!(
                    "{}; {} of the memory in use before each step is the matmul buffer candle keeps on each of \
                     {} threads ({} each, this host's L2 cache per core): fewer threads (RAYON_NUM_THREADS) \
                     leave more room",
                    failure.message,
                    Bytes(buffers.bytes),
                    buffers.threads,
                    Bytes(buffers.each),
                ),
                ..failure
            },
            _ => failure,
        }
    }
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

/// Address space each worker thread may reserve beyond what it allocates (an
/// allocator arena and a stack): counted against `ulimit -v` and `ulimit -d`.
const PER_THREAD_RESERVE: u64 = 66 << 20;
