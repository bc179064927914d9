//! The lean step of a config model (blocked attention, the chunked loss)
//! against the eager one (the scores and the logits whole), measured on the
//! CPU heap: bytes per sample and step time at 256, 512, 1024 and 2048
//! tokens, and samples per second at each one's tuned batch.
//!
//! ```text
//! cargo bench --bench lean_step            # writes its two sections of docs/benchmarks.md
//! cargo bench --bench lean_step -- tuned   # the tuned batches alone (or: tables)
//! ```
//!
//! Models: SmolLM2-135M (vocabulary 49,152) with 2 of its 30 layers, and
//! Llama-3.2-1B (vocabulary 128,256, hidden 2048) with 1 of its 16 layers,
//! in f32. Bytes per sample: the slope of a forward and backward pass's peak
//! between batches 1 and 2 (no optimizer step, whose peak would hide the
//! activations at small batches); a step the machine cannot hold (the eager
//! step past 1024 tokens: gigabytes a sample) is not run, and the table shows
//! the count `Config::bytes_per_sample` gives instead, marked. Step time:
//! the median of two forward and backward passes at batch 2. Samples per
//! second: each step tuned by `Tuner` with AdamW under a 2 GiB budget in
//! the config's dtype (bf16), as `autobatch probe --config … --budget 2GiB`
//! tunes it, then timed at its largest batch.

#[global_allocator]
static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();

use std::fmt::Write as _;
use std::time::Instant;

use autobatch::{Bytes, HeapMeter, MemoryMeter, ModelProbe, Tuner, Workload};
use autobatch_models::{Attention, Config, ConfigModel, Loss, Training};
use candle_core::{DType, Device};

const LENGTHS: [usize; 4] = [256, 512, 1024, 2048];
/// The most bytes a measured pass may need: the machine's RAM, with room.
const MEASURABLE: u64 = 12 << 30;

fn config(name: &str, layers: usize) -> Config {
    let path = format!("{}/tests/configs/{name}", env!("CARGO_MANIFEST_DIR"));
    Config::from_file(path).unwrap().with_layers(layers).unwrap()
}

fn training(seq_len: usize, lean: bool) -> Training {
    let (attention, loss) = if lean { (Attention::Blocked, Loss::Chunked) } else { (Attention::Eager, Loss::Full) };
    Training::new(seq_len).dtype(DType::F32).attention(attention).loss(loss)
}

/// Bytes per sample (the slope between batches 1 and 2) and the median time
/// of a pass at batch 2, of a forward and backward pass.
fn measure(config: &Config, training: &Training) -> (u64, f64) {
    let model = ConfigModel::build(config, training, &Device::Cpu).unwrap();
    let mut probe = ModelProbe::new(model.varmap(), |batch| model.loss(batch, 0));
    let mut meter = HeapMeter::with_room(1 << 30, 0.9).unwrap();
    probe.step(1).unwrap(); // warm
    let mut peak = |batch: usize| {
        meter.reset_peak().unwrap();
        probe.step(batch).unwrap();
        meter.peak().unwrap()
    };
    let per_sample = peak(2).saturating_sub(peak(1));
    let mut times: Vec<f64> = (0..2)
        .map(|_| {
            let started = Instant::now();
            probe.step(2).unwrap();
            started.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (per_sample, times[0])
}

/// The largest batch under 2 GiB with AdamW, and samples per second there;
/// `None` when nothing fits (the error said).
fn tuned(config: &Config, training: &Training) -> Option<(usize, f64)> {
    let mut trainer = ConfigModel::build(config, training, &Device::Cpu).unwrap().into_trainer().unwrap();
    let mut meter = HeapMeter::new(2 << 30).unwrap();
    let plan = match Tuner::new().run(&mut trainer, &mut meter) {
        Ok(plan) => plan,
        Err(err) => {
            eprintln!("{}: {err}", config.describe(training));
            return None;
        }
    };
    let batch = plan.largest_batch;
    let started = Instant::now();
    trainer.step(batch).unwrap();
    Some((batch, batch as f64 / started.elapsed().as_secs_f64()))
}

fn main() {
    let part = std::env::args().skip(1).find(|arg| !arg.starts_with('-'));
    if part.as_deref() != Some("tuned") {
        tables();
    }
    if part.as_deref() != Some("tables") {
        tuned_batches();
    }
}

/// Bytes per sample and step time, lean and eager, at each length.
fn tables() {
    let mut section = String::from(
        "## The lean step against the eager one\n\n`cargo bench --bench lean_step`: a config model's \
         training step with blocked attention and the chunked loss (the default) against the eager forms \
         (`--attention eager --loss full`), in f32 on the CPU heap. Bytes per sample: the slope of a \
         forward and backward pass's peak between batches 1 and 2; † marks a step too large to run here, \
         with `Config::bytes_per_sample`'s count in its place. Step time: a forward and backward pass at \
         batch 2.\n\n",
    );
    let models = [
        ("SmolLM2-135M, 2 layers", config("smollm2-135m.json", 2)),
        ("Llama-3.2-1B, 1 layer", config("llama-3.2-1b.json", 1)),
    ];
    for (name, config) in &models {
        let _ = writeln!(section, "### {name}\n");
        section += "| tokens | lean bytes/sample | eager bytes/sample | eager / lean | lean step | eager step | lean / eager time |\n|---|---|---|---|---|---|---|\n";
        let mut lean_bytes = Vec::new();
        for seq_len in LENGTHS {
            let (lean, eager) = (training(seq_len, true), training(seq_len, false));
            let (lean_sample, lean_time) = measure(config, &lean);
            lean_bytes.push(lean_sample);
            let counted = config.bytes_per_sample(&eager).unwrap();
            let row = if 2 * counted < MEASURABLE {
                let (eager_sample, eager_time) = measure(config, &eager);
                format!(
                    "| {seq_len} | {} | {} | {:.1}× | {lean_time:.2} s | {eager_time:.2} s | {:.2} |",
                    Bytes(lean_sample),
                    Bytes(eager_sample),
                    eager_sample as f64 / lean_sample as f64,
                    lean_time / eager_time
                )
            } else {
                format!(
                    "| {seq_len} | {} | {} † | {:.1}× | {lean_time:.2} s | – | – |",
                    Bytes(lean_sample),
                    Bytes(counted),
                    counted as f64 / lean_sample as f64
                )
            };
            eprintln!("{name}: {row}");
            section += &row;
            section.push('\n');
        }
        let _ = writeln!(
            section,
            "\nLean bytes per sample at 2048 tokens over 1024: {:.2} (linear in the length: 2).\n",
            lean_bytes[3] as f64 / lean_bytes[2] as f64
        );
    }
    let path = shared::replace("lean-step", &shared::with_host(&section)).unwrap();
    eprintln!("wrote {}", path.display());
}

/// Samples per second at each step's tuned batch: SmolLM2 at 512 tokens
/// under 2 GiB, in the config's dtype.
fn tuned_batches() {
    let (name, config) = ("SmolLM2-135M, 2 layers", config("smollm2-135m.json", 2));
    let in_config_dtype = |lean| Training { dtype: None, ..training(512, lean) };
    let lean = tuned(&config, &in_config_dtype(true));
    let eager = tuned(&config, &in_config_dtype(false));
    let mut section = String::from("### Tuned\n\n");
    let show = |tuned: Option<(usize, f64)>| match tuned {
        Some((batch, rate)) => format!("batch {batch}, {rate:.3} samples/s"),
        None => "nothing fits".to_owned(),
    };
    let _ = writeln!(
        section,
        "{name} at 512 tokens in bf16 (its config's dtype) under a 2 GiB budget, tuned with AdamW and timed \
         at the batch found: lean {}, eager {}.",
        show(lean),
        show(eager)
    );
    if let (Some((lean_batch, lean_rate)), Some((eager_batch, eager_rate))) = (lean, eager) {
        let _ = writeln!(
            section,
            "\nThe lean step fits {:.0}× the eager one's batch there, at {:.2}× its samples per second.",
            lean_batch as f64 / eager_batch as f64,
            lean_rate / eager_rate
        );
    }
    let path = shared::replace("lean-step-tuned", &shared::with_host(&section)).unwrap();
    eprintln!("wrote {}", path.display());
}

#[path = "../../../benches/shared/docs.rs"]
mod shared;
