//! The architectures built from a config, by `model_type`, and what each
//! names its parts.

/// The architectures built from a config, by `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// `llama`: Llama 2, Llama 3/3.1/3.2 (`rope_scaling` `llama3`), TinyLlama, SmolLM.
    Llama,
    /// `mistral`: Mistral 7B (its sliding window at least the sequence length).
    Mistral,
    /// `qwen2`: Qwen2 / Qwen2.5 (biases on q, k and v).
    Qwen2,
    /// `qwen3`: Qwen3 (RMS norms on q and k, an explicit `head_dim`).
    Qwen3,
    /// `gpt2`: GPT-2 (learned positions, `Conv1D` weights, the head tied or not).
    Gpt2,
    /// `bert`: BERT, with its masked-LM head or a classifier.
    Bert,
}

impl Family {
    /// The `model_type` values read.
    pub const MODEL_TYPES: &'static str = "llama, mistral, qwen2, qwen3, gpt2, bert";

    /// Every family.
    pub const ALL: [Family; 6] =
        [Family::Llama, Family::Mistral, Family::Qwen2, Family::Qwen3, Family::Gpt2, Family::Bert];

    /// The modules LoRA adapts by default, as PEFT does: the attention's
    /// query and value projections (`c_attn`, which holds both, for GPT-2).
    pub fn lora_targets(self) -> &'static [&'static str] {
        match self {
            Family::Gpt2 => &["c_attn"],
            Family::Bert => &["query", "value"],
            _ => &["q_proj", "v_proj"],
        }
    }

    /// Its `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Gpt2 => "gpt2",
            Family::Bert => "bert",
        }
    }

    /// Whether it is a decoder of the Llama kind (RMS norm, rotary positions,
    /// grouped-query attention, SwiGLU).
    pub fn is_llama_like(self) -> bool {
        matches!(self, Family::Llama | Family::Mistral | Family::Qwen2 | Family::Qwen3)
    }

    /// The prefix Hugging Face's head models put before the base model's
    /// tensor names (`base_model_prefix`): `model`, `transformer`, `bert`.
    pub fn base_model_prefix(self) -> &'static str {
        match self {
            Family::Gpt2 => "transformer",
            Family::Bert => "bert",
            _ => "model",
        }
    }
}
