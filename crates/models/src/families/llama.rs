//! Llama (`llama`): Llama 2, Llama 3/3.1/3.2 (`rope_scaling` `llama3`),
//! TinyLlama, SmolLM. The decoder of the Llama kind as it is: every bias
//! optional (`attention_bias`, `mlp_bias`), full attention.

use super::Architecture;
use crate::Error;
use crate::config::{Config, Fields};
use crate::decoder;
use crate::family::Family;
use crate::keys::{Handling, LLAMA_LIKE};

const LLAMA: &[(&str, Handling)] = &[
    ("attention_bias", Handling::Read),
    ("mlp_bias", Handling::Read),
    // SmolLM's configs (written by nanotron): transformers' Llama does not read them
    ("rope_interleaved", Handling::Inert("nanotron's; transformers' Llama does not read it")),
    ("is_llama_config", Handling::Inert("nanotron's; transformers' Llama does not read it")),
];

pub(crate) struct Llama;

impl Architecture for Llama {
    fn model_type(&self) -> &'static str {
        "llama"
    }

    fn keys(&self) -> &'static [&'static [(&'static str, Handling)]] {
        &[LLAMA, LLAMA_LIKE]
    }

    fn read(&self, family: Family, fields: &Fields) -> Result<Config, Error> {
        decoder::silu(fields)?;
        let mut config = decoder::read(family, fields, "Llama")?;
        config.attention_bias = decoder::attention_bias(fields)?;
        config.mlp_bias = fields.flag("mlp_bias")? == Some(true);
        config.sliding_window = decoder::full_attention(fields, config.layers)?;
        Ok(config)
    }
}
