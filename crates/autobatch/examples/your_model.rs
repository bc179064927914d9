//! Your own candle model, tuned with `ModelProbe` and trained with `TrainLoop`.
//!
//! The model is written as a candle user writes it (candle-nn layers in a
//! `VarMap`, `candle_nn::AdamW`), nothing from `autobatch_models::reference`: a small
//! character-level language model that learns to continue a repeating text.
//! The glue is the fifteen lines of `main` between "tune" and "train".
//!
//! ```text
//! cargo run --release --example your_model
//! ```

// The CPU meter counts the heap through this allocator; on a GPU use CudaMeter.
#[global_allocator]
static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();

use autobatch::{Bytes, HeapMeter, MemoryMeter, ModelProbe, TrainLoop, Tuner};
use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{Embedding, Linear, Optimizer, ParamsAdamW, VarBuilder, VarMap, embedding, linear, loss};

const TEXT: &[u8] = b"the quick brown fox jumps over the lazy dog. ";
const CONTEXT: usize = 8;
const VOCAB: usize = 128;

/// Predicts the next byte from the previous eight.
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

    fn forward(&self, context: &Tensor) -> Result<Tensor> {
        let x = self.embed.forward(context)?.flatten_from(1)?;
        self.out.forward(&self.hidden.forward(&x)?.gelu()?)
    }

    /// The mean loss of `batch` windows of the text starting at window `offset`.
    fn loss(&self, batch: usize, offset: usize) -> Result<Tensor> {
        let byte = |i: usize| u32::from(TEXT[i % TEXT.len()]);
        let context: Vec<u32> = (0..batch).flat_map(|s| (0..CONTEXT).map(move |j| byte(offset + s + j))).collect();
        let next: Vec<u32> = (0..batch).map(|s| byte(offset + s + CONTEXT)).collect();
        let device = Device::Cpu;
        let logits = self.forward(&Tensor::from_vec(context, (batch, CONTEXT), &device)?)?;
        loss::cross_entropy(&logits, &Tensor::from_vec(next, batch, &device)?)
    }
}

fn main() -> std::result::Result<(), autobatch::Error> {
    let varmap = VarMap::new();
    let model = NextByte::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    // device memory, played by the heap: 26 MiB for the steps under the 90% ceiling,
    // beside what the process holds (the model, the threads' matmul buffers)
    let mut meter = HeapMeter::with_room(26 << 20)?;

    // tune: forward, backward and AdamW's update, run for real and changing nothing
    let params = ParamsAdamW { lr: 1e-2, ..Default::default() };
    let mut probe = ModelProbe::new(&varmap, |batch| model.loss(batch.len, 0))
        .optimizer::<autobatch::optim::AdamW>(params.clone())?;
    let plan = Tuner::new().multiple_of(8).target_effective_batch(4096).search(&mut probe, &mut meter).run()?;
    // (the probe freed its AdamW moments when the search ended)
    println!("{plan}\n");

    // train: the plan's micro-batches, guarded, gradients accumulated
    let optimizer = autobatch::optim::AdamW::new(varmap.all_vars(), params)?;
    let mut training = TrainLoop::new(&plan, &varmap, optimizer)?;
    for step in 1..=30 {
        meter.reset_peak()?;
        let report = training.step(&mut meter, |micro| model.loss(micro.len, step * 4096 + micro.offset))?;
        if step % 5 == 0 || step == 1 {
            let peak = Bytes(meter.peak()?);
            println!("step {step:>3}  loss {:.4}  peak {peak}", report.loss.unwrap_or(f64::NAN));
        }
    }
    Ok(())
}
