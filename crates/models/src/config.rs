//! A Hugging Face `config.json`, read into the shape of one of the supported
//! families and checked. Every key transformers 4 or 5 writes for a family is
//! read, or known not to change the computation ([`keys`]), or refused by
//! name with its value; a key of neither kind is named in a warning, once.

use candle_core::DType;
use serde_json::Value;

use super::keys::{self, Handling};
use crate::Error;
use crate::family::Family;

/// The largest `config.json` read: published configs are a few KiB (with a
/// long `id2label`, some hundred KiB).
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Llama 3's frequency-dependent rotary scaling (`rope_type` `llama3`).
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

/// YaRN's rotary scaling (`rope_type` `yarn`), as transformers computes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnRope {
    /// `factor`.
    pub factor: f64,
    /// `original_max_position_embeddings`.
    pub original_max_position_embeddings: usize,
    /// `attention_factor`: what cos and sin are scaled by (from `factor`,
    /// `mscale` and `mscale_all_dim` when not given).
    pub attention_factor: f64,
    /// `beta_fast` (32 when not given).
    pub beta_fast: f64,
    /// `beta_slow` (1 when not given).
    pub beta_slow: f64,
    /// `truncate` (true when not given).
    pub truncate: bool,
}

/// How rotary positions are scaled (`rope_parameters` in transformers 5,
/// `rope_scaling` in transformers 4).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// `default`: none.
    None,
    /// `linear`: every frequency divided by `factor`.
    Linear {
        /// `factor`.
        factor: f64,
    },
    /// `dynamic` (NTK): the base grows with a sequence longer than the
    /// positions; at every length up to them (all this crate steps at) it is
    /// the default.
    Dynamic {
        /// `factor`.
        factor: f64,
    },
    /// `llama3`.
    Llama3(Llama3Rope),
    /// `yarn`.
    Yarn(YarnRope),
}

/// Rotary positions: the base and its scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// `rope_theta` (10000 when not given, as transformers defaults it).
    pub theta: f64,
    /// The scaling, if any.
    pub scaling: RopeScaling,
}

/// What a BERT model trains: its masked-LM head, or a classifier over the
/// pooled first token (`architectures`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BertHead {
    /// `BertForMaskedLM` (the default): a transform, a layer norm and the
    /// decoder (tied to the word embeddings unless `tie_word_embeddings` is
    /// false), over every position.
    MaskedLm,
    /// `BertForSequenceClassification`: the pooler and a classifier of `labels` classes.
    Classification {
        /// Classes (`num_labels`, or the entries of `id2label`; 2 by default).
        labels: usize,
    },
}

/// The GELU a family's MLP uses (`hidden_act`, `activation_function`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gelu {
    /// `gelu`: the exact, erf form.
    Erf,
    /// `gelu_new`, `gelu_pytorch_tanh`: the tanh approximation.
    Tanh,
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
    /// Rotary positions (the decoders of the Llama kind; `None` for GPT-2 and BERT).
    pub rope: Option<Rope>,
    /// `tie_word_embeddings`: the head is the token embedding.
    pub tie_embeddings: bool,
    /// Biases on the q, k, v (and output) projections: `attention_bias`, or
    /// Qwen2's q/k/v biases.
    pub attention_bias: AttentionBias,
    /// `mlp_bias` (Llama).
    pub mlp_bias: bool,
    /// The GELU of GPT-2's and BERT's MLPs (the decoders of the Llama kind use SiLU).
    pub gelu: Gelu,
    /// `sliding_window` when some layer attends within one: a sequence
    /// longer than it attends differently, and is refused.
    pub sliding_window: Option<usize>,
    /// `type_vocab_size` (BERT).
    pub type_vocab: usize,
    /// BERT's head.
    pub bert_head: BertHead,
    /// `pad_token_id` where the family's embedding takes it as `padding_idx`
    /// (every family but GPT-2): that row of the embedding gets no gradient.
    pub padding_idx: Option<usize>,
    /// `torch_dtype` (`dtype`): what the weights are stored in (f32 when not given).
    pub dtype: DType,
    /// Dropout probabilities above zero, by key: training in transformers
    /// applies them; the step here does not (see [`Config::unapplied`]).
    pub dropout: Vec<(String, f64)>,
    /// Keys neither read nor known to leave the computation unchanged
    /// (warned about when the config is read).
    pub unknown_keys: Vec<String>,
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
pub(crate) fn refuse(field: &str, value: impl std::fmt::Display, valid: impl Into<String>) -> Error {
    Error::invalid(
        crate::Setting::ConfigKey(shortened(field)),
        autobatch::Value::Text(shortened(&value.to_string())),
        format!("use {}", valid.into()),
    )
}

/// The largest number in `[fit, over)` that `fits`, where `fits(fit)` holds,
/// `over` is past what fits, and `fits` holds up to some number and not
/// after: bisected, one shared loop for every count that grows with it.
pub(crate) fn last_fitting(mut fit: usize, mut over: usize, fits: impl Fn(usize) -> bool) -> usize {
    while over - fit > 1 {
        let middle = fit + (over - fit) / 2;
        if fits(middle) { fit = middle } else { over = middle }
    }
    fit
}

/// The most characters of a value from a file said back in a message.
const SAID_AT_MOST: usize = 80;

/// `text` as a message says it back: whole up to [`SAID_AT_MOST`]
/// characters, else its start and how much was cut (a million-character
/// `model_type` is not one line of a terminal).
pub(crate) fn shortened(text: &str) -> String {
    let length = text.chars().count();
    if length <= SAID_AT_MOST {
        return text.to_owned();
    }
    let start: String = text.chars().take(SAID_AT_MOST).collect();
    format!("{start}… (cut: {length} characters in all)")
}

/// What a count or an id must be (`valid`), and for a number written with a
/// fraction of zero (`64.0`) that it is refused as written, and how to write
/// it: every count and id is read the same way, as JSON's whole numbers.
fn whole(valid: &str, value: &Value) -> String {
    match value.as_f64().filter(|v| v.fract() == 0.0 && *v >= 1.0 && *v < 2f64.powi(53)) {
        Some(number) if value.is_f64() => {
            format!("{valid}, written without a fraction: {number:.0}, not {value} (refused as written)")
        }
        _ => valid.to_owned(),
    }
}

/// A JSON object's fields, read with the config's own names in the errors
/// (`rope_parameters.factor` inside an object).
struct Fields<'a> {
    object: &'a serde_json::Map<String, Value>,
    prefix: &'a str,
}

impl<'a> Fields<'a> {
    fn top(object: &'a serde_json::Map<String, Value>) -> Fields<'a> {
        Fields { object, prefix: "" }
    }

    fn name(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn value(&self, name: &str) -> Option<&'a Value> {
        self.object.get(name).filter(|value| !value.is_null())
    }

    /// A whole number of at least 1 under the first of `names` present.
    fn count(&self, names: &[&str]) -> Result<Option<usize>, Error> {
        for name in names {
            if let Some(value) = self.value(name) {
                return match value.as_u64().and_then(|v| usize::try_from(v).ok()) {
                    Some(0) | None => {
                        Err(refuse(&self.name(name), value, whole("a whole number of at least 1", value)))
                    }
                    Some(count) => Ok(Some(count)),
                };
            }
        }
        Ok(None)
    }

    /// A whole number, zero allowed (a token id).
    fn id(&self, name: &str) -> Result<Option<usize>, Error> {
        self.whole_from_zero(name, "a token id")
    }

    /// A whole number from 0 that is `what` (a token id, a layer count).
    fn whole_from_zero(&self, name: &str, what: &str) -> Result<Option<usize>, Error> {
        match self.value(name) {
            None => Ok(None),
            Some(value) => match value.as_u64().and_then(|v| usize::try_from(v).ok()) {
                Some(id) => Ok(Some(id)),
                None => Err(refuse(&self.name(name), value, whole(&format!("{what}, a whole number from 0"), value))),
            },
        }
    }

    fn required(&self, names: &[&str]) -> Result<usize, Error> {
        self.count(names)?
            .ok_or_else(|| refuse(&self.name(names[0]), "missing", "a whole number of at least 1 (required)"))
    }

    fn number(&self, name: &str) -> Result<Option<f64>, Error> {
        match self.value(name) {
            None => Ok(None),
            Some(value) => match value.as_f64().filter(|v| v.is_finite() && *v > 0.0) {
                Some(number) => Ok(Some(number)),
                None => Err(refuse(&self.name(name), value, "a positive number")),
            },
        }
    }

    /// A probability in [0, 1).
    fn probability(&self, name: &str) -> Result<Option<f64>, Error> {
        match self.value(name) {
            None => Ok(None),
            Some(value) => match value.as_f64().filter(|v| (0.0..1.0).contains(v)) {
                Some(number) => Ok(Some(number)),
                None => Err(refuse(&self.name(name), value, "a probability from 0 to below 1")),
            },
        }
    }

    fn flag(&self, name: &str) -> Result<Option<bool>, Error> {
        match self.value(name) {
            None => Ok(None),
            Some(Value::Bool(flag)) => Ok(Some(*flag)),
            Some(value) => Err(refuse(&self.name(name), value, "true or false")),
        }
    }

    /// Text, or an error naming the field when it holds something else.
    fn text(&self, name: &str) -> Result<Option<&'a str>, Error> {
        match self.value(name) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(value) => Err(refuse(&self.name(name), value, "text")),
        }
    }
}

impl Config {
    /// Reads a `config.json` file: a regular file of at most
    /// [`MAX_CONFIG_BYTES`] (a named pipe, a device or a folder is refused
    /// before it is opened), UTF-8 with or without a byte-order mark.
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Config, Error> {
        let path = path.as_ref();
        let unreadable = |why: String| {
            Error::invalid(crate::Setting::ConfigFile, autobatch::Value::Text(path.display().to_string()), why)
        };
        let meta = std::fs::metadata(path).map_err(|err| unreadable(format!("name a readable config.json ({err})")))?;
        if meta.is_dir() {
            return Err(unreadable("it is a folder: name the config.json in it".to_owned()));
        }
        if !meta.is_file() {
            return Err(unreadable("it is not a regular file (a pipe or a device): name a config.json".to_owned()));
        }
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(unreadable(format!(
                "it holds {} bytes; a config.json is at most {} (4 MiB): name the model's config.json",
                meta.len(),
                MAX_CONFIG_BYTES
            )));
        }
        use std::io::Read;
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|file| file.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes))
            .map_err(|err| unreadable(format!("name a readable config.json ({err})")))?;
        if bytes.len() as u64 > MAX_CONFIG_BYTES {
            return Err(unreadable("it grew past 4 MiB while read: name the model's config.json".to_owned()));
        }
        let text =
            String::from_utf8(bytes).map_err(|_| unreadable("it is not UTF-8 text: name a config.json".into()))?;
        Config::from_json(&text)
    }

    /// Reads the text of a `config.json` (a leading byte-order mark is skipped).
    ///
    /// ```
    /// let config = autobatch_models::Config::from_json(r#"{
    ///     "model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
    ///     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2
    /// }"#)?;
    /// assert_eq!(config.head_dim, 16);
    /// assert!(autobatch_models::Config::from_json(r#"{"model_type": "t5"}"#).is_err());
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn from_json(text: &str) -> Result<Config, Error> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let value: Value =
            serde_json::from_str(text).map_err(|err| refuse("config", "not JSON", format!("a JSON object ({err})")))?;
        let Some(object) = value.as_object() else {
            return Err(refuse("config", "not an object", "a JSON object of the model's settings"));
        };
        let fields = Fields::top(object);
        let family = match fields.value("model_type") {
            None => return Err(refuse("model_type", "missing", Family::MODEL_TYPES)),
            Some(Value::String(model_type)) => match model_type.as_str() {
                "llama" => Family::Llama,
                "mistral" => Family::Mistral,
                "qwen2" => Family::Qwen2,
                "qwen3" => Family::Qwen3,
                "gpt2" => Family::Gpt2,
                "bert" => Family::Bert,
                other => return Err(refuse("model_type", other, Family::MODEL_TYPES)),
            },
            Some(other) => return Err(refuse("model_type", other, format!("one of {} as text", Family::MODEL_TYPES))),
        };
        let mut unknown_keys = Vec::new();
        let mut dropout = Vec::new();
        for (key, value) in object {
            match keys::handling(family, key) {
                Some(Handling::Read) | Some(Handling::Inert(_)) => {}
                Some(Handling::RefusedUnless(allowed)) => {
                    if !value.is_null() && !allowed.iter().any(|ok| ok.matches(value)) {
                        let valid: Vec<String> = allowed.iter().map(|ok| ok.to_string()).collect();
                        let valid = match valid.as_slice() {
                            // only its absence (or null) is computed here
                            [] => format!("no {key}, or null (what it asks is not computed here)"),
                            _ => format!("{} (anything else is not computed here)", valid.join(" or ")),
                        };
                        return Err(refuse(key, value, valid));
                    }
                }
                Some(Handling::Dropout) => {
                    if let Some(p) = fields.probability(key)?.filter(|p| *p > 0.0) {
                        dropout.push((key.clone(), p));
                    }
                }
                None => unknown_keys.push(key.clone()),
            }
        }
        let mut config = match family {
            Family::Gpt2 => Config::gpt2(&fields)?,
            Family::Bert => Config::bert(&fields)?,
            _ => Config::llama_like(family, &fields)?,
        };
        config.dropout = dropout;
        config.unknown_keys = unknown_keys;
        config.check_shape()?;
        if let (key, Some("float16")) = Config::dtype_given(&fields)? {
            log::warn!(
                "{key} float16 is trained here in bf16: the same two bytes a value, so the bytes measured and \
                 counted are float16's (candle's CPU computes no f16 matmul backward worth measuring)"
            );
        }
        if !config.unknown_keys.is_empty() {
            log::warn!(
                "config keys not read (transformers may compute another model with them): {}",
                shortened(&config.unknown_keys.iter().map(|key| shortened(key)).collect::<Vec<_>>().join(", "))
            );
        }
        Ok(config)
    }

    /// What transformers computes in training that the step here does not:
    /// the dropout the config asks for (a probe measures the step without
    /// dropout's masks), for a warning; `None` when there is nothing.
    pub fn unapplied(&self) -> Option<String> {
        if self.dropout.is_empty() {
            return None;
        }
        let listed: Vec<String> = self.dropout.iter().map(|(key, p)| format!("{key} {p}")).collect();
        Some(format!(
            "dropout is not applied here ({}): the step is measured without dropout's masks, which training in \
             transformers keeps",
            listed.join(", ")
        ))
    }

    /// The key the dtype is read from (transformers 5's `dtype`, else
    /// `torch_dtype`) and its value, if given.
    fn dtype_given<'a>(fields: &Fields<'a>) -> Result<(&'static str, Option<&'a str>), Error> {
        Ok(match fields.text("dtype")? {
            Some(dtype) => ("dtype", Some(dtype)),
            None => ("torch_dtype", fields.text("torch_dtype")?),
        })
    }

    fn dtype(fields: &Fields) -> Result<DType, Error> {
        let (key, given) = Config::dtype_given(fields)?;
        Ok(match given {
            None | Some("float32") => DType::F32,
            Some("bfloat16") => DType::BF16,
            // f16 weights are trained in bf16 here (candle's CPU has no f16 matmul backward worth measuring)
            Some("float16") => DType::BF16,
            Some(other) => return Err(refuse(key, other, "float32, bfloat16 or float16")),
        })
    }

    /// `architectures[0]`, when it is one of `accepted` (or absent).
    fn architecture<'a>(fields: &Fields<'a>, accepted: &[&str], what: &str) -> Result<Option<&'a str>, Error> {
        let Some(value) = fields.value("architectures") else { return Ok(None) };
        let first = match value.as_array().map(|list| list.as_slice()) {
            Some([]) => return Ok(None),
            Some([Value::String(first), ..]) => first.as_str(),
            _ => return Err(refuse("architectures", value, "a list of class names")),
        };
        if accepted.contains(&first) {
            Ok(Some(first))
        } else {
            Err(refuse("architectures", first, format!("{} ({what})", accepted.join(" or "))))
        }
    }

    fn llama_like(family: Family, fields: &Fields) -> Result<Config, Error> {
        let class = match family {
            Family::Llama => "Llama",
            Family::Mistral => "Mistral",
            Family::Qwen2 => "Qwen2",
            _ => "Qwen3",
        };
        let (causal, base) = (format!("{class}ForCausalLM"), format!("{class}Model"));
        Config::architecture(fields, &[causal.as_str(), base.as_str()], "a language model trained on its next tokens")?;
        let hidden = fields.required(&["hidden_size"])?;
        let heads = fields.required(&["num_attention_heads"])?;
        let layers = fields.required(&["num_hidden_layers"])?;
        let kv_heads = fields.count(&["num_key_value_heads"])?.unwrap_or(heads);
        let head_dim = match fields.count(&["head_dim"])? {
            Some(head_dim) => head_dim,
            None if hidden.is_multiple_of(heads) => hidden / heads,
            None => return Err(refuse("num_attention_heads", heads, format!("a divisor of hidden_size {hidden}"))),
        };
        let act = fields.text("hidden_act")?.unwrap_or("silu");
        if act != "silu" {
            return Err(refuse("hidden_act", act, "silu (SwiGLU)"));
        }
        // transformers: Qwen2 has q/k/v biases whatever the config says, Mistral none
        let attention_bias = match family {
            Family::Qwen2 => AttentionBias::Qkv,
            Family::Mistral => AttentionBias::None,
            _ if fields.flag("attention_bias")? == Some(true) => AttentionBias::All,
            _ => AttentionBias::None,
        };
        let max_positions = fields.count(&["max_position_embeddings"])?.unwrap_or(2048);
        Ok(Config {
            family,
            vocab: fields.required(&["vocab_size"])?,
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            intermediate: fields.required(&["intermediate_size"])?,
            max_positions,
            norm_eps: fields.number("rms_norm_eps")?.unwrap_or(1e-6),
            rope: Some(Config::rope(fields, max_positions)?),
            tie_embeddings: fields.flag("tie_word_embeddings")?.unwrap_or(false),
            attention_bias,
            mlp_bias: family == Family::Llama && fields.flag("mlp_bias")? == Some(true),
            gelu: Gelu::Tanh,
            sliding_window: Config::sliding_window(family, fields, layers)?,
            type_vocab: 0,
            bert_head: BertHead::MaskedLm,
            padding_idx: fields.id("pad_token_id")?,
            dtype: Config::dtype(fields)?,
            dropout: Vec::new(),
            unknown_keys: Vec::new(),
        })
    }

    /// The window of the layers that attend within one, if any: Mistral's
    /// every layer (`sliding_window`); Qwen's `layer_types` (transformers 5)
    /// or the layers from `max_window_layers` on with `use_sliding_window`
    /// (transformers 4).
    fn sliding_window(family: Family, fields: &Fields, layers: usize) -> Result<Option<usize>, Error> {
        let window = fields.count(&["sliding_window"])?;
        if family == Family::Mistral {
            // transformers' default window when the key is absent; null: none
            return Ok(if fields.object.contains_key("sliding_window") { window } else { Some(4096) });
        }
        let layer_types = match fields.value("layer_types") {
            None => None,
            Some(Value::Array(types)) => {
                let mut sliding = false;
                for kind in types {
                    match kind.as_str() {
                        Some("full_attention") => {}
                        Some("sliding_attention") => sliding = true,
                        _ => {
                            return Err(refuse(
                                "layer_types",
                                kind,
                                "full_attention or sliding_attention for each layer",
                            ));
                        }
                    }
                }
                if types.len() != layers {
                    return Err(refuse(
                        "layer_types",
                        format!("a list of {}", types.len()),
                        format!("one entry for each of num_hidden_layers {layers}"),
                    ));
                }
                Some(sliding)
            }
            Some(other) => return Err(refuse("layer_types", other, "a list of attention kinds, one per layer")),
        };
        Ok(match family {
            Family::Qwen2 | Family::Qwen3 => {
                // transformers drops the window unless use_sliding_window
                let use_window = fields.flag("use_sliding_window")?.unwrap_or(false);
                let from_layer = fields.whole_from_zero("max_window_layers", "a number of layers")?.unwrap_or(28);
                let sliding = layer_types.unwrap_or(from_layer < layers);
                window.filter(|_| use_window && sliding)
            }
            _ if layer_types == Some(true) => {
                return Err(refuse("layer_types", "sliding_attention", "full_attention for every layer"));
            }
            _ => None,
        })
    }

    /// Rotary positions from `rope_parameters` (transformers 5) or
    /// `rope_theta` and `rope_scaling` (transformers 4), as transformers
    /// reads them: `rope_scaling` takes precedence where both are given, a
    /// `rope_theta` inside the object over one beside it.
    fn rope(fields: &Fields, max_positions: usize) -> Result<Rope, Error> {
        let top_theta = fields.number("rope_theta")?;
        let (key, object) = match (fields.value("rope_scaling"), fields.value("rope_parameters")) {
            (Some(scaling), _) => ("rope_scaling", scaling),
            (None, Some(parameters)) => ("rope_parameters", parameters),
            (None, None) => return Ok(Rope { theta: top_theta.unwrap_or(10_000.0), scaling: RopeScaling::None }),
        };
        let Some(object) = object.as_object() else {
            return Err(refuse(key, object, "an object with a rope_type, or null"));
        };
        let prefix = format!("{key}.");
        let scaling = Fields { object, prefix: &prefix };
        let kind = match scaling.text("rope_type")? {
            Some(kind) => kind,
            None => scaling.text("type")?.unwrap_or("default"),
        };
        let theta = scaling.number("rope_theta")?.or(top_theta).unwrap_or(10_000.0);
        Config::check_rope_keys(&scaling, key, kind)?;
        let scaling_kind = match kind {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear { factor: Config::rope_factor(&scaling, kind)? },
            "dynamic" => RopeScaling::Dynamic { factor: Config::rope_factor(&scaling, kind)? },
            "llama3" => RopeScaling::Llama3(Config::llama3_rope(&scaling, kind, max_positions)?),
            _ => RopeScaling::Yarn(Config::yarn_rope(&scaling, kind, max_positions)?),
        };
        Ok(Rope { theta, scaling: scaling_kind })
    }

    /// Every key of a RoPE object is one its `rope_type` reads (a
    /// `partial_rotary_factor` of 1 aside): a key this crate would not apply
    /// is refused, not ignored.
    fn check_rope_keys(scaling: &Fields, key: &str, kind: &str) -> Result<(), Error> {
        let known: &[&str] = match kind {
            "default" => &[],
            "linear" | "dynamic" => &["factor"],
            "llama3" => &["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"],
            "yarn" => &[
                "factor",
                "original_max_position_embeddings",
                "attention_factor",
                "beta_fast",
                "beta_slow",
                "mscale",
                "mscale_all_dim",
                "truncate",
            ],
            other => {
                return Err(refuse(
                    &format!("{key}.rope_type"),
                    other,
                    "default, linear, dynamic, llama3 or yarn (the kinds these families use)",
                ));
            }
        };
        let object = scaling.object;
        for name in object.keys() {
            if let "rope_type" | "type" | "rope_theta" = name.as_str() {
                continue;
            }
            if name == "partial_rotary_factor" {
                if scaling.value(name).and_then(Value::as_f64) == Some(1.0) {
                    continue;
                }
                return Err(refuse(&scaling.name(name), &object[name], "1 (every dimension of a head rotates here)"));
            }
            if !known.contains(&name.as_str()) {
                return Err(refuse(
                    &scaling.name(name),
                    &object[name],
                    format!("only the keys rope_type {kind} reads: rope_type, rope_theta{}", {
                        known.iter().map(|k| format!(", {k}")).collect::<String>()
                    }),
                ));
            }
        }
        Ok(())
    }

    /// A scaled RoPE's `factor`: at least 1, and needed.
    fn rope_factor(scaling: &Fields, kind: &str) -> Result<f64, Error> {
        match scaling.number("factor")? {
            Some(factor) if factor >= 1.0 => Ok(factor),
            Some(factor) => Err(refuse(&scaling.name("factor"), factor, "a factor of at least 1")),
            None => Err(refuse(&scaling.name("factor"), "missing", format!("a factor for rope_type {kind}"))),
        }
    }

    /// A scaled RoPE's pre-training length: transformers takes the positions
    /// when it is not given.
    fn rope_original(scaling: &Fields, max_positions: usize) -> Result<usize, Error> {
        Ok(scaling.count(&["original_max_position_embeddings"])?.unwrap_or(max_positions))
    }

    /// `rope_type: llama3`: its two frequency factors, the high above the low.
    fn llama3_rope(scaling: &Fields, kind: &str, max_positions: usize) -> Result<Llama3Rope, Error> {
        let required = |name: &str| -> Result<f64, Error> {
            scaling
                .number(name)?
                .ok_or_else(|| refuse(&scaling.name(name), "missing", "a positive number (llama3 needs it)"))
        };
        let (low, high) = (required("low_freq_factor")?, required("high_freq_factor")?);
        if high <= low {
            return Err(refuse(
                &scaling.name("high_freq_factor"),
                high,
                format!("a number above low_freq_factor {low}"),
            ));
        }
        Ok(Llama3Rope {
            factor: Config::rope_factor(scaling, kind)?,
            low_freq_factor: low,
            high_freq_factor: high,
            original_max_position_embeddings: Config::rope_original(scaling, max_positions)?,
        })
    }

    /// `rope_type: yarn`: its attention factor as transformers computes it
    /// when not given (from `mscale` and `mscale_all_dim`, else the factor).
    fn yarn_rope(scaling: &Fields, kind: &str, max_positions: usize) -> Result<YarnRope, Error> {
        let factor = Config::rope_factor(scaling, kind)?;
        let mscale = |name: &str| scaling.number(name);
        let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
        let attention_factor = match (scaling.number("attention_factor")?, mscale("mscale")?, mscale("mscale_all_dim")?)
        {
            (Some(given), _, _) => given,
            (None, Some(m), Some(all)) => get_mscale(factor, m) / get_mscale(factor, all),
            (None, _, _) => get_mscale(factor, 1.0),
        };
        Ok(YarnRope {
            factor,
            original_max_position_embeddings: Config::rope_original(scaling, max_positions)?,
            attention_factor,
            beta_fast: scaling.number("beta_fast")?.unwrap_or(32.0),
            beta_slow: scaling.number("beta_slow")?.unwrap_or(1.0),
            truncate: scaling.flag("truncate")?.unwrap_or(true),
        })
    }

    /// GPT-2's and BERT's GELU, by its transformers name.
    fn gelu(key: &str, name: &str) -> Result<Gelu, Error> {
        match name {
            "gelu" => Ok(Gelu::Erf),
            "gelu_new" | "gelu_pytorch_tanh" => Ok(Gelu::Tanh),
            other => Err(refuse(key, other, "gelu, gelu_new or gelu_pytorch_tanh")),
        }
    }

    fn gpt2(fields: &Fields) -> Result<Config, Error> {
        Config::architecture(fields, &["GPT2LMHeadModel", "GPT2Model"], "a language model trained on its next tokens")?;
        let hidden = fields.required(&["n_embd", "hidden_size"])?;
        let heads = fields.required(&["n_head", "num_attention_heads"])?;
        if !hidden.is_multiple_of(heads) {
            return Err(refuse("n_head", heads, format!("a divisor of n_embd {hidden}")));
        }
        let gelu = Config::gelu("activation_function", fields.text("activation_function")?.unwrap_or("gelu_new"))?;
        let intermediate = match fields.count(&["n_inner"])? {
            Some(inner) => inner,
            None => hidden
                .checked_mul(4)
                .ok_or_else(|| refuse("n_embd", hidden, "a width whose MLP (4 × n_embd) is countable"))?,
        };
        Ok(Config {
            family: Family::Gpt2,
            vocab: fields.required(&["vocab_size"])?,
            hidden,
            layers: fields.required(&["n_layer", "num_hidden_layers"])?,
            heads,
            kv_heads: heads,
            head_dim: hidden / heads,
            intermediate,
            max_positions: fields.count(&["n_positions", "max_position_embeddings"])?.unwrap_or(1024),
            norm_eps: fields.number("layer_norm_epsilon")?.unwrap_or(1e-5),
            rope: None,
            tie_embeddings: fields.flag("tie_word_embeddings")?.unwrap_or(true),
            attention_bias: AttentionBias::All,
            mlp_bias: true,
            gelu,
            sliding_window: None,
            type_vocab: 0,
            bert_head: BertHead::MaskedLm,
            // GPT-2's embedding has no padding_idx
            padding_idx: None,
            dtype: Config::dtype(fields)?,
            dropout: Vec::new(),
            unknown_keys: Vec::new(),
        })
    }

    fn bert(fields: &Fields) -> Result<Config, Error> {
        let hidden = fields.required(&["hidden_size"])?;
        let heads = fields.required(&["num_attention_heads"])?;
        if !hidden.is_multiple_of(heads) {
            return Err(refuse("num_attention_heads", heads, format!("a divisor of hidden_size {hidden}")));
        }
        let gelu = Config::gelu("hidden_act", fields.text("hidden_act")?.unwrap_or("gelu"))?;
        let architecture = Config::architecture(
            fields,
            &["BertForMaskedLM", "BertForSequenceClassification", "BertForPreTraining", "BertModel"],
            "a head to train: the masked-LM head, or a classifier",
        )?;
        let bert_head = match architecture.unwrap_or("BertForMaskedLM") {
            "BertForSequenceClassification" => {
                let from_labels = fields.value("id2label").and_then(Value::as_object).map(|labels| labels.len());
                let labels = fields.count(&["num_labels"])?.or(from_labels).unwrap_or(2);
                if labels < 2 {
                    return Err(refuse(
                        "num_labels",
                        labels,
                        "at least 2 classes (one is regression, not computed here)",
                    ));
                }
                BertHead::Classification { labels }
            }
            // a pre-training or bare checkpoint is fine-tuned with the masked-LM head
            _ => BertHead::MaskedLm,
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
            rope: None,
            tie_embeddings: fields.flag("tie_word_embeddings")?.unwrap_or(true),
            attention_bias: AttentionBias::All,
            mlp_bias: true,
            gelu,
            sliding_window: None,
            type_vocab: fields.count(&["type_vocab_size"])?.unwrap_or(2),
            bert_head,
            padding_idx: Some(fields.id("pad_token_id")?.unwrap_or(0)),
            dtype: Config::dtype(fields)?,
            dropout: Vec::new(),
            unknown_keys: Vec::new(),
        })
    }

    /// The shapes the forward pass needs to agree, and every size the
    /// model's tensors are made of countable: the parameters, and their
    /// bytes at 16 per parameter (weights, gradients and two f32 moments),
    /// fit in 64 bits, checked before anything is allocated.
    fn check_shape(&self) -> Result<(), Error> {
        if self.kv_heads > self.heads || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(refuse(
                "num_key_value_heads",
                self.kv_heads,
                format!("a divisor of num_attention_heads {}", self.heads),
            ));
        }
        if self.family.is_llama_like() && !self.head_dim.is_multiple_of(2) {
            return Err(refuse("head_dim", self.head_dim, "an even number (rotary positions rotate pairs)"));
        }
        if let Some(padding) = self.padding_idx.filter(|&id| id >= self.vocab) {
            return Err(refuse("pad_token_id", padding, format!("an id below vocab_size {}", self.vocab)));
        }
        self.checked_parameter_count()?;
        Ok(())
    }

    /// The parameter count with every product checked: where it (or 16 bytes
    /// for each parameter) passes 64 bits, an error naming the config field
    /// at fault (the largest whose value alone makes it so), its value and
    /// the most it may be. The config is counted as it is written, before any
    /// copy with other layers ([`with_layers`](Self::with_layers)).
    pub fn checked_parameter_count(&self) -> Result<u64, Error> {
        let countable =
            |config: &Config| super::count_parameters(config).filter(|count| count.checked_mul(16).is_some());
        if let Some(count) = countable(self) {
            return Ok(count);
        }
        let gpt2 = self.family == Family::Gpt2;
        type Setter = fn(&mut Config, usize);
        let fields: [(&str, usize, Setter); 9] = [
            ("vocab_size", self.vocab, |c, v| c.vocab = v),
            (if gpt2 { "n_embd" } else { "hidden_size" }, self.hidden, |c, v| c.hidden = v),
            (if gpt2 { "n_layer" } else { "num_hidden_layers" }, self.layers, |c, v| c.layers = v),
            (if gpt2 { "n_head" } else { "num_attention_heads" }, self.heads, |c, v| c.heads = v),
            ("num_key_value_heads", self.kv_heads, |c, v| c.kv_heads = v),
            ("head_dim", self.head_dim, |c, v| c.head_dim = v),
            (if gpt2 { "n_inner" } else { "intermediate_size" }, self.intermediate, |c, v| c.intermediate = v),
            (if gpt2 { "n_positions" } else { "max_position_embeddings" }, self.max_positions, |c, v| {
                c.max_positions = v
            }),
            ("type_vocab_size", self.type_vocab, |c, v| c.type_vocab = v),
        ];
        let with = |set: fn(&mut Config, usize), value: usize| {
            let mut changed = self.clone();
            set(&mut changed, value);
            countable(&changed).is_some()
        };
        // the field at fault: one that, at 1, leaves the rest countable
        let fault =
            fields.iter().filter(|(_, value, set)| *value > 1 && with(*set, 1)).max_by_key(|(_, value, _)| *value);
        match fault {
            Some(&(field, value, set)) => {
                let fit = last_fitting(1, value, |middle| with(set, middle));
                Err(refuse(
                    field,
                    value,
                    format!(
                        "at most {fit}: past it the {} config's parameters, 16 bytes each in training, pass what 64 \
                         bits count (a config is counted as it is written, before any copy with other layers)",
                        self.family.model_type()
                    ),
                ))
            }
            None => Err(Error::byte_overflow(format!(
                "the parameters of a {} config of vocab_size {}, hidden_size {}, {} layers, intermediate_size {} \
                 and {} positions",
                self.family.model_type(),
                self.vocab,
                self.hidden,
                self.layers,
                self.intermediate,
                self.max_positions
            ))),
        }
    }

    /// The same model with `layers` layers: a shallower (or deeper) copy to
    /// probe, every layer alike.
    pub fn with_layers(mut self, layers: usize) -> Result<Config, Error> {
        if layers == 0 {
            return Err(refuse("num_hidden_layers", 0, "at least 1"));
        }
        self.layers = layers;
        self.checked_parameter_count()?;
        Ok(self)
    }

    /// A sequence length this model can step at: at most its positions and
    /// within its sliding window.
    pub fn check_seq_len(&self, seq_len: usize) -> Result<(), Error> {
        if seq_len == 0 || seq_len > self.max_positions {
            return Err(Error::invalid(
                crate::Setting::SeqLen,
                autobatch::Value::Count(seq_len),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_field(json: &str) -> (String, String) {
        match Config::from_json(json) {
            Err(err @ Error::InvalidSetting { .. }) => {
                let Error::InvalidSetting { setting: crate::Setting::ConfigKey(field), .. } = &err else {
                    panic!("{err:?}")
                };
                (field.clone(), err.to_string())
            }
            other => panic!("{json}: {other:?}"),
        }
    }

    fn llama(extra: &str) -> String {
        format!(
            r#"{{"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
               "num_hidden_layers": 2, "num_attention_heads": 4 {extra}}}"#
        )
    }

    /// A config whose parameters pass 64 bits names the field at fault, its
    /// value and the most it may be (issue 85: "the parameters of a llama
    /// config of vocab_size 256, … is past what 64 bits count" named none);
    /// the rule is the config as written, whatever copy is made of it later.
    #[test]
    fn a_count_past_64_bits_names_the_field_at_fault_and_the_most_it_may_be() {
        {
            let (extra, field) = (r#", "head_dim": 4611686018427387904"#, "head_dim");
            let json = llama(extra);
            let (got, said) = refused_field(&json);
            assert_eq!(got, field, "{said}");
            assert!(said.contains("use at most"), "{said}");
            let most: u64 = said.split("use at most ").nth(1).unwrap().split(':').next().unwrap().parse().unwrap();
            let at_most = json.replace("4611686018427387904", &most.to_string());
            // countable there (another rule may still refuse it: head_dim is even)
            let counted = Config::from_json(&at_most).map_err(|err| err.to_string());
            assert!(
                counted.as_ref().err().is_none_or(|err| !err.contains("64 bits")),
                "{field} at {most}: {counted:?}"
            );
            let past = json.replace("4611686018427387904", &(most + 1).to_string());
            assert_eq!(refused_field(&past).0, field, "{field} at {} is not", most + 1);
        }
        let layers = llama("").replace(r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 9223372036854775808"#);
        let (field, said) = refused_field(&layers);
        assert_eq!(field, "num_hidden_layers");
        assert!(said.contains("before any copy with other layers"), "the rule, said: {said}");
        // a countable config of a billion layers is read; a copy of one layer is made of it
        let billion = llama("").replace(r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 1000000000"#);
        assert_eq!(Config::from_json(&billion).unwrap().with_layers(1).unwrap().layers, 1);
    }

    /// A value said back is cut to a readable length, and says so (issue 85:
    /// a million-character `model_type` was echoed whole).
    #[test]
    fn a_long_value_is_said_back_cut() {
        let long = "x".repeat(1_000_000);
        let (field, said) = refused_field(&format!(r#"{{"model_type": "{long}", "vocab_size": 8}}"#));
        assert_eq!(field, "model_type");
        assert!(said.len() < 1000 && said.contains("(cut: 1000000 characters in all)"), "{}", said.len());
        let key = "k".repeat(10_000);
        let (field, said) = refused_field(&llama(&format!(r#", "hidden_act": "{key}""#)));
        assert_eq!(field, "hidden_act");
        assert!(said.len() < 1000, "{}", said.len());
    }

    /// `max_window_layers` is a number of layers, said so (issue 85: "use a
    /// token id").
    #[test]
    fn max_window_layers_is_refused_as_a_number_of_layers() {
        let json = r#"{"model_type": "qwen2", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "use_sliding_window": true, "sliding_window": 64,
            "max_window_layers": -1}"#;
        let (field, said) = refused_field(json);
        assert_eq!(field, "max_window_layers");
        assert!(said.contains("a number of layers, a whole number from 0") && !said.contains("token id"), "{said}");
    }
}
