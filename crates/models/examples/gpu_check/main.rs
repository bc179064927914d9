//! The GPU check (feature `cuda`): tune the reference transformer on a real
//! GPU at several sizes with `CudaMeter`, and verify the answer by brute force.
//!
//! Built on a CPU machine by `scripts/gpu-check.sh build`, carried to the GPU
//! machine and run there by `scripts/gpu-check.sh run` (see the script). For
//! each size it:
//!
//! 1. tunes with `CudaMeter` (ceiling 0.9), timing the whole tuning (the
//!    meter refuses to start when its pool does not see allocations);
//! 2. re-measures the found batch b in a fresh step, by the pool's used and
//!    reserved peaks and the device-wide use (`CudaMeter::peaks`), and b + 1
//!    (goes over, or runs out of memory);
//! 3. compares those with what `cuMemGetInfo` sees when the pool keeps what
//!    it reserved (release threshold at its maximum);
//! 4. forces a real out-of-memory error at b itself, a ballast holding all
//!    but half of the step's own bytes (a larger batch could pass the 2^32
//!    elements candle's kernels count), classified as the tuner classifies
//!    (`may_be_oom`), then runs a step at b again: the context must still be
//!    healthy;
//! 5. times one step at b, and three at b with the pool's release threshold
//!    at 0 (as tuning runs) and at its maximum (does keeping what the pool
//!    reserved make a trial faster?);
//! 6. decides (`autobatch_testkit::gpu_verdict`, tested on the CPU by `crates/models/tests/measured/gpu_verdict.rs`): b
//!    fits by every peak, b + 1 does not where the search proved b the
//!    largest, the context survived, the pool was checked.
//!
//! The tuner's log (its trials, warnings and decisions) goes to stderr,
//! which the script keeps in `gpu-check.log`; each phase appends its result
//! to `gpu-phases.jsonl` as it ends, so that a run cut short in a phase still
//! says what the phases before it measured.
//!
//! Sizes run smallest first; a size is skipped when the time left before
//! `GPU_CHECK_DEADLINE_S` (set by `scripts/gpu-check.sh`) is under three times
//! what the previous size took. It prints a table and writes
//! `gpu-results.md` and `gpu-results.json` into `$OUT` (or the current
//! directory) after every size, so that a run cut short still leaves what it
//! measured.
//!
//! `gpu_check lean` measures a config model's lean step against its other
//! forms on CUDA (bytes per sample and pass time), and `gpu_check serve`
//! serves a config on CUDA, its answer checked as `serve --check` checks it
//! (`lean.rs`); with no argument both run after the sizes, while time is left.
//!
//! `gpu_check remedies` instead tunes the small size as it is, with gradient
//! checkpointing, in bf16 and with both (`Search::compare`, as `autobatch probe
//! --compare`), and writes `gpu-remedies.md`: the remedies' effect measured on a GPU.

use std::time::{Duration, Instant};

mod lean;
use autobatch_testkit::gpu_verdict::{Evidence, Next, verdict};

use autobatch::plan::PeakKinds;
use autobatch::{Bytes, CudaMeter, MemoryMeter, Tuner, Workload, may_be_oom};
use autobatch_models::reference::TransformerConfig;
use candle_core::DType;
use candle_core::cuda_backend::cudarc::driver as cudarc;
use candle_core::cuda_backend::cudarc::driver::result::{device, mem_pool};
use candle_core::cuda_backend::cudarc::driver::sys::{self, CUmemPool_attribute};
use serde::Serialize;

const CEILING: f64 = 0.9;

#[derive(Serialize)]
struct Row {
    size: String,
    model: String,
    parameters: usize,
    trials: usize,
    tuning_s: f64,
    step_s: f64,
    /// The median of three synchronized steps at b, the pool's release
    /// threshold at 0 (as tuning runs) and at its maximum.
    step_s_threshold_0: f64,
    step_s_threshold_max: f64,
    capacity_bytes: u64,
    evidence: Evidence,
    /// `total − free` after a step at b with the pool keeping all it reserved.
    mem_get_info_peak_bytes: u64,
    pool_reserved_high_bytes: u64,
    oom_batch: Option<usize>,
    warnings: Vec<String>,
    pass: bool,
    notes: Vec<String>,
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

/// One step at `batch`: its outcome, the meter's peaks, and the time.
fn measured_step<W: Workload>(
    workload: &mut W,
    meter: &mut CudaMeter,
    batch: usize,
) -> Result<(candle_core::Result<()>, PeakKinds, Duration), autobatch::Error> {
    meter.release_cached()?;
    meter.reset_peak()?;
    let started = Instant::now();
    let result = workload.step(batch);
    let synced = meter.synchronize();
    let elapsed = started.elapsed();
    if result.is_ok() {
        synced?;
    }
    let peaks = meter.peaks()?;
    meter.release_cached()?;
    Ok((result, peaks, elapsed))
}

/// The meter's CUDA context and the device's default memory pool.
fn device_pool(
    meter: &CudaMeter,
) -> Result<(std::sync::Arc<cudarc::CudaContext>, sys::CUmemoryPool), Box<dyn std::error::Error>> {
    let cuda = meter.device().as_cuda_device()?;
    let context = cuda.cuda_stream().context().clone();
    let pool = unsafe { device::get_mem_pool(context.cu_device()) }?;
    Ok((context, pool))
}

/// Sets one of the pool's `u64` attributes.
fn set_pool_attribute(
    pool: sys::CUmemoryPool,
    attribute: CUmemPool_attribute,
    mut value: u64,
) -> Result<(), cudarc::DriverError> {
    unsafe { mem_pool::set_attribute(pool, attribute, (&mut value as *mut u64).cast()) }
}

/// The step at `batch` run with the pool keeping everything it reserves, so
/// that `total − free` afterwards shows the step's reservation high-water mark.
fn mem_get_info_peak<W: Workload>(
    workload: &mut W,
    meter: &mut CudaMeter,
    batch: usize,
) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    let (context, pool) = device_pool(meter)?;
    let set = |attribute, value| set_pool_attribute(pool, attribute, value);
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

/// The median time of three steps at `batch`, each synchronized (as a
/// trial is), with the pool's release threshold at 0 (what tuning runs
/// with: every synchronize returns the pool's free memory to the driver and
/// the next step maps it again) and at its maximum (the pool keeps it):
/// what decides whether tuning should raise it (issue 35 item 6).
fn release_threshold_timing<W: Workload>(
    workload: &mut W,
    meter: &mut CudaMeter,
    batch: usize,
) -> Result<(Duration, Duration), Box<dyn std::error::Error>> {
    let (_, pool) = device_pool(meter)?;
    let set_threshold = |value| set_pool_attribute(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, value);
    let median = |workload: &mut W, meter: &mut CudaMeter| -> Result<Duration, Box<dyn std::error::Error>> {
        meter.release_cached()?;
        let mut times = Vec::new();
        for _ in 0..3 {
            let started = Instant::now();
            workload.step(batch)?;
            meter.synchronize()?;
            times.push(started.elapsed());
        }
        times.sort();
        Ok(times[1])
    };
    set_threshold(0)?;
    let released = median(workload, meter)?;
    set_threshold(u64::MAX)?;
    let kept = median(workload, meter);
    set_threshold(0)?;
    meter.release_cached()?;
    Ok((released, kept?))
}

/// Appends `result` of `phase` of size `size` to `gpu-phases.jsonl` in
/// `out`, as the phase ends.
fn phase_done(out: &str, size: &str, phase: &str, started: Instant, result: serde_json::Value) {
    use std::io::Write;
    let line = serde_json::json!({
        "size": size, "phase": phase, "seconds": started.elapsed().as_secs_f64(), "result": result,
    });
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(format!("{out}/gpu-phases.jsonl"))
        .and_then(|mut file| writeln!(file, "{line}"));
    if let Err(err) = written {
        eprintln!("cannot write {out}/gpu-phases.jsonl: {err}");
    }
}

/// A real out-of-memory error in a step at `batch`: a ballast takes the
/// free memory but half of the step's own bytes, so that the step fails
/// partway (a smaller ballast each time the ballast itself does not fit).
/// Returns the error's text when one came, classified as the tuner does.
fn forced_oom<W: Workload>(
    workload: &mut W,
    meter: &mut CudaMeter,
    batch: usize,
    step_bytes: u64,
) -> Result<Option<String>, Box<dyn std::error::Error>> {
    let cuda = meter.device().as_cuda_device()?;
    let context = cuda.cuda_stream().context().clone();
    meter.release_cached()?;
    let (free, _) = context.mem_get_info()?;
    let mut ballast_bytes = (free as u64).saturating_sub(step_bytes / 2);
    for _ in 0..8 {
        match candle_core::Tensor::zeros(ballast_bytes as usize, DType::U8, meter.device()) {
            Ok(ballast) => {
                let (result, _, _) = measured_step(workload, meter, batch)?;
                drop(ballast);
                meter.release_cached()?;
                return match result {
                    Err(err) if may_be_oom(&err) => Ok(Some(autobatch::Error::from(err).to_string())),
                    Err(err) => Err(err.into()),
                    Ok(()) => Ok(None),
                };
            }
            Err(err) if may_be_oom(&err) => ballast_bytes = ballast_bytes / 10 * 9,
            Err(err) => return Err(err.into()),
        }
    }
    Ok(None)
}

fn check(
    out: &str,
    name: &str,
    config: &TransformerConfig,
    meter: &mut CudaMeter,
) -> Result<Row, Box<dyn std::error::Error>> {
    let mut model = config.build(meter.device())?;
    let description = autobatch_models::trainer::Model::describe(&*model.model());
    println!("== {name}: {description}, {} parameters", model.parameter_count());
    let started = Instant::now();
    let plan = Tuner::new().ceiling(CEILING).search(&mut model, meter).run()?;
    let tuning = started.elapsed();
    println!("{plan}\n(tuned in {tuning:.2?})");
    let (b, limit) = (plan.largest_batch(), plan.limit_bytes());
    phase_done(out, name, "tuned", started, serde_json::from_str(&plan.to_json())?);

    let phase = Instant::now();
    let before = meter.in_use()?;
    let (fits, peaks, step_time) = measured_step(&mut model, meter, b)?;
    fits?;
    phase_done(out, name, "b re-measured", phase, serde_json::json!({"batch": b, "peaks": peaks}));
    let phase = Instant::now();
    // b + 1 past the element limit would never finish (or fail to launch): not run
    let next = if matches!(plan.stopped_by(), Some(autobatch::plan::SearchLimit::TensorElements { .. })) {
        Next::PastElementLimit
    } else {
        let (next, next_peaks, _) = measured_step(&mut model, meter, b + 1)?;
        match next {
            Ok(()) if next_peaks.binding() > limit => Next::OverCeiling { peak_bytes: next_peaks.binding() },
            Ok(()) => Next::Fits { peak_bytes: next_peaks.binding() },
            Err(err) if may_be_oom(&err) => Next::OutOfMemory,
            Err(err) => Next::Error { message: autobatch::Error::from(err).to_string() },
        }
    };
    phase_done(out, name, "b + 1", phase, serde_json::to_value(&next)?);
    let phase = Instant::now();
    let (info_peak, reserved_high) = mem_get_info_peak(&mut model, meter, b)?;
    phase_done(
        out,
        name,
        "cuMemGetInfo",
        phase,
        serde_json::json!({"peak": info_peak, "reserved_high": reserved_high}),
    );

    let phase = Instant::now();
    let (released, kept) = release_threshold_timing(&mut model, meter, b)?;
    phase_done(
        out,
        name,
        "release threshold",
        phase,
        serde_json::json!({"step_s_threshold_0": released.as_secs_f64(), "step_s_threshold_max": kept.as_secs_f64()}),
    );

    let phase = Instant::now();
    let forced = forced_oom(&mut model, meter, b, peaks.used.saturating_sub(before))?;
    let oom_batch = forced.as_ref().map(|_| b);
    phase_done(out, name, "forced out of memory", phase, serde_json::json!({"error": forced}));
    let phase = Instant::now();
    let (after, _, _) = measured_step(&mut model, meter, b)?;
    phase_done(out, name, "healthy after", phase, serde_json::json!({"ok": after.is_ok()}));
    let evidence = Evidence {
        largest_batch: b,
        proven_largest: plan.proven_largest(),
        stopped_by: plan.stopped_by().map(ToString::to_string),
        limit_bytes: limit,
        used_bytes: peaks.used,
        reserved_bytes: peaks.reserved,
        device_bytes: peaks.device,
        next,
        oom_forced: oom_batch.is_some(),
        healthy_after_oom: after.is_ok(),
        // CudaMeter::new refuses a pool that does not see a test allocation
        pool_checked: true,
    };
    let decided = verdict(&evidence);
    Ok(Row {
        size: name.to_owned(),
        model: description,
        parameters: model.parameter_count(),
        trials: plan.trials().len(),
        tuning_s: tuning.as_secs_f64(),
        step_s: step_time.as_secs_f64(),
        step_s_threshold_0: released.as_secs_f64(),
        step_s_threshold_max: kept.as_secs_f64(),
        capacity_bytes: plan.capacity_bytes(),
        evidence,
        mem_get_info_peak_bytes: info_peak,
        pool_reserved_high_bytes: reserved_high,
        oom_batch,
        // memory outside the pool at a new shape can look like a leak: reported, not judged
        warnings: plan.warnings().iter().map(ToString::to_string).collect(),
        pass: decided.pass,
        notes: decided.notes,
    })
}

fn markdown(device: &str, capacity: u64, rows: &[Row]) -> String {
    let mut md = format!(
        "# GPU check\n\n{device}, {} ({} bytes); ceiling {:.0}%; `scripts/gpu-check.sh`\n\n\
         | size | largest batch | proven | trials | tuning | step at b | used / reserved / device-wide at b | limit | b+1 | cuMemGetInfo (reserved high) | OOM at | healthy after OOM | verdict |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        Bytes(capacity),
        capacity,
        CEILING * 100.0
    );
    for r in rows {
        let e = &r.evidence;
        let next = match &e.next {
            Next::Fits { peak_bytes } => format!("FITS ({})", Bytes(*peak_bytes)),
            Next::OverCeiling { peak_bytes } => format!("over ({})", Bytes(*peak_bytes)),
            Next::OutOfMemory => "out of memory".to_owned(),
            Next::Error { message } => format!("error: {message}"),
            Next::PastElementLimit => "not run (past 2^32 elements)".to_owned(),
        };
        md += &format!(
            "| {} | {} | {} | {} | {:.2} s | {:.3} s | {} / {} / {} | {} | {next} | {} ({}) | {} | {} | {} |\n",
            r.size,
            e.largest_batch,
            e.proven_largest,
            r.trials,
            r.tuning_s,
            r.step_s,
            Bytes(e.used_bytes),
            Bytes(e.reserved_bytes),
            Bytes(e.device_bytes),
            Bytes(e.limit_bytes),
            Bytes(r.mem_get_info_peak_bytes),
            Bytes(r.pool_reserved_high_bytes),
            r.oom_batch.map_or("none".to_owned(), |b| b.to_string()),
            e.healthy_after_oom,
            if r.pass { "pass" } else { "FAIL" }
        );
    }
    for r in rows.iter().filter(|r| !r.notes.is_empty() || !r.warnings.is_empty()) {
        md += &format!("\n{}: {}\n", r.size, r.notes.iter().chain(&r.warnings).cloned().collect::<Vec<_>>().join("; "));
    }
    md += "\nThe pool's release threshold (the median of three synchronized steps at b; tuning runs at 0):\n\n";
    for r in rows {
        md += &format!(
            "- {}: {:.3} s at 0, {:.3} s kept (ratio {:.2})\n",
            r.size,
            r.step_s_threshold_0,
            r.step_s_threshold_max,
            r.step_s_threshold_0 / r.step_s_threshold_max.max(f64::MIN_POSITIVE)
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
    use autobatch::ModelVariant;
    let (_, small) = sizes().remove(0);
    let cuda = meter.device().clone();
    let variant = |name: &'static str, checkpointing: bool, dtype: DType| {
        let config = TransformerConfig { checkpointing, dtype, ..small.clone() };
        let cuda = cuda.clone();
        ModelVariant::lazy(name, move || config.build(&cuda))
    };
    let mut variants = vec![
        variant("as it is", false, DType::F32),
        variant("bf16", false, DType::BF16),
        variant("gradient checkpointing", true, DType::F32),
        variant("checkpointing + bf16", true, DType::BF16),
    ];
    let comparison = Tuner::new().ceiling(CEILING).search(&mut variants, meter).compare()?;
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
    // the tuner's trials, warnings and decisions: stderr, kept in gpu-check.log
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let out = std::env::var("OUT").unwrap_or_else(|_| ".".to_owned());
    let only: Vec<String> = std::env::args().skip(1).collect();
    let mut meter = CudaMeter::new(0)?;
    let (device, capacity) = (meter.name().to_owned(), meter.capacity()?);
    println!("device: {device}, {}", Bytes(capacity));
    if only.iter().any(|o| o == "remedies") {
        return remedies(&out, &device, &mut meter);
    }
    println!("the meter's pool sees allocations (checked by CudaMeter::new)");
    let deadline = std::env::var("GPU_CHECK_DEADLINE_S")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(|seconds| Instant::now() + Duration::from_secs(seconds));
    let wants = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    let time_left = |name: &str, last: Option<Duration>| match (deadline, last) {
        (Some(deadline), Some(last)) => {
            let left = deadline.saturating_duration_since(Instant::now());
            let enough = left >= 3 * last;
            if !enough {
                println!("{name}: skipped, {left:.0?} left and the previous part took {last:.0?}");
            }
            enough
        }
        _ => true,
    };
    let mut rows = Vec::new();
    let mut last: Option<Duration> = None;
    for (name, config) in sizes() {
        if !wants(name) || !time_left(name, last) {
            continue;
        }
        let started = Instant::now();
        match check(&out, name, &config, &mut meter) {
            Ok(row) => rows.push(row),
            Err(err) => println!("{name}: FAILED: {err}"),
        }
        last = Some(started.elapsed());
        std::fs::write(format!("{out}/gpu-results.md"), markdown(&device, capacity, &rows))?;
        std::fs::write(format!("{out}/gpu-results.json"), serde_json::to_string_pretty(&rows)?)?;
    }
    let mut md = markdown(&device, capacity, &rows);
    let (mut steps, mut served) = (Vec::new(), None);
    if wants("lean") && time_left("lean", last) {
        let started = Instant::now();
        for (seq_len, dtype) in [(1024, DType::F32), (1024, DType::BF16), (4096, DType::BF16)] {
            match lean::steps(&mut meter, seq_len, dtype) {
                Ok(found) => steps.extend(found),
                Err(err) => println!("lean step at {seq_len} tokens in {dtype:?}: FAILED: {err}"),
            }
            std::fs::write(format!("{out}/gpu-results.md"), md.clone() + &lean::markdown(&steps, None))?;
        }
        phase_done(&out, "lean", "steps", started, serde_json::to_value(&steps)?);
        last = Some(started.elapsed());
    }
    if wants("serve") && time_left("serve", last) {
        let started = Instant::now();
        match lean::serve(&mut meter, "llama-3.2-1b.json", 4096) {
            Ok(row) => {
                phase_done(&out, "serve", "plan and check", started, serde_json::to_value(&row)?);
                served = Some(row);
            }
            Err(err) => println!("serve: FAILED: {err}"),
        }
    }
    md += &lean::markdown(&steps, served.as_ref());
    std::fs::write(format!("{out}/gpu-results.md"), &md)?;
    println!("\n{md}");
    Ok(())
}
