//! The search strategy a user chooses.

use serde::{Deserialize, Serialize};

/// How the tuner chooses the next batch to try.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Strategy {
    /// Double from the first candidate until the first failure (trying
    /// `max_batch` once when the next doubling would pass it), then bisect the
    /// bracket down to the exact largest fitting batch at the granularity.
    /// About `2·log2(b*/g)` trials.
    Binary,
    /// Double until the first failure and stop: the largest fitting
    /// `first_candidate × 2^j`. Fewer trials, up to half the batch lost.
    Power,
    /// Fit `peak(b) ≈ fixed + per_sample·b` to small trials (a third checks
    /// linearity), jump just under the predicted largest batch, verify, and
    /// close with a short model-guided bisection. The same answer as `Binary`
    /// on any monotone curve, in a handful of trials, most of them cheap. When
    /// the fit is poor it doubles like `Binary` until it is good, and bisects
    /// when the model stops narrowing the bracket. The default: the same
    /// answer as `Binary` (property-tested), measured at about 6 trials instead
    /// of 16 and a quarter of the probe cost.
    #[default]
    Predictive,
}

impl Strategy {
    /// Every strategy, in the order the command line lists them.
    pub const ALL: [Strategy; 3] = [Strategy::Predictive, Strategy::Binary, Strategy::Power];

    /// The name used on the command line: `predictive`, `binary`, `power`.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Binary => "binary",
            Strategy::Power => "power",
            Strategy::Predictive => "predictive",
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}
