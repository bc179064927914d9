//! What `estimate --config … --on-cpu` promises, against what the probe
//! measures when it is done, on config models of several families: the
//! largest batch beside the probe's proven one, and every change the
//! estimate advises past it, run at that batch, its promised total beside
//! the measured peak.
//!
//! ```text
//! cargo bench -p autobatch-cli --bench advice     # writes its section of docs/benchmarks.md
//! ```

use std::fmt::Write as _;
use std::process::Command;

use autobatch_testkit::advice::{estimate_precision, probe_flags_of};

/// One setup: the config (under crates/models/tests/configs), its flags
/// beside the precision, the precision, and the budget.
struct Case {
    config: &'static str,
    flags: &'static [&'static str],
    precision: &'static str,
    budget: &'static str,
}

const CASES: &[Case] = &[
    Case {
        config: "qwen2.5-0.5b.json",
        flags: &["--layers", "2", "--seq-len", "64"],
        precision: "bf16",
        budget: "3300MiB",
    },
    Case {
        config: "qwen2.5-0.5b.json",
        flags: &["--layers", "2", "--seq-len", "64"],
        precision: "fp32",
        budget: "3900MiB",
    },
    Case {
        config: "qwen2.5-0.5b.json",
        flags: &["--layers", "2", "--seq-len", "128", "--lora", "8"],
        precision: "bf16",
        budget: "1950MiB",
    },
    Case {
        config: "smollm2-135m.json",
        flags: &["--layers", "2", "--seq-len", "128"],
        precision: "mixed",
        budget: "1150MiB",
    },
    Case {
        config: "smollm2-135m.json",
        flags: &["--layers", "2", "--seq-len", "128"],
        precision: "fp32",
        budget: "1GiB",
    },
    Case { config: "gpt2.json", flags: &["--layers", "2", "--seq-len", "128"], precision: "fp32", budget: "1600MiB" },
    Case {
        config: "bert-base-uncased.json",
        flags: &["--layers", "2", "--seq-len", "128"],
        precision: "fp32",
        budget: "1GiB",
    },
    Case { config: "tiny-qwen2.json", flags: &["--seq-len", "32"], precision: "bf16", budget: "600MiB" },
    Case { config: "tiny-llama.json", flags: &["--seq-len", "64"], precision: "fp32", budget: "40MiB" },
];

fn config(name: &str) -> String {
    format!("{}/../models/tests/configs/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The JSON `autobatch ARGS --json` prints, `None` when it exits otherwise
/// than 0 (with what it said).
fn autobatch(args: &[String]) -> Result<serde_json::Value, String> {
    let output = Command::new(env!("CARGO_BIN_EXE_autobatch")).args(args).arg("--json").output().unwrap();
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).lines().last().unwrap_or_default().to_owned());
    }
    Ok(serde_json::from_slice(&output.stdout).unwrap())
}

fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|arg| (*arg).to_owned()).collect()
}

fn mb(bytes: f64) -> String {
    format!("{:.1} MB", bytes / 1e6)
}

fn main() {
    let mut batches = String::new();
    let mut advice = String::new();
    for case in CASES {
        let model = [owned(&["--config", &config(case.config)]), owned(case.flags)].concat();
        let setup = format!("{} {} {} under {}", case.config, case.flags.join(" "), case.precision, case.budget);
        eprintln!("{setup}");
        let probe_args =
            [owned(&["probe"]), model.clone(), owned(&["--precision", case.precision, "--budget", case.budget])];
        let probed = autobatch(&probe_args.concat()).expect("the probe finds a batch");
        let largest = probed["largest_batch"].as_u64().unwrap();
        let estimate_args = [
            owned(&["estimate"]),
            model.clone(),
            estimate_precision(case.precision),
            owned(&["--capacity", case.budget]),
        ]
        .concat();
        let on_cpu = autobatch(&[estimate_args.clone(), owned(&["--on-cpu"])].concat()).unwrap();
        let accelerator = autobatch(&estimate_args).unwrap();
        let counted = on_cpu["largest_batch"].as_u64().unwrap();
        let on_an_accelerator = accelerator["largest_batch"].as_u64().unwrap();
        writeln!(
            batches,
            "| {setup} | {largest} | {counted} | {:+.0}% | {on_an_accelerator} |",
            100.0 * (counted as f64 / largest.max(1) as f64 - 1.0)
        )
        .unwrap();
        // past the largest batch: each advised change, run
        let batch = (largest + largest.div_ceil(2)).to_string();
        let over = autobatch(&[estimate_args, owned(&["--on-cpu", "--batch", &batch])].concat()).unwrap();
        let limit = over["limit_bytes"].as_f64().unwrap();
        for remedy in over["remedies"].as_array().unwrap() {
            let flag = remedy["flag"].as_str().unwrap();
            let promised = remedy["total_bytes"].as_f64().unwrap();
            let said_fits = remedy["fits"] == true;
            let Some(change) = probe_flags_of(flag, case.precision) else {
                writeln!(advice, "| {setup} | {batch} | `{flag}` | {} | not run here | | |", mb(promised)).unwrap();
                continue;
            };
            let mut args = [owned(&["probe"]), model.clone()].concat();
            if !change.iter().any(|arg| arg == "--precision") {
                args.extend(owned(&["--precision", case.precision]));
            }
            args.extend(change);
            args.extend(owned(&["--budget", "10GiB", "--start", &batch, "--max-batch", &batch]));
            let run = autobatch(&args).expect("the change runs under room enough");
            let measured = run["trials"][0]["peak_bytes"].as_f64().unwrap();
            let verdict = match (said_fits, measured <= limit) {
                (true, true) => "fits, as said",
                (true, false) => "**said to fit, over**",
                (false, false) => "over, as said",
                (false, true) => "fits (said over)",
            };
            writeln!(
                advice,
                "| {setup} | {batch} | `{flag}` | {} | {} | {:+.1}% | {verdict} |",
                mb(promised),
                mb(measured),
                100.0 * (promised / measured - 1.0)
            )
            .unwrap();
        }
    }
    let text = format!(
        "## Advice promised against measured\n\n\
         `estimate --config … --on-cpu` against `probe` on the same setup (`cargo bench -p autobatch-cli --bench \
         advice`). The largest batch: the probe's proven one, the estimate's counted for the CPU, and the one it \
         counts for an accelerator (no widened bf16 products). Then, at half as many samples again as the probe's \
         largest batch, each change the estimate advises, run by the probe at that batch: the total it promised \
         beside the peak measured, and whether it fits under the same ceiling.\n\n\
         | setup | probe | estimate (CPU) | error | estimate (accelerator) |\n|---|---|---|---|---|\n{batches}\n\
         | setup | batch | advice | promised | measured | error | under the ceiling |\n|---|---|---|---|---|---|---|\n{advice}"
    );
    let path = autobatch_testkit::docs::replace("advice", &autobatch_testkit::docs::with_host(&text)).unwrap();
    eprintln!("wrote {}", path.display());
}
