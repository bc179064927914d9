//! The decoders of the Llama kind (`llama`, `mistral`, `qwen2`, `qwen3`, `olmo2`): RMS
//! norms, rotary positions, grouped-query attention, a SwiGLU MLP, the head
//! tied to the embedding or not. Tensor names are the checkpoints'
//! (`model.layers.0.self_attn.q_proj.weight`).

use candle_core::{Module, Result, Tensor};

use super::config::{
    AttentionBias, BertHead, BlockNorms, Config, Fields, Gelu, Llama3Rope, QkNorm, RopeScaling, YarnRope, refuse,
};
use super::kv_cache::{Chunk, KvCache};
use super::layers::{Forms, Layout, Norm, Proj, rotate};
use super::layers::{attention, cached_attention, embed, last_tokens, rotary_tables, rotary_tables_at};
use super::lora::Lora;
use super::weights::{Init, TensorSpec, Weights};
use crate::Error;
use crate::family::Family;
use crate::ops::{self, Activation};
use crate::per_token::{PerToken, Widths};

const STD: f32 = 0.02;

/// The checkpoint's tensors (the adapters' too, with `lora`).
pub(crate) fn tensors(config: &Config) -> Vec<TensorSpec> {
    let (h, q, kv, i) =
        (config.hidden, config.heads * config.head_dim, config.kv_heads * config.head_dim, config.intermediate);
    let mut specs = vec![TensorSpec::new("model.embed_tokens.weight", &[config.vocab, h], Init::Normal(STD))];
    for layer in 0..config.layers {
        let at = |part: &str| format!("model.layers.{layer}.{part}");
        let qkv_bias = config.attention_bias != AttentionBias::None;
        for (name, out, input, bias) in [
            ("self_attn.q_proj", q, h, qkv_bias),
            ("self_attn.k_proj", kv, h, qkv_bias),
            ("self_attn.v_proj", kv, h, qkv_bias),
            ("self_attn.o_proj", h, q, config.attention_bias == AttentionBias::All),
            ("mlp.gate_proj", i, h, config.mlp_bias),
            ("mlp.up_proj", i, h, config.mlp_bias),
            ("mlp.down_proj", h, i, config.mlp_bias),
        ] {
            specs.push(TensorSpec::new(at(&format!("{name}.weight")), &[out, input], Init::Normal(STD)));
            if bias {
                specs.push(TensorSpec::new(at(&format!("{name}.bias")), &[out], Init::Zeros));
            }
        }
        let (q_norm, k_norm) = match config.qk_norm {
            QkNorm::None => (0, 0),
            QkNorm::PerHead => (config.head_dim, config.head_dim),
            QkNorm::Projection => (q, kv),
        };
        if config.qk_norm != QkNorm::None {
            specs.push(TensorSpec::new(at("self_attn.q_norm.weight"), &[q_norm], Init::Ones));
            specs.push(TensorSpec::new(at("self_attn.k_norm.weight"), &[k_norm], Init::Ones));
        }
        for norm in norm_names(config.norms) {
            specs.push(TensorSpec::new(at(&format!("{norm}.weight")), &[h], Init::Ones));
        }
    }
    specs.push(TensorSpec::new("model.norm.weight", &[h], Init::Ones));
    if !config.tie_embeddings {
        specs.push(TensorSpec::new("lm_head.weight", &[config.vocab, h], Init::Normal(STD)));
    }
    specs
}

/// A block's norms by checkpoint name, in the order they are listed.
fn norm_names(norms: BlockNorms) -> &'static [&'static str] {
    match norms {
        BlockNorms::Pre => &["input_layernorm", "post_attention_layernorm"],
        BlockNorms::Post => &["post_attention_layernorm", "post_feedforward_layernorm"],
    }
}

/// The modules LoRA can adapt, by checkpoint name, with their (out, in).
pub(crate) fn projections(config: &Config) -> Vec<(String, usize, usize)> {
    let (h, q, kv, i) =
        (config.hidden, config.heads * config.head_dim, config.kv_heads * config.head_dim, config.intermediate);
    (0..config.layers)
        .flat_map(|layer| {
            [
                ("self_attn.q_proj", q, h),
                ("self_attn.k_proj", kv, h),
                ("self_attn.v_proj", kv, h),
                ("self_attn.o_proj", h, q),
                ("mlp.gate_proj", i, h),
                ("mlp.up_proj", i, h),
                ("mlp.down_proj", h, i),
            ]
            .into_iter()
            .map(move |(name, out, input)| (format!("model.layers.{layer}.{name}"), out, input))
        })
        .collect()
}

/// A decoder of the Llama kind read from its config, as transformers reads
/// `{class}Config`: what every one of them has. The family reads the rest
/// (biases, windows, q/k norms) and sets it.
pub(crate) fn read(family: Family, fields: &Fields, class: &str) -> std::result::Result<Config, Error> {
    let (causal, base) = (format!("{class}ForCausalLM"), format!("{class}Model"));
    Config::architecture(fields, &[causal.as_str(), base.as_str()], "a language model trained on its next tokens")?;
    let hidden = fields.required(&["hidden_size"])?;
    let heads = fields.required(&["num_attention_heads"])?;
    let layers = fields.required(&["num_hidden_layers"])?;
    let kv_heads = fields.count(&["num_key_value_heads"])?.unwrap_or(heads);
    let head_dim = match fields.count(&["head_dim"])? {
        Some(head_dim) => head_dim,
        None if hidden.is_multiple_of(heads) => hidden / heads,
        None => return Err(refuse("num_attention_heads", heads, format!("a divisor of hidden_size {hidden}"))),
    };
    let act = fields.text("hidden_act")?.unwrap_or("silu");
    if act != "silu" {
        return Err(refuse("hidden_act", act, "silu (SwiGLU)"));
    }
    let max_positions = fields.count(&["max_position_embeddings"])?.unwrap_or(2048);
    Ok(Config {
        family,
        vocab: fields.required(&["vocab_size"])?,
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        intermediate: fields.required(&["intermediate_size"])?,
        max_positions,
        norm_eps: fields.number("rms_norm_eps")?.unwrap_or(1e-6),
        rope: Some(Config::rope(fields, max_positions)?),
        tie_embeddings: fields.flag("tie_word_embeddings")?.unwrap_or(false),
        attention_bias: AttentionBias::None,
        mlp_bias: false,
        qk_norm: QkNorm::None,
        norms: BlockNorms::Pre,
        gelu: Gelu::Tanh,
        sliding_window: None,
        type_vocab: 0,
        bert_head: BertHead::MaskedLm,
        padding_idx: fields.id("pad_token_id")?,
        dtype: Config::dtype(fields)?,
        dropout: Vec::new(),
        unknown_keys: Vec::new(),
    })
}

/// `attention_bias`: every attention projection's bias, or none.
pub(crate) fn attention_bias(fields: &Fields) -> std::result::Result<AttentionBias, Error> {
    Ok(if fields.flag("attention_bias")? == Some(true) { AttentionBias::All } else { AttentionBias::None })
}

/// No window: a `layer_types` that names a sliding layer is refused (the
/// family attends in full everywhere).
pub(crate) fn full_attention(fields: &Fields, layers: usize) -> std::result::Result<Option<usize>, Error> {
    if Config::sliding_layers(fields, layers)? == Some(true) {
        return Err(refuse("layer_types", "sliding_attention", "full_attention for every layer"));
    }
    Ok(None)
}

/// One layer's tensors per token but attention's and the adapters': the
/// input norm, q/k/v (made contiguous eager), the q/k norms, rotary
/// positions on q and k, o and the residual, the post norm, gate, up, silu
/// and their product, down and the residual.
pub(crate) fn block_bytes(config: &Config, w: &Widths, eager_attention: bool) -> PerToken {
    let d = w.d;
    // an MLP's activation (and a gate's product): kept eager, recomputed fused
    let activation = |width: f64| if w.fused { 0.0 } else { width * d };
    let qkv_bias = config.attention_bias != AttentionBias::None;
    let qk_norms = match config.qk_norm {
        QkNorm::None => 0.0,
        QkNorm::PerHead | QkNorm::Projection => w.rms_norm(w.q) + w.rms_norm(w.kv),
    };
    // pre: a norm before attention and the MLP, each output joining the
    // stream with its projection; post: each output kept, normed, then summed
    let (norms, o_out, down_out) = match config.norms {
        BlockNorms::Pre => (
            2.0 * w.rms_norm(w.h),
            w.residual_linear(w.h, config.attention_bias == AttentionBias::All),
            w.residual_linear(w.h, config.mlp_bias),
        ),
        BlockNorms::Post => (
            2.0 * w.rms_norm(w.h) + 2.0 * w.h * d,
            w.linear(w.h, config.attention_bias == AttentionBias::All),
            w.linear(w.h, config.mlp_bias),
        ),
    };
    // eager: a half negated, the halves joined, two products, their sum;
    // fused: one tensor, none inside blocked attention
    let rotary = match (w.fused, eager_attention) {
        (false, _) => 4.5 * (w.q + w.kv) * d,
        (true, true) => (w.q + w.kv) * d,
        (true, false) => 0.0,
    };
    let contiguous = if eager_attention && w.fused { 2.0 * w.kv * d } else { w.heads(w.q + 2.0 * w.kv) };
    PerToken {
        kept: norms
            + w.linear(w.q, qkv_bias)
            + 2.0 * w.linear(w.kv, qkv_bias)
            + contiguous
            + qk_norms
            + rotary
            + o_out
            + 2.0 * w.linear(w.i, config.mlp_bias)
            + 2.0 * activation(w.i)
            + down_out,
        backward: w.mlp_backward(false) + 4.0 * (w.q + 2.0 * w.kv) * d,
    }
}

struct Block {
    /// Before attention (`Pre`).
    input_norm: Option<Norm>,
    q: Proj,
    k: Proj,
    v: Proj,
    o: Proj,
    q_norm: Option<Norm>,
    k_norm: Option<Norm>,
    /// Over the whole projection (OLMo 2), not each head.
    qk_norm_whole: bool,
    /// On attention's output before it joins the stream (`Post`).
    attention_out_norm: Option<Norm>,
    /// Before the MLP (`Pre`).
    mlp_norm: Option<Norm>,
    /// On the MLP's output before it joins the stream (`Post`).
    mlp_out_norm: Option<Norm>,
    gate: Proj,
    up: Proj,
    down: Proj,
}

/// A decoder of the Llama kind over its weights.
pub(crate) struct Decoder {
    embed: Tensor,
    blocks: Vec<Block>,
    norm: Norm,
    head: Proj,
    inverse_frequencies: Vec<f64>,
    /// What cos and sin are scaled by (YaRN's attention factor).
    rotary_scale: f64,
    padding_idx: Option<usize>,
    forms: Forms,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Decoder {
    pub(crate) fn new(config: &Config, weights: &Weights, lora: Option<&Lora>, forms: Forms) -> Result<Decoder> {
        let (eps, ops) = (config.norm_eps, forms.ops);
        let mut blocks = Vec::with_capacity(config.layers);
        for layer in 0..config.layers {
            let at = |part: &str| format!("model.layers.{layer}.{part}");
            let proj = |part: &str| Proj::new(weights, &at(part), Layout::OutIn, lora, ops);
            let norm = |part: &str| Norm::rms(weights, &at(part), eps, ops);
            let qk_norm = config.qk_norm != QkNorm::None;
            let (pre, post) = (config.norms == BlockNorms::Pre, config.norms == BlockNorms::Post);
            let norm_if = |on: bool, part: &str| on.then(|| norm(part)).transpose();
            blocks.push(Block {
                input_norm: norm_if(pre, "input_layernorm")?,
                q: proj("self_attn.q_proj")?,
                k: proj("self_attn.k_proj")?,
                v: proj("self_attn.v_proj")?,
                o: proj("self_attn.o_proj")?,
                q_norm: qk_norm.then(|| norm("self_attn.q_norm")).transpose()?,
                k_norm: qk_norm.then(|| norm("self_attn.k_norm")).transpose()?,
                qk_norm_whole: config.qk_norm == QkNorm::Projection,
                attention_out_norm: norm_if(post, "post_attention_layernorm")?,
                mlp_norm: norm_if(pre, "post_attention_layernorm")?,
                mlp_out_norm: norm_if(post, "post_feedforward_layernorm")?,
                gate: proj("mlp.gate_proj")?,
                up: proj("mlp.up_proj")?,
                down: proj("mlp.down_proj")?,
            });
        }
        let (inverse_frequencies, rotary_scale) = rotary_frequencies(config);
        let head_name = if config.tie_embeddings { "model.embed_tokens" } else { "lm_head" };
        Ok(Decoder {
            embed: weights.get("model.embed_tokens.weight")?,
            blocks,
            norm: Norm::rms(weights, "model.norm", eps, ops)?,
            head: Proj::unadapted(weights, head_name, Layout::OutIn, lora, ops)?,
            inverse_frequencies,
            rotary_scale,
            padding_idx: config.padding_idx,
            forms,
            heads: config.heads,
            kv_heads: config.kv_heads,
            head_dim: config.head_dim,
        })
    }

    /// The logits `(b, s, vocab)` of token ids `(b, s)`.
    pub(crate) fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.head(&self.trunk(ids)?)
    }

    /// The last block's output `(b, s, hidden)` for token ids `(b, s)`.
    pub(crate) fn trunk(&self, ids: &Tensor) -> Result<Tensor> {
        let mut xs = self.embed(ids)?;
        let tables = self.tables(&xs)?;
        for index in 0..self.blocks.len() {
            xs = self.block(index, &xs, &tables)?;
        }
        Ok(xs)
    }

    /// The token embeddings `(b, s, hidden)` of ids `(b, s)`.
    pub(crate) fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        embed(&self.embed, ids, self.padding_idx)
    }

    /// The rotary tables for the sequence `xs` `(b, s, hidden)` holds.
    pub(crate) fn tables(&self, xs: &Tensor) -> Result<(Tensor, Tensor)> {
        rotary_tables(&self.inverse_frequencies, self.rotary_scale, xs.dim(1)?, xs.dtype(), xs.device())
    }

    /// Block `index` of the decoder.
    pub(crate) fn block(&self, index: usize, xs: &Tensor, tables: &(Tensor, Tensor)) -> Result<Tensor> {
        let (q, k, v) = self.queries_keys_values(index, xs)?;
        self.after_attention(index, xs, &attention(&q, &k, &v, true, Some(tables), self.forms)?)
    }

    /// Block `index`'s queries `(b, heads, s, d)`, keys and values `(b,
    /// kv_heads, s, d)`, normed (Qwen3), not rotated: views of the
    /// projections' outputs, no copy.
    fn queries_keys_values(&self, index: usize, xs: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let block = &self.blocks[index];
        let (b, s, _) = xs.dims3()?;
        let h = match &block.input_norm {
            Some(norm) => norm.forward(xs)?,
            None => xs.clone(),
        };
        // a norm over the whole projection before the heads are split, or over each head after
        let (whole, each) = match (&block.q_norm, &block.k_norm) {
            (Some(q), Some(k)) if block.qk_norm_whole => ((Some(q), Some(k)), (None, None)),
            (Some(q), Some(k)) => ((None, None), (Some(q), Some(k))),
            _ => ((None, None), (None, None)),
        };
        let heads = |proj: &Proj, norm: Option<&Norm>, count: usize| {
            let projected = proj.forward(&h)?;
            let projected = match norm {
                Some(norm) => norm.forward(&projected)?,
                None => projected,
            };
            projected.reshape((b, s, count, self.head_dim))
        };
        let (mut q, mut k) = (heads(&block.q, whole.0, self.heads)?, heads(&block.k, whole.1, self.kv_heads)?);
        let v = heads(&block.v, None, self.kv_heads)?;
        if let (Some(q_norm), Some(k_norm)) = each {
            q = q_norm.forward(&q)?;
            k = k_norm.forward(&k)?;
        }
        Ok((q.transpose(1, 2)?, k.transpose(1, 2)?, v.transpose(1, 2)?))
    }

    /// The rest of block `index` once attention gave `attended` `(b, s,
    /// heads × d)`: the output projection, the residual and the MLP.
    fn after_attention(&self, index: usize, xs: &Tensor, attended: &Tensor) -> Result<Tensor> {
        let block = &self.blocks[index];
        let xs = match &block.attention_out_norm {
            Some(norm) => ops::residual(xs, &norm.forward(&block.o.forward(attended)?)?)?,
            None => block.o.added_to(xs, attended)?,
        };
        let h = match &block.mlp_norm {
            Some(norm) => norm.forward(&xs)?,
            None => xs.clone(),
        };
        let (gate, up) = (block.gate.forward(&h)?, block.up.forward(&h)?);
        match &block.mlp_out_norm {
            Some(norm) => {
                ops::residual(&xs, &norm.forward(&block.down.activated(Activation::Silu, &gate, Some(&up))?)?)
            }
            None => block.down.activated_added_to(&xs, Activation::Silu, &gate, Some(&up)),
        }
    }

    /// The logits `(n, vocab)` of the last token of each of `chunks`, whose
    /// ids `(1, T)` are the chunks' tokens one after the other: each chunk's
    /// keys and values written into `cache` (reserved before) and its
    /// queries attending to every key of its sequence so far.
    pub(crate) fn forward_cached(&self, ids: &Tensor, chunks: &[Chunk], cache: &KvCache) -> Result<Tensor> {
        let mut xs = self.embed(ids)?;
        let positions: Vec<usize> = chunks.iter().flat_map(|chunk| chunk.positions()).collect();
        let tables =
            rotary_tables_at(&self.inverse_frequencies, self.rotary_scale, &positions, xs.dtype(), xs.device())?;
        let (cos, sin) = &tables;
        for index in 0..self.blocks.len() {
            let (q, k, v) = self.queries_keys_values(index, &xs)?;
            let (q, k) = (rotate(&q, cos, sin, self.forms.ops)?, rotate(&k, cos, sin, self.forms.ops)?);
            let attended = cached_attention(&q, &k, &v.contiguous()?, chunks, cache, index, self.forms.attention)?;
            xs = self.after_attention(index, &xs, &attended)?;
        }
        self.head(&last_tokens(&xs, chunks)?)
    }

    /// The final norm and the head: logits of the last block's output.
    pub(crate) fn head(&self, xs: &Tensor) -> Result<Tensor> {
        self.head.forward(&self.norm.forward(xs)?)
    }

    /// The final norm of the last block's output: what the head multiplies.
    pub(crate) fn final_norm(&self, xs: &Tensor) -> Result<Tensor> {
        self.norm.forward(xs)
    }

    /// The head's weight `(vocab, hidden)` and bias.
    pub(crate) fn head_dense(&self) -> Option<(Tensor, Option<Tensor>)> {
        self.head.dense()
    }
}

/// The rotary frequencies of a head's pairs of dimensions, as transformers
/// computes them for the config's `rope_type`, and the factor cos and sin
/// are scaled by (YaRN's attention factor; 1 otherwise).
pub(crate) fn rotary_frequencies(config: &Config) -> (Vec<f64>, f64) {
    let d = config.head_dim;
    let Some(rope) = config.rope else { return (Vec::new(), 1.0) };
    let base: Vec<f64> = (0..d / 2).map(|i| 1.0 / rope.theta.powf(2.0 * i as f64 / d as f64)).collect();
    match rope.scaling {
        // dynamic NTK changes the base only past the positions, where no step here runs
        RopeScaling::None | RopeScaling::Dynamic { .. } => (base, 1.0),
        RopeScaling::Linear { factor } => (base.into_iter().map(|f| f / factor).collect(), 1.0),
        RopeScaling::Llama3(scaling) => (llama3(base, &scaling), 1.0),
        RopeScaling::Yarn(yarn) => (yarn_frequencies(&base, rope.theta, d, &yarn), yarn.attention_factor),
    }
}

/// Llama 3's scaling: long wavelengths divided by `factor`, short ones kept,
/// a smooth blend between.
fn llama3(base: Vec<f64>, scaling: &Llama3Rope) -> Vec<f64> {
    let old = scaling.original_max_position_embeddings as f64;
    let (low_wavelength, high_wavelength) = (old / scaling.low_freq_factor, old / scaling.high_freq_factor);
    base.into_iter()
        .map(|frequency| {
            let wavelength = 2.0 * std::f64::consts::PI / frequency;
            if wavelength < high_wavelength {
                frequency
            } else if wavelength > low_wavelength {
                frequency / scaling.factor
            } else {
                let smooth =
                    (old / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
                (1.0 - smooth) * frequency / scaling.factor + smooth * frequency
            }
        })
        .collect()
}

/// YaRN (transformers' `_compute_yarn_parameters`): each frequency a blend
/// of itself (extrapolation) and itself over `factor` (interpolation), by a
/// linear ramp over the dimensions between the correction range's bounds.
fn yarn_frequencies(base: &[f64], theta: f64, d: usize, yarn: &YarnRope) -> Vec<f64> {
    let dim = d as f64;
    let original = yarn.original_max_position_embeddings as f64;
    let correction =
        |rotations: f64| (dim * (original / (rotations * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * theta.ln());
    let (mut low, mut high) = (correction(yarn.beta_fast), correction(yarn.beta_slow));
    if yarn.truncate {
        low = low.floor();
        high = high.ceil();
    }
    let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
    if low == high {
        high += 0.001;
    }
    base.iter()
        .enumerate()
        .map(|(i, &frequency)| {
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let extrapolation = 1.0 - ramp;
            frequency / yarn.factor * (1.0 - extrapolation) + frequency * extrapolation
        })
        .collect()
}
