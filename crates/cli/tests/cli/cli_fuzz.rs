//! The command line as an adversary types it: random flags with absurd,
//! negative, huge, fractional and empty values. Whatever the input, the
//! binary exits 0–3, never panics or aborts, says what went wrong in one
//! `error:` line, and every number it prints is consistent.
//!
//! Each run is the real binary under a virtual-memory limit and a time limit,
//! so an allocation that would take the machine down aborts the run (and fails
//! the test) instead. Budgets that are allowed stay small, so that a case takes
//! a second or two.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use crate::common::names_no_internals;

/// Address space a run may take: far above what a 32 MiB probe needs (threads'
/// stacks and the over-budget trial included), far below a runaway allocation.
const ADDRESS_SPACE_KIB: u64 = 6 << 20;
const TIME_LIMIT: Duration = Duration::from_secs(120);

fn autobatch(args: &[String]) -> (Output, Duration) {
    autobatch_under(ADDRESS_SPACE_KIB, args)
}

/// A run with `kib` KiB of address space (`ulimit -v`).
fn autobatch_under(kib: u64, args: &[String]) -> (Output, Duration) {
    let started = Instant::now();
    let output = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {kib}; exec timeout {} \"$0\" \"$@\"", TIME_LIMIT.as_secs()))
        .arg(env!("CARGO_BIN_EXE_autobatch"))
        .args(args)
        .env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("sh runs");
    (output, started.elapsed())
}

/// Mostly small valid counts (so that runs get far), sometimes absurd ones.
fn counts() -> impl Strategy<Value = String> {
    prop_oneof![3 => (1usize..=40).prop_map(|n| n.to_string()), 2 => absurd_counts()]
}

fn absurd_counts() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0"),
        Just("1"),
        Just("3"),
        Just("8"),
        Just("64"),
        Just("100000"),
        Just("4294967296"),
        Just("18446744073709551615"),
        Just("18446744073709551616"),
        Just("-1"),
        Just("-0"),
        Just("0.5"),
        Just("1e3"),
        Just(""),
        Just("lots"),
    ]
    .prop_map(str::to_owned)
}

fn sizes() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0"),
        Just("1B"),
        Just("1MiB"),
        Just("8MiB"),
        Just("32MiB"),
        Just("-5MiB"),
        Just("0.5"),
        Just("1024TiB"),
        Just("16EiB"),
        Just("1e400GB"),
        Just("10TB"),
        Just("nan GB"),
        Just("12 gigs"),
        Just(""),
    ]
    .prop_map(str::to_owned)
}

fn fractions() -> impl Strategy<Value = String> {
    prop_oneof![Just("0.9"), Just("0.5"), Just("1"), Just("0"), Just("-0.5"), Just("1.5"), Just("nan"), Just("inf")]
        .prop_map(str::to_owned)
}

fn flag(name: &'static str, values: impl Strategy<Value = String>) -> impl Strategy<Value = Vec<String>> {
    values.prop_map(move |value| vec![name.to_owned(), value])
}

fn probe() -> impl Strategy<Value = Vec<String>> {
    let model = prop_oneof![Just("transformer"), Just("mlp"), Just("convnet"), Just("resnet")]
        .prop_map(|m| vec!["--model".to_owned(), m.to_owned()]);
    let flags = prop::collection::vec(
        prop_oneof![
            flag("--seq-len", counts()),
            flag(
                "--seq-lens",
                prop_oneof![Just("8,16"), Just("4,0"), Just("2,x"), Just(""), Just("16,16,4"), Just("99999999999")]
                    .prop_map(str::to_owned)
            ),
            flag("--d-model", counts()),
            flag("--heads", counts()),
            flag("--layers", counts()),
            flag("--vocab", counts()),
            flag("--width", counts()),
            flag("--depth", counts()),
            flag("--resolution", counts()),
            flag("--classes", counts()),
            flag("--start", counts()),
            flag("--multiple-of", counts()),
            flag("--max-batch", counts()),
            flag("--max-trials", counts()),
            flag("--target-effective-batch", counts()),
            flag("--world-size", counts()),
            flag("--ceiling", fractions()),
            flag(
                "--strategy",
                prop_oneof![Just("predictive"), Just("binary"), Just("power"), Just("best")].prop_map(str::to_owned)
            ),
            flag(
                "--optimizer",
                prop_oneof![Just("adamw"), Just("lion"), Just("adafactor"), Just("adam8bit"), Just("sgd")]
                    .prop_map(str::to_owned)
            ),
            flag("--precision", prop_oneof![Just("f32"), Just("bf16"), Just("mixed")].prop_map(str::to_owned)),
            Just(vec!["--json".to_owned()]),
            Just(vec!["--exact".to_owned()]),
            Just(vec!["--eval".to_owned()]),
        ],
        0..5,
    );
    // the budget: small when valid, so a case stays quick; absurd otherwise
    let budget = prop_oneof![2 => Just("8MiB".to_owned()), 2 => Just("32MiB".to_owned()), 1 => sizes()]
        .prop_map(|budget| vec!["--budget".to_owned(), budget]);
    (model, flags, budget).prop_map(|(model, flags, budget)| {
        let mut args = vec!["probe".to_owned()];
        args.extend(model);
        args.extend(flags.into_iter().flatten());
        args.extend(budget);
        args
    })
}

/// A probe that should run: each model with its own flags at small sizes, and
/// the search settings anywhere in their valid ranges.
fn runnable_probe() -> impl Strategy<Value = Vec<String>> {
    let model = prop_oneof![
        (1usize..=48, prop::sample::select(vec![(8usize, 1usize), (16, 2), (32, 4)]), 1usize..=3).prop_map(
            |(seq_len, (d_model, heads), layers)| {
                format!("--model transformer --seq-len {seq_len} --d-model {d_model} --heads {heads} --layers {layers}")
            }
        ),
        (1usize..=128, 1usize..=3).prop_map(|(width, depth)| format!("--model mlp --width {width} --depth {depth}")),
        prop::sample::select(vec![4usize, 8, 16]).prop_map(|side| format!("--model convnet --resolution {side}")),
    ];
    let settings = (
        1usize..=8,
        1usize..=8,
        prop::option::of(1usize..=2000),
        1usize..=4,
        prop::sample::select(vec!["predictive", "binary", "power"]),
        30u32..=100,
        8u64..=48,
        any::<bool>(),
    );
    (model, settings).prop_map(|(model, (start, multiple_of, target, ranks, strategy, ceiling, budget, eval))| {
        let mut line = format!(
            "probe {model} --start {start} --multiple-of {multiple_of} --world-size {ranks} --strategy {strategy} \
             --ceiling {} --budget {budget}MiB --json",
            f64::from(ceiling) / 100.0
        );
        if let Some(target) = target {
            line += &format!(" --target-effective-batch {target}");
        }
        if eval {
            line += " --eval";
        }
        line.split_whitespace().map(str::to_owned).collect()
    })
}

fn estimate() -> impl Strategy<Value = Vec<String>> {
    let params = prop_oneof![
        Just("1e9"),
        Just("7B"),
        Just("125M"),
        Just("1e18"),
        Just("2e18"),
        Just("1e19"),
        Just("5e18"),
        Just("0.5"),
        Just("0"),
        Just("-3"),
        Just("1.3b"),
        Just("18446744073709551615"),
    ]
    .prop_map(|p| vec!["--params".to_owned(), p.to_owned()]);
    let flags = prop::collection::vec(
        prop_oneof![
            flag("--capacity", sizes()),
            flag("--activations", sizes()),
            flag("--dtype", prop_oneof![Just("f32"), Just("fp32"), Just("bf16"), Just("fp8")].prop_map(str::to_owned)),
            flag(
                "--optimizer",
                prop_oneof![Just("adamw"), Just("sgd"), Just("adafactor"), Just("adam8bit"), Just("lion")]
                    .prop_map(str::to_owned)
            ),
            Just(vec!["--mixed-precision".to_owned()]),
            Just(vec!["--json".to_owned()]),
        ],
        0..4,
    );
    (params, flags).prop_map(|(params, flags)| {
        let mut args = vec!["estimate".to_owned()];
        args.extend(params);
        args.extend(flags.into_iter().flatten());
        args
    })
}

fn plan() -> impl Strategy<Value = Vec<String>> {
    (
        counts(),
        counts(),
        prop::collection::vec(
            prop_oneof![
                flag("--world-size", counts()),
                flag("--multiple-of", counts()),
                Just(vec!["--equal-micro-batches".to_owned()])
            ],
            0..3,
        ),
        any::<bool>(),
    )
        .prop_map(|(target, largest, flags, json)| {
            let mut args = vec!["plan".to_owned(), "--target".to_owned(), target, "--largest".to_owned(), largest];
            args.extend(flags.into_iter().flatten());
            if json {
                args.push("--json".to_owned());
            }
            args
        })
}

fn plan_uneven() -> impl Strategy<Value = Vec<String>> {
    (
        counts(),
        prop::collection::vec(counts(), 1..5),
        prop::option::of(flag("--multiple-of", counts())),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(target, largest, granule, exact, json)| {
            let mut args =
                vec!["plan".to_owned(), "--target".to_owned(), target, "--uneven".to_owned(), largest.join(",")];
            args.extend(granule.into_iter().flatten());
            args.extend(exact.then(|| "--exact".to_owned()));
            args.extend(json.then(|| "--json".to_owned()));
            args
        })
}

fn number(value: &serde_json::Value, key: &str) -> u128 {
    u128::from(value[key].as_u64().unwrap_or_else(|| panic!("{key} in {value}")))
}

/// The numbers of a successful run agree with each other.
fn check_numbers(args: &[String], stdout: &str) {
    match args[0].as_str() {
        "estimate" => {
            let mut json_args = args.to_vec();
            if !json_args.iter().any(|a| a == "--json") {
                json_args.push("--json".to_owned());
            }
            let (output, _) = autobatch(&json_args);
            assert_eq!(output.status.code(), Some(0), "{json_args:?}");
            let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
            let state = &json["state"];
            let rows = ["weights", "gradients", "optimizer_states", "master_weights"].map(|k| number(state, k));
            let total = number(&json, "total_bytes");
            assert_eq!(rows.iter().sum::<u128>() + number(&json, "activation_bytes"), total, "{json}");
            for remedy in json["remedies"].as_array().unwrap() {
                assert!(number(remedy, "saves_bytes") > 0, "{remedy}");
                assert_eq!(number(remedy, "saves_bytes") + number(remedy, "total_bytes"), total, "{remedy}");
            }
            if !args.iter().any(|a| a == "--json") {
                assert!(stdout.contains("total"), "{stdout}");
            }
        }
        "plan" if args.iter().any(|a| a == "--json") && args.iter().any(|a| a == "--uneven") => {
            let split: serde_json::Value = serde_json::from_str(stdout).unwrap();
            let global = number(&split, "global_batch");
            assert!(global >= number(&split, "target_global_batch"), "{split}");
            let shares = split["shares"].as_array().unwrap();
            assert_eq!(shares.iter().map(|s| number(s, "samples")).sum::<u128>(), global, "{split}");
            for share in shares {
                let (steps, larger_steps) = (number(share, "steps"), number(share, "larger_steps"));
                let (larger, smaller) = (number(share, "larger"), number(share, "smaller"));
                assert_eq!(
                    larger_steps * larger + (steps - larger_steps) * smaller,
                    number(share, "samples"),
                    "{share}"
                );
                assert!(larger <= number(share, "largest_micro_batch"), "{share}");
            }
        }
        "plan" if args.iter().any(|a| a == "--json") => {
            let split: serde_json::Value = serde_json::from_str(stdout).unwrap();
            let (micro, steps, ranks) =
                (number(&split, "micro_batch"), number(&split, "accumulation_steps"), number(&split, "world_size"));
            // the last `smaller_steps` micro-steps take one granule less
            let fewer = number(&split, "smaller_steps") * number(&split, "multiple_of");
            assert_eq!((micro * steps - fewer) * ranks, number(&split, "effective_batch"), "{split}");
            assert!(micro <= number(&split, "largest_micro_batch") && micro % number(&split, "multiple_of") == 0);
            assert!(number(&split, "effective_batch") >= number(&split, "target_effective_batch"));
        }
        "probe" if args.iter().any(|a| a == "--json") => {
            let plan: serde_json::Value = serde_json::from_str(stdout).unwrap();
            let (micro, steps, ranks) =
                (number(&plan, "micro_batch"), number(&plan, "accumulation_steps"), number(&plan, "world_size"));
            let split = &plan["accumulation"];
            let fewer = if split.is_null() { 0 } else { number(split, "smaller_steps") * number(split, "multiple_of") };
            assert_eq!((micro * steps - fewer) * ranks, number(&plan, "effective_batch"), "{plan}");
            let limit = (plan["ceiling"].as_f64().unwrap() * plan["capacity_bytes"].as_f64().unwrap()).floor() as u128;
            assert!(number(&plan, "peak_bytes") <= limit, "{plan}");
            let largest = plan["largest_batch"].as_u64();
            assert!(
                plan["trials"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|t| t["batch"].as_u64() == largest && t["outcome"] == "fits")
            );
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_command_line_exits_cleanly_with_consistent_numbers(
        args in prop_oneof![3 => probe(), 2 => runnable_probe(), 2 => estimate(), 1 => plan(), 1 => plan_uneven()]
    ) {
        let (output, took) = autobatch(&args);
        let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        let code = output.status.code();
        prop_assert!(took < TIME_LIMIT, "{args:?} ran past the time limit");
        prop_assert!(matches!(code, Some(0..=3)), "{args:?}: exit {code:?}\n{stderr}");
        for bad in ["panicked", "memory allocation of", "stack backtrace", "capacity overflow", "attempt to"] {
            prop_assert!(!stderr.contains(bad), "{args:?}: {bad} in {stderr}");
        }
        eprintln!("exit {code:?} in {took:.1?}: {}", args.join(" "));
        for line in stderr.lines().chain(stdout.lines()).filter(|l| !l.trim_start().starts_with('{') && !l.trim_start().starts_with('"')) {
            prop_assert!(names_no_internals(line), "{:?}: a library identifier in {:?}", args, line);
        }
        if code != Some(0) {
            let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
            prop_assert_eq!(errors.len(), 1, "{:?}: one error line, got {}", args, stderr);
        } else {
            check_numbers(&args, &stdout);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, failure_persistence: None, ..ProptestConfig::default() })]

    /// Under a tight address-space limit a budget that could pass it is
    /// refused before any trial (exit 2, naming `ulimit -v`), and one that is
    /// allowed runs to the end: no abort whatever the limit and budget.
    #[test]
    fn a_memory_limited_process_is_refused_or_runs_but_never_aborts(
        kib in prop::sample::select(vec![250_000u64, 400_000, 700_000, 1_500_000]),
        budget in prop::sample::select(vec!["4MiB", "16MiB", "64MiB", "200MiB", "600MiB", "5GiB"]),
        model in prop::sample::select(vec!["mlp", "transformer"]),
    ) {
        let args: Vec<String> = ["probe", "--model", model, "--budget", budget, "--max-batch", "64", "--json"]
            .iter().map(|s| (*s).to_owned()).collect();
        let (output, _) = autobatch_under(kib, &args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let code = output.status.code();
        prop_assert!(matches!(code, Some(0 | 2 | 3)), "{args:?} under {kib} KiB: exit {code:?}\n{stderr}");
        prop_assert!(!stderr.contains("memory allocation of") && !stderr.contains("panicked"), "{stderr}");
        if code == Some(2) {
            prop_assert!(stderr.contains("ulimit -v") || stderr.contains("available"), "{stderr}");
        }
    }
}

/// What the adversary of the portability issue tried, as classes: each case
/// is one of them with a random member.
#[derive(Clone, Debug)]
enum Hostile {
    /// The reader closes stdout at once (`| head -0`).
    ClosedStdout(Vec<String>),
    /// `--cache` or `--plot` names something that is not a file to write.
    SpecialPath { flag: &'static str, path: &'static str },
    /// `--cache` and `--plot` name one file, spelled two ways.
    SamePath { plot: &'static str },
    /// A budget with a fraction of a byte, or an extreme one.
    Size(&'static str),
    /// A plan cache whose entry was edited by hand.
    EditedCache { key: &'static str, value: serde_json::Value },
}

fn hostile() -> impl Strategy<Value = Hostile> {
    let quick = |extra: &[&str]| {
        let mut args: Vec<String> = ["probe", "--model", "mlp", "--budget", "16MiB", "--max-batch", "4"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    };
    prop_oneof![
        prop::sample::select(vec![
            quick(&[]),
            quick(&["--json"]),
            vec!["probe".into(), "--seq-lens".into(), "8,16".into(), "--d-model".into(), "16".into()],
            vec!["plan".into(), "--target".into(), "5000".into(), "--uneven".into(), vec!["3"; 2000].join(",")],
            vec!["estimate".into(), "--params".into(), "7B".into(), "--capacity".into(), "80GB".into()],
        ])
        .prop_map(Hostile::ClosedStdout),
        (
            prop::sample::select(vec!["--cache", "--plot"]),
            prop::sample::select(vec!["FIFO", "DIR", "DIR.svg", "/proc/x.svg", "/dev/null", "READONLY.svg"]),
        )
            .prop_map(|(flag, path)| Hostile::SpecialPath { flag, path }),
        // every file goes into a folder that exists: none is made
        prop::sample::select(vec!["--plot", "--cache"])
            .prop_map(|flag| Hostile::SpecialPath { flag, path: "NO-SUCH-DIR/x.svg" }),
        prop::sample::select(vec!["same.svg", "./same.svg", "LINK.svg"]).prop_map(|plot| Hostile::SamePath { plot }),
        prop::sample::select(vec![
            "11.2MiB",
            "12.75MiB",
            "1.5e1MiB",
            "0.1B",
            "0.5KiB",
            "18446744073709551615",
            "18446744073709551616",
            "1e400GB",
            "NaN",
            "infGiB",
            "-0B",
            "16EiB",
        ])
        .prop_map(Hostile::Size),
        (
            prop::sample::select(vec![
                "largest_batch",
                "peak_bytes",
                "ceiling",
                "capacity_bytes",
                "micro_batch",
                "trials"
            ]),
            prop::sample::select(vec![
                serde_json::json!(-1),
                serde_json::json!(0),
                serde_json::json!(1e15),
                serde_json::json!(100000),
                serde_json::json!(0.5),
                serde_json::json!(-5),
                serde_json::json!("x"),
                serde_json::Value::Null,
                serde_json::json!([]),
            ]),
        )
            .prop_map(|(key, value)| Hostile::EditedCache { key, value }),
    ]
}

/// A folder of its own for each case, with the special files the cases name.
fn scratch() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static CASE: AtomicUsize = AtomicUsize::new(0);
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "hostile-{}-{}",
        std::process::id(),
        CASE.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("DIR")).unwrap();
    std::fs::create_dir_all(dir.join("DIR.svg")).unwrap();
    let fifo = dir.join("FIFO");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    std::fs::write(dir.join("READONLY.svg"), "").unwrap();
    let mut readonly = std::fs::metadata(dir.join("READONLY.svg")).unwrap().permissions();
    readonly.set_readonly(true);
    std::fs::set_permissions(dir.join("READONLY.svg"), readonly).unwrap();
    std::os::unix::fs::symlink(dir.join("same.svg"), dir.join("LINK.svg")).unwrap();
    dir
}

/// The binary in `dir`, under the same limits as every fuzz case.
fn autobatch_in(dir: &std::path::Path, args: &[String]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {ADDRESS_SPACE_KIB}; exec timeout {} \"$0\" \"$@\"", TIME_LIMIT.as_secs()))
        .arg(env!("CARGO_BIN_EXE_autobatch"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("sh runs")
}

/// A cache the edits start from: one entry, stored by a real probe.
fn stored_cache(dir: &std::path::Path) -> serde_json::Value {
    let args: Vec<String> =
        ["probe", "--model", "mlp", "--budget", "16MiB", "--max-batch", "4", "--cache", "plans.json"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
    assert!(autobatch_in(dir, &args).status.success());
    serde_json::from_str(&std::fs::read_to_string(dir.join("plans.json")).unwrap()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Closed pipes, special files, path conflicts, fractional and extreme
    /// sizes, edited cache files: the binary ends quietly or with one clear
    /// error line, never panics, aborts or hangs, and loses nothing.
    #[test]
    fn hostile_inputs_end_quietly_or_with_one_clear_line(case in hostile()) {
        use std::os::unix::process::ExitStatusExt;
        let dir = scratch();
        let one_error = |output: &Output, code: i32, says: &str| {
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            assert_eq!(output.status.code(), Some(code), "{case:?}: {stderr}");
            let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
            assert_eq!(errors.len(), 1, "{case:?}: {stderr}");
            assert!(errors[0].contains(says), "{case:?}: want {says:?} in {stderr}");
        };
        match &case {
            Hostile::ClosedStdout(args) => {
                let mut child = Command::new(env!("CARGO_BIN_EXE_autobatch"))
                    .args(args)
                    .current_dir(&dir)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                drop(child.stdout.take()); // the reader is gone before the first line
                let output = child.wait_with_output().unwrap();
                let stderr = String::from_utf8_lossy(&output.stderr);
                let quiet = output.status.success() || output.status.signal() == Some(libc_sigpipe());
                prop_assert!(quiet, "{args:?}: {:?}\n{stderr}", output.status);
                prop_assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{stderr}");
            }
            Hostile::SpecialPath { flag, path } => {
                let path = if path.starts_with('/') { (*path).to_owned() } else { dir.join(path).display().to_string() };
                let plot = if *flag == "--plot" { path.clone() } else { "chart.svg".to_owned() };
                let args: Vec<String> = ["probe", "--model", "mlp", "--budget", "16MiB", "--max-batch", "4", flag, &path]
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect();
                let started = Instant::now();
                let output = autobatch_in(&dir, &args);
                prop_assert!(started.elapsed() < Duration::from_secs(30), "{case:?} took {:?}", started.elapsed());
                one_error(&output, 2, flag);
                // refused before the first trial: nothing was probed, nothing written
                prop_assert!(!String::from_utf8_lossy(&output.stdout).contains("largest batch"));
                prop_assert!(!dir.join("chart.svg").exists() || plot != "chart.svg");
                if path.ends_with("READONLY.svg") {
                    prop_assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
                }
            }
            Hostile::SamePath { plot } => {
                let args: Vec<String> =
                    ["probe", "--model", "mlp", "--budget", "16MiB", "--max-batch", "4", "--cache", "same.svg", "--plot", plot]
                        .iter()
                        .map(|s| (*s).to_owned())
                        .collect();
                one_error(&autobatch_in(&dir, &args), 2, "name the same file");
                prop_assert!(!dir.join("same.svg").exists(), "nothing written");
            }
            Hostile::Size(budget) => {
                let args: Vec<String> = ["probe", "--model", "mlp", "--max-batch", "2", "--json", "--budget", budget]
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect();
                let output = autobatch_in(&dir, &args);
                let stderr = String::from_utf8_lossy(&output.stderr);
                prop_assert!(!stderr.contains("panicked") && !stderr.contains("memory allocation of"), "{stderr}");
                match output.status.code() {
                    Some(0) => {
                        let plan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
                        let capacity = plan["capacity_bytes"].as_u64().unwrap();
                        // a fraction of a byte is rounded down, and said
                        let said = stderr.contains(&format!("rounded down to {capacity} bytes"));
                        let whole = parse_whole_bytes(budget).is_some_and(|bytes| bytes == capacity);
                        prop_assert!(said || whole, "{}: capacity {} and {}", budget, capacity, stderr);
                    }
                    Some(code @ (2 | 3)) => {
                        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: ")).collect();
                        prop_assert_eq!(errors.len(), 1, "{}", stderr);
                        let says = if code == 2 { "--budget" } else { "error: nothing fits" };
                        prop_assert!(errors[0].contains(says), "{}", stderr);
                        prop_assert!(names_no_internals(errors[0]), "{}", errors[0]);
                        prop_assert!(!errors[0].contains("EiB (16.0 EiB)") && !errors[0].contains("at least more"), "{}", errors[0]);
                    }
                    other => prop_assert!(false, "{budget}: exit {other:?}\n{stderr}"),
                }
            }
            Hostile::EditedCache { key, value } => {
                let mut cache = stored_cache(&dir);
                let entry = cache["entries"].as_object_mut().unwrap().values_mut().next().unwrap();
                let original = entry["plan"][*key].clone();
                entry["plan"][*key] = value.clone();
                std::fs::write(dir.join("plans.json"), serde_json::to_string(&cache).unwrap()).unwrap();
                let args: Vec<String> = ["probe", "--model", "mlp", "--budget", "16MiB", "--max-batch", "4", "--json", "--cache", "plans.json"]
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect();
                let output = autobatch_in(&dir, &args);
                let stderr = String::from_utf8_lossy(&output.stderr);
                prop_assert_eq!(output.status.code(), Some(0), "{:?}: {}", case, stderr);
                let plan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
                if original != *value {
                    // the edited entry is not served: one line says so, and the probe ran
                    prop_assert_eq!(&plan["cached"], &serde_json::json!(false), "{:?} was served: {}", case, plan);
                    let said: Vec<&str> = stderr.lines().filter(|l| l.contains("plan cache")).collect();
                    prop_assert_eq!(said.len(), 1, "{}", stderr);
                    prop_assert!(names_no_internals(said[0]) || said[0].contains("largest_batch") || said[0].contains("peak_bytes")
                        || said[0].contains("capacity_bytes") || said[0].contains("micro_batch"), "{}", said[0]);
                }
                check_numbers(&args, &String::from_utf8_lossy(&output.stdout));
                // and the cache holds a good entry again
                let again = autobatch_in(&dir, &args);
                let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
                prop_assert_eq!(&again["cached"], &serde_json::json!(true), "{}", again);
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The bytes a budget written without a fraction of a byte means (only the
/// forms the cases use).
fn parse_whole_bytes(budget: &str) -> Option<u64> {
    let (number, scale) = match budget.strip_suffix("MiB") {
        Some(number) => (number, 1u64 << 20),
        None => (budget.strip_suffix('B').unwrap_or(budget), 1),
    };
    let value: f64 = number.parse().ok()?;
    let bytes = value * scale as f64;
    (bytes.fract() == 0.0).then_some(bytes as u64)
}

/// SIGPIPE's number, without a dependency on libc in the tests.
fn libc_sigpipe() -> i32 {
    13
}
