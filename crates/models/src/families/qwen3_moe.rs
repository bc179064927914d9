//! Qwen3-MoE (`qwen3_moe`): Qwen3's decoder (q/k norms on each head) with
//! a mixture of experts in place of the MLP on every `decoder_sparse_step`-th
//! layer but `mlp_only_layers`: `num_experts` SwiGLU experts of
//! `moe_intermediate_size` (`mlp.experts.N.gate_proj/up_proj/down_proj`),
//! the chosen probabilities renormalized when `norm_topk_prob`.

use super::Architecture;
use super::mixtral::{EXPERTS, experts};
use super::qwen2::{QWEN, window};
use crate::Error;
use crate::config::{Config, ExpertNames, Fields, QkNorm};
use crate::decoder;
use crate::family::Family;
use crate::keys::{Handling, LLAMA_LIKE};

const QWEN3_MOE: &[(&str, Handling)] = &[
    ("attention_bias", Handling::Read),
    ("num_experts", Handling::Read),
    ("moe_intermediate_size", Handling::Read),
    ("norm_topk_prob", Handling::Read),
    ("decoder_sparse_step", Handling::Read),
    ("mlp_only_layers", Handling::Read),
];

pub(crate) struct Qwen3Moe;

impl Architecture for Qwen3Moe {
    fn model_type(&self) -> &'static str {
        "qwen3_moe"
    }

    fn keys(&self) -> &'static [&'static [(&'static str, Handling)]] {
        &[QWEN3_MOE, EXPERTS, QWEN, LLAMA_LIKE]
    }

    fn read(&self, family: Family, fields: &Fields) -> Result<Config, Error> {
        decoder::silu(fields)?;
        let mut config = decoder::read(family, fields, "Qwen3Moe")?;
        config.max_positions = fields.count(&["max_position_embeddings"])?.unwrap_or(32_768);
        config.attention_bias = decoder::attention_bias(fields)?;
        config.qk_norm = QkNorm::PerHead;
        (config.sliding_window, config.sliding_layers) = window(fields, config.layers)?;
        let intermediate = fields.count(&["moe_intermediate_size"])?.unwrap_or(768);
        let normalized = fields.flag("norm_topk_prob")?.unwrap_or(false);
        config.experts = Some(experts(fields, config.layers, intermediate, normalized, ExpertNames::Qwen)?);
        Ok(config)
    }
}
