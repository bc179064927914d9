//! What a tuner is set to: the builder's values as given ([`Options`]) and,
//! checked once, what the engine runs with ([`Settings`]). A search a run
//! makes inside itself is these settings with what that search changes said
//! by name (`single_rank`, `across`, `keyed`, `starting_at`, `hinted`,
//! `up_to`, `over_sizes`), never the public `run` again.

use std::path::PathBuf;
use std::time::Duration;

use crate::estimate::TrainingSetup;
use crate::plan::Objective;
use crate::search::SearchSpace;
use crate::{CacheKey, Error, plan::Ceiling, plan::SizeRange, search::Strategy};

/// The builder's values besides the ceiling, as given: nothing here is
/// checked until [`Settings::new`].
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Options {
    pub(super) start: usize,
    pub(super) max_batch: Option<usize>,
    pub(super) multiple_of: usize,
    pub(super) max_trials: Option<usize>,
    pub(super) steps_per_trial: usize,
    pub(super) strategy: Strategy,
    pub(super) target_effective_batch: Option<usize>,
    pub(super) world_size: usize,
    pub(super) exact_effective_batch: bool,
    pub(super) equal_micro_batches: bool,
    pub(super) warmup: bool,
    pub(super) profile: Option<TrainingSetup>,
    pub(super) cache_path: Option<PathBuf>,
    pub(super) cache_key: Option<CacheKey>,
    pub(super) objective: Objective,
    pub(super) timing_repeats: usize,
    pub(super) uneven_ranks: bool,
    pub(super) allow_partial_graph: bool,
    pub(super) time_limit: Option<Duration>,
    /// The most elements one tensor may have; `None`: the meter's.
    pub(super) element_limit: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            start: 1,
            max_batch: None,
            multiple_of: 1,
            max_trials: None,
            steps_per_trial: 1,
            strategy: Strategy::Predictive,
            target_effective_batch: None,
            world_size: 1,
            exact_effective_batch: false,
            equal_micro_batches: false,
            warmup: true,
            profile: None,
            cache_path: None,
            cache_key: None,
            objective: Objective::LargestBatch,
            timing_repeats: 3,
            uneven_ranks: false,
            allow_partial_graph: false,
            time_limit: None,
            element_limit: None,
        }
    }
}

/// A tuner's settings, checked: the ceiling a [`Ceiling`], every count above
/// zero, a target reachable by the ranks. The engine takes these; the byte
/// limit is the ceiling's of the device, computed where the engine starts.
#[derive(Clone, Debug)]
pub(super) struct Settings {
    pub(super) ceiling: Ceiling,
    pub(super) options: Options,
    /// Where a sub-search expects its answer (see [`SearchSpace::with_hint`]).
    pub(super) hint: Option<usize>,
    /// Bytes per sample expected near the hint (see [`SearchSpace::with_hint_slope`]).
    pub(super) hint_slope: Option<f64>,
}

impl Settings {
    /// `ceiling` and `options` checked, or the first setting that is invalid.
    pub(super) fn new(ceiling: f64, options: &Options) -> Result<Settings, Error> {
        let settings =
            Settings { ceiling: Ceiling::new(ceiling)?, options: options.clone(), hint: None, hint_slope: None };
        let o = &settings.options;
        for (setting, value) in [
            (crate::Setting::StepsPerTrial, Some(o.steps_per_trial)),
            (crate::Setting::WorldSize, Some(o.world_size)),
            (crate::Setting::MaxTrials, o.max_trials),
            (crate::Setting::TimingRepeats, Some(o.timing_repeats)),
            (crate::Setting::TargetEffectiveBatch, o.target_effective_batch),
        ] {
            if value == Some(0) {
                return Err(Error::zero(setting));
            }
        }
        settings.space()?;
        if let Some(target) = o.target_effective_batch {
            let smallest = o.world_size.checked_mul(o.multiple_of).ok_or_else(|| {
                Error::batch_overflow(o.world_size, &[crate::Setting::WorldSize, crate::Setting::MultipleOf])
            })?;
            if target < smallest {
                return Err(Error::target_below_ranks(
                    (crate::Setting::TargetEffectiveBatch, crate::Setting::WorldSize),
                    target,
                    o.world_size,
                    o.multiple_of,
                ));
            }
        }
        Ok(settings)
    }

    /// The batches to search, with the hint if any: checked again for a
    /// sub-search, whose range is its own.
    pub(super) fn space(&self) -> Result<SearchSpace, Error> {
        let o = &self.options;
        let mut space = SearchSpace::new(o.start, o.max_batch, o.multiple_of)?;
        if let Some(hint) = self.hint {
            space = space.with_hint(hint);
        }
        if let Some(slope) = self.hint_slope {
            space = space.with_hint_slope(slope);
        }
        Ok(space)
    }

    /// These settings with `change` made: every sub-search's starting point.
    fn varied(&self, change: impl FnOnce(&mut Settings)) -> Settings {
        let mut varied = Settings::clone(self);
        change(&mut varied);
        varied
    }

    /// On one rank, for no target: each rank's own search before the ranks agree.
    pub(super) fn single_rank(&self) -> Settings {
        self.varied(|s| {
            let o = &mut s.options;
            (o.world_size, o.target_effective_batch, o.exact_effective_batch) = (1, None, false);
        })
    }

    /// Across `world_size` ranks: the split of a batch the ranks agreed on.
    pub(super) fn across(&self, world_size: usize) -> Settings {
        self.varied(|s| s.options.world_size = world_size)
    }

    /// Cached under `key`, or not cached without one.
    pub(super) fn keyed(&self, key: Option<CacheKey>) -> Settings {
        self.varied(|s| {
            s.options.cache_path = s.options.cache_path.take().filter(|_| key.is_some());
            s.options.cache_key = key;
        })
    }

    /// From `start` instead.
    pub(super) fn starting_at(&self, start: usize) -> Settings {
        self.varied(|s| s.options.start = start)
    }

    /// Expecting its answer near `hint` (see [`SearchSpace::with_hint`]).
    pub(super) fn hinted(&self, hint: usize) -> Settings {
        self.varied(|s| s.hint = Some(hint))
    }

    /// Expecting its answer near `hint`, each sample there adding about
    /// `bytes_per_sample` (see [`SearchSpace::with_hint_slope`]).
    pub(super) fn hinted_along(&self, hint: usize, bytes_per_sample: f64) -> Settings {
        self.varied(|s| (s.hint, s.hint_slope) = (Some(hint), Some(bytes_per_sample)))
    }

    /// Starting from `batch`, where an earlier search cut short ended, along
    /// its slope when it measured one.
    pub(super) fn resumed_from(&self, batch: usize, bytes_per_sample: Option<f64>) -> Settings {
        self.varied(|s| (s.hint, s.hint_slope) = (Some(batch), bytes_per_sample))
    }

    /// Below `max_batch`.
    pub(super) fn up_to(&self, max_batch: usize) -> Settings {
        self.varied(|s| s.options.max_batch = Some(max_batch))
    }

    /// Over the sizes of `range` at a fixed batch: the size is the searched
    /// number, with no profile or model key of the batch search's.
    pub(super) fn over_sizes(&self, range: &SizeRange) -> Settings {
        self.varied(|s| {
            let o = &mut s.options;
            (o.start, o.max_batch, o.multiple_of) = (range.smallest, Some(range.largest), range.multiple_of);
            (o.profile, o.cache_key) = (None, None);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sub_search_changes_only_what_it_names() {
        let settings =
            Settings::new(0.8, &Options { world_size: 4, target_effective_batch: Some(64), ..Options::default() })
                .unwrap();
        let single = settings.single_rank();
        assert_eq!((single.options.world_size, single.options.target_effective_batch), (1, None));
        assert_eq!(single.ceiling, settings.ceiling);
        let below = settings.up_to(32).starting_at(8);
        assert_eq!((below.options.start, below.options.max_batch), (8, Some(32)));
        assert_eq!(below.options.world_size, 4);
        assert_eq!(
            settings.hinted_along(9, 2.0).space().unwrap(),
            SearchSpace::new(1, None, 1).unwrap().with_hint(9).with_hint_slope(2.0)
        );
    }

    #[test]
    fn checking_refuses_the_first_invalid_setting() {
        assert!(matches!(
            Settings::new(1.5, &Options::default()),
            Err(Error::InvalidSetting { setting: crate::Setting::Ceiling, .. })
        ));
        let zero_steps = Options { steps_per_trial: 0, ..Options::default() };
        assert!(matches!(
            Settings::new(0.9, &zero_steps),
            Err(Error::InvalidSetting { setting: crate::Setting::StepsPerTrial, value: crate::Value::Count(0), .. })
        ));
        let unreachable = Options { world_size: 4, target_effective_batch: Some(2), ..Options::default() };
        let below = Settings::new(0.9, &unreachable).unwrap_err().to_string();
        assert!(below.contains("= 4: every rank needs at least one micro-batch"), "{below}");
    }
}
