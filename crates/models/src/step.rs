//! What one sample adds to a config model's training step on candle, counted
//! from the ops the step runs: candle keeps every op's output of the forward
//! pass until the loss is dropped (each op holds its inputs), so the bytes a
//! sample adds are the sum of those outputs, and then what the backward pass
//! holds beside them at its widest. The estimate's model of a step
//! (`estimate --config`), checked against the probe's measurement.

use candle_core::DType;

use super::config::Config;
use super::{Attention, Loss, Ops, Training};
use crate::Error;
use crate::per_token::{PerToken, Widths};

/// Where a config model's training step computes: the CPU widens what the
/// accelerator computes in bf16 (candle's CPU matmul has no bf16 kernel: both
/// operands and the product are made f32 for it), so the same step holds
/// more there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compute {
    /// A CUDA device (the default): each op in the dtype it is given.
    #[default]
    Accelerator,
    /// The CPU heap, as `probe --device cpu` measures it: the matmul
    /// buffers each of this host's threads keeps counted too
    /// ([`HeapMeter::host_scratch_bytes`](autobatch::HeapMeter::host_scratch_bytes)).
    Cpu,
}

/// One moment of a training step: what it holds beside the training state
/// (`fixed_bytes`, plus the gradients when `holds_gradients`) and what each
/// sample adds then. A step's peak is the widest of its moments at a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StepMoment {
    /// What the moment is.
    pub name: &'static str,
    /// Whether the parameters' gradients exist then (the backward pass and
    /// after), or not yet (the forward pass, the loss).
    pub holds_gradients: bool,
    /// Bytes held whatever the batch, beside the weights, the optimizer's
    /// state and (when held) the gradients.
    pub fixed_bytes: u64,
    /// Bytes each sample adds.
    pub bytes_per_sample: u64,
    /// The chunked loss's chunk of logits, when this is its moment.
    pub chunk: Option<LossChunk>,
}

/// The chunked loss's chunk of logits ([`ChunkedCrossEntropy`](crate::ops::ChunkedCrossEntropy)):
/// `⌈n / rows_per_chunk_row⌉` rows of the step's `n` predicted rows, at
/// least [`MIN_CHUNK_ROWS`](crate::ops::MIN_CHUNK_ROWS) and at most `n`
/// (a frozen head's: `frozen_rows` at most), each row `bytes_per_row`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LossChunk {
    /// Rows a sample predicts, in thousandths (BERT predicts about 15%).
    pub milli_rows_per_sample: u64,
    /// Rows of the step per row of a chunk: `⌈vocab / hidden⌉`.
    pub rows_per_chunk_row: u64,
    /// Bytes a chunk's row holds (its logits in f32, several at once).
    pub bytes_per_row: u64,
    /// Where the head is frozen, the rows of a chunk whatever the batch
    /// ([`FROZEN_HEAD_CHUNK_ELEMENTS`](crate::ops::FROZEN_HEAD_CHUNK_ELEMENTS)
    /// over the vocabulary).
    pub frozen_rows: Option<u64>,
}

impl LossChunk {
    /// The chunk's bytes at `batch`.
    fn bytes(&self, batch: u64) -> Option<u64> {
        let rows = batch.checked_mul(self.milli_rows_per_sample)?.div_ceil(1000);
        let chunk_rows = match self.frozen_rows {
            Some(most) => rows.min(most.max(1)),
            None => rows.div_ceil(self.rows_per_chunk_row.max(1)).max(rows.min(crate::ops::MIN_CHUNK_ROWS as u64)),
        };
        chunk_rows.checked_mul(self.bytes_per_row)
    }
}

impl StepMoment {
    /// The moment's bytes at `batch`, `gradient_bytes` counted when it holds them.
    pub fn bytes(&self, gradient_bytes: u64, batch: u64) -> Option<u64> {
        let chunk = match &self.chunk {
            Some(chunk) => chunk.bytes(batch)?,
            None => 0,
        };
        self.bytes_per_sample
            .checked_mul(batch)?
            .checked_add(self.fixed_bytes)?
            .checked_add(chunk)?
            .checked_add(if self.holds_gradients { gradient_bytes } else { 0 })
    }
}

/// What a config model's training step holds beside its training state, at
/// each of its widest moments: the middle of the backward pass (every kept
/// activation and the widest of the gradients in flight), the chunked loss in
/// the forward pass (its chunk of logits, the head's gradient in f32, on the
/// CPU the head's weight widened to f32), the head's gradient narrowed at the
/// loss's end, and the embedding's gradient made whole at the end of the
/// backward pass. Counted from the config ([`Config::step_memory`]).
///
/// ```
/// use autobatch_models::{Compute, Config, Training};
/// let config = Config::from_json(r#"{"model_type": "llama", "vocab_size": 151936, "hidden_size": 64,
///     "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "tie_word_embeddings": true}"#)?;
/// let step = config.step_memory(&Training::new(32), Compute::Cpu)?;
/// let gradients = config.parameter_count() * 4;
/// // a small batch: the chunked loss, its logits and the head's gradient summed in f32
/// assert_eq!(step.widest_at(gradients, 1).unwrap().name, "the chunked loss");
/// assert!(step.peak_bytes(gradients, 1)? > 151936 * 64 * 4 + 32 * 151936 * 4);
/// // a large one: the activations, in the middle of the backward pass
/// assert_eq!(step.widest_at(gradients, 100_000).unwrap().name, "the backward pass");
/// assert_eq!(step.largest_batch(gradients, step.peak_bytes(gradients, 40)?), 40);
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StepMemory {
    /// Where the step was counted for.
    pub compute: Compute,
    /// Each moment that can be the widest.
    pub moments: Vec<StepMoment>,
}

impl StepMemory {
    /// The step's peak beside the weights and the optimizer's state at
    /// `batch`, `gradient_bytes` the parameters' gradients (held by the
    /// moments of the backward pass).
    pub fn peak_bytes(&self, gradient_bytes: u64, batch: u64) -> Result<u64, Error> {
        let mut peak = 0u64;
        for moment in &self.moments {
            let bytes = moment
                .bytes(gradient_bytes, batch)
                .ok_or_else(|| Error::byte_overflow(format!("{} at a batch of {batch}", moment.name)))?;
            peak = peak.max(bytes);
        }
        Ok(peak)
    }

    /// The largest batch whose [`peak_bytes`](Self::peak_bytes) stays within
    /// `room` (what the ceiling leaves beside the weights and the optimizer's
    /// state); 0 when not even one sample does. Every moment grows with the
    /// batch: searched by halving, exact.
    pub fn largest_batch(&self, gradient_bytes: u64, room: u64) -> u64 {
        let fits = |batch: u64| self.peak_bytes(gradient_bytes, batch).is_ok_and(|bytes| bytes <= room);
        if !fits(1) {
            return 0;
        }
        let (mut fitting, mut over) = (1u64, 2u64);
        while fits(over) {
            fitting = over;
            match over.checked_mul(2) {
                Some(next) => over = next,
                None => return u64::MAX,
            }
        }
        while over - fitting > 1 {
            let middle = fitting + (over - fitting) / 2;
            if fits(middle) { fitting = middle } else { over = middle }
        }
        fitting
    }

    /// The bytes a sample adds once the batch is large: the steepest moment's.
    pub fn bytes_per_sample(&self) -> u64 {
        let slope = |moment: &StepMoment| {
            // a frozen head's chunk stops growing at its rows
            let chunk = moment.chunk.filter(|chunk| chunk.frozen_rows.is_none()).map_or(0, |chunk| {
                chunk.bytes_per_row.saturating_mul(chunk.milli_rows_per_sample) / 1000 / chunk.rows_per_chunk_row.max(1)
            });
            moment.bytes_per_sample.saturating_add(chunk)
        };
        self.moments.iter().map(slope).max().unwrap_or(0)
    }

    /// The bytes a sample adds around `batch`: the step's slope over the
    /// three batches `batch − 1`, `batch`, `batch + 1` (1 to 3 at the
    /// smallest), as a probe measures it there. Below the batch that fills
    /// the chunked loss's chunk it is steeper than
    /// [`bytes_per_sample`](Self::bytes_per_sample): each sample's rows of
    /// logits are then held whole.
    pub fn bytes_per_sample_at(&self, gradient_bytes: u64, batch: u64) -> Result<u64, Error> {
        let low = batch.saturating_sub(1).max(1);
        let high = low.checked_add(2).ok_or_else(|| Error::byte_overflow(format!("a step at a batch of {batch}")))?;
        let rise = self.peak_bytes(gradient_bytes, high)?.saturating_sub(self.peak_bytes(gradient_bytes, low)?);
        Ok(rise / 2)
    }

    /// The moment that is the widest at `batch`.
    pub fn widest_at(&self, gradient_bytes: u64, batch: u64) -> Option<&StepMoment> {
        self.moments.iter().max_by_key(|moment| moment.bytes(gradient_bytes, batch).unwrap_or(u64::MAX))
    }
}

/// f32 tensors of a chunk's logits the chunked loss holds at once: two,
/// each let go as the next is made (the logits and their shifted copy,
/// then the exponentials, the gradient and its scaled copy), whatever the
/// dtype and wherever it runs (issue 89: five, six on the CPU in bf16,
/// before).
fn chunk_tensors(compute: Compute, dtype: DType) -> u64 {
    let _ = (compute, dtype);
    2
}

impl Config {
    /// Bytes one sample adds to a training step of this model as
    /// `training` runs it on candle once the batch is large (the eager or
    /// the lean attention and loss, checkpointing, LoRA), from the config
    /// alone, counted for an accelerator: [`step_memory`](Self::step_memory)'s
    /// steepest moment. What `estimate --config` counts, within 15% of what
    /// the probe measures on the reference families
    /// (crates/models/tests/measured/models.rs).
    pub fn bytes_per_sample(&self, training: &Training) -> Result<u64, Error> {
        Ok(self.step_memory(training, Compute::Accelerator)?.bytes_per_sample())
    }

    /// What a training step of this model holds beside its training state
    /// at each of its widest moments, counted from the config for `compute`.
    pub fn step_memory(&self, training: &Training, compute: Compute) -> Result<StepMemory, Error> {
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
            worst_routing: training.routing == crate::Routing::Worst,
        };
        let eager = training.attention == Attention::Eager;
        // per layer, per token: the block, its attention, its adapters; for
        // each kind of layer (dense, sparse), the layers of it
        let attention = self.attention_bytes(&w, s, eager);
        let (mut layers_kept, mut block) = (0.0, PerToken::default());
        for (one, count) in self.layer_kinds().into_iter().filter(|(_, count)| *count > 0) {
            let mut kind = one.family.architecture().block_bytes(&one, &w, eager) + one.adapters_bytes(&w, training);
            kind.kept += attention.kept;
            // the fused MLP's moment and blocked attention's are apart; the eager ones' overlap
            kind.backward =
                if w.fused { kind.backward.max(attention.backward) } else { kind.backward + attention.backward };
            layers_kept += count as f64 * kind.kept;
            block = PerToken { kept: block.kept.max(kind.kept), backward: block.backward.max(kind.backward) };
        }
        let (embedding, head) =
            (self.family.architecture().embedding_bytes(self, &w), self.head_bytes(&w, training.loss));
        let layers = self.layers as f64;
        let kept = if training.checkpointing {
            // each layer's input; one layer's whole forward again while its backward
            // runs, beside its input made a variable, its output, the output times the
            // gradient coming back and that gradient (measured within 10%)
            embedding + layers * w.h * w.d + block.kept + 4.0 * w.h * w.d + head.kept
        } else {
            embedding + layers_kept + head.kept
        };
        let overflow = |what: &str| Error::byte_overflow(format!("{what} of {}", self.describe(training)));
        let bytes = |value: f64, what: &str| -> Result<u64, Error> {
            if !value.is_finite() || value >= u64::MAX as f64 {
                return Err(overflow(what));
            }
            Ok(value.ceil() as u64)
        };
        let per_sample = |per_token: f64| bytes(s * per_token, "a sample");
        let (v, h) = (self.vocab as u64, self.hidden as u64);
        let head_elements = v.checked_mul(h).ok_or_else(|| overflow("the head"))?;
        let vocab_sized =
            |bytes_per_value: u64| head_elements.checked_mul(bytes_per_value).ok_or_else(|| overflow("the head"));
        let trains_embeddings = training.lora.is_none();
        let mut moments = vec![StepMoment {
            name: "the backward pass",
            holds_gradients: true,
            fixed_bytes: self.mlp_block_bytes(training)?,
            bytes_per_sample: per_sample(kept + block.backward.max(head.backward) + self.in_flight(&w, compute))?,
            chunk: None,
        }];
        let family = self.family.architecture();
        let predicted_milli_rows = family.predicted_milli_rows(self);
        let predicts_tokens = predicted_milli_rows > 0;
        let native = dtype.size_in_bytes() as u64;
        // a decoder's full fine-tune makes the two tables' gradients once: the
        // head's in the loss, the lookup's rows added into it (or into the
        // embedding's own) in place; the backward pass counts them with the rest
        let once = training.loss == Loss::Chunked && !training.checkpointing && family.makes_table_gradients_once();
        if trains_embeddings && predicts_tokens && !once {
            // the loss hands the head's gradient to candle's backward pass, which
            // scales it by the loss's gradient and adds it to a zero tensor of its
            // own: three at once, before any other gradient is made (measured)
            let tenths = family.head_gradient_tenths();
            moments.push(StepMoment {
                name: "the head's gradient handed to the backward pass",
                holds_gradients: false,
                fixed_bytes: vocab_sized(native)?.checked_mul(tenths).ok_or_else(|| overflow("the head"))? / 10,
                bytes_per_sample: per_sample(kept)?,
                chunk: None,
            });
        }
        if trains_embeddings && !once {
            // candle's index_select backward: the rows added into a new table
            moments.push(StepMoment {
                name: "the embedding's gradient",
                holds_gradients: true,
                fixed_bytes: vocab_sized(native)?,
                bytes_per_sample: per_sample(kept)?,
                chunk: None,
            });
        }
        if training.loss == Loss::Chunked && predicts_tokens {
            // the head's gradient, summed in f32 over the chunks; the weight widened on the CPU
            let gradient = if trains_embeddings { vocab_sized(4)? } else { 0 };
            let widened = if compute == Compute::Cpu && dtype != DType::F32 { vocab_sized(4)? } else { 0 };
            // soft-capped logits: the cap's derivative kept beside the chunk's
            // tensors (the capped logits take the logits' place; measured with
            // Gemma 2's caps at 128 and 256 tokens, +3% and +12%)
            let capped = if self.final_softcap.is_some() { 1 } else { 0 };
            let tensors = chunk_tensors(compute, dtype) + capped;
            let chunk = LossChunk {
                milli_rows_per_sample: (training.seq_len as u64)
                    .checked_mul(predicted_milli_rows)
                    .ok_or_else(|| overflow("a sample"))?,
                rows_per_chunk_row: self.vocab.div_ceil(self.hidden.max(1)).max(1) as u64,
                bytes_per_row: v.checked_mul(4 * tensors).ok_or_else(|| overflow("the loss's chunk"))?,
                frozen_rows: (!trains_embeddings)
                    .then(|| crate::ops::default_chunk_rows(0, self.vocab, self.hidden, false) as u64),
            };
            moments.push(StepMoment {
                name: "the chunked loss",
                holds_gradients: false,
                fixed_bytes: gradient,
                bytes_per_sample: per_sample(kept)?,
                chunk: Some(chunk),
            });
            if widened > 0 {
                // the product on the CPU in 16 bits: the weight widened to f32 beside the
                // chunk's product in f32 and its narrowed copy, before the two tensors above
                let product =
                    LossChunk { bytes_per_row: v.checked_mul(6).ok_or_else(|| overflow("the loss's chunk"))?, ..chunk };
                moments.push(StepMoment {
                    name: "the chunked loss's product",
                    holds_gradients: false,
                    fixed_bytes: gradient.checked_add(widened).ok_or_else(|| overflow("the loss"))?,
                    bytes_per_sample: per_sample(kept)?,
                    chunk: Some(product),
                });
            }
            if trains_embeddings && dtype != DType::F32 {
                // the f32 sum narrowed to the model's dtype at the loss's end
                moments.push(StepMoment {
                    name: "the head's gradient narrowed",
                    holds_gradients: false,
                    fixed_bytes: vocab_sized(4 + native)?,
                    bytes_per_sample: per_sample(kept)?,
                    chunk: None,
                });
            }
        }
        if compute == Compute::Cpu {
            // the matmul buffers every thread keeps, part of each of its moments
            let scratch = autobatch::HeapMeter::host_scratch_bytes();
            moments.iter_mut().for_each(|moment| moment.fixed_bytes = moment.fixed_bytes.saturating_add(scratch));
        }
        Ok(StepMemory { compute, moments })
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
        // the widest MLP's: a dense one's, or an expert's where every layer is sparse
        let widest = self
            .layer_kinds()
            .into_iter()
            .filter(|(_, count)| *count > 0)
            .map(|(one, _)| {
                one.experts.map_or(one.intermediate, |experts| experts.intermediate.max(experts.shared.unwrap_or(0)))
            })
            .max()
            .unwrap_or(self.intermediate);
        rows.checked_mul(widest as u64)
            .and_then(|values| values.checked_mul(per_value))
            .ok_or_else(|| Error::byte_overflow(format!("an MLP block of {}", self.describe(training))))
    }

    /// Bytes per token the backward pass holds whatever the layer: the
    /// gradients in flight along the residual stream (each sum hands its
    /// gradient to both inputs, the norms' to theirs), about six of the
    /// hidden width (measured, from one layer to three; the family says);
    /// on the CPU in a
    /// 16-bit dtype, the widest projection's operands and product widened to
    /// f32 for its product and the product narrowed.
    fn in_flight(&self, w: &Widths, compute: Compute) -> f64 {
        let residual = self.family.architecture().residual_in_flight() * w.h * w.d;
        let widened = match compute {
            Compute::Cpu if w.d < 4.0 => (w.h + w.i) * 4.0 + w.i * w.d,
            _ => 0.0,
        };
        residual + widened
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
                let joined = self.family.architecture().attention_backward_beside() * w.q;
                20.0 * w.heads * block * block / s + joined
            } else {
                0.0
            };
            return PerToken { kept: output + 4.0 * w.heads, backward };
        }
        // the scores, scaled, masked and their softmax's three tensors (one fused)
        // (soft-capped: the scores over the cap, their tanh, times the cap)
        let capped = if self.attention_softcap.is_some() { 3.0 } else { 0.0 };
        let scores = (if w.fused { 4.0 } else { 6.0 } + capped) * w.heads * s * w.d;
        let repeated = if self.kv_heads < self.heads { 2.0 * w.q * w.d } else { 0.0 };
        // the softmax's backward: the gradients of its output, its numerator and
        // denominator, the difference, the scaled scores, about eight at once
        // (six fused: the gradient, its products with the weights, the row sums' share)
        let backward = (if w.fused { 6.0 } else { 8.0 } + capped) * w.heads * s * w.d;
        PerToken { kept: output + scores + repeated, backward }
    }

    /// LoRA's adapters per token: for each projection a layer adapts, its
    /// product with A and the scaling (of the rank's width). The adapters'
    /// other tensors (the input cast to their dtype, the product with B, the
    /// sum) are about what the frozen base no longer keeps: measured, a LoRA
    /// step holds what the same step fully fine-tuned holds a sample, within
    /// 3% (tiny-llama at 256 tokens, a llama of 8 layers at 8 and 64 tokens,
    /// adapters on q and v or on every projection), where counting them
    /// over-counted by up to a half.
    fn adapters_bytes(&self, w: &Widths, training: &Training) -> PerToken {
        let Some(lora) = &training.lora else { return PerToken::default() };
        let adapter = lora.adapter_dtype(if w.d == 4.0 { DType::F32 } else { DType::BF16 }).size_in_bytes() as f64;
        // an expert's adapters see the rows routed to it: k of E a token
        let routed = self.experts.as_ref().map_or(1.0, |e| e.per_token as f64 / e.count as f64);
        let adapted: f64 = Config { layers: 1, ..self.clone() }
            .projections()
            .into_iter()
            .filter(|(name, _, _)| lora.targets(name))
            .map(|(name, _, _)| if name.contains(".experts.") { routed } else { 1.0 })
            .sum();
        PerToken { kept: adapted * 2.0 * lora.rank as f64 * adapter, backward: 0.0 }
    }

    /// The head's and the loss's tensors per token: the final norm (BERT's
    /// transform), then, chunked, the gradient of the hidden states the
    /// fused loss computes in the forward pass; in full, the logits, their
    /// f32 copy and log-softmax's three tensors kept, and their gradients at
    /// the start of the backward pass.
    fn head_bytes(&self, w: &Widths, loss: Loss) -> PerToken {
        let family = self.family.architecture();
        let rows = family.predicted_milli_rows(self) as f64 / 1000.0;
        if rows == 0.0 {
            return PerToken::default();
        }
        let norm = family.head_input_bytes(self, w);
        match loss {
            // the gradient of the hidden states, computed in the forward pass (the
            // chunk's logits are the loss's own moment: `step_memory`)
            Loss::Chunked => PerToken { kept: norm + rows * w.h * w.d, backward: 0.0 },
            Loss::Full => {
                let widened = if w.d == 4.0 { 0.0 } else { 4.0 };
                let bias = if family.logits_bias(self) { w.d } else { 0.0 };
                // soft-capped: the logits over the cap, their tanh, times the cap
                let capped = if self.final_softcap.is_some() { 3.0 * w.d } else { 0.0 };
                PerToken {
                    kept: norm + w.vocab * (w.d + bias + capped + widened + 12.0),
                    // log-softmax's backward: the gradients of its output, of the
                    // difference (two summed), of the exponentials, of the logits;
                    // through a cap, tanh's derivative and its products beside
                    backward: w.vocab * (24.0 + capped),
                }
            }
        }
    }
}
