//! A straight line through measured peaks: `peak(b) ≈ fixed + per_sample·b`.

/// A least-squares line through (batch, peak bytes) points: what the
/// predictive search jumps with, and what a plan's
/// [`MemoryModel`](crate::plan::MemoryModel) and a comparison's rows report.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LinearFit {
    /// Bytes at batch 0: weights, gradients, optimizer state, workspaces.
    pub(crate) fixed_bytes: f64,
    /// Bytes each sample adds: activations, mostly.
    pub(crate) bytes_per_sample: f64,
}

impl LinearFit {
    /// The least-squares line through `points`; `None` with fewer than two
    /// distinct batches.
    pub(crate) fn through(points: &[(usize, u64)]) -> Option<Self> {
        if points.len() < 2 {
            return None;
        }
        // around the mean batch and the mean peak the two columns are
        // orthogonal: the solution is the closed form, well conditioned
        let n = points.len() as f64;
        let mean_b = points.iter().map(|&(b, _)| b as f64).sum::<f64>() / n;
        let mean_p = points.iter().map(|&(_, p)| p as f64).sum::<f64>() / n;
        let rows: Vec<(Vec<f64>, f64, f64)> =
            points.iter().map(|&(b, p)| (vec![b as f64 - mean_b], p as f64 - mean_p, 1.0)).collect();
        let [bytes_per_sample] = least_squares(&rows)?[..] else { return None };
        Some(LinearFit { fixed_bytes: mean_p - bytes_per_sample * mean_b, bytes_per_sample })
    }

    /// Whether both coefficients are finite numbers.
    pub(crate) fn is_finite(&self) -> bool {
        self.fixed_bytes.is_finite() && self.bytes_per_sample.is_finite()
    }

    /// The predicted peak at `batch`.
    pub(crate) fn predict(&self, batch: usize) -> f64 {
        self.fixed_bytes + self.bytes_per_sample * batch as f64
    }

    /// The (fractional) batch at which the predicted peak reaches `limit_bytes`;
    /// `None` when the line does not rise.
    pub(crate) fn largest_under(&self, limit_bytes: u64) -> Option<f64> {
        (self.bytes_per_sample > 0.0 && self.bytes_per_sample.is_finite())
            .then(|| (limit_bytes as f64 - self.fixed_bytes) / self.bytes_per_sample)
    }
}

/// Weighted least squares: the coefficients `c` minimizing
/// `Σ weight · (features · c − target)²` over `rows` of `(features, target,
/// weight)`; `None` when the rows do not determine them. Each column is
/// scaled to at most 1 before the normal equations are solved (Gauss–Jordan
/// with partial pivoting), so that terms of very different sizes (a batch, a
/// batch times a squared length) stay well conditioned. The one solver of
/// the crate: the batch line above and the size model of
/// [`SizePlan`](crate::plan::SizePlan) use it.
pub(crate) fn least_squares(rows: &[(Vec<f64>, f64, f64)]) -> Option<Vec<f64>> {
    let n = rows.first()?.0.len();
    if rows.len() < n || rows.iter().any(|(features, _, _)| features.len() != n) {
        return None;
    }
    let scale: Vec<f64> =
        (0..n).map(|j| rows.iter().map(|(features, _, _)| features[j].abs()).fold(0.0, f64::max)).collect();
    if scale.iter().any(|&s| s <= 0.0 || !s.is_finite()) {
        return None;
    }
    let mut m = vec![vec![0.0; n + 1]; n];
    for (features, target, weight) in rows {
        let x: Vec<f64> = features.iter().zip(&scale).map(|(v, s)| v / s).collect();
        for i in 0..n {
            for j in 0..n {
                m[i][j] += weight * x[i] * x[j];
            }
            m[i][n] += weight * x[i] * target;
        }
    }
    for col in 0..n {
        let pivot = (col..n).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        // relative to the column's scale (≤ 1 after scaling, times the row count)
        if m[pivot][col].abs() < 1e-9 * m.iter().map(|r| r[col].abs()).fold(0.0, f64::max).max(f64::MIN_POSITIVE) {
            return None;
        }
        m.swap(col, pivot);
        let pivot_row = m[col].clone();
        for (index, row) in m.iter_mut().enumerate() {
            if index != col {
                let factor = row[col] / pivot_row[col];
                for (value, pivot_value) in row.iter_mut().zip(&pivot_row).skip(col) {
                    *value -= factor * pivot_value;
                }
            }
        }
    }
    Some((0..n).map(|i| m[i][n] / m[i][i] / scale[i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solves_weighted_problems_and_refuses_undetermined_ones() {
        // y = 2 + 3x exactly, weights do not matter
        let rows: Vec<(Vec<f64>, f64, f64)> =
            (0..5).map(|x| (vec![1.0, x as f64], 2.0 + 3.0 * x as f64, 1.0 + x as f64)).collect();
        let c = least_squares(&rows).unwrap();
        assert!((c[0] - 2.0).abs() < 1e-9 && (c[1] - 3.0).abs() < 1e-9, "{c:?}");
        // a column of zeros, or fewer rows than unknowns, determine nothing
        assert!(least_squares(&[(vec![1.0, 0.0], 1.0, 1.0), (vec![1.0, 0.0], 2.0, 1.0)]).is_none());
        assert!(least_squares(&[(vec![1.0, 2.0], 1.0, 1.0)]).is_none());
        // a weight pulls the line towards its row
        let pulled = least_squares(&[(vec![1.0], 0.0, 1.0), (vec![1.0], 10.0, 9.0)]).unwrap();
        assert!((pulled[0] - 9.0).abs() < 1e-9, "{pulled:?}");
    }

    #[test]
    fn a_line_through_points_on_a_line_is_that_line() {
        let fit = LinearFit::through(&[(1, 1_100), (4, 1_400), (16, 2_600)]).unwrap();
        assert!((fit.bytes_per_sample - 100.0).abs() < 1e-9);
        assert!((fit.fixed_bytes - 1_000.0).abs() < 1e-6);
        assert_eq!(fit.largest_under(10_000), Some(90.0));
        assert_eq!(fit.predict(10), 2_000.0);
    }

    #[test]
    fn a_line_through_two_points_is_the_line_between_them() {
        let fit = LinearFit::through(&[(700, 1_700), (705, 1_705)]).unwrap();
        assert_eq!(fit.largest_under(1_700), Some(700.0));
        assert!(LinearFit::through(&[(5, 1), (5, 2)]).is_none());
    }
}
