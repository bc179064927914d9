//! The same model with and without remedies, tuned side by side.

use std::fmt;
use std::time::Duration;

use log::debug;

use super::Settings;
use super::search::{Alone, Search};
use crate::search::LinearFit;
use crate::units::format_bytes;
use crate::{Error, MemoryMeter, Plan, Workload};

/// Builds a variant's workload when its turn comes.
type Build<'a> = Box<dyn FnOnce() -> Result<Box<dyn Workload + 'a>, Error> + 'a>;

/// One way of running the model: a name and its workload, with what the
/// analytical estimate predicts for its bytes per sample, if anything.
pub struct ModelVariant<'a> {
    /// What was changed, e.g. `gradient checkpointing`.
    pub name: String,
    build: Build<'a>,
    /// The estimate's bytes per sample for it, to print beside the measurement.
    pub predicted_bytes_per_sample: Option<f64>,
    expected: Option<Expectation>,
}

/// What a variant is expected to need against one tuned before it (see
/// [`ModelVariant::expecting`]).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Expectation {
    like: usize,
    bytes_per_sample_share: f64,
    fixed_bytes_change: f64,
}

impl<'a> ModelVariant<'a> {
    /// A variant named `name` running `workload`, built already (it is then
    /// alive, and in the device's memory, while the other variants are tuned).
    pub fn new(name: impl Into<String>, workload: impl Workload + 'a) -> Self {
        ModelVariant::lazy(name, move || Ok::<_, Error>(workload))
    }

    /// A variant whose workload `build` makes when its turn comes, and which is
    /// dropped after: each variant is measured with only itself on the device.
    pub fn lazy<W: Workload + 'a, E: Into<Error>>(
        name: impl Into<String>,
        build: impl FnOnce() -> Result<W, E> + 'a,
    ) -> Self {
        let build: Build<'a> =
            Box::new(move || build().map(|w| Box::new(w) as Box<dyn Workload + 'a>).map_err(Into::into));
        ModelVariant { name: name.into(), build, predicted_bytes_per_sample: None, expected: None }
    }

    /// Adds the estimate's prediction of its bytes per sample.
    pub fn predicted(mut self, bytes_per_sample: f64) -> Self {
        self.predicted_bytes_per_sample = Some(bytes_per_sample);
        self
    }

    /// Starts its search where the variant at place `like` (an earlier one
    /// in the list given to [`Search::compare`], from 0) would reach the
    /// limit with its bytes per sample times `bytes_per_sample_share` (1 for
    /// a change that leaves the activations alone, 0.5 for halving them) and
    /// its fixed bytes plus `fixed_bytes_change` (what is held whatever the
    /// batch, negative for less: optimizer state, master weights). Give it where the
    /// change is known well (an optimizer's state, master weights): a good
    /// start is the answer and the batch above it, two steps; from a poor one
    /// the search moves along the slope it expects, then along what it
    /// measured (about as many steps as starting small), never to a different
    /// answer.
    pub fn expecting(mut self, like: usize, bytes_per_sample_share: f64, fixed_bytes_change: f64) -> Self {
        self.expected = Some(Expectation { like, bytes_per_sample_share, fixed_bytes_change });
        self
    }

    /// Checks the expectation of the variant at place `index`.
    fn check_expectation(&self, index: usize) -> Result<(), Error> {
        let Some(expected) = self.expected else { return Ok(()) };
        let invalid = |setting: crate::Setting, value: String, valid: String| {
            Error::invalid(setting, crate::Value::Text(value), format!("it must be {valid} (variant '{}')", self.name))
        };
        if expected.like >= index {
            let valid = match index {
                0 => "given to a later variant: the first has none before it".to_owned(),
                _ => format!("an earlier variant's place, 0 to {}", index - 1),
            };
            return Err(invalid(crate::Setting::Like, expected.like.to_string(), valid));
        }
        let share = expected.bytes_per_sample_share;
        if !(share.is_finite() && share > 0.0) {
            return Err(invalid(
                crate::Setting::BytesPerSampleShare,
                share.to_string(),
                "a finite number above 0".to_owned(),
            ));
        }
        let change = expected.fixed_bytes_change;
        if !change.is_finite() {
            return Err(invalid(
                crate::Setting::FixedBytesChange,
                change.to_string(),
                "a finite number of bytes".to_owned(),
            ));
        }
        Ok(())
    }
}

/// Where `expected` puts the largest batch, from the earlier variant's plan:
/// its peak at its largest batch, its activations (the peak above the fixed
/// bytes) scaled and its fixed bytes moved as expected, extended along the
/// slope it was measured to have there (to the nearest batch measured in
/// full), solved for its limit.
fn expected_batch(earlier: &ComparisonRow, expected: &Expectation) -> Option<(usize, f64)> {
    let plan = earlier.plan.as_ref()?;
    let fixed = plan.memory_model.as_ref()?.fixed_bytes;
    let (b0, p0) = (plan.largest_batch as f64, plan.peak_bytes as f64);
    let nearest = plan
        .trials
        .iter()
        .filter(|t| t.batch != plan.largest_batch && t.outcome != crate::search::Outcome::OutOfMemory)
        .filter_map(|t| Some((t.batch as f64, t.peak_bytes? as f64)))
        .min_by(|a, b| (a.0 - b0).abs().total_cmp(&(b.0 - b0).abs()))?;
    let slope = (nearest.1 - p0) / (nearest.0 - b0);
    if !(slope.is_finite() && slope > 0.0) {
        return None;
    }
    // fixed + Δ + share·(p0 − fixed + slope·(b − b0)) = limit
    let share = expected.bytes_per_sample_share;
    let room = (plan.limit_bytes() as f64 - fixed - expected.fixed_bytes_change) / share - (p0 - fixed);
    let batch = b0 + room / slope;
    (batch.is_finite() && batch >= 1.0).then_some((batch as usize, slope * share))
}

/// What tuning one variant found.
#[derive(Clone, Debug)]
pub struct ComparisonRow {
    /// The variant's name.
    pub name: String,
    /// Its plan, or `None` when not even the smallest batch fit.
    pub plan: Option<Plan>,
    /// The estimate's bytes per sample, when the variant came with one.
    pub predicted_bytes_per_sample: Option<f64>,
    /// Where its search started, when an expectation said (else it
    /// started small, as a search does).
    pub started_at: Option<usize>,
    /// For a search that started where its expectation said (its few
    /// trials near the answer make a poor line of their own): the earlier
    /// variant's bytes per sample, changed as expected, through the peak
    /// measured at the largest batch (read through [`memory`](ComparisonRow::memory)).
    carried_line: Option<LinearFit>,
}

impl ComparisonRow {
    /// The largest batch, 0 when nothing fit.
    pub fn largest_batch(&self) -> usize {
        self.plan.as_ref().map_or(0, |plan| plan.largest_batch)
    }

    /// Bytes per sample and fixed bytes: for a search that started where its
    /// expectation said (its few trials near the answer make a poor line of
    /// their own), the earlier variant's bytes per sample, changed as
    /// expected, through the peak measured at the largest batch; else the
    /// plan's memory model.
    pub fn memory(&self) -> Option<(f64, f64)> {
        let plan = self.plan.as_ref()?;
        let line = self.carried_line.or_else(|| plan.memory_model.as_ref().map(|model| model.line()))?;
        Some((line.bytes_per_sample, line.fixed_bytes))
    }

    /// Wall time of one step at the largest batch (the fitting trial there).
    pub fn step_time(&self) -> Option<Duration> {
        let plan = self.plan.as_ref()?;
        let steps = plan.trials.iter().rev().find(|t| t.batch == plan.largest_batch && t.outcome.fits())?;
        Some(steps.duration)
    }

    /// Samples per second at the largest batch.
    pub fn samples_per_second(&self) -> Option<f64> {
        let time = self.step_time()?.as_secs_f64();
        (time > 0.0).then(|| self.largest_batch() as f64 / time)
    }
}

/// Variants tuned side by side: [`Search::compare`].
#[derive(Clone, Debug)]
pub struct Comparison {
    /// One row per variant, in the order given.
    pub rows: Vec<ComparisonRow>,
}

impl<'v, M: MemoryMeter + ?Sized> Search<'_, Vec<ModelVariant<'v>>, M, Alone> {
    /// Tunes each variant with the tuner's settings on the same device and
    /// returns what each found: the measured effect of each remedy on the
    /// model itself. A variant where nothing fits is a row without a plan; any
    /// other error stops the comparison. The variants are taken from the
    /// vector, each built, tuned and dropped in its turn.
    ///
    /// ```
    /// use autobatch::memory::simulated::{MemoryCurve, Simulation};
    /// use autobatch::ModelVariant;
    /// use autobatch::Tuner;
    ///
    /// let (plain, mut meter) = Simulation::new(16 << 30, MemoryCurve::affine(2 << 30, 100 << 20)).build();
    /// let leaner = Simulation::new(16 << 30, MemoryCurve::affine(2 << 30, 40 << 20)).build_on(&meter);
    /// let mut variants =
    ///     vec![ModelVariant::new("as it is", plain), ModelVariant::new("checkpointing", leaner).predicted(40.0 * 1048576.0)];
    /// let comparison = Tuner::new().search(&mut variants, &mut meter).compare()?;
    /// assert!(comparison.rows[1].largest_batch() > 2 * comparison.rows[0].largest_batch());
    /// println!("{comparison}");
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn compare(self) -> Result<Comparison, Error> {
        let (tuner, variants, meter) = self.parts();
        tuner.settings()?.compare(std::mem::take(variants), meter, &mut tuner.observing())
    }
}

impl Settings {
    /// [`Search::compare`] with these settings.
    pub(super) fn compare<M, O>(
        &self,
        variants: Vec<ModelVariant<'_>>,
        meter: &mut M,
        observer: &mut O,
    ) -> Result<Comparison, Error>
    where
        M: MemoryMeter + ?Sized,
        O: super::Observer + ?Sized,
    {
        for (index, variant) in variants.iter().enumerate() {
            variant.check_expectation(index)?;
        }
        let mut rows: Vec<ComparisonRow> = Vec::with_capacity(variants.len());
        for variant in variants {
            observer.variant_started(&variant.name);
            let expected = variant.expected.and_then(|expected| expected_batch(&rows[expected.like], &expected));
            let hinted;
            let settings = match expected {
                Some((batch, bytes_per_sample)) => {
                    debug!("{}: starting at batch {batch}, where the expectation puts it", variant.name);
                    hinted = self.hinted_along(batch, bytes_per_sample);
                    &hinted
                }
                None => self,
            };
            let started_at = expected.map(|(batch, _)| batch);
            let mut workload = (variant.build)()?;
            let plan = match settings.search(&mut *workload, meter, observer) {
                Ok(plan) => Some(plan),
                Err(Error::NothingFits { .. }) => None,
                Err(err) => return Err(err),
            };
            drop(workload);
            observer.variant_finished(&variant.name, plan.as_ref().map(|plan| plan.largest_batch));
            let carried_line = match (&plan, variant.expected) {
                (Some(plan), Some(expected)) if started_at.is_some() => {
                    rows[expected.like].memory().map(|(per_sample, _)| {
                        let bytes_per_sample = per_sample * expected.bytes_per_sample_share;
                        let fixed_bytes = plan.peak_bytes as f64 - bytes_per_sample * plan.largest_batch as f64;
                        LinearFit { fixed_bytes, bytes_per_sample }
                    })
                }
                _ => None,
            };
            rows.push(ComparisonRow {
                name: variant.name,
                plan,
                predicted_bytes_per_sample: variant.predicted_bytes_per_sample,
                started_at,
                carried_line,
            });
        }
        Ok(Comparison { rows })
    }
}

impl fmt::Display for Comparison {
    /// ```text
    /// variant                  largest   per sample  (estimate)        fixed   step time   samples/s
    /// as it is                      19     935 KiB                  3.54 MiB     36.0 ms         528
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self.rows.iter().map(|r| r.name.chars().count()).max().unwrap_or(0).max(7);
        writeln!(
            f,
            "{:<width$}  {:>7}  {:>10}  {:>10}  {:>9}  {:>10}  {:>9}",
            "variant", "largest", "per sample", "(estimate)", "fixed", "step time", "samples/s"
        )?;
        let bytes = |b: f64| format_bytes(b.max(0.0) as u64);
        for row in &self.rows {
            let (per_sample, fixed) =
                row.memory().map_or(("-".to_owned(), "-".to_owned()), |(p, x)| (bytes(p), bytes(x)));
            let predicted = row.predicted_bytes_per_sample.map_or(String::new(), |p| format!("({})", bytes(p)));
            let time = row.step_time().map_or("-".to_owned(), |t| format!("{:.1} ms", t.as_secs_f64() * 1e3));
            let rate = row.samples_per_second().map_or("-".to_owned(), crate::units::format_rate);
            let largest = if row.plan.is_some() { row.largest_batch().to_string() } else { "none".to_owned() };
            writeln!(
                f,
                "{:<width$}  {largest:>7}  {per_sample:>10}  {predicted:>10}  {fixed:>9}  {time:>10}  {rate:>9}",
                row.name
            )?;
        }
        Ok(())
    }
}
