//! The lean optimizers (Lion, Adafactor, 8-bit AdamW) next to AdamW: each
//! learns the reference task about as well, holds the state its docs say (read
//! off the heap), and its dry step changes nothing, also when `ModelProbe`
//! tunes a model with it.
//!
//! Heap measurements: its own sequential harness (see autobatch_testkit::harness).

use autobatch::optim::{Adafactor, AdamW, AdamW8bit, DryStep, Lion, ParamsAdafactor, ParamsLion};
use autobatch::{HeapMeter, MemoryMeter, ModelProbe, TrackingAllocator, Tuner, plan::Warning};
use candle_core::{DType, Device, Module, Result, Tensor, Var};
use candle_nn::{Linear, Optimizer, ParamsAdamW, VarBuilder, VarMap, linear, loss};

const INPUTS: usize = 64;
const CLASSES: usize = 10;

/// The reference MLP task: labels from a fixed random linear teacher.
struct Task {
    teacher: Tensor,
}

impl Task {
    fn new() -> Task {
        let values: Vec<f32> = (0..INPUTS * CLASSES).map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0).collect();
        Task { teacher: Tensor::from_vec(values, (INPUTS, CLASSES), &Device::Cpu).unwrap() }
    }

    fn batch(&self, size: usize, seed: usize) -> (Tensor, Tensor) {
        let values: Vec<f32> =
            (0..size * INPUTS).map(|i| (((seed * 104_729 + i) * 2_654_435_761 % 4096) as f32 / 2048.0) - 1.0).collect();
        let x = Tensor::from_vec(values, (size, INPUTS), &Device::Cpu).unwrap();
        let y = x.matmul(&self.teacher).unwrap().argmax(1).unwrap();
        (x, y)
    }
}

struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    fn new(varmap: &VarMap) -> Mlp {
        Mlp::with_dtype(varmap, DType::F32)
    }

    fn with_dtype(varmap: &VarMap, dtype: DType) -> Mlp {
        let vb = VarBuilder::from_varmap(varmap, dtype, &Device::Cpu);
        let layers = vec![
            linear(INPUTS, 128, vb.pp("fc1")).unwrap(),
            linear(128, 128, vb.pp("fc2")).unwrap(),
            linear(128, CLASSES, vb.pp("out")).unwrap(),
        ];
        // candle's CPU generator cannot be seeded: start every run from the same weights
        let mut vars: Vec<_> = varmap.data().lock().unwrap().iter().map(|(n, v)| (n.clone(), v.clone())).collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        for (index, (name, var)) in vars.into_iter().enumerate() {
            let fan_in = if name.ends_with("weight") { var.dims()[1] } else { 128 } as f32;
            let values: Vec<f32> = (0..var.elem_count())
                .map(|i| {
                    let hash = ((index * 1_000_003 + i) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
                    (hash as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) / fan_in.sqrt()
                })
                .collect();
            var.set(&Tensor::from_vec(values, var.shape(), &Device::Cpu).unwrap().to_dtype(dtype).unwrap()).unwrap();
        }
        Mlp { layers }
    }

    fn loss(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        let mut h = x.to_dtype(self.layers[0].weight().dtype())?;
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = h.relu()?;
            }
        }
        loss::cross_entropy(&h.to_dtype(DType::F32)?, y)
    }
}

/// Trains 150 steps of 64 samples; the mean loss of the first and of the last 10 steps.
fn train<O: Optimizer>(make: impl FnOnce(Vec<Var>) -> O) -> (f32, f32) {
    let task = Task::new();
    let varmap = VarMap::new();
    let model = Mlp::new(&varmap);
    let mut optimizer = make(varmap.all_vars());
    let mut losses = Vec::new();
    for step in 0..150 {
        let (x, y) = task.batch(64, step);
        let loss = model.loss(&x, &y).unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap());
        optimizer.backward_step(&loss).unwrap();
    }
    (losses[..10].iter().sum::<f32>() / 10.0, losses[140..].iter().sum::<f32>() / 10.0)
}

/// Criterion: each optimizer at its usual learning rate ends (mean of the last
/// 10 of 150 steps) below half its starting loss and within 1.5× AdamW's final
/// loss + 0.05.
fn each_learns_the_task_about_as_well_as_adamw() {
    let adamw = train(|vars| AdamW::new(vars, ParamsAdamW { lr: 3e-3, ..Default::default() }).unwrap());
    let results = [
        ("lion", train(|vars| Lion::new(vars, ParamsLion { lr: 1e-3, ..Default::default() }).unwrap())),
        ("adafactor", train(|vars| Adafactor::new(vars, ParamsAdafactor::default()).unwrap())),
        (
            "adamw8bit",
            train(|vars| AdamW8bit::new(vars, candle_nn::ParamsAdamW { lr: 3e-3, ..Default::default() }).unwrap()),
        ),
    ];
    println!("  adamw: {:.4} -> {:.4}", adamw.0, adamw.1);
    for (name, (first, last)) in results {
        println!("  {name}: {first:.4} -> {last:.4}");
        assert!(last < first / 2.0, "{name}: {first} -> {last}");
        assert!(last <= 1.5 * adamw.1 + 0.05, "{name}: {last} against adamw's {}", adamw.1);
    }
}

/// The state each optimizer allocates, read off the heap, is what `state_bytes`
/// says, and that is the documented figure.
fn each_holds_the_state_its_docs_say() {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let _big = linear(1024, 512, vb.pp("big")).unwrap(); // a 512×1024 matrix and a 512 vector
    let _small = linear(32, 16, vb.pp("small")).unwrap(); // a 16×32 matrix and a 16 vector
    let vars = varmap.all_vars();
    let parameters: u64 = vars.iter().map(|v| v.elem_count() as u64).sum();
    fn measured<O: DryStep>(make: impl FnOnce() -> O) -> (O, u64) {
        let before = TrackingAllocator::live_bytes();
        let optimizer = make();
        (optimizer, TrackingAllocator::live_bytes() - before)
    }
    // small per-variable bookkeeping (Vec slots, Arc headers) on top of the tensors
    let overhead = 1024 * vars.len() as u64;
    let check = |name: &str, state: u64, heap: u64, documented: u64| {
        println!(
            "  {name}: {state} bytes of state ({:.3} per parameter), {heap} on the heap",
            state as f64 / parameters as f64
        );
        assert_eq!(state, documented, "{name}");
        assert!(heap >= state && heap <= state + overhead, "{name}: heap {heap}, state {state}");
    };
    let (o, heap) = measured(|| AdamW::new(vars.clone(), ParamsAdamW::default()).unwrap());
    check("adamw", o.state_bytes(), heap, 8 * parameters);
    let (o, heap) = measured(|| Lion::new(vars.clone(), ParamsLion::default()).unwrap());
    check("lion", o.state_bytes(), heap, 4 * parameters);
    let (o, heap) = measured(|| Adafactor::new(vars.clone(), ParamsAdafactor::default()).unwrap());
    check("adafactor", o.state_bytes(), heap, 4 * (512 + 1024) + 4 * 512 + 4 * (16 + 32) + 4 * 16);
    let (o, heap) = measured(|| AdamW8bit::new(vars.clone(), candle_nn::ParamsAdamW::default()).unwrap());
    // the big matrix quantized (2 bytes + 2 scales per 256), the rest (< 4096 values) in f32
    let big = 512 * 1024u64;
    check("adamw8bit", o.state_bytes(), heap, 2 * big + 2 * 4 * (big / 256) + 8 * (parameters - big));
}

/// A dry step leaves weights, state and step count alone: an optimizer that
/// ran one steps on exactly like its twin that did not.
fn a_dry_step_changes_nothing() {
    fn check<O: Optimizer + DryStep>(name: &str, make: impl Fn(Vec<Var>) -> O) {
        let task = Task::new();
        let (a_map, b_map) = (VarMap::new(), VarMap::new());
        let (a_model, b_model) = (Mlp::new(&a_map), Mlp::new(&b_map));
        for (name, var) in a_map.data().lock().unwrap().iter() {
            b_map.data().lock().unwrap()[name].set(var.as_tensor()).unwrap();
        }
        let (mut a, mut b) = (make(a_map.all_vars()), make(b_map.all_vars()));
        for step in 0..6 {
            let (x, y) = task.batch(32, step);
            let (a_grads, b_grads) =
                (a_model.loss(&x, &y).unwrap().backward().unwrap(), b_model.loss(&x, &y).unwrap().backward().unwrap());
            if step % 2 == 1 {
                a.dry_step(&a_grads).unwrap();
            }
            a.step(&a_grads).unwrap();
            b.step(&b_grads).unwrap();
        }
        let bits = |map: &VarMap| {
            let data = map.data().lock().unwrap();
            let mut all: Vec<_> = data
                .iter()
                .map(|(n, v)| {
                    (
                        n.clone(),
                        v.as_tensor()
                            .flatten_all()
                            .unwrap()
                            .to_vec1::<f32>()
                            .unwrap()
                            .iter()
                            .map(|f| f.to_bits())
                            .collect::<Vec<_>>(),
                    )
                })
                .collect();
            all.sort();
            all
        };
        assert!(bits(&a_map) == bits(&b_map), "{name}: the dry steps changed something");
    }
    check("adamw", |vars| AdamW::new(vars, ParamsAdamW::default()).unwrap());
    check("lion", |vars| Lion::new(vars, ParamsLion::default()).unwrap());
    check("adafactor", |vars| Adafactor::new(vars, ParamsAdafactor::default()).unwrap());
    check("adamw8bit", |vars| AdamW8bit::new(vars, candle_nn::ParamsAdamW::default()).unwrap());
}

/// `probe` with the optimizer `name` (adamw, lion, adafactor, adamw8bit) at its defaults.
fn with_optimizer<L: autobatch::model::ProbeLoss>(probe: ModelProbe<L>, name: &str) -> ModelProbe<L> {
    match name {
        "adamw" => probe.optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default()),
        "lion" => probe.optimizer::<autobatch::optim::Lion>(ParamsLion::default()),
        "adafactor" => probe.optimizer::<autobatch::optim::Adafactor>(ParamsAdafactor::default()),
        _ => probe.optimizer::<autobatch::optim::AdamW8bit>(candle_nn::ParamsAdamW::default()),
    }
    .unwrap()
}

/// `ModelProbe` tunes a model with each optimizer: the weights are
/// bit-identical afterwards, and leaner state lets a larger batch fit.
fn model_probe_tunes_with_each_and_changes_nothing() {
    let task = Task::new();
    let varmap = VarMap::new();
    let model = Mlp::new(&varmap);
    let weights = || {
        let data = varmap.data().lock().unwrap();
        let mut all: Vec<_> = data
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all.into_iter().map(|(n, v)| (n, v.into_iter().map(f32::to_bits).collect::<Vec<_>>())).collect::<Vec<_>>()
    };
    let before = weights();
    let loss = |b: autobatch::MicroBatch| {
        let (x, y) = task.batch(b.len, 0);
        model.loss(&x, &y)
    };
    let mut largest = Vec::new();
    for name in ["adamw", "lion", "adafactor", "adamw8bit"] {
        let mut probe = with_optimizer(ModelProbe::new(&varmap, loss), name);
        let plan = Tuner::new()
            .max_batch(8192)
            .search(&mut probe, &mut HeapMeter::with_room(12 << 20).unwrap())
            .run()
            .unwrap();
        // the one thing to say of this model: candle keeps the input batch's own gradient
        // (its first matmul reads the data), batch × INPUTS features × 4 bytes
        for warning in plan.warnings() {
            let autobatch::plan::Warning::UntrainedGradients { tensors: 1, bytes, shapes, of_the_batch, .. } = warning
            else {
                panic!("{name}: {warning}\n{plan}")
            };
            // told by its shape, and as the batch's own: no frozen projection's fix (issue 85)
            assert_eq!((shapes.len(), *of_the_batch), (1, 1), "{name}: {warning}");
            assert_eq!(shapes[0][1], INPUTS, "{name}: {warning}");
            let said = warning.to_string();
            assert!(said.contains(&format!("{:?}", shapes[0])), "{said}");
            assert!(said.contains("the step's input, a target or a mask") && !said.contains("FrozenLinear"), "{said}");
            // (the largest reading: of a trial at least as large as the answer)
            let per_sample = INPUTS as u64 * 4;
            assert!(bytes % per_sample == 0 && *bytes >= plan.largest_batch() as u64 * per_sample, "{name}:\n{plan}");
        }
        assert_eq!(weights(), before, "{name}: probing changed a weight");
        println!(
            "  {name}: largest batch {} with 12 MiB of room, {:.0} bytes per sample",
            plan.largest_batch(),
            plan.memory_model().map_or(0.0, |m| m.bytes_per_sample)
        );
        largest.push(plan.largest_batch());
    }
    assert!(largest[1..].iter().all(|&b| b >= largest[0]), "a leaner state never fits less: {largest:?}");
}

/// A probe still alive after tuning holds no optimizer state: training beside
/// it (no `drop(probe)` first) has the memory the plan measured. Its moments
/// come back if it steps again.
fn a_probe_kept_after_tuning_holds_no_optimizer_state() {
    let task = Task::new();
    let varmap = VarMap::new();
    let model = Mlp::new(&varmap);
    let loss = |b: autobatch::MicroBatch| {
        let (x, y) = task.batch(b.len, 0);
        model.loss(&x, &y)
    };
    let parameters: u64 = varmap.all_vars().iter().map(|v| v.elem_count() as u64).sum();
    let moments = 8 * parameters; // AdamW: two f32 moments a parameter
    let mut meter = HeapMeter::with_room(12 << 20).unwrap();
    for name in ["adamw", "lion", "adamw8bit"] {
        let before = meter.in_use().unwrap();
        let mut probe = with_optimizer(ModelProbe::new(&varmap, loss), name);
        let plan = Tuner::new().max_batch(64).search(&mut probe, &mut meter).run().unwrap();
        let held = meter.in_use().unwrap().saturating_sub(before);
        assert!(held < moments / 8, "{name}: the probe still holds {held} bytes after tuning\n{plan}");
        // stepping again builds its state again, and the answer is the same
        let again = Tuner::new().max_batch(64).search(&mut probe, &mut meter).run().unwrap();
        assert_eq!(again.largest_batch(), plan.largest_batch(), "{name}");
    }
    // training beside the live probe stays under the plan's limit
    let mut probe =
        ModelProbe::new(&varmap, loss).optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default()).unwrap();
    let plan = Tuner::new().max_batch(64).target_effective_batch(128).search(&mut probe, &mut meter).run().unwrap();
    let optimizer = AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    let mut training = autobatch::TrainLoop::new(&plan, &varmap, optimizer).unwrap();
    meter.reset_peak().unwrap();
    training.step(&mut meter, loss).unwrap();
    let peak = meter.peak().unwrap();
    assert!(peak <= plan.limit_bytes(), "training peaked at {peak} over the limit of\n{plan}");
    println!("  training beside the live probe: peak {peak} under {}", plan.limit_bytes());
    drop(probe);
}

/// Mixed precision: bf16 variables, f32 masters and AdamW state. The loss
/// falls as with f32 AdamW, the state is 12 bytes per parameter on top of the
/// 2 + 2 of bf16 weights and gradients, and the probe changes nothing.
fn mixed_precision_learns_and_holds_the_zero_papers_16_bytes() {
    use autobatch::optim::MixedPrecision;
    let task = Task::new();
    let train_mixed = || {
        let varmap = VarMap::new();
        let model = Mlp::with_dtype(&varmap, DType::BF16);
        let mut optimizer =
            MixedPrecision::<AdamW>::new(varmap.all_vars(), ParamsAdamW { lr: 3e-3, ..Default::default() }).unwrap();
        let mut losses = Vec::new();
        let started = std::time::Instant::now();
        for step in 0..150 {
            let (x, y) = task.batch(64, step);
            let loss = model.loss(&x, &y).unwrap();
            losses.push(loss.to_scalar::<f32>().unwrap());
            optimizer.backward_step(&loss).unwrap();
        }
        let time = started.elapsed() / 150;
        (losses[..10].iter().sum::<f32>() / 10.0, losses[140..].iter().sum::<f32>() / 10.0, time)
    };
    let started = std::time::Instant::now();
    let f32_run = train(|vars| AdamW::new(vars, ParamsAdamW { lr: 3e-3, ..Default::default() }).unwrap());
    let f32_time = started.elapsed() / 150;
    let (first, last, bf16_time) = train_mixed();
    println!("  f32 adamw: {:.4} -> {:.4} ({f32_time:.1?} a step)", f32_run.0, f32_run.1);
    println!("  mixed (bf16 + f32 masters): {first:.4} -> {last:.4} ({bf16_time:.1?} a step)");
    assert!(last < first / 2.0 && last <= 1.5 * f32_run.1 + 0.05, "{first} -> {last} against {f32_run:?}");

    // state, read off the heap: masters and moments in f32, 12 bytes per parameter
    let varmap = VarMap::new();
    let model = Mlp::with_dtype(&varmap, DType::BF16);
    let parameters: u64 = varmap.all_vars().iter().map(|v| v.elem_count() as u64).sum();
    let before = TrackingAllocator::live_bytes();
    let mixed = MixedPrecision::<AdamW>::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    let heap = TrackingAllocator::live_bytes() - before;
    assert_eq!(mixed.state_bytes(), 12 * parameters);
    // per-variable bookkeeping (Vec slots, Arc headers) on top of the tensors
    let overhead = 1024 * varmap.all_vars().len() as u64;
    assert!(heap >= 12 * parameters && heap <= 12 * parameters + overhead, "{heap} for {parameters} parameters");
    let weights: u64 = varmap.all_vars().iter().map(|v| (v.elem_count() * v.dtype().size_in_bytes()) as u64).sum();
    assert_eq!(weights, 2 * parameters);
    println!(
        "  per parameter: 2 (bf16 weights) + 2 (bf16 gradients) + {} (masters and moments)",
        mixed.state_bytes() / parameters
    );
    drop(mixed);

    // probing with it changes nothing; the profile says mixed precision
    // bf16 → f32 is exact: equal f32 bits are equal bf16 bits
    let bits = |map: &VarMap| -> Vec<Vec<u32>> {
        map.all_vars()
            .iter()
            .map(|v| {
                let values =
                    v.as_tensor().flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
                values.into_iter().map(f32::to_bits).collect()
            })
            .collect()
    };
    let before = bits(&varmap);
    let loss = |b: autobatch::MicroBatch| {
        let (x, y) = task.batch(b.len, 0);
        model.loss(&x, &y)
    };
    let mut probe = ModelProbe::new(&varmap, loss).optimizer::<MixedPrecision<AdamW>>(ParamsAdamW::default()).unwrap();
    let plan =
        Tuner::new().max_batch(8192).search(&mut probe, &mut HeapMeter::with_room(12 << 20).unwrap()).run().unwrap();
    assert_eq!(autobatch::Workload::profile(&probe).unwrap().precision, autobatch::estimate::Precision::Mixed);
    drop(probe);
    assert_eq!(before, bits(&varmap), "probing changed a weight");
    let per_sample = plan.memory_model().map_or(0.0, |m| m.bytes_per_sample);
    println!(
        "  bf16 MLP: largest batch {} with 12 MiB of room, {per_sample:.0} bytes per sample",
        plan.largest_batch()
    );

    // and the plan's ceiling holds when training in mixed precision through TrainLoop
    let mut meter = HeapMeter::with_room(12 << 20).unwrap();
    let plan = {
        let mut probe = ModelProbe::new(&varmap, loss)
            .dry(MixedPrecision::<AdamW>::new(varmap.all_vars(), ParamsAdamW::default()).unwrap());
        Tuner::new().target_effective_batch(2 * plan.largest_batch()).search(&mut probe, &mut meter).run().unwrap()
    };
    assert!(plan.accumulation_peak_bytes().is_some(), "{plan}");
    let optimizer = MixedPrecision::<AdamW>::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    let mut training = autobatch::TrainLoop::new(&plan, &varmap, optimizer).unwrap();
    for step in 0..2 {
        meter.reset_peak().unwrap();
        training
            .step(&mut meter, |micro| {
                let (x, y) = task.batch(micro.len, 100 + step * 10 + micro.offset);
                model.loss(&x, &y)
            })
            .unwrap();
        let peak = meter.peak().unwrap();
        assert!(peak <= plan.limit_bytes(), "step {step} peaked at {peak}:\n{plan}");
    }
}

/// Mixed precision's gradients against f32's on the same weights: bf16 keeps
/// 8 bits of mantissa (a relative rounding of 2^-9 per value), and the
/// backward pass of a 3-layer MLP compounds a few dozen such roundings, so
/// each variable's gradient must agree to within 5% in relative L2 norm (the
/// measured figure is printed).
fn mixed_precision_gradients_match_f32_within_tolerance() {
    let task = Task::new();
    let f32_map = VarMap::new();
    let f32_model = Mlp::with_dtype(&f32_map, DType::F32);
    let bf16_map = VarMap::new();
    let bf16_model = Mlp::with_dtype(&bf16_map, DType::BF16);
    // the same weights: f32's, rounded to bf16 (and back, so both start equal)
    for (name, var) in f32_map.data().lock().unwrap().iter() {
        let rounded = var.as_tensor().to_dtype(DType::BF16).unwrap();
        bf16_map.data().lock().unwrap()[name].set(&rounded).unwrap();
        var.set(&rounded.to_dtype(DType::F32).unwrap()).unwrap();
    }
    let (x, y) = task.batch(64, 3);
    let f32_grads = f32_model.loss(&x, &y).unwrap().backward().unwrap();
    let bf16_grads = bf16_model.loss(&x, &y).unwrap().backward().unwrap();
    let mut worst = 0f64;
    for (name, var) in f32_map.data().lock().unwrap().iter() {
        let exact = f32_grads.get(var).unwrap();
        let mixed = bf16_grads.get(&bf16_map.data().lock().unwrap()[name]).unwrap().to_dtype(DType::F32).unwrap();
        let norm =
            |t: &Tensor| f64::from(t.sqr().unwrap().sum_all().unwrap().sqrt().unwrap().to_scalar::<f32>().unwrap());
        let error = norm(&(&mixed - exact).unwrap()) / norm(exact).max(f64::MIN_POSITIVE);
        assert!(error < 0.05, "{name}: relative error {error}");
        worst = worst.max(error);
    }
    println!("  largest relative L2 error of a bf16 gradient: {worst:.4}");
}

/// Peak heap bytes above the baseline, per parameter, of one optimizer step
/// (real, or dry) on a 1024×1024 matrix, with the gradient straight from
/// `backward` (it carries its graph, as a training loop's does), after a
/// first real step so that every moment is in its steady state.
fn step_temporaries_per_parameter<O: Optimizer>(
    make: impl FnOnce(Vec<Var>) -> O,
    step: impl Fn(&mut O, &candle_core::backprop::GradStore),
) -> f64 {
    const N: usize = 1024;
    let values: Vec<f32> = (0..N * N).map(|i| ((i * 7919 % 2003) as f32 / 1000.0) - 1.0).collect();
    let var = Var::from_tensor(&Tensor::from_vec(values, (N, N), &Device::Cpu).unwrap()).unwrap();
    let x = Tensor::ones((8, N), DType::F32, &Device::Cpu).unwrap();
    let grads = || x.matmul(var.as_tensor()).unwrap().sqr().unwrap().mean_all().unwrap().backward().unwrap();
    let mut optimizer = make(vec![var.clone()]);
    let first = grads();
    step(&mut optimizer, &first);
    drop(first);
    let grads = grads();
    let before = TrackingAllocator::live_bytes();
    TrackingAllocator::reset_peak();
    step(&mut optimizer, &grads);
    let peak = TrackingAllocator::peak_bytes();
    (peak - before) as f64 / (N * N) as f64
}

/// Every lean optimizer's step holds no more temporaries per parameter than
/// `candle_nn::AdamW`'s, and its dry step exactly what its real step holds.
fn each_step_holds_no_more_than_candle_adamws() {
    let candle = step_temporaries_per_parameter(
        |vars| candle_nn::AdamW::new(vars, ParamsAdamW::default()).unwrap(),
        |o, g| o.step(g).unwrap(),
    );
    println!("  candle_nn::AdamW: {candle:.1} bytes per parameter");
    fn both<O: Optimizer + DryStep + 'static>(name: &str, make: impl Fn(Vec<Var>) -> O) -> (f64, f64) {
        let real = step_temporaries_per_parameter(&make, |o: &mut O, g| o.step(g).unwrap());
        let dry = step_temporaries_per_parameter(&make, |o: &mut O, g| o.dry_step(g).unwrap());
        println!("  {name}: real {real:.1}, dry {dry:.1} bytes per parameter");
        (real, dry)
    }
    let results = [
        ("adamw", both("adamw", |v| AdamW::new(v, ParamsAdamW::default()).unwrap())),
        ("lion", both("lion", |v| Lion::new(v, ParamsLion::default()).unwrap())),
        ("adafactor", both("adafactor", |v| Adafactor::new(v, ParamsAdafactor::default()).unwrap())),
        ("adamw8bit", both("adamw8bit", |v| AdamW8bit::new(v, candle_nn::ParamsAdamW::default()).unwrap())),
    ];
    for (name, (real, dry)) in results {
        assert!(real <= candle + 0.01, "{name}: {real} bytes per parameter against candle_nn::AdamW's {candle}");
        assert!((real - dry).abs() < 0.01, "{name}: the dry step holds {dry}, the real one {real}");
    }
}

/// A weight-heavy decoder (1.6M parameters, 16 tokens a sample): embedding,
/// two linear layers and a head over the vocabulary.
struct Decoder {
    embed: candle_nn::Embedding,
    up: Linear,
    down: Linear,
    head: Linear,
}

const VOCAB: usize = 2048;
const TOKENS: usize = 16;

impl Decoder {
    fn new(varmap: &VarMap) -> Decoder {
        let vb = VarBuilder::from_varmap(varmap, DType::F32, &Device::Cpu);
        Decoder {
            embed: candle_nn::embedding(VOCAB, 256, vb.pp("embed")).unwrap(),
            up: linear(256, 512, vb.pp("up")).unwrap(),
            down: linear(512, 256, vb.pp("down")).unwrap(),
            head: linear(256, VOCAB, vb.pp("head")).unwrap(),
        }
    }

    fn loss(&self, batch: usize) -> Result<Tensor> {
        let ids: Vec<u32> = (0..batch * TOKENS).map(|i| (i * 7919 % VOCAB) as u32).collect();
        let tokens = Tensor::from_vec(ids, (batch, TOKENS), &Device::Cpu)?;
        let h = self.embed.forward(&tokens)?;
        let h = self.down.forward(&self.up.forward(&h)?.relu()?)?;
        let logits = self.head.forward(&h)?.reshape((batch * TOKENS, VOCAB))?;
        loss::cross_entropy(&logits, &tokens.flatten_all()?)
    }
}

/// A loop that trains with `candle_nn::AdamW` by its own idiom
/// (`optimizer.backward_step(&loss)`: the graph held through the update, so
/// the update's temporaries add to the activations at every batch), probed
/// as it runs (through a host copy), hears in its plan what this crate's
/// AdamW (the same numbers, a slice at a time) saves at the answer,
/// measured; done as it says (probed with `.adamw`, trained with
/// `optim::AdamW`), the step at that batch peaks that much lower and the
/// largest batch grows. (A loop that frees the loss first, as `TrainLoop`
/// does, peaks in its update only at small batches: there the saving is in
/// the plateau, and at an answer on the line it is none, and not said.)
fn candle_nns_adamw_is_told_what_switching_saves() {
    let varmap = VarMap::new();
    let model = Decoder::new(&varmap);
    let mut meter = HeapMeter::with_room(56 << 20).unwrap();
    let loss = |batch: autobatch::MicroBatch| model.loss(batch.len);
    let mut candle = ModelProbe::new(&varmap, loss)
        .optimizer::<candle_nn::AdamW>(ParamsAdamW::default())
        .unwrap()
        .graph_through_update(true);
    let plan = Tuner::new().search(&mut candle, &mut meter).run().unwrap();
    drop(candle);
    let said = plan.warnings().iter().find_map(|w| match w {
        Warning::LeanerUpdate { batch, saves_bytes, .. } => Some((*batch, *saves_bytes)),
        _ => None,
    });
    let (batch, saves) = said.unwrap_or_else(|| panic!("no saving said:\n{plan}"));
    assert_eq!(batch, plan.largest_batch());
    assert!(plan.to_string().contains("autobatch::optim::AdamW"), "{plan}");
    let mut lean = ModelProbe::new(&varmap, loss)
        .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
        .unwrap()
        .graph_through_update(true);
    autobatch::Workload::step(&mut lean, batch).unwrap(); // warm, as the switched step ran
    meter.reset_peak().unwrap();
    autobatch::Workload::step(&mut lean, batch).unwrap();
    let lean_peak = meter.peak().unwrap();
    let measured = plan.peak_bytes().saturating_sub(lean_peak);
    let gap = measured.abs_diff(saves) as f64 / saves as f64;
    assert!(gap <= 0.01, "said {saves} saved, the lean step at batch {batch} saves {measured}");
    let lean_plan = Tuner::new().search(&mut lean, &mut meter).run().unwrap();
    assert!(lean_plan.largest_batch() > plan.largest_batch(), "{lean_plan}\n{plan}");
    assert!(!lean_plan.warnings().iter().any(|w| matches!(w, Warning::LeanerUpdate { .. })), "{lean_plan}");
    println!(
        "  candle_nn::AdamW: largest batch {}; switching saves {saves} bytes there; optim::AdamW: largest batch {}",
        plan.largest_batch(),
        lean_plan.largest_batch()
    );
}

/// On a weight-heavy model the optimizers' largest batches order as their
/// state sizes say: AdamW8bit and Adafactor above AdamW, Lion at least
/// AdamW's. Each answer checked by brute force: the probe's step at the
/// answer fits, at one more it does not; and a real training step with the
/// optimizer at the answer stays under the ceiling, in both idioms: the
/// default probe for a loop that frees the loss before the update (as
/// `TrainLoop` does), `graph_through_update(true)` for candle-nn's
/// `optimizer.backward_step(&loss)`, which holds it.
fn a_weight_heavy_models_largest_batch_orders_by_state_size() {
    let varmap = VarMap::new();
    let model = Decoder::new(&varmap);
    let parameters: usize = varmap.all_vars().iter().map(|v| v.elem_count()).sum();
    // one device for every optimizer: 56 MiB under the ceiling beside the model
    let budget = HeapMeter::with_room(56 << 20).unwrap().budget_bytes();
    let limit = (0.9 * budget as f64).floor() as u64;
    let loss = |batch: autobatch::MicroBatch| model.loss(batch.len);
    fn peak(meter: &mut HeapMeter, mut step: impl FnMut() -> Result<()>) -> u64 {
        meter.reset_peak().unwrap();
        step().unwrap();
        meter.peak().unwrap()
    }
    /// The real step at `batch`, the optimizer's state held as training
    /// holds it, the loss freed before the update or held through it.
    fn train_peak<O: Optimizer>(
        meter: &mut HeapMeter,
        mut optimizer: O,
        loss: impl Fn() -> Result<Tensor>,
        held: bool,
    ) -> u64 {
        optimizer.backward_step(&loss().unwrap()).unwrap(); // warm state: the moments exist and are nonzero
        if held {
            return peak(meter, || optimizer.backward_step(&loss()?));
        }
        peak(meter, || {
            let grads = loss()?.backward()?; // the loss and its graph dropped here
            optimizer.step(&grads)
        })
    }
    let mut largest = Vec::new();
    for name in ["adamw", "lion", "adafactor", "adamw8bit"] {
        let mut answers = Vec::new();
        for held in [false, true] {
            let mut meter = HeapMeter::new(budget).unwrap();
            let mut probe = with_optimizer(ModelProbe::new(&varmap, loss), name).graph_through_update(held);
            let plan = Tuner::new().search(&mut probe, &mut meter).run().unwrap();
            let b = plan.largest_batch();
            assert!(plan.proven_largest(), "{name}:\n{plan}");
            let at = peak(&mut meter, || autobatch::Workload::step(&mut probe, b));
            let above = peak(&mut meter, || autobatch::Workload::step(&mut probe, b + 1));
            assert!(
                at <= limit && above > limit,
                "{name}: batch {b} peaks at {at}, {} at {above}, limit {limit}",
                b + 1
            );
            drop(probe);
            // (the weights train on: their values do not change the memory)
            let vars = varmap.all_vars();
            let trained = match name {
                // the probe measured this crate's AdamW, which training runs
                "adamw" => train_peak(
                    &mut meter,
                    AdamW::new(vars, ParamsAdamW::default()).unwrap(),
                    || loss(autobatch::MicroBatch::of(b)),
                    held,
                ),
                "lion" => train_peak(
                    &mut meter,
                    Lion::new(vars, ParamsLion::default()).unwrap(),
                    || loss(autobatch::MicroBatch::of(b)),
                    held,
                ),
                "adafactor" => train_peak(
                    &mut meter,
                    Adafactor::new(vars, ParamsAdafactor::default()).unwrap(),
                    || loss(autobatch::MicroBatch::of(b)),
                    held,
                ),
                _ => train_peak(
                    &mut meter,
                    AdamW8bit::new(vars, candle_nn::ParamsAdamW::default()).unwrap(),
                    || loss(autobatch::MicroBatch::of(b)),
                    held,
                ),
            };
            assert!(
                trained <= limit,
                "{name} (graph held: {held}): training at batch {b} peaked at {trained}, over the limit {limit}"
            );
            println!(
                "  {name}, graph held through the update: {held}: largest batch {b} ({parameters} parameters, 56 MiB of room); \
                 probe peak {at}, training peak {trained}"
            );
            answers.push(b);
        }
        assert!(answers[0] >= answers[1], "{name}: freeing the graph before the update fits less: {answers:?}");
        largest.push(answers[0]);
    }
    let [adamw, lion, adafactor, adamw8bit] = largest[..] else { unreachable!() };
    assert!(adamw8bit > adamw && adafactor > adamw && lion >= adamw, "{largest:?}");
}

/// The tests of this file, in the order they run.
pub fn tests() -> Vec<(&'static str, fn())> {
    vec![
        ("each_step_holds_no_more_than_candle_adamws", each_step_holds_no_more_than_candle_adamws),
        ("candle_nns_adamw_is_told_what_switching_saves", candle_nns_adamw_is_told_what_switching_saves),
        (
            "a_weight_heavy_models_largest_batch_orders_by_state_size",
            a_weight_heavy_models_largest_batch_orders_by_state_size,
        ),
        ("each_learns_the_task_about_as_well_as_adamw", each_learns_the_task_about_as_well_as_adamw),
        ("each_holds_the_state_its_docs_say", each_holds_the_state_its_docs_say),
        ("a_dry_step_changes_nothing", a_dry_step_changes_nothing),
        ("model_probe_tunes_with_each_and_changes_nothing", model_probe_tunes_with_each_and_changes_nothing),
        ("a_probe_kept_after_tuning_holds_no_optimizer_state", a_probe_kept_after_tuning_holds_no_optimizer_state),
        (
            "mixed_precision_learns_and_holds_the_zero_papers_16_bytes",
            mixed_precision_learns_and_holds_the_zero_papers_16_bytes,
        ),
        ("mixed_precision_gradients_match_f32_within_tolerance", mixed_precision_gradients_match_f32_within_tolerance),
    ]
}
