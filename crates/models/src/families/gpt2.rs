//! GPT-2 (`gpt2`): learned positions, pre-norm blocks with layer norms and
//! biases, `Conv1D` weights stored `(in, out)`, a `gelu_new` MLP, the head
//! tied to the token embedding or its own (`lm_head.weight`). Tensor names are the checkpoint's
//! (`h.0.attn.c_attn.weight`).

use candle_core::{Module, Result, Tensor};

use crate::ops::add_constant;

use super::{Architecture, Network};
use crate::Error;
use crate::config::{AttentionBias, BertHead, BlockNorms, Config, Fields, Gelu, QkNorm, refuse};
use crate::family::Family;
use crate::keys::{FALSE, Handling, TRUE};
use crate::kv_cache::{Chunk, KvCache};
use crate::layers::{Forms, Layout, Norm, Proj, Scores, attention, cached_attention, gelu, last_tokens};
use crate::lora::Lora;
use crate::per_token::{PerToken, Widths};
use crate::weights::{Init, TensorSpec, Weights};

const STD: f32 = 0.02;

pub(crate) fn tensors(config: &Config) -> Vec<TensorSpec> {
    let (h, i) = (config.hidden, config.intermediate);
    let mut specs = vec![
        TensorSpec::new("wte.weight", &[config.vocab, h], Init::Normal(STD)),
        TensorSpec::new("wpe.weight", &[config.max_positions, h], Init::Normal(STD)),
    ];
    for layer in 0..config.layers {
        let at = |part: &str| format!("h.{layer}.{part}");
        for norm in ["ln_1", "ln_2"] {
            specs.push(TensorSpec::new(at(&format!("{norm}.weight")), &[h], Init::Ones));
            specs.push(TensorSpec::new(at(&format!("{norm}.bias")), &[h], Init::Zeros));
        }
        for (name, input, out) in
            [("attn.c_attn", h, 3 * h), ("attn.c_proj", h, h), ("mlp.c_fc", h, i), ("mlp.c_proj", i, h)]
        {
            specs.push(TensorSpec::new(at(&format!("{name}.weight")), &[input, out], Init::Normal(STD)));
            specs.push(TensorSpec::new(at(&format!("{name}.bias")), &[out], Init::Zeros));
        }
    }
    specs.push(TensorSpec::new("ln_f.weight", &[h], Init::Ones));
    specs.push(TensorSpec::new("ln_f.bias", &[h], Init::Zeros));
    if !config.tie_embeddings {
        specs.push(TensorSpec::new("lm_head.weight", &[config.vocab, h], Init::Normal(STD)));
    }
    specs
}

/// The modules LoRA can adapt, with their (out, in).
pub(crate) fn projections(config: &Config) -> Vec<(String, usize, usize)> {
    let (h, i) = (config.hidden, config.intermediate);
    (0..config.layers)
        .flat_map(|layer| {
            [("attn.c_attn", 3 * h, h), ("attn.c_proj", h, h), ("mlp.c_fc", i, h), ("mlp.c_proj", h, i)]
                .into_iter()
                .map(move |(name, out, input)| (format!("h.{layer}.{name}"), out, input))
        })
        .collect()
}

struct Block {
    ln_1: Norm,
    c_attn: Proj,
    attn_proj: Proj,
    ln_2: Norm,
    c_fc: Proj,
    mlp_proj: Proj,
}

pub(crate) struct Gpt2 {
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Block>,
    ln_f: Norm,
    head: Proj,
    heads: usize,
    gelu: Gelu,
    forms: Forms,
}

impl Gpt2 {
    pub(crate) fn new(config: &Config, weights: &Weights, lora: Option<&Lora>, forms: Forms) -> Result<Gpt2> {
        let (eps, ops) = (config.norm_eps, forms.ops);
        let mut blocks = Vec::with_capacity(config.layers);
        for layer in 0..config.layers {
            let at = |part: &str| format!("h.{layer}.{part}");
            let proj = |part: &str| Proj::new(weights, &at(part), Layout::InOut, lora, ops);
            blocks.push(Block {
                ln_1: Norm::layer(weights, &at("ln_1"), eps, ops)?,
                c_attn: proj("attn.c_attn")?,
                attn_proj: proj("attn.c_proj")?,
                ln_2: Norm::layer(weights, &at("ln_2"), eps, ops)?,
                c_fc: proj("mlp.c_fc")?,
                mlp_proj: proj("mlp.c_proj")?,
            });
        }
        Ok(Gpt2 {
            wte: weights.get("wte.weight")?,
            wpe: weights.get("wpe.weight")?,
            blocks,
            ln_f: Norm::layer(weights, "ln_f", eps, ops)?,
            // tied: the token embedding, (vocab, hidden) as a Linear reads it
            head: Proj::unadapted(
                weights,
                if config.tie_embeddings { "wte" } else { "lm_head" },
                Layout::OutIn,
                lora,
                ops,
            )?,
            heads: config.heads,
            gelu: config.gelu,
            forms,
        })
    }

    pub(crate) fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.head(&self.trunk(ids)?)
    }

    /// The last block's output `(b, s, hidden)` for token ids `(b, s)`.
    pub(crate) fn trunk(&self, ids: &Tensor) -> Result<Tensor> {
        let mut xs = self.embed(ids)?;
        for index in 0..self.blocks.len() {
            xs = self.block(index, &xs)?;
        }
        Ok(xs)
    }

    /// Token and position embeddings `(b, s, hidden)` of ids `(b, s)`.
    pub(crate) fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, s) = ids.dims2()?;
        let hidden = self.wte.dim(1)?;
        let tokens = self.wte.index_select(&ids.flatten_all()?, 0)?.reshape((b, s, hidden))?;
        // learned positions: a variable when it trains, a constant when frozen
        if self.wpe.track_op() {
            tokens.broadcast_add(&self.wpe.narrow(0, 0, s)?)
        } else {
            add_constant(&tokens, &self.wpe.narrow(0, 0, s)?)
        }
    }

    /// Block `index`.
    pub(crate) fn block(&self, index: usize, xs: &Tensor) -> Result<Tensor> {
        let (q, k, v) = self.queries_keys_values(index, xs)?;
        self.after_attention(index, xs, &attention(&q, &k, &v, true, None, self.forms, Scores::default())?)
    }

    /// Block `index`'s queries, keys and values `(b, heads, s, d)`: views
    /// of the projection's output, no copy.
    fn queries_keys_values(&self, index: usize, xs: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let block = &self.blocks[index];
        let (b, s, hidden) = xs.dims3()?;
        let qkv =
            block.c_attn.forward(&block.ln_1.forward(xs)?)?.reshape((b, s, 3, self.heads, hidden / self.heads))?;
        let part = |i: usize| qkv.narrow(2, i, 1)?.squeeze(2)?.transpose(1, 2);
        Ok((part(0)?, part(1)?, part(2)?))
    }

    /// The rest of block `index` once attention gave `attended`.
    fn after_attention(&self, index: usize, xs: &Tensor, attended: &Tensor) -> Result<Tensor> {
        let block = &self.blocks[index];
        let xs = block.attn_proj.added_to(xs, attended)?;
        let fc = block.c_fc.forward(&block.ln_2.forward(&xs)?)?;
        block.mlp_proj.activated_added_to(&xs, gelu(self.gelu), &fc, None)
    }

    /// The logits `(n, vocab)` of the last token of each of `chunks` (see
    /// the decoders' `forward_cached`), positions learned.
    pub(crate) fn forward_cached(&self, ids: &Tensor, chunks: &[Chunk], cache: &KvCache) -> Result<Tensor> {
        let hidden = self.wte.dim(1)?;
        let positions: Vec<u32> = chunks.iter().flat_map(|chunk| chunk.positions()).map(|p| p as u32).collect();
        let count = positions.len();
        let positions = Tensor::from_vec(positions, count, ids.device())?;
        let tokens = self.wte.index_select(&ids.flatten_all()?, 0)?;
        let mut xs = (tokens + self.wpe.index_select(&positions, 0)?)?.reshape((1, count, hidden))?;
        for index in 0..self.blocks.len() {
            let (q, k, v) = self.queries_keys_values(index, &xs)?;
            let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
            let attended = cached_attention(&q, &k, &v, chunks, cache, index, self.forms.attention, Scores::default())?;
            xs = self.after_attention(index, &xs, &attended)?;
        }
        self.head(&last_tokens(&xs, chunks)?)
    }

    /// The final norm and the head.
    pub(crate) fn head(&self, xs: &Tensor) -> Result<Tensor> {
        self.head.forward(&self.ln_f.forward(xs)?)
    }

    /// The final norm of the last block's output: what the head multiplies.
    pub(crate) fn final_norm(&self, xs: &Tensor) -> Result<Tensor> {
        self.ln_f.forward(xs)
    }

    /// The head's weight `(vocab, hidden)`.
    pub(crate) fn head_dense(&self) -> Option<(Tensor, Option<Tensor>)> {
        self.head.dense()
    }
}

const GPT2: &[(&str, Handling)] = &[
    ("n_embd", Handling::Read),
    ("hidden_size", Handling::Read),
    ("n_layer", Handling::Read),
    ("num_hidden_layers", Handling::Read),
    ("n_head", Handling::Read),
    ("num_attention_heads", Handling::Read),
    ("n_inner", Handling::Read),
    ("n_positions", Handling::Read),
    ("max_position_embeddings", Handling::Read),
    ("n_ctx", Handling::Inert("transformers 2's name of n_positions; transformers does not read it")),
    ("layer_norm_epsilon", Handling::Read),
    ("activation_function", Handling::Read),
    ("pad_token_id", Handling::Inert("GPT-2's embedding has no padding row")),
    ("attn_pdrop", Handling::Dropout),
    ("embd_pdrop", Handling::Dropout),
    ("resid_pdrop", Handling::Dropout),
    ("summary_type", Handling::Inert("GPT2DoubleHeadsModel's head")),
    ("summary_use_proj", Handling::Inert("GPT2DoubleHeadsModel's head")),
    ("summary_activation", Handling::Inert("GPT2DoubleHeadsModel's head")),
    ("summary_proj_to_labels", Handling::Inert("GPT2DoubleHeadsModel's head")),
    ("summary_first_dropout", Handling::Inert("GPT2DoubleHeadsModel's head")),
    ("scale_attn_weights", Handling::RefusedUnless(TRUE)),
    ("scale_attn_by_inverse_layer_idx", Handling::RefusedUnless(FALSE)),
    ("reorder_and_upcast_attn", Handling::RefusedUnless(FALSE)),
];

/// GPT-2 as a family: its keys, its config, its `Conv1D` layout and
/// `transformer.` names, its bytes.
pub(crate) struct Gpt2Family;

impl Architecture for Gpt2Family {
    fn makes_table_gradients_once(&self) -> bool {
        false
    }

    fn model_type(&self) -> &'static str {
        "gpt2"
    }

    fn keys(&self) -> &'static [&'static [(&'static str, Handling)]] {
        &[GPT2]
    }

    fn read(&self, family: Family, fields: &Fields) -> std::result::Result<Config, Error> {
        read_gpt2(family, fields)
    }

    fn config_key(&self, field: &'static str) -> &'static str {
        match field {
            "hidden_size" => "n_embd",
            "num_hidden_layers" => "n_layer",
            "num_attention_heads" => "n_head",
            "intermediate_size" => "n_inner",
            "max_position_embeddings" => "n_positions",
            other => other,
        }
    }

    fn lora_targets(&self) -> &'static [&'static str] {
        &["c_attn"]
    }

    fn base_model_prefix(&self) -> &'static str {
        "transformer"
    }

    fn tensors(&self, config: &Config) -> Vec<TensorSpec> {
        tensors(config)
    }

    fn projections(&self, config: &Config) -> Vec<(String, usize, usize)> {
        projections(config)
    }

    fn layer_prefix(&self, index: usize) -> String {
        format!("h.{index}.")
    }

    fn weights_in_out(&self) -> bool {
        true
    }

    /// This crate names GPT-2's base tensors without the prefix
    /// (`wte.weight`); a checkpoint may write it.
    fn spellings(&self, ours: &str) -> Vec<String> {
        let mut names = vec![ours.to_owned()];
        if ours != "lm_head.weight" {
            names.push(format!("transformer.{ours}"));
        }
        names
    }

    fn ignored(&self, _config: &Config, _name: &str, bare: &str) -> Option<&'static str> {
        bare.ends_with(".attn.bias").then_some("GPT-2's causal-mask buffer")
    }

    fn tied_copies(&self, _config: &Config) -> Vec<(&'static str, &'static str)> {
        vec![("lm_head.weight", "wte.weight")]
    }

    fn network(&self, config: &Config, weights: &Weights, lora: Option<&Lora>, forms: Forms) -> Result<Network> {
        Ok(Network::Gpt2(Gpt2::new(config, weights, lora, forms)?))
    }

    /// ln_1, c_attn with its bias, q/k/v made contiguous, c_proj and the
    /// residual, ln_2, c_fc, gelu, c_proj and the residual.
    fn block_bytes(&self, _config: &Config, w: &Widths, eager_attention: bool) -> PerToken {
        // the MLP's activation: kept eager, recomputed fused
        let activation = if w.fused { 0.0 } else { w.i * w.d };
        PerToken {
            kept: 2.0 * w.layer_norm(w.h)
                + w.linear(3.0 * w.h, true)
                + 3.0 * if eager_attention { w.h * w.d } else { w.heads(w.h) }
                + w.residual_linear(w.h, true)
                + w.linear(w.i, true)
                + activation
                + w.residual_linear(w.h, true),
            backward: w.mlp_backward(true),
        }
    }

    /// The token rows, the positions added.
    fn embedding_bytes(&self, _config: &Config, w: &Widths) -> f64 {
        2.0 * w.h * w.d
    }

    fn head_input_bytes(&self, _config: &Config, w: &Widths) -> f64 {
        w.layer_norm(w.h)
    }
}

fn read_gpt2(family: Family, fields: &Fields) -> std::result::Result<Config, Error> {
    Config::architecture(fields, &["GPT2LMHeadModel", "GPT2Model"], "a language model trained on its next tokens")?;
    let hidden = fields.required(&["n_embd", "hidden_size"])?;
    let heads = fields.required(&["n_head", "num_attention_heads"])?;
    if !hidden.is_multiple_of(heads) {
        return Err(refuse("n_head", heads, format!("a divisor of n_embd {hidden}")));
    }
    let gelu = Config::gelu("activation_function", fields.text("activation_function")?.unwrap_or("gelu_new"))?;
    let intermediate = match fields.count(&["n_inner"])? {
        Some(inner) => inner,
        None => hidden
            .checked_mul(4)
            .ok_or_else(|| refuse("n_embd", hidden, "a width whose MLP (4 × n_embd) is countable"))?,
    };
    Ok(Config {
        family,
        vocab: fields.required(&["vocab_size"])?,
        hidden,
        layers: fields.required(&["n_layer", "num_hidden_layers"])?,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads,
        intermediate,
        max_positions: fields.count(&["n_positions", "max_position_embeddings"])?.unwrap_or(1024),
        norm_eps: fields.number("layer_norm_epsilon")?.unwrap_or(1e-5),
        rope: None,
        local_rope: None,
        partial_rotary_factor: 1.0,
        fused_projections: false,
        tie_embeddings: fields.flag("tie_word_embeddings")?.unwrap_or(true),
        attention_bias: AttentionBias::All,
        mlp_bias: true,
        qk_norm: QkNorm::None,
        norms: BlockNorms::Pre,
        norm_plus_one: false,
        embedding_scale: None,
        mlp_activation: crate::ops::Activation::Silu,
        attention_scale: None,
        attention_softcap: None,
        final_softcap: None,
        gelu,
        sliding_window: None,
        sliding_layers: Vec::new(),
        experts: None,
        type_vocab: 0,
        bert_head: BertHead::MaskedLm,
        // GPT-2's embedding has no padding_idx
        padding_idx: None,
        dtype: Config::dtype(fields)?,
        dropout: Vec::new(),
        unknown_keys: Vec::new(),
    })
}
