//! Ranks as threads of one process: for tests, and for several devices driven
//! from one process.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::Collective;
use crate::Error;

/// A [`Collective`] over threads: one handle per rank, each moved to its thread.
///
/// ```
/// use autobatch::collective::{Collective, ThreadCollective};
///
/// let ranks = ThreadCollective::group(4)?;
/// let minimums: Vec<u64> = std::thread::scope(|s| {
///     let handles: Vec<_> = ranks
///         .iter()
///         .map(|rank| s.spawn(move || rank.all_reduce_min(10 + rank.rank() as u64).unwrap()))
///         .collect();
///     handles.into_iter().map(|h| h.join().unwrap()).collect()
/// });
/// assert_eq!(minimums, [10, 10, 10, 10]);
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ThreadCollective {
    rank: usize,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    world_size: usize,
    timeout: Duration,
    round: Mutex<Round>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct Round {
    generation: u64,
    arrived: usize,
    min: u64,
    max: u64,
    result: (u64, u64),
}

impl ThreadCollective {
    /// Handles for `world_size` ranks; a collective call waits at most ten
    /// minutes for the other ranks.
    pub fn group(world_size: usize) -> Result<Vec<ThreadCollective>, Error> {
        Self::group_with_timeout(world_size, Duration::from_secs(600))
    }

    /// Handles for `world_size` ranks whose calls fail after `timeout` without
    /// every rank (a rank that died would otherwise hang the others).
    pub fn group_with_timeout(world_size: usize, timeout: Duration) -> Result<Vec<ThreadCollective>, Error> {
        if world_size == 0 {
            return Err(Error::zero(crate::Setting::WorldSize));
        }
        let shared =
            Arc::new(Shared { world_size, timeout, round: Mutex::new(Round::default()), done: Condvar::new() });
        Ok((0..world_size).map(|rank| ThreadCollective { rank, shared: Arc::clone(&shared) }).collect())
    }

    fn lock(&self) -> MutexGuard<'_, Round> {
        self.shared.round.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Contributes `value` to this round; returns the round's (min, max).
    fn all_reduce(&self, value: u64) -> Result<(u64, u64), Error> {
        let mut round = self.lock();
        let generation = round.generation;
        if round.arrived == 0 {
            (round.min, round.max) = (value, value);
        } else {
            (round.min, round.max) = (round.min.min(value), round.max.max(value));
        }
        round.arrived += 1;
        if round.arrived == self.shared.world_size {
            round.result = (round.min, round.max);
            round.arrived = 0;
            round.generation += 1;
            self.shared.done.notify_all();
            return Ok(round.result);
        }
        let (round, timeout) = self
            .shared
            .done
            .wait_timeout_while(round, self.shared.timeout, |r| r.generation == generation)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if timeout.timed_out() {
            return Err(Error::Collective(format!(
                "rank {} waited {:?} for the other ranks of {}",
                self.rank, self.shared.timeout, self.shared.world_size
            )));
        }
        // the next round cannot complete before this rank joins it: `result` is this round's
        Ok(round.result)
    }
}

impl Collective for ThreadCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world_size
    }

    fn all_reduce_min(&self, value: u64) -> Result<u64, Error> {
        self.all_reduce(value).map(|(min, _)| min)
    }

    fn all_reduce_max(&self, value: u64) -> Result<u64, Error> {
        self.all_reduce(value).map(|(_, max)| max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_rounds_agree() {
        let ranks = ThreadCollective::group(8).unwrap();
        std::thread::scope(|s| {
            for rank in &ranks {
                s.spawn(move || {
                    for round in 0..200u64 {
                        let mine = round * 10 + rank.rank() as u64;
                        assert_eq!(rank.all_reduce_min(mine).unwrap(), round * 10);
                        assert_eq!(rank.all_reduce_max(mine).unwrap(), round * 10 + 7);
                        rank.barrier().unwrap();
                    }
                });
            }
        });
    }

    #[test]
    fn a_missing_rank_is_a_timeout_not_a_hang() {
        let ranks = ThreadCollective::group_with_timeout(2, Duration::from_millis(50)).unwrap();
        let err = ranks[0].all_reduce_min(1).unwrap_err();
        assert!(err.to_string().contains("waited"), "{err}");
        assert!(ThreadCollective::group(0).is_err());
    }
}
