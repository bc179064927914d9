//! An example headroom regression test on a reference workload: the kind of
//! test a project keeps in CI so that a change that grows memory fails here.
//! One #[test] only: heap measurements want no other test thread running.

use autobatch::{Error, Headroom, HeadroomReport, HeapMeter};
use autobatch_models::reference::TransformerConfig;
use candle_core::Device;

fn the_reference_transformer_keeps_its_headroom_at_batch_32() {
    let mut model =
        TransformerConfig { vocab: 64, d_model: 32, heads: 4, layers: 1, seq_len: 16, ..Default::default() }
            .build(&Device::Cpu)
            .unwrap();
    // the CPU as a device with 64 MiB free beside what the process holds (the
    // threads' matmul buffers differ by host: a fixed budget holds on one only)
    let mut meter = HeapMeter::with_room(64 << 20).unwrap();

    // the regression test itself
    let report = Headroom::new(32).min_headroom(0.3).assert(&mut model, &mut meter);
    // headroom is of the whole capacity: the room under no ceiling
    let capacity = meter.budget_bytes();
    assert!(report.passed && !report.out_of_memory);
    assert!(report.peak_bytes > report.baseline_bytes && report.peak_bytes < capacity);
    assert_eq!(report.headroom_bytes, capacity - report.peak_bytes);

    // its artifact
    let artifact = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("headroom-transformer-b32.json");
    std::fs::write(&artifact, report.to_json()).unwrap();
    let back: HeadroomReport = serde_json::from_str(&std::fs::read_to_string(&artifact).unwrap()).unwrap();
    assert_eq!(back, report);

    // and what a regression looks like: the same model asked for more headroom than it has
    let failed = Headroom::new(32).min_headroom(0.9).check(&mut model, &mut meter).unwrap_err();
    let Error::InsufficientHeadroom(failed) = failed else { panic!("{failed}") };
    assert!(!failed.passed);
    let message = failed.to_string();
    assert!(
        message.contains("peak")
            && message.contains(&format!("of {}", autobatch::Bytes(capacity)))
            && message.contains("minimum 90.0%"),
        "{message}"
    );
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Headroom::new(32).min_headroom(0.9).assert(&mut model, &mut meter)
    }));
    let payload = panic.expect_err("Headroom::assert panics on a regression");
    let text = payload.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(text.starts_with("memory headroom regression: batch 32: peak"), "{text}");
    assert!(matches!(
        Headroom::new(32).min_headroom(1.5).check(&mut model, &mut meter),
        Err(Error::InvalidSetting { value: autobatch::Value::Fraction(_), .. })
    ));
}

/// The tests of this file, in the order they run.
pub fn tests() -> Vec<(&'static str, fn())> {
    vec![(
        "the_reference_transformer_keeps_its_headroom_at_batch_32",
        the_reference_transformer_keeps_its_headroom_at_batch_32,
    )]
}
