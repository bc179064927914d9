//! The algorithms people use today, re-implemented from their sources as
//! search loops over the same measurements ours see. A "failure" is an
//! out-of-memory error or a peak over the ceiling: the ceiling acts as the
//! device's end for every algorithm alike (as a ballast would make it).

use autobatch::search::{Observation, SearchSpace};
use autobatch::{search::Outcome, search::Strategy};

/// One measured trial: the outcome and the peak, if it ran to the end.
pub type Measure<'a> = dyn FnMut(usize) -> (Outcome, Option<u64>) + 'a;

#[derive(Clone, Copy, Debug)]
pub enum Algorithm {
    Ours(Strategy),
    /// Lightning `BatchSizeFinder(mode="power")`: init 2, double on success,
    /// halve and stop at the first failure after a success (max 25 trials).
    LightningPower,
    /// Lightning `mode="binsearch"`: init 2, double until a failure, bisect
    /// `(high + low) // 2` with `low` starting at 1, and return the result
    /// times `1 − 0.05` (its margin), untried.
    LightningBinsearch,
    /// Accelerate `find_executable_batch_size`: start at 128, multiply by 0.9
    /// on each failure, return the first success.
    Accelerate,
    /// Ultralytics AutoBatch: one step at 1, 2, 4, …, 64, a straight line
    /// through the peaks of those that ran, solved for `fraction × capacity`;
    /// no verification; outside [1, 1024] it falls back to 16.
    Ultralytics {
        fraction: f64,
    },
}

impl Algorithm {
    pub fn name(&self) -> String {
        match self {
            Algorithm::Ours(strategy) => format!("autobatch {strategy}"),
            Algorithm::LightningPower => "Lightning power".to_owned(),
            Algorithm::LightningBinsearch => "Lightning binsearch".to_owned(),
            Algorithm::Accelerate => "Accelerate (128, ×0.9)".to_owned(),
            Algorithm::Ultralytics { fraction } => format!("Ultralytics {:.0}%", fraction * 100.0),
        }
    }

    /// Runs the algorithm; returns its answer (if any) and the batches it tried.
    pub fn run(&self, limit: u64, capacity: u64, measure: &mut Measure) -> (Option<usize>, Vec<usize>) {
        let mut tried = Vec::new();
        let mut trial = |batch: usize| {
            tried.push(batch);
            measure(batch)
        };
        let answer = match *self {
            Algorithm::Ours(strategy) => ours(strategy, limit, &mut trial),
            Algorithm::LightningPower => lightning_power(&mut trial),
            Algorithm::LightningBinsearch => lightning_binsearch(&mut trial),
            Algorithm::Accelerate => accelerate(&mut trial),
            Algorithm::Ultralytics { fraction } => ultralytics(fraction, capacity, &mut trial),
        };
        (answer, tried)
    }
}

fn ours(strategy: Strategy, limit: u64, trial: &mut Measure) -> Option<usize> {
    let space = SearchSpace::new(1, None, 1).expect("valid").with_limit(limit);
    let mut history = Vec::new();
    while let Some(batch) = strategy.next_batch(&space, &history) {
        let (outcome, peak_bytes) = trial(batch);
        history.push(Observation { batch, outcome, peak_bytes });
    }
    Observation::best(&history).map(|o| o.batch)
}

fn lightning_power(trial: &mut Measure) -> Option<usize> {
    let mut size = 2usize;
    let mut any_success = false;
    for _ in 0..25 {
        if trial(size).0.fits() {
            any_success = true;
            size *= 2;
        } else {
            size /= 2;
            if any_success || size == 0 {
                break;
            }
        }
    }
    (size > 0).then_some(size)
}

fn lightning_binsearch(trial: &mut Measure) -> Option<usize> {
    let (mut low, mut high): (usize, Option<usize>) = (1, None);
    let mut size = 2usize;
    let mut count = 0;
    loop {
        if trial(size).0.fits() {
            count += 1;
            if count > 25 {
                break;
            }
            low = size;
            match high {
                Some(high) if high - low <= 1 => break,
                Some(high) => size = (high + low) / 2,
                None => size *= 2,
            }
        } else {
            let failed = size;
            high = Some(failed);
            size = (failed + low) / 2;
            if failed - low <= 1 {
                break;
            }
        }
    }
    Some(((size as f64) * (1.0 - 0.05)).max(1.0) as usize)
}

fn accelerate(trial: &mut Measure) -> Option<usize> {
    let mut size = 128usize;
    while size > 0 {
        if trial(size).0.fits() {
            return Some(size);
        }
        size = (size as f64 * 0.9) as usize;
    }
    None
}

fn ultralytics(fraction: f64, capacity: u64, trial: &mut Measure) -> Option<usize> {
    let sizes = [1usize, 2, 4, 8, 16, 32, 64];
    let mut points = Vec::new();
    let mut first_failure = None;
    for &size in &sizes {
        match trial(size) {
            (outcome, Some(peak)) if outcome.fits() => points.push((size, peak)),
            _ => {
                first_failure.get_or_insert(size);
            }
        }
    }
    let (fixed_bytes, bytes_per_sample) = straight_line(&points)?;
    let mut batch = ((fraction * capacity as f64 - fixed_bytes) / bytes_per_sample) as i64;
    if let Some(failed) = first_failure
        && batch >= failed as i64
    {
        let index = sizes.iter().position(|&s| s == failed).unwrap_or(0);
        batch = sizes[index.saturating_sub(1)] as i64;
    }
    if !(1..=1024).contains(&batch) {
        batch = 16;
    }
    Some(batch as usize)
}

/// The ordinary least-squares line through `(batch, peak)` points, as
/// Ultralytics fits it (`np.polyfit(x, y, deg=1)`): `(fixed bytes, bytes per
/// sample)`, `None` with fewer than two distinct batches.
pub fn straight_line(points: &[(usize, u64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    let mean_b = points.iter().map(|&(b, _)| b as f64).sum::<f64>() / n;
    let mean_p = points.iter().map(|&(_, p)| p as f64).sum::<f64>() / n;
    let spread: f64 = points.iter().map(|&(b, _)| (b as f64 - mean_b).powi(2)).sum();
    if points.len() < 2 || spread == 0.0 {
        return None;
    }
    let covariance: f64 = points.iter().map(|&(b, p)| (b as f64 - mean_b) * (p as f64 - mean_p)).sum();
    let per_sample = covariance / spread;
    Some((mean_p - per_sample * mean_b, per_sample))
}
