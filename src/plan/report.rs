//! The human report: a table of trials and the plan they led to.

use std::fmt;

use super::{utilization, Outcome, Plan, TrialKind};
use crate::bytes::format_bytes;

impl fmt::Display for Plan {
    /// ```text
    /// trial  batch  outcome          peak   util      time
    ///     1      1  fits         1.20 GiB   7.5%    12 ms
    ///   ...
    /// largest batch 133 (proven largest), peak 14.1 GiB = 88.1% of 16.0 GiB (ceiling 90%)
    /// plan: micro-batch 67 × 4 accumulation steps × 1 rank = effective batch 268 (target 268, exact)
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:>5}  {:>7}  {:<13}  {:>9}  {:>6}  {:>9}", "trial", "batch", "outcome", "peak", "util", "time")?;
        for (index, trial) in self.trials.iter().enumerate() {
            let (peak, util) = match trial.peak_bytes {
                Some(peak) => (format_bytes(peak), format!("{:.1}%", 100.0 * utilization(peak, self.capacity_bytes))),
                None => ("-".to_owned(), "-".to_owned()),
            };
            let recheck = if trial.kind == TrialKind::Recheck { "  (re-check)" } else { "" };
            writeln!(
                f,
                "{:>5}  {:>7}  {:<13}  {:>9}  {:>6}  {:>9}{recheck}",
                index + 1,
                trial.batch,
                trial.outcome,
                peak,
                util,
                format_duration(trial.duration)
            )?;
        }
        let proof = if self.proven_largest { "proven largest" } else { "not proven largest" };
        let granularity =
            if self.multiple_of > 1 { format!(", multiples of {}", self.multiple_of) } else { String::new() };
        writeln!(
            f,
            "largest batch {} ({proof}{granularity}), peak {} = {:.1}% of {} (ceiling {:.0}%)",
            self.largest_batch,
            format_bytes(self.peak_bytes),
            100.0 * self.utilization(),
            format_bytes(self.capacity_bytes),
            100.0 * self.ceiling
        )?;
        let ranks = if self.world_size == 1 { "rank" } else { "ranks" };
        let steps = if self.accumulation_steps == 1 { "step" } else { "steps" };
        write!(
            f,
            "plan: micro-batch {} × {} accumulation {steps} × {} {ranks} = effective batch {}",
            self.micro_batch, self.accumulation_steps, self.world_size, self.effective_batch
        )?;
        if let Some(split) = &self.accumulation {
            if split.exact {
                write!(f, " (target {}, exact)", split.target_effective_batch)?;
            } else {
                write!(
                    f,
                    " (target {}, +{}: scale the learning rate by {:.4} (linear) or {:.4} (square root) to compensate)",
                    split.target_effective_batch,
                    split.deviation,
                    split.lr_scale,
                    split.lr_scale.sqrt()
                )?;
            }
        }
        for warning in &self.warnings {
            write!(f, "\nwarning: {warning}")?;
        }
        Ok(())
    }
}

fn format_duration(duration: std::time::Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs >= 100.0 {
        format!("{secs:.0} s")
    } else if secs >= 1.0 {
        format!("{secs:.2} s")
    } else if secs >= 1e-3 {
        format!("{:.1} ms", secs * 1e3)
    } else {
        format!("{:.0} µs", secs * 1e6)
    }
}

impl Outcome {
    #[cfg(test)]
    fn all() -> [Outcome; 3] {
        [Outcome::Fits, Outcome::OverCeiling, Outcome::OutOfMemory]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        use std::time::Duration;
        assert_eq!(format_duration(Duration::from_micros(250)), "250 µs");
        assert_eq!(format_duration(Duration::from_micros(12_345)), "12.3 ms");
        assert_eq!(format_duration(Duration::from_millis(2_500)), "2.50 s");
        assert_eq!(format_duration(Duration::from_secs(250)), "250 s");
    }

    #[test]
    fn outcome_labels_are_distinct() {
        let labels: std::collections::HashSet<_> = Outcome::all().iter().map(|o| o.label()).collect();
        assert_eq!(labels.len(), 3);
    }
}
