//! Disk use is bounded by live data (docs/wal.md, "Disk bounded by live
//! data"): after every run of a restart loop, a shard's WAL segments and
//! snapshots together stay within `2 × D + A`, where D is the live data as
//! a full snapshot holds it and A the stated allowance
//! (`checkpoint_wal_bytes + 3 × wal_segment_size`, plus the headers and
//! trailers of the kept snapshot files). Growing and overwritten sets,
//! graceful stops and crash-like halts mixed; every acknowledged write is
//! read back at each start.

mod common;

use bytes::Bytes;
use common::*;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::{Engine, Op};
use std::collections::BTreeMap;
use std::path::Path;
use tunables::Durability;

const RUNS: u64 = 16;
/// Keys each run writes, and their values' size.
const KEYS_PER_RUN: u64 = 40;
const VALUE_BYTES: usize = 1000;
/// What a snapshot adds per entry (its header) and per file (header and
/// trailer blocks).
const ENTRY_HEADER: u64 = 8;
const FILE_FRAMING: u64 = 8192;

fn value_of_run(k: u64, run: u64) -> Bytes {
    let mut v = format!("{k}:{run}:").into_bytes();
    v.resize(VALUE_BYTES, b'v');
    Bytes::from(v)
}

fn run_loop(seed: u64, growing: bool) {
    init_log();
    let disk = SimDisk::new(seed);
    let config = small_config(Path::new("/bound"), 1, Durability::Sync);
    let allowance =
        config.storage.checkpoint_wal_bytes.as_u64() + 3 * config.storage.wal_segment_size.as_u64();
    let mut model: BTreeMap<u64, u64> = BTreeMap::new();
    let mut worst = 0.0f64;
    let mut checkpoints = 0;
    for run in 0..RUNS {
        let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
        let h = engine.handle();
        let known: Vec<(u64, u64)> = model.iter().map(|(k, r)| (*k, *r)).collect();
        for part in known.chunks(400) {
            let got = h
                .batch_blocking(part.iter().map(|&(k, _)| get(k)).collect())
                .expect("gets");
            for ((k, r), got) in part.iter().zip(got) {
                assert_eq!(
                    value_of(&got),
                    Some(value_of_run(*k, *r)),
                    "run {run}, key {k}"
                );
            }
        }
        let first = if growing { run * KEYS_PER_RUN } else { 0 };
        for chunk in (first..first + KEYS_PER_RUN).collect::<Vec<_>>().chunks(8) {
            let ops = chunk
                .iter()
                .map(|&k| Op::Put {
                    key: key(k),
                    value: value_of_run(k, run),
                })
                .collect();
            h.batch_blocking(ops).expect("puts");
            for &k in chunk {
                model.insert(k, run);
            }
        }
        checkpoints += engine.metrics().shards[0].checkpoints;
        if run % 3 == 2 {
            engine.halt();
            disk.crash();
        } else {
            engine.shutdown().expect("shutdown");
        }
        let live: u64 = model
            .keys()
            .map(|&k| ENTRY_HEADER + key(k).len() as u64 + VALUE_BYTES as u64)
            .sum();
        let wal: u64 = file_lens(&disk, "wal").iter().sum();
        let snap_lens = file_lens(&disk, "snap");
        let (snaps, files) = (snap_lens.iter().sum::<u64>(), snap_lens.len() as u64);
        let bound = 2 * live + allowance + files * FILE_FRAMING;
        assert!(
            wal + snaps <= bound,
            "run {run} ({}): WAL {wal} + snapshots {snaps} ({files} files) = {} bytes \
             over the bound 2 × {live} + {allowance} + {files} × {FILE_FRAMING} = {bound}",
            if growing { "growing" } else { "overwrite" },
            wal + snaps
        );
        worst = worst.max((wal + snaps) as f64 / bound as f64);
    }
    // Overwrites meet the bound through checkpoints that ran, not by a
    // loop too short to need any. (A growing set needs none here: its WAL
    // is about its live data, within twice it.)
    assert!(
        growing || checkpoints > 0,
        "no checkpoint ran in {RUNS} runs"
    );
    eprintln!("disk_bound: growing={growing}: worst disk / bound = {worst:.2}");
}

#[test]
fn an_overwritten_set_stays_within_twice_live_plus_the_allowance() {
    run_loop(91, false);
}

#[test]
fn a_growing_set_stays_within_twice_live_plus_the_allowance() {
    run_loop(92, true);
}
