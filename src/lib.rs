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
//! accumulation steps. On the CPU, [`HeapMeter`] measures live heap bytes under a
//! budget (install [`TrackingAllocator`]); the reference [`workloads`] probe with
//! the full AdamW step and change no weight.
//!
//! ```
//! #[global_allocator]
//! static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
//!
//! use autobatch::workloads::TransformerConfig;
//! use autobatch::{HeapMeter, Tuner};
//!
//! let mut model = TransformerConfig::tiny().build(&candle_core::Device::Cpu)?;
//! let mut meter = HeapMeter::new(12 << 20)?; // a 12 MiB budget plays device memory
//! let plan = Tuner::new()
//!     .ceiling(0.9)
//!     .target_effective_batch(256)
//!     .run(&mut model, &mut meter)?;
//! println!("{plan}");
//! for _ in 0..3 {
//!     model.train_step_accumulated(plan.micro_batch, plan.accumulation_steps)?;
//! }
//! assert_eq!(plan.micro_batch * plan.accumulation_steps, 256);
//! # Ok::<(), autobatch::Error>(())
//! ```
//!
//! Probe at the longest sequence (largest image) training will see: activation
//! memory per sample grows with it, quadratically in attention.
//!
//! ## From the command line
//!
//! The `autobatch` binary tunes the built-in reference models on the CPU (or a
//! GPU with the `cuda` feature), estimates training memory analytically, and
//! does the accumulation arithmetic:
//!
//! ```text
//! cargo run --release                    # probe a small transformer under a 256 MiB budget
//! autobatch probe --model transformer --seq-len 256 --budget 1GiB --target-effective-batch 1024
//! autobatch estimate --params 7B --optimizer adamw --mixed-precision --capacity 80GB
//! autobatch plan --target 268 --largest 133
//! ```
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
//!
//! ## In a training loop
//!
//! - [`Tuner::cache`] keeps plans keyed by what decides memory ([`CacheKey`]),
//!   so later start-ups skip probing;
//! - [`Guard`] runs each step as micro-batches and halves them on an
//!   out-of-memory error without changing the effective batch or the gradient;
//! - [`Tuner::run_distributed`] makes every rank agree on one batch through a
//!   [`collective::Collective`];
//! - [`Tuner::run_with_eval`] plans the evaluation step's own batch;
//! - [`Headroom`] and [`assert_headroom`] turn memory regressions into failing tests;
//! - [`estimate`] is the analytical model (bytes per parameter) behind
//!   `autobatch estimate` and the advice that comes with [`Error::NothingFits`].
//!
//! On a GPU (feature `cuda`), `CudaMeter` measures candle's CUDA memory pool.

#![warn(missing_docs)]

mod cache;
pub mod collective;
mod error;
pub mod estimate;
mod guard;
mod headroom;
pub mod memory;
pub mod model;
mod oom;
mod plan;
pub mod search;
mod splitmix;
mod tuner;
mod units;
mod workload;
pub mod workloads;

pub use cache::CacheKey;
pub use error::{Error, Result};
pub use guard::{Guard, MicroBatch, StepReport};
pub use headroom::{assert_headroom, Headroom, HeadroomReport};
#[cfg(feature = "cuda")]
pub use memory::CudaMeter;
pub use memory::{HeapMeter, MemoryMeter, TrackingAllocator};
pub use model::{ModelProbe, TrainLoop};
pub use oom::is_oom;
pub use plan::{
    plan_accumulation, plan_accumulation_aligned, Accumulation, EvaluationPlan, MemoryModel, Plan, Trial, TrialKind,
    Warning,
};
pub use search::{LinearFit, Outcome, Strategy};
pub use tuner::{Observer, Tuner};
pub use units::{format_bytes, format_bytes_decimal};
pub use workload::{Profile, Workload};
