//! The GPU check (feature `cuda`): tune the reference transformer on a real
//! GPU at several sizes with `CudaMeter`, and verify the answer by brute force.
//!
//! Built on a CPU machine by `scripts/gpu-check.sh build`, carried to the GPU
//! machine and run there by `scripts/gpu-check.sh run` (see the script). For
//! each size it:
//!
//! 1. tunes with `CudaMeter` (ceiling 0.9), timing the whole tuning;
//! 2. re-measures the found batch b (fits under the ceiling) and b + 1 (goes
//!    over it, or runs out of memory) in fresh steps;
//! 3. compares the pool-based peak with what `cuMemGetInfo` sees when the pool
//!    keeps what it reserved (release threshold at its maximum);
//! 4. forces a real out-of-memory error (doubling the batch until one comes),
//!    then runs a step at b again: the context must still be healthy;
//! 5. times one step at b.
//!
//! It prints a table and writes `gpu-results.md` and `gpu-results.json` into
//! `$OUT` (or the current directory), after every size, so that a run cut
//! short still leaves what it measured.
//!
//! `gpu_check remedies` instead tunes the small size as it is, with gradient
//! checkpointing, in bf16 and with both (`Tuner::compare`, as `autobatch probe
//! --compare`), and writes `gpu-remedies.md`: the remedies' effect measured on a GPU.

use std::time::{Duration, Instant};

use autobatch::workloads::TransformerConfig;
use autobatch::{format_bytes, is_oom, CudaMeter, MemoryMeter, Tuner, Workload};
use candle_core::cuda_backend::cudarc::driver::result::{device, mem_pool};
use candle_core::cuda_backend::cudarc::driver::sys::CUmemPool_attribute;
use candle_core::DType;
use serde::Serialize;

const CEILING: f64 = 0.9;

#[derive(Serialize)]
struct Row {
    size: String,
    model: String,
    parameters: usize,
    largest_batch: usize,
    trials: usize,
    tuning_s: f64,
    step_s: f64,
    peak_bytes: u64,
    limit_bytes: u64,
    capacity_bytes: u64,
    next_batch: usize,
    next_outcome: String,
    next_peak_bytes: Option<u64>,
    pool_peak_bytes: u64,
    mem_get_info_peak_bytes: u64,
    pool_reserved_high_bytes: u64,
    oom_batch: Option<usize>,
    healthy_after_oom: bool,
    verdict: &'static str,
}

fn sizes() -> Vec<(&'static str, TransformerConfig)> {
    let base = TransformerConfig::default();
    vec![
        ("small", TransformerConfig { vocab: 8192, d_model: 256, heads: 4, layers: 4, seq_len: 256, ..base.clone() }),
        ("medium", TransformerConfig { vocab: 8192, d_model: 512, heads: 8, layers: 8, seq_len: 512, ..base.clone() }),
        (
            "large-bf16",
            TransformerConfig {
                vocab: 32000,
                d_model: 1024,
                heads: 16,
                layers: 8,
                seq_len: 1024,
                dtype: DType::BF16,
                ..base
            },
        ),
    ]
}

/// One step at `batch`: its outcome, the pool-based peak, and the time.
fn measured_step<W: Workload>(
    workload: &mut W,
    meter: &mut CudaMeter,
    batch: usize,
) -> Result<(candle_core::Result<()>, u64, Duration), autobatch::Error> {
    meter.release_cached()?;
    meter.reset_peak()?;
    let started = Instant::now();
    let result = workload.step(batch);
    let synced = meter.synchronize();
    let elapsed = started.elapsed();
    if result.is_ok() {
        synced?;
    }
    let peak = meter.peak()?;
    meter.release_cached()?;
    Ok((result, peak, elapsed))
}

/// The step at `batch` run with the pool keeping everything it reserves, so
/// that `total − free` afterwards shows the step's reservation high-water mark.
fn mem_get_info_peak<W: Workload>(
    workload: &mut W,
    meter: &mut CudaMeter,
    batch: usize,
) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    let cuda = meter.device().as_cuda_device()?;
    let context = cuda.cuda_stream().context().clone();
    let pool = unsafe { device::get_mem_pool(context.cu_device()) }?;
    let set = |attribute, mut value: u64| unsafe {
        mem_pool::set_attribute(pool, attribute, (&mut value as *mut u64).cast())
    };
    meter.release_cached()?;
    set(CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, u64::MAX)?;
    set(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0)?;
    let result = workload.step(batch);
    meter.synchronize()?;
    let (free, total) = context.mem_get_info()?;
    let mut reserved_high = 0u64;
    unsafe {
        mem_pool::get_attribute(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
            (&mut reserved_high as *mut u64).cast(),
        )
    }?;
    set(CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 0)?;
    meter.release_cached()?;
    result?;
    Ok(((total - free) as u64, reserved_high))
}

fn check(name: &str, config: &TransformerConfig, meter: &mut CudaMeter) -> Result<Row, Box<dyn std::error::Error>> {
    let mut model = config.build(meter.device())?;
    let description = autobatch::workloads::Model::describe(model.model());
    println!("== {name}: {description}, {} parameters", model.parameter_count());
    let started = Instant::now();
    let plan = Tuner::new().ceiling(CEILING).run(&mut model, meter)?;
    let tuning = started.elapsed();
    println!("{plan}\n(tuned in {tuning:.2?})");
    let (b, limit) = (plan.largest_batch, plan.limit_bytes());

    let (fits, peak, step_time) = measured_step(&mut model, meter, b)?;
    fits?;
    let (next, next_peak, _) = measured_step(&mut model, meter, b + 1)?;
    let next_outcome = match &next {
        Ok(()) if next_peak > limit => "over ceiling".to_owned(),
        Ok(()) => "FITS".to_owned(),
        Err(err) if is_oom(err) => "out of memory".to_owned(),
        Err(err) => format!("error: {err}"),
    };
    let (info_peak, reserved_high) = mem_get_info_peak(&mut model, meter, b)?;

    let mut oom_batch = None;
    let mut batch = 2 * b;
    for _ in 0..4 {
        let (result, _, _) = measured_step(&mut model, meter, batch)?;
        match result {
            Err(err) if is_oom(&err) => {
                oom_batch = Some(batch);
                break;
            }
            Err(err) => return Err(err.into()),
            Ok(()) => batch *= 2,
        }
    }
    let (after, _, _) = measured_step(&mut model, meter, b)?;
    let healthy = after.is_ok();

    let ok = peak <= limit && next_outcome != "FITS" && !next_outcome.starts_with("error") && healthy;
    Ok(Row {
        size: name.to_owned(),
        model: description,
        parameters: model.parameter_count(),
        largest_batch: b,
        trials: plan.trials.len(),
        tuning_s: tuning.as_secs_f64(),
        step_s: step_time.as_secs_f64(),
        peak_bytes: peak,
        limit_bytes: limit,
        capacity_bytes: plan.capacity_bytes,
        next_batch: b + 1,
        next_outcome,
        next_peak_bytes: next.is_ok().then_some(next_peak),
        pool_peak_bytes: peak,
        mem_get_info_peak_bytes: info_peak,
        pool_reserved_high_bytes: reserved_high,
        oom_batch,
        healthy_after_oom: healthy,
        verdict: if ok { "pass" } else { "FAIL" },
    })
}

fn markdown(device: &str, capacity: u64, rows: &[Row]) -> String {
    let mut md = format!(
        "# GPU check\n\n{device}, {} ({} bytes); ceiling {:.0}%; `scripts/gpu-check.sh`\n\n\
         | size | largest batch | trials | tuning | step at b | peak at b / limit | b+1 | pool peak vs cuMemGetInfo (reserved high) | OOM at | healthy after OOM | verdict |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
        format_bytes(capacity),
        capacity,
        CEILING * 100.0
    );
    for r in rows {
        md += &format!(
            "| {} | {} | {} | {:.2} s | {:.3} s | {} / {} | {} | {} vs {} ({}) | {} | {} | {} |\n",
            r.size,
            r.largest_batch,
            r.trials,
            r.tuning_s,
            r.step_s,
            format_bytes(r.peak_bytes),
            format_bytes(r.limit_bytes),
            r.next_outcome,
            format_bytes(r.pool_peak_bytes),
            format_bytes(r.mem_get_info_peak_bytes),
            format_bytes(r.pool_reserved_high_bytes),
            r.oom_batch.map_or("none".to_owned(), |b| b.to_string()),
            r.healthy_after_oom,
            r.verdict
        );
    }
    md += "\nModels:\n\n";
    for r in rows {
        md += &format!("- {}: {} ({} parameters)\n", r.size, r.model, r.parameters);
    }
    md
}

/// The small size as it is, checkpointed, in bf16 and both, tuned side by side.
fn remedies(out: &str, device: &str, meter: &mut CudaMeter) -> Result<(), Box<dyn std::error::Error>> {
    use autobatch::tuner::Variant;
    let (_, small) = sizes().remove(0);
    let cuda = meter.device().clone();
    let variant = |name: &'static str, checkpointing: bool, dtype: DType| {
        let config = TransformerConfig { checkpointing, dtype, ..small.clone() };
        let cuda = cuda.clone();
        Variant::lazy(name, move || config.build(&cuda))
    };
    let variants = vec![
        variant("as it is", false, DType::F32),
        variant("bf16", false, DType::BF16),
        variant("gradient checkpointing", true, DType::F32),
        variant("checkpointing + bf16", true, DType::BF16),
    ];
    let comparison = Tuner::new().ceiling(CEILING).compare(variants, meter)?;
    let report = format!(
        "# Remedies on {device}\n\n`gpu_check remedies`: the reference transformer (vocab {}, d_model {}, {} heads, \
         {} layers, {} tokens) at a {CEILING} ceiling.\n\n```text\n{comparison}```\n",
        small.vocab, small.d_model, small.heads, small.layers, small.seq_len
    );
    println!("{report}");
    std::fs::write(format!("{out}/gpu-remedies.md"), report)?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::var("OUT").unwrap_or_else(|_| ".".to_owned());
    let only: Vec<String> = std::env::args().skip(1).collect();
    let mut meter = CudaMeter::new(0)?;
    let (device, capacity) = (meter.name().to_owned(), meter.capacity()?);
    println!("device: {device}, {}", format_bytes(capacity));
    if only.iter().any(|o| o == "remedies") {
        return remedies(&out, &device, &mut meter);
    }
    let mut rows = Vec::new();
    for (name, config) in sizes() {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        match check(name, &config, &mut meter) {
            Ok(row) => rows.push(row),
            Err(err) => println!("{name}: FAILED: {err}"),
        }
        std::fs::write(format!("{out}/gpu-results.md"), markdown(&device, capacity, &rows))?;
        std::fs::write(format!("{out}/gpu-results.json"), serde_json::to_string_pretty(&rows)?)?;
    }
    println!("\n{}", markdown(&device, capacity, &rows));
    Ok(())
}
