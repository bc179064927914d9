//! What one device holds when the training state is split across devices:
//! tensor parallelism splits every parameter `t` ways, and ZeRO (Rajbhandari et
//! al. 2020) partitions, across `N` data-parallel ranks, the optimizer states
//! (stage 1), then the gradients (stage 2), then the weights (stage 3).
//!
//! The ZeRO paper's Figure 1 (Ψ = 7.5B parameters, mixed-precision Adam,
//! N = 64): 120 GB per device without ZeRO; 31.4 GB at stage 1 (4Ψ + 12Ψ/N);
//! 16.6 GB at stage 2 (2Ψ + 14Ψ/N); 1.9 GB at stage 3 (16Ψ/N).
//!
//! ```
//! use autobatch::estimate::{OptimizerKind, Precision, Sharding, StaticMemory};
//!
//! let model = StaticMemory::new(7_500_000_000, Precision::Mixed, OptimizerKind::AdamW)?;
//! let per_device = |stage| model.per_device(&Sharding::zero(stage, 64).unwrap()).total();
//! assert_eq!(
//!     [model.total(), per_device(1), per_device(2), per_device(3)],
//!     [120_000_000_000, 31_406_250_000, 16_640_625_000, 1_875_000_000]
//! );
//! # Ok::<(), autobatch::Error>(())
//! ```

use serde::{Deserialize, Serialize};

use super::StaticMemory;
use crate::Error;

/// How the training state is split across devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sharding {
    /// ZeRO stage: 0 (none), 1 (optimizer states and master weights), 2 (+
    /// gradients), 3 (+ weights).
    pub zero_stage: u8,
    /// Data-parallel ranks the ZeRO partitions are spread over.
    pub data_parallel: u64,
    /// Tensor-parallel degree: each parameter is split this many ways.
    pub tensor_parallel: u64,
}

impl Sharding {
    /// One device holds everything.
    pub const NONE: Sharding = Sharding { zero_stage: 0, data_parallel: 1, tensor_parallel: 1 };

    /// ZeRO `stage` over `ranks` data-parallel ranks, no tensor parallelism.
    pub fn zero(stage: u8, ranks: u64) -> Result<Sharding, Error> {
        Sharding::new(stage, ranks, 1)
    }

    /// Checks and builds a sharding: a stage from 0 to 3, at least one rank
    /// and a tensor-parallel degree of at least 1.
    pub fn new(zero_stage: u8, data_parallel: u64, tensor_parallel: u64) -> Result<Sharding, Error> {
        if zero_stage > 3 {
            return Err(Error::invalid(
                crate::Setting::ZeroStage,
                crate::Value::Count(usize::from(zero_stage)),
                "use 0 (none), 1 (optimizer states), 2 (+ gradients) or 3 (+ weights)",
            ));
        }
        if data_parallel == 0 {
            return Err(Error::zero(crate::Setting::DataParallel));
        }
        if tensor_parallel == 0 {
            return Err(Error::zero(crate::Setting::TensorParallel));
        }
        Ok(Sharding { zero_stage, data_parallel, tensor_parallel })
    }

    /// [`Error::InvalidSetting`] when the devices outnumber the `parameters`
    /// they share: past that, each would hold less than one parameter, and a
    /// per-device figure would be a rounding artefact.
    pub fn check_splits(&self, parameters: u64) -> Result<(), Error> {
        let partitioned = if self.zero_stage > 0 { self.data_parallel } else { 1 };
        let devices = self.tensor_parallel.checked_mul(partitioned);
        if devices.is_none_or(|devices| devices > parameters) {
            // the setting past the parameters on its own, or the larger of the two
            let (setting, value) = if self.tensor_parallel > parameters || partitioned <= self.tensor_parallel {
                (crate::Setting::TensorParallel, self.tensor_parallel)
            } else {
                (crate::Setting::DataParallel, self.data_parallel)
            };
            return Err(Error::invalid(
                setting,
                crate::Value::Count(usize::try_from(value).unwrap_or(usize::MAX)),
                crate::Valid::DevicePerParameter { tensor_parallel: self.tensor_parallel, partitioned, parameters },
            ));
        }
        Ok(())
    }

    /// Bytes of a state one device holds: split `tensor_parallel` ways, then
    /// `data_parallel` ways when `partitioned` (rounded up: a rank holds whole bytes).
    fn share(&self, bytes: u64, partitioned: bool) -> u64 {
        let split = bytes.div_ceil(self.tensor_parallel);
        if partitioned { split.div_ceil(self.data_parallel) } else { split }
    }
}

impl Default for Sharding {
    fn default() -> Self {
        Sharding::NONE
    }
}

impl StaticMemory {
    /// What one device holds under `sharding`. `parameters`, `precision` and
    /// `optimizer` stay those of the whole model.
    pub fn per_device(&self, sharding: &Sharding) -> StaticMemory {
        let stage = sharding.zero_stage;
        StaticMemory {
            weights: sharding.share(self.weights, stage >= 3),
            gradients: sharding.share(self.gradients, stage >= 2),
            optimizer_states: sharding.share(self.optimizer_states, stage >= 1),
            master_weights: sharding.share(self.master_weights, stage >= 1),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::{OptimizerKind, Precision};

    #[test]
    fn reproduces_the_zero_papers_figure_one() {
        let model = StaticMemory::new(7_500_000_000, Precision::Mixed, OptimizerKind::AdamW).unwrap();
        let gb = |stage: u8| model.per_device(&Sharding::zero(stage, 64).unwrap()).total() as f64 / 1e9;
        let rounded = |x: f64| (x * 10.0).round() / 10.0;
        assert_eq!([gb(0), gb(1), gb(2), gb(3)].map(rounded), [120.0, 31.4, 16.6, 1.9]);
    }

    #[test]
    fn tensor_parallelism_splits_everything_first() {
        let model = StaticMemory::new(1_000_000_000, Precision::Fp32, OptimizerKind::AdamW).unwrap();
        let split = model.per_device(&Sharding::new(0, 8, 4).unwrap());
        assert_eq!(split.total(), 4_000_000_000);
        let both = model.per_device(&Sharding::new(3, 8, 4).unwrap());
        assert_eq!(both.total(), 500_000_000);
        assert_eq!(model.per_device(&Sharding::NONE), model);
    }

    #[test]
    fn bad_shardings_are_errors() {
        assert!(matches!(Sharding::new(4, 8, 1), Err(Error::InvalidSetting { .. })));
        assert!(matches!(Sharding::new(1, 0, 1), Err(Error::InvalidSetting { .. })));
        assert!(matches!(Sharding::new(1, 8, 0), Err(Error::InvalidSetting { .. })));
    }
}
