//! Gemma 2 (`gemma2`): the decoder of the Llama kind with the token
//! embeddings scaled by √hidden, RMS norms that scale by `1 + weight` (their
//! weights stored as the offset), a norm before and after both attention and
//! the MLP, a GeGLU MLP (`hidden_activation`), a `head_dim` of its own, the
//! scores scaled by `query_pre_attn_scalar^-½` and soft-capped
//! (`attn_logit_softcapping`), the logits soft-capped
//! (`final_logit_softcapping`, inside the chunked loss), a sliding window on
//! the layers `layer_types` names (every other one, the first sliding, when
//! absent), the head tied.

use super::Architecture;
use crate::Error;
use crate::config::{BlockNorms, Config, Fields, Rope, refuse};
use crate::decoder;
use crate::family::Family;
use crate::keys::{FALSE, Handling, LLAMA_LIKE};

/// The keys Gemma 2 and Gemma 3 share.
pub(super) const GEMMA: &[(&str, Handling)] = &[
    ("hidden_activation", Handling::Read),
    ("hidden_act", Handling::Inert("transformers 4's other name; Gemma's MLP reads hidden_activation")),
    ("query_pre_attn_scalar", Handling::Read),
    ("sliding_window", Handling::Read),
    ("layer_types", Handling::Read),
    ("attention_bias", Handling::Read),
    ("cache_implementation", Handling::Inert("generation's cache; training keeps none")),
    ("use_bidirectional_attention", Handling::RefusedUnless(FALSE)),
];

const GEMMA2: &[(&str, Handling)] =
    &[("attn_logit_softcapping", Handling::Read), ("final_logit_softcapping", Handling::Read)];

pub(crate) struct Gemma2;

impl Architecture for Gemma2 {
    fn model_type(&self) -> &'static str {
        "gemma2"
    }

    fn keys(&self) -> &'static [&'static [(&'static str, Handling)]] {
        &[GEMMA2, GEMMA, LLAMA_LIKE]
    }

    fn read(&self, family: Family, fields: &Fields) -> Result<Config, Error> {
        let classes = ["Gemma2ForCausalLM", "Gemma2Model"];
        let mut config =
            read_gemma(family, fields, &classes, 2, |fields, positions| Ok((Config::rope(fields, positions)?, None)))?;
        config.attention_softcap = softcap(fields, "attn_logit_softcapping", 50.0)?;
        config.final_softcap = softcap(fields, "final_logit_softcapping", 30.0)?;
        Ok(config)
    }
}

/// The rotary positions of every layer and, where they differ, of the
/// sliding ones, read from a config of `max_positions`.
pub(super) type Ropes = fn(&Fields, usize) -> Result<(Rope, Option<Rope>), Error>;

/// What Gemma 2 and Gemma 3 read alike; `pattern`: one full-attention
/// layer in that many when `layer_types` is absent.
pub(super) fn read_gemma(
    family: Family,
    fields: &Fields,
    classes: &[&str],
    pattern: usize,
    ropes: Ropes,
) -> Result<Config, Error> {
    let mut config = decoder::read_as(family, fields, classes)?;
    // Gemma's own defaults where the key is absent
    config.head_dim = fields.count(&["head_dim"])?.unwrap_or(256);
    config.tie_embeddings = fields.flag("tie_word_embeddings")?.unwrap_or(true);
    config.padding_idx = Some(fields.id("pad_token_id")?.unwrap_or(0));
    config.max_positions = fields.count(&["max_position_embeddings"])?.unwrap_or(8192);
    let (rope, local_rope) = ropes(fields, config.max_positions)?;
    (config.rope, config.local_rope) = (Some(rope), local_rope);
    config.mlp_activation = decoder::gelu(fields, "hidden_activation", "gelu_pytorch_tanh")?;
    config.attention_bias = decoder::attention_bias(fields)?;
    config.norms = BlockNorms::Sandwich;
    config.norm_plus_one = true;
    config.embedding_scale = Some((config.hidden as f64).sqrt());
    let scalar = fields.number("query_pre_attn_scalar")?.unwrap_or(256.0);
    config.attention_scale = Some(scalar.powf(-0.5));
    let layers = config.layers;
    let sliding = match Config::layer_types(fields, layers)? {
        Some(types) => types,
        None => (0..layers).map(|layer| !(layer + 1).is_multiple_of(pattern)).collect(),
    };
    let window =
        if fields.object.contains_key("sliding_window") { fields.count(&["sliding_window"])? } else { Some(4096) };
    if window.is_none() && sliding.contains(&true) {
        return Err(refuse("sliding_window", "null", "a window for the layers layer_types slides"));
    }
    (config.sliding_window, config.sliding_layers) = (window, sliding);
    Ok(config)
}

/// A soft cap: its default where absent, none where null.
fn softcap(fields: &Fields, key: &str, default: f64) -> Result<Option<f64>, Error> {
    Ok(if fields.object.contains_key(key) { fields.number(key)? } else { Some(default) })
}
