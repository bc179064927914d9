//! Mixtral (`mixtral`): Mistral's decoder with a mixture of experts in
//! place of every MLP: a router over `num_local_experts` SwiGLU experts
//! (`block_sparse_moe.experts.N.w1/w3/w2`), each token sent to its top
//! `num_experts_per_tok`, their probabilities renormalized over the chosen.

use serde_json::Value;

use super::Architecture;
use crate::Error;
use crate::config::{Config, ExpertNames, Experts, Fields, refuse};
use crate::decoder;
use crate::family::Family;
use crate::keys::{Handling, LLAMA_LIKE};

/// The keys every mixture of experts here shares.
pub(super) const EXPERTS: &[(&str, Handling)] = &[
    ("num_local_experts", Handling::Read),
    ("num_experts_per_tok", Handling::Read),
    // transformers adds the router's load-balancing loss only when asked
    ("output_router_logits", Handling::Read),
    ("router_aux_loss_coef", Handling::Read),
];

const MIXTRAL: &[(&str, Handling)] = &[("sliding_window", Handling::Read), ("router_jitter_noise", Handling::Read)];

pub(crate) struct Mixtral;

impl Architecture for Mixtral {
    fn model_type(&self) -> &'static str {
        "mixtral"
    }

    fn keys(&self) -> &'static [&'static [(&'static str, Handling)]] {
        &[MIXTRAL, EXPERTS, LLAMA_LIKE]
    }

    fn read(&self, family: Family, fields: &Fields) -> Result<Config, Error> {
        decoder::silu(fields)?;
        let mut config = decoder::read(family, fields, "Mixtral")?;
        // MixtralConfig's defaults, not Llama's
        config.norm_eps = fields.number("rms_norm_eps")?.unwrap_or(1e-5);
        config.max_positions = fields.count(&["max_position_embeddings"])?.unwrap_or(131_072);
        if ["rope_theta", "rope_scaling", "rope_parameters"].iter().all(|key| fields.value(key).is_none()) {
            config.rope = Some(crate::Rope { theta: 1e6, scaling: crate::RopeScaling::None });
        }
        if let Some(window) = fields.count(&["sliding_window"])? {
            (config.sliding_window, config.sliding_layers) = (Some(window), vec![true]);
        }
        // noise on the router's input in training: not computed here
        if let Some(noise) = fields.value("router_jitter_noise")
            && noise.as_f64() != Some(0.0)
        {
            return Err(refuse("router_jitter_noise", noise, "0 (the router's input without noise)"));
        }
        let intermediate = config.intermediate;
        config.experts = Some(experts(fields, config.layers, intermediate, true, ExpertNames::Mixtral)?);
        Ok(config)
    }
}

/// A mixture of experts' shape: its experts (`num_local_experts`, or
/// Qwen's `num_experts`), each token's (`num_experts_per_tok`), each
/// expert's `intermediate`, whether the chosen probabilities are
/// renormalized, and Qwen's sparse layers (`decoder_sparse_step`,
/// `mlp_only_layers`; every layer where absent).
pub(super) fn experts(
    fields: &Fields,
    layers: usize,
    intermediate: usize,
    normalized: bool,
    names: ExpertNames,
) -> Result<Experts, Error> {
    let count = fields.required(&["num_local_experts", "num_experts"])?;
    let per_token = fields.required(&["num_experts_per_tok"])?;
    if per_token > count {
        return Err(refuse("num_experts_per_tok", per_token, format!("at most num_local_experts {count}")));
    }
    let sparse_step = fields.count(&["decoder_sparse_step"])?.unwrap_or(1);
    let dense_layers = match fields.value("mlp_only_layers") {
        None => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|layer| match layer.as_u64().and_then(|l| usize::try_from(l).ok()) {
                Some(index) => Ok(index),
                None => Err(refuse("mlp_only_layers", layer, "layer indices, whole numbers from 0")),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => Err(refuse("mlp_only_layers", other, "a list of layer indices"))?,
    };
    if (0..layers).all(|layer| dense_layers.contains(&layer) || !(layer + 1).is_multiple_of(sparse_step)) {
        log::debug!("no sparse layer among {layers}: every MLP is dense");
    }
    // the load-balancing loss at its weight, where asked for (0.001: transformers' default)
    let aux_loss = match fields.flag("output_router_logits")? {
        Some(true) => Some(fields.number("router_aux_loss_coef")?.unwrap_or(0.001)),
        _ => None,
    };
    Ok(Experts { count, per_token, intermediate, normalized, sparse_step, dense_layers, names, aux_loss, shared: None })
}
