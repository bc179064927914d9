//! Tunes a simulated 80 GiB accelerator and prints the report: the search
//! logic end to end, with no model and no GPU.
//!
//! ```text
//! cargo run --release --example simulated_probe
//! ```

use autobatch::Tuner;
use autobatch::memory::simulated::{MemoryCurve, Simulation};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn main() -> Result<(), autobatch::Error> {
    // 14 GiB of weights, gradients and AdamW moments; 310 MiB of activations per
    // sample; a 2 MiB pool granule; 3 GiB held by another process; and a real
    // out-of-memory from batch 170 on, below the ceiling (fragmentation).
    let simulation = Simulation::new(80 * GIB, MemoryCurve::affine(14 * GIB, 310 * MIB))
        .rounding(2 * MIB)
        .other_process(3 * GIB)
        .oom_from(170);
    let (mut workload, mut meter) = simulation.build();
    let plan = Tuner::new()
        .ceiling(0.9)
        .multiple_of(8)
        .target_effective_batch(1024)
        .search(&mut workload, &mut meter)
        .run()?;
    println!("{plan}");
    Ok(())
}
