//! Which architecture a config is: a handle to one of the families listed in
//! [`families`](crate::families), each in a file of its own. The handle is
//! what a [`Config`](crate::Config) carries; what a family computes is
//! reached through it.

/// The architecture a config describes, by its `model_type`: one of
/// [`Family::all`] (`llama`, `mistral`, `qwen2`, `qwen3`, `olmo2`, `gpt2`, `bert`).
///
/// ```
/// use autobatch_models::Family;
/// let llama = Family::named("llama").unwrap();
/// assert_eq!(llama.model_type(), "llama");
/// assert_eq!(llama.lora_targets(), ["q_proj", "v_proj"]);
/// assert!(Family::named("t5").is_none());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Family {
    model_type: &'static str,
    generates: bool,
}

impl Family {
    /// The handle of a family the list holds (made there alone).
    pub(crate) const fn of(model_type: &'static str, generates: bool) -> Family {
        Family { model_type, generates }
    }

    /// Its `model_type`.
    pub fn model_type(self) -> &'static str {
        self.model_type
    }

    /// Whether it generates tokens one after another (a decoder): what a KV
    /// cache and `serve` need; BERT does not.
    pub fn generates(self) -> bool {
        self.generates
    }
}

impl std::fmt::Debug for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.model_type)
    }
}
