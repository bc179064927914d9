//! The `autobatch` binary as a user runs it, one test binary: every command's
//! output and exit code (`cli`), and flags fuzzed for a clear error, never a
//! panic (`cli_fuzz`).

#[path = "../../../../tests/common/mod.rs"]
mod common;

mod cli;
mod cli_fuzz;
