//! The command lines of the engine's benches (put_sync, get_batch,
//! recovery). The benches are built with `harness = false`, so they run no
//! `#[test]` of their own; each keeps its clap definition in an `args.rs`
//! that this file compiles as a module, next to the bench's own
//! `bench_core.rs` where the defaults come from. The command lines here are
//! those of scripts/bench-durable-writes.sh and docs/ (benchmarks.md,
//! benchmarks-history.md, storage.md), which must keep working.

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use std::time::Duration;

// A `#[path]` on an inline module names the folder its modules' paths
// start from.
#[path = "../benches/put_sync"]
mod put_sync {
    #[path = "args.rs"]
    pub mod args;
    #[path = "bench_core.rs"]
    pub mod bench_core;
    #[path = "../shared/duration_arg.rs"]
    pub mod duration_arg;
}

#[path = "../benches/get_batch"]
mod get_batch {
    #[path = "args.rs"]
    pub mod args;
    #[allow(dead_code)] // Only its options are used here.
    #[path = "bench_core.rs"]
    pub mod bench_core;
}

#[path = "../benches/recovery"]
mod recovery {
    #[path = "args.rs"]
    pub mod args;
}

use put_sync::duration_arg::parse_duration;

/// Parses `args` after a program name.
fn parse<P: Parser>(args: &str) -> Result<P, clap::Error> {
    P::try_parse_from(std::iter::once("bench").chain(args.split_whitespace()))
}

/// `args` must fail with an error that names `flag` and does not exit 0.
fn assert_refused<P: Parser + std::fmt::Debug>(args: &str, flag: &str) {
    let err = parse::<P>(args).expect_err(args);
    let text = err.to_string();
    assert!(
        text.contains(flag),
        "{args}: the error does not name {flag}: {text}"
    );
    assert_ne!(err.exit_code(), 0, "{args}");
}

/// `--help` is shown (exit 0) and names each of `flags`.
fn assert_help_lists<P: Parser + std::fmt::Debug>(flags: &[&str]) {
    let err = parse::<P>("--help").expect_err("help is printed, not parsed");
    assert_eq!(err.kind(), ErrorKind::DisplayHelp);
    assert_eq!(err.exit_code(), 0);
    let help = err.to_string();
    for flag in flags {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    assert!(!help.contains("--bench"), "--bench is hidden:\n{help}");
}

#[test]
fn durations_are_seconds_or_carry_a_unit() {
    assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
    assert_eq!(parse_duration("2.5"), Ok(Duration::from_millis(2500)));
    assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("0.5ms"), Ok(Duration::from_micros(500)));
    for bad in [
        "", "x", "s", "ms", "-1", "-0.5s", "5m", "5 min", "10h", "inf", "NaN", "1e400",
    ] {
        assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn put_sync_command_line_is_consistent() {
    put_sync::args::Args::command().debug_assert();
}

#[test]
fn put_sync_defaults_are_bench_core_defaults() {
    let parsed = parse::<put_sync::args::Args>("")
        .expect("no flags")
        .into_options();
    assert_eq!(
        format!("{parsed:?}"),
        format!("{:?}", put_sync::bench_core::Options::default())
    );
}

#[test]
fn put_sync_documented_command_lines_parse() {
    use put_sync::args::Args;
    // scripts/bench-durable-writes.sh, through `cargo bench` (which adds --bench).
    let o = parse::<Args>(
        "--bench --seconds 10 --memory-keys 0 --key-space 100000 --shards 2 --dir /tmp/p \
         --wal-flushes-in-flight 4",
    )
    .expect("bench-durable-writes.sh")
    .into_options();
    assert_eq!(o.seconds, 10.0);
    assert_eq!((o.memory_keys, o.key_space, o.shards), (0, 100_000, 2));
    assert_eq!(o.dir, std::path::PathBuf::from("/tmp/p"));
    assert_eq!(o.wal_flushes_in_flight, 4);
    // docs/benchmarks-history.md, and the flags it lists.
    let o = parse::<Args>(
        "--seconds 6 --raw-seconds 2 --memory-keys 0 --key-space 1000000 --batch 1 \
         --value-size 100 --submitters 4 --group-commit-bytes 65536 \
         --checkpoint-wal-bytes 1048576 --max-memory 1000000",
    )
    .expect("benchmarks-history.md")
    .into_options();
    assert_eq!((o.seconds, o.raw_seconds), (6.0, 2.0));
    assert_eq!((o.batch, o.value_size, o.submitters), (1, 100, 4));
    assert_eq!(o.group_commit_max_bytes.as_u64(), 65_536);
    assert_eq!(o.checkpoint_wal_bytes.as_u64(), 1_048_576);
    assert_eq!(o.max_memory.as_u64(), 1_000_000);
    let o = parse::<Args>("--seconds 1.5 --raw-seconds 250ms")
        .expect("fractions and units")
        .into_options();
    assert_eq!((o.seconds, o.raw_seconds), (1.5, 0.25));
}

#[test]
fn put_sync_bad_values_are_errors() {
    use put_sync::args::Args;
    assert_refused::<Args>("--seconds x", "--seconds");
    assert_refused::<Args>("--seconds -1", "--seconds");
    assert_refused::<Args>("--raw-seconds 4m", "--raw-seconds");
    assert_refused::<Args>("--batch -1", "--batch");
    assert_refused::<Args>("--batch 0", "--batch");
    assert_refused::<Args>("--submitters 0", "--submitters");
    assert_refused::<Args>("--key-space 0", "--key-space");
    assert_refused::<Args>("--shards two", "--shards");
    assert_refused::<Args>("--max-memory 1GiB", "--max-memory");
    assert_refused::<Args>("--seconds", "--seconds");
    assert_refused::<Args>("--secs 3", "--secs");
}

#[test]
fn put_sync_help_describes_every_flag() {
    assert_help_lists::<put_sync::args::Args>(&[
        "--seconds",
        "--raw-seconds",
        "--batch",
        "--value-size",
        "--submitters",
        "--shards",
        "--key-space",
        "--memory-keys",
        "--group-commit-bytes",
        "--checkpoint-wal-bytes",
        "--wal-flushes-in-flight",
        "--max-memory",
        "--dir",
        "in seconds",
        "in bytes",
    ]);
}

#[test]
fn get_batch_command_line_is_consistent() {
    get_batch::args::Args::command().debug_assert();
}

#[test]
fn get_batch_defaults_are_bench_core_defaults() {
    let parsed = parse::<get_batch::args::Args>("")
        .expect("no flags")
        .into_options();
    assert_eq!(
        format!("{parsed:?}"),
        format!("{:?}", get_batch::bench_core::Options::default())
    );
}

#[test]
fn get_batch_documented_command_line_parses() {
    // docs/benchmarks.md, "Engine reads".
    let o = parse::<get_batch::args::Args>(
        "--bench --keys 5000 --value-size 100 --batch 10 --batches 3 --runs 2 --missing 250",
    )
    .expect("benchmarks.md")
    .into_options();
    assert_eq!((o.keys, o.value_size, o.batch), (5_000, 100, 10));
    assert_eq!(
        (o.batches_per_run, o.runs, o.missing_per_mille),
        (3, 2, 250)
    );
}

#[test]
fn get_batch_bad_values_are_errors() {
    use get_batch::args::Args;
    assert_refused::<Args>("--keys x", "--keys");
    assert_refused::<Args>("--keys 0", "--keys");
    assert_refused::<Args>("--batch -5", "--batch");
    assert_refused::<Args>("--runs 0", "--runs");
    assert_refused::<Args>("--missing 1001", "--missing");
    assert_refused::<Args>("--miss 5", "--miss");
}

#[test]
fn get_batch_help_describes_every_flag() {
    assert_help_lists::<get_batch::args::Args>(&[
        "--keys",
        "--value-size",
        "--batch",
        "--batches",
        "--runs",
        "--missing",
        "per mille",
        "in bytes",
    ]);
}

#[test]
fn recovery_command_line_is_consistent() {
    recovery::args::Args::command().debug_assert();
}

#[test]
fn recovery_defaults_are_the_documented_ones() {
    use recovery::args::{Args, KeySize, Phase, Tier};
    let a = parse::<Args>("").expect("no flags");
    assert_eq!(
        (a.keys, a.passes, a.value_size, a.shards),
        (1_000_000, 1, 1000, 2)
    );
    assert_eq!(
        (a.key_size, a.tier, a.phase),
        (KeySize::Sixteen, Tier::Memory, Phase::All)
    );
    assert!(a.dir.ends_with("target/bench-recovery"), "{:?}", a.dir);
    assert_eq!(
        (a.checkpoint_wal_bytes, a.cache_bytes, a.deltas_max),
        (None, None, None)
    );
    assert_eq!(a.updates, 0);
    assert!(!a.mixed && !a.count_found);
}

#[test]
fn recovery_documented_command_lines_parse() {
    use recovery::args::{Args, KeySize, Phase, Tier};
    // docs/benchmarks.md and docs/benchmarks-history.md.
    let a = parse::<Args>(
        "--bench --keys 100000000 --key-size 8 --value-size 32 --tier hybrid \
         --cache-bytes 67108864 --checkpoint-wal-bytes 1099511627776 --dir target/bench-h100m \
         --mixed --count-found",
    )
    .expect("hybrid at 100M");
    assert_eq!(
        (a.keys, a.key_size, a.value_size),
        (100_000_000, KeySize::Eight, 32)
    );
    assert_eq!(a.key_size.bytes(), 8);
    assert_eq!(a.tier, Tier::Hybrid);
    assert_eq!(a.cache_bytes, Some(67_108_864));
    assert_eq!(a.checkpoint_wal_bytes, Some(1 << 40));
    assert!(a.mixed && a.count_found);
    let a = parse::<Args>(
        "--keys 2000000 --value-size 1000 --updates 2000000 --checkpoint-wal-bytes 67108864 \
         --deltas-max 0 --passes 3 --shards 4",
    )
    .expect("delta checkpoints");
    assert_eq!(
        (a.updates, a.deltas_max, a.passes, a.shards),
        (2_000_000, Some(0), 3, 4)
    );
    let a = parse::<Args>("--keys 1000000 --passes 3 --dir D --phase fill").expect("fill");
    assert_eq!(a.phase, Phase::Fill);
    // The `all` phase starts its second process with its own arguments and
    // `--phase recover` after them: the last --phase wins.
    let a = parse::<Args>("--phase all --keys 10 --phase recover").expect("second process");
    assert_eq!(a.phase, Phase::Recover);
}

#[test]
fn recovery_bad_values_are_errors() {
    use recovery::args::Args;
    assert_refused::<Args>("--keys x", "--keys");
    assert_refused::<Args>("--keys -1", "--keys");
    assert_refused::<Args>("--keys 0", "--keys");
    assert_refused::<Args>("--passes 1.5", "--passes");
    assert_refused::<Args>("--key-size 12", "--key-size");
    assert_refused::<Args>("--tier disk", "--tier");
    assert_refused::<Args>("--phase restart", "--phase");
    assert_refused::<Args>("--deltas-max -2", "--deltas-max");
    assert_refused::<Args>("--mixed yes", "yes");
    assert_refused::<Args>("--counts-found", "--counts-found");
}

#[test]
fn recovery_help_describes_every_flag() {
    assert_help_lists::<recovery::args::Args>(&[
        "--keys",
        "--passes",
        "--value-size",
        "--key-size",
        "--shards",
        "--dir",
        "--checkpoint-wal-bytes",
        "--tier",
        "--cache-bytes",
        "--updates",
        "--deltas-max",
        "--mixed",
        "--count-found",
        "--phase",
        "in bytes",
    ]);
}
