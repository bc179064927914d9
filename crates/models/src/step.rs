//! What one sample adds to a config model's training step on candle, counted
//! from the ops the step runs: candle keeps every op's output of the forward
//! pass until the loss is dropped (each op holds its inputs), so the bytes a
//! sample adds are the sum of those outputs, and then what the backward pass
//! holds beside them at its widest. The estimate's model of a step
//! (`estimate --config`), checked against the probe's measurement.

use candle_core::DType;

use super::config::{AttentionBias, BertHead, Config};
use super::{Attention, Loss, Ops, Training};
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
    /// The fused ops ([`Ops::Fused`]): each one tensor kept.
    fused: bool,
}

impl Widths {
    /// An RMS norm of width `w` (candle-nn's `rms_norm_slow`: squared,
    /// divided, scaled; in f32 for a 16-bit input).
    fn rms_norm(&self, w: f64) -> f64 {
        if self.fused {
            w * self.d
        } else if self.widened {
            4.0 * w * 3.0 + 2.0 * w * 2.0
        } else {
            3.0 * w * self.d
        }
    }

    /// A layer norm of width `w` (candle-nn's `layer_norm_slow`: centred,
    /// squared, divided, scaled, shifted).
    fn layer_norm(&self, w: f64) -> f64 {
        if self.fused {
            w * self.d
        } else if self.widened {
            4.0 * w * 4.0 + 2.0 * w * 3.0
        } else {
            5.0 * w * self.d
        }
    }

    /// A projection to `out` features: the product, and the bias added
    /// (one tensor fused).
    fn linear(&self, out: f64, bias: bool) -> f64 {
        out * self.d * if bias && !self.fused { 2.0 } else { 1.0 }
    }

    /// A projection to `out` features added to the residual stream: the
    /// product (with its bias) and the sum, one tensor fused.
    fn residual_linear(&self, out: f64, bias: bool) -> f64 {
        if self.fused { out * self.d } else { self.linear(out, bias) + out * self.d }
    }

    /// Heads split from a projection's output and made contiguous: a copy of
    /// `w`, none fused (the heads are views).
    fn heads(&self, w: f64) -> f64 {
        if self.fused { 0.0 } else { w * self.d }
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
            fused: training.ops == Ops::Fused,
        };
        let eager = training.attention == Attention::Eager;
        // per layer, per token: the block, its attention, its adapters
        let attention = self.attention_bytes(&w, s, eager);
        let mut block = self.block(&w, eager) + self.adapters_bytes(&w, training);
        block.kept += attention.kept;
        // the fused MLP's moment and blocked attention's are apart; the eager ones' overlap
        block.backward =
            if w.fused { block.backward.max(attention.backward) } else { block.backward + attention.backward };
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

    /// Bytes the fused MLP's backward pass takes whatever the batch once a
    /// step has more rows than its block ([`Ops::Fused`]: the activation's
    /// derivative and the halves' gradients computed 64 rows at a time, in
    /// f32 beside a 16-bit model); 0 with the eager ops, whose temporaries
    /// grow with the batch (`bytes_per_sample` counts them).
    pub fn mlp_block_bytes(&self, training: &Training) -> Result<u64, Error> {
        if training.ops == Ops::Eager {
            return Ok(0);
        }
        let dtype = self.model_dtype(training)?;
        // measured: about three block-sized tensors at once in f32, six f32 ones beside a 16-bit model
        let per_value = if dtype == DType::F32 { 3 * 4 } else { 6 * 4 };
        let rows = super::ops::ROWS_AT_ONCE as u64;
        rows.checked_mul(self.intermediate as u64)
            .and_then(|values| values.checked_mul(per_value))
            .ok_or_else(|| Error::byte_overflow(format!("an MLP block of {}", self.describe(training))))
    }

    /// One layer's tensors but attention's and the adapters'.
    fn block(&self, w: &Widths, eager_attention: bool) -> PerToken {
        let d = w.d;
        // an MLP's activation (and a gate's product): kept eager, recomputed fused
        let activation = |width: f64| if w.fused { 0.0 } else { width * d };
        match self.family {
            Family::Gpt2 => PerToken {
                // ln_1, c_attn with its bias, q/k/v made contiguous, c_proj and the
                // residual, ln_2, c_fc, gelu, c_proj and the residual
                kept: 2.0 * w.layer_norm(w.h)
                    + w.linear(3.0 * w.h, true)
                    + 3.0 * if eager_attention { w.h * d } else { w.heads(w.h) }
                    + w.residual_linear(w.h, true)
                    + w.linear(w.i, true)
                    + activation(w.i)
                    + w.residual_linear(w.h, true),
                backward: self.mlp_backward(w, true),
            },
            Family::Bert => PerToken {
                // query, key, value with biases, made contiguous, the output and its
                // residual, its norm, the intermediate, gelu, the output and its
                // residual, its norm
                kept: 3.0 * w.linear(w.h, true)
                    + 3.0 * if eager_attention { w.h * d } else { w.heads(w.h) }
                    + w.residual_linear(w.h, true)
                    + w.layer_norm(w.h)
                    + w.linear(w.i, true)
                    + activation(w.i)
                    + w.residual_linear(w.h, true)
                    + w.layer_norm(w.h),
                backward: self.mlp_backward(w, true),
            },
            _ => {
                let qkv_bias = self.attention_bias != AttentionBias::None;
                let qk_norms = if self.family == Family::Qwen3 { w.rms_norm(w.q) + w.rms_norm(w.kv) } else { 0.0 };
                // eager: a half negated, the halves joined, two products, their sum;
                // fused: one tensor, none inside blocked attention
                let rotary = match (w.fused, eager_attention) {
                    (false, _) => 4.5 * (w.q + w.kv) * d,
                    (true, true) => (w.q + w.kv) * d,
                    (true, false) => 0.0,
                };
                let contiguous = if eager_attention && w.fused { 2.0 * w.kv * d } else { w.heads(w.q + 2.0 * w.kv) };
                PerToken {
                    // the input norm, q/k/v (made contiguous eager), the q/k norms,
                    // rotary positions on q and k, o and the residual, the post norm,
                    // gate, up, silu and their product, down and the residual
                    kept: 2.0 * w.rms_norm(w.h)
                        + w.linear(w.q, qkv_bias)
                        + 2.0 * w.linear(w.kv, qkv_bias)
                        + contiguous
                        + qk_norms
                        + rotary
                        + w.residual_linear(w.h, self.attention_bias == AttentionBias::All)
                        + 2.0 * w.linear(w.i, self.mlp_bias)
                        + 2.0 * activation(w.i)
                        + w.residual_linear(w.h, self.mlp_bias),
                    backward: self.mlp_backward(w, false) + 4.0 * (w.q + 2.0 * w.kv) * d,
                }
            }
        }
    }

    /// The widest moment of the backward pass through the MLP: eager, the
    /// gradients of its intermediates with their sums (GELU's backward
    /// about twice SiLU's temporaries, with the attention's beside); fused,
    /// the gradients of its two halves (or of one with GELU), the
    /// activation's recomputed a block of rows at a time.
    fn mlp_backward(&self, w: &Widths, gelu: bool) -> f64 {
        match (w.fused, gelu) {
            (false, true) => 16.0 * w.i * w.d + 12.0 * w.h * w.d,
            (false, false) => 8.0 * w.i * w.d,
            (true, true) => 2.0 * w.i * w.d + 4.0 * w.h * w.d,
            (true, false) => 2.0 * w.i * w.d,
        }
    }

    /// Attention's tensors per token at `s` tokens: blocked, the output (and
    /// its heads joined) and each row's log-sum-exp; eager, the scores, their
    /// scaling, the mask added and the softmax's three tensors of `s` per
    /// head, and grouped keys and values repeated.
    fn attention_bytes(&self, w: &Widths, s: f64, eager: bool) -> PerToken {
        let output = if w.fused { w.q * w.d } else { 2.0 * w.q * w.d };
        if !eager {
            // the backward pass's blocks of scores, their weights and gradients
            // (about five `block × block` tensors a head in f32, a sample's at
            // once: per token, over its `s`), measured; BERT's bidirectional
            // pass holds some eight f32 tensors of the queries' width beside
            // them (the gradients' blocks and their joins), measured too
            let backward = if w.fused {
                let block = s.min(super::ops::DEFAULT_BLOCK as f64);
                let joined = if self.family == Family::Bert { 32.0 * w.q } else { 0.0 };
                20.0 * w.heads * block * block / s + joined
            } else {
                0.0
            };
            return PerToken { kept: output + 4.0 * w.heads, backward };
        }
        // the scores, scaled, masked and their softmax's three tensors (one fused)
        let scores = if w.fused { 4.0 } else { 6.0 } * w.heads * s * w.d;
        let repeated = if self.kv_heads < self.heads { 2.0 * w.q * w.d } else { 0.0 };
        // the softmax's backward: the gradients of its output, its numerator and
        // denominator, the difference, the scaled scores, about eight at once
        // (six fused: the gradient, its products with the weights, the row sums' share)
        let backward = if w.fused { 6.0 } else { 8.0 } * w.heads * s * w.d;
        PerToken { kept: output + scores + repeated, backward }
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
