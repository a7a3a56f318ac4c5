//! What the keyed table hash costs (issue 31): SipHash-1-3 against the
//! unkeyed FNV-1a, per key, in the memory tier, and through an engine.
//! Benchmarks, ignored by default; run in release:
//! `cargo test --release -p ringkv-engine --test bench_table_hash -- --ignored --nocapture --test-threads 1`
//! The numbers are in docs/benchmarks.md ("Hash flooding (issue 31)").

use bytes::Bytes;
use ringkv_engine::hash::TableHasher;
use ringkv_engine::tier::{MemoryTier, Tier};
use ringkv_engine::{Engine, Op, OpResult};
use std::hint::black_box;
use std::time::{Duration, Instant};
use tunables::{Config, Durability};

fn key(i: u64) -> Bytes {
    Bytes::from(format!("user:{i:012}"))
}

fn best(runs: &[Duration]) -> Duration {
    *runs.iter().min().expect("runs")
}

/// Nanoseconds per key of the table hash alone, for keys of a few sizes.
#[test]
#[ignore = "benchmark: prints numbers, run by hand in release"]
fn table_hash_ns_per_key() {
    let keyed = TableHasher::random().expect("key");
    for len in [8usize, 16, 32, 64, 256] {
        let keys: Vec<Vec<u8>> = (0..4096u64)
            .map(|i| {
                let mut k = format!("{i:0len$}").into_bytes();
                k.truncate(len);
                k
            })
            .collect();
        let mut line = format!("key {len:>3} bytes:");
        for (name, h) in [("fnv1a64", TableHasher::LEGACY), ("siphash-1-3", keyed)] {
            let mut runs = Vec::new();
            for _ in 0..7 {
                let started = Instant::now();
                let mut acc = 0u64;
                for _ in 0..100 {
                    for k in &keys {
                        acc ^= h.hash_key(black_box(k));
                    }
                }
                black_box(acc);
                runs.push(started.elapsed());
            }
            let ns = best(&runs).as_nanos() as f64 / (100.0 * keys.len() as f64);
            line += &format!("  {name} {ns:>5.1} ns");
        }
        println!("{line}");
    }
}

/// Puts and gets of 1,000,000 keys in a memory tier, hash included,
/// unkeyed and keyed alternately (best of 5 each).
#[test]
#[ignore = "benchmark: prints numbers, run by hand in release"]
fn memory_tier_put_get_legacy_vs_keyed() {
    let count = 1_000_000u64;
    let keys: Vec<Bytes> = (0..count).map(key).collect();
    let keyed = TableHasher::random().expect("key");
    let mut put_runs = [Vec::new(), Vec::new()];
    let mut get_runs = [Vec::new(), Vec::new()];
    for _ in 0..5 {
        for (slot, h) in [TableHasher::LEGACY, keyed].into_iter().enumerate() {
            let mut t = MemoryTier::with_hasher(h);
            let started = Instant::now();
            for k in &keys {
                t.put(h.hash_key(k), k, b"0123456789abcdef", 0);
            }
            put_runs[slot].push(started.elapsed());
            let started = Instant::now();
            for k in &keys {
                black_box(t.get(h.hash_key(k), k));
            }
            get_runs[slot].push(started.elapsed());
        }
    }
    let mops = |d: Duration| count as f64 / d.as_secs_f64() / 1e6;
    for (what, runs) in [("put", &put_runs), ("get", &get_runs)] {
        let (legacy, keyed) = (mops(best(&runs[0])), mops(best(&runs[1])));
        println!(
            "memory tier {what}: unkeyed {legacy:.2} Mops/s, keyed {keyed:.2} Mops/s, keyed/unkeyed {:.3}",
            keyed / legacy
        );
    }
}

/// Puts then gets through one engine (`durability = none`, one shard,
/// batches of 200): operations per second. Uses only the engine's API, so
/// the same function runs on a build without the keyed hash.
#[test]
#[ignore = "benchmark: prints numbers, run by hand in release"]
fn engine_put_get_throughput() {
    let mut config = Config {
        shards: 1,
        ..Default::default()
    };
    config.storage.durability = Durability::None;
    let engine = Engine::open(&config).expect("open");
    let h = engine.handle();
    let count = 400_000u64;
    let value = Bytes::from_static(b"0123456789abcdef");
    let (mut puts, mut gets) = (Vec::new(), Vec::new());
    for round in 0..5u64 {
        let started = Instant::now();
        for at in (0..count).step_by(200) {
            let ops = (at..at + 200)
                .map(|i| Op::Put {
                    key: key(round * count + i),
                    value: value.clone(),
                })
                .collect();
            h.batch_blocking(ops).expect("puts");
        }
        puts.push(started.elapsed());
        let started = Instant::now();
        for at in (0..count).step_by(200) {
            let ops = (at..at + 200)
                .map(|i| Op::Get {
                    key: key(round * count + i),
                })
                .collect();
            let a = h.batch_blocking(ops).expect("gets");
            assert!(matches!(a[0], OpResult::Value(_)));
        }
        gets.push(started.elapsed());
    }
    engine.shutdown().expect("shutdown");
    let kops = |d: Duration| count as f64 / d.as_secs_f64() / 1e3;
    println!(
        "engine (1 shard, batches of 200): put {:.0} kops/s, get {:.0} kops/s (best of 5)",
        kops(best(&puts)),
        kops(best(&gets))
    );
}
