//! Expiry times as a storage feature: they are logged with their Put
//! records and copied into snapshots, so they survive restarts, crashes and
//! checkpoints; expired keys are never returned; active expiry deletes them
//! through logged deletes within a bounded number of ticks; updates keep
//! or clear an expiry as Redis's commands do.

mod common;

use bytes::Bytes;
use common::*;
use ringkv_engine::clock::now_ms;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::{
    Current, Engine, Op, OpResult, TtlUpdate, UpdateAnswer, UpdateOutcome, UpdateWrite,
};
use std::path::Path;
use std::time::{Duration, Instant};
use tunables::Durability;

/// Sets only the expiry time (`number`; 0: remove it).
fn set_expiry(_: Current, _now: u64, _: &Bytes, number: i64) -> UpdateOutcome {
    UpdateOutcome {
        write: UpdateWrite::SetExpiry((number != 0).then_some(number as u64)),
        answer: UpdateAnswer::Ok,
    }
}

/// Appends `arg` keeping the expiry (an INCR/APPEND-style update).
fn append(current: Option<Bytes>, arg: &Bytes, _: i64) -> UpdateOutcome {
    let mut v = current.map(|c| c.to_vec()).unwrap_or_default();
    v.extend_from_slice(arg);
    UpdateOutcome {
        write: UpdateWrite::Put(Bytes::from(v)),
        answer: UpdateAnswer::Ok,
    }
}

fn ttl_op(apply: ringkv_engine::TtlUpdateFn, k: &Bytes, arg: &[u8], number: i64) -> Op {
    Op::UpdateTtl {
        key: k.clone(),
        update: TtlUpdate {
            apply,
            arg: Bytes::copy_from_slice(arg),
            number,
        },
    }
}

fn expiry(h: &ringkv_engine::Handle, k: &Bytes) -> i64 {
    match h
        .batch_blocking(vec![ttl_op(expiry_of, k, b"", 0)])
        .expect("batch")[0]
    {
        OpResult::Updated(UpdateAnswer::Int(n)) => n,
        ref other => panic!("expiry answered {other:?}"),
    }
}

/// A far-future expiry, unique per key (the year 2100 and on).
fn far(i: u64) -> i64 {
    (4_102_444_800_000 + i * 1000) as i64
}

#[test]
fn expiry_times_survive_restarts_crashes_and_checkpoints() {
    init_log();
    let disk = SimDisk::new(21);
    let dir = Path::new("/data");
    let config = small_config(dir, 2, Durability::Sync);
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    let h = engine.handle();
    // Even keys expire far in the future; odd keys have none.
    let ops: Vec<Op> = (0..200)
        .map(|i| {
            let at = if i % 2 == 0 { far(i) } else { 0 };
            ttl_op(set_expiring, &key(i), &value(i, 1), at)
        })
        .collect();
    h.batch_blocking(ops).expect("batch");
    let check = |h: &ringkv_engine::Handle, what: &str| {
        for i in 0..200 {
            let want = if i % 2 == 0 { far(i) } else { -1 };
            assert_eq!(expiry(h, &key(i)), want, "key {i} after {what}");
            let got = h.batch_blocking(vec![get(i)]).expect("get");
            assert_eq!(value_of(&got[0]), Some(value(i, 1)), "key {i} after {what}");
        }
    };
    check(&h, "writing");
    engine.shutdown().expect("shutdown");

    // A graceful restart replays the WAL.
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("reopen");
    let h = engine.handle();
    check(&h, "a restart");
    // Enough other writes for several checkpoints, so the expiring keys
    // come back from a snapshot.
    for round in 0..8 {
        let ops = (1000..1200).map(|i| put(i, round)).collect();
        h.batch_blocking(ops).expect("batch");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while engine.metrics().shards.iter().any(|s| s.checkpoints == 0) {
        assert!(Instant::now() < deadline, "no checkpoint on some shard");
        std::thread::sleep(Duration::from_millis(20));
    }
    engine.halt();
    disk.crash();

    let engine = Engine::open_with_disk(&config, disk.clone()).expect("reopen after crash");
    let h = engine.handle();
    let loaded: u64 = engine
        .metrics()
        .shards
        .iter()
        .map(|s| s.recovery_snapshot_entries)
        .sum();
    assert!(loaded > 0, "recovery loaded no snapshot");
    check(&h, "checkpoints and a crash");
    let expiring: u64 = engine
        .metrics()
        .shards
        .iter()
        .map(|s| s.expiring_keys)
        .sum();
    assert_eq!(expiring, 100);
    engine.shutdown().expect("shutdown");
}

#[test]
fn updates_keep_or_clear_the_expiry_as_redis_does() {
    init_log();
    let disk = SimDisk::new(22);
    let config = small_config(Path::new("/data"), 1, Durability::Sync);
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    let h = engine.handle();
    let k = key(1);
    h.batch_blocking(vec![ttl_op(set_expiring, &k, b"a", far(1))])
        .expect("set");
    // An append keeps the expiry.
    h.batch_blocking(vec![Op::Update {
        key: k.clone(),
        update: ringkv_engine::Update {
            apply: append,
            arg: Bytes::from_static(b"b"),
            number: 0,
        },
    }])
    .expect("append");
    assert_eq!(expiry(&h, &k), far(1));
    // Changing only the expiry keeps the value.
    h.batch_blocking(vec![ttl_op(set_expiry, &k, b"", far(2))])
        .expect("expire");
    assert_eq!(expiry(&h, &k), far(2));
    // Removing it (PERSIST).
    h.batch_blocking(vec![ttl_op(set_expiry, &k, b"", 0)])
        .expect("persist");
    assert_eq!(expiry(&h, &k), -1);
    h.batch_blocking(vec![ttl_op(set_expiry, &k, b"", far(3))])
        .expect("expire");
    // A plain put clears it.
    h.batch_blocking(vec![Op::Put {
        key: k.clone(),
        value: Bytes::from_static(b"plain"),
    }])
    .expect("put");
    assert_eq!(expiry(&h, &k), -1);
    // An expiry time already passed deletes the key.
    h.batch_blocking(vec![ttl_op(set_expiry, &k, b"", 1)])
        .expect("expire in the past");
    assert_eq!(expiry(&h, &k), -2);
    // A missing key gets no expiry.
    h.batch_blocking(vec![ttl_op(set_expiry, &key(2), b"", far(4))])
        .expect("expire missing");
    assert_eq!(expiry(&h, &key(2)), -2);
    engine.shutdown().expect("shutdown");
    let engine = Engine::open_with_disk(&config, disk).expect("reopen");
    let h = engine.handle();
    assert_eq!(expiry(&h, &k), -2);
    let got = h.batch_blocking(vec![get(1)]).expect("get");
    assert_eq!(got[0], OpResult::NotFound);
    engine.shutdown().expect("shutdown");
}

#[test]
fn expired_keys_are_never_returned_and_active_expiry_reclaims_them() {
    init_log();
    let disk = SimDisk::new(23);
    let mut config = small_config(Path::new("/data"), 2, Durability::Sync);
    config.storage.expiry_tick = tunables::Duration::from_millis(100);
    config.storage.expiry_keys_per_tick = 256;
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    let h = engine.handle();
    let n = 1500u64;
    let soon = (now_ms() + 300) as i64;
    for chunk in (0..n).collect::<Vec<_>>().chunks(300) {
        let ops = chunk
            .iter()
            .map(|&i| ttl_op(set_expiring, &key(i), &value(i, 1), soon))
            .collect();
        h.batch_blocking(ops).expect("batch");
    }
    let keep = (n..n + 10).map(|i| put(i, 1)).collect();
    h.batch_blocking(keep).expect("batch");
    let memory_full: u64 = engine.metrics().shards.iter().map(|s| s.memory_bytes).sum();
    while now_ms() <= soon as u64 {
        std::thread::sleep(Duration::from_millis(10));
    }
    // Gone for every read at once, whether or not active expiry ran yet.
    let answers = h
        .batch_blocking((0..n).step_by(7).map(get).collect())
        .expect("gets");
    assert!(
        answers.iter().all(|r| *r == OpResult::NotFound),
        "an expired key was returned"
    );
    assert_eq!(expiry(&h, &key(3)), -2);
    // Deleting an expired key answers NotFound, as Redis's DEL does.
    let answers = h.batch_blocking(vec![del(5)]).expect("delete");
    assert_eq!(answers[0], OpResult::NotFound);
    let mut scanned = 0;
    for shard in 0..engine.shard_count() {
        let mut from = Some(0);
        while let Some(p) = from {
            let page = futures::executor::block_on(h.partition_keys(shard, p, 1000)).expect("scan");
            scanned += page.keys.len();
            from = page.next;
        }
    }
    assert_eq!(scanned, 10, "a scan returned an expired key");
    // Active expiry deletes 256 keys per shard per 100 ms tick: 1500 keys
    // on 2 shards need about 3 ticks. Allow generously many, but bounded.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = engine.metrics();
        let keys: u64 = m.shards.iter().map(|s| s.keys).sum();
        if keys == 10 {
            let expired: u64 = m.shards.iter().map(|s| s.expired_keys).sum();
            assert_eq!(expired, n);
            assert_eq!(m.shards.iter().map(|s| s.expiring_keys).sum::<u64>(), 0);
            let memory: u64 = m.shards.iter().map(|s| s.memory_bytes).sum();
            assert!(
                memory < memory_full,
                "memory not reclaimed: {memory} >= {memory_full}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "active expiry left {keys} keys");
        std::thread::sleep(Duration::from_millis(20));
    }
    engine.halt();
    disk.crash();
    // The deletes were logged: after a crash the keys stay gone.
    let engine = Engine::open_with_disk(&config, disk).expect("reopen");
    let keys: u64 = engine.metrics().shards.iter().map(|s| s.keys).sum();
    assert_eq!(keys, 10);
    engine.shutdown().expect("shutdown");
}
