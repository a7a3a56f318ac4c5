//! `cargo bench -p ringkv-engine --bench put_sync -- [--seconds N] [--batch N]
//! [--value-size N] [--dir PATH] [--submitters N] [--shards N] [--key-space N]
//! [--raw-seconds N] [--memory-keys N] [--group-commit-bytes N] [--checkpoint-wal-bytes N]
//! [--max-memory BYTES] [--wal-flushes-in-flight N]`
//!
//! Measures the raw O_DIRECT write bandwidth of the disk under `--dir`, then
//! durable (`sync`) puts through `Handle::batch`, then memory per key. Prints
//! the machine and the config with every result. See docs/benchmarks.md.

mod bench_core;

use bench_core::{run, Options};
use std::path::PathBuf;

fn main() {
    let mut opts = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> String {
            args.next().unwrap_or_else(|| {
                eprintln!("{name} needs a value");
                std::process::exit(2)
            })
        };
        let num = |s: String| -> u64 {
            s.parse().unwrap_or_else(|_| {
                eprintln!("not a number: {s}");
                std::process::exit(2)
            })
        };
        match arg.as_str() {
            "--seconds" => opts.seconds = value("--seconds").parse().unwrap_or(10.0),
            "--raw-seconds" => opts.raw_seconds = value("--raw-seconds").parse().unwrap_or(4.0),
            "--batch" => opts.batch = num(value("--batch")) as usize,
            "--value-size" => opts.value_size = num(value("--value-size")) as usize,
            "--submitters" => opts.submitters = num(value("--submitters")) as usize,
            "--shards" => opts.shards = num(value("--shards")) as u32,
            "--key-space" => opts.key_space = num(value("--key-space")),
            "--memory-keys" => opts.memory_keys = num(value("--memory-keys")),
            "--group-commit-bytes" => {
                opts.group_commit_max_bytes = tunables::ByteSize(num(value("--group-commit-bytes")))
            }
            "--checkpoint-wal-bytes" => {
                opts.checkpoint_wal_bytes = tunables::ByteSize(num(value("--checkpoint-wal-bytes")))
            }
            "--wal-flushes-in-flight" => {
                opts.wal_flushes_in_flight = num(value("--wal-flushes-in-flight")) as u32
            }
            "--max-memory" => opts.max_memory = tunables::ByteSize(num(value("--max-memory"))),
            "--dir" => opts.dir = PathBuf::from(value("--dir")),
            "--bench" => {} // passed by `cargo bench`
            other => {
                eprintln!(
                    "unknown argument {other}; see the top of engine/benches/put_sync/main.rs"
                );
                std::process::exit(2);
            }
        }
    }
    let report = run(&opts);
    println!("{report}");
}
