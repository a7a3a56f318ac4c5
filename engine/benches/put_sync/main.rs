//! `cargo bench -p ringkv-engine --bench put_sync -- [FLAGS]`; `-- --help`
//! lists the flags (engine/benches/put_sync/args.rs).
//!
//! Measures the raw O_DIRECT write bandwidth of the disk under `--dir`, then
//! durable (`sync`) puts through `Handle::batch`, then memory per key. Prints
//! the machine and the config with every result. See docs/benchmarks.md.

mod args;
mod bench_core;
#[path = "../shared/duration_arg.rs"]
mod duration_arg;

use bench_core::run;
use clap::Parser;

fn main() {
    let opts = args::Args::parse().into_options();
    let report = run(&opts);
    println!("{report}");
}
