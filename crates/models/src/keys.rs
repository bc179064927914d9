//! Every key transformers 4 and 5 write in a `config.json` of the families
//! built here, and what reading a config does with it: read into the model,
//! known not to change the training computation (with why), accepted only at
//! the value computed here, or a dropout probability. docs/models.md has the
//! same table; a test keeps the two equal.

use serde_json::Value;

/// What reading a config does with one key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Handling {
    /// Read into the model (its shape, its numerics, its head).
    Read,
    /// Present in configs, and does not change the training step (why).
    Inert(&'static str),
    /// Accepted at these values (or null); any other is refused by name.
    RefusedUnless(&'static [Allowed]),
    /// A dropout probability: read, not applied, warned about when above 0.
    Dropout,
}

/// A value a [`Handling::RefusedUnless`] key may hold.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Allowed {
    Bool(bool),
    Text(&'static str),
    /// `{}` or `[]`.
    Empty,
}

impl Allowed {
    pub(crate) fn matches(&self, value: &Value) -> bool {
        match (self, value) {
            (Allowed::Bool(expected), Value::Bool(flag)) => expected == flag,
            (Allowed::Text(expected), Value::String(text)) => expected == text,
            (Allowed::Empty, Value::Object(map)) => map.is_empty(),
            (Allowed::Empty, Value::Array(list)) => list.is_empty(),
            _ => false,
        }
    }
}

impl std::fmt::Display for Allowed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Allowed::Bool(flag) => write!(f, "{flag}"),
            Allowed::Text(text) => write!(f, "{text:?}"),
            Allowed::Empty => f.write_str("{}"),
        }
    }
}

pub(crate) const FALSE: &[Allowed] = &[Allowed::Bool(false)];
pub(crate) const TRUE: &[Allowed] = &[Allowed::Bool(true)];

/// Keys of every family: what transformers' `PretrainedConfig` writes
/// (generation settings included, as transformers 4 wrote them).
pub(crate) const COMMON: &[(&str, Handling)] = &[
    ("model_type", Handling::Read),
    ("architectures", Handling::Read),
    ("dtype", Handling::Read),
    ("torch_dtype", Handling::Read),
    ("vocab_size", Handling::Read),
    ("tie_word_embeddings", Handling::Read),
    ("transformers_version", Handling::Inert("the writer's version")),
    ("_name_or_path", Handling::Inert("where the config came from")),
    ("_commit_hash", Handling::Inert("where the config came from")),
    ("bos_token_id", Handling::Inert("a tokenizer id; the loss does not use it")),
    ("eos_token_id", Handling::Inert("a tokenizer id; the loss does not use it")),
    ("sep_token_id", Handling::Inert("a tokenizer id; the loss does not use it")),
    ("decoder_start_token_id", Handling::Inert("a tokenizer id; the loss does not use it")),
    ("use_cache", Handling::Inert("the KV cache of generation; a training step keeps none")),
    ("initializer_range", Handling::Inert("how new weights are drawn; memory does not depend on their values")),
    ("output_attentions", Handling::Inert("what a forward returns, not what it computes")),
    ("output_hidden_states", Handling::Inert("what a forward returns, not what it computes")),
    ("return_dict", Handling::Inert("what a forward returns, not what it computes")),
    ("use_return_dict", Handling::Inert("what a forward returns, not what it computes")),
    ("torchscript", Handling::Inert("tracing, not the computation")),
    ("use_bfloat16", Handling::Inert("a TensorFlow setting; dtype says the weights' dtype")),
    ("tf_legacy_loss", Handling::Inert("a TensorFlow setting")),
    ("chunk_size_feed_forward", Handling::Inert("the same MLP in chunks: the same values")),
    ("finetuning_task", Handling::Inert("a label for people")),
    ("tokenizer_class", Handling::Inert("the tokenizer, not the model")),
    ("prefix", Handling::Inert("a generation prompt")),
    ("task_specific_params", Handling::Inert("generation settings")),
    ("gradient_checkpointing", Handling::Inert("an old training flag; --checkpointing is this tool's")),
    ("_attn_implementation", Handling::Inert("eager, sdpa and flash attention compute the same values")),
    ("attn_implementation", Handling::Inert("eager, sdpa and flash attention compute the same values")),
    ("loss_type", Handling::Inert("transformers falls back to the family's own loss")),
    ("keys_to_ignore_at_inference", Handling::Inert("outputs dropped at inference")),
    ("id2label", Handling::Read),
    ("label2id", Handling::Inert("the names of id2label's classes")),
    ("num_labels", Handling::Read),
    ("problem_type", Handling::RefusedUnless(&[Allowed::Text("single_label_classification")])),
    ("pruned_heads", Handling::RefusedUnless(&[Allowed::Empty])),
    ("is_encoder_decoder", Handling::RefusedUnless(FALSE)),
    ("tie_encoder_decoder", Handling::RefusedUnless(FALSE)),
    ("add_cross_attention", Handling::RefusedUnless(FALSE)),
    ("cross_attention_hidden_size", Handling::Inert("cross-attention, which add_cross_attention false leaves out")),
    ("is_decoder", Handling::RefusedUnless(FALSE)),
    ("quantization_config", Handling::RefusedUnless(&[])),
    // generation settings transformers 4 wrote into config.json
    ("max_length", Handling::Inert("a generation setting")),
    ("min_length", Handling::Inert("a generation setting")),
    ("do_sample", Handling::Inert("a generation setting")),
    ("early_stopping", Handling::Inert("a generation setting")),
    ("num_beams", Handling::Inert("a generation setting")),
    ("num_beam_groups", Handling::Inert("a generation setting")),
    ("diversity_penalty", Handling::Inert("a generation setting")),
    ("temperature", Handling::Inert("a generation setting")),
    ("top_k", Handling::Inert("a generation setting")),
    ("top_p", Handling::Inert("a generation setting")),
    ("typical_p", Handling::Inert("a generation setting")),
    ("repetition_penalty", Handling::Inert("a generation setting")),
    ("length_penalty", Handling::Inert("a generation setting")),
    ("no_repeat_ngram_size", Handling::Inert("a generation setting")),
    ("encoder_no_repeat_ngram_size", Handling::Inert("a generation setting")),
    ("bad_words_ids", Handling::Inert("a generation setting")),
    ("num_return_sequences", Handling::Inert("a generation setting")),
    ("output_scores", Handling::Inert("a generation setting")),
    ("return_dict_in_generate", Handling::Inert("a generation setting")),
    ("forced_bos_token_id", Handling::Inert("a generation setting")),
    ("forced_eos_token_id", Handling::Inert("a generation setting")),
    ("remove_invalid_values", Handling::Inert("a generation setting")),
    ("exponential_decay_length_penalty", Handling::Inert("a generation setting")),
    ("suppress_tokens", Handling::Inert("a generation setting")),
    ("begin_suppress_tokens", Handling::Inert("a generation setting")),
];

/// Keys of the decoders of the Llama kind.
pub(crate) const LLAMA_LIKE: &[(&str, Handling)] = &[
    ("hidden_size", Handling::Read),
    ("intermediate_size", Handling::Read),
    ("num_hidden_layers", Handling::Read),
    ("num_attention_heads", Handling::Read),
    ("num_key_value_heads", Handling::Read),
    ("head_dim", Handling::Read),
    ("hidden_act", Handling::Read),
    ("max_position_embeddings", Handling::Read),
    ("rms_norm_eps", Handling::Read),
    ("rope_theta", Handling::Read),
    ("rope_scaling", Handling::Read),
    ("rope_parameters", Handling::Read),
    ("pad_token_id", Handling::Read),
    ("attention_dropout", Handling::Dropout),
    ("pretraining_tp", Handling::Inert("transformers 4 split the products in slices that sum to the same")),
];

/// What reading a config whose family has the key `tables` does with
/// `key`; `None`: a key transformers does not write for it.
pub(crate) fn handling(tables: &[&[(&'static str, Handling)]], key: &str) -> Option<Handling> {
    table(tables).find(|(name, _)| *name == key).map(|(_, handling)| handling)
}

/// Every key of a family's `tables`, with its handling: the family's own
/// first, then the common ones.
pub(crate) fn table<'a>(
    tables: &'a [&'a [(&'static str, Handling)]],
) -> impl Iterator<Item = (&'static str, Handling)> + 'a {
    tables.iter().chain([COMMON].iter()).flat_map(|list| list.iter().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_values_match_as_written() {
        assert!(Allowed::Empty.matches(&serde_json::json!({})));
        assert!(!Allowed::Empty.matches(&serde_json::json!({"0": [1]})));
        assert!(Allowed::Bool(false).matches(&serde_json::json!(false)));
        assert!(!Allowed::Text("absolute").matches(&serde_json::json!("relative_key")));
    }
}
