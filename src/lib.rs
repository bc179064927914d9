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
//! Your model as you wrote it: a `VarMap` and a loss. [`ModelProbe`] runs
//! forward, backward and the optimizer's update without changing a weight;
//! [`TrainLoop`] trains with the plan's micro-batches and accumulation. On the
//! CPU, [`HeapMeter`] measures live heap bytes under a budget (install
//! [`TrackingAllocator`]); on a GPU, `CudaMeter` (feature `cuda`).
//!
//! ```
//! #[global_allocator]
//! static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
//!
//! use autobatch::{HeapMeter, ModelProbe, TrainLoop, Tuner};
//! use candle_core::{DType, Device, Module, Tensor};
//! use candle_nn::{linear, loss, Optimizer, ParamsAdamW, VarBuilder, VarMap};
//!
//! let varmap = VarMap::new();
//! let model = linear(32, 4, VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
//! let batch_loss = |samples: usize| {
//!     let x = Tensor::ones((samples, 32), DType::F32, &Device::Cpu)?;
//!     loss::cross_entropy(&model.forward(&x)?, &Tensor::zeros(samples, DType::U32, &Device::Cpu)?)
//! };
//! // device memory, played by the heap: 2 MiB under the (default) 90% ceiling beside what the process holds
//! let mut meter = HeapMeter::with_room(2 << 20, 0.9)?;
//! let mut probe = ModelProbe::new(&varmap, batch_loss).adamw(ParamsAdamW::default())?;
//! // a step that leaves a variable without a gradient (candle's fused LayerNorm) is refused:
//! // Error::PartialGraph names the switch to autobatch::models::ops::nn
//! let plan = Tuner::new().max_batch(256).target_effective_batch(512).run(&mut probe, &mut meter)?;
//! drop(probe);
//! println!("{plan}");
//!
//! let optimizer = candle_nn::AdamW::new(varmap.all_vars(), ParamsAdamW::default())?;
//! let mut training = TrainLoop::new(&plan, &varmap, optimizer)?;
//! let report = training.step(&mut meter, |micro| batch_loss(micro.len))?;
//! assert_eq!(report.samples, plan.micro_batch() * plan.accumulation_steps());
//! # Ok::<(), autobatch::Error>(())
//! ```
//!
//! Probe at the longest sequence (largest image) training will see: activation
//! memory per sample grows with it, quadratically in attention. Or probe at
//! several ([`Tuner::run_sizes`] with [`ModelProbe::by_size`]) and get a batch
//! per length bucket, a token budget and a memory model in batch and length
//! ([`SizePlan`]). With mixed GPUs, [`Tuner::uneven_ranks`] gives each rank a
//! share of one exact global batch in proportion to what fits on it.
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
//! autobatch probe --seq-lens 64,128,256   # a batch per sequence length, a token budget
//! autobatch estimate --params 7B --optimizer adamw --mixed-precision --capacity 80GB
//! autobatch plan --target 268 --largest 133
//! autobatch serve --config config.json --max-model-len 4096   # sequences beside their KV caches
//! ```
//!
//! A server asks the same question of inference: [`serve::ServeProbe`]
//! finds how many sequences fit beside their KV caches and the worst step.
//!
//! ## In a headroom regression test
//!
//! Assert that a model keeps its batch with memory to spare, so that a change
//! that grows activations fails CI instead of a training run. On a real model
//! that is [`Headroom::assert`] with a [`HeapMeter`]; the code around the
//! search (a trainer's start-up path, its fallbacks) is tested on a simulated
//! device, `memory::simulated`, with the `simulation` feature turned on
//! where the tests build (`autobatch = { version = "0.1", features =
//! ["simulation"] }` under `[dev-dependencies]`):
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
//! [`Accumulation::plan`] is the arithmetic without a device: the fewest
//! accumulation steps that hit the target exactly (within twice the minimum),
//! otherwise the nearest effective batch above, with the deviation and a
//! learning-rate scaling hint.
//!
//! The reference models of [`models::reference`] (a transformer, an MLP, a convnet)
//! are workloads too, and any closure `FnMut(usize) -> candle_core::Result<()>` is.
//!
//! ## In a training loop
//!
//! - [`Tuner::cache`] keeps plans keyed by what decides memory ([`CacheKey`]),
//!   so later start-ups skip probing;
//! - [`Guard`] runs each step as micro-batches and halves them on an
//!   out-of-memory error without changing the effective batch or the gradient;
//! - [`Tuner::run_distributed`] makes every rank agree on one batch through a
//!   [`collective::Collective`];
//! - [`Tuner::run_with_eval`] plans the evaluation step's own batch, between
//!   training steps (the optimizer's state held) and alone (a separate
//!   evaluation or serving process);
//! - [`Headroom`] (its [`assert`](Headroom::assert) for tests) turns memory regressions into failing tests;
//! - [`estimate`] is the analytical model (bytes per parameter) behind
//!   `autobatch estimate` and the advice that comes with [`Error::NothingFits`].
//!
//! On a GPU (feature `cuda`), `CudaMeter` measures candle's CUDA memory pool.
//!
//! ## Features
//!
//! - `cli` (default): the `autobatch` command-line tool; a library user can
//!   leave it out with `default-features = false`.
//! - `cuda`: candle's CUDA backend and `CudaMeter`. It needs a CUDA toolchain
//!   to build (the repository's `scripts/cuda-toolchain.sh` installs CUDA 13
//!   from NVIDIA's Python wheels), so these docs, built where there is none
//!   (docs.rs), do not show its items.
//! - `nccl`: `collective::NcclCollective`, ranks in separate processes
//!   through NCCL (implies `cuda`; needs libnccl to link).
//! - `simulation`: `memory::simulated`, simulated devices for tests. Turn it
//!   on in `[dev-dependencies]`, as tokio's `test-util` is: tests that build on
//!   it need it, a trainer does not.
//!
//! ## How it is arranged
//!
//! One engine runs every trial: the [`Tuner`] checks its settings once (the
//! ceiling a [`Ceiling`], from `--ceiling` to [`Plan::ceiling`]) and hands
//! them to its engine (warm-up, trials, re-check and plan, or one trial of a
//! kind for the check of a split, of the batch ranks agreed on), which runs a
//! pure search ([`search`]: a history in, the next batch out); the searches a
//! run makes inside itself (ranks, lengths, evaluation) vary those settings
//! and call the engine again, never the public `run`. A [`Plan`] says its split once ([`Split`]: one step,
//! accumulated micro-steps, or uneven ranks' shares), and
//! [`micro_batch`](Plan::micro_batch), [`accumulation_steps`](Plan::accumulation_steps),
//! [`effective_batch`](Plan::effective_batch) read it, as
//! [`capacity_bytes`](Plan::capacity_bytes), [`ceiling`](Plan::ceiling),
//! [`rank`](Plan::rank) and [`tuning_steps`](Plan::tuning_steps) read what
//! was searched, for which rank, and at what cost. Your model and the
//! reference models of [`models::reference`] go through the same two pieces:
//! [`ModelProbe`] measures, [`TrainLoop`] trains, with one optimizer between
//! them ([`optim`]). What a workload says of its model
//! ([`Workload::profile`]) is the analytical model's own
//! [`Setup`](estimate::Setup), so the advice that comes with
//! [`Error::NothingFits`] is computed where every estimate is. Every public
//! item has one path, one type per concept: the root has what most users call; [`search`], [`model`], [`optim`], [`estimate`],
//! `memory::simulated` and [`collective`] hold the rest, and [`models`] the
//! architectures: those built from a `config.json`, the reference models of
//! [`models::reference`] and the differentiable ops of [`models::ops`].
//! An [`Error`] is read by its [`kind`](Error::kind) (fix the request, give
//! it more memory, fix the model, look at the machine); every invalid setting
//! is one variant, [`Error::InvalidSetting`] (the [`Setting`], its [`Value`],
//! what would be valid), and a program that names the settings its own way
//! (the command line's flags) prints the same messages through [`Names`].
//! `memory::simulated` is test support, behind the `simulation` feature:
//! a simulated device (a memory curve, and the ways real devices stray from
//! it: granules, noise, an out-of-memory error below the ceiling, memory
//! another process holds) is how code that depends on the search, a
//! trainer's start-up path or a headroom test as above, is tested without a
//! GPU, and nothing a trainer calls. This crate's own tests and benchmarks
//! use the same API, with the feature turned on by its dev-dependency on
//! itself.

#![warn(missing_docs)]

mod cache;
pub mod collective;
mod error;
pub mod estimate;
mod guard;
mod headroom;
pub mod memory;
pub mod model;
pub mod models;
mod oom;
pub mod optim;
mod plan;
pub mod search;
pub mod serve;
mod splitmix;
mod tuner;
mod units;
mod vocabulary;
mod workload;

pub use cache::CacheKey;
pub use error::{DeviceProblem, Error, ErrorKind, Names, Setting, Value};
pub use guard::{Guard, MicroBatch, StepReport};
pub use headroom::{Headroom, HeadroomReport};
#[cfg(feature = "cuda")]
pub use memory::cuda::CudaMeter;
pub use memory::heap::HeapMeter;
pub use memory::meter::MemoryMeter;
pub use memory::tracking::TrackingAllocator;
pub use model::probe::ModelProbe;
pub use model::train::TrainLoop;
pub use oom::{is_oom, may_be_oom};
pub use plan::{
    Accumulation, Basis, Ceiling, EvaluationPlan, LongestSize, MemoryModel, Objective, PeakKinds, Plan, RankShare,
    RankSplit, SearchLimit, SizeBatch, SizeModel, SizePlan, SizeRange, Split, ThroughputChoice, ThroughputPoint, Trial,
    TrialKind, Warning,
};
pub use search::outcome::Outcome;
pub use search::strategy::Strategy;
pub use tuner::{Compared, Comparison, Observer, Tuner, Variant};
pub use units::Bytes;
pub use workload::{BySize, Resizable, Workload};
