//! `Strategy::Predictive`: fit, jump, verify, close.

use super::{Bracket, LinearFit, Next, Observation, Outcome, SearchSpace};

/// A forecast is trusted for a jump straight to the predicted batch only when
/// the largest fit is within this factor of it; from further away the jump
/// lands at a quarter of the way (cheap, and far enough to show curvature the
/// small trials could not), and the forecast is made again from there.
const ANCHOR_RATIO: f64 = 8.0;
const FAR_JUMP_SHARE: f64 = 0.25;

/// Two slopes agree when they differ by at most this share: the line is
/// trusted for a jump only then.
const LINEARITY_TOLERANCE: f64 = 0.10;

/// Small trials grow by this factor until three fit, while the last fit's
/// peak is at most half the limit: a step's peak grows at most in proportion
/// to its batch (the fixed part does not grow), so the next trial needs at
/// most twice the limit, as a doubling search's does. Above half the limit
/// they double.
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

/// What the three largest fits say about where the peak reaches `limit`, and
/// how far a jump may trust it.
enum Forecast {
    /// Not enough growth to extrapolate from: double.
    Unknown,
    /// The three points lie on a line: jump to where it reaches the limit.
    Linear(f64),
    /// Slopes grow (attention's b², a convex curve): the parabola through the
    /// three points reaches the limit before the line would, so jumping there
    /// is conservative.
    Convex(f64),
    /// Slopes shrink (often allocator granules at small batches): the last
    /// secant is above the curve ahead; trust it only a few doublings far.
    Concave(f64),
}

fn forecast(points: &[(usize, u64)], limit: u64) -> Forecast {
    let Some(&[a, b, c]) = points.get(points.len().saturating_sub(3)..) else { return Forecast::Unknown };
    if points.len() < 3 {
        return Forecast::Unknown;
    }
    let (xa, xb, xc) = (a.0 as f64, b.0 as f64, c.0 as f64);
    let (ya, yb, yc) = (a.1 as f64, b.1 as f64, c.1 as f64);
    let (near, far) = ((yb - ya) / (xb - xa), (yc - yb) / (xc - xb));
    if far <= 0.0 || near < 0.0 {
        return Forecast::Unknown;
    }
    let secant = LinearFit { fixed_bytes: yc - far * xc, bytes_per_sample: far };
    let Some(on_secant) = secant.largest_under(limit) else { return Forecast::Unknown };
    if (far - near).abs() <= LINEARITY_TOLERANCE * far.max(near) {
        return Forecast::Linear(on_secant);
    }
    if far < near {
        return Forecast::Concave(on_secant);
    }
    // y = yc + far·(x − xc) + k·(x − xc)(x − xb), with k from the slopes' growth
    let k = (far - near) / (xc - xa);
    let (slope_at_c, room) = (far + k * (xc - xb), limit as f64 - yc);
    let dx = if room <= 0.0 {
        0.0
    } else {
        // k·dx² + slope_at_c·dx − room = 0, the positive root
        2.0 * room / (slope_at_c + (slope_at_c * slope_at_c + 4.0 * k * room).sqrt())
    };
    Forecast::Convex(xc + dx)
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
        let last_peak = points.last().map_or(u64::MAX, |&(_, peak)| peak);
        let factor = if last_peak <= limit / 2 { PROBE_GROWTH } else { 2 };
        return step_up(factor);
    }
    let predicted = match forecast(&points, limit) {
        Forecast::Unknown => return step_up(2),
        Forecast::Linear(predicted) | Forecast::Convex(predicted) => predicted,
        Forecast::Concave(predicted) => predicted.min(fitting.saturating_mul(PROBE_GROWTH) as f64),
    };
    let anchored = fitting as f64 * ANCHOR_RATIO >= predicted;
    let target = if anchored { predicted } else { predicted * FAR_JUMP_SHARE };
    if target >= space.last as f64 {
        return Next::Try(space.last);
    }
    let jump = space.floor(target.max(0.0) as usize);
    Next::Try(if jump > fitting { jump } else { fitting + space.multiple_of }.min(space.last))
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
/// ends when both peaks were measured in full (through a third, smaller fit
/// too when there is one, so that convex curves are met in one step), else by
/// the line through the two largest fits.
fn boundary_estimate(bracket: &Bracket, failing: usize, history: &[Observation], limit: u64) -> Option<f64> {
    let measured = |batch: usize| {
        history.iter().rev().find(|o| o.batch == batch).filter(|o| o.outcome != Outcome::OutOfMemory)?.peak_bytes
    };
    let lo = bracket.fitting?;
    let points = fitting_points(history);
    if let (Some(p_lo), Some(p_hi)) = (measured(lo), measured(failing)) {
        if p_hi > p_lo {
            let (x1, y1, x2, y2) = (lo as f64, p_lo as f64, failing as f64, p_hi as f64);
            let (span, room) = (x2 - x1, limit as f64 - y1);
            let secant = (y2 - y1) / span;
            let below = points.iter().rev().find(|&&(b, _)| b < lo);
            if let Some(&(x0, y0)) = below {
                let (x0, y0) = (x0 as f64, y0 as f64);
                // y = y1 + secant·d + k·d·(d − span), d = x − x1
                let k = (secant - (y1 - y0) / (x1 - x0)) / (x2 - x0);
                let slope = secant - k * span;
                let discriminant = slope * slope + 4.0 * k * room;
                if k.is_finite() && discriminant >= 0.0 {
                    let d = 2.0 * room / (slope + discriminant.sqrt());
                    if d.is_finite() && d > 0.0 && d < span {
                        return Some(x1 + d);
                    }
                }
            }
            return Some(x1 + room / secant);
        }
    }
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
        assert_eq!(tried, [1, 4, 16, 1024, 4096, 4097]);
    }

    #[test]
    fn small_trials_grow_fourfold_only_while_the_next_stays_within_twice_the_limit() {
        let space = SearchSpace::new(1, None, 1).unwrap();
        // 15 MiB per sample, nothing fixed, a 100 MiB limit: 4 fits at 60 MiB, over half
        // the limit, so the next is 8 (120 MiB), not 16 (240 MiB, more than twice the limit)
        let peak = |b: usize| (b as u64) * (15 << 20);
        let limit = 100 << 20;
        let tried = run(space, peak, limit);
        assert_eq!(tried[..3], [1, 4, 8]);
        assert!(tried.iter().all(|&b| peak(b) <= 2 * limit), "{tried:?}");
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
