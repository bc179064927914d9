//! A simulated step whose accumulating micro-step holds a quarter more
//! samples' worth of memory: as when the accumulator (a copy of the
//! gradients) is large beside the activations.

use autobatch::Workload;
use autobatch::memory::simulated::{SimulatedWorkload, Simulation};

pub struct Accumulating(pub SimulatedWorkload);

impl Accumulating {
    /// The batch an accumulating micro-step at `batch` costs like.
    pub fn cost_of(batch: usize) -> usize {
        batch + batch / 4
    }

    /// The largest batch whose accumulating micro-step stays under `limit` bytes.
    pub fn largest(sim: &Simulation, plain_largest: usize, limit: u64) -> usize {
        (1..=plain_largest).rev().find(|&b| sim.device_peak(Self::cost_of(b)) <= limit).unwrap_or(0)
    }
}

impl Workload for Accumulating {
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        self.0.step(batch)
    }
    fn accumulating_step(&mut self, batch: usize) -> candle_core::Result<()> {
        self.0.step(Self::cost_of(batch))
    }
    fn can_accumulate(&self) -> bool {
        true
    }
}
