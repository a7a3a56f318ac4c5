//! A fresh data directory prepares its WAL segments before the engine
//! reports ready, so its first write phase writes to the WAL device only
//! what the flushes carry: records, segment header, seals padding each
//! flush to a 4 KiB block, and the WAL head update of the first segment.
//! No zero-fill lands in the phase (docs/wal.md, "What a fresh server
//! costs the device").

mod common;

use bytes::Bytes;
use common::*;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::wal::format::{record_size, BLOCK_BYTES, SEAL_RESERVE_BYTES};
use ringkv_engine::{Engine, Op};
use std::path::Path;
use std::time::Instant;
use tunables::{ByteSize, Durability};

const ITEMS: u64 = 10_000;
const BATCH: u64 = 100;

#[test]
fn first_write_phase_writes_records_plus_alignment_only() {
    init_log();
    let disk = SimDisk::new(5);
    let mut config = small_config(Path::new("/fresh"), 1, Durability::Sync);
    // Segments big enough that a zero-fill would dwarf the phase's bytes.
    config.storage.wal_segment_size = ByteSize::mib(16);
    config.storage.group_commit_max_bytes = ByteSize::kib(256);
    config.storage.checkpoint_wal_bytes = ByteSize::mib(64);
    config.limits.ops_per_frame_max = BATCH as u32;
    config
        .devices
        .get_mut("wal")
        .expect("default wal device")
        .profile = "nvme".to_string();
    let engine = Engine::open_with_disk(&config, disk).expect("open");
    let before = engine.metrics();
    let h = engine.handle();
    let started = Instant::now();
    let mut payload = 0u64;
    for b in 0..ITEMS / BATCH {
        let ops = (b * BATCH..(b + 1) * BATCH)
            .map(|i| {
                let key = Bytes::copy_from_slice(&i.to_le_bytes());
                let value = Bytes::from(vec![(i % 251) as u8; 32]);
                payload += record_size(key.len(), value.len()) as u64;
                Op::Put { key, value }
            })
            .collect();
        h.batch_blocking(ops).expect("batch");
    }
    let elapsed = started.elapsed();
    let after = engine.metrics();
    let (d0, d1) = (&before.devices[0].io, &after.devices[0].io);
    let bytes = d1.bytes_written - d0.bytes_written;
    let flushes = after.shards[0].wal_flushes - before.shards[0].wal_flushes;
    let wait_ms = (d1.wait_ns_total - d0.wait_ns_total) / 1_000_000;
    // Records, plus per flush at most one seal padding it to a block, plus
    // the segment header block and one WAL head slot (the first segment).
    let bound =
        payload + flushes * (BLOCK_BYTES + SEAL_RESERVE_BYTES) as u64 + 2 * BLOCK_BYTES as u64;
    eprintln!(
        "{ITEMS} puts of 8 B keys and 32 B values in batches of {BATCH}: {flushes} flushes, \
         payload {payload} B, WAL device wrote {bytes} B ({:.2} x payload, bound {bound} B), \
         token wait {wait_ms} ms, phase {} ms",
        bytes as f64 / payload as f64,
        elapsed.as_millis()
    );
    assert!(flushes > 0);
    assert!(
        bytes <= bound,
        "the first write phase wrote {bytes} B to the WAL device; records plus alignment allow {bound} B"
    );
    // Segment preparation happened before ready: the open segment and one spare.
    assert!(
        before.devices[0].io.bytes_written >= 2 * config.storage.wal_segment_size.as_u64(),
        "both segments were prepared before ready"
    );
    engine.shutdown().expect("shutdown");
}
