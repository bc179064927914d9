//! The CPU as a device does not depend on the host or on the process's
//! history: gemm's per-thread matmul buffers (sized from the host's caches,
//! kept for a thread's life) are brought to size by the meter, so a larger
//! matmul before, between or after trials changes neither the answer nor
//! training's peak; a backtrace the process printed (its debug information
//! kept on the heap) changes no answer measured with a budget sized from the
//! baseline; and the tuner itself never prints one.
//!
//! The heap is process-wide: this file has its own harness and runs its checks
//! one after another on one thread (see autobatch_testkit::harness).

use std::sync::{Arc, Mutex};

use autobatch::{HeapMeter, MemoryMeter, ModelProbe, Observer, TrackingAllocator, TrainLoop, Tuner, plan::Trial};
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Linear, Optimizer, ParamsAdamW, VarBuilder, VarMap, linear, loss};

const MIB: u64 = 1 << 20;
/// What the harness and the test's own bookkeeping allocate between two
/// readings (see crates/models/tests/measured/workloads.rs).
const TOLERANCE: u64 = 4 << 10;

/// Matmuls of every kind gemm treats apart: small and large, contiguous and
/// transposed operands, a batched product; the largest is larger than any step
/// of the model below.
fn larger_matmuls() -> candle_core::Result<()> {
    let cpu = &Device::Cpu;
    for (m, k, n) in [(16, 16, 16), (64, 64, 64), (300, 200, 100), (1024, 512, 512), (2048, 1024, 64)] {
        let a = Tensor::ones((m, k), DType::F32, cpu)?;
        let b = Tensor::ones((k, n), DType::F32, cpu)?;
        a.matmul(&b)?;
        a.t()?.contiguous()?.t()?.matmul(&b)?;
        a.matmul(&b.t()?.contiguous()?.t()?)?;
        a.unsqueeze(0)?.repeat((3, 1, 1))?.matmul(&b.unsqueeze(0)?.repeat((3, 1, 1))?)?;
    }
    Ok(())
}

/// [`larger_matmuls`] on this thread and on every worker of the pool.
fn larger_matmuls_everywhere() {
    larger_matmuls().unwrap();
    rayon::broadcast(|_| larger_matmuls()).into_iter().collect::<candle_core::Result<()>>().unwrap();
}

/// Runs [`larger_matmuls_everywhere`] after every trial, outside its measurement.
struct MatmulsBetweenTrials;

impl Observer for MatmulsBetweenTrials {
    fn trial_finished(&mut self, _trial: &Trial, _capacity_bytes: u64) {
        larger_matmuls_everywhere();
    }
}

/// A user's model as a user writes it: candle-nn layers over a `VarMap`.
struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    fn new(varmap: &VarMap) -> Mlp {
        let vb = VarBuilder::from_varmap(varmap, DType::F32, &Device::Cpu);
        let widths = [96, 192, 192, 10];
        let layers = widths.windows(2).enumerate().map(|(i, w)| linear(w[0], w[1], vb.pp(i)).unwrap()).collect();
        Mlp { layers }
    }

    fn loss(&self, samples: usize) -> candle_core::Result<Tensor> {
        let cpu = &Device::Cpu;
        let mut x = Tensor::ones((samples, 96), DType::F32, cpu)?;
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x)?;
            if i + 1 < self.layers.len() {
                x = x.relu()?;
            }
        }
        loss::cross_entropy(&x, &Tensor::zeros(samples, DType::U32, cpu)?)
    }
}

/// Heap bytes live at the peak of `step`, device-wide.
fn peak_of(step: impl FnOnce()) -> u64 {
    TrackingAllocator::reset_peak();
    step();
    TrackingAllocator::peak_bytes()
}

fn a_thread_the_meter_settled_keeps_nothing_after_any_matmul() {
    // the pool's workers and this thread, settled by a meter reading
    let meter = HeapMeter::new(MIB).unwrap();
    meter.in_use().unwrap();
    larger_matmuls().unwrap(); // candle's own lazily built pools and tables, once
    let before = TrackingAllocator::live_bytes();
    larger_matmuls_everywhere();
    let after = TrackingAllocator::live_bytes();
    assert!(after <= before + TOLERANCE, "matmuls on settled threads kept {} bytes", after.saturating_sub(before));

    // a thread the meter never saw keeps its buffer at its first matmul; one it
    // settled keeps nothing more (this fails if candle's gemm is not the one the
    // meter settles: another version keeps its buffer in another thread-local)
    let kept_on_a_new_thread = |settle: bool| {
        std::thread::spawn(move || {
            if settle {
                HeapMeter::new(MIB).unwrap().in_use().unwrap();
            }
            let before = TrackingAllocator::live_bytes();
            larger_matmuls().unwrap();
            TrackingAllocator::live_bytes().saturating_sub(before)
        })
        .join()
        .unwrap()
    };
    let buffer = meter.thread_buffer_bytes();
    let unsettled = kept_on_a_new_thread(false);
    let settled = kept_on_a_new_thread(true);
    println!("  matmul buffer {buffer} bytes a thread: a new thread keeps {unsettled}, a settled one {settled}");
    assert!(buffer >= 16 << 10, "gemm reads an L2 cache of {buffer} bytes");
    assert!(unsettled.abs_diff(buffer) <= TOLERANCE, "a new thread kept {unsettled} bytes, its buffer is {buffer}");
    assert!(settled <= TOLERANCE, "a settled thread kept {settled} bytes");
    // the new threads are gone, and with them their buffers: the count follows
    let threads = rayon::current_num_threads() + 1;
    assert_eq!(meter.buffered_threads(), threads, "threads holding a buffer");
    assert_eq!(meter.thread_scratch_bytes(), buffer * threads as u64);
}

fn larger_matmuls_before_between_and_after_trials_change_no_answer() {
    let varmap = VarMap::new();
    let model = Mlp::new(&varmap);
    let tune = |between: bool| {
        let mut probe = ModelProbe::new(&varmap, |b| model.loss(b.len))
            .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
            .unwrap();
        let mut meter = HeapMeter::with_room(12 * MIB).unwrap();
        let tuner = Tuner::new().ceiling(0.9).max_batch(4096);
        let tuner = if between { tuner.observer(Arc::new(Mutex::new(MatmulsBetweenTrials))) } else { tuner };
        let plan = tuner.search(&mut probe, &mut meter).run().unwrap();
        (plan, meter)
    };
    let (quiet, quiet_meter) = tune(false);
    larger_matmuls_everywhere();
    let (busy, _) = tune(true);
    println!("  largest batch {} quietly, {} with larger matmuls around", quiet.largest_batch(), busy.largest_batch());
    assert!(quiet.largest_batch() >= 16, "{quiet}");
    assert_eq!(busy.largest_batch(), quiet.largest_batch(), "quiet:\n{quiet}\nbusy:\n{busy}");
    assert!(
        busy.peak_bytes().abs_diff(quiet.peak_bytes()) <= TOLERANCE,
        "peaks {} and {}",
        quiet.peak_bytes(),
        busy.peak_bytes()
    );

    // training with the plan, after larger matmuls, peaks under its ceiling
    larger_matmuls_everywhere();
    let optimizer = autobatch::optim::AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    let mut training = TrainLoop::new(&quiet, &varmap, optimizer).unwrap();
    let mut meter = quiet_meter;
    let mut step = || {
        training.step(&mut meter, |micro| model.loss(micro.len)).unwrap();
    };
    step();
    larger_matmuls_everywhere();
    let trained = peak_of(step);
    let limit = quiet.limit_bytes();
    println!("  training peaks at {trained}, limit {limit}");
    assert!(trained <= limit + TOLERANCE, "training peaks at {trained} > {limit}\n{quiet}");
}

fn the_tuner_never_prints_a_backtrace() {
    let err = candle_core::Error::WithBacktrace {
        inner: Box::new(candle_core::Error::Msg("a shape mismatch".to_owned())),
        backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
    };
    let before = TrackingAllocator::live_bytes();
    assert!(!autobatch::is_oom(&err) && !autobatch::may_be_oom(&err));
    let message = autobatch::Error::from(err).to_string();
    assert_eq!(message, "candle: a shape mismatch");
    let grew = TrackingAllocator::live_bytes().saturating_sub(before);
    assert!(grew <= 64 << 10, "classifying an error kept {grew} bytes");
}

fn a_printed_backtrace_changes_no_answer_under_a_budget_sized_from_the_baseline() {
    let varmap = VarMap::new();
    let model = Mlp::new(&varmap);
    let tune = || {
        let mut probe = ModelProbe::new(&varmap, |b| model.loss(b.len))
            .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
            .unwrap();
        let mut meter = HeapMeter::with_room(12 * MIB).unwrap();
        Tuner::new().ceiling(0.9).max_batch(4096).search(&mut probe, &mut meter).run().unwrap()
    };
    let before = tune();
    let held = TrackingAllocator::live_bytes();
    let printed = format!("{}", std::backtrace::Backtrace::force_capture());
    let kept = TrackingAllocator::live_bytes().saturating_sub(held);
    drop(printed);
    let after = tune();
    println!(
        "  printing a backtrace kept {kept} bytes; largest batch {} before, {} after",
        before.largest_batch(),
        after.largest_batch()
    );
    assert_eq!(after.largest_batch(), before.largest_batch(), "before:\n{before}\nafter:\n{after}");
}

/// The tests of this file, in the order they run.
pub fn tests() -> Vec<(&'static str, fn())> {
    vec![
        (
            "a_thread_the_meter_settled_keeps_nothing_after_any_matmul",
            a_thread_the_meter_settled_keeps_nothing_after_any_matmul,
        ),
        (
            "larger_matmuls_before_between_and_after_trials_change_no_answer",
            larger_matmuls_before_between_and_after_trials_change_no_answer,
        ),
        ("the_tuner_never_prints_a_backtrace", the_tuner_never_prints_a_backtrace),
        (
            "a_printed_backtrace_changes_no_answer_under_a_budget_sized_from_the_baseline",
            a_printed_backtrace_changes_no_answer_under_a_budget_sized_from_the_baseline,
        ),
    ]
}
