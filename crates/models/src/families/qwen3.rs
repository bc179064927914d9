//! Qwen3 (`qwen3`): Qwen2's decoder with RMS norms on each head's queries
//! and keys, an explicit `head_dim`, `attention_bias` as written.

use super::Architecture;
use super::qwen2::{QWEN, window};
use crate::Error;
use crate::config::{Config, Fields, QkNorm};
use crate::decoder;
use crate::family::Family;
use crate::keys::{Handling, LLAMA_LIKE};

const QWEN3: &[(&str, Handling)] = &[("attention_bias", Handling::Read)];

pub(crate) struct Qwen3;

impl Architecture for Qwen3 {
    fn model_type(&self) -> &'static str {
        "qwen3"
    }

    fn keys(&self) -> &'static [&'static [(&'static str, Handling)]] {
        &[QWEN3, QWEN, LLAMA_LIKE]
    }

    fn read(&self, family: Family, fields: &Fields) -> Result<Config, Error> {
        decoder::silu(fields)?;
        let mut config = decoder::read(family, fields, "Qwen3")?;
        config.attention_bias = decoder::attention_bias(fields)?;
        config.qk_norm = QkNorm::PerHead;
        (config.sliding_window, config.sliding_layers) = window(fields, config.layers)?;
        Ok(config)
    }
}
