//! A checkpoint's tensors as `save_pretrained` writes them, matched to a
//! model's names as transformers matches them: with or without the base
//! model's prefix (`transformer.`, `model.`, `bert.`), a tied head's copy
//! accepted where it equals what it is tied to, the buffers and heads
//! transformers itself ignores listed, and any other tensor refused by name.

use std::collections::HashMap;

use candle_core::Tensor;

use super::config::Config;
use crate::Error;
use crate::family::Family;

/// What matching a checkpoint found besides the model's own tensors.
#[derive(Debug, Default)]
pub(crate) struct Matched {
    /// The model's tensors by its names.
    pub(crate) tensors: HashMap<String, Tensor>,
    /// Tensors of the checkpoint left unused, as transformers leaves them.
    pub(crate) ignored: Vec<String>,
}

/// `ours` and the other spelling a checkpoint may use, for a message.
pub(crate) fn both_spellings(family: Family, ours: &str) -> String {
    family.architecture().spellings(ours).join(" or ")
}

/// Tensors transformers ignores when it loads this model from a checkpoint
/// (its buffers, heads of other tasks): the reason, or `None`.
fn ignored_by_transformers(config: &Config, name: &str) -> Option<&'static str> {
    let bare =
        name.strip_prefix(config.family.base_model_prefix()).and_then(|rest| rest.strip_prefix('.')).unwrap_or(name);
    if bare.ends_with(".attn.masked_bias") {
        return Some("GPT-2's causal-mask buffer");
    }
    if bare.ends_with("rotary_emb.inv_freq") {
        return Some("a rotary buffer, computed from the config");
    }
    config.family.architecture().ignored(config, name, bare)
}

/// A head a checkpoint may lack that training starts fresh, as transformers
/// starts it: a classifier fine-tuned from a pre-trained encoder.
pub(crate) fn starts_fresh(config: &Config, ours: &str) -> bool {
    config.family.architecture().starts_fresh(config, ours)
}

/// A tied head's copy in a checkpoint and what it is tied to (our names).
fn tied_copies(config: &Config) -> Vec<(&'static str, &'static str)> {
    if !config.tie_embeddings {
        return Vec::new();
    }
    config.family.architecture().tied_copies(config)
}

fn equal(a: &Tensor, b: &Tensor) -> candle_core::Result<bool> {
    if a.dims() != b.dims() {
        return Ok(false);
    }
    let difference = (a.to_dtype(candle_core::DType::F32)? - b.to_dtype(candle_core::DType::F32)?)?;
    Ok(difference.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()? == 0.0)
}

fn refused(name: &str, why: String) -> Error {
    Error::invalid(crate::Setting::CheckpointTensor(name.to_owned()), autobatch::Value::Given, why)
}

/// Matches `given` (a checkpoint's tensors) to `expected` (the model's
/// names). A tensor of the model missing from the checkpoint is left out of
/// the result (the caller decides: LoRA adapters and a new classifier start
/// fresh, anything else is an error); a tensor of the checkpoint the model
/// does not use is an error naming it, unless transformers also ignores it.
pub(crate) fn match_names(
    config: &Config,
    expected: &[String],
    mut given: HashMap<String, Tensor>,
) -> Result<Matched, Error> {
    let mut matched = Matched::default();
    for ours in expected {
        let mut found =
            config.family.architecture().spellings(ours).into_iter().filter(|name| given.contains_key(name));
        let Some(name) = found.next() else { continue };
        if let Some(twice) = found.next() {
            return Err(refused(
                &twice,
                format!("it is {ours} again, under the name {name} too: keep one of the two in the checkpoint"),
            ));
        }
        let tensor = given.remove(&name).expect("the name was found");
        matched.tensors.insert(ours.clone(), tensor);
    }
    for (copy, source) in tied_copies(config) {
        let Some((name, tensor)) = config
            .family
            .architecture()
            .spellings(copy)
            .into_iter()
            .find_map(|name| given.remove(&name).map(|tensor| (name, tensor)))
        else {
            continue;
        };
        let same = match matched.tensors.get(source) {
            Some(source) => equal(&tensor, source)?,
            None => false,
        };
        if !same {
            return Err(refused(
                &name,
                format!(
                    "the config ties the head (tie_word_embeddings true), but the checkpoint's {name} differs from \
                     {source}: set tie_word_embeddings to false to train the head the checkpoint has"
                ),
            ));
        }
        matched.ignored.push(format!("{name} (the tied head, equal to {source})"));
    }
    let mut rest: Vec<(String, Tensor)> = given.into_iter().collect();
    rest.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, _) in rest {
        match ignored_by_transformers(config, &name) {
            Some(why) => matched.ignored.push(format!("{name} ({why})")),
            None => {
                return Err(refused(
                    &name,
                    format!(
                        "a {} model of this config has no such tensor: check that config.json is the checkpoint's \
                         own (its head, tie_word_embeddings, its layers)",
                        config.family.model_type()
                    ),
                ));
            }
        }
    }
    Ok(matched)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spellings(model_type: &str, ours: &str) -> Vec<String> {
        Family::named(model_type).unwrap().architecture().spellings(ours)
    }

    #[test]
    fn names_are_tried_with_and_without_the_base_models_prefix() {
        assert_eq!(spellings("gpt2", "wte.weight"), ["wte.weight", "transformer.wte.weight"]);
        assert_eq!(spellings("gpt2", "lm_head.weight"), ["lm_head.weight"]);
        assert_eq!(spellings("llama", "model.norm.weight"), ["model.norm.weight", "norm.weight"]);
        assert_eq!(spellings("llama", "lm_head.weight"), ["lm_head.weight"]);
        assert_eq!(
            spellings("bert", "bert.encoder.layer.0.output.dense.weight"),
            ["bert.encoder.layer.0.output.dense.weight", "encoder.layer.0.output.dense.weight"]
        );
    }
}
