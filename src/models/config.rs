//! A Hugging Face `config.json`, read into the shape of one of the supported
//! families and checked: a field that asks for something not computed here
//! is refused by name, never approximated.

use candle_core::DType;
use serde_json::Value;

use crate::Error;

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
    /// `gpt2`: GPT-2 (learned positions, `Conv1D` weights, the head tied).
    Gpt2,
    /// `bert`: BERT, with its masked-LM head or a classifier.
    Bert,
}

impl Family {
    /// The `model_type` values read.
    pub const MODEL_TYPES: &'static str = "llama, mistral, qwen2, qwen3, gpt2, bert";

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
}

/// Llama 3's frequency-dependent rotary scaling (`rope_scaling` of
/// `rope_type` `llama3`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Rope {
    /// `factor`.
    pub factor: f64,
    /// `low_freq_factor`.
    pub low_freq_factor: f64,
    /// `high_freq_factor`.
    pub high_freq_factor: f64,
    /// `original_max_position_embeddings`.
    pub original_max_position_embeddings: usize,
}

/// What a BERT model trains: its masked-LM head, or a classifier over the
/// pooled first token (`architectures`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BertHead {
    /// `BertForMaskedLM` (the default): a transform, a layer norm and the
    /// decoder tied to the word embeddings, over every position.
    MaskedLm,
    /// `BertForSequenceClassification`: the pooler and a classifier of `labels` classes.
    Classification {
        /// Classes (`num_labels`, or the entries of `id2label`; 2 by default).
        labels: usize,
    },
}

/// A model's shape as its `config.json` gives it, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The family (`model_type`).
    pub family: Family,
    /// `vocab_size`.
    pub vocab: usize,
    /// `hidden_size` (`n_embd` for GPT-2).
    pub hidden: usize,
    /// `num_hidden_layers` (`n_layer`).
    pub layers: usize,
    /// `num_attention_heads` (`n_head`).
    pub heads: usize,
    /// `num_key_value_heads` (the heads, without grouped-query attention).
    pub kv_heads: usize,
    /// `head_dim`, or `hidden / heads`.
    pub head_dim: usize,
    /// `intermediate_size` (`n_inner`, or 4 × hidden, for GPT-2).
    pub intermediate: usize,
    /// `max_position_embeddings` (`n_positions`): the longest sequence.
    pub max_positions: usize,
    /// `rms_norm_eps` or `layer_norm_eps` (`layer_norm_epsilon`).
    pub norm_eps: f64,
    /// `rope_theta` (10000 by default).
    pub rope_theta: f64,
    /// `rope_scaling` of type `llama3`, if any.
    pub rope_scaling: Option<Llama3Rope>,
    /// `tie_word_embeddings`: the head is the token embedding.
    pub tie_embeddings: bool,
    /// Biases on the q, k, v (and output) projections: `attention_bias`, or
    /// Qwen2's q/k/v biases.
    pub attention_bias: AttentionBias,
    /// `mlp_bias` (Llama).
    pub mlp_bias: bool,
    /// `sliding_window` when attention uses one: a sequence longer than it
    /// attends differently, and is refused.
    pub sliding_window: Option<usize>,
    /// `type_vocab_size` (BERT).
    pub type_vocab: usize,
    /// BERT's head.
    pub bert_head: BertHead,
    /// `torch_dtype`: what the weights are stored in (f32 when not given).
    pub dtype: DType,
}

/// Which attention projections have a bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionBias {
    /// None (Llama, Mistral, Qwen3).
    None,
    /// q, k and v (Qwen2).
    Qkv,
    /// q, k, v and the output (`attention_bias: true`; GPT-2 and BERT have every bias).
    All,
}

/// A refused config: the field, what it held, what would be valid.
fn refuse(field: &str, value: impl std::fmt::Display, valid: impl Into<String>) -> Error {
    Error::invalid(
        crate::Setting::Input(format!("config field {field}")),
        crate::Value::Text(value.to_string()),
        format!("use {}", valid.into()),
    )
}

/// A JSON object's fields, read with the config's own names in the errors.
struct Fields<'a> {
    object: &'a serde_json::Map<String, Value>,
}

impl Fields<'_> {
    fn value(&self, name: &str) -> Option<&Value> {
        self.object.get(name).filter(|value| !value.is_null())
    }

    /// A whole number of at least 1 under the first of `names` present.
    fn count(&self, names: &[&str]) -> Result<Option<usize>, Error> {
        for name in names {
            if let Some(value) = self.value(name) {
                return match value.as_u64().and_then(|v| usize::try_from(v).ok()) {
                    Some(0) | None => Err(refuse(name, value, "a whole number of at least 1")),
                    Some(count) => Ok(Some(count)),
                };
            }
        }
        Ok(None)
    }

    fn required(&self, names: &[&str]) -> Result<usize, Error> {
        self.count(names)?.ok_or_else(|| refuse(names[0], "missing", "a whole number of at least 1 (required)"))
    }

    fn number(&self, name: &str) -> Result<Option<f64>, Error> {
        match self.value(name) {
            None => Ok(None),
            Some(value) => match value.as_f64().filter(|v| v.is_finite() && *v > 0.0) {
                Some(number) => Ok(Some(number)),
                None => Err(refuse(name, value, "a positive number")),
            },
        }
    }

    fn flag(&self, name: &str) -> Result<Option<bool>, Error> {
        match self.value(name) {
            None => Ok(None),
            Some(Value::Bool(flag)) => Ok(Some(*flag)),
            Some(value) => Err(refuse(name, value, "true or false")),
        }
    }

    fn text(&self, name: &str) -> Option<&str> {
        self.value(name).and_then(Value::as_str)
    }
}

impl Config {
    /// Reads a `config.json` file.
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Config, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|err| refuse("config", path.display(), format!("a readable config.json ({err})")))?;
        Config::from_json(&text)
    }

    /// Reads the text of a `config.json`.
    ///
    /// ```
    /// let config = autobatch::models::Config::from_json(r#"{
    ///     "model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
    ///     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2
    /// }"#)?;
    /// assert_eq!(config.head_dim, 16);
    /// assert!(autobatch::models::Config::from_json(r#"{"model_type": "t5"}"#).is_err());
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn from_json(text: &str) -> Result<Config, Error> {
        let value: Value =
            serde_json::from_str(text).map_err(|err| refuse("config", "not JSON", format!("a JSON object ({err})")))?;
        let Some(object) = value.as_object() else {
            return Err(refuse("config", "not an object", "a JSON object of the model's settings"));
        };
        let fields = Fields { object };
        let model_type = fields.text("model_type").unwrap_or("missing");
        let family = match model_type {
            "llama" => Family::Llama,
            "mistral" => Family::Mistral,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "gpt2" => Family::Gpt2,
            "bert" => Family::Bert,
            other => return Err(refuse("model_type", other, Family::MODEL_TYPES)),
        };
        let config = match family {
            Family::Gpt2 => Config::gpt2(&fields)?,
            Family::Bert => Config::bert(&fields)?,
            _ => Config::llama_like(family, &fields)?,
        };
        config.check_shape()?;
        Ok(config)
    }

    fn dtype(fields: &Fields) -> Result<DType, Error> {
        Ok(match fields.text("torch_dtype").or(fields.text("dtype")) {
            None | Some("float32") => DType::F32,
            Some("bfloat16") => DType::BF16,
            // f16 weights are trained in bf16 here (candle's CPU has no f16 matmul backward worth measuring)
            Some("float16") => DType::BF16,
            Some(other) => return Err(refuse("torch_dtype", other, "float32, bfloat16 or float16")),
        })
    }

    fn llama_like(family: Family, fields: &Fields) -> Result<Config, Error> {
        let hidden = fields.required(&["hidden_size"])?;
        let heads = fields.required(&["num_attention_heads"])?;
        let kv_heads = fields.count(&["num_key_value_heads"])?.unwrap_or(heads);
        let head_dim = match fields.count(&["head_dim"])? {
            Some(head_dim) => head_dim,
            None if hidden.is_multiple_of(heads) => hidden / heads,
            None => return Err(refuse("num_attention_heads", heads, format!("a divisor of hidden_size {hidden}"))),
        };
        let act = fields.text("hidden_act").unwrap_or("silu");
        if act != "silu" {
            return Err(refuse("hidden_act", act, "silu (SwiGLU)"));
        }
        let attention_bias = match (family, fields.flag("attention_bias")?) {
            (Family::Qwen2, _) => AttentionBias::Qkv,
            (_, Some(true)) => AttentionBias::All,
            _ => AttentionBias::None,
        };
        let sliding_window = match family {
            Family::Mistral => fields.count(&["sliding_window"])?,
            Family::Qwen2 | Family::Qwen3 if fields.flag("use_sliding_window")? == Some(true) => {
                fields.count(&["sliding_window"])?
            }
            _ => None,
        };
        Ok(Config {
            family,
            vocab: fields.required(&["vocab_size"])?,
            hidden,
            layers: fields.required(&["num_hidden_layers"])?,
            heads,
            kv_heads,
            head_dim,
            intermediate: fields.required(&["intermediate_size"])?,
            max_positions: fields.count(&["max_position_embeddings"])?.unwrap_or(2048),
            norm_eps: fields.number("rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta: fields.number("rope_theta")?.unwrap_or(10_000.0),
            rope_scaling: Config::rope_scaling(fields)?,
            tie_embeddings: fields.flag("tie_word_embeddings")?.unwrap_or(false),
            attention_bias,
            mlp_bias: fields.flag("mlp_bias")?.unwrap_or(false),
            sliding_window,
            type_vocab: 0,
            bert_head: BertHead::MaskedLm,
            dtype: Config::dtype(fields)?,
        })
    }

    fn rope_scaling(fields: &Fields) -> Result<Option<Llama3Rope>, Error> {
        let Some(scaling) = fields.value("rope_scaling") else { return Ok(None) };
        let Some(object) = scaling.as_object() else {
            return Err(refuse("rope_scaling", scaling, "an object with rope_type llama3, or null"));
        };
        let scaling = Fields { object };
        let kind = scaling.text("rope_type").or(scaling.text("type")).unwrap_or("missing");
        match kind {
            "llama3" => Ok(Some(Llama3Rope {
                factor: scaling.number("factor")?.unwrap_or(8.0),
                low_freq_factor: scaling.number("low_freq_factor")?.unwrap_or(1.0),
                high_freq_factor: scaling.number("high_freq_factor")?.unwrap_or(4.0),
                original_max_position_embeddings: scaling.count(&["original_max_position_embeddings"])?.unwrap_or(8192),
            })),
            "default" => Ok(None),
            other => Err(refuse("rope_scaling.rope_type", other, "llama3 (or default, or no rope_scaling)")),
        }
    }

    fn gpt2(fields: &Fields) -> Result<Config, Error> {
        let hidden = fields.required(&["n_embd", "hidden_size"])?;
        let heads = fields.required(&["n_head", "num_attention_heads"])?;
        if !hidden.is_multiple_of(heads) {
            return Err(refuse("n_head", heads, format!("a divisor of n_embd {hidden}")));
        }
        let act = fields.text("activation_function").unwrap_or("gelu_new");
        if act != "gelu_new" {
            return Err(refuse("activation_function", act, "gelu_new"));
        }
        Ok(Config {
            family: Family::Gpt2,
            vocab: fields.required(&["vocab_size"])?,
            hidden,
            layers: fields.required(&["n_layer", "num_hidden_layers"])?,
            heads,
            kv_heads: heads,
            head_dim: hidden / heads,
            intermediate: fields.count(&["n_inner"])?.unwrap_or(4 * hidden),
            max_positions: fields.count(&["n_positions", "max_position_embeddings"])?.unwrap_or(1024),
            norm_eps: fields.number("layer_norm_epsilon")?.unwrap_or(1e-5),
            rope_theta: 0.0,
            rope_scaling: None,
            tie_embeddings: fields.flag("tie_word_embeddings")?.unwrap_or(true),
            attention_bias: AttentionBias::All,
            mlp_bias: true,
            sliding_window: None,
            type_vocab: 0,
            bert_head: BertHead::MaskedLm,
            dtype: Config::dtype(fields)?,
        })
    }

    fn bert(fields: &Fields) -> Result<Config, Error> {
        let hidden = fields.required(&["hidden_size"])?;
        let heads = fields.required(&["num_attention_heads"])?;
        if !hidden.is_multiple_of(heads) {
            return Err(refuse("num_attention_heads", heads, format!("a divisor of hidden_size {hidden}")));
        }
        let act = fields.text("hidden_act").unwrap_or("gelu");
        if act != "gelu" {
            return Err(refuse("hidden_act", act, "gelu"));
        }
        if let Some(kind) = fields.text("position_embedding_type").filter(|kind| *kind != "absolute") {
            return Err(refuse("position_embedding_type", kind, "absolute"));
        }
        let architecture = fields
            .value("architectures")
            .and_then(Value::as_array)
            .and_then(|list| list.first())
            .and_then(Value::as_str)
            .unwrap_or("BertForMaskedLM");
        let bert_head = match architecture {
            "BertForMaskedLM" => BertHead::MaskedLm,
            "BertForSequenceClassification" => {
                let from_labels = fields.value("id2label").and_then(Value::as_object).map(|labels| labels.len());
                let labels = fields.count(&["num_labels"])?.or(from_labels).unwrap_or(2);
                if labels < 2 {
                    return Err(refuse("num_labels", labels, "at least 2 classes"));
                }
                BertHead::Classification { labels }
            }
            other => {
                return Err(refuse(
                    "architectures",
                    other,
                    "BertForMaskedLM or BertForSequenceClassification (a head to train)",
                ))
            }
        };
        Ok(Config {
            family: Family::Bert,
            vocab: fields.required(&["vocab_size"])?,
            hidden,
            layers: fields.required(&["num_hidden_layers"])?,
            heads,
            kv_heads: heads,
            head_dim: hidden / heads,
            intermediate: fields.required(&["intermediate_size"])?,
            max_positions: fields.count(&["max_position_embeddings"])?.unwrap_or(512),
            norm_eps: fields.number("layer_norm_eps")?.unwrap_or(1e-12),
            rope_theta: 0.0,
            rope_scaling: None,
            tie_embeddings: true,
            attention_bias: AttentionBias::All,
            mlp_bias: true,
            sliding_window: None,
            type_vocab: fields.count(&["type_vocab_size"])?.unwrap_or(2),
            bert_head,
            dtype: Config::dtype(fields)?,
        })
    }

    /// The shapes the forward pass needs to agree.
    fn check_shape(&self) -> Result<(), Error> {
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(refuse(
                "num_key_value_heads",
                self.kv_heads,
                format!("a divisor of num_attention_heads {}", self.heads),
            ));
        }
        if self.family.is_llama_like() && !self.head_dim.is_multiple_of(2) {
            return Err(refuse("head_dim", self.head_dim, "an even number (rotary positions rotate pairs)"));
        }
        Ok(())
    }

    /// The same model with `layers` layers: a shallower (or deeper) copy to
    /// probe, every layer alike.
    pub fn with_layers(mut self, layers: usize) -> Result<Config, Error> {
        if layers == 0 {
            return Err(refuse("num_hidden_layers", 0, "at least 1"));
        }
        self.layers = layers;
        Ok(self)
    }

    /// A sequence length this model can step at: at most its positions and
    /// within its sliding window.
    pub fn check_seq_len(&self, seq_len: usize) -> Result<(), Error> {
        if seq_len == 0 || seq_len > self.max_positions {
            return Err(Error::invalid(
                "seq_len",
                crate::Value::Count(seq_len),
                format!("it must be from 1 to the config's max_position_embeddings, {}", self.max_positions),
            ));
        }
        if let Some(window) = self.sliding_window.filter(|&window| seq_len > window) {
            return Err(refuse(
                "sliding_window",
                window,
                format!(
                    "at least the sequence length, {seq_len}: a longer sequence attends within a window, which \
                     changes the memory and is not computed here"
                ),
            ));
        }
        Ok(())
    }
}
