//! Memory-headroom regression checks: does this model still run at this batch
//! with memory to spare?

pub(crate) mod report;

use crate::memory::measure::measure;
use crate::{Error, MemoryMeter, Workload, is_oom};

pub use report::HeadroomReport;

/// Runs a workload at a given batch and checks the device keeps at least a
/// minimum share of its memory free at the step's peak.
///
/// For CI: a change that grows activations or state fails a test instead of a
/// training run. Save the [`HeadroomReport`] as JSON for the build's artifacts.
///
/// ```
/// use autobatch::memory::simulated::{MemoryCurve, Simulation};
/// use autobatch::Headroom;
///
/// let (mut step, mut meter) = Simulation::new(16 << 30, MemoryCurve::affine(2 << 30, 90 << 20)).build();
/// let report = Headroom::new(64).min_headroom(0.25).check(&mut step, &mut meter)?;
/// assert!(report.passed && report.headroom > 0.5);
/// let too_tight = Headroom::new(64).min_headroom(0.75).check(&mut step, &mut meter);
/// assert!(matches!(too_tight, Err(autobatch::Error::InsufficientHeadroom(_))));
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Headroom {
    batch: usize,
    min_headroom: f64,
    steps: usize,
    warmup: bool,
}

impl Headroom {
    /// A check at `batch`, requiring 10% of the device free at the peak, over one
    /// measured step after one warm-up step.
    pub fn new(batch: usize) -> Self {
        Headroom { batch, min_headroom: 0.10, steps: 1, warmup: true }
    }

    /// The share of capacity that must stay free at the peak, in [0, 1).
    pub fn min_headroom(mut self, fraction: f64) -> Self {
        self.min_headroom = fraction;
        self
    }

    /// Measured steps; the peak is the highest over them.
    pub fn steps(mut self, steps: usize) -> Self {
        self.steps = steps;
        self
    }

    /// Whether to run one unmeasured step first (default true), so that
    /// runtime buffers kept for good are in the baseline.
    pub fn warmup(mut self, warmup: bool) -> Self {
        self.warmup = warmup;
        self
    }

    /// Measures and reports, passing or not: an out-of-memory step is a failed
    /// report, any other workload error an [`Error::Workload`].
    pub fn measure<W, M>(&self, workload: &mut W, meter: &mut M) -> Result<HeadroomReport, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
    {
        if self.batch == 0 {
            return Err(Error::zero(crate::Setting::Batch));
        }
        if self.steps == 0 {
            return Err(Error::zero(crate::Setting::Steps));
        }
        if !(0.0..1.0).contains(&self.min_headroom) {
            return Err(Error::invalid(
                crate::Setting::MinHeadroom,
                crate::Value::Fraction(self.min_headroom),
                "it must be a fraction in [0, 1): pass e.g. 0.1 to keep 10% of the device free",
            ));
        }
        let batch = self.batch;
        // a meter sized by its room leaves it under no ceiling: headroom is of the whole capacity
        meter.under_ceiling(crate::plan::Ceiling::new(1.0)?);
        let capacity_bytes = meter.capacity()?;
        // Ok(false): ran out of memory; other errors end the check
        let ran = |result: candle_core::Result<()>| match result {
            Ok(()) => Ok(true),
            Err(err) if is_oom(&err) => Ok(false),
            Err(source) => Err(Error::workload(batch, source)),
        };
        if self.warmup {
            let warm = measure(meter, 1, None, || workload.step(batch))?;
            if ran(warm.result)? {
                warm.settled?;
            }
        }
        let measured = measure(meter, self.steps, None, || workload.step(batch))?;
        let ran = ran(measured.result)?;
        if ran {
            measured.settled?;
        }
        let (baseline_bytes, peak_bytes) = (measured.baseline_bytes, measured.peak?);
        let headroom_bytes = capacity_bytes.saturating_sub(peak_bytes);
        let headroom = if capacity_bytes == 0 { 0.0 } else { headroom_bytes as f64 / capacity_bytes as f64 };
        Ok(HeadroomReport {
            batch,
            steps: self.steps,
            out_of_memory: !ran,
            baseline_bytes,
            peak_bytes,
            capacity_bytes,
            headroom_bytes,
            headroom,
            min_headroom: self.min_headroom,
            passed: ran && headroom >= self.min_headroom,
        })
    }

    /// [`measure`](Headroom::measure), with a failed report turned into
    /// [`Error::InsufficientHeadroom`].
    pub fn check<W, M>(&self, workload: &mut W, meter: &mut M) -> Result<HeadroomReport, Error>
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
    {
        let report = self.measure(workload, meter)?;
        if report.passed { Ok(report) } else { Err(Error::InsufficientHeadroom(Box::new(report))) }
    }

    /// [`check`](Headroom::check) for `#[test]` functions: panics, with peak,
    /// capacity and headroom in the message, unless the workload runs with
    /// at least the minimum headroom free; returns the report otherwise.
    ///
    /// ```
    /// use autobatch::memory::simulated::{MemoryCurve, Simulation};
    /// use autobatch::Headroom;
    ///
    /// let (mut step, mut meter) = Simulation::new(16 << 30, MemoryCurve::affine(2 << 30, 90 << 20)).build();
    /// let report = Headroom::new(64).min_headroom(0.25).assert(&mut step, &mut meter);
    /// println!("{}", report.to_json()); // keep it as a CI artifact
    /// ```
    pub fn assert<W, M>(&self, workload: &mut W, meter: &mut M) -> HeadroomReport
    where
        W: Workload + ?Sized,
        M: MemoryMeter + ?Sized,
    {
        match self.check(workload, meter) {
            Ok(report) => report,
            Err(Error::InsufficientHeadroom(report)) => panic!("memory headroom regression: {report}"),
            Err(err) => panic!("memory headroom check could not run: {err}"),
        }
    }
}
