//! docs/library.md's examples, run: each block of Rust the guide shows is
//! the text between a `// guide:` marker and `// end guide` here, line for
//! line (suite test `readme::the_guides_code_is_run` compares them; a
//! `#[global_allocator]` line, its static and `#[test]` stand for this
//! binary's own), with what it leaves to the reader (a model, a loader)
//! defined around it.

use autobatch::memory::simulated::{MemoryCurve, Simulation};
use autobatch::{CacheKey, Guard, HeapMeter, MemoryMeter, ModelProbe, TrainLoop, Tuner};
use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{Embedding, Linear, Optimizer, ParamsAdamW, VarBuilder, VarMap, embedding, linear, loss};

const TEXT: &[u8] = b"the quick brown fox jumps over the lazy dog. ";
const CONTEXT: usize = 8;
const VOCAB: usize = 128;

/// examples/your_model.rs's model: the next byte from the previous eight.
struct NextByte {
    embed: Embedding,
    hidden: Linear,
    out: Linear,
}

impl NextByte {
    fn new(vb: VarBuilder) -> Result<Self> {
        Ok(NextByte {
            embed: embedding(VOCAB, 32, vb.pp("embed"))?,
            hidden: linear(CONTEXT * 32, 256, vb.pp("hidden"))?,
            out: linear(256, VOCAB, vb.pp("out"))?,
        })
    }

    fn loss(&self, batch: usize, offset: usize) -> Result<Tensor> {
        let byte = |i: usize| u32::from(TEXT[i % TEXT.len()]);
        let context: Vec<u32> = (0..batch).flat_map(|s| (0..CONTEXT).map(move |j| byte(offset + s + j))).collect();
        let next: Vec<u32> = (0..batch).map(|s| byte(offset + s + CONTEXT)).collect();
        let x = self.embed.forward(&Tensor::from_vec(context, (batch, CONTEXT), &Device::Cpu)?)?.flatten_from(1)?;
        let logits = self.out.forward(&self.hidden.forward(&x)?.gelu()?)?;
        loss::cross_entropy(&logits, &Tensor::from_vec(next, batch, &Device::Cpu)?)
    }
}

/// "As a library": tuned at start-up, trained with the plan beside the probe.
fn as_a_library() -> std::result::Result<(), autobatch::Error> {
    let steps = 2;
    // guide: as a library
    let varmap = VarMap::new();
    let model = NextByte::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    let mut meter = HeapMeter::with_room(26 << 20)?; // or CudaMeter::new(0)? on a GPU

    // tune: forward, backward and AdamW's update, run for real and changing nothing
    let params = ParamsAdamW { lr: 1e-2, ..Default::default() };
    let mut probe = ModelProbe::new(&varmap, |batch| model.loss(batch.len, 0))
        .optimizer::<autobatch::optim::AdamW>(params.clone())?;
    let plan = Tuner::new().multiple_of(8).target_effective_batch(4096).search(&mut probe, &mut meter).run()?;
    // the probe freed its AdamW moments when the search ended: train beside it

    // train: the plan's micro-batches, guarded, only the variables' gradients accumulated
    let optimizer = autobatch::optim::AdamW::new(varmap.all_vars(), params)?;
    let mut training = TrainLoop::new(&plan, &varmap, optimizer)?;
    for step in 0..steps {
        let report = training.step(&mut meter, |micro| model.loss(micro.len, step * 4096 + micro.offset))?;
        println!("step {step}: loss {:?} over {} samples", report.loss, report.samples);
    }
    // end guide
    assert!(meter.peak()? <= plan.limit_bytes(), "a step beside the live probe went over\n{plan}");
    drop(probe);
    Ok(())
}

/// "Any closure is a workload too", on a simulated 80 GiB device.
fn any_closure() -> std::result::Result<(), autobatch::Error> {
    let (mut device, mut meter) = Simulation::new(80 << 30, MemoryCurve::affine(8 << 30, 64 << 20)).build();
    let mut my_train_step = |batch: usize| autobatch::Workload::step(&mut device, batch);
    // guide: any closure
    use autobatch::{Tuner, search::Strategy};

    // One training step at a given batch: forward, loss, backward, optimizer step.
    // It must leave weights and optimizer state as it found them.
    let mut step = |batch: usize| -> candle_core::Result<()> { my_train_step(batch) };

    let plan = Tuner::new()
        .ceiling(0.9) // at most 90% of device memory, device-wide
        .multiple_of(8) // tensor-core friendly batches
        .target_effective_batch(1024) // what the optimizer should see
        .world_size(4) // data-parallel ranks
        .strategy(Strategy::Predictive) // the default: fit, jump near the answer, verify
        .search(&mut step, &mut meter) // meter: how the device's memory is measured
        .run()?;

    println!("{plan}"); // trial table and the plan
    // plan.micro_batch() × plan.accumulation_steps() × plan.world_size() == plan.effective_batch()
    // plan.split() says it once: Split::Single, Split::Accumulated or Split::Uneven
    // end guide
    assert_eq!(plan.micro_batch() * plan.accumulation_steps() * plan.world_size(), plan.effective_batch());
    assert!(plan.effective_batch() >= 1024 && plan.micro_batch() % 8 == 0, "{plan}");
    Ok(())
}

/// A batch of the guide's training loop, and what it leaves to the reader.
struct Model;

impl Model {
    fn loss(&self, batch: &[f32], offset: usize, len: usize) -> Result<Tensor> {
        Tensor::new(&batch[offset..offset + len], &Device::Cpu)?.mean_all()
    }
}

/// "In a training loop": a cached plan agreed by every rank, guarded steps.
fn in_a_training_loop() -> std::result::Result<(), autobatch::Error> {
    let here = std::env::current_dir().map_err(autobatch::Error::meter)?;
    let scratch = std::env::temp_dir().join(format!("autobatch-guide-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(autobatch::Error::meter)?;
    std::env::set_current_dir(&scratch).map_err(autobatch::Error::meter)?; // the cache's relative path lands here
    let (mut step, mut meter) = Simulation::new(80 << 30, MemoryCurve::affine(8 << 30, 64 << 20)).build();
    let varmap = VarMap::new();
    varmap.get(4, "w", candle_nn::Init::Const(1.0), DType::F32, &Device::Cpu)?;
    let collective = autobatch::collective::ThreadCollective::group(1)?.remove(0);
    let (model, loader) = (Model, vec![vec![1f32; 1024]; 2]);
    let mut gradients = Vec::new();
    let mut accumulate = |grads: candle_core::backprop::GradStore| gradients.push(grads);
    let take_accumulated = candle_core::backprop::GradStore::default;
    let mut optimizer = candle_nn::SGD::new(varmap.all_vars(), 0.1)?;
    // guide: in a training loop
    let plan = Tuner::new()
        .target_effective_batch(1024)
        .cache("target/autobatch-plans.json") // later start-ups skip probing
        .cache_key(CacheKey::new().var_map(&varmap).param("seq_len", 2048))
        .search(&mut step, &mut meter)
        .across(&collective)
        .run()?; // every rank agrees on one batch

    let mut guard = Guard::new(&plan)?; // survives an OOM mid-training
    for batch in loader {
        guard.step(&mut meter, |micro| {
            let loss = (model.loss(&batch, micro.offset, micro.len)? * micro.loss_scale)?;
            accumulate(loss.backward()?); // only after backward succeeded
            Ok(())
        })?;
        optimizer.step(&take_accumulated())?;
    }
    // end guide
    assert!(scratch.join("target/autobatch-plans.json").exists(), "the plan was cached");
    std::env::set_current_dir(here).map_err(autobatch::Error::meter)?;
    std::fs::remove_dir_all(&scratch).map_err(autobatch::Error::meter)?;
    assert!(!gradients.is_empty());
    Ok(())
}

/// The model a headroom test checks: 64 KiB a sample, held through the step.
fn build_my_model() -> impl FnMut(usize) -> Result<()> {
    |batch: usize| {
        std::hint::black_box(vec![1u8; batch << 16]);
        Ok(())
    }
}

// guide: a headroom test
fn batch_32_keeps_30_percent_free() {
    let mut model = build_my_model(); // a Workload
    // 64 MiB beside what the process holds: the same room on any host (or CudaMeter::new(0) on a GPU runner)
    let mut meter = autobatch::HeapMeter::with_room(64 << 20).unwrap();
    let report = autobatch::Headroom::new(32).min_headroom(0.30).assert(&mut model, &mut meter);
    std::fs::write("headroom.json", report.to_json()).unwrap(); // keep as a CI artifact
}
// end guide

fn a_headroom_test() {
    let here = std::env::current_dir().unwrap();
    let scratch = std::env::temp_dir().join(format!("autobatch-guide-headroom-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    std::env::set_current_dir(&scratch).unwrap(); // the report lands here
    batch_32_keeps_30_percent_free();
    assert!(std::fs::read_to_string("headroom.json").unwrap().contains("headroom"));
    std::env::set_current_dir(here).unwrap();
    std::fs::remove_dir_all(&scratch).unwrap();
}

pub fn tests() -> Vec<(&'static str, fn())> {
    vec![
        ("the_guides_library_example_trains_under_its_plan", || as_a_library().unwrap()),
        ("the_guides_closure_example_plans_its_split", || any_closure().unwrap()),
        ("the_guides_training_loop_caches_and_guards", || in_a_training_loop().unwrap()),
        ("the_guides_headroom_test_passes", a_headroom_test),
    ]
}
