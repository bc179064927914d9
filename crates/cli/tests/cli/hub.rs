//! `--config ORG/NAME[@REVISION]` read offline from a cache laid out as the
//! Hub's clients lay it out (refs, snapshots whose files link into blobs),
//! built here: no test touches the network.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn config(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../models/tests/configs/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// A Hub cache with `org/tiny`: `main` and the tag `v1` (a one-layer copy),
/// a ref whose snapshot has no config.json, and one named by its commit.
struct Hub {
    root: PathBuf,
    main: String,
    v1: String,
}

impl Hub {
    fn new(name: &str) -> Hub {
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("hub-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let repo = root.join("hub").join("models--org--tiny");
        let (main, v1, bare) = ("a".repeat(40), "b".repeat(40), "c".repeat(40));
        let two_layers = config("tiny-llama.json");
        let one_layer = two_layers.replace(r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 1"#);
        for (commit, json, blob) in [(&main, &two_layers, "1".repeat(64)), (&v1, &one_layer, "2".repeat(64))] {
            std::fs::create_dir_all(repo.join("blobs")).unwrap();
            std::fs::write(repo.join("blobs").join(&blob), json).unwrap();
            let snapshot = repo.join("snapshots").join(commit);
            std::fs::create_dir_all(&snapshot).unwrap();
            std::os::unix::fs::symlink(Path::new("../../blobs").join(&blob), snapshot.join("config.json")).unwrap();
        }
        std::fs::create_dir_all(repo.join("snapshots").join(&bare)).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        for (reference, commit) in [("main", &main), ("v1", &v1), ("bare", &bare)] {
            std::fs::write(repo.join("refs").join(reference), commit).unwrap();
        }
        Hub { root, main, v1 }
    }

    /// The binary with this cache as `HF_HUB_CACHE`, offline.
    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_autobatch"))
            .args(args)
            .env("HF_HUB_CACHE", self.root.join("hub"))
            .env("HF_HUB_OFFLINE", "1")
            .env_remove("HF_HOME")
            .env_remove("HF_TOKEN")
            .env_remove("RUST_LOG")
            .current_dir(&self.root)
            .output()
            .unwrap()
    }
}

fn json(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "{}", text(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn a_hub_name_is_read_from_the_cache_and_said_with_its_commit() {
    let hub = Hub::new("read");
    let main = json(&hub.run(&["estimate", "--config", "org/tiny", "--json"]));
    let source = &main["config_source"];
    assert_eq!(
        (&source["from"], &source["repo"], &source["revision"]),
        (&"hub".into(), &"org/tiny".into(), &"main".into())
    );
    assert_eq!(source["commit"], hub.main.as_str(), "{main}");
    assert_eq!(source["fetched"], false);
    // a tag, and a commit, name their own snapshots
    let v1 = json(&hub.run(&["estimate", "--config", "org/tiny@v1", "--json"]));
    assert_eq!(v1["config_source"]["commit"], hub.v1.as_str());
    let by_commit = json(&hub.run(&["estimate", "--config", &format!("org/tiny@{}", hub.v1), "--json"]));
    assert_eq!(by_commit["state"], v1["state"]);
    assert!(v1["state"]["parameters"].as_u64() < main["state"]["parameters"].as_u64(), "one layer against two");
    // in words, where the answer is
    let said = text(&hub.run(&["estimate", "--config", "org/tiny"]).stdout);
    assert!(
        said.starts_with(&format!("config: org/tiny@main, commit {}, from the Hugging Face cache", hub.main)),
        "{said}"
    );
    // probe and serve read it the same way, and their JSON carries it
    let probe = json(&hub.run(&[
        "probe",
        "--config",
        "org/tiny",
        "--layers",
        "1",
        "--seq-len",
        "16",
        "--budget",
        "32MiB",
        "--json",
    ]));
    assert_eq!(probe["config_source"]["commit"], hub.main.as_str(), "{probe}");
    let serve =
        json(&hub.run(&["serve", "--config", "org/tiny@v1", "--budget", "32MiB", "--max-model-len", "64", "--json"]));
    assert_eq!(serve["config_source"]["commit"], hub.v1.as_str(), "{serve}");
    // HF_HOME/hub when HF_HUB_CACHE is not set
    let output = Command::new(env!("CARGO_BIN_EXE_autobatch"))
        .args(["estimate", "--config", "org/tiny", "--json"])
        .env("HF_HOME", &hub.root)
        .env("HF_HUB_OFFLINE", "1")
        .env_remove("HF_HUB_CACHE")
        .output()
        .unwrap();
    assert_eq!(json(&output)["config_source"]["commit"], hub.main.as_str());
}

/// Each way a name is not found says where it looked and how to fetch it.
#[test]
fn a_name_not_in_the_cache_says_where_it_looked_and_how_to_fetch_it() {
    let hub = Hub::new("missing");
    let refused = |args: &[&str], says: &[&str]| {
        let output = hub.run(args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        for said in says {
            assert!(stderr.contains(said), "{args:?}: want {said:?} in {stderr}");
        }
    };
    refused(
        &["estimate", "--config", "org/absent"],
        &[
            "neither a file nor in the Hugging Face cache",
            "models--org--absent",
            "huggingface-cli download org/absent config.json",
            "HF_HUB_OFFLINE",
        ],
    );
    refused(&["probe", "--config", "org/tiny@nope"], &["refs/nope", "--revision nope"]);
    refused(&["serve", "--config", "org/tiny@bare"], &["has no config.json", &"c".repeat(40)]);
    // not a Hub name at all: the file reader's own words
    refused(&["estimate", "--config", "no/such/file.json"], &["name a readable config.json"]);
}

/// A name that is also a local path reads the local file, and says so.
#[test]
fn a_local_file_of_the_same_name_wins_and_is_said() {
    let hub = Hub::new("local");
    std::fs::create_dir_all(hub.root.join("org")).unwrap();
    let one_layer = config("tiny-llama.json").replace(r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 1"#);
    std::fs::write(hub.root.join("org").join("tiny"), one_layer).unwrap();
    let local = json(&hub.run(&["estimate", "--config", "org/tiny", "--json"]));
    assert_eq!(
        (&local["config_source"]["from"], &local["config_source"]["hub_name_too"]),
        (&"file".into(), &true.into())
    );
    let said = text(&hub.run(&["estimate", "--config", "org/tiny"]).stdout);
    assert!(said.starts_with("config: the local file org/tiny (a Hub model has that name too"), "{said}");
}

/// A stand-in for the Hub on loopback (`HF_ENDPOINT`), answering every
/// request as `answer` says: what the fetch does with the Hub's answers,
/// seen without the network.
fn fake_hub(answer: impl Fn(&str) -> String + Send + 'static) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                request.push(byte[0]);
            }
            let _ = stream.write_all(answer(&String::from_utf8_lossy(&request)).as_bytes());
        }
    });
    format!("http://{address}")
}

impl Hub {
    /// The binary with this cache, online against `endpoint`.
    fn fetch(&self, args: &[&str], endpoint: &str, token: Option<&str>) -> Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_autobatch"));
        command
            .args(args)
            .env("HF_HUB_CACHE", self.root.join("hub"))
            .env("HF_ENDPOINT", endpoint)
            .env("HOME", &self.root)
            .env_remove("HF_HUB_OFFLINE")
            .env_remove("HF_HOME")
            .env_remove("HF_TOKEN")
            .current_dir(&self.root);
        if let Some(token) = token {
            command.env("HF_TOKEN", token);
        }
        command.output().unwrap()
    }
}

/// A name not in the cache is fetched into it (then read from it, offline),
/// and the Hub's refusals say what they are: a gated model is "gated", with
/// what to do, not a status code; the token is sent where one is set.
#[test]
fn a_name_not_in_the_cache_is_fetched_and_a_gated_one_says_so() {
    let hub = Hub::new("fetch");
    let body = config("tiny-llama.json");
    let commit = "d".repeat(40);
    let (body_served, commit_served) = (body.clone(), commit.clone());
    let endpoint = fake_hub(move |request| {
        let len = body_served.len();
        let start = request
            .lines()
            .find_map(|line| line.to_ascii_lowercase().strip_prefix("range: bytes=").map(str::to_owned))
            .and_then(|range| range.split('-').next().and_then(|s| s.parse::<usize>().ok()))
            .unwrap_or(0);
        let end = if request.to_ascii_lowercase().contains("range: bytes=0-0") { 0 } else { len - 1 };
        let part = &body_served[start..=end];
        format!(
            "HTTP/1.1 206 Partial Content\r\nx-repo-commit: {commit_served}\r\netag: \"{}\"\r\ncontent-range: bytes \
             {start}-{end}/{len}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{part}",
            "e".repeat(64),
            part.len()
        )
    });
    let fetched = json(&hub.fetch(&["estimate", "--config", "org/new", "--json"], &endpoint, None));
    let source = &fetched["config_source"];
    assert_eq!((&source["fetched"], &source["commit"]), (&true.into(), &commit.as_str().into()), "{fetched}");
    // in the cache as the Hub's clients lay it out: read again offline
    let again = json(&hub.run(&["estimate", "--config", "org/new", "--json"]));
    assert_eq!(
        (&again["config_source"]["fetched"], &again["config_source"]["commit"]),
        (&false.into(), &commit.as_str().into())
    );
    assert_eq!(again["state"], fetched["state"]);

    let tokens = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = tokens.clone();
    let gated = fake_hub(move |request| {
        let token = request
            .lines()
            .find_map(|line| line.strip_prefix("authorization: ").or(line.strip_prefix("Authorization: ")));
        seen.lock().unwrap().push(token.map(str::to_owned));
        "HTTP/1.1 401 Unauthorized\r\nx-error-code: GatedRepo\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            .to_owned()
    });
    let output = hub.fetch(&["estimate", "--config", "meta-llama/Llama-3.1-8B"], &gated, None);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("meta-llama/Llama-3.1-8B is gated") && stderr.contains("HF_TOKEN") && !stderr.contains("401"),
        "{stderr}"
    );
    let output = hub.fetch(&["estimate", "--config", "meta-llama/Llama-3.1-8B"], &gated, Some("hf_abc"));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("the token from HF_TOKEN may not read it"), "{stderr}");
    assert!(tokens.lock().unwrap().iter().any(|token| token.as_deref() == Some("Bearer hf_abc")), "the token was sent");
}

/// The tensors of a random `tiny-llama` as transformers names them.
fn tiny_tensors(layers: usize) -> std::collections::HashMap<String, candle_core::Tensor> {
    let config = autobatch_models::Config::from_json(&config("tiny-llama.json")).unwrap().with_layers(layers).unwrap();
    let model =
        autobatch_models::ConfigModel::build(&config, &autobatch_models::Training::new(16), &candle_core::Device::Cpu)
            .unwrap();
    let data = model.varmap().data().lock().unwrap();
    data.iter().map(|(name, var)| (name.clone(), var.as_tensor().clone())).collect()
}

/// `file` written into the snapshot of `commit` as the Hub lays it: a blob,
/// and a link to it in the snapshot.
fn put(hub: &Hub, commit: &str, file: &str, bytes: &[u8]) {
    let repo = hub.root.join("hub").join("models--org--tiny");
    let blob = format!("{:064x}", bytes.len() as u128 * 7919 + file.len() as u128);
    std::fs::write(repo.join("blobs").join(&blob), bytes).unwrap();
    std::os::unix::fs::symlink(Path::new("../../blobs").join(&blob), repo.join("snapshots").join(commit).join(file))
        .unwrap();
}

fn safetensors(tensors: &std::collections::HashMap<String, candle_core::Tensor>) -> Vec<u8> {
    let path = std::env::temp_dir().join(format!("autobatch-hub-{}-{}.safetensors", std::process::id(), tensors.len()));
    candle_core::safetensors::save(tensors, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    bytes
}

/// `--weights` loads the checkpoint beside the config, from the same
/// snapshot: one file, or the shards an index names; a checkpoint that is
/// not the config's is refused by its tensor (it was read), and a snapshot
/// without one says how to fetch it.
#[test]
fn weights_come_from_the_same_snapshot_whole_or_sharded() {
    let hub = Hub::new("weights");
    let tensors = tiny_tensors(2);
    put(&hub, &hub.main, "model.safetensors", &safetensors(&tensors));
    let probe = ["probe", "--seq-len", "16", "--budget", "32MiB", "--check", "1", "--json"];
    fn with<'a>(probe: &[&'a str], config: &'a str) -> Vec<&'a str> {
        [probe, &["--config", config, "--weights"]].concat()
    }
    let whole = json(&hub.run(&with(&probe, "org/tiny")));
    let weights = whole["config_source"]["weights"].as_array().unwrap();
    assert_eq!(weights.len(), 1, "{whole}");
    assert!(weights[0].as_str().unwrap().ends_with(&format!("snapshots/{}/model.safetensors", hub.main)));
    // sharded: two files and their index, in the v1 snapshot (its config has one layer)
    let (mut first, mut second) = (std::collections::HashMap::new(), std::collections::HashMap::new());
    let mut map = serde_json::Map::new();
    for (i, (name, tensor)) in tiny_tensors(1).iter().enumerate() {
        let (shard, file) = if i % 2 == 0 {
            (&mut first, "model-00001-of-00002.safetensors")
        } else {
            (&mut second, "model-00002-of-00002.safetensors")
        };
        shard.insert(name.clone(), tensor.clone());
        map.insert(name.clone(), file.into());
    }
    put(&hub, &hub.v1, "model-00001-of-00002.safetensors", &safetensors(&first));
    put(&hub, &hub.v1, "model-00002-of-00002.safetensors", &safetensors(&second));
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    put(&hub, &hub.v1, "model.safetensors.index.json", index.to_string().as_bytes());
    let sharded = json(&hub.run(&with(&probe, "org/tiny@v1")));
    assert_eq!(sharded["config_source"]["weights"].as_array().unwrap().len(), 2, "{sharded}");
    // the file is read: a checkpoint of another shape is refused by its tensor
    let mut wrong = tensors.clone();
    wrong.insert(
        "model.embed_tokens.weight".into(),
        candle_core::Tensor::zeros((3, 3), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap(),
    );
    std::fs::create_dir_all(hub.root.join("local")).unwrap();
    std::fs::write(hub.root.join("local").join("config.json"), config("tiny-llama.json")).unwrap();
    std::fs::write(hub.root.join("local").join("model.safetensors"), safetensors(&wrong)).unwrap();
    let output = hub.run(&with(&probe, "local/config.json"));
    assert_ne!(output.status.code(), Some(0), "a wrong checkpoint loads: {}", text(&output.stdout));
    assert!(text(&output.stderr).contains("model.embed_tokens.weight"), "{}", text(&output.stderr));
    // none beside the config, offline: where it looked and how to fetch it
    let output = hub.run(&with(&probe, "org/tiny@bare"));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("has no config.json"), "the bare snapshot has no config either: {stderr}");
    std::fs::create_dir_all(hub.root.join("bare")).unwrap();
    std::fs::write(hub.root.join("bare").join("config.json"), config("tiny-llama.json")).unwrap();
    let output = hub.run(&with(&probe, "bare/config.json"));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--weights: no model.safetensors or model.safetensors.index.json beside the config"),
        "{stderr}"
    );
    // a checkpoint is loaded as saved: its own layers
    let output = hub.run(&[&with(&probe, "org/tiny")[..], &["--layers", "1"]].concat());
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("--weights loads the checkpoint as saved"), "{}", text(&output.stderr));
}
