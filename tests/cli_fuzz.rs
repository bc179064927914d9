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

mod common;
use common::names_no_internals;

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
        prop::collection::vec(prop_oneof![flag("--world-size", counts()), flag("--multiple-of", counts())], 0..3),
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
            assert_eq!(micro * steps * ranks, number(&split, "effective_batch"), "{split}");
            assert!(micro <= number(&split, "largest_micro_batch") && micro % number(&split, "multiple_of") == 0);
            assert!(number(&split, "effective_batch") >= number(&split, "target_effective_batch"));
        }
        "probe" if args.iter().any(|a| a == "--json") => {
            let plan: serde_json::Value = serde_json::from_str(stdout).unwrap();
            let (micro, steps, ranks) =
                (number(&plan, "micro_batch"), number(&plan, "accumulation_steps"), number(&plan, "world_size"));
            assert_eq!(micro * steps * ranks, number(&plan, "effective_batch"), "{plan}");
            let limit = (plan["ceiling"].as_f64().unwrap() * plan["capacity_bytes"].as_f64().unwrap()).floor() as u128;
            assert!(number(&plan, "peak_bytes") <= limit, "{plan}");
            let largest = plan["largest_batch"].as_u64();
            assert!(plan["trials"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["batch"].as_u64() == largest && t["outcome"] == "fits"));
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
