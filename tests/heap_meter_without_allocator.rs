//! Without the tracking allocator installed, the heap meter refuses to start.

use autobatch::{Error, HeapMeter, TrackingAllocator};

#[test]
fn heap_meter_detects_a_missing_tracking_allocator() {
    assert!(!TrackingAllocator::is_installed());
    let err = HeapMeter::new(1 << 30).unwrap_err();
    assert!(matches!(err, Error::AllocatorNotInstalled));
    assert!(err.to_string().contains("#[global_allocator]"), "{err}");
}
