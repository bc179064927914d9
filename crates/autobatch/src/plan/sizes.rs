//! Plans across input sizes: each probed size's largest batch, a memory model
//! in batch and size, a token budget, and batches for sizes in between.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Plan, TrialKind};
use crate::Error;
use crate::search::Outcome;

/// `peak(b, s) ≈ fixed + per_sample·b + per_token·b·s + per_token_length·b·s²`:
/// weights, gradients and optimizer state; what each sample needs whatever its
/// size (a classification head, per-sample buffers); activations that grow
/// with the tokens (b·s); attention scores that grow with tokens × length
/// (b·s²). Fitted by relative least squares to every full measurement at
/// every probed size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SizeModel {
    /// Bytes at batch 0.
    pub fixed_bytes: f64,
    /// Bytes per sample whatever its size (0 when the fit does without it).
    #[serde(default)]
    pub bytes_per_sample: f64,
    /// Bytes per token (per sample per unit of size).
    pub bytes_per_token: f64,
    /// Bytes per token per unit of size (attention's quadratic term).
    pub bytes_per_token_length: f64,
    /// The measurements it was fitted to.
    pub fitted_points: usize,
    /// The largest `|predicted − measured| / measured` over them.
    pub max_error: f64,
}

impl SizeModel {
    /// Bytes one sample of size `size` adds.
    pub fn bytes_per_sample_at(&self, size: usize) -> f64 {
        let s = size as f64;
        self.bytes_per_sample + self.bytes_per_token * s + self.bytes_per_token_length * s * s
    }

    /// The predicted peak of a step of `batch` samples of size `size`, in bytes.
    pub fn predict(&self, batch: usize, size: usize) -> f64 {
        self.fixed_bytes + batch as f64 * self.bytes_per_sample_at(size)
    }

    /// The largest batch of size `size` whose predicted peak, raised by the
    /// model's worst error on its own measurements, is at most `limit_bytes`
    /// (0 when not even the fixed part fits).
    pub fn largest_batch(&self, size: usize, limit_bytes: u64) -> usize {
        let margin = 1.0 + self.max_error + 1e-9;
        let per_sample = self.bytes_per_sample_at(size) * margin;
        let room = limit_bytes as f64 - (self.fixed_bytes + self.fixed_bytes.abs() * (margin - 1.0));
        if room <= 0.0 || per_sample <= 0.0 {
            return 0;
        }
        // a float past usize::MAX saturates in the cast
        (room / per_sample).floor() as usize
    }

    /// Fits the model to `(batch, size, peak)` points; `None` when they do not
    /// determine it (fewer points than terms, or every point the same size
    /// and no term can be told apart). Fits each subset of the terms that the
    /// points determine with no negative coefficient, smallest subsets first,
    /// and keeps a larger one only when it halves the worst error: a term
    /// that only follows the noise does not get in.
    pub(crate) fn fit(points: &[(usize, usize, u64)]) -> Option<SizeModel> {
        // per token and per token × length first: the form attention has
        const SUBSETS: [&[usize]; 7] = [&[1], &[2], &[0], &[1, 2], &[0, 1], &[0, 2], &[0, 1, 2]];
        let mut best: Option<SizeModel> = None;
        for terms in SUBSETS {
            let Some(model) = Self::fit_terms(points, terms) else { continue };
            let better = |incumbent: &SizeModel| {
                model.max_error < incumbent.max_error / 2.0 && incumbent.max_error - model.max_error > 1e-6
            };
            if best.as_ref().is_none_or(better) {
                best = Some(model);
            }
        }
        best
    }

    /// Least squares over the constant and the given terms (0: b, 1: b·s, 2: b·s²).
    fn fit_terms(points: &[(usize, usize, u64)], terms: &[usize]) -> Option<SizeModel> {
        let n = terms.len() + 1;
        if points.len() < n {
            return None;
        }
        let feature = |&(b, s, _): &(usize, usize, u64), term: usize| (b as f64) * (s as f64).powi(term as i32);
        // relative least squares (each row over its peak): a step of 10 MiB
        // counts as much as one of 10 GiB, so the small trials do not
        // dominate and the error near the ceiling stays small
        let rows: Vec<(Vec<f64>, f64, f64)> = points
            .iter()
            .map(|point| {
                let features = std::iter::once(1.0).chain(terms.iter().map(|&t| feature(point, t))).collect();
                (features, point.2 as f64, 1.0 / (point.2.max(1) as f64).powi(2))
            })
            .collect();
        let solution = crate::search::least_squares(&rows)?;
        let coefficient = |term: usize| terms.iter().position(|&t| t == term).map_or(0.0, |i| solution[i + 1]);
        let model = SizeModel {
            fixed_bytes: solution[0],
            bytes_per_sample: coefficient(0),
            bytes_per_token: coefficient(1),
            bytes_per_token_length: coefficient(2),
            fitted_points: points.len(),
            max_error: 0.0,
        };
        let terms_ok = terms.iter().all(|&t| coefficient(t) >= 0.0) && terms.iter().any(|&t| coefficient(t) > 0.0);
        if !terms_ok || !model.fixed_bytes.is_finite() {
            return None;
        }
        let max_error = points
            .iter()
            .map(|&(b, s, peak)| ((model.predict(b, s) - peak as f64) / peak.max(1) as f64).abs())
            .fold(0.0, f64::max);
        max_error.is_finite().then_some(SizeModel { max_error, ..model })
    }
}

/// How a batch for a size was arrived at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchSource {
    /// A probed size: the batch was run and seen to fit, and the next did not.
    Verified,
    /// Between two probed sizes: the memory model's answer, kept between what
    /// the two verified neighbours allow (at most the shorter one's batch, at
    /// least the longer one's), never run.
    Predicted,
    /// Shorter than every probed size: the shortest one's verified batch,
    /// which fits (a shorter input needs no more memory) but may not be the largest.
    Bound,
}

impl std::fmt::Display for BatchSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BatchSource::Verified => "verified",
            BatchSource::Predicted => "predicted",
            BatchSource::Bound => "bound",
        })
    }
}

/// A batch for one input size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeBatch {
    /// The size asked about (for [`SizePlan::bucket_for`], the bucket's size).
    pub size: usize,
    /// The batch.
    pub batch: usize,
    /// How it was arrived at.
    pub source: BatchSource,
}

/// The probed sizes in JSON: an array of `{size, plan}`, shortest first.
mod by_size {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::Plan;

    #[derive(Serialize)]
    struct Sized<'a> {
        size: usize,
        plan: &'a Plan,
    }

    #[derive(Deserialize)]
    struct Owned {
        size: usize,
        plan: Plan,
    }

    pub(super) fn serialize<S: Serializer>(sizes: &BTreeMap<usize, Plan>, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(sizes.iter().map(|(&size, plan)| Sized { size, plan }))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<BTreeMap<usize, Plan>, D::Error> {
        let entries = Vec::<Owned>::deserialize(deserializer)?;
        let count = entries.len();
        let sizes: BTreeMap<usize, Plan> = entries.into_iter().map(|entry| (entry.size, entry.plan)).collect();
        if sizes.len() < count {
            return Err(serde::de::Error::custom("a size is probed twice"));
        }
        Ok(sizes)
    }
}

/// What [`Search::sizes`](crate::Search::sizes) found: the largest batch
/// at each probed input size, a memory model in batch and size, and a token
/// budget per micro-batch.
///
/// ```
/// use autobatch::memory::simulated::SizedSimulation;
/// use autobatch::{plan::BatchSource, Tuner};
///
/// // fixed 1 GiB; 64 KiB per token; 256 B per token per unit of length
/// let peak = |batch: usize, len: usize| (1u64 << 30) + (batch * len) as u64 * ((64 << 10) + 256 * len as u64);
/// let (mut workload, mut meter) = SizedSimulation::new(16 << 30, 512, peak).build();
/// let plan = Tuner::new().search(&mut workload, &mut meter).sizes(&[128, 256, 512])?;
///
/// let at_256 = plan.batch_for(256)?;
/// assert_eq!(at_256.source, BatchSource::Verified);
/// let at_200 = plan.batch_for(200)?;
/// assert_eq!(at_200.source, BatchSource::Predicted);
/// assert!(at_200.batch <= plan.batch_for(128)?.batch && at_200.batch >= at_256.batch);
/// // any micro-batch padded to 128..=512 tokens with ≤ token_budget tokens fits
/// assert_eq!(plan.token_budget, plan.sizes.iter().map(|(size, plan)| size * plan.largest_batch()).min().unwrap());
/// assert_eq!(plan.sizes[&256].largest_batch(), at_256.batch);
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SizePlan {
    /// The probed sizes, shortest first, each with its plan (in JSON, an
    /// array of `{size, plan}`).
    #[serde(with = "by_size")]
    pub sizes: BTreeMap<usize, Plan>,
    /// The memory model fitted to all of them, when the points determine it.
    pub model: Option<SizeModel>,
    /// Tokens (padded samples × size) per micro-batch that fit at every
    /// probed size: the smallest of `size × largest_batch`. A micro-batch
    /// padded to any length `L` between the shortest and the longest probed
    /// size fits when `batch × L` stays within it: memory per token,
    /// `per_token + per_token_length·L + per_sample/L`, is convex in `L`, so
    /// between two probed sizes it is at most what it is at one of them.
    /// Below the shortest size that holds too unless each sample has a
    /// sizeable part independent of its length.
    pub token_budget: usize,
    /// The most a fitting step may use, in bytes (ceiling × capacity).
    pub limit_bytes: u64,
    /// The granularity batches are kept to.
    pub multiple_of: usize,
}

impl SizePlan {
    pub(crate) fn new(sizes: BTreeMap<usize, Plan>) -> Result<SizePlan, Error> {
        let Some(first) = sizes.values().next() else { return Err(Error::zero(crate::Setting::Sizes)) };
        let (limit_bytes, multiple_of) = (first.limit_bytes(), first.multiple_of());
        let token_budget = sizes.iter().map(|(size, plan)| size.saturating_mul(plan.largest_batch)).min().unwrap_or(0);
        let mut points: Vec<(usize, usize, u64)> = Vec::new();
        for (&size, plan) in &sizes {
            for trial in plan.trials.iter().rev() {
                let full = matches!(trial.outcome, Outcome::Fits | Outcome::OverCeiling);
                let plain = matches!(trial.kind, TrialKind::Search | TrialKind::Recheck);
                if let (true, true, Some(peak)) = (full, plain, trial.peak_bytes)
                    && !points.iter().any(|&(b, s, _)| (b, s) == (trial.batch, size))
                {
                    points.push((trial.batch, size, peak));
                }
            }
        }
        let model = SizeModel::fit(&points);
        Ok(SizePlan { sizes, model, token_budget, limit_bytes, multiple_of })
    }

    /// The plan of a probed size.
    pub fn plan_for(&self, size: usize) -> Option<&Plan> {
        self.sizes.get(&size)
    }

    /// Whether every size's plan came from the plan cache.
    pub fn cached(&self) -> bool {
        self.sizes.values().all(Plan::cached)
    }

    /// The longest probed size.
    fn longest(&self) -> usize {
        self.sizes.last_key_value().map_or(0, |(&size, _)| size)
    }

    /// The largest batch for inputs of `size`: verified at a probed size;
    /// between two, the smallest of the memory model's answer (lowered by its
    /// worst error), the shorter neighbour's verified batch scaled by the
    /// model's growth in bytes per sample, and, when no more sizes were
    /// probed than the model has terms in the size (which cannot tell its
    /// form), the answer with bytes per sample on the chord between them (safe
    /// for any curve convex in the size); kept within what the verified neighbours allow. Below the
    /// shortest, the shortest's batch.
    /// Past the longest probed size nothing is known: [`Error::InvalidSetting`].
    pub fn batch_for(&self, size: usize) -> Result<SizeBatch, Error> {
        let (&above_size, above) = self.sizes.range(size..).next().ok_or_else(|| out_of_range(size, self.longest()))?;
        if above_size == size {
            return Ok(SizeBatch { size, batch: above.largest_batch, source: BatchSource::Verified });
        }
        let Some((&below_size, below)) = self.sizes.range(..size).next_back() else {
            return Ok(SizeBatch { size, batch: above.largest_batch, source: BatchSource::Bound });
        };
        // the shorter neighbour allows at most its batch, the longer at least its own
        let upper = below.largest_batch;
        let lower = above.largest_batch.min(upper);
        let predicted = self.model.as_ref().map_or(lower, |model| {
            let (short, long) = (model.bytes_per_sample_at(below_size), model.bytes_per_sample_at(above_size));
            // the shorter neighbour's verified batch, scaled by how much more a
            // sample needs here: what the model gets wrong in absolute terms
            // (a fixed part off) largely cancels in the ratio
            let anchored = (upper as f64 * short / model.bytes_per_sample_at(size)).floor() as usize;
            let by_model = model.largest_batch(size, self.limit_bytes).min(anchored);
            let size_terms = [model.bytes_per_sample, model.bytes_per_token, model.bytes_per_token_length]
                .into_iter()
                .filter(|&term| term != 0.0)
                .count();
            if self.sizes.len() > size_terms {
                // a size more than the terms checked the model's form: its worst error says how far to trust it
                return by_model;
            }
            // As many sizes as terms fit them exactly, whatever the curve does
            // in between (16, 32 and 64 fit a quadratic that lies 0.5% under
            // the transformer's peaks at 24, measured), and the forms differ
            // in between. Bytes per sample on the chord between the neighbours
            // lie above the curve whatever its form, as long as it is convex in
            // the size (constant, linear and quadratic terms are): safe.
            let along = (size - below_size) as f64 / (above_size - below_size) as f64;
            let chord = SizeModel {
                bytes_per_sample: short + (long - short) * along,
                bytes_per_token: 0.0,
                bytes_per_token_length: 0.0,
                ..model.clone()
            };
            by_model.min(chord.largest_batch(size, self.limit_bytes))
        });
        let predicted = predicted - predicted % self.multiple_of;
        Ok(SizeBatch { size, batch: predicted.clamp(lower, upper), source: BatchSource::Predicted })
    }

    /// The bucket an input of length `len` goes to when batches are padded to
    /// the probed sizes: the shortest probed size at least `len`, with its
    /// verified largest batch. [`Error::InvalidSetting`] past the longest.
    /// With a target or [`Objective::Throughput`](crate::plan::Objective::Throughput),
    /// train with that size's plan ([`plan_for`](Self::plan_for)): its
    /// micro-batch and accumulation steps.
    pub fn bucket_for(&self, len: usize) -> Result<SizeBatch, Error> {
        let (&size, bucket) = self.sizes.range(len..).next().ok_or_else(|| out_of_range(len, self.longest()))?;
        Ok(SizeBatch { size, batch: bucket.largest_batch, source: BatchSource::Verified })
    }

    /// Serializes the plan as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a plan always serializes: it holds no maps with non-string keys")
    }
}

impl std::fmt::Display for SizePlan {
    /// ```text
    ///     size     batch     tokens        peak    util  trials       model
    ///       64        59       3776     229 MiB   89.5%       5          58
    ///    ...
    /// memory: 5.43 MiB + 38.1 KiB per token + 331 B per token per unit of size (fitted to 15 steps, worst error 4.8%)
    /// token budget: 1792 tokens per micro-batch (padded length × batch) at any length from 64 to 256
    /// ```
    ///
    /// With a target or the throughput objective, a last column gives each
    /// size's training split (micro-batch × accumulation steps × ranks).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::units::format_bytes;
        let splits = self.sizes.values().any(|plan| {
            plan.micro_batch() != plan.largest_batch || plan.accumulation_steps() > 1 || plan.world_size() > 1
        });
        write!(
            f,
            "{:>8}  {:>8}  {:>9}  {:>10}  {:>6}  {:>6}  {:>10}",
            "size", "batch", "tokens", "peak", "util", "trials", "model"
        )?;
        writeln!(f, "{}", if splits { "  train with" } else { "" })?;
        for (&size, plan) in &self.sizes {
            let model =
                self.model.as_ref().map_or("-".to_owned(), |m| m.largest_batch(size, self.limit_bytes).to_string());
            let split = if splits {
                format!(
                    "  {} × {} × {} = {}",
                    plan.micro_batch(),
                    plan.accumulation_steps(),
                    plan.world_size(),
                    plan.effective_batch()
                )
            } else {
                String::new()
            };
            writeln!(
                f,
                "{:>8}  {:>8}  {:>9}  {:>10}  {:>5.1}%  {:>6}  {:>10}{split}{}",
                size,
                plan.largest_batch,
                size.saturating_mul(plan.largest_batch),
                format_bytes(plan.peak_bytes),
                100.0 * plan.utilization(),
                if plan.cached() { format!("{} now", plan.cache_checks()) } else { plan.trials.len().to_string() },
                model,
                if plan.proven_largest() { "" } else { "  (not proven largest)" }
            )?;
        }
        match &self.model {
            Some(model) => {
                // only the terms the fit kept: a term it did without is 0, not "0 B per token"
                let terms: Vec<String> = [
                    (model.bytes_per_sample, "per sample"),
                    (model.bytes_per_token, "per token"),
                    (model.bytes_per_token_length, "per token per unit of size"),
                ]
                .into_iter()
                .filter(|(bytes, _)| bytes.round() >= 1.0)
                .map(|(bytes, what)| format!(" + {} {what}", format_bytes(bytes.round() as u64)))
                .collect();
                writeln!(
                    f,
                    "memory: {}{} (fitted to {} steps, worst error {:.1}%)",
                    format_bytes(model.fixed_bytes.max(0.0) as u64),
                    terms.concat(),
                    model.fitted_points,
                    100.0 * model.max_error
                )?
            }
            None => writeln!(f, "memory: too few measurements for a model in batch and size")?,
        }
        write!(
            f,
            "token budget: {} tokens per micro-batch (padded length × batch) at any length from {} to {}",
            self.token_budget,
            self.sizes.first_key_value().map_or(0, |(&size, _)| size),
            self.longest()
        )?;
        for (size, plan) in &self.sizes {
            for warning in &plan.warnings {
                write!(f, "\nwarning (size {size}): {warning}")?;
            }
        }
        Ok(())
    }
}

/// A size past the `longest` probed: nothing is known there.
fn out_of_range(size: usize, longest: usize) -> Error {
    Error::invalid(
        crate::Setting::Size,
        crate::Value::Count(size),
        format!(
            "it must be at most the longest size probed, {longest}: probe it (or a longer one) to get a batch for it"
        ),
    )
}
