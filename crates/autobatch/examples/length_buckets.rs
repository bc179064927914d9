//! Variable-length training with a batch per length bucket.
//!
//! A small causal language model written with candle-nn takes sequences of 16
//! to 64 tokens, most of them short. Tuning at the longest length only would
//! train every batch at the longest length's batch; instead the model is tuned
//! at 16, 32, 48 and 64 tokens (`Search::sizes`), and each training step
//! draws its batch from one length bucket and trains at that bucket's verified
//! batch (`SizePlan::bucket_for`, `TrainLoop::switch_plan`), one optimizer
//! throughout. Every step's peak stays under the ceiling.
//!
//! ```text
//! cargo run --release --example length_buckets
//! ```

// The CPU meter counts the heap through this allocator; on a GPU use CudaMeter.
#[global_allocator]
static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();

use autobatch::{Bytes, HeapMeter, MemoryMeter, ModelProbe, TrainLoop, Tuner};
use candle_core::{D, DType, Device, Module, Result, Tensor};
use candle_nn::{Embedding, Linear, Optimizer, ParamsAdamW, VarBuilder, VarMap, embedding, linear, loss, ops};

const TEXT: &[u8] = b"the quick brown fox jumps over the lazy dog. ";
const VOCAB: usize = 128;
const LONGEST: usize = 64;
const D_MODEL: usize = 64;

/// One causal self-attention layer and an MLP over learned positions.
struct TinyLm {
    embed: Embedding,
    positions: Tensor,
    qkv: Linear,
    mlp: (Linear, Linear),
    head: Linear,
}

impl TinyLm {
    fn new(vb: VarBuilder) -> Result<Self> {
        Ok(TinyLm {
            embed: embedding(VOCAB, D_MODEL, vb.pp("embed"))?,
            positions: vb.get_with_hints((LONGEST, D_MODEL), "positions", candle_nn::init::DEFAULT_KAIMING_NORMAL)?,
            qkv: linear(D_MODEL, 3 * D_MODEL, vb.pp("qkv"))?,
            mlp: (linear(D_MODEL, 4 * D_MODEL, vb.pp("fc1"))?, linear(4 * D_MODEL, D_MODEL, vb.pp("fc2"))?),
            head: linear(D_MODEL, VOCAB, vb.pp("head"))?,
        })
    }

    fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        let len = tokens.dim(1)?;
        let x = self.embed.forward(tokens)?.broadcast_add(&self.positions.narrow(0, 0, len)?)?;
        let qkv = self.qkv.forward(&x)?;
        let (q, k, v) =
            (qkv.narrow(2, 0, D_MODEL)?, qkv.narrow(2, D_MODEL, D_MODEL)?, qkv.narrow(2, 2 * D_MODEL, D_MODEL)?);
        let mask: Vec<f32> =
            (0..len).flat_map(|i| (0..len).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 })).collect();
        let mask = Tensor::from_vec(mask, (len, len), tokens.device())?;
        let scores =
            (q.contiguous()?.matmul(&k.t()?.contiguous()?)? / (D_MODEL as f64).sqrt())?.broadcast_add(&mask)?;
        let x = (x + ops::softmax(&scores, D::Minus1)?.matmul(&v.contiguous()?)?)?;
        let x = (&x + self.mlp.1.forward(&self.mlp.0.forward(&x)?.gelu()?)?)?;
        self.head.forward(&x)
    }

    /// The mean next-byte loss of `batch` windows of `len` bytes from window `offset`.
    fn loss(&self, batch: usize, len: usize, offset: usize) -> Result<Tensor> {
        let byte = |i: usize| u32::from(TEXT[i % TEXT.len()]);
        let window = |s: usize, shift: usize| (0..len).map(move |j| byte(offset + 3 * s + j + shift));
        let inputs: Vec<u32> = (0..batch).flat_map(|s| window(s, 0)).collect();
        let targets: Vec<u32> = (0..batch).flat_map(|s| window(s, 1)).collect();
        let logits = self.forward(&Tensor::from_vec(inputs, (batch, len), &Device::Cpu)?)?;
        loss::cross_entropy(
            &logits.reshape((batch * len, VOCAB))?,
            &Tensor::from_vec(targets, batch * len, &Device::Cpu)?,
        )
    }
}

/// A skewed length: most sequences short, a few long (a fixed cycle, for a
/// reproducible run).
fn length_of_step(step: usize) -> usize {
    [12, 20, 9, 30, 16, 44, 14, 25, 61, 18][step % 10]
}

fn main() -> std::result::Result<(), autobatch::Error> {
    let varmap = VarMap::new();
    let model = TinyLm::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    // device memory, played by the heap: 40 MiB for the steps under the 90% ceiling,
    // beside what the process holds (the model, the threads' matmul buffers)
    let mut meter = HeapMeter::with_room(40 << 20)?;

    // tune at four lengths: forward, backward and AdamW's update, changing nothing
    let params = ParamsAdamW { lr: 1e-2, ..Default::default() };
    let mut probe = ModelProbe::by_size(&varmap, LONGEST, |batch, len| model.loss(batch.len, len, 0))
        .optimizer::<autobatch::optim::AdamW>(params.clone())?;
    let plan = Tuner::new().search(&mut probe, &mut meter).sizes(&[16, 32, 48, LONGEST])?;
    // (the probe freed its AdamW moments when the search ended)
    println!("{plan}\n");
    for len in [24, 40, 56] {
        let predicted = plan.batch_for(len)?;
        println!("a bucket at {len} tokens would take batch {} ({})", predicted.batch, predicted.source);
    }
    println!();

    // train: each step's batch from one bucket, at that bucket's verified batch
    let optimizer = autobatch::optim::AdamW::new(varmap.all_vars(), params)?;
    let shortest = plan.sizes.values().next().expect("a plan has a size");
    let mut training = TrainLoop::new(shortest, &varmap, optimizer)?;
    for step in 1..=20 {
        let bucket = plan.bucket_for(length_of_step(step))?;
        let bucket_plan = plan.plan_for(bucket.size).expect("a bucket is a probed size");
        training.switch_plan(bucket_plan)?;
        meter.reset_peak()?;
        let report =
            training.step(&mut meter, |micro| model.loss(micro.len, bucket.size, step * 997 + micro.offset))?;
        let peak = meter.peak()?;
        assert!(peak <= plan.limit_bytes, "step {step} peaked at {} over the ceiling", Bytes(peak));
        if step % 4 == 0 || step == 1 {
            println!(
                "step {step:>3}  bucket {:>2} tokens × batch {:>3}  loss {:.4}  peak {}",
                bucket.size,
                report.samples,
                report.loss.unwrap_or(f64::NAN),
                Bytes(peak)
            );
        }
    }
    Ok(())
}
