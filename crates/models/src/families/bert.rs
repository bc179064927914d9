//! BERT (`bert`): word, position and token-type embeddings, post-norm encoder
//! layers with biases everywhere, and the head training uses: the masked-LM
//! head (its decoder tied to the word embeddings) or the pooler and a
//! classifier. Tensor names are the checkpoint's
//! (`bert.encoder.layer.0.attention.self.query.weight`).

use candle_core::{D, Module, Result, Tensor};

use super::{Architecture, Network};
use crate::Error;
use crate::config::{AttentionBias, BertHead, BlockNorms, Config, Fields, Gelu, QkNorm, refuse};
use crate::family::Family;
use crate::keys::{Allowed, Handling};
use crate::layers::{Forms, Layout, Norm, Proj, Scores, attention, embed, gelu, split_heads};
use crate::lora::Lora;
use crate::per_token::{PerToken, Widths};
use crate::weights::{Init, TensorSpec, Weights};

const STD: f32 = 0.02;

fn push_linear(specs: &mut Vec<TensorSpec>, name: &str, out: usize, input: usize) {
    specs.push(TensorSpec::new(format!("{name}.weight"), &[out, input], Init::Normal(STD)));
    specs.push(TensorSpec::new(format!("{name}.bias"), &[out], Init::Zeros));
}

fn push_norm(specs: &mut Vec<TensorSpec>, name: &str, size: usize) {
    specs.push(TensorSpec::new(format!("{name}.weight"), &[size], Init::Ones));
    specs.push(TensorSpec::new(format!("{name}.bias"), &[size], Init::Zeros));
}

pub(crate) fn tensors(config: &Config) -> Vec<TensorSpec> {
    let (h, i) = (config.hidden, config.intermediate);
    let mut specs = vec![
        TensorSpec::new("bert.embeddings.word_embeddings.weight", &[config.vocab, h], Init::Normal(STD)),
        TensorSpec::new("bert.embeddings.position_embeddings.weight", &[config.max_positions, h], Init::Normal(STD)),
        TensorSpec::new("bert.embeddings.token_type_embeddings.weight", &[config.type_vocab, h], Init::Normal(STD)),
    ];
    push_norm(&mut specs, "bert.embeddings.LayerNorm", h);
    for layer in 0..config.layers {
        let at = |part: &str| format!("bert.encoder.layer.{layer}.{part}");
        for name in ["attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"] {
            push_linear(&mut specs, &at(name), h, h);
        }
        push_norm(&mut specs, &at("attention.output.LayerNorm"), h);
        push_linear(&mut specs, &at("intermediate.dense"), i, h);
        push_linear(&mut specs, &at("output.dense"), h, i);
        push_norm(&mut specs, &at("output.LayerNorm"), h);
    }
    match config.bert_head {
        BertHead::MaskedLm => {
            push_linear(&mut specs, "cls.predictions.transform.dense", h, h);
            push_norm(&mut specs, "cls.predictions.transform.LayerNorm", h);
            // untied, transformers' decoder has a weight and bias of its own, and keeps
            // `cls.predictions.bias` (the tied decoder's bias) without using it
            specs.push(TensorSpec::new("cls.predictions.bias", &[config.vocab], Init::Zeros));
            if !config.tie_embeddings {
                push_linear(&mut specs, "cls.predictions.decoder", config.vocab, h);
            }
        }
        BertHead::Classification { labels } => {
            push_linear(&mut specs, "bert.pooler.dense", h, h);
            push_linear(&mut specs, "classifier", labels, h);
        }
    }
    specs
}

/// The modules LoRA can adapt, with their (out, in).
pub(crate) fn projections(config: &Config) -> Vec<(String, usize, usize)> {
    let (h, i) = (config.hidden, config.intermediate);
    (0..config.layers)
        .flat_map(|layer| {
            [
                ("attention.self.query", h, h),
                ("attention.self.key", h, h),
                ("attention.self.value", h, h),
                ("attention.output.dense", h, h),
                ("intermediate.dense", i, h),
                ("output.dense", h, i),
            ]
            .into_iter()
            .map(move |(name, out, input)| (format!("bert.encoder.layer.{layer}.{name}"), out, input))
        })
        .collect()
}

struct Layer {
    query: Proj,
    key: Proj,
    value: Proj,
    attention_out: Proj,
    attention_norm: Norm,
    intermediate: Proj,
    output: Proj,
    output_norm: Norm,
}

enum Head {
    /// The decoder, and the bias added to it when it is the tied embedding.
    MaskedLm {
        transform: Proj,
        norm: Norm,
        decoder: Proj,
        bias: Option<Tensor>,
    },
    Classification {
        pooler: Proj,
        classifier: Proj,
    },
}

pub(crate) struct Bert {
    word: Tensor,
    position: Tensor,
    token_type: Tensor,
    embeddings_norm: Norm,
    layers: Vec<Layer>,
    head: Head,
    heads: usize,
    gelu: Gelu,
    padding_idx: Option<usize>,
    forms: Forms,
}

impl Bert {
    pub(crate) fn new(config: &Config, weights: &Weights, lora: Option<&Lora>, forms: Forms) -> Result<Bert> {
        let (eps, ops) = (config.norm_eps, forms.ops);
        let mut layers = Vec::with_capacity(config.layers);
        for layer in 0..config.layers {
            let at = |part: &str| format!("bert.encoder.layer.{layer}.{part}");
            let proj = |part: &str| Proj::new(weights, &at(part), Layout::OutIn, lora, ops);
            layers.push(Layer {
                query: proj("attention.self.query")?,
                key: proj("attention.self.key")?,
                value: proj("attention.self.value")?,
                attention_out: proj("attention.output.dense")?,
                attention_norm: Norm::layer(weights, &at("attention.output.LayerNorm"), eps, ops)?,
                intermediate: proj("intermediate.dense")?,
                output: proj("output.dense")?,
                output_norm: Norm::layer(weights, &at("output.LayerNorm"), eps, ops)?,
            });
        }
        let head = match config.bert_head {
            BertHead::MaskedLm => Head::MaskedLm {
                transform: Proj::unadapted(weights, "cls.predictions.transform.dense", Layout::OutIn, lora, ops)?,
                norm: Norm::layer(weights, "cls.predictions.transform.LayerNorm", eps, ops)?,
                // tied: the word embeddings, as a projection (frozen ones keep no gradient)
                decoder: Proj::unadapted(
                    weights,
                    if config.tie_embeddings { "bert.embeddings.word_embeddings" } else { "cls.predictions.decoder" },
                    Layout::OutIn,
                    lora,
                    ops,
                )?,
                bias: if config.tie_embeddings { Some(weights.get("cls.predictions.bias")?) } else { None },
            },
            BertHead::Classification { .. } => Head::Classification {
                pooler: Proj::unadapted(weights, "bert.pooler.dense", Layout::OutIn, lora, ops)?,
                classifier: Proj::unadapted(weights, "classifier", Layout::OutIn, lora, ops)?,
            },
        };
        Ok(Bert {
            word: weights.get("bert.embeddings.word_embeddings.weight")?,
            position: weights.get("bert.embeddings.position_embeddings.weight")?,
            token_type: weights.get("bert.embeddings.token_type_embeddings.weight")?,
            embeddings_norm: Norm::layer(weights, "bert.embeddings.LayerNorm", eps, ops)?,
            layers,
            head,
            heads: config.heads,
            gelu: config.gelu,
            padding_idx: config.padding_idx,
            forms,
        })
    }

    /// The encoder's output `(b, s, hidden)` for token ids `(b, s)`, every token of type 0.
    fn encode(&self, ids: &Tensor) -> Result<Tensor> {
        let s = ids.dim(1)?;
        let hidden = self.word.dim(1)?;
        let words = embed(&self.word, ids, self.padding_idx)?;
        let embedded = words.broadcast_add(&self.position.narrow(0, 0, s)?)?.broadcast_add(&self.token_type.get(0)?)?;
        let mut xs = self.embeddings_norm.forward(&embedded)?;
        let head_dim = hidden / self.heads;
        for layer in &self.layers {
            let split = |proj: &Proj| split_heads(&proj.forward(&xs)?, self.heads, head_dim);
            let (q, k, v) = (split(&layer.query)?, split(&layer.key)?, split(&layer.value)?);
            let attended = attention(&q, &k, &v, false, None, self.forms, Scores::default())?;
            xs = layer.attention_norm.forward(&layer.attention_out.added_to(&xs, &attended)?)?;
            let intermediate = layer.intermediate.forward(&xs)?;
            xs = layer.output_norm.forward(&layer.output.activated_added_to(
                &xs,
                gelu(self.gelu),
                &intermediate,
                None,
            )?)?;
        }
        Ok(xs)
    }

    /// The masked-LM head's logits `(b, s, vocab)`, or the classifier's `(b, labels)`.
    pub(crate) fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let xs = self.encode(ids)?;
        match &self.head {
            Head::MaskedLm { transform, norm, decoder, bias } => {
                let transformed = norm.forward(&self.activated(&transform.forward(&xs)?)?)?;
                let logits = decoder.forward(&transformed)?;
                match bias {
                    Some(bias) if bias.track_op() => logits.broadcast_add(bias),
                    Some(bias) => crate::ops::add_constant(&logits, bias),
                    None => Ok(logits),
                }
            }
            Head::Classification { pooler, classifier } => {
                let first = xs.narrow(1, 0, 1)?.squeeze(1)?;
                classifier.forward(&pooler.forward(&first)?.tanh()?)
            }
        }
    }

    /// The masked-LM head's input to its decoder, `(b, s, hidden)` (the
    /// transform and its norm over the encoder's output), and the decoder's
    /// weight `(vocab, hidden)` and bias; `None` for a classifier.
    pub(crate) fn masked_lm_features(&self, ids: &Tensor) -> Result<Option<(Tensor, Tensor, Option<Tensor>)>> {
        let Head::MaskedLm { transform, norm, decoder, bias } = &self.head else { return Ok(None) };
        let xs = self.encode(ids)?;
        let transformed = norm.forward(&self.activated(&transform.forward(&xs)?)?)?;
        let Some((weight, decoder_bias)) = decoder.dense() else { return Ok(None) };
        Ok(Some((transformed, weight, bias.clone().or(decoder_bias))))
    }

    /// The head transform's GELU: one node with the fused ops.
    fn activated(&self, xs: &Tensor) -> Result<Tensor> {
        match self.forms.ops {
            crate::Ops::Fused => crate::ops::activation(gelu(self.gelu), xs),
            crate::Ops::Eager => gelu(self.gelu).apply(xs),
        }
    }

    /// Whether the head predicts tokens (masked LM) rather than classes.
    pub(crate) fn predicts_tokens(&self) -> bool {
        matches!(self.head, Head::MaskedLm { .. })
    }
}

/// BERT as a family: an encoder (no generation, no checkpointing), its
/// heads, its `bert.` names, its bytes.
pub(crate) struct BertFamily;

impl Architecture for BertFamily {
    fn makes_table_gradients_once(&self) -> bool {
        false
    }

    fn model_type(&self) -> &'static str {
        "bert"
    }

    fn keys(&self) -> &'static [&'static [(&'static str, Handling)]] {
        &[BERT]
    }

    fn read(&self, family: Family, fields: &Fields) -> std::result::Result<Config, Error> {
        read_bert(family, fields)
    }

    fn lora_targets(&self) -> &'static [&'static str] {
        &["query", "value"]
    }

    fn base_model_prefix(&self) -> &'static str {
        "bert"
    }

    fn generates(&self) -> bool {
        false
    }

    fn checkpoints(&self) -> bool {
        false
    }

    fn tensors(&self, config: &Config) -> Vec<TensorSpec> {
        tensors(config)
    }

    fn projections(&self, config: &Config) -> Vec<(String, usize, usize)> {
        projections(config)
    }

    fn layer_prefix(&self, index: usize) -> String {
        format!("bert.encoder.layer.{index}.")
    }

    /// An untied masked-LM head's `cls.predictions.bias`: transformers keeps
    /// it and never uses it.
    fn unused_tensors(&self, config: &Config) -> Vec<&'static str> {
        match (config.bert_head, config.tie_embeddings) {
            (BertHead::MaskedLm, false) => vec!["cls.predictions.bias"],
            _ => Vec::new(),
        }
    }

    fn ignored(&self, config: &Config, name: &str, bare: &str) -> Option<&'static str> {
        let masked_lm = config.bert_head == BertHead::MaskedLm;
        if bare == "embeddings.position_ids" {
            Some("BERT's position-id buffer")
        } else if name.starts_with("cls.seq_relationship.") {
            Some("the next-sentence head of pre-training")
        } else if masked_lm && bare.starts_with("pooler.") {
            Some("the pooler, which BertForMaskedLM does not have")
        } else if !masked_lm && name.starts_with("cls.predictions.") {
            Some("the masked-LM head, which a classifier does not have")
        } else {
            None
        }
    }

    /// A classifier fine-tuned from a pre-trained encoder starts fresh.
    fn starts_fresh(&self, config: &Config, ours: &str) -> bool {
        matches!(config.bert_head, BertHead::Classification { .. }) && ours.starts_with("classifier.")
    }

    fn tied_copies(&self, _config: &Config) -> Vec<(&'static str, &'static str)> {
        vec![
            ("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),
            ("cls.predictions.decoder.bias", "cls.predictions.bias"),
        ]
    }

    fn network(&self, config: &Config, weights: &Weights, lora: Option<&Lora>, forms: Forms) -> Result<Network> {
        Ok(Network::Bert(Bert::new(config, weights, lora, forms)?))
    }

    /// Query, key, value with biases, made contiguous, the output and its
    /// residual, its norm, the intermediate, gelu, the output and its
    /// residual, its norm.
    fn block_bytes(&self, _config: &Config, w: &Widths, eager_attention: bool) -> PerToken {
        // the MLP's activation: kept eager, recomputed fused
        let activation = if w.fused { 0.0 } else { w.i * w.d };
        PerToken {
            kept: 3.0 * w.linear(w.h, true)
                + 3.0 * if eager_attention { w.h * w.d } else { w.heads(w.h) }
                + w.residual_linear(w.h, true)
                + w.layer_norm(w.h)
                + w.linear(w.i, true)
                + activation
                + w.residual_linear(w.h, true)
                + w.layer_norm(w.h),
            backward: w.mlp_backward(true),
        }
    }

    /// The word rows, positions and token types added, the norm.
    fn embedding_bytes(&self, _config: &Config, w: &Widths) -> f64 {
        3.0 * w.h * w.d + w.layer_norm(w.h)
    }

    /// The masked-LM head's transform with its bias, gelu, its norm.
    fn head_input_bytes(&self, _config: &Config, w: &Widths) -> f64 {
        w.linear(w.h, true) + w.h * w.d + w.layer_norm(w.h)
    }

    /// About 15% of the tokens masked; a classifier predicts none.
    fn predicted_milli_rows(&self, config: &Config) -> u64 {
        match config.bert_head {
            BertHead::MaskedLm => 150,
            BertHead::Classification { .. } => 0,
        }
    }

    /// Measured: BERT-base at batches 4 and 12, its bias beside.
    fn head_gradient_tenths(&self) -> u64 {
        37
    }

    fn residual_in_flight(&self) -> f64 {
        0.0
    }

    fn attention_backward_beside(&self) -> f64 {
        32.0
    }

    fn logits_bias(&self, config: &Config) -> bool {
        config.tie_embeddings
    }
}

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

fn read_bert(family: Family, fields: &Fields) -> std::result::Result<Config, Error> {
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
            let from_labels =
                fields.value("id2label").and_then(serde_json::Value::as_object).map(|labels| labels.len());
            let labels = fields.count(&["num_labels"])?.or(from_labels).unwrap_or(2);
            if labels < 2 {
                return Err(refuse("num_labels", labels, "at least 2 classes (one is regression, not computed here)"));
            }
            BertHead::Classification { labels }
        }
        // a pre-training or bare checkpoint is fine-tuned with the masked-LM head
        _ => BertHead::MaskedLm,
    };
    Ok(Config {
        family,
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
        local_rope: None,
        partial_rotary_factor: 1.0,
        fused_projections: false,
        tie_embeddings: fields.flag("tie_word_embeddings")?.unwrap_or(true),
        attention_bias: AttentionBias::All,
        mlp_bias: true,
        qk_norm: QkNorm::None,
        norms: BlockNorms::Pre,
        norm_plus_one: false,
        embedding_scale: None,
        mlp_activation: crate::ops::Activation::Silu,
        attention_scale: None,
        attention_softcap: None,
        final_softcap: None,
        gelu,
        sliding_window: None,
        sliding_layers: Vec::new(),
        experts: None,
        type_vocab: fields.count(&["type_vocab_size"])?.unwrap_or(2),
        bert_head,
        padding_idx: Some(fields.id("pad_token_id")?.unwrap_or(0)),
        dtype: Config::dtype(fields)?,
        dropout: Vec::new(),
        unknown_keys: Vec::new(),
    })
}

/// Masked-LM loss as Hugging Face computes it: log-probabilities over every
/// position (`(n, vocab)` in f32), the negative log-likelihood of the masked ones.
pub(crate) fn masked_lm_loss(logits: &Tensor, masked: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let log_probs = candle_nn::ops::log_softmax(&logits.to_dtype(candle_core::DType::F32)?, D::Minus1)?;
    candle_nn::loss::nll(&log_probs.index_select(masked, 0)?, targets)
}
