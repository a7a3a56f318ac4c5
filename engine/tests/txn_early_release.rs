//! Early lock release (docs/transactions.md, "Early lock release"), on the
//! simulated disk under `sync`: a transaction that writes one shard
//! releases its locks once its part is in the WAL buffer, before the
//! fdatasync, and nobody (its own commit, a plain GET, another
//! transaction's read) is answered with its writes before they are
//! durable. A crash between the release and the fsync loses the part, and
//! no reader saw it.

mod common;

use bytes::Bytes;
use common::small_config;
use ringkv_engine::io::sim::{SimDisk, SimFaults};
use ringkv_engine::{Engine, Handle, OpError, TxnError, TxnSettings};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tunables::Durability;

const KEY: &[u8] = b"account-7";

fn key() -> Bytes {
    Bytes::from_static(KEY)
}

fn commit_put(h: &Handle, value: &'static [u8]) -> Result<(), TxnError> {
    pollster::block_on(async {
        let mut txn = h.begin(TxnSettings::default());
        txn.put(key(), Bytes::from_static(value)).await?;
        txn.commit().await
    })
}

fn current_lsn(engine: &Engine) -> u64 {
    engine.metrics().shards[0].current_lsn
}

/// The answers of a commit, a plain GET and a transaction's read, taken
/// while the commit's part waits for its (slow) flush; with `crash`, the
/// disk loses power before that flush ends.
struct Observed {
    commit: Result<(), TxnError>,
    plain_get: Result<Option<Bytes>, OpError>,
    txn_read: Result<Option<Bytes>, TxnError>,
}

fn run(seed: u64, crash: bool) -> (SimDisk, tunables::Config, Observed) {
    let disk = SimDisk::new(seed);
    let config = small_config(Path::new("/early"), 1, Durability::Sync);
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
    let h = engine.handle();
    commit_put(&h, b"v0").expect("the first commit");
    // Every write and fsync now takes 300 ms: the next commit's part sits
    // in the WAL buffer, or in flight, long enough to look around.
    disk.set_faults(SimFaults {
        latency: Some(Duration::from_millis(300)),
        torn_write_on_crash: false,
        ..SimFaults::default()
    });
    let before = current_lsn(&engine);
    let (commit_tx, commit_rx) = mpsc::channel();
    let h1 = h.clone();
    let t1 = std::thread::spawn(move || {
        let _ = commit_tx.send(commit_put(&h1, b"v1"));
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while current_lsn(&engine) == before {
        assert!(
            Instant::now() < deadline,
            "the commit never logged its part"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // The part is logged, not durable: the key's lock is free already. A
    // younger transaction gets it (without early release it would die by
    // wait-die, the older committer holding the key).
    let mut t2 = h.begin(TxnSettings::default());
    let locked = pollster::block_on(t2.put(key(), Bytes::from_static(b"v2")));
    assert!(
        commit_rx.try_recv().is_err(),
        "the commit was answered before its part could be durable"
    );
    assert_eq!(locked, Ok(()), "the lock was not released before the fsync");
    // Readers of the key: each must wait for the commit's part.
    let (get_tx, get_rx) = mpsc::channel();
    let hg = h.clone();
    let tg = std::thread::spawn(move || {
        let _ = get_tx.send(pollster::block_on(hg.get(key())));
    });
    let (read_tx, read_rx) = mpsc::channel();
    let hr = h.clone();
    let tr = std::thread::spawn(move || {
        let mut t3 = hr.begin(TxnSettings::default());
        let got = pollster::block_on(t3.get(key()));
        let _ = read_tx.send(got);
        pollster::block_on(t3.rollback());
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        get_rx.try_recv().is_err(),
        "a plain GET was answered while the value it read was not durable"
    );
    assert!(
        read_rx.try_recv().is_err(),
        "a transaction's read was answered while the value it read was not durable"
    );
    assert!(commit_rx.try_recv().is_err(), "the commit answered early");
    if crash {
        // Power loss between the release and the end of the fsync.
        disk.crash();
    }
    let wait = Duration::from_secs(10);
    let observed = Observed {
        commit: commit_rx.recv_timeout(wait).expect("the commit answers"),
        plain_get: get_rx.recv_timeout(wait).expect("the GET answers"),
        txn_read: read_rx.recv_timeout(wait).expect("the read answers"),
    };
    for t in [t1, tg, tr] {
        t.join().expect("thread");
    }
    pollster::block_on(t2.rollback());
    engine.halt();
    (disk, config, observed)
}

#[test]
fn the_lock_goes_before_the_fsync_and_readers_wait_for_the_commit_to_be_durable() {
    let (disk, config, seen) = run(7, false);
    assert_eq!(seen.commit, Ok(()));
    assert_eq!(seen.plain_get, Ok(Some(Bytes::from_static(b"v1"))));
    assert_eq!(seen.txn_read, Ok(Some(Bytes::from_static(b"v1"))));
    disk.crash();
    disk.set_faults(SimFaults::default());
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("reopen");
    let got = pollster::block_on(engine.handle().get(key())).expect("get");
    assert_eq!(got, Some(Bytes::from_static(b"v1")), "acknowledged commit");
    engine.shutdown().expect("shutdown");
}

#[test]
fn a_crash_between_the_release_and_the_fsync_loses_the_commit_and_no_reader_saw_it() {
    for seed in 0..4 {
        let (disk, config, seen) = run(seed, true);
        let v1 = Some(Bytes::from_static(b"v1"));
        assert!(
            seen.commit.is_err(),
            "seed {seed}: the commit was acknowledged though the crash took its part"
        );
        assert!(
            !matches!(&seen.plain_get, Ok(v) if *v == v1),
            "seed {seed}: a plain GET saw the lost commit"
        );
        assert!(
            !matches!(&seen.txn_read, Ok(v) if *v == v1),
            "seed {seed}: a transaction read the lost commit"
        );
        disk.set_faults(SimFaults::default());
        let engine = Engine::open_with_disk(&config, disk.clone()).expect("reopen");
        let got = pollster::block_on(engine.handle().get(key())).expect("get");
        assert_eq!(
            got,
            Some(Bytes::from_static(b"v0")),
            "seed {seed}: after the crash"
        );
        engine.shutdown().expect("shutdown");
    }
}
