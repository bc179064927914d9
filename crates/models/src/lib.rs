//! The architectures people fine-tune, built from a Hugging Face
//! `config.json`: Llama (2, 3, 3.1, 3.2, TinyLlama, SmolLM), Mistral, Qwen2,
//! Qwen3, GPT-2 and BERT, every op differentiable, their tensors named as in
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
//! own model file can switch to.
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
//! let mut probe = ModelProbe::new(model.varmap(), |batch| model.loss(batch, 0)).adamw(Default::default())?;
//! let plan = Tuner::new().max_batch(64).run(&mut probe, &mut HeapMeter::with_room(8 << 20, 0.9)?)?;
//! assert!(plan.largest_batch >= 1);
//! # Ok::<(), autobatch::Error>(())
//! ```

mod bert;
mod checkpoint;
mod config;
mod decoder;
mod error;
mod family;
mod gpt2;
mod inference;
mod keys;
mod kv_cache;
mod layers;
mod lora;
pub mod ops;
mod params;
pub mod reference;
mod serve;
mod serving_bytes;
mod splitmix;
mod step;
pub mod trainer;
mod weights;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarMap;

pub use config::{AttentionBias, BertHead, Config, Gelu, Llama3Rope, MAX_CONFIG_BYTES, Rope, RopeScaling, YarnRope};
pub use error::{Error, Setting};
pub use family::Family;
pub use inference::{Inference, Serving};
pub use kv_cache::{Chunk, DEFAULT_BLOCK_SIZE, KvCache, SequenceId};
pub use lora::{BaseDtype, Lora, LoraLinear};
pub use serving_bytes::{Moment, ServingBytes, ServingShape};
pub use step::{Compute, LossChunk, StepMemory, StepMoment};

use crate::splitmix::Rng;
use crate::trainer::{Footprint, Model, Trainer};
use ops::ChunkedCrossEntropy;
use weights::{Init, TensorSpec, Weights};

/// An error met building a model: candle's own is the model's
/// ([`autobatch::Error::ModelBuild`]), the rest as they are.
pub(crate) fn building(err: Error) -> Error {
    match err {
        Error::Core(autobatch::Error::Candle(source)) => autobatch::Error::ModelBuild(source).into(),
        other => other,
    }
}

/// How a config model computes attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Attention {
    /// In blocks with an online softmax, the scores recomputed block by
    /// block in the backward pass ([`ops::BlockedAttention`]): nothing of
    /// `b × heads × s × s` kept, as transformers' SDPA and FlashAttention-2.
    #[default]
    Blocked,
    /// The scores and their softmax made whole and kept for the backward
    /// pass, as transformers' `attn_implementation="eager"`.
    Eager,
}

impl Attention {
    /// Both ways, in the order the command line lists them.
    pub const ALL: [Attention; 2] = [Attention::Blocked, Attention::Eager];

    /// The name used on the command line: `blocked`, `eager`.
    pub fn name(self) -> &'static str {
        match self {
            Attention::Blocked => "blocked",
            Attention::Eager => "eager",
        }
    }
}

/// How a config model computes its head and loss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Loss {
    /// The head and the cross entropy fused in chunks of rows, the
    /// gradients computed chunk by chunk ([`ops::ChunkedCrossEntropy`]):
    /// the logits never whole, as Liger Kernel's fused loss.
    #[default]
    Chunked,
    /// The logits of every position made whole (and their f32 copy, their
    /// log-softmax, their gradients), as `cross_entropy(logits, targets)`.
    Full,
}

impl Loss {
    /// Both ways, in the order the command line lists them.
    pub const ALL: [Loss; 2] = [Loss::Chunked, Loss::Full];

    /// The name used on the command line: `chunked`, `full`.
    pub fn name(self) -> &'static str {
        match self {
            Loss::Chunked => "chunked",
            Loss::Full => "full",
        }
    }
}

/// How a config model computes its norms, rotary positions, MLP
/// activations and projections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Ops {
    /// Each one node of candle's graph that keeps its inputs and output and
    /// recomputes the rest in its backward pass ([`ops`]' fused ops): what
    /// PyTorch's autograd keeps, or less.
    #[default]
    Fused,
    /// Each written as candle's differentiable ops ([`ops::eager`]): the
    /// graph keeps every intermediate until the loss is dropped.
    Eager,
}

impl Ops {
    /// Both ways, in the order the command line lists them.
    pub const ALL: [Ops; 2] = [Ops::Fused, Ops::Eager];

    /// The name used on the command line: `fused`, `eager`.
    pub fn name(self) -> &'static str {
        match self {
            Ops::Fused => "fused",
            Ops::Eager => "eager",
        }
    }
}

/// How a model is trained: the sequence length, the dtype, full fine-tuning
/// or LoRA, the seed of its weights and data, how attention, the loss and
/// the other ops are computed.
#[derive(Clone, Debug, PartialEq)]
pub struct Training {
    /// Tokens per sample: probe at the longest training will see.
    pub seq_len: usize,
    /// The dtype of weights, gradients and activations; `None`: the config's
    /// `torch_dtype` (f16 is trained in bf16).
    pub dtype: Option<DType>,
    /// LoRA adapters, the base frozen; `None`: every tensor trains.
    pub lora: Option<Lora>,
    /// The seed of the weights and the token ids.
    pub seed: u64,
    /// Gradient checkpointing per layer: only each layer's input is kept,
    /// and each layer runs again in the backward pass (decoders and GPT-2).
    pub checkpointing: bool,
    /// How attention is computed (blocked by default).
    pub attention: Attention,
    /// How the head and the loss are computed (chunked by default).
    pub loss: Loss,
    /// How norms, rotary positions, activations and projections are computed (fused by default).
    pub ops: Ops,
}

impl Training {
    /// Full fine-tuning at `seq_len` tokens, in the config's dtype.
    pub fn new(seq_len: usize) -> Training {
        Training {
            seq_len,
            dtype: None,
            lora: None,
            seed: 0,
            checkpointing: false,
            attention: Attention::Blocked,
            loss: Loss::Chunked,
            ops: Ops::Fused,
        }
    }

    /// With attention computed as `attention` says.
    pub fn attention(mut self, attention: Attention) -> Training {
        self.attention = attention;
        self
    }

    /// With the head and the loss computed as `loss` says.
    pub fn loss(mut self, loss: Loss) -> Training {
        self.loss = loss;
        self
    }

    /// With norms, rotary positions, activations and projections computed as `ops` says.
    pub fn ops(mut self, ops: Ops) -> Training {
        self.ops = ops;
        self
    }

    /// With LoRA adapters.
    pub fn lora(mut self, lora: Lora) -> Training {
        self.lora = Some(lora);
        self
    }

    /// In `dtype` (f32 or bf16).
    pub fn dtype(mut self, dtype: DType) -> Training {
        self.dtype = Some(dtype);
        self
    }

    /// With gradient checkpointing per layer.
    pub fn checkpointing(mut self) -> Training {
        self.checkpointing = true;
        self
    }
}

impl Config {
    /// The checkpoint's tensors, names and shapes, as [`ConfigModel::build`] makes them.
    fn tensors(&self) -> Vec<TensorSpec> {
        match self.family {
            Family::Gpt2 => gpt2::tensors(self),
            Family::Bert => bert::tensors(self),
            _ => decoder::tensors(self),
        }
    }

    /// The start of layer `index`'s tensor names.
    fn layer_prefix(&self, index: usize) -> String {
        match self.family {
            Family::Gpt2 => format!("h.{index}."),
            Family::Bert => format!("bert.encoder.layer.{index}."),
            _ => format!("model.layers.{index}."),
        }
    }

    /// The elements of `specs` outside the layers and in one layer (every
    /// layer is alike), listed for a one-layer copy: counted without a list
    /// as long as the layers, every product checked.
    fn split_counts(&self, specs: impl Fn(&Config) -> Vec<TensorSpec>) -> Option<(u64, u64)> {
        let one = Config { layers: 1, ..self.clone() };
        let prefix = self.layer_prefix(0);
        let (mut outside, mut layer) = (0u64, 0u64);
        for spec in specs(&one) {
            let elements = spec.elements()?;
            if spec.name.starts_with(&prefix) {
                layer = layer.checked_add(elements)?;
            } else {
                outside = outside.checked_add(elements)?;
            }
        }
        Some((outside, layer))
    }

    /// `outside + layers × layer`, checked.
    fn over_layers(&self, (outside, layer): (u64, u64)) -> Option<u64> {
        layer.checked_mul(self.layers as u64)?.checked_add(outside)
    }

    /// The model's parameters, counted from the config without allocating:
    /// every tensor of the checkpoint once (a tied head is the embedding), as
    /// transformers' `num_parameters()` counts them; `u64::MAX` for a config
    /// past 64 bits (see [`checked_parameter_count`](Self::checked_parameter_count)).
    ///
    /// ```
    /// let gpt2 = autobatch_models::Config::from_json(
    ///     r#"{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024}"#,
    /// )?;
    /// assert_eq!(gpt2.parameter_count(), 124_439_808);
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn parameter_count(&self) -> u64 {
        count_parameters(self).unwrap_or(u64::MAX)
    }

    /// The projections LoRA can adapt: checkpoint names with (out, in).
    fn projections(&self) -> Vec<(String, usize, usize)> {
        match self.family {
            Family::Gpt2 => gpt2::projections(self),
            Family::Bert => bert::projections(self),
            _ => decoder::projections(self),
        }
    }

    /// The projections of one layer (every layer has the same).
    fn layer_projections(&self) -> Vec<(String, usize, usize)> {
        Config { layers: 1, ..self.clone() }.projections()
    }

    /// Tensors transformers keeps in the model and never uses (an untied
    /// BERT head's `cls.predictions.bias`): counted and loaded, never trained.
    fn unused_tensors(&self) -> Vec<&'static str> {
        match (self.family, self.bert_head, self.tie_embeddings) {
            (Family::Bert, BertHead::MaskedLm, false) => vec!["cls.predictions.bias"],
            _ => Vec::new(),
        }
    }

    /// The module names LoRA can target in this family.
    pub fn lora_modules(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for (name, _, _) in self.layer_projections() {
            let module = name.rsplit('.').next().unwrap_or(&name).to_owned();
            if !names.contains(&module) {
                names.push(module);
            }
        }
        names
    }

    /// The adapters `lora` adds: `{module}.lora_A.weight` `(r, in)` and
    /// `{module}.lora_B.weight` `(out, r)` for each module it targets.
    fn adapters(&self, lora: &Lora) -> Result<Vec<TensorSpec>, Error> {
        self.check_lora(lora)?;
        Ok(self.adapter_specs(lora))
    }

    fn adapter_specs(&self, lora: &Lora) -> Vec<TensorSpec> {
        let mut specs = Vec::new();
        for (name, out, input) in self.projections().into_iter().filter(|(name, _, _)| lora.targets(name)) {
            let std = 1.0 / (input as f32).sqrt();
            specs.push(TensorSpec::new(format!("{name}.lora_A.weight"), &[lora.rank, input], Init::Normal(std)));
            specs.push(TensorSpec::new(format!("{name}.lora_B.weight"), &[out, lora.rank], Init::Zeros));
        }
        specs
    }

    /// A rank of at least 1 and targets that are modules of this family.
    fn check_lora(&self, lora: &Lora) -> Result<(), Error> {
        if lora.rank == 0 {
            return Err(Error::zero(crate::Setting::LoraRank));
        }
        let valid = self.lora_modules();
        if let Some(unknown) = lora.targets.iter().find(|target| !valid.contains(target)) {
            return Err(Error::invalid(
                crate::Setting::LoraTargets,
                autobatch::Value::Text(unknown.clone()),
                format!("use modules of a {} layer: {}", self.family.model_type(), valid.join(", ")),
            ));
        }
        if lora.targets.is_empty() {
            return Err(Error::invalid(
                crate::Setting::LoraTargets,
                autobatch::Value::Missing,
                format!("use one or more of {}", valid.join(", ")),
            ));
        }
        let twice = lora
            .targets
            .iter()
            .enumerate()
            .find_map(|(i, target)| lora.targets[..i].contains(target).then_some(target));
        if let Some(twice) = twice {
            return Err(Error::invalid(
                crate::Setting::LoraTargets,
                autobatch::Value::Text(lora.targets.join(",")),
                format!("name each module once ({twice} is given twice)"),
            ));
        }
        Ok(())
    }

    /// The adapters' elements, counted without a per-layer list.
    fn adapter_count(&self, lora: &Lora) -> Result<Option<u64>, Error> {
        self.check_lora(lora)?;
        Ok(self.split_counts(|one| one.adapter_specs(lora)).and_then(|counts| self.over_layers(counts)))
    }

    /// What a step of this model surely needs on the CPU, from the config
    /// alone: the weights, and for what trains its gradient and two AdamW
    /// moments; beside them 85% of the step's widest moment at one sample
    /// (less a sample's least bytes) and of its least bytes a sample ([`step_memory`](Self::step_memory), which
    /// holds within 15% of the measured step on the reference configs), so
    /// that `fixed + batch × per sample` stays under what any batch holds.
    /// What decides, before anything is allocated, that not even the first
    /// batch fits. Every product is checked.
    pub fn footprint(&self, training: &Training) -> Result<Footprint, Error> {
        let model_dtype = self.model_dtype(training)?;
        let dtype = model_dtype.size_in_bytes() as u64;
        let overflow = || Error::byte_overflow(format!("the tensors of {}", self.describe(training)));
        let base = self.checked_parameter_count()?;
        let (trained, fixed) = match &training.lora {
            Some(lora) => {
                let adapters = self.adapter_count(lora)?.ok_or_else(overflow)?;
                let adapter_bytes = lora.adapter_dtype(model_dtype).size_in_bytes() as u64;
                let frozen = self.frozen_bytes(training)?;
                let fixed = adapters.checked_mul(4 * adapter_bytes).and_then(|a| a.checked_add(frozen));
                (adapters, fixed.ok_or_else(overflow)?)
            }
            None => (base, base.checked_mul(4 * dtype).ok_or_else(overflow)?),
        };
        let step = self.step_memory(training, Compute::Cpu)?;
        let gradients = match &training.lora {
            Some(_) => 0,
            None => base.checked_mul(dtype).ok_or_else(overflow)?,
        };
        // the state above counts the gradients: the moments before them hold the
        // rest. Every moment grows by at least the least bytes a sample, so the
        // widest at one sample plus that many a sample more bounds every batch
        let least_per_sample = step.moments.iter().map(|moment| moment.bytes_per_sample).min().unwrap_or(0);
        let widest = step.peak_bytes(gradients, 1)?.saturating_sub(gradients).saturating_sub(least_per_sample);
        let lower = |bytes: u64| bytes / 20 * 17;
        Ok(Footprint {
            model: self.describe(training),
            parameters: trained,
            fixed_bytes: fixed.checked_add(lower(widest)).ok_or_else(overflow)?,
            min_bytes_per_sample: lower(least_per_sample),
        })
    }

    /// The bytes of a LoRA model's frozen base, from the config alone: its
    /// weights without gradients or moments, a quantized base's projections
    /// in whole blocks plus the one weight a product dequantizes at a time;
    /// 0 without LoRA (every weight trains).
    ///
    /// ```
    /// use autobatch_models::{BaseDtype, Config, Lora, Training};
    /// let config = Config::from_json(r#"{"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
    ///     "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}"#)?;
    /// let lora = |base| Training::new(32).dtype(candle_core::DType::F32).lora(Lora::new(8, &["q_proj"]).base(base));
    /// let f32_base = config.frozen_bytes(&lora(BaseDtype::F32))?;
    /// assert_eq!(f32_base, config.parameter_count() * 4);
    /// assert!(config.frozen_bytes(&lora(BaseDtype::Q4_0))? < f32_base / 2);
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn frozen_bytes(&self, training: &Training) -> Result<u64, Error> {
        let Some(lora) = &training.lora else { return Ok(0) };
        let dtype = self.model_dtype(training)?.size_in_bytes() as u64;
        let base = self.checked_parameter_count()?;
        let overflow = || Error::byte_overflow(format!("the frozen base of {}", self.describe(training)));
        let Some(quantized) = lora.base.and_then(BaseDtype::quantized) else {
            return base.checked_mul(dtype).ok_or_else(overflow);
        };
        let sizes: Vec<u64> =
            self.layer_projections().iter().map(|(_, out, input)| *out as u64 * *input as u64).collect();
        let largest = sizes.iter().copied().max().unwrap_or(0);
        let projections = sizes.iter().sum::<u64>().checked_mul(self.layers as u64).ok_or_else(overflow)?;
        // whole blocks, and the one weight a product dequantizes (f32, then the model's dtype)
        let dequantized = if dtype == 4 { 4 } else { 4 + dtype };
        (projections / quantized.block_size() as u64)
            .checked_mul(quantized.type_size() as u64)
            .and_then(|bytes| (base - projections).checked_mul(dtype)?.checked_add(bytes))
            .and_then(|bytes| largest.checked_mul(dequantized)?.checked_add(bytes))
            .ok_or_else(overflow)
    }

    /// The dtype of the model's weights and activations: a float LoRA
    /// base's, else `training.dtype`, else the config's `torch_dtype`.
    /// Refused: a float base of another dtype than `training.dtype` asks
    /// for, a quantized base over projections whose inputs are not whole
    /// blocks, candle's frozen gradients kept over a quantized base.
    pub fn model_dtype(&self, training: &Training) -> Result<DType, Error> {
        let asked = training.dtype.unwrap_or(self.dtype);
        let Some(lora) = &training.lora else { return Ok(asked) };
        let Some(base) = lora.base else { return Ok(asked) };
        let refused = |valid: String| {
            Error::invalid(
                crate::Setting::BaseDtype,
                autobatch::Value::Text(base.name().into()),
                format!("use {valid}"),
            )
        };
        if let Some(float) = base.float() {
            return match training.dtype {
                Some(dtype) if dtype != float => Err(refused(format!(
                    "{} to match the model's dtype {} (a float base is the model's dtype), or q8_0 or q4_0",
                    match dtype {
                        DType::F32 => "f32",
                        _ => "bf16",
                    },
                    dtype.as_str()
                ))),
                _ => Ok(float),
            };
        }
        if lora.frozen_gradients {
            return Err(refused("f32 or bf16 to keep candle's gradients of the frozen weights".into()));
        }
        let block = base.quantized().map_or(1, |quantized| quantized.block_size());
        if let Some((name, _, input)) = self.layer_projections().into_iter().find(|(_, _, input)| input % block != 0) {
            return Err(refused(format!(
                "f32 or bf16 here: {name} takes {input} features, not a multiple of {block}, the block of {base}"
            )));
        }
        Ok(asked)
    }

    /// `llama(vocab 128256, hidden 2048, layers 16, heads 32/8, seq-len 512, bf16, LoRA r 8 on q_proj,v_proj)`.
    pub fn describe(&self, training: &Training) -> String {
        let dtype = self.model_dtype(training).unwrap_or(training.dtype.unwrap_or(self.dtype));
        let heads = if self.kv_heads == self.heads {
            self.heads.to_string()
        } else {
            format!("{}/{}", self.heads, self.kv_heads)
        };
        let lora = match &training.lora {
            Some(lora) => {
                let base = match lora.base {
                    Some(base) => format!(", {base} base"),
                    None => String::new(),
                };
                let kept = if lora.frozen_gradients { ", frozen gradients kept" } else { "" };
                format!(", LoRA r {} on {}{base}{kept}", lora.rank, lora.targets.join(","))
            }
            None => String::new(),
        };
        let checkpointing = if training.checkpointing { ", checkpointed" } else { "" };
        // the lean step is the default: the eager forms are named
        let mut step = String::new();
        if training.attention == Attention::Eager {
            step += ", eager attention";
        }
        if training.loss == Loss::Full {
            step += ", full loss";
        }
        if training.ops == Ops::Eager {
            step += ", eager ops";
        }
        format!(
            "{}(vocab {}, hidden {}, layers {}, heads {heads}, seq-len {}, {}{lora}{checkpointing}{step})",
            self.family.model_type(),
            self.vocab,
            self.hidden,
            self.layers,
            training.seq_len,
            dtype.as_str()
        )
    }
}

/// The parameters of `config`, counted without a per-layer list; `None`
/// past 64 bits.
pub(crate) fn count_parameters(config: &Config) -> Option<u64> {
    config.over_layers(config.split_counts(Config::tensors)?)
}

/// The network of one family over its weights.
enum Network {
    Decoder(decoder::Decoder),
    Gpt2(gpt2::Gpt2),
    Bert(bert::Bert),
}

impl Network {
    fn new(config: &Config, weights: &Weights, training: &Training) -> candle_core::Result<Network> {
        let lora = training.lora.as_ref();
        let forms = layers::Forms { attention: training.attention, ops: training.ops };
        Ok(match config.family {
            Family::Gpt2 => Network::Gpt2(gpt2::Gpt2::new(config, weights, lora, forms)?),
            Family::Bert => Network::Bert(bert::Bert::new(config, weights, lora, forms)?),
            _ => Network::Decoder(decoder::Decoder::new(config, weights, lora, forms)?),
        })
    }

    /// The final norm of the last block's output `(b, s, hidden)` and the
    /// head's weight and bias: a decoder's (or GPT-2's) fused loss's inputs.
    fn head_parts(&self, xs: &Tensor) -> candle_core::Result<(Tensor, Tensor, Option<Tensor>)> {
        let (features, dense) = match self {
            Network::Decoder(network) => (network.final_norm(xs)?, network.head_dense()),
            Network::Gpt2(network) => (network.final_norm(xs)?, network.head_dense()),
            Network::Bert(_) => candle_core::bail!("BERT's head is its masked-LM head"),
        };
        let Some((weight, bias)) = dense else { candle_core::bail!("the head has adapters") };
        Ok((features, weight, bias))
    }
}

/// A model built from its config, with deterministic weights: a `VarMap` of
/// what trains and the loss it trains with (see the [module](self) docs).
pub struct ConfigModel {
    config: Config,
    training: Training,
    weights: Weights,
    network: Network,
    /// With checkpointing: the same network over detached weights, whose
    /// forward pass records no graph.
    frozen: Option<Network>,
    dtype: DType,
    device: Device,
    /// The sequence length it was built for: the longest it steps at.
    longest: usize,
    /// Checkpoint tensors left unused, as transformers leaves them.
    ignored: Vec<String>,
}

impl ConfigModel {
    /// Builds `config` for `training` on `device`. Refused before anything
    /// is allocated: a sequence past the model's positions or its sliding
    /// window, an unknown LoRA target, a dtype other than f32 or bf16.
    pub fn build(config: &Config, training: &Training, device: &Device) -> Result<ConfigModel, Error> {
        ConfigModel::assemble(config, training, device, None).map_err(crate::building)
    }

    /// [`build`](Self::build) over given weights, by their checkpoint names
    /// (what `candle_core::safetensors::load` of the model's files returns);
    /// LoRA adapters not among them start as `build` starts them. A missing
    /// tensor or a shape other than the config's is an error naming it.
    ///
    /// ```
    /// use autobatch_models::{Config, ConfigModel, Training};
    /// let config = Config::from_json(r#"{"model_type": "gpt2", "vocab_size": 16, "n_embd": 8, "n_layer": 1, "n_head": 2, "n_positions": 8}"#)?;
    /// let random = ConfigModel::build(&config, &Training::new(4), &candle_core::Device::Cpu)?;
    /// let tensors = random.varmap().data().lock().unwrap().iter().map(|(n, v)| (n.clone(), v.as_tensor().clone())).collect();
    /// let loaded = ConfigModel::from_tensors(&config, &Training::new(4), tensors, &candle_core::Device::Cpu)?;
    /// let ids = candle_core::Tensor::new(&[[1u32, 2, 3, 4]], &candle_core::Device::Cpu)?;
    /// assert_eq!(loaded.forward(&ids)?.to_vec3::<f32>()?, random.forward(&ids)?.to_vec3::<f32>()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_tensors(
        config: &Config,
        training: &Training,
        tensors: std::collections::HashMap<String, Tensor>,
        device: &Device,
    ) -> Result<ConfigModel, Error> {
        ConfigModel::assemble(config, training, device, Some(tensors)).map_err(crate::building)
    }

    /// [`from_tensors`](Self::from_tensors) of the model's safetensors files.
    pub fn from_safetensors(
        config: &Config,
        training: &Training,
        files: &[impl AsRef<std::path::Path>],
        device: &Device,
    ) -> Result<ConfigModel, Error> {
        let mut tensors = std::collections::HashMap::new();
        for file in files {
            tensors.extend(candle_core::safetensors::load(file.as_ref(), device)?);
        }
        ConfigModel::from_tensors(config, training, tensors, device)
    }

    fn assemble(
        config: &Config,
        training: &Training,
        device: &Device,
        given: Option<std::collections::HashMap<String, Tensor>>,
    ) -> Result<ConfigModel, Error> {
        config.check_seq_len(training.seq_len)?;
        let dtype = config.model_dtype(training)?;
        crate::trainer::check_dtype(dtype)?;
        let adapter_dtype = training.lora.as_ref().map_or(dtype, |lora| lora.adapter_dtype(dtype));
        let dtype_of = |name: &str| if name.contains(".lora_") { adapter_dtype } else { dtype };
        let mut specs = config.tensors();
        let trains_everything = training.lora.is_none();
        if let Some(lora) = &training.lora {
            specs.extend(config.adapters(lora)?);
        }
        // a tensor transformers keeps and does not use (an untied BERT head's old bias) never learns
        let unused = config.unused_tensors();
        let trained = |name: &str| (trains_everything && !unused.contains(&name)) || name.contains(".lora_");
        let mut ignored = Vec::new();
        let weights = match given {
            None => Weights::build(&specs, training.seed, dtype_of, device, trained)?,
            Some(given) => {
                let names: Vec<String> = specs.iter().map(|spec| spec.name.clone()).collect();
                let mut matched = checkpoint::match_names(config, &names, given)?;
                ignored = matched.ignored;
                // adapters and a new classifier a checkpoint does not hold start as they start in build
                let mut fresh_specs = specs.clone();
                fresh_specs.retain(|spec| {
                    (spec.name.contains(".lora_") || checkpoint::starts_fresh(config, &spec.name))
                        && !matched.tensors.contains_key(&spec.name)
                });
                let fresh = Weights::build(&fresh_specs, training.seed, dtype_of, device, |_| false)?;
                let source = |spec: &TensorSpec| match matched.tensors.remove(&spec.name) {
                    Some(tensor) => Ok(tensor),
                    None if fresh.maybe(&spec.name).is_some() => fresh.get(&spec.name),
                    None => Err(candle_core::Error::Msg(format!(
                        "the checkpoint has no tensor {}",
                        checkpoint::both_spellings(config.family, &spec.name)
                    ))),
                };
                Weights::from_source(&specs, dtype_of, source, trained)?
            }
        };
        if !ignored.is_empty() {
            log::info!("checkpoint tensors left unused, as transformers leaves them: {}", ignored.join(", "));
        }
        let mut weights = weights;
        if let Some(quantized) = training.lora.as_ref().and_then(|lora| lora.base?.quantized()) {
            for (name, _, _) in config.projections() {
                weights.quantize(&format!("{name}.weight"), config.family == Family::Gpt2, quantized)?;
            }
        }
        let network = Network::new(config, &weights, training)?;
        let frozen = match (training.checkpointing, config.family) {
            (false, _) => None,
            (true, Family::Bert) => {
                return Err(Error::invalid(
                    crate::Setting::ConfigKey("model_type".to_owned()),
                    autobatch::Value::Text("bert".to_owned()),
                    "use a decoder (llama, mistral, qwen2, qwen3, gpt2) for gradient checkpointing",
                ));
            }
            (true, _) => Some(Network::new(config, &weights.detached(), training)?),
        };
        Ok(ConfigModel {
            config: config.clone(),
            training: training.clone(),
            weights,
            network,
            frozen,
            dtype,
            device: device.clone(),
            longest: training.seq_len,
            ignored,
        })
    }

    /// The checkpoint's tensors it left unused as transformers leaves them
    /// (a tied head's copy, buffers, another task's head), each with why.
    pub fn ignored_tensors(&self) -> &[String] {
        &self.ignored
    }

    /// The loss transformers computes for `model(input_ids, labels=labels).loss`,
    /// in f32, on `input_ids` `(b, s)` and `labels` (i64, `-100` ignored):
    /// a decoder's next-token loss, `labels` `(b, s)` shifted inside (the
    /// logits at position t against `labels[t + 1]`: s tokens give s − 1
    /// predictions); BERT's masked-LM loss, `labels` `(b, s)` with `-100`
    /// everywhere but the masked positions; a BERT classifier's, `labels`
    /// `(b)`. The mean over the labels not ignored.
    pub fn loss_of(&self, input_ids: &Tensor, labels: &Tensor) -> Result<Tensor, Error> {
        let (b, s) = input_ids.dims2()?;
        let labels_host = labels.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?;
        if let Network::Bert(network) = &self.network
            && !network.predicts_tokens()
        {
            let logits = network.forward(input_ids)?;
            let targets = Tensor::from_vec(labels_host.iter().map(|&l| l as u32).collect(), b, &self.device)?;
            return Ok(layers::cross_entropy(&logits, &targets)?);
        }
        if labels_host.len() != b * s {
            return Err(Error::invalid(
                crate::Setting::Labels,
                autobatch::Value::Count(labels_host.len()),
                format!("give one label per input token, {b} × {s}"),
            ));
        }
        let shift = usize::from(!matches!(self.network, Network::Bert(_)));
        let (mut rows, mut targets) = (Vec::new(), Vec::new());
        for sample in 0..b {
            for position in 0..s.saturating_sub(shift) {
                let label = labels_host[sample * s + position + shift];
                if label == ops::IGNORE_INDEX {
                    continue;
                }
                let vocab = self.config.vocab as i64;
                if !(0..vocab).contains(&label) {
                    return Err(Error::invalid(
                        crate::Setting::Labels,
                        autobatch::Value::Text(label.to_string()),
                        format!("a token id below the vocabulary, {vocab}, or -100 to ignore the position"),
                    ));
                }
                rows.push((sample * s + position) as u32);
                targets.push(label as u32);
            }
        }
        if targets.is_empty() {
            return Err(Error::invalid(
                crate::Setting::Labels,
                autobatch::Value::Text("-100 everywhere".to_owned()),
                "give at least one label that is not -100",
            ));
        }
        Ok(self.token_loss(input_ids, Some(rows), targets)?)
    }

    /// What trains: every tensor, or the LoRA adapters alone.
    pub fn varmap(&self) -> &VarMap {
        &self.weights.varmap
    }

    /// The config it was built from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The sequence length its steps run at.
    pub fn seq_len(&self) -> usize {
        self.training.seq_len
    }

    /// The logits of token ids `(b, s)`: `(b, s, vocab)`, or `(b, labels)`
    /// for a BERT classifier.
    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        match &self.network {
            Network::Decoder(network) => network.forward(ids),
            Network::Gpt2(network) => network.forward(ids),
            Network::Bert(network) => network.forward(ids),
        }
    }

    /// The mean loss of `batch` samples drawn from `data_seed` (the same seed,
    /// the same samples): next-token cross entropy for a decoder, masked-LM
    /// (15% of the tokens masked) or classification for BERT; in f32.
    pub fn loss(&self, batch: usize, data_seed: u64) -> candle_core::Result<Tensor> {
        let (s, vocab) = (self.training.seq_len, self.config.vocab);
        match &self.network {
            Network::Bert(network) => {
                let ids = sequences(data_seed, batch, s, vocab);
                if !network.predicts_tokens() {
                    let BertHead::Classification { labels } = self.config.bert_head else { unreachable!() };
                    // the class is the first token's, modulo the classes: something to learn
                    let classes: Vec<u32> = ids.chunks(s).map(|sample| sample[0] % labels as u32).collect();
                    let logits = network.forward(&Tensor::from_vec(ids, (batch, s), &self.device)?)?;
                    return layers::cross_entropy(&logits, &Tensor::from_vec(classes, batch, &self.device)?);
                }
                // every sample's first token and about 15% of the rest are masked
                let mask_id = if vocab > 103 { 103 } else { vocab as u32 - 1 };
                let mut rng = Rng::new(data_seed ^ 0x4d41_534b);
                let masked: Vec<u32> =
                    (0..batch * s).filter(|&i| i % s == 0 || rng.below(100) < 15).map(|i| i as u32).collect();
                let targets: Vec<u32> = masked.iter().map(|&i| ids[i as usize]).collect();
                let mut input = ids;
                for &i in &masked {
                    input[i as usize] = mask_id;
                }
                self.token_loss(&Tensor::from_vec(input, (batch, s), &self.device)?, Some(masked), targets)
            }
            _ => {
                let (input, targets) = self.next_tokens(batch, data_seed)?;
                self.token_loss(&input, None, targets.to_vec1::<u32>()?)
            }
        }
    }

    /// The mean cross entropy of token predictions on `input` `(b, s)`: the
    /// logits at `rows` of the `b · s` positions (every one when `None`)
    /// against `targets`, the head and the loss computed as the training's
    /// [`Loss`] says. BERT's masked-LM loss in full is transformers': the
    /// log-probabilities at every position, the rows of them counted.
    fn token_loss(&self, input: &Tensor, rows: Option<Vec<u32>>, targets: Vec<u32>) -> candle_core::Result<Tensor> {
        let (b, s) = input.dims2()?;
        let (count, vocab) = (targets.len(), self.config.vocab);
        let targets = Tensor::from_vec(targets, count, &self.device)?;
        let rows = rows.map(|rows| Tensor::from_vec(rows, count, &self.device)).transpose()?;
        let pick = |tensor: Tensor| match &rows {
            Some(rows) => tensor.index_select(rows, 0),
            None => Ok(tensor),
        };
        match (&self.network, self.training.loss) {
            (Network::Bert(network), Loss::Full) => {
                let Some(rows) = &rows else { candle_core::bail!("a masked-LM loss needs its masked positions") };
                bert::masked_lm_loss(&network.forward(input)?.reshape((b * s, vocab))?, rows, &targets)
            }
            (Network::Bert(network), Loss::Chunked) => {
                let Some((features, weight, bias)) = network.masked_lm_features(input)? else {
                    candle_core::bail!("a BERT classifier predicts no tokens")
                };
                let features = pick(features.reshape((b * s, self.config.hidden))?)?;
                ChunkedCrossEntropy::default().forward(&features, &weight, bias.as_ref(), &targets)
            }
            (_, Loss::Full) => layers::cross_entropy(&pick(self.forward(input)?.reshape((b * s, vocab))?)?, &targets),
            (network, Loss::Chunked) => {
                let trunk = match network {
                    Network::Decoder(network) => network.trunk(input)?,
                    Network::Gpt2(network) => network.trunk(input)?,
                    Network::Bert(_) => unreachable!("BERT's loss is above"),
                };
                let (features, weight, bias) = network.head_parts(&trunk)?;
                let features = pick(features.reshape((b * s, self.config.hidden))?)?;
                ChunkedCrossEntropy::default().forward(&features, &weight, bias.as_ref(), &targets)
            }
        }
    }

    /// A decoder's batch: `s + 1` tokens a sample, the first `s` the input
    /// `(b, s)`, each one's next token its target `(b · s)`.
    fn next_tokens(&self, batch: usize, data_seed: u64) -> candle_core::Result<(Tensor, Tensor)> {
        let s = self.training.seq_len;
        let tokens = sequences(data_seed, batch, s + 1, self.config.vocab);
        let tokens = Tensor::from_vec(tokens, (batch, s + 1), &self.device)?;
        Ok((tokens.narrow(1, 0, s)?.contiguous()?, tokens.narrow(1, 1, s)?.flatten_all()?))
    }

    /// The model in the reference models' engine: a [`Workload`](autobatch::Workload)
    /// whose probe changes nothing and a training loop with one optimizer
    /// (AdamW by default), resizable to any sequence length up to the one it
    /// was built for. What `autobatch probe --config` tunes.
    pub fn into_trainer(self) -> Result<Trainer<ConfigModel>, Error> {
        // the variables' dtype: the adapters' under LoRA
        let dtype = self.training.lora.as_ref().map_or(self.dtype, |lora| lora.adapter_dtype(self.dtype));
        let (varmap, seed) = (self.weights.varmap.clone(), self.training.seed);
        Trainer::from_varmap(self, varmap, dtype, seed)
    }

    /// Steps at `seq_len` tokens from now on (at most the length built for).
    pub fn set_seq_len(&mut self, seq_len: usize) -> Result<(), Error> {
        if seq_len == 0 || seq_len > self.longest {
            return Err(Error::invalid(
                crate::Setting::SeqLen,
                autobatch::Value::Count(seq_len),
                format!("it must be from 1 to the sequence length the model was built for, {}", self.longest),
            ));
        }
        self.training.seq_len = seq_len;
        Ok(())
    }

    /// The sequence length it was built for.
    pub fn longest_seq_len(&self) -> usize {
        self.longest
    }
}

impl Model for ConfigModel {
    fn describe(&self) -> String {
        self.config.describe(&self.training)
    }

    fn loss(&self, batch: usize, data_seed: u64) -> candle_core::Result<Tensor> {
        ConfigModel::loss(self, batch, data_seed)
    }

    /// With checkpointing: each layer's input kept, each layer run again in
    /// the backward pass ([`checkpointed`](autobatch::model::checkpointed)).
    fn loss_and_gradients(
        &self,
        batch: usize,
        data_seed: u64,
        vars: &[candle_core::Var],
    ) -> candle_core::Result<(Tensor, candle_core::backprop::GradStore)> {
        let Some(frozen) = &self.frozen else {
            let loss = self.loss(batch, data_seed)?;
            let grads = loss.backward()?;
            return Ok((loss, grads));
        };
        let (input, targets) = self.next_tokens(batch, data_seed)?;
        let (embedded, tables) = match &self.network {
            Network::Decoder(network) => {
                let embedded = network.embed(&input)?;
                let tables = network.tables(&embedded)?;
                (embedded, Some(tables))
            }
            Network::Gpt2(network) => (network.embed(&input)?, None),
            Network::Bert(_) => candle_core::bail!("BERT is not checkpointed"),
        };
        let steps = |network| -> Vec<Step<'_>> {
            (0..self.config.layers).map(|index| Step { network, index, tables: tables.as_ref() }).collect()
        };
        let (blocks, detached) = (steps(&self.network), steps(frozen));
        let vocab = self.config.vocab;
        let mut loss = None;
        let (_, grads) = autobatch::model::checkpointed(vars, &embedded, &blocks, &detached, |h| {
            let rows = batch * self.training.seq_len;
            let head = match self.training.loss {
                Loss::Full => {
                    let logits = match &self.network {
                        Network::Decoder(network) => network.head(h)?,
                        Network::Gpt2(network) => network.head(h)?,
                        Network::Bert(_) => candle_core::bail!("BERT is not checkpointed"),
                    };
                    layers::cross_entropy(&logits.reshape((rows, vocab))?, &targets)?
                }
                Loss::Chunked => {
                    let (features, weight, bias) = self.network.head_parts(h)?;
                    let features = features.reshape((rows, self.config.hidden))?;
                    ChunkedCrossEntropy::default().forward(&features, &weight, bias.as_ref(), &targets)?
                }
            };
            loss = Some(head.detach());
            Ok(head)
        })?;
        Ok((loss.expect("the head ran"), grads))
    }

    fn computes_own_gradients(&self) -> bool {
        self.frozen.is_some()
    }

    fn transformer(&self) -> Option<(autobatch::estimate::TransformerShape, autobatch::estimate::Recompute)> {
        let shape = autobatch::estimate::TransformerShape {
            layers: self.config.layers as u64,
            hidden: self.config.hidden as u64,
            heads: self.config.heads as u64,
            seq_len: self.training.seq_len as u64,
            batch: 1,
        };
        let recompute = if self.frozen.is_some() {
            autobatch::estimate::Recompute::Full
        } else {
            autobatch::estimate::Recompute::None
        };
        Some((shape, recompute))
    }

    fn detached(&self) -> ConfigModel {
        let weights = self.weights.detached();
        let network =
            Network::new(&self.config, &weights, &self.training).expect("the same weights build the same network");
        ConfigModel {
            config: self.config.clone(),
            training: self.training.clone(),
            weights,
            network,
            frozen: None,
            dtype: self.dtype,
            device: self.device.clone(),
            longest: self.longest,
            ignored: self.ignored.clone(),
        }
    }
}

/// One layer of a network as a `Module`: what checkpointing runs twice.
struct Step<'a> {
    network: &'a Network,
    index: usize,
    tables: Option<&'a (Tensor, Tensor)>,
}

impl candle_core::Module for Step<'_> {
    fn forward(&self, xs: &Tensor) -> candle_core::Result<Tensor> {
        match (self.network, self.tables) {
            (Network::Decoder(network), Some(tables)) => network.block(self.index, xs, tables),
            (Network::Gpt2(network), _) => network.block(self.index, xs),
            _ => candle_core::bail!("layer {} cannot be checkpointed", self.index),
        }
    }
}

/// `batch` samples of `len` token ids below `vocab`: each starts at a random
/// token and follows a fixed successor rule (`t → 5t + 3 mod vocab`) with a
/// random token one time in eight: a language a model can learn, so that a
/// loss falls as training goes.
fn sequences(seed: u64, batch: usize, len: usize, vocab: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    let mut ids = Vec::with_capacity(batch * len);
    for _ in 0..batch {
        let mut token = rng.below(vocab);
        for _ in 0..len {
            ids.push(token as u32);
            token = if rng.below(8) == 0 { rng.below(vocab) } else { (5 * token + 3) % vocab };
        }
    }
    ids
}

/// Steps at any sequence length from 1 to the one the model was built for.
impl autobatch::Resizable for Trainer<ConfigModel> {
    fn resize(&mut self, size: usize) -> Result<(), autobatch::Error> {
        let longest = self.model().longest_seq_len();
        if size == 0 || size > longest {
            return Err(autobatch::Error::invalid(
                autobatch::Setting::Size,
                autobatch::Value::Count(size),
                format!("it must be from 1 to the sequence length the model was built for, {longest}"),
            ));
        }
        self.model_mut().set_seq_len(size).map_err(|_| autobatch::Error::zero(autobatch::Setting::Size))
    }

    fn size(&self) -> usize {
        self.model().seq_len()
    }
}
