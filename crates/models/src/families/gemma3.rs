//! Gemma 3's text model (`gemma3_text`): Gemma 2's decoder (scaled
//! embeddings, `1 + weight` norms before and after attention and the MLP,
//! GeGLU, its query scalar) without soft caps unless the config sets them,
//! with RMS norms on each head's queries and keys, five sliding layers to a
//! full one (`layer_types`, else `sliding_window_pattern`, 6), and two
//! rotary bases: the full layers' (`rope_theta`, 1e6, with its scaling) and
//! the sliding layers' (`rope_local_base_freq`, 1e4); in transformers 5's
//! layout both under `rope_parameters`, by layer type.

use serde_json::Value;

use super::Architecture;
use super::gemma2::{GEMMA, read_gemma};
use crate::Error;
use crate::config::{Config, Fields, QkNorm, Rope, RopeScaling, refuse};
use crate::family::Family;
use crate::keys::{Handling, LLAMA_LIKE};

const GEMMA3: &[(&str, Handling)] = &[
    ("attn_logit_softcapping", Handling::Read),
    ("final_logit_softcapping", Handling::Read),
    ("rope_local_base_freq", Handling::Read),
    ("sliding_window_pattern", Handling::Read),
    (
        "_sliding_window_pattern",
        Handling::Inert("transformers 5 writes it beside layer_types, made from it, and reads sliding_window_pattern"),
    ),
];

/// The full layers' base where the config gives none, and the sliding ones'.
const GLOBAL_THETA: f64 = 1_000_000.0;
const LOCAL_THETA: f64 = 10_000.0;

pub(crate) struct Gemma3;

impl Architecture for Gemma3 {
    fn model_type(&self) -> &'static str {
        "gemma3_text"
    }

    fn keys(&self) -> &'static [&'static [(&'static str, Handling)]] {
        &[GEMMA3, GEMMA, LLAMA_LIKE]
    }

    fn read(&self, family: Family, fields: &Fields) -> Result<Config, Error> {
        let pattern = fields.count(&["sliding_window_pattern"])?.unwrap_or(6);
        let classes = ["Gemma3ForCausalLM", "Gemma3TextModel"];
        let mut config = read_gemma(family, fields, &classes, pattern, |fields, positions| {
            let (global, local) = ropes(fields, positions)?;
            Ok((global, Some(local)))
        })?;
        config.qk_norm = QkNorm::PerHead;
        config.attention_softcap = fields.number("attn_logit_softcapping")?;
        config.final_softcap = fields.number("final_logit_softcapping")?;
        Ok(config)
    }
}

/// The full layers' rotary positions and the sliding layers', from
/// `rope_parameters` by layer type (transformers 5) or `rope_theta`,
/// `rope_scaling` and `rope_local_base_freq` (transformers 4).
fn ropes(fields: &Fields, max_positions: usize) -> Result<(Rope, Rope), Error> {
    if let Some(Value::Object(by_type)) = fields.value("rope_parameters")
        && fields.value("rope_scaling").is_none()
        && (by_type.contains_key("full_attention") || by_type.contains_key("sliding_attention"))
    {
        let of = |layer_type: &str, theta: f64| match by_type.get(layer_type).filter(|value| !value.is_null()) {
            Some(object) => {
                Config::rope_of(&format!("rope_parameters.{layer_type}"), object, Some(theta), max_positions)
            }
            None => Ok(Rope { theta, scaling: RopeScaling::None }),
        };
        if let Some(other) = by_type.keys().find(|key| !matches!(key.as_str(), "full_attention" | "sliding_attention"))
        {
            return Err(refuse(
                &format!("rope_parameters.{other}"),
                &by_type[other],
                "full_attention and sliding_attention, the layer types",
            ));
        }
        return Ok((of("full_attention", GLOBAL_THETA)?, of("sliding_attention", LOCAL_THETA)?));
    }
    let mut global = Config::rope(fields, max_positions)?;
    let scaling_theta = fields.value("rope_scaling").and_then(|scaling| scaling.get("rope_theta"));
    if fields.value("rope_theta").is_none() && scaling_theta.is_none() {
        global.theta = GLOBAL_THETA;
    }
    let local =
        Rope { theta: fields.number("rope_local_base_freq")?.unwrap_or(LOCAL_THETA), scaling: RopeScaling::None };
    Ok((global, local))
}
