//! The decoders of the Llama kind (`llama`, `mistral`, `qwen2`, `qwen3`, `olmo2`): RMS
//! norms, rotary positions, grouped-query attention, a SwiGLU MLP, the head
//! tied to the embedding or not. Tensor names are the checkpoints'
//! (`model.layers.0.self_attn.q_proj.weight`).

use candle_core::{Module, Result, Tensor};

use super::config::{
    AttentionBias, BertHead, BlockNorms, Config, Fields, Gelu, Llama3Rope, QkNorm, Rope, RopeScaling, YarnRope, refuse,
};
use super::kv_cache::{Chunk, KvCache};
use super::layers::{Forms, Layout, Norm, Proj, Scores, rotate};
use super::layers::{attention, cached_attention, embed, last_tokens, rotary_tables, rotary_tables_at};
use super::lora::Lora;
use super::moe::{self, RouterStats, SparseMlp};
use super::weights::{Init, TensorSpec, Weights};
use crate::Error;
use crate::family::Family;
use crate::ops::{self, Activation};
use crate::per_token::{PerToken, Widths};

const STD: f32 = 0.02;

/// The checkpoint's tensors (the adapters' too, with `lora`).
pub(crate) fn tensors(config: &Config) -> Vec<TensorSpec> {
    let h = config.hidden;
    let mut specs = vec![TensorSpec::new("model.embed_tokens.weight", &[config.vocab, h], Init::Normal(STD))];
    // a norm that scales by 1 + weight starts at 0, as transformers starts it
    let norm_init = if config.norm_plus_one { Init::Zeros } else { Init::Ones };
    for layer in 0..config.layers {
        let at = |part: &str| format!("model.layers.{layer}.{part}");
        let experts = config.experts_at(layer);
        for (name, out, input, bias) in dense_projections(config, layer) {
            specs.push(TensorSpec::new(at(&format!("{name}.weight")), &[out, input], Init::Normal(STD)));
            if bias {
                specs.push(TensorSpec::new(at(&format!("{name}.bias")), &[out], Init::Zeros));
            }
        }
        let (q_norm, k_norm) = match config.qk_norm {
            QkNorm::None => (0, 0),
            QkNorm::PerHead => (config.head_dim, config.head_dim),
            QkNorm::Projection => (config.heads * config.head_dim, config.kv_heads * config.head_dim),
        };
        if config.qk_norm != QkNorm::None {
            specs.push(TensorSpec::new(at("self_attn.q_norm.weight"), &[q_norm], norm_init));
            specs.push(TensorSpec::new(at("self_attn.k_norm.weight"), &[k_norm], norm_init));
        }
        if let Some(experts) = experts {
            specs.extend(moe::tensors(config, experts, layer));
        }
        for norm in norm_names(config.norms) {
            specs.push(TensorSpec::new(at(&format!("{norm}.weight")), &[h], norm_init));
        }
    }
    specs.push(TensorSpec::new("model.norm.weight", &[h], norm_init));
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
        BlockNorms::Sandwich => {
            &["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"]
        }
    }
}

/// A layer's projections of the Llama kind, by name within the layer, with
/// their (out, in) and whether each has a bias: attention's (q, k and v
/// apart or joined, o), then the MLP's unless the layer is sparse (its
/// router and experts are [`moe`]'s).
fn dense_projections(config: &Config, layer: usize) -> Vec<(&'static str, usize, usize, bool)> {
    let (h, q, kv, i) =
        (config.hidden, config.heads * config.head_dim, config.kv_heads * config.head_dim, config.intermediate);
    let (qkv_bias, o_bias) =
        (config.attention_bias != AttentionBias::None, config.attention_bias == AttentionBias::All);
    let mlp_bias = config.mlp_bias;
    // saturated where past usize: the count of a config past 64 bits refuses it, not a panic
    let mut projections = match config.fused_projections {
        true => vec![("self_attn.qkv_proj", q.saturating_add(kv.saturating_mul(2)), h, qkv_bias)],
        false => vec![
            ("self_attn.q_proj", q, h, qkv_bias),
            ("self_attn.k_proj", kv, h, qkv_bias),
            ("self_attn.v_proj", kv, h, qkv_bias),
        ],
    };
    projections.push(("self_attn.o_proj", h, q, o_bias));
    if config.experts_at(layer).is_none() {
        match config.fused_projections {
            true => projections.push(("mlp.gate_up_proj", i.saturating_mul(2), h, mlp_bias)),
            false => projections.extend([("mlp.gate_proj", i, h, mlp_bias), ("mlp.up_proj", i, h, mlp_bias)]),
        }
        projections.push(("mlp.down_proj", h, i, mlp_bias));
    }
    projections
}

/// The modules LoRA can adapt, by checkpoint name, with their (out, in).
pub(crate) fn projections(config: &Config) -> Vec<(String, usize, usize)> {
    (0..config.layers)
        .flat_map(|layer| {
            let dense = dense_projections(config, layer)
                .into_iter()
                .map(move |(name, out, input, _)| (format!("model.layers.{layer}.{name}"), out, input));
            // the attention's, then the experts'
            let experts = config.experts_at(layer).map(|experts| moe::projections(config, experts, layer));
            dense.chain(experts.into_iter().flatten()).collect::<Vec<_>>()
        })
        .collect()
}

/// A decoder of the Llama kind read from its config, as transformers reads
/// `{class}Config`: what every one of them has. The family reads the rest
/// (biases, windows, q/k norms) and sets it.
pub(crate) fn read(family: Family, fields: &Fields, class: &str) -> std::result::Result<Config, Error> {
    let (causal, base) = (format!("{class}ForCausalLM"), format!("{class}Model"));
    let mut config = read_as(family, fields, &[causal.as_str(), base.as_str()])?;
    config.rope = Some(Config::rope(fields, config.max_positions)?);
    Ok(config)
}

/// [`read`] of a family whose `architectures` may name `classes`, its
/// rotary positions left for the family to read (`rope` `None`).
pub(crate) fn read_as(family: Family, fields: &Fields, classes: &[&str]) -> std::result::Result<Config, Error> {
    Config::architecture(fields, classes, "a language model trained on its next tokens")?;
    let hidden = fields.required(&["hidden_size"])?;
    let heads = fields.required(&["num_attention_heads"])?;
    let layers = fields.required(&["num_hidden_layers"])?;
    let kv_heads = fields.count(&["num_key_value_heads"])?.unwrap_or(heads);
    let head_dim = match fields.count(&["head_dim"])? {
        Some(head_dim) => head_dim,
        None if hidden.is_multiple_of(heads) => hidden / heads,
        None => return Err(refuse("num_attention_heads", heads, format!("a divisor of hidden_size {hidden}"))),
    };
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
        rope: None,
        local_rope: None,
        partial_rotary_factor: 1.0,
        fused_projections: false,
        tie_embeddings: fields.flag("tie_word_embeddings")?.unwrap_or(false),
        attention_bias: AttentionBias::None,
        mlp_bias: false,
        qk_norm: QkNorm::None,
        norms: BlockNorms::Pre,
        norm_plus_one: false,
        embedding_scale: None,
        mlp_activation: crate::ops::Activation::Silu,
        attention_scale: None,
        attention_softcap: None,
        final_softcap: None,
        gelu: Gelu::Tanh,
        sliding_window: None,
        sliding_layers: Vec::new(),
        experts: None,
        type_vocab: 0,
        bert_head: BertHead::MaskedLm,
        padding_idx: fields.id("pad_token_id")?,
        dtype: Config::dtype(fields)?,
        dropout: Vec::new(),
        unknown_keys: Vec::new(),
    })
}

/// `hidden_act` SiLU (SwiGLU), all a Llama-kind MLP computes.
pub(crate) fn silu(fields: &Fields) -> std::result::Result<(), Error> {
    let act = fields.text("hidden_act")?.unwrap_or("silu");
    if act != "silu" {
        return Err(refuse("hidden_act", act, "silu (SwiGLU)"));
    }
    Ok(())
}

/// A GeGLU MLP's GELU under `key` (`default` when absent), by its
/// transformers name: the tanh form, or the exact one.
pub(crate) fn gelu(fields: &Fields, key: &str, default: &str) -> std::result::Result<Activation, Error> {
    match fields.text(key)?.unwrap_or(default) {
        "gelu_pytorch_tanh" | "gelu_new" => Ok(Activation::Gelu),
        "gelu" => Ok(Activation::GeluErf),
        other => Err(refuse(key, other, "gelu_pytorch_tanh, gelu_new or gelu (GeGLU)")),
    }
}

/// `attention_bias`: every attention projection's bias, or none.
pub(crate) fn attention_bias(fields: &Fields) -> std::result::Result<AttentionBias, Error> {
    Ok(if fields.flag("attention_bias")? == Some(true) { AttentionBias::All } else { AttentionBias::None })
}

/// No window: a `layer_types` that names a sliding layer is refused (the
/// family attends in full everywhere).
pub(crate) fn full_attention(fields: &Fields, layers: usize) -> std::result::Result<Option<usize>, Error> {
    if Config::layer_types(fields, layers)?.is_some_and(|types| types.contains(&true)) {
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
        BlockNorms::Sandwich => (
            4.0 * w.rms_norm(w.h) + 2.0 * w.h * d,
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
    // joined projections: q, k and v split from one product and copied as
    // their heads are made, the gate and up halves made contiguous
    let split = if config.fused_projections { (w.q + 2.0 * w.kv + 2.0 * w.i) * d } else { 0.0 };
    let attention = PerToken {
        kept: norms
            + split
            + w.linear(w.q, qkv_bias)
            + 2.0 * w.linear(w.kv, qkv_bias)
            + contiguous
            + qk_norms
            + rotary
            + o_out,
        backward: 4.0 * (w.q + 2.0 * w.kv) * d,
    };
    // a layer of one kind (Config::layer_kinds): its MLP dense, or its experts
    let mlp = match config.experts_at(0) {
        Some(experts) => moe::block_bytes(experts, w),
        None => PerToken {
            kept: 2.0 * w.linear(w.i, config.mlp_bias) + 2.0 * activation(w.i) + down_out,
            backward: w.mlp_backward(false),
        },
    };
    attention + mlp
}

struct Block {
    /// Before attention (`Pre`).
    input_norm: Option<Norm>,
    qkv: Qkv,
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
    mlp: Mlp,
    /// Its attention's window, soft cap and scale.
    scores: Scores,
    /// It rotates by the sliding layers' own tables (Gemma 3's local base).
    local_rope: bool,
}

/// q, k and v: three projections, or one whose output they split (Phi-3's
/// `qkv_proj`).
enum Qkv {
    Apart { q: Proj, k: Proj, v: Proj },
    Joined(Proj),
}

/// A block's MLP: dense, or a mixture of experts.
enum Mlp {
    Dense { gate_up: GateUp, down: Proj },
    Sparse(SparseMlp),
}

/// An MLP's gate and up projections, apart or joined (`gate_up_proj`).
enum GateUp {
    Apart { gate: Proj, up: Proj },
    Joined(Proj),
}

/// The rotary tables of a sequence: every layer's, and the sliding layers'
/// where they differ.
pub(crate) struct Tables {
    global: (Tensor, Tensor),
    local: Option<(Tensor, Tensor)>,
}

impl Tables {
    fn of(&self, local: bool) -> &(Tensor, Tensor) {
        match (&self.local, local) {
            (Some(tables), true) => tables,
            _ => &self.global,
        }
    }
}

/// A decoder of the Llama kind over its weights.
pub(crate) struct Decoder {
    /// The load-balancing loss's weight, and the routers' statistics of
    /// the last training forward pass (`output_router_logits`).
    aux_loss: Option<(f64, std::sync::Mutex<Vec<RouterStats>>)>,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: Norm,
    head: Proj,
    inverse_frequencies: Vec<f64>,
    /// What cos and sin are scaled by (YaRN's attention factor).
    rotary_scale: f64,
    /// The sliding layers' frequencies and scale where they differ (Gemma 3).
    local_frequencies: Option<(Vec<f64>, f64)>,
    /// LongRoPE's long frequencies and scale, and past how many positions
    /// they apply.
    long_frequencies: Option<(Vec<f64>, f64, usize)>,
    padding_idx: Option<usize>,
    /// The embeddings multiplied by this (Gemma's √hidden).
    embedding_scale: Option<f64>,
    /// The gated MLP's activation.
    activation: Activation,
    /// The logits soft-capped at this.
    final_softcap: Option<f64>,
    forms: Forms,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Decoder {
    pub(crate) fn new(config: &Config, weights: &Weights, lora: Option<&Lora>, forms: Forms) -> Result<Decoder> {
        let (eps, ops) = (config.norm_eps, forms.ops);
        let rms = |weights: &Weights, name: &str| {
            Ok::<_, candle_core::Error>(Norm::rms(weights, name, eps, ops)?.plus_one(config.norm_plus_one))
        };
        let mut blocks = Vec::with_capacity(config.layers);
        for layer in 0..config.layers {
            let at = |part: &str| format!("model.layers.{layer}.{part}");
            let proj = |part: &str| Proj::new(weights, &at(part), Layout::OutIn, lora, ops);
            let norm = |part: &str| rms(weights, &at(part));
            let qk_norm = config.qk_norm != QkNorm::None;
            // norms before attention and the MLP, after them, or both
            let sandwich = config.norms == BlockNorms::Sandwich;
            let (pre, post) = (config.norms == BlockNorms::Pre, config.norms == BlockNorms::Post);
            let norm_if = |on: bool, part: &str| on.then(|| norm(part)).transpose();
            blocks.push(Block {
                input_norm: norm_if(pre || sandwich, "input_layernorm")?,
                qkv: if config.fused_projections {
                    Qkv::Joined(proj("self_attn.qkv_proj")?)
                } else {
                    Qkv::Apart {
                        q: proj("self_attn.q_proj")?,
                        k: proj("self_attn.k_proj")?,
                        v: proj("self_attn.v_proj")?,
                    }
                },
                o: proj("self_attn.o_proj")?,
                q_norm: qk_norm.then(|| norm("self_attn.q_norm")).transpose()?,
                k_norm: qk_norm.then(|| norm("self_attn.k_norm")).transpose()?,
                qk_norm_whole: config.qk_norm == QkNorm::Projection,
                attention_out_norm: norm_if(post || sandwich, "post_attention_layernorm")?,
                mlp_norm: match config.norms {
                    BlockNorms::Pre => Some(norm("post_attention_layernorm")?),
                    BlockNorms::Post => None,
                    BlockNorms::Sandwich => Some(norm("pre_feedforward_layernorm")?),
                },
                mlp_out_norm: norm_if(post || sandwich, "post_feedforward_layernorm")?,
                scores: Scores {
                    window: config.window_of(layer),
                    softcap: config.attention_softcap,
                    scale: config.attention_scale,
                },
                local_rope: config.local_rope.is_some() && config.window_of(layer).is_some(),
                mlp: match config.experts_at(layer) {
                    Some(experts) => {
                        Mlp::Sparse(SparseMlp::new(experts, layer, weights, lora, config.mlp_activation, forms)?)
                    }
                    None => Mlp::Dense {
                        gate_up: if config.fused_projections {
                            GateUp::Joined(proj("mlp.gate_up_proj")?)
                        } else {
                            GateUp::Apart { gate: proj("mlp.gate_proj")?, up: proj("mlp.up_proj")? }
                        },
                        down: proj("mlp.down_proj")?,
                    },
                },
            });
        }
        let (inverse_frequencies, rotary_scale) = rotary_frequencies(config);
        let local_frequencies =
            config.local_rope.as_ref().map(|rope| rope_frequencies(rope, config.rotary_dim(), false));
        let long_frequencies = match &config.rope {
            Some(rope @ Rope { scaling: RopeScaling::LongRope(long), .. }) => {
                let (frequencies, scale) = rope_frequencies(rope, config.rotary_dim(), true);
                Some((frequencies, scale, long.original_max_position_embeddings))
            }
            _ => None,
        };
        let head_name = if config.tie_embeddings { "model.embed_tokens" } else { "lm_head" };
        Ok(Decoder {
            aux_loss: config.experts.as_ref().and_then(|e| e.aux_loss).map(|w| (w, std::sync::Mutex::new(Vec::new()))),
            embed: weights.get("model.embed_tokens.weight")?,
            blocks,
            norm: rms(weights, "model.norm")?,
            head: Proj::unadapted(weights, head_name, Layout::OutIn, lora, ops)?,
            inverse_frequencies,
            rotary_scale,
            local_frequencies,
            long_frequencies,
            padding_idx: config.padding_idx,
            embedding_scale: config.embedding_scale,
            activation: config.mlp_activation,
            final_softcap: config.final_softcap,
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
        self.trunk_of_rows(embed(&self.embed, ids, self.padding_idx)?)
    }

    /// [`trunk`](Self::trunk) from the embedding table's rows for the ids
    /// `(b, s, hidden)`, before any scale.
    pub(crate) fn trunk_of_rows(&self, rows: Tensor) -> Result<Tensor> {
        if let Some((_, stats)) = &self.aux_loss {
            stats.lock().map_err(|_| candle_core::Error::Msg("the router's statistics".into()))?.clear();
        }
        let mut xs = self.scaled(rows)?;
        let tables = self.tables(&xs)?;
        for index in 0..self.blocks.len() {
            xs = self.block(index, &xs, &tables)?;
        }
        Ok(xs)
    }

    /// The token embeddings `(b, s, hidden)` of ids `(b, s)`.
    pub(crate) fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        self.scaled(embed(&self.embed, ids, self.padding_idx)?)
    }

    /// The embedding table and the token whose row gets no gradient.
    pub(crate) fn embedding(&self) -> (&Tensor, Option<usize>) {
        (&self.embed, self.padding_idx)
    }

    /// Embedding rows `xs` scaled as the family scales them.
    fn scaled(&self, xs: Tensor) -> Result<Tensor> {
        match self.embedding_scale {
            // the scale rounded to the embeddings' dtype first, as transformers rounds it
            Some(scale) => xs.affine(
                Tensor::new(scale as f32, xs.device())?
                    .to_dtype(xs.dtype())?
                    .to_dtype(candle_core::DType::F64)?
                    .to_scalar::<f64>()?,
                0.0,
            ),
            None => Ok(xs),
        }
    }

    /// The rotary tables for the sequence `xs` `(b, s, hidden)` holds.
    pub(crate) fn tables(&self, xs: &Tensor) -> Result<Tables> {
        let (s, dtype, device) = (xs.dim(1)?, xs.dtype(), xs.device());
        let (frequencies, scale) = self.frequencies(s);
        Ok(Tables {
            global: rotary_tables(frequencies, scale, s, dtype, device)?,
            local: self
                .local_frequencies
                .as_ref()
                .map(|(frequencies, scale)| rotary_tables(frequencies, *scale, s, dtype, device))
                .transpose()?,
        })
    }

    /// Every layer's frequencies and scale for a forward pass whose longest
    /// position is `longest − 1`: LongRoPE's long ones past its original
    /// positions, as transformers chooses them.
    fn frequencies(&self, longest: usize) -> (&[f64], f64) {
        match &self.long_frequencies {
            Some((frequencies, scale, original)) if longest > *original => (frequencies, *scale),
            _ => (&self.inverse_frequencies, self.rotary_scale),
        }
    }

    /// Block `index` of the decoder.
    pub(crate) fn block(&self, index: usize, xs: &Tensor, tables: &Tables) -> Result<Tensor> {
        let tables = tables.of(self.blocks[index].local_rope);
        let (q, k, v) = self.queries_keys_values(index, xs)?;
        let scores = self.blocks[index].scores;
        let stats = self.aux_loss.as_ref().map(|(_, stats)| stats);
        self.after_attention(index, xs, &attention(&q, &k, &v, true, Some(tables), self.forms, scores)?, stats)
    }

    /// The load-balancing loss of the last forward pass's routers, at its
    /// weight, where the config asks for it (`output_router_logits`).
    pub(crate) fn router_aux_loss(&self) -> Result<Option<Tensor>> {
        let Some((weight, stats)) = &self.aux_loss else { return Ok(None) };
        let stats = std::mem::take(&mut *stats.lock().map_err(|_| candle_core::Error::Msg("the router".into()))?);
        if stats.is_empty() {
            return Ok(None);
        }
        moe::load_balancing_loss(&stats, *weight).map(Some)
    }

    /// Block `index`'s queries `(b, heads, s, d)`, keys and values `(b,
    /// kv_heads, s, d)`, normed (Qwen3, OLMo 2), not rotated: views of the
    /// projections' outputs, no copy (copies of a joined projection's splits).
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
        let (q_width, kv_width) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let (q, k, v) = match &block.qkv {
            Qkv::Apart { q, k, v } => (q.forward(&h)?, k.forward(&h)?, v.forward(&h)?),
            // split from one product (each split copied where the heads are made)
            Qkv::Joined(qkv) => {
                let all = qkv.forward(&h)?;
                (
                    all.narrow(2, 0, q_width)?,
                    all.narrow(2, q_width, kv_width)?,
                    all.narrow(2, q_width + kv_width, kv_width)?,
                )
            }
        };
        let heads = |projected: Tensor, norm: Option<&Norm>, count: usize| {
            let projected = match norm {
                Some(norm) => norm.forward(&projected)?,
                None => projected,
            };
            projected.reshape((b, s, count, self.head_dim))
        };
        let (mut q, mut k) = (heads(q, whole.0, self.heads)?, heads(k, whole.1, self.kv_heads)?);
        let v = heads(v, None, self.kv_heads)?;
        if let (Some(q_norm), Some(k_norm)) = each {
            q = q_norm.forward(&q)?;
            k = k_norm.forward(&k)?;
        }
        Ok((q.transpose(1, 2)?, k.transpose(1, 2)?, v.transpose(1, 2)?))
    }

    /// The rest of block `index` once attention gave `attended` `(b, s,
    /// heads × d)`: the output projection, the residual and the MLP.
    fn after_attention(
        &self,
        index: usize,
        xs: &Tensor,
        attended: &Tensor,
        stats: Option<&std::sync::Mutex<Vec<RouterStats>>>,
    ) -> Result<Tensor> {
        let block = &self.blocks[index];
        let xs = match &block.attention_out_norm {
            Some(norm) => ops::residual(xs, &norm.forward(&block.o.forward(attended)?)?)?,
            None => block.o.added_to(xs, attended)?,
        };
        let h = match &block.mlp_norm {
            Some(norm) => norm.forward(&xs)?,
            None => xs.clone(),
        };
        let (gate_up, down) = match &block.mlp {
            Mlp::Dense { gate_up, down } => (gate_up, down),
            Mlp::Sparse(sparse) => {
                return match &block.mlp_out_norm {
                    Some(norm) => ops::residual(&xs, &norm.forward(&sparse.forward(&h, None, stats)?)?),
                    None => sparse.forward(&h, Some(&xs), stats),
                };
            }
        };
        let (gate, up) = match gate_up {
            GateUp::Apart { gate, up } => (gate.forward(&h)?, up.forward(&h)?),
            // the first half the gate, the second the up projection (Phi-3's chunk)
            GateUp::Joined(gate_up) => {
                let both = gate_up.forward(&h)?;
                let half = both.dim(2)? / 2;
                (both.narrow(2, 0, half)?.contiguous()?, both.narrow(2, half, half)?.contiguous()?)
            }
        };
        match &block.mlp_out_norm {
            Some(norm) => ops::residual(&xs, &norm.forward(&down.activated(self.activation, &gate, Some(&up))?)?),
            None => down.activated_added_to(&xs, self.activation, &gate, Some(&up)),
        }
    }

    /// The logits `(n, vocab)` of the last token of each of `chunks`, whose
    /// ids `(1, T)` are the chunks' tokens one after the other: each chunk's
    /// keys and values written into `cache` (reserved before) and its
    /// queries attending to every key of its sequence so far.
    pub(crate) fn forward_cached(&self, ids: &Tensor, chunks: &[Chunk], cache: &KvCache) -> Result<Tensor> {
        let mut xs = self.embed(ids)?;
        let positions: Vec<usize> = chunks.iter().flat_map(|chunk| chunk.positions()).collect();
        let at =
            |frequencies: &[f64], scale: f64| rotary_tables_at(frequencies, scale, &positions, xs.dtype(), xs.device());
        let longest = positions.iter().max().map_or(0, |last| last + 1);
        let (frequencies, scale) = self.frequencies(longest);
        let tables = Tables {
            global: at(frequencies, scale)?,
            local: self.local_frequencies.as_ref().map(|(frequencies, scale)| at(frequencies, *scale)).transpose()?,
        };
        for index in 0..self.blocks.len() {
            let (cos, sin) = tables.of(self.blocks[index].local_rope);
            let (q, k, v) = self.queries_keys_values(index, &xs)?;
            let (q, k) = (rotate(&q, cos, sin, self.forms.ops)?, rotate(&k, cos, sin, self.forms.ops)?);
            let scores = self.blocks[index].scores;
            let attended =
                cached_attention(&q, &k, &v.contiguous()?, chunks, cache, index, self.forms.attention, scores)?;
            xs = self.after_attention(index, &xs, &attended, None)?;
        }
        self.head(&last_tokens(&xs, chunks)?)
    }

    /// The final norm and the head: logits of the last block's output.
    pub(crate) fn head(&self, xs: &Tensor) -> Result<Tensor> {
        let logits = self.head.forward(&self.norm.forward(xs)?)?;
        match self.final_softcap {
            Some(cap) => (logits / cap)?.tanh()? * cap,
            None => Ok(logits),
        }
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
    match &config.rope {
        Some(rope) => rope_frequencies(rope, config.rotary_dim(), false),
        None => (Vec::new(), 1.0),
    }
}

/// [`rotary_frequencies`] of one `rope` over `d` rotated dimensions of a
/// head (LongRoPE's `long` factors, or its short ones).
fn rope_frequencies(rope: &Rope, d: usize, long: bool) -> (Vec<f64>, f64) {
    let base: Vec<f64> = (0..d / 2).map(|i| 1.0 / rope.theta.powf(2.0 * i as f64 / d as f64)).collect();
    match &rope.scaling {
        // dynamic NTK changes the base only past the positions, where no step here runs
        RopeScaling::None | RopeScaling::Dynamic { .. } => (base, 1.0),
        RopeScaling::Linear { factor } => (base.into_iter().map(|f| f / *factor).collect(), 1.0),
        RopeScaling::Llama3(scaling) => (llama3(base, scaling), 1.0),
        RopeScaling::Yarn(yarn) => (yarn_frequencies(&base, rope.theta, d, yarn), yarn.attention_factor),
        RopeScaling::LongRope(scaling) => {
            let factors = if long { &scaling.long_factor } else { &scaling.short_factor };
            (base.iter().zip(factors).map(|(frequency, factor)| frequency / factor).collect(), scaling.attention_factor)
        }
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
