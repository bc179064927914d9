//! Qwen2-MoE (`qwen2_moe`): Qwen1.5-MoE and Qwen2-57B-A14B. Qwen2's decoder
//! (q/k/v biases, `qkv_bias`) with a mixture of experts in place of the MLP
//! on every `decoder_sparse_step`-th layer but `mlp_only_layers`:
//! `num_experts` SwiGLU experts of `moe_intermediate_size`, and a shared
//! expert of `shared_expert_intermediate_size` every token goes through,
//! scaled by the sigmoid of its own gate.

use super::Architecture;
use super::mixtral::{EXPERTS, experts};
use super::qwen2::{QWEN, window};
use crate::Error;
use crate::config::{AttentionBias, Config, ExpertNames, Fields};
use crate::decoder;
use crate::family::Family;
use crate::keys::{Handling, LLAMA_LIKE};

const QWEN2_MOE: &[(&str, Handling)] = &[
    ("qkv_bias", Handling::Read),
    ("num_experts", Handling::Read),
    ("moe_intermediate_size", Handling::Read),
    ("shared_expert_intermediate_size", Handling::Read),
    ("norm_topk_prob", Handling::Read),
    ("decoder_sparse_step", Handling::Read),
    ("mlp_only_layers", Handling::Read),
];

pub(crate) struct Qwen2Moe;

impl Architecture for Qwen2Moe {
    fn model_type(&self) -> &'static str {
        "qwen2_moe"
    }

    fn keys(&self) -> &'static [&'static [(&'static str, Handling)]] {
        &[QWEN2_MOE, EXPERTS, QWEN, LLAMA_LIKE]
    }

    fn read(&self, family: Family, fields: &Fields) -> Result<Config, Error> {
        decoder::silu(fields)?;
        let mut config = decoder::read(family, fields, "Qwen2Moe")?;
        config.max_positions = fields.count(&["max_position_embeddings"])?.unwrap_or(32_768);
        // transformers' default: q, k and v biased
        let biased = fields.flag("qkv_bias")?.unwrap_or(true);
        config.attention_bias = if biased { AttentionBias::Qkv } else { AttentionBias::None };
        // transformers 5 writes a window of 0 where none is used
        let unused = fields.value("sliding_window").and_then(serde_json::Value::as_u64) == Some(0)
            && fields.flag("use_sliding_window")? != Some(true);
        if !unused {
            (config.sliding_window, config.sliding_layers) = window(fields, config.layers)?;
        }
        let intermediate = fields.count(&["moe_intermediate_size"])?.unwrap_or(1408);
        let normalized = fields.flag("norm_topk_prob")?.unwrap_or(false);
        let mut experts = experts(fields, config.layers, intermediate, normalized, ExpertNames::Qwen)?;
        experts.shared = Some(fields.count(&["shared_expert_intermediate_size"])?.unwrap_or(5632));
        config.experts = Some(experts);
        Ok(config)
    }
}
