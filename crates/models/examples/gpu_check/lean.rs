//! Parts 3 and 4 of the GPU check: a config model's lean step against its
//! other forms on CUDA (bytes per sample and step time, measured there), and
//! serving one config on CUDA (the probe's answer, then `--check`'s two
//! trials at it: the answer fits, one more sequence does not).

use std::time::Instant;

use autobatch::serve::{Scheduling, ServePlan, ServeTrial};
use autobatch::{Bytes, CudaMeter, MemoryMeter, ModelProbe, Tuner, Workload};
use autobatch_models::{Attention, BaseDtype, Config, ConfigModel, Loss, Ops, Serving, Training};
use candle_core::DType;
use serde::Serialize;

/// One step form's measurement at one length.
#[derive(Serialize)]
pub struct StepRow {
    pub form: String,
    pub seq_len: usize,
    pub dtype: String,
    pub bytes_per_sample: u64,
    /// The median of three synchronized forward and backward passes at batch 2.
    pub step_s: f64,
}

/// The forms compared: the default, its ops composed, the eager attention
/// and full loss.
fn forms() -> [(&'static str, Attention, Loss, Ops); 3] {
    [
        ("fused ops, blocked attention, chunked loss (default)", Attention::Blocked, Loss::Chunked, Ops::Fused),
        ("composed ops, blocked attention, chunked loss", Attention::Blocked, Loss::Chunked, Ops::Eager),
        ("fused ops, eager attention, full loss", Attention::Eager, Loss::Full, Ops::Fused),
    ]
}

pub fn config(name: &str, layers: Option<usize>) -> Result<Config, Box<dyn std::error::Error>> {
    let path = format!("{}/tests/configs/{name}", env!("CARGO_MANIFEST_DIR"));
    // the binary runs from the repository's root on the GPU machine
    let path = if std::path::Path::new(&path).exists() { path } else { format!("crates/models/tests/configs/{name}") };
    let config = Config::from_file(&path)?;
    Ok(match layers {
        Some(layers) => config.with_layers(layers)?,
        None => config,
    })
}

/// The peak of a forward and backward pass at `batch`, synchronized.
fn pass_peak<W: Workload>(
    probe: &mut W,
    meter: &mut CudaMeter,
    batch: usize,
) -> Result<u64, Box<dyn std::error::Error>> {
    meter.release_cached()?;
    meter.reset_peak()?;
    probe.step(batch)?;
    meter.synchronize()?;
    let peak = meter.peaks()?.binding();
    meter.release_cached()?;
    Ok(peak)
}

/// SmolLM2-135M with 2 layers at `seq_len` tokens in `dtype`, each form:
/// the slope of the pass's peak between batches 1 and 2 (the CPU bench's
/// measure, docs/benchmarks.md) and the pass's time at batch 2.
pub fn steps(meter: &mut CudaMeter, seq_len: usize, dtype: DType) -> Result<Vec<StepRow>, Box<dyn std::error::Error>> {
    let config = config("smollm2-135m.json", Some(2))?;
    let mut rows = Vec::new();
    for (form, attention, loss, ops) in forms() {
        let training = Training::new(seq_len).dtype(dtype).attention(attention).loss(loss).ops(ops);
        let model = ConfigModel::build(&config, &training, meter.device())?;
        let mut probe = ModelProbe::new(model.varmap(), |batch| model.loss(batch.len, 0));
        pass_peak(&mut probe, meter, 1)?; // warm: kernels loaded, cuBLAS workspaces made
        let (one, two) = (pass_peak(&mut probe, meter, 1)?, pass_peak(&mut probe, meter, 2)?);
        let mut times = Vec::new();
        for _ in 0..3 {
            let started = Instant::now();
            probe.step(2)?;
            meter.synchronize()?;
            times.push(started.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let row = StepRow {
            form: form.to_owned(),
            seq_len,
            dtype: format!("{dtype:?}"),
            bytes_per_sample: two.saturating_sub(one),
            step_s: times[1],
        };
        println!(
            "{seq_len} tokens, {dtype:?}, {form}: {} per sample, {:.4} s a pass",
            Bytes(row.bytes_per_sample),
            row.step_s
        );
        rows.push(row);
    }
    Ok(rows)
}

/// The serving part's result.
#[derive(Serialize)]
pub struct ServeRow {
    pub config: String,
    pub context: usize,
    pub plan: ServePlan,
    /// `--check` at the answer: the answer's trial and the next one's.
    pub check: Vec<ServeTrial>,
    /// The answer fits and one more sequence does not, again.
    pub pass: bool,
}

/// `autobatch serve --device cuda` on `name` at `context` tokens in bf16:
/// the search, then `--check` at its answer.
pub fn serve(meter: &mut CudaMeter, name: &str, context: usize) -> Result<ServeRow, Box<dyn std::error::Error>> {
    let config = config(name, None)?;
    let device = meter.device().clone();
    let mut server = Serving::build(&config, BaseDtype::Bf16, None, &device)?;
    let shape = Scheduling::new(context);
    let tuner = Tuner::new().ceiling(0.9);
    let started = Instant::now();
    let plan = tuner.search(&mut server, meter).sequences(&shape)?;
    println!(
        "serve {name} at {context} tokens: {} sequences (proven {}), peak {} of a {} limit, in {:.1?}",
        plan.max_sequences,
        plan.proven,
        Bytes(plan.peak_bytes),
        Bytes(plan.limit_bytes),
        started.elapsed()
    );
    let n = plan.max_sequences;
    let check = vec![
        tuner.search(&mut server, meter).measure(n, &shape)?,
        tuner.search(&mut server, meter).measure(n + 1, &shape)?,
    ];
    let pass = check[0].fits && !check[1].fits;
    for trial in &check {
        let peak = trial.peak_bytes.map_or("not read".to_owned(), |b| Bytes(b).to_string());
        println!("  --check {}: peak {peak}, fits {}", trial.number, trial.fits);
    }
    Ok(ServeRow { config: name.to_owned(), context, plan, check, pass })
}

/// The two parts as markdown for gpu-results.md.
pub fn markdown(steps: &[StepRow], serve: Option<&ServeRow>) -> String {
    let mut md = String::from(
        "\n## The lean step on CUDA\n\nSmolLM2-135M with 2 layers, AdamW not run (a forward and backward pass); bytes per \
         sample: the slope of the pass's peak (CudaMeter) between batches 1 and 2; time: the median of three \
         synchronized passes at batch 2.\n\n| tokens | dtype | form | bytes per sample | pass |\n|---|---|---|---|---|\n",
    );
    for row in steps {
        md += &format!(
            "| {} | {} | {} | {} | {:.4} s |\n",
            row.seq_len,
            row.dtype,
            row.form,
            Bytes(row.bytes_per_sample),
            row.step_s
        );
    }
    if let Some(serve) = serve {
        md += &format!(
            "\n## Serving on CUDA\n\n`serve --device cuda` of {} at {} tokens (bf16): {} sequences (proven: {}), the worst \
             step's peak {} of a {} limit; `--check {}`: {}.\n",
            serve.config,
            serve.context,
            serve.plan.max_sequences,
            serve.plan.proven,
            Bytes(serve.plan.peak_bytes),
            Bytes(serve.plan.limit_bytes),
            serve.plan.max_sequences,
            serve
                .check
                .iter()
                .map(|t| format!("{} {}", t.number, if t.fits { "fits" } else { "does not fit" }))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    md
}
