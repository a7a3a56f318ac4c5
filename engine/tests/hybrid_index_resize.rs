//! The hybrid index follows `storage.index_keys` across a restart: a tier
//! checkpointed with one size and reloaded with another rebuilds its
//! index at the new size from the keys in its segments (spilled keys move
//! into a larger table; a smaller one spills), writes the new size in its
//! next checkpoint, and keeps the old index whole when a record cannot be
//! read or holds a key that does not match its entry.

use common::hybrid::{checkpoint, get, key, layout_buckets, put, reload, settings, value, Entries};
use ringkv_engine::hash::fnv1a64;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::tier::hybrid::index::buckets_for;
use ringkv_engine::tier::{HybridSettings, HybridStats, HybridTier, Tier};
use ringkv_engine::{Engine, Op, OpResult};
use std::collections::BTreeSet;

mod common;

/// More keys than an index for 10,000 holds without spilling.
const KEYS: u64 = 15_000;
/// Keys 0..EXPIRING are written with an expiry time.
const EXPIRING: u64 = 100;
const EXPIRES_AT_MS: u64 = 1_000_000;

fn with_index_keys(index_keys: u64) -> HybridSettings {
    HybridSettings {
        index_keys,
        ..settings(64 << 10)
    }
}

/// A tier with an index for 10,000 keys holding KEYS keys (some spilled),
/// and its checkpoint.
fn filled(disk: &SimDisk) -> (HybridStats, Entries) {
    let mut t = HybridTier::new(disk.clone(), with_index_keys(10_000)).expect("tier");
    for i in 0..KEYS {
        let (k, v) = (key(i), value(i, 0));
        let at = (i < EXPIRING).then_some(EXPIRES_AT_MS);
        assert!(t.put_expiring(fnv1a64(&k), &k, &v, at, common::hybrid::lsn()));
    }
    let entries = checkpoint(&mut t);
    assert_eq!(layout_buckets(&entries), buckets_for(10_000) as u64);
    let stats = t.stats();
    assert!(stats.spilled_keys > 0, "{stats:?}");
    (stats, entries)
}

/// Every key reads back its value of `round` (or its delete).
fn check_all(t: &dyn Tier, round: impl Fn(u64) -> Option<u64>) {
    for i in 0..KEYS {
        let want = round(i).map(|r| value(i, r));
        assert_eq!(get(t, &key(i)).as_deref(), want.as_deref(), "key {i}");
    }
}

/// The keys with an expiry time are all due past it (the expiry set,
/// keyed by record address, still names their entries).
fn check_expiring(t: &mut dyn Tier) {
    t.set_now_ms(EXPIRES_AT_MS + 1);
    let due: BTreeSet<Vec<u8>> = t.due_keys(1_000).into_iter().map(|k| k.to_vec()).collect();
    let want: BTreeSet<Vec<u8>> = (0..EXPIRING).map(key).collect();
    assert_eq!(due, want);
    t.set_now_ms(0);
}

#[test]
fn a_larger_index_keys_grows_the_index_and_takes_the_spilled_keys_in() {
    common::init_log();
    let disk = SimDisk::new(11);
    let (before, entries) = filled(&disk);

    let mut t = reload(&disk, with_index_keys(200_000), &entries);
    let s = t.stats();
    // Entries, not keys: a new key whose tag matched a cold entry of
    // another key left that entry unresolved (blind writes).
    assert_eq!(s.keys + s.unresolved_entries, KEYS);
    assert_eq!(s.spilled_keys, 0, "{s:?}");
    assert!(s.index_bytes > before.index_bytes, "{s:?} vs {before:?}");
    // One read per segment header, then the segments read in runs of
    // many records, not one read per record.
    assert!(
        s.device_reads <= 3 * s.segments,
        "{} reads for {} segments",
        s.device_reads,
        s.segments
    );
    // Nothing of the values was cached by the rebuild.
    assert_eq!(s.cache_records, 0);
    check_all(&t, |_| Some(0));
    check_expiring(&mut t);

    // The resized index takes writes: overwrite a third, delete a tenth.
    for i in (0..KEYS).step_by(3) {
        // Blind: whether the key was new is not known without a read.
        put(&mut t, &key(i), &value(i, 1));
    }
    for i in (1..KEYS).step_by(10) {
        assert!(t.delete(fnv1a64(&key(i)), &key(i), common::hybrid::lsn()));
    }
    let round = |i: u64| match (i % 3, i % 10) {
        (_, 1) => None,
        (0, _) => Some(1),
        _ => Some(0),
    };
    check_all(&t, round);

    // The next checkpoint writes the new size; loading it rebuilds nothing.
    let entries = checkpoint(&mut t);
    assert_eq!(layout_buckets(&entries), buckets_for(200_000) as u64);
    drop(t);
    let t = reload(&disk, with_index_keys(200_000), &entries);
    let s = t.stats();
    assert_eq!(s.device_reads, s.segments, "only the segment headers read");
    assert_eq!(s.spilled_keys, 0);
    // `keys` leaves out unresolved entries: older versions the blind
    // overwrites left, and the few keys that share a tag with one.
    let live = (0..KEYS).filter(|&i| round(i).is_some()).count() as u64;
    assert!(
        s.keys <= live && s.keys + s.unresolved_entries >= live,
        "{s:?}"
    );
    check_all(&t, round);
}

#[test]
fn a_smaller_index_keys_shrinks_the_index_and_spills_what_does_not_fit() {
    common::init_log();
    let disk = SimDisk::new(12);
    let (before, entries) = filled(&disk);

    let mut t = reload(&disk, with_index_keys(1_000), &entries);
    let s = t.stats();
    // Entries, not keys: a new key whose tag matched a cold entry of
    // another key left that entry unresolved (blind writes).
    assert_eq!(s.keys + s.unresolved_entries, KEYS);
    assert!(s.spilled_keys > before.spilled_keys, "{s:?} vs {before:?}");
    check_all(&t, |_| Some(0));
    check_expiring(&mut t);

    let entries = checkpoint(&mut t);
    assert_eq!(layout_buckets(&entries), buckets_for(1_000) as u64);
    drop(t);
    let t = reload(&disk, with_index_keys(1_000), &entries);
    let again = t.stats();
    assert_eq!(
        again.device_reads, again.segments,
        "only the segment headers read"
    );
    assert_eq!(again.spilled_keys, s.spilled_keys);
    check_all(&t, |_| Some(0));
}

#[test]
fn a_damaged_record_keeps_the_old_index_whole() {
    common::init_log();
    let disk = SimDisk::new(13);
    let (before, entries) = filled(&disk);
    let seg = disk
        .files()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .min()
        .expect("a segment");
    assert!(disk.corrupt(&seg, 3 * 4096 + 100, 4));

    let mut t = reload(&disk, with_index_keys(200_000), &entries);
    let s = t.stats();
    // Entries, not keys: a new key whose tag matched a cold entry of
    // another key left that entry unresolved (blind writes).
    assert_eq!(s.keys + s.unresolved_entries, KEYS);
    assert_eq!(s.index_bytes, before.index_bytes, "the old index stays");
    assert_eq!(s.spilled_keys, before.spilled_keys);
    // Every key reads its value, or answers an error (never a wrong value).
    let mut missing = Vec::new();
    for i in 0..KEYS {
        match get(&t, &key(i)) {
            Some(v) => assert_eq!(v, value(i, 0), "key {i}"),
            None => missing.push(key(i)),
        }
    }
    let errors: Vec<Vec<u8>> = t
        .take_read_errors()
        .into_iter()
        .map(|(k, _)| k.to_vec())
        .collect();
    assert_eq!(missing, errors, "only the damaged block's keys fail");
    // A block holds a handful of records (the damaged one: 5).
    assert!(!missing.is_empty() && missing.len() <= 8, "{missing:?}");
    // The next checkpoint keeps the old size too.
    let entries = checkpoint(&mut t);
    assert_eq!(layout_buckets(&entries), buckets_for(10_000) as u64);
}

#[test]
fn an_entry_whose_record_holds_another_key_keeps_the_old_index() {
    common::init_log();
    let disk = SimDisk::new(14);
    let (before, mut entries) = filled(&disk);
    // Swap the addresses of two entries of partition 0 with different
    // tags: each now names a record whose key does not hash to it.
    let mut chunk_key = b"\0hybrid/index/".to_vec();
    chunk_key.extend_from_slice(&0u32.to_le_bytes());
    chunk_key.extend_from_slice(&0u32.to_le_bytes());
    let (_, chunk, _) = entries
        .iter_mut()
        .find(|(k, _, _)| *k == chunk_key)
        .expect("partition 0's first chunk");
    let slots = chunk.len() / 49 * 8;
    let tag = |c: &[u8], s: usize| u16::from_le_bytes([c[2 * s], c[2 * s + 1]]) & 0x7FFF;
    let addr_at = |s: usize| 2 * slots + 4 * s;
    let used: Vec<usize> = (0..slots)
        .filter(|&s| chunk[addr_at(s)..addr_at(s) + 4] != [0; 4])
        .collect();
    let (a, b) = (
        used[0],
        *used
            .iter()
            .find(|&&s| tag(chunk, s) != tag(chunk, used[0]))
            .expect("two tags"),
    );
    for i in 0..4 {
        chunk.swap(addr_at(a) + i, addr_at(b) + i);
    }

    let t = reload(&disk, with_index_keys(200_000), &entries);
    let s = t.stats();
    // Entries, not keys: a new key whose tag matched a cold entry of
    // another key left that entry unresolved (blind writes).
    assert_eq!(s.keys + s.unresolved_entries, KEYS);
    assert_eq!(s.index_bytes, before.index_bytes, "the old index stays");
    // The two keys of the swapped entries are not found; every other key
    // reads its value.
    let missing = (0..KEYS)
        .filter(|&i| match get(&t, &key(i)) {
            Some(v) => {
                assert_eq!(v, value(i, 0), "key {i}");
                false
            }
            None => true,
        })
        .count();
    assert_eq!(missing, 2);
}

#[test]
fn an_engine_restarted_with_a_larger_index_keys_unspills() {
    common::init_log();
    const N: u64 = 12_000;
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = |index_keys: u64| {
        let mut c = tunables::Config {
            shards: 1,
            ..Default::default()
        };
        c.storage.data_dir = tmp.path().join("data");
        c.storage.durability = tunables::Durability::Sync;
        c.storage.tier = tunables::Tier::Hybrid;
        c.storage.cache_bytes = tunables::ByteSize::kib(256);
        c.storage.value_segment_size = tunables::ByteSize::mib(1);
        c.storage.index_keys = index_keys;
        c.limits.value_bytes_max = tunables::ByteSize::kib(64);
        c.storage.wal_segment_size = tunables::ByteSize::mib(4);
        c.storage.checkpoint_wal_bytes = tunables::ByteSize::mib(1);
        c
    };
    let val = |i: u64| bytes::Bytes::from(format!("{i:0>300}"));
    let put_all = |e: &Engine, keys: std::ops::Range<u64>| {
        let checkpoints = e.metrics().shards[0].checkpoints;
        let keys: Vec<u64> = keys.collect();
        for chunk in keys.chunks(500) {
            let ops = chunk
                .iter()
                .map(|&i| Op::Put {
                    key: key(i).into(),
                    value: val(i),
                })
                .collect();
            let answers = e.handle().batch_blocking(ops).expect("puts");
            assert!(answers.iter().all(|a| matches!(a, OpResult::Ok)));
        }
        // More than checkpoint_wal_bytes was written: wait for the
        // checkpoint.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while e.metrics().shards[0].checkpoints == checkpoints {
            assert!(std::time::Instant::now() < deadline, "no checkpoint");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    let check_all = |e: &Engine, keys: std::ops::Range<u64>| {
        let keys: Vec<u64> = keys.collect();
        for chunk in keys.chunks(500) {
            let ops = chunk
                .iter()
                .map(|&i| Op::Get { key: key(i).into() })
                .collect();
            let answers = e.handle().batch_blocking(ops).expect("gets");
            for (&i, a) in chunk.iter().zip(answers) {
                assert!(matches!(a, OpResult::Value(v) if v == val(i)), "key {i}");
            }
        }
    };
    // The shard publishes the tier's counters every 100 ms: wait for ones
    // that count every key (before any GET, so reads are recovery's).
    let hybrid = |e: &Engine, keys: u64| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let s = e.metrics().shards[0].hybrid;
            match s {
                // Index entries: blind writes (and their replay) leave
                // older versions and entries of keys that share a tag
                // unresolved until settled.
                Some(s) if s.keys + s.unresolved_entries >= keys => return s,
                _ => assert!(std::time::Instant::now() < deadline, "{s:?}"),
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };

    let e = Engine::open(&config(1_024)).expect("open");
    put_all(&e, 0..N);
    let s = hybrid(&e, N);
    assert!(s.spilled_keys > 0, "{s:?}");
    e.shutdown().expect("shutdown");

    // Recovery loads the small index and rebuilds it from the segments.
    let e = Engine::open(&config(100_000)).expect("reopen");
    assert!(e.metrics().shards[0].recovery_snapshot_entries > 0);
    let s = hybrid(&e, N);
    assert_eq!(s.spilled_keys, 0, "{s:?}");
    assert!(s.device_reads > s.segments, "the records were read: {s:?}");
    check_all(&e, 0..N);
    put_all(&e, N..2 * N);
    e.shutdown().expect("shutdown");

    // From the checkpoint written since, at the new size (the WAL replay
    // reads records too, so reads do not tell whether it was rebuilt
    // again: the tier tests check that).
    let e = Engine::open(&config(100_000)).expect("reopen");
    let s = hybrid(&e, 2 * N);
    assert_eq!(s.spilled_keys, 0, "{s:?}");
    check_all(&e, 0..2 * N);
    e.shutdown().expect("shutdown");
}
