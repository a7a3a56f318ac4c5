//! `cargo bench -p ringkv-engine --bench get_batch -- [--keys N]
//! [--value-size N] [--batch N] [--batches N] [--runs N] [--missing N]`
//!
//! Measures GETs in the memory tier: the per-key path against the batched,
//! prefetching path, interleaved in one process. `--missing` is the share
//! of GETs (per mille) for absent keys. Prints the machine and the config
//! with the result. See docs/benchmarks.md ("Engine reads").

mod bench_core;

use bench_core::{run, Options};

fn main() {
    let mut opts = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut num = |name: &str| -> u64 {
            let text = args.next().unwrap_or_else(|| {
                eprintln!("{name} needs a value");
                std::process::exit(2)
            });
            text.parse().unwrap_or_else(|_| {
                eprintln!("not a number: {text}");
                std::process::exit(2)
            })
        };
        match arg.as_str() {
            "--keys" => opts.keys = num("--keys"),
            "--value-size" => opts.value_size = num("--value-size") as usize,
            "--batch" => opts.batch = num("--batch") as usize,
            "--batches" => opts.batches_per_run = num("--batches") as usize,
            "--runs" => opts.runs = num("--runs") as usize,
            "--missing" => opts.missing_per_mille = num("--missing") as u32,
            "--bench" => {} // passed by `cargo bench`
            other => {
                eprintln!(
                    "unknown argument {other}; see the top of engine/benches/get_batch/main.rs"
                );
                std::process::exit(2);
            }
        }
    }
    println!("{}", run(&opts));
}
