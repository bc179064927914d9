//! A decoder built from its config for serving: forward only, its weights in
//! the dtype they are served in (f32, bf16, q8_0, q4_0), every step reading
//! and extending a paged [`KvCache`].

use candle_core::{DType, Device, Tensor};

use super::config::Config;
use super::config_model::build_network;
use super::kv_cache::{Chunk, KvCache};
use super::lora::BaseDtype;
use super::weights::Weights;
use super::{Attention, Training};
use crate::Error;
use crate::families::Network;

/// A config's decoder (every family but BERT) for inference,
/// with deterministic weights as [`ConfigModel`](super::ConfigModel) makes them.
///
/// A step takes chunks of several sequences at once: a prompt's chunk
/// (prefill) or one token each (decode), and gives the logits of each
/// chunk's last token.
///
/// ```
/// use autobatch_models::{BaseDtype, Chunk, Config, Inference, KvCache};
/// use candle_core::{DType, Device};
///
/// let config = Config::from_json(r#"{"model_type": "llama", "vocab_size": 32, "hidden_size": 16,
///     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
///     "intermediate_size": 32, "max_position_embeddings": 64}"#)?;
/// let model = Inference::build(&config, BaseDtype::F32, Some(DType::F32), 0, &Device::Cpu)?;
/// let mut cache = KvCache::new(&config, 4, 16, DType::F32, &Device::Cpu)?;
/// let sequence = cache.add_sequence();
/// // the prompt, then one decoded token
/// model.step(&mut cache, &[Chunk { sequence, start: 0, tokens: vec![1, 2, 3] }])?;
/// let logits = model.step(&mut cache, &[Chunk { sequence, start: 3, tokens: vec![4] }])?;
/// assert_eq!(logits.dims(), [1, 32]);
/// assert_eq!(cache.len(sequence), 4);
/// # Ok::<(), autobatch::Error>(())
/// ```
pub struct Inference {
    config: Config,
    network: Network,
    dtype: DType,
    weights: BaseDtype,
    weight_bytes: u64,
}

impl Inference {
    /// `config`'s decoder with its weights from `seed` stored as `weights`,
    /// attention blocked. Float weights compute in their own dtype (`dtype`
    /// `None` or the same); under q8_0 or q4_0 the projections are quantized
    /// and the rest (embeddings, norms, activations) is in `dtype` (f32 or
    /// bf16; `None`: the config's `torch_dtype`, f16 computed in bf16).
    pub fn build(
        config: &Config,
        weights: BaseDtype,
        dtype: Option<DType>,
        seed: u64,
        device: &Device,
    ) -> Result<Inference, Error> {
        Inference::assemble(config, weights, dtype, seed, None, device).map_err(crate::building)
    }

    /// [`build`](Self::build) over a checkpoint's tensors, by their names
    /// (with or without the base model's prefix, as
    /// [`ConfigModel::from_tensors`](super::ConfigModel::from_tensors) reads
    /// them), converted to `weights`: a missing tensor, or one of another
    /// shape, is an error naming it.
    pub fn from_tensors(
        config: &Config,
        weights: BaseDtype,
        dtype: Option<DType>,
        tensors: std::collections::HashMap<String, Tensor>,
        device: &Device,
    ) -> Result<Inference, Error> {
        Inference::assemble(config, weights, dtype, 0, Some(tensors), device).map_err(crate::building)
    }

    /// [`from_tensors`](Self::from_tensors) of the model's safetensors files.
    pub fn from_safetensors(
        config: &Config,
        weights: BaseDtype,
        dtype: Option<DType>,
        files: &[impl AsRef<std::path::Path>],
        device: &Device,
    ) -> Result<Inference, Error> {
        let mut tensors = std::collections::HashMap::new();
        for file in files {
            tensors.extend(candle_core::safetensors::load(file.as_ref(), device)?);
        }
        Inference::from_tensors(config, weights, dtype, tensors, device)
    }

    fn assemble(
        config: &Config,
        weights: BaseDtype,
        dtype: Option<DType>,
        seed: u64,
        given: Option<std::collections::HashMap<String, Tensor>>,
        device: &Device,
    ) -> Result<Inference, Error> {
        config.family.check_generates("serve")?;
        if let (Some(float), Some(asked)) = (weights.float(), dtype)
            && float != asked
        {
            return Err(Error::invalid(
                crate::Setting::Dtype,
                autobatch::Value::Text(format!("{asked:?}").to_lowercase()),
                format!("the weights' own, {}: float weights compute in their dtype", weights.name()),
            ));
        }
        // a checkpoint's experts take the tokens its router sends them; random
        // weights (a serving plan's measure) the costliest routing
        let routing = if given.is_some() { crate::Routing::Router } else { crate::Routing::Worst };
        let training = Training { dtype: weights.float().or(dtype), seed, routing, ..Training::new(1) };
        let dtype = config.model_dtype(&training)?;
        crate::trainer::check_dtype(dtype)?;
        let stored = weights.float().unwrap_or(dtype);
        let specs = config.tensors();
        let mut built = match given {
            None => Weights::build(&specs, seed, |_| stored, device, |_| false)?,
            Some(given) => {
                let names: Vec<String> = specs.iter().map(|spec| spec.name.clone()).collect();
                let mut matched = super::checkpoint::match_names(config, &names, given)?;
                let source = |spec: &super::weights::TensorSpec| {
                    matched.tensors.remove(&spec.name).ok_or_else(|| {
                        candle_core::Error::Msg(format!(
                            "the checkpoint has no tensor {}",
                            super::checkpoint::both_spellings(config.family, &spec.name)
                        ))
                    })
                };
                Weights::from_source(&specs, |_| stored, source, |_| false)?
            }
        };
        if let Some(quantized) = weights.quantized() {
            for (name, _, _) in config.projections() {
                built.quantize(&format!("{name}.weight"), config.family.architecture().weights_in_out(), quantized)?;
            }
        }
        let weight_bytes = built.bytes();
        let network = build_network(config, &built, &training.attention(Attention::Blocked))?;
        Ok(Inference { config: config.clone(), network, dtype, weights, weight_bytes })
    }

    /// The config it was built from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The dtype it computes in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The dtype its weights are stored in.
    pub fn weights(&self) -> BaseDtype {
        self.weights
    }

    /// The bytes its weights take.
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// Runs `chunks` (each extending its sequence from where it ends, no
    /// sequence twice) through the model: their keys and values go into
    /// `cache`, which takes the blocks they need; returns the logits `(n,
    /// vocab)` in f32 of each chunk's last token. No graph is kept.
    pub fn step(&self, cache: &mut KvCache, chunks: &[Chunk]) -> Result<Tensor, Error> {
        self.check(cache, chunks)?;
        for chunk in chunks {
            cache.reserve(chunk.sequence, chunk.start + chunk.tokens.len())?;
        }
        let ids: Vec<u32> = chunks.iter().flat_map(|chunk| chunk.tokens.iter().copied()).collect();
        let count = ids.len();
        let device = cache.device();
        let ids = Tensor::from_vec(ids, (1, count), &device)?;
        let logits = match &self.network {
            Network::Decoder(network) => network.forward_cached(&ids, chunks, cache)?,
            Network::Gpt2(network) => network.forward_cached(&ids, chunks, cache)?,
            Network::Bert(_) => unreachable!("build refuses BERT"),
        };
        Ok(logits.to_dtype(DType::F32)?)
    }

    /// Every chunk non-empty, where its sequence ends, within the positions
    /// (and the sliding window: the cache keeps every key); no sequence twice.
    fn check(&self, cache: &KvCache, chunks: &[Chunk]) -> Result<(), Error> {
        let chunk_error = |value: autobatch::Value, valid: String| Error::invalid(crate::Setting::Chunk, value, valid);
        if chunks.is_empty() {
            return Err(chunk_error(autobatch::Value::Count(0), "at least one chunk a step".to_owned()));
        }
        let mut seen = std::collections::HashSet::new();
        for chunk in chunks {
            if !seen.insert(chunk.sequence) {
                return Err(chunk_error(
                    autobatch::Value::Text(format!("{:?}", chunk.sequence)),
                    "one chunk per sequence a step".to_owned(),
                ));
            }
            if chunk.tokens.is_empty() {
                return Err(chunk_error(autobatch::Value::Count(0), "at least one token a chunk".to_owned()));
            }
            let held = cache.len(chunk.sequence);
            if chunk.start != held {
                return Err(chunk_error(
                    autobatch::Value::Count(chunk.start),
                    format!("the position where the sequence ends, {held}"),
                ));
            }
            if let Some(&id) = chunk.tokens.iter().find(|&&id| id as usize >= self.config.vocab) {
                return Err(chunk_error(
                    autobatch::Value::Count(id as usize),
                    format!("token ids below the vocabulary, {}", self.config.vocab),
                ));
            }
            self.config.check_seq_len(chunk.start + chunk.tokens.len())?;
        }
        Ok(())
    }
}

/// A config's decoder served from a paged [`KvCache`]: what
/// a tuner's search ([`Scheduling`](autobatch::serve::Scheduling)) measures for `autobatch serve`.
pub struct Serving {
    model: Inference,
    block_size: usize,
    cache_dtype: DType,
    device: Device,
}

impl Serving {
    /// `config`'s decoder with its weights stored as `weights` and computing
    /// in `dtype` (see [`Inference::build`]), its cache in blocks of
    /// [`DEFAULT_BLOCK_SIZE`](super::DEFAULT_BLOCK_SIZE) tokens in the dtype
    /// it computes in.
    pub fn build(config: &Config, weights: BaseDtype, dtype: Option<DType>, device: &Device) -> Result<Serving, Error> {
        Ok(Serving::new(Inference::build(config, weights, dtype, 0, device)?, device))
    }

    /// `model` served on `device`, its cache as [`build`](Self::build) keeps it.
    pub fn new(model: Inference, device: &Device) -> Serving {
        let cache_dtype = model.dtype();
        Serving { model, block_size: super::DEFAULT_BLOCK_SIZE, cache_dtype, device: device.clone() }
    }

    /// With blocks of `tokens` tokens (at least 1).
    pub fn block_size(mut self, tokens: usize) -> Result<Serving, Error> {
        if tokens == 0 {
            return Err(Error::zero(crate::Setting::BlockSize));
        }
        self.block_size = tokens;
        Ok(self)
    }

    /// With the cache in `dtype` (f32, bf16 or f16).
    pub fn cache_dtype(mut self, dtype: DType) -> Result<Serving, Error> {
        KvCache::check(self.model.config(), self.block_size, dtype)?;
        self.cache_dtype = dtype;
        Ok(self)
    }

    /// The model.
    pub fn model(&self) -> &Inference {
        &self.model
    }

    /// Tokens per block.
    pub fn tokens_per_block(&self) -> usize {
        self.block_size
    }

    /// The dtype its cache keeps keys and values in.
    pub fn kv_cache_dtype(&self) -> DType {
        self.cache_dtype
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The bytes a block takes.
    pub fn block_bytes(&self) -> u64 {
        KvCache::block_bytes(self.model.config(), self.block_size, self.cache_dtype)
    }

    /// The bytes the cache of one sequence of `context` tokens takes: its
    /// blocks, the last one whole.
    pub fn bytes_per_sequence(&self, context: usize) -> u64 {
        context.div_ceil(self.block_size) as u64 * self.block_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConfigModel, SequenceId};

    fn configs() -> Vec<(&'static str, Config)> {
        let llama = r#"{"model_type": "llama", "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 24, "max_position_embeddings": 64,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16}}"#;
        let qwen3 = r#"{"model_type": "qwen3", "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 24,
            "max_position_embeddings": 64, "tie_word_embeddings": true}"#;
        let qwen2 = r#"{"model_type": "qwen2", "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 24, "max_position_embeddings": 64}"#;
        let mistral = r#"{"model_type": "mistral", "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 24, "max_position_embeddings": 64,
            "sliding_window": 64}"#;
        let olmo2 = r#"{"model_type": "olmo2", "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 24, "max_position_embeddings": 64}"#;
        let gpt2 =
            r#"{"model_type": "gpt2", "vocab_size": 40, "n_embd": 16, "n_layer": 2, "n_head": 2, "n_positions": 64}"#;
        [("llama", llama), ("qwen3", qwen3), ("qwen2", qwen2), ("mistral", mistral), ("olmo2", olmo2), ("gpt2", gpt2)]
            .into_iter()
            .map(|(name, json)| (name, Config::from_json(json).unwrap()))
            .collect()
    }

    fn tokens(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| (i * 7 + seed * 13 + 3) % 40).collect()
    }

    fn max_difference(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
    }

    /// Two sequences: one's prompt in two chunks, the other's whole beside
    /// the first's second chunk, then both decoding together; blocks of 4
    /// tokens, so chunks start and end inside blocks. The last token's
    /// logits equal a full forward pass's within 1e-5 in f32.
    #[test]
    fn prefill_in_chunks_and_decode_equal_a_full_forward() {
        let device = Device::Cpu;
        for (name, config) in configs() {
            let full = ConfigModel::build(&config, &Training::new(16).dtype(DType::F32), &device).unwrap();
            let model = Inference::build(&config, BaseDtype::F32, Some(DType::F32), 0, &device).unwrap();
            let mut cache = KvCache::new(&config, 12, 4, DType::F32, &device).unwrap();
            let (a, b) = (cache.add_sequence(), cache.add_sequence());
            let (prompt_a, prompt_b) = (tokens(1, 11), tokens(2, 7));
            let chunk =
                |sequence: SequenceId, start: usize, tokens: &[u32]| Chunk { sequence, start, tokens: tokens.to_vec() };
            model.step(&mut cache, &[chunk(a, 0, &prompt_a[..5])]).unwrap();
            model.step(&mut cache, &[chunk(a, 5, &prompt_a[5..]), chunk(b, 0, &prompt_b)]).unwrap();
            let (mut seq_a, mut seq_b) = (prompt_a.clone(), prompt_b.clone());
            let mut logits = None;
            for (next_a, next_b) in [(5u32, 9u32), (17, 33)] {
                logits = Some(
                    model
                        .step(&mut cache, &[chunk(a, seq_a.len(), &[next_a]), chunk(b, seq_b.len(), &[next_b])])
                        .unwrap(),
                );
                seq_a.push(next_a);
                seq_b.push(next_b);
            }
            let logits = logits.unwrap();
            for (row, sequence) in [(0, &seq_a), (1, &seq_b)] {
                let ids = Tensor::new(sequence.as_slice(), &device).unwrap().unsqueeze(0).unwrap();
                let expected = full.forward(&ids).unwrap().squeeze(0).unwrap();
                let expected = expected.get(sequence.len() - 1).unwrap();
                let ours = logits.get(row).unwrap();
                let difference = max_difference(&ours, &expected);
                assert!(difference <= 1e-5, "{name}, sequence {row}: off by {difference:e}");
            }
            assert_eq!((cache.len(a), cache.len(b)), (13, 9));
            // 13 tokens in blocks of 4: 4 blocks, 9: 3 blocks
            assert_eq!(cache.free_blocks(), 12 - 4 - 3, "{name}");
        }
    }

    #[test]
    fn a_chunk_that_does_not_start_where_its_sequence_ends_is_refused() {
        let config = configs().remove(0).1;
        let model = Inference::build(&config, BaseDtype::F32, Some(DType::F32), 0, &Device::Cpu).unwrap();
        let mut cache = KvCache::new(&config, 4, 16, DType::F32, &Device::Cpu).unwrap();
        let sequence = cache.add_sequence();
        let gap = model.step(&mut cache, &[Chunk { sequence, start: 2, tokens: vec![1] }]);
        assert!(gap.unwrap_err().to_string().contains("where the sequence ends, 0"));
        let past = model.step(&mut cache, &[Chunk { sequence, start: 0, tokens: vec![40] }]);
        assert!(past.unwrap_err().to_string().contains("below the vocabulary"));
        // 4 blocks of 16 hold 64 tokens: a 65th is refused by the cache, not computed
        let long = model.step(&mut cache, &[Chunk { sequence, start: 0, tokens: vec![1; 65] }]);
        assert!(long.is_err());
        assert_eq!(cache.len(sequence), 0);
    }

    #[test]
    fn a_cache_in_bf16_stays_close_and_quantized_weights_run() {
        let json = r#"{"model_type": "llama", "vocab_size": 40, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64}"#;
        let config = Config::from_json(json).unwrap();
        let device = Device::Cpu;
        let model = Inference::build(&config, BaseDtype::F32, None, 0, &device).unwrap();
        let prompt = tokens(3, 20);
        let run = |model: &Inference, dtype: DType| {
            let mut cache = KvCache::new(&config, 4, 16, dtype, &device).unwrap();
            let sequence = cache.add_sequence();
            model.step(&mut cache, &[Chunk { sequence, start: 0, tokens: prompt[..19].to_vec() }]).unwrap();
            model.step(&mut cache, &[Chunk { sequence, start: 19, tokens: vec![prompt[19]] }]).unwrap()
        };
        let exact = run(&model, DType::F32);
        let scale = exact.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        let difference = max_difference(&run(&model, DType::BF16), &exact);
        assert!(difference <= 2e-2 * scale.max(1.0), "a bf16 cache: off by {difference:e}");
        // 8 bits and a scale per token and head: each value within half a scale
        let difference = max_difference(&run(&model, KvCache::INT8), &exact);
        assert!(difference <= 2e-2 * scale.max(1.0), "an 8-bit cache: off by {difference:e}");
        assert!(difference > 0.0, "an 8-bit cache rounds");
        for weights in [BaseDtype::Bf16, BaseDtype::Q8_0, BaseDtype::Q4_0] {
            let served = Inference::build(&config, weights, None, 0, &device).unwrap();
            assert!(served.weight_bytes() < model.weight_bytes(), "{weights:?}");
            assert_eq!(run(&served, served.dtype()).dims(), [1, 40]);
        }
        // a model candle cannot build is the model's problem, not the device's
        let narrow = Config::from_json(&json.replace("\"hidden_size\": 32", "\"hidden_size\": 16")).unwrap();
        let refused = Inference::build(&narrow, BaseDtype::Q4_0, None, 0, &device).err().unwrap();
        assert_eq!(refused.kind(), autobatch::ErrorKind::Model, "{refused}");
        assert!(refused.to_string().starts_with("building the model: "), "{refused}");
        let mixed = Inference::build(&config, BaseDtype::Bf16, Some(DType::F32), 0, &device);
        assert!(mixed.err().unwrap().to_string().contains("float weights compute in their dtype"));
    }
}
