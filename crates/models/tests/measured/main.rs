//! The models' integration tests, one binary: real candle steps measured on
//! the heap, one after another on the main thread under the tracking
//! allocator (autobatch_testkit::harness).
//! `cargo test -p autobatch-models --test measured -- NAME` runs the tests
//! whose name contains NAME.

#[global_allocator]
static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();

use autobatch_testkit as common;

mod gpu_verdict;
mod headroom;
mod layering;
mod models;
mod workloads;
mod your_model;

fn main() {
    let tests: Vec<_> = [
        layering::tests(),
        models::tests(),
        workloads::tests(),
        your_model::tests(),
        headroom::tests(),
        gpu_verdict::tests(),
    ]
    .concat();
    common::harness::run_sequentially(&tests);
}
