//! The families, one file each: what a family's `config.json` holds and how
//! it is read, its tensors and their checkpoint names, its network, and the
//! bytes its step takes. Adding a family is a file here and a line in
//! [`ARCHITECTURES`]; nothing outside this folder asks which family a config
//! is, only what its [`Architecture`] answers.
//!
//! The decoders of the Llama kind share one network ([`decoder`](crate::decoder)),
//! set by what their config reads (biases, q/k norms, windows); GPT-2 and
//! BERT bring their own.

use candle_core::Tensor;

use crate::Error;
use crate::config::{Config, Fields};
use crate::decoder::{self, Decoder};
use crate::family::Family;
use crate::keys::Handling;
use crate::layers::Forms;
use crate::lora::Lora;
use crate::per_token::{PerToken, Widths};
use crate::weights::{TensorSpec, Weights};

pub(crate) mod bert;
mod gemma2;
mod gemma3;
pub(crate) mod gpt2;
mod llama;
mod mistral;
mod mixtral;
mod olmo2;
mod phi3;
mod qwen2;
mod qwen2_moe;
mod qwen3;
mod qwen3_moe;

/// Every family, in the order messages list them.
const ARCHITECTURES: &[&dyn Architecture] = &[
    &llama::Llama,
    &mistral::Mistral,
    &qwen2::Qwen2,
    &qwen3::Qwen3,
    &olmo2::Olmo2,
    &gemma2::Gemma2,
    &gemma3::Gemma3,
    &phi3::Phi3,
    &mixtral::Mixtral,
    &qwen2_moe::Qwen2Moe,
    &qwen3_moe::Qwen3Moe,
    &gpt2::Gpt2Family,
    &bert::BertFamily,
];

/// What differs from one family to another. The defaults are the decoders
/// of the Llama kind (`model.layers.N.…` names, the shared [`Decoder`]).
pub(crate) trait Architecture: Sync {
    /// Its `model_type`.
    fn model_type(&self) -> &'static str;

    /// The keys its `config.json` may hold, its own tables first (the
    /// common keys every family shares are added after them).
    fn keys(&self) -> &'static [&'static [(&'static str, Handling)]];

    /// The config read from its fields (its keys already checked).
    fn read(&self, family: Family, fields: &Fields) -> Result<Config, Error>;

    /// The key its config writes `field` under, named in messages
    /// (GPT-2's `n_embd` for `hidden_size`).
    fn config_key(&self, field: &'static str) -> &'static str {
        field
    }

    /// The modules LoRA adapts by default, as PEFT does: the attention's
    /// query and value projections.
    fn lora_targets(&self) -> &'static [&'static str] {
        &["q_proj", "v_proj"]
    }

    /// The prefix Hugging Face's head models put before the base model's
    /// tensor names (`base_model_prefix`).
    fn base_model_prefix(&self) -> &'static str {
        "model"
    }

    /// Whether it generates (a KV cache, `serve`).
    fn generates(&self) -> bool {
        true
    }

    /// Whether its layers are checkpointed (a decoder's are, one at a time).
    fn checkpoints(&self) -> bool {
        true
    }

    /// The checkpoint's tensors, names and shapes.
    fn tensors(&self, config: &Config) -> Vec<TensorSpec> {
        decoder::tensors(config)
    }

    /// The modules LoRA can adapt, by checkpoint name, with their (out, in).
    fn projections(&self, config: &Config) -> Vec<(String, usize, usize)> {
        decoder::projections(config)
    }

    /// The start of layer `index`'s tensor names.
    fn layer_prefix(&self, index: usize) -> String {
        format!("model.layers.{index}.")
    }

    /// Tensors transformers keeps in the model and never uses.
    fn unused_tensors(&self, _config: &Config) -> Vec<&'static str> {
        Vec::new()
    }

    /// Whether its projections' weights are stored `(in, out)` (GPT-2's
    /// `Conv1D`), not `(out, in)`.
    fn weights_in_out(&self) -> bool {
        false
    }

    /// The checkpoint names tried for the model's name `ours`: itself, and
    /// without the base model's prefix.
    fn spellings(&self, ours: &str) -> Vec<String> {
        let prefix = format!("{}.", self.base_model_prefix());
        let mut names = vec![ours.to_owned()];
        if let Some(bare) = ours.strip_prefix(&prefix) {
            names.push(bare.to_owned());
        }
        names
    }

    /// Why transformers ignores the checkpoint's tensor `name` (`bare`
    /// without the base model's prefix) in this family, if it does.
    fn ignored(&self, _config: &Config, _name: &str, _bare: &str) -> Option<&'static str> {
        None
    }

    /// A head a checkpoint may lack that training starts fresh.
    fn starts_fresh(&self, _config: &Config, _ours: &str) -> bool {
        false
    }

    /// A tied head's copies in a checkpoint and what each is tied to.
    fn tied_copies(&self, _config: &Config) -> Vec<(&'static str, &'static str)> {
        vec![("lm_head.weight", "model.embed_tokens.weight")]
    }

    /// Its network over `weights`.
    fn network(
        &self,
        config: &Config,
        weights: &Weights,
        lora: Option<&Lora>,
        forms: Forms,
    ) -> candle_core::Result<Network> {
        Ok(Network::Decoder(Decoder::new(config, weights, lora, forms)?))
    }

    /// One layer's tensors per token but attention's and the adapters'.
    fn block_bytes(&self, config: &Config, w: &Widths, eager_attention: bool) -> PerToken {
        decoder::block_bytes(config, w, eager_attention)
    }

    /// The embeddings' tensors per token (and their scaled copy, Gemma's).
    fn embedding_bytes(&self, config: &Config, w: &Widths) -> f64 {
        if config.embedding_scale.is_some() { 2.0 * w.h * w.d } else { w.h * w.d }
    }

    /// The tensors per token before the head: the final norm (BERT's transform).
    fn head_input_bytes(&self, _config: &Config, w: &Widths) -> f64 {
        w.rms_norm(w.h)
    }

    /// The rows predicted, in thousandths of the tokens: all of them for a
    /// decoder; 0 where no token is predicted (a classifier).
    fn predicted_milli_rows(&self, _config: &Config) -> u64 {
        1000
    }

    /// Whether a full fine-tune's step makes its embedding's and head's
    /// gradients once, the loss keeping the head's and the lookup's rows
    /// added into it in place (`ConfigModel::loss_and_gradients`): the
    /// decoders'; GPT-2's and BERT's hand them to candle's backward pass.
    fn makes_table_gradients_once(&self) -> bool {
        true
    }

    /// The head's gradient handed to the backward pass, in tenths of the
    /// head (measured: three; BERT's, its bias beside, 3.7).
    fn head_gradient_tenths(&self) -> u64 {
        30
    }

    /// The gradients in flight along the residual stream in the backward
    /// pass, in widths of the hidden size (six measured; none in BERT,
    /// whose norms after each sum take it in place).
    fn residual_in_flight(&self) -> f64 {
        6.0
    }

    /// Blocked attention's backward pass beside its blocks, in widths of
    /// the queries (BERT's bidirectional pass: some eight f32 tensors).
    fn attention_backward_beside(&self) -> f64 {
        0.0
    }

    /// Whether the full loss's logits carry a bias beside them (BERT's tied head).
    fn logits_bias(&self, _config: &Config) -> bool {
        false
    }
}

/// The network of one family over its weights.
pub(crate) enum Network {
    Decoder(Decoder),
    Gpt2(gpt2::Gpt2),
    Bert(bert::Bert),
}

impl Network {
    /// The final norm of the last block's output `(b, s, hidden)` and the
    /// head's weight and bias: a decoder's (or GPT-2's) fused loss's inputs.
    pub(crate) fn head_parts(&self, xs: &Tensor) -> candle_core::Result<(Tensor, Tensor, Option<Tensor>)> {
        let (features, dense) = match self {
            Network::Decoder(network) => (network.final_norm(xs)?, network.head_dense()),
            Network::Gpt2(network) => (network.final_norm(xs)?, network.head_dense()),
            Network::Bert(_) => candle_core::bail!("BERT's head is its masked-LM head"),
        };
        let Some((weight, bias)) = dense else { candle_core::bail!("the head has adapters") };
        Ok((features, weight, bias))
    }
}

impl Family {
    /// What the family computes.
    pub(crate) fn architecture(self) -> &'static dyn Architecture {
        ARCHITECTURES
            .iter()
            .copied()
            .find(|architecture| architecture.model_type() == self.model_type())
            .expect("a family's handle is made from the list")
    }

    /// Every family, in the order messages list them.
    pub fn all() -> Vec<Family> {
        ARCHITECTURES.iter().map(|architecture| handle(*architecture)).collect()
    }

    /// The family of `model_type`, if it is one of [`all`](Self::all).
    pub fn named(model_type: &str) -> Option<Family> {
        ARCHITECTURES.iter().find(|architecture| architecture.model_type() == model_type).map(|a| handle(*a))
    }

    /// The `model_type`s of the families `which` holds for, listed for a
    /// message: `llama, mistral, qwen2, qwen3, olmo2, gemma2, gemma3_text, phi3, mixtral, qwen2_moe, qwen3_moe, gpt2, bert`.
    pub fn listed(which: impl Fn(Family) -> bool) -> String {
        Family::all().into_iter().filter(|family| which(*family)).map(Family::model_type).collect::<Vec<_>>().join(", ")
    }

    /// The modules LoRA adapts by default, as PEFT does: the attention's
    /// query and value projections (`c_attn`, which holds both, for GPT-2).
    pub fn lora_targets(self) -> &'static [&'static str] {
        self.architecture().lora_targets()
    }

    /// The prefix Hugging Face's head models put before the base model's
    /// tensor names (`base_model_prefix`): `model`, `transformer`, `bert`.
    pub fn base_model_prefix(self) -> &'static str {
        self.architecture().base_model_prefix()
    }

    /// Whether gradient checkpointing applies: a decoder's layers are
    /// checkpointed one at a time; BERT's are not.
    pub fn checkpoints(self) -> bool {
        self.architecture().checkpoints()
    }
}

impl Family {
    /// Refused where the family does not generate: `doing` (`serve`, `a
    /// KV cache serves`) a decoder, the ones that do named.
    pub(crate) fn check_generates(self, doing: &str) -> Result<(), Error> {
        if self.generates() {
            return Ok(());
        }
        let decoders: Vec<Family> = Family::all().into_iter().filter(|family| family.generates()).collect();
        let names: Vec<&str> = decoders.iter().map(|family| family.model_type()).collect();
        let listed = match names.split_last() {
            Some((last, [])) => (*last).to_owned(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        };
        Err(Error::invalid(
            crate::Setting::ConfigKey("model_type".to_owned()),
            autobatch::Value::Text(self.model_type().to_owned()),
            format!("{doing} a decoder: {listed}"),
        ))
    }
}

fn handle(architecture: &dyn Architecture) -> Family {
    Family::of(architecture.model_type(), architecture.generates())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{self, Handling};

    #[test]
    fn the_guide_shows_the_table_the_reader_uses() {
        let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/models.md")).unwrap();
        let table = markdown_table();
        assert!(guide.contains(&table), "docs/models.md's key table is not the reader's; paste this one:\n{table}");
    }

    #[test]
    fn every_family_reads_its_shape_and_refuses_what_it_does_not_compute() {
        for family in Family::all() {
            let handling = |key| keys::handling(family.architecture().keys(), key);
            for key in ["model_type", "vocab_size", "num_hidden_layers", "tie_word_embeddings"] {
                let read = handling(key).or_else(|| handling("n_layer"));
                assert_eq!(read, Some(Handling::Read), "{family:?} {key}");
            }
            assert!(matches!(handling("quantization_config"), Some(Handling::RefusedUnless([]))));
            assert_eq!(handling("a_key_nobody_writes"), None);
        }
    }

    /// Each family's handle finds its own architecture, by its name alone.
    #[test]
    fn every_family_is_named_once() {
        let all = Family::all();
        for family in &all {
            assert_eq!(Family::named(family.model_type()), Some(*family));
            assert_eq!(family.architecture().model_type(), family.model_type());
            assert_eq!(all.iter().filter(|other| other.model_type() == family.model_type()).count(), 1);
        }
        assert_eq!(
            Family::listed(|_| true),
            "llama, mistral, qwen2, qwen3, olmo2, gemma2, gemma3_text, phi3, mixtral, qwen2_moe, qwen3_moe, gpt2, bert"
        );
    }

    /// The key table as docs/models.md shows it: one row per key, the families
    /// it applies to, what reading does with it.
    fn markdown_table() -> String {
        let mut rows: Vec<(String, String, Vec<&str>)> = Vec::new();
        for family in Family::all() {
            for (key, handling) in keys::table(family.architecture().keys()) {
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
            let families = if families.len() == Family::all().len() { "all".to_owned() } else { families.join(", ") };
            table += &format!("| `{key}` | {families} | {what} |\n");
        }
        table
    }
}
