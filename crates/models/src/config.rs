//! A Hugging Face `config.json`, read into the shape of one of the supported
//! families and checked. Every key transformers 4 or 5 writes for a family is
//! read, or known not to change the computation ([`keys`]), or refused by
//! name with its value; a key of neither kind is named in a warning, once.

use candle_core::DType;
use serde_json::Value;

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

/// LongRoPE (`rope_type` `longrope`, Phi-3's): each frequency divided by
/// its own factor, the short ones up to `original_max_position_embeddings`
/// tokens and the long ones past them (by the longest position a forward
/// pass sees, as transformers chooses), cos and sin scaled by
/// `attention_factor`.
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    /// `short_factor`: one per rotated pair of a head's dimensions.
    pub short_factor: Vec<f64>,
    /// `long_factor`.
    pub long_factor: Vec<f64>,
    /// `original_max_position_embeddings`: past it, the long factors.
    pub original_max_position_embeddings: usize,
    /// `attention_factor`, or `√(1 + ln f / ln original)` of `f` =
    /// `factor` (the positions over the original ones when not given).
    pub attention_factor: f64,
}

/// How rotary positions are scaled (`rope_parameters` in transformers 5,
/// `rope_scaling` in transformers 4).
#[derive(Clone, Debug, PartialEq)]
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
    /// `longrope` (Phi-3's `su` and `yarn` too).
    LongRope(LongRope),
}

/// Rotary positions: the base and its scaling.
#[derive(Clone, Debug, PartialEq)]
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
    /// The sliding layers' rotary positions where they differ from the
    /// others' (Gemma 3's `rope_local_base_freq`, `sliding_attention`).
    pub local_rope: Option<Rope>,
    /// The share of a head's dimensions that rotate, the first ones
    /// (`partial_rotary_factor`, Phi's; 1 elsewhere).
    pub partial_rotary_factor: f64,
    /// q, k and v in one projection (`qkv_proj`), the MLP's gate and up in
    /// another (`gate_up_proj`): Phi-3's.
    pub fused_projections: bool,
    /// `tie_word_embeddings`: the head is the token embedding.
    pub tie_embeddings: bool,
    /// Biases on the q, k, v (and output) projections: `attention_bias`, or
    /// Qwen2's q/k/v biases.
    pub attention_bias: AttentionBias,
    /// `mlp_bias` (Llama).
    pub mlp_bias: bool,
    /// Norms on the queries and keys (Qwen3, OLMo 2).
    pub qk_norm: QkNorm,
    /// Where a decoder block's norms sit.
    pub norms: BlockNorms,
    /// RMS norms scale by `1 + weight`, their weights stored as the offset
    /// (Gemma).
    pub norm_plus_one: bool,
    /// The token embeddings multiplied by this, rounded to the model's dtype
    /// (Gemma: √hidden).
    pub embedding_scale: Option<f64>,
    /// The activation of a decoder's gated MLP: SiLU (SwiGLU), or GELU's
    /// tanh form (GeGLU, Gemma's `gelu_pytorch_tanh`).
    pub mlp_activation: crate::ops::Activation,
    /// What the attention scores `q·kᵀ` are multiplied by where not `1/√d`
    /// (Gemma: `query_pre_attn_scalar^-½`).
    pub attention_scale: Option<f64>,
    /// The scores soft-capped, `cap · tanh(s / cap)` (Gemma 2's
    /// `attn_logit_softcapping`).
    pub attention_softcap: Option<f64>,
    /// The logits soft-capped (Gemma 2's `final_logit_softcapping`), inside
    /// the chunked loss too.
    pub final_softcap: Option<f64>,
    /// The GELU of GPT-2's and BERT's MLPs (the decoders of the Llama kind use SiLU).
    pub gelu: Gelu,
    /// `sliding_window` when some layer attends within one: each of its
    /// queries sees the last `sliding_window` positions up to its own.
    pub sliding_window: Option<usize>,
    /// Which layers attend within `sliding_window`, by index, read
    /// cyclically past the list's end (a deeper copy repeats the pattern):
    /// `[true]` where every layer does, empty where none does.
    pub sliding_layers: Vec<bool>,
    /// A mixture of experts in place of the MLP (Mixtral, Qwen3-MoE), on
    /// the layers [`Experts::at`] names; `None`: a dense MLP everywhere.
    pub experts: Option<Experts>,
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

/// A sparse MLP: a router choosing `per_token` of `count` gated experts
/// for each token, their outputs summed by the router's weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Experts {
    /// `num_local_experts` (`num_experts`).
    pub count: usize,
    /// `num_experts_per_tok`: the experts each token is sent to.
    pub per_token: usize,
    /// Each expert's intermediate size (Qwen3-MoE's `moe_intermediate_size`;
    /// Mixtral's `intermediate_size`).
    pub intermediate: usize,
    /// The chosen experts' probabilities renormalized to sum to 1
    /// (Mixtral always; Qwen3-MoE's `norm_topk_prob`).
    pub normalized: bool,
    /// Every `sparse_step`-th layer is sparse (Qwen's `decoder_sparse_step`; 1: all).
    pub sparse_step: usize,
    /// Layers with a dense MLP of `intermediate_size` whatever the step
    /// (Qwen's `mlp_only_layers`).
    pub dense_layers: Vec<usize>,
    /// How the checkpoint names the router and the experts.
    pub names: ExpertNames,
    /// The router's load-balancing loss added to the loss at this weight
    /// (`router_aux_loss_coef`, where `output_router_logits` asks for it).
    pub aux_loss: Option<f64>,
    /// A shared expert every token goes through, of this intermediate size,
    /// gated by a sigmoid of the input (Qwen2-MoE's
    /// `shared_expert_intermediate_size`, `mlp.shared_expert`,
    /// `mlp.shared_expert_gate`).
    pub shared: Option<usize>,
}

/// How a checkpoint names a sparse MLP's tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertNames {
    /// `block_sparse_moe.gate`, `block_sparse_moe.experts.N.w1` (gate),
    /// `w3` (up), `w2` (down): Mixtral's.
    Mixtral,
    /// `mlp.gate`, `mlp.experts.N.gate_proj`, `up_proj`, `down_proj`: Qwen's.
    Qwen,
}

impl ExpertNames {
    /// The sparse MLP's module within a layer.
    pub fn module(self) -> &'static str {
        match self {
            ExpertNames::Mixtral => "block_sparse_moe",
            ExpertNames::Qwen => "mlp",
        }
    }

    /// An expert's gate, up and down projections.
    pub fn projections(self) -> [&'static str; 3] {
        match self {
            ExpertNames::Mixtral => ["w1", "w3", "w2"],
            ExpertNames::Qwen => ["gate_proj", "up_proj", "down_proj"],
        }
    }
}

impl Experts {
    /// Whether layer `layer` is sparse.
    pub fn at(&self, layer: usize) -> bool {
        !self.dense_layers.contains(&layer) && (layer + 1).is_multiple_of(self.sparse_step)
    }
}

/// RMS norms on the queries and keys, before rotary positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    /// None (Llama, Mistral, Qwen2, GPT-2, BERT).
    None,
    /// One over each head's `head_dim` (Qwen3's `q_norm`, `k_norm`).
    PerHead,
    /// One over the whole projection, before it is split into heads (OLMo 2).
    Projection,
}

/// Where a decoder block's RMS norms sit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockNorms {
    /// Before attention and before the MLP (`input_layernorm`,
    /// `post_attention_layernorm`): Llama and most decoders; GPT-2 and BERT
    /// (whose own norms their families place).
    Pre,
    /// On attention's and the MLP's outputs before each joins the stream
    /// (`post_attention_layernorm`, `post_feedforward_layernorm`): OLMo 2.
    Post,
    /// Both: before and after attention and the MLP (`input_layernorm`,
    /// `post_attention_layernorm`, `pre_feedforward_layernorm`,
    /// `post_feedforward_layernorm`): Gemma 2 and 3.
    Sandwich,
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
pub(crate) struct Fields<'a> {
    pub(crate) object: &'a serde_json::Map<String, Value>,
    pub(crate) prefix: &'a str,
}

impl<'a> Fields<'a> {
    pub(crate) fn top(object: &'a serde_json::Map<String, Value>) -> Fields<'a> {
        Fields { object, prefix: "" }
    }

    pub(crate) fn name(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    pub(crate) fn value(&self, name: &str) -> Option<&'a Value> {
        self.object.get(name).filter(|value| !value.is_null())
    }

    /// A whole number of at least 1 under the first of `names` present.
    pub(crate) fn count(&self, names: &[&str]) -> Result<Option<usize>, Error> {
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
    pub(crate) fn id(&self, name: &str) -> Result<Option<usize>, Error> {
        self.whole_from_zero(name, "a token id")
    }

    /// A whole number from 0 that is `what` (a token id, a layer count).
    pub(crate) fn whole_from_zero(&self, name: &str, what: &str) -> Result<Option<usize>, Error> {
        match self.value(name) {
            None => Ok(None),
            Some(value) => match value.as_u64().and_then(|v| usize::try_from(v).ok()) {
                Some(id) => Ok(Some(id)),
                None => Err(refuse(&self.name(name), value, whole(&format!("{what}, a whole number from 0"), value))),
            },
        }
    }

    pub(crate) fn required(&self, names: &[&str]) -> Result<usize, Error> {
        self.count(names)?
            .ok_or_else(|| refuse(&self.name(names[0]), "missing", "a whole number of at least 1 (required)"))
    }

    pub(crate) fn number(&self, name: &str) -> Result<Option<f64>, Error> {
        match self.value(name) {
            None => Ok(None),
            Some(value) => match value.as_f64().filter(|v| v.is_finite() && *v > 0.0) {
                Some(number) => Ok(Some(number)),
                None => Err(refuse(&self.name(name), value, "a positive number")),
            },
        }
    }

    /// A probability in [0, 1).
    pub(crate) fn probability(&self, name: &str) -> Result<Option<f64>, Error> {
        match self.value(name) {
            None => Ok(None),
            Some(value) => match value.as_f64().filter(|v| (0.0..1.0).contains(v)) {
                Some(number) => Ok(Some(number)),
                None => Err(refuse(&self.name(name), value, "a probability from 0 to below 1")),
            },
        }
    }

    pub(crate) fn flag(&self, name: &str) -> Result<Option<bool>, Error> {
        match self.value(name) {
            None => Ok(None),
            Some(Value::Bool(flag)) => Ok(Some(*flag)),
            Some(value) => Err(refuse(&self.name(name), value, "true or false")),
        }
    }

    /// Text, or an error naming the field when it holds something else.
    pub(crate) fn text(&self, name: &str) -> Result<Option<&'a str>, Error> {
        match self.value(name) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(value) => Err(refuse(&self.name(name), value, "text")),
        }
    }
}

impl Config {
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
    pub(crate) fn dtype_given<'a>(fields: &Fields<'a>) -> Result<(&'static str, Option<&'a str>), Error> {
        Ok(match fields.text("dtype")? {
            Some(dtype) => ("dtype", Some(dtype)),
            None => ("torch_dtype", fields.text("torch_dtype")?),
        })
    }

    pub(crate) fn dtype(fields: &Fields) -> Result<DType, Error> {
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
    pub(crate) fn architecture<'a>(
        fields: &Fields<'a>,
        accepted: &[&str],
        what: &str,
    ) -> Result<Option<&'a str>, Error> {
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

    /// Rotary positions from `rope_parameters` (transformers 5) or
    /// `rope_theta` and `rope_scaling` (transformers 4), as transformers
    /// reads them: `rope_scaling` takes precedence where both are given, a
    /// `rope_theta` inside the object over one beside it.
    pub(crate) fn rope(fields: &Fields, max_positions: usize) -> Result<Rope, Error> {
        let top_theta = fields.number("rope_theta")?;
        let (key, object) = match (fields.value("rope_scaling"), fields.value("rope_parameters")) {
            (Some(scaling), _) => ("rope_scaling", scaling),
            (None, Some(parameters)) => ("rope_parameters", parameters),
            (None, None) => return Ok(Rope { theta: top_theta.unwrap_or(10_000.0), scaling: RopeScaling::None }),
        };
        Config::rope_of(key, object, top_theta, max_positions)
    }

    /// Rotary positions from the RoPE object `object` under `key` (its
    /// `rope_type` and what that type reads), `top_theta` where it has no
    /// `rope_theta` of its own.
    pub(crate) fn rope_of(
        key: &str,
        object: &Value,
        top_theta: Option<f64>,
        max_positions: usize,
    ) -> Result<Rope, Error> {
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
    pub(crate) fn rope_factor(scaling: &Fields, kind: &str) -> Result<f64, Error> {
        match scaling.number("factor")? {
            Some(factor) if factor >= 1.0 => Ok(factor),
            Some(factor) => Err(refuse(&scaling.name("factor"), factor, "a factor of at least 1")),
            None => Err(refuse(&scaling.name("factor"), "missing", format!("a factor for rope_type {kind}"))),
        }
    }

    /// A scaled RoPE's pre-training length: transformers takes the positions
    /// when it is not given.
    pub(crate) fn rope_original(scaling: &Fields, max_positions: usize) -> Result<usize, Error> {
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
    pub(crate) fn gelu(key: &str, name: &str) -> Result<Gelu, Error> {
        match name {
            "gelu" => Ok(Gelu::Erf),
            "gelu_new" | "gelu_pytorch_tanh" => Ok(Gelu::Tanh),
            other => Err(refuse(key, other, "gelu, gelu_new or gelu_pytorch_tanh")),
        }
    }

    /// `layer_types` (transformers 5): one attention kind per layer, whether
    /// each attends within a sliding window; `None` when not given.
    pub(crate) fn layer_types(fields: &Fields, layers: usize) -> Result<Option<Vec<bool>>, Error> {
        match fields.value("layer_types") {
            None => Ok(None),
            Some(Value::Array(types)) => {
                let mut sliding = Vec::with_capacity(types.len());
                for kind in types {
                    match kind.as_str() {
                        Some("full_attention") => sliding.push(false),
                        Some("sliding_attention") => sliding.push(true),
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
                Ok(Some(sliding))
            }
            Some(other) => Err(refuse("layer_types", other, "a list of attention kinds, one per layer")),
        }
    }

    /// The dimensions of a head that rotate: the first
    /// `head_dim × partial_rotary_factor` (rounded down, as transformers does).
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim as f64 * self.partial_rotary_factor) as usize
    }

    /// The experts of layer `layer`, if it is sparse.
    pub fn experts_at(&self, layer: usize) -> Option<&Experts> {
        self.experts.as_ref().filter(|experts| experts.at(layer))
    }

    /// The window layer `layer` attends within, if it slides.
    pub fn window_of(&self, layer: usize) -> Option<usize> {
        let slides = match self.sliding_layers.as_slice() {
            [] => false,
            pattern => pattern[layer % pattern.len()],
        };
        self.sliding_window.filter(|_| slides)
    }

    /// A sequence length this model can step at: from 1 to its positions
    /// (a sliding window is computed: each query attends within it).
    pub fn check_seq_len(&self, seq_len: usize) -> Result<(), Error> {
        if seq_len == 0 || seq_len > self.max_positions {
            return Err(Error::invalid(
                crate::Setting::SeqLen,
                autobatch::Value::Count(seq_len),
                format!("it must be from 1 to the config's max_position_embeddings, {}", self.max_positions),
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
