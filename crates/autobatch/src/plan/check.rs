//! A batch checked, not searched: what [`Search::check`](crate::Search::check)
//! answers.

use serde::{Deserialize, Serialize};

use super::{Ceiling, Trial};
use crate::units::format_bytes;

/// A batch and the next one up (one granule larger), each run once after a
/// warm-up step, with no search around them: whether the batch fits under the
/// ceiling, and whether it is the largest that does.
///
/// ```
/// use autobatch::memory::simulated::{MemoryCurve, Simulation};
/// use autobatch::Tuner;
///
/// // 1 GiB fixed + 64 MiB a sample on 16 GiB under the 90% ceiling: 214 fit
/// let (mut workload, mut meter) = Simulation::new(16 << 30, MemoryCurve::affine(1 << 30, 64 << 20)).build();
/// let check = Tuner::new().search(&mut workload, &mut meter).check(214)?;
/// assert!(check.fits() && check.is_largest());
/// let check = Tuner::new().search(&mut workload, &mut meter).check(200)?;
/// assert!(check.fits() && !check.is_largest());
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BatchCheck {
    /// The batch checked.
    pub batch: usize,
    /// Its trial, then the trial one granule up.
    pub trials: [Trial; 2],
    /// The bytes that 100% means.
    pub capacity_bytes: u64,
    /// The ceiling the trials ran under: a fitting trial's peak stays at or
    /// under its limit of the capacity.
    pub ceiling: Ceiling,
}

impl BatchCheck {
    /// Whether the batch ran and its peak stayed under the limit.
    pub fn fits(&self) -> bool {
        self.trials[0].outcome.fits()
    }

    /// Whether the batch fits and the next one up does not: the largest.
    pub fn is_largest(&self) -> bool {
        self.fits() && !self.trials[1].outcome.fits()
    }

    /// The verdict in one line, then a line per trial.
    pub fn summary(&self) -> String {
        let (batch, next) = (self.batch, self.trials[1].batch);
        let verdict = match (self.fits(), self.trials[1].outcome.fits()) {
            (true, false) => format!("batch {batch} is the largest that fits: {batch} fits and {next} does not"),
            (true, true) => format!("batch {batch} fits, and so does {next}: a larger batch fits"),
            (false, _) => format!("batch {batch} does not fit"),
        };
        let mut lines = vec![format!(
            "{verdict} (ceiling {} of {} = {})",
            self.ceiling,
            format_bytes(self.capacity_bytes),
            format_bytes(self.ceiling.limit_bytes(self.capacity_bytes))
        )];
        for trial in &self.trials {
            let peak = trial.peak_bytes.map_or_else(|| "not read".to_owned(), format_bytes);
            lines.push(format!("  batch {:>6}  {:<14} peak {peak}", trial.batch, trial.outcome.to_string()));
        }
        lines.join("\n")
    }
}
