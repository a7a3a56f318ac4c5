//! Values larger than one flush buffer are logged as chunk chains
//! (`docs/wal.md`, "Chunk chains"). On the simulated disk, a write of a
//! 300 KiB value (a 16 KiB group-commit buffer, 64 KiB WAL segments: some
//! 40 chunks over several segments, with checkpoints due during the chain)
//! is cut by a failed WAL write at every write it makes, then the disk
//! crashes (unsynced writes dropped, the last block torn). After each cut
//! the key holds either its old value or the whole new one, never a part,
//! and an acknowledged write always holds the new one; the log then goes
//! on past the dropped chain and survives another restart. The cut points
//! cover every chunk boundary: the crash images hold 0, 1, 2, ... chunks of
//! the chain without its end. Both tiers.

mod common;

use bytes::Bytes;
use common::*;
use ringkv_engine::io::sim::{SimDisk, SimFaults};
use ringkv_engine::wal::format::{decode_record, Decoded, RecordKind, SEGMENT_DATA_OFFSET};
use ringkv_engine::{Engine, Op, OpResult};
use std::collections::BTreeSet;
use std::path::Path;
use tunables::{ByteSize, Config, Durability};

const BIG_BYTES: usize = 300 * 1024;

fn chain_config(hybrid: bool) -> Config {
    let mut c = small_config(Path::new("/chains"), 1, Durability::Sync);
    c.limits.value_bytes_max = ByteSize::kib(512);
    if hybrid {
        c.storage.tier = tunables::Tier::Hybrid;
        c.storage.value_segment_size = ByteSize::mib(1);
        c.storage.cache_bytes = ByteSize::kib(16);
        c.storage.index_keys = 1024;
    }
    c
}

fn big_key() -> Bytes {
    Bytes::from_static(b"the-big-one")
}

/// A value no shorter prefix or other chain could be mistaken for.
fn big_value() -> Bytes {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..BIG_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

fn old_value() -> Bytes {
    Bytes::from_static(b"old value")
}

/// Chunk records and chain ends in the durable WAL images, and the chunk
/// counts at which a flush starts (the points a crash may cut the chain).
fn chain_records_on_disk(disk: &SimDisk) -> (u64, u64, BTreeSet<u64>) {
    let (mut chunks, mut ends) = (0, 0);
    let mut flush_starts = BTreeSet::new();
    for path in disk.files() {
        if path.extension().is_none_or(|e| e != "wal") {
            continue;
        }
        let Some(bytes) = disk.read_durable(&path) else {
            continue;
        };
        let mut pos = SEGMENT_DATA_OFFSET as usize;
        while pos < bytes.len() {
            let Ok(Decoded::Record(r)) = decode_record(&bytes[pos..], bytes.len() - pos) else {
                break;
            };
            if r.is_first() {
                flush_starts.insert(chunks);
            }
            match r.kind {
                RecordKind::Chunk => chunks += 1,
                RecordKind::Put if r.chain_first_lsn.is_some() => ends += 1,
                _ => {}
            }
            pos += r.size;
        }
    }
    (chunks, ends, flush_starts)
}

fn read(h: &ringkv_engine::Handle, key: Bytes) -> Option<Bytes> {
    let answers = h
        .batch_blocking(vec![Op::Get { key }])
        .expect("read refused");
    match &answers[0] {
        OpResult::Value(v) => Some(v.clone()),
        OpResult::NotFound => None,
        other => panic!("unexpected answer {other:?}"),
    }
}

fn check_small_keys(h: &ringkv_engine::Handle, version: u64, what: &str) {
    for i in 0..8 {
        let got = read(h, key(i));
        assert_eq!(got, Some(value(i, version)), "{what}: small key {i}");
    }
}

/// How a cut is made.
#[derive(Clone, Copy, Debug)]
enum Cut {
    None,
    /// The Nth WAL write from the big write's start fails.
    Write(u64),
    /// The Nth WAL fdatasync fails (the file's unsynced data is dropped).
    Sync(u64),
}

/// One cut: a WAL write or sync fails during the big write, the disk
/// crashes. Returns (acknowledged, chunks on disk, the big
/// key's value held after recovery is the new one, the chunk counts at
/// which the chain's flushes start).
fn cut_at(hybrid: bool, cut: Cut) -> (bool, u64, bool, BTreeSet<u64>) {
    let mut config = chain_config(hybrid);
    // No checkpoint during the big write: its segments stay live (none is
    // retired and removed), so the chunks counted on disk are the chain's.
    config.storage.checkpoint_wal_bytes = ByteSize::mib(2);
    let disk = SimDisk::new(match cut {
        Cut::None => 0,
        Cut::Write(n) => 1 + 2 * n,
        Cut::Sync(n) => 2 + 2 * n,
    });
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    let h = engine.handle();
    let mut before: Vec<Op> = (0..8).map(|i| put(i, 1)).collect();
    before.push(Op::Put {
        key: big_key(),
        value: old_value(),
    });
    let answers = h.batch_blocking(before).expect("first writes");
    assert!(answers.iter().all(|a| *a == OpResult::Ok), "{answers:?}");
    disk.set_faults(SimFaults {
        fail_write_after: match cut {
            Cut::Write(n) => Some(n),
            _ => None,
        },
        fail_sync_after: match cut {
            Cut::Sync(n) => Some(n),
            _ => None,
        },
        path_filter: Some(".wal".to_string()),
        ..SimFaults::default()
    });
    let put_big = Op::Put {
        key: big_key(),
        value: big_value(),
    };
    let acked = matches!(
        h.batch_blocking(vec![put_big]).as_deref(),
        Ok([OpResult::Ok])
    );
    if matches!(cut, Cut::None) {
        assert!(acked, "the write without a fault is acknowledged");
        assert_eq!(read(&h, big_key()), Some(big_value()));
    }
    engine.halt();
    disk.crash();
    let (chunks, _ends, flush_starts) = chain_records_on_disk(&disk);

    disk.set_faults(SimFaults::default());
    let what = format!("cut at WAL write {cut:?}");
    let engine = Engine::open_with_disk(&config, disk.clone())
        .unwrap_or_else(|e| panic!("{what}: recovery refused: {e}"));
    let h = engine.handle();
    let got = read(&h, big_key());
    let whole = got.as_ref() == Some(&big_value());
    assert!(
        whole || got == Some(old_value()),
        "{what}: the big key holds {} bytes, neither the old value nor the whole new one",
        got.map_or(0, |v| v.len())
    );
    assert!(
        !acked || whole,
        "{what}: an acknowledged value is lost or partial"
    );
    check_small_keys(&h, 1, &what);

    // The log goes on after the dropped chain (a Put follows its chunks),
    // and the next recovery reads past it.
    let answers = h
        .batch_blocking((0..8).map(|i| put(i, 2)).collect())
        .expect("writes after recovery");
    assert!(
        answers.iter().all(|a| *a == OpResult::Ok),
        "{what}: {answers:?}"
    );
    engine.shutdown().expect("shutdown");
    let engine = Engine::open_with_disk(&config, disk.clone())
        .unwrap_or_else(|e| panic!("{what}: second recovery refused: {e}"));
    let h = engine.handle();
    check_small_keys(&h, 2, &what);
    assert_eq!(
        read(&h, big_key()).as_ref() == Some(&big_value()),
        whole,
        "{what}: second restart changed the big key"
    );
    engine.shutdown().expect("shutdown");
    (acked, chunks, whole, flush_starts)
}

fn tear_at_every_chunk_boundary(hybrid: bool) {
    // The chain on disk when nothing fails: its length, and where its
    // flushes start.
    let (_, full_chunks, whole, flush_starts) = cut_at(hybrid, Cut::None);
    assert!(whole);
    assert!(
        full_chunks >= 20,
        "a 300 KiB value over 16 KiB flushes is a chain of many chunks, found {full_chunks}"
    );
    let boundaries: Vec<u64> = flush_starts
        .into_iter()
        .filter(|&c| c <= full_chunks)
        .collect();
    assert!(boundaries.len() >= 20, "{boundaries:?}");
    let mut torn_with: BTreeSet<u64> = BTreeSet::new();
    let mut cuts = 0u64;
    // Every WAL write and every sync the big write makes (a chain of N
    // flushes makes about N of each, plus those of segment creation, whose
    // failures are retried rather than fatal).
    let points = 2 * boundaries.len() as u64 + 16;
    for make in [Cut::Write as fn(u64) -> Cut, Cut::Sync] {
        for n in 0..points {
            let (_acked, chunks, whole, _) = cut_at(hybrid, make(n));
            cuts += 1;
            if !whole {
                torn_with.insert(chunks);
            }
        }
    }
    let cut = cuts;
    let missing: Vec<u64> = boundaries
        .iter()
        .copied()
        .filter(|c| !torn_with.contains(c))
        .collect();
    assert!(
        missing.is_empty(),
        "no cut left the chain torn after {missing:?} chunks (cuts made: {cut}, torn after: {torn_with:?}, flush boundaries: {boundaries:?})"
    );
}

#[test]
fn memory_tier_a_torn_chain_is_all_or_nothing_at_every_chunk_boundary() {
    tear_at_every_chunk_boundary(false);
}

#[test]
fn hybrid_tier_a_torn_chain_is_all_or_nothing_at_every_chunk_boundary() {
    tear_at_every_chunk_boundary(true);
}

/// A chained value survives checkpoints (the snapshot holds it) and
/// restarts, together with the writes around it; checkpoints taken while a
/// chain is being logged never claim part of it.
fn chains_across_checkpoints(hybrid: bool) {
    let config = chain_config(hybrid);
    let disk = SimDisk::new(7);
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    let h = engine.handle();
    for round in 0..4u64 {
        let mut v = big_value().to_vec();
        v[0] = round as u8;
        let ops = vec![
            put(round, 1),
            Op::Put {
                key: big_key(),
                value: Bytes::from(v),
            },
            put(round + 10, 1),
        ];
        let answers = h.batch_blocking(ops).expect("writes");
        assert!(answers.iter().all(|a| *a == OpResult::Ok), "{answers:?}");
    }
    // The checkpointer runs beside the writes: give it a moment to finish.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while engine.metrics().shards[0].checkpoints == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let m = &engine.metrics().shards[0];
    assert!(
        m.checkpoints >= 1,
        "1.2 MiB of chains over a 128 KiB checkpoint threshold takes checkpoints ({})",
        m.checkpoints
    );
    engine.halt();
    disk.crash();
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("recovery");
    let h = engine.handle();
    let mut want = big_value().to_vec();
    want[0] = 3;
    assert_eq!(read(&h, big_key()).as_deref(), Some(&want[..]));
    for round in 0..4 {
        assert_eq!(read(&h, key(round)), Some(value(round, 1)));
        assert_eq!(read(&h, key(round + 10)), Some(value(round + 10, 1)));
    }
    engine.shutdown().expect("shutdown");
}

#[test]
fn memory_tier_chains_survive_checkpoints_and_crashes() {
    chains_across_checkpoints(false);
}

#[test]
fn hybrid_tier_chains_survive_checkpoints_and_crashes() {
    chains_across_checkpoints(true);
}

/// The offline verify on a real directory: it follows a chain across
/// segments and counts it whole; with the flush holding the chain's end
/// torn off, it reports the torn flush and the unfinished chain (which the
/// trial open drops); with the end record naming other chunks (checksum
/// recomputed, so only the chain rule can see it), it reports a broken
/// chain at that flush, and recovery refuses.
#[test]
fn verify_follows_chains_and_reports_broken_ones() {
    use ringkv_engine::inspect::{examine, trial_open, Depth, OverlayDisk};
    use ringkv_engine::wal::format::{chain_end_size, encode_chain_end};

    let dir = tempfile::tempdir().unwrap();
    let mut config = chain_config(false);
    config.storage.data_dir = dir.path().to_path_buf();
    config.storage.checkpoint_wal_bytes = ByteSize::mib(64);
    // A crash-like stop with no durable mark: the tail this test tears
    // must read as what a crash leaves (after a clean stop it is damage).
    config.storage.wal_mark_interval = tunables::Duration::from_secs(60);
    let engine = Engine::open(&config).expect("open");
    let h = engine.handle();
    let ops = vec![
        put(1, 1),
        Op::Put {
            key: big_key(),
            value: big_value(),
        },
    ];
    assert!(h
        .batch_blocking(ops)
        .unwrap()
        .iter()
        .all(|a| *a == OpResult::Ok));
    engine.halt();

    let report = examine(&config, Depth::Full);
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    let chains = &report.shards[0].chunk_chains;
    assert_eq!((chains.whole, chains.unfinished), (1, None));

    // Find the chain's end record and the flush it starts in.
    let wal_dir = dir.path().join("shard-000").join("wal");
    let mut end_at = None;
    let mut segs: Vec<_> = std::fs::read_dir(&wal_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    segs.sort();
    for path in &segs {
        let bytes = std::fs::read(path).unwrap();
        let mut pos = SEGMENT_DATA_OFFSET as usize;
        let mut flush_start = pos;
        while pos < bytes.len() {
            let Ok(Decoded::Record(r)) = decode_record(&bytes[pos..], bytes.len() - pos) else {
                break;
            };
            if r.is_first() {
                flush_start = pos;
            }
            if let Some(first) = r.chain_first_lsn {
                end_at = Some((path.clone(), flush_start, pos, r.lsn, first, r.key.to_vec()));
            }
            pos += r.size;
        }
    }
    let (path, flush_start, pos, lsn, first, key_bytes) = end_at.expect("a chain end on disk");
    let original = std::fs::read(&path).unwrap();

    // The end's flush torn off (zeroes from its start).
    let mut torn = original.clone();
    for b in &mut torn[flush_start..] {
        *b = 0;
    }
    torn[flush_start] = 0xAB; // not zero: a torn write, not a clean end
    std::fs::write(&path, &torn).unwrap();
    let report = examine(&config, Depth::Full);
    let chains = &report.shards[0].chunk_chains;
    let unfinished = chains.unfinished.expect("an unfinished chain is reported");
    assert_eq!(unfinished.first_lsn, first);
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.to_string().contains("torn flush")),
        "{:#?}",
        report.problems
    );
    trial_open(&config, OverlayDisk::new()).expect("recovery drops the unfinished chain");

    // The end record names chunks that are not right before it.
    let mut broken = original.clone();
    let size = chain_end_size(key_bytes.len(), 0, None);
    encode_chain_end(
        &mut broken[pos..pos + size],
        lsn,
        1,
        0,
        &key_bytes,
        b"",
        None,
        first + 1,
    );
    std::fs::write(&path, &broken).unwrap();
    let report = examine(&config, Depth::Full);
    let found = report
        .problems
        .iter()
        .find(|p| p.to_string().contains("chunk chain ending at LSN"))
        .unwrap_or_else(|| panic!("no broken-chain problem: {:#?}", report.problems));
    assert_eq!(found.offset, Some(flush_start as u64), "{found}");
    let refused = trial_open(&config, OverlayDisk::new()).expect_err("recovery refuses");
    assert!(refused.to_string().contains("chunk chain"), "{refused}");
}
