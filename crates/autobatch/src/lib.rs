//! # autobatch
//!
//! The largest training batch that fits in accelerator memory under a
//! utilization ceiling, found by running real forward/backward steps of a
//! candle model, and the plan that follows: micro-batch × gradient-accumulation
//! steps × ranks = the effective batch you asked for.
//!
//! A [`Tuner`] runs your [`Workload`] at batches a pure [`Strategy`](search::Strategy) proposes,
//! while a [`MemoryMeter`] reads each step's peak, and stops at the exact
//! largest batch that fits: every answer was run and seen to fit, the next
//! one up was run and did not. When nothing fits you get
//! [`Error::NothingFits`] with what would make it fit, never a made-up default.
//!
//! ## At trainer start-up
//!
//! Your model as you wrote it: a `VarMap` and a loss. [`ModelProbe`] runs
//! forward, backward and the optimizer's update without changing a weight;
//! [`TrainLoop`] trains with the plan. On the CPU, [`HeapMeter`] measures
//! the heap under a budget (install [`TrackingAllocator`]); on a GPU,
//! `CudaMeter` (feature `cuda`).
//!
//! ```
//! #[global_allocator]
//! static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
//!
//! use autobatch::optim::AdamW;
//! use autobatch::{HeapMeter, MicroBatch, ModelProbe, TrainLoop, Tuner};
//! use candle_core::{DType, Device, Module, Tensor};
//! use candle_nn::{linear, loss, Optimizer, ParamsAdamW, VarBuilder, VarMap};
//!
//! let varmap = VarMap::new();
//! let model = linear(32, 4, VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
//! // the loss of a micro-batch: the probe's at batch n is the first n samples
//! let batch_loss = |batch: MicroBatch| {
//!     let x = Tensor::ones((batch.len, 32), DType::F32, &Device::Cpu)?;
//!     loss::cross_entropy(&model.forward(&x)?, &Tensor::zeros(batch.len, DType::U32, &Device::Cpu)?)
//! };
//! // device memory, played by the heap: 2 MiB for the step under the tuner's ceiling, beside what the process holds
//! let mut meter = HeapMeter::with_room(2 << 20)?;
//! let mut probe = ModelProbe::new(&varmap, batch_loss).optimizer::<AdamW>(ParamsAdamW::default())?;
//! // a step that leaves a variable without a gradient (candle's fused LayerNorm) is refused:
//! // Error::PartialGraph names the variables (autobatch_models::ops has differentiable forms);
//! // the probe frees its optimizer state when the search ends: train beside it
//! let plan = Tuner::new().max_batch(256).target_effective_batch(512).search(&mut probe, &mut meter).run()?;
//! println!("{plan}");
//!
//! let optimizer = AdamW::new(varmap.all_vars(), ParamsAdamW::default())?; // the type the probe measured
//! let mut training = TrainLoop::new(&plan, &varmap, optimizer)?;
//! let report = training.step(&mut meter, batch_loss)?; // the loss the probe measured
//! assert_eq!(report.samples, plan.effective_batch()); // 512, in micro-steps of at most 256
//! # Ok::<(), autobatch::Error>(())
//! ```
//!
//! Probe at the longest input training will see, or at several
//! ([`Search::sizes`]) for a batch per length bucket. [`Tuner::cache`]
//! skips the probe at the next start-up, [`Guard`] halves micro-batches on an
//! out-of-memory error during training, and [`Search::across`] makes
//! ranks agree.
//!
//! ## From the command line
//!
//! The `autobatch` tool (`cargo install autobatch-cli`) probes the reference
//! models and Hugging Face configs, estimates training memory analytically,
//! does the accumulation arithmetic and measures serving capacity:
//!
//! ```text
//! autobatch probe --config config.json --seq-len 2048 --lora 16 --device cuda
//! autobatch estimate --params 7B --optimizer adamw --precision mixed --capacity 80GB
//! autobatch plan --target 268 --largest 133
//! autobatch serve --config config.json --max-model-len 4096
//! ```
//!
//! ## In a headroom regression test
//!
//! Assert that a model keeps its batch with memory to spare, so that a change
//! that grows activations fails CI instead of a training run: on a real model
//! [`Headroom::assert`] with a [`HeapMeter`]; for the code around the search,
//! a simulated device (`memory::simulated`, feature `simulation`, turned on
//! under `[dev-dependencies]`):
//!
//! ```
//! use autobatch::memory::simulated::{MemoryCurve, Simulation};
//! use autobatch::Tuner;
//!
//! let (mut step, mut meter) = Simulation::new(16 << 30, MemoryCurve::affine(2 << 30, 90 << 20)).build();
//! let plan = Tuner::new().ceiling(0.8).max_batch(64).search(&mut step, &mut meter).run()?;
//! assert_eq!(plan.largest_batch(), 64, "batch 64 no longer fits under 80%:\n{plan}");
//! assert!(plan.utilization() < 0.5, "headroom shrank:\n{plan}");
//! # Ok::<(), autobatch::Error>(())
//! ```
//!
//! ## The workspace
//!
//! This crate is what a trainer needs. `autobatch-models` builds Llama,
//! Mistral, Qwen, GPT-2 and BERT from a `config.json` (full, LoRA, QLoRA), their
//! lean attention and loss, and serving over a paged KV cache;
//! `autobatch-cli` is the tool. Features here: `cuda`, `nccl` (ranks as
//! processes), `simulation`. How it is built inside: `docs/design.md`.

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
pub mod optim;
mod per_parameter;
pub mod plan;
pub mod search;
pub mod serve;
mod setting;
#[cfg(feature = "simulation")]
mod splitmix;
mod tuner;
mod units;
mod workload;

pub use cache::CacheKey;
pub use error::{DeviceProblem, Error, ErrorKind, Names, Valid, Value};
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
pub use plan::result::Plan;
pub use setting::Setting;
pub use tuner::{Comparison, ComparisonRow, ModelVariant, Observer, Search, Tuner};
pub use units::Bytes;
pub use workload::{BySize, GraphTensor, Resizable, Workload};
