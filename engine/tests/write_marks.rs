//! Write marks (what WATCH compares) and restarted transactions: a key's
//! mark moves with every change of the key whatever made it (a put of
//! the same value, a delete, a read-modify-write, a transaction commit)
//! and not with reads; a transaction restarted after wait-die keeps its
//! id, so it waits for a younger holder instead of dying.

mod common;

use bytes::Bytes;
use common::*;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::{
    Engine, Op, TxnError, TxnSettings, Update, UpdateAnswer, UpdateOutcome, UpdateWrite,
};
use std::path::Path;
use tunables::Durability;

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn touch(current: Option<Bytes>, _: &Bytes, _: i64) -> UpdateOutcome {
    UpdateOutcome {
        write: UpdateWrite::Put(current.unwrap_or_default()),
        answer: UpdateAnswer::Ok,
    }
}

#[test]
fn every_change_moves_the_mark_and_reads_do_not() {
    init_log();
    let config = small_config(Path::new("/data"), 2, Durability::Sync);
    let engine = Engine::open_with_disk(&config, SimDisk::new(7)).expect("open");
    let h = engine.handle();
    let mark = || pollster::block_on(h.key_marks(&[b("k")])).expect("marks")[0];
    let run = |op: Op| h.batch_blocking(vec![op]).expect("batch");

    let start = mark();
    run(Op::Get { key: b("k") });
    run(Op::Delete { key: b("k") });
    assert_eq!(
        mark(),
        start,
        "a read or a delete of a missing key changes nothing"
    );

    let mut seen = vec![start];
    let mut changed = |what: &str| {
        let now = mark();
        assert!(
            seen.iter().all(|m| m.changed_by(&now, 0)),
            "{what} did not move the mark"
        );
        seen.push(now);
    };
    run(Op::Put {
        key: b("k"),
        value: b("v"),
    });
    changed("a put");
    run(Op::Put {
        key: b("k"),
        value: b("v"),
    });
    changed("a put of the same value");
    run(Op::Update {
        key: b("k"),
        update: Update {
            apply: touch,
            arg: Bytes::new(),
            number: 0,
        },
    });
    changed("a read-modify-write");
    run(Op::Delete { key: b("k") });
    changed("a delete");
    pollster::block_on(async {
        let mut t = h.begin(TxnSettings::default());
        t.put(b("k"), b("t")).await.expect("txn put");
        t.commit().await.expect("commit");
    });
    changed("a transaction commit");
    engine.shutdown().expect("shutdown");
}

#[test]
fn a_restarted_transaction_keeps_its_age() {
    init_log();
    let config = small_config(Path::new("/data"), 1, Durability::Async);
    let engine = Engine::open_with_disk(&config, SimDisk::new(8)).expect("open");
    let h = engine.handle();
    pollster::block_on(async {
        let settings = TxnSettings::default();
        let mut oldest = h.begin(settings);
        let mut young = h.begin(settings);
        oldest.get_for_update(b("a")).await.expect("lock a");
        assert_eq!(young.get_for_update(b("a")).await, Err(TxnError::Die));
        let id = young.id();
        // A transaction newer than `young` holds b.
        let mut newest = h.begin(settings);
        newest.put(b("b"), b("newest")).await.expect("lock b");
        // A fresh transaction is younger than `newest`: it dies on b.
        let mut fresh = h.begin(settings);
        assert_eq!(fresh.put(b("b"), b("x")).await, Err(TxnError::Die));
        fresh.rollback().await;
        // Restarted, `young` keeps its id: older than `newest`, it waits
        // for b and gets it when `newest` commits.
        let mut young = young.restart().await;
        assert_eq!(young.id(), id);
        let (waited, committed) = futures::join!(young.put(b("b"), b("young")), newest.commit());
        committed.expect("newest commits");
        waited.expect("the restarted transaction waited instead of dying");
        young.commit().await.expect("young commits");
        oldest.rollback().await;
    });
    let got = h
        .batch_blocking(vec![Op::Get { key: b("b") }])
        .expect("get");
    assert_eq!(got[0], ringkv_engine::OpResult::Value(b("young")));
    engine.shutdown().expect("shutdown");
}
