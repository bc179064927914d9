//! Plan cache: skip probing when nothing that decides memory has changed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use log::{info, warn};
use serde::{Deserialize, Serialize};

use crate::Plan;

/// What decides a model's memory, as the cache key sees it: its variables
/// (names, shapes, dtypes) and the shape parameters of its inputs that the
/// caller names (sequence length, image resolution…). The tuner adds the
/// device (name and capacity), the search settings (ceiling, granularity,
/// bounds, steps per trial, strategy) and the crate version.
///
/// ```
/// use autobatch::CacheKey;
/// use candle_core::{DType, Device, Var};
///
/// let w = Var::zeros((64, 32), DType::F32, &Device::Cpu)?;
/// let key = CacheKey::new().variables([("layer.weight", &w)]).param("seq_len", 512);
/// assert!(key.to_string().contains("layer.weight: F32 [64, 32]"));
/// assert_ne!(key.clone().param("seq_len", 1024), key);
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheKey {
    parts: BTreeMap<String, String>,
}

impl CacheKey {
    /// An empty key.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds named variables: their names, shapes and dtypes.
    pub fn variables<'a>(mut self, vars: impl IntoIterator<Item = (&'a str, &'a candle_core::Var)>) -> Self {
        for (name, var) in vars {
            self.parts.insert(format!("var {name}"), format!("{:?} {:?}", var.dtype(), var.dims()));
        }
        self
    }

    /// Adds every variable of a candle-nn `VarMap`.
    pub fn var_map(self, map: &candle_nn::VarMap) -> Self {
        let data = map.data().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let vars: Vec<(String, candle_core::Var)> = data.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
        drop(data);
        self.variables(vars.iter().map(|(n, v)| (n.as_str(), v)))
    }

    /// Adds a named parameter that decides memory, e.g. `("seq_len", 2048)`.
    pub fn param(mut self, name: &str, value: impl std::fmt::Display) -> Self {
        self.parts.insert(format!("param {name}"), value.to_string());
        self
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// A stable 64-bit FNV-1a fingerprint of the key's text, as hex.
    pub fn fingerprint(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.to_string().bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{hash:016x}")
    }
}

impl std::fmt::Display for CacheKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = String::new();
        for (name, value) in &self.parts {
            let _ = writeln!(text, "{}: {value}", name.split_once(' ').map_or(name.as_str(), |(_, n)| n));
        }
        f.write_str(&text)
    }
}

const FORMAT: &str = "autobatch-plan-cache";
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct CacheFile {
    format: String,
    version: u32,
    /// Entries are read one at a time: one that does not parse is a miss (and is
    /// replaced on the next store), not the loss of the whole file.
    entries: BTreeMap<String, serde_json::Value>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    key: String,
    plan: Plan,
}

/// What is at the cache path.
enum Contents {
    Missing,
    Ours(CacheFile),
    /// Unreadable, corrupt or not a plan cache: never written over.
    Unusable(String),
}

fn read(path: &Path) -> Contents {
    // reading a FIFO or a device would block or never end: only a file is read
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => {
            return Contents::Unusable(format!("it is not a regular file (a {})", file_kind(&meta.file_type())));
        }
        _ => {}
    }
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Contents::Missing,
        Err(err) => return Contents::Unusable(format!("cannot read it: {err}")),
    };
    match serde_json::from_str::<CacheFile>(&text) {
        Ok(file) if file.format == FORMAT && file.version == VERSION => Contents::Ours(file),
        Ok(file) => Contents::Unusable(format!(
            "it is {} version {}, not {FORMAT} version {VERSION}",
            file.format, file.version
        )),
        Err(err) => Contents::Unusable(format!("it is not a plan cache ({err})")),
    }
}

/// serde's message with its Rust type names in words.
fn readable(message: &str) -> String {
    message
        .replace("expected usize", "expected a whole number, 0 or more")
        .replace("expected u64", "expected a whole number, 0 or more")
        .replace("expected f64", "expected a number")
}

/// What a path that is not a regular file is, in words.
fn file_kind(kind: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "named pipe";
        }
        if kind.is_socket() {
            return "socket";
        }
        if kind.is_block_device() || kind.is_char_device() {
            return "device";
        }
    }
    if kind.is_dir() { "directory" } else { "special file" }
}

/// The cached plan for `key`, if the file at `path` has one. Never fails: a
/// missing, unreadable, corrupt or foreign file is a miss (with a warning).
pub(crate) fn lookup(path: &Path, key: &CacheKey) -> Option<Plan> {
    let fingerprint = key.fingerprint();
    match read(path) {
        Contents::Missing => None,
        Contents::Unusable(why) => {
            warn!("ignoring the plan cache {}: {why}", path.display());
            None
        }
        Contents::Ours(mut file) => {
            let entry = file.entries.remove(&fingerprint).map(serde_json::from_value::<Entry>);
            match entry {
                Some(Ok(entry)) if entry.key == key.to_string() => {
                    info!("plan cache hit in {} ({fingerprint}): no probing", path.display());
                    Some(entry.plan)
                }
                Some(Err(err)) => {
                    warn!(
                        "ignoring entry {fingerprint} of the plan cache {} (probing instead): {}",
                        path.display(),
                        readable(&err.to_string())
                    );
                    None
                }
                _ => {
                    info!("plan cache miss in {} ({fingerprint})", path.display());
                    None
                }
            }
        }
    }
}

/// Stores `plan` under `key`, keeping the other entries. A symbolic link is
/// followed (the file it points to is updated, the link stays) and an existing
/// file keeps its permissions. Atomic: the file is
/// written to a temporary file beside it and renamed over it, so a reader (or
/// a concurrent writer) never sees half a file; when two write at once, one
/// entry may be lost, never the file. Never fails: problems are warnings.
pub(crate) fn store(path: &Path, key: &CacheKey, plan: &Plan) {
    let mut file = match read(path) {
        Contents::Missing => CacheFile { format: FORMAT.to_owned(), version: VERSION, entries: BTreeMap::new() },
        Contents::Ours(file) => file,
        Contents::Unusable(why) => {
            warn!("not writing the plan cache {}: {why}; delete it or choose another path", path.display());
            return;
        }
    };
    let entry = match serde_json::to_value(Entry { key: key.to_string(), plan: plan.clone() }) {
        Ok(entry) => entry,
        Err(err) => {
            warn!("not caching the plan: {err}");
            return;
        }
    };
    file.entries.insert(key.fingerprint(), entry);
    if let Err(err) = write_atomically(path, &file) {
        warn!("could not write the plan cache {}: {err}", path.display());
    }
}

/// The file a write to `path` must replace: `path` itself, or the file its
/// chain of symbolic links ends at (which may not exist yet), so that a
/// linked cache is updated where it lives instead of the link being replaced.
fn resolve_links(path: &Path) -> std::io::Result<PathBuf> {
    // the kernel's own limit on links followed in one lookup (Linux MAXSYMLINKS)
    const MAX_LINKS: usize = 40;
    let mut current = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = std::fs::read_link(&current)?;
                current = match current.parent() {
                    Some(parent) if target.is_relative() => parent.join(target),
                    _ => target,
                };
            }
            _ => return Ok(current),
        }
    }
    Err(std::io::Error::other(format!("more than {MAX_LINKS} symbolic links from {}", path.display())))
}

fn write_atomically(path: &Path, file: &CacheFile) -> std::io::Result<()> {
    use std::io::Write;
    let json = serde_json::to_vec_pretty(file).map_err(std::io::Error::other)?;
    let path = &resolve_links(path)?;
    // a new file gets the process's default mode; an existing one keeps its own
    let permissions = std::fs::metadata(path).ok().map(|meta| meta.permissions());
    let directory = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(directory)?;
    let name = path.file_name().map_or_else(|| "plan-cache".into(), |n| n.to_string_lossy().into_owned());
    let unique = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let temporary =
        directory.join(format!(".{name}.{}.{unique}.{:?}.tmp", std::process::id(), std::thread::current().id()));
    let result = (|| {
        let mut out = std::fs::File::create(&temporary)?;
        if let Some(permissions) = permissions {
            out.set_permissions(permissions)?;
        }
        out.write_all(&json)?;
        out.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}
