//! What an adversary found (issue 68), each as the command that showed it:
//! no panic on a failed write, no stale answer from the cache, no flag
//! silently ignored, no file overwritten that the tool did not write.

use std::process::{Command, Output, Stdio};

fn config(name: &str) -> String {
    format!("{}/../models/tests/configs/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_autobatch"));
    command.args(args).env_remove("RUST_LOG").env("RUST_BACKTRACE", "1");
    command
}

fn autobatch(args: &[&str]) -> Output {
    command(args).output().expect("the binary runs")
}

/// A folder of its own for each test.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("adversary-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Exit 2 and one line on stderr that says `says`.
fn assert_refused(args: &[&str], says: &str) {
    let output = autobatch(args);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: one line, got {stderr:?}");
    assert!(stderr.starts_with("error: ") && stderr.contains(says), "{args:?}: want {says:?} in {stderr:?}");
}

/// The commands of the report, each with a small answer.
fn every_command() -> Vec<Vec<String>> {
    let tiny = config("tiny-llama.json");
    let commands: [&[&str]; 6] = [
        &["plan", "--target", "100", "--largest", "7"],
        &["probe", "--model", "mlp", "--budget", "16MiB", "--max-batch", "8"],
        &["probe", "--model", "mlp", "--budget", "16MiB", "--max-batch", "8", "--json"],
        &["estimate", "--params", "1B", "--capacity", "24GB"],
        &["serve", "--config", &tiny, "--budget", "64MiB"],
        &["estimate", "--config", &tiny, "--serve", "--capacity", "64MiB"],
    ];
    commands.iter().map(|args| args.iter().map(|s| (*s).to_owned()).collect()).collect()
}

#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_on_stdout_or_stderr_is_exit_1_and_a_line_not_a_panic() {
    for args in every_command() {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let full = || std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let output = command(&args).stdout(full()).output().unwrap();
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?} > /dev/full: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(
            stderr.lines().last(),
            Some("error: could not write to standard output: No space left on device (os error 28)"),
            "{args:?}: {stderr}"
        );
        // a command that writes to stderr (probe --json: its trial rows) fails with it
        let writes_to_stderr = args.contains(&"--json") && args[0] == "probe";
        let output = command(&args).stderr(full()).stdout(Stdio::null()).output().unwrap();
        let code = if writes_to_stderr { 1 } else { 0 };
        assert_eq!(output.status.code(), Some(code), "{args:?} 2> /dev/full");
    }
    // a warning is a write too: lost to a full stderr, the command says so by
    // its exit code (issue 85: a config with an unknown key exited 0)
    let dir = scratch("warning-to-full");
    let path = dir.join("config.json");
    let json = std::fs::read_to_string(config("tiny-llama.json")).unwrap();
    std::fs::write(&path, json.replacen('{', r#"{"an_unknown_key": 1,"#, 1)).unwrap();
    let args = ["probe", "--config", path.to_str().unwrap(), "--layers", "1", "--seq-len", "16", "--budget", "32MiB"];
    let said = command(&args).stdout(Stdio::null()).output().unwrap();
    assert!(text(&said.stderr).contains("warning: "), "the config warns: {}", text(&said.stderr));
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let output = command(&args).stderr(full).stdout(Stdio::null()).output().unwrap();
    assert_eq!(output.status.code(), Some(1), "a warning lost to 2> /dev/full");
}

#[test]
fn a_cached_search_cut_short_is_searched_again_not_served() {
    let dir = scratch("cache");
    let cache = dir.join("c.json");
    let cache = cache.to_str().unwrap();
    let tiny = config("tiny-llama.json");
    let probe = ["probe", "--config", &tiny, "--layers", "1", "--seq-len", "16", "--budget", "32MiB", "--json"];
    let largest = |extra: &[&str]| {
        let output = autobatch(&[&probe[..], &["--cache", cache], extra].concat());
        assert!(output.status.success(), "{}", text(&output.stderr));
        let plan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        (plan["largest_batch"].as_u64().unwrap(), plan["proven_largest"].as_bool().unwrap(), plan)
    };
    let (cut, proven, _) = largest(&["--max-trials", "2"]);
    assert!(!proven);
    let (answer, proven, plan) = largest(&[]);
    assert!(proven && answer > cut, "{plan}");
    assert!(!plan["cached"].as_bool().unwrap(), "{plan}");
    assert!(plan.to_string().contains("cached_unproven"), "the output says it searched again: {plan}");
    let (again, proven, plan) = largest(&[]);
    assert!(proven && again == answer && plan["cached"].as_bool().unwrap(), "{plan}");
}

/// A cached entry edited to another ceiling than its key names is not
/// served, and one line says so at the default verbosity (the tuner's own
/// warnings are left to the plan's report; this one is the cache's).
#[test]
fn an_edited_cache_entry_is_probed_again_and_said() {
    let dir = scratch("edited-cache");
    let cache = dir.join("plans.json");
    let args = ["probe", "--model", "mlp", "--budget", "16MiB", "--max-batch", "4", "--json", "--cache"];
    let args = [&args[..], &[cache.to_str().unwrap()]].concat();
    assert!(autobatch(&args).status.success());
    let mut stored: serde_json::Value = serde_json::from_slice(&std::fs::read(&cache).unwrap()).unwrap();
    let entry = stored["entries"].as_object_mut().unwrap().values_mut().next().unwrap();
    // above the key's 0.9, so that the plan's peak stays under the ceiling it
    // claims on any host: only the disagreement with its key is at fault
    entry["plan"]["ceiling"] = serde_json::json!(0.95);
    std::fs::write(&cache, serde_json::to_vec(&stored).unwrap()).unwrap();
    let output = autobatch(&args);
    let (stderr, plan) = (text(&output.stderr), serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap());
    assert_eq!(plan["cached"], false, "{plan}");
    let said: Vec<&str> = stderr.lines().filter(|line| line.contains("plan cache")).collect();
    assert_eq!(
        said,
        ["warning: ignoring an entry of the plan cache ".to_owned()
            + cache.to_str().unwrap()
            + " (probing instead): ceiling 0.95 where its key says 0.9"],
        "{stderr}"
    );
}

#[test]
fn a_config_flag_beside_a_reference_model_is_refused_not_ignored() {
    for flag in [&["--lora", "4"][..], &["--attention", "eager"], &["--ops", "eager"], &["--loss", "full"]] {
        let args = [&["probe", "--model", "transformer", "--budget", "64MiB", "--max-batch", "2"][..], flag].concat();
        assert_refused(&args, &format!("{} applies to a model from a config.json", flag[0]));
    }
    assert_refused(&["probe", "--model", "mlp", "--lora", "4"], "--lora applies to a model from a config.json");
}

#[test]
fn a_training_flag_beside_estimate_serve_is_refused_not_ignored() {
    let tiny = config("tiny-llama.json");
    let serve = ["estimate", "--config", tiny.as_str(), "--serve", "--capacity", "64MiB"];
    let training: [&[&str]; 10] = [
        &["--ops", "eager"],
        &["--attention", "eager"],
        &["--loss", "full"],
        &["--recompute", "full"],
        &["--optimizer", "lion"],
        &["--zero", "2", "--ranks", "2"],
        &["--layers", "1"],
        &["--dtype", "bf16"],
        &["--which-gpus"],
        &["--mixed-precision"],
    ];
    for flag in training {
        assert_refused(&[&serve[..], flag].concat(), "--serve");
    }
    // --on-cpu counts a config's step (or its serving) on the CPU: a bare parameter count has none
    assert_refused(
        &["estimate", "--params", "1B", "--on-cpu"],
        "--on-cpu counts a config's step on the CPU heap: add --config",
    );
}

#[test]
fn small_things_are_said() {
    let tiny = config("tiny-llama.json");
    assert_refused(&["probe", "--model", "mlp", "--exact"], "--target-effective-batch");
    assert_refused(&["probe", "--seq-len", "8", "--seq-len", "16"], "--seq-len is given twice: give it once");
    assert_refused(
        &["probe", "--config", &tiny, "--lora", "4", "--lora-targets", "q_proj,q_proj"],
        "name each module once (q_proj is given twice)",
    );
    let dir = scratch("configs");
    let edited = |name: &str, key: &str, value: serde_json::Value| {
        let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&tiny).unwrap()).unwrap();
        json[key] = value;
        let path = dir.join(name);
        std::fs::write(&path, json.to_string()).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let f16 = edited("f16.json", "torch_dtype", serde_json::json!("float16"));
    let output = autobatch(&["probe", "--config", &f16, "--budget", "64MiB", "--max-batch", "1"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("torch_dtype float16 is trained here in bf16"), "{}", text(&output.stderr));
    let quantized = edited("q.json", "quantization_config", serde_json::json!({"bits": 4}));
    let output = autobatch(&["probe", "--config", &quantized]);
    let stderr = text(&output.stderr);
    assert!(stderr.contains("use no quantization_config, or null"), "{stderr}");
    let fractional = edited("h.json", "hidden_size", serde_json::json!(64.0));
    let output = autobatch(&["probe", "--config", &fractional]);
    let stderr = text(&output.stderr);
    assert!(stderr.contains("written without a fraction: 64, not 64.0 (refused as written)"), "{stderr}");
    assert_refused(
        &["serve", "--config", &tiny, "--budget", "64MiB", "--check", "18446744073709551615"],
        "--check 18446744073709551615: 18446744073709551615 and one more",
    );
}

#[cfg(unix)]
#[test]
fn a_file_the_tool_did_not_write_is_never_written_over() {
    let dir = scratch("files");
    let tiny = config("tiny-llama.json");
    let quick = |extra: &[&str]| {
        let args = [&["probe", "--model", "mlp", "--budget", "16MiB", "--max-batch", "4"][..], extra].concat();
        command(&args).current_dir(&dir).output().unwrap()
    };
    let refused = |output: Output, says: &str| {
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(says), "want {says:?} in {stderr}");
    };
    std::fs::write(dir.join("important.txt"), "keep").unwrap();
    std::os::unix::fs::symlink("important.txt", dir.join("link.svg")).unwrap();
    refused(quick(&["--plot", "link.svg"]), "is a symbolic link");
    std::fs::write(dir.join("foreign.svg"), "mine").unwrap();
    refused(quick(&["--plot", "foreign.svg"]), "is not a chart autobatch wrote");
    refused(quick(&["--cache", "no-such-dir/c.json"]), "does not exist");
    refused(quick(&["--plot", "no-such-dir/c.svg"]), "does not exist");
    assert_eq!(std::fs::read_to_string(dir.join("important.txt")).unwrap(), "keep");
    assert_eq!(std::fs::read_to_string(dir.join("foreign.svg")).unwrap(), "mine");
    // the config itself, for probe and serve
    std::fs::copy(&tiny, dir.join("cfg.svg")).unwrap();
    let config_args = ["--config", "cfg.svg", "--budget", "64MiB", "--plot", "cfg.svg"];
    refused(
        command(&[&["probe"][..], &config_args].concat()).current_dir(&dir).output().unwrap(),
        "is the file --config reads",
    );
    refused(
        command(&[&["serve"][..], &config_args].concat()).current_dir(&dir).output().unwrap(),
        "is the file --config reads",
    );
    assert_eq!(std::fs::read(dir.join("cfg.svg")).unwrap(), std::fs::read(&tiny).unwrap());
    // a chart of its own it replaces, whole
    assert!(quick(&["--plot", "chart.svg"]).status.success());
    assert!(quick(&["--plot", "chart.svg"]).status.success());
    assert!(std::fs::read_to_string(dir.join("chart.svg")).unwrap().contains("<svg"));
}

/// The nothing-fits advice is what each change does when made: every change
/// said to fit fits when run, and every one said to stay over does not.
#[test]
fn nothing_fits_advice_on_a_config_model_holds_when_each_change_is_made() {
    let tiny = config("tiny-llama.json");
    // room from what the process holds before a step here (the matmul buffers
    // differ by host): batch 1 of 512 tokens peaks some 5.6 MiB above it
    let probed = autobatch(&["probe", "--config", &tiny, "--max-batch", "1", "--budget", "64MiB", "--json"]);
    let plan: serde_json::Value =
        serde_json::from_slice(&probed.stdout).unwrap_or_else(|_| panic!("{}", text(&probed.stderr)));
    let held = plan["trials"][0]["baseline_bytes"].as_u64().unwrap();
    let budget = format!("{}B", ((held + (49 << 20) / 10) as f64 / 0.9).ceil() as u64);
    let budget = budget.as_str();
    let output = autobatch(&["probe", "--config", &tiny, "--budget", budget]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    let advice = stderr.split("what would help, each alone (each run at batch 1): ").nth(1).expect(&stderr);
    let mut checked = 0;
    for item in advice.split("; ").filter(|item| item.contains("measured")) {
        let flags: Vec<&str> = item.split(':').next().unwrap().split_whitespace().collect();
        let fits = item.ends_with("(fits)");
        let run =
            autobatch(&[&["probe", "--config", &tiny, "--budget", budget, "--max-batch", "1"][..], &flags].concat());
        assert_eq!(run.status.success(), fits, "{item}: {}", text(&run.stderr));
        checked += 1;
    }
    assert!(checked >= 4, "{advice}");
}

#[test]
fn serve_advice_names_no_flag_already_set_and_a_length_that_fits() {
    let tiny = config("tiny-llama.json");
    let quantized = ["serve", "--config", tiny.as_str(), "--weights", "q4_0", "--kv-cache-dtype", "int8"];
    // a budget from what the process holds here (the matmul buffers differ by
    // host): a limit 1 MiB above it, under the 512-token step, over a shorter one
    let checked = autobatch(&[&quantized[..], &["--budget", "64MiB", "--check", "1", "--json"]].concat());
    let report: serde_json::Value =
        serde_json::from_slice(&checked.stdout).unwrap_or_else(|_| panic!("{}", text(&checked.stderr)));
    let held = report["held_bytes"].as_u64().unwrap();
    let budget = format!("{}B", ((held + (1 << 20)) as f64 / 0.9).ceil() as u64);
    let set = [&quantized[..], &["--budget", budget.as_str()]].concat();
    let output = autobatch(&set);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    // set by its 0.1 spelling, --weights: the one flag, advised by its name or not at all
    assert!(!stderr.contains("--base-dtype q4_0 (") && !stderr.contains("--kv-cache-dtype int8 ("), "{stderr}");
    let length = stderr.split("--max-model-len ").nth(1).and_then(|rest| rest.split(' ').next()).expect(&stderr);
    let run = autobatch(&[&set[..], &["--max-model-len", length]].concat());
    assert!(run.status.success(), "--max-model-len {length}: {}", text(&run.stderr));
}
