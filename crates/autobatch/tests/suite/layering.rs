//! The core's modules depend one way (the testkit's check, over this
//! package's own `src/`): no import cycle between them, every module placed
//! in a layer that uses only the layers below it, and the leaves (a trial's
//! outcome, the headroom report, byte formatting, the mixer) import nothing
//! from the crate but other leaves. The models and the command line check
//! theirs in their own tests.

use std::path::Path;

use crate::common::layering::{Crate, depend_one_way, reaches};

/// Submodules placed in layers of their own, apart from the module that holds
/// them (none at present: the models, which had two, are a crate of their own).
const PARTS: [&str; 0] = [];

/// Files that are modules of their own for this check.
const LEAVES: [&str; 8] = [
    "units",
    "per_parameter",
    "setting",
    "splitmix",
    "search::outcome",
    "search::fit",
    "headroom::report",
    "estimate::change",
];

/// Every module in its layer, lowest first: each may use only the ones before
/// it (the design's order: search below plan below tuner; the user-facing
/// `model` layer below the tuner that probes it).
const ORDER: [&str; 23] = [
    "units",
    "per_parameter",
    "setting",
    "splitmix",
    "search::outcome",
    "search::fit",
    "estimate::change",
    "headroom::report",
    "error",
    "search",
    "estimate",
    "plan",
    "cache",
    "workload",
    "memory",
    "oom",
    "collective",
    "optim",
    "guard",
    "headroom",
    "model",
    "tuner",
    "serve",
];

#[test]
fn the_core_modules_depend_one_way() {
    let core =
        Crate { src: Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), leaves: &LEAVES, parts: &PARTS, order: &ORDER };
    let edges = depend_one_way(&core);
    assert!(
        reaches(&edges, "tuner", "plan")
            && reaches(&edges, "plan", "search")
            && reaches(&edges, "search", "search::outcome"),
        "{edges:#?}"
    );
}
