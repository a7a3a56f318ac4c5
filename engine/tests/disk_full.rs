//! A disk that fills up, on a small ext4 file system this test creates
//! (a loop-mounted image; skipped, saying so, where mounting is not
//! permitted). While the disk is full, writes answer POISONED and reads
//! keep working; nothing acknowledged is lost; no partial segment is left
//! behind; the engine restarts on the full disk (serving reads), and once
//! the free space docs/config.md asks for is there, writes work again.

mod common;
#[path = "common/small_fs.rs"]
mod small_fs;

use bytes::Bytes;
use common::*;
use ringkv_engine::{Engine, EngineError, Op, OpError, OpResult};
use small_fs::mount_small_fs;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tunables::{ByteSize, Durability};

const IMAGE_MIB: u64 = 64;
const SEGMENT_MIB: u64 = 4;
const BALLAST_MIB: u64 = 12;

fn config(data: &Path) -> tunables::Config {
    let mut c = small_config(data, 1, Durability::Sync);
    c.storage.wal_segment_size = ByteSize::mib(SEGMENT_MIB);
    c.storage.group_commit_max_bytes = ByteSize::kib(256);
    // No checkpoint: the WAL alone fills the disk.
    c.storage.checkpoint_wal_bytes = ByteSize::gib(1);
    c
}

fn put_big(i: u64, version: u64) -> Op {
    let mut v = value(i, version).to_vec();
    v.resize(1800, b'#');
    Op::Put {
        key: key(i),
        value: Bytes::from(v),
    }
}

/// The small file system, with ballast the test frees later to give the
/// restart its space back; `None` (the test skips, saying so) where
/// mounting is not permitted.
fn full_disk_fs(name: &str) -> Option<(small_fs::Mounted, PathBuf)> {
    let fs = match mount_small_fs(name, IMAGE_MIB) {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("SKIPPED: cannot mount a small file system here ({why})");
            return None;
        }
    };
    let ballast = fs.path().join("ballast");
    std::fs::write(&ballast, vec![1u8; (BALLAST_MIB << 20) as usize]).expect("ballast");
    Some((fs, ballast))
}

/// Frees the ballast (the space docs/config.md asks for: two segments per
/// shard) and restarts: nothing acknowledged is lost, writes work again,
/// and they are there after a reopen.
fn free_space_and_write_again(
    config: &tunables::Config,
    root: &Path,
    ballast: &Path,
    model: &mut BTreeMap<u64, u64>,
) {
    std::fs::remove_file(ballast).expect("free space");
    // ext4 reuses a deleted file's blocks only once the journal committed
    // the removal: fsync the directory so the space is free now.
    std::fs::File::open(root)
        .and_then(|d| d.sync_all())
        .expect("fsync the directory");
    let engine = Engine::open(config).expect("restart with space");
    check_all_versions(&engine, model);
    let h = engine.handle();
    let results = h
        .batch_blocking((0..50).map(|k| put(k, 1_000_000)).collect())
        .expect("batch");
    assert!(
        results.iter().all(|r| matches!(r, OpResult::Ok)),
        "writes work again: {:?}",
        results.iter().find(|r| !matches!(r, OpResult::Ok))
    );
    for k in 0..50 {
        model.insert(k, 1_000_000);
    }
    engine.shutdown().expect("clean shutdown");
    let engine = Engine::open(config).expect("reopen");
    check_all_versions(&engine, model);
    engine.shutdown().expect("shutdown");
}

#[test]
fn disk_full_poisons_writes_keeps_data_and_restarts() {
    init_log();
    let Some((fs, ballast)) = full_disk_fs("ringkv-disk-full") else {
        return;
    };
    let root = fs.path().to_path_buf();
    let data = root.join("data");
    let config = config(&data);

    // 1. Fill the disk with acknowledged writes until writes are refused.
    let engine = Engine::open(&config).expect("open");
    let h = engine.handle();
    let mut model: BTreeMap<u64, u64> = BTreeMap::new();
    let mut poisoned = false;
    for round in 0..10_000u64 {
        let keys: Vec<u64> = (0..100).map(|j| (round * 100 + j) % 20_000).collect();
        let ops = keys.iter().map(|&k| put_big(k, round + 1)).collect();
        let results = h.batch_blocking(ops).expect("batch");
        for (k, r) in keys.iter().zip(&results) {
            match r {
                OpResult::Ok => {
                    model.insert(*k, round + 1);
                }
                OpResult::Err(OpError::Poisoned { .. }) => poisoned = true,
                other => panic!("unexpected answer {other:?}"),
            }
        }
        if poisoned {
            break;
        }
    }
    assert!(poisoned, "the disk never filled up");
    assert!(!model.is_empty());
    // Reads still work, and see every acknowledged write.
    check_all_versions(&engine, &model);
    let m = engine.metrics().shards[0].clone();
    assert!(m.poisoned);
    match engine.shutdown() {
        Err(EngineError::PoisonedAtShutdown { .. }) => {}
        other => panic!("shutdown of a poisoned engine: {other:?}"),
    }

    // 2. No partial segment left: every file in the WAL directory is a
    //    whole segment. A creation cut short by the shutdown may leave one
    //    `.wal.tmp` (like a crash would); the next start removes it.
    let wal_dir = data.join("shard-000").join("wal");
    let list_wal = || {
        std::fs::read_dir(&wal_dir)
            .expect("wal dir")
            .map(|e| e.expect("entry").path())
            .collect::<Vec<_>>()
    };
    check_no_partial_segment(&list_wal());

    // 3. Restart on the full disk: it starts and serves reads.
    let engine = Engine::open(&config).expect("a start on a full disk still works");
    check_all_versions(&engine, &model);
    let _ = engine.shutdown();
    check_no_partial_segment(&list_wal());

    // 4. Free space, restart: writes work again.
    free_space_and_write_again(&config, &root, &ballast, &mut model);
}

/// Every key of `model` reads its acknowledged version or a newer one (a
/// refused, POISONED write's outcome is unknown: it may be visible; never
/// an older version than acknowledged).
fn check_all_versions(engine: &Engine, model: &BTreeMap<u64, u64>) {
    let h = engine.handle();
    let keys: Vec<u64> = model.keys().copied().collect();
    for chunk in keys.chunks(400) {
        let got = h
            .batch_blocking(chunk.iter().map(|&k| get(k)).collect())
            .expect("reads work");
        for (k, r) in chunk.iter().zip(got) {
            let v = value_of(&r).expect("acknowledged key present");
            let version = parse_value(&v).map_or(0, |(_, ver)| ver);
            assert!(
                version >= model[k],
                "key {k}: version {version} < {}",
                model[k]
            );
        }
    }
}

/// Every `.wal` file is a whole segment; at most one unfinished creation
/// (`.wal.tmp`) exists, so failed attempts do not pile up.
fn check_no_partial_segment(files: &[PathBuf]) {
    let mut unfinished = 0;
    for p in files {
        let len = std::fs::metadata(p).expect("stat").len();
        if p.to_string_lossy().ends_with(".wal.tmp") {
            unfinished += 1;
            continue;
        }
        assert!(
            p.extension().is_some_and(|e| e == "wal") && len == SEGMENT_MIB << 20,
            "{} ({len} B) is not a whole segment",
            p.display()
        );
    }
    assert!(
        unfinished <= 1,
        "{unfinished} unfinished segments: {files:?}"
    );
}

/// The same on the hybrid tier: a small key set overwritten, so GC moves
/// records and starts value segments while the disk fills; whichever of
/// GC, a put's value segment or the WAL meets ENOSPC first poisons the
/// shard. Nothing acknowledged is lost, the engine starts on the full disk
/// and serves reads, and with space back writes work again.
#[test]
fn disk_full_on_the_hybrid_tier_poisons_writes_keeps_data_and_restarts() {
    init_log();
    let Some((fs, ballast)) = full_disk_fs("ringkv-disk-full-hybrid") else {
        return;
    };
    let root = fs.path().to_path_buf();
    let data = root.join("data");
    let mut config = config(&data);
    config.storage.tier = tunables::Tier::Hybrid;
    config.storage.value_segment_size = ByteSize::mib(1);
    config.storage.cache_bytes = ByteSize::kib(64);
    config.storage.index_keys = 8192;
    config.storage.gc_garbage_percent = 10;

    let engine = Engine::open(&config).expect("open");
    let h = engine.handle();
    let mut model: BTreeMap<u64, u64> = BTreeMap::new();
    let mut poisoned = false;
    let mut refused = std::collections::BTreeSet::new();
    for round in 0..10_000u64 {
        let keys: Vec<u64> = (0..100).map(|j| (round * 100 + j) % 3_000).collect();
        let ops = keys.iter().map(|&k| put_big(k, round + 1)).collect();
        for (k, r) in keys.iter().zip(&h.batch_blocking(ops).expect("batch")) {
            match r {
                OpResult::Ok => {
                    model.insert(*k, round + 1);
                }
                OpResult::Err(OpError::Poisoned { .. }) => {
                    poisoned = true;
                    refused.insert(*k);
                }
                other => panic!("unexpected answer {other:?}"),
            }
        }
        if poisoned {
            break;
        }
        // GC runs between requests: give it time to meet the full disk.
        if round % 20 == 19 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    assert!(poisoned, "the disk never filled up");
    let m = engine.metrics().shards[0].clone();
    assert!(m.poisoned);
    let gc = m.hybrid.expect("hybrid stats");
    assert!(
        gc.gc_runs > 0,
        "GC never ran before the disk filled: {gc:?}"
    );
    check_while_poisoned(&engine, &model, &refused);
    match engine.shutdown() {
        Err(EngineError::PoisonedAtShutdown { .. }) => {}
        other => panic!("shutdown of a poisoned engine: {other:?}"),
    }

    let engine = Engine::open(&config).expect("a start on a full disk still works");
    check_all_versions(&engine, &model);
    let _ = engine.shutdown();
    free_space_and_write_again(&config, &root, &ballast, &mut model);
}

/// Reads on the poisoned hybrid tier: every acknowledged key reads its
/// acknowledged version or a newer one, except that a key whose last
/// write was refused (its record never reached the value segments) may
/// answer an error instead: the tier will not answer the older version
/// it still has, and the WAL replay at restart decides.
fn check_while_poisoned(
    engine: &Engine,
    model: &BTreeMap<u64, u64>,
    refused: &std::collections::BTreeSet<u64>,
) {
    let h = engine.handle();
    let keys: Vec<u64> = model.keys().copied().collect();
    let mut errors = 0;
    for chunk in keys.chunks(400) {
        let got = h
            .batch_blocking(chunk.iter().map(|&k| get(k)).collect())
            .expect("reads work");
        for (k, r) in chunk.iter().zip(got) {
            match (value_of(&r), refused.contains(k)) {
                (Some(v), _) => {
                    let version = parse_value(&v).map_or(0, |(_, ver)| ver);
                    assert!(
                        version >= model[k],
                        "key {k}: version {version} < {}",
                        model[k]
                    );
                }
                (None, true) if matches!(r, OpResult::Err(_)) => errors += 1,
                (None, _) => panic!("acknowledged key {k}: {r:?}"),
            }
        }
    }
    assert!(errors <= refused.len());
}
