//! The `autobatch` binary as a user runs it, one test binary: every command's
//! output and exit code (`cli`), and flags fuzzed for a clear error, never a
//! panic (`cli_fuzz`).

use autobatch_testkit as common;

mod adversary;
mod cli;
mod cli_fuzz;
mod hub;
mod layering;
