//! The hybrid tier when a segment write fails or a record cannot be read,
//! on the simulated disk: a transaction whose writes did not reach the
//! tier is not acknowledged, and its keys do not read their older values;
//! a delete that cannot read one of its candidates still removes its key;
//! an entry whose record is another key's never lets a read fall through
//! to an older version, a delete of its key leaves it absent, GC never
//! settles an older version behind it, and walks do not list it; an emptied segment stays while a kept snapshot
//! may point into it, and a snapshot chain whose index points into a
//! segment removed since is refused; keys with a TTL stay due through a
//! GC that raced a checkpoint and through a failed read.

mod common;

use bytes::Bytes;
use common::hybrid::{
    checkpoint, checkpoint_of, get, key, put, reload, settings, value, Entries, SHARED_TAG,
};
use ringkv_engine::hash::fnv1a64;
use ringkv_engine::io::sim::{SimDisk, SimFaults};
use ringkv_engine::tier::{ColdAnswer, HybridSettings, HybridTier, Tier};
use ringkv_engine::{Engine, OpError, TxnError, TxnSettings};
use std::path::Path;

/// One hybrid shard, values up to 64 KiB, no checkpoint and no GC while a
/// test runs (their segment writes would meet the injected fault first).
fn txn_config() -> tunables::Config {
    let mut c = common::small_config(Path::new("/h"), 1, tunables::Durability::Sync);
    c.storage.tier = tunables::Tier::Hybrid;
    c.storage.value_segment_size = tunables::ByteSize::mib(1);
    c.storage.cache_bytes = tunables::ByteSize(0);
    c.storage.index_keys = 10_000;
    c.storage.gc_garbage_percent = 95;
    c.storage.wal_segment_size = tunables::ByteSize::mib(8);
    c.storage.checkpoint_wal_bytes = tunables::ByteSize::mib(256);
    c.limits.value_bytes_max = tunables::ByteSize::kib(64);
    c.storage.group_commit_max_bytes = tunables::ByteSize::kib(128);
    c
}

fn txn_key(i: u64) -> Bytes {
    Bytes::from(format!("account-{i:04}"))
}

/// 60 KiB naming its key and round: a chunk of the segment buffer fills
/// every 17 records.
fn txn_value(i: u64, round: u64) -> Bytes {
    let mut v = format!("{i}/{round}/").into_bytes();
    v.resize(60 * 1024, (i + round) as u8);
    Bytes::from(v)
}

#[test]
fn a_commit_whose_tier_write_failed_is_an_error_and_its_key_never_reads_the_older_value() {
    let disk = SimDisk::new(28);
    let config = txn_config();
    const KEYS: u64 = 40;
    let failed_at;
    {
        let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
        let h = engine.handle();
        for i in 0..KEYS {
            pollster::block_on(h.put(txn_key(i), txn_value(i, 1))).expect("put");
        }
        // The next write of a value segment fails: the commit that makes
        // the buffer spill cannot apply its write to the tier.
        disk.set_faults(SimFaults {
            fail_write_after: Some(0),
            path_filter: Some(".seg".into()),
            ..SimFaults::default()
        });
        let mut failed = None;
        for i in 0..KEYS {
            let mut txn = h.begin(TxnSettings::default());
            pollster::block_on(txn.put(txn_key(i), txn_value(i, 2))).expect("txn put");
            match pollster::block_on(txn.commit()) {
                Ok(()) => {
                    let got = pollster::block_on(h.get(txn_key(i))).expect("get");
                    assert_eq!(got, Some(txn_value(i, 2)), "key {i}: acknowledged commit");
                }
                Err(TxnError::Poisoned { shard: 0 }) => {
                    failed = Some(i);
                    break;
                }
                Err(e) => panic!("key {i}: commit answered {e}"),
            }
        }
        failed_at = failed.expect("a commit met the failed segment write");
        assert!(engine.metrics().shards[0].poisoned);
        // Its key is not served at its pre-commit value: the read waits for
        // the commit's part, which the poisoned shard never makes durable
        // (POISONED), or finds the key's write missing (VALUE_UNREADABLE).
        match pollster::block_on(h.get(txn_key(failed_at))) {
            Err(OpError::ValueUnreadable { .. } | OpError::Poisoned { .. }) => {}
            other => panic!("key {failed_at} after its failed commit: {other:?}"),
        }
        // Keys not written since the fault read as before.
        let other = pollster::block_on(h.get(txn_key(KEYS - 1))).expect("get");
        assert_eq!(other, Some(txn_value(KEYS - 1, 1)));
        let _ = engine.shutdown();
    }
    // The acknowledged commits are in the WAL. The failed one answered
    // POISONED, its outcome the restart's: with early lock release it was
    // applied before its part was durable, and the poisoned WAL may never
    // have flushed it, so the key holds round 1 or round 2, whole.
    disk.set_faults(SimFaults::default());
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("reopen");
    let h = engine.handle();
    for i in 0..KEYS {
        let got = pollster::block_on(h.get(txn_key(i))).expect("get");
        if i == failed_at {
            assert!(
                got == Some(txn_value(i, 2)) || got == Some(txn_value(i, 1)),
                "key {i} after the restart: neither its committed nor its failed value"
            );
            continue;
        }
        let round = if i < failed_at { 2 } else { 1 };
        assert_eq!(got, Some(txn_value(i, round)), "key {i} after the restart");
    }
    engine.shutdown().expect("shutdown");
}

/// The tier of [`SHARED_TAG`] tests (an index for 1,000 keys): `first`
/// written first (its record in the first block of the first segment),
/// then 300 other keys, then `last`; reloaded from a checkpoint, so
/// nothing is in RAM. Returns the tier and its checkpoint's entries.
fn tag_sharing_tier(disk: &SimDisk, first: &[u8], last: &[u8]) -> (HybridTier<SimDisk>, Entries) {
    let mut t = HybridTier::new(disk.clone(), small()).expect("tier");
    put(&mut t, first, &value(1, 0));
    for i in 0..300 {
        put(&mut t, &key(i), &value(i, 0));
    }
    put(&mut t, last, &value(0, 0));
    let entries = checkpoint(&mut t);
    (reload(disk, small(), &entries), entries)
}

fn small() -> HybridSettings {
    HybridSettings {
        index_keys: 1_000,
        ..settings(0)
    }
}

/// Damages the first record block of the first segment.
fn damage_first_block(disk: &SimDisk) {
    let seg = disk
        .files()
        .into_iter()
        .find(|p| p.ends_with("0000000000000001.seg"))
        .expect("the first segment");
    assert!(disk.corrupt(&seg, 4096 + 100, 1));
}

#[test]
fn a_delete_that_cannot_read_another_keys_record_still_removes_its_key() {
    let disk = SimDisk::new(2802);
    let (k, other) = (SHARED_TAG[0].as_bytes(), SHARED_TAG[1].as_bytes());
    let (mut t, _) = tag_sharing_tier(&disk, other, k);
    damage_first_block(&disk);
    assert_eq!(get(&t, other), None, "the other key's record is damaged");
    assert_eq!(t.take_read_errors().len(), 1);
    assert_eq!(get(&t, k).as_deref(), Some(&value(0, 0)[..]));
    // No room for blind deletes: the delete reads its candidates, and one
    // of them (the other key's) cannot be read.
    t.set_unresolved_max(0);
    t.delete_blind(fnv1a64(k), k, common::hybrid::lsn());
    assert_eq!(get(&t, k), None, "the deleted key is gone");
    t.take_read_errors();
    // (The first keys after the other one share its damaged block.)
    for i in 50..300 {
        assert_eq!(
            get(&t, &key(i)).as_deref(),
            Some(&value(i, 0)[..]),
            "key {i}"
        );
    }
    // And it stays gone through a checkpoint.
    let entries = checkpoint(&mut t);
    let back = reload(&disk, small(), &entries);
    assert_eq!(get(&back, k), None);
    // The same through the delete that answers whether the key was there:
    // it could not tell, but the key goes.
    let disk = SimDisk::new(2803);
    let (mut t, _) = tag_sharing_tier(&disk, other, k);
    damage_first_block(&disk);
    t.delete(fnv1a64(k), k, common::hybrid::lsn());
    assert_eq!(get(&t, k), None, "the deleted key is gone");
}

/// The checkpoint's index slots as (chunk index in `entries`, slot, tag
/// with its span bit, address) for every filled slot.
fn filled_slots(entries: &Entries) -> Vec<(usize, usize, u16, u32)> {
    let mut out = Vec::new();
    for (n, (k, v, _)) in entries.iter().enumerate() {
        if !k.starts_with(b"\0hybrid/index/") {
            continue;
        }
        // tags (u16 each), addresses (u32 each), one overflow byte per
        // bucket of 8 slots: 6 bytes per slot plus 1/8.
        let slots = v.len() * 8 / 49;
        for s in 0..slots {
            let tag = u16::from_le_bytes([v[2 * s], v[2 * s + 1]]);
            let at = slots * 2 + 4 * s;
            let addr = u32::from_le_bytes(v[at..at + 4].try_into().expect("4 bytes"));
            if addr != 0 {
                out.push((n, s, tag, addr));
            }
        }
    }
    out
}

fn unresolved_addrs(entries: &Entries) -> Vec<u32> {
    entries
        .iter()
        .filter(|(k, _, _)| k.starts_with(b"\0hybrid/unresolved/"))
        .flat_map(|(_, v, _)| {
            v.chunks_exact(4)
                .map(|a| u32::from_le_bytes(a.try_into().expect("4 bytes")))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A checkpoint in which "the key" has an older record (an unresolved
/// entry) and a settled entry that dangles: it points at the record of
/// "another key", whose tag differs (as an entry into a removed segment
/// whose slot was reused would). Returns the checkpoint's entries.
fn dangling_entry_checkpoint(disk: &SimDisk) -> Entries {
    let (k, other) = (b"the key".as_slice(), b"another key".as_slice());
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    put(&mut t, k, &value(0, 0));
    let entries = checkpoint(&mut t);
    // A blind overwrite: the old record stays, unresolved, behind the new.
    let mut t = reload(disk, settings(0), &entries);
    put(&mut t, k, &value(0, 1));
    put(&mut t, other, &value(1, 0));
    assert_eq!(t.stats().unresolved_entries, 1);
    let mut entries = checkpoint(&mut t);
    let slots = filled_slots(&entries);
    assert_eq!(slots.len(), 3, "{slots:?}");
    let unresolved = unresolved_addrs(&entries);
    assert_eq!(unresolved.len(), 1);
    let key_tag = slots
        .iter()
        .find(|s| s.3 == unresolved[0])
        .expect("the older entry")
        .2
        & 0x7fff;
    type Slot<'a> = &'a (usize, usize, u16, u32);
    let (newer, others): (Vec<Slot>, Vec<Slot>) = slots
        .iter()
        .filter(|s| s.3 != unresolved[0])
        .partition(|s| s.2 & 0x7fff == key_tag);
    let (newer, other_slot) = (newer[0], others[0]);
    assert_ne!(other_slot.2 & 0x7fff, key_tag, "the two keys' tags differ");
    // The key's settled entry dangles: it points at the other key's record
    // (as an entry into a removed segment whose slot was reused would).
    let (chunk, slot) = (newer.0, newer.1);
    let v = &mut entries[chunk].1;
    let slots_in_chunk = v.len() * 8 / 49;
    let tag = (newer.2 & 0x7fff) | (other_slot.2 & 0x8000);
    v[2 * slot..2 * slot + 2].copy_from_slice(&tag.to_le_bytes());
    let at = slots_in_chunk * 2 + 4 * slot;
    v[at..at + 4].copy_from_slice(&other_slot.3.to_le_bytes());
    entries
}

#[test]
fn an_entry_pointing_at_another_keys_record_is_an_error_never_the_older_version() {
    let disk = SimDisk::new(2804);
    let (k, other) = (b"the key".as_slice(), b"another key".as_slice());
    let entries = dangling_entry_checkpoint(&disk);
    // Neither read path answers the older value: the split one (the
    // records on the device) ...
    let t = reload(&disk, settings(0), &entries);
    let (answers, cold) = get_split(&t, &[k.to_vec()]);
    assert_eq!(cold, 1, "read from the device");
    match &answers[0] {
        Err(_) => {}
        a => panic!("split read answered {a:?}"),
    }
    // ... and the blocking one.
    let mut t = reload(&disk, settings(0), &entries);
    let got = get(&t, k);
    assert_ne!(got.as_deref(), Some(&value(0, 0)[..]), "blocking read");
    assert_eq!(got, None);
    assert_eq!(t.take_read_errors().len(), 1, "the read is an error");
    assert_eq!(get(&t, other).as_deref(), Some(&value(1, 0)[..]));
}

#[test]
fn a_delete_of_a_key_whose_entry_dangles_leaves_it_absent_not_unreadable() {
    let disk = SimDisk::new(2807);
    let (k, other) = (b"the key".as_slice(), b"another key".as_slice());
    let entries = dangling_entry_checkpoint(&disk);
    // Every way a delete goes: reading its candidates (Tier::delete, as
    // transactions, active expiry and updates do; a blind delete past the
    // sets' bound) or blind, with the dangling entry's record read into
    // RAM by a GET first or not.
    type Delete = fn(&mut HybridTier<SimDisk>, &[u8]);
    let deletes: [(&str, Delete, bool); 4] = [
        (
            "reading",
            |t, k| {
                t.delete(fnv1a64(k), k, common::hybrid::lsn());
            },
            false,
        ),
        (
            "past the bound",
            |t, k| {
                t.set_unresolved_max(0);
                t.delete_blind(fnv1a64(k), k, common::hybrid::lsn());
            },
            false,
        ),
        (
            "blind",
            |t, k| t.delete_blind(fnv1a64(k), k, common::hybrid::lsn()),
            false,
        ),
        (
            "blind, read first",
            |t, k| t.delete_blind(fnv1a64(k), k, common::hybrid::lsn()),
            true,
        ),
    ];
    for (how, delete, read_first) in deletes {
        let mut t = reload(&disk, settings(0), &entries);
        if read_first {
            assert_eq!(get(&t, k), None);
            assert_eq!(t.take_read_errors().len(), 1, "{how}: the entry dangles");
        }
        delete(&mut t, k);
        assert_eq!(get(&t, k), None, "{how}");
        assert!(
            t.take_read_errors().is_empty(),
            "{how}: the deleted key reads as absent, not as an error"
        );
        let (answers, _) = get_split(&t, &[k.to_vec()]);
        assert_eq!(answers[0], Ok(None), "{how}: split read");
        assert_eq!(get(&t, other).as_deref(), Some(&value(1, 0)[..]), "{how}");
        // And it stays so through a checkpoint.
        let mut back = reload(&disk, settings(0), &checkpoint(&mut t));
        assert_eq!(get(&back, k), None, "{how}: after a checkpoint");
        assert!(
            back.take_read_errors().is_empty(),
            "{how}: after a checkpoint"
        );
        assert_eq!(get(&back, other).as_deref(), Some(&value(1, 0)[..]));
        // A put of the key afterwards is its value.
        put(&mut back, k, &value(0, 2));
        assert_eq!(get(&back, k).as_deref(), Some(&value(0, 2)[..]), "{how}");
    }
}

#[test]
fn gc_never_settles_an_older_version_behind_a_dangling_entry() {
    let disk = SimDisk::new(2809);
    let (k, other) = (b"the key".as_slice(), b"another key".as_slice());
    let entries = dangling_entry_checkpoint(&disk);
    let eager = HybridSettings {
        gc_garbage_percent: 1,
        ..settings(0)
    };
    let mut t = reload(&disk, eager, &entries);
    // GC goes through the segment of the key's older record (all garbage
    // as far as the counts know), and must not take that record for the
    // key's current one: its newer entry dangles and may have been it.
    // (Before this rule GC copied it as current in its first step.)
    for _ in 0..50 {
        t.background_step();
    }
    let got = get(&t, k);
    assert_ne!(got.as_deref(), Some(&value(0, 0)[..]), "the older value");
    let (answers, _) = get_split(&t, &[k.to_vec()]);
    assert!(
        !matches!(&answers[0], Ok(Some(v)) if v[..] == value(0, 0)[..]),
        "split read answered the older value"
    );
    assert_eq!(get(&t, other).as_deref(), Some(&value(1, 0)[..]));
    // Nor after a checkpoint and a reload.
    let back = reload(&disk, settings(0), &checkpoint(&mut t));
    assert_ne!(get(&back, k).as_deref(), Some(&value(0, 0)[..]));
}

#[test]
fn a_walk_lists_no_key_through_a_dangling_entry() {
    let disk = SimDisk::new(2810);
    let other = b"another key".as_slice();
    let entries = dangling_entry_checkpoint(&disk);
    let t = reload(&disk, settings(0), &entries);
    // The dangling entry points at the other key's record: a walk of the
    // key's partition must not list the other key (twice, or under the
    // wrong partition, or after it is deleted).
    let mut listed = Vec::new();
    for p in 0..t.partition_count() {
        t.visit_partition(p, &mut |k, v, _| {
            listed.push((p, k.to_vec(), v.to_vec()));
        });
    }
    let others: Vec<_> = listed
        .iter()
        .filter(|(_, k, _)| k[..] == other[..])
        .collect();
    assert_eq!(others.len(), 1, "{others:?}");
    assert_eq!(others[0].2, value(1, 0));
    // Deleted, the other key is listed nowhere (its record is still in
    // its segment, where the dangling entry points).
    let mut t = t;
    assert!(t.delete(fnv1a64(other), other, common::hybrid::lsn()));
    for p in 0..t.partition_count() {
        t.visit_partition(p, &mut |k, _, _| {
            assert_ne!(k, other, "a deleted key listed by partition {p}");
        });
    }
}

fn get_split(t: &dyn Tier, keys: &[Vec<u8>]) -> (Vec<ColdAnswer>, usize) {
    let keys: Vec<Bytes> = keys.iter().map(|k| Bytes::copy_from_slice(k)).collect();
    let hashes: Vec<u64> = keys.iter().map(|k| fnv1a64(k)).collect();
    let (mut out, mut cold) = (Vec::new(), Vec::new());
    let mut left = usize::MAX;
    let answered = t.get_many_split(&hashes, &keys, &mut out, &mut left, &mut cold);
    assert_eq!(answered, keys.len());
    let mut answers: Vec<ColdAnswer> = out.into_iter().map(Ok).collect();
    let n = cold.len();
    for (i, a) in pollster::block_on(t.read_cold(cold)) {
        answers[i] = a;
    }
    (answers, n)
}

/// A chain's entries loaded into a new tier, as recovery does; `Err` if
/// the tier refuses the chain.
fn try_load_chain(disk: &SimDisk, chain: &[&Entries]) -> Result<HybridTier<SimDisk>, String> {
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    for (i, entries) in chain.iter().enumerate() {
        t.load_checkpoint_begin(i > 0)?;
        for (k, v, at) in entries.iter() {
            t.load_checkpoint_entry(k, v, *at)?;
        }
    }
    t.load_checkpoint_done()?;
    t.recovery_done();
    Ok(t)
}

/// Every key and its value.
type Model = std::collections::BTreeMap<Vec<u8>, Vec<u8>>;

/// A full checkpoint, then a delta (D1) during which GC empties a segment
/// after every index partition was copied, so the chain up to D1 still
/// points into it. Returns the tier, what it holds, and the two files.
fn gc_during_a_delta(disk: &SimDisk) -> (HybridTier<SimDisk>, Model, Entries, Entries) {
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    let mut model = std::collections::BTreeMap::new();
    // Later rounds overwrite the even keys only: the oldest segment keeps
    // the odd keys live, so GC has records to move out of it.
    for round in 0..8 {
        for i in (0..800).filter(|i| round == 0 || i % 2 == 0) {
            put(&mut t, &key(i), &value(i, round));
            model.insert(key(i), value(i, round));
        }
    }
    let full = checkpoint_of(&mut t, false);
    t.checkpoint_begin();
    let mut d1 = Vec::new();
    let mut push = |k: &[u8], v: Option<&[u8]>, at: Option<u64>| {
        d1.push((k.to_vec(), v.expect("no deleted keys").to_vec(), at));
    };
    for p in 0..t.partition_count() {
        t.visit_checkpoint_partition(p, true, &mut push);
    }
    let mut steps = 0;
    while t.stats().gc_runs == 0 {
        assert!(t.background_step(), "GC has a victim");
        steps += 1;
        assert!(steps < 100, "GC does not finish its victim");
    }
    t.checkpoint_finish(&mut push).expect("checkpoint");
    t.checkpoint_published();
    (t, model, full, d1)
}

#[test]
fn an_emptied_segment_stays_while_a_kept_snapshot_may_point_into_it() {
    let disk = SimDisk::new(2805);
    let (mut t, model, full, d1) = gc_during_a_delta(&disk);
    // D2 and D3 start after the GC, but they are deltas over the full
    // snapshot taken before it: D1 is kept (in D2's and D3's chains), and
    // a recovery whose D2 is damaged loads the chain up to D1.
    let d2 = checkpoint_of(&mut t, true);
    let segments = disk.files().len();
    let d3 = checkpoint_of(&mut t, true);
    let emptied: Vec<_> = disk
        .files()
        .into_iter()
        .filter(|f| f.to_string_lossy().ends_with(".seg"))
        .collect();
    assert_eq!(
        disk.files().len(),
        segments,
        "the emptied segment stays while D1 is kept"
    );
    // The whole chain holds every value; so does the chain up to D1.
    let back = try_load_chain(&disk, &[&full, &d1, &d2, &d3]).expect("the chain loads");
    for (k, v) in &model {
        assert_eq!(get(&back, k).as_deref(), Some(&v[..]));
    }
    let mut back = try_load_chain(&disk, &[&full, &d1]).expect("the chain up to D1 loads");
    for (k, v) in &model {
        assert_eq!(
            get(&back, k).as_deref(),
            Some(&v[..]),
            "{}",
            String::from_utf8_lossy(k)
        );
    }
    assert!(back.take_read_errors().is_empty());
    // A new full snapshot and one more: no kept snapshot is older than the
    // GC any more, and the emptied segment goes.
    let full2 = checkpoint_of(&mut t, false);
    assert_eq!(disk.files().len(), segments, "D3's chain is still kept");
    let d4 = checkpoint_of(&mut t, true);
    assert_eq!(
        disk.files().len(),
        segments - 1,
        "the emptied segment is removed"
    );
    let gone: Vec<_> = emptied
        .iter()
        .filter(|f| !disk.files().contains(f))
        .collect();
    assert_eq!(gone.len(), 1, "{gone:?}");
    let back = try_load_chain(&disk, &[&full2, &d4]).expect("the newest chain loads");
    for (k, v) in &model {
        assert_eq!(get(&back, k).as_deref(), Some(&v[..]));
    }
    // Once it is gone, the chain up to D1 (no longer kept: a recovery
    // would not find it) points into a removed segment. It must be refused, or serve every value; never an unreadable or older
    // one.
    match try_load_chain(&disk, &[&full, &d1]) {
        Err(reason) => assert!(reason.contains("segment"), "{reason}"),
        Ok(mut back) => {
            for (k, v) in &model {
                assert_eq!(
                    get(&back, k).as_deref(),
                    Some(&v[..]),
                    "{}",
                    String::from_utf8_lossy(k)
                );
            }
            assert!(back.take_read_errors().is_empty());
        }
    }
}

#[test]
fn an_emptied_segment_listed_at_a_restart_stays_while_the_older_snapshots_may_be_kept() {
    let disk = SimDisk::new(2806);
    let (mut t, model, full, d1) = gc_during_a_delta(&disk);
    let d2 = checkpoint_of(&mut t, true);
    drop(t);
    // A restart from the chain up to D2: its segment table lists the
    // emptied segment, and its index does not point into it. The files
    // of that chain stay kept until a full checkpoint after the restart
    // and one more replace them, and the chain up to D1 points into it.
    let segments = disk.files().len();
    let mut t = try_load_chain(&disk, &[&full, &d1, &d2]).expect("the chain loads");
    assert_eq!(disk.files().len(), segments);
    let d3 = checkpoint_of(&mut t, true);
    let d4 = checkpoint_of(&mut t, true);
    let d5 = checkpoint_of(&mut t, true);
    assert_eq!(disk.files().len(), segments, "the emptied segment stays");
    for chain in [&[&full, &d1][..], &[&full, &d1, &d2, &d3, &d4, &d5][..]] {
        let mut back = try_load_chain(&disk, chain).expect("the chain loads");
        for (k, v) in &model {
            assert_eq!(
                get(&back, k).as_deref(),
                Some(&v[..]),
                "{}",
                String::from_utf8_lossy(k)
            );
        }
        assert!(back.take_read_errors().is_empty());
    }
    let full2 = checkpoint_of(&mut t, false);
    assert_eq!(
        disk.files().len(),
        segments,
        "the older chain is still kept"
    );
    checkpoint_of(&mut t, true);
    assert_eq!(
        disk.files().len(),
        segments - 1,
        "the emptied segment is removed"
    );
    let back = try_load_chain(&disk, &[&full2]).expect("the newest full checkpoint loads");
    for (k, v) in &model {
        assert_eq!(get(&back, k).as_deref(), Some(&v[..]));
    }
}

#[test]
fn keys_with_a_ttl_that_gc_moved_during_a_checkpoint_still_expire_after_recovery() {
    let disk = SimDisk::new(2806);
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    // The odd keys carry an expiry time and stay in the oldest segment;
    // the even ones are overwritten, so GC moves the odd ones.
    for round in 0..8 {
        for i in (0..800).filter(|i| round == 0 || i % 2 == 0) {
            let at = (i % 2 == 1).then_some(1_000 + i);
            t.put_expiring(
                fnv1a64(&key(i)),
                &key(i),
                &value(i, round),
                at,
                common::hybrid::lsn(),
            );
        }
    }
    // A full checkpoint copies the index, then GC moves the records, then
    // the checkpoint finishes (it writes the expiry list last).
    t.checkpoint_begin();
    let mut entries = Vec::new();
    let mut push = |k: &[u8], v: Option<&[u8]>, at: Option<u64>| {
        entries.push((k.to_vec(), v.expect("no deleted keys").to_vec(), at));
    };
    for p in 0..t.partition_count() {
        t.visit_checkpoint_partition(p, false, &mut push);
    }
    let mut steps = 0;
    while t.stats().gc_runs == 0 {
        assert!(t.background_step(), "GC has a victim");
        steps += 1;
        assert!(steps < 100, "GC does not finish its victim");
    }
    assert!(t.stats().gc_bytes_written > 0, "GC moved records");
    t.checkpoint_finish(&mut push).expect("checkpoint");
    t.checkpoint_published();
    // A crash, and recovery from that checkpoint (no WAL records after it).
    disk.crash();
    let mut back = reload(&disk, settings(0), &entries);
    back.set_now_ms(5_000);
    let mut due: Vec<Vec<u8>> = back
        .due_keys(10_000)
        .into_iter()
        .map(|k| k.to_vec())
        .collect();
    due.sort();
    let want: Vec<Vec<u8>> = (0..800).filter(|i| i % 2 == 1).map(key).collect();
    assert_eq!(due.len(), want.len(), "every key with a TTL is due");
    assert_eq!(due, want);
}

#[test]
fn a_due_key_whose_record_cannot_be_read_now_is_expired_once_it_can() {
    let disk = SimDisk::new(2807);
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    for i in 0..20 {
        t.put_expiring(
            fnv1a64(&key(i)),
            &key(i),
            &value(i, 0),
            Some(1_000 + i),
            common::hybrid::lsn(),
        );
    }
    let entries = checkpoint(&mut t);
    let mut t = reload(&disk, settings(0), &entries);
    t.set_now_ms(5_000);
    disk.set_faults(SimFaults {
        read_error_probability: 1.0,
        path_filter: Some(".seg".into()),
        ..SimFaults::default()
    });
    assert!(t.due_keys(100).is_empty(), "nothing could be read");
    disk.set_faults(SimFaults::default());
    let mut due: Vec<Vec<u8>> = t.due_keys(100).into_iter().map(|k| k.to_vec()).collect();
    due.sort();
    assert_eq!(due, (0..20).map(key).collect::<Vec<_>>());
}

#[test]
fn a_due_key_whose_newer_candidate_cannot_be_read_stays_due() {
    let disk = SimDisk::new(2808);
    let (k, other) = (SHARED_TAG[0].as_bytes(), SHARED_TAG[1].as_bytes());
    let mut t = HybridTier::new(disk.clone(), small()).expect("tier");
    t.put_expiring(
        fnv1a64(k),
        k,
        &value(0, 0),
        Some(1_000),
        common::hybrid::lsn(),
    );
    for i in 0..300 {
        put(&mut t, &key(i), &value(i, 0));
    }
    let entries = checkpoint(&mut t);
    // A blind put of a key that shares the tag: the key's entry becomes
    // unresolved, and whether it is current takes a read of the newer
    // record, which goes to another segment.
    let mut t = reload(&disk, small(), &entries);
    put(&mut t, other, &value(1, 0));
    assert_eq!(t.stats().unresolved_entries, 1);
    let entries = checkpoint(&mut t);
    let mut t = reload(&disk, small(), &entries);
    let newer: Vec<_> = disk
        .files()
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".seg") && !p.ends_with("0000000000000001.seg"))
        .collect();
    assert_eq!(newer.len(), 1, "{newer:?}");
    t.set_now_ms(5_000);
    disk.set_faults(SimFaults {
        read_error_probability: 1.0,
        path_filter: Some(newer[0].to_string_lossy().into_owned()),
        ..SimFaults::default()
    });
    assert!(
        t.due_keys(100).is_empty(),
        "the newer record could not be read"
    );
    disk.set_faults(SimFaults::default());
    let due: Vec<Vec<u8>> = t.due_keys(100).into_iter().map(|k| k.to_vec()).collect();
    assert_eq!(due, vec![k.to_vec()], "the key is due once the read works");
}
