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

/// One phase of a step's peak: the line its trials lie on, and which of the
/// points (by index, in batch order) it was fitted to.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Segment {
    pub(crate) line: LinearFit,
    pub(crate) points: std::ops::Range<usize>,
}

/// The most phases [`phases`] tells apart: the update's, the backward
/// pass's, and one more (a loss chunk that fills, a workspace that grows).
const MOST_PHASES: usize = 3;

/// The step's peak as the largest of a few lines, `peak(b) ≈ maxᵢ (fixedᵢ +
/// per_sampleᵢ·b)`, through `points` (sorted by batch, distinct): a step
/// peaks in one phase at small batches (the optimizer's update, the loss
/// chunk) and in another, steeper one past where their lines cross (the
/// backward pass). Each phase is a run of consecutive points and its own
/// least-squares line through at least two of them, except the first, which
/// may be flat (the height of its highest point: an update that does not grow
/// with the batch) from one point on; the slopes grow from phase to phase (a
/// maximum of lines is convex). A phase is added only where the fewer phases
/// miss the peaks by more than a thousandth (RMS) and the added phase halves
/// their squared error: noise and allocator granules make no phase. `None`
/// with fewer than two points.
pub(crate) fn phases(points: &[(usize, u64)]) -> Option<Vec<Segment>> {
    let whole = vec![Segment { line: LinearFit::through(points)?, points: 0..points.len() }];
    let error = |segments: &[Segment]| -> f64 {
        let peak = |b: usize| segments.iter().map(|s| s.line.predict(b)).fold(f64::MIN, f64::max);
        points.iter().map(|&(b, p)| (peak(b) - p as f64).powi(2)).sum()
    };
    let mean_peak = points.iter().map(|&(_, peak)| peak as f64).sum::<f64>() / points.len() as f64;
    let noise = |squared: f64| (squared / points.len() as f64).sqrt() <= mean_peak / 1000.0;
    let mut best = (error(&whole), whole);
    for count in 2..=MOST_PHASES {
        if noise(best.0) {
            break;
        }
        let better = splits(points.len(), count)
            .filter_map(|ends| segments_at(points, &ends))
            .map(|segments| (error(&segments), segments))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        match better {
            Some(better) if better.0 <= best.0 / 2.0 => best = better,
            _ => break,
        }
    }
    Some(best.1)
}

/// Every way to cut `n` points into `count` consecutive runs, each of at
/// least two points but the first (one or more): the runs' ends.
fn splits(n: usize, count: usize) -> impl Iterator<Item = Vec<usize>> {
    // ends[0] < ends[1] < … < ends[count - 1] = n
    let mut all = Vec::new();
    let mut ends = Vec::with_capacity(count);
    fn cut(n: usize, count: usize, start: usize, ends: &mut Vec<usize>, all: &mut Vec<Vec<usize>>) {
        if ends.len() + 1 == count {
            if n >= start + 2 || (ends.is_empty() && n > start) {
                ends.push(n);
                all.push(ends.clone());
                ends.pop();
            }
            return;
        }
        let least = if ends.is_empty() { start + 1 } else { start + 2 };
        for end in least..n {
            ends.push(end);
            cut(n, count, end, ends, all);
            ends.pop();
        }
    }
    cut(n, count, 0, &mut ends, &mut all);
    all.into_iter()
}

/// The phases through the runs that end at `ends`: each run's line (the
/// first run's may be flat at its highest point, whichever misses less),
/// `None` where the slopes do not grow from run to run, the last does not
/// rise, or a run's line passes over an earlier run's points by more than
/// those points' own line does (it would be the peak there, not its phase).
fn segments_at(points: &[(usize, u64)], ends: &[usize]) -> Option<Vec<Segment>> {
    let mut segments: Vec<Segment> = Vec::with_capacity(ends.len());
    let mut start = 0;
    for &end in ends {
        let run = &points[start..end];
        let line = if start == 0 {
            let height = run.iter().map(|&(_, p)| p as f64).fold(0.0, f64::max);
            let flat = LinearFit { fixed_bytes: height, bytes_per_sample: 0.0 };
            let misses = |line: &LinearFit| run.iter().map(|&(b, p)| (line.predict(b) - p as f64).powi(2)).sum::<f64>();
            match LinearFit::through(run) {
                Some(line) if misses(&line) < misses(&flat) && line.bytes_per_sample >= 0.0 => line,
                _ => flat,
            }
        } else {
            LinearFit::through(run)?
        };
        if !line.is_finite()
            || segments.last().is_some_and(|before| line.bytes_per_sample <= before.line.bytes_per_sample)
        {
            return None;
        }
        segments.push(Segment { line, points: start..end });
        start = end;
    }
    if segments.last()?.line.bytes_per_sample <= 0.0 {
        return None;
    }
    // each phase is the peak at its own points, or near it: a later line far
    // over an earlier run's points would make them its own
    for (i, segment) in segments.iter().enumerate() {
        for later in &segments[i + 1..] {
            for &(b, p) in &points[segment.points.clone()] {
                let own = (segment.line.predict(b) - p as f64).abs();
                if later.line.predict(b) - p as f64 > own.max(p as f64 / 1000.0) {
                    return None;
                }
            }
        }
    }
    Some(segments)
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

    #[test]
    fn two_rising_lines_are_two_phases_with_their_own_slopes() {
        // issue 89's step at 256 tokens: 792.5 MB + 16.0 MB a sample, then 563 MB + 23.13 MB
        let peak = |b: usize| (792.5e6 + 16.0e6 * b as f64).max(563.0e6 + 23.13e6 * b as f64) as u64;
        let points: Vec<(usize, u64)> = [1, 4, 8, 16, 24, 40, 48, 56].into_iter().map(|b| (b, peak(b))).collect();
        let found = phases(&points).unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!((found[0].points.clone(), found[1].points.clone()), (0..5, 5..8));
        assert!((found[0].line.bytes_per_sample - 16.0e6).abs() < 1.0, "{found:?}");
        assert!((found[1].line.bytes_per_sample - 23.13e6).abs() < 1.0, "{found:?}");
    }

    #[test]
    fn three_phases_are_told_apart_and_a_plateau_may_be_one_trial() {
        let peak = |b: usize| 900e6f64.max(500e6 + 5e6 * b as f64).max(100e6 + 9e6 * b as f64) as u64;
        let points: Vec<(usize, u64)> = [1, 84, 88, 92, 96, 110, 130, 150].into_iter().map(|b| (b, peak(b))).collect();
        let found = phases(&points).unwrap();
        let slopes: Vec<f64> = found.iter().map(|s| s.line.bytes_per_sample.round()).collect();
        assert_eq!(slopes, [0.0, 5e6, 9e6], "{found:?}");
        assert_eq!(found[0].line.fixed_bytes, 900e6);
    }

    #[test]
    fn a_straight_or_noisy_line_is_one_phase() {
        let points: Vec<(usize, u64)> = (1..=8).map(|b| (b * 8, 300_000_000 + 2_000_000 * (b * 8) as u64)).collect();
        assert_eq!(phases(&points).unwrap().len(), 1);
        // allocator granules of 2 MiB on a 1 GB step: within a thousandth, no phase
        let grainy: Vec<(usize, u64)> = (1..=8)
            .map(|b| (b * 8, (1_000_000_000 + 2_000_000 * (b * 8) as u64).div_ceil(2 << 20) * (2 << 20)))
            .collect();
        assert_eq!(phases(&grainy).unwrap().len(), 1);
        assert!(phases(&points[..1]).is_none());
    }

    #[test]
    fn every_cut_is_made_once_with_runs_of_two_but_the_first() {
        let cuts: Vec<Vec<usize>> = splits(5, 2).collect();
        assert_eq!(cuts, [vec![1, 5], vec![2, 5], vec![3, 5]]);
        assert_eq!(splits(5, 3).collect::<Vec<_>>(), [vec![1, 3, 5]]);
        assert_eq!(splits(3, 3).count(), 0);
    }
}
