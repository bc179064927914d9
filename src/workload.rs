//! What the tuner runs: one training step at a given batch size.

/// One training step at a given batch size: forward, loss, backward (and the
/// optimizer step, if it should be measured).
///
/// A step must leave the model and optimizer state as it found them ("probing
/// changes nothing"), and must release everything it allocated when it fails.
/// Return the device's out-of-memory error as is (see [`is_oom`](crate::is_oom)):
/// the tuner tells it apart from every other error, which ends the search.
///
/// Closures are workloads:
///
/// ```
/// use autobatch::Workload;
///
/// let mut calls = Vec::new();
/// let mut step = |batch: usize| -> candle_core::Result<()> {
///     calls.push(batch);
///     Ok(())
/// };
/// step.step(8)?;
/// assert_eq!(calls, [8]);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub trait Workload {
    /// Runs one step at `batch` samples.
    fn step(&mut self, batch: usize) -> candle_core::Result<()>;
}

impl<F: FnMut(usize) -> candle_core::Result<()>> Workload for F {
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        self(batch)
    }
}
