//! End-to-end behaviour of the engine on the simulated disk: batches across
//! shards, answers in op order, limits, reopen after shutdown, the durability
//! modes, metrics, and the manifest's shard-count rule.

mod common;

use bytes::Bytes;
use common::*;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::{Engine, EngineError, ManifestError, Op, OpError, OpResult};
use std::path::Path;
use tunables::Durability;

#[test]
fn batches_across_shards_answer_in_order_and_survive_reopen() {
    init_log();
    let disk = SimDisk::new(7);
    let dir = Path::new("/data");
    let config = small_config(dir, 3, Durability::Sync);
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    assert_eq!(engine.shard_count(), 3);
    let h = engine.handle();
    for round in 0..10u64 {
        let ops: Vec<Op> = (0..100).map(|i| put(round * 100 + i, 1)).collect();
        let answers = h.batch_blocking(ops).expect("batch");
        assert!(answers.iter().all(|a| *a == OpResult::Ok));
    }
    // Mixed batch: gets, overwrites, deletes of present and absent keys.
    let ops = vec![
        get(5),
        put(5, 2),
        get(5),
        del(5),
        get(5),
        del(5),
        del(999_999),
        get(42),
    ];
    let answers = h.batch_blocking(ops).expect("batch");
    assert_eq!(value_of(&answers[0]), Some(value(5, 1)));
    assert_eq!(answers[1], OpResult::Ok);
    assert_eq!(value_of(&answers[2]), Some(value(5, 2)));
    assert_eq!(answers[3], OpResult::Ok);
    assert_eq!(answers[4], OpResult::NotFound);
    assert_eq!(answers[5], OpResult::NotFound);
    assert_eq!(answers[6], OpResult::NotFound);
    assert_eq!(value_of(&answers[7]), Some(value(42, 1)));
    let m = engine.metrics();
    assert_eq!(m.shards.len(), 3);
    assert_eq!(m.shards.iter().map(|s| s.keys).sum::<u64>(), 999);
    assert!(m.shards.iter().all(|s| s.durable_lsn == s.current_lsn));
    assert!(m.shards.iter().map(|s| s.wal_flushes).sum::<u64>() > 0);
    assert_eq!(m.devices.len(), 1);
    engine.shutdown().expect("shutdown");

    let engine = Engine::open_with_disk(&config, disk.clone()).expect("reopen");
    let h = engine.handle();
    let ops: Vec<Op> = (0..1000).map(get).collect::<Vec<_>>();
    for chunk in ops.chunks(500) {
        let answers = h.batch_blocking(chunk.to_vec()).expect("batch");
        for (op, a) in chunk.iter().zip(answers) {
            let i: u64 = std::str::from_utf8(&op.key()[4..])
                .unwrap()
                .parse()
                .unwrap();
            if i == 5 {
                assert_eq!(a, OpResult::NotFound);
            } else {
                assert_eq!(value_of(&a), Some(value(i, 1)), "key {i}");
            }
        }
    }
    let m = engine.metrics();
    assert!(
        m.shards
            .iter()
            .map(|s| s.recovery_records_replayed + s.recovery_snapshot_entries)
            .sum::<u64>()
            >= 999
    );
    engine.shutdown().expect("shutdown");
}

#[test]
fn limits_give_error_answers_not_panics() {
    let disk = SimDisk::new(1);
    let config = small_config(Path::new("/d"), 2, Durability::Sync);
    let engine = Engine::open_with_disk(&config, disk).expect("open");
    let h = engine.handle();
    let ops = vec![
        Op::Put {
            key: Bytes::new(),
            value: Bytes::from_static(b"x"),
        },
        Op::Put {
            key: Bytes::from(vec![b'k'; 65]),
            value: Bytes::from_static(b"x"),
        },
        Op::Put {
            key: Bytes::from_static(b"ok"),
            value: Bytes::from(vec![0u8; 2049]),
        },
        Op::Put {
            key: Bytes::from_static(b"ok"),
            value: Bytes::from(vec![1u8; 2048]),
        },
        Op::Get { key: Bytes::new() },
        Op::Get {
            key: Bytes::from_static(b"ok"),
        },
    ];
    let a = h.batch_blocking(ops).expect("batch");
    assert_eq!(a[0], OpResult::Err(OpError::EmptyKey));
    assert_eq!(
        a[1],
        OpResult::Err(OpError::KeyTooLarge { len: 65, max: 64 })
    );
    assert_eq!(
        a[2],
        OpResult::Err(OpError::ValueTooLarge {
            len: 2049,
            max: 2048
        })
    );
    assert_eq!(a[3], OpResult::Ok);
    assert_eq!(a[4], OpResult::Err(OpError::EmptyKey));
    assert_eq!(value_of(&a[5]).map(|v| v.len()), Some(2048));
    let too_many: Vec<Op> = (0..501).map(get).collect();
    assert_eq!(
        h.batch_blocking(too_many),
        Err(OpError::BatchTooLarge {
            count: 501,
            max: 500
        })
    );
    assert_eq!(h.batch_blocking(Vec::new()), Ok(Vec::new()));
    engine.shutdown().expect("shutdown");
    assert_eq!(h.batch_blocking(vec![get(1)]), Err(OpError::ShuttingDown));
}

#[test]
fn single_op_helpers() {
    let disk = SimDisk::new(2);
    let config = small_config(Path::new("/d"), 2, Durability::Sync);
    let engine = Engine::open_with_disk(&config, disk).expect("open");
    let h = engine.handle();
    pollster::block_on(async {
        h.put(key(1), value(1, 1)).await.expect("put");
        assert_eq!(h.get(key(1)).await.expect("get"), Some(value(1, 1)));
        assert!(h.delete(key(1)).await.expect("delete"));
        assert!(!h.delete(key(1)).await.expect("delete"));
        assert_eq!(h.get(key(1)).await.expect("get"), None);
        assert_eq!(
            h.put(Bytes::new(), value(1, 1)).await,
            Err(OpError::EmptyKey)
        );
    });
    engine.shutdown().expect("shutdown");
}

#[test]
fn async_mode_is_correct_and_durable_after_shutdown() {
    let disk = SimDisk::new(3);
    let config = small_config(Path::new("/d"), 2, Durability::Async);
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    let h = engine.handle();
    for round in 0..20u64 {
        let ops: Vec<Op> = (0..50).map(|i| put(i, round)).collect();
        h.batch_blocking(ops).expect("batch");
    }
    let a = h.batch_blocking((0..50).map(get).collect()).expect("batch");
    for (i, a) in a.iter().enumerate() {
        assert_eq!(value_of(a), Some(value(i as u64, 19)));
    }
    engine.shutdown().expect("shutdown");
    // Shutdown flushed everything: a crash now loses nothing.
    disk.crash();
    let engine = Engine::open_with_disk(&config, disk).expect("reopen");
    let a = engine
        .handle()
        .batch_blocking((0..50).map(get).collect())
        .expect("batch");
    for (i, a) in a.iter().enumerate() {
        assert_eq!(value_of(a), Some(value(i as u64, 19)));
    }
    engine.shutdown().expect("shutdown");
}

#[test]
fn none_mode_keeps_data_in_memory_and_writes_no_files() {
    let disk = SimDisk::new(4);
    let config = small_config(Path::new("/d"), 2, Durability::None);
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    let h = engine.handle();
    h.batch_blocking((0..100).map(|i| put(i, 1)).collect())
        .expect("batch");
    let a = h
        .batch_blocking((0..100).map(get).collect())
        .expect("batch");
    assert!(a
        .iter()
        .enumerate()
        .all(|(i, a)| value_of(a) == Some(value(i as u64, 1))));
    let m = engine.metrics();
    assert_eq!(m.shards.iter().map(|s| s.wal_bytes_written).sum::<u64>(), 0);
    engine.shutdown().expect("shutdown");
    assert!(
        disk.files().is_empty(),
        "none mode wrote {:?}",
        disk.files()
    );
}

#[test]
fn manifest_shard_count_mismatch_is_refused_clearly() {
    let disk = SimDisk::new(5);
    let dir = Path::new("/d");
    let engine = Engine::open_with_disk(&small_config(dir, 3, Durability::Sync), disk.clone())
        .expect("open");
    engine.shutdown().expect("shutdown");
    let err = Engine::open_with_disk(&small_config(dir, 2, Durability::Sync), disk.clone())
        .expect_err("must refuse another shard count");
    match &err {
        EngineError::Manifest(ManifestError::ShardCountMismatch {
            manifest, config, ..
        }) => {
            assert_eq!((*manifest, *config), (3, 2));
        }
        other => panic!("wrong error: {other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("3 shards") && text.contains("asks for 2"),
        "{text}"
    );
    // shards = 0 follows the manifest.
    let engine =
        Engine::open_with_disk(&small_config(dir, 0, Durability::Sync), disk).expect("open");
    assert_eq!(engine.shard_count(), 3);
    engine.shutdown().expect("shutdown");
}

#[test]
fn spawn_on_runs_on_the_shard_and_calls_inline() {
    let disk = SimDisk::new(6);
    let config = small_config(Path::new("/d"), 2, Durability::Sync);
    let engine = Engine::open_with_disk(&config, disk).expect("open");
    let (tx, rx) = std::sync::mpsc::channel();
    for shard in 0..2 {
        let h = engine.handle();
        let tx = tx.clone();
        engine.spawn_on(shard, move || async move {
            let name = std::thread::current().name().map(str::to_string);
            // A batch touching both shards from a shard thread.
            let ops: Vec<Op> = (0..20).map(|i| put(i + shard as u64 * 100, 1)).collect();
            let put_ok = h
                .batch(ops)
                .await
                .map(|a| a.iter().all(|r| *r == OpResult::Ok));
            let got = h
                .batch((0..20).map(|i| get(i + shard as u64 * 100)).collect())
                .await;
            let _ = tx.send((shard, name, put_ok, got.map(|a| a.len())));
        });
    }
    for _ in 0..2 {
        let (shard, name, put_ok, got) = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("task ran");
        assert_eq!(
            name.as_deref(),
            Some(format!("rkv-shard-{shard:03}").as_str())
        );
        // The kernel keeps 15 bytes of a thread's name: longer ones would
        // read the same for shards 0-9 in ps, top and perf.
        assert!(name.as_deref().is_some_and(|n| n.len() <= 15), "{name:?}");
        assert_eq!(put_ok, Ok(true));
        assert_eq!(got, Ok(20));
    }
    engine.shutdown().expect("shutdown");
}
