//! The one measure sequence: read the baseline, reset the peak, run the
//! steps, synchronize, read the peak, release cached memory. The tuner's
//! trials and warm-up and the headroom check all measure through it.

use std::time::{Duration, Instant};

use crate::{Error, MemoryMeter};

/// What one measured run saw.
pub(crate) struct Measured {
    /// The steps' own result: the first error stops the run.
    pub(crate) result: candle_core::Result<()>,
    /// Device-wide bytes in use just before the steps.
    pub(crate) baseline_bytes: u64,
    /// The device-wide peak over the steps, as the meter read it.
    pub(crate) peak: Result<u64, Error>,
    /// Its kinds, where the meter reads several.
    pub(crate) peak_kinds: Option<crate::plan::PeakKinds>,
    /// Wall-clock time of the steps, synchronization included.
    pub(crate) duration: Duration,
    /// The steps that ran (fewer than asked when the deadline passed, or a
    /// step failed: the failed one counts).
    pub(crate) steps: usize,
    /// Whether synchronizing and releasing cached memory afterwards worked
    /// (the first failure, if any).
    pub(crate) settled: Result<(), Error>,
}

/// Runs `step` up to `steps` times (stopping at its first error, or after any
/// step once `deadline` has passed: at least one runs) between a peak reset
/// and a peak read, and releases cached memory after.
pub(crate) fn measure<M: MemoryMeter + ?Sized>(
    meter: &mut M,
    steps: usize,
    deadline: Option<Instant>,
    mut step: impl FnMut() -> candle_core::Result<()>,
) -> Result<Measured, Error> {
    let baseline_bytes = meter.in_use()?;
    meter.reset_peak()?;
    let started = Instant::now();
    let mut result = Ok(());
    let mut ran = 0;
    while ran < steps {
        result = step();
        ran += 1;
        if result.is_err() || deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            break;
        }
    }
    let synced = meter.synchronize();
    let duration = started.elapsed();
    // a meter that reads several kinds of peak reads them once: the peak is their highest
    let peak_kinds = meter.peak_kinds().ok().flatten();
    let peak = match peak_kinds {
        Some(kinds) => Ok(kinds.binding()),
        None => meter.peak(),
    };
    let released = meter.release_cached();
    Ok(Measured { result, baseline_bytes, peak, peak_kinds, duration, steps: ran, settled: synced.and(released) })
}
