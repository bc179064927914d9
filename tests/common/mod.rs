//! Shared by the integration tests: the sequential harness of the files that
//! measure the heap, and a simulated workload that accumulates.

#![allow(dead_code)] // each test file uses some of it

pub mod accumulating;
pub mod harness;
pub mod token_curve;

/// Every variable of `varmap` (f32), by name, as bits: equal bits, equal model.
pub fn bits(varmap: &candle_nn::VarMap) -> Vec<(String, Vec<u32>)> {
    let data = varmap.data().lock().unwrap();
    let mut all: Vec<(String, Vec<u32>)> = data
        .iter()
        .map(|(name, var)| {
            let values = var.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            (name.clone(), values.into_iter().map(f32::to_bits).collect())
        })
        .collect();
    all.sort();
    all
}

/// Whether a line a person reads speaks in flags and plain words: no Rust
/// path (`Tuner::cache_key`), no snake_case field name (`world_size`), no
/// debug output (`Shape { layers: 3 }`). Environment variables
/// (`RAYON_NUM_THREADS`) are upper case and allowed.
pub fn names_no_internals(line: &str) -> bool {
    if line.contains("::") || line.contains(" { ") {
        return false;
    }
    !line
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .any(|word| word.contains('_') && word.chars().any(|c| c.is_lowercase()))
}
