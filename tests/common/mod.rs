//! Shared by the integration tests that measure the heap.

pub mod harness;
