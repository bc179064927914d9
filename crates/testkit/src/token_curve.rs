//! A simulated step whose memory grows with the tokens and tokens × length:
//! `fixed + per_token·b·s + per_token_length·b·s²` bytes on a device of
//! `capacity_gib` GiB. Shared by the searches over sizes and over lengths.

use autobatch::memory::simulated::SizedSimulation;

pub const GIB: u64 = 1 << 30;

#[derive(Clone, Copy, Debug)]
pub struct Curve {
    pub capacity_gib: u64,
    pub fixed: u64,
    pub per_token: u64,
    pub per_token_length: u64,
}

impl Curve {
    pub fn bytes(self, batch: usize, len: usize) -> u64 {
        let (b, s) = (batch as u64, len as u64);
        self.fixed + self.per_token * b * s + self.per_token_length * b * s * s
    }

    /// A device running this curve, its steps starting at `start_len`.
    pub fn simulation(self, start_len: usize) -> SizedSimulation {
        SizedSimulation::new(self.capacity_gib * GIB, start_len, move |b, s| self.bytes(b, s))
    }

    /// The limit at `ceiling`.
    pub fn limit(self, ceiling: f64) -> u64 {
        (ceiling * (self.capacity_gib * GIB) as f64).floor() as u64
    }
}
