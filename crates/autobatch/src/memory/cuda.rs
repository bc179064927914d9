//! Measuring a CUDA step: the device's memory pool, exactly.

use std::sync::Arc;

use cudarc::driver::result::{device, mem_pool};
use cudarc::driver::sys::{CUdevice_attribute, CUdeviceptr, CUmemPool_attribute, CUmemoryPool};
use cudarc::driver::{CudaContext, CudaStream, DriverError};

use super::pool::{PoolCounters, peaks_from_counters, pool_sees_allocations};
use crate::plan::PeakKinds;
use crate::{Error, MemoryMeter};

/// A [`MemoryMeter`] for a candle CUDA device: capacity is the device's
/// memory, in use is `total − free` device-wide, and a step's peak the
/// highest of the memory pool's live and reserved high-water marks above the
/// use at [`reset_peak`](MemoryMeter::reset_peak) and the use after the step
/// ([`peaks`](CudaMeter::peaks)). [`new`](CudaMeter::new) refuses a device
/// whose pool does not see candle's allocations
/// ([`DeviceProblem::PeaksUnreadable`](crate::DeviceProblem::PeaksUnreadable):
/// every step would look like a fit) or that is not there
/// ([`DeviceProblem::CudaUnavailable`](crate::DeviceProblem::CudaUnavailable)).
/// Its blind spot (memory taken outside the pool during a step), what covers
/// it ([`with_ballast`](CudaMeter::with_ballast)) and how it is checked:
/// docs/gpu.md. The driver is linked dynamically, as candle links it: a
/// `cuda` build needs `libcuda.so.1` to start.
pub struct CudaMeter {
    device: candle_core::Device,
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pool: CUmemoryPool,
    name: String,
    total: u64,
    /// The counters at the last reset.
    at_reset: PoolCounters,
    ballast: Option<Ballast>,
}

/// Memory held outside the pool so that the device runs out at the ceiling.
struct Ballast {
    pointer: CUdeviceptr,
    bytes: u64,
}

impl CudaMeter {
    /// A meter (and the candle device to build the workload on) for GPU `ordinal`.
    pub fn new(ordinal: usize) -> Result<Self, Error> {
        let count = CudaContext::device_count().map_err(|err| {
            Error::Device(crate::DeviceProblem::CudaUnavailable {
                ordinal,
                reason: format!("the driver reports {err}"),
            })
        })?;
        if count <= 0 {
            return Err(Error::Device(crate::DeviceProblem::CudaUnavailable {
                ordinal,
                reason: "the driver sees no CUDA device".to_owned(),
            }));
        }
        if ordinal >= count as usize {
            return Err(Error::Device(crate::DeviceProblem::CudaUnavailable {
                ordinal,
                reason: format!("there are {count} devices: use an ordinal from 0 to {}", count - 1),
            }));
        }
        let device = candle_core::Device::new_cuda(ordinal)
            .map_err(|err| Error::Device(crate::DeviceProblem::CudaUnavailable { ordinal, reason: err.to_string() }))?;
        Self::for_device(&device)
    }

    /// A meter for an existing candle CUDA device.
    pub fn for_device(device: &candle_core::Device) -> Result<Self, Error> {
        let cuda = device
            .as_cuda_device()
            .map_err(|_| Error::Device(crate::DeviceProblem::NotCuda { device: format!("{device:?}") }))?;
        let stream = cuda.cuda_stream();
        let context = Arc::clone(stream.context());
        let name = context.name().map_err(driver)?;
        // candle's cuMemAllocAsync allocates from the device's current pool
        // SAFETY: `cu_device` is the device handle of a live context (held by
        // `context` for the meter's life); the call only reads its pool handle.
        let pool = unsafe { device::get_mem_pool(context.cu_device()) }.map_err(driver)?;
        let (_, total) = context.mem_get_info().map_err(driver)?;
        // SAFETY: as above, a live context's device handle; the call reads one attribute.
        let pools_supported = unsafe {
            device::get_attribute(context.cu_device(), CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
        }
        .map_err(driver)?
            > 0;
        let mut meter = CudaMeter {
            device: device.clone(),
            context,
            stream,
            pool,
            name,
            total: total as u64,
            at_reset: PoolCounters::default(),
            ballast: None,
        };
        meter.check_pool_sees_allocations(pools_supported)?;
        meter.reset_peak()?;
        Ok(meter)
    }

    /// Refuses a pool whose counters do not move when candle allocates.
    fn check_pool_sees_allocations(&mut self, pools_supported: bool) -> Result<(), Error> {
        const TEST_BYTES: u64 = 4 << 20;
        let name = self.name.clone();
        let refuse =
            |reason: String| Error::Device(crate::DeviceProblem::PeaksUnreadable { device: name.clone(), reason });
        if !pools_supported {
            return Err(refuse(
                pool_sees_allocations(false, PoolCounters::default(), PoolCounters::default(), 0)
                    .expect_err("no pools is refused"),
            ));
        }
        self.synchronize()?;
        let before = self.counters()?;
        let test = candle_core::Tensor::zeros((TEST_BYTES / 4) as usize, candle_core::DType::F32, &self.device)?;
        self.synchronize()?;
        let during = self.counters()?;
        drop(test);
        self.release_cached()?;
        pool_sees_allocations(true, before, during, TEST_BYTES).map_err(refuse)
    }

    /// The peaks of the step since the last reset: used, reserved and
    /// device-wide (the meter's [`peak`](MemoryMeter::peak) is the highest).
    pub fn peaks(&self) -> Result<PeakKinds, Error> {
        let after = self.counters()?;
        Ok(peaks_from_counters(self.at_reset, after, after.device))
    }

    /// The pool's counters and the device's use, now.
    fn counters(&self) -> Result<PoolCounters, Error> {
        Ok(PoolCounters {
            device: self.device_used()?,
            used: self.pool_attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            reserved: self.pool_attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            used_high: self.pool_attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            reserved_high: self.pool_attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
        })
    }

    /// Holds `(1 − ceiling) × capacity` bytes outside the memory pool for as
    /// long as the meter lives, so that a step over the ceiling fails with a
    /// real out-of-memory error, allocations outside the pool included. Off by
    /// default: the pool's peak is exact for candle's own allocations, an
    /// over-ceiling trial is cheaper than an out-of-memory one, and the ballast
    /// must be freed (drop the meter, or [`release_ballast`](CudaMeter::release_ballast))
    /// before training. Use it for workloads that allocate outside the pool.
    pub fn with_ballast(mut self, ceiling: f64) -> Result<Self, Error> {
        crate::plan::Ceiling::new(ceiling)?;
        self.release_ballast()?;
        let bytes = ((1.0 - ceiling) * self.total as f64) as u64;
        if bytes > 0 {
            self.context.bind_to_thread().map_err(driver)?;
            // SAFETY: the context is current on this thread (bound just above);
            // the pointer is owned by the `Ballast` and freed once, in `release_ballast`.
            let pointer = unsafe { cudarc::driver::result::malloc_sync(bytes as usize) }.map_err(driver)?;
            self.ballast = Some(Ballast { pointer, bytes });
        }
        Ok(self)
    }

    /// Frees the ballast, if any.
    pub fn release_ballast(&mut self) -> Result<(), Error> {
        if let Some(ballast) = self.ballast.take() {
            self.context.bind_to_thread().map_err(driver)?;
            // SAFETY: `ballast.pointer` came from `malloc_sync` in this context and
            // was taken out of `self.ballast`, so it is freed exactly once.
            unsafe { cudarc::driver::result::free_sync(ballast.pointer) }.map_err(driver)?;
        }
        Ok(())
    }

    /// The candle device the workload must run on.
    pub fn device(&self) -> &candle_core::Device {
        &self.device
    }

    /// The GPU's name, e.g. `NVIDIA H200`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes in use device-wide, the ballast left out.
    fn device_used(&self) -> Result<u64, Error> {
        let (free, total) = self.context.mem_get_info().map_err(driver)?;
        let ballast = self.ballast.as_ref().map_or(0, |b| b.bytes);
        Ok((total as u64).saturating_sub(free as u64).saturating_sub(ballast))
    }

    fn pool_attribute(&self, attribute: CUmemPool_attribute) -> Result<u64, Error> {
        let mut value = 0u64;
        // SAFETY: `self.pool` is the live default pool of the meter's device, and
        // every attribute read here is a u64 (cuMemPoolGetAttribute's contract
        // for the USED/RESERVED_MEM attributes), written into `value`.
        unsafe { mem_pool::get_attribute(self.pool, attribute, (&mut value as *mut u64).cast()) }.map_err(driver)?;
        Ok(value)
    }
}

impl MemoryMeter for CudaMeter {
    /// candle 0.11.1 launches its element-wise kernels with a `u32` count and
    /// loops over an `unsigned int` index: a tensor of 2^32 elements or more
    /// never finishes, or fails to launch.
    fn element_limit(&self) -> Option<u64> {
        Some(u64::from(u32::MAX))
    }

    fn capacity(&self) -> Result<u64, Error> {
        Ok(self.total)
    }

    fn in_use(&self) -> Result<u64, Error> {
        self.device_used()
    }

    fn reset_peak(&mut self) -> Result<(), Error> {
        self.synchronize()?;
        // setting a high-water mark to zero restarts it from the current value
        for attribute in
            [CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH]
        {
            let mut zero = 0u64;
            // SAFETY: `self.pool` is the live default pool of the meter's device;
            // both high-water marks take a u64, read from `zero` during the call only.
            unsafe { mem_pool::set_attribute(self.pool, attribute, (&mut zero as *mut u64).cast()) }.map_err(driver)?;
        }
        self.at_reset = self.counters()?;
        Ok(())
    }

    fn peak(&self) -> Result<u64, Error> {
        let peaks = self.peaks()?;
        log::debug!(
            "peaks: used {}, reserved {}, device-wide {} ({} binds)",
            peaks.used,
            peaks.reserved,
            peaks.device,
            peaks.binding_name()
        );
        Ok(peaks.binding())
    }

    fn synchronize(&mut self) -> Result<(), Error> {
        self.stream.synchronize().map_err(driver)
    }

    fn release_cached(&mut self) -> Result<(), Error> {
        self.synchronize()?;
        self.context.bind_to_thread().map_err(driver)?;
        // SAFETY: `self.pool` is the live default pool of the meter's device, and
        // the stream was synchronized above, so no allocation is in flight.
        unsafe { mem_pool::trim_to(self.pool, 0) }.map_err(driver)
    }

    fn device_name(&self) -> String {
        self.name.clone()
    }

    fn peak_kinds(&self) -> Result<Option<PeakKinds>, Error> {
        self.peaks().map(Some)
    }

    /// The pool hands out memory in 2 MiB granules.
    fn slack_bytes(&self) -> u64 {
        2 << 20
    }
}

impl Drop for CudaMeter {
    fn drop(&mut self) {
        if let Err(err) = self.release_ballast() {
            log::warn!("could not free the ballast: {err}");
        }
    }
}

impl std::fmt::Debug for CudaMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaMeter")
            .field("name", &self.name)
            .field("ordinal", &self.context.ordinal())
            .field("total", &self.total)
            .field("ballast", &self.ballast.as_ref().map(|b| b.bytes))
            .finish()
    }
}

fn driver(err: DriverError) -> Error {
    Error::meter(err)
}
