//! The line through the trials: what the plan predicts between them.

use serde::{Deserialize, Serialize};

use super::{Trial, TrialKind};
use crate::search::{LinearFit, Outcome};

/// `peak(b) ≈ fixed + per_sample·b`, fitted (least squares) to every trial that
/// ran to the end except those at the chosen batch, so that its peak there is a
/// prediction that the measurement then checks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryModel {
    /// Bytes at batch 0: weights, gradients, optimizer state, workspaces,
    /// other processes.
    pub fixed_bytes: f64,
    /// Bytes each sample adds: activations, mostly.
    pub bytes_per_sample: f64,
    /// The batches the line was fitted to.
    pub fitted_batches: Vec<usize>,
    /// The line's peak at the chosen batch.
    pub predicted_peak_bytes: u64,
    /// `(predicted − measured) / measured` at the chosen batch: negative when
    /// the line under-estimates (the dangerous direction).
    pub prediction_error: f64,
}

impl MemoryModel {
    /// The line's peak at `batch`, in bytes.
    pub fn predict(&self, batch: usize) -> f64 {
        self.line().predict(batch)
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
        let line = LinearFit::through(&latest)?;
        let predicted = line.predict(chosen).max(0.0);
        // JSON has no NaN or infinity: a model that cannot be checked is no model
        if measured == 0 || !(line.is_finite() && predicted.is_finite()) {
            return None;
        }
        Some(MemoryModel {
            fixed_bytes: line.fixed_bytes,
            bytes_per_sample: line.bytes_per_sample,
            fitted_batches: latest.iter().map(|&(b, _)| b).collect(),
            predicted_peak_bytes: predicted.round() as u64,
            prediction_error: (predicted - measured as f64) / measured as f64,
        })
    }
}
