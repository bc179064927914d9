//! A model's step measured at one batch as the probe measures it (its
//! ceiling, its steps per trial): what the advice and the refusals run for
//! each change they name, and what `--compare` runs for each variant.

use autobatch::MemoryMeter;
use autobatch::estimate::OptimizerKind;
use autobatch_models::trainer::ReferenceWorkload;

use crate::model::ModelConfig;

use super::context::Run;

/// The peak of `config`'s step at `batch` and whether it fits, measured as
/// the probe measures (its ceiling, its steps per trial); `None` where the
/// model cannot be built or the step fails otherwise than by not fitting.
pub(super) fn peak_at(
    run: &Run,
    meter: &mut dyn MemoryMeter,
    config: &ModelConfig,
    mixed: bool,
    optimizer: OptimizerKind,
    batch: usize,
) -> Option<(u64, bool)> {
    let workload = config.build_with(run.device, mixed, optimizer).ok()?;
    let tuner = run.request.search.clone().start(batch).max_batch(batch);
    match tuner.search(&mut ReferenceStep(workload), meter).run() {
        Ok(plan) => Some((plan.peak_bytes(), true)),
        Err(autobatch::Error::NothingFits { peak_bytes: Some(peak), .. }) => Some((peak, false)),
        Err(err) => {
            log::debug!("advice not measured: {err}");
            None
        }
    }
}

/// A reference workload as a plain `Workload` for [`Search::compare`](autobatch::Search::compare).
pub(super) struct ReferenceStep(pub(super) Box<dyn ReferenceWorkload>);

impl autobatch::Workload for ReferenceStep {
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        self.0.step(batch)
    }
    fn accumulating_step(&mut self, batch: usize) -> candle_core::Result<()> {
        self.0.accumulating_step(batch)
    }
    fn can_accumulate(&self) -> bool {
        self.0.can_accumulate()
    }
    fn profile(&self) -> Option<autobatch::estimate::TrainingSetup> {
        self.0.profile()
    }
    fn graph_tensors(&self) -> Option<Vec<autobatch::GraphTensor>> {
        self.0.graph_tensors()
    }
}
