//! Agreement between data-parallel ranks: every rank must train with a batch
//! that fits on the smallest device.

#[cfg(feature = "nccl")]
mod nccl;
// how NCCL's ranks find each other: only the NCCL collective uses it
#[cfg_attr(not(feature = "nccl"), allow(dead_code))]
mod rendezvous;
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
    /// Every rank's `value`, by rank. The default takes one
    /// [`all_reduce_max`](Self::all_reduce_max) per rank (each rank contributes
    /// its value in its own round, 0 in the others); a backend with a real
    /// all-gather should use it.
    fn all_gather(&self, value: u64) -> Result<Vec<u64>, Error> {
        (0..self.world_size()).map(|rank| self.all_reduce_max(if rank == self.rank() { value } else { 0 })).collect()
    }
    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<(), Error> {
        self.all_reduce_max(0).map(|_| ())
    }
    /// Runs a collective as large as training's (about `bytes`, the
    /// gradients') once, before any rank measures: a backend that allocates
    /// buffers at its first collective (NCCL: its channels' buffers) then
    /// holds them in every measured step's baseline, as training will. The
    /// default is a [`barrier`](Self::barrier).
    fn warm_up(&self, bytes: u64) -> Result<(), Error> {
        let _ = bytes;
        self.barrier()
    }
}
