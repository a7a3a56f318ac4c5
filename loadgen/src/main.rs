//! The `loadgen` binary: parses the command line and hands it to `loadgen::app`.

use clap::Parser;

fn main() -> std::process::ExitCode {
    loadgen::app::main_with(loadgen::cli::Cli::parse())
}
