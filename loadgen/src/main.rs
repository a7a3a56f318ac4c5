//! The `loadgen` binary: parses the command line and hands it to `loadgen::app`.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use clap::Parser;

/// The allocator `ringkv-server` uses (see server/src/main.rs), so the
/// embedded server that loadgen measures allocates as the real one does;
/// the JSON report's `run.allocator` says which allocator served the run.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    loadgen::app::main_with(loadgen::cli::Cli::parse())
}
