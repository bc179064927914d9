//! What a CUDA memory pool's counters say, kept apart from the driver so that
//! it can be tested without a GPU: whether the pool sees the allocations at
//! all, and which peak binds.

use crate::plan::PeakKinds;

/// One reading of the pool's counters and the device's use.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PoolCounters {
    /// Bytes in use device-wide (`total − free`).
    pub(crate) device: u64,
    /// The pool's live bytes (`USED_MEM_CURRENT`).
    pub(crate) used: u64,
    /// The pool's reserved bytes (`RESERVED_MEM_CURRENT`).
    pub(crate) reserved: u64,
    /// The pool's live-bytes high-water mark (`USED_MEM_HIGH`).
    pub(crate) used_high: u64,
    /// The pool's reserved high-water mark (`RESERVED_MEM_HIGH`).
    pub(crate) reserved_high: u64,
}

/// The peaks of a step from the counters read at the reset and after it.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn peaks_from_counters(at_reset: PoolCounters, after: PoolCounters, device_after: u64) -> PeakKinds {
    PeakKinds {
        used: at_reset.device.saturating_add(after.used_high.saturating_sub(at_reset.used)),
        reserved: at_reset.device.saturating_add(after.reserved_high.saturating_sub(at_reset.reserved)),
        device: device_after,
    }
}

/// Whether the pool saw a test allocation of `bytes`: without memory pool
/// support, or when the allocator goes around the pool (candle falls back to
/// `cuMemAlloc` where cudarc finds no pools), its counters stay where they
/// were, and a peak read from them would be a constant. `Err` says why.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn pool_sees_allocations(
    pools_supported: bool,
    before: PoolCounters,
    during: PoolCounters,
    bytes: u64,
) -> Result<(), String> {
    if !pools_supported {
        return Err("the device reports no memory pool support (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 0, \
                    as on some virtual GPUs): candle then allocates with cuMemAlloc, whose peak no counter records"
            .to_owned());
    }
    let grew = during.used.saturating_sub(before.used);
    if grew < bytes {
        return Err(format!(
            "a test allocation of {bytes} bytes grew the pool's live bytes by {grew}: the allocator goes around the \
             device's default pool, so its counters cannot show a step's peak"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_pool_that_does_not_grow_is_blind() {
        let before = PoolCounters { device: 500 * MIB, used: 10 * MIB, ..PoolCounters::default() };
        let grew = PoolCounters { used: 14 * MIB, ..before };
        assert!(pool_sees_allocations(true, before, grew, 4 * MIB).is_ok());
        let err = pool_sees_allocations(true, before, before, 4 * MIB).unwrap_err();
        assert!(err.contains("grew the pool's live bytes by 0"), "{err}");
        let err = pool_sees_allocations(false, before, grew, 4 * MIB).unwrap_err();
        assert!(err.contains("no memory pool support"), "{err}");
    }

    #[test]
    fn the_highest_of_used_reserved_and_device_wide_binds() {
        let at_reset =
            PoolCounters { device: 1000 * MIB, used: 100 * MIB, reserved: 100 * MIB, ..PoolCounters::default() };
        // 300 MiB live at the peak, 340 MiB reserved around it (fragmentation)
        let after = PoolCounters { used_high: 400 * MIB, reserved_high: 440 * MIB, ..at_reset };
        let peaks = peaks_from_counters(at_reset, after, 1100 * MIB);
        assert_eq!((peaks.used, peaks.reserved, peaks.device), (1300 * MIB, 1340 * MIB, 1100 * MIB));
        assert_eq!((peaks.binding(), peaks.binding_name()), (1340 * MIB, "reserved"));
        // a workspace taken outside the pool and kept: device-wide binds
        let peaks = peaks_from_counters(at_reset, after, 1400 * MIB);
        assert_eq!((peaks.binding(), peaks.binding_name()), (1400 * MIB, "device"));
        // no fragmentation, nothing outside: the pool's used peak, as before
        let after = PoolCounters { used_high: 400 * MIB, reserved_high: 400 * MIB, ..at_reset };
        let peaks = peaks_from_counters(at_reset, after, 1000 * MIB);
        assert_eq!((peaks.binding(), peaks.binding_name()), (1300 * MIB, "used"));
    }
}
