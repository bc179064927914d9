//! # autobatch
//!
//! Finds the largest training batch that fits in accelerator memory under a
//! utilization ceiling, by running real forward/backward steps of a candle
//! model, and turns it into a plan: micro-batch × gradient-accumulation steps ×
//! ranks = the effective batch you asked for.
//!
//! A [`Tuner`] proposes batches with a pure search [`Strategy`], runs each as a
//! trial of your [`Workload`] while a [`MemoryMeter`] measures the device-wide
//! peak, classifies it ([`Outcome::Fits`], [`Outcome::OverCeiling`],
//! [`Outcome::OutOfMemory`]) and stops at the exact largest batch that fits.
//! Every answer was run and seen to fit; when nothing fits you get
//! [`Error::NothingFits`], never a made-up default.
//!
//! ## At trainer start-up
//!
//! Wrap one training step in a closure (or implement [`Workload`]) and run the
//! tuner with the meter of your device; train with the plan's micro-batch and
//! accumulation steps.
//!
//! ```
//! use autobatch::memory::simulated::{MemoryCurve, Simulation};
//! use autobatch::Tuner;
//!
//! # // A simulated 24 GiB device stands in for a real one here.
//! let (mut step, mut meter) = Simulation::new(24 << 30, MemoryCurve::affine(3 << 30, 150 << 20)).build();
//! let plan = Tuner::new()
//!     .ceiling(0.9)
//!     .target_effective_batch(256)
//!     .run(&mut step, &mut meter)?;
//! println!("{plan}");
//! for _optimizer_step in 0..3 {
//!     for _micro_step in 0..plan.accumulation_steps {
//!         // forward + backward on `plan.micro_batch` samples, accumulate gradients
//!     }
//!     // optimizer step
//! }
//! assert_eq!(plan.micro_batch * plan.accumulation_steps, 256);
//! # Ok::<(), autobatch::Error>(())
//! ```
//!
//! ## From the command line
//!
//! The `autobatch` binary tunes built-in reference models (`cargo run --release`
//! runs a small transformer on the CPU under a memory budget). Until it lands,
//! `cargo run --release --example simulated_probe` shows the report.
//!
//! ## In a headroom regression test
//!
//! Assert that a model keeps its batch with memory to spare, so that a change
//! that grows activations fails CI instead of a training run:
//!
//! ```
//! use autobatch::memory::simulated::{MemoryCurve, Simulation};
//! use autobatch::Tuner;
//!
//! let (mut step, mut meter) = Simulation::new(16 << 30, MemoryCurve::affine(2 << 30, 90 << 20)).build();
//! let plan = Tuner::new().ceiling(0.8).max_batch(64).run(&mut step, &mut meter)?;
//! assert_eq!(plan.largest_batch, 64, "batch 64 no longer fits under 80%:\n{plan}");
//! assert!(plan.utilization() < 0.5, "headroom shrank:\n{plan}");
//! # Ok::<(), autobatch::Error>(())
//! ```
//!
//! ## Gradient accumulation alone
//!
//! [`plan_accumulation`] is the arithmetic without a device: the fewest
//! accumulation steps that hit the target exactly (within twice the minimum),
//! otherwise the nearest effective batch above, with the deviation and a
//! learning-rate scaling hint.

#![warn(missing_docs)]

mod bytes;
mod error;
pub mod memory;
mod oom;
mod plan;
pub mod search;
mod tuner;
mod workload;
pub mod workloads;

pub use bytes::format_bytes;
pub use error::Error;
pub use memory::{HeapMeter, MemoryMeter, TrackingAllocator};
pub use oom::is_oom;
pub use plan::{plan_accumulation, plan_accumulation_aligned, Accumulation, Outcome, Plan, Trial, TrialKind, Warning};
pub use search::Strategy;
pub use tuner::Tuner;
pub use workload::Workload;
