//! Damage that a crash cannot make is refused, not read as a torn write:
//! a used WAL segment cut short (`ShortSegment`), and a damaged last flush
//! that `wal.head`'s durable mark vouches for (`MarkedRecordsMissing`),
//! written at a clean stop and when the WAL goes idle. And the converse:
//! a flush torn above the mark is still a torn tail, so the mark never
//! refuses what a crash legitimately leaves.

mod common;

use common::*;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::io::{Disk, DiskFile};
use ringkv_engine::layout::ShardPaths;
use ringkv_engine::wal::format::{decode_segment_header, BLOCK_BYTES};
use ringkv_engine::wal::head::read_head;
use ringkv_engine::wal::recovery::{recover, RecoveryCase, RecoveryConfig};
use ringkv_engine::{Damage, Engine, EngineError, WalError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tunables::Durability;

const ROOT: &str = "/m";
const SEG: u64 = 64 * 1024;

fn paths() -> ShardPaths {
    ShardPaths::new(Path::new(ROOT), 0)
}

fn cfg() -> RecoveryConfig {
    RecoveryConfig {
        shard: 0,
        segment_bytes: SEG,
        dir_id: 0,
    }
}

fn config(mark_interval: Duration) -> tunables::Config {
    let mut c = small_config(Path::new(ROOT), 1, Durability::Sync);
    // No checkpoint: the log alone holds the data.
    c.storage.checkpoint_wal_bytes = tunables::ByteSize::mib(64);
    c.storage.wal_mark_interval = tunables::Duration::from_micros(mark_interval.as_micros() as u64);
    c
}

/// Writes 8 rounds of 64 keys (several segments) and returns the model.
fn write_rounds(engine: &Engine) -> BTreeMap<u64, u64> {
    let h = engine.handle();
    let mut model = BTreeMap::new();
    for version in 1..=8 {
        h.batch_blocking((0..64).map(|k| put(k, version)).collect())
            .expect("batch");
        for k in 0..64 {
            model.insert(k, version);
        }
    }
    model
}

/// The newest segment with a used header, and its flush layout: the
/// offset where its records end (the first zero block after data).
fn newest_used_segment(disk: &SimDisk) -> (PathBuf, u64) {
    let mut used: Vec<(u64, PathBuf, Vec<u8>)> = disk
        .list_dir(&paths().wal_dir)
        .expect("list")
        .into_iter()
        .filter_map(|p| {
            let bytes = disk.read_written(&p)?;
            match decode_segment_header(&bytes[..BLOCK_BYTES]) {
                Ok(Some(h)) if !h.is_prepared() => Some((h.seq, p, bytes)),
                _ => None,
            }
        })
        .collect();
    used.sort_by_key(|u| u.0);
    let (_, path, bytes) = used.pop().expect("a used segment");
    let end = bytes
        .chunks(BLOCK_BYTES)
        .rposition(|b| b.iter().any(|&x| x != 0))
        .map_or(0, |i| (i as u64 + 1) * BLOCK_BYTES as u64);
    (path, end)
}

fn refusal(err: &EngineError) -> (&Path, u64, &Damage) {
    match err.root() {
        EngineError::Wal(WalError::Corrupt {
            file,
            offset,
            reason,
        }) => (file, *offset, reason),
        other => panic!("expected WalError::Corrupt, got {other}"),
    }
}

/// Recovery refuses, and the case it names fired.
fn expect_refusal(disk: &SimDisk) -> (PathBuf, u64, Damage) {
    let err = block_on(recover(disk, &paths(), cfg()))
        .err()
        .expect("recovery must refuse");
    let (file, offset, reason) = refusal(&err);
    (file.to_path_buf(), offset, reason.clone())
}

fn marked_lsn(disk: &SimDisk) -> u64 {
    block_on(read_head(disk, &paths(), 0))
        .expect("head")
        .expect("a head file")
        .marked_lsn
}

#[test]
fn a_clean_stop_marks_every_record_durable() {
    let disk = SimDisk::new(1);
    let engine =
        Engine::open_with_disk(&config(Duration::from_secs(60)), disk.clone()).expect("open");
    let model = write_rounds(&engine);
    let last = engine.metrics().shards[0].current_lsn;
    engine.shutdown().expect("shutdown");
    assert_eq!(marked_lsn(&disk), last, "the mark covers the last record");
    let r = block_on(recover(&disk, &paths(), cfg())).expect("a clean directory opens");
    for (k, v) in model {
        let key = key(k);
        let got = r.tier.get(ringkv_engine::hash::fnv1a64(&key), &key);
        assert_eq!(got, Some(value(k, v)), "key {k}");
    }
}

#[test]
fn a_damaged_last_flush_after_a_clean_stop_refuses() {
    // Before the mark, this read as a torn write: recovery started and the
    // last flush's acknowledged writes were gone without an error.
    let disk = SimDisk::new(2);
    let engine =
        Engine::open_with_disk(&config(Duration::from_secs(60)), disk.clone()).expect("open");
    write_rounds(&engine);
    engine.shutdown().expect("shutdown");
    let (newest, end) = newest_used_segment(&disk);
    // 16 bytes inside the last block that holds records.
    assert!(disk.corrupt(&newest, end - 100, 16));
    let (file, _, reason) = expect_refusal(&disk);
    assert!(
        matches!(reason, Damage::MarkedRecordsMissing { .. }),
        "{reason}"
    );
    assert_eq!(file, newest, "names the segment where the log stops");
    assert!(reason.to_string().contains("durable mark"), "{reason}");
}

#[test]
fn an_idle_wal_is_marked_so_a_damaged_last_flush_refuses_after_a_crash() {
    let disk = SimDisk::new(3);
    let engine =
        Engine::open_with_disk(&config(Duration::from_millis(5)), disk.clone()).expect("open");
    write_rounds(&engine);
    let last = engine.metrics().shards[0].current_lsn;
    // The mark comes once the WAL has been idle for 5 ms; wait for it
    // (generously: this is not a timing test).
    let deadline = Instant::now() + Duration::from_secs(30);
    while marked_lsn(&disk) < last {
        assert!(Instant::now() < deadline, "no durable mark after 30 s idle");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(engine.metrics().shards[0].wal_marks >= 1);
    engine.halt();
    disk.crash();
    let (newest, end) = newest_used_segment(&disk);
    assert!(disk.corrupt(&newest, end - BLOCK_BYTES as u64, 8));
    let (_, _, reason) = expect_refusal(&disk);
    assert!(
        matches!(reason, Damage::MarkedRecordsMissing { marked_lsn, .. } if marked_lsn == last),
        "{reason}"
    );
}

#[test]
fn a_torn_flush_above_the_mark_is_still_a_torn_tail() {
    // Written after the last mark and never vouched for: damage there is
    // what a crash leaves, and recovery must still start.
    let disk = SimDisk::new(4);
    let engine =
        Engine::open_with_disk(&config(Duration::from_secs(60)), disk.clone()).expect("open");
    write_rounds(&engine);
    engine.shutdown().expect("shutdown");
    let marked = marked_lsn(&disk);
    let engine =
        Engine::open_with_disk(&config(Duration::from_secs(60)), disk.clone()).expect("reopen");
    engine
        .handle()
        .batch_blocking((0..8).map(|k| put(k, 9)).collect())
        .expect("batch");
    engine.halt();
    disk.crash();
    let (newest, end) = newest_used_segment(&disk);
    assert!(disk.corrupt(&newest, end - 100, 16));
    let r = block_on(recover(&disk, &paths(), cfg())).expect("a torn tail opens");
    assert!(r.cases.contains(&RecoveryCase::TornTail), "{:?}", r.cases);
    assert_eq!(
        r.last_lsn, marked,
        "everything the mark vouched for is there"
    );
}

#[test]
fn a_cut_segment_refuses_naming_its_size() {
    // No crash leaves a used segment short (they are created whole and
    // renamed), so the flushes the cut removed were durable.
    let disk = SimDisk::new(5);
    // A crash with no mark written: the cut must be caught on its own.
    let engine =
        Engine::open_with_disk(&config(Duration::from_secs(60)), disk.clone()).expect("open");
    write_rounds(&engine);
    engine.halt();
    disk.crash();
    let (newest, end) = newest_used_segment(&disk);
    let cut = end / 2 + 100;
    block_on(async {
        let f = disk.open(&newest, false).await.expect("open");
        f.set_len(cut).await.expect("cut");
        f.sync_data().await.expect("sync");
    });
    let (file, offset, reason) = expect_refusal(&disk);
    assert_eq!(file, newest);
    assert_eq!(offset, cut);
    assert_eq!(
        reason,
        Damage::ShortSegment {
            len: cut,
            created: SEG
        }
    );
}

#[test]
fn a_steady_load_is_marked_while_it_runs() {
    // No idle spell: the mark still follows the durable LSN, once per
    // `wal_mark_interval`, so what a crash can hide is bounded by time
    // whatever the load.
    let disk = SimDisk::new(6);
    let engine =
        Engine::open_with_disk(&config(Duration::from_millis(20)), disk.clone()).expect("open");
    let h = engine.handle();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (h, stop) = (h.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut version = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                version += 1;
                h.batch_blocking((0..8).map(|k| put(k, version)).collect())
                    .expect("batch");
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = 0;
    // Two marks that both moved while the writer kept writing.
    while seen < 2 {
        assert!(
            Instant::now() < deadline,
            "the mark did not move under load"
        );
        std::thread::sleep(Duration::from_millis(5));
        let marked = marked_lsn(&disk);
        if marked > 0 && marked < engine.metrics().shards[0].current_lsn {
            seen += 1;
            while marked_lsn(&disk) == marked {
                assert!(Instant::now() < deadline, "the mark stopped at {marked}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().expect("writer");
    engine.shutdown().expect("shutdown");
}
