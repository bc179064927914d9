//! Measuring a CUDA step: the device's memory pool, exactly.

use std::sync::Arc;

use cudarc::driver::result::{device, mem_pool};
use cudarc::driver::sys::{CUdeviceptr, CUmemPool_attribute, CUmemoryPool};
use cudarc::driver::{CudaContext, CudaStream, DriverError};

use crate::{Error, MemoryMeter};

/// A [`MemoryMeter`] for a candle CUDA device.
///
/// - capacity: total device memory (`cuMemGetInfo`);
/// - in use: `total − free`, device-wide (other processes included);
/// - peak: `(total − free)` at [`reset_peak`](MemoryMeter::reset_peak) + the
///   pool's `USED_MEM_HIGH` since then − the pool's use at that moment.
///
/// candle allocates every tensor with `cuMemAllocAsync` from the device's
/// current memory pool, whose high-water mark is an exact peak of live pool
/// bytes (PyTorch's `max_memory_allocated`). Blind spots: memory allocated
/// outside the pool *during* a step (cuBLAS workspaces and kernel modules
/// loaded for the first time at a new shape, another process growing) is not
/// in the peak. The tuner's warm-up step loads the modules and workspaces of
/// the smallest batch before the first trial, and the chosen batch is run again
/// when memory in use rose during the search; [`with_ballast`](CudaMeter::with_ballast)
/// closes the rest by making the device itself enforce the ceiling.
///
/// The CUDA driver is linked dynamically (as candle links it): a binary built
/// with the `cuda` feature cannot start on a machine without `libcuda.so.1`;
/// ship a CPU build there. No device, or an ordinal out of range, is an
/// [`Error::CudaUnavailable`].
pub struct CudaMeter {
    device: candle_core::Device,
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pool: CUmemoryPool,
    name: String,
    total: u64,
    baseline_device_used: u64,
    baseline_pool_used: u64,
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
        let count = CudaContext::device_count()
            .map_err(|err| Error::CudaUnavailable { ordinal, reason: format!("the driver reports {err}") })?;
        if count <= 0 {
            return Err(Error::CudaUnavailable { ordinal, reason: "the driver sees no CUDA device".to_owned() });
        }
        if ordinal >= count as usize {
            return Err(Error::CudaUnavailable {
                ordinal,
                reason: format!("there are {count} devices: use an ordinal from 0 to {}", count - 1),
            });
        }
        let device = candle_core::Device::new_cuda(ordinal)
            .map_err(|err| Error::CudaUnavailable { ordinal, reason: err.to_string() })?;
        Self::for_device(&device)
    }

    /// A meter for an existing candle CUDA device.
    pub fn for_device(device: &candle_core::Device) -> Result<Self, Error> {
        let cuda = device.as_cuda_device().map_err(|_| Error::NotCuda { device: format!("{device:?}") })?;
        let stream = cuda.cuda_stream();
        let context = Arc::clone(stream.context());
        let name = context.name().map_err(driver)?;
        // candle's cuMemAllocAsync allocates from the device's current pool
        // SAFETY: `cu_device` is the device handle of a live context (held by
        // `context` for the meter's life); the call only reads its pool handle.
        let pool = unsafe { device::get_mem_pool(context.cu_device()) }.map_err(driver)?;
        let (_, total) = context.mem_get_info().map_err(driver)?;
        let mut meter = CudaMeter {
            device: device.clone(),
            context,
            stream,
            pool,
            name,
            total: total as u64,
            baseline_device_used: 0,
            baseline_pool_used: 0,
            ballast: None,
        };
        meter.reset_peak()?;
        Ok(meter)
    }

    /// Holds `(1 − ceiling) × capacity` bytes outside the memory pool for as
    /// long as the meter lives, so that a step over the ceiling fails with a
    /// real out-of-memory error, allocations outside the pool included. Off by
    /// default: the pool's peak is exact for candle's own allocations, an
    /// over-ceiling trial is cheaper than an out-of-memory one, and the ballast
    /// must be freed (drop the meter, or [`release_ballast`](CudaMeter::release_ballast))
    /// before training. Use it for workloads that allocate outside the pool.
    pub fn with_ballast(mut self, ceiling: f64) -> Result<Self, Error> {
        if !(ceiling > 0.0 && ceiling <= 1.0) {
            return Err(Error::InvalidCeiling { ceiling });
        }
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
    fn capacity(&self) -> Result<u64, Error> {
        Ok(self.total)
    }

    fn in_use(&self) -> Result<u64, Error> {
        self.device_used()
    }

    fn reset_peak(&mut self) -> Result<(), Error> {
        self.synchronize()?;
        let mut zero = 0u64;
        // setting USED_MEM_HIGH to zero restarts it from the current use
        // SAFETY: `self.pool` is the live default pool of the meter's device;
        // USED_MEM_HIGH takes a u64, read from `zero` during the call only.
        unsafe {
            mem_pool::set_attribute(
                self.pool,
                CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                (&mut zero as *mut u64).cast(),
            )
        }
        .map_err(driver)?;
        self.baseline_pool_used = self.pool_attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
        self.baseline_device_used = self.device_used()?;
        Ok(())
    }

    fn peak(&self) -> Result<u64, Error> {
        let high = self.pool_attribute(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?;
        Ok(self.baseline_device_used + high.saturating_sub(self.baseline_pool_used))
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
