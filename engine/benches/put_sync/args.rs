//! The command line of the `put_sync` bench. Kept apart from `main.rs` so
//! that engine/tests/bench_args.rs can parse command lines with it (a bench
//! built with `harness = false` runs no `#[test]`). Every default comes
//! from [`Options::default`], so `--help` shows what a run without flags
//! does.

use super::bench_core::Options;
use super::duration_arg::parse_duration;
use clap::builder::RangedU64ValueParser;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

/// Measures the raw O_DIRECT write bandwidth of the disk under --dir, then
/// durable (sync) puts through Handle::batch, then memory per key.
#[derive(Debug, Parser)]
#[command(
    name = "put_sync",
    bin_name = "put_sync",
    allow_negative_numbers = true
)]
pub struct Args {
    /// Length of the durable-put phase, in seconds (or with a unit: 500ms, 2s)
    #[arg(long, value_name = "DURATION", default_value = "10", value_parser = parse_duration)]
    pub seconds: Duration,

    /// Length of the raw O_DIRECT bandwidth phase, in seconds (or with a unit: 500ms, 2s); 0 skips it
    #[arg(long, value_name = "DURATION", default_value = "4", value_parser = parse_duration)]
    pub raw_seconds: Duration,

    /// Puts per batch (one Handle::batch call), a count of at least 1
    #[arg(long, value_name = "N", default_value_t = Options::default().batch,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pub batch: usize,

    /// Size of each value, in bytes
    #[arg(long, value_name = "BYTES", default_value_t = Options::default().value_size)]
    pub value_size: usize,

    /// Threads submitting batches, a count of at least 1
    #[arg(long, value_name = "N", default_value_t = Options::default().submitters,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pub submitters: usize,

    /// Engine shards, a count; 0 means one per core
    #[arg(long, value_name = "N", default_value_t = Options::default().shards)]
    pub shards: u32,

    /// Distinct keys the puts cycle through, a count of at least 1
    #[arg(long, value_name = "N", default_value_t = Options::default().key_space,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub key_space: u64,

    /// Keys inserted for the memory-per-key phase, a count; 0 skips the phase
    #[arg(long, value_name = "N", default_value_t = Options::default().memory_keys)]
    pub memory_keys: u64,

    /// The engine's storage.group_commit_max_bytes for the put phase, in bytes
    #[arg(long = "group-commit-bytes", value_name = "BYTES",
          default_value_t = Options::default().group_commit_max_bytes.as_u64())]
    pub group_commit_bytes: u64,

    /// The engine's storage.checkpoint_wal_bytes for the put phase, in bytes
    #[arg(long, value_name = "BYTES", default_value_t = Options::default().checkpoint_wal_bytes.as_u64())]
    pub checkpoint_wal_bytes: u64,

    /// The engine's storage.wal_flushes_in_flight for the put phase, a count
    #[arg(long, value_name = "N", default_value_t = Options::default().wal_flushes_in_flight)]
    pub wal_flushes_in_flight: u32,

    /// The engine's storage.max_memory for the memory phase, in bytes; 0 means no limit
    #[arg(long, value_name = "BYTES", default_value_t = Options::default().max_memory.as_u64())]
    pub max_memory: u64,

    /// Directory for the data and the raw-bandwidth files, on the disk to measure
    #[arg(long, value_name = "PATH", default_value_os_t = Options::default().dir)]
    pub dir: PathBuf,

    /// Passed by `cargo bench`; ignored
    #[arg(long = "bench", hide = true)]
    pub _bench: bool,
}

impl Args {
    /// The bench's options: these flags over the defaults of the rest.
    pub fn into_options(self) -> Options {
        Options {
            dir: self.dir,
            seconds: self.seconds.as_secs_f64(),
            batch: self.batch,
            value_size: self.value_size,
            submitters: self.submitters,
            shards: self.shards,
            key_space: self.key_space,
            raw_seconds: self.raw_seconds.as_secs_f64(),
            memory_keys: self.memory_keys,
            group_commit_max_bytes: tunables::ByteSize(self.group_commit_bytes),
            checkpoint_wal_bytes: tunables::ByteSize(self.checkpoint_wal_bytes),
            wal_flushes_in_flight: self.wal_flushes_in_flight,
            max_memory: tunables::ByteSize(self.max_memory),
            ..Options::default()
        }
    }
}
