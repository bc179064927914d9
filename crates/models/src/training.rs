//! What a config model trains: its sequence length, dtype, LoRA, attention,
//! loss and ops ([`Training`]).

use candle_core::DType;

use crate::Lora;

/// How a config model computes attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Attention {
    /// In blocks with an online softmax, the scores recomputed block by
    /// block in the backward pass ([`ops::BlockedAttention`](crate::ops::BlockedAttention)): nothing of
    /// `b × heads × s × s` kept, as transformers' SDPA and FlashAttention-2.
    #[default]
    Blocked,
    /// The scores and their softmax made whole and kept for the backward
    /// pass, as transformers' `attn_implementation="eager"`.
    Eager,
}

impl Attention {
    /// Both ways, in the order the command line lists them.
    pub const ALL: [Attention; 2] = [Attention::Blocked, Attention::Eager];

    /// The name used on the command line: `blocked`, `eager`.
    pub fn name(self) -> &'static str {
        match self {
            Attention::Blocked => "blocked",
            Attention::Eager => "eager",
        }
    }
}

/// How a config model computes its head and loss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Loss {
    /// The head and the cross entropy fused in chunks of rows, the
    /// gradients computed chunk by chunk ([`ops::ChunkedCrossEntropy`](crate::ops::ChunkedCrossEntropy)):
    /// the logits never whole, as Liger Kernel's fused loss.
    #[default]
    Chunked,
    /// The logits of every position made whole (and their f32 copy, their
    /// log-softmax, their gradients), as `cross_entropy(logits, targets)`.
    Full,
}

impl Loss {
    /// Both ways, in the order the command line lists them.
    pub const ALL: [Loss; 2] = [Loss::Chunked, Loss::Full];

    /// The name used on the command line: `chunked`, `full`.
    pub fn name(self) -> &'static str {
        match self {
            Loss::Chunked => "chunked",
            Loss::Full => "full",
        }
    }
}

/// Where a mixture of experts sends each token (models without experts
/// are the same either way).
///
/// The step's memory depends on the routing: each expert computes on the
/// tokens sent to it, so its transient products, forward and backward, are
/// as large as its share of the batch. Random weights route about evenly,
/// while real data may send most tokens to a few experts, and a batch found
/// under the first can run out of memory under the second. The weights and
/// the loss's path are the same under both: only the router's choice is
/// forced, the chosen experts' weights are still its probabilities.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Routing {
    /// The costliest routing: every token to the same `k` experts (its
    /// products as large as the batch), and each other expert one token at
    /// least (every expert's gradient exists, as it does in training).
    #[default]
    Worst,
    /// The router's own choice, its top `k` (about even for random weights):
    /// what transformers computes.
    Router,
}

/// How a config model computes its norms, rotary positions, MLP
/// activations and projections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Ops {
    /// Each one node of candle's graph that keeps its inputs and output and
    /// recomputes the rest in its backward pass ([`ops`](crate::ops)' fused ops): what
    /// PyTorch's autograd keeps, or less.
    #[default]
    Fused,
    /// Each written as candle's differentiable ops ([`ops::eager`](crate::ops::eager)): the
    /// graph keeps every intermediate until the loss is dropped.
    Eager,
}

impl Ops {
    /// Both ways, in the order the command line lists them.
    pub const ALL: [Ops; 2] = [Ops::Fused, Ops::Eager];

    /// The name used on the command line: `fused`, `eager`.
    pub fn name(self) -> &'static str {
        match self {
            Ops::Fused => "fused",
            Ops::Eager => "eager",
        }
    }
}

/// How a model is trained: the sequence length, the dtype, full fine-tuning
/// or LoRA, the seed of its weights and data, how attention, the loss and
/// the other ops are computed.
#[derive(Clone, Debug, PartialEq)]
pub struct Training {
    /// Tokens per sample: probe at the longest training will see.
    pub seq_len: usize,
    /// The dtype of weights, gradients and activations; `None`: the config's
    /// `torch_dtype` (f16 is trained in bf16).
    pub dtype: Option<DType>,
    /// LoRA adapters, the base frozen; `None`: every tensor trains.
    pub lora: Option<Lora>,
    /// The seed of the weights and the token ids.
    pub seed: u64,
    /// Gradient checkpointing per layer: only each layer's input is kept,
    /// and each layer runs again in the backward pass (decoders and GPT-2).
    pub checkpointing: bool,
    /// How attention is computed (blocked by default).
    pub attention: Attention,
    /// How the head and the loss are computed (chunked by default).
    pub loss: Loss,
    /// How norms, rotary positions, activations and projections are computed (fused by default).
    pub ops: Ops,
    /// Where a mixture of experts' router sends the tokens (the costliest
    /// routing by default, so that an answer holds whatever the data does).
    pub routing: Routing,
}

impl Training {
    /// Full fine-tuning at `seq_len` tokens, in the config's dtype.
    pub fn new(seq_len: usize) -> Training {
        Training {
            seq_len,
            dtype: None,
            lora: None,
            seed: 0,
            checkpointing: false,
            attention: Attention::Blocked,
            loss: Loss::Chunked,
            ops: Ops::Fused,
            routing: Routing::Worst,
        }
    }

    /// With a mixture of experts' tokens routed as `routing` says.
    pub fn routing(mut self, routing: Routing) -> Training {
        self.routing = routing;
        self
    }

    /// With attention computed as `attention` says.
    pub fn attention(mut self, attention: Attention) -> Training {
        self.attention = attention;
        self
    }

    /// With the head and the loss computed as `loss` says.
    pub fn loss(mut self, loss: Loss) -> Training {
        self.loss = loss;
        self
    }

    /// With norms, rotary positions, activations and projections computed as `ops` says.
    pub fn ops(mut self, ops: Ops) -> Training {
        self.ops = ops;
        self
    }

    /// With LoRA adapters.
    pub fn lora(mut self, lora: Lora) -> Training {
        self.lora = Some(lora);
        self
    }

    /// In `dtype` (f32 or bf16).
    pub fn dtype(mut self, dtype: DType) -> Training {
        self.dtype = Some(dtype);
        self
    }

    /// With gradient checkpointing per layer.
    pub fn checkpointing(mut self) -> Training {
        self.checkpointing = true;
        self
    }
}
