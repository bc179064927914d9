//! Real candle workloads measured on the CPU with the tracking allocator.
//!
//! The heap is process-wide, so this file has its own harness (`harness =
//! false` in Cargo.toml): `main` runs the tests one after another on one
//! thread. Under libtest, tests run on threads of their own, and another
//! test's thread starting, printing or exiting (which frees its thread-local
//! buffers, gemm's 2 MiB scratch among them) lands in the middle of a
//! measurement. `cargo test -p autobatch-models --test measured -- NAME` runs the tests whose name
//! contains NAME.
//!
//! Tolerance: once warm, the heap peak of the same step repeats to within 32
//! bytes (measured). Between the tuner's measurement and the brute-force one
//! below, the test itself holds a few small allocations (the plan is dropped
//! first, but libtest and the harness allocate), so the brute-force comparisons
//! allow `TOLERANCE` = 4 KiB, less than a tenth of the smallest per-sample
//! step of any size tested here.

use autobatch::estimate::OptimizerKind;
use autobatch::{
    Error, HeapMeter, MemoryMeter, Resizable, Setting, TrackingAllocator, Tuner, Value, Workload, plan::SizeRange,
};
use autobatch_models::reference::{ConvNetConfig, MlpConfig, TransformerConfig};
use autobatch_models::trainer::{Model, Trainer};
use candle_core::{DType, Device};

const MIB: u64 = 1 << 20;
const TOLERANCE: u64 = 4 << 10;

/// Heap peak of one probe step at `batch`, device-wide (all live bytes).
fn peak_of<W: Workload>(workload: &mut W, batch: usize) -> u64 {
    TrackingAllocator::reset_peak();
    workload.step(batch).unwrap();
    TrackingAllocator::peak_bytes()
}

/// Tunes with `room` bytes under the ceiling above what the process holds
/// (the model, the threads' matmul buffers: a budget from the baseline, the
/// same room on any host), then checks by brute force that the answer fits and
/// the next candidate does not. Returns the largest batch.
fn tune_and_verify<M: Model>(mut trainer: Trainer<M>, room: u64, ceiling: f64, multiple_of: usize) -> usize {
    let mut meter = HeapMeter::with_room(room).unwrap();
    let plan = Tuner::new().ceiling(ceiling).multiple_of(multiple_of).search(&mut trainer, &mut meter).run().unwrap();
    let (largest, limit) = (plan.largest_batch(), plan.limit_bytes());
    let report = plan.to_string();
    eprintln!("{report}");
    assert!(plan.proven_largest(), "{report}");
    assert!(plan.peak_bytes() <= limit, "{report}");
    drop(plan);

    let fits = peak_of(&mut trainer, largest);
    let next = peak_of(&mut trainer, largest + multiple_of);
    assert!(fits <= limit + TOLERANCE, "batch {largest} peaks at {fits} > limit {limit}\n{report}");
    assert!(next > limit - TOLERANCE, "batch {} peaks at {next} <= limit {limit}\n{report}", largest + multiple_of);
    largest
}

fn transformer(seq_len: usize, d_model: usize, layers: usize) -> TransformerConfig {
    TransformerConfig { vocab: 64, d_model, heads: 4, layers, seq_len, ..TransformerConfig::default() }
}

fn transformer_largest_batch_is_exact_at_two_sizes() {
    let small = tune_and_verify(transformer(16, 32, 1).build(&Device::Cpu).unwrap(), 32 * MIB, 0.9, 1);
    let large = tune_and_verify(transformer(32, 48, 2).build(&Device::Cpu).unwrap(), 80 * MIB, 0.9, 1);
    eprintln!("transformer: {small} and {large}");
    assert!((10..=1000).contains(&small) && (10..=1000).contains(&large), "{small}, {large}");
}

fn mlp_largest_batch_is_exact_at_two_sizes() {
    let narrow = MlpConfig { inputs: 256, width: 512, depth: 2, ..MlpConfig::default() };
    let wide = MlpConfig { inputs: 128, width: 768, depth: 3, ..MlpConfig::default() };
    let a = tune_and_verify(narrow.build(&Device::Cpu).unwrap(), 38 * MIB, 0.9, 1);
    let b = tune_and_verify(wide.build(&Device::Cpu).unwrap(), 70 * MIB, 0.8, 8);
    eprintln!("mlp: {a} and {b}");
    assert!((10..=1000).contains(&a) && (10..=1000).contains(&b), "{a}, {b}");
}

fn convnet_largest_batch_is_exact_at_two_sizes() {
    let small = ConvNetConfig { channels: 8, resolution: 16, ..ConvNetConfig::default() };
    let large = ConvNetConfig { channels: 16, resolution: 32, ..ConvNetConfig::default() };
    let a = tune_and_verify(small.build(&Device::Cpu).unwrap(), 24 * MIB, 0.9, 1);
    let b = tune_and_verify(large.build(&Device::Cpu).unwrap(), 52 * MIB, 0.9, 1);
    eprintln!("convnet: {a} and {b}");
    assert!((10..=1000).contains(&a) && (10..=1000).contains(&b), "{a}, {b}");
}

/// Tunes, then checks that every weight and both AdamW moments are bit-for-bit
/// what they were, that the optimizer took no step, and that the heap is back
/// to where it was before `run`.
fn assert_probing_changes_nothing<M: Model>(mut trainer: Trainer<M>, room: u64) {
    // a few real steps first, so the moments are not all zeros
    for _ in 0..3 {
        trainer.train_step(4).unwrap();
    }
    let state = trainer.state_bits().unwrap();
    let (steps, optimizer_steps) = (trainer.steps_done(), trainer.adamw_steps().unwrap().unwrap());
    // gemm's per-thread buffers are brought to size by the meter: nothing stays
    // for good after the first trial that was not there before it
    let mut meter = HeapMeter::with_room(room).unwrap();
    let before = meter.in_use().unwrap();
    let plan = Tuner::new().search(&mut trainer, &mut meter).run().unwrap();
    let largest = plan.largest_batch();
    drop(plan);
    let after = meter.in_use().unwrap();
    assert!(after.abs_diff(before) <= TOLERANCE, "heap in use {before} before tuning, {after} after");
    assert!(largest >= 2);
    assert_eq!(trainer.state_bits().unwrap(), state, "weights or AdamW moments changed");
    assert_eq!((trainer.steps_done(), trainer.adamw_steps().unwrap().unwrap()), (steps, optimizer_steps));
}

fn probing_the_transformer_changes_nothing() {
    assert_probing_changes_nothing(transformer(16, 32, 1).build(&Device::Cpu).unwrap(), 32 * MIB);
}

fn probing_the_mlp_changes_nothing() {
    let config = MlpConfig { inputs: 256, width: 512, depth: 2, ..MlpConfig::default() };
    assert_probing_changes_nothing(config.build(&Device::Cpu).unwrap(), 38 * MIB);
}

fn probing_the_convnet_changes_nothing() {
    let config = ConvNetConfig { channels: 8, resolution: 16, ..ConvNetConfig::default() };
    assert_probing_changes_nothing(config.build(&Device::Cpu).unwrap(), 24 * MIB);
}

fn training_after_probing_is_training_without_it() {
    let config = transformer(16, 32, 1);
    let mut probed = config.build(&Device::Cpu).unwrap();
    let mut untouched = config.build(&Device::Cpu).unwrap();
    let mut meter = HeapMeter::with_room(32 * MIB).unwrap();
    Tuner::new().search(&mut probed, &mut meter).run().unwrap();
    for _ in 0..3 {
        let (a, b) = (probed.train_step(8).unwrap(), untouched.train_step(8).unwrap());
        assert_eq!(a.to_bits(), b.to_bits());
    }
    assert_eq!(probed.state_bits().unwrap(), untouched.state_bits().unwrap());
}

fn the_dry_optimizer_step_costs_what_the_real_one_costs() {
    let mut trainer = transformer(16, 32, 1).build(&Device::Cpu).unwrap();
    trainer.train_step(16).unwrap();
    trainer.step(16).unwrap();
    let dry = peak_of(&mut trainer, 16);
    TrackingAllocator::reset_peak();
    trainer.train_step(16).unwrap();
    let real = TrackingAllocator::peak_bytes();
    // the real step also reads the loss back as a number: a few hundred bytes
    assert!(real.abs_diff(dry) <= TOLERANCE, "dry step peaks at {dry}, real step at {real}");
}

/// The plan holds where the reference model trains: an accumulating plan's
/// optimizer step, run by `train_step_accumulated` (a `TrainLoop` over the
/// shared optimizer), peaks under the ceiling and where the plan's
/// accumulating check measured; for a plain model and a checkpointed one
/// (whose loop scales gradients, not the loss).
fn an_accumulating_plan_holds_in_the_reference_models_training() {
    fn check<M: Model>(name: &str, mut trainer: Trainer<M>, room: u64, target: usize) {
        let mut meter = HeapMeter::with_room(room).unwrap();
        let plan = Tuner::new().target_effective_batch(target).search(&mut trainer, &mut meter).run().unwrap();
        assert!(plan.accumulation_steps() > 1, "{name}: the plan does not accumulate:\n{plan}");
        let checked = plan.accumulation_peak_bytes().unwrap_or_else(|| panic!("{name}: unchecked:\n{plan}"));
        let (micro, steps, limit) = (plan.micro_batch(), plan.accumulation_steps(), plan.limit_bytes());
        trainer.train_step_accumulated(micro, steps).unwrap();
        TrackingAllocator::reset_peak();
        trainer.train_step_accumulated(micro, steps).unwrap();
        let trained = TrackingAllocator::peak_bytes();
        println!("  {name}: {micro} x {steps}: training peaks at {trained}, the check at {checked}, limit {limit}");
        assert!(trained <= limit + TOLERANCE, "{name}: training peaks at {trained} > {limit}\n{plan}");
        assert!(trained.abs_diff(checked) <= checked / 50, "{name}: training {trained}, the plan's check {checked}");
    }
    let mlp = MlpConfig { inputs: 256, width: 512, depth: 2, ..MlpConfig::default() };
    check("mlp", mlp.build(&Device::Cpu).unwrap(), 20 * MIB, 1000);
    let checkpointed = TransformerConfig { checkpointing: true, ..transformer(32, 32, 2) };
    check("checkpointed transformer", checkpointed.build(&Device::Cpu).unwrap(), 22 * MIB, 250);
}

/// Bytes per sample of a probe step, from peaks at two batches.
fn bytes_per_sample<W: Workload>(workload: &mut W) -> f64 {
    workload.step(16).unwrap();
    let (small, large) = (peak_of(workload, 4), peak_of(workload, 12));
    (large - small) as f64 / 8.0
}

fn memory_per_sample_grows_with_sequence_length_faster_than_linearly() {
    let per_sample: Vec<f64> = [16, 32, 64]
        .into_iter()
        .map(|seq_len| bytes_per_sample(&mut transformer(seq_len, 32, 1).build(&Device::Cpu).unwrap()))
        .collect();
    eprintln!("bytes per sample at seq_len 16, 32, 64: {per_sample:?}");
    // linear terms double with the sequence; attention's s² term makes it more
    assert!(per_sample[1] > 2.0 * per_sample[0], "{per_sample:?}");
    assert!(per_sample[2] > 2.0 * per_sample[1], "{per_sample:?}");
}

fn memory_per_sample_grows_with_image_area() {
    let per_sample: Vec<f64> = [8, 16, 32]
        .into_iter()
        .map(|resolution| {
            let config = ConvNetConfig { channels: 8, resolution, ..ConvNetConfig::default() };
            bytes_per_sample(&mut config.build(&Device::Cpu).unwrap())
        })
        .collect();
    eprintln!("bytes per sample at 8², 16², 32²: {per_sample:?}");
    for pair in per_sample.windows(2) {
        let ratio = pair[1] / pair[0];
        assert!((3.0..=5.0).contains(&ratio), "doubling the resolution scaled memory per sample by {ratio}");
    }
}

fn bf16_halves_the_model_state_where_the_cpu_supports_it() {
    let f32_lm = transformer(16, 32, 1).build(&Device::Cpu).unwrap();
    let mut bf16_lm = TransformerConfig { dtype: DType::BF16, ..transformer(16, 32, 1) }.build(&Device::Cpu).unwrap();
    assert_eq!(bf16_lm.dtype(), DType::BF16);
    assert_eq!(bf16_lm.parameter_count(), f32_lm.parameter_count());
    assert_eq!(2 * bf16_lm.state().unwrap().total(), f32_lm.state().unwrap().total());
    let first = bf16_lm.train_step(8).unwrap();
    assert!(first.is_finite());

    let mut bf16_mlp = MlpConfig { dtype: DType::BF16, ..MlpConfig::default() }.build(&Device::Cpu).unwrap();
    bf16_mlp.step(8).unwrap();
    assert!(bf16_mlp.train_step(8).unwrap().is_finite());

    // candle's CPU conv2d has no bf16 matmul: a clear error, not a failed step later
    let err = ConvNetConfig { dtype: DType::BF16, ..ConvNetConfig::default() }.build(&Device::Cpu).unwrap_err();
    assert!(
        matches!(err, autobatch_models::Error::InvalidSetting { value: autobatch::Value::Dtype(DType::BF16), .. }),
        "{err}"
    );
}

fn invalid_model_settings_are_errors() {
    // what must come before training says so, and an optimizer without a dry step is named
    let mut trainer = MlpConfig::default().build(&Device::Cpu).unwrap();
    trainer.train_step(2).unwrap();
    let err = trainer.with_optimizer(OptimizerKind::Lion).unwrap_err();
    assert!(matches!(err.core(), Some(Error::AlreadyTrained { steps: 1, .. })), "{err}");
    assert!(err.to_string().contains("choose the optimizer before the first one"), "{err}");
    let fresh = MlpConfig::default().build(&Device::Cpu).unwrap();
    let err = fresh.with_optimizer(OptimizerKind::Momentum).unwrap_err();
    assert!(
        matches!(
            &err,
            autobatch_models::Error::InvalidSetting { value: autobatch::Value::Optimizer(OptimizerKind::Momentum), .. }
        ),
        "{err}"
    );
    assert!(err.is_configuration());
    let cases: Vec<(Result<(), autobatch_models::Error>, &str)> = vec![
        (TransformerConfig { heads: 3, ..TransformerConfig::default() }.check(), "heads is 3"),
        (TransformerConfig { seq_len: 0, ..TransformerConfig::default() }.check(), "seq_len is 0"),
        (TransformerConfig { dtype: DType::U8, ..TransformerConfig::default() }.check(), "dtype is u8"),
        (MlpConfig { depth: 0, ..MlpConfig::default() }.check(), "depth is 0"),
        (MlpConfig { classes: 1, ..MlpConfig::default() }.check(), "classes is 1"),
        (ConvNetConfig { resolution: 30, ..ConvNetConfig::default() }.check(), "resolution is 30"),
        (ConvNetConfig { classes: 4, ..ConvNetConfig::default() }.check(), "classes is 4"),
    ];
    for (result, message) in cases {
        let err = result.expect_err(message);
        assert!(err.to_string().contains(message), "want {message:?} in {err}");
    }
}

fn nothing_fits_comes_with_remedies_for_a_reference_model() {
    use autobatch::estimate::{Change, OptimizerKind, Precision};
    let mut mlp = MlpConfig { inputs: 128, width: 768, depth: 3, ..MlpConfig::default() }.build(&Device::Cpu).unwrap();
    let state = mlp.state().unwrap().total();
    // the weights and moments are held already: room for half the gradients
    let gradients = 4 * mlp.parameter_count() as u64;
    let budget = TrackingAllocator::live_bytes() + gradients / 2;
    let mut meter = HeapMeter::new(budget).unwrap();
    let err = Tuner::new().ceiling(1.0).search(&mut mlp, &mut meter).run().unwrap_err();
    let Error::NothingFits { remedies, .. } = &err else { panic!("{err}") };
    let changes: Vec<&Change> = remedies.iter().map(|r| &r.change).collect();
    assert!(changes.contains(&&Change::Precision { to: Precision::Bf16 }), "{err}");
    assert!(changes.contains(&&Change::Optimizer { to: OptimizerKind::Adafactor }), "{err}");
    let bf16 = remedies.iter().find(|r| r.change == Change::Precision { to: Precision::Bf16 }).unwrap();
    assert!(bf16.saves_bytes >= state / 2, "bf16 halves weights, gradients and moments: {bf16:?}");
}

fn the_evaluation_step_gets_its_own_larger_batch() {
    let mut model = transformer(16, 32, 1).build(&Device::Cpu).unwrap();
    let state = model.state_bits().unwrap();
    let mut evaluation = model.evaluation();
    let mut meter = HeapMeter::with_room(32 * MIB).unwrap();
    let plan = Tuner::new().search(&mut model, &mut meter).evaluating(&mut evaluation).run().unwrap();
    let eval = plan.evaluation().expect("evaluation planned");
    eprintln!("{plan}");
    // no gradients, no optimizer, no graph kept: much more fits
    assert!(eval.largest_batch > 2 * plan.largest_batch(), "{plan}");
    assert!(eval.proven_largest && eval.peak_bytes <= plan.limit_bytes());
    // the plan stays in hand, as a trainer holds it while it trains: the
    // searches measured beside it (on the CPU it is on the heap they measure)
    let (limit, plan_batch) = (plan.limit_bytes(), plan.largest_batch());
    // alone: the trainer freed its optimizer's state for that search
    assert!(peak_of(&mut evaluation, eval.largest_batch) <= limit + TOLERANCE);
    assert!(peak_of(&mut evaluation, eval.largest_batch + 1) > limit - TOLERANCE);
    // between training steps: the state built again (a probe step does), held beside evaluation
    let during = eval.during_training.clone().expect("the trainer frees its optimizer's state");
    assert!(during.state_bytes > 0 && during.proven_largest);
    assert!(during.largest_batch > 2 * plan_batch && during.largest_batch < eval.largest_batch, "{during:?}");
    model.step(1).unwrap();
    assert_eq!(model.optimizer_state_bytes(), during.state_bytes);
    assert!(peak_of(&mut evaluation, during.largest_batch) <= limit + TOLERANCE);
    assert!(peak_of(&mut evaluation, during.largest_batch + 1) > limit - TOLERANCE);
    assert_eq!(model.state_bits().unwrap(), state);
    drop(plan);
}

fn checkpointing_the_transformer_keeps_every_gradient_and_lowers_the_peak() {
    let config = TransformerConfig { vocab: 64, d_model: 32, heads: 4, layers: 3, seq_len: 48, ..Default::default() };
    let plain = config.build(&Device::Cpu).unwrap();
    let checkpointed = TransformerConfig { checkpointing: true, ..config.clone() }.build(&Device::Cpu).unwrap();
    let vars = |t: &Trainer<_>| t.vars().iter().map(|(_, v)| v.clone()).collect::<Vec<_>>();
    let (loss_a, grads_a) = plain.model().loss_and_gradients(6, 42, &vars(&plain)).unwrap();
    let (loss_b, grads_b) = checkpointed.model().loss_and_gradients(6, 42, &vars(&checkpointed)).unwrap();
    assert_eq!(loss_a.to_scalar::<f32>().unwrap(), loss_b.to_scalar::<f32>().unwrap());
    for ((name, a), (_, b)) in plain.vars().iter().zip(checkpointed.vars()) {
        let (ga, gb) = (grads_a.get(a).unwrap(), grads_b.get(b).unwrap());
        let bits = |t: &candle_core::Tensor| {
            t.flatten_all().unwrap().to_vec1::<f32>().unwrap().into_iter().map(f32::to_bits).collect::<Vec<_>>()
        };
        assert_eq!(bits(ga), bits(gb), "{name}: the gradients differ");
    }
    drop((loss_a, grads_a, loss_b, grads_b));
    // bytes per sample with and without, at two sequence lengths
    for seq_len in [48, 96] {
        let per_sample = |checkpointing: bool| {
            let config = TransformerConfig { seq_len, checkpointing, ..config.clone() };
            let mut model = config.build(&Device::Cpu).unwrap();
            bytes_per_sample(&mut model)
        };
        let (without, with) = (per_sample(false), per_sample(true));
        println!("  seq_len {seq_len}: {without:.0} -> {with:.0} bytes per sample");
        assert!(with < 0.7 * without, "seq_len {seq_len}: {without} -> {with}");
    }
    // probing changes nothing, training learns
    let mut model = checkpointed;
    let state = model.state_bits().unwrap();
    let plan = Tuner::new().search(&mut model, &mut HeapMeter::with_room(12 * MIB).unwrap()).run().unwrap();
    assert!(plan.proven_largest(), "{plan}");
    assert_eq!(model.state_bits().unwrap(), state);
    let first = model.train_step_accumulated(8, 2).unwrap();
    for _ in 0..30 {
        model.train_step_accumulated(8, 2).unwrap();
    }
    assert!(model.train_step_accumulated(8, 2).unwrap() < first / 2.0);
}

fn the_transformer_trains_in_mixed_precision() {
    let config = TransformerConfig { dtype: DType::BF16, ..transformer(16, 32, 1) };
    let mut model = config.build(&Device::Cpu).unwrap().into_mixed_precision().unwrap();
    assert!(model.is_mixed_precision());
    assert_eq!(model.profile().unwrap().precision, autobatch::estimate::Precision::Mixed);
    // probing changes no weight, master or moment
    let state = model.state_bits().unwrap();
    let plan = Tuner::new().search(&mut model, &mut HeapMeter::with_room(12 * MIB).unwrap()).run().unwrap();
    assert!(plan.proven_largest(), "{plan}");
    assert_eq!(model.state_bits().unwrap(), state);
    // and the loss falls as training goes
    let first = model.train_step(8).unwrap();
    for _ in 0..30 {
        model.train_step(8).unwrap();
    }
    let last = model.train_step(8).unwrap();
    println!("  mixed precision transformer: loss {first:.3} -> {last:.3}");
    assert!(last < first / 2.0, "{first} -> {last}");
    // f32 models cannot: mixed precision keeps bf16 variables
    let f32_model = transformer(16, 32, 1).build(&Device::Cpu).unwrap();
    assert!(matches!(
        f32_model.into_mixed_precision(),
        Err(autobatch_models::Error::InvalidSetting { value: autobatch::Value::Dtype(DType::F32), .. })
    ));
}

fn the_transformer_trains_with_each_lean_optimizer() {
    use autobatch::estimate::OptimizerKind;
    for kind in [OptimizerKind::Lion, OptimizerKind::Adafactor, OptimizerKind::Adam8bit, OptimizerKind::Sgd] {
        let mut model = transformer(16, 32, 1).build(&Device::Cpu).unwrap().with_optimizer(kind).unwrap();
        assert!(model.adamw_steps().unwrap().is_none());
        assert_eq!(model.profile().unwrap().optimizer, kind);
        let state = model.state_bits().unwrap();
        Tuner::new().search(&mut model, &mut HeapMeter::with_room(12 * MIB).unwrap()).run().unwrap();
        assert_eq!(model.state_bits().unwrap(), state, "{kind:?}: probing changed a weight");
        let first = model.train_step(8).unwrap();
        for _ in 0..30 {
            model.train_step(8).unwrap();
        }
        let last = model.train_step(8).unwrap();
        let counted = model.state().unwrap();
        assert_eq!(counted, model.profile().unwrap().state().unwrap(), "{kind:?}: the state is counted once");
        println!(
            "  {}: loss {first:.3} -> {last:.3}, {} bytes of state ({} counted)",
            kind.name(),
            model.optimizer_state_bytes(),
            counted.optimizer_states
        );
        // the count is what the estimate and the footprint add: never more than the optimizer holds
        assert!(counted.optimizer_states <= model.optimizer_state_bytes(), "{kind:?}");
        assert!(last < first / 2.0, "{kind:?}: {first} -> {last}");
    }
    let momentum = transformer(16, 32, 1).build(&Device::Cpu).unwrap().with_optimizer(OptimizerKind::Momentum);
    assert!(momentum.is_err(), "momentum SGD has no dry step here");
}

fn heap_meter_measures_live_bytes_and_a_resettable_peak() {
    let mut meter = HeapMeter::new(64 * MIB).unwrap();
    assert_eq!(meter.capacity().unwrap(), 64 * MIB);
    let before = meter.in_use().unwrap();
    meter.reset_peak().unwrap();
    let buffer = vec![1u8; 3 * MIB as usize];
    std::hint::black_box(&buffer);
    let during = meter.in_use().unwrap();
    assert!(during >= before + 3 * MIB && during < before + 3 * MIB + TOLERANCE, "{before} then {during}");
    drop(buffer);
    let peak = meter.peak().unwrap();
    assert!(peak >= before + 3 * MIB && peak < before + 3 * MIB + TOLERANCE, "{before} then peak {peak}");
    meter.reset_peak().unwrap();
    assert!(meter.peak().unwrap() < before + TOLERANCE);
    assert!(matches!(
        HeapMeter::new(0),
        Err(Error::InvalidSetting { setting: autobatch::Setting::BudgetBytes, value: autobatch::Value::Count(0), .. })
    ));
}

/// The reference transformer tuned at three sequence lengths: each length's
/// batch fits and the next does not (brute force at that length), predicted
/// lengths in between fit and stay within their neighbours, and a resized
/// model trains at the length it was set to.
fn the_transformer_tuned_at_several_lengths_is_exact_at_each() {
    use autobatch::{Resizable, plan::BatchSource};
    let mut trainer = transformer(64, 32, 1).build(&Device::Cpu).unwrap();
    let mut meter = HeapMeter::with_room(38 * MIB).unwrap();
    let plan = Tuner::new().search(&mut trainer, &mut meter).sizes(&[16, 32, 64]).unwrap();
    let report = plan.to_string();
    eprintln!("{report}");
    assert_eq!(trainer.size(), 64, "put back at its length");
    let limit = plan.limit_bytes;
    let entries: Vec<(usize, usize)> = plan.sizes.iter().map(|(&size, plan)| (size, plan.largest_batch())).collect();
    let between: Vec<_> = [24, 48].into_iter().map(|len| plan.batch_for(len).unwrap()).collect();
    let model = plan.model.clone().unwrap();
    drop(plan);
    assert!(entries[0].1 > entries[1].1 && entries[1].1 > entries[2].1, "{report}");
    for (len, batch) in entries {
        trainer.resize(len).unwrap();
        let fits = peak_of(&mut trainer, batch);
        let next = peak_of(&mut trainer, batch + 1);
        assert!(fits <= limit + TOLERANCE, "length {len}: batch {batch} peaks at {fits} > {limit}\n{report}");
        assert!(next > limit - TOLERANCE, "length {len}: batch {} peaks at {next} <= {limit}\n{report}", batch + 1);
    }
    for predicted in between {
        assert_eq!(predicted.source, BatchSource::Predicted);
        trainer.resize(predicted.size).unwrap();
        let peak = peak_of(&mut trainer, predicted.batch);
        assert!(peak <= limit + TOLERANCE, "predicted {predicted:?} peaks at {peak} > {limit}\n{report}");
    }
    assert!(model.bytes_per_token_length > 0.0, "attention grows with length: {model:?}");
    assert!(model.max_error < 0.05, "{model:?}");
    trainer.resize(16).unwrap();
    let first = trainer.train_step(8).unwrap();
    for _ in 0..10 {
        trainer.train_step(8).unwrap();
    }
    assert!(trainer.train_step(8).unwrap() < first);
    assert!(matches!(
        trainer.resize(65),
        Err(Error::InvalidSetting { setting: Setting::Size, value: Value::Count(65), .. })
    ));
    assert!(matches!(trainer.resize(0), Err(Error::InvalidSetting { value: Value::Count(0), .. })));
}

/// The longest input at a fixed batch, by the tuner's size search, checked
/// by brute force: the answer's step fits, one granule longer does not; the
/// trainer is left at its size and trains as before.
fn longest_input_at_a_batch_is_exact<M: Model>(mut trainer: Trainer<M>, room: u64, batch: usize, range: SizeRange)
where
    Trainer<M>: Resizable,
{
    let original = trainer.size();
    let state = trainer.state_bits().unwrap();
    let mut meter = HeapMeter::with_room(room).unwrap();
    let longest = Tuner::new().search(&mut trainer, &mut meter).longest(batch, range).unwrap();
    let (size, limit, granule) = (longest.largest_size, longest.limit_bytes(), range.multiple_of);
    let report = longest.summary("size");
    eprint!("{report}");
    assert!(longest.proven_longest, "{report}");
    assert!(longest.peak_bytes <= limit, "{report}");
    assert_eq!(trainer.size(), original);
    assert_eq!(trainer.state_bits().unwrap(), state, "probing changed the model");
    drop(longest);

    trainer.resize(size).unwrap();
    let fits = peak_of(&mut trainer, batch);
    trainer.resize(size + granule).unwrap();
    let next = peak_of(&mut trainer, batch);
    assert!(fits <= limit + TOLERANCE, "size {size} peaks at {fits} > limit {limit}\n{report}");
    assert!(next > limit - TOLERANCE, "size {} peaks at {next} <= limit {limit}\n{report}", size + granule);
}

fn the_longest_sequence_length_at_a_batch_is_exact() {
    let trainer = transformer(1024, 32, 1).build(&Device::Cpu).unwrap();
    longest_input_at_a_batch_is_exact(trainer, 52 * MIB, 4, SizeRange::up_to(1024));
    let trainer = transformer(1024, 32, 2).build(&Device::Cpu).unwrap();
    longest_input_at_a_batch_is_exact(trainer, 80 * MIB, 2, SizeRange::up_to(1024).multiple_of(16));
}

fn the_largest_resolution_at_a_batch_is_exact() {
    let config = ConvNetConfig { channels: 8, resolution: 128, ..ConvNetConfig::default() };
    longest_input_at_a_batch_is_exact(
        config.build(&Device::Cpu).unwrap(),
        24 * MIB,
        4,
        SizeRange::up_to(128).multiple_of(4),
    );
}

/// The tests of this file, in the order they run.
pub fn tests() -> Vec<(&'static str, fn())> {
    vec![
        ("the_longest_sequence_length_at_a_batch_is_exact", the_longest_sequence_length_at_a_batch_is_exact),
        ("the_largest_resolution_at_a_batch_is_exact", the_largest_resolution_at_a_batch_is_exact),
        ("transformer_largest_batch_is_exact_at_two_sizes", transformer_largest_batch_is_exact_at_two_sizes),
        ("mlp_largest_batch_is_exact_at_two_sizes", mlp_largest_batch_is_exact_at_two_sizes),
        ("convnet_largest_batch_is_exact_at_two_sizes", convnet_largest_batch_is_exact_at_two_sizes),
        ("probing_the_transformer_changes_nothing", probing_the_transformer_changes_nothing),
        ("probing_the_mlp_changes_nothing", probing_the_mlp_changes_nothing),
        ("probing_the_convnet_changes_nothing", probing_the_convnet_changes_nothing),
        ("training_after_probing_is_training_without_it", training_after_probing_is_training_without_it),
        ("the_dry_optimizer_step_costs_what_the_real_one_costs", the_dry_optimizer_step_costs_what_the_real_one_costs),
        (
            "an_accumulating_plan_holds_in_the_reference_models_training",
            an_accumulating_plan_holds_in_the_reference_models_training,
        ),
        (
            "memory_per_sample_grows_with_sequence_length_faster_than_linearly",
            memory_per_sample_grows_with_sequence_length_faster_than_linearly,
        ),
        ("memory_per_sample_grows_with_image_area", memory_per_sample_grows_with_image_area),
        (
            "bf16_halves_the_model_state_where_the_cpu_supports_it",
            bf16_halves_the_model_state_where_the_cpu_supports_it,
        ),
        ("invalid_model_settings_are_errors", invalid_model_settings_are_errors),
        (
            "nothing_fits_comes_with_remedies_for_a_reference_model",
            nothing_fits_comes_with_remedies_for_a_reference_model,
        ),
        ("the_evaluation_step_gets_its_own_larger_batch", the_evaluation_step_gets_its_own_larger_batch),
        (
            "checkpointing_the_transformer_keeps_every_gradient_and_lowers_the_peak",
            checkpointing_the_transformer_keeps_every_gradient_and_lowers_the_peak,
        ),
        ("the_transformer_trains_in_mixed_precision", the_transformer_trains_in_mixed_precision),
        ("the_transformer_trains_with_each_lean_optimizer", the_transformer_trains_with_each_lean_optimizer),
        ("heap_meter_measures_live_bytes_and_a_resettable_peak", heap_meter_measures_live_bytes_and_a_resettable_peak),
        (
            "the_transformer_tuned_at_several_lengths_is_exact_at_each",
            the_transformer_tuned_at_several_lengths_is_exact_at_each,
        ),
    ]
}
