//! The command line's modules depend one way (the testkit's check over
//! this package's own `src/`): reading what people type, then what the
//! commands share, then the commands.

use crate::common::layering::{Crate, depend_one_way, reaches};

/// The command line's modules, lowest first: reading what people type
/// (sizes, the flags' value types, the flags), then what the commands share
/// (the paths, the Hub's cache, the charts, the device and budget flags, the model the flags
/// describe), then the commands, probe's parts in their own order (the flags
/// checked, the request made, what a run holds, then what its modes measure).
/// Its root (`main.rs`) sits above them all.
const CLI_ORDER: [&str; 26] = [
    "parse",
    "limits",
    "failure",
    "output",
    "progress",
    "values",
    "args",
    "paths",
    "hub",
    "plot",
    "device_flags",
    "model",
    "serve",
    "estimate",
    "plan",
    "probe::checks",
    "probe::request",
    "probe::context",
    "probe::footprint",
    "probe::measure",
    "probe::compare",
    "probe::find",
    "probe::refusal",
    "probe::advice",
    "probe::modes",
    "probe",
];

/// probe's parts, each placed on its own: a cycle between two of them fails.
const PROBE_PARTS: [&str; 10] = [
    "probe::checks",
    "probe::request",
    "probe::context",
    "probe::footprint",
    "probe::measure",
    "probe::compare",
    "probe::find",
    "probe::refusal",
    "probe::advice",
    "probe::modes",
];

#[test]
fn the_command_lines_modules_depend_one_way() {
    let cli = Crate {
        src: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        leaves: &[],
        parts: &PROBE_PARTS,
        order: &CLI_ORDER,
    };
    let edges = depend_one_way(&cli);
    assert!(reaches(&edges, "probe", "args") && !reaches(&edges, "args", "probe"), "{edges:#?}");
}
