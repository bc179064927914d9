//! The lean step of a config model against PyTorch's and against its own
//! forms, measured on the CPU heap: bytes per sample and step time at 256,
//! 1024 and 2048 tokens, and samples per second at each one's tuned batch.
//!
//! ```text
//! cargo bench --bench lean_step            # writes its two sections of docs/benchmarks.md
//! cargo bench --bench lean_step -- fixed   # the fixed peak alone, two ways (its own section)
//! cargo bench --bench lean_step -- short   # bytes a token at 64 tokens against 1024 (its own section)
//! cargo bench --bench lean_step -- tuned   # the tuned batches alone (or: tables)
//! ```
//!
//! The steps, in one run: the default (fused ops, blocked attention, the
//! chunked loss); the same with the ops written as candle ops (`Ops::Eager`:
//! the lean step as it stood before the fused ops); and the eager attention
//! with the full loss (fused ops), against PyTorch's eager step. PyTorch's
//! figures are the issue's (transformers 5, LlamaForCausalLM, f32, AdamW,
//! SDPA with the head and loss in checkpointed chunks, or eager attention
//! with the full loss, on a 2-core host), quoted, not run here.
//!
//! Models: SmolLM2-135M (vocabulary 49,152) with 2 of its 30 layers, and
//! Llama-3.2-1B (vocabulary 128,256, hidden 2048) with 1 of its 16 layers,
//! in f32. The whole step's peak (forward, backward, AdamW's update) is the
//! largest of two lines, the update's at small batches and the backward
//! pass's past where they cross: the tables fit both with the plan's own fit
//! (`MemoryModel::through`) to at least three batches each and publish each
//! line, its batches and the crossover; bytes per sample is the last line's
//! slope. For the eager table, of a forward and backward pass between
//! batches 1 and 2, as PyTorch's eager figures were measured (a step the
//! machine cannot hold is not run, and the table shows the count
//! `Config::bytes_per_sample` gives instead, marked). Samples per second:
//! each step tuned by `Tuner` with AdamW under a 2 GiB budget in the
//! config's dtype (bf16), as `autobatch probe --config … --budget 2GiB`
//! tunes it, then timed at its largest batch.

#[global_allocator]
static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();

use std::fmt::Write as _;
use std::time::Instant;

use autobatch::{HeapMeter, MemoryMeter, ModelProbe, Tuner, Workload};
use autobatch_models::{Attention, Config, ConfigModel, Loss, Ops, Training};
use candle_core::{DType, Device};
use candle_nn::ParamsAdamW;

const LENGTHS: [usize; 3] = [256, 1024, 2048];
/// The batches a length's whole step is measured at: enough on each side of
/// where the update's line and the backward pass's cross (SmolLM2-135M with
/// 2 layers: a few thousand tokens a batch) that each phase's line is fitted
/// from at least two and confirmed by a third.
const PHASE_BATCHES: [(usize, &[usize]); 3] =
    [(256, &[1, 2, 3, 4, 6, 8, 12, 16, 20, 24]), (1024, &[1, 2, 3, 4, 5, 6]), (2048, &[1, 2, 3, 4])];
/// The budget whose largest batch the tables predict and check (at 256
/// tokens), under the default ceiling of 90%.
const BUDGET: u64 = 2 << 30;
/// PyTorch's largest batch under that budget at 256 tokens (issue 89).
const PYTORCH_LARGEST: usize = 46;
/// PyTorch's bytes per sample of the whole step (forward, backward, AdamW)
/// past its crossover on SmolLM2-135M with 2 layers (issue 89's, in bytes:
/// transformers 5.25, torch 2.15, SDPA with the head and loss in checkpointed
/// chunks, torch's default AdamW), at 256, 1024 and 2048 tokens.
const PYTORCH_LEAN: [(usize, f64); 3] = [(256, 25.19e6), (1024, 100.77e6), (2048, 201.55e6)];
/// PyTorch's fixed peak of the same whole step (batch 1–2 at 256 tokens).
const PYTORCH_FIXED: f64 = 792.8e6;
const PYTORCH_EAGER: [(usize, f64); 2] = [(256, 163.8e6), (1024, 784.1e6)];
/// The most bytes a measured pass may need: the machine's RAM, with room.
const MEASURABLE: u64 = 12 << 30;

fn config(name: &str, layers: usize) -> Config {
    let path = format!("{}/tests/configs/{name}", env!("CARGO_MANIFEST_DIR"));
    Config::from_file(path).unwrap().with_layers(layers).unwrap()
}

/// The default step (blocked attention, the chunked loss) or the eager
/// attention with the full loss, with the ops fused or written as candle ops.
fn training(seq_len: usize, lean: bool, ops: Ops) -> Training {
    let (attention, loss) = if lean { (Attention::Blocked, Loss::Chunked) } else { (Attention::Eager, Loss::Full) };
    Training::new(seq_len).dtype(DType::F32).attention(attention).loss(loss).ops(ops)
}

/// Bytes per sample (the slope between batches 1 and 2) and the median time
/// of a pass at batch 2, of a forward and backward pass.
fn measure(config: &Config, training: &Training) -> (u64, f64) {
    let model = ConfigModel::build(config, training, &Device::Cpu).unwrap();
    let mut probe = ModelProbe::new(model.varmap(), |batch| model.loss(batch.len, 0));
    let mut meter = HeapMeter::with_room(1 << 30).unwrap();
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

/// The whole step (forward, backward and AdamW's update, this crate's, as
/// `ModelProbe::optimizer::<AdamW>` measures it) at two batches: its bytes
/// per sample (the slope between them), its peak at the first, and the
/// faster of two steps there; the gradients `own` (the loss and gradients
/// the probe and the training loop run: the tables' gradients made once) or
/// those of `loss.backward()` (a user's step over the model's loss).
fn measure_step(config: &Config, training: &Training, (first, second): (usize, usize), own: bool) -> (u64, u64, f64) {
    use autobatch_models::trainer::Model;
    let model = ConfigModel::build(config, training, &Device::Cpu).unwrap();
    let vars = model.varmap().all_vars();
    let mut probe = ModelProbe::new(model.varmap(), |batch| match own {
        true => model.loss_and_gradients(batch.len, 0, &vars),
        false => model.loss(batch.len, 0).and_then(|loss| Ok((loss.clone(), loss.backward()?))),
    })
    .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
    .unwrap();
    let mut meter = HeapMeter::with_room(1 << 30).unwrap();
    probe.step(first).unwrap(); // warm
    let mut peak = |batch: usize| {
        meter.reset_peak().unwrap();
        probe.step(batch).unwrap();
        meter.peak().unwrap()
    };
    let (at_first, at_second) = (peak(first), peak(second));
    let per_sample = at_second.saturating_sub(at_first) / (second - first) as u64;
    let mut times: Vec<f64> = (0..2)
        .map(|_| {
            let started = Instant::now();
            probe.step(first).unwrap();
            started.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (per_sample, at_first, times[0])
}

/// The largest batch under 2 GiB with AdamW, and samples per second there;
/// `None` when nothing fits (the error said).
fn tuned(config: &Config, training: &Training) -> Option<(usize, f64)> {
    let mut trainer = ConfigModel::build(config, training, &Device::Cpu).unwrap().into_trainer().unwrap();
    let mut meter = HeapMeter::new(2 << 30).unwrap();
    let plan = match Tuner::new().search(&mut trainer, &mut meter).run() {
        Ok(plan) => plan,
        Err(err) => {
            eprintln!("{}: {err}", config.describe(training));
            return None;
        }
    };
    let batch = plan.largest_batch();
    let started = Instant::now();
    trainer.step(batch).unwrap();
    Some((batch, batch as f64 / started.elapsed().as_secs_f64()))
}

fn main() {
    let part = std::env::args().skip(1).find(|arg| !arg.starts_with('-'));
    if part.as_deref() == Some("short") {
        short_lengths();
        return;
    }
    if part.as_deref() == Some("fixed") {
        fixed_peaks();
        return;
    }
    if part.as_deref() != Some("tuned") {
        tables();
    }
    if part.as_deref() != Some("tables") {
        tuned_batches();
    }
}

/// The fixed peak (the whole step at batch 1 of 64 tokens) with the
/// embedding's and head's gradients made once, as the probe and the training
/// loop run the step, against `loss.backward()`'s (candle's backward pass
/// over the model's loss, as a user's loop over `ConfigModel::loss` runs it)
/// and PyTorch's, in one run: `cargo bench --bench lean_step -- fixed`.
fn fixed_peaks() {
    let (config, training) = (config("smollm2-135m.json", 2), training(64, true, Ops::Fused));
    let [candles, once] = [false, true].map(|own| measure_step(&config, &training, (1, 2), own).1 as f64);
    let mb = |bytes: f64| format!("{:.1} MB", bytes / 1e6);
    let section = format!(
        "### The fixed peak\n\n`cargo bench --bench lean_step -- fixed`: SmolLM2-135M, 2 layers (its head tied to \
         its 49,152 × 576 embedding, 113.2 MB in f32), the whole step (AdamW) at batch 1 of 64 tokens.\n\n\
         | the step | fixed peak | / PyTorch's {} |\n|---|---|---|\n\
         | the tables' gradients made once (the probe's and the training loop's step) | {} | {:.2} |\n\
         | candle's backward pass over the loss (`loss.backward()`) | {} | {:.2} |\n\n\
         candle's backward pass adds the first gradient a variable gets to a zero tensor of its own: the head's, \
         handed over by the loss, is three vocabulary-sized tensors at once; the step that makes them once keeps \
         the head's gradient in the loss and adds the embedding lookup's rows into it in place.\n",
        mb(PYTORCH_FIXED),
        mb(once),
        once / PYTORCH_FIXED,
        mb(candles),
        candles / PYTORCH_FIXED,
    );
    println!("{section}");
    let path = shared::replace("lean-step-fixed", &shared::with_host(&section)).unwrap();
    eprintln!("wrote {}", path.display());
}

/// The whole step's peaks at `batches` (the probe's and the training loop's step).
fn peaks(config: &Config, training: &Training, batches: &[usize]) -> Vec<u64> {
    timed_peaks(config, training, batches).into_iter().map(|(peak, _)| peak).collect()
}

/// [`peaks`], each with its step's wall time in seconds.
fn timed_peaks(config: &Config, training: &Training, batches: &[usize]) -> Vec<(u64, f64)> {
    use autobatch_models::trainer::Model;
    let model = ConfigModel::build(config, training, &Device::Cpu).unwrap();
    let vars = model.varmap().all_vars();
    let mut probe = ModelProbe::new(model.varmap(), |batch| model.loss_and_gradients(batch.len, 0, &vars))
        .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
        .unwrap();
    let mut meter = HeapMeter::with_room(4 << 30).unwrap();
    probe.step(batches[0]).unwrap(); // warm
    batches
        .iter()
        .map(|&batch| {
            meter.reset_peak().unwrap();
            let started = Instant::now();
            probe.step(batch).unwrap();
            (meter.peak().unwrap(), started.elapsed().as_secs_f64())
        })
        .collect()
}

/// Bytes a token of the whole step at 64 tokens against 1024 (issue 89: a
/// short sequence at a large vocabulary paid for the loss's chunk a
/// sample): the slope over three batches on one line, full fine-tuning and
/// LoRA, in one run: `cargo bench --bench lean_step -- short`.
fn short_lengths() {
    let config = config("smollm2-135m.json", 2);
    let mut section = String::from(
        "### Short sequences\n\n`cargo bench --bench lean_step -- short`: SmolLM2-135M, 2 layers, f32, AdamW, \
         the whole step's bytes a token: the least-squares slope of its peak over three batches, and (in \
         brackets) how far in samples the middle one lies off the line through the others. A full \
         fine-tune's chunk of the loss grows with the batch up to 256 rows (4 samples of 64 tokens); a \
         frozen head's is 32 rows (4M values over the vocabulary, at most 32).\n\n\
         | training | 64 tokens, batches 1–3 | / 1024 tokens' | 64 tokens, batches 4–12 | / 1024 tokens' | \
         1024 tokens, batches 1–3 |\n|---|---|---|---|---|---|\n",
    );
    let lora = || autobatch_models::Lora::new(8, &["q_proj", "k_proj", "v_proj", "o_proj"]);
    for (name, lora) in [("full fine-tuning", None), ("LoRA rank 8 (attention)", Some(lora()))] {
        // the least-squares slope over the three, and how far the middle lies off the line through the ends
        let per_token = |seq_len: usize, batches: [usize; 3]| {
            let mut training = training(seq_len, true, Ops::Fused);
            if let Some(lora) = lora.clone() {
                training = training.lora(lora);
            }
            let p = peaks(&config, &training, &batches);
            let (xs, ys) = (batches.map(|b| b as f64), [p[0], p[1], p[2]].map(|p| p as f64));
            let (mx, my) = (xs.iter().sum::<f64>() / 3.0, ys.iter().sum::<f64>() / 3.0);
            let slope = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum::<f64>()
                / xs.iter().map(|x| (x - mx).powi(2)).sum::<f64>();
            let ends = (ys[2] - ys[0]) / (xs[2] - xs[0]);
            let off = (ys[1] - (ys[0] + ends * (xs[1] - xs[0]))).abs() / ends.max(1.0);
            eprintln!(
                "{name} at {seq_len}: peaks {p:?}, {:.1} kB a token, the middle {off:.2} of a sample off the line",
                slope / seq_len as f64 / 1e3
            );
            (slope / seq_len as f64, off)
        };
        let [(first, first_off), (past, past_off), (long, long_off)] =
            [(64, [1, 2, 3]), (64, [4, 8, 12]), (1024, [1, 2, 3])]
                .map(|(seq_len, batches)| per_token(seq_len, batches));
        let _ = writeln!(
            section,
            "| {name} | {:.1} kB ({first_off:.2}) | {:.2} | {:.1} kB ({past_off:.2}) | {:.2} | {:.1} kB ({long_off:.2}) |",
            first / 1e3,
            first / long,
            past / 1e3,
            past / long,
            long / 1e3,
        );
    }
    println!("{section}");
    let path = shared::replace("lean-step-short", &shared::with_host(&section)).unwrap();
    eprintln!("wrote {}", path.display());
}

/// The phases of each step at each length (each line, the batches it was
/// fitted to, where they cross), the last one's bytes a sample against
/// PyTorch's, step time, and the largest batch under 2 GiB at 256 tokens.
fn tables() {
    let mut section = String::from(
        "## The lean step against PyTorch's\n\n`cargo bench --bench lean_step`: a config model's whole training \
         step (forward, backward and AdamW's update, the probe's and the training loop's step) in f32 on the CPU \
         heap. Fused: the default (fused ops, blocked attention, the chunked loss); composed: the same with the \
         ops written as candle ops (`Ops::Eager`). PyTorch: transformers 5.25's LlamaForCausalLM on the same \
         config (SDPA, the head and loss in checkpointed chunks, torch 2.15's default AdamW), issue 89's \
         figures past its crossover, quoted. The step's peak is the largest of two or more lines (the update's \
         at small batches, the backward pass's past where they cross): each is fitted by `MemoryModel::through`, \
         the plan's own fit, to the batches named, and *bytes a sample* is the last phase's slope, past the \
         crossover (MB: 10^6 bytes). Step time: the whole step at the largest batch measured, per sample.\n\n",
    );
    let models = [
        ("SmolLM2-135M, 2 layers", config("smollm2-135m.json", 2), &LENGTHS[..]),
        ("Llama-3.2-1B, 1 layer", config("llama-3.2-1b.json", 1), &LENGTHS[..1]),
    ];
    let mb = |bytes: f64| format!("{:.1} MB", bytes / 1e6);
    let phases = |model: &autobatch::plan::MemoryModel| -> String {
        let said: Vec<String> = model
            .phases
            .iter()
            .map(|phase| {
                let batches = phase.batches.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
                let from = phase.crossover.map_or(String::new(), |at| format!("from batch {at:.1}: "));
                let confirmed = if phase.confirmed() { "" } else { ", unconfirmed" };
                let line = match phase.bytes_per_sample {
                    0.0 => format!("{} flat", mb(phase.fixed_bytes)),
                    slope => format!("{} + {} a sample", mb(phase.fixed_bytes), mb(slope)),
                };
                format!("{from}{line} (batches {batches}{confirmed})")
            })
            .collect();
        said.join("; then ")
    };
    let mut smol_256 = None;
    for (name, config, lengths) in &models {
        let _ = writeln!(section, "### {name}\n");
        section += "| tokens | phases (fused) | bytes a sample past the crossover | PyTorch | / PyTorch | composed | \
                    composed / fused | fused step a sample | composed step a sample | fused / composed time |\n\
                    |---|---|---|---|---|---|---|---|---|---|\n";
        for &seq_len in lengths.iter() {
            let (_, batches) = PHASE_BATCHES.iter().find(|(len, _)| *len == seq_len).unwrap();
            let batches = if name.starts_with("Llama") { &batches[..6] } else { batches };
            let fit = |ops: Ops| {
                let measured = timed_peaks(config, &training(seq_len, true, ops), batches);
                let points: Vec<(usize, u64)> =
                    batches.iter().zip(&measured).map(|(&b, &(peak, _))| (b, peak)).collect();
                eprintln!("{name} at {seq_len}, {ops:?}: {measured:?}");
                let last = batches.len() - 1;
                (autobatch::plan::MemoryModel::through(&points).unwrap(), measured[last].1 / batches[last] as f64)
            };
            let (fused, fused_time) = fit(Ops::Fused);
            let (composed, composed_time) = fit(Ops::Eager);
            let pytorch = PYTORCH_LEAN.iter().find(|(len, _)| *len == seq_len && name.starts_with("SmolLM2"));
            let (theirs, ratio) = match pytorch {
                Some(&(_, bytes)) => (mb(bytes), format!("{:.2}", fused.bytes_per_sample / bytes)),
                None => ("–".to_owned(), "–".to_owned()),
            };
            let row = format!(
                "| {seq_len} | {} | {} | {theirs} | {ratio} | {} | {:.2}× | {fused_time:.2} s | {composed_time:.2} s | {:.2} |",
                phases(&fused),
                mb(fused.bytes_per_sample),
                mb(composed.bytes_per_sample),
                composed.bytes_per_sample / fused.bytes_per_sample,
                fused_time / composed_time
            );
            eprintln!("{name}: {row}");
            section += &row;
            section.push('\n');
            if seq_len == 256 && name.starts_with("SmolLM2") {
                smol_256 = Some(fused);
            }
        }
        section.push('\n');
    }
    // the largest batch under the budget at 256 tokens: the fit's, then run there and one above
    if let Some(model) = smol_256 {
        let limit = autobatch::plan::Ceiling::default().limit_bytes(BUDGET);
        let predicted = model.largest_under(limit).unwrap();
        let smol = &models[0].1;
        let at = peaks(smol, &training(256, true, Ops::Fused), &[predicted, predicted + 1]);
        let _ = writeln!(
            section,
            "The largest batch of 256 tokens under a 2 GiB budget (a 90% ceiling, {}): {predicted} by the fit \
             (PyTorch's {PYTORCH_LARGEST}: {:.2}×); run there the step peaks at {} ({}), at {} {} ({}).\n",
            mb(limit as f64),
            predicted as f64 / PYTORCH_LARGEST as f64,
            mb(at[0] as f64),
            if at[0] <= limit { "under" } else { "over" },
            predicted + 1,
            mb(at[1] as f64),
            if at[1] <= limit { "under" } else { "over" },
        );
    }
    section += "### Eager attention and the full loss, SmolLM2-135M, 2 layers\n\n\
        The scores and the logits made whole (`--attention eager --loss full`), the ops fused, against \
        PyTorch's eager attention with the full loss (issue 57's figures): the slope of a forward and \
        backward pass between batches 1 and 2, as those were measured.\n\n\
        | tokens | ours | PyTorch | ours / PyTorch |\n|---|---|---|---|\n";
    let smol = &models[0].1;
    for (seq_len, theirs) in PYTORCH_EAGER {
        let eager = training(seq_len, false, Ops::Fused);
        let counted = smol.bytes_per_sample(&eager).unwrap();
        let row = if 2 * counted < MEASURABLE {
            let (ours, _) = measure(smol, &eager);
            format!("| {seq_len} | {} | {} | {:.2} |", mb(ours as f64), mb(theirs), ours as f64 / theirs)
        } else {
            format!("| {seq_len} | {} † | {} | {:.2} |", mb(counted as f64), mb(theirs), counted as f64 / theirs)
        };
        eprintln!("eager: {row}");
        section += &row;
        section.push('\n');
    }
    let path = shared::replace("lean-step", &shared::with_host(&section)).unwrap();
    eprintln!("wrote {}", path.display());
}

/// Samples per second at each step's tuned batch: SmolLM2 at 512 tokens
/// under 2 GiB, in the config's dtype.
fn tuned_batches() {
    let (name, config) = ("SmolLM2-135M, 2 layers", config("smollm2-135m.json", 2));
    let in_config_dtype = |lean| Training { dtype: None, ..training(512, lean, Ops::Fused) };
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

use autobatch_testkit::docs as shared;
