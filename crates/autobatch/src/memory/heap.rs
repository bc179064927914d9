//! Measuring a CPU step: live heap bytes under a budget.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::memory::tracking::TrackingAllocator;
use crate::{Error, MemoryMeter, plan::Ceiling};

/// A [`MemoryMeter`] for the CPU: capacity is a budget you set, in use and peak
/// are live heap bytes counted by [`TrackingAllocator`], which must be the
/// process's global allocator.
///
/// On the CPU a failed allocation aborts the process, so "out of memory" here
/// means the measured peak went over the ceiling × budget: the trial ran, and
/// is classified [`Outcome::OverCeiling`](crate::search::Outcome::OverCeiling). Keep the
/// budget well under physical memory: the over-budget trial of a doubling search
/// allocates up to about twice it.
///
/// ```
/// #[global_allocator]
/// static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
///
/// use autobatch::{HeapMeter, Tuner};
///
/// // 32 MiB for the step under a 50% ceiling, beside what the process holds
/// // (`HeapMeter::new(bytes)` sets the budget itself)
/// let mut meter = HeapMeter::with_room(32 << 20)?;
/// // a "step" that needs 1 MiB per sample
/// let mut step = |batch: usize| -> candle_core::Result<()> {
///     let activations = vec![1u8; batch << 20];
///     std::hint::black_box(&activations);
///     Ok(())
/// };
/// let plan = Tuner::new().ceiling(0.5).search(&mut step, &mut meter).run()?;
/// assert!(plan.peak_bytes() <= plan.limit_bytes());
/// assert!(plan.largest_batch() == 31 || plan.largest_batch() == 32, "{plan}");
/// # Ok::<(), autobatch::Error>(())
/// ```
///
/// candle's CPU matmul keeps a buffer the size of the host's L2 cache on
/// every thread that has run one: the meter brings each worker to it before
/// every reading, so an answer does not depend on what ran before
/// ([`thread_buffer_bytes`](Self::thread_buffer_bytes); docs/library.md
/// tells why). Budgets in fixed bytes hold on one host only:
/// [`HeapMeter::with_room`] sizes one from what the process holds now.
#[derive(Debug, Clone)]
pub struct HeapMeter {
    budget_bytes: u64,
    slack_bytes: u64,
    /// Sized by its room: what must stay under the ceiling (the heap held
    /// when it was made and the room).
    wanted_bytes: Option<u64>,
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
            return Err(Error::zero(crate::Setting::BudgetBytes));
        }
        if !TrackingAllocator::is_installed() {
            return Err(Error::Device(crate::DeviceProblem::AllocatorNotInstalled));
        }
        settle_thread_buffers();
        Ok(HeapMeter { budget_bytes, slack_bytes: Self::DEFAULT_SLACK_BYTES, wanted_bytes: None })
    }

    /// A meter whose budget leaves `room_bytes` under the tuner's ceiling
    /// above the heap the process holds now (its weights, other tests'
    /// leftovers, the threads' matmul buffers, brought to size first): the
    /// smallest budget `b` with `ceiling × b ≥ in use + room_bytes`, for the
    /// ceiling the tuner tells it ([`MemoryMeter::under_ceiling`]; until
    /// then [`Ceiling::default`]). The room is what a test or an example
    /// means by "this much memory for the step", on any host and after
    /// anything the process did before, whatever the ceiling.
    ///
    /// ```
    /// #[global_allocator]
    /// static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
    ///
    /// use autobatch::{HeapMeter, MemoryMeter, Tuner};
    ///
    /// let kept = vec![7u8; 50 << 20]; // 50 MiB the process holds, as weights would be
    /// let mut meter = HeapMeter::with_room(16 << 20)?;
    /// let mut step = |batch: usize| -> candle_core::Result<()> {
    ///     std::hint::black_box(vec![1u8; batch << 20]); // 1 MiB a sample
    ///     Ok(())
    /// };
    /// for ceiling in [0.9, 0.5] {
    ///     let plan = Tuner::new().ceiling(ceiling).search(&mut step, &mut meter).run()?;
    ///     assert!(plan.largest_batch() == 15 || plan.largest_batch() == 16, "{plan}");
    /// }
    /// # drop(kept);
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn with_room(room_bytes: u64) -> Result<Self, Error> {
        let mut meter = HeapMeter::new(1)?;
        meter.wanted_bytes = Some(meter.in_use()?.saturating_add(room_bytes));
        meter.under_ceiling(Ceiling::default());
        Ok(meter)
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

    /// Heap bytes candle's matmul keeps for good on each thread that has run
    /// one: gemm's packing buffer, the size of this host's L2 cache per core
    /// (as gemm reads it from the operating system). The meter brings every
    /// thread it measures to it; part of every baseline.
    pub fn thread_buffer_bytes(&self) -> u64 {
        gemm_common::cache::CACHE_INFO[1].cache_bytes as u64
    }

    /// What the matmul buffers of this host will hold once a meter has
    /// brought this thread and every worker of the global thread pool to
    /// them: [`thread_buffer_bytes`](Self::thread_buffer_bytes) × (the pool's
    /// threads + 1), known before any meter is made (an estimate of a CPU
    /// step counts it).
    pub fn host_scratch_bytes() -> u64 {
        let threads = rayon::current_num_threads() as u64 + 1;
        gemm_common::cache::CACHE_INFO[1].cache_bytes as u64 * threads
    }

    /// The threads that hold [`thread_buffer_bytes`](Self::thread_buffer_bytes)
    /// because a meter brought them to it: this one and the workers of each
    /// thread pool a meter was used in.
    pub fn buffered_threads(&self) -> usize {
        BUFFERED_THREADS.load(Ordering::Relaxed)
    }

    /// [`thread_buffer_bytes`](Self::thread_buffer_bytes) ×
    /// [`buffered_threads`](Self::buffered_threads): what the matmul buffers
    /// hold of every baseline.
    pub fn thread_scratch_bytes(&self) -> u64 {
        self.thread_buffer_bytes() * self.buffered_threads() as u64
    }
}

/// Brings the calling thread and every worker of the rayon pool it is in (the
/// global pool, or candle's own inside `Device::with_context`) to the matmul
/// buffer gemm keeps per thread. gemm allocates it at a thread's first matmul
/// that does not pack its left operand up front, which depends on the shapes
/// and the host's caches: touching the thread-local itself is exact whatever
/// the shapes, and costs nothing on a thread that has it.
fn settle_thread_buffers() {
    settle_this_thread();
    rayon::broadcast(|_| settle_this_thread());
}

fn settle_this_thread() {
    thread_local! {
        static SETTLED: Settled = Settled::new();
    }
    SETTLED.with(|_| ());
}

/// A thread's mark that its matmul buffer is there: it is counted in
/// [`BUFFERED_THREADS`] while the thread (and so the buffer) lives.
struct Settled;

impl Settled {
    fn new() -> Settled {
        gemm_common::gemm::L2_SLAB.with(|slab| drop(slab.borrow()));
        BUFFERED_THREADS.fetch_add(1, Ordering::Relaxed);
        Settled
    }
}

impl Drop for Settled {
    fn drop(&mut self) {
        BUFFERED_THREADS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Threads that a meter brought to their matmul buffer and that still live.
static BUFFERED_THREADS: AtomicUsize = AtomicUsize::new(0);

impl MemoryMeter for HeapMeter {
    fn capacity(&self) -> Result<u64, Error> {
        Ok(self.budget_bytes)
    }

    fn under_ceiling(&mut self, ceiling: Ceiling) {
        let Some(wanted) = self.wanted_bytes else { return };
        let mut budget = (wanted as f64 / ceiling.fraction()).ceil() as u64;
        while ceiling.limit_bytes(budget) < wanted {
            budget += 1;
        }
        while budget > 1 && ceiling.limit_bytes(budget - 1) >= wanted {
            budget -= 1;
        }
        self.budget_bytes = budget;
    }

    fn in_use(&self) -> Result<u64, Error> {
        settle_thread_buffers();
        Ok(TrackingAllocator::live_bytes())
    }

    fn reset_peak(&mut self) -> Result<(), Error> {
        settle_thread_buffers();
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
        format!(
            "the CPU heap: {} worker threads and the caller, each holding a {} matmul buffer",
            rayon::current_num_threads(),
            crate::units::format_bytes(self.thread_buffer_bytes())
        )
    }
}
