//! Read-modify-write operations ([`Op::Update`]): run on the key's shard
//! in one step, logged as ordinary put/delete records, durable when
//! acknowledged in `sync` mode (they survive a crash of the simulated disk),
//! atomic under concurrent callers, and bounded by `value_bytes_max`.

mod common;

use bytes::Bytes;
use common::*;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::{
    Engine, Op, OpError, OpResult, Update, UpdateAnswer, UpdateOutcome, UpdateWrite,
};
use std::path::Path;
use tunables::Durability;

/// Adds `number` to a decimal counter (absent counts as 0).
fn add(current: Option<Bytes>, _arg: &Bytes, number: i64) -> UpdateOutcome {
    let old: i64 = match current {
        None => 0,
        Some(v) => match std::str::from_utf8(&v).ok().and_then(|s| s.parse().ok()) {
            Some(n) => n,
            None => {
                return UpdateOutcome {
                    write: UpdateWrite::Keep,
                    answer: UpdateAnswer::Refused("not a number"),
                }
            }
        },
    };
    let new = old + number;
    UpdateOutcome {
        write: UpdateWrite::Put(Bytes::from(new.to_string())),
        answer: UpdateAnswer::Int(new),
    }
}

/// Appends `arg`; answers the new length.
fn append(current: Option<Bytes>, arg: &Bytes, _number: i64) -> UpdateOutcome {
    let mut v = current.map(|c| c.to_vec()).unwrap_or_default();
    v.extend_from_slice(arg);
    let len = v.len() as i64;
    UpdateOutcome {
        write: UpdateWrite::Put(Bytes::from(v)),
        answer: UpdateAnswer::Int(len),
    }
}

/// Removes the key, answering its old value.
fn take(current: Option<Bytes>, _arg: &Bytes, _number: i64) -> UpdateOutcome {
    match current {
        Some(v) => UpdateOutcome {
            write: UpdateWrite::Delete,
            answer: UpdateAnswer::Value(v),
        },
        None => UpdateOutcome {
            write: UpdateWrite::Keep,
            answer: UpdateAnswer::Nil,
        },
    }
}

fn update(key: &str, apply: ringkv_engine::UpdateFn, arg: &[u8], number: i64) -> Op {
    Op::Update {
        key: Bytes::copy_from_slice(key.as_bytes()),
        update: Update {
            apply,
            arg: Bytes::copy_from_slice(arg),
            number,
        },
    }
}

fn get_op(key: &str) -> Op {
    Op::Get {
        key: Bytes::copy_from_slice(key.as_bytes()),
    }
}

#[test]
fn updates_apply_in_order_and_survive_a_crash() {
    init_log();
    let disk = SimDisk::new(11);
    let dir = Path::new("/data");
    let config = small_config(dir, 2, Durability::Sync);
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    let h = engine.handle();
    let answers = h
        .batch_blocking(vec![
            update("n", add, b"", 5),
            update("n", add, b"", -2),
            get_op("n"),
            update("s", append, b"ab", 0),
            update("s", append, b"cd", 0),
            update("gone", take, b"", 0),
            update("s", take, b"", 0),
            get_op("s"),
            Op::Put {
                key: Bytes::from_static(b"bad"),
                value: Bytes::from_static(b"x"),
            },
            update("bad", add, b"", 1),
            get_op("bad"),
        ])
        .expect("batch");
    assert_eq!(answers[0], OpResult::Updated(UpdateAnswer::Int(5)));
    assert_eq!(answers[1], OpResult::Updated(UpdateAnswer::Int(3)));
    assert_eq!(answers[2], OpResult::Value(Bytes::from_static(b"3")));
    assert_eq!(answers[3], OpResult::Updated(UpdateAnswer::Int(2)));
    assert_eq!(answers[4], OpResult::Updated(UpdateAnswer::Int(4)));
    assert_eq!(answers[5], OpResult::Updated(UpdateAnswer::Nil));
    assert_eq!(
        answers[6],
        OpResult::Updated(UpdateAnswer::Value(Bytes::from_static(b"abcd")))
    );
    assert_eq!(answers[7], OpResult::NotFound);
    assert_eq!(answers[8], OpResult::Ok);
    assert_eq!(
        answers[9],
        OpResult::Updated(UpdateAnswer::Refused("not a number"))
    );
    assert_eq!(answers[10], OpResult::Value(Bytes::from_static(b"x")));
    // Acknowledged in sync mode: the crash keeps all of it.
    engine.halt();
    disk.crash();
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("reopen");
    let h = engine.handle();
    let answers = h
        .batch_blocking(vec![get_op("n"), get_op("s"), get_op("bad")])
        .expect("batch");
    assert_eq!(answers[0], OpResult::Value(Bytes::from_static(b"3")));
    assert_eq!(answers[1], OpResult::NotFound);
    assert_eq!(answers[2], OpResult::Value(Bytes::from_static(b"x")));
    engine.shutdown().expect("shutdown");
}

#[test]
fn concurrent_increments_are_not_lost() {
    init_log();
    let disk = SimDisk::new(12);
    let config = small_config(Path::new("/data"), 2, Durability::Async);
    let engine = Engine::open_with_disk(&config, disk).expect("open");
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let h = engine.handle();
            std::thread::spawn(move || {
                for _ in 0..50 {
                    let ops = (0..10).map(|_| update("counter", add, b"", 1)).collect();
                    let answers = h.batch_blocking(ops).expect("batch");
                    assert!(answers
                        .iter()
                        .all(|a| matches!(a, OpResult::Updated(UpdateAnswer::Int(_)))));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    let answers = engine
        .handle()
        .batch_blocking(vec![get_op("counter")])
        .expect("batch");
    assert_eq!(answers[0], OpResult::Value(Bytes::from_static(b"2000")));
    engine.shutdown().expect("shutdown");
}

#[test]
fn an_update_may_not_write_past_the_value_limit() {
    let disk = SimDisk::new(13);
    let config = small_config(Path::new("/data"), 1, Durability::Sync);
    let max = config.limits.value_bytes_max.as_u64() as usize;
    let engine = Engine::open_with_disk(&config, disk).expect("open");
    let h = engine.handle();
    let half = vec![b'x'; max / 2 + 1];
    let answers = h
        .batch_blocking(vec![
            update("k", append, &half, 0),
            update("k", append, &half, 0),
            get_op("k"),
            update("k", append, &vec![b'y'; max + 1], 0),
        ])
        .expect("batch");
    assert_eq!(
        answers[0],
        OpResult::Updated(UpdateAnswer::Int(half.len() as i64))
    );
    assert_eq!(
        answers[1],
        OpResult::Err(OpError::ValueTooLarge {
            len: 2 * half.len(),
            max
        })
    );
    assert_eq!(answers[2], OpResult::Value(Bytes::from(half.clone())));
    assert!(matches!(
        answers[3],
        OpResult::Err(OpError::ValueTooLarge { .. })
    ));
    engine.shutdown().expect("shutdown");
}
