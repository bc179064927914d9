//! Search strategies, kept pure: a history of observations in, the next batch out.
//!
//! Nothing here touches a device or a clock, so every invariant can be checked
//! exhaustively with simulated curves, and baseline algorithms can run side by
//! side on the same workloads. What a user chooses is the [`Strategy`]; the
//! step-by-step interface ([`Strategy::next_batch`] over a history of [`Observation`]s,
//! [`Observation::best`] of it) drives a search with trials run your own way: the crate's
//! property tests and benchmarks run the strategies through it, beside other
//! tools' algorithms.

pub(crate) mod fit;
pub(crate) mod outcome;
mod predictive;
pub(crate) mod strategy;

use crate::Error;

pub(crate) use fit::least_squares;
pub(crate) use fit::{LinearFit, phases};
pub use outcome::Observation;
pub use outcome::Outcome;
pub use strategy::Strategy;

/// The batches a search may try: multiples of `multiple_of` from `start`
/// (rounded up) to `max_batch` (rounded down).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchSpace {
    first: usize,
    last: usize,
    multiple_of: usize,
    limit_bytes: Option<u64>,
    hint: Option<usize>,
    hint_slope: Option<u64>,
    held_bytes: Option<u64>,
    largest_allocation: Option<AllocationBound>,
}

/// The most bytes one allocation of a step may take at a batch: `fixed +
/// per_sample × batch`, in whole bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AllocationBound {
    fixed: u64,
    per_sample: u64,
}

impl AllocationBound {
    /// The bound at `batch`.
    pub(crate) fn at(&self, batch: usize) -> u64 {
        self.fixed.saturating_add(self.per_sample.saturating_mul(batch as u64))
    }
}

impl SearchSpace {
    /// Checks the bounds and builds the space.
    ///
    /// ```
    /// use autobatch::search::SearchSpace;
    ///
    /// let space = SearchSpace::new(3, Some(100), 8)?;
    /// assert_eq!((space.first(), space.last()), (8, 96));
    /// assert!(SearchSpace::new(3, Some(7), 8).is_err());
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn new(start: usize, max_batch: Option<usize>, multiple_of: usize) -> Result<Self, Error> {
        if start == 0 {
            return Err(Error::zero(crate::Setting::Start));
        }
        if multiple_of == 0 {
            return Err(Error::zero(crate::Setting::MultipleOf));
        }
        if let Some(max_batch) = max_batch
            && max_batch < start
        {
            return Err(Error::invalid(
                crate::Setting::MaxBatch,
                crate::Value::Count(max_batch),
                crate::Valid::AtLeast { setting: crate::Setting::Start, value: start },
            ));
        }
        let ceiling = max_batch.unwrap_or(usize::MAX);
        let first = start
            .checked_next_multiple_of(multiple_of)
            .ok_or_else(|| Error::batch_overflow(start, &[crate::Setting::Start, crate::Setting::MultipleOf]))?;
        let last = ceiling - ceiling % multiple_of;
        if first > last {
            return Err(Error::NoCandidate { start, max_batch: ceiling, multiple_of });
        }
        Ok(SearchSpace {
            first,
            last,
            multiple_of,
            limit_bytes: None,
            hint: None,
            hint_slope: None,
            held_bytes: None,
            largest_allocation: None,
        })
    }

    /// The most a fitting step may use (`ceiling × capacity`): what
    /// [`Strategy::Predictive`] solves its memory model for. Without it,
    /// `Predictive` searches like `Binary`.
    pub fn with_limit(mut self, limit_bytes: u64) -> Self {
        self.limit_bytes = Some(limit_bytes);
        self
    }

    /// Where the largest batch is expected (a measured neighbour's answer
    /// moved by a known change of memory): [`Strategy::Predictive`] tries it
    /// first (rounded into the space), then steps away from it, a granule and
    /// then doubling, until the other side is seen, and closes the bracket
    /// as usual. The answer is the same as without the hint; a good hint
    /// takes two trials.
    pub fn with_hint(mut self, batch: usize) -> Self {
        let rounded = batch - batch % self.multiple_of;
        self.hint = Some(rounded.clamp(self.first, self.last));
        self
    }

    /// The bytes each sample is expected to add near the hint (see
    /// [`with_hint`](SearchSpace::with_hint)): from the hint, the next trial
    /// is where the hint's measured peak, moved along this slope, meets the
    /// limit, rather than a granule away; a slope that is off costs steps,
    /// never the answer.
    pub fn with_hint_slope(mut self, bytes_per_sample: f64) -> Self {
        // whole bytes: a space compares equal to itself, and a byte is the
        // finest a meter reads
        self.hint_slope =
            Some(bytes_per_sample.round()).filter(|slope| slope.is_finite() && *slope >= 1.0).map(|slope| slope as u64);
        self
    }

    /// What the device held before the steps (weights, optimizer state, other
    /// processes: the least a trial's baseline read): memory that does not
    /// grow with the batch, so that [`Strategy::Predictive`]'s small trials
    /// may grow faster when the step's own bytes are a small part of its peak
    /// (each trial still needs at most twice the limit, the step's own bytes
    /// growing at most in proportion to the batch).
    pub fn with_held_bytes(mut self, bytes: u64) -> Self {
        self.held_bytes = Some(bytes);
        self
    }

    /// The most bytes one allocation of a step may take at batch `b`, at most
    /// `fixed + per_sample × b` (a step's largest tensor, as its graph shows):
    /// what bounds the device's end above an out-of-memory reading. A step
    /// that fails with out-of-memory has been handed what the reading says,
    /// and the allocation that failed was at most this: the device's end lies
    /// between the two, and [`Strategy::Predictive`] leaves out the trials
    /// outside. Without it, a reading still says the batches under it fit.
    ///
    /// ```
    /// use autobatch::search::SearchSpace;
    ///
    /// // logits of 2 MiB per sample are the step's largest tensor
    /// let space = SearchSpace::new(1, None, 1)?.with_largest_allocation(0, 2 << 20);
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn with_largest_allocation(mut self, fixed: u64, per_sample: u64) -> Self {
        self.largest_allocation = Some(AllocationBound { fixed, per_sample });
        self
    }

    /// The space with no candidate above `max_batch` (rounded down to the
    /// granularity), but never below its first candidate.
    pub fn capped(mut self, max_batch: usize) -> Self {
        self.last = self.last.min(self.floor(max_batch).max(self.first));
        self.hint = self.hint.map(|hint| hint.min(self.last));
        self
    }

    /// The limit given to [`with_limit`](SearchSpace::with_limit), if any.
    pub fn limit_bytes(&self) -> Option<u64> {
        self.limit_bytes
    }

    /// `batch` rounded down to the granularity.
    fn floor(&self, batch: usize) -> usize {
        batch - batch % self.multiple_of
    }

    /// The smallest candidate: `start` rounded up to the granularity.
    pub fn first(&self) -> usize {
        self.first
    }

    /// The largest candidate: `max_batch` (or `usize::MAX`) rounded down to the granularity.
    pub fn last(&self) -> usize {
        self.last
    }

    /// The granularity.
    pub fn multiple_of(&self) -> usize {
        self.multiple_of
    }

    /// Whether `batch` is a candidate of this space.
    pub fn contains(&self, batch: usize) -> bool {
        batch.is_multiple_of(self.multiple_of) && (self.first..=self.last).contains(&batch)
    }
}

impl Strategy {
    /// The next batch to try after `history`, or `None` when the search is
    /// over (its answer is then [`Observation::best`] of the history).
    ///
    /// Never proposes a batch already in `history` nor one outside `space`.
    ///
    /// ```
    /// use autobatch::search::{Observation, SearchSpace};
    /// use autobatch::{search::Outcome, search::Strategy};
    ///
    /// let space = SearchSpace::new(1, None, 1)?;
    /// let fits = |b: usize| if b <= 5 { Outcome::Fits } else { Outcome::OverCeiling };
    /// let mut history = Vec::new();
    /// while let Some(batch) = Strategy::Binary.next_batch(&space, &history) {
    ///     history.push(Observation { batch, outcome: fits(batch), peak_bytes: None });
    /// }
    /// let tried: Vec<usize> = history.iter().map(|o| o.batch).collect();
    /// assert_eq!(tried, [1, 2, 4, 8, 6, 5]);
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn next_batch(self, space: &SearchSpace, history: &[Observation]) -> Option<usize> {
        let bracket = Bracket::of(space, history);
        match self {
            Strategy::Binary => match bracket.failing {
                None => bracket.double(space, true),
                Some(failing) => bisect(space, bracket.floor, failing),
            },
            Strategy::Power => match bracket.failing {
                None => bracket.double(space, false),
                Some(_) => None,
            },
            Strategy::Predictive => predictive::next(space, &bracket, history),
        }
    }
}

/// What the history says about where the boundary lies.
pub(crate) struct Bracket {
    /// Largest fitting batch, if any.
    pub(crate) fitting: Option<usize>,
    /// Largest fitting batch, or the candidate below the first when none fits yet
    /// (a virtual floor that makes "nothing fits" fall out of the bisection).
    pub(crate) floor: usize,
    /// Smallest failing batch above `floor`.
    pub(crate) failing: Option<usize>,
}

impl Bracket {
    pub(crate) fn of(space: &SearchSpace, history: &[Observation]) -> Bracket {
        let fitting = Observation::best(history).map(|o| o.batch);
        let floor = fitting.unwrap_or(space.first - space.multiple_of);
        let failing = history.iter().filter(|o| !o.outcome.fits() && o.batch > floor).map(|o| o.batch).min();
        Bracket { fitting, floor, failing }
    }

    /// The doubling phase: the first candidate, then twice the largest fit; past
    /// the last candidate, `last` itself once if `try_last`.
    pub(crate) fn double(&self, space: &SearchSpace, try_last: bool) -> Option<usize> {
        let Some(fitting) = self.fitting else {
            return Some(space.first);
        };
        match fitting.checked_mul(2) {
            Some(next) if next <= space.last => Some(next),
            _ if try_last && fitting < space.last => Some(space.last),
            _ => None,
        }
    }
}

/// Halves the open bracket (floor, failing) at the granularity.
pub(crate) fn bisect(space: &SearchSpace, floor: usize, failing: usize) -> Option<usize> {
    let gaps = (failing - floor) / space.multiple_of;
    if gaps <= 1 { None } else { Some(floor + space.multiple_of * (gaps / 2)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(strategy: Strategy, space: SearchSpace, largest_fit: usize) -> Vec<usize> {
        let mut history = Vec::new();
        while let Some(batch) = strategy.next_batch(&space, &history) {
            let outcome = if batch <= largest_fit { Outcome::Fits } else { Outcome::OutOfMemory };
            history.push(Observation { batch, outcome, peak_bytes: None });
        }
        history.iter().map(|o| o.batch).collect()
    }

    #[test]
    fn binary_doubles_then_bisects() {
        let space = SearchSpace::new(1, None, 1).unwrap();
        assert_eq!(
            run(Strategy::Binary, space, 133),
            [1, 2, 4, 8, 16, 32, 64, 128, 256, 192, 160, 144, 136, 132, 134, 133]
        );
    }

    #[test]
    fn binary_tries_max_batch_once_when_doubling_would_pass_it() {
        let space = SearchSpace::new(1, Some(100), 1).unwrap();
        assert_eq!(run(Strategy::Binary, space, 1000), [1, 2, 4, 8, 16, 32, 64, 100]);
        assert_eq!(run(Strategy::Binary, space, 70), [1, 2, 4, 8, 16, 32, 64, 100, 82, 73, 68, 70, 71]);
        let space = SearchSpace::new(5, Some(100), 8).unwrap();
        assert_eq!(run(Strategy::Binary, space, 1000), [8, 16, 32, 64, 96]);
    }

    #[test]
    fn binary_stops_when_the_first_candidate_fails() {
        let space = SearchSpace::new(4, None, 4).unwrap();
        assert_eq!(run(Strategy::Binary, space, 3), [4]);
    }

    #[test]
    fn power_stops_at_the_first_failure_and_never_tries_max_batch() {
        let space = SearchSpace::new(1, None, 8).unwrap();
        assert_eq!(run(Strategy::Power, space, 100), [8, 16, 32, 64, 128]);
        let space = SearchSpace::new(1, Some(100), 8).unwrap();
        assert_eq!(run(Strategy::Power, space, 1000), [8, 16, 32, 64]);
    }

    #[test]
    fn a_fit_above_a_failure_moves_the_bracket_up() {
        // a non-monotone blip at 8: the history is all the search relies on.
        let space = SearchSpace::new(1, None, 1).unwrap();
        let history = [
            Observation { batch: 4, outcome: Outcome::Fits, peak_bytes: None },
            Observation { batch: 8, outcome: Outcome::OverCeiling, peak_bytes: None },
            Observation { batch: 16, outcome: Outcome::Fits, peak_bytes: None },
        ];
        assert_eq!(Strategy::Binary.next_batch(&space, &history), Some(32));
    }

    #[test]
    fn space_rounds_bounds_to_the_granularity() {
        let space = SearchSpace::new(9, Some(31), 8).unwrap();
        assert_eq!((space.first(), space.last()), (16, 24));
        assert!(space.contains(24) && !space.contains(20) && !space.contains(8) && !space.contains(32));
        assert!(matches!(
            SearchSpace::new(0, None, 1),
            Err(Error::InvalidSetting { setting: crate::Setting::Start, value: crate::Value::Count(0), .. })
        ));
        assert!(matches!(
            SearchSpace::new(1, None, 0),
            Err(Error::InvalidSetting { setting: crate::Setting::MultipleOf, value: crate::Value::Count(0), .. })
        ));
        assert!(matches!(
            SearchSpace::new(8, Some(4), 1),
            Err(Error::InvalidSetting { setting: crate::Setting::MaxBatch, value: crate::Value::Count(4), .. })
        ));
        assert!(matches!(SearchSpace::new(usize::MAX, None, 2), Err(Error::BatchOverflow { .. })));
    }
}
