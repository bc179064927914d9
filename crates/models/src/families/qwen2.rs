//! Qwen2 (`qwen2`): Qwen2 and Qwen2.5, biases on q, k and v whatever the
//! config says, the sliding window of the layers Qwen's keys name.

use super::Architecture;
use crate::Error;
use crate::config::{AttentionBias, Config, Fields};
use crate::decoder;
use crate::family::Family;
use crate::keys::{FALSE, Handling, LLAMA_LIKE};

/// The keys Qwen2 and Qwen3 share: their windows.
pub(super) const QWEN: &[(&str, Handling)] = &[
    ("sliding_window", Handling::Read),
    ("use_sliding_window", Handling::Read),
    ("max_window_layers", Handling::Read),
    ("layer_types", Handling::Read),
    ("use_mrope", Handling::RefusedUnless(FALSE)),
];

const QWEN2: &[(&str, Handling)] =
    &[("attention_bias", Handling::Inert("Qwen2 has q/k/v biases and no o bias whatever it says"))];

pub(crate) struct Qwen2;

impl Architecture for Qwen2 {
    fn model_type(&self) -> &'static str {
        "qwen2"
    }

    fn keys(&self) -> &'static [&'static [(&'static str, Handling)]] {
        &[QWEN2, QWEN, LLAMA_LIKE]
    }

    fn read(&self, family: Family, fields: &Fields) -> Result<Config, Error> {
        decoder::silu(fields)?;
        let mut config = decoder::read(family, fields, "Qwen2")?;
        config.attention_bias = AttentionBias::Qkv;
        (config.sliding_window, config.sliding_layers) = window(fields, config.layers)?;
        Ok(config)
    }
}

/// Qwen's window and the layers that attend within it: those
/// `layer_types` names (transformers 5), or those from `max_window_layers`
/// on (transformers 4); none unless `use_sliding_window`, as transformers
/// drops it.
pub(super) fn window(fields: &Fields, layers: usize) -> Result<(Option<usize>, Vec<bool>), Error> {
    let window = fields.count(&["sliding_window"])?;
    let layer_types = Config::layer_types(fields, layers)?;
    let use_window = fields.flag("use_sliding_window")?.unwrap_or(false);
    let from_layer = fields.whole_from_zero("max_window_layers", "a number of layers")?.unwrap_or(28);
    let sliding = layer_types.unwrap_or_else(|| (0..layers).map(|layer| layer >= from_layer).collect());
    match window {
        Some(window) if use_window && sliding.contains(&true) => Ok((Some(window), sliding)),
        _ => Ok((None, Vec::new())),
    }
}
