//! The models' modules depend one way (the testkit's check over this
//! package's own `src/`): the ops and the config below the layers, the
//! decoder's network on the layers, the families above it, everything that
//! asks a family what it computes above them.

use crate::common::layering::{Crate, depend_one_way, reaches};

/// The models crate's modules, lowest first: the ops and the config below the
/// layers, the decoder's network on the layers, the families (one file each)
/// on it, everything that asks a family what it computes above them, the trainer below the reference
/// models it trains, serving on top. Its root (`lib.rs`: ConfigModel, the
/// model a config describes) sits above them all and is not placed.
const MODELS_ORDER: [&str; 27] = [
    "splitmix",
    "error",
    "ops",
    "family",
    "keys",
    "config",
    "params",
    "weights",
    "lora",
    "training",
    "kv_cache",
    "layers",
    "per_token",
    "moe",
    "decoder",
    "families",
    "checkpoint",
    "step",
    "serving_bytes",
    "trainer",
    "tensors",
    "reading",
    "estimate",
    "config_model",
    "reference",
    "inference",
    "serve",
];

fn the_models_modules_depend_one_way() {
    let models = Crate {
        src: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        leaves: &["splitmix"],
        parts: &[],
        order: &MODELS_ORDER,
    };
    let edges = depend_one_way(&models);
    assert!(reaches(&edges, "reference", "trainer") && !reaches(&edges, "trainer", "reference"), "{edges:#?}");
}

/// The tests of this file, in the order they run.
pub fn tests() -> Vec<(&'static str, fn())> {
    vec![("the_models_modules_depend_one_way", the_models_modules_depend_one_way)]
}
