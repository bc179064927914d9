//! Measuring memory: the [`MemoryMeter`](crate::MemoryMeter) trait and its
//! implementations ([`HeapMeter`](crate::HeapMeter), `CudaMeter`, exported at
//! the crate's root), and `simulated` devices (feature `simulation`) for your tests (and ours, and
//! the benchmarks), with the `simulation` feature.

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod heap;
pub(crate) mod measure;
pub(crate) mod meter;
mod pool;
#[cfg(feature = "simulation")]
pub mod simulated;
pub(crate) mod tracking;
