//! The hybrid tier on its own, on the simulated disk: values round-trip
//! through segment files, keys with the same tag stay apart, a
//! checkpoint's entries rebuild the tier, GC keeps every live value, and
//! damaged blocks or failed reads answer errors, never wrong values.

use bytes::Bytes;
use common::hybrid::{
    checkpoint, checkpoint_of, get, key, put, reload, reload_chain, run_settles, settings, value,
    CheckpointEntry, Entries, SHARED_TAG,
};
use ringkv_engine::hash::fnv1a64;
use ringkv_engine::io::sim::{SimDisk, SimFaults};
use ringkv_engine::tier::{HybridSettings, HybridTier, Tier};
use std::collections::BTreeMap;

mod common;

fn load(disk: &SimDisk, entries: &[(Vec<u8>, Vec<u8>, Option<u64>)]) -> HybridTier<SimDisk> {
    reload(disk, settings(64 << 10), entries)
}

#[test]
fn values_round_trip_through_segments_with_a_small_cache() {
    let disk = SimDisk::new(1);
    let mut t = HybridTier::new(disk.clone(), settings(32 << 10)).expect("tier");
    let mut model = BTreeMap::new();
    for i in 0..3_000 {
        assert!(put(&mut t, &key(i), &value(i, 0)));
        model.insert(key(i), value(i, 0));
    }
    // Overwrite a third, delete a tenth.
    for i in (0..3_000).step_by(3) {
        // An overwrite of a key not in RAM is a blind write: the answer
        // "was it new" is not known then.
        put(&mut t, &key(i), &value(i, 1));
        model.insert(key(i), value(i, 1));
    }
    for i in (0..3_000).step_by(10) {
        assert_eq!(
            t.delete(fnv1a64(&key(i)), &key(i), common::hybrid::lsn()),
            model.remove(&key(i)).is_some()
        );
    }
    assert_eq!(t.len(), model.len() as u64);
    for i in 0..3_100 {
        assert_eq!(
            get(&t, &key(i)).as_deref(),
            model.get(&key(i)).map(|v| &v[..]),
            "key {i}"
        );
    }
    let stats = t.stats();
    assert!(stats.segments >= 5, "{stats:?}");
    assert!(
        stats.device_reads > 1_000,
        "values came from the device: {stats:?}"
    );
    assert!(stats.cache_bytes <= 32 << 10);
    assert!(t.take_read_errors().is_empty());
}

#[test]
fn keys_with_the_same_tag_stay_apart() {
    let disk = SimDisk::new(2);
    // An index of four buckets per partition, where the six SHARED_TAG
    // keys share partition, home bucket and tag: every entry of theirs is
    // a candidate for each of them. (Each key's hash is its table hash: a
    // record whose key hashes elsewhere than its entry is a dangling
    // entry, an error, so keys cannot be given one made-up hash.)
    let small = HybridSettings {
        index_keys: 1_000,
        ..settings(0)
    };
    let mut t = HybridTier::new(disk.clone(), small.clone()).expect("tier");
    let keys: Vec<&[u8]> = SHARED_TAG.iter().map(|k| k.as_bytes()).collect();
    for (i, k) in keys.iter().enumerate() {
        assert!(put(&mut t, k, &value(i as u64, 0)), "key {i} is new");
    }
    for (i, k) in keys.iter().enumerate().step_by(2) {
        assert!(!put(&mut t, k, &value(i as u64, 1)), "key {i} existed");
    }
    assert!(t.delete(fnv1a64(keys[3]), keys[3], common::hybrid::lsn()));
    assert!(!t.delete(fnv1a64(keys[3]), keys[3], common::hybrid::lsn()));
    assert_eq!(t.len(), 5);
    for (i, k) in keys.iter().enumerate() {
        let want = match i {
            3 => None,
            i if i % 2 == 0 => Some(value(i as u64, 1)),
            i => Some(value(i as u64, 0)),
        };
        assert_eq!(get(&t, k).as_deref(), want.as_deref(), "key {i}");
    }
    assert_eq!(get(&t, b"never written"), None);
    assert!(t.take_read_errors().is_empty());
    // They do share the tag: a blind put of one, with nothing in RAM,
    // leaves every live entry of the six unresolved beside its new one.
    let mut t = reload(&disk, small, &checkpoint(&mut t));
    put(&mut t, keys[1], &value(1, 2));
    assert_eq!(t.stats().unresolved_entries, 5);
    assert_eq!(get(&t, keys[1]).as_deref(), Some(&value(1, 2)[..]));
    assert_eq!(get(&t, keys[4]).as_deref(), Some(&value(4, 1)[..]));
}

#[test]
fn a_checkpoint_rebuilds_the_tier_without_its_values() {
    let disk = SimDisk::new(3);
    let mut t = HybridTier::new(disk.clone(), settings(1 << 20)).expect("tier");
    for i in 0..2_000 {
        put(&mut t, &key(i), &value(i, 0));
    }
    t.put_expiring(
        fnv1a64(b"ttl"),
        b"ttl",
        b"v",
        Some(u64::MAX / 2),
        common::hybrid::lsn(),
    );
    let entries = checkpoint(&mut t);
    let bytes: usize = entries.iter().map(|(k, v, _)| k.len() + v.len()).sum();
    let values: usize = (0..2_000).map(|i| value(i, 0).len()).sum();
    assert!(
        bytes * 5 < values,
        "the checkpoint holds {bytes} bytes for {values} of values"
    );
    // Power loss after the checkpoint: what it points at is durable.
    disk.crash();
    let back = load(&disk, &entries);
    assert_eq!(back.len(), 2_001);
    for i in 0..2_000 {
        assert_eq!(
            get(&back, &key(i)).as_deref(),
            Some(&value(i, 0)[..]),
            "key {i}"
        );
    }
    assert_eq!(back.expiring_count(), 1);
    assert_eq!(
        back.get_expiring(fnv1a64(b"ttl"), b"ttl"),
        Some((Bytes::from_static(b"v"), Some(u64::MAX / 2)))
    );
}

#[test]
fn index_deltas_loaded_over_their_checkpoint_give_the_tier_back() {
    let disk = SimDisk::new(31);
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    let mut model = BTreeMap::new();
    for i in 0..3_000 {
        put(&mut t, &key(i), &value(i, 0));
        model.insert(key(i), value(i, 0));
    }
    let full = checkpoint_of(&mut t, false);
    let mut deltas = Vec::new();
    for round in 1..4u64 {
        // Overwrite and delete a slice, add new keys, and let GC move
        // records (its repoints must be in the next delta too).
        for i in (round * 200)..(round * 200 + 300) {
            put(&mut t, &key(i), &value(i, round));
            model.insert(key(i), value(i, round));
        }
        for i in (round * 700)..(round * 700 + 50) {
            t.delete(fnv1a64(&key(i)), &key(i), common::hybrid::lsn());
            model.remove(&key(i));
        }
        for i in (3_000 + round * 100)..(3_000 + round * 100 + 100) {
            put(&mut t, &key(i), &value(i, round));
            model.insert(key(i), value(i, round));
        }
        for _ in 0..20 {
            t.background_step();
        }
        deltas.push(checkpoint_of(&mut t, true));
    }
    let bytes = |e: &Entries| -> usize { e.iter().map(|(k, v, _)| k.len() + v.len()).sum() };
    for d in &deltas {
        assert!(
            bytes(d) < bytes(&full),
            "a delta is smaller than the full copy"
        );
    }
    disk.crash();
    let mut chain: Vec<&[CheckpointEntry]> = vec![&full];
    chain.extend(deltas.iter().map(|d| d.as_slice()));
    let back = reload_chain(&disk, settings(0), &chain);
    for i in 0..3_500 {
        assert_eq!(
            get(&back, &key(i)).as_deref(),
            model.get(&key(i)).map(|v| &v[..]),
            "key {i}"
        );
    }
    // Without the last delta, its changes are missing: each file counts.
    let back = reload_chain(&disk, settings(0), &chain[..chain.len() - 1]);
    let differ = (0..3_500u64)
        .filter(|&i| get(&back, &key(i)).as_deref() != model.get(&key(i)).map(|v| &v[..]))
        .count();
    assert!(differ > 0);
}

#[test]
fn a_wal_replay_overwrites_cold_keys_without_reading_past_the_bound() {
    let disk = SimDisk::new(32);
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    for i in 0..500 {
        put(&mut t, &key(i), &value(i, 0));
    }
    let entries = checkpoint(&mut t);
    disk.crash();
    // Recovery: the checkpoint, then a replay of 200 overwrites of cold
    // keys, far more than the 8 unresolved entries allowed in service.
    let mut back = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    back.set_unresolved_max(8);
    for (k, v, at) in &entries {
        back.load_checkpoint_entry(k, v, *at).expect("entry");
    }
    back.load_checkpoint_done().expect("chain");
    let reads = back.stats().device_reads;
    back.replay_begin();
    for i in 0..200 {
        put(&mut back, &key(i), &value(i, 1));
    }
    assert_eq!(back.stats().device_reads, reads, "the replay read records");
    assert!(back.stats().unresolved_entries > 8);
    back.recovery_done();
    // In service the bound holds again: an overwrite of a cold key does not
    // read either, but queues a settling read, which drops its older entry.
    let (reads, unresolved) = (back.stats().device_reads, back.stats().unresolved_entries);
    put(&mut back, &key(400), &value(400, 2));
    assert_eq!(back.stats().device_reads, reads, "the put read");
    assert_eq!(back.stats().unresolved_entries, unresolved + 1);
    assert_eq!(run_settles(&mut back), 1);
    assert!(back.stats().device_reads > reads);
    assert_eq!(back.stats().unresolved_entries, unresolved);
    for i in 0..500 {
        let round = match i {
            0..200 => 1,
            400 => 2,
            _ => 0,
        };
        assert_eq!(
            get(&back, &key(i)).as_deref(),
            Some(&value(i, round)[..]),
            "key {i}"
        );
    }
}

#[test]
fn gc_keeps_every_live_value_and_frees_space_after_two_checkpoints() {
    let disk = SimDisk::new(4);
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    let mut model = BTreeMap::new();
    for round in 0..6 {
        for i in 0..800 {
            put(&mut t, &key(i), &value(i, round));
            model.insert(key(i), value(i, round));
        }
    }
    let before = t.stats();
    let mut runs = 0;
    while t.background_step() {
        runs += 1;
        assert!(runs < 1_000, "GC does not converge");
    }
    assert!(runs > 0, "garbage was over the bound: {before:?}");
    for (k, v) in &model {
        assert_eq!(get(&t, k).as_deref(), Some(&v[..]));
    }
    let files_before = disk.files().len();
    checkpoint(&mut t);
    checkpoint(&mut t);
    let after = t.stats();
    assert!(
        disk.files().len() < files_before,
        "emptied segments were removed"
    );
    assert!(
        after.segment_bytes < before.segment_bytes,
        "{before:?} -> {after:?}"
    );
    assert!(after.gc_bytes_read > 0 && after.gc_bytes_written > 0);
    // And a restart from the last checkpoint still has every value.
    let entries = checkpoint(&mut t);
    disk.crash();
    let back = load(&disk, &entries);
    for (k, v) in &model {
        assert_eq!(get(&back, k).as_deref(), Some(&v[..]));
    }
}

#[test]
fn a_damaged_block_is_an_error_naming_the_file_never_a_wrong_value() {
    let disk = SimDisk::new(5);
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    for i in 0..500 {
        put(&mut t, &key(i), &value(i, 0));
    }
    let entries = checkpoint(&mut t);
    let seg = disk
        .files()
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .expect("a segment");
    // Damage one payload byte of the second block.
    assert!(disk.corrupt(&seg, 4096 + 100, 1));
    let mut back = load(&disk, &entries);
    let mut errors = 0;
    for i in 0..500 {
        match get(&back, &key(i)) {
            Some(v) => assert_eq!(&v[..], &value(i, 0)[..], "key {i}"),
            None => {
                let e = back.take_read_errors();
                assert_eq!(e.len(), 1, "key {i}: {e:?}");
                assert_eq!(e[0].0.as_ref(), &key(i)[..]);
                assert!(e[0].1.contains(&seg.display().to_string()), "{}", e[0].1);
                assert!(e[0].1.contains("checksum"), "{}", e[0].1);
                errors += 1;
            }
        }
    }
    assert!(
        errors > 0 && errors < 20,
        "{errors} keys in the damaged block"
    );
}

#[test]
fn read_errors_are_answered_per_key_and_the_tier_keeps_serving() {
    let disk = SimDisk::new(6);
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    for i in 0..300 {
        put(&mut t, &key(i), &value(i, 0));
    }
    checkpoint(&mut t);
    disk.set_faults(SimFaults {
        read_error_probability: 0.5,
        path_filter: Some(".seg".into()),
        ..SimFaults::default()
    });
    let (mut ok, mut failed) = (0, 0);
    for i in 0..300 {
        match get(&t, &key(i)) {
            Some(v) => {
                assert_eq!(&v[..], &value(i, 0)[..]);
                ok += 1;
            }
            None => {
                assert_eq!(t.take_read_errors().len(), 1);
                failed += 1;
            }
        }
    }
    assert!(ok > 50 && failed > 50, "ok {ok}, failed {failed}");
    disk.set_faults(SimFaults::default());
    for i in 0..300 {
        assert_eq!(get(&t, &key(i)).as_deref(), Some(&value(i, 0)[..]));
    }
}

#[test]
fn a_failed_segment_write_is_a_fault_and_nothing_is_lost_from_ram() {
    let disk = SimDisk::new(7);
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    disk.set_faults(SimFaults {
        fail_write_after: Some(0),
        path_filter: Some(".seg".into()),
        ..SimFaults::default()
    });
    let mut i = 0;
    while t.take_fault().is_none() {
        put(&mut t, &key(i), &value(i, 0));
        i += 1;
        assert!(i < 10_000, "no fault reported");
    }
}

#[test]
fn a_checkpoint_and_a_crash_in_the_middle_of_a_gc_lose_nothing() {
    let disk = SimDisk::new(8);
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    let mut model = BTreeMap::new();
    // Later rounds overwrite the even keys only: the oldest segments keep
    // the odd keys live, so GC has records to move.
    for round in 0..8 {
        for i in (0..800).filter(|i| round == 0 || i % 2 == 0) {
            put(&mut t, &key(i), &value(i, round));
            model.insert(key(i), value(i, round));
        }
    }
    // Two GC steps: a 1 MiB segment takes four, so the victim is half done.
    assert!(t.background_step());
    assert!(t.background_step());
    assert_eq!(t.stats().gc_runs, 0, "the victim is not finished yet");
    assert!(t.stats().gc_bytes_written > 0, "live records were moved");
    let entries = checkpoint(&mut t);
    // Overwrite some keys after the checkpoint: they are lost by the crash
    // (the WAL would replay them), the checkpoint's state must hold.
    for i in 0..50 {
        put(&mut t, &key(i), &value(i, 99));
    }
    disk.crash();
    let mut back = load(&disk, &entries);
    for (k, v) in &model {
        assert_eq!(get(&back, k).as_deref(), Some(&v[..]));
    }
    // GC goes on from scratch after the restart and converges.
    let mut steps = 0;
    while back.background_step() {
        steps += 1;
        assert!(steps < 1_000, "GC does not converge");
    }
    assert!(back.stats().gc_runs > 0);
    for (k, v) in &model {
        assert_eq!(get(&back, k).as_deref(), Some(&v[..]));
    }
}

#[test]
fn key_walks_and_due_keys_read_the_records_back() {
    let disk = SimDisk::new(9);
    let mut t = HybridTier::new(disk, settings(0)).expect("tier");
    for i in 0..1_000 {
        put(&mut t, &key(i), &value(i, 0));
    }
    for i in 0..10 {
        let k = format!("ttl-{i}").into_bytes();
        t.put_expiring(
            fnv1a64(&k),
            &k,
            b"v",
            Some(1_000 + i),
            common::hybrid::lsn(),
        );
    }
    checkpoint(&mut t);
    t.set_now_ms(1_005);
    let mut seen = BTreeMap::new();
    for p in 0..t.partition_count() {
        t.visit_partition(p, &mut |k, v, _| {
            seen.insert(k.to_vec(), v.to_vec());
        });
    }
    // Every plain key with its value, and the four TTL keys not yet expired.
    assert_eq!(seen.len(), 1_004);
    for i in 0..1_000 {
        assert_eq!(seen.get(&key(i)), Some(&value(i, 0)), "key {i}");
    }
    let mut due: Vec<Bytes> = t.due_keys(100);
    due.sort();
    let want: Vec<Bytes> = (0..6).map(|i| Bytes::from(format!("ttl-{i}"))).collect();
    assert_eq!(due, want);
}

/// Every record carries the LSN of the write that made it, and GC's copies
/// keep it: after GC, the segments written by GC alone hold each live
/// key's record with the LSN of the key's last write (a copy written
/// with no LSN, or another write's, fails).
#[test]
fn gc_copies_keep_the_lsn_of_the_write() {
    use ringkv_engine::io::real::RealDisk;
    use ringkv_engine::tier::hybrid::log::{SegState, ValueLog};
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("values");
    let mut s = settings(0);
    s.dir = dir.clone();
    let mut t = HybridTier::new(RealDisk, s.clone()).expect("tier");
    let mut last: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let mut lsn = 1_000u64;
    for round in 0..3u64 {
        for i in 0..1_500u64 {
            if round > 0 && i % 3 == 0 {
                continue;
            }
            lsn += 1;
            t.put(fnv1a64(&key(i)), &key(i), &value(i, round), lsn);
            last.insert(key(i), lsn);
        }
    }
    checkpoint(&mut t);
    let seqs = |dir: &std::path::Path| -> Vec<u64> {
        let mut v: Vec<u64> = std::fs::read_dir(dir)
            .expect("read_dir")
            .filter_map(|e| {
                let name = e.expect("entry").file_name().into_string().ok()?;
                name.strip_suffix(".seg")?.parse().ok()
            })
            .collect();
        v.sort();
        v
    };
    let written_by_puts = *seqs(&dir).last().expect("segments");
    while t.background_step() {}
    checkpoint(&mut t);
    assert!(t.stats().gc_bytes_written > 0, "GC copied records");
    let mut log = ValueLog::new(RealDisk, dir.clone(), 0, s.segment_bytes);
    let mut copies = 0;
    for (slot, seq) in seqs(&dir).into_iter().enumerate() {
        let path = log.path_of(seq);
        let end = std::fs::metadata(&path).expect("metadata").len();
        log.open_existing(slot as u32, seq, end, 0, SegState::Sealed)
            .expect("open");
        let mut from = 0;
        while from < end {
            let (records, next) = log.scan_from(slot as u32, from, 64).expect("scan");
            for (_, r) in records {
                let lsn = r.lsn.expect("every record carries an LSN");
                if seq > written_by_puts {
                    copies += 1;
                    assert_eq!(lsn, last[&r.key[..]], "GC's copy of {:?}", r.key);
                }
            }
            from = next;
        }
    }
    assert!(copies > 100, "{copies} records copied by GC");
}

/// A replay that never leaves the active segment (a store smaller than a
/// segment, restarted with no checkpoint: every version of a key is a
/// record the replay wrote into that segment) leaves its older entries
/// unresolved there: the settling scan reads the active segment too, up
/// to where it ended when the scan began.
#[test]
fn background_steps_settle_a_replay_left_in_the_active_segment() {
    let disk = SimDisk::new(34);
    let big = HybridSettings {
        segment_bytes: 16 << 20,
        index_keys: 4_000,
        gc_garbage_percent: 100,
        ..settings(0)
    };
    let mut back = HybridTier::new(disk.clone(), big).expect("tier");
    back.set_unresolved_max(8);
    back.load_checkpoint_done().expect("no chain");
    back.replay_begin();
    for round in 0..3 {
        for i in 0..1_000 {
            put(&mut back, &key(i), &value(i, round));
        }
    }
    back.recovery_done();
    assert_eq!(back.stats().segments, 1, "the replay stayed in one segment");
    let left = back.stats().unresolved_entries;
    assert!(left >= 1_000, "the replay left {left} entries unresolved");
    back.set_unresolved_max(0);
    let mut steps = 0;
    while back.background_step() {
        steps += 1;
        assert!(steps < 10_000, "the settling scan does not end");
    }
    assert_eq!(back.stats().unresolved_entries, 0);
    assert_eq!(back.len(), 1_000);
    // A put after the round is read back over the settled entries.
    put(&mut back, &key(0), &value(0, 9));
    for i in 0..1_000 {
        let round = if i == 0 { 9 } else { 2 };
        assert_eq!(
            get(&back, &key(i)).as_deref(),
            Some(&value(i, round)[..]),
            "key {i}"
        );
    }
    assert!(back.take_read_errors().is_empty());
}

#[test]
fn background_steps_settle_what_a_replay_left_unresolved() {
    let disk = SimDisk::new(33);
    // No GC: only the settling scan can settle what the replay leaves.
    // Four buckets per partition, so the SHARED_TAG keys share a tag.
    let small = HybridSettings {
        index_keys: 1_000,
        gc_garbage_percent: 100,
        ..settings(0)
    };
    let mut t = HybridTier::new(disk.clone(), small.clone()).expect("tier");
    let shared: Vec<&[u8]> = SHARED_TAG.iter().map(|k| k.as_bytes()).collect();
    for i in 0..400 {
        put(&mut t, &key(i), &value(i, 0));
    }
    for (i, k) in shared.iter().enumerate() {
        put(&mut t, k, &value(1000 + i as u64, 0));
    }
    let entries = checkpoint(&mut t);
    disk.crash();
    let mut back = HybridTier::new(disk.clone(), small).expect("tier");
    back.set_unresolved_max(8);
    for (k, v, at) in &entries {
        back.load_checkpoint_entry(k, v, *at).expect("entry");
    }
    back.load_checkpoint_done().expect("chain");
    // The replay: 300 keys overwritten, and one of the keys sharing a tag
    // (the other five's entries become unresolved though they are theirs).
    back.replay_begin();
    for i in 0..300 {
        put(&mut back, &key(i), &value(i, 1));
    }
    put(&mut back, shared[2], &value(1002, 1));
    back.recovery_done();
    let left = back.stats().unresolved_entries;
    assert!(left >= 300, "the replay left {left} entries unresolved");
    // A bound of none: every entry is settled, the shared tag's too.
    back.set_unresolved_max(0);
    let sets_before = back.stats().blind_sets_bytes;
    let mut steps = 0;
    while back.background_step() {
        steps += 1;
        assert!(steps < 10_000, "the settling scan does not end");
    }
    let s = back.stats();
    assert_eq!(s.unresolved_entries, 0);
    assert!(
        s.blind_sets_bytes < sets_before / 4,
        "the set kept its table: {} bytes, {sets_before} before",
        s.blind_sets_bytes
    );
    assert_eq!(back.len(), 406);
    for i in 0..400 {
        let round = if i < 300 { 1 } else { 0 };
        assert_eq!(
            get(&back, &key(i)).as_deref(),
            Some(&value(i, round)[..]),
            "key {i}"
        );
    }
    for (i, k) in shared.iter().enumerate() {
        let round = if i == 2 { 1 } else { 0 };
        assert_eq!(
            get(&back, k).as_deref(),
            Some(&value(1000 + i as u64, round)[..]),
            "shared key {i}"
        );
    }
    assert!(back.take_read_errors().is_empty());
}
