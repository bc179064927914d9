//! A straight line through measured peaks: `peak(b) ≈ fixed + per_sample·b`.

use serde::{Deserialize, Serialize};

/// A least-squares line through (batch, peak bytes) points.
///
/// ```
/// use autobatch::search::LinearFit;
///
/// let fit = LinearFit::through(&[(1, 1_100), (4, 1_400), (16, 2_600)]).unwrap();
/// assert!((fit.bytes_per_sample - 100.0).abs() < 1e-9);
/// assert!((fit.fixed_bytes - 1_000.0).abs() < 1e-6);
/// assert_eq!(fit.largest_under(10_000), Some(90.0));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinearFit {
    /// Bytes at batch 0: weights, gradients, optimizer state, workspaces.
    pub fixed_bytes: f64,
    /// Bytes each sample adds: activations, mostly.
    pub bytes_per_sample: f64,
}

impl LinearFit {
    /// The least-squares line through `points`; `None` with fewer than two
    /// distinct batches.
    pub fn through(points: &[(usize, u64)]) -> Option<Self> {
        let n = points.len() as f64;
        if points.len() < 2 {
            return None;
        }
        let mean_b = points.iter().map(|&(b, _)| b as f64).sum::<f64>() / n;
        let mean_p = points.iter().map(|&(_, p)| p as f64).sum::<f64>() / n;
        let (mut covariance, mut variance) = (0.0, 0.0);
        for &(b, p) in points {
            let db = b as f64 - mean_b;
            covariance += db * (p as f64 - mean_p);
            variance += db * db;
        }
        if variance == 0.0 {
            return None;
        }
        let bytes_per_sample = covariance / variance;
        Some(LinearFit { fixed_bytes: mean_p - bytes_per_sample * mean_b, bytes_per_sample })
    }

    /// Whether both coefficients are finite numbers.
    pub fn is_finite(&self) -> bool {
        self.fixed_bytes.is_finite() && self.bytes_per_sample.is_finite()
    }

    /// The predicted peak at `batch`.
    pub fn predict(&self, batch: usize) -> f64 {
        self.fixed_bytes + self.bytes_per_sample * batch as f64
    }

    /// The (fractional) batch at which the predicted peak reaches `limit_bytes`;
    /// `None` when the line does not rise.
    pub fn largest_under(&self, limit_bytes: u64) -> Option<f64> {
        (self.bytes_per_sample > 0.0 && self.bytes_per_sample.is_finite())
            .then(|| (limit_bytes as f64 - self.fixed_bytes) / self.bytes_per_sample)
    }
}
