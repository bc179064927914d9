//! The pieces every family is made of, each differentiable: projections
//! (trained, frozen or with LoRA adapters), norms, rotary tables and
//! attention.

use candle_core::{D, DType, Device, Module, Result, Tensor};

use super::kv_cache::{Chunk, KvCache};
use super::lora::{Lora, LoraLinear};
use super::weights::Weights;
use crate::ops::{self, Activation, BlockedAttention, FrozenLinear, add_constant, eager, matmul, mul_constant};
use crate::{Attention, Ops};

/// How a network computes attention and its other ops.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Forms {
    pub(crate) attention: Attention,
    pub(crate) ops: Ops,
    pub(crate) routing: crate::Routing,
}

/// A weight's layout in its checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// `(out, in)`: `nn.Linear`.
    OutIn,
    /// `(in, out)`: GPT-2's `Conv1D`.
    InOut,
}

/// A projection `x · Wᵀ + b` over the weight of a checkpoint module.
#[derive(Clone, Debug)]
pub(crate) struct Proj {
    kind: ProjKind,
    ops: Ops,
}

#[derive(Clone, Debug)]
enum ProjKind {
    /// candle's own matmul: a trained weight (full fine-tuning), or a frozen
    /// one whose gradient candle keeps (LoRA's `frozen_gradients`).
    Plain { weight: Tensor, bias: Option<Tensor> },
    /// Frozen, dense or quantized: the backward pass gives the input its
    /// gradient, the weight none.
    Frozen(FrozenLinear),
    /// Frozen, with LoRA adapters that train.
    Lora(LoraLinear),
}

impl Proj {
    /// The projection of module `name` (`{name}.weight`, `{name}.bias` if any):
    /// trained when its weight is a variable, with adapters when `lora` targets it.
    pub(crate) fn new(weights: &Weights, name: &str, layout: Layout, lora: Option<&Lora>, ops: Ops) -> Result<Proj> {
        Ok(Proj { kind: ProjKind::build(weights, name, layout, lora, true)?, ops })
    }

    /// A projection LoRA never adapts (a head, a pooler), frozen as `lora`
    /// freezes the others.
    pub(crate) fn unadapted(
        weights: &Weights,
        name: &str,
        layout: Layout,
        lora: Option<&Lora>,
        ops: Ops,
    ) -> Result<Proj> {
        Ok(Proj { kind: ProjKind::build(weights, name, layout, lora, false)?, ops })
    }
}

impl ProjKind {
    fn build(weights: &Weights, name: &str, layout: Layout, lora: Option<&Lora>, adapt: bool) -> Result<ProjKind> {
        let targeted = lora.filter(|lora| adapt && lora.targets(name));
        let weight_name = format!("{name}.weight");
        let bias = weights.maybe(&format!("{name}.bias"));
        let frozen = match weights.quantized(&weight_name) {
            Some(quantized) => FrozenLinear::quantized(quantized, bias.clone()),
            None => {
                let stored = weights.get(&weight_name)?;
                // as (out, in): a transposed view of a Conv1D weight, no copy
                let weight = match layout {
                    Layout::OutIn => stored,
                    Layout::InOut => stored.t()?,
                };
                if weights.is_trained(&weight_name) || lora.is_some_and(|lora| lora.frozen_gradients) {
                    if let Some(lora) = targeted {
                        return Ok(ProjKind::Lora(adapted(weights, name, FrozenLinear::new(weight, bias), lora)?));
                    }
                    return Ok(ProjKind::Plain { weight, bias });
                }
                FrozenLinear::new(weight, bias)
            }
        };
        match targeted {
            Some(lora) => Ok(ProjKind::Lora(adapted(weights, name, frozen, lora)?)),
            None => Ok(ProjKind::Frozen(frozen)),
        }
    }
}

/// The adapters of module `name` over its frozen projection.
fn adapted(weights: &Weights, name: &str, base: FrozenLinear, lora: &Lora) -> Result<LoraLinear> {
    let a = weights.get(&format!("{name}.lora_A.weight"))?;
    let b = weights.get(&format!("{name}.lora_B.weight"))?;
    let adapted = LoraLinear::over(base, a, b, lora.scale(), lora.dropout);
    Ok(if lora.frozen_gradients { adapted.keeping_frozen_gradients() } else { adapted })
}

impl Proj {
    /// The dense weight `(out, in)` and bias of a trained or frozen
    /// projection without adapters: what a head's fused loss multiplies by.
    pub(crate) fn dense(&self) -> Option<(Tensor, Option<Tensor>)> {
        match &self.kind {
            ProjKind::Plain { weight, bias } => Some((weight.clone(), bias.clone())),
            ProjKind::Frozen(frozen) => Some((frozen.weight()?.clone(), frozen.bias().cloned())),
            ProjKind::Lora(_) => None,
        }
    }

    /// The weight and bias a fused op multiplies by: a trained weight, or a
    /// frozen one, dense or quantized; not candle's own product kept for a
    /// frozen weight (LoRA's `frozen_gradients`) or adapters.
    fn fused(&self) -> Option<(ops::Weight<'_>, Option<&Tensor>)> {
        match (&self.kind, self.ops) {
            (ProjKind::Plain { weight, bias }, Ops::Fused) if weight.track_op() => {
                Some((ops::Weight::Dense(weight), bias.as_ref()))
            }
            (ProjKind::Frozen(frozen), Ops::Fused) => {
                let weight = match (frozen.weight(), frozen.quantized_weight()) {
                    (Some(dense), _) => ops::Weight::Dense(dense),
                    (None, Some(quantized)) => ops::Weight::Quantized(quantized),
                    (None, None) => return None,
                };
                Some((weight, frozen.bias()))
            }
            _ => None,
        }
    }

    /// `residual + self(xs)`: one node where the product fuses (a quantized
    /// weight too: its dequantized copy lives for the product alone).
    pub(crate) fn added_to(&self, residual: &Tensor, xs: &Tensor) -> Result<Tensor> {
        if let Some((weight, bias)) = self.fused() {
            return ops::residual_linear_of(residual, xs, weight, bias);
        }
        if let (ProjKind::Lora(lora), Ops::Fused) = (&self.kind, self.ops)
            && let Some(sum) = lora.fused(Some(residual), xs)
        {
            return sum;
        }
        ops::residual(residual, &self.forward(xs)?)
    }

    /// `residual + self(activation(gate) · up)` (`activation(gate)` without
    /// `up`): an MLP's down projection, one node where the product fuses,
    /// the activation recomputed in its backward pass.
    pub(crate) fn activated_added_to(
        &self,
        residual: &Tensor,
        activation: Activation,
        gate: &Tensor,
        up: Option<&Tensor>,
    ) -> Result<Tensor> {
        if let Some((weight, bias)) = self.fused() {
            return ops::residual_mlp_down_of(residual, activation, gate, up, weight, bias);
        }
        let activated = match (up, self.ops) {
            (Some(up), Ops::Fused) => ops::gated(activation, gate, up)?,
            (Some(up), Ops::Eager) => (activation.apply(gate)? * up)?,
            (None, _) => activation.apply(gate)?,
        };
        self.added_to(residual, &activated)
    }
}

impl Proj {
    /// `self(activation(gate) · up)` (`activation(gate)` without `up`): an
    /// MLP's down projection whose output is normed before the residual,
    /// one node where the product fuses.
    pub(crate) fn activated(&self, activation: Activation, gate: &Tensor, up: Option<&Tensor>) -> Result<Tensor> {
        if let Some((weight, bias)) = self.fused() {
            return ops::mlp_down_of(None, activation, gate, up, weight, bias);
        }
        let activated = match (up, self.ops) {
            (Some(up), Ops::Fused) => ops::gated(activation, gate, up)?,
            (Some(up), Ops::Eager) => (activation.apply(gate)? * up)?,
            (None, _) => activation.apply(gate)?,
        };
        self.forward(&activated)
    }
}

impl Module for Proj {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        if let Some((ops::Weight::Dense(weight), bias)) = self.fused() {
            return ops::linear(xs, weight, bias);
        }
        match (&self.kind, self.ops) {
            (ProjKind::Plain { weight, bias }, _) => eager::linear(xs, weight, bias.as_ref()),
            (ProjKind::Frozen(frozen), _) => frozen.forward(xs),
            (ProjKind::Lora(lora), Ops::Fused) => lora.fused(None, xs).unwrap_or_else(|| lora.forward(xs)),
            (ProjKind::Lora(lora), Ops::Eager) => lora.forward(xs),
        }
    }
}

/// A norm over the last dimension: RMS (Llama) or layer norm (GPT-2, BERT,
/// with a bias). A frozen norm (under LoRA) gets no gradient for its weight.
#[derive(Clone, Debug)]
pub(crate) struct Norm {
    weight: Tensor,
    /// A layer norm's bias; `None`: an RMS norm.
    bias: Option<Tensor>,
    eps: f32,
    ops: Ops,
    /// It scales by `1 + weight` (Gemma's weights are stored as the offset).
    plus_one: bool,
}

impl Norm {
    pub(crate) fn rms(weights: &Weights, name: &str, eps: f64, ops: Ops) -> Result<Norm> {
        Ok(Norm { weight: weights.get(&format!("{name}.weight"))?, bias: None, eps: eps as f32, ops, plus_one: false })
    }

    /// The same norm scaling by `1 + weight` where `plus_one`.
    pub(crate) fn plus_one(mut self, plus_one: bool) -> Norm {
        self.plus_one = plus_one;
        self
    }

    pub(crate) fn layer(weights: &Weights, name: &str, eps: f64, ops: Ops) -> Result<Norm> {
        let (weight, bias) = (weights.get(&format!("{name}.weight"))?, weights.get(&format!("{name}.bias"))?);
        Ok(Norm { weight, bias: Some(bias), eps: eps as f32, ops, plus_one: false })
    }
}

impl Module for Norm {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        // `1 + weight` made for this call: a tensor of the norm's width, its
        // gradient the weight's
        let offset = if self.plus_one { Some(self.weight.affine(1.0, 1.0)?) } else { None };
        let (weight, eps) = (offset.as_ref().unwrap_or(&self.weight), self.eps);
        match (&self.bias, self.ops) {
            (None, Ops::Fused) => ops::rms_norm(xs, weight, eps),
            (Some(bias), Ops::Fused) => ops::layer_norm(xs, weight, bias, eps),
            // a frozen norm scales and shifts by constants: `broadcast_mul` would
            // keep a gradient of the activations' size for its weight
            (None, Ops::Eager) if !weight.track_op() => mul_constant(&normalized(xs, eps, false)?, weight),
            (Some(bias), Ops::Eager) if !weight.track_op() => {
                add_constant(&mul_constant(&normalized(xs, eps, true)?, weight)?, bias)
            }
            (None, Ops::Eager) => eager::rms_norm(xs, weight, eps),
            (Some(bias), Ops::Eager) => eager::layer_norm(xs, weight, bias, eps),
        }
    }
}

/// `xs` over its root mean square (the mean removed first for a layer norm),
/// computed in f32 for a 16-bit input, as candle-nn's slow norms compute it.
fn normalized(xs: &Tensor, eps: f32, centered: bool) -> Result<Tensor> {
    let dtype = xs.dtype();
    let internal = if matches!(dtype, DType::F16 | DType::BF16) { DType::F32 } else { dtype };
    let size = xs.dim(candle_core::D::Minus1)? as f64;
    let mut x = xs.to_dtype(internal)?;
    if centered {
        let mean = (x.sum_keepdim(candle_core::D::Minus1)? / size)?;
        x = x.broadcast_sub(&mean)?;
    }
    let norm = (x.sqr()?.sum_keepdim(candle_core::D::Minus1)? / size)?;
    x.broadcast_div(&(norm + eps as f64)?.sqrt()?)?.to_dtype(dtype)
}

/// Rotary tables for positions `0..seq_len`: cos and sin of `(seq_len,
/// head_dim / 2)`, each times `scale`. As transformers computes them: the
/// frequencies and the angles in f32, cos and sin in f32, then the model's dtype.
pub(crate) fn rotary_tables(
    inverse_frequencies: &[f64],
    scale: f64,
    seq_len: usize,
    dtype: DType,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let positions: Vec<usize> = (0..seq_len).collect();
    rotary_tables_at(inverse_frequencies, scale, &positions, dtype, device)
}

/// The rotary tables `(n, d / 2)` of `positions`, one row each (the tokens
/// of several sequences, each at its own place).
pub(crate) fn rotary_tables_at(
    inverse_frequencies: &[f64],
    scale: f64,
    positions: &[usize],
    dtype: DType,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let half = inverse_frequencies.len();
    let angles: Vec<f32> = positions
        .iter()
        .flat_map(|&position| inverse_frequencies.iter().map(move |&f| position as f32 * f as f32))
        .collect();
    let angles = Tensor::from_vec(angles, (positions.len(), half), device)?;
    let (cos, sin) = (angles.cos()?, angles.sin()?);
    let (cos, sin) = if scale == 1.0 { (cos, sin) } else { ((cos * scale)?, (sin * scale)?) };
    Ok((cos.to_dtype(dtype)?, sin.to_dtype(dtype)?))
}

/// How one layer's attention scores are made beyond `softmax(q·kᵀ/√d)`:
/// a sliding window, a soft cap, a scale of the family's own.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Scores {
    /// Each query sees the last `window` positions up to its own.
    pub(crate) window: Option<usize>,
    /// `cap · tanh(score / cap)` before the mask.
    pub(crate) softcap: Option<f64>,
    /// What `q·kᵀ` is multiplied by; `None`: `1 / √d`.
    pub(crate) scale: Option<f64>,
}

impl Scores {
    /// The blocked attention of these scores, causal or not.
    fn blocked(&self, causal: bool) -> BlockedAttention {
        let config = if causal { BlockedAttention::causal() } else { BlockedAttention::bidirectional() };
        config.window(self.window).softcap(self.softcap).scale(self.scale)
    }

    /// Whether they are `softmax(q·kᵀ/√d)` as it is.
    fn plain(&self) -> bool {
        *self == Scores::default()
    }
}

/// Attention of the chunks' queries `(1, heads, T, d)` over their
/// sequences' cached keys: each chunk's keys and values `(1, kv_heads, T,
/// d)` written into `cache` at `layer` first, then its queries attend
/// causally to every key of its sequence so far. `(1, T, heads × d)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn cached_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    chunks: &[Chunk],
    cache: &KvCache,
    layer: usize,
    form: Attention,
    scores: Scores,
) -> Result<Tensor> {
    let (_, heads, _, d) = q.dims4()?;
    let mut outputs = Vec::with_capacity(chunks.len());
    let mut offset = 0;
    for chunk in chunks {
        let len = chunk.tokens.len();
        let part = |t: &Tensor| t.narrow(2, offset, len)?.squeeze(0);
        cache.write(layer, chunk.sequence, chunk.start, &part(k)?, &part(v)?)?;
        let (keys, values) = cache.gather(layer, chunk.sequence, chunk.start + len, q.dtype())?;
        let queries = q.narrow(2, offset, len)?.contiguous()?;
        let out = match form {
            Attention::Blocked => scores.blocked(true).forward(&queries, &keys, &values, None)?,
            Attention::Eager if scores.plain() => crate::ops::attention(&queries, &keys, &values, None, true)?,
            Attention::Eager => scores.blocked(true).eager(&queries, &keys, &values, None)?,
        };
        outputs.push(out.transpose(1, 2)?.reshape((1, len, heads * d))?);
        offset += len;
    }
    Tensor::cat(&outputs, 1)
}

/// The rows of `xs` `(1, T, hidden)` at each chunk's last token: `(n, hidden)`.
pub(crate) fn last_tokens(xs: &Tensor, chunks: &[Chunk]) -> Result<Tensor> {
    let mut rows = Vec::with_capacity(chunks.len());
    let mut end = 0;
    for chunk in chunks {
        end += chunk.tokens.len();
        rows.push(end as u32 - 1);
    }
    let count = rows.len();
    xs.squeeze(0)?.index_select(&Tensor::from_vec(rows, count, xs.device())?, 0)
}

/// Multi-head attention of `q` `(b, heads, s, d)` over `k`, `v` `(b, kv_heads,
/// s, d)` (grouped: each kv head serves `heads / kv_heads` query heads; any
/// layout), `q` and `k` rotated first by `rotary`'s tables where given,
/// causal or not, in blocks or eager; returns `(b, s, heads · d)`.
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    rotary: Option<&(Tensor, Tensor)>,
    forms: Forms,
    scores: Scores,
) -> Result<Tensor> {
    let (b, heads, s, d) = q.dims4()?;
    let attended = match forms.attention {
        Attention::Blocked => {
            let config = scores.blocked(causal);
            // tables of fewer pairs than a head has rotate q and k before
            let whole = rotary.is_some_and(|(cos, _)| cos.dim(1).is_ok_and(|half| 2 * half == d));
            match (rotary, forms.ops) {
                (Some((cos, sin)), Ops::Fused) if whole => config.forward_rotary(q, k, v, None, cos, sin)?,
                (Some((cos, sin)), Ops::Fused) => {
                    config.forward(&rotate(q, cos, sin, Ops::Fused)?, &rotate(k, cos, sin, Ops::Fused)?, v, None)?
                }
                (Some((cos, sin)), Ops::Eager) => config.forward(
                    &eager::rope(&q.contiguous()?, cos, sin)?,
                    &eager::rope(&k.contiguous()?, cos, sin)?,
                    v,
                    None,
                )?,
                (None, _) => config.forward(q, k, v, None)?,
            }
        }
        Attention::Eager => {
            let (q, k) = match rotary {
                Some((cos, sin)) => (rotate(q, cos, sin, forms.ops)?, rotate(k, cos, sin, forms.ops)?),
                None => (q.contiguous()?, k.contiguous()?),
            };
            eager_attention(&q, &k, &v.contiguous()?, causal, forms.ops, scores)?
        }
    };
    attended.transpose(1, 2)?.reshape((b, s, heads * d))
}

/// Attention with the scores made whole, as transformers' eager attention
/// computes it: `(b, heads, s, d)` of contiguous `q`, `k`, `v`.
fn eager_attention(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, ops: Ops, settings: Scores) -> Result<Tensor> {
    let (_, heads, s, d) = q.dims4()?;
    let kv_heads = k.dim(1)?;
    let (k, v) = (repeat_kv(k, heads / kv_heads)?, repeat_kv(v, heads / kv_heads)?);
    // keys and values from frozen layers are outside the graph: no gradient for them
    let scores = match settings.scale {
        None => (matmul(q, &k.t()?)? / (d as f64).sqrt())?,
        Some(scale) => (matmul(q, &k.t()?)? * scale)?,
    };
    let scores = match settings.softcap {
        Some(cap) => ((scores / cap)?.tanh()? * cap)?,
        None => scores,
    };
    // the mask is a constant: added without a gradient of the scores' size of its own
    let mask = |s| causal_mask(s, settings.window, q.dtype(), q.device());
    let scores = if causal { add_constant(&scores, &mask(s)?)? } else { scores };
    let weights = match ops {
        Ops::Fused => ops::softmax_last_dim(&scores)?,
        Ops::Eager => eager::softmax_last_dim(&scores)?,
    };
    matmul(&weights, &v)
}

/// `(b, kv_heads, s, d)` → `(b, kv_heads · n, s, d)`, each kv head repeated `n` times.
fn repeat_kv(xs: &Tensor, n: usize) -> Result<Tensor> {
    if n == 1 {
        return Ok(xs.clone());
    }
    let (b, kv_heads, s, d) = xs.dims4()?;
    xs.unsqueeze(2)?.expand((b, kv_heads, n, s, d))?.reshape((b, kv_heads * n, s, d))
}

/// 0 on and below the diagonal (within `window` of it), −∞ elsewhere: what
/// a causal score adds.
fn causal_mask(s: usize, window: Option<usize>, dtype: DType, device: &Device) -> Result<Tensor> {
    let hidden = |i: usize, j: usize| j > i || window.is_some_and(|window| j + window <= i);
    let mask: Vec<f32> =
        (0..s).flat_map(|i| (0..s).map(move |j| if hidden(i, j) { f32::NEG_INFINITY } else { 0.0 })).collect();
    Tensor::from_vec(mask, (s, s), device)?.to_dtype(dtype)
}

/// `(b, s, heads · d)` → `(b, heads, s, d)`: a view, no copy.
pub(crate) fn split_heads(xs: &Tensor, heads: usize, head_dim: usize) -> Result<Tensor> {
    let (b, s, _) = xs.dims3()?;
    xs.reshape((b, s, heads, head_dim))?.transpose(1, 2)
}

/// Rotary positions on `(b, heads, s, d)` (any layout), the halves rotated
/// (Hugging Face's `rotate_half`): contiguous.
pub(crate) fn rotate(xs: &Tensor, cos: &Tensor, sin: &Tensor, ops: Ops) -> Result<Tensor> {
    // tables of fewer pairs than a head has: its first dimensions rotate, the rest pass (Phi's)
    let (d, rotated) = (xs.dim(D::Minus1)?, 2 * cos.dim(D::Minus1)?);
    if rotated < d {
        let head = xs.narrow(D::Minus1, 0, rotated)?.contiguous()?;
        let rest = xs.narrow(D::Minus1, rotated, d - rotated)?.contiguous()?;
        return Tensor::cat(&[&rotate(&head, cos, sin, ops)?, &rest], D::Minus1);
    }
    match ops {
        Ops::Fused => ops::rope(xs, cos, sin),
        Ops::Eager => eager::rope(&xs.contiguous()?, cos, sin),
    }
}

/// Mean cross-entropy in f32 of `logits` `(n, classes)` against `targets` `(n)`.
pub(crate) fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    candle_nn::loss::cross_entropy(&logits.to_dtype(DType::F32)?, targets)
}

/// The activation of a config's GELU: the tanh approximation (`gelu_new`,
/// GPT-2's) or the exact erf form (`gelu`, BERT's).
pub(crate) fn gelu(kind: super::config::Gelu) -> Activation {
    match kind {
        super::config::Gelu::Tanh => Activation::Gelu,
        super::config::Gelu::Erf => Activation::GeluErf,
    }
}

/// The rows of `table` `(vocab, hidden)` for token ids `(b, s)`: `(b, s,
/// hidden)`. With `padding_idx` (transformers' `nn.Embedding(padding_idx=…)`)
/// the padding token's row gets no gradient, as in PyTorch.
pub(crate) fn embed(table: &Tensor, ids: &Tensor, padding_idx: Option<usize>) -> Result<Tensor> {
    let (b, s) = ids.dims2()?;
    let hidden = table.dim(1)?;
    let flat = ids.flatten_all()?;
    let rows = match padding_idx {
        Some(padding) if table.track_op() => table.apply_op2(&flat, PaddedRows { padding: padding as u32 })?,
        _ => table.index_select(&flat, 0)?,
    };
    rows.reshape((b, s, hidden))
}

/// `index_select` of a table's rows whose backward pass leaves the padding
/// row's gradient at zero.
struct PaddedRows {
    padding: u32,
}

impl PaddedRows {
    fn apply<S: candle_core::backend::BackendStorage>(
        s1: &S,
        l1: &candle_core::Layout,
        s2: &S,
        l2: &candle_core::Layout,
    ) -> Result<(S, candle_core::Shape)> {
        let (rows, hidden) = (l2.dims()[0], l1.dims()[1]);
        Ok((s1.index_select(s2, l1, l2, 0)?, (rows, hidden).into()))
    }
}

impl candle_core::CustomOp2 for PaddedRows {
    fn name(&self) -> &'static str {
        "embedding-with-padding"
    }

    fn cpu_fwd(
        &self,
        s1: &candle_core::CpuStorage,
        l1: &candle_core::Layout,
        s2: &candle_core::CpuStorage,
        l2: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        Self::apply(s1, l1, s2, l2)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &candle_core::Layout,
        s2: &candle_core::CudaStorage,
        l2: &candle_core::Layout,
    ) -> Result<(candle_core::CudaStorage, candle_core::Shape)> {
        Self::apply(s1, l1, s2, l2)
    }

    fn bwd(
        &self,
        table: &Tensor,
        ids: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // the padding rows' share of the gradient is dropped before it is added up
        let kept = ids.ne(self.padding)?.to_dtype(grad.dtype())?.unsqueeze(1)?;
        let grad = grad.broadcast_mul(&kept)?;
        Ok((Some(table.zeros_like()?.index_add(ids, &grad, 0)?), None))
    }
}
