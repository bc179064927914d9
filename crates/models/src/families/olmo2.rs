//! OLMo 2 (`olmo2`): the decoder of the Llama kind with its norms after
//! attention and after the MLP (`post_attention_layernorm`,
//! `post_feedforward_layernorm`, none before), and RMS norms on the queries
//! and keys over the whole projection, before the heads are split.

use super::Architecture;
use crate::Error;
use crate::config::{BlockNorms, Config, Fields, QkNorm};
use crate::decoder;
use crate::family::Family;
use crate::keys::{Handling, LLAMA_LIKE};

const OLMO2: &[(&str, Handling)] = &[("attention_bias", Handling::Read)];

pub(crate) struct Olmo2;

impl Architecture for Olmo2 {
    fn model_type(&self) -> &'static str {
        "olmo2"
    }

    fn keys(&self) -> &'static [&'static [(&'static str, Handling)]] {
        &[OLMO2, LLAMA_LIKE]
    }

    fn read(&self, family: Family, fields: &Fields) -> Result<Config, Error> {
        decoder::silu(fields)?;
        let mut config = decoder::read(family, fields, "Olmo2")?;
        // transformers' Olmo2Config default, not Llama's
        config.norm_eps = fields.number("rms_norm_eps")?.unwrap_or(1e-5);
        config.attention_bias = decoder::attention_bias(fields)?;
        config.qk_norm = QkNorm::Projection;
        config.norms = BlockNorms::Post;
        config.sliding_window = decoder::full_attention(fields, config.layers)?;
        Ok(config)
    }
}
