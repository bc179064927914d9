//! Mistral (`mistral`): Mistral 7B, no biases, every layer within
//! `sliding_window`.

use super::Architecture;
use crate::Error;
use crate::config::{Config, Fields};
use crate::decoder;
use crate::family::Family;
use crate::keys::{Handling, LLAMA_LIKE};

const MISTRAL: &[(&str, Handling)] = &[("sliding_window", Handling::Read)];

pub(crate) struct Mistral;

impl Architecture for Mistral {
    fn model_type(&self) -> &'static str {
        "mistral"
    }

    fn keys(&self) -> &'static [&'static [(&'static str, Handling)]] {
        &[MISTRAL, LLAMA_LIKE]
    }

    fn read(&self, family: Family, fields: &Fields) -> Result<Config, Error> {
        decoder::silu(fields)?;
        let mut config = decoder::read(family, fields, "Mistral")?;
        // transformers: no bias whatever the config says; its default window
        // when the key is absent, none when it is null
        let window = fields.count(&["sliding_window"])?;
        config.sliding_window = if fields.object.contains_key("sliding_window") { window } else { Some(4096) };
        config.sliding_layers = vec![true];
        Ok(config)
    }
}
