//! A Hugging Face `config.json` read: its family found by `model_type`,
//! every key checked against the family's table ([`keys`]), the family
//! reading the rest, the shape checked and counted before anything is
//! allocated.

use serde_json::Value;

use crate::config::{Fields, MAX_CONFIG_BYTES, refuse, shortened};
use crate::keys::{self, Handling};
use crate::{Config, Error, Family};

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
        let model_types = Family::listed(|_| true);
        let family = match fields.value("model_type") {
            None => return Err(refuse("model_type", "missing", model_types)),
            Some(Value::String(model_type)) => match Family::named(model_type) {
                Some(family) => family,
                None => return Err(refuse("model_type", model_type, model_types)),
            },
            Some(other) => return Err(refuse("model_type", other, format!("one of {model_types} as text"))),
        };
        let architecture = family.architecture();
        let mut unknown_keys = Vec::new();
        let mut dropout = Vec::new();
        for (key, value) in object {
            match keys::handling(architecture.keys(), key) {
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
        let mut config = architecture.read(family, &fields)?;
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
}
