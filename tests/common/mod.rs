//! Shared by the integration tests: the sequential harness of the files that
//! measure the heap, and a simulated workload that accumulates.

#![allow(dead_code)] // each test file uses some of it

pub mod accumulating;
pub mod harness;
