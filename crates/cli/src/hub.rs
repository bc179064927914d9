//! `--config ORG/NAME[@REVISION]`: a model by its Hugging Face Hub name, as
//! `accelerate estimate-memory` and vLLM take it. Where no local file has
//! that name, its `config.json` is read from the local Hub cache as the
//! Hub's own clients lay it out (`models--ORG--NAME/refs/REVISION` names a
//! commit, `snapshots/<commit>/config.json` is the file), and fetched into
//! that cache with `hf-hub` when it is not there and the network is allowed.
//! Only the command line reaches the network; the libraries read files.
//!
//! The cache is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`; the token `$HF_TOKEN`, else the token file the
//! Hub's clients write (`$HF_HOME/token`, `~/.cache/huggingface/token`);
//! `HF_HUB_OFFLINE=1` never touches the network.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::failure::Failure;

/// The file a model's config is, on the Hub.
pub const CONFIG: &str = "config.json";

/// Where the config a command read came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum ConfigSource {
    /// A local file, as given.
    File {
        /// The file.
        path: PathBuf,
        /// The name is also a Hub name: the local file won, and is said to.
        hub_name_too: bool,
    },
    /// A snapshot in the Hub's cache.
    Hub {
        /// `ORG/NAME`.
        repo: String,
        /// The revision asked for (`main` unless `@REVISION` was given).
        revision: String,
        /// The commit of the snapshot read.
        commit: String,
        /// The file read, in the snapshot.
        path: PathBuf,
        /// Whether it was fetched now (else it was in the cache).
        fetched: bool,
    },
}

impl ConfigSource {
    /// The file to read.
    pub fn path(&self) -> &Path {
        match self {
            ConfigSource::File { path, .. } | ConfigSource::Hub { path, .. } => path,
        }
    }

    /// Where it came from, in words: `meta-llama/Llama-3.2-1B@main (commit
    /// 4e20de36…, from the Hugging Face cache)`; `None` for a local file
    /// given as a path that is no Hub name (nothing to say).
    pub fn said(&self) -> Option<String> {
        match self {
            ConfigSource::File { hub_name_too: false, .. } => None,
            ConfigSource::File { path, hub_name_too: true } => Some(format!(
                "config: the local file {} (a Hub model has that name too: the local file is read)",
                path.display()
            )),
            ConfigSource::Hub { repo, revision, commit, path, fetched } => Some(format!(
                "config: {repo}@{revision}, commit {commit}, {} ({})",
                if *fetched { "fetched into the Hugging Face cache" } else { "from the Hugging Face cache" },
                path.display()
            )),
        }
        .map(|said| match checkpoint() {
            Some(files) => format!("{said}; weights: {} checkpoint file(s) beside it", files.len()),
            None => said,
        })
    }
}

/// The config this command read, once resolved: what its output says it
/// came from (one command reads one config).
static SOURCE: std::sync::OnceLock<ConfigSource> = std::sync::OnceLock::new();

/// Keeps where the command's config came from, for its output.
pub fn remember(source: ConfigSource) {
    let _ = SOURCE.set(source);
}

/// Where the command's config came from, where it read one.
pub fn source() -> Option<&'static ConfigSource> {
    SOURCE.get()
}

/// `json` (an object) with `config_source` added where the command read a
/// config: the name, revision and commit of a Hub snapshot, or the file.
pub fn annotate(mut json: serde_json::Value) -> serde_json::Value {
    if let (Some(source), Some(object)) = (source(), json.as_object_mut()) {
        let mut said = serde_json::to_value(source).expect("plain values serialize");
        if let Some(files) = checkpoint() {
            said["weights"] = serde_json::to_value(files).expect("plain values serialize");
        }
        object.insert("config_source".to_owned(), said);
    }
    json
}

/// A JSON text with `config_source` added ([`annotate`]).
pub fn annotated(json: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(value) if source().is_some() => {
            serde_json::to_string_pretty(&annotate(value)).expect("plain values serialize")
        }
        _ => json.to_owned(),
    }
}

/// `ORG/NAME` and the revision of `ORG/NAME@REVISION` (`main` without one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubName {
    pub repo: String,
    pub revision: String,
}

impl HubName {
    /// `text` as a Hub model name, where it is one: `ORG/NAME` of letters,
    /// digits, `-`, `_` and `.` (neither part starting with `.` or `-`), an
    /// optional `@REVISION` (a branch, a tag or a commit; `/` allowed, as in
    /// `refs/pr/1`).
    pub fn parse(text: &str) -> Option<HubName> {
        let (repo, revision) = match text.split_once('@') {
            Some((repo, revision)) => (repo, revision),
            None => (text, "main"),
        };
        let (org, name) = repo.split_once('/')?;
        let part = |part: &str| {
            !part.is_empty()
                && part.len() <= 96
                && !part.starts_with(['.', '-'])
                && !part.contains("..")
                && part.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        let revision_ok = !revision.is_empty()
            && revision.len() <= 255
            && !revision.contains("..")
            && !revision.starts_with('/')
            && revision.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
        (part(org) && part(name) && revision_ok)
            .then(|| HubName { repo: repo.to_owned(), revision: revision.to_owned() })
    }

    /// The repo's folder in the cache: `models--ORG--NAME`.
    fn folder(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }

    /// Whether the revision is a commit (40 hex digits).
    fn is_commit(&self) -> bool {
        self.revision.len() == 40 && self.revision.bytes().all(|b| b.is_ascii_hexdigit())
    }
}

/// The Hub's cache folder: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub`; `None` with none of them and no home.
pub fn cache_dir() -> Option<PathBuf> {
    let set = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty()).map(PathBuf::from);
    set("HF_HUB_CACHE")
        .or_else(|| set("HF_HOME").map(|home| home.join("hub")))
        .or_else(|| set("HOME").map(|home| home.join(".cache").join("huggingface").join("hub")))
}

/// `HF_HUB_OFFLINE` as the Hub's clients read it: 1, true, yes or on.
fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|value| matches!(value.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

/// `$HF_TOKEN`, else the token file beside the cache (`huggingface-cli
/// login` writes it), with where it came from.
fn token(cache: &Path) -> Option<(String, &'static str)> {
    if let Some(token) = std::env::var("HF_TOKEN").ok().map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()) {
        return Some((token, "HF_TOKEN"));
    }
    let home = std::env::var_os("HF_HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    let file = home.map_or_else(|| hf_hub::Cache::new(cache.to_path_buf()).token_path(), |home| home.join("token"));
    let token = std::fs::read_to_string(file).ok()?.trim().to_owned();
    (!token.is_empty()).then_some((token, "the token file"))
}

/// The config `given` names: the local file where one exists, else a Hub
/// name's `config.json` from the cache (fetched into it where allowed),
/// else the path as given (its reader says why it cannot be read).
pub fn resolve(given: &Path) -> Result<ConfigSource, Failure> {
    let text = given.to_str();
    let name = text.and_then(HubName::parse);
    if std::fs::symlink_metadata(given).is_ok() || name.is_none() {
        return Ok(ConfigSource::File { path: given.to_path_buf(), hub_name_too: name.is_some() });
    }
    let name = name.expect("a Hub name, checked above");
    let Some(cache) = cache_dir() else {
        return Err(Failure::usage(format!(
            "--config {}: no such file, and no Hugging Face cache to look in (set HF_HUB_CACHE or HF_HOME)",
            given.display()
        )));
    };
    let repo_dir = cache.join(name.folder());
    match cached(&name, &repo_dir) {
        Cached::File { commit, path } => {
            return Ok(ConfigSource::Hub { repo: name.repo, revision: name.revision, commit, path, fetched: false });
        }
        Cached::SnapshotWithout { commit } if offline() => {
            return Err(Failure::usage(format!(
                "--config {}: the cached snapshot {commit} of {} ({}) has no {CONFIG}, and HF_HUB_OFFLINE is set: \
                 fetch it (`huggingface-cli download {} {CONFIG} --revision {}`) or unset HF_HUB_OFFLINE",
                given.display(),
                name.repo,
                repo_dir.join("snapshots").join(&commit).display(),
                name.repo,
                name.revision
            )));
        }
        Cached::Nothing if offline() => {
            return Err(Failure::usage(format!(
                "--config {}: neither a file nor in the Hugging Face cache (looked in {} for refs/{} and its \
                 snapshot), and HF_HUB_OFFLINE is set: fetch it (`huggingface-cli download {} {CONFIG}{}`), unset \
                 HF_HUB_OFFLINE, or give the path of a config.json",
                given.display(),
                repo_dir.display(),
                name.revision,
                name.repo,
                if name.revision == "main" { String::new() } else { format!(" --revision {}", name.revision) }
            )));
        }
        Cached::SnapshotWithout { .. } | Cached::Nothing => {}
    }
    fetch(given, &name, &cache)
}

/// What the cache holds of a revision.
enum Cached {
    File {
        commit: String,
        path: PathBuf,
    },
    /// The revision's snapshot is there, without the file.
    SnapshotWithout {
        commit: String,
    },
    Nothing,
}

fn cached(name: &HubName, repo_dir: &Path) -> Cached {
    let commit = match name.is_commit() {
        true => Some(name.revision.clone()),
        false => std::fs::read_to_string(repo_dir.join("refs").join(&name.revision)).ok().map(|c| c.trim().to_owned()),
    };
    let Some(commit) = commit.filter(|commit| !commit.is_empty() && !commit.contains(['/', '.'])) else {
        return Cached::Nothing;
    };
    let snapshot = repo_dir.join("snapshots").join(&commit);
    let path = snapshot.join(CONFIG);
    if path.is_file() {
        return Cached::File { commit, path };
    }
    if snapshot.is_dir() { Cached::SnapshotWithout { commit } } else { Cached::Nothing }
}

/// The config fetched into the cache with `hf-hub`, then read from it.
fn fetch(given: &Path, name: &HubName, cache: &Path) -> Result<ConfigSource, Failure> {
    let fetched = fetch_file(given, name, cache, CONFIG)?;
    let commit = match name.is_commit() {
        true => name.revision.clone(),
        false => {
            // the snapshot's folder is the commit: `snapshots/<commit>/config.json`
            let snapshot = fetched.parent().and_then(Path::file_name).and_then(|c| c.to_str());
            snapshot.map_or_else(|| "unknown".to_owned(), str::to_owned)
        }
    };
    Ok(ConfigSource::Hub {
        repo: name.repo.clone(),
        revision: name.revision.clone(),
        commit,
        path: fetched,
        fetched: true,
    })
}

/// `file` of the repo's revision fetched into the cache with `hf-hub`: its
/// path in the snapshot.
fn fetch_file(given: &Path, name: &HubName, cache: &Path, file: &str) -> Result<PathBuf, Failure> {
    let token = token(cache);
    log::info!("fetching {file} of {}@{} into {}", name.repo, name.revision, cache.display());
    // from the cache given (ApiBuilder::new reads the home folder's, and
    // panics without one); HF_ENDPOINT as the Hub's clients read it
    let mut builder = hf_hub::api::sync::ApiBuilder::from_cache(hf_hub::Cache::new(cache.to_path_buf()));
    if let Some(endpoint) = std::env::var("HF_ENDPOINT").ok().filter(|endpoint| !endpoint.is_empty()) {
        builder = builder.with_endpoint(endpoint);
    }
    let api = builder
        .with_token(token.as_ref().map(|(token, _)| token.clone()))
        .with_progress(false)
        .build()
        .map_err(|err| Failure::runtime(format!("--config {}: the Hub client: {err}", given.display())))?;
    let repo = hf_hub::Repo::with_revision(name.repo.clone(), hf_hub::RepoType::Model, name.revision.clone());
    api.repo(repo).get(file).map_err(|err| {
        let (status, code, transport) = match &err {
            hf_hub::api::sync::ApiError::RequestError(request) => match request.as_ref() {
                ureq::Error::Status(status, response) => {
                    (Some(*status), response.header("x-error-code").map(str::to_owned), None)
                }
                ureq::Error::Transport(transport) => (None, None, Some(transport.to_string())),
            },
            other => (None, None, Some(other.to_string())),
        };
        let token_from = token.as_ref().map(|(_, from)| *from);
        let why = fetch_error(name, file, status, code.as_deref(), token_from, transport.as_deref());
        Failure::usage(format!("--config {}: {why}", given.display()))
    })
}

/// The checkpoint's files in the cache.
static CHECKPOINT: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();

/// The checkpoint files `--weights` found, where it was given.
pub fn checkpoint() -> Option<&'static [PathBuf]> {
    CHECKPOINT.get().map(Vec::as_slice)
}

/// A checkpoint's single file, and its shards' index.
const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

/// `--weights`: the checkpoint beside the config `source` read, as
/// transformers saves it (`model.safetensors`, else the shards
/// `model.safetensors.index.json` names), from the same Hub snapshot (each
/// file fetched into the cache where missing and allowed) or the config's
/// folder; kept for the model's build.
pub fn find_checkpoint(source: &ConfigSource) -> Result<&'static [PathBuf], Failure> {
    let files = checkpoint_files(source)?;
    log::info!("weights: {} file(s) beside the config, from {}", files.len(), files[0].display());
    Ok(CHECKPOINT.get_or_init(|| files).as_slice())
}

fn checkpoint_files(source: &ConfigSource) -> Result<Vec<PathBuf>, Failure> {
    let folder = source.path().parent().unwrap_or(Path::new(".")).to_path_buf();
    // a file of the checkpoint: in the folder, or fetched into the snapshot (a Hub name, online)
    let hub = match source {
        ConfigSource::Hub { repo, commit, .. } => {
            Some((HubName { repo: repo.clone(), revision: commit.clone() }, commit))
        }
        ConfigSource::File { .. } => None,
    };
    let get = |file: &str| -> Result<Option<PathBuf>, Failure> {
        let path = folder.join(file);
        if path.is_file() {
            return Ok(Some(path));
        }
        match (&hub, cache_dir()) {
            (Some((name, _)), Some(cache)) if !offline() => {
                let given = PathBuf::from(&name.repo);
                match fetch_file(&given, name, &cache, file) {
                    Ok(path) => Ok(Some(path)),
                    // the Hub says it has no such file: the other layout may be there
                    Err(failure) if failure.message.contains(&format!("has no {file}")) => Ok(None),
                    Err(failure) => Err(failure),
                }
            }
            _ => Ok(None),
        }
    };
    if let Some(single) = get(SINGLE)? {
        return Ok(vec![single]);
    }
    let Some(index) = get(INDEX)? else {
        let how = match (&hub, offline()) {
            (Some((name, commit)), true) => format!(
                " (HF_HUB_OFFLINE is set: fetch them with `huggingface-cli download {} --revision {commit} \
                 --include '*.safetensors*'`)",
                name.repo
            ),
            _ => String::new(),
        };
        return Err(Failure::usage(format!(
            "--weights: no {SINGLE} or {INDEX} beside the config, in {}{how}; drop --weights to probe random \
             weights (the memory is the same)",
            folder.display()
        )));
    };
    let text = std::fs::read_to_string(&index)
        .map_err(|err| Failure::usage(format!("--weights: {} cannot be read: {err}", index.display())))?;
    let shards = shard_names(&text)
        .map_err(|why| Failure::usage(format!("--weights: {} is not a safetensors index: {why}", index.display())))?;
    let mut files = Vec::new();
    for shard in shards {
        match get(&shard)? {
            Some(path) => files.push(path),
            None => {
                return Err(Failure::usage(format!(
                    "--weights: {} names the shard {shard}, which is not in {}",
                    index.display(),
                    folder.display()
                )));
            }
        }
    }
    Ok(files)
}

/// The shard files a `model.safetensors.index.json` names (its
/// `weight_map`'s values), each once, in order; plain file names only.
fn shard_names(index: &str) -> Result<Vec<String>, String> {
    let value: serde_json::Value = serde_json::from_str(index).map_err(|err| err.to_string())?;
    let map = value.get("weight_map").and_then(serde_json::Value::as_object).ok_or("no weight_map object")?;
    let mut shards: Vec<String> = Vec::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| format!("the file of {tensor} is not a name"))?;
        if file.is_empty() || file.contains(['/', '\\']) || file.starts_with('.') {
            return Err(format!("the file of {tensor}, {file:?}, is not a plain file name"));
        }
        if !shards.iter().any(|known| known == file) {
            shards.push(file.to_owned());
        }
    }
    if shards.is_empty() {
        return Err("an empty weight_map".to_owned());
    }
    Ok(shards)
}

/// Why a fetch failed, in words that say what to do: the Hub answers 401
/// for a gated or private model and for one that does not exist (its
/// `X-Error-Code` tells them apart), 404 for a revision or a file it lacks.
pub fn fetch_error(
    name: &HubName,
    file: &str,
    status: Option<u16>,
    code: Option<&str>,
    token_from: Option<&str>,
    transport: Option<&str>,
) -> String {
    let HubName { repo, revision } = name;
    let offline = "or set HF_HUB_OFFLINE=1 to read only the cache";
    match (status, code) {
        (_, Some("GatedRepo")) => match token_from {
            None => format!(
                "{repo} is gated: accept its terms at https://huggingface.co/{repo} and set HF_TOKEN to a token \
                 of that account (or run `huggingface-cli login`)"
            ),
            Some(from) => format!(
                "{repo} is gated and the token from {from} may not read it: accept its terms at \
                 https://huggingface.co/{repo} with that account, or use one that has"
            ),
        },
        (_, Some("RevisionNotFound")) => format!(
            "{repo} has no revision {revision} on the Hub: give a branch, a tag or a commit it has (@main, the \
             default)"
        ),
        (_, Some("EntryNotFound")) if file == CONFIG => {
            format!("{repo}@{revision} has no {CONFIG} on the Hub: it is not a model transformers can load")
        }
        (_, Some("EntryNotFound")) => format!("{repo}@{revision} has no {file} on the Hub"),
        (_, Some("RepoNotFound")) | (Some(401), None) => match token_from {
            None => {
                format!("no model {repo} on the Hub, or a private one: check the name, or set HF_TOKEN if it is yours")
            }
            Some(from) => format!("no model {repo} on the Hub that the token from {from} may read: check the name"),
        },
        (Some(403), _) => format!(
            "the Hub refused {repo} (403) to the token{}: it may be gated (accept its terms at \
             https://huggingface.co/{repo}) or need another token",
            token_from.map(|from| format!(" from {from}")).unwrap_or_default()
        ),
        (Some(404), _) => format!("the Hub has no {file} at {repo}@{revision} (404): check the name and revision"),
        (Some(status), _) => format!("the Hub answered {status} for {repo}@{revision}: try again, {offline}"),
        (None, _) => format!(
            "could not fetch {repo}@{revision} from the Hub ({}): check the network, {offline}",
            transport.unwrap_or("no answer")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_names_are_told_from_paths() {
        let name = HubName::parse("meta-llama/Llama-3.2-1B").unwrap();
        assert_eq!((name.repo.as_str(), name.revision.as_str()), ("meta-llama/Llama-3.2-1B", "main"));
        assert_eq!(name.folder(), "models--meta-llama--Llama-3.2-1B");
        let pinned = HubName::parse("Qwen/Qwen3-0.6B@refs/pr/3").unwrap();
        assert_eq!(pinned.revision, "refs/pr/3");
        assert!(HubName::parse(&format!("org/name@{}", "a".repeat(40))).unwrap().is_commit());
        for not_a_name in [
            "config.json",
            "./org/name",
            "/abs/path",
            "a/b/c",
            "org/../x",
            "org/.hidden",
            "org/",
            "org/name@",
            "org name/x",
        ] {
            assert!(HubName::parse(not_a_name).is_none(), "{not_a_name}");
        }
    }

    /// Each way a fetch fails says what to do, in the Hub's own terms:
    /// gated (not "404"), a missing revision, a missing model, no network.
    #[test]
    fn a_failed_fetch_says_what_to_do() {
        let name = HubName::parse("meta-llama/Llama-3.1-8B@main").unwrap();
        let gated = fetch_error(&name, CONFIG, Some(401), Some("GatedRepo"), None, None);
        assert!(gated.contains("is gated") && gated.contains("HF_TOKEN") && !gated.contains("404"), "{gated}");
        let refused = fetch_error(&name, CONFIG, Some(403), Some("GatedRepo"), Some("HF_TOKEN"), None);
        assert!(refused.contains("the token from HF_TOKEN may not read it"), "{refused}");
        let revision = fetch_error(&name, CONFIG, Some(404), Some("RevisionNotFound"), None, None);
        assert!(revision.contains("no revision main"), "{revision}");
        let missing = fetch_error(&name, CONFIG, Some(401), Some("RepoNotFound"), None, None);
        assert!(missing.contains("no model meta-llama/Llama-3.1-8B on the Hub"), "{missing}");
        let offline = fetch_error(&name, CONFIG, None, None, None, Some("dns failed"));
        assert!(offline.contains("dns failed") && offline.contains("HF_HUB_OFFLINE=1"), "{offline}");
    }
}
