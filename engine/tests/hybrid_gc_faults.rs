//! The hybrid tier when a value segment write fails while GC is moving
//! records (EIO, or ENOSPC on a full disk: the tier handles both the same
//! way). GC's moves are not in the WAL, so they are the writes a crash
//! test sees least. After the failure the tier reports its fault (the
//! shard poisons itself on it and runs no more GC), every key still reads
//! its newest value, and recovery from the last checkpoint plus the operations
//! logged after it gives every key back, with any of GC's unsynced moves
//! dropped or kept by the crash.

use common::hybrid::{key, put, settings, value};
use ringkv_engine::hash::fnv1a64;
use ringkv_engine::io::sim::{SimDisk, SimFaults};
use ringkv_engine::tier::{HybridSettings, HybridTier, Tier};
use std::collections::BTreeMap;

mod common;

const KEYS: u64 = 600;

type Entries = Vec<(Vec<u8>, Vec<u8>, Option<u64>)>;
type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// 64 KiB segments: GC's moves fill a segment and write it out within a
/// few steps, so its writes reach the device while the test watches.
fn small() -> HybridSettings {
    HybridSettings {
        segment_bytes: 64 << 10,
        index_keys: 2_000,
        gc_garbage_percent: 10,
        ..settings(4 << 10)
    }
}

/// Writes every key, then overwrites the even ones a few times, so the
/// older segments hold the odd keys among garbage: GC has victims with
/// live records to move. Returns the model.
fn fill(t: &mut dyn Tier, rounds: u64) -> Model {
    let mut model = Model::new();
    for round in 0..rounds {
        for i in (0..KEYS).filter(|i| round == 0 || i % 2 == 0) {
            let (k, v) = (key(i), value(i, round));
            assert!(put(t, &k, &v));
            model.insert(k, v);
        }
    }
    model
}

fn checkpoint(t: &mut dyn Tier) -> Entries {
    common::hybrid::checkpoint(t)
}

/// Recovery as the shard does it: the checkpoint's entries, then the
/// operations logged after it (here: puts), replayed.
/// A put logged after the checkpoint: key, value and its LSN.
type Logged = (Vec<u8>, Vec<u8>, u64);

fn recover(disk: &SimDisk, entries: &Entries, logged: &[Logged]) -> HybridTier<SimDisk> {
    let mut t = HybridTier::new(disk.clone(), small()).expect("tier");
    t.load_checkpoint_begin(false).expect("checkpoint starts");
    for (k, v, at) in entries {
        t.load_checkpoint_entry(k, v, *at).expect("entry loads");
    }
    t.load_checkpoint_done().expect("the checkpoint loads");
    t.replay_begin();
    for (k, v, lsn) in logged {
        // The replay gives each write the LSN it was logged with.
        t.put(fnv1a64(k), k, v, *lsn);
    }
    t.recovery_done();
    t
}

fn check(t: &dyn Tier, model: &Model, when: &str) {
    for (k, v) in model {
        let got = t.get(fnv1a64(k), k);
        assert_eq!(
            got.as_deref(),
            Some(&v[..]),
            "{when}: key {}",
            String::from_utf8_lossy(k)
        );
    }
}

/// Runs GC steps until the tier reports a fault; returns the steps run
/// and whether GC had moved records before it.
fn gc_until_fault(t: &mut HybridTier<SimDisk>) -> (u32, bool) {
    let mut steps = 0;
    loop {
        let moved_before = HybridTier::stats(t).gc_bytes_written > 0;
        let did = t.background_step();
        steps += 1;
        if let Some(fault) = t.take_fault() {
            assert!(fault.contains("GC"), "the fault names GC: {fault}");
            return (steps, moved_before);
        }
        assert!(did, "GC ran out of work before the injected fault");
        assert!(steps < 10_000, "GC never wrote");
    }
}

fn run(seed: u64, fail_after: u64, with_writes_after: bool) {
    let disk = SimDisk::new(seed);
    let mut t = HybridTier::new(disk.clone(), small()).expect("tier");
    let mut model = fill(&mut t, 6);
    let entries = checkpoint(&mut t);
    // Operations after the checkpoint: in the WAL, so replayed.
    let mut logged = Vec::new();
    if with_writes_after {
        for i in (0..KEYS).step_by(7) {
            let (k, v, lsn) = (key(i), value(i, 100), common::hybrid::lsn());
            t.put(fnv1a64(&k), &k, &v, lsn);
            model.insert(k.clone(), v.clone());
            logged.push((k, v, lsn));
        }
    }
    disk.set_faults(SimFaults {
        fail_write_after: Some(fail_after),
        path_filter: Some(".seg".into()),
        ..SimFaults::default()
    });
    let (steps, moved_before) = gc_until_fault(&mut t);
    disk.set_faults(SimFaults::default());
    if fail_after > 0 {
        assert!(moved_before, "GC moved records before the failed write");
    }
    // Poisoned (the shard takes no more writes), but every key reads its
    // newest value, those GC moved into the failed buffer too.
    check(
        &t,
        &model,
        &format!("after the failed GC write (step {steps})"),
    );
    // Crash: the written, unsynced blocks may or may not survive.
    disk.crash();
    let back = recover(&disk, &entries, &logged);
    check(&back, &model, "after recovery");
    // And once more, after a clean restart of the recovered tier: its
    // checkpoint must not point into anything the failure left behind.
    let mut back = back;
    let entries = checkpoint(&mut back);
    assert!(back.take_fault().is_none(), "the recovered tier works");
    disk.crash();
    let again = recover(&disk, &entries, &[]);
    check(&again, &model, "after a second recovery");
}

#[test]
fn a_gc_write_that_fails_first_loses_nothing() {
    run(31, 0, false);
}

#[test]
fn a_gc_write_that_fails_after_gc_moved_records_loses_nothing() {
    for (seed, fail_after) in [(32, 1), (33, 2), (34, 5)] {
        run(seed, fail_after, false);
    }
}

#[test]
fn a_failed_gc_write_with_logged_writes_after_the_checkpoint_loses_nothing() {
    for (seed, fail_after) in [(35, 0), (36, 1), (37, 3)] {
        run(seed, fail_after, true);
    }
}

#[test]
fn gc_resumes_after_recovery_from_a_failed_gc_write() {
    let disk = SimDisk::new(38);
    let mut t = HybridTier::new(disk.clone(), small()).expect("tier");
    let model = fill(&mut t, 6);
    let entries = checkpoint(&mut t);
    disk.set_faults(SimFaults {
        fail_write_after: Some(1),
        path_filter: Some(".seg".into()),
        ..SimFaults::default()
    });
    gc_until_fault(&mut t);
    disk.set_faults(SimFaults::default());
    disk.crash();
    let mut back = recover(&disk, &entries, &[]);
    let runs = HybridTier::stats(&back).gc_runs;
    let mut steps = 0;
    while back.background_step() {
        steps += 1;
        assert!(steps < 10_000, "GC does not finish");
    }
    assert!(back.take_fault().is_none());
    assert!(
        HybridTier::stats(&back).gc_runs > runs,
        "GC emptied segments again"
    );
    check(&back, &model, "after GC on the recovered tier");
}
