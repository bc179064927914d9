//! The architectures people fine-tune, built from a Hugging Face
//! `config.json`: Llama (2, 3, 3.1, 3.2, TinyLlama, SmolLM), Mistral, Qwen2,
//! Qwen3, OLMo 2, Gemma 2 and 3, Phi-3, the mixtures of experts Mixtral,
//! Qwen2-MoE and Qwen3-MoE (probed at their worst routing), GPT-2 and BERT
//! (one file each under `families/`), every op differentiable, their tensors named as in
//! the checkpoint (`model.layers.0.self_attn.q_proj.weight`), filled with
//! deterministic values (a step's memory does not depend on them).
//!
//! A [`ConfigModel`] is a user's model for the rest of the crate: a
//! `VarMap` of what trains (every tensor, or with [`Lora`] the adapters
//! alone, the base frozen and kept out of the gradients) and a loss over
//! deterministic token ids, the loss people train it with (next-token cross
//! entropy for the decoders, masked-LM or classification for BERT). Probe it
//! with [`ModelProbe`](autobatch::ModelProbe), train it with
//! [`TrainLoop`](autobatch::TrainLoop), or hand it to
//! [`into_trainer`](ConfigModel::into_trainer) for the reference models' engine
//! (what `autobatch probe --config` runs).
//!
//! Beside them, in their own modules: the [`reference`](mod@reference) models (a small
//! transformer, an MLP and a convnet trained on synthetic data, what the
//! command line's toy sizes, the tests and the benchmarks run) and [`ops`],
//! differentiable forms of the candle ops that cut the graph, and the ops of
//! a frozen base, that these architectures are built from and that a user's
//! own model file can switch to; and [`estimate`], a config's whole step (or
//! N parameters' state) counted without running it, against a device: what
//! `autobatch estimate` prints, as a typed value.
//!
//! ```
//! # #[global_allocator]
//! # static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
//! use autobatch_models::{Config, ConfigModel, Training};
//! use autobatch::{HeapMeter, ModelProbe, Tuner};
//!
//! let config = Config::from_json(r#"{
//!     "model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
//!     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
//!     "tie_word_embeddings": true
//! }"#)?;
//! assert_eq!(config.parameter_count(), 256 * 64 + 2 * (64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 64);
//! let model = ConfigModel::build(&config, &Training::new(32), &candle_core::Device::Cpu)?;
//! let mut probe = ModelProbe::new(model.varmap(), |batch| model.loss(batch.len, 0)).optimizer::<autobatch::optim::AdamW>(Default::default())?;
//! let plan = Tuner::new().max_batch(64).search(&mut probe, &mut HeapMeter::with_room(8 << 20)?).run()?;
//! assert!(plan.largest_batch() >= 1);
//! # Ok::<(), autobatch::Error>(())
//! ```

mod checkpoint;
mod config;
mod config_model;
mod decoder;
mod error;
pub mod estimate;
mod families;
mod family;
mod inference;
mod keys;
mod kv_cache;
mod layers;
mod lora;
mod moe;
pub mod ops;
mod params;
mod per_token;
mod reading;
pub mod reference;
mod serve;
mod serving_bytes;
mod splitmix;
mod step;
mod tensors;
pub mod trainer;
mod training;
mod weights;

pub use config::{
    AttentionBias, BertHead, BlockNorms, Config, ExpertNames, Experts, Gelu, Llama3Rope, MAX_CONFIG_BYTES, QkNorm,
    Rope, RopeScaling, YarnRope,
};
pub use config_model::ConfigModel;
pub use error::{Error, Names, Setting};
pub use family::Family;
pub use inference::{Inference, Serving};
pub use kv_cache::{Chunk, DEFAULT_BLOCK_SIZE, KvCache, SequenceId};
pub use lora::{BaseDtype, Lora, LoraLinear};
pub use serving_bytes::{Moment, ServingBytes, ServingShape};
pub use step::{Compute, LossChunk, StepMemory, StepMoment};
pub use training::{Attention, Loss, Ops, Routing, Training};

pub(crate) use config_model::building;
