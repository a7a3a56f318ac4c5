//! The `loadgen` binary: parses the command line and hands it to `loadgen::app`.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use clap::Parser;

fn main() -> std::process::ExitCode {
    loadgen::app::main_with(loadgen::cli::Cli::parse())
}
