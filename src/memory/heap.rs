//! Measuring a CPU step: live heap bytes under a budget.

use crate::memory::tracking::TrackingAllocator;
use crate::{Error, MemoryMeter};

/// A [`MemoryMeter`] for the CPU: capacity is a budget you set, in use and peak
/// are live heap bytes counted by [`TrackingAllocator`], which must be the
/// process's global allocator.
///
/// On the CPU a failed allocation aborts the process, so "out of memory" here
/// means the measured peak went over the ceiling × budget: the trial ran, and
/// is classified [`Outcome::OverCeiling`](crate::Outcome::OverCeiling). Keep the
/// budget well under physical memory: the over-budget trial of a doubling search
/// allocates up to about twice it.
///
/// ```
/// #[global_allocator]
/// static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
///
/// use autobatch::{HeapMeter, MemoryMeter, Tuner};
///
/// let mut meter = HeapMeter::new(64 << 20)?; // 64 MiB budget
/// // a "step" that needs 1 MiB per sample
/// let mut step = |batch: usize| -> candle_core::Result<()> {
///     let activations = vec![1u8; batch << 20];
///     std::hint::black_box(&activations);
///     Ok(())
/// };
/// let plan = Tuner::new().ceiling(0.5).run(&mut step, &mut meter)?;
/// assert!(plan.peak_bytes <= 32 << 20);
/// assert!(plan.largest_batch > 16 && plan.largest_batch < 32);
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct HeapMeter {
    budget_bytes: u64,
    slack_bytes: u64,
}

impl HeapMeter {
    /// Default [`slack_bytes`](MemoryMeter::slack_bytes): 256 KiB. Once warm, heap
    /// peaks of a candle step repeat to within about a kilobyte, but runtimes
    /// keep small caches (thread-local buffers, lazily built tables) that
    /// appear at first use.
    pub const DEFAULT_SLACK_BYTES: u64 = 256 << 10;

    /// A meter whose capacity is `budget_bytes`. Fails when the budget is zero or
    /// when [`TrackingAllocator`] is not the global allocator (checked, not assumed).
    pub fn new(budget_bytes: u64) -> Result<Self, Error> {
        if budget_bytes == 0 {
            return Err(Error::Zero { setting: "budget_bytes" });
        }
        if !TrackingAllocator::is_installed() {
            return Err(Error::AllocatorNotInstalled);
        }
        engage_thread_scratch()?;
        Ok(HeapMeter { budget_bytes, slack_bytes: Self::DEFAULT_SLACK_BYTES })
    }

    /// Sets the bytes of drift in use that do not count as a leak.
    pub fn with_slack(mut self, slack_bytes: u64) -> Self {
        self.slack_bytes = slack_bytes;
        self
    }

    /// The budget: what 100% utilization means.
    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    /// Heap bytes candle's matmul keeps for good on this thread and on each
    /// worker of the pool its CPU kernels run on (about 2 MiB a thread,
    /// measured when the first meter engaged them): part of every baseline,
    /// and more of it with more threads (`RAYON_NUM_THREADS`).
    pub fn thread_scratch_bytes(&self) -> u64 {
        THREAD_SCRATCH.get().copied().unwrap_or(0)
    }
}

/// Runs a small matmul on this thread and on every worker of the rayon pool
/// candle's CPU kernels use, so that the scratch buffer its matmul keeps per
/// thread for good (gemm's packing slab, the size of the L2 cache: 1–2 MiB) is
/// part of every baseline. Otherwise the first trial that brings a new worker
/// into a matmul holds that much more memory after it than before, which
/// looks exactly like a leak.
fn engage_thread_scratch() -> Result<(), Error> {
    let matmul = || -> candle_core::Result<()> {
        let a = candle_core::Tensor::ones((64, 64), candle_core::DType::F32, &candle_core::Device::Cpu)?;
        a.matmul(&a).map(drop)
    };
    let before = TrackingAllocator::live_bytes();
    matmul()?;
    rayon::broadcast(|_| matmul()).into_iter().collect::<candle_core::Result<()>>()?;
    // the first engagement is the one that allocates (later ones find the scratch there)
    let _ = THREAD_SCRATCH.set(TrackingAllocator::live_bytes().saturating_sub(before));
    Ok(())
}

/// Heap bytes the first engagement of the worker threads' matmul scratch kept.
static THREAD_SCRATCH: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

impl MemoryMeter for HeapMeter {
    fn capacity(&self) -> Result<u64, Error> {
        Ok(self.budget_bytes)
    }

    fn in_use(&self) -> Result<u64, Error> {
        Ok(TrackingAllocator::live_bytes())
    }

    fn reset_peak(&mut self) -> Result<(), Error> {
        TrackingAllocator::reset_peak();
        Ok(())
    }

    fn peak(&self) -> Result<u64, Error> {
        Ok(TrackingAllocator::peak_bytes())
    }

    fn slack_bytes(&self) -> u64 {
        self.slack_bytes
    }

    fn device_name(&self) -> String {
        format!("cpu heap ({} threads)", std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}
