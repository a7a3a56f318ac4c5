//! `cargo bench -p ringkv-engine --bench get_batch -- [--keys N]
//! [--value-size N] [--batch N] [--batches N] [--runs N] [--missing N]`;
//! `-- --help` describes each flag (engine/benches/get_batch/args.rs).
//!
//! Measures GETs in the memory tier: the per-key path against the batched,
//! prefetching path, interleaved in one process. `--missing` is the share
//! of GETs (per mille) for absent keys. Prints the machine and the config
//! with the result. See docs/benchmarks.md ("Engine reads").

mod args;
mod bench_core;

use bench_core::run;
use clap::Parser;

fn main() {
    let opts = args::Args::parse().into_options();
    println!("{}", run(&opts));
}
