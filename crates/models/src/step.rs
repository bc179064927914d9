//! What one sample adds to a config model's training step on candle, counted
//! from the ops the step runs: candle keeps every op's output of the forward
//! pass until the loss is dropped (each op holds its inputs), so the bytes a
//! sample adds are the sum of those outputs, and then what the backward pass
//! holds beside them at its widest. The estimate's model of a step
//! (`estimate --config`), checked against the probe's measurement.

use candle_core::DType;

use super::config::{AttentionBias, BertHead, Config};
use super::{Attention, Loss, Training};
use crate::family::Family;
use autobatch::Error;

/// Bytes per token of the tensors the forward pass keeps, and of the widest
/// moment of the backward pass beside them.
#[derive(Clone, Copy, Debug, Default)]
struct PerToken {
    kept: f64,
    backward: f64,
}

impl std::ops::Add for PerToken {
    type Output = PerToken;

    fn add(self, other: PerToken) -> PerToken {
        PerToken { kept: self.kept + other.kept, backward: self.backward + other.backward }
    }
}

/// The widths a layer's tensors have, and their dtypes' bytes.
struct Widths {
    h: f64,
    q: f64,
    kv: f64,
    i: f64,
    vocab: f64,
    heads: f64,
    /// The model's dtype (weights, activations).
    d: f64,
    /// Whether norms compute in f32 beside a 16-bit dtype (a copy each way).
    widened: bool,
}

impl Widths {
    /// An RMS norm of width `w` (candle-nn's `rms_norm_slow`: squared,
    /// divided, scaled; in f32 for a 16-bit input).
    fn rms_norm(&self, w: f64) -> f64 {
        if self.widened {
            4.0 * w * 3.0 + 2.0 * w * 2.0
        } else {
            3.0 * w * self.d
        }
    }

    /// A layer norm of width `w` (candle-nn's `layer_norm_slow`: centred,
    /// squared, divided, scaled, shifted).
    fn layer_norm(&self, w: f64) -> f64 {
        if self.widened {
            4.0 * w * 4.0 + 2.0 * w * 3.0
        } else {
            5.0 * w * self.d
        }
    }

    /// A projection to `out` features: the product, and the bias added.
    fn linear(&self, out: f64, bias: bool) -> f64 {
        out * self.d * if bias { 2.0 } else { 1.0 }
    }
}

impl Config {
    /// Bytes one sample adds to a training step of this model as
    /// `training` runs it on candle (the eager or the lean attention and
    /// loss, checkpointing, LoRA), from the config alone: the forward pass's
    /// tensors, which candle keeps until the loss is dropped, and the widest
    /// moment of the backward pass beside them. What `estimate --config`
    /// counts, within 15% of what the probe measures on the reference
    /// families (crates/models/tests/measured/models.rs).
    pub fn bytes_per_sample(&self, training: &Training) -> Result<u64, Error> {
        let dtype = self.model_dtype(training)?;
        let s = training.seq_len as f64;
        let w = Widths {
            h: self.hidden as f64,
            q: (self.heads * self.head_dim) as f64,
            kv: (self.kv_heads * self.head_dim) as f64,
            i: self.intermediate as f64,
            vocab: self.vocab as f64,
            heads: self.heads as f64,
            d: dtype.size_in_bytes() as f64,
            widened: dtype != DType::F32,
        };
        let eager = training.attention == Attention::Eager;
        // per layer, per token: the block, its attention, its adapters
        let block = self.block(&w) + self.attention_bytes(&w, s, eager) + self.adapters_bytes(&w, training);
        let (embedding, head) = (self.embedding_bytes(&w), self.head_bytes(&w, training.loss));
        let layers = self.layers as f64;
        let kept = if training.checkpointing {
            // each layer's input; one layer's whole forward again while its backward runs
            embedding + layers * w.h * w.d + block.kept + head.kept
        } else {
            embedding + layers * block.kept + head.kept
        };
        let backward = block.backward.max(head.backward);
        let bytes = s * (kept + backward);
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(Error::byte_overflow(format!("a sample of {}", self.describe(training))));
        }
        Ok(bytes.ceil() as u64)
    }

    /// Bytes the chunked loss takes whatever the batch while a sample takes
    /// fewer rows than a chunk's least ([`MIN_CHUNK_ROWS`](super::ops::MIN_CHUNK_ROWS)):
    /// a chunk's logits, probabilities and gradient (twice) in f32. 0 for
    /// the full loss (its logits grow with the batch) and a classifier.
    pub fn loss_chunk_bytes(&self, training: &Training) -> u64 {
        match (training.loss, self.family, self.bert_head) {
            (Loss::Full, _, _) | (_, Family::Bert, BertHead::Classification { .. }) => 0,
            _ => (super::ops::MIN_CHUNK_ROWS as u64).saturating_mul(self.vocab as u64).saturating_mul(16),
        }
    }

    /// One layer's tensors but attention's and the adapters'.
    fn block(&self, w: &Widths) -> PerToken {
        let d = w.d;
        match self.family {
            Family::Gpt2 => PerToken {
                // ln_1, c_attn with its bias, q/k/v made contiguous, c_proj, the
                // residual, ln_2, c_fc, gelu, c_proj, the residual
                kept: 2.0 * w.layer_norm(w.h)
                    + w.linear(3.0 * w.h, true)
                    + 3.0 * w.h * d
                    + w.linear(w.h, true)
                    + w.h * d
                    + w.linear(w.i, true)
                    + w.i * d
                    + w.linear(w.h, true)
                    + w.h * d,
                // gelu's backward holds about twice silu's temporaries
                backward: 16.0 * w.i * d + 12.0 * w.h * d,
            },
            Family::Bert => PerToken {
                // query, key, value with biases, made contiguous, the output and its
                // norm, the intermediate, gelu, the output and its norm
                kept: 3.0 * w.linear(w.h, true)
                    + 3.0 * w.h * d
                    + w.linear(w.h, true)
                    + w.h * d
                    + w.layer_norm(w.h)
                    + w.linear(w.i, true)
                    + w.i * d
                    + w.linear(w.h, true)
                    + w.h * d
                    + w.layer_norm(w.h),
                // gelu's backward holds about twice silu's temporaries
                backward: 16.0 * w.i * d + 12.0 * w.h * d,
            },
            _ => {
                let qkv_bias = self.attention_bias != AttentionBias::None;
                let qk_norms = if self.family == Family::Qwen3 { w.rms_norm(w.q) + w.rms_norm(w.kv) } else { 0.0 };
                PerToken {
                    // the input norm, q/k/v, made contiguous, the q/k norms, rotary
                    // positions on q and k (a half negated, the halves joined, two
                    // products, their sum), o, the residual, the post norm, gate,
                    // up, silu, their product, down, the residual
                    kept: 2.0 * w.rms_norm(w.h)
                        + w.linear(w.q, qkv_bias)
                        + 2.0 * w.linear(w.kv, qkv_bias)
                        + (w.q + 2.0 * w.kv) * d
                        + qk_norms
                        + 4.5 * (w.q + w.kv) * d
                        + w.linear(w.h, self.attention_bias == AttentionBias::All)
                        + w.h * d
                        + 2.0 * w.linear(w.i, self.mlp_bias)
                        + 2.0 * w.i * d
                        + w.linear(w.h, self.mlp_bias)
                        + w.h * d,
                    // the backward pass through the MLP and attention: the gradients of
                    // gate, up, silu and their product with their sums, of q, k, v
                    backward: 8.0 * w.i * d + 4.0 * (w.q + 2.0 * w.kv) * d,
                }
            }
        }
    }

    /// Attention's tensors per token at `s` tokens: blocked, the output (and
    /// its heads joined) and each row's log-sum-exp; eager, the scores, their
    /// scaling, the mask added and the softmax's three tensors of `s` per
    /// head, and grouped keys and values repeated.
    fn attention_bytes(&self, w: &Widths, s: f64, eager: bool) -> PerToken {
        let output = 2.0 * w.q * w.d;
        if !eager {
            return PerToken { kept: output + 4.0 * w.heads, backward: 0.0 };
        }
        let scores = 6.0 * w.heads * s * w.d;
        let repeated = if self.kv_heads < self.heads { 2.0 * w.q * w.d } else { 0.0 };
        // the softmax's backward: the gradients of its output, its numerator
        // and denominator, the difference, the scaled scores, about eight at once
        PerToken { kept: output + scores + repeated, backward: 8.0 * w.heads * s * w.d }
    }

    /// LoRA's adapters per token: for each projection a layer adapts, the
    /// input in the adapters' dtype, its product with A and the scaling, the
    /// product with B, back in the model's dtype, and the sum.
    fn adapters_bytes(&self, w: &Widths, training: &Training) -> PerToken {
        let Some(lora) = &training.lora else { return PerToken::default() };
        let adapter = lora.adapter_dtype(if w.d == 4.0 { DType::F32 } else { DType::BF16 }).size_in_bytes() as f64;
        let kept = Config { layers: 1, ..self.clone() }
            .projections()
            .into_iter()
            .filter(|(name, _, _)| lora.targets(name))
            .map(|(_, out, input)| {
                let cast = if adapter != w.d { input as f64 * adapter + out as f64 * w.d } else { 0.0 };
                cast + 2.0 * lora.rank as f64 * adapter + out as f64 * adapter + out as f64 * w.d
            })
            .sum();
        PerToken { kept, backward: 0.0 }
    }

    /// The embeddings' tensors per token.
    fn embedding_bytes(&self, w: &Widths) -> f64 {
        match self.family {
            // the token rows, the positions added
            Family::Gpt2 => 2.0 * w.h * w.d,
            // the word rows, positions and token types added, the norm
            Family::Bert => 3.0 * w.h * w.d + w.layer_norm(w.h),
            _ => w.h * w.d,
        }
    }

    /// The head's and the loss's tensors per token: the final norm (BERT's
    /// transform), then, chunked, the gradient of the hidden states the
    /// fused loss computes in the forward pass; in full, the logits, their
    /// f32 copy and log-softmax's three tensors kept, and their gradients at
    /// the start of the backward pass.
    fn head_bytes(&self, w: &Widths, loss: Loss) -> PerToken {
        let (norm, rows) = match (self.family, self.bert_head) {
            (Family::Bert, BertHead::Classification { .. }) => return PerToken::default(),
            // the transform with its bias, gelu, its norm; about 15% of the rows predicted
            (Family::Bert, BertHead::MaskedLm) => (w.linear(w.h, true) + w.h * w.d + w.layer_norm(w.h), 0.15),
            (Family::Gpt2, _) => (w.layer_norm(w.h), 1.0),
            _ => (w.rms_norm(w.h), 1.0),
        };
        match loss {
            // a chunk's logits hold about as many values as the hidden states: its
            // logits, probabilities and gradient (twice) in f32 beside them
            Loss::Chunked => PerToken { kept: norm + rows * w.h * w.d, backward: rows * 16.0 * w.h },
            Loss::Full => {
                let widened = if w.d == 4.0 { 0.0 } else { 4.0 };
                let bias = if self.family == Family::Bert && self.tie_embeddings { w.d } else { 0.0 };
                PerToken {
                    kept: norm + w.vocab * (w.d + bias + widened + 12.0),
                    // log-softmax's backward: the gradients of its output, of the
                    // difference (two summed), of the exponentials, of the logits
                    backward: w.vocab * 24.0,
                }
            }
        }
    }
}
