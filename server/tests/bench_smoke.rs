//! The Redis-comparison benchmark tool (examples/ringkv-bench.rs) runs in a
//! tiny size against the real server, so it never rots; speed is measured by
//! scripts/bench-vs-redis.sh, never asserted here.

mod common;

#[path = "../examples/ringkv-bench.rs"]
mod bench;

use common::*;

#[test]
fn bench_tool_runs_in_a_tiny_size() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ringkv.toml");
    std::fs::write(&cfg, "[storage]\nwal_segment_size = \"8MiB\"\n").unwrap();
    let server = start_server(
        &dir.path().join("d"),
        &["--config", cfg.to_str().unwrap(), "--shards", "2"],
    );
    let opts = bench::Options {
        server: server.addr,
        connections: 4,
        batch: 100,
        value_bytes: 1000,
        keys: 100,
        requests: 2_000,
        seed: 7,
    };
    let (put, get) = with_runtime(async move { bench::run(&opts, WAIT).await }).expect("bench run");
    assert_eq!(put.ops, 2_000);
    assert_eq!(get.ops, 2_000);
    assert_eq!(put.batch_latencies.len(), 20);
    assert!(put.percentile(0.5) <= put.percentile(1.0));
    // 2,000 random puts over 100 keys write every key (fixed seed).
    assert_eq!(get.not_found, 0);
    assert!(bench::describe(&get).starts_with("GET: 2000 ops"));
}
