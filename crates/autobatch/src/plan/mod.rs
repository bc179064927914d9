//! What a tuning run produces: the [`Plan`] (at the crate root) and
//! its parts, read through its accessors: the [`Split`] of the effective
//! batch ([`Accumulation`], or a [`RankSplit`] over uneven ranks), the
//! [`Trial`]s, the [`Warning`]s, the [`SearchLimit`] that stopped it, the
//! [`MemoryModel`] fitted to the trials, a batch per length
//! ([`SizePlan`]), the [`EvaluationPlan`], the throughput curve
//! ([`ThroughputChoice`]), a batch checked ([`BatchCheck`]); and the
//! [`Ceiling`] and [`Objective`] a tuner is given.

mod accumulation;
mod ceiling;
mod check;
mod longest;
mod memory_model;
mod ranks;
mod record;
mod report;
pub(crate) mod result;
mod search_limit;
mod sizes;
mod split;
mod throughput;
mod trial;
mod warning;

pub use accumulation::Accumulation;
pub use ceiling::Ceiling;
pub(crate) use ceiling::utilization;
pub use check::BatchCheck;
pub use longest::{LongestSize, SizeRange};
pub use memory_model::{MemoryModel, Phase};
pub use ranks::{RankShare, RankSplit};
pub use result::EvaluationPlan;
pub(crate) use result::{Distributed, Plan, SearchSettings, TuningCost};
pub use search_limit::SearchLimit;
pub use sizes::{BatchSource, SizeBatch, SizeModel, SizePlan};
pub use split::Split;
pub use throughput::{Objective, ThroughputChoice, ThroughputPoint};
pub use trial::{PeakKinds, Trial, TrialKind};
pub use warning::Warning;
pub(crate) use warning::{MeasuredGraph, as_measured_graph};

/// Durations as fractional seconds in JSON.
mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(duration.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(deserializer)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
    }
}
