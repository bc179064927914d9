//! Tune at trainer start-up, then train with the plan.
//!
//! Builds the reference transformer, finds the largest micro-batch that fits
//! under a CPU memory budget, splits a target effective batch of 256 into
//! micro-batches × accumulation steps, and trains on a synthetic next-token task
//! whose loss falls from ln(vocab) towards zero.
//!
//! ```text
//! cargo run --release --example trainer_startup
//! ```

// The heap meter counts what this allocator sees.
#[global_allocator]
static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();

use std::time::Instant;

use autobatch::{Bytes, HeapMeter, Tuner};
use autobatch_models::reference::TransformerConfig;
use candle_core::Device;

/// Memory for the steps under the ceiling, beside what the process holds (the
/// model, the threads' matmul buffers): the heap plays device memory.
const ROOM: u64 = 32 << 20;
const TARGET_EFFECTIVE_BATCH: usize = 256;
const OPTIMIZER_STEPS: usize = 100;

fn main() -> Result<(), autobatch::Error> {
    let config = TransformerConfig { vocab: 64, d_model: 32, heads: 4, layers: 1, seq_len: 16, ..Default::default() };
    let mut model = config.build(&Device::Cpu)?;
    println!(
        "model: {} parameters, {:?}; {} of memory for the steps",
        model.parameter_count(),
        model.dtype(),
        Bytes(ROOM)
    );

    // Tune at start-up: the probe runs real steps and changes no weight.
    let started = Instant::now();
    let mut meter = HeapMeter::with_room(ROOM)?;
    let plan = Tuner::new()
        .ceiling(0.9)
        .target_effective_batch(TARGET_EFFECTIVE_BATCH)
        .search(&mut model, &mut meter)
        .run()?;
    println!("{plan}\n(tuned in {:.2?})\n", started.elapsed());

    let started = Instant::now();
    for step in 1..=OPTIMIZER_STEPS {
        let loss = model.train_step_planned(&plan)?;
        if step == 1 || step % 20 == 0 {
            println!("step {step:>4}  loss {loss:.4}");
        }
    }
    println!(
        "{OPTIMIZER_STEPS} optimizer steps of {} samples ({}) in {:.1?}",
        plan.effective_batch(),
        plan.accumulation().map_or_else(|| plan.micro_batch().to_string(), |split| split.micro_steps_summary()),
        started.elapsed()
    );
    Ok(())
}
