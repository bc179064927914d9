//! What serving a config takes, counted from the config alone: the weights,
//! the KV cache per token and per sequence, and the worst step's own bytes,
//! as [`Serving`](super::Serving) allocates them; and the number vLLM's
//! formula gives for the same settings.

use candle_core::DType;
use serde::Serialize;

use super::config::Config;
use super::lora::BaseDtype;
use crate::Error;

/// How a config is served: its context, the prefill chunk, the cache's
/// blocks and dtype, the weights' dtype and the dtype it computes in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServingShape {
    /// Tokens each sequence's cache holds (`max_model_len`).
    pub context: usize,
    /// Tokens the worst step prefills (`max_num_batched_tokens`, at most the context).
    pub chunk: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// The weights' dtype.
    pub weights: BaseDtype,
    /// The dtype activations are computed in.
    pub dtype: DType,
    /// The cache's dtype.
    pub cache_dtype: DType,
    /// Counted for the CPU, where candle's matmul widens a bf16 or f16
    /// right-hand side to f32 before multiplying (a 49152 × 576 head takes
    /// 113 MB beside a 2 MB product, measured); not on an accelerator.
    pub on_cpu: bool,
}

/// The bytes of serving a config, counted.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ServingBytes {
    /// The weights as stored.
    pub weight_bytes: u64,
    /// Keys and values of one token over every layer: `2 × layers ×
    /// kv_heads × head_dim × bytes per element` (in 8 bits, each head's f32
    /// scale too).
    pub cache_bytes_per_token: u64,
    /// One block of the cache.
    pub block_bytes: u64,
    /// Tokens per block.
    pub block_size: usize,
    /// One sequence's cache at the context: its blocks, the last one whole
    /// (a sliding layer's, the blocks its decoding query still sees).
    pub cache_bytes_per_sequence: u64,
    /// The worst step's own bytes with one sequence (its prefill chunk alone;
    /// with sliding layers, the blocks its chunk's first queries see beyond a
    /// decoding sequence's).
    pub step_bytes: u64,
    /// What each other sequence's decoded token adds to the worst step at
    /// most (the steepest of its moments).
    pub step_bytes_per_sequence: u64,
    /// The step's widest moments (a layer's attention, its MLP, the head),
    /// each with one sequence and what each other sequence adds to it: the
    /// step's own bytes are the largest of them at a number of sequences.
    pub moments: [Moment; 3],
    /// The worst step's own bytes without the cached keys it reads: what
    /// vLLM's profile run (a forward pass of the chunk, no cache) measures.
    pub profile_bytes: u64,
    /// Tokens each sequence holds.
    pub context: usize,
}

impl Config {
    /// What serving takes under `shape`, counted as [`Serving`](super::Serving)
    /// allocates: the cache exactly, the worst step's tensors at its widest
    /// moment (a layer's MLP or its attention, the logits of each sequence's
    /// last token, the keys the prefilled sequence reads gathered from its
    /// blocks).
    pub fn serving_bytes(&self, shape: &ServingShape) -> Result<ServingBytes, Error> {
        self.family.check_generates("serve")?;
        if shape.block_size == 0 {
            return Err(Error::zero(crate::Setting::BlockSize));
        }
        let cache_bytes_per_token = super::KvCache::block_bytes(self, 1, shape.cache_dtype);
        let block_bytes = cache_bytes_per_token.saturating_mul(shape.block_size as u64);
        let blocks = shape.context.div_ceil(shape.block_size) as u64;
        let chunk = shape.chunk.min(shape.context);
        // the layers that keep every key hold the context; a sliding layer its
        // window at the step (a decoding sequence's, and the prefilling one's
        // wider by what its chunk's first queries still see)
        let (cache, sliding) = (shape.cache_dtype, true);
        let full_block = super::KvCache::group_block_bytes(self, shape.block_size, cache, !sliding);
        let window_block = super::KvCache::group_block_bytes(self, shape.block_size, cache, sliding);
        let window_blocks = |last_step: usize| {
            super::KvCache::window_blocks_for(
                self,
                shape.block_size,
                shape.context.saturating_sub(last_step),
                last_step,
            )
        };
        let cache_bytes_per_sequence =
            blocks.saturating_mul(full_block).saturating_add((window_blocks(1) as u64).saturating_mul(window_block));
        let prefill_window =
            (window_blocks(chunk).saturating_sub(window_blocks(1)) as u64).saturating_mul(window_block);
        let moments = |tokens: f64, sequences: f64, gathered: f64| self.moments(shape, tokens, sequences, gathered);
        let (one, two) =
            (moments(chunk as f64, 1.0, shape.context as f64), moments(chunk as f64 + 1.0, 2.0, shape.context as f64));
        // each moment is a line in the sequences: its bytes with one (and the
        // prefilling sequence's wider window), and the slope
        let moments = [0, 1, 2].map(|k| Moment {
            at_one: (one[k].ceil() as u64).saturating_add(prefill_window),
            per_sequence: (two[k] - one[k]).max(0.0).ceil() as u64,
        });
        let widest = |bytes: [f64; 3]| bytes.into_iter().fold(0.0, f64::max).ceil() as u64;
        Ok(ServingBytes {
            weight_bytes: self.serving_weight_bytes(shape.weights, shape.dtype),
            cache_bytes_per_token,
            block_bytes,
            block_size: shape.block_size,
            cache_bytes_per_sequence,
            step_bytes: widest(one).saturating_add(prefill_window),
            step_bytes_per_sequence: moments.iter().map(|m| m.per_sequence).max().unwrap_or(0),
            moments,
            profile_bytes: widest(self.moments(shape, chunk as f64, 1.0, 0.0)),
            context: shape.context,
        })
    }

    /// The weights stored as `weights`: the projections quantized under
    /// q8_0 or q4_0 (34 or 18 bytes a block of 32), the rest in `dtype`.
    fn serving_weight_bytes(&self, weights: BaseDtype, dtype: DType) -> u64 {
        let total = self.parameter_count();
        match weights.float() {
            Some(float) => total.saturating_mul(float.size_in_bytes() as u64),
            None => {
                // one layer's projections times the layers: no list as long as the layers
                let one = Config { layers: 1, ..self.clone() };
                let per_layer: u64 =
                    one.projections().iter().map(|&(_, out, input)| (out as u64).saturating_mul(input as u64)).sum();
                let projections = per_layer.saturating_mul(self.layers as u64).min(total);
                let block = if weights == BaseDtype::Q8_0 { 34 } else { 18 };
                (projections.div_ceil(32).saturating_mul(block))
                    .saturating_add((total - projections).saturating_mul(dtype.size_in_bytes() as u64))
            }
        }
    }

    /// The worst step's own bytes at its widest moment: `tokens` run through
    /// the layers, `sequences` logits rows, and `gathered` keys the widest
    /// chunk reads from the cache (`0`: none, as vLLM's profile run).
    fn moments(&self, shape: &ServingShape, tokens: f64, sequences: f64, gathered: f64) -> [f64; 3] {
        let d = shape.dtype.size_in_bytes() as f64;
        let (h, i, vocab) = (self.hidden as f64, self.intermediate as f64, self.vocab as f64);
        let (q, kv) = ((self.heads * self.head_dim) as f64, (self.kv_heads * self.head_dim) as f64);
        // a layer's attention: its input and normed copy, the queries, keys
        // and values, the rotated queries and keys; the keys and values the
        // prefilled chunk reads, copied out of their blocks and made
        // contiguous; a block of its scores in f32 (the scores, less their
        // maximum, their exponentials; in a narrower dtype also the product
        // before widening and the weights narrowed again)
        let chunk = (tokens - sequences + 1.0).max(1.0);
        let block = crate::ops::DEFAULT_BLOCK as f64;
        let scores = self.heads as f64 * chunk.min(block) * gathered.min(block);
        let widened = if d < 4.0 { 2.0 * d } else { 0.0 };
        let attention = tokens * d * (2.0 * h + 2.0 * q + 3.0 * kv)
            + 2.0 * gathered * kv * (shape.cache_dtype.size_in_bytes() as f64 + d)
            + scores * (12.0 + widened);
        // a layer's MLP: its input, the residual and the normed copy; the
        // gate, its activation, the up projection and their product
        let mlp = tokens * d * (3.0 * h + 4.0 * i) + self.weight_copies(shape, h * i, true);
        // the head: the last layer's output, each sequence's last row, its
        // logits and their f32 copy
        let head =
            tokens * h * d + sequences * (h * d + vocab * (d + 4.0)) + self.weight_copies(shape, h * vocab, false);
        [attention, mlp, head]
    }

    /// The copies a matmul makes of a weight of `elements`: a quantized
    /// projection's (`quantized`) dequantized in f32 and then in the dtype
    /// it computes in; on the CPU in bf16 or f16, the weight widened to f32.
    fn weight_copies(&self, shape: &ServingShape, elements: f64, quantized: bool) -> f64 {
        let d = shape.dtype.size_in_bytes() as f64;
        let dequantized = if quantized && shape.weights.quantized().is_some() { elements * (4.0 + d) } else { 0.0 };
        let widened = if shape.on_cpu && d < 4.0 { elements * 4.0 } else { 0.0 };
        dequantized + widened
    }
}

/// One moment of the worst step: its bytes with one sequence, and what each
/// other sequence adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Moment {
    /// The bytes with one sequence (the prefill chunk alone).
    pub at_one: u64,
    /// What each other sequence's decoded token adds.
    pub per_sequence: u64,
}

impl ServingBytes {
    /// The worst step's own bytes with `sequences` sequences: its widest moment.
    pub fn step_bytes_at(&self, sequences: usize) -> u64 {
        let others = sequences.saturating_sub(1) as u64;
        self.moments.iter().map(|m| m.at_one.saturating_add(m.per_sequence.saturating_mul(others))).max().unwrap_or(0)
    }

    /// What `sequences` sequences take beside what is `held`: the weights,
    /// their caches and the worst step.
    pub fn bytes_at(&self, sequences: usize, held_bytes: u64) -> u64 {
        held_bytes
            .saturating_add(self.weight_bytes)
            .saturating_add(self.cache_bytes_per_sequence.saturating_mul(sequences as u64))
            .saturating_add(self.step_bytes_at(sequences))
    }

    /// What `sequences` sequences surely take beside what is `held`: the
    /// weights and their caches, in whole blocks, without the step's own
    /// bytes (a count a measurement could settle either way). A lower bound:
    /// what only this passes the limit cannot fit, whatever a step measures.
    pub fn least_bytes_at(&self, sequences: usize, held_bytes: u64) -> u64 {
        held_bytes
            .saturating_add(self.weight_bytes)
            .saturating_add(self.cache_bytes_per_sequence.saturating_mul(sequences as u64))
    }

    /// The most sequences whose caches and worst step fit under `limit_bytes`
    /// beside what is `held` (other than the weights); 0 when none does.
    pub fn max_sequences(&self, limit_bytes: u64, held_bytes: u64) -> usize {
        let fits = |n: usize| self.bytes_at(n, held_bytes) <= limit_bytes;
        if !fits(1) {
            return 0;
        }
        // bytes_at grows with n: bisect between a fit and a bound past it
        let most = limit_bytes / (self.cache_bytes_per_sequence + self.step_bytes_per_sequence).max(1) + 1;
        crate::config::last_fitting(1, usize::try_from(most).unwrap_or(usize::MAX).max(2), fits)
    }

    /// vLLM's number of cache blocks at `limit_bytes` (its `gpu_memory_utilization
    /// × total`): what is left past `held_bytes`, the weights and the profile
    /// run's own bytes, in whole blocks (`determine_available_memory`, then
    /// `available // page_size` in vLLM v1).
    pub fn vllm_blocks(&self, limit_bytes: u64, held_bytes: u64) -> u64 {
        let used = held_bytes.saturating_add(self.weight_bytes).saturating_add(self.profile_bytes);
        limit_bytes.saturating_sub(used) / self.block_bytes.max(1)
    }

    /// vLLM's "maximum concurrency for `context` tokens per request": its
    /// blocks' tokens over the context.
    pub fn vllm_concurrency(&self, limit_bytes: u64, held_bytes: u64) -> f64 {
        (self.vllm_blocks(limit_bytes, held_bytes) * self.block_size as u64) as f64 / self.context.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_past_64_bits_saturate_and_fit_nothing() {
        let config = Config::from_json(
            r#"{"model_type": "llama", "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 32, "max_position_embeddings": 64}"#,
        )
        .unwrap();
        let shape = |context, block_size| ServingShape {
            context,
            chunk: 16,
            block_size,
            weights: BaseDtype::F32,
            dtype: DType::F32,
            cache_dtype: DType::F32,
            on_cpu: false,
        };
        for (context, block) in [(usize::MAX, 16), (64, usize::MAX)] {
            let counted = config.serving_bytes(&shape(context, block)).unwrap();
            assert_eq!(counted.cache_bytes_per_sequence, u64::MAX, "{context} {block}");
            assert_eq!(counted.max_sequences(u64::MAX / 2, 0), 0);
        }
        // the count in range is the arithmetic: 2 × 2 layers × 2 kv heads × 4 dims × 4 bytes
        assert_eq!(config.serving_bytes(&shape(64, 16)).unwrap().cache_bytes_per_token, 128);
    }
}
