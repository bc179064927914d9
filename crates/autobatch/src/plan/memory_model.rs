//! The phases through the trials: what the plan predicts between them.

use serde::{Deserialize, Serialize};

use super::{Trial, TrialKind};
use crate::search::{LinearFit, Outcome};
use crate::units::format_bytes;

/// The step's peak as the largest of the lines its trials lie on, `peak(b)
/// ≈ maxᵢ (fixedᵢ + per_sampleᵢ·b)`: a step peaks in one phase at small
/// batches (the optimizer's update, whose peak grows little or not at all
/// with the batch; a loss chunk that is not yet full) and in a steeper one
/// past where their lines cross (the forward and backward passes' saved
/// activations). Each phase is fitted (least squares) to its own run of
/// trials, at least two (a flat first phase: one), and is *confirmed* by a
/// third; the fit uses every trial that ran to the end except those at the
/// chosen batch, so that its peak there is a prediction that the measurement
/// then checks. `fixed_bytes` and `bytes_per_sample` are the last phase's:
/// the whole step's slope at the largest batches, not a line through the
/// phases below it.
///
/// ```
/// use autobatch::plan::MemoryModel;
///
/// // the update's line, then the backward pass's, crossing near batch 32
/// let peak = |b: usize| (792.5e6 + 16.0e6 * b as f64).max(563.0e6 + 23.13e6 * b as f64) as u64;
/// let points: Vec<(usize, u64)> = [1, 4, 16, 40, 48, 56].iter().map(|&b| (b, peak(b))).collect();
/// let model = MemoryModel::through(&points).unwrap();
/// assert_eq!(model.phases.len(), 2);
/// assert!((model.bytes_per_sample - 23.13e6).abs() < 1.0);
/// assert!((model.predict(8) - 920.5e6).abs() < 1.0);
/// assert!((model.phases[1].crossover.unwrap() - 32.19).abs() < 0.01);
/// // the first line alone would say 71
/// assert_eq!(model.largest_under(1_932_735_283), Some(59));
/// println!("{model}"); // 756 MiB + 15.3 MiB per sample (batches 1, 4, 16); then from batch 32.2: …
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryModel {
    /// Bytes at batch 0 of the last phase's line (the one at the largest
    /// batches): weights, gradients, optimizer state, workspaces, other
    /// processes.
    pub fixed_bytes: f64,
    /// Bytes each sample adds in the last phase: activations, mostly.
    pub bytes_per_sample: f64,
    /// The first phase's height where it is flat and another phase follows
    /// (the update's peak, whatever the batch); 0 otherwise. Also in
    /// [`phases`](MemoryModel::phases).
    #[serde(default)]
    pub plateau_bytes: f64,
    /// The phases, in batch order (the slopes grow): one where every trial
    /// lies on one line. Empty in a plan recorded before phases were kept
    /// (the line and the plateau say it all there).
    #[serde(default)]
    pub phases: Vec<Phase>,
    /// The batches the phases were fitted to.
    pub fitted_batches: Vec<usize>,
    /// The model's peak at the chosen batch.
    pub predicted_peak_bytes: u64,
    /// `(predicted − measured) / measured` at the chosen batch: negative when
    /// the model under-estimates (the dangerous direction).
    pub prediction_error: f64,
}

/// One phase of the step's peak: the line through the trials where it is
/// the peak.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// Bytes at batch 0 of this phase's line.
    pub fixed_bytes: f64,
    /// Bytes each sample adds in this phase (0 for a flat one).
    pub bytes_per_sample: f64,
    /// The batches it was fitted to.
    pub batches: Vec<usize>,
    /// The (fractional) batch at which this phase's line passes the one
    /// before it: where the step's peak moves into this phase. `None` for
    /// the first.
    pub crossover: Option<f64>,
}

impl Phase {
    /// Whether a third trial confirms the line two determine (a flat phase:
    /// a second).
    pub fn confirmed(&self) -> bool {
        self.batches.len() >= if self.bytes_per_sample == 0.0 { 2 } else { 3 }
    }

    /// The phase's peak at `batch`.
    pub(crate) fn predict(&self, batch: usize) -> f64 {
        self.fixed_bytes + self.bytes_per_sample * batch as f64
    }
}

impl MemoryModel {
    /// A model of `phases` (in batch order), their crossovers set, not yet
    /// checked at a batch.
    pub(crate) fn of_phases(mut phases: Vec<Phase>) -> MemoryModel {
        for i in 1..phases.len() {
            let (before, this) = (&phases[i - 1], &phases[i]);
            let rise = this.bytes_per_sample - before.bytes_per_sample;
            let at = (before.fixed_bytes - this.fixed_bytes) / rise;
            phases[i].crossover = (rise > 0.0 && at.is_finite()).then_some(at);
        }
        let last = phases.last().cloned().unwrap_or(Phase {
            fixed_bytes: 0.0,
            bytes_per_sample: 0.0,
            batches: Vec::new(),
            crossover: None,
        });
        let plateau_bytes = match &phases[..] {
            [first, _, ..] if first.bytes_per_sample == 0.0 => first.fixed_bytes,
            _ => 0.0,
        };
        MemoryModel {
            fixed_bytes: last.fixed_bytes,
            bytes_per_sample: last.bytes_per_sample,
            plateau_bytes,
            fitted_batches: phases.iter().flat_map(|phase| phase.batches.iter().copied()).collect(),
            phases,
            predicted_peak_bytes: 0,
            prediction_error: 0.0,
        }
    }

    /// The phases through measured `(batch, peak bytes)` points (any order,
    /// one per batch): the fit a plan's model is, for figures measured
    /// outside a search (a benchmark's). `None` with fewer than two batches.
    ///
    /// ```
    /// use autobatch::plan::MemoryModel;
    ///
    /// let peak = |b: usize| (900e6f64).max(500e6 + 5e6 * b as f64) as u64;
    /// let points: Vec<(usize, u64)> = [1, 2, 4, 100, 120, 140].iter().map(|&b| (b, peak(b))).collect();
    /// let model = MemoryModel::through(&points).unwrap();
    /// assert_eq!((model.phases.len(), model.plateau_bytes), (2, 900e6));
    /// assert!((model.bytes_per_sample - 5e6).abs() < 1e-3);
    /// ```
    pub fn through(points: &[(usize, u64)]) -> Option<MemoryModel> {
        let mut sorted = points.to_vec();
        sorted.sort_unstable();
        sorted.dedup_by_key(|&mut (batch, _)| batch);
        let segments = crate::search::phases(&sorted)?;
        let phases = segments
            .iter()
            .map(|segment| {
                let batches = sorted[segment.points.clone()].iter().map(|&(b, _)| b).collect();
                let (fixed_bytes, bytes_per_sample) = (segment.line.fixed_bytes, segment.line.bytes_per_sample);
                Phase { fixed_bytes, bytes_per_sample, batches, crossover: None }
            })
            .collect();
        Some(MemoryModel::of_phases(phases))
    }

    /// The step's peak at `batch`, in bytes: the largest of the phases'
    /// lines.
    pub fn predict(&self, batch: usize) -> f64 {
        if self.phases.is_empty() {
            return self.line().predict(batch).max(self.plateau_bytes);
        }
        self.phases.iter().map(|phase| phase.predict(batch)).fold(f64::MIN, f64::max)
    }

    /// Bytes the next sample adds at `batch`: the slope of the phase that is
    /// the peak there.
    pub fn bytes_per_sample_at(&self, batch: usize) -> f64 {
        let peak = self.predict(batch);
        match self.phases.iter().rev().find(|phase| phase.predict(batch) >= peak) {
            Some(phase) => phase.bytes_per_sample,
            None if self.line().predict(batch) >= self.plateau_bytes => self.bytes_per_sample,
            None => 0.0,
        }
    }

    /// The largest batch whose predicted peak is at most `limit_bytes`;
    /// `None` when not even batch 1's is, or when no phase rises (every
    /// batch would).
    pub fn largest_under(&self, limit_bytes: u64) -> Option<usize> {
        let last = self.line();
        let end = last.largest_under(limit_bytes)?;
        if end.is_nan() || end < 1.0 {
            return None;
        }
        // the last phase is the steepest: past its crossing nothing is higher
        let mut batch = end.floor().min(usize::MAX as f64 / 2.0) as usize;
        while batch >= 1 && self.predict(batch) > limit_bytes as f64 {
            // an earlier phase is the peak here: step along it
            let over = self.predict(batch) - limit_bytes as f64;
            let slope = self.bytes_per_sample_at(batch);
            let step = if slope > 0.0 { (over / slope).ceil().max(1.0) as usize } else { batch };
            batch = batch.saturating_sub(step);
        }
        (batch >= 1).then_some(batch)
    }

    /// The last phase's line.
    pub(crate) fn line(&self) -> LinearFit {
        LinearFit { fixed_bytes: self.fixed_bytes, bytes_per_sample: self.bytes_per_sample }
    }

    /// Fits the phases to `trials` (the last measurement of each batch that
    /// ran to the end) except `chosen`, and checks them against `measured`
    /// there.
    pub(crate) fn fit(trials: &[Trial], chosen: usize, measured: u64) -> Option<MemoryModel> {
        let mut latest: Vec<(usize, u64)> = Vec::new();
        for trial in trials.iter().rev() {
            if trial.batch == chosen
                || matches!(trial.kind, TrialKind::Accumulation | TrialKind::Timing)
                || trial.outcome == Outcome::OutOfMemory
                || latest.iter().any(|&(b, _)| b == trial.batch)
            {
                continue;
            }
            if let Some(peak) = trial.peak_bytes {
                latest.push((trial.batch, peak));
            }
        }
        let mut model = MemoryModel::through(&latest)?;
        let predicted = model.predict(chosen).max(0.0);
        // JSON has no NaN or infinity: a model that cannot be checked is no model
        let finite =
            model.phases.iter().all(|phase| phase.fixed_bytes.is_finite() && phase.bytes_per_sample.is_finite());
        if measured == 0 || !(finite && predicted.is_finite()) {
            return None;
        }
        model.predicted_peak_bytes = predicted.round() as u64;
        model.prediction_error = (predicted - measured as f64) / measured as f64;
        Some(model)
    }
}

/// The phases in words: each line, the batches it was fitted to and where
/// it takes over, e.g. `756 MiB + 15.3 MiB per sample (batches 1, 4, 16);
/// then from batch 32.2: 537 MiB + 22.1 MiB per sample (batches 40, 48, 56)`.
impl std::fmt::Display for MemoryModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let line = |fixed: f64, slope: f64| match slope {
            0.0 => format!("{} flat", format_bytes(fixed.max(0.0) as u64)),
            _ => {
                format!("{} + {} per sample", format_bytes(fixed.max(0.0) as u64), format_bytes(slope.max(0.0) as u64))
            }
        };
        if self.phases.is_empty() {
            // recorded before phases were kept
            write!(f, "{}", line(self.fixed_bytes, self.bytes_per_sample))?;
            if self.plateau_bytes > 0.0 {
                write!(f, ", at least {} (the update's peak)", format_bytes(self.plateau_bytes as u64))?;
            }
            return Ok(());
        }
        for (i, phase) in self.phases.iter().enumerate() {
            if i > 0 {
                write!(f, "; then ")?;
            }
            if let Some(at) = phase.crossover {
                write!(f, "from batch {at:.1}: ")?;
            }
            let batches: Vec<String> = phase.batches.iter().map(usize::to_string).collect();
            let plural = if batches.len() == 1 { "" } else { "es" };
            let confirmed = if phase.confirmed() { "" } else { ", unconfirmed" };
            write!(
                f,
                "{} (batch{plural} {}{confirmed})",
                line(phase.fixed_bytes, phase.bytes_per_sample),
                batches.join(", ")
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(curve: impl Fn(usize) -> u64, batches: &[usize]) -> MemoryModel {
        MemoryModel::through(&batches.iter().map(|&b| (b, curve(b))).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn a_step_that_peaks_in_its_update_at_small_batches_has_a_plateau_and_the_slope_past_it() {
        // the update's 900 MB until the activations' line (500 MB + 5 MB a sample) passes it
        let curve = |b: usize| (500_000_000 + 5_000_000 * b as u64).max(900_000_000);
        let model = model(curve, &[1, 2, 4, 8, 16, 64, 128, 200]);
        assert_eq!(model.plateau_bytes, 900_000_000.0);
        assert!((model.bytes_per_sample - 5e6).abs() < 1.0 && (model.fixed_bytes - 5e8).abs() < 100.0, "{model:?}");
        assert_eq!(model.phases[0].batches, [1, 2, 4, 8, 16, 64]);
        assert!((model.phases[1].crossover.unwrap() - 80.0).abs() < 1e-6);
        for b in [1, 50, 80, 81, 300] {
            assert!((model.predict(b) - curve(b) as f64).abs() < 100.0, "{b}");
        }
    }

    #[test]
    fn a_straight_step_has_one_phase_and_noise_makes_none() {
        let straight = |b: usize| 300_000_000 + 2_000_000 * b as u64;
        let batches = [1, 2, 4, 8, 16, 64, 128, 200];
        let one = model(straight, &batches);
        assert_eq!((one.phases.len(), one.plateau_bytes), (1, 0.0));
        let noisy = |b: usize| straight(b) + [0, 3000, 1000, 0, 2000, 500, 0, 1500][b.trailing_zeros() as usize % 8];
        let noisy = model(noisy, &batches);
        assert_eq!(noisy.phases.len(), 1);
        assert!((noisy.bytes_per_sample - 2e6).abs() < 50.0, "{noisy:?}");
    }

    #[test]
    fn the_model_of_two_rising_phases_predicts_their_maximum_and_its_largest_batch() {
        // issue 89's step at 256 tokens on the CPU: AdamW's update's line, then the backward pass's
        let curve = |b: usize| (792.5e6 + 16.0e6 * b as f64).max(563.0e6 + 23.13e6 * b as f64) as u64;
        let model = model(curve, &[1, 4, 8, 16, 40, 48, 56]);
        assert_eq!(model.phases.len(), 2, "{model:?}");
        assert!(model.phases.iter().all(Phase::confirmed));
        let limit = (0.9 * (2u64 << 30) as f64) as u64;
        let truth = (1..1000).filter(|&b| curve(b) <= limit).max().unwrap();
        assert_eq!(model.largest_under(limit), Some(truth));
        // the first phase's slope alone would say 71
        assert_eq!(((limit as f64 - 792.5e6) / 16.0e6) as usize, 71);
        // below the crossing the first phase is the peak, and its slope the next sample's
        assert!((model.bytes_per_sample_at(10) - 16.0e6).abs() < 1.0);
        assert!((model.bytes_per_sample_at(40) - 23.13e6).abs() < 1.0);
        let said = model.to_string();
        assert!(said.contains("(batches 1, 4, 8, 16); then from batch 32.2: "), "{said}");
        // a limit under batch 1's peak fits nothing
        assert_eq!(model.largest_under(800_000_000), None);
        assert_eq!(model.largest_under(808_500_000), Some(1));
    }

    #[test]
    fn a_model_recorded_before_phases_predicts_as_it_did() {
        let old: MemoryModel = serde_json::from_str(
            r#"{"fixed_bytes": 5e8, "bytes_per_sample": 5e6, "plateau_bytes": 9e8, "fitted_batches": [1, 2],
                "predicted_peak_bytes": 0, "prediction_error": 0.0}"#,
        )
        .unwrap();
        assert!(old.phases.is_empty());
        assert_eq!((old.predict(10), old.predict(100)), (9e8, 1e9));
        assert_eq!(old.largest_under(1_000_000_000), Some(100));
    }
}
