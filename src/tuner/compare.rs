//! The same model with and without remedies, tuned side by side.

use std::fmt;
use std::time::Duration;

use super::Tuner;
use crate::units::format_bytes;
use crate::{Error, MemoryMeter, Plan, Workload};

/// Builds a variant's workload when its turn comes.
type Build<'a> = Box<dyn FnOnce() -> Result<Box<dyn Workload + 'a>, Error> + 'a>;

/// One way of running the model: a name and its workload, with what the
/// analytical estimate predicts for its bytes per sample, if anything.
pub struct Variant<'a> {
    /// What was changed, e.g. `gradient checkpointing`.
    pub name: String,
    build: Build<'a>,
    /// The estimate's bytes per sample for it, to print beside the measurement.
    pub predicted_bytes_per_sample: Option<f64>,
}

impl<'a> Variant<'a> {
    /// A variant named `name` running `workload`, built already (it is then
    /// alive, and in the device's memory, while the other variants are tuned).
    pub fn new(name: impl Into<String>, workload: impl Workload + 'a) -> Self {
        Variant::lazy(name, move || Ok(workload))
    }

    /// A variant whose workload `build` makes when its turn comes, and which is
    /// dropped after: each variant is measured with only itself on the device.
    pub fn lazy<W: Workload + 'a>(name: impl Into<String>, build: impl FnOnce() -> Result<W, Error> + 'a) -> Self {
        let build: Build<'a> = Box::new(move || build().map(|w| Box::new(w) as Box<dyn Workload + 'a>));
        Variant { name: name.into(), build, predicted_bytes_per_sample: None }
    }

    /// Adds the estimate's prediction of its bytes per sample.
    pub fn predicted(mut self, bytes_per_sample: f64) -> Self {
        self.predicted_bytes_per_sample = Some(bytes_per_sample);
        self
    }
}

/// What tuning one variant found.
#[derive(Clone, Debug)]
pub struct Compared {
    /// The variant's name.
    pub name: String,
    /// Its plan, or `None` when not even the smallest batch fit.
    pub plan: Option<Plan>,
    /// The estimate's bytes per sample, when the variant came with one.
    pub predicted_bytes_per_sample: Option<f64>,
}

impl Compared {
    /// The largest batch, 0 when nothing fit.
    pub fn largest_batch(&self) -> usize {
        self.plan.as_ref().map_or(0, |plan| plan.largest_batch)
    }

    /// Measured bytes per sample and fixed bytes (the plan's memory model).
    pub fn memory(&self) -> Option<(f64, f64)> {
        let model = self.plan.as_ref()?.memory_model.as_ref()?;
        Some((model.line.bytes_per_sample, model.line.fixed_bytes))
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

/// Variants tuned side by side: [`Tuner::compare`].
#[derive(Clone, Debug)]
pub struct Comparison {
    /// One row per variant, in the order given.
    pub rows: Vec<Compared>,
}

impl Tuner {
    /// Tunes each variant with this tuner's settings on the same device and
    /// returns what each found: the measured effect of each remedy on the
    /// model itself. A variant where nothing fits is a row without a plan; any
    /// other error stops the comparison.
    ///
    /// ```
    /// use autobatch::memory::simulated::{MemoryCurve, Simulation};
    /// use autobatch::Variant;
    /// use autobatch::Tuner;
    ///
    /// let (plain, mut meter) = Simulation::new(16 << 30, MemoryCurve::affine(2 << 30, 100 << 20)).build();
    /// let (leaner, _) = Simulation::new(16 << 30, MemoryCurve::affine(2 << 30, 40 << 20)).build();
    /// let comparison = Tuner::new().compare(
    ///     vec![Variant::new("as it is", plain), Variant::new("checkpointing", leaner).predicted(40.0 * 1048576.0)],
    ///     &mut meter,
    /// )?;
    /// assert!(comparison.rows[1].largest_batch() > 2 * comparison.rows[0].largest_batch());
    /// println!("{comparison}");
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn compare<M: MemoryMeter + ?Sized>(
        &self,
        variants: Vec<Variant<'_>>,
        meter: &mut M,
    ) -> Result<Comparison, Error> {
        self.compare_observed(variants, meter, &mut ())
    }

    /// [`compare`](Tuner::compare), telling `observer` as each variant starts
    /// and ends, and about each of its trials.
    pub fn compare_observed<M, O>(
        &self,
        variants: Vec<Variant<'_>>,
        meter: &mut M,
        observer: &mut O,
    ) -> Result<Comparison, Error>
    where
        M: MemoryMeter + ?Sized,
        O: super::Observer + ?Sized,
    {
        let mut rows = Vec::with_capacity(variants.len());
        for variant in variants {
            observer.variant_started(&variant.name);
            let mut workload = (variant.build)()?;
            let plan = match self.run_observed(&mut *workload, meter, observer) {
                Ok(plan) => Some(plan),
                Err(Error::NothingFits { .. }) => None,
                Err(err) => return Err(err),
            };
            drop(workload);
            observer.variant_finished(&variant.name, plan.as_ref().map(|plan| plan.largest_batch));
            rows.push(Compared {
                name: variant.name,
                plan,
                predicted_bytes_per_sample: variant.predicted_bytes_per_sample,
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
            let rate = row.samples_per_second().map_or("-".to_owned(), |r| format!("{r:.0}"));
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
