//! The crate's error: one of its own inputs refused (a `config.json` field, a
//! LoRA rank, a serving length), or the core's error, handed on untouched.

use std::borrow::Cow;

use autobatch::{ErrorKind, Value};

/// An input of this crate an [`Error::InvalidSetting`] is about: a builder's
/// argument or a `config.json` key. Its `Display` names it as the caller wrote
/// it. Not `non_exhaustive`, as [`autobatch::Setting`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Setting {
    /// The path given to [`Config::from_file`](crate::Config::from_file).
    ConfigFile,
    /// A key of a `config.json` (`model_type`, `hidden_size`).
    ConfigKey(String),
    /// A tensor of a checkpoint, by its name.
    CheckpointTensor(String),
    /// [`Lora::new`](crate::Lora::new)'s rank.
    LoraRank,
    /// [`Lora::new`](crate::Lora::new)'s targets.
    LoraTargets,
    /// A LoRA base's storage ([`BaseDtype`](crate::BaseDtype)).
    BaseDtype,
    /// [`Training`](crate::Training)'s dtype, or the dtype a model is served in.
    Dtype,
    /// The optimizer of a [`Trainer`](crate::trainer::Trainer).
    Optimizer,
    /// [`Training::new`](crate::Training::new)'s sequence length (or a
    /// reference transformer's).
    SeqLen,
    /// A model's layers: a config cut to fewer, or a reference transformer's.
    Layers,
    /// A reference transformer's attention heads.
    Heads,
    /// A reference transformer's model width.
    DModel,
    /// A reference transformer's vocabulary.
    Vocab,
    /// A reference MLP's width.
    Width,
    /// A reference MLP's hidden layers.
    Depth,
    /// A reference MLP's inputs.
    Inputs,
    /// A reference model's classes.
    Classes,
    /// A reference convnet's channels.
    Channels,
    /// A reference convnet's input channels.
    InChannels,
    /// A reference convnet's image side.
    Resolution,
    /// Tokens per block of a [`KvCache`](crate::KvCache).
    BlockSize,
    /// The blocks a [`KvCache`](crate::KvCache) is asked for.
    KvCacheBlocks,
    /// A [`KvCache`](crate::KvCache)'s dtype.
    KvCacheDtype,
    /// A sequence of a [`KvCache`](crate::KvCache).
    Sequence,
    /// The chunks of a serving step.
    Chunk,
    /// The labels given to [`ConfigModel::loss_of`](crate::ConfigModel::loss_of).
    Labels,
    /// The parameters an [`Estimator`](crate::estimate::Estimator) counts.
    Parameters,
    /// The precision an [`Estimator`](crate::estimate::Estimator) counts the state in.
    Precision,
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Setting::ConfigFile => "Config::from_file's path",
            Setting::ConfigKey(key) => return write!(f, "config.json's {key}"),
            Setting::CheckpointTensor(name) => return write!(f, "checkpoint tensor {name}"),
            Setting::LoraRank => "Lora::new's rank",
            Setting::LoraTargets => "Lora::new's targets",
            Setting::BaseDtype => "Lora::base",
            Setting::Dtype => "dtype",
            Setting::Optimizer => "optimizer",
            Setting::SeqLen => "seq_len",
            Setting::Layers => "layers",
            Setting::Heads => "TransformerConfig's heads",
            Setting::DModel => "TransformerConfig's d_model",
            Setting::Vocab => "TransformerConfig's vocab",
            Setting::Width => "MlpConfig's width",
            Setting::Depth => "MlpConfig's depth",
            Setting::Inputs => "MlpConfig's inputs",
            Setting::Classes => "classes",
            Setting::Channels => "ConvNetConfig's channels",
            Setting::InChannels => "ConvNetConfig's in_channels",
            Setting::Resolution => "ConvNetConfig's resolution",
            Setting::BlockSize => "block_size",
            Setting::KvCacheBlocks => "KV cache blocks",
            Setting::KvCacheDtype => "KV cache dtype",
            Setting::Sequence => "sequence",
            Setting::Chunk => "chunk",
            Setting::Labels => "labels",
            Setting::Parameters => "Estimator::parameters",
            Setting::Precision => "Estimator::precision",
        })
    }
}

/// What can go wrong in this crate: its own input refused, or the core's
/// error (a search, a meter, candle), handed on as it came.
///
/// ```
/// use autobatch_models::{Compute, Error, Lora, Setting, Training};
///
/// let config = autobatch_models::Config::from_json(
///     r#"{"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
///         "num_hidden_layers": 1, "num_attention_heads": 2}"#,
/// )?;
/// let err = config.footprint(&Training::new(8).lora(Lora::new(0, &["q_proj"])), Compute::Cpu).unwrap_err();
/// assert!(matches!(err, Error::InvalidSetting { setting: Setting::LoraRank, .. }));
/// assert_eq!(err.to_string(), "Lora::new's rank is 0: it must be at least 1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// One of this crate's inputs has a value that is not valid.
    #[error("{}", self.message(&Methods))]
    InvalidSetting {
        /// What was set.
        setting: Setting,
        /// What it held.
        value: Value,
        /// What would be valid, in words.
        valid: Cow<'static, str>,
    },

    /// The core's error: a search, a meter, a step of candle.
    #[error(transparent)]
    Core(#[from] autobatch::Error),
}

/// How a caller names this crate's settings, beside the core's
/// ([`autobatch::Names`]): what it gives [`Error::message`] so that each
/// message is written once; `Display` names them by builder method
/// (`Lora::new's rank`).
///
/// ```
/// use std::borrow::Cow;
/// use autobatch_models::{Error, Names, Setting};
///
/// struct Flags;
/// impl autobatch::Names for Flags {
///     fn setting(&self, setting: autobatch::Setting) -> Cow<'static, str> {
///         setting.as_str().into()
///     }
/// }
/// impl Names for Flags {
///     fn model_setting(&self, setting: &Setting) -> Cow<'static, str> {
///         match setting {
///             Setting::LoraRank => "--lora".into(),
///             other => other.to_string().into(),
///         }
///     }
/// }
///
/// let config = autobatch_models::Config::from_json(
///     r#"{"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
///         "num_hidden_layers": 1, "num_attention_heads": 2}"#,
/// )?;
/// let training = autobatch_models::Training::new(8).lora(autobatch_models::Lora::new(0, &["q_proj"]));
/// let err = config.footprint(&training, autobatch_models::Compute::Cpu).unwrap_err();
/// assert_eq!(err.message(&Flags), "--lora is 0: it must be at least 1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Names: autobatch::Names {
    /// What sets `setting`, as the caller's users know it.
    fn model_setting(&self, setting: &Setting) -> Cow<'static, str>;
}

/// The names `Display` uses: each setting by its builder method or key.
struct Methods;

impl autobatch::Names for Methods {
    fn setting(&self, setting: autobatch::Setting) -> Cow<'static, str> {
        setting.as_str().into()
    }
}

impl Names for Methods {
    fn model_setting(&self, setting: &Setting) -> Cow<'static, str> {
        setting.to_string().into()
    }
}

impl Error {
    /// The error's message with every setting, this crate's and the core's,
    /// named by `names`: what its `Display` writes with the builder methods'
    /// names, a command line with its flags.
    pub fn message(&self, names: &dyn Names) -> String {
        match self {
            Error::InvalidSetting { setting, value, valid } => {
                format!("{} is {value}: {valid}", names.model_setting(setting))
            }
            Error::Core(core) => core.message(names),
        }
    }
}

impl From<candle_core::Error> for Error {
    fn from(err: candle_core::Error) -> Self {
        Error::Core(autobatch::Error::from(err))
    }
}

impl From<Error> for autobatch::Error {
    /// The core's error as it was; this crate's own as
    /// [`autobatch::Error::Input`], whole (downcast it back).
    fn from(err: Error) -> Self {
        match err {
            Error::Core(core) => core,
            own => autobatch::Error::Input(Box::new(own)),
        }
    }
}

impl std::fmt::Debug for Error {
    /// The message, as the core's error shows it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Core(core) => std::fmt::Debug::fmt(core, f),
            own => std::fmt::Display::fmt(own, f),
        }
    }
}

impl Error {
    /// What kind of failure this is (see [`autobatch::Error::kind`]): an
    /// input of this crate refused is [`ErrorKind::Configuration`].
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidSetting { .. } => ErrorKind::Configuration,
            Error::Core(core) => core.kind(),
        }
    }

    /// Whether the error is in what was asked: `kind() == ErrorKind::Configuration`.
    pub fn is_configuration(&self) -> bool {
        self.kind() == ErrorKind::Configuration
    }

    /// The core's error, when it is one.
    pub fn core(&self) -> Option<&autobatch::Error> {
        match self {
            Error::Core(core) => Some(core),
            Error::InvalidSetting { .. } => None,
        }
    }

    /// [`Error::InvalidSetting`]: `setting` held `value`; `valid` says what would be.
    pub(crate) fn invalid(setting: Setting, value: Value, valid: impl Into<Cow<'static, str>>) -> Error {
        Error::InvalidSetting { setting, value, valid: valid.into() }
    }

    /// A count that was zero and must be at least 1.
    pub(crate) fn zero(setting: Setting) -> Error {
        Error::invalid(setting, Value::Count(0), "it must be at least 1")
    }

    /// The core's [`autobatch::Error::ByteOverflow`].
    pub(crate) fn byte_overflow(what: impl Into<String>) -> Error {
        Error::Core(autobatch::Error::byte_overflow(what))
    }
}
