//! How a trial ended, and what a search strategy sees of it: the leaf every
//! other module builds on (it imports nothing from the crate).

use serde::{Deserialize, Serialize};

/// How one trial ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The step ran and the device-wide peak stayed at or under `ceiling × capacity`.
    Fits,
    /// The step ran but the device-wide peak went above `ceiling × capacity`.
    OverCeiling,
    /// The step failed with an out-of-memory error (see [`is_oom`](crate::is_oom)).
    OutOfMemory,
}

impl Outcome {
    /// Whether the batch is usable: only [`Outcome::Fits`] is.
    pub fn fits(self) -> bool {
        self == Outcome::Fits
    }

    /// A short lower-case label, as in the report: `fits`, `over ceiling`, `out of memory`.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Fits => "fits",
            Outcome::OverCeiling => "over ceiling",
            Outcome::OutOfMemory => "out of memory",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.label())
    }
}

/// What a strategy sees of one trial.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    /// The batch tried.
    pub batch: usize,
    /// How it ended.
    pub outcome: Outcome,
    /// Its measured device-wide peak, if any.
    pub peak_bytes: Option<u64>,
}

impl Observation {
    /// The largest batch in `history` that fits, if any: the only kind of answer a
    /// search gives.
    pub fn best(history: &[Observation]) -> Option<&Observation> {
        history.iter().filter(|o| o.outcome.fits()).max_by_key(|o| o.batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_distinct_and_only_fits_fits() {
        let all = [Outcome::Fits, Outcome::OverCeiling, Outcome::OutOfMemory];
        let labels: std::collections::HashSet<_> = all.iter().map(|o| o.label()).collect();
        assert_eq!(labels.len(), 3);
        assert_eq!(all.map(Outcome::fits), [true, false, false]);
    }
}
