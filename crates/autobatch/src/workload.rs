//! What the tuner runs: one training step at a given batch size.

/// One training step at a given batch size: forward, loss, backward (and the
/// optimizer step, if it should be measured).
///
/// A step must leave the model and optimizer state as it found them ("probing
/// changes nothing"), and must release everything it allocated when it fails.
/// Return the device's out-of-memory error as is (see [`is_oom`](crate::is_oom)):
/// the tuner tells it apart from every other error, which ends the search.
///
/// Measure what training will hold: if training accumulates gradients over
/// several micro-steps, the accumulator (one more copy of the gradients) is
/// alive during every micro-step but the first; keep a buffer of that size
/// alive in the probe step too, or the answer can be one gradient copy too big
/// for accumulation.
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

    /// What the model's training state is made of, when the workload knows:
    /// its parameters, precision, optimizer, largest variable and, for a
    /// transformer, its shape, as the analytical model's
    /// [`TrainingSetup`](crate::estimate::TrainingSetup) (the tuner measures the rest). It
    /// lets the tuner say what would make the model fit when nothing does.
    /// `None` by default (closures); see also
    /// [`Tuner::profile`](crate::Tuner::profile).
    ///
    /// ```
    /// use autobatch::estimate::{OptimizerKind, Precision, Recompute, TrainingSetup, TransformerShape};
    ///
    /// let shape = TransformerShape { layers: 12, hidden: 768, heads: 12, seq_len: 1024, batch: 1 };
    /// let profile = TrainingSetup::new(124_000_000, Precision::Fp32, OptimizerKind::AdamW)
    ///     .largest_variable(38_597_376)
    ///     .transformer(shape, Recompute::None)?;
    /// assert_eq!(profile.transformer, Some(shape));
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    fn profile(&self) -> Option<crate::estimate::TrainingSetup> {
        None
    }

    /// What decides this workload's memory, for the plan cache (see
    /// [`Tuner::cache`](crate::Tuner::cache)). `None` by default.
    fn cache_key(&self) -> Option<crate::CacheKey> {
        None
    }

    /// One micro-step of gradient accumulation at `batch`, as training runs
    /// every micro-step after the first: the step of [`step`](Self::step) with
    /// an accumulator of the variables' gradients held throughout, the new
    /// gradients added to it, and the optimizer's update computed from it.
    /// The tuner verifies a plan with accumulation through it and steps the
    /// micro-batch down until it fits, when [`can_accumulate`](Self::can_accumulate)
    /// says the workload implements it. The default runs [`step`](Self::step).
    fn accumulating_step(&mut self, batch: usize) -> candle_core::Result<()> {
        self.step(batch)
    }

    /// Whether [`accumulating_step`](Self::accumulating_step) holds an
    /// accumulator (false by default, e.g. for closures): without it a plan
    /// that accumulates is not verified with the accumulator held.
    fn can_accumulate(&self) -> bool {
        false
    }

    /// What the workload noticed while it ran that the plan should say, e.g.
    /// variables that received no gradient. Asked once, after the search.
    fn diagnose(&mut self) -> Vec<crate::plan::Warning> {
        Vec::new()
    }

    /// The tensors of the last step's graph, each as its element count and
    /// dtype ([`GraphTensor`]), in the order the graph sorts
    /// them (the same for every batch of one model): what lets
    /// the tuner keep every tensor under a device's element limit
    /// ([`Tuner::element_limit`](crate::Tuner::element_limit)) and bound the
    /// allocation an out-of-memory step failed at by the step's largest
    /// tensor. `None` by default (a closure's graph is not seen).
    fn graph_tensors(&self) -> Option<Vec<GraphTensor>> {
        None
    }

    /// Tuning is over (the tuner's last call, whatever the outcome): release
    /// state kept between steps. Nothing by default.
    fn tuning_finished(&mut self) {}

    /// Switches the step's update to a leaner form that computes the same
    /// numbers (`leaner`: `candle_nn::AdamW` to `autobatch::optim::AdamW`) or
    /// back, naming both (`(from, to)`); `None` where there is none (the
    /// default). The tuner runs one step of the leaner form at the answer, for
    /// the plan to say what switching saves, measured.
    fn switch_update(&mut self, leaner: bool) -> Option<(String, String)> {
        let _ = leaner;
        None
    }

    /// Frees the state the workload holds between steps for training only
    /// (the optimizer's: AdamW's moments), building it again at its next
    /// step; returns the bytes it expects to have freed, 0 when it holds none
    /// it can free (the default). [`Search::evaluating`](crate::Search::evaluating)
    /// calls it to measure evaluation alone, as a separate evaluation or
    /// serving process runs it; every search calls it when it ends, so that
    /// a probe kept alive holds no state beside the training that follows.
    fn free_training_state(&mut self) -> u64 {
        0
    }
}

/// A workload whose memory depends on an input size (a sequence length, an
/// image side) as well as on the batch: what
/// [`Search::sizes`](crate::Search::sizes) tunes at several sizes.
///
/// [`resize`](Self::resize) sets the size the following steps run at; the
/// workload's [`cache_key`](Workload::cache_key) should tell sizes apart (the
/// tuner adds the size to the key too). Closures `|batch, size|` become one
/// with [`BySize::new`].
pub trait Resizable: Workload {
    /// Runs the following steps at `size`; an error when the workload cannot.
    fn resize(&mut self, size: usize) -> Result<(), crate::Error>;

    /// The size steps run at now.
    fn size(&self) -> usize;
}

/// A closure of the batch and an input size, run at a size that can change:
/// a [`Resizable`] workload ([`BySize::new`]), or the loss of a probe
/// ([`ModelProbe::by_size`](crate::ModelProbe::by_size), its closure
/// returning the loss or the loss and its gradients).
pub struct BySize<F> {
    pub(crate) closure: F,
    /// The size the closure runs at now.
    pub(crate) size: usize,
}

impl<F: FnMut(usize, usize) -> candle_core::Result<()>> BySize<F> {
    /// A closure `|batch, size|` as a [`Resizable`] workload, starting at `size`.
    ///
    /// ```
    /// use autobatch::{BySize, Resizable, Workload};
    ///
    /// let mut steps = Vec::new();
    /// let mut workload = BySize::new(8, |batch, len| {
    ///     steps.push((batch, len));
    ///     Ok(())
    /// });
    /// workload.resize(32)?;
    /// workload.step(4)?;
    /// drop(workload);
    /// assert_eq!(steps, [(4, 32)]);
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn new(size: usize, step: F) -> BySize<F> {
        BySize { closure: step, size }
    }
}

impl<F: FnMut(usize, usize) -> candle_core::Result<()>> Workload for BySize<F> {
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        (self.closure)(batch, self.size)
    }
}

impl<F: FnMut(usize, usize) -> candle_core::Result<()>> Resizable for BySize<F> {
    fn resize(&mut self, size: usize) -> Result<(), crate::Error> {
        self.size = size;
        Ok(())
    }

    fn size(&self) -> usize {
        self.size
    }
}

impl<F> std::fmt::Debug for BySize<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BySize").field("size", &self.size).finish_non_exhaustive()
    }
}

impl<F: FnMut(usize) -> candle_core::Result<()>> Workload for F {
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        self(batch)
    }
}

/// One tensor of a step's graph, as a device's limits see it: how many
/// elements, of which dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphTensor {
    /// Its element count.
    pub elements: u64,
    /// Its dtype.
    pub dtype: candle_core::DType,
}

impl GraphTensor {
    /// The bytes it takes: its elements times its dtype's size.
    pub fn bytes(&self) -> u64 {
        self.elements.saturating_mul(self.dtype.size_in_bytes() as u64)
    }
}
