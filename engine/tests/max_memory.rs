//! `storage.max_memory` through the engine, on a real disk, for both
//! tiers: filled to the limit, writes that would grow memory answer
//! OUT_OF_MEMORY (and leave nothing in the WAL), while reads, deletes and
//! overwrites that do not grow memory still work; a transaction whose puts
//! do not fit aborts whole; a restart holds every acknowledged write and
//! nothing that was refused.

mod common;

use bytes::Bytes;
use common::small_config;
use ringkv_engine::{Engine, Op, OpError, OpResult, TxnError, TxnSettings};
use std::collections::BTreeMap;
use std::path::Path;
use tunables::{ByteSize, Config, Durability, Tier};

fn key(i: u64) -> Bytes {
    Bytes::from(format!("mm-key-{i:08}"))
}

fn value(i: u64, len: usize) -> Bytes {
    let mut v = format!("v{i}:").into_bytes();
    v.resize(len, b'x');
    Bytes::from(v)
}

fn memory_config(dir: &Path) -> Config {
    let mut c = small_config(dir, 2, Durability::Sync);
    c.storage.max_memory = ByteSize::mib(1);
    // Room for a value that outgrows what a full shard has left.
    c.limits.value_bytes_max = ByteSize::kib(4);
    c
}

/// Puts keys `from..` of `len`-byte values, `batch` at a time, until
/// `refusals_wanted` puts were refused (or `cap` keys were tried). Every
/// answer is Ok or OUT_OF_MEMORY; returns the acknowledged keys (with
/// their values) and the refused ones.
fn fill(
    engine: &Engine,
    from: u64,
    len: usize,
    refusals_wanted: usize,
    cap: u64,
) -> (BTreeMap<u64, Bytes>, Vec<u64>) {
    let h = engine.handle();
    let mut acked = BTreeMap::new();
    let mut refused = Vec::new();
    let mut i = from;
    while refused.len() < refusals_wanted && i < from + cap {
        let ids: Vec<u64> = (i..i + 20).collect();
        i += 20;
        let ops = ids
            .iter()
            .map(|&k| Op::Put {
                key: key(k),
                value: value(k, len),
            })
            .collect();
        for (&k, answer) in ids.iter().zip(h.batch_blocking(ops).expect("batch")) {
            match answer {
                OpResult::Ok => {
                    acked.insert(k, value(k, len));
                }
                OpResult::Err(e @ OpError::OutOfMemory { .. }) => {
                    assert!(
                        e.to_string()
                            .starts_with("command not allowed when used memory > 'maxmemory'"),
                        "{e}"
                    );
                    refused.push(k);
                }
                other => panic!("put {k}: {other:?}"),
            }
        }
    }
    (acked, refused)
}

/// Every key of `model` reads its value; every key of `absent` reads
/// NotFound.
fn check(engine: &Engine, model: &BTreeMap<u64, Bytes>, absent: &[u64]) {
    let h = engine.handle();
    let ids: Vec<u64> = model
        .keys()
        .copied()
        .chain(absent.iter().copied())
        .collect();
    for chunk in ids.chunks(200) {
        let ops = chunk.iter().map(|&k| Op::Get { key: key(k) }).collect();
        for (&k, answer) in chunk.iter().zip(h.batch_blocking(ops).expect("batch")) {
            match (answer, model.get(&k)) {
                (OpResult::Value(v), Some(want)) => assert_eq!(&v, want, "key {k}"),
                (OpResult::NotFound, None) => {}
                (other, want) => panic!("key {k}: got {other:?}, want {want:?}"),
            }
        }
    }
}

/// Each shard holds at most its share of `max_memory` (1 MiB / 2 shards)
/// and is full: within two 1000-byte values of it. Returns the refusals
/// the shards counted.
fn assert_every_shard_is_full(engine: &Engine) -> u64 {
    let mut refusals = 0;
    for s in &engine.metrics().shards {
        assert_eq!(s.memory_bytes_max, 512 * 1024, "shard {}", s.shard);
        assert!(
            s.memory_bytes <= s.memory_bytes_max,
            "shard {} holds {} bytes over its {}",
            s.shard,
            s.memory_bytes,
            s.memory_bytes_max
        );
        assert!(
            s.memory_bytes + 2 * 1100 > s.memory_bytes_max,
            "shard {} holds only {} of {}",
            s.shard,
            s.memory_bytes,
            s.memory_bytes_max
        );
        refusals += s.oom_refusals;
    }
    refusals
}

fn put_one(engine: &Engine, k: u64, v: Bytes) -> OpResult {
    let answers = engine
        .handle()
        .batch_blocking(vec![Op::Put {
            key: key(k),
            value: v,
        }])
        .expect("batch");
    answers.into_iter().next().expect("one answer")
}

#[test]
fn memory_tier_refuses_growth_at_the_limit_and_keeps_the_rest() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = memory_config(tmp.path());
    let engine = Engine::open(&config).expect("open");

    let (mut model, refused) = fill(&engine, 0, 1000, 200, 20_000);
    assert!(
        refused.len() >= 200,
        "no write was refused after {} acknowledged ones",
        model.len()
    );
    let refusals = assert_every_shard_is_full(&engine);
    assert_eq!(refusals, refused.len() as u64);
    check(&engine, &model, &refused);

    // At the limit: an overwrite with a value of the same size or smaller
    // does not grow memory and is taken; a larger one is refused.
    let keys: Vec<u64> = model.keys().copied().take(20).collect();
    for &k in &keys[..10] {
        assert_eq!(put_one(&engine, k, value(k, 1000)), OpResult::Ok, "key {k}");
        assert_eq!(put_one(&engine, k, value(k, 100)), OpResult::Ok, "key {k}");
        model.insert(k, value(k, 100));
    }
    // The 10 x 900 bytes freed let a few new keys in, then it is full again.
    let (more, refused_again) = fill(&engine, 1_000_000, 1000, 100, 4000);
    assert!(!refused_again.is_empty());
    model.extend(more);
    assert_every_shard_is_full(&engine);
    // A new key costs its block and, now and then, a partition table that
    // doubles, so a shard that refuses one can still have a value's worth
    // of room: growing a 1000-byte value by more than the two values of
    // room a full shard may have left is refused whatever the tables did.
    let grow = keys[15];
    match put_one(&engine, grow, value(grow, 1000 + 2 * 1100 + 100)) {
        OpResult::Err(OpError::OutOfMemory { .. }) => {}
        other => panic!("growing {grow}: {other:?}"),
    }

    // A transaction whose puts do not fit aborts whole: nothing of it is
    // written; one of deletes only is taken. (Each shard has less than
    // one 1000-byte value of room left; a part must fit one WAL record.)
    let h = engine.handle();
    let mut txn = h.begin(TxnSettings::default());
    pollster::block_on(async {
        for k in 2_000_000..2_000_002 {
            txn.put(key(k), value(k, 1900)).await.expect("txn put");
        }
    });
    match pollster::block_on(txn.commit()) {
        Err(TxnError::Op(OpError::OutOfMemory { .. })) => {}
        other => panic!("commit: {other:?}"),
    }
    let txn_keys: Vec<u64> = (2_000_000..2_000_002).collect();
    let mut txn = h.begin(TxnSettings::default());
    let gone: Vec<u64> = model.keys().copied().skip(20).take(5).collect();
    pollster::block_on(async {
        for &k in &gone {
            txn.delete(key(k)).await.expect("txn delete");
        }
        txn.commit().await.expect("a commit of deletes only");
    });
    for k in &gone {
        model.remove(k);
    }

    // Deletes work at the limit and make room for new writes.
    let dels: Vec<u64> = model.keys().copied().skip(20).take(100).collect();
    let ops = dels.iter().map(|&k| Op::Delete { key: key(k) }).collect();
    for (&k, a) in dels.iter().zip(h.batch_blocking(ops).expect("batch")) {
        assert_eq!(a, OpResult::Ok, "delete {k}");
        model.remove(&k);
    }
    let (room, _) = fill(&engine, 3_000_000, 1000, 1, 40);
    assert!(
        room.len() >= 20,
        "only {} writes after 100 deletes",
        room.len()
    );
    model.extend(room);
    check(&engine, &model, &refused);
    check(&engine, &BTreeMap::new(), &txn_keys);
    drop(engine);

    // A restart holds every acknowledged write and nothing refused.
    let engine = Engine::open(&config).expect("reopen");
    check(&engine, &model, &refused);
    check(&engine, &BTreeMap::new(), &txn_keys);
    check(&engine, &BTreeMap::new(), &dels);
}

#[test]
fn hybrid_tier_refuses_index_growth_at_the_limit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let hybrid = |dir: &Path, max: ByteSize| {
        let mut c = small_config(dir, 1, Durability::Sync);
        c.storage.tier = Tier::Hybrid;
        c.storage.cache_bytes = ByteSize::kib(64);
        c.storage.index_keys = 1024;
        c.storage.value_segment_size = ByteSize::kib(256);
        c.storage.max_memory = max;
        // No checkpoint while it fills: one copies the blind sets while it
        // runs, RAM no write added (docs/operations.md, "Memory limit").
        c.storage.checkpoint_wal_bytes = ByteSize::gib(1);
        c
    };
    // What an empty hybrid shard holds (its fixed index and buffers, and
    // its cache counted full), then a limit 200 spilled keys above it.
    let probe = tmp.path().join("probe");
    let empty = {
        let engine = Engine::open(&hybrid(&probe, ByteSize(0))).expect("open probe");
        engine.metrics().shards[0].memory_bytes
    };
    let max = ByteSize(empty + 200 * 40);
    let config = hybrid(&tmp.path().join("data"), max);
    let engine = Engine::open(&config).expect("open");

    let (mut model, refused) = fill(&engine, 0, 300, 50, 50_000);
    assert!(
        refused.len() >= 50,
        "no write was refused after {} acknowledged ones",
        model.len()
    );
    let s = &engine.metrics().shards[0];
    assert!(
        s.memory_bytes <= max.0,
        "{} over {}: {:?}",
        s.memory_bytes,
        max.0,
        s.hybrid
    );
    // The tier's own counters are published by its background task (at
    // least every 100 ms), so they may lag the last writes a little.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let hybrid = engine.metrics().shards[0].hybrid.expect("hybrid stats");
        if hybrid.spilled_keys > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the limit bit before the index spilled: {hybrid:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    check(&engine, &model, &refused);

    // Deletes work and give the spilled entries back.
    let h = engine.handle();
    let dels: Vec<u64> = model.keys().copied().rev().take(400).collect();
    let ops = dels.iter().map(|&k| Op::Delete { key: key(k) }).collect();
    for (&k, a) in dels.iter().zip(h.batch_blocking(ops).expect("batch")) {
        assert_eq!(a, OpResult::Ok, "delete {k}");
        model.remove(&k);
    }
    let (room, _) = fill(&engine, 1_000_000, 300, 1, 40);
    assert!(
        room.len() >= 20,
        "only {} writes after 400 deletes",
        room.len()
    );
    model.extend(room);
    check(&engine, &model, &refused);
    drop(engine);

    let engine = Engine::open(&config).expect("reopen");
    check(&engine, &model, &refused);
    check(&engine, &BTreeMap::new(), &dels);
}
