//! The decoders of the Llama kind (`llama`, `mistral`, `qwen2`, `qwen3`): RMS
//! norms, rotary positions, grouped-query attention, a SwiGLU MLP, the head
//! tied to the embedding or not. Tensor names are the checkpoints'
//! (`model.layers.0.self_attn.q_proj.weight`).

use candle_core::{Module, Result, Tensor};

use super::config::{AttentionBias, Config, Llama3Rope, RopeScaling, YarnRope};
use super::kv_cache::{Chunk, KvCache};
use super::layers::{Forms, Layout, Norm, Proj, rotate};
use super::layers::{attention, cached_attention, embed, last_tokens, rotary_tables, rotary_tables_at};
use super::lora::Lora;
use super::weights::{Init, TensorSpec, Weights};
use crate::family::Family;
use crate::ops::Activation;

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
        if config.family == Family::Qwen3 {
            specs.push(TensorSpec::new(at("self_attn.q_norm.weight"), &[config.head_dim], Init::Ones));
            specs.push(TensorSpec::new(at("self_attn.k_norm.weight"), &[config.head_dim], Init::Ones));
        }
        specs.push(TensorSpec::new(at("input_layernorm.weight"), &[h], Init::Ones));
        specs.push(TensorSpec::new(at("post_attention_layernorm.weight"), &[h], Init::Ones));
    }
    specs.push(TensorSpec::new("model.norm.weight", &[h], Init::Ones));
    if !config.tie_embeddings {
        specs.push(TensorSpec::new("lm_head.weight", &[config.vocab, h], Init::Normal(STD)));
    }
    specs
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

struct Block {
    input_norm: Norm,
    q: Proj,
    k: Proj,
    v: Proj,
    o: Proj,
    q_norm: Option<Norm>,
    k_norm: Option<Norm>,
    post_norm: Norm,
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
            let qk_norm = config.family == Family::Qwen3;
            blocks.push(Block {
                input_norm: norm("input_layernorm")?,
                q: proj("self_attn.q_proj")?,
                k: proj("self_attn.k_proj")?,
                v: proj("self_attn.v_proj")?,
                o: proj("self_attn.o_proj")?,
                q_norm: qk_norm.then(|| norm("self_attn.q_norm")).transpose()?,
                k_norm: qk_norm.then(|| norm("self_attn.k_norm")).transpose()?,
                post_norm: norm("post_attention_layernorm")?,
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
        let h = block.input_norm.forward(xs)?;
        let heads = |proj: &Proj, count: usize| proj.forward(&h)?.reshape((b, s, count, self.head_dim));
        let (mut q, mut k) = (heads(&block.q, self.heads)?, heads(&block.k, self.kv_heads)?);
        let v = heads(&block.v, self.kv_heads)?;
        if let (Some(q_norm), Some(k_norm)) = (&block.q_norm, &block.k_norm) {
            q = q_norm.forward(&q)?;
            k = k_norm.forward(&k)?;
        }
        Ok((q.transpose(1, 2)?, k.transpose(1, 2)?, v.transpose(1, 2)?))
    }

    /// The rest of block `index` once attention gave `attended` `(b, s,
    /// heads × d)`: the output projection, the residual and the MLP.
    fn after_attention(&self, index: usize, xs: &Tensor, attended: &Tensor) -> Result<Tensor> {
        let block = &self.blocks[index];
        let xs = block.o.added_to(xs, attended)?;
        let h = block.post_norm.forward(&xs)?;
        let (gate, up) = (block.gate.forward(&h)?, block.up.forward(&h)?);
        block.down.activated_added_to(&xs, Activation::Silu, &gate, Some(&up))
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
