//! The command line of the `recovery` bench. Kept apart from `main.rs` so
//! that engine/tests/bench_args.rs can parse command lines with it (a bench
//! built with `harness = false` runs no `#[test]`). `main.rs` describes the
//! phases these flags add.

use clap::{Parser, ValueEnum};
use std::path::PathBuf;

/// Fills a sync engine, then restarts it in a fresh process and reports
/// how long recovery took, what it read and the RAM before and after.
#[derive(Debug, Parser)]
#[command(
    name = "recovery",
    bin_name = "recovery",
    allow_negative_numbers = true
)]
pub struct Args {
    /// Distinct keys the fill writes, a count of at least 1
    #[arg(long, value_name = "N", default_value_t = 1_000_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub keys: u64,

    /// Times the fill writes every key, a count
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub passes: u64,

    /// Size of each value, in bytes
    #[arg(long, value_name = "BYTES", default_value_t = 1000)]
    pub value_size: usize,

    /// Size of each key, in bytes: 8 (the key number, big-endian) or 16 (`k` and 15 digits)
    #[arg(long, value_name = "BYTES", value_enum, default_value_t = KeySize::Sixteen)]
    pub key_size: KeySize,

    /// Engine shards, a count; 0 means one per core
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub shards: u32,

    /// Directory the engine's data goes under (`DIR/data`); the fill empties it first
    #[arg(long, value_name = "PATH", default_value_os_t = default_dir())]
    pub dir: PathBuf,

    /// The engine's storage.checkpoint_wal_bytes, in bytes, with no timed checkpoints; the engine's defaults when absent
    #[arg(long, value_name = "BYTES")]
    pub checkpoint_wal_bytes: Option<u64>,

    /// The storage tier: memory, or hybrid (index in RAM, values on disk, the index sized for --keys)
    #[arg(long, value_name = "TIER", value_enum, default_value_t = Tier::Memory)]
    pub tier: Tier,

    /// The hybrid tier's storage.cache_bytes, in bytes; the engine's default when absent
    #[arg(long, value_name = "BYTES")]
    pub cache_bytes: Option<u64>,

    /// Random overwrites after the fill, a count; 0 skips the phase
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub updates: u64,

    /// The engine's storage.checkpoint_deltas_max, a count (0: every checkpoint full); the engine's default when absent
    #[arg(long, value_name = "N")]
    pub deltas_max: Option<u32>,

    /// After the fill, overwrite, delete, expire and insert keys as service would, then report RAM and cold reads
    #[arg(long)]
    pub mixed: bool,

    /// With --mixed, read every key back before and after the restart and count those present (slow)
    #[arg(long)]
    pub count_found: bool,

    /// What this process runs: fill, recover (a directory filled before), or all (fill, then recover in a fresh process)
    #[arg(long, value_name = "PHASE", value_enum, default_value_t = Phase::All, overrides_with = "phase")]
    pub phase: Phase,

    /// Passed by `cargo bench`; ignored
    #[arg(long = "bench", hide = true)]
    pub _bench: bool,
}

/// `--key-size`: how a key number is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KeySize {
    // The key number as 8 big-endian bytes.
    #[value(name = "8")]
    Eight,
    // `k` and the key number in 15 decimal digits.
    #[value(name = "16")]
    Sixteen,
}

impl KeySize {
    /// The key's length in bytes.
    pub fn bytes(self) -> usize {
        match self {
            KeySize::Eight => 8,
            KeySize::Sixteen => 16,
        }
    }
}

/// `--tier`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Tier {
    Memory,
    Hybrid,
}

/// `--phase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Phase {
    Fill,
    Recover,
    All,
}

/// `target/bench-recovery` of the workspace.
fn default_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-recovery")
}
