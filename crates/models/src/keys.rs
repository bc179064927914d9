//! Every key transformers 4 and 5 write in a `config.json` of the families
//! built here, and what reading a config does with it: read into the model,
//! known not to change the training computation (with why), accepted only at
//! the value computed here, or a dropout probability. docs/models.md has the
//! same table; a test keeps the two equal.

use serde_json::Value;

use crate::family::Family;

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

const FALSE: &[Allowed] = &[Allowed::Bool(false)];
const TRUE: &[Allowed] = &[Allowed::Bool(true)];

/// Keys of every family: what transformers' `PretrainedConfig` writes
/// (generation settings included, as transformers 4 wrote them).
const COMMON: &[(&str, Handling)] = &[
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
const LLAMA_LIKE: &[(&str, Handling)] = &[
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

const LLAMA: &[(&str, Handling)] = &[
    ("attention_bias", Handling::Read),
    ("mlp_bias", Handling::Read),
    // SmolLM's configs (written by nanotron): transformers' Llama does not read them
    ("rope_interleaved", Handling::Inert("nanotron's; transformers' Llama does not read it")),
    ("is_llama_config", Handling::Inert("nanotron's; transformers' Llama does not read it")),
];

const MISTRAL: &[(&str, Handling)] = &[("sliding_window", Handling::Read)];

const QWEN: &[(&str, Handling)] = &[
    ("sliding_window", Handling::Read),
    ("use_sliding_window", Handling::Read),
    ("max_window_layers", Handling::Read),
    ("layer_types", Handling::Read),
    ("use_mrope", Handling::RefusedUnless(FALSE)),
];

const QWEN2: &[(&str, Handling)] =
    &[("attention_bias", Handling::Inert("Qwen2 has q/k/v biases and no o bias whatever it says"))];

const QWEN3: &[(&str, Handling)] = &[("attention_bias", Handling::Read)];

const GPT2: &[(&str, Handling)] = &[
    ("n_embd", Handling::Read),
    ("hidden_size", Handling::Read),
    ("n_layer", Handling::Read),
    ("num_hidden_layers", Handling::Read),
    ("n_head", Handling::Read),
    ("num_attention_heads", Handling::Read),
    ("n_inner", Handling::Read),
    ("n_positions", Handling::Read),
    ("max_position_embeddings", Handling::Read),
    ("n_ctx", Handling::Inert("transformers 2's name of n_positions; transformers does not read it")),
    ("layer_norm_epsilon", Handling::Read),
    ("activation_function", Handling::Read),
    ("pad_token_id", Handling::Inert("GPT-2's embedding has no padding row")),
    ("attn_pdrop", Handling::Dropout),
    ("embd_pdrop", Handling::Dropout),
    ("resid_pdrop", Handling::Dropout),
    ("summary_type", Handling::Inert("GPT2DoubleHeadsModel's head")),
    ("summary_use_proj", Handling::Inert("GPT2DoubleHeadsModel's head")),
    ("summary_activation", Handling::Inert("GPT2DoubleHeadsModel's head")),
    ("summary_proj_to_labels", Handling::Inert("GPT2DoubleHeadsModel's head")),
    ("summary_first_dropout", Handling::Inert("GPT2DoubleHeadsModel's head")),
    ("scale_attn_weights", Handling::RefusedUnless(TRUE)),
    ("scale_attn_by_inverse_layer_idx", Handling::RefusedUnless(FALSE)),
    ("reorder_and_upcast_attn", Handling::RefusedUnless(FALSE)),
];

const BERT: &[(&str, Handling)] = &[
    ("hidden_size", Handling::Read),
    ("intermediate_size", Handling::Read),
    ("num_hidden_layers", Handling::Read),
    ("num_attention_heads", Handling::Read),
    ("hidden_act", Handling::Read),
    ("max_position_embeddings", Handling::Read),
    ("type_vocab_size", Handling::Read),
    ("layer_norm_eps", Handling::Read),
    ("pad_token_id", Handling::Read),
    ("hidden_dropout_prob", Handling::Dropout),
    ("attention_probs_dropout_prob", Handling::Dropout),
    ("classifier_dropout", Handling::Dropout),
    ("position_embedding_type", Handling::RefusedUnless(&[Allowed::Text("absolute")])),
];

/// What reading a config of `family` does with `key`; `None`: a key
/// transformers does not write for it.
pub(crate) fn handling(family: Family, key: &str) -> Option<Handling> {
    table(family).find(|(name, _)| *name == key).map(|(_, handling)| handling)
}

/// Every key of `family`'s table, with its handling: the family's own
/// first, then the common ones.
pub(crate) fn table(family: Family) -> impl Iterator<Item = (&'static str, Handling)> {
    let own: &[&[(&str, Handling)]] = match family {
        Family::Llama => &[LLAMA, LLAMA_LIKE],
        Family::Mistral => &[MISTRAL, LLAMA_LIKE],
        Family::Qwen2 => &[QWEN2, QWEN, LLAMA_LIKE],
        Family::Qwen3 => &[QWEN3, QWEN, LLAMA_LIKE],
        Family::Gpt2 => &[GPT2],
        Family::Bert => &[BERT],
    };
    own.iter().chain([COMMON].iter()).flat_map(|list| list.iter().copied())
}

/// The key table as docs/models.md shows it: one row per key, the families
/// it applies to, what reading does with it.
#[cfg(test)]
pub(crate) fn markdown_table() -> String {
    let mut rows: Vec<(String, String, Vec<&str>)> = Vec::new();
    for family in Family::ALL {
        for (key, handling) in table(family) {
            let what = match handling {
                Handling::Read => "read".to_owned(),
                Handling::Inert(why) => format!("not read: {why}"),
                Handling::RefusedUnless([]) => "refused".to_owned(),
                Handling::RefusedUnless(allowed) => {
                    let values: Vec<String> = allowed.iter().map(|a| a.to_string().replace('"', "")).collect();
                    format!("refused unless {}", values.join(" or "))
                }
                Handling::Dropout => "read, not applied: warned about when above 0".to_owned(),
            };
            match rows.iter_mut().find(|(k, w, _)| k == key && *w == what) {
                Some(row) => row.2.push(family.model_type()),
                None => rows.push((key.to_owned(), what, vec![family.model_type()])),
            }
        }
    }
    let mut table = String::from("| key | families | what reading does |\n|---|---|---|\n");
    for (key, what, families) in rows {
        let families = if families.len() == Family::ALL.len() { "all".to_owned() } else { families.join(", ") };
        table += &format!("| `{key}` | {families} | {what} |\n");
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guide_shows_the_table_the_reader_uses() {
        let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/models.md")).unwrap();
        let table = markdown_table();
        assert!(guide.contains(&table), "docs/models.md's key table is not the reader's; paste this one:\n{table}");
    }

    #[test]
    fn every_family_reads_its_shape_and_refuses_what_it_does_not_compute() {
        for family in Family::ALL {
            for key in ["model_type", "vocab_size", "num_hidden_layers", "tie_word_embeddings"] {
                let handling = handling(family, key).or_else(|| handling(family, "n_layer"));
                assert_eq!(handling, Some(Handling::Read), "{family:?} {key}");
            }
            assert!(matches!(handling(family, "quantization_config"), Some(Handling::RefusedUnless([]))));
            assert_eq!(handling(family, "a_key_nobody_writes"), None);
        }
        assert!(Allowed::Empty.matches(&serde_json::json!({})));
        assert!(!Allowed::Empty.matches(&serde_json::json!({"0": [1]})));
        assert!(Allowed::Bool(false).matches(&serde_json::json!(false)));
        assert!(!Allowed::Text("absolute").matches(&serde_json::json!("relative_key")));
    }
}
