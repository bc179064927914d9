//! Phi-3 (`phi3`: Phi-3, Phi-3.5 and Phi-4 mini): the decoder of the Llama
//! kind with q, k and v in one projection (`qkv_proj`) and the MLP's gate and
//! up in another (`gate_up_proj`, the gate its first half), the first
//! `partial_rotary_factor` of each head rotating, LongRoPE (`rope_type`
//! `longrope`; `su` and `yarn` are read as it, as transformers reads them for
//! Phi-3): short factors up to `original_max_position_embeddings` tokens,
//! long ones past them; every layer within `sliding_window` where one is set.

use serde_json::Value;

use super::Architecture;
use crate::Error;
use crate::config::{Config, Fields, LongRope, Rope, RopeScaling, refuse};
use crate::decoder;
use crate::family::Family;
use crate::keys::{FALSE, Handling, LLAMA_LIKE};

const PHI3: &[(&str, Handling)] = &[
    ("original_max_position_embeddings", Handling::Read),
    ("partial_rotary_factor", Handling::Read),
    ("sliding_window", Handling::Read),
    ("resid_pdrop", Handling::Dropout),
    ("embd_pdrop", Handling::Dropout),
    ("attention_bias", Handling::RefusedUnless(FALSE)),
    ("auto_map", Handling::Inert("the Hub's remote code for the same model; transformers' Phi3 reads this config")),
];

pub(crate) struct Phi3;

impl Architecture for Phi3 {
    fn model_type(&self) -> &'static str {
        "phi3"
    }

    fn keys(&self) -> &'static [&'static [(&'static str, Handling)]] {
        &[PHI3, LLAMA_LIKE]
    }

    /// PEFT's default for Phi-3: the joined q/k/v projection.
    fn lora_targets(&self) -> &'static [&'static str] {
        &["qkv_proj"]
    }

    fn read(&self, family: Family, fields: &Fields) -> Result<Config, Error> {
        decoder::silu(fields)?;
        let mut config = decoder::read_as(family, fields, &["Phi3ForCausalLM", "Phi3Model"])?;
        // Phi3Config's own defaults
        config.norm_eps = fields.number("rms_norm_eps")?.unwrap_or(1e-5);
        config.max_positions = fields.count(&["max_position_embeddings"])?.unwrap_or(4096);
        config.fused_projections = true;
        let (rope, partial) = rope(fields, config.max_positions, config.head_dim)?;
        (config.rope, config.partial_rotary_factor) = (Some(rope), partial);
        if config.rotary_dim() == 0 || !config.rotary_dim().is_multiple_of(2) {
            return Err(refuse(
                "partial_rotary_factor",
                partial,
                format!("a share of head_dim {} that rotates an even number of dimensions", config.head_dim),
            ));
        }
        if let Some(window) = fields.count(&["sliding_window"])? {
            (config.sliding_window, config.sliding_layers) = (Some(window), vec![true]);
        }
        Ok(config)
    }
}

/// Phi-3's rotary positions and the share of a head that rotates, from
/// `rope_scaling` (transformers 4) or `rope_parameters` (5), beside the
/// top-level `rope_theta`, `partial_rotary_factor` and
/// `original_max_position_embeddings`: the default, or LongRoPE.
fn rope(fields: &Fields, max_positions: usize, head_dim: usize) -> Result<(Rope, f64), Error> {
    let top_theta = fields.number("rope_theta")?;
    let top_partial = fields.number("partial_rotary_factor")?;
    let top_original = fields.count(&["original_max_position_embeddings"])?;
    let (key, object) = match (fields.value("rope_scaling"), fields.value("rope_parameters")) {
        (Some(scaling), _) => ("rope_scaling", scaling),
        (None, Some(parameters)) => ("rope_parameters", parameters),
        (None, None) => {
            let theta = top_theta.unwrap_or(10_000.0);
            return Ok((
                Rope { theta, scaling: RopeScaling::None },
                partial_factor("partial_rotary_factor", top_partial)?,
            ));
        }
    };
    let Some(object) = object.as_object() else {
        return Err(refuse(key, object, "an object with a rope_type, or null"));
    };
    let prefix = format!("{key}.");
    let rope = Fields { object, prefix: &prefix };
    let kind = match rope.text("rope_type")? {
        Some(kind) => kind,
        None => rope.text("type")?.unwrap_or("default"),
    };
    let theta = rope.number("rope_theta")?.or(top_theta).unwrap_or(10_000.0);
    let partial =
        partial_factor(&rope.name("partial_rotary_factor"), rope.number("partial_rotary_factor")?.or(top_partial))?;
    let known: &[&str] = match kind {
        "default" => &[],
        // transformers reads Phi-3's `su` and `yarn` as LongRoPE
        "longrope" | "su" | "yarn" => {
            &["short_factor", "long_factor", "factor", "attention_factor", "original_max_position_embeddings"]
        }
        other => return Err(refuse(&rope.name("rope_type"), other, "default or longrope (what Phi-3 computes)")),
    };
    for name in object.keys() {
        if !matches!(name.as_str(), "rope_type" | "type" | "rope_theta" | "partial_rotary_factor")
            && !known.contains(&name.as_str())
        {
            return Err(refuse(
                &rope.name(name),
                &object[name],
                format!("only the keys rope_type {kind} reads: rope_type, rope_theta, partial_rotary_factor{}", {
                    known.iter().map(|k| format!(", {k}")).collect::<String>()
                }),
            ));
        }
    }
    if kind == "default" {
        return Ok((Rope { theta, scaling: RopeScaling::None }, partial));
    }
    let pairs = (head_dim as f64 * partial) as usize / 2;
    let factors = |name: &str| -> Result<Vec<f64>, Error> {
        let value = rope
            .value(name)
            .ok_or_else(|| refuse(&rope.name(name), "missing", "a list of factors (longrope needs it)"))?;
        let list: Option<Vec<f64>> = value.as_array().and_then(|list| {
            list.iter().map(|factor| Value::as_f64(factor).filter(|f| f.is_finite() && *f > 0.0)).collect()
        });
        match list {
            Some(list) if list.len() == pairs => Ok(list),
            _ => Err(refuse(
                &rope.name(name),
                value,
                format!("{pairs} positive factors, one per rotated pair of a head's dimensions"),
            )),
        }
    };
    let original = rope.count(&["original_max_position_embeddings"])?.or(top_original).unwrap_or(4096);
    let factor = rope.number("factor")?.unwrap_or(max_positions as f64 / original as f64);
    let attention_factor = match rope.number("attention_factor")? {
        Some(given) => given,
        None if factor <= 1.0 => 1.0,
        None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
    };
    let scaling = RopeScaling::LongRope(LongRope {
        short_factor: factors("short_factor")?,
        long_factor: factors("long_factor")?,
        original_max_position_embeddings: original,
        attention_factor,
    });
    Ok((Rope { theta, scaling }, partial))
}

/// A share of a head's dimensions in (0, 1], 1 when not given.
fn partial_factor(key: &str, given: Option<f64>) -> Result<f64, Error> {
    match given {
        None => Ok(1.0),
        Some(share) if share > 0.0 && share <= 1.0 => Ok(share),
        Some(share) => Err(refuse(key, share, "a share of a head's dimensions, above 0 and at most 1")),
    }
}
