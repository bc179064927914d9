//! The line through the trials: what the plan predicts between them.

use serde::{Deserialize, Serialize};

use super::{Trial, TrialKind};
use crate::search::{LinearFit, Outcome};

/// The step's peak in its two phases, `peak(b) ≈ max(plateau, fixed +
/// per_sample·b)`: the forward and backward passes, whose peak grows with the
/// batch, and the optimizer's update, whose peak does not (the weights,
/// gradients and state, and the update's temporaries) and is the whole
/// step's at small batches. Fitted (least squares) to every trial that ran to
/// the end except those at the chosen batch, so that its peak there is a
/// prediction that the measurement then checks; the trials on the plateau
/// are left out of the line, so that `bytes_per_sample` is the whole step's
/// slope past it, not a line through it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryModel {
    /// Bytes at batch 0 of the forward and backward passes' line: weights,
    /// gradients, optimizer state, workspaces, other processes.
    pub fixed_bytes: f64,
    /// Bytes each sample adds: activations, mostly.
    pub bytes_per_sample: f64,
    /// The step's peak where it does not grow with the batch (the update's,
    /// where it is the step's at the smallest batches); 0 when every trial
    /// lies on the line.
    #[serde(default)]
    pub plateau_bytes: f64,
    /// The batches the line was fitted to.
    pub fitted_batches: Vec<usize>,
    /// The line's peak at the chosen batch.
    pub predicted_peak_bytes: u64,
    /// `(predicted − measured) / measured` at the chosen batch: negative when
    /// the line under-estimates (the dangerous direction).
    pub prediction_error: f64,
}

impl MemoryModel {
    /// The step's peak at `batch`, in bytes: the line's, or the plateau
    /// where that is higher.
    pub fn predict(&self, batch: usize) -> f64 {
        self.line().predict(batch).max(self.plateau_bytes)
    }

    /// The line itself.
    pub(crate) fn line(&self) -> LinearFit {
        LinearFit { fixed_bytes: self.fixed_bytes, bytes_per_sample: self.bytes_per_sample }
    }

    /// Fits the line to `trials` (the last measurement of each batch that ran
    /// to the end) except `chosen`, and checks it against `measured` there.
    pub(crate) fn fit(trials: &[Trial], chosen: usize, measured: u64) -> Option<MemoryModel> {
        let mut latest: Vec<(usize, u64)> = Vec::new();
        for trial in trials.iter().rev() {
            if trial.batch == chosen
                || matches!(trial.kind, TrialKind::Accumulation | TrialKind::Timing)
                || trial.outcome == Outcome::OutOfMemory
                || latest.iter().any(|&(b, _)| b == trial.batch)
            {
                continue;
            }
            if let Some(peak) = trial.peak_bytes {
                latest.push((trial.batch, peak));
            }
        }
        latest.sort_unstable();
        let (plateau, line) = phases(&latest)?;
        let predicted = line.predict(chosen).max(plateau).max(0.0);
        // JSON has no NaN or infinity: a model that cannot be checked is no model
        if measured == 0 || !(line.is_finite() && predicted.is_finite()) {
            return None;
        }
        Some(MemoryModel {
            fixed_bytes: line.fixed_bytes,
            bytes_per_sample: line.bytes_per_sample,
            plateau_bytes: plateau,
            fitted_batches: latest.iter().map(|&(b, _)| b).collect(),
            predicted_peak_bytes: predicted.round() as u64,
            prediction_error: (predicted - measured as f64) / measured as f64,
        })
    }
}

/// The plateau and the line through `points` (sorted by batch): the first
/// `k` points on the plateau (its height their highest peak), the rest on
/// the least-squares line, for the `k` that fits best, where the line passes
/// under every plateau point and rises; a plateau is taken only where the
/// line alone misses the peaks by more than a thousandth and the plateau
/// halves its squared error (noise is no plateau).
fn phases(points: &[(usize, u64)]) -> Option<(f64, LinearFit)> {
    let squared_error = |plateau: f64, line: &LinearFit| -> f64 {
        points.iter().map(|&(b, peak)| (line.predict(b).max(plateau) - peak as f64).powi(2)).sum()
    };
    let whole = LinearFit::through(points)?;
    let mut best = (0.0, whole, squared_error(0.0, &whole));
    // a line within a thousandth of the peaks (RMS) leaves nothing to explain
    let mean_peak = points.iter().map(|&(_, peak)| peak as f64).sum::<f64>() / points.len() as f64;
    if (best.2 / points.len() as f64).sqrt() <= mean_peak / 1000.0 {
        return Some((0.0, whole));
    }
    // at least two points on the line
    for k in 1..points.len().saturating_sub(1) {
        let Some(line) = LinearFit::through(&points[k..]) else { continue };
        let plateau = points[..k].iter().map(|&(_, peak)| peak as f64).fold(0.0, f64::max);
        let under = points[..k].iter().all(|&(b, _)| line.predict(b) <= plateau);
        if line.bytes_per_sample <= 0.0 || !under || !line.is_finite() {
            continue;
        }
        let error = squared_error(plateau, &line);
        if error <= best.2 / 2.0 {
            best = (plateau, line, error);
        }
    }
    Some((best.0, best.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(curve: impl Fn(usize) -> u64) -> Vec<(usize, u64)> {
        [1, 2, 4, 8, 16, 64, 128, 200].into_iter().map(|b| (b, curve(b))).collect()
    }

    #[test]
    fn a_step_that_peaks_in_its_update_at_small_batches_has_a_plateau_and_the_slope_past_it() {
        // the update's 900 MB until the activations' line (500 MB + 5 MB a sample) passes it
        let curve = |b: usize| (500_000_000 + 5_000_000 * b as u64).max(900_000_000);
        let (plateau, line) = phases(&points(curve)).unwrap();
        assert_eq!(plateau, 900_000_000.0);
        assert!((line.bytes_per_sample - 5e6).abs() < 1.0 && (line.fixed_bytes - 5e8).abs() < 100.0, "{line:?}");
    }

    #[test]
    fn a_straight_step_has_no_plateau_and_noise_makes_none() {
        let straight = |b: usize| 300_000_000 + 2_000_000 * b as u64;
        assert_eq!(phases(&points(straight)).unwrap().0, 0.0);
        let noisy = |b: usize| straight(b) + [0, 3000, 1000, 0, 2000, 500, 0, 1500][b.trailing_zeros() as usize % 8];
        let (plateau, line) = phases(&points(noisy)).unwrap();
        assert_eq!(plateau, 0.0);
        assert!((line.bytes_per_sample - 2e6).abs() < 50.0, "{line:?}");
    }
}
