//! `Strategy::Predictive`: fit, jump, verify, close.

use super::{Bracket, LinearFit, Next, Observation, SearchSpace};
use crate::plan::Outcome;

/// How far under the predicted largest batch the jump lands: a fitting jump
/// costs one trial less than a failing one and anchors the line far from the
/// small trials.
const JUMP_MARGIN: f64 = 0.01;

/// Two slopes agree when they differ by at most this share: the line is
/// trusted for a jump only then.
const LINEARITY_TOLERANCE: f64 = 0.10;

/// Small trials grow by this factor until three fit.
const PROBE_GROWTH: usize = 4;

pub(super) fn next(space: &SearchSpace, bracket: &Bracket, history: &[Observation]) -> Next {
    match (bracket.failing, space.limit_bytes()) {
        (_, None) => fallback(space, bracket),
        (None, Some(limit)) => explore(space, bracket, history, limit),
        (Some(failing), Some(limit)) => close(space, bracket, failing, history, limit),
    }
}

/// Binary's moves, for when there is nothing to predict with.
fn fallback(space: &SearchSpace, bracket: &Bracket) -> Next {
    match bracket.failing {
        None => bracket.double(space, true),
        Some(failing) => super::bisect(space, bracket.floor, failing),
    }
}

/// Fitting trials with a measured peak, by batch.
fn fitting_points(history: &[Observation]) -> Vec<(usize, u64)> {
    let mut points: Vec<(usize, u64)> =
        history.iter().filter(|o| o.outcome.fits()).filter_map(|o| o.peak_bytes.map(|p| (o.batch, p))).collect();
    points.sort_unstable();
    points
}

/// The secant through the last two of three points, if the three lie on a line.
fn linear_tail(points: &[(usize, u64)]) -> Option<LinearFit> {
    let [a, b, c] = points[points.len().checked_sub(3)?..] else { return None };
    let slope = |(x0, y0): (usize, u64), (x1, y1): (usize, u64)| (y1 as f64 - y0 as f64) / (x1 - x0) as f64;
    let (near, far) = (slope(a, b), slope(b, c));
    let agree = near > 0.0 && far > 0.0 && (far - near).abs() <= LINEARITY_TOLERANCE * far.max(near);
    agree.then_some(LinearFit { fixed_bytes: c.1 as f64 - far * c.0 as f64, bytes_per_sample: far })
}

/// No failure yet: small trials, then a jump just under the prediction.
fn explore(space: &SearchSpace, bracket: &Bracket, history: &[Observation], limit: u64) -> Next {
    let Some(fitting) = bracket.fitting else { return Next::Try(space.first) };
    if fitting >= space.last {
        return Next::Done;
    }
    let points = fitting_points(history);
    let step_up = |factor: usize| Next::Try(fitting.checked_mul(factor).map_or(space.last, |b| b.min(space.last)));
    if points.len() < 3 {
        return step_up(PROBE_GROWTH);
    }
    let Some(line) = linear_tail(&points) else {
        // not (yet) a line: allocator granules at small batches, or a convex curve
        return step_up(2);
    };
    let Some(predicted) = line.largest_under(limit) else { return step_up(2) };
    if predicted >= space.last as f64 {
        return Next::Try(space.last);
    }
    let jump = space.floor((predicted * (1.0 - JUMP_MARGIN)).max(0.0) as usize);
    let at_prediction = space.floor(predicted.max(0.0) as usize);
    let batch = if jump > fitting {
        jump
    } else if at_prediction > fitting {
        at_prediction
    } else {
        fitting + space.multiple_of
    };
    Next::Try(batch.min(space.last))
}

/// A failure is known: propose the model's boundary inside the bracket; bisect
/// when the model is contradicted by what was measured (it puts the boundary
/// outside the bracket, as when a real out-of-memory error comes before the
/// ceiling) or stops narrowing the bracket from both sides.
fn close(space: &SearchSpace, bracket: &Bracket, failing: usize, history: &[Observation], limit: u64) -> Next {
    let g = space.multiple_of;
    let floor = bracket.floor;
    if (failing - floor) / g <= 1 {
        return Next::Done;
    }
    let last_two_same_side =
        history.len() >= 2 && history[history.len() - 2].outcome.fits() == history[history.len() - 1].outcome.fits();
    let estimate = if last_two_same_side { None } else { boundary_estimate(bracket, failing, history, limit) };
    match estimate.filter(|&predicted| predicted > floor as f64 && predicted < failing as f64) {
        Some(predicted) => {
            let batch = space.floor(predicted as usize);
            Next::Try(batch.clamp(floor + g, failing - g))
        }
        // A failed jump can leave a bracket far wider than doubling would have:
        // gallop up from the largest fit, as Binary would, before bisecting.
        None => match bracket.fitting.and_then(|fit| fit.checked_mul(2)) {
            Some(doubled) if doubled < failing => Next::Try(doubled),
            _ => super::bisect(space, floor, failing),
        },
    }
}

/// Where the peak crosses the limit: by interpolation between the bracket's
/// ends when both peaks were measured in full, else by the line through the
/// two largest fits.
fn boundary_estimate(bracket: &Bracket, failing: usize, history: &[Observation], limit: u64) -> Option<f64> {
    let measured = |batch: usize| {
        history.iter().rev().find(|o| o.batch == batch).filter(|o| o.outcome != Outcome::OutOfMemory)?.peak_bytes
    };
    let lo = bracket.fitting?;
    if let (Some(p_lo), Some(p_hi)) = (measured(lo), measured(failing)) {
        if p_hi > p_lo {
            let per_sample = (p_hi - p_lo) as f64 / (failing - lo) as f64;
            return Some(lo as f64 + (limit as f64 - p_lo as f64) / per_sample);
        }
    }
    let points = fitting_points(history);
    LinearFit::through(&points[points.len().saturating_sub(2)..])?.largest_under(limit)
}

#[cfg(test)]
mod tests {
    use super::super::{next_batch, Strategy};
    use super::*;

    fn run(space: SearchSpace, peak: impl Fn(usize) -> u64, limit: u64) -> Vec<usize> {
        let space = space.with_limit(limit);
        let mut history = Vec::new();
        while let Next::Try(batch) = next_batch(Strategy::Predictive, &space, &history) {
            let p = peak(batch);
            let outcome = if p <= limit { Outcome::Fits } else { Outcome::OverCeiling };
            history.push(Observation { batch, outcome, peak_bytes: Some(p) });
            assert!(history.len() < 100);
        }
        history.iter().map(|o| o.batch).collect()
    }

    #[test]
    fn affine_curve_in_six_trials() {
        let space = SearchSpace::new(1, None, 1).unwrap();
        // fixed 1 GiB, 1 MiB per sample, limit 1 GiB + 4096.5 MiB: b* = 4096
        let tried = run(space, |b| (1 << 30) + (b as u64) * (1 << 20), (1 << 30) + 4096 * (1 << 20) + (1 << 19));
        assert_eq!(tried, [1, 4, 16, 4055, 4096, 4097]);
    }

    #[test]
    fn an_overshooting_jump_is_closed_by_interpolation() {
        let space = SearchSpace::new(1, None, 1).unwrap();
        // slightly convex: the line from small trials overshoots
        let peak = |b: usize| 1_000_000 + 1_000 * b as u64 + (b as u64 * b as u64) / 20;
        let limit = peak(700) + 10;
        let tried = run(space, peak, limit);
        assert_eq!(*tried.iter().filter(|&&b| peak(b) <= limit).max().unwrap(), 700);
        assert!(tried.len() <= 9, "{tried:?}");
    }
}
