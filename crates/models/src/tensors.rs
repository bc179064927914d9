//! A config's tensors by name and shape, counted: its parameters, LoRA's
//! adapters on its projections, the footprint before any step, the frozen
//! bytes, the dtype it trains in.

use candle_core::DType;

use autobatch::estimate::TrainingSetup;

use crate::config::{last_fitting, refuse};
use crate::trainer::Footprint;
use crate::trainer::footprint::adamw_state;
use crate::weights::{Init, TensorSpec};
use crate::{Attention, BaseDtype, Compute, Config, Error, Lora, Loss, Ops, Training};

impl Config {
    /// The checkpoint's tensors, names and shapes, as [`ConfigModel::build`] makes them.
    pub(crate) fn tensors(&self) -> Vec<TensorSpec> {
        self.family.architecture().tensors(self)
    }

    /// The start of layer `index`'s tensor names.
    fn layer_prefix(&self, index: usize) -> String {
        self.family.architecture().layer_prefix(index)
    }

    /// The elements of `specs` outside the layers and in every layer,
    /// listed for a one-layer copy of each kind of layer (dense, sparse):
    /// counted without a list as long as the layers, every product checked.
    fn counted(&self, specs: impl Fn(&Config) -> Vec<TensorSpec>) -> Option<u64> {
        let prefix = self.layer_prefix(0);
        let mut total = 0u64;
        for (index, (one, layers)) in self.layer_kinds().into_iter().enumerate() {
            let (mut outside, mut layer) = (0u64, 0u64);
            for spec in specs(&one) {
                let elements = spec.elements()?;
                if spec.name.starts_with(&prefix) {
                    layer = layer.checked_add(elements)?;
                } else {
                    outside = outside.checked_add(elements)?;
                }
            }
            // what lies outside the layers, once
            let outside = if index == 0 { outside } else { 0 };
            total = total.checked_add(layer.checked_mul(layers)?)?.checked_add(outside)?;
        }
        Some(total)
    }

    /// A one-layer copy of each kind of layer the model has and how many
    /// of it: a dense one, and a sparse one (its experts) where it has experts.
    pub(crate) fn layer_kinds(&self) -> Vec<(Config, u64)> {
        let dense = Config { layers: 1, experts: None, ..self.clone() };
        let Some(experts) = &self.experts else {
            return vec![(dense, self.layers as u64)];
        };
        // the multiples of the step, less the dense layers among them, counted without a walk
        let mut dense_listed: Vec<usize> = experts
            .dense_layers
            .iter()
            .copied()
            .filter(|&layer| layer < self.layers && (layer + 1).is_multiple_of(experts.sparse_step))
            .collect();
        dense_listed.sort_unstable();
        dense_listed.dedup();
        let sparse_count = (self.layers / experts.sparse_step - dense_listed.len()) as u64;
        let every = crate::config::Experts { sparse_step: 1, dense_layers: Vec::new(), ..experts.clone() };
        let sparse = Config { layers: 1, experts: Some(every), ..self.clone() };
        vec![(dense, self.layers as u64 - sparse_count), (sparse, sparse_count)]
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

    /// A mixture of experts' parameters in its experts (every expert of
    /// every sparse layer), and those a token passes through: the rest and
    /// its `k` experts a sparse layer. Both the whole count without experts.
    ///
    /// ```
    /// let mixtral = autobatch_models::Config::from_json(
    ///     r#"{"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
    ///         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    ///         "num_local_experts": 8, "num_experts_per_tok": 2}"#,
    /// )?;
    /// assert_eq!(mixtral.parameter_count(), 46_702_792_704);
    /// let (experts, active) = mixtral.expert_parameter_counts();
    /// assert_eq!((experts, active), (45_097_156_608, 12_879_925_248));
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn expert_parameter_counts(&self) -> (u64, u64) {
        let total = self.parameter_count();
        let Some(experts) = &self.experts else { return (0, total) };
        let sparse = self.layer_kinds().into_iter().find(|(one, _)| one.experts.is_some()).map_or(0, |(_, n)| n);
        let per_expert = 3 * self.hidden as u64 * experts.intermediate as u64;
        let all = sparse.saturating_mul(experts.count as u64).saturating_mul(per_expert);
        let idle = sparse.saturating_mul((experts.count - experts.per_token) as u64).saturating_mul(per_expert);
        (all, total.saturating_sub(idle))
    }

    /// The shapes the forward pass needs to agree, and every size the
    /// model's tensors are made of countable: the parameters, and their
    /// bytes at 16 per parameter (weights, gradients and two f32 moments),
    /// fit in 64 bits, checked before anything is allocated.
    pub(crate) fn check_shape(&self) -> Result<(), Error> {
        if self.kv_heads > self.heads || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(refuse(
                "num_key_value_heads",
                self.kv_heads,
                format!("a divisor of num_attention_heads {}", self.heads),
            ));
        }
        if self.rope.is_some() && !self.head_dim.is_multiple_of(2) {
            return Err(refuse("head_dim", self.head_dim, "an even number (rotary positions rotate pairs)"));
        }
        if let Some(padding) = self.padding_idx.filter(|&id| id >= self.vocab) {
            return Err(refuse("pad_token_id", padding, format!("an id below vocab_size {}", self.vocab)));
        }
        self.checked_parameter_count()?;
        Ok(())
    }

    /// The parameter count with every product checked: where it (or 16 bytes
    /// for each parameter) passes 64 bits, an error naming the config field
    /// at fault (the largest whose value alone makes it so), its value and
    /// the most it may be. The config is counted as it is written, before any
    /// copy with other layers ([`with_layers`](Self::with_layers)).
    pub fn checked_parameter_count(&self) -> Result<u64, Error> {
        let countable = |config: &Config| count_parameters(config).filter(|count| count.checked_mul(16).is_some());
        if let Some(count) = countable(self) {
            return Ok(count);
        }
        let key = |field| self.family.architecture().config_key(field);
        type Setter = fn(&mut Config, usize);
        let fields: [(&str, usize, Setter); 9] = [
            ("vocab_size", self.vocab, |c, v| c.vocab = v),
            (key("hidden_size"), self.hidden, |c, v| c.hidden = v),
            (key("num_hidden_layers"), self.layers, |c, v| c.layers = v),
            (key("num_attention_heads"), self.heads, |c, v| c.heads = v),
            ("num_key_value_heads", self.kv_heads, |c, v| c.kv_heads = v),
            ("head_dim", self.head_dim, |c, v| c.head_dim = v),
            (key("intermediate_size"), self.intermediate, |c, v| c.intermediate = v),
            (key("max_position_embeddings"), self.max_positions, |c, v| c.max_positions = v),
            ("type_vocab_size", self.type_vocab, |c, v| c.type_vocab = v),
        ];
        let with = |set: fn(&mut Config, usize), value: usize| {
            let mut changed = self.clone();
            set(&mut changed, value);
            countable(&changed).is_some()
        };
        // the field at fault: one that, at 1, leaves the rest countable
        let fault =
            fields.iter().filter(|(_, value, set)| *value > 1 && with(*set, 1)).max_by_key(|(_, value, _)| *value);
        match fault {
            Some(&(field, value, set)) => {
                let fit = last_fitting(1, value, |middle| with(set, middle));
                Err(refuse(
                    field,
                    value,
                    format!(
                        "at most {fit}: past it the {} config's parameters, 16 bytes each in training, pass what 64 \
                         bits count (a config is counted as it is written, before any copy with other layers)",
                        self.family.model_type()
                    ),
                ))
            }
            None => Err(Error::byte_overflow(format!(
                "the parameters of a {} config of vocab_size {}, hidden_size {}, {} layers, intermediate_size {} \
                 and {} positions",
                self.family.model_type(),
                self.vocab,
                self.hidden,
                self.layers,
                self.intermediate,
                self.max_positions
            ))),
        }
    }

    /// The same model with `layers` layers: a shallower (or deeper) copy to
    /// probe, every layer alike.
    pub fn with_layers(mut self, layers: usize) -> Result<Config, Error> {
        if layers == 0 {
            return Err(refuse("num_hidden_layers", 0, "at least 1"));
        }
        self.layers = layers;
        self.checked_parameter_count()?;
        Ok(self)
    }

    /// The projections LoRA can adapt: checkpoint names with (out, in).
    pub(crate) fn projections(&self) -> Vec<(String, usize, usize)> {
        self.family.architecture().projections(self)
    }

    /// The projections of one layer (every layer has the same).
    fn layer_projections(&self) -> Vec<(String, usize, usize)> {
        Config { layers: 1, ..self.clone() }.projections()
    }

    /// Tensors transformers keeps in the model and never uses (an untied
    /// BERT head's `cls.predictions.bias`): counted and loaded, never trained.
    pub(crate) fn unused_tensors(&self) -> Vec<&'static str> {
        self.family.architecture().unused_tensors(self)
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
    pub(crate) fn adapters(&self, lora: &Lora) -> Result<Vec<TensorSpec>, Error> {
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
        Ok(self.counted(|one| one.adapter_specs(lora)))
    }

    /// What trains, how it is stored and what stays frozen beside it, with
    /// AdamW's state: the one count of a step's state, which the footprint
    /// ([`footprint`](Self::footprint)) and the estimate
    /// ([`Estimator::step`](crate::estimate::Estimator::step)) both start from. What
    /// trains is every parameter, in the model's dtype, or LoRA's adapters (in
    /// f32 over a base of its own dtype) beside the frozen base
    /// ([`frozen_bytes`](Self::frozen_bytes)).
    ///
    /// ```
    /// use autobatch::estimate::{OptimizerKind, Precision};
    /// use autobatch_models::{Config, Lora, Training};
    /// let config = Config::from_json(r#"{"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
    ///     "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "torch_dtype": "bfloat16"}"#)?;
    /// let full = config.training_setup(&Training::new(32))?;
    /// assert_eq!((full.parameters, full.precision, full.optimizer), (config.parameter_count(), Precision::Bf16, OptimizerKind::AdamW));
    /// // bf16 weights, gradients and two moments
    /// assert_eq!(full.state()?.total(), config.parameter_count() * 2 * 4);
    /// let lora = config.training_setup(&Training::new(32).lora(Lora::new(8, &["q_proj"])))?;
    /// assert!(lora.parameters < config.parameter_count() / 10);
    /// assert_eq!(lora.frozen_bytes, config.parameter_count() * 2);
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn training_setup(&self, training: &Training) -> Result<TrainingSetup, Error> {
        let model_dtype = self.model_dtype(training)?;
        let (trained, dtype) = match &training.lora {
            Some(lora) => {
                let overflow = || Error::byte_overflow(format!("the adapters of {}", self.describe(training)));
                (self.adapter_count(lora)?.ok_or_else(overflow)?, lora.adapter_dtype(model_dtype))
            }
            None => (self.checked_parameter_count()?, model_dtype),
        };
        let state = adamw_state(trained, dtype)?;
        Ok(TrainingSetup::new(trained, state.precision, state.optimizer).frozen(self.frozen_bytes(training)?))
    }

    /// What a step of this model surely needs on `compute` (the CPU widens
    /// 16-bit products to f32, an accelerator does not), from the config
    /// alone: the state ([`training_setup`](Self::training_setup): AdamW's,
    /// [`Footprint::trained_with`] for another optimizer or precision) and a
    /// frozen base; beside them 85% of the step's widest moment at one sample
    /// (less a sample's least bytes) and of its least bytes a sample
    /// ([`step_memory`](Self::step_memory), which holds within 15% of the
    /// measured step on the reference configs), so that `fixed + batch × per
    /// sample` stays under what any batch holds. What decides, before
    /// anything is allocated, that not even the first batch fits. Every
    /// product is checked.
    pub fn footprint(&self, training: &Training, compute: Compute) -> Result<Footprint, Error> {
        let setup = self.training_setup(training)?;
        let state = setup.state()?;
        let step = self.step_memory(training, compute)?;
        // the state counts the gradients: the moments before them hold the rest.
        // Every moment grows by at least the least bytes a sample, so the widest
        // at one sample plus that many a sample more bounds every batch
        let least_per_sample = step.moments.iter().map(|moment| moment.bytes_per_sample).min().unwrap_or(0);
        let widest =
            step.peak_bytes(state.gradients, 1)?.saturating_sub(state.gradients).saturating_sub(least_per_sample);
        let lower = |bytes: u64| bytes / 20 * 17;
        let fixed_bytes = [setup.frozen_bytes, lower(widest)]
            .into_iter()
            .try_fold(state.total(), u64::checked_add)
            .ok_or_else(|| Error::byte_overflow(format!("the tensors of {}", self.describe(training))))?;
        Ok(Footprint {
            model: self.describe(training),
            state,
            fixed_bytes,
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
        // the worst routing is the default: the router's is named
        let experts = match &self.experts {
            Some(experts) => {
                let routed = if training.routing == crate::Routing::Router { ", routed by its router" } else { "" };
                format!(
                    ", {} experts of {} ({} a token{routed})",
                    experts.count, experts.intermediate, experts.per_token
                )
            }
            None => String::new(),
        };
        format!(
            "{}(vocab {}, hidden {}, layers {}, heads {heads}{experts}, seq-len {}, {}{lora}{checkpointing}{step})",
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
fn count_parameters(config: &Config) -> Option<u64> {
    // the sizes the tensors' shapes are products of: none may wrap
    config.heads.checked_mul(config.head_dim)?;
    config.kv_heads.checked_mul(config.head_dim)?;
    config.hidden.checked_mul(3)?;
    config.counted(Config::tensors)
}
