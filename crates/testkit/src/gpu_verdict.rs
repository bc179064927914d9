//! The GPU check's verdict for one size, from what it measured: kept free of
//! CUDA so that `crates/models/tests/measured/gpu_verdict.rs` checks it on the
//! CPU, and here so that the check (`crates/models/examples/gpu_check`) and its
//! test share it without reaching into each other's folders.

use serde::Serialize;

/// How the step one granule above the found batch ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Next {
    /// It ran and its binding peak stayed under the limit: the found batch
    /// was not the largest.
    Fits { peak_bytes: u64 },
    /// It ran and went over the limit.
    OverCeiling { peak_bytes: u64 },
    /// The device ran out of memory.
    OutOfMemory,
    /// Another error.
    Error { message: String },
    /// Not run: it would run a tensor past the elements candle's kernels
    /// count (the search stopped below it, `tensor_elements`).
    PastElementLimit,
}

/// What one size's check measured.
#[derive(Clone, Debug, Serialize)]
pub struct Evidence {
    /// The found batch.
    pub largest_batch: usize,
    /// Whether the search proved it the largest (else why not, in words).
    pub proven_largest: bool,
    pub stopped_by: Option<String>,
    /// The limit, ceiling × capacity.
    pub limit_bytes: u64,
    /// The found batch's peaks in a fresh step: pool used, pool reserved,
    /// device-wide after the step.
    pub used_bytes: u64,
    pub reserved_bytes: u64,
    pub device_bytes: u64,
    /// The step one granule above.
    pub next: Next,
    /// Whether an out-of-memory error could be forced, and whether a step at
    /// the found batch ran after it.
    pub oom_forced: bool,
    pub healthy_after_oom: bool,
    /// Whether the meter checked that its pool sees allocations (it refuses
    /// to start otherwise).
    pub pool_checked: bool,
}

/// Pass or fail, and every reason.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    pub pass: bool,
    /// Why it failed, or what was not judged.
    pub notes: Vec<String>,
}

/// How far a re-measured peak may land from the limit and still be judged
/// as the search judged it: the larger of 2 MiB (the CUDA pool reserves in
/// 2 MiB granules, and a fresh step's reserved and device-wide bytes move by
/// about one) and 0.2% of the limit. A found batch a little over it, or the
/// next batch a little under it, is a note, not a failure.
pub fn tolerance(limit_bytes: u64) -> u64 {
    (2 << 20).max(limit_bytes / 500)
}

/// Passes when the found batch fits by every peak, the next one does not
/// (judged only when the search proved it), the context survived a forced
/// out-of-memory error, and the meter checked its pool; at the limit, within
/// [`tolerance`], a peak is noted rather than judged.
pub fn verdict(e: &Evidence) -> Verdict {
    let mut failures = Vec::new();
    let mut notes = Vec::new();
    let slack = tolerance(e.limit_bytes);
    for (name, bytes) in [("used", e.used_bytes), ("reserved", e.reserved_bytes), ("device-wide", e.device_bytes)] {
        if bytes > e.limit_bytes.saturating_add(slack) {
            failures.push(format!(
                "batch {} peaks at {bytes} {name} bytes, over the limit of {}",
                e.largest_batch, e.limit_bytes
            ));
        } else if bytes > e.limit_bytes {
            notes.push(format!(
                "batch {} peaks at {bytes} {name} bytes, {} over the limit of {}: within the tolerance of {slack}",
                e.largest_batch,
                bytes - e.limit_bytes,
                e.limit_bytes
            ));
        }
    }
    let next = e.largest_batch + 1;
    match (&e.next, e.proven_largest) {
        (Next::Error { message }, _) => failures.push(format!("batch {next} failed: {message}")),
        (Next::Fits { peak_bytes }, true) if peak_bytes.saturating_add(slack) >= e.limit_bytes => notes.push(format!(
            "batch {next} fits at {peak_bytes} bytes, within the tolerance of {slack} under the limit of {}: not judged",
            e.limit_bytes
        )),
        (Next::Fits { peak_bytes }, true) => failures.push(format!(
            "batch {next} fits ({peak_bytes} bytes under {}): the proven answer is not the largest",
            e.limit_bytes
        )),
        (Next::Fits { .. }, false) => notes.push(format!(
            "batch {next} fits, as it may: the search did not prove {} the largest ({})",
            e.largest_batch,
            e.stopped_by.as_deref().unwrap_or("no reason given")
        )),
        (Next::OverCeiling { .. } | Next::OutOfMemory, _) => {}
        (Next::PastElementLimit, _) => notes.push(format!(
            "batch {next} not run: a tensor past the elements candle's kernels count ({})",
            e.stopped_by.as_deref().unwrap_or("no reason given")
        )),
    }
    match (e.oom_forced, e.healthy_after_oom) {
        (true, false) => failures.push("the context failed a step after the forced out-of-memory error".to_owned()),
        (false, _) => {
            notes.push("no out-of-memory error could be forced: context health after one not judged".to_owned())
        }
        (true, true) => {}
    }
    if !e.pool_checked {
        failures.push("the meter did not check that its pool sees allocations".to_owned());
    }
    let pass = failures.is_empty();
    failures.extend(notes);
    Verdict { pass, notes: failures }
}
