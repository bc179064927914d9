//! Without the tracking allocator installed, the heap meter refuses to start,
//! and says so readably where a user's `main` meets it.

use autobatch::{DeviceProblem, Error, HeapMeter, TrackingAllocator};

#[test]
fn heap_meter_detects_a_missing_tracking_allocator() {
    assert!(!TrackingAllocator::is_installed());
    let err = HeapMeter::new(1 << 30).unwrap_err();
    assert!(matches!(err, Error::Device(DeviceProblem::AllocatorNotInstalled)));
    assert!(err.to_string().contains("#[global_allocator]"), "{err}");
    // `fn main() -> Result<(), autobatch::Error>` prints the Debug form: the message, not a variant's name
    let debug = format!("{err:?}");
    assert_eq!(debug, err.to_string());
    assert!(!debug.contains("AllocatorNotInstalled"), "{debug}");
    // a room-sized meter refuses the same way
    assert!(matches!(HeapMeter::with_room(1 << 20), Err(Error::Device(DeviceProblem::AllocatorNotInstalled))));
}

#[test]
fn a_workload_error_reads_as_its_message_with_candle_underneath() {
    let failed = Error::Workload { batch: 3, source: candle_core::Error::Msg("shape mismatch in matmul".to_owned()) };
    let debug = format!("{failed:?}");
    assert!(debug.contains("batch 3") && debug.contains("shape mismatch in matmul"), "{debug}");
    assert_eq!(debug.matches("shape mismatch").count(), 1, "the cause is said once: {debug}");
}
