//! What the workspace's tests and benches share, and only they (never
//! published): the sequential harness of the files that measure the heap,
//! simulated workloads, the checks of lines people read, the docs pages
//! benches write their figures into, the GPU check's verdict, and the
//! layering check each package runs over its own modules.

pub mod accumulating;
pub mod advice;
pub mod docs;
pub mod gpu_verdict;
pub mod harness;
pub mod layering;
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

/// The workspace's root (where `docs/` and `Cargo.lock` are), from this
/// package's place under `crates/`.
pub fn workspace_root() -> &'static std::path::Path {
    let testkit = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    testkit.parent().and_then(std::path::Path::parent).expect("crates/testkit is two folders under the root")
}
