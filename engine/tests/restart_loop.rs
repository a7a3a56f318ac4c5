//! A server that restarts often must still checkpoint: many short runs,
//! each writing less than the checkpoint threshold, with graceful stops
//! and crash-like halts mixed. The WAL replayed at each start and the WAL
//! kept on disk must stay bounded (docs/wal.md states the bound), and every
//! acknowledged write must be there.

mod common;

use common::*;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::Engine;
use std::collections::BTreeMap;
use std::path::Path;
use tunables::Durability;

const RUNS: u64 = 40;
const KEYS: u64 = 200;
const PUTS_PER_RUN: u64 = 20;

#[test]
fn restart_loop_keeps_the_wal_and_the_replay_bounded() {
    init_log();
    let disk = SimDisk::new(77);
    let config = small_config(Path::new("/loop"), 1, Durability::Sync);
    let threshold = config.storage.checkpoint_wal_bytes.as_u64();
    let segment = config.storage.wal_segment_size.as_u64();
    let mut model: BTreeMap<u64, u64> = BTreeMap::new();
    let mut max_replayed = 0u64;
    let mut max_wal = 0u64;
    let mut total_written = 0u64;
    for run in 0..RUNS {
        let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
        let m = engine.metrics().shards[0].clone();
        max_replayed = max_replayed.max(m.recovery_bytes_replayed);
        // Everything acknowledged before is there.
        let h = engine.handle();
        let gets = model.keys().map(|&k| get(k)).collect::<Vec<_>>();
        if !gets.is_empty() {
            let got = h.batch_blocking(gets).expect("gets");
            for ((k, v), r) in model.iter().zip(got) {
                assert_eq!(value_of(&r), Some(value(*k, *v)), "run {run}, key {k}");
            }
        }
        // A short run: well below the checkpoint threshold.
        for i in 0..PUTS_PER_RUN {
            let k = (run * PUTS_PER_RUN + i) % KEYS;
            h.batch_blocking(vec![put(k, run + 1)]).expect("put");
            model.insert(k, run + 1);
        }
        let written = engine.metrics().shards[0].wal_bytes_written;
        assert!(
            written < threshold,
            "each run must stay below the threshold ({written} >= {threshold})"
        );
        total_written += written;
        if run % 2 == 0 {
            engine.shutdown().expect("shutdown");
        } else {
            engine.halt();
        }
        max_wal = max_wal.max(file_lens(&disk, "wal").iter().sum());
    }
    eprintln!(
        "runs {RUNS}: WAL written {total_written} B in all, max replayed at a start {max_replayed} B, \
         max WAL on disk {max_wal} B (threshold {threshold} B, segment {segment} B)"
    );
    assert!(
        total_written > 4 * threshold,
        "the loop must write several thresholds in all ({total_written})"
    );
    // docs/wal.md: the WAL replayed at a start is at most the threshold
    // plus what one run wrote after it (here < threshold).
    assert!(
        max_replayed <= 2 * threshold,
        "replay grew to {max_replayed} B (threshold {threshold} B)"
    );
    // The WAL kept reaches back to the older of two snapshots (two
    // thresholds plus a run), rounded up to segments, plus the pool of
    // spares (threshold / segment + 1), the open segment and one ahead.
    let bound = (3 * threshold).div_ceil(segment) * segment
        + (threshold / segment + 1) * segment
        + 3 * segment;
    assert!(
        max_wal <= bound,
        "WAL on disk grew to {max_wal} B (bound {bound} B)"
    );
}
