//! The core's heap measurements, one binary: the heap is process-wide, so
//! these run one after another on the main thread under the tracking
//! allocator (autobatch_testkit::harness). `cargo test --test measured -- NAME`
//! runs the tests whose name contains NAME.

#[global_allocator]
static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();

use autobatch_testkit as common;

mod guide;
mod host;
mod optimizers;
mod split;
mod stateful;

fn main() {
    let tests: Vec<_> =
        [guide::tests(), host::tests(), optimizers::tests(), split::tests(), stateful::tests()].concat();
    common::harness::run_sequentially(&tests);
}
