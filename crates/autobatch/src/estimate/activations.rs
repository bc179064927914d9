//! A transformer's activation memory, as Korthikanti et al. 2022 ("Reducing
//! Activation Recomputation in Large Transformer Models", Table 2) count it:
//! per layer, at 16 bits, `s·b·h·(34 + 5·a·s/h)` bytes (s sequence length, b
//! micro-batch, h hidden size, a attention heads); with tensor parallelism `t`,
//! `s·b·h·(10 + 24/t + 5·a·s/(h·t))`; with selective recomputation (the
//! attention's `5·a·s/h` part recomputed), `s·b·h·(10 + 24/t)`; with full
//! recomputation only each layer's input stays, `2·s·b·h`.
//!
//! ```
//! use autobatch::estimate::{Recompute, TransformerShape};
//!
//! // GPT-3 175B's layer (h = 12288, a = 96, s = 2048) at micro-batch 1
//! let gpt3 = TransformerShape { layers: 96, hidden: 12288, heads: 96, seq_len: 2048, batch: 1 };
//! let per_layer = gpt3.activation_bytes(1, Recompute::None)? / 96;
//! assert_eq!(per_layer, 2048 * 12288 * 34 + 5 * 96 * 2048 * 2048);
//! assert_eq!(gpt3.activation_bytes(1, Recompute::Full)?, 96 * 2 * 2048 * 12288);
//! # Ok::<(), autobatch::Error>(())
//! ```

use serde::{Deserialize, Serialize};

use crate::Error;

/// Which activations the backward pass recomputes instead of keeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recompute {
    /// Keep everything.
    None,
    /// Recompute the attention's softmax, dropout and score-times-value parts.
    Selective,
    /// Recompute every layer from its input (gradient checkpointing).
    Full,
}

impl Recompute {
    /// Every choice, in the order the command line lists them.
    pub const ALL: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        }
    }
}

/// The sizes of a decoder-only transformer that decide its activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransformerShape {
    /// Transformer layers.
    pub layers: u64,
    /// Hidden size h.
    pub hidden: u64,
    /// Attention heads a.
    pub heads: u64,
    /// Sequence length s.
    pub seq_len: u64,
    /// Micro-batch b.
    pub batch: u64,
}

impl TransformerShape {
    /// How many times the formula's activations (at f32, so twice the 16-bit
    /// figure) a candle training step holds per sample, at most, measured on the
    /// reference transformer (`cargo bench --bench activations`, docs/activations.md:
    /// 3.35 to 4.50 over six sizes). candle has no fused attention or layer norm,
    /// computes the softmax in f32 and keeps both matmul operands' gradients; the
    /// logits and the loss are outside the formula too. For a candle model the
    /// probe's own measurement is the figure to plan with; this factor makes the
    /// formula usable for candle models too large to probe.
    pub const CANDLE_F32_ACTIVATION_RATIO: f64 = 4.5;

    /// Activation bytes of all layers at 16 bits, per device, with tensor
    /// parallelism `tensor_parallel` (1 for none) and `recompute`; checked,
    /// never wrapped ([`Error::ByteOverflow`] past 2^64 − 1).
    pub fn activation_bytes(&self, tensor_parallel: u64, recompute: Recompute) -> Result<u64, Error> {
        let overflow = || {
            Error::byte_overflow(format!(
                "the activations of {} layers of width {} with {} heads at {} tokens and batch {}",
                self.layers, self.hidden, self.heads, self.seq_len, self.batch
            ))
        };
        if tensor_parallel == 0 {
            return Err(Error::zero(crate::Setting::TensorParallel));
        }
        let [l, h, a, s, b, t] =
            [self.layers, self.hidden, self.heads, self.seq_len, self.batch, tensor_parallel].map(u128::from);
        let sbh = s * b * h;
        // the sbh·24/t and a·s²·b·5/t terms divide exactly only sometimes: round up
        let per_layer = match recompute {
            Recompute::None => 10 * sbh + (24 * sbh).div_ceil(t) + (5 * a * s * s * b).div_ceil(t),
            Recompute::Selective => 10 * sbh + (24 * sbh).div_ceil(t),
            Recompute::Full => 2 * sbh,
        };
        u64::try_from(per_layer.checked_mul(l).ok_or_else(overflow)?).map_err(|_| overflow())
    }

    /// What a candle f32 training step holds, by the measured ratio: the
    /// formula at f32 (twice the 16-bit bytes) × [`Self::CANDLE_F32_ACTIVATION_RATIO`].
    pub fn candle_f32_activation_bytes(&self) -> Result<u64, Error> {
        let formula = self.activation_bytes(1, Recompute::None)?;
        let bytes = 2.0 * formula as f64 * Self::CANDLE_F32_ACTIVATION_RATIO;
        if bytes >= u64::MAX as f64 {
            return Err(Error::byte_overflow(format!(
                "candle's activations of {} layers of width {}",
                self.layers, self.hidden
            )));
        }
        Ok(bytes.ceil() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_formulas() {
        let shape = TransformerShape { layers: 2, hidden: 64, heads: 4, seq_len: 128, batch: 3 };
        let (s, b, h, a) = (128u64, 3, 64, 4);
        let sbh = s * b * h;
        assert_eq!(shape.activation_bytes(1, Recompute::None).unwrap(), 2 * (34 * sbh + 5 * a * s * s * b));
        assert_eq!(shape.activation_bytes(1, Recompute::Selective).unwrap(), 2 * 34 * sbh);
        assert_eq!(shape.activation_bytes(1, Recompute::Full).unwrap(), 2 * 2 * sbh);
        assert_eq!(
            shape.activation_bytes(4, Recompute::None).unwrap(),
            2 * (10 * sbh + 6 * sbh + 5 * a * s * s * b / 4)
        );
        let huge = TransformerShape { layers: u64::MAX, ..shape };
        assert!(matches!(huge.activation_bytes(1, Recompute::None), Err(Error::ByteOverflow { .. })));
        assert!(shape.activation_bytes(0, Recompute::None).is_err());
    }
}
