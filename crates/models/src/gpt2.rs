//! GPT-2 (`gpt2`): learned positions, pre-norm blocks with layer norms and
//! biases, `Conv1D` weights stored `(in, out)`, a `gelu_new` MLP, the head
//! tied to the token embedding or its own (`lm_head.weight`). Tensor names are the checkpoint's
//! (`h.0.attn.c_attn.weight`).

use candle_core::{Module, Result, Tensor};

use crate::ops::add_constant;

use super::config::{Config, Gelu};
use super::kv_cache::{Chunk, KvCache};
use super::layers::{Forms, Layout, Norm, Proj, attention, cached_attention, gelu, last_tokens};
use super::lora::Lora;
use super::weights::{Init, TensorSpec, Weights};

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
        self.after_attention(index, xs, &attention(&q, &k, &v, true, None, self.forms)?)
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
            let attended = cached_attention(&q, &k, &v, chunks, cache, index, self.forms.attention)?;
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
