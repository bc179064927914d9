//! What a headroom check measured: plain data, so that the error type can
//! carry it without depending on the check.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::units::format_bytes;

/// What a [`Headroom`](crate::Headroom) check measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeadroomReport {
    /// The batch run.
    pub batch: usize,
    /// Measured steps.
    pub steps: usize,
    /// Whether a step ran out of memory.
    pub out_of_memory: bool,
    /// Device-wide bytes in use before the measured steps.
    pub baseline_bytes: u64,
    /// Device-wide peak over the measured steps.
    pub peak_bytes: u64,
    /// Device capacity.
    pub capacity_bytes: u64,
    /// `capacity − peak`.
    pub headroom_bytes: u64,
    /// `headroom_bytes / capacity`.
    pub headroom: f64,
    /// The minimum asked for.
    pub min_headroom: f64,
    /// Whether the steps ran and kept at least the minimum free.
    pub passed: bool,
}

impl HeadroomReport {
    /// The report as pretty-printed JSON, for a CI artifact.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report holds only numbers and flags")
    }
}

impl fmt::Display for HeadroomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match (self.out_of_memory, self.passed) {
            (true, _) => "ran out of memory",
            (false, true) => "ok",
            (false, false) => "too little headroom",
        };
        write!(
            f,
            "batch {}: peak {} of {}, headroom {} = {:.1}% (minimum {:.1}%): {verdict}",
            self.batch,
            format_bytes(self.peak_bytes),
            format_bytes(self.capacity_bytes),
            format_bytes(self.headroom_bytes),
            100.0 * self.headroom,
            100.0 * self.min_headroom
        )
    }
}
