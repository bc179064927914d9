//! Ranks as processes, one GPU each, through NCCL (feature `nccl`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaStream;
use cudarc::nccl::{Comm, Id, ReduceOp};

use super::Collective;
use super::rendezvous::{IdFile, RunToken, expected_ordinal};
use crate::Error;

/// The size of NCCL's unique id.
const ID_BYTES: usize = 128;

/// A [`Collective`] over NCCL, for one process per GPU as `torchrun`-style
/// launchers start them.
///
/// [`from_env`](NcclCollective::from_env) reads `RANK`, `WORLD_SIZE` and
/// `LOCAL_RANK`; the ranks meet through a file: rank 0 writes NCCL's unique id
/// to `AUTOBATCH_NCCL_ID_FILE` (a path all ranks can read, e.g. on a shared
/// disk for several hosts) and the others wait for it
/// ([`rendezvous`](super::rendezvous): a file of an earlier run is never
/// joined; set `AUTOBATCH_RUN_ID`, or let torchrun's `TORCHELASTIC_RUN_ID`
/// name the run). Waiting ends after `AUTOBATCH_NCCL_TIMEOUT` seconds
/// (default 300) with an error naming the file.
pub struct NcclCollective {
    comm: Comm,
}

fn env_number(name: &str) -> Result<usize, Error> {
    let text = std::env::var(name)
        .map_err(|_| Error::Collective(format!("{name} is not set: launch with torchrun or set it")))?;
    text.parse().map_err(|_| Error::Collective(format!("{name}={text:?} is not a number")))
}

/// A failure moving a collective's values to or from the GPU.
fn staging(what: &str, values: &str, err: cudarc::driver::DriverError) -> Error {
    Error::Collective(format!("{what} {values} on the GPU: {err}"))
}

fn nccl(err: cudarc::nccl::result::NcclError) -> Error {
    Error::Collective(format!("NCCL: {err:?}"))
}

impl NcclCollective {
    /// The rank's `LOCAL_RANK`: which GPU of this host it should use.
    pub fn local_rank() -> Result<usize, Error> {
        env_number("LOCAL_RANK")
    }

    /// Joins the job described by the environment, on `stream` (the stream of
    /// this rank's GPU, e.g. candle's `device.as_cuda_device()?.cuda_stream()`).
    pub fn from_env(stream: Arc<CudaStream>) -> Result<Self, Error> {
        let (rank, world_size) = (env_number("RANK")?, env_number("WORLD_SIZE")?);
        if world_size == 0 || rank >= world_size {
            return Err(Error::Collective(format!("RANK {rank} is not below WORLD_SIZE {world_size}")));
        }
        let path =
            PathBuf::from(std::env::var("AUTOBATCH_NCCL_ID_FILE").map_err(|_| {
                Error::Collective("AUTOBATCH_NCCL_ID_FILE is not set: a path every rank can read".into())
            })?);
        // the GPU this rank was given must be the one its stream is on, among
        // those the process can see (one, under a launcher that masks each rank)
        let ordinal = stream.context().ordinal();
        if let Ok(local_rank) = Self::local_rank() {
            let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
            let expected = expected_ordinal(local_rank, visible.as_deref())?;
            if expected != ordinal {
                return Err(Error::Collective(format!(
                    "LOCAL_RANK is {local_rank} (CUDA_VISIBLE_DEVICES={}) but the stream is on GPU {ordinal}: build \
                     the device with Device::new_cuda({expected})",
                    visible.as_deref().unwrap_or("unset")
                )));
            }
        }
        let timeout = match std::env::var("AUTOBATCH_NCCL_TIMEOUT") {
            Ok(text) => Duration::from_secs(text.trim().parse().map_err(|_| {
                Error::Collective(format!("AUTOBATCH_NCCL_TIMEOUT={text:?} is not a whole number of seconds"))
            })?),
            Err(_) => Duration::from_secs(300),
        };
        let file = IdFile::new(path, RunToken::from_env(), timeout, ID_BYTES);
        let id = if rank == 0 {
            let mut made = None;
            // the stale file goes before the id is made: a rank starting meanwhile must not find it
            file.publish_new(|| {
                let id = Id::new().map_err(nccl)?;
                let bytes = id.internal().iter().map(|&c| c as u8).collect();
                made = Some(id);
                Ok(bytes)
            })?;
            made.expect("publish_new made the id")
        } else {
            let bytes = file.wait()?;
            let mut internal = [0 as std::ffi::c_char; ID_BYTES];
            for (slot, byte) in internal.iter_mut().zip(bytes) {
                *slot = byte as std::ffi::c_char;
            }
            Id::uninit(internal)
        };
        // NCCL creates the communicator in the current context: make it this GPU's
        stream.context().bind_to_thread().map_err(|e| Error::Collective(format!("binding GPU {ordinal}: {e}")))?;
        let comm = Comm::from_rank(stream, rank, world_size, id).map_err(nccl)?;
        Ok(NcclCollective { comm })
    }

    fn all_reduce(&self, value: u64, op: ReduceOp) -> Result<u64, Error> {
        let stream = self.comm.stream();
        let copy = |what: &str, err| staging(what, "the all-reduce value", err);
        let send = stream.clone_htod(&[value]).map_err(|e| copy("copying", e))?;
        let mut receive = stream.alloc_zeros::<u64>(1).map_err(|e| copy("allocating", e))?;
        self.comm.all_reduce(&send, &mut receive, &op).map_err(nccl)?;
        let result = stream.clone_dtoh(&receive).map_err(|e| copy("reading back", e))?;
        Ok(result[0])
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    fn all_reduce_min(&self, value: u64) -> Result<u64, Error> {
        self.all_reduce(value, ReduceOp::Min)
    }

    fn all_reduce_max(&self, value: u64) -> Result<u64, Error> {
        self.all_reduce(value, ReduceOp::Max)
    }

    /// One all-reduce of a zeroed f32 buffer of `bytes` (at most 256 MiB:
    /// NCCL's buffers are sized by its channels and protocols, which a
    /// message that large already selects), freed after; NCCL's own buffers
    /// stay allocated, in every later baseline.
    fn warm_up(&self, bytes: u64) -> Result<(), Error> {
        const MOST: u64 = 256 << 20;
        let elements = (bytes.clamp(4, MOST) / 4) as usize;
        let stream = self.comm.stream();
        let copy = |what: &str, err| staging(what, "the warm-up all-reduce", err);
        let send = stream.alloc_zeros::<f32>(elements).map_err(|e| copy("allocating", e))?;
        let mut receive = stream.alloc_zeros::<f32>(elements).map_err(|e| copy("allocating", e))?;
        self.comm.all_reduce(&send, &mut receive, &ReduceOp::Sum).map_err(nccl)?;
        stream.synchronize().map_err(|e| copy("finishing", e))
    }

    /// One NCCL all-gather (not one all-reduce per rank).
    fn all_gather(&self, value: u64) -> Result<Vec<u64>, Error> {
        let stream = self.comm.stream();
        let copy = |what: &str, err| staging(what, "the all-gather values", err);
        let send = stream.clone_htod(&[value]).map_err(|e| copy("copying", e))?;
        let mut receive = stream.alloc_zeros::<u64>(self.comm.world_size()).map_err(|e| copy("allocating", e))?;
        self.comm.all_gather(&send, &mut receive).map_err(nccl)?;
        stream.clone_dtoh(&receive).map_err(|e| copy("reading back", e))
    }
}
