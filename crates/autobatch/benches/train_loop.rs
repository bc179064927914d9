//! `TrainLoop` against the loop a user writes by hand: the same model, data,
//! accumulation and candle-nn AdamW step, run in interleaved pairs so that
//! the machine's drift falls on both alike. Time ratio (median of the pairs),
//! step peaks, and losses.
//!
//! ```text
//! cargo bench --bench train_loop      # writes its section of docs/benchmarks.md
//! ```

#[global_allocator]
static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();

use std::fmt::Write as _;
use std::time::Instant;

use autobatch::{HeapMeter, MemoryMeter, ModelProbe, Plan, TrackingAllocator, TrainLoop, Tuner};
use candle_core::{DType, Device, Module, Result, Tensor, Var, backprop::GradStore};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, Sequential, VarBuilder, VarMap, linear, loss};

const PAIRS: usize = 31;
const BUDGET: u64 = 1 << 30;

/// A user's MLP: `inputs → width → width → 10`, ReLU between.
fn mlp(varmap: &VarMap, inputs: usize, width: usize) -> Result<Sequential> {
    let vb = VarBuilder::from_varmap(varmap, DType::F32, &Device::Cpu);
    Ok(candle_nn::seq()
        .add(linear(inputs, width, vb.pp("fc1"))?)
        .add(candle_nn::Activation::Relu)
        .add(linear(width, width, vb.pp("fc2"))?)
        .add(candle_nn::Activation::Relu)
        .add(linear(width, 10, vb.pp("head"))?))
}

/// The step's samples, the same for both loops.
struct Data {
    inputs: Tensor,
    labels: Tensor,
}

impl Data {
    fn new(samples: usize, inputs: usize) -> Result<Self> {
        let inputs = Tensor::randn(0f32, 1., (samples, inputs), &Device::Cpu)?;
        let labels = Tensor::from_vec((0..samples as u32).map(|i| i % 10).collect(), samples, &Device::Cpu)?;
        Ok(Data { inputs, labels })
    }

    fn loss(&self, model: &Sequential, offset: usize, len: usize) -> Result<Tensor> {
        let logits = model.forward(&self.inputs.narrow(0, offset, len)?)?;
        loss::cross_entropy(&logits, &self.labels.narrow(0, offset, len)?)
    }
}

/// The loop by hand: each micro-step's mean loss scaled by its share, its
/// gradients added up variable by variable, AdamW's step on the sum, the
/// step's loss read back once.
fn by_hand(
    model: &Sequential,
    vars: &[Var],
    optimizer: &mut AdamW,
    data: &Data,
    micro: usize,
    k: usize,
) -> Result<f32> {
    let mut sum: Option<GradStore> = None;
    let mut total: Option<Tensor> = None;
    for step in 0..k {
        let scaled = (data.loss(model, step * micro, micro)? / k as f64)?;
        let grads = scaled.backward()?;
        total = Some(match total {
            Some(t) => (t + scaled.detach())?,
            None => scaled.detach(),
        });
        sum = Some(match sum {
            None => grads,
            Some(mut acc) => {
                for var in vars {
                    if let (Some(a), Some(g)) = (acc.get(var.as_tensor()), grads.get(var.as_tensor())) {
                        let added = (a + g)?;
                        acc.insert(var.as_tensor(), added);
                    }
                }
                acc
            }
        });
    }
    optimizer.step(&sum.expect("k ≥ 1"))?;
    total.expect("k ≥ 1").to_scalar::<f32>()
}

/// The plan `TrainLoop` follows: micro-batch `micro` × `k` steps.
fn plan(varmap: &VarMap, model: &Sequential, data: &Data, micro: usize, k: usize) -> Plan {
    let mut probe = ModelProbe::new(varmap, |batch| data.loss(model, 0, batch.len))
        .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
        .unwrap();
    let tuner = Tuner::new().start(micro).max_batch(micro).target_effective_batch(micro * k);
    let plan = tuner.search(&mut probe, &mut HeapMeter::new(BUDGET).unwrap()).run().unwrap();
    assert_eq!((plan.micro_batch(), plan.accumulation_steps()), (micro, k), "{plan}");
    plan
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// One case: the median time ratio, the two step peaks over what was held
/// before the step, and the last losses of each.
fn case(inputs: usize, width: usize, micro: usize, k: usize) -> (f64, u64, u64, u64) {
    let varmap = VarMap::new();
    let model = mlp(&varmap, inputs, width).unwrap();
    let vars = varmap.all_vars();
    let data = Data::new(micro * k, inputs).unwrap();
    let plan = plan(&varmap, &model, &data, micro, k);
    // the probe's step, over what was held before it (with k > 1, the accumulating micro-step)
    let probed = plan
        .trials()
        .iter()
        .filter(|t| t.batch == micro && t.outcome.fits())
        .filter_map(|t| Some(t.peak_bytes? - t.baseline_bytes))
        .max()
        .unwrap();
    let mut meter = HeapMeter::new(BUDGET).unwrap();
    let mut training =
        TrainLoop::new(&plan, &varmap, AdamW::new(vars.clone(), ParamsAdamW::default()).unwrap()).unwrap();
    let mut hand = AdamW::new(vars.clone(), ParamsAdamW::default()).unwrap();
    let mut ratios = Vec::new();
    let (mut loop_peak, mut hand_peak) = (0, 0);
    let mut run_loop = |meter: &mut HeapMeter| {
        let before = meter.in_use().unwrap();
        TrackingAllocator::reset_peak();
        let started = Instant::now();
        let report = training.step(meter, |m| data.loss(&model, m.offset, m.len)).unwrap();
        (started.elapsed().as_secs_f64(), TrackingAllocator::peak_bytes() - before, report.loss.unwrap() as f32)
    };
    let mut run_hand = |meter: &mut HeapMeter| {
        let before = meter.in_use().unwrap();
        TrackingAllocator::reset_peak();
        let started = Instant::now();
        let loss = by_hand(&model, &vars, &mut hand, &data, micro, k).unwrap();
        (started.elapsed().as_secs_f64(), TrackingAllocator::peak_bytes() - before, loss)
    };
    // one warm step each
    run_loop(&mut meter);
    run_hand(&mut meter);
    for pair in 0..PAIRS {
        let (a, b) = if pair % 2 == 0 {
            let a = run_loop(&mut meter);
            (a, run_hand(&mut meter))
        } else {
            let b = run_hand(&mut meter);
            (run_loop(&mut meter), b)
        };
        ratios.push(a.0 / b.0);
        assert_eq!(a.2.is_finite(), b.2.is_finite());
        (loop_peak, hand_peak) = (a.1, b.1);
    }
    (median(ratios), probed, loop_peak, hand_peak)
}

use autobatch_testkit::docs;

fn main() {
    if std::env::args().any(|a| a == "--test" || a == "--list") {
        return;
    }
    let mut section = format!(
        "## TrainLoop against a loop by hand\n\nGenerated by `cargo bench --bench train_loop` (crates/autobatch/benches/train_loop.rs): \
         a user's candle-nn MLP (`inputs → width → width → 10`, ReLU) with candle-nn's AdamW, one optimizer step of \
         micro-batch × k accumulation steps, through `TrainLoop::step` and through the loop a user writes by hand \
         (each micro-step's mean loss scaled by 1/k, its gradients added variable by variable, AdamW's step on the \
         sum, the loss read back once), in {PAIRS} interleaved pairs after a warm step each. Peaks are the heap's \
         high-water mark over what was held before the step; the plan's probe is `ModelProbe` with `.optimizer::<AdamW>` at the \
         same micro-batch (with k > 1 its accumulating micro-step), what the plan's peak promises.\n\n\
         | model | micro-batch × k | time TrainLoop / by hand (median) | peak: the plan's probe | peak TrainLoop | \
         peak by hand |\n|---|---|---|---|---|---|\n"
    );
    for (inputs, width, micro, k) in [(512, 1024, 64, 1), (512, 1024, 16, 4), (256, 512, 128, 1), (256, 512, 32, 4)] {
        let (ratio, probed, loop_peak, hand_peak) = case(inputs, width, micro, k);
        let _ = writeln!(
            section,
            "| mlp {inputs}→{width}→{width}→10 | {micro} × {k} | {ratio:.3} | {} | {} | {} |",
            autobatch::Bytes(probed),
            autobatch::Bytes(loop_peak),
            autobatch::Bytes(hand_peak)
        );
        eprintln!("mlp {inputs} {width} {micro}x{k}: ratio {ratio:.3}, peaks {probed} / {loop_peak} / {hand_peak}");
    }
    let _ = writeln!(
        section,
        "\nOn {} CPU threads. A ratio of 1 is no overhead; the guard's bookkeeping and the loss summed on the device \
         are all `TrainLoop` adds.",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    print!("{section}");
    let path = docs::replace("train-loop", &docs::with_host(&section)).unwrap();
    eprintln!("wrote {}", path.display());
}
