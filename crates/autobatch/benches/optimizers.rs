//! What each optimizer holds per parameter: its state between steps, and the
//! temporaries of one step (real and dry) above the state, read off the heap
//! on a 1024 × 1024 f32 matrix with its gradient straight from `backward`
//! (the gradient carries its graph, as in a training loop).
//!
//! ```text
//! cargo bench --bench optimizers      # writes docs/optimizers.md, a few seconds
//! ```

#[global_allocator]
static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();

use std::fmt::Write as _;

use autobatch::TrackingAllocator;
use autobatch::optim::{Adafactor, AdamW, AdamW8bit, DryStep, Lion, MixedPrecision, ParamsAdafactor, ParamsLion, Sgd};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{Optimizer, ParamsAdamW};

const N: usize = 1024;
/// The side of the large matrix: 16.8M parameters, 16 of the optimizers' slices.
const LARGE: usize = 4096;

/// Bytes per parameter: (state, real step's temporaries, dry step's temporaries).
struct Row {
    name: &'static str,
    state: f64,
    real: f64,
    dry: Option<f64>,
}

fn matrix(side: usize, dtype: DType) -> Var {
    let values: Vec<f32> = (0..side * side).map(|i| ((i * 7919 % 2003) as f32 / 1000.0) - 1.0).collect();
    let tensor = Tensor::from_vec(values, (side, side), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
    Var::from_tensor(&tensor).unwrap()
}

fn gradients(var: &Var) -> GradStore {
    let x = Tensor::ones((8, var.dims()[0]), var.dtype(), &Device::Cpu).unwrap();
    x.matmul(var.as_tensor())
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .sqr()
        .unwrap()
        .mean_all()
        .unwrap()
        .backward()
        .unwrap()
}

/// The state `make` allocates, and the peak above the live heap of one
/// `step` after a first real one (so that every moment is in its steady
/// state), in bytes per parameter of a `N × N` matrix.
fn measure<O: Optimizer>(dtype: DType, make: impl Fn(Vec<Var>) -> O, step: impl Fn(&mut O, &GradStore)) -> (f64, f64) {
    let (state, peak) = measure_bytes(N, dtype, make, step);
    let parameters = (N * N) as f64;
    (state as f64 / parameters, peak as f64 / parameters)
}

/// [`measure`] on a `side × side` matrix, in bytes.
fn measure_bytes<O: Optimizer>(
    side: usize,
    dtype: DType,
    make: impl Fn(Vec<Var>) -> O,
    step: impl Fn(&mut O, &GradStore),
) -> (u64, u64) {
    let var = matrix(side, dtype);
    let before = TrackingAllocator::live_bytes();
    let mut optimizer = make(vec![var.clone()]);
    let state = TrackingAllocator::live_bytes() - before;
    optimizer.step(&gradients(&var)).unwrap();
    let grads = gradients(&var);
    let live = TrackingAllocator::live_bytes();
    TrackingAllocator::reset_peak();
    step(&mut optimizer, &grads);
    let peak = TrackingAllocator::peak_bytes() - live;
    (state, peak)
}

/// One optimizer's state and real step on the large matrix, in MiB, and the
/// step against the target: at most 64 MiB or 5% of the state, the larger.
fn large_row<O: Optimizer>(name: &str, make: impl Fn(Vec<Var>) -> O) -> String {
    let (state, step) = measure_bytes(LARGE, DType::F32, &make, |o, g| o.step(g).unwrap());
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    let bound = (64u64 << 20).max(state / 20);
    let verdict = if step <= bound { "within" } else { "over" };
    // the median of five steps, after a first
    let var = matrix(LARGE, DType::F32);
    let mut optimizer = make(vec![var.clone()]);
    let grads = gradients(&var);
    optimizer.step(&grads).unwrap();
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            let started = std::time::Instant::now();
            optimizer.step(&grads).unwrap();
            started.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let time = times[2];
    println!("{name:<45} state {:8.1} MiB  step {:8.1} MiB  ({verdict})  {time:.0} ms", mib(state), mib(step));
    format!("| {name} | {:.1} | {:.1} | {verdict} | {time:.0} ms |", mib(state), mib(step))
}

fn row<O: Optimizer + DryStep>(name: &'static str, dtype: DType, make: impl Fn(Vec<Var>) -> O) -> Row {
    let (state, real) = measure(dtype, &make, |o, g| o.step(g).unwrap());
    let (_, dry) = measure(dtype, &make, |o, g| o.dry_step(g).unwrap());
    Row { name, state, real, dry: Some(dry) }
}

fn main() {
    let (state, real) =
        measure(DType::F32, |v| candle_nn::AdamW::new(v, ParamsAdamW::default()).unwrap(), |o, g| o.step(g).unwrap());
    let (sgd_state, sgd_real) =
        measure(DType::F32, |v| candle_nn::SGD::new(v, 0.01).unwrap(), |o, g| o.step(g).unwrap());
    let (bf16_sgd_state, bf16_sgd_real) =
        measure(DType::BF16, |v| candle_nn::SGD::new(v, 0.01).unwrap(), |o, g| o.step(g).unwrap());
    let rows = [
        Row { name: "`candle_nn::SGD`", state: sgd_state, real: sgd_real, dry: None },
        row("`optim::Sgd` (candle-nn's numbers)", DType::F32, |v| Sgd::new(v, 0.01).unwrap()),
        Row { name: "`candle_nn::AdamW`", state, real, dry: None },
        row("`optim::AdamW` (candle-nn's numbers)", DType::F32, |v| AdamW::new(v, ParamsAdamW::default()).unwrap()),
        row("`optim::Lion`", DType::F32, |v| Lion::new(v, ParamsLion::default()).unwrap()),
        row("`optim::Adafactor`", DType::F32, |v| Adafactor::new(v, ParamsAdafactor::default()).unwrap()),
        row("`optim::AdamW8bit`", DType::F32, |v| AdamW8bit::new(v, candle_nn::ParamsAdamW::default()).unwrap()),
        Row { name: "`candle_nn::SGD` (bf16 variable)", state: bf16_sgd_state, real: bf16_sgd_real, dry: None },
        row("`optim::Sgd` (bf16 variable)", DType::BF16, |v| Sgd::new(v, 0.01).unwrap()),
        row("`optim::AdamW` (bf16 variable)", DType::BF16, |v| AdamW::new(v, ParamsAdamW::default()).unwrap()),
        row("`optim::Lion` (bf16 variable)", DType::BF16, |v| Lion::new(v, ParamsLion::default()).unwrap()),
        row("`optim::Adafactor` (bf16 variable)", DType::BF16, |v| {
            Adafactor::new(v, ParamsAdafactor::default()).unwrap()
        }),
        row("`optim::AdamW8bit` (bf16 variable)", DType::BF16, |v| {
            AdamW8bit::new(v, candle_nn::ParamsAdamW::default()).unwrap()
        }),
        row("`MixedPrecision<AdamW>` (bf16 variable)", DType::BF16, |v| {
            MixedPrecision::<AdamW>::new(v, ParamsAdamW::default()).unwrap()
        }),
    ];
    let mut report = String::new();
    writeln!(report, "# Optimizers: state and step memory per parameter\n").unwrap();
    writeln!(
        report,
        "Written by `cargo bench --bench optimizers`. Heap bytes per parameter of a 1024 × 1024 matrix \
         (f32 unless said), its gradient straight from `backward`. *State* is what the optimizer holds \
         between steps; *step* is the peak of one step above everything live before it (state, weights, \
         gradients), one variable at a time, the real step's and the dry step's (what `ModelProbe` runs: \
         the same computation, not written back). The probe's measured peak includes the step, so a \
         step that equals its dry twin is measured as training holds it.\n"
    )
    .unwrap();
    writeln!(report, "| optimizer | state | step (real) | step (dry) |").unwrap();
    writeln!(report, "|---|---:|---:|---:|").unwrap();
    for row in &rows {
        let dry = row.dry.map_or_else(|| "–".to_owned(), |dry| format!("{dry:.1}"));
        writeln!(report, "| {} | {:.2} | {:.1} | {dry} |", row.name, row.state, row.real).unwrap();
        println!("{:<45} state {:6.2}  step {:6.1}  dry {dry}", row.name, row.state, row.real);
    }
    writeln!(
        report,
        "\nThe library's optimizers compute their update a slice of the variable at a time (2^20 elements: \
         a 1024 × 1024 matrix is one slice) on detached tensors, freeing each intermediate as soon as the \
         next exists, and write each slice in place; `optim::AdamW` gives candle-nn's AdamW's numbers to \
         the bit. `candle_nn::AdamW` computes on the variable and the gradient as they are, and a chain of \
         ops on tensors that hold a graph keeps every intermediate alive until the result is dropped. \
         Mixed precision steps the f32 masters from the bf16 gradients, cast a slice at a time, and rounds \
         the masters back a slice at a time."
    )
    .unwrap();
    writeln!(
        report,
        "\n## A large variable\n\nThe same on a {LARGE} × {LARGE} f32 matrix ({} parameters, 64 MiB): the \
         step's temporaries in MiB, against the bound the update keeps whatever the variable (at most 64 MiB \
         or 5% of the state, the larger). The library's optimizers update a slice of 2^20 elements at a time \
         in place (`Tensor::slice_set`), so their step does not grow with the variable; candle-nn's SGD and \
         AdamW make whole-variable temporaries. Step time: one step of the whole matrix, the median of five \
         (`optim::AdamW` against `candle_nn::AdamW`, `optim::Sgd` against `candle_nn::SGD`: the same arithmetic, in slices or whole).\n",
        LARGE * LARGE
    )
    .unwrap();
    writeln!(report, "| optimizer | state (MiB) | step (MiB) | bound | step time (median of 5) |").unwrap();
    writeln!(report, "|---|---:|---:|---|---:|").unwrap();
    let large = [
        large_row("`candle_nn::SGD`", |v| candle_nn::SGD::new(v, 0.01).unwrap()),
        large_row("`optim::Sgd`", |v| Sgd::new(v, 0.01).unwrap()),
        large_row("`candle_nn::AdamW`", |v| candle_nn::AdamW::new(v, ParamsAdamW::default()).unwrap()),
        large_row("`optim::AdamW`", |v| AdamW::new(v, ParamsAdamW::default()).unwrap()),
        large_row("`optim::Lion`", |v| Lion::new(v, ParamsLion::default()).unwrap()),
        large_row("`optim::Adafactor`", |v| Adafactor::new(v, ParamsAdafactor::default()).unwrap()),
        large_row("`optim::AdamW8bit`", |v| AdamW8bit::new(v, ParamsAdamW::default()).unwrap()),
    ];
    for line in large {
        writeln!(report, "{line}").unwrap();
    }
    std::fs::write(docs::page("optimizers.md"), docs::with_host(&report)).unwrap();
}

use autobatch_testkit::docs;
