//! A decoder-only transformer language model on a synthetic next-token task.

use candle_core::backprop::GradStore;
use candle_core::{D, DType, Device, Module, Tensor};
use candle_nn::{Embedding, Linear};

use super::{at_least, cross_entropy, detach_linear};
use crate::Error;
use crate::params::Params;
use crate::splitmix::Rng;
use crate::trainer::footprint::{Sizes, adamw_state};
use crate::trainer::{Footprint, Model, Trainer, check_dtype};
use autobatch::model::checkpointed;

/// Size of a [`Transformer`]: GPT-style blocks (pre-norm, causal multi-head
/// self-attention, 4× GELU MLP), learned positions, untied output head.
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Hidden size.
    pub d_model: usize,
    /// Attention heads; must divide `d_model`.
    pub heads: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Tokens per sample: the longest sequence the model takes (its learned
    /// positions). Memory per sample grows with it, quadratically in
    /// attention: tune at the longest sequence training will see, or at
    /// several with [`Search::sizes`](autobatch::Search::sizes) (the built
    /// model steps at any length up to this one, see [`Resizable`](autobatch::Resizable)).
    pub seq_len: usize,
    /// Dtype of weights, gradients and optimizer state: f32 or bf16.
    pub dtype: DType,
    /// Seed of the weights and the synthetic data.
    pub seed: u64,
    /// Gradient checkpointing over the blocks ([`checkpointed`]):
    /// each block's input kept instead of its activations, each block run again
    /// in the backward pass.
    pub checkpointing: bool,
}

impl Default for TransformerConfig {
    /// A small model: vocab 256, d_model 64, 4 heads, 2 layers, 64 tokens, f32,
    /// no checkpointing.
    fn default() -> Self {
        TransformerConfig {
            vocab: 256,
            d_model: 64,
            heads: 4,
            layers: 2,
            seq_len: 64,
            dtype: DType::F32,
            seed: 0,
            checkpointing: false,
        }
    }
}

impl TransformerConfig {
    /// A very small model for doc examples and quick tests.
    pub fn tiny() -> Self {
        TransformerConfig { vocab: 32, d_model: 16, heads: 2, layers: 1, seq_len: 8, ..Self::default() }
    }

    /// Checks the sizes.
    pub fn check(&self) -> Result<(), Error> {
        at_least(crate::Setting::Vocab, self.vocab, 2)?;
        at_least(crate::Setting::DModel, self.d_model, 1)?;
        at_least(crate::Setting::Heads, self.heads, 1)?;
        at_least(crate::Setting::Layers, self.layers, 1)?;
        at_least(crate::Setting::SeqLen, self.seq_len, 1)?;
        if !self.d_model.is_multiple_of(self.heads) {
            return Err(Error::invalid(
                crate::Setting::Heads,
                autobatch::Value::Count(self.heads),
                format!("it must be a divisor of the model width, {}", self.d_model),
            ));
        }
        check_dtype(self.dtype)
    }

    /// The model's name and size, as its [`Model::describe`] says it.
    fn describe(&self, active_len: usize) -> String {
        let seq_len = if active_len == self.seq_len {
            self.seq_len.to_string()
        } else {
            format!("{active_len} of {}", self.seq_len)
        };
        format!(
            "transformer(vocab {}, d-model {}, heads {}, layers {}, seq-len {seq_len}, {}{})",
            self.vocab,
            self.d_model,
            self.heads,
            self.layers,
            self.dtype.as_str(),
            if self.checkpointing { ", checkpointing" } else { "" }
        )
    }

    /// What the model needs before a step, from its sizes alone (checked:
    /// sizes too large for 64-bit byte counts are an error).
    pub fn footprint(&self) -> Result<Footprint, Error> {
        self.check()?;
        let n = Sizes { model: self.describe(self.seq_len) };
        let [v, d, h, l, s] = [self.vocab, self.d_model, self.heads, self.layers, self.seq_len].map(|x| x as u64);
        let dtype = self.dtype.size_in_bytes() as u64;
        // per block: qkv 3d² + 3d, proj d² + d, fc1 4d² + 4d, fc2 4d² + d, two norms 4d
        let block = n.sum(&[n.product(&[12, d, d])?, n.product(&[13, d])?])?;
        let parameters = n.sum(&[
            n.product(&[v, d])?, // token embeddings
            n.product(&[s, d])?, // positions
            n.product(&[l, block])?,
            n.product(&[2, d])?, // final norm
            n.product(&[d, v])?, // head weight
            v,                   // head bias
        ])?;
        let state = adamw_state(parameters, self.dtype)?;
        let constant_inputs = n.sum(&[
            n.product(&[s, s, dtype])?, // the causal mask
            n.product(&[v, 4])?,        // the successor table
        ])?;
        // one layer's attention scores and their softmax, and the logits in f32
        let min_bytes_per_sample = n.sum(&[n.product(&[2, h, s, s, dtype])?, n.product(&[s, v, 4])?])?;
        n.footprint(state, constant_inputs, min_bytes_per_sample)
    }

    /// Builds the model and its AdamW optimizer on `device`.
    pub fn build(&self, device: &Device) -> Result<Trainer<Transformer>, Error> {
        self.footprint()?;
        let mut params = Params::new(self.seed, device, self.dtype);
        let model = Transformer::new(self, &mut params, device)?;
        Trainer::new(model, params, self.dtype, self.seed)
    }
}

struct Block {
    ln1: (Tensor, Tensor),
    qkv: Linear,
    proj: Linear,
    ln2: (Tensor, Tensor),
    fc1: Linear,
    fc2: Linear,
}

/// The language model. Built by [`TransformerConfig::build`].
pub struct Transformer {
    config: TransformerConfig,
    /// The length steps run at: `config.seq_len` unless resized.
    seq_len: usize,
    tokens: Embedding,
    positions: Tensor,
    blocks: Vec<Block>,
    ln_f: (Tensor, Tensor),
    head: Linear,
    mask: Tensor,
    /// The synthetic task: token t+1 = successor[token t].
    successor: Vec<u32>,
    /// With checkpointing: the blocks over detached weights, for the forward pass.
    frozen: Option<Vec<Block>>,
}

/// One block of a [`Transformer`] as a `Module`: what checkpointing runs.
struct BlockStep<'a> {
    model: &'a Transformer,
    block: &'a Block,
}

impl Module for BlockStep<'_> {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.model.block(self.block, x)
    }
}

fn layer_norm(params: &mut Params, name: &str, size: usize) -> candle_core::Result<(Tensor, Tensor)> {
    Ok((params.constant(format!("{name}.weight"), size, 1.0)?, params.constant(format!("{name}.bias"), size, 0.0)?))
}

fn norm(x: &Tensor, (weight, bias): &(Tensor, Tensor)) -> candle_core::Result<Tensor> {
    // the fused candle_nn::ops::layer_norm has no backward pass
    candle_nn::ops::layer_norm_slow(x, weight, bias, 1e-5)
}

impl Transformer {
    fn new(config: &TransformerConfig, params: &mut Params, device: &Device) -> candle_core::Result<Self> {
        let (d, s) = (config.d_model, config.seq_len);
        let tokens = Embedding::new(params.normal("tok_emb", (config.vocab, d), 0.02)?, d);
        let positions = params.normal("pos_emb", (s, d), 0.02)?;
        let mut blocks = Vec::with_capacity(config.layers);
        for layer in 0..config.layers {
            let name = |part: &str| format!("blocks.{layer}.{part}");
            blocks.push(Block {
                ln1: layer_norm(params, &name("ln1"), d)?,
                qkv: params.linear(&name("attn.qkv"), d, 3 * d)?,
                proj: params.linear(&name("attn.proj"), d, d)?,
                ln2: layer_norm(params, &name("ln2"), d)?,
                fc1: params.linear(&name("mlp.fc1"), d, 4 * d)?,
                fc2: params.linear(&name("mlp.fc2"), 4 * d, d)?,
            });
        }
        let ln_f = layer_norm(params, "ln_f", d)?;
        let head = params.linear("head", d, config.vocab)?;
        let mask: Vec<f32> =
            (0..s).flat_map(|i| (0..s).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 })).collect();
        let mask = Tensor::from_vec(mask, (s, s), device)?.to_dtype(config.dtype)?;
        let mut rng = Rng::new(config.seed ^ 0x7A5C);
        let successor = (0..config.vocab).map(|_| rng.below(config.vocab) as u32).collect();
        let mut model = Transformer {
            config: config.clone(),
            seq_len: s,
            tokens,
            positions,
            blocks,
            ln_f,
            head,
            mask,
            successor,
            frozen: None,
        };
        if config.checkpointing {
            model.frozen = Some(model.blocks.iter().map(Block::detached).collect());
        }
        Ok(model)
    }

    fn block(&self, block: &Block, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = (x + self.attention(block, &norm(x, &block.ln1)?)?)?;
        let hidden = block.fc1.forward(&norm(&x, &block.ln2)?)?.gelu()?;
        &x + block.fc2.forward(&hidden)?
    }

    fn embed(&self, input: &Tensor) -> candle_core::Result<Tensor> {
        self.tokens.forward(input)?.broadcast_add(&self.positions.narrow(0, 0, input.dim(1)?)?)
    }

    fn logits(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.head.forward(&norm(x, &self.ln_f)?)
    }

    /// Inputs and flattened targets of `batch` synthetic sequences.
    fn data(&self, batch: usize, data_seed: u64) -> candle_core::Result<(Tensor, Tensor)> {
        let s = self.seq_len;
        let tokens = Tensor::from_vec(self.sample(batch, data_seed), (batch, s + 1), self.positions.device())?;
        Ok((tokens.narrow(1, 0, s)?.contiguous()?, tokens.narrow(1, 1, s)?.flatten_all()?))
    }

    fn attention(&self, block: &Block, x: &Tensor) -> candle_core::Result<Tensor> {
        let (b, s, d) = x.dims3()?;
        let heads = self.config.heads;
        let head_dim = d / heads;
        let qkv = block.qkv.forward(x)?.reshape((b, s, 3, heads, head_dim))?.permute((2, 0, 3, 1, 4))?;
        let q = qkv.get(0)?.contiguous()?;
        let k = qkv.get(1)?.contiguous()?;
        let v = qkv.get(2)?.contiguous()?;
        let mask =
            if s == self.config.seq_len { self.mask.clone() } else { self.mask.narrow(0, 0, s)?.narrow(1, 0, s)? };
        // the mask is a constant: added without a gradient of the scores' size of its own
        let scores = crate::ops::add_constant(&(q.matmul(&k.t()?)? / (head_dim as f64).sqrt())?, &mask)?;
        let weights = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let y = weights.matmul(&v)?.transpose(1, 2)?.reshape((b, s, d))?;
        block.proj.forward(&y)
    }

    /// Logits of shape (batch, seq_len, vocab).
    pub fn forward(&self, input: &Tensor) -> candle_core::Result<Tensor> {
        let mut x = self.embed(input)?;
        for block in &self.blocks {
            x = self.block(block, &x)?;
        }
        self.logits(&x)
    }

    /// `batch` sequences of `seq_len + 1` tokens following the successor table.
    fn sample(&self, batch: usize, data_seed: u64) -> Vec<u32> {
        let mut rng = Rng::new(data_seed);
        let len = self.seq_len + 1;
        let mut tokens = Vec::with_capacity(batch * len);
        for _ in 0..batch {
            let mut token = rng.below(self.config.vocab) as u32;
            for _ in 0..len {
                tokens.push(token);
                token = self.successor[token as usize];
            }
        }
        tokens
    }
}

impl Block {
    /// The same block over detached weights (same storage, no graph).
    fn detached(&self) -> Block {
        let pair = |(w, b): &(Tensor, Tensor)| (w.detach(), b.detach());
        Block {
            ln1: pair(&self.ln1),
            qkv: detach_linear(&self.qkv),
            proj: detach_linear(&self.proj),
            ln2: pair(&self.ln2),
            fc1: detach_linear(&self.fc1),
            fc2: detach_linear(&self.fc2),
        }
    }
}

impl Model for Transformer {
    fn transformer(&self) -> Option<(autobatch::estimate::TransformerShape, autobatch::estimate::Recompute)> {
        let c = &self.config;
        let shape = autobatch::estimate::TransformerShape {
            layers: c.layers as u64,
            hidden: c.d_model as u64,
            heads: c.heads as u64,
            seq_len: self.seq_len as u64,
            batch: 1,
        };
        let recompute =
            if c.checkpointing { autobatch::estimate::Recompute::Full } else { autobatch::estimate::Recompute::None };
        Some((shape, recompute))
    }

    fn detached(&self) -> Self {
        Transformer {
            config: TransformerConfig { checkpointing: false, ..self.config.clone() },
            seq_len: self.seq_len,
            tokens: Embedding::new(self.tokens.embeddings().detach(), self.config.d_model),
            positions: self.positions.detach(),
            blocks: self.blocks.iter().map(Block::detached).collect(),
            ln_f: (self.ln_f.0.detach(), self.ln_f.1.detach()),
            head: detach_linear(&self.head),
            mask: self.mask.clone(),
            successor: self.successor.clone(),
            frozen: None,
        }
    }

    /// With checkpointing: the boundaries of the blocks kept, each block run
    /// again in the backward pass ([`checkpointed`]).
    fn loss_and_gradients(
        &self,
        batch: usize,
        data_seed: u64,
        vars: &[candle_core::Var],
    ) -> candle_core::Result<(Tensor, GradStore)> {
        let Some(frozen) = &self.frozen else {
            let loss = self.loss(batch, data_seed)?;
            let grads = loss.backward()?;
            return Ok((loss, grads));
        };
        let (input, targets) = self.data(batch, data_seed)?;
        let steps: Vec<BlockStep> = self.blocks.iter().map(|block| BlockStep { model: self, block }).collect();
        let frozen: Vec<BlockStep> = frozen.iter().map(|block| BlockStep { model: self, block }).collect();
        let vocab = self.config.vocab;
        let mut loss = None;
        let (_, grads) = checkpointed(vars, &self.embed(&input)?, &steps, &frozen, |h| {
            let logits = self.logits(h)?.reshape((batch * self.seq_len, vocab))?;
            let head = cross_entropy(&logits, &targets)?;
            loss = Some(head.detach());
            Ok(head)
        })?;
        Ok((loss.expect("the head ran"), grads))
    }

    fn computes_own_gradients(&self) -> bool {
        self.frozen.is_some()
    }

    fn describe(&self) -> String {
        self.config.describe(self.seq_len)
    }

    fn loss(&self, batch: usize, data_seed: u64) -> candle_core::Result<Tensor> {
        let (input, targets) = self.data(batch, data_seed)?;
        let logits = self.forward(&input)?.reshape((batch * self.seq_len, self.config.vocab))?;
        cross_entropy(&logits, &targets)
    }
}

impl Transformer {
    /// The sequence length steps run at.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }
}

/// Steps at any sequence length from 1 to the configured `seq_len` (the
/// learned positions and the causal mask cut to it).
impl autobatch::Resizable for Trainer<Transformer> {
    fn resize(&mut self, size: usize) -> Result<(), autobatch::Error> {
        let longest = self.model().config.seq_len;
        if size == 0 || size > longest {
            return Err(autobatch::Error::invalid(
                autobatch::Setting::Size,
                autobatch::Value::Count(size),
                format!("it must be from 1 to the model's sequence length, {longest}"),
            ));
        }
        self.model_mut().seq_len = size;
        Ok(())
    }

    fn size(&self) -> usize {
        self.model().seq_len
    }
}
