//! `Strategy::Predictive`: fit, jump, verify, close.

use super::{Bracket, LinearFit, Observation, Outcome, SearchSpace};

/// A forecast is trusted for a jump straight to the predicted batch only when
/// the largest fit is within this factor of it; from further away the jump
/// lands at a quarter of the way, and at most [`PROBE_GROWTH`] times the
/// largest fit (cheap, and far enough to show curvature the small trials could not:
/// a step whose small batches peak in the optimizer's update, flat, and whose
/// large ones peak in the backward pass), and the forecast is made again
/// from there.
const ANCHOR_RATIO: f64 = 8.0;
const FAR_JUMP_SHARE: f64 = 0.25;

/// A slope under this share of the next one is a bend, not a parabola.
const BEND: f64 = 2.0;

/// Slopes that agree this closely make a line trusted for a jump from any
/// distance the proportional bound allows.
const STRAIGHT_LINE: f64 = 0.01;

/// Two slopes agree when they differ by at most this share: the line is
/// trusted for a jump only then.
const LINEARITY_TOLERANCE: f64 = 0.10;

/// Small trials grow by this factor until three fit, while the next trial
/// needs at most twice the limit, as a doubling search's does (see
/// [`growth`]); else they double.
const PROBE_GROWTH: usize = 4;

pub(super) fn next(space: &SearchSpace, bracket: &Bracket, history: &[Observation]) -> Option<usize> {
    match (bracket.failing, space.limit_bytes()) {
        (_, None) => fallback(space, bracket),
        (None, Some(limit)) => explore(space, bracket, history, limit),
        (Some(failing), Some(limit)) => close(space, bracket, failing, history, limit),
    }
}

/// Binary's moves, for when there is nothing to predict with.
fn fallback(space: &SearchSpace, bracket: &Bracket) -> Option<usize> {
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

/// Where the line through the two largest fits reaches `limit`, when the
/// fits below them all peaked alike (within a 1/1024 share): the step's peak
/// was elsewhere at small batches (an MLP's optimizer update, whatever the
/// batch) and only the fits past that flat start are the activations' own;
/// a parabola through the flat start would bend too early and land short.
fn past_a_flat_start(points: &[(usize, u64)], limit: u64) -> Option<f64> {
    let end = flat_start_end(points)?;
    let rising = spread(&points[points.iter().take_while(|&&(batch, _)| batch <= end).count()..]);
    if rising.len() < 2 {
        return None;
    }
    line_through_largest(&rising)?.largest_under(limit)
}

/// The largest batch of a flat start: two or more of the smallest fits that
/// all peaked alike (within a 1/1024 share), the step's peak elsewhere than
/// in what grows with the batch.
fn flat_start_end(points: &[(usize, u64)]) -> Option<usize> {
    let first = points.first()?.1;
    let flat = points.iter().take_while(|&&(_, peak)| peak.abs_diff(first) <= first / 1024).count();
    (flat >= 2).then(|| points[flat - 1].0)
}

/// The points a forecast reads, in batch order: each at least an eighth of
/// its batch below the one above it, so that two neighbours (the jump and the
/// batch after it) do not make a slope out of one allocator granule.
fn spread(points: &[(usize, u64)]) -> Vec<(usize, u64)> {
    let mut kept: Vec<(usize, u64)> = Vec::new();
    for &point in points.iter().rev() {
        if kept.last().is_none_or(|&(above, _)| point.0.saturating_add((above / 8).max(1)) <= above) {
            kept.push(point);
        }
    }
    kept.reverse();
    kept
}

fn forecast(points: &[(usize, u64)], limit: u64) -> Forecast {
    if let Some(predicted) = past_a_flat_start(points, limit) {
        return Forecast::Linear(predicted);
    }
    let Some(([a, b, c], near, far)) = largest_three(points) else { return Forecast::Unknown };
    let (xc, yc) = (c.0 as f64, c.1 as f64);
    if far <= 0.0 || near < 0.0 {
        return Forecast::Unknown;
    }
    let secant = LinearFit { fixed_bytes: yc - far * xc, bytes_per_sample: far };
    let Some(on_secant) = secant.largest_under(limit) else { return Forecast::Unknown };
    if slopes_agree(near, far, LINEARITY_TOLERANCE) {
        return Forecast::Linear(on_secant);
    }
    if far < near {
        return Forecast::Concave(on_secant);
    }
    if limit as f64 <= yc {
        return Forecast::Convex(xc);
    }
    parabola_reach([a, b, c], limit).map_or(Forecast::Unknown, Forecast::Convex)
}

/// The lines above and below `line` (through the two largest of `points`)
/// within which a fit past them is expected: twice the largest distance of a
/// smaller fit from the line (its scatter: noise, allocator granules) at
/// the largest fit, and the slope that error at both ends would give, beyond.
fn noise_band(points: &[Point], line: &LinearFit) -> Option<(LinearFit, LinearFit)> {
    let &[_, .., (b1, _), (b2, _)] = points else { return None };
    let run = (b2 - b1) as f64;
    let smaller = &points[..points.len() - 2];
    let scatter = smaller.iter().map(|&(b, p)| (p as f64 - line.predict(b)).abs()).fold(0.0, f64::max);
    // one smaller fit alone cannot tell noise from a curve: only one on the
    // line (within 1/1024 of a sample's bytes) is taken to show a straight one
    if smaller.len() == 1 && scatter > line.bytes_per_sample / 1024.0 {
        return None;
    }
    let error = 2.0 * scatter;
    let band = |sign: f64| LinearFit {
        fixed_bytes: line.fixed_bytes + sign * (error - 2.0 * error * b2 as f64 / run),
        bytes_per_sample: line.bytes_per_sample + sign * 2.0 * error / run,
    };
    Some((band(1.0), band(-1.0)))
}

/// Where the parabola through three points (in batch order) reaches `bytes`
/// past the first of them: `y = yc + far·(x − xc) + k·(x − xc)(x − xb)`, with
/// `k` from the slopes' growth (a line when they agree); `None` when it
/// never does (a parabola that bends down first).
fn parabola_reach([a, b, c]: [Point; 3], bytes: u64) -> Option<f64> {
    let (xa, xb, xc) = (a.0 as f64, b.0 as f64, c.0 as f64);
    let slope = |(x0, y0): Point, (x1, y1): Point| (y1 as f64 - y0 as f64) / (x1 as f64 - x0 as f64);
    let (near, far) = (slope(a, b), slope(b, c));
    let k = (far - near) / (xc - xa);
    let (slope_at_c, room) = (far + k * (xc - xb), bytes as f64 - c.1 as f64);
    // k·dx² + slope_at_c·dx − room = 0: the root nearest c
    let discriminant = slope_at_c * slope_at_c + 4.0 * k * room;
    let dx = 2.0 * room / (slope_at_c + discriminant.sqrt());
    Some(xc + dx).filter(|x| discriminant >= 0.0 && slope_at_c > 0.0 && x.is_finite() && *x >= xa)
}

/// How far a trial without a forecast may grow past the largest fit, whose
/// peak was `last_peak`: fourfold while the step's own bytes (the peak above
/// what the device held before it) grown fourfold keep the peak within twice
/// the limit, else doubling (the step's own bytes grow at most in proportion
/// to the batch, the held bytes not at all).
fn growth(space: &SearchSpace, last_peak: u64, limit: u64) -> usize {
    let held = space.held_bytes.unwrap_or(0).min(last_peak);
    let own = (last_peak - held) as u128;
    let fourfold = u128::from(held) + own * PROBE_GROWTH as u128;
    if fourfold <= 2 * u128::from(limit) { PROBE_GROWTH } else { 2 }
}

/// No failure yet: small trials, then a jump just under the prediction.
fn explore(space: &SearchSpace, bracket: &Bracket, history: &[Observation], limit: u64) -> Option<usize> {
    let Some(fitting) = bracket.fitting else { return Some(space.hint.unwrap_or(space.first)) };
    if fitting >= space.last {
        return None;
    }
    if let Some(hint) = space.hint {
        return away_from_hint(space, history, |o| o.outcome.fits() && o.batch >= hint, fitting, true);
    }
    let points = fitting_points(history);
    let step_up = |factor: usize| Some(fitting.checked_mul(factor).map_or(space.last, |b| b.min(space.last)));
    let last_peak = points.last().map_or(u64::MAX, |&(_, peak)| peak);
    let factor = growth(space, last_peak, limit);
    if points.len() < 3 {
        // the line through two fits puts the answer below the next small
        // trial: try it there (verified as any jump is) rather than overshoot
        let short_of_next = LinearFit::through(&points)
            .and_then(|line| line.largest_under(limit))
            .filter(|&predicted| predicted < fitting.saturating_mul(factor) as f64);
        if let Some(predicted) = short_of_next {
            let jump = space.floor(predicted.max(0.0) as usize);
            return Some(jump.max(fitting + space.multiple_of).min(space.last));
        }
        return step_up(factor);
    }
    let predicted = match forecast(&points, limit) {
        Forecast::Unknown => return step_up(factor),
        Forecast::Linear(predicted) | Forecast::Convex(predicted) => predicted,
        Forecast::Concave(predicted) => predicted.min(fitting.saturating_mul(PROBE_GROWTH) as f64),
    };
    // a jump the proportional bound keeps within twice the limit (the whole
    // peak's: a jump this far should not lean on what the device held), on a
    // line its points agree on closely, is trusted from any distance
    let safe = (last_peak as f64) * predicted / fitting as f64 <= 2.0 * limit as f64;
    let anchored = fitting as f64 * ANCHOR_RATIO >= predicted
        || (safe && on_a_line(&points, STRAIGHT_LINE) && past_a_flat_start(&points, limit).is_none());
    let target = if anchored {
        predicted
    } else {
        (predicted * FAR_JUMP_SHARE).min(fitting.saturating_mul(PROBE_GROWTH) as f64)
    };
    if target >= space.last as f64 {
        return Some(space.last);
    }
    let jump = space.floor(target.max(0.0) as usize);
    Some(if jump > fitting { jump } else { fitting + space.multiple_of }.min(space.last))
}

/// A failure is known. Where failed steps read what the device handed out
/// before their failing allocation ([`Window`]), the search is the one told
/// nothing at a failure, with every trial whose outcome the readings settle
/// left out: it never costs more than that search. Else [`close_unread`].
fn close(space: &SearchSpace, bracket: &Bracket, failing: usize, history: &[Observation], limit: u64) -> Option<usize> {
    let Some(window) = Window::read(space, history, limit) else {
        return close_unread(space, bracket, failing, history, limit);
    };
    // decided on what the first failure showed, so that every call decides alike
    let first_oom = history.iter().position(|o| o.outcome == Outcome::OutOfMemory).unwrap_or(0);
    let bisect = Window::read(space, &history[..=first_oom], limit)
        .is_some_and(|first| first.bisecting_is_no_dearer(space, &history[..=first_oom], limit));
    if bisect { window.bisect(space, history) } else { window.replay(space, history, limit) }
}

/// The most candidates a window may hold for [`Window::bisecting_is_no_dearer`]
/// to try every place the device's end may be.
const WINDOW_CANDIDATES: usize = 64;

/// The step time of trials past `start` in a search of `next` against a
/// device whose largest batch is `end` (a fit's peak read off `line`): `Σ (b + 4)`.
fn simulated_cost(
    start: &[Observation],
    end: usize,
    line: &LinearFit,
    next: impl Fn(&[Observation]) -> Option<usize>,
) -> u64 {
    let mut history = start.to_vec();
    let mut cost = 0u64;
    while let Some(batch) = next(&history) {
        if history.len() > start.len() + 200 {
            return u64::MAX; // no search of a space runs this long: count it as dearest
        }
        let fits = batch <= end;
        let outcome = if fits { Outcome::Fits } else { Outcome::OutOfMemory };
        let peak_bytes = fits.then(|| line.predict(batch).round().max(0.0) as u64);
        history.push(Observation { batch, outcome, peak_bytes });
        cost = cost.saturating_add(batch as u64 + 4);
    }
    cost
}

/// The search told nothing at a failure: its next trial after `history`.
fn unread_next(space: &SearchSpace, history: &[Observation], limit: u64) -> Option<usize> {
    let bracket = Bracket::of(space, history);
    match bracket.failing {
        Some(failing) => close_unread(space, &bracket, failing, history, limit),
        None => explore(space, &bracket, history, limit),
    }
}

/// `history` as the search told nothing at a failure sees it.
fn without_readings(history: &[Observation]) -> Vec<Observation> {
    let unread = |o: &Observation| match o.outcome {
        Outcome::OutOfMemory => Observation { peak_bytes: None, ..*o },
        _ => *o,
    };
    history.iter().map(unread).collect()
}

/// Where out-of-memory readings below the ceiling put the device's end: a
/// failed step was handed what it read (the device has at least that much
/// room), and the allocation that failed was at most the step's largest
/// ([`SearchSpace::with_largest_allocation`]), so the end lies under the
/// reading plus that. Along the line through the fits, a batch at or below
/// `fits_to` fits, and one at or above `fails_from` does not.
#[derive(Debug)]
struct Window {
    line: LinearFit,
    fits_to: usize,
    fails_from: Option<usize>,
}

impl Window {
    /// The window the failures of `history` show, when the fits before the
    /// first failure lie on a line (slopes within 1%: a curve that bends
    /// would move its ends; the scatter of the smaller fits widens them)
    /// and a failure read more
    /// than any fit before the first failure held, less than the line says it
    /// needed in full, and less than the limit (at or above the ceiling a
    /// reading says no more than the limit).
    fn read(space: &SearchSpace, history: &[Observation], limit: u64) -> Option<Window> {
        let first_oom = history.iter().position(|o| o.outcome == Outcome::OutOfMemory)?;
        // the fits before the first failure: the replay's line stays put as
        // the trials after it run
        let all = fitting_points(&history[..first_oom]);
        let highest_fit = all.iter().map(|&(_, peak)| peak).max()?;
        let points = last_phase(&all);
        if !on_a_line(&points, STRAIGHT_LINE) {
            return None;
        }
        let line = line_through_largest(&points)?;
        let (three, near, far) = largest_three(&points)?;
        let (upper, lower) = noise_band(&points, &line)?;
        let at = |line: &LinearFit, batch: f64| line.fixed_bytes + line.bytes_per_sample * batch;
        // the line through the two largest fits falls under a curve whose
        // slopes grow past them and over one whose slopes shrink: where it
        // does, the parabola through the three largest bounds that side; the
        // band the smaller fits' scatter about the line puts round it, both
        let fits_under = |bytes: u64| {
            let on_band = upper.largest_under(bytes)?;
            let margin = (at(&upper, on_band) - at(&line, on_band)).max(0.0) as u64;
            Some(if far > near { parabola_reach(three, bytes.saturating_sub(margin))?.min(on_band) } else { on_band })
        };
        let fails_over = |bytes: u64| {
            let on_band = lower.largest_under(bytes)?;
            let margin = (at(&line, on_band) - at(&lower, on_band)).max(0.0) as u64;
            Some(if far < near { parabola_reach(three, bytes.saturating_add(margin))?.max(on_band) } else { on_band })
        };
        let readings: Vec<(usize, u64)> = history
            .iter()
            .filter(|o| o.outcome == Outcome::OutOfMemory)
            .filter_map(|o| Some((o.batch, o.peak_bytes?)))
            .filter(|&(batch, read)| read > highest_fit && read < limit && (read as f64) < line.predict(batch))
            .collect();
        let room = readings.iter().map(|&(_, read)| read).max()?;
        // a line is trusted that far only near its points, as a jump is
        let largest_fit = points.last()?.0;
        let fits_to = space.floor(fits_under(room)?.max(0.0) as usize);
        if fits_to < space.first || fits_to as f64 > largest_fit as f64 * ANCHOR_RATIO {
            return None;
        }
        let fails_from = space.largest_allocation.and_then(|bound| {
            let end = readings.iter().map(|&(batch, read)| read.saturating_add(bound.at(batch))).min()?;
            let batch = fails_over(end)?.max(0.0).ceil() as usize;
            Some(batch.div_ceil(space.multiple_of).saturating_mul(space.multiple_of).max(fits_to + space.multiple_of))
        });
        let window = Window { line, fits_to, fails_from };
        // a trial that contradicts it (a noisy step failing a granule under
        // the line's batch, a curve bending more than the parabola) says the
        // line is no guide here
        let contradicted = history.iter().any(|o| window.settles(o.batch).is_some_and(|fits| fits != o.outcome.fits()));
        (!contradicted).then_some(window)
    }

    /// Whether bisecting the window ([`bisect`](Window::bisect)) costs no
    /// more than the search told nothing at a failure, wherever in the
    /// window the device's end is (each place tried, when there are at most
    /// [`WINDOW_CANDIDATES`]): bisecting goes straight to the window, the
    /// other walks to it from the fits below.
    fn bisecting_is_no_dearer(&self, space: &SearchSpace, start: &[Observation], limit: u64) -> bool {
        let g = space.multiple_of;
        let Some(top) = self.fails_from.filter(|&top| (top - self.fits_to) / g <= WINDOW_CANDIDATES) else {
            return false;
        };
        let unread_start = without_readings(start);
        (self.fits_to..top.min(space.last.saturating_add(1))).step_by(g).all(|end| {
            let bisected = simulated_cost(start, end, &self.line, |h| self.bisect(space, h));
            let unread = simulated_cost(&unread_start, end, &self.line, |h| unread_next(space, h, limit));
            bisected <= unread
        })
    }

    /// Bisects between the larger of the largest fit and the window's
    /// bottom, and the smaller of the smallest failure above it and the
    /// window's top; then runs the bottom and the top if only settled (a
    /// plan's answer is measured and proven by a failure above it).
    fn bisect(&self, space: &SearchSpace, history: &[Observation]) -> Option<usize> {
        let g = space.multiple_of;
        let ran = |batch: usize| history.iter().any(|o| o.batch == batch);
        let largest_fit = Observation::best(history).map_or(0, |o| o.batch);
        let lo = largest_fit.max(self.fits_to);
        let smallest_failure = history.iter().filter(|o| !o.outcome.fits() && o.batch > lo).map(|o| o.batch).min();
        let top = self.fails_from.unwrap_or(usize::MAX).min(space.last.saturating_add(g));
        let hi = smallest_failure.map_or(top, |failure| failure.min(top));
        if (hi - lo) / g > 1 {
            return Some(lo + g * ((hi - lo) / g / 2));
        }
        if !ran(lo) {
            return Some(lo);
        }
        if hi <= space.last && !ran(hi) {
            return Some(hi);
        }
        None
    }

    /// Whether `batch` fits, where the readings settle it.
    fn settles(&self, batch: usize) -> Option<bool> {
        if batch <= self.fits_to {
            Some(true)
        } else if self.fails_from.is_some_and(|from| batch >= from) {
            Some(false)
        } else {
            None
        }
    }

    /// The next trial of the search told nothing at a failure, replayed from
    /// the first failure: where it would try a batch that was run, what was
    /// measured; one the readings settle, that outcome (a fit's peak read off
    /// the line); the first batch that is neither is the next trial. When it is done, the
    /// answer and the batch above it are run if only settled, since a plan's
    /// answer is measured and proven by a failure above it.
    fn replay(&self, space: &SearchSpace, history: &[Observation], limit: u64) -> Option<usize> {
        let first_oom = history.iter().position(|o| o.outcome == Outcome::OutOfMemory).unwrap_or(history.len());
        let unread = without_readings(history);
        let mut seen: Vec<Observation> = unread[..=first_oom.min(history.len() - 1)].to_vec();
        let ran = |batch: usize| unread.iter().rev().find(|o| o.batch == batch).copied();
        while let Some(batch) = unread_next(space, &seen, limit) {
            if let Some(measured) = ran(batch) {
                seen.push(measured);
                continue;
            }
            let outcome = match self.settles(batch) {
                Some(true) => Outcome::Fits,
                Some(false) => Outcome::OutOfMemory,
                None => return Some(batch),
            };
            let peak = outcome.fits().then(|| self.line.predict(batch).round() as u64);
            seen.push(Observation { batch, outcome, peak_bytes: peak });
        }
        // done: what only the readings settled is run, the answer, then the batch above it
        let ran_here = |batch: usize| history.iter().any(|o| o.batch == batch);
        let answer = Observation::best(&seen)?.batch;
        if !ran_here(answer) {
            return Some(answer);
        }
        match answer.checked_add(space.multiple_of).filter(|&above| above <= space.last) {
            Some(above) if !ran_here(above) && seen.iter().any(|o| o.batch == above) => Some(above),
            _ => None,
        }
    }
}

/// A failure is known and none read how far the device got: propose the
/// model's boundary inside the bracket; bisect when the model is contradicted
/// by what was measured (it puts the boundary outside the bracket, as when a
/// real out-of-memory error comes before the ceiling) or stops narrowing the
/// bracket from both sides.
fn close_unread(
    space: &SearchSpace,
    bracket: &Bracket,
    failing: usize,
    history: &[Observation],
    limit: u64,
) -> Option<usize> {
    let g = space.multiple_of;
    let floor = bracket.floor;
    if (failing - floor) / g <= 1 {
        return None;
    }
    if let (None, Some(hint)) = (bracket.fitting, space.hint) {
        return away_from_hint(space, history, |o| !o.outcome.fits() && o.batch <= hint, failing, false);
    }
    let last_two_same_side =
        history.len() >= 2 && history[history.len() - 2].outcome.fits() == history[history.len() - 1].outcome.fits();
    // a forecast that ran out of memory once is not sent there again: the
    // device ends before the line says, by an amount no reading told
    let forecast_failed = history.iter().filter(|o| o.outcome == Outcome::OutOfMemory).count() > 1
        && history.iter().rev().find(|o| o.batch == failing).is_some_and(|o| o.outcome == Outcome::OutOfMemory);
    let estimate = boundary_estimate(bracket, failing, history, limit)
        .filter(|_| !forecast_failed)
        // at the largest fit itself: the next granule up proves it the answer
        .filter(|&predicted| predicted >= floor as f64 && predicted < failing as f64)
        .map(|predicted| space.floor(predicted as usize).clamp(floor + g, failing - g));
    let estimate = if last_two_same_side {
        // The model stopped narrowing from both sides: bisect, unless it puts
        // the boundary a granule from the side it keeps landing on (the answer
        // or the first failure is then one trial away), and the last step was
        // not such a granule already.
        let last = &history[history.len() - 1];
        let granule_step = history[history.len() - 2].batch.abs_diff(last.batch) == g;
        let next_to_side = if last.outcome.fits() { floor + g } else { failing - g };
        estimate.filter(|&batch| batch == next_to_side && !granule_step)
    } else {
        estimate
    };
    match estimate {
        Some(batch) => Some(batch),
        // A failed jump can leave a bracket far wider than doubling would have:
        // gallop up from the largest fit, as Binary would, before bisecting,
        // while doubling lands no higher than bisecting would (a doubling just
        // under the failure tells almost nothing)
        None => match bracket.fitting.and_then(|fit| fit.checked_mul(2)) {
            Some(doubled) if doubled <= floor + (failing - floor) / 2 => Some(doubled),
            // a wide bracket is split a little under its middle: a trial's
            // time grows with its batch, and those above the answer are the dearer half
            _ if (failing - floor) / g > WIDE_BRACKET => Some(floor + g * ((failing - floor) / g * 9 / 20)),
            _ => super::bisect(space, floor, failing),
        },
    }
}

/// From the hint, one side seen (`seen` picks its trials, `edge` the one
/// nearest the other side): a granule further, then twice as far each time
/// (up when the hint fit, down when it did not), never past the space. With
/// a slope expected near the hint, the first three steps go where the edge's
/// measured peak meets the limit along it (then along the secant through the
/// side's two nearest measured points), at least a granule on.
fn away_from_hint(
    space: &SearchSpace,
    history: &[Observation],
    seen: impl Fn(&Observation) -> bool,
    edge: usize,
    up: bool,
) -> Option<usize> {
    let g = space.multiple_of;
    let steps = history.iter().filter(|o| seen(o)).count().max(1);
    let along_slope = || {
        let limit = space.limit_bytes?;
        let full = |o: &&Observation| o.outcome != Outcome::OutOfMemory;
        let edge_trial = history.iter().rev().find(|o| o.batch == edge)?;
        // a failed step's reading above the limit is a peak it reached at
        // least: moved along the slope from there, the next trial lands short
        // of where the whole peak would put it, on the side it came from
        let y0 = edge_trial.peak_bytes.filter(|&peak| full(&edge_trial) || (!up && peak > limit))?;
        // the secant through the side's two nearest peaks measured in full once
        // there are two, else the slope expected near the hint
        let nearest_other = history
            .iter()
            .filter(|o| seen(o) && o.batch != edge)
            .filter(full)
            .filter_map(|o| Some((o.batch, o.peak_bytes?)))
            .min_by_key(|&(batch, _)| batch.abs_diff(edge));
        let slope = match nearest_other {
            Some((x1, y1)) if full(&edge_trial) && y1 != y0 => (y1 as f64 - y0 as f64) / (x1 as f64 - edge as f64),
            _ => space.hint_slope? as f64,
        };
        if !(slope.is_finite() && slope > 0.0) {
            return None;
        }
        let predicted = edge as f64 + (limit as f64 - y0 as f64) / slope;
        let batch = space.floor(predicted.clamp(0.0, space.last as f64) as usize);
        Some(if up { batch.max(edge.saturating_add(g)) } else { batch.min(edge.saturating_sub(g)) })
    };
    let next = match along_slope().filter(|_| space.hint_slope.is_some() && steps <= 3) {
        Some(batch) => batch,
        None => {
            let distance = doubling(g, steps);
            if up { edge.saturating_add(distance) } else { edge.saturating_sub(distance) }
        }
    };
    Some(space.floor(next.min(space.last)).max(space.first))
}

/// A fitting trial's batch and measured peak.
type Point = (usize, u64);

/// The three largest of `points`, spread apart (see [`spread`]), with the
/// slope between the first two (near) and the last two (far).
fn largest_three(points: &[Point]) -> Option<([Point; 3], f64, f64)> {
    let points = spread(points);
    let &[a, b, c] = points.get(points.len().checked_sub(3)?..)? else { return None };
    let slope = |(x0, y0): (usize, u64), (x1, y1): (usize, u64)| (y1 as f64 - y0 as f64) / (x1 as f64 - x0 as f64);
    Some(([a, b, c], slope(a, b), slope(b, c)))
}

/// The fits of the step's last phase (see [`phases`](super::phases)) when
/// the fits show more than one and a third confirms the last one's line;
/// else all of them. What a line through the largest fits reads: the fits
/// below a crossing lie on a flatter line that is not the peak past it.
fn last_phase(points: &[Point]) -> Vec<Point> {
    match super::phases(points).as_deref() {
        Some([.., last]) if last.points.start > 0 && last.points.len() >= 3 => points[last.points.clone()].to_vec(),
        _ => points.to_vec(),
    }
}

/// Whether two slopes differ by at most `tolerance` of the larger.
fn slopes_agree(near: f64, far: f64, tolerance: f64) -> bool {
    (far - near).abs() <= tolerance * far.max(near)
}

/// Whether the three largest of `points`, spread apart, rise with slopes
/// that agree within `tolerance`.
fn on_a_line(points: &[(usize, u64)], tolerance: f64) -> bool {
    largest_three(points).is_some_and(|(_, near, far)| far > 0.0 && slopes_agree(near, far, tolerance))
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
    if let (Some(p_lo), Some(p_hi)) = (measured(lo), measured(failing))
        && p_hi > p_lo
    {
        let (x1, y1, x2, y2) = (lo as f64, p_lo as f64, failing as f64, p_hi as f64);
        let (span, room) = (x2 - x1, limit as f64 - y1);
        let secant = (y2 - y1) / span;
        let below = points.iter().rev().find(|&&(b, _)| b < lo);
        // a slope below that is under half the secant's is no parabola's (a
        // parabola's slopes between doublings grow at most twofold): a bend,
        // the peak elsewhere at small batches (the optimizer's update), and
        // the parabola through it would pass the boundary: keep the chord
        let bent = |&&(x0, y0): &&(usize, u64)| (y1 - y0 as f64) / (x1 - x0 as f64) * BEND < secant;
        // nor is a point of a flat start on the curve the bracket's ends are on
        let flat = |&&(x0, _): &&(usize, u64)| x0 <= flat_start_end(&points).unwrap_or(0);
        if let Some(&(x0, y0)) = below.filter(|point| !bent(point) && !flat(point)) {
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
    line_through_largest(&points)?.largest_under(limit)
}

/// The line through the two largest of `points` (in batch order).
fn line_through_largest(points: &[(usize, u64)]) -> Option<LinearFit> {
    LinearFit::through(&points[points.len().saturating_sub(2)..])
}

/// Granules in a bracket past which [`close_unread`] splits it at 45%, not
/// at its middle.
const WIDE_BRACKET: usize = 64;

/// `first × 2^(k − 1)`: the `k`-th step (from 1) of a gallop that doubles,
/// saturating.
fn doubling(first: usize, k: usize) -> usize {
    first.saturating_mul(1usize.checked_shl(k.saturating_sub(1) as u32).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::super::Strategy;
    use super::*;

    fn run(space: SearchSpace, peak: impl Fn(usize) -> u64, limit: u64) -> Vec<usize> {
        let space = space.with_limit(limit);
        let mut history = Vec::new();
        while let Some(batch) = Strategy::Predictive.next_batch(&space, &history) {
            let p = peak(batch);
            let outcome = if p <= limit { Outcome::Fits } else { Outcome::OverCeiling };
            history.push(Observation { batch, outcome, peak_bytes: Some(p) });
            assert!(history.len() < 100);
        }
        history.iter().map(|o| o.batch).collect()
    }

    #[test]
    fn affine_curve_in_eight_trials() {
        let space = SearchSpace::new(1, None, 1).unwrap();
        // fixed 1 GiB, 1 MiB per sample, limit 1 GiB + 4096.5 MiB: b* = 4096;
        // far jumps go no further than 4× the largest fit
        let tried = run(space, |b| (1 << 30) + (b as u64) * (1 << 20), (1 << 30) + 4096 * (1 << 20) + (1 << 19));
        assert_eq!(tried, [1, 4, 16, 64, 256, 1024, 4096, 4097]);
    }

    #[test]
    fn a_flat_start_does_not_send_the_far_jump_past_the_bend() {
        // the optimizer's update peaks at small batches (flat), the backward pass
        // at large ones (steep): the line through the flat part sees no growth
        let peak = |b: usize| (23u64 << 20).max((16 << 20) + (b as u64) * (40 << 10));
        let limit = 43 << 20;
        let space = SearchSpace::new(1, None, 1).unwrap();
        let tried = run(space, peak, limit);
        let truth = (1..2000).filter(|&b| peak(b) <= limit).max().unwrap();
        assert_eq!(tried.iter().copied().filter(|&b| peak(b) <= limit).max(), Some(truth));
        let over: Vec<usize> = tried.iter().copied().filter(|&b| peak(b) > limit).collect();
        assert!(over.iter().all(|&b| b <= truth + truth / 4), "{tried:?}");
        assert!(tried.len() <= 13, "{tried:?}");
    }

    #[test]
    fn a_bend_is_closed_by_the_chord_not_a_parabola_through_the_flat() {
        // an MLP's step: AdamW's update peaks at small batches (flat), the
        // backward pass at large ones (steep), measured on the CPU heap
        let mib = |x: f64| (x * (1 << 20) as f64) as u64;
        let peak = |b: usize| mib(115.0).max(mib(57.0 + 0.132 * b as f64));
        let limit = mib(172.8);
        let truth = (1..5000).filter(|&b| peak(b) <= limit).max().unwrap();
        let tried = run(SearchSpace::new(1, None, 1).unwrap(), peak, limit);
        assert_eq!(tried.iter().copied().filter(|&b| peak(b) <= limit).max(), Some(truth), "{tried:?}");
        // one jump over, then the chord through it and the last fit lands on the answer
        assert_eq!(tried.iter().filter(|&&b| peak(b) > limit).count(), 2, "{tried:?}");
        assert!(tried.len() <= 13, "{tried:?}");
    }

    #[test]
    fn spreading_points_near_the_largest_batch_does_not_overflow() {
        let top = usize::MAX - 1;
        assert_eq!(spread(&[(top - 1, 10), (top, 11)]), [(top, 11)]);
        assert_eq!(spread(&[(1, 1), (2, 2), (16, 3), (17, 4)]), [(1, 1), (2, 2), (17, 4)]);
    }

    #[test]
    fn the_line_past_a_flat_start_leaves_the_flat_start_out() {
        // an MLP under 96 MiB: flat at 54.2 MiB (AdamW's update) up to batch ~360,
        // then 0.0887 MiB per sample (the backward pass), as measured on the CPU heap
        let mib = |x: f64| (x * (1 << 20) as f64) as u64;
        let peak = |b: usize| mib(54.2).max(mib(54.2 + 0.0887 * (b as f64 - 360.0)));
        let limit = mib(86.4);
        let truth = (1..5000).filter(|&b| peak(b) <= limit).max().unwrap();
        let tried = run(SearchSpace::new(1, None, 1).unwrap(), peak, limit);
        assert_eq!(tried.iter().copied().filter(|&b| peak(b) <= limit).max(), Some(truth), "{tried:?}");
        // two fits past the bend, then the answer and the batch above it
        let past_the_bend = tried.iter().filter(|&&b| peak(b) > mib(54.2)).count();
        assert!(past_the_bend <= 4, "{tried:?}");
    }

    #[test]
    fn a_hint_that_is_right_takes_two_trials_and_a_wrong_one_stays_exact() {
        let peak = |b: usize| (1u64 << 30) + (b as u64) * (1 << 20);
        let limit = (1 << 30) + 700 * (1 << 20);
        for (hint, most) in [(700, 2), (690, 8), (720, 8), (5000, 16), (1, 14)] {
            let space = SearchSpace::new(1, None, 1).unwrap().with_hint(hint);
            let tried = run(space, peak, limit);
            assert_eq!(tried[0], hint);
            assert_eq!(tried.iter().copied().filter(|&b| peak(b) <= limit).max(), Some(700), "{tried:?}");
            assert!(tried.len() <= most, "hint {hint}: {tried:?}");
        }
    }

    #[test]
    fn a_hint_with_its_slope_goes_where_the_measured_peak_meets_the_limit() {
        let peak = |b: usize| (1u64 << 30) + (b as u64) * (1 << 20);
        let limit = (1 << 30) + 700 * (1 << 20) + (1 << 19);
        for (slope_share, most) in [(1.0, 3), (0.8, 5), (1.25, 5)] {
            for hint in [700, 690, 720, 5000, 1] {
                let space = SearchSpace::new(1, None, 1)
                    .unwrap()
                    .with_hint(hint)
                    .with_hint_slope(slope_share * (1u64 << 20) as f64);
                let tried = run(space, peak, limit);
                assert_eq!(tried[0], hint);
                assert_eq!(tried.iter().copied().filter(|&b| peak(b) <= limit).max(), Some(700), "{tried:?}");
                assert!(tried.len() <= most, "hint {hint}, slope x{slope_share}: {tried:?}");
            }
        }
    }

    #[test]
    fn small_trials_grow_fourfold_only_while_the_next_stays_within_twice_the_limit() {
        let space = SearchSpace::new(1, None, 1).unwrap();
        // 40 MiB fixed, 5 MiB per sample, a 100 MiB limit: 4 fits at 60 MiB, over half
        // the limit, so the next is 8 (80 MiB), not 16 (120 MiB)
        let peak = |b: usize| (40 << 20) + (b as u64) * (5 << 20);
        let limit = 100 << 20;
        let tried = run(space, peak, limit);
        assert_eq!(tried[..3], [1, 4, 8]);
        assert!(tried.iter().all(|&b| peak(b) <= 2 * limit), "{tried:?}");
    }

    #[test]
    fn what_the_device_held_lets_small_trials_grow_fourfold_and_a_flat_start_is_no_parabola_point() {
        // an MLP under 192 MiB, as measured on the CPU heap: 42 MiB of weights and
        // AdamW moments held between steps, the update peaking at 115 MiB (60% of
        // the budget) up to batch ~425, then the backward pass at 61 MiB + 0.127 MiB
        // per sample
        let mib = |x: f64| (x * (1 << 20) as f64) as u64;
        let peak = |b: usize| mib(115.0).max(mib(61.0 + 0.127 * b as f64));
        let limit = mib(172.8);
        let truth = (1..5000).filter(|&b| peak(b) <= limit).max().unwrap();
        let held = SearchSpace::new(1, None, 1).unwrap().with_held_bytes(mib(42.0));
        let tried = run(held, peak, limit);
        assert_eq!(tried.iter().copied().filter(|&b| peak(b) <= limit).max(), Some(truth), "{tried:?}");
        // fourfold: the step's own 73 MiB grown fourfold and the held 42 MiB stay
        // within twice the limit; without knowing what was held, 115 MiB is over
        // half the limit and the trials double
        assert_eq!(tried[..5], [1, 4, 16, 64, 256], "{tried:?}");
        assert!(tried.iter().all(|&b| peak(b) <= 2 * limit), "{tried:?}");
        // the chord from the flat start, then the chord along the rise: the
        // answer and the batch above it
        assert!(tried.len() <= 9, "{tried:?}");
        let unknown = run(SearchSpace::new(1, None, 1).unwrap(), peak, limit);
        assert_eq!(unknown[..3], [1, 2, 4], "{unknown:?}");
        assert!(unknown.len() > tried.len(), "{unknown:?}");
    }

    #[test]
    fn two_fits_whose_line_ends_short_of_the_next_small_trial_are_followed_there() {
        // 15 MiB per sample, a 100 MiB limit: the line through 1 and 4 ends at
        // 6.7, short of the next small trial (8): 6, then 7 to prove it
        let peak = |b: usize| (b as u64) * (15 << 20);
        let tried = run(SearchSpace::new(1, None, 1).unwrap(), peak, 100 << 20);
        assert_eq!(tried, [1, 4, 6, 7]);
        // granules of 64 and an answer of 640: 64, 256, then the line's 640
        // and 704, not 1024 (past the answer, a step and a half's cost)
        let peak = |b: usize| (8u64 << 30) + (b as u64) * (100 << 20);
        let limit = (8u64 << 30) + 700 * (100 << 20);
        let tried = run(SearchSpace::new(1, None, 64).unwrap(), peak, limit);
        assert_eq!(tried, [64, 256, 640, 704]);
    }

    /// A device whose room ends below the ceiling: a step that does not fit
    /// fails with out-of-memory, its reading the pieces handed out before
    /// the failing one (`pieces` per step of `fixed + per_sample·b`).
    fn run_short_device(room: u64, fixed: u64, per_sample: u64, pieces: u64, limit: u64) -> Vec<Observation> {
        run_short_device_in(SearchSpace::new(1, None, 1).unwrap(), room, fixed, per_sample, pieces, limit)
    }

    fn run_short_device_in(
        space: SearchSpace,
        room: u64,
        fixed: u64,
        per_sample: u64,
        pieces: u64,
        limit: u64,
    ) -> Vec<Observation> {
        let space = space.with_limit(limit);
        let mut history = Vec::new();
        while let Some(batch) = Strategy::Predictive.next_batch(&space, &history) {
            let peak = fixed + per_sample * batch as u64;
            let (outcome, reading) = if peak > room {
                let piece = (peak - fixed) / pieces;
                (Outcome::OutOfMemory, fixed + (room - fixed) / piece * piece)
            } else if peak <= limit {
                (Outcome::Fits, peak)
            } else {
                (Outcome::OverCeiling, peak)
            };
            history.push(Observation { batch, outcome, peak_bytes: Some(reading) });
            assert!(history.len() < 100);
        }
        history
    }

    #[test]
    fn an_out_of_memory_reading_below_the_ceiling_is_taken_to_fit_and_the_allocation_above_it_searched() {
        // the ceiling allows batch 4000, the device runs out above batch 2999
        let (fixed, per_sample) = (1u64 << 30, 1u64 << 20);
        let limit = fixed + 4000 * per_sample;
        let room = fixed + 3000 * per_sample - 1;
        // a step of 256 equal allocations: the largest, a 256th of the step's own bytes
        let told = SearchSpace::new(1, None, 1).unwrap().with_largest_allocation(0, per_sample.div_ceil(256));
        let history = run_short_device_in(told, room, fixed, per_sample, 256, limit);
        let unread = run_short_device(room, fixed, per_sample, 1, limit);
        let tried: Vec<usize> = history.iter().map(|o| o.batch).collect();
        assert_eq!(Observation::best(&history).map(|o| o.batch), Some(2999), "{tried:?}");
        assert_eq!(Observation::best(&unread).map(|o| o.batch), Some(2999));
        // 1, 4, 16, a far jump, the failed jump, then only batches within one
        // allocation of the failed step above where the line reaches its
        // reading (the rest the reading settles), fewer than told nothing
        let failed = history.iter().find(|o| o.outcome == Outcome::OutOfMemory).unwrap();
        let level = ((failed.peak_bytes.unwrap() - fixed) / per_sample) as usize;
        assert!(level < 2999 && !tried.contains(&level), "{level} {tried:?}");
        let after_failure = &tried[tried.iter().position(|&b| b == failed.batch).unwrap() + 1..];
        assert!(after_failure.len() <= 6, "{tried:?}");
        assert!(after_failure.iter().all(|&b| b > level && b <= level + failed.batch.div_ceil(256) + 1), "{tried:?}");
        assert!(
            history.len() < unread.len(),
            "{tried:?} against {:?}",
            unread.iter().map(|o| o.batch).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_reading_is_read_along_the_last_phase_when_the_fits_show_two() {
        // the update's line, then the backward pass's past batch 32; the device
        // ends at batch 60, and the failed step at 64 read what batch 60 holds
        let peak = |b: usize| (792.5e6 + 16.0e6 * b as f64).max(563.0e6 + 23.13e6 * b as f64) as u64;
        let limit = peak(200);
        let space = SearchSpace::new(1, None, 1).unwrap().with_limit(limit);
        let fit = |batch: usize| Observation { batch, outcome: Outcome::Fits, peak_bytes: Some(peak(batch)) };
        let mut history: Vec<Observation> = [1, 4, 16, 40, 48, 56].into_iter().map(fit).collect();
        history.push(Observation { batch: 64, outcome: Outcome::OutOfMemory, peak_bytes: Some(peak(60) + 1) });
        let window = Window::read(&space, &history, limit).expect("the last phase's three fits lie on a line");
        assert_eq!(window.fits_to, 60, "{window:?}");
        // the fits of the first phase are no scatter about the second's line
        assert_eq!(last_phase(&fitting_points(&history)).iter().map(|p| p.0).collect::<Vec<_>>(), [40, 48, 56]);
    }

    #[test]
    fn a_coarse_reading_settles_what_it_can_and_the_rest_is_bisected() {
        // the ceiling allows batch 4000, the device ends above batch 999, and a
        // failed step of two allocations reads half of it: what is under the
        // reading is settled, the rest bisected as told nothing, not galloped
        // through (Binary: 1 … 512, 1024, then nine halvings)
        let (fixed, per_sample) = (1u64 << 30, 1u64 << 20);
        let limit = fixed + 4000 * per_sample;
        let room = fixed + 1000 * per_sample - 1;
        let history = run_short_device(room, fixed, per_sample, 2, limit);
        let tried: Vec<usize> = history.iter().map(|o| o.batch).collect();
        assert_eq!(Observation::best(&history).map(|o| o.batch), Some(999), "{tried:?}");
        assert!(tried.len() <= 20, "{tried:?}");
        // a device that ends far below the ceiling and reads nothing of it
        // (a failed step's reading no higher than what was held): one forecast
        // past the end, then no other
        let history = run_short_device(room, fixed, per_sample, 1, limit);
        let tried: Vec<usize> = history.iter().map(|o| o.batch).collect();
        assert_eq!(Observation::best(&history).map(|o| o.batch), Some(999), "{tried:?}");
        assert!(tried.iter().filter(|&&b| b > 1200).count() <= 2, "{tried:?}");
        assert!(tried.len() <= 22, "{tried:?}");
    }

    #[test]
    fn a_convex_curve_on_a_device_that_ends_far_below_the_ceiling_is_bisected_after_one_failure() {
        // convex (each fit lowers the ceiling's forecast a little); the device
        // ends at batch 600 and a failed step reads only what was held before
        // it: one failure past the end, then doubling and bisection
        let (fixed, per_sample, square) = (1u64 << 30, 1u64 << 20, 64u64 << 10);
        let peak = |b: usize| fixed + per_sample * b as u64 + square * (b * b) as u64;
        let limit = peak(4000);
        let space = SearchSpace::new(1, None, 1).unwrap().with_limit(limit);
        let mut history = Vec::new();
        while let Some(batch) = Strategy::Predictive.next_batch(&space, &history) {
            let p = peak(batch);
            let (outcome, reading) = if batch > 600 { (Outcome::OutOfMemory, fixed) } else { (Outcome::Fits, p) };
            history.push(Observation { batch, outcome, peak_bytes: Some(reading) });
            assert!(history.len() < 100);
        }
        let tried: Vec<usize> = history.iter().map(|o| o.batch).collect();
        assert_eq!(Observation::best(&history).map(|o| o.batch), Some(600), "{tried:?}");
        assert!(tried.iter().filter(|&&b| b > 1200).count() <= 2, "{tried:?}");
        assert!(tried.len() <= 22, "{tried:?}");
    }

    #[test]
    fn a_reading_as_high_as_the_full_step_is_not_taken_for_room() {
        // a meter that reports the would-be peak of a failed step says nothing
        // about the device's end: the search bisects and stays exact
        let space = SearchSpace::new(1, None, 1).unwrap().with_limit(10_000_000);
        let peak = |b: usize| 1_000_000 + 1_000 * b as u64;
        let mut history = Vec::new();
        while let Some(batch) = Strategy::Predictive.next_batch(&space, &history) {
            let outcome = if batch > 6000 { Outcome::OutOfMemory } else { Outcome::Fits };
            history.push(Observation { batch, outcome, peak_bytes: Some(peak(batch)) });
            assert!(history.len() < 100);
        }
        assert_eq!(Observation::best(&history).map(|o| o.batch), Some(6000));
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

#[cfg(test)]
mod unread_tests {
    use super::super::Strategy;
    use super::*;

    fn fits(batch: usize) -> Observation {
        Observation { batch, outcome: Outcome::Fits, peak_bytes: None }
    }

    fn fails(batch: usize) -> Observation {
        Observation { batch, outcome: Outcome::OutOfMemory, peak_bytes: None }
    }

    #[test]
    fn doubling_that_would_land_past_the_middle_of_the_bracket_is_not_tried() {
        let space = SearchSpace::new(1, None, 1).unwrap().with_limit(1 << 40);
        // 2000 is past the middle of (1000, 2100): a trial there tells little
        let near = [fits(1000), fails(2100)];
        assert_ne!(Strategy::Predictive.next_batch(&space, &near), Some(2000));
        // far under the failure, the gallop doubles as Binary's does
        let far = [fits(1000), fails(9000)];
        assert_eq!(Strategy::Predictive.next_batch(&space, &far), Some(2000));
    }

    #[test]
    fn a_wide_bracket_is_split_under_its_middle_a_narrow_one_at_it() {
        let space = SearchSpace::new(1, None, 1).unwrap().with_limit(1 << 40);
        let wide = [fits(1000), fails(1800)];
        assert_eq!(Strategy::Predictive.next_batch(&space, &wide), Some(1000 + 800 * 9 / 20));
        let narrow = [fits(1000), fails(1040)];
        assert_eq!(Strategy::Predictive.next_batch(&space, &narrow), Some(1020));
    }
}
