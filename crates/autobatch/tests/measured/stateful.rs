//! A model with state, written as a candle user writes it: a CNN with
//! candle-nn's BatchNorm in training mode (2-d after the convolution, 1-d after
//! the first linear layer) and a layer of the user's own that keeps a running
//! mean of its input in a `Var`. Tuning it through every path of `ModelProbe`
//! changes no bit of any variable (the running statistics included), gives no
//! false missing-gradient warning, finds the exact answer, and the plan trains
//! under the ceiling; an evaluation model built once from `detached` sees the
//! statistics training moves.
//!
//! Heap measurements: its own sequential harness (see autobatch_testkit::harness).

use crate::common::bits;

use autobatch::ModelVariant;
use autobatch::model::{detached, detached_sharing};
use autobatch::optim::{Adafactor, ParamsAdafactor, ParamsLion};
use autobatch::{HeapMeter, MemoryMeter, ModelProbe, TrainLoop, Tuner, Workload, plan::Warning};
use candle_core::{DType, Device, Module, ModuleT, Result, Tensor, Var};
use candle_nn::{
    BatchNorm, BatchNormConfig, Conv2d, Conv2dConfig, Linear, Optimizer, ParamsAdamW, VarBuilder, VarMap, batch_norm,
    conv2d, linear, loss,
};

const MIB: u64 = 1 << 20;
/// Room for the step under the default ceiling, above what the process holds
/// (the model, the threads' matmul buffers: those differ by host).
const ROOM: u64 = 40 * MIB;
const CLASSES: usize = 10;
const SIDE: usize = 16;

/// A layer of the user's own with state: the running mean of its input
/// features, kept in a `Var` of the `VarMap` and written in training mode.
struct RunningMean {
    mean: Var,
}

impl RunningMean {
    fn new(features: usize, vb: VarBuilder) -> Result<RunningMean> {
        let mean = vb.get_with_hints(features, "mean", candle_nn::Init::Const(0.))?;
        Ok(RunningMean { mean: Var::from_tensor(&mean)? })
    }

    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        if train {
            let batch_mean = x.detach().mean(0)?;
            let next = ((self.mean.as_tensor().detach() * 0.9)? + (batch_mean * 0.1)?)?;
            self.mean.set(&next)?;
        }
        x.broadcast_sub(&self.mean.as_detached_tensor())
    }
}

struct Cnn {
    conv: Conv2d,
    norm2d: BatchNorm,
    fc: Linear,
    norm1d: BatchNorm,
    centre: RunningMean,
    head: Linear,
}

impl Cnn {
    fn new(vb: VarBuilder) -> Result<Cnn> {
        let conv_config = Conv2dConfig { padding: 1, ..Default::default() };
        Ok(Cnn {
            conv: conv2d(3, 8, 3, conv_config, vb.pp("conv"))?,
            norm2d: batch_norm(8, BatchNormConfig::default(), vb.pp("bn2d"))?,
            fc: linear(8 * 4 * 4, 32, vb.pp("fc"))?,
            norm1d: batch_norm(32, BatchNormConfig::default(), vb.pp("bn1d"))?,
            centre: RunningMean::new(32, vb.pp("centre"))?,
            head: linear(32, CLASSES, vb.pp("head"))?,
        })
    }

    fn logits(&self, images: &Tensor, train: bool) -> Result<Tensor> {
        // pooled to a 4 × 4 grid whatever the image side
        let side = images.dim(3)?;
        let h = self.norm2d.forward_t(&self.conv.forward(images)?, train)?.relu()?.max_pool2d(side / 4)?;
        let h = self.fc.forward(&h.flatten_from(1)?)?;
        let h = self.centre.forward_t(&self.norm1d.forward_t(&h, train)?.relu()?, train)?;
        self.head.forward(&h)
    }

    /// The training loss of `batch` images of `side` pixels (samples from `seed`).
    fn loss(&self, batch: usize, side: usize, seed: usize) -> Result<Tensor> {
        let (images, labels) = data(batch, side, seed)?;
        loss::cross_entropy(&self.logits(&images, true)?, &labels)
    }
}

/// Deterministic images and labels (candle's CPU generator cannot be seeded).
fn data(batch: usize, side: usize, seed: usize) -> Result<(Tensor, Tensor)> {
    let values: Vec<f32> = (0..batch * 3 * side * side)
        .map(|i| (((seed * 104_729 + i) * 2_654_435_761 % 4096) as f32 / 2048.0) - 1.0)
        .collect();
    let images = Tensor::from_vec(values, (batch, 3, side, side), &Device::Cpu)?;
    let labels: Vec<u32> = (0..batch).map(|i| ((seed + i) % CLASSES) as u32).collect();
    Ok((images, Tensor::from_vec(labels, batch, &Device::Cpu)?))
}

/// The names of the variables whose bits differ.
fn changed(before: &[(String, Vec<u32>)], after: &[(String, Vec<u32>)]) -> Vec<String> {
    before.iter().zip(after).filter(|(a, b)| a.1 != b.1).map(|(a, _)| a.0.clone()).collect()
}

fn model() -> (VarMap, Cnn) {
    let varmap = VarMap::new();
    let cnn = Cnn::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu)).unwrap();
    (varmap, cnn)
}

const STATE: [&str; 5] =
    ["bn1d.running_mean", "bn1d.running_var", "bn2d.running_mean", "bn2d.running_var", "centre.mean"];

fn no_missing_gradients(name: &str, warnings: &[Warning]) {
    assert!(
        !warnings.iter().any(|w| matches!(w, Warning::MissingGradients { .. })),
        "{name}: a buffer named as a missing gradient: {warnings:?}"
    );
}

/// The forward pass writes the running statistics: without putting them back,
/// one forward pass would change them.
fn the_forward_pass_writes_the_state() {
    let (varmap, model) = model();
    let before = bits(&varmap);
    drop(model.loss(4, SIDE, 0).unwrap());
    let after = bits(&varmap);
    let changed: Vec<&str> = before.iter().zip(&after).filter(|(a, b)| a.1 != b.1).map(|(a, _)| a.0.as_str()).collect();
    assert_eq!(changed, STATE);
}

/// Tuned through each optimizer path, every variable (the state included) is
/// bit-identical afterwards, the state is found as buffers and not named as
/// missing gradients, and the answer is exact: the probe's step fits at it and
/// not at one more.
fn every_probe_path_changes_no_bit() {
    let (varmap, model) = model();
    let before = bits(&varmap);
    let loss = |batch: autobatch::MicroBatch| model.loss(batch.len, SIDE, 0);
    for name in ["adamw", "sgd", "lion", "adafactor (dry)", "candle_nn::AdamW (general)", "none"] {
        let probe = ModelProbe::new(&varmap, loss);
        let mut probe = match name {
            "adamw" => probe.optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default()).unwrap(),
            "sgd" => probe.optimizer::<autobatch::optim::Sgd>(0.1).unwrap(),
            "lion" => probe.optimizer::<autobatch::optim::Lion>(ParamsLion::default()).unwrap(),
            "adafactor (dry)" => probe.dry(Adafactor::new(varmap.all_vars(), ParamsAdafactor::default()).unwrap()),
            "candle_nn::AdamW (general)" => probe.optimizer::<candle_nn::AdamW>(ParamsAdamW::default()).unwrap(),
            _ => probe,
        };
        let mut meter = HeapMeter::with_room(ROOM).unwrap();
        let plan = Tuner::new().search(&mut probe, &mut meter).run().unwrap();
        assert_eq!(changed(&before, &bits(&varmap)), [] as [String; 0], "{name}: tuning changed a variable");
        no_missing_gradients(name, plan.warnings());
        assert_eq!(probe.buffers().unwrap(), STATE, "{name}");
        assert_eq!(probe.variables_without_gradient().unwrap(), [] as [&str; 0], "{name}");
        let b = plan.largest_batch();
        let limit = plan.limit_bytes();
        let mut peak = |probe: &mut ModelProbe<_>, batch| {
            meter.reset_peak().unwrap();
            probe.step(batch).unwrap();
            meter.peak().unwrap()
        };
        let (at, above) = (peak(&mut probe, b), peak(&mut probe, b + 1));
        assert!(at <= limit && above > limit, "{name}: batch {b} peaks at {at}, {} at {above}, limit {limit}", b + 1);
        assert_eq!(changed(&before, &bits(&varmap)), [] as [String; 0], "{name}: a step changed a variable");
        println!("  {name}: largest batch {b} with 40 MiB of room, no variable changed");
    }
}

/// The other ways in: a probe that runs its own backward pass, one by image
/// size tuned at several sizes, an accumulating plan, the evaluation search
/// and `compare`: no bit changes.
fn every_other_path_changes_no_bit() {
    let (varmap, model) = model();
    let before = bits(&varmap);
    let mut meter = HeapMeter::with_room(ROOM).unwrap();

    let mut own_backward = ModelProbe::new(&varmap, |batch| {
        let loss = model.loss(batch.len, SIDE, 0)?;
        let grads = loss.backward()?;
        Ok((loss, grads))
    })
    .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
    .unwrap();
    let plan = Tuner::new().target_effective_batch(1000).search(&mut own_backward, &mut meter).run().unwrap();
    assert!(plan.accumulation_steps() > 1 && plan.accumulation_peak_bytes().is_some(), "{plan}");
    no_missing_gradients("with_backward", plan.warnings());
    drop(own_backward);
    assert_eq!(
        changed(&before, &bits(&varmap)),
        [] as [String; 0],
        "with_backward (accumulating): tuning changed a variable"
    );

    let mut by_size = ModelProbe::by_size(&varmap, SIDE, |batch, side| model.loss(batch.len, side, 0))
        .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
        .unwrap();
    let sizes = Tuner::new().search(&mut by_size, &mut meter).sizes(&[8, SIDE]).unwrap();
    for plan in sizes.sizes.values() {
        no_missing_gradients("by_size", plan.warnings());
    }
    drop(by_size);
    assert_eq!(changed(&before, &bits(&varmap)), [] as [String; 0], "by_size: tuning changed a variable");

    let evaluation_model = Cnn::new(detached(&varmap)).unwrap();
    let mut evaluation = |batch: usize| -> Result<()> {
        let (images, _) = data(batch, SIDE, 0)?;
        evaluation_model.logits(&images, false).map(drop)
    };
    let mut probe = ModelProbe::new(&varmap, |batch| model.loss(batch.len, SIDE, 0))
        .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
        .unwrap();
    let plan = Tuner::new().search(&mut probe, &mut meter).evaluating(&mut evaluation).run().unwrap();
    assert!(plan.evaluation().unwrap().largest_batch > plan.largest_batch(), "{plan}");
    drop(probe);
    assert_eq!(changed(&before, &bits(&varmap)), [] as [String; 0], "evaluation: tuning changed a variable");

    let mut variants = vec![
        ModelVariant::lazy("adamw", || {
            ModelProbe::new(&varmap, |b| model.loss(b.len, SIDE, 0))
                .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
        }),
        ModelVariant::lazy("lion", || {
            ModelProbe::new(&varmap, |b| model.loss(b.len, SIDE, 0))
                .optimizer::<autobatch::optim::Lion>(ParamsLion::default())
        }),
    ];
    let comparison = Tuner::new().search(&mut variants, &mut meter).compare().unwrap();
    assert!(comparison.rows.iter().all(|row| row.plan.is_some()));
    assert_eq!(changed(&before, &bits(&varmap)), [] as [String; 0], "compare: tuning changed a variable");
}

/// The largest image side at a fixed batch (`Search::longest` over
/// `ModelProbe::by_size`) on a model with BatchNorm: no bit changes, the
/// answer's step fits and one granule more does not, and a real training step
/// at the answer (backward, then candle-nn's AdamW) stays under the ceiling.
fn the_largest_image_side_at_a_batch_is_exact_and_changes_no_bit() {
    use autobatch::{Resizable, plan::SizeRange};
    use candle_nn::Optimizer;
    let (varmap, model) = model();
    let before = bits(&varmap);
    let mut meter = HeapMeter::with_room(ROOM).unwrap();
    let batch = 64;
    let mut probe = ModelProbe::by_size(&varmap, SIDE, |batch, side| model.loss(batch.len, side, 0))
        .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
        .unwrap();
    // the pooling takes sides that are multiples of 4
    let longest =
        Tuner::new().search(&mut probe, &mut meter).longest(batch, SizeRange::up_to(128).multiple_of(4)).unwrap();
    let (side, limit) = (longest.largest_size, longest.limit_bytes());
    assert!(longest.proven_longest && side < 128, "{}", longest.summary("image side"));
    no_missing_gradients("longest", &longest.warnings);
    assert_eq!(changed(&before, &bits(&varmap)), [] as [String; 0], "longest: tuning changed a variable");
    let peak = |probe: &mut ModelProbe<_>, meter: &mut HeapMeter, side: usize| {
        probe.resize(side).unwrap();
        meter.reset_peak().unwrap();
        probe.step(batch).unwrap();
        meter.peak().unwrap()
    };
    let (at, above) = (peak(&mut probe, &mut meter, side), peak(&mut probe, &mut meter, side + 4));
    assert!(at <= limit && above > limit, "side {side} peaks at {at}, {} at {above}, limit {limit}", side + 4);
    drop(probe);
    let mut optimizer = autobatch::optim::AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    optimizer.step(&model.loss(batch, side, 1).unwrap().backward().unwrap()).unwrap(); // the moments exist
    meter.reset_peak().unwrap();
    let grads = model.loss(batch, side, 2).unwrap().backward().unwrap();
    optimizer.step(&grads).unwrap();
    drop(grads);
    let trained = meter.peak().unwrap();
    assert!(trained <= limit, "training at batch {batch}, side {side} peaked at {trained} > {limit}");
    println!("  largest side at batch {batch}: {side} (probe peak {at}, training peak {trained}, limit {limit})");
}

/// The plan trains under the ceiling with `TrainLoop` and candle-nn's AdamW,
/// with accumulation; an evaluation model built once from `detached` before
/// training sees the statistics training moved (its outputs equal the
/// training model's in evaluation mode, bit for bit), and so does one built
/// with `detached_sharing` for the user's own buffer.
fn training_stays_under_the_ceiling_and_evaluation_sees_its_statistics() {
    let (varmap, model) = model();
    let evaluation_model = Cnn::new(detached(&varmap)).unwrap();
    let mut meter = HeapMeter::with_room(ROOM).unwrap();
    let plan = {
        let mut probe = ModelProbe::new(&varmap, |batch| model.loss(batch.len, SIDE, 0))
            .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
            .unwrap();
        let first = Tuner::new().search(&mut probe, &mut meter).run().unwrap();
        Tuner::new().target_effective_batch(2 * first.largest_batch() + 1).search(&mut probe, &mut meter).run().unwrap()
    };
    let before = bits(&varmap);
    let optimizer = autobatch::optim::AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    let mut training = TrainLoop::new(&plan, &varmap, optimizer).unwrap();
    for step in 0..3 {
        meter.reset_peak().unwrap();
        training.step(&mut meter, |micro| model.loss(micro.len, SIDE, 100 + 7 * step + micro.offset)).unwrap();
        let peak = meter.peak().unwrap();
        assert!(peak <= plan.limit_bytes(), "step {step} peaked at {peak}:\n{plan}");
    }
    let after = bits(&varmap);
    for name in STATE {
        let moved = |all: &[(String, Vec<u32>)]| all.iter().find(|(n, _)| n == name).unwrap().1.clone();
        assert_ne!(moved(&before), moved(&after), "training moves {name}");
    }
    let (images, _) = data(6, SIDE, 999).unwrap();
    let trained = model.logits(&images, false).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let evaluated = evaluation_model.logits(&images, false).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let bits_of = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    // the user's own buffer is not BatchNorm's: `detached` hands it out detached,
    // and RunningMean copies it; `detached_sharing` shares it too
    let sharing = Cnn::new(detached_sharing(&varmap, |name| STATE.contains(&name))).unwrap();
    let shared = sharing.logits(&images, false).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(bits_of(&trained), bits_of(&shared), "an evaluation model sharing every buffer");
    let built_late = Cnn::new(detached(&varmap)).unwrap();
    let late = built_late.logits(&images, false).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(bits_of(&trained), bits_of(&late));
    // built before training: BatchNorm's statistics are shared, the user's own copied at build time
    let model_stale_centre = {
        let centre = model.centre.mean.as_tensor().copy().unwrap();
        model.centre.mean.set(&Tensor::zeros(32, DType::F32, &Device::Cpu).unwrap()).unwrap();
        let logits = model.logits(&images, false).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        model.centre.mean.set(&centre).unwrap();
        logits
    };
    assert_eq!(bits_of(&evaluated), bits_of(&model_stale_centre), "BatchNorm's statistics are the trained ones");
}

/// A workload error displayed with `RUST_BACKTRACE=1` leaves nothing on the
/// heap: formatting candle's backtrace would load the binary's debug info for
/// good (30 MiB measured), and every later heap baseline would count it. (Runs
/// first: the backtrace setting is read once per process.)
fn a_displayed_error_leaves_the_heap_as_it_was() {
    // SAFETY (edition 2021: safe): set before any thread reads the environment for a backtrace
    // TODO: Audit that the environment access only happens in single-threaded code.
    unsafe { std::env::set_var("RUST_BACKTRACE", "1") };
    let (varmap, model) = model();
    let wrong = |batch: autobatch::MicroBatch| -> Result<Tensor> {
        let (images, labels) = data(batch.len, SIDE, 0)?;
        // a shape mismatch: the labels of one sample more than the images
        let labels = Tensor::cat(&[&labels, &labels.narrow(0, 0, 1)?], 0)?;
        loss::cross_entropy(&model.logits(&images, true)?, &labels)
    };
    let mut probe =
        ModelProbe::new(&varmap, wrong).optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default()).unwrap();
    let err = Tuner::new().search(&mut probe, &mut HeapMeter::with_room(ROOM).unwrap()).run().unwrap_err();
    assert!(err.workload_error().is_some(), "{err}");
    let before = autobatch::TrackingAllocator::live_bytes();
    let text = err.to_string();
    drop(text);
    let after = autobatch::TrackingAllocator::live_bytes();
    assert!(after < before + (256 << 10), "displaying the error kept {} bytes", after.saturating_sub(before));
    assert!(!err.to_string().contains("stack backtrace") && !err.to_string().contains("backtrace:"), "{err}");
}

/// Fine-tuning with BatchNorm in evaluation mode (as candle-transformers'
/// EfficientNet runs it): the running statistics are read without a graph,
/// so they get no gradient, and are no cut graph: taken for buffers by their
/// names; the user's own frozen mean is named until declared, then the
/// answer is proven and exact and no bit changes.
fn buffers_read_in_evaluation_mode_are_no_cut_graph() {
    let (varmap, model) = model();
    let before = bits(&varmap);
    let loss = |batch: autobatch::MicroBatch| -> Result<Tensor> {
        let (images, labels) = data(batch.len, SIDE, 0)?;
        loss::cross_entropy(&model.logits(&images, false)?, &labels)
    };
    let mut probe =
        ModelProbe::new(&varmap, loss).optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default()).unwrap();
    // refused by default, naming the variable and how to declare a buffer
    let err = Tuner::new().search(&mut probe, &mut HeapMeter::with_room(ROOM).unwrap()).run().unwrap_err();
    assert!(matches!(&err, autobatch::Error::PartialGraph { variables, .. } if variables == &["centre.mean"]), "{err}");
    assert!(err.to_string().contains("buffers_named"), "{err}");
    let plan = Tuner::new()
        .allow_partial_graph(true)
        .search(&mut probe, &mut HeapMeter::with_room(ROOM).unwrap())
        .run()
        .unwrap();
    let mut buffers: Vec<&str> = probe.read_only_buffers().iter().map(String::as_str).collect();
    buffers.sort();
    assert_eq!(buffers, ["bn1d.running_mean", "bn1d.running_var", "bn2d.running_mean", "bn2d.running_var"]);
    let missing = plan.warnings().iter().find_map(|w| match w {
        Warning::MissingGradients { variables, .. } => Some(variables.clone()),
        _ => None,
    });
    assert_eq!(missing, Some(vec!["centre.mean".to_owned()]), "{plan}");
    assert!(plan.to_string().contains("buffers_named"), "the warning says which rule decided:\n{plan}");
    drop(probe);

    let mut probe = ModelProbe::new(&varmap, loss)
        .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
        .unwrap()
        .buffers_named(|name| name.starts_with("centre."));
    let mut meter = HeapMeter::with_room(ROOM).unwrap();
    // candle's CPU convolution runs its tiles as rayon tasks whose buffers
    // overlap or not from one step to the next: the same step's peak takes
    // one of two values 2.3 MB apart (seen here: 42.79 or 45.12 MB at batch
    // 249). Each trial is the largest of four steps, as training meets them.
    const STEPS: usize = 4;
    let plan = Tuner::new().steps_per_trial(STEPS).search(&mut probe, &mut meter).run().unwrap();
    no_missing_gradients("declared", plan.warnings());
    assert!(plan.proven_largest(), "{plan}");
    let (b, limit) = (plan.largest_batch(), plan.limit_bytes());
    let mut peak = |batch| {
        meter.reset_peak().unwrap();
        for _ in 0..STEPS {
            probe.step(batch).unwrap();
        }
        meter.peak().unwrap()
    };
    let (at, above) = (peak(b), peak(b + 1));
    assert!(at <= limit && above > limit, "batch {b} peaks at {at}, {} at {above}, limit {limit}", b + 1);
    assert_eq!(changed(&before, &bits(&varmap)), [] as [String; 0]);
    println!("  evaluation-mode BatchNorm: largest batch {b}, 4 statistics taken for buffers by name, 1 declared");
}

/// The tests of this file, in the order they run.
pub fn tests() -> Vec<(&'static str, fn())> {
    vec![
        ("buffers_read_in_evaluation_mode_are_no_cut_graph", buffers_read_in_evaluation_mode_are_no_cut_graph),
        ("a_displayed_error_leaves_the_heap_as_it_was", a_displayed_error_leaves_the_heap_as_it_was),
        ("the_forward_pass_writes_the_state", the_forward_pass_writes_the_state),
        ("every_probe_path_changes_no_bit", every_probe_path_changes_no_bit),
        ("every_other_path_changes_no_bit", every_other_path_changes_no_bit),
        (
            "the_largest_image_side_at_a_batch_is_exact_and_changes_no_bit",
            the_largest_image_side_at_a_batch_is_exact_and_changes_no_bit,
        ),
        (
            "training_stays_under_the_ceiling_and_evaluation_sees_its_statistics",
            training_stays_under_the_ceiling_and_evaluation_sees_its_statistics,
        ),
    ]
}
