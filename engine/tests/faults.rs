//! Injected I/O faults: a failed WAL write or fdatasync poisons the shard
//! (waiting and later writes answer `Poisoned`, reads go on, the fdatasync
//! is never retried), shutdown reports it, and a restart recovers what was
//! durable.

mod common;

use common::*;
use ringkv_engine::io::sim::{SimDisk, SimFaults};
use ringkv_engine::{Engine, EngineError, Op, OpError, OpResult};
use std::path::Path;
use std::time::{Duration, Instant};
use tunables::Durability;

fn config() -> tunables::Config {
    let mut c = small_config(Path::new("/f"), 1, Durability::Sync);
    // No checkpoints in these tests: only the WAL writes and syncs.
    c.storage.checkpoint_wal_bytes = tunables::ByteSize::mib(64);
    c
}

/// Opens the engine and waits until the spare segment exists, so the only
/// file the next WAL I/O touches is the active segment.
fn open_settled(disk: &SimDisk) -> Engine {
    let engine = Engine::open_with_disk(&config(), disk.clone()).expect("open");
    let deadline = Instant::now() + Duration::from_secs(20);
    while disk.file_len(Path::new("/f/shard-000/wal/00000000000000000002.wal")) != Some(64 * 1024)
        || disk.stats().syncs < 3
    {
        assert!(Instant::now() < deadline, "spare segment never created");
        std::thread::sleep(Duration::from_millis(1));
    }
    engine
}

const ACTIVE: &str = "00000000000000000001.wal";

fn poisoned(shard: usize) -> OpResult {
    OpResult::Err(OpError::Poisoned { shard })
}

fn check_poisoning(faults: SimFaults) {
    let disk = SimDisk::new(21);
    let engine = open_settled(&disk);
    let h = engine.handle();
    let acked: Vec<Op> = (0..10).map(|i| put(i, 1)).collect();
    assert!(h
        .batch_blocking(acked)
        .expect("batch")
        .iter()
        .all(|a| *a == OpResult::Ok));

    disk.set_faults(SimFaults {
        path_filter: Some(ACTIVE.to_string()),
        ..faults
    });
    let before = disk.stats();
    // The batch whose flush fails: its writes answer Poisoned, its read works.
    let answers = h
        .batch_blocking(vec![put(20, 1), get(3), del(4)])
        .expect("batch");
    assert_eq!(answers[0], poisoned(0));
    assert_eq!(value_of(&answers[1]), Some(value(3, 1)));
    assert_eq!(answers[2], poisoned(0));
    let m = engine.metrics();
    assert!(m.shards[0].poisoned);
    let after_failure = disk.stats();

    // Later writes are refused at once; reads go on; nothing is retried.
    for round in 0..5 {
        let answers = h
            .batch_blocking(vec![put(30 + round, 1), get(5), del(6)])
            .expect("batch");
        assert_eq!(answers[0], poisoned(0));
        assert_eq!(value_of(&answers[1]), Some(value(5, 1)));
        assert_eq!(answers[2], poisoned(0));
    }
    let later = disk.stats();
    assert_eq!(
        later.syncs, after_failure.syncs,
        "no fdatasync after the failure"
    );
    assert_eq!(
        later.injected_sync_errors + later.injected_write_errors,
        after_failure.injected_sync_errors + after_failure.injected_write_errors,
        "the failed operation was not retried"
    );
    assert_eq!(
        later.writes, after_failure.writes,
        "no WAL write after the failure"
    );
    assert!(
        after_failure.injected_sync_errors + after_failure.injected_write_errors
            > before.injected_sync_errors + before.injected_write_errors
    );

    // Shutdown reports the poisoning; a restart recovers what was durable.
    match engine.shutdown() {
        Err(EngineError::PoisonedAtShutdown { shard: 0 }) => {}
        other => panic!("shutdown must report the poisoning, got {other:?}"),
    }
    disk.set_faults(SimFaults::default());
    let engine = Engine::open_with_disk(&config(), disk.clone()).expect("reopen");
    let answers = engine
        .handle()
        .batch_blocking((0..10).map(get).collect())
        .expect("batch");
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(
            value_of(a),
            Some(value(i as u64, 1)),
            "acknowledged key {i}"
        );
    }
    // The shard takes writes again after the restart.
    assert_eq!(
        engine
            .handle()
            .batch_blocking(vec![put(50, 1)])
            .expect("batch"),
        vec![OpResult::Ok]
    );
    engine.shutdown().expect("shutdown");
}

#[test]
fn failed_fdatasync_poisons_the_shard() {
    check_poisoning(SimFaults {
        fail_sync_after: Some(0),
        ..SimFaults::default()
    });
}

#[test]
fn failed_write_poisons_the_shard() {
    check_poisoning(SimFaults {
        fail_write_after: Some(0),
        ..SimFaults::default()
    });
}

#[test]
fn poisoning_one_shard_leaves_the_others_writing() {
    let disk = SimDisk::new(22);
    let mut config = config();
    config.shards = 2;
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    let h = engine.handle();
    // Wait for both spares, then fail syncs of shard 0's active segment only.
    let deadline = Instant::now() + Duration::from_secs(20);
    while (0..2).any(|s| {
        disk.file_len(Path::new(&format!(
            "/f/shard-{s:03}/wal/00000000000000000002.wal"
        ))) != Some(64 * 1024)
    }) {
        assert!(Instant::now() < deadline, "spares never created");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(20));
    disk.set_faults(SimFaults {
        fail_sync_after: Some(0),
        path_filter: Some(format!("shard-000/wal/{ACTIVE}")),
        ..SimFaults::default()
    });
    let keys: Vec<u64> = (0..40).collect();
    let answers = h
        .batch_blocking(keys.iter().map(|&k| put(k, 1)).collect())
        .expect("batch");
    for (&k, a) in keys.iter().zip(&answers) {
        match h.shard_of(&key(k)) {
            0 => assert_eq!(*a, poisoned(0), "key {k}"),
            _ => assert_eq!(*a, OpResult::Ok, "key {k}"),
        }
    }
    let m = engine.metrics();
    assert!(m.shards[0].poisoned && !m.shards[1].poisoned);
    assert!(engine.shutdown().is_err());
}
