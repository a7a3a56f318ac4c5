//! Runs the `put_sync` benchmark's own code at a tiny size, so the
//! benchmark keeps compiling and working. Checks correctness of what it
//! reports, never speed.

#[path = "../benches/put_sync/bench_core.rs"]
mod bench_core;

use bench_core::{run, Options};

#[test]
fn put_sync_benchmark_runs_at_tiny_size() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = Options {
        dir: tmp.path().to_path_buf(),
        seconds: 60.0,
        max_puts: Some(2_000),
        batch: 1000,
        value_size: 1000,
        submitters: 2,
        shards: 2,
        key_space: 5_000,
        raw_seconds: 0.05,
        raw_file_bytes: 4 << 20,
        memory_keys: 2_000,
        ..Options::default()
    };
    let report = run(&opts);
    assert_eq!(report.puts.puts, 2_000);
    assert_eq!(report.puts.batches, 2);
    // Every put's record (1,000-byte value, 16-byte key, header) was logged.
    assert!(report.puts.wal_bytes >= 2_000 * 1_000, "{report}");
    assert!(report.puts.wal_flushes >= 2);
    let raw = report.raw.as_ref().expect("raw phase ran");
    assert!(raw.groups > 0);
    assert!(report.raw_after.as_ref().is_some_and(|r| r.groups > 0));
    assert!(report.raw_bytes_per_sec().is_some_and(|b| b > 0.0));
    let memory = report.memory.as_ref().expect("memory phase ran");
    assert!(memory.tier_bytes >= 2_000 * 1_000, "{report}");
    let text = report.to_string();
    assert!(
        text.contains("durable puts") && text.contains("bytes/key"),
        "{text}"
    );
}
