//! A global allocator that counts live heap bytes and their peak.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

// Process-wide counters: there is only one global allocator, and the meter must
// find them without a reference to the static the binary declared.
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// A [`GlobalAlloc`] over the system allocator that counts live heap bytes and a
/// resettable peak, so that [`HeapMeter`](crate::HeapMeter) can measure a CPU
/// training step exactly.
///
/// Install it in your binary or test crate:
///
/// ```
/// #[global_allocator]
/// static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
///
/// let before = autobatch::TrackingAllocator::live_bytes();
/// let buffer = vec![0u8; 1 << 20];
/// assert!(autobatch::TrackingAllocator::live_bytes() >= before + (1 << 20));
/// drop(buffer);
/// ```
///
/// Counting costs two relaxed atomic read-modify-writes per allocation. Existing
/// crates were looked at first: `stats_alloc` counts totals but keeps no peak,
/// and `cap` enforces a limit but has no resettable peak; a peak the tuner can
/// reset between trials is the one thing this needs.
#[derive(Debug, Default, Clone, Copy)]
pub struct TrackingAllocator;

impl TrackingAllocator {
    /// The allocator, for a `#[global_allocator]` static.
    pub const fn new() -> Self {
        TrackingAllocator
    }

    /// Heap bytes allocated and not yet freed, process-wide.
    pub fn live_bytes() -> u64 {
        LIVE.load(Ordering::Relaxed) as u64
    }

    /// The most heap bytes live at once since the last [`reset_peak`](Self::reset_peak).
    pub fn peak_bytes() -> u64 {
        PEAK.load(Ordering::Relaxed) as u64
    }

    /// Starts a new peak from the bytes live now.
    pub fn reset_peak() {
        PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Whether this allocator is the process's global allocator: it has counted
    /// at least one allocation (after making one, so the answer is certain).
    pub fn is_installed() -> bool {
        let probe = std::hint::black_box(Box::new(0u64));
        drop(probe);
        ALLOCATIONS.load(Ordering::Relaxed) > 0
    }

    fn grew(bytes: usize) {
        let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
        PEAK.fetch_max(live, Ordering::Relaxed);
    }

    fn shrank(bytes: usize) {
        LIVE.fetch_sub(bytes, Ordering::Relaxed);
    }
}

unsafe impl GlobalAlloc for TrackingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            Self::grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            Self::grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) };
        Self::shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // Old and new blocks may coexist during the move: count the new one
            // first so that the peak is never under-reported.
            Self::grew(new_size);
            Self::shrank(layout.size());
        }
        new
    }
}
