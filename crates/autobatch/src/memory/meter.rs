//! The [`MemoryMeter`] trait, and a meter that measures nothing.

use crate::{Error, plan::Ceiling, plan::PeakKinds};

/// How much memory a device has and how much a step used at its peak.
///
/// All figures are device-wide bytes: what `nvidia-smi` would show, including
/// memory held by other processes, so that a utilization ceiling means the
/// same thing however busy the device already is.
///
/// The tuner calls, around each trial: [`synchronize`](Self::synchronize),
/// [`release_cached`](Self::release_cached), [`in_use`](Self::in_use) (the
/// baseline), [`reset_peak`](Self::reset_peak), the workload's steps,
/// [`synchronize`](Self::synchronize), [`peak`](Self::peak),
/// [`release_cached`](Self::release_cached), [`in_use`](Self::in_use).
pub trait MemoryMeter {
    /// Bytes that 100% utilization means.
    fn capacity(&self) -> Result<u64, Error>;
    /// Device-wide bytes in use now.
    fn in_use(&self) -> Result<u64, Error>;
    /// Starts a new peak measurement from the memory in use now.
    fn reset_peak(&mut self) -> Result<(), Error>;
    /// Device-wide bytes in use at the peak since the last [`reset_peak`](Self::reset_peak).
    fn peak(&self) -> Result<u64, Error>;
    /// Waits for queued device work to finish, so that [`peak`](Self::peak) is complete.
    fn synchronize(&mut self) -> Result<(), Error> {
        Ok(())
    }
    /// Returns cached but unused memory to the device (e.g. trims a memory pool).
    fn release_cached(&mut self) -> Result<(), Error> {
        Ok(())
    }
    /// Bytes by which [`in_use`](Self::in_use) may drift between two quiet
    /// moments without anything having leaked: allocator slack the meter can
    /// explain. A failed trial that leaves more than this behind is reported as
    /// a leak. Default 0: exact.
    fn slack_bytes(&self) -> u64 {
        0
    }
    /// The device's name, e.g. `NVIDIA H200`: part of the plan cache's key.
    fn device_name(&self) -> String {
        "unnamed device".to_owned()
    }
    /// The kinds of peak since the last reset, where the meter reads
    /// several (a CUDA pool's used and reserved bytes, the device-wide use):
    /// [`peak`](Self::peak) is their highest. `None` by default.
    fn peak_kinds(&self) -> Result<Option<PeakKinds>, Error> {
        Ok(None)
    }
    /// The most elements one tensor may have on this device, where its
    /// kernels count them in fewer bits than memory holds: candle's CUDA
    /// kernels count in 32 bits (`2^32 - 1`). `None` by default (the CPU's
    /// kernels count in `usize`).
    fn element_limit(&self) -> Option<u64> {
        None
    }
    /// The ceiling the caller (the tuner: it owns the ceiling) reads this
    /// meter's capacity under, told before it reads it. A meter whose
    /// capacity is the device's ignores it (the default); one sized by the
    /// room it leaves for a step ([`HeapMeter::with_room`](crate::HeapMeter::with_room))
    /// sizes its capacity so that the room is under this ceiling.
    fn under_ceiling(&mut self, ceiling: Ceiling) {
        let _ = ceiling;
    }
}

impl<M: MemoryMeter + ?Sized> MemoryMeter for &mut M {
    fn capacity(&self) -> Result<u64, Error> {
        (**self).capacity()
    }
    fn in_use(&self) -> Result<u64, Error> {
        (**self).in_use()
    }
    fn reset_peak(&mut self) -> Result<(), Error> {
        (**self).reset_peak()
    }
    fn peak(&self) -> Result<u64, Error> {
        (**self).peak()
    }
    fn synchronize(&mut self) -> Result<(), Error> {
        (**self).synchronize()
    }
    fn release_cached(&mut self) -> Result<(), Error> {
        (**self).release_cached()
    }
    fn slack_bytes(&self) -> u64 {
        (**self).slack_bytes()
    }
    fn device_name(&self) -> String {
        (**self).device_name()
    }
    fn peak_kinds(&self) -> Result<Option<PeakKinds>, Error> {
        (**self).peak_kinds()
    }
    fn element_limit(&self) -> Option<u64> {
        (**self).element_limit()
    }
    fn under_ceiling(&mut self, ceiling: Ceiling) {
        (**self).under_ceiling(ceiling)
    }
}
