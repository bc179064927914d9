//! A test harness for heap measurements: the heap is process-wide, so the
//! tests of a file run one after another on the main thread (under libtest,
//! other tests' threads starting, printing or exiting land in the middle of a
//! measurement). `cargo test --test NAME -- FILTER` runs the tests whose name
//! contains FILTER.

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `tests` in order, prints a libtest-like report, exits 1 on a failure.
///
/// A failing test's panic prints its message and place, never a backtrace:
/// with `RUST_BACKTRACE` set, printing one loads the binary's debug
/// information onto the heap for the rest of the process (about 100 MB in a
/// test binary), under every later test's measurement.
pub fn run_sequentially(tests: &[(&str, fn())]) {
    std::panic::set_hook(Box::new(|info| eprintln!("{info}")));
    let filter: Vec<String> = std::env::args().skip(1).filter(|arg| !arg.starts_with('-')).collect();
    let selected: Vec<_> = tests
        .iter()
        .filter(|(name, _)| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str())))
        .collect();
    println!("\nrunning {} tests (sequentially, one thread: heap measurements)", selected.len());
    let mut failed = Vec::new();
    for (name, test) in selected {
        let started = std::time::Instant::now();
        let passed = catch_unwind(AssertUnwindSafe(test)).is_ok();
        println!("test {name} ... {} ({:.1?})", if passed { "ok" } else { "FAILED" }, started.elapsed());
        if !passed {
            failed.push(*name);
        }
    }
    if !failed.is_empty() {
        println!("\nfailures: {failed:?}");
        std::process::exit(1);
    }
    println!("\ntest result: ok");
}
