//! The human report: a table of trials and the plan they led to.

use std::fmt;

use super::{Accumulation, Plan, Trial, TrialKind, utilization};
use crate::units::{format_bytes, format_rate};

impl fmt::Display for Plan {
    /// ```text
    /// trial    batch  outcome             peak    util       time
    ///     1        1  fits            1.20 GiB    7.5%    12.0 ms
    ///   ...
    /// largest batch 133 (proven largest), peak 14.1 GiB = 88.1% of 16.0 GiB (ceiling 90%)
    /// plan: micro-batch 67 × 4 accumulation steps × 1 rank = effective batch 268 (target 268, exact)
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self.trials.iter().map(|t| t.batch.to_string().len()).fold(Trial::BATCH_WIDTH, usize::max);
        writeln!(f, "{}", Trial::table_header_with_width(width))?;
        for (index, trial) in self.trials.iter().enumerate() {
            writeln!(f, "{}", trial.table_row_with_width(index + 1, self.capacity_bytes(), width))?;
        }
        f.write_str(&self.summary())
    }
}

/// The trial table's pieces, for a live display of your own: an
/// [`Observer`](crate::Observer) prints each row as its trial ends, as the
/// command line does.
impl Trial {
    /// The batch column's usual width: batches up to 9,999,999.
    pub const BATCH_WIDTH: usize = 7;

    /// The header of the trial table, with a batch column `batch_width` wide.
    pub fn table_header_with_width(batch_width: usize) -> String {
        format!(
            "{:>5}  {:>batch_width$}  {:<13}  {:>9}  {:>6}  {:>9}  {:>9}",
            "trial", "batch", "outcome", "peak", "util", "time", "samples/s"
        )
    }

    /// This trial as row `number` of the table; utilization is of `capacity_bytes`.
    pub fn table_row_with_width(&self, number: usize, capacity_bytes: u64, batch_width: usize) -> String {
        let (peak, util) = match self.peak_bytes {
            Some(peak) => (format_bytes(peak), format!("{:.1}%", 100.0 * utilization(peak, capacity_bytes))),
            None => ("-".to_owned(), "-".to_owned()),
        };
        let recheck = match self.kind {
            TrialKind::Search => "",
            TrialKind::Recheck => "  (re-check)",
            TrialKind::Accumulation => "  (accumulating)",
            TrialKind::Timing => "  (timing)",
        };
        let rate =
            self.samples_per_second().filter(|_| timed(self.duration)).map_or_else(|| "-".to_owned(), format_rate);
        format!(
            "{:>5}  {:>batch_width$}  {:<13}  {:>9}  {:>6}  {:>9}  {:>9}{recheck}",
            number,
            self.batch,
            self.outcome,
            peak,
            util,
            format_duration(self.duration),
            rate
        )
    }
}

/// "proven largest", or "not proven largest: " and what stopped the search.
fn proof(proven: bool, stopped_by: Option<&super::SearchLimit>) -> String {
    match (proven, stopped_by) {
        (true, _) => "proven largest".to_owned(),
        (false, Some(limit)) => format!("not proven largest: {limit}"),
        (false, None) => "not proven largest".to_owned(),
    }
}

impl Plan {
    /// The report without the trial table: the search result, the plan and any warnings.
    pub fn summary(&self) -> String {
        let mut out = self.cache_note();
        out += &self.answer_lines();
        out += &self.plan_line();
        if let Some(split) = &self.accumulation() {
            out += &accumulation_note(split);
        }
        out += &self.throughput_note();
        if let Some(peak) = self.accumulation_peak_bytes() {
            out += &format!(
                "\naccumulating: micro-batch {} with the gradient accumulator held peaks at {} = {:.1}% (verified)",
                self.micro_batch(),
                format_bytes(peak),
                100.0 * utilization(peak, self.capacity_bytes())
            );
        }
        if let Some(model) = &self.memory_model {
            out += &format!(
                "\nmemory: {model} (predicts {} at batch {}, {:+.1}% of measured)",
                format_bytes(model.predicted_peak_bytes),
                self.largest_batch,
                100.0 * model.prediction_error
            );
        }
        out += &self.evaluation_note();
        if self.tuning.steps > 0 {
            out += &format!("\n{}", self.tuning_note());
        }
        for warning in &self.warnings {
            out += &format!("\nwarning: {warning}");
        }
        out
    }

    /// A cached plan says so, and what ran to check it.
    fn cache_note(&self) -> String {
        if !self.cached() {
            return String::new();
        }
        let ran = match self.cache_checks() {
            0 => "no step ran\n".to_owned(),
            1 => "one accumulating micro-step ran to check the new split (the last trial)\n".to_owned(),
            n => format!("{n} accumulating micro-steps ran to check the new split (the last trials)\n"),
        };
        format!("cached plan: stored by an earlier run with the same model, device and settings; {ran}")
    }

    /// The largest batch, its peak, where it was measured and what the peak holds.
    fn answer_lines(&self) -> String {
        let proven = proof(self.proven_largest(), self.stopped_by.as_ref());
        let granularity =
            if self.multiple_of() > 1 { format!(", multiples of {}", self.multiple_of()) } else { String::new() };
        let mut out = format!(
            "largest batch {} ({proven}{granularity}), peak {} = {:.1}% of {} (ceiling {})\n",
            self.largest_batch,
            format_bytes(self.peak_bytes),
            100.0 * self.utilization(),
            format_bytes(self.capacity_bytes()),
            self.ceiling()
        );
        if !self.device.is_empty() {
            out += &format!("measured on {}\n", self.device);
        }
        if self.untrained_gradient_bytes > 0 {
            out += &format!(
                "of the peak, {} are gradients candle's backward pass kept for tensors that are not variables \
                 (constants, the input batch)\n",
                format_bytes(self.untrained_gradient_bytes)
            );
        }
        let answer = self.trials.iter().rev().find(|t| t.batch == self.largest_batch && t.outcome.fits());
        if let Some(kinds) = answer.and_then(|t| t.peak_kinds) {
            out += &format!(
                "peak by kind: pool used {}, pool reserved {}, device-wide after the step {} ({} binds)\n",
                format_bytes(kinds.used),
                format_bytes(kinds.reserved),
                format_bytes(kinds.device),
                kinds.binding_name()
            );
        }
        out
    }

    /// `plan: micro-batch … × … accumulation steps × … ranks = effective batch …`,
    /// or this rank's share of an uneven split.
    fn plan_line(&self) -> String {
        if let (Some(split), Some(rank)) = (&self.ranks(), self.rank()) {
            return uneven_note(split, rank);
        }
        let ranks = if self.world_size() == 1 { "rank" } else { "ranks" };
        let steps = if self.accumulation_steps() == 1 { "step" } else { "steps" };
        if let Some(split) = self.accumulation().filter(|split| !split.equal_micro_batches()) {
            return format!("plan: {}", split.micro_steps_line());
        }
        format!(
            "plan: micro-batch {} × {} accumulation {steps} × {} {ranks} = effective batch {}",
            self.micro_batch(),
            self.accumulation_steps(),
            self.world_size(),
            self.effective_batch()
        )
    }

    /// Under the throughput objective: what was timed and chosen.
    fn throughput_note(&self) -> String {
        let Some(choice) = &self.throughput else { return String::new() };
        if choice.candidates.is_empty() {
            return format!(
                "\nthroughput: nothing was timed before the time limit: the plan trains at the largest batch, {}",
                choice.chosen_batch
            );
        }
        let points: Vec<String> = choice
            .candidates
            .iter()
            .map(|p| format!("{} → {}/s", p.batch, format_rate(p.samples_per_second)))
            .collect();
        let mut out = format!(
            "\nthroughput: batch {} is the fastest ({}; median of timed runs; {} extra steps); DeepSpeed's 5% rule \
             would pick {}",
            choice.chosen_batch,
            points.join(", "),
            choice.extra_steps,
            choice.deepspeed_batch
        );
        if self.micro_batch() != choice.chosen_batch {
            out += &format!(
                "; the plan trains at micro-batch {}, the largest up to {} that splits the target exactly or fits \
                 beside the accumulator",
                self.micro_batch(),
                choice.chosen_batch
            );
        }
        out
    }

    /// The evaluation step's own answer, alone and between training steps.
    fn evaluation_note(&self) -> String {
        let Some(evaluation) = &self.evaluation else { return String::new() };
        let mut out = format!(
            "\nevaluation: largest batch {} ({}), peak {} = {:.1}% of {}",
            evaluation.largest_batch,
            proof(evaluation.proven_largest, evaluation.stopped_by.as_ref()),
            format_bytes(evaluation.peak_bytes),
            100.0 * utilization(evaluation.peak_bytes, self.capacity_bytes()),
            format_bytes(self.capacity_bytes())
        );
        if let Some(during) = &evaluation.during_training {
            let proven = if during.proven_largest { "proven largest" } else { "not proven largest" };
            out += &format!(
                " alone (a separate evaluation or serving process); {} ({proven}) between training steps, beside \
                 the optimizer's {} of state",
                during.largest_batch,
                format_bytes(during.state_bytes)
            );
        }
        out
    }

    /// `tuning took 7 steps, 1.8 s: about 2.3 training steps at batch 133`
    /// (the time over one step at the largest batch, as measured there).
    fn tuning_note(&self) -> String {
        let steps = if self.tuning.steps == 1 { "step" } else { "steps" };
        // what the steps were, where the table of trials does not show them all
        let in_trials: usize = self.trials.iter().map(|t| t.steps).sum();
        let trials = self.trials.len();
        let each = match self.trials.first().map(|t| t.steps) {
            Some(steps) if steps > 1 && self.trials.iter().all(|t| t.steps == steps) => format!(" of {steps} steps"),
            _ => String::new(),
        };
        let what = match self.tuning.steps.checked_sub(in_trials) {
            Some(0) | None => String::new(),
            Some(1) => format!(" (a warm-up step, then {trials} trial{}{each})", if trials == 1 { "" } else { "s" }),
            Some(other) => {
                format!(" ({other} warm-up steps, then {trials} trial{}{each})", if trials == 1 { "" } else { "s" })
            }
        };
        let mut note = format!(
            "tuning took {} {steps}{what}, {}",
            self.tuning.steps,
            format_duration(std::time::Duration::from_secs_f64(self.tuning.seconds.max(0.0)))
        );
        let answer = self.trials.iter().rev().find(|t| t.batch == self.largest_batch && t.outcome.fits());
        let step_seconds = answer
            .filter(|t| timed(t.duration / t.steps.max(1) as u32))
            .map(|t| t.duration.as_secs_f64() / t.steps.max(1) as f64);
        if let Some(step_seconds) = step_seconds {
            note += &format!(
                ": about {:.1} training steps at batch {}",
                self.tuning.seconds / step_seconds,
                self.largest_batch
            );
        }
        note
    }
}

/// ` (target 268, exact)` or ` (target 257, +1: scale the learning rate …)`.
/// `plan (rank 1 of 2, uneven): micro-steps 2 × 78 + 2 × 77 (…); ranks' samples 690 + 310 = global batch 1000 (target 1000, exact)`
fn uneven_note(split: &super::RankSplit, rank: usize) -> String {
    let Some(share) = split.shares.get(rank) else {
        return format!("plan: rank {rank} is not among the {} ranks of the split", split.world_size());
    };
    let samples: Vec<String> = split.shares.iter().map(|s| s.samples.to_string()).collect();
    let exactness = if split.exact {
        "exact".to_owned()
    } else {
        format!("{} above", split.global_batch - split.target_global_batch)
    };
    format!(
        "plan (rank {rank} of {}, uneven): micro-steps {} (each mean loss × its samples / {} when gradients are \
         summed over ranks); ranks' samples {} = global batch {} (target {}, {exactness})",
        split.world_size(),
        share.micro_steps_summary(),
        split.global_batch,
        samples.join(" + "),
        split.global_batch,
        split.target_global_batch
    )
}

pub(crate) fn accumulation_note(split: &Accumulation) -> String {
    if split.exact {
        format!(" (target {}, exact)", split.target_effective_batch)
    } else {
        format!(
            " (target {}, +{}: scale the learning rate by {:.4} (linear) or {:.4} (square root) to compensate)",
            split.target_effective_batch,
            split.deviation,
            split.lr_scale,
            split.lr_scale.sqrt()
        )
    }
}

impl Accumulation {
    /// `micro-batches 1 × 90 + 2 × 89 (3 accumulation steps that differ by
    /// one sample, each loss weighted by its samples) × 1 rank = effective
    /// batch 268`: the split plainly where micro-steps differ.
    fn micro_steps_line(&self) -> String {
        let ranks = if self.world_size == 1 { "rank" } else { "ranks" };
        let by = if self.multiple_of == 1 { "one sample".to_owned() } else { format!("{} samples", self.multiple_of) };
        format!(
            "micro-batches {} ({} accumulation steps that differ by {by}, each loss weighted by its samples) × {} \
             {ranks} = effective batch {}",
            self.micro_steps_summary(),
            self.accumulation_steps,
            self.world_size,
            self.effective_batch
        )
    }
}

impl fmt::Display for Accumulation {
    /// `micro-batch 67 × 4 accumulation steps × 1 rank = effective batch 268
    /// (target 268, exact)`; where micro-steps differ, `micro-batches 1 × 90 +
    /// 2 × 89 (3 accumulation steps …) × 1 rank = effective batch 268 (target 268, exact)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.equal_micro_batches() {
            return write!(f, "{}{}", self.micro_steps_line(), accumulation_note(self));
        }
        let ranks = if self.world_size == 1 { "rank" } else { "ranks" };
        let steps = if self.accumulation_steps == 1 { "step" } else { "steps" };
        write!(
            f,
            "micro-batch {} × {} accumulation {steps} × {} {ranks} = effective batch {}{}",
            self.micro_batch,
            self.accumulation_steps,
            self.world_size,
            self.effective_batch,
            accumulation_note(self)
        )
    }
}

/// Whether a measured time says anything about a training step: a real
/// step takes microseconds at least (a kernel launch alone does); one under a
/// microsecond ran on a simulated device, whose rate and cost in steps would
/// be artefacts.
fn timed(duration: std::time::Duration) -> bool {
    duration >= std::time::Duration::from_micros(1)
}

fn format_duration(duration: std::time::Duration) -> String {
    if !timed(duration) {
        return "< 1 µs".to_owned();
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_batches_widen_the_column_and_keep_it_aligned() {
        use std::time::Duration;
        let trial = |batch| Trial {
            batch,
            outcome: crate::search::Outcome::Fits,
            peak_bytes: Some(1 << 20),
            duration: Duration::from_millis(1),
            baseline_bytes: 0,
            kind: TrialKind::Search,
            steps: 1,
            peak_kinds: None,
            size: None,
        };
        let width = usize::MAX.to_string().len();
        let header = Trial::table_header_with_width(width);
        for batch in [1, 12_345_678, usize::MAX - 7] {
            let row = trial(batch).table_row_with_width(1, 1 << 30, width);
            assert_eq!(row.find("fits"), header.find("outcome"), "{header}\n{row}");
        }
    }

    #[test]
    fn durations_read_naturally() {
        use std::time::Duration;
        assert_eq!(format_duration(Duration::from_micros(250)), "250 µs");
        assert_eq!(format_duration(Duration::from_micros(12_345)), "12.3 ms");
        assert_eq!(format_duration(Duration::from_millis(2_500)), "2.50 s");
        assert_eq!(format_duration(Duration::from_secs(250)), "250 s");
    }
}
