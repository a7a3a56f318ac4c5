//! The command line of the `get_batch` bench. Kept apart from `main.rs` so
//! that engine/tests/bench_args.rs can parse command lines with it (a bench
//! built with `harness = false` runs no `#[test]`). Every default comes
//! from [`Options::default`].

use super::bench_core::Options;
use clap::builder::RangedU64ValueParser;
use clap::Parser;

/// Measures GETs in the memory tier: the per-key path against the batched,
/// prefetching path, interleaved in one process.
#[derive(Debug, Parser)]
#[command(
    name = "get_batch",
    bin_name = "get_batch",
    allow_negative_numbers = true
)]
pub struct Args {
    /// Keys in the tier, a count of at least 1
    #[arg(long, value_name = "N", default_value_t = Options::default().keys,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub keys: u64,

    /// Size of each value, in bytes
    #[arg(long, value_name = "BYTES", default_value_t = Options::default().value_size)]
    pub value_size: usize,

    /// GETs per batch, a count of at least 1
    #[arg(long, value_name = "N", default_value_t = Options::default().batch,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pub batch: usize,

    /// Batches per timed run, a count of at least 1
    #[arg(long, value_name = "N", default_value_t = Options::default().batches_per_run,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pub batches: usize,

    /// Timed runs of each path (the report gives the median), a count of at least 1
    #[arg(long, value_name = "N", default_value_t = Options::default().runs,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pub runs: usize,

    /// Share of GETs asking for an absent key, in per mille (0 to 1000)
    #[arg(long, value_name = "PER_MILLE", default_value_t = Options::default().missing_per_mille,
          value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub missing: u32,

    /// Passed by `cargo bench`; ignored
    #[arg(long = "bench", hide = true)]
    pub _bench: bool,
}

impl Args {
    /// The bench's options: these flags over the defaults of the rest.
    pub fn into_options(self) -> Options {
        Options {
            keys: self.keys,
            value_size: self.value_size,
            batch: self.batch,
            batches_per_run: self.batches,
            runs: self.runs,
            missing_per_mille: self.missing,
            ..Options::default()
        }
    }
}
