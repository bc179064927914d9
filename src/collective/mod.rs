//! Agreement between data-parallel ranks: every rank must train with a batch
//! that fits on the smallest device.

#[cfg(feature = "nccl")]
mod nccl;
mod threads;

#[cfg(feature = "nccl")]
pub use nccl::NcclCollective;
pub use threads::ThreadCollective;

use crate::Error;

/// The few collective operations the tuner needs across ranks. Every rank must
/// make the same calls in the same order.
pub trait Collective {
    /// This rank, in `0..world_size`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// The minimum of `value` over all ranks.
    fn all_reduce_min(&self, value: u64) -> Result<u64, Error>;
    /// The maximum of `value` over all ranks.
    fn all_reduce_max(&self, value: u64) -> Result<u64, Error>;
    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<(), Error> {
        self.all_reduce_max(0).map(|_| ())
    }
}
