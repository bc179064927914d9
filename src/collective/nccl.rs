//! Ranks as processes, one GPU each, through NCCL (feature `nccl`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;
use cudarc::nccl::{Comm, Id, ReduceOp};

use super::Collective;
use crate::Error;

/// A [`Collective`] over NCCL, for one process per GPU as `torchrun`-style
/// launchers start them.
///
/// [`from_env`](NcclCollective::from_env) reads `RANK`, `WORLD_SIZE` and
/// `LOCAL_RANK`; the ranks meet through a file: rank 0 writes NCCL's unique id
/// to `AUTOBATCH_NCCL_ID_FILE` (a path all ranks can read, e.g. on a shared
/// disk for several hosts) and the others wait for it.
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
        let id = if rank == 0 {
            let id = Id::new().map_err(nccl)?;
            let bytes: Vec<u8> = id.internal().iter().map(|&c| c as u8).collect();
            let temporary = path.with_extension("tmp");
            std::fs::write(&temporary, &bytes)
                .and_then(|()| std::fs::rename(&temporary, &path))
                .map_err(|e| Error::Collective(format!("cannot write {}: {e}", path.display())))?;
            id
        } else {
            let started = Instant::now();
            let bytes = loop {
                match std::fs::read(&path) {
                    Ok(bytes) if bytes.len() == 128 => break bytes,
                    _ if started.elapsed() > Duration::from_secs(600) => {
                        return Err(Error::Collective(format!(
                            "rank 0 wrote no NCCL id to {} in 10 minutes",
                            path.display()
                        )))
                    }
                    _ => std::thread::sleep(Duration::from_millis(100)),
                }
            };
            let mut internal = [0 as std::ffi::c_char; 128];
            for (slot, byte) in internal.iter_mut().zip(bytes) {
                *slot = byte as std::ffi::c_char;
            }
            Id::uninit(internal)
        };
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
