//! Length-bucketed batches against one batch tuned at the longest length, on
//! the reference transformer with a skewed length distribution, measured on
//! the CPU: samples per second and the peak of every step, both under the
//! ceiling.
//!
//! ```text
//! cargo bench --bench lengths     # writes its section of docs/benchmarks.md
//! ```
//!
//! The transformer (vocab 256, d_model 64, 4 heads, 2 layers, sequences up to
//! 256 tokens, AdamW) is tuned with `Search::sizes` at 64, 128, 192 and 256
//! tokens under a 256 MiB budget. Each sample's length comes from a
//! log-normal with a median of 60 tokens (σ = 0.7, clipped to 8..=256): most
//! sequences are short, a few are long, as in chat and code corpora. Each
//! policy then runs real probe steps (forward, backward, the AdamW update
//! computed in full) at the (batch, padded length) pairs it would train with,
//! each timed three times (median), its peak read by the heap meter:
//!
//! - **longest**: one batch tuned at 256 tokens, every batch padded to 256;
//! - **longest, bucketed**: the same batch, but each batch padded only to its
//!   bucket (the probed length at or above its longest sample);
//! - **per-bucket batches**: each bucket at its own verified largest batch
//!   (`SizePlan::bucket_for`);
//! - **token budget**: each bucket at `token_budget / length` samples;
//! - **throughput choice**: each bucket at the batch `Objective::Throughput`
//!   picked at its size (the fastest of the largest, ¾ and ½ of it).
//!
//! Samples per second over the distribution is the number of samples over the
//! time their batches take: Σ over buckets of (samples in the bucket / batch)
//! × step time.

#[global_allocator]
static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();

use std::fmt::Write as _;
use std::time::Instant;

use autobatch::{Bytes, HeapMeter, MemoryMeter, Resizable, Tuner, Workload, plan::Objective};
use autobatch_models::reference::TransformerConfig;
use candle_core::Device;

const BUDGET: u64 = 256 << 20;
const BUCKETS: [usize; 4] = [64, 128, 192, 256];
const SAMPLES: usize = 20_000;
const REPEATS: usize = 3;

/// Lengths from a log-normal (median 60, σ 0.7) clipped to 8..=256.
fn lengths(seed: u64) -> Vec<usize> {
    let mut state = seed;
    let mut uniform = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..SAMPLES)
        .map(|_| {
            let (u1, u2) = (uniform().max(f64::MIN_POSITIVE), uniform());
            let normal = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            (60.0 * (0.7 * normal).exp()).round().clamp(8.0, 256.0) as usize
        })
        .collect()
}

/// Median seconds and peak bytes of a step at `batch` samples of `len` tokens.
fn measure(
    trainer: &mut autobatch_models::trainer::Trainer<autobatch_models::reference::Transformer>,
    meter: &mut HeapMeter,
    batch: usize,
    len: usize,
) -> (f64, u64) {
    trainer.resize(len).unwrap();
    trainer.step(batch).unwrap(); // warm
    let mut times = Vec::with_capacity(REPEATS);
    let mut peak = 0;
    for _ in 0..REPEATS {
        meter.reset_peak().unwrap();
        let started = Instant::now();
        trainer.step(batch).unwrap();
        times.push(started.elapsed().as_secs_f64());
        peak = peak.max(meter.peak().unwrap());
    }
    times.sort_by(f64::total_cmp);
    (times[REPEATS / 2], peak)
}

struct Policy {
    name: &'static str,
    /// (bucket, batch, padded length) for each bucket.
    batches: Vec<(usize, usize, usize)>,
}

fn section() -> String {
    let config = TransformerConfig { vocab: 256, d_model: 64, heads: 4, layers: 2, seq_len: 256, ..Default::default() };
    let mut trainer = config.build(&Device::Cpu).unwrap();
    let mut meter = HeapMeter::new(BUDGET).unwrap();
    let started = Instant::now();
    let plan = Tuner::new().search(&mut trainer, &mut meter).sizes(&BUCKETS).unwrap();
    let tuning_s = started.elapsed().as_secs_f64();
    let tuning_steps: usize = plan.sizes.values().flat_map(|plan| plan.trials()).map(|t| t.steps).sum();
    let limit = plan.limit_bytes;

    let lengths = lengths(7);
    let mut counts = [0usize; BUCKETS.len()];
    for &len in &lengths {
        let bucket = plan.bucket_for(len).unwrap().size;
        counts[BUCKETS.iter().position(|&b| b == bucket).unwrap()] += 1;
    }
    let longest = plan.batch_for(256).unwrap().batch;
    // the same sizes with the throughput objective: each size's fastest batch near its largest
    let started = Instant::now();
    let fastest =
        Tuner::new().objective(Objective::Throughput).search(&mut trainer, &mut meter).sizes(&BUCKETS).unwrap();
    let throughput_s = started.elapsed().as_secs_f64();
    let throughput_steps: usize = fastest.sizes.values().flat_map(|plan| plan.trials()).map(|t| t.steps).sum();
    let chosen = |size: usize| fastest.plan_for(size).unwrap().micro_batch();
    let policies = [
        Policy { name: "one batch tuned at 256, padded to 256", batches: BUCKETS.map(|b| (b, longest, 256)).to_vec() },
        Policy {
            name: "one batch tuned at 256, padded to the bucket",
            batches: BUCKETS.map(|b| (b, longest, b)).to_vec(),
        },
        Policy {
            name: "each bucket at its verified batch",
            batches: BUCKETS.map(|b| (b, plan.bucket_for(b).unwrap().batch, b)).to_vec(),
        },
        Policy { name: "token budget / length", batches: BUCKETS.map(|b| (b, plan.token_budget / b, b)).to_vec() },
        Policy { name: "each bucket at its throughput choice", batches: BUCKETS.map(|b| (b, chosen(b), b)).to_vec() },
    ];
    let mut measured: Vec<((usize, usize), (f64, u64))> = Vec::new();
    let mut rows = String::new();
    let mut baseline = None;
    let mut rates = Vec::new();
    for policy in &policies {
        let mut seconds = 0.0;
        let mut worst_peak = 0;
        let mut cells = Vec::new();
        for (index, &(_, batch, len)) in policy.batches.iter().enumerate() {
            let (time, peak) = match measured.iter().find(|(key, _)| *key == (batch, len)) {
                Some((_, value)) => *value,
                None => {
                    let value = measure(&mut trainer, &mut meter, batch, len);
                    measured.push(((batch, len), value));
                    value
                }
            };
            seconds += counts[index] as f64 / batch as f64 * time;
            worst_peak = worst_peak.max(peak);
            cells.push(format!("{batch}×{len}"));
        }
        let rate = SAMPLES as f64 / seconds;
        rates.push(rate);
        let speedup = rate / *baseline.get_or_insert(rate);
        let _ = writeln!(
            rows,
            "| {} | {} | {:.0} | {:.2}× | {} ({:.1}%) | {} |",
            policy.name,
            cells.join(", "),
            rate,
            speedup,
            Bytes(worst_peak),
            100.0 * worst_peak as f64 / BUDGET as f64,
            if worst_peak <= limit { "yes" } else { "**no**" }
        );
    }

    let share: Vec<String> =
        BUCKETS.iter().zip(counts).map(|(b, n)| format!("{:.0}% ≤ {b}", 100.0 * n as f64 / SAMPLES as f64)).collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Variable lengths: bucketed batches\n\nGenerated by `cargo bench --bench lengths` (benches/lengths.rs). \
         The reference transformer (vocab 256, d_model 64, 4 heads, 2 layers, up to 256 tokens, AdamW) tuned with \
         `Search::sizes` at {:?} tokens under a {} budget (ceiling 90% = {}), in {:.1} s and {tuning_steps} steps. \
         Sample lengths: log-normal, median 60 tokens, σ = 0.7, clipped to 8..=256, {SAMPLES} samples (seed 7): \
         by bucket {} (each bucket holds the lengths above the previous one).\n",
        BUCKETS,
        Bytes(BUDGET),
        Bytes(limit),
        tuning_s,
        share.join(", ")
    );
    let _ = writeln!(out, "| size | largest batch (verified) | tokens | peak |\n|---|---|---|---|");
    for (size, at_size) in &plan.sizes {
        let _ = writeln!(
            out,
            "| {size} | {} | {} | {} |",
            at_size.largest_batch(),
            size * at_size.largest_batch(),
            Bytes(at_size.peak_bytes())
        );
    }
    if let Some(model) = &plan.model {
        let _ = writeln!(
            out,
            "\nMemory model: {} + {} per sample + {} per token + {} per token per unit of length (worst error \
             {:.1}% over {} steps). Token budget: {} tokens per micro-batch. Predicted between probes: {}.\n",
            Bytes(model.fixed_bytes.max(0.0) as u64),
            Bytes(model.bytes_per_sample.round() as u64),
            Bytes(model.bytes_per_token.round() as u64),
            Bytes(model.bytes_per_token_length.round() as u64),
            100.0 * model.max_error,
            model.fitted_points,
            plan.token_budget,
            [96, 160, 224].map(|len| format!("{len} → {}", plan.batch_for(len).unwrap().batch)).join(", ")
        );
    }
    let _ = writeln!(
        out,
        "| policy | batch × padded length, by bucket | samples/s | vs. first | worst step peak | under the ceiling |\n\
         |---|---|---|---|---|---|"
    );
    out.push_str(&rows);
    let _ = writeln!(
        out,
        "\nPer-bucket batches take {:.2}× the samples per second of one batch tuned at the longest length and \
         padded to it.{}",
        rates[2] / rates[0],
        if rates[1] > rates[2] {
            " Here the longest length's small batch padded only to the bucket is faster still: on a CPU a step's \
             time per sample grows with the batch (see the throughput table above), so small batches win; on a GPU, \
             where a small batch leaves the device idle, the per-bucket batches (or `Objective::Throughput` at each \
             size) are the ones to train with."
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "\nThe throughput choice (`Tuner::objective(Objective::Throughput)` with `Search::sizes`: the largest, ¾ and ½ \
         of each size's largest batch timed three times) took {:.1} s and {throughput_steps} steps for the four \
         sizes, search included.",
        throughput_s
    );
    let _ = writeln!(
        out,
        "\nEach step's time is the median of {REPEATS} runs; samples/s over the distribution = samples / Σ (samples \
         in bucket / batch × step time). Run on {} CPU threads.",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    out
}

use autobatch_testkit::docs;

fn main() {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let started = Instant::now();
    let section = section();
    print!("{section}");
    let path = docs::replace("lengths", &docs::with_host(&section)).unwrap();
    eprintln!("wrote the lengths section of {} in {:.0} s", path.display(), started.elapsed().as_secs_f64());
}
