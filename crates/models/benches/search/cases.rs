//! The reference models the benchmarks probe for real, three sizes each,
//! with the CPU budgets they are probed under.

use autobatch_models::reference::{ConvNetConfig, MlpConfig, TransformerConfig};
use autobatch_models::trainer::ReferenceWorkload;

pub const CEILING: f64 = 0.9;
pub const MIB: u64 = 1 << 20;

/// A real case: a reference model (built when its turn comes, so that only
/// one model is in the heap at a time) under a CPU budget.
pub type RealCase = (String, Box<dyn Fn() -> Box<dyn ReferenceWorkload>>, u64);

pub fn real_cases() -> Vec<RealCase> {
    let transformer = |seq_len, d_model, layers| TransformerConfig {
        vocab: 64,
        d_model,
        heads: 4,
        layers,
        seq_len,
        ..Default::default()
    };
    let mlp = |inputs, width, depth| MlpConfig { inputs, width, depth, ..Default::default() };
    let convnet = |channels, resolution| ConvNetConfig { channels, resolution, ..Default::default() };
    let mut cases: Vec<RealCase> = Vec::new();
    for (config, budget) in
        [(transformer(16, 32, 1), 40 * MIB), (transformer(32, 48, 2), 96 * MIB), (transformer(64, 64, 2), 160 * MIB)]
    {
        let name = format!("transformer s={} d={} L={}", config.seq_len, config.d_model, config.layers);
        cases.push((name, Box::new(move || Box::new(config.build(&candle_core::Device::Cpu).unwrap())), budget));
    }
    for (config, budget) in [(mlp(256, 512, 2), 48 * MIB), (mlp(128, 768, 3), 96 * MIB), (mlp(512, 1024, 4), 192 * MIB)]
    {
        let name = format!("mlp in={} w={} d={}", config.inputs, config.width, config.depth);
        cases.push((name, Box::new(move || Box::new(config.build(&candle_core::Device::Cpu).unwrap())), budget));
    }
    for (config, budget) in [(convnet(8, 16), 32 * MIB), (convnet(16, 32), 64 * MIB), (convnet(16, 48), 128 * MIB)] {
        let name = format!("convnet c={} r={}", config.channels, config.resolution);
        cases.push((name, Box::new(move || Box::new(config.build(&candle_core::Device::Cpu).unwrap())), budget));
    }
    cases
}
