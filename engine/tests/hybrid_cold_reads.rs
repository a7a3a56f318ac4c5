//! The hybrid tier's asynchronous GET path on the simulated disk: a run of
//! GETs is looked up at once, the records not in RAM are read together
//! (one read per record, adjacent blocks merged), and the answers are the
//! ones the keys had at lookup time, whatever happens in between: writes
//! of the same keys, GC removing the segment, damaged blocks, read errors.
//! And its blind writes: an overwrite of a key not in RAM reads nothing,
//! yet reads, deletes, walks, expiry, GC and checkpoints all see only the
//! key's newest record.

use bytes::Bytes;
use common::hybrid::{checkpoint, get, key, reload, run_settles, settings, value, SHARED_TAG};
use futures::FutureExt;
use ringkv_engine::hash::fnv1a64;
use ringkv_engine::io::sim::{SimDisk, SimFaults};
use ringkv_engine::tier::{ColdAnswer, ColdGet, DeleteLookup, HybridSettings, HybridTier, Tier};
use ringkv_engine::{Engine, Op, OpResult};
use std::path::Path;
use std::time::{Duration, Instant};

mod common;

fn put(t: &mut dyn Tier, k: &[u8], v: &[u8]) {
    common::hybrid::put(t, k, v);
}

/// A tier that has `n` keys on the device and nothing of them in RAM: no
/// cache, no recently read blocks, no unwritten tail.
fn cold_tier(disk: &SimDisk, n: u64) -> HybridTier<SimDisk> {
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    for i in 0..n {
        put(&mut t, &key(i), &value(i, 0));
    }
    let entries = checkpoint(&mut t);
    reload(disk, settings(0), &entries)
}

/// Looks a run of keys up (the first step, as the shard does).
fn lookup(t: &dyn Tier, keys: &[Vec<u8>]) -> (Vec<ColdAnswer>, Vec<ColdGet>) {
    let keys: Vec<Bytes> = keys.iter().map(|k| Bytes::copy_from_slice(k)).collect();
    let hashes: Vec<u64> = keys.iter().map(|k| fnv1a64(k)).collect();
    let (mut out, mut cold) = (Vec::new(), Vec::new());
    let mut left = usize::MAX;
    let answered = t.get_many_split(&hashes, &keys, &mut out, &mut left, &mut cold);
    assert_eq!(answered, keys.len());
    assert_eq!(out.len(), keys.len());
    (out.into_iter().map(Ok).collect(), cold)
}

/// Reads and answers the cold GETs (the second step).
fn read_cold(t: &dyn Tier, answers: &mut [ColdAnswer], cold: Vec<ColdGet>) {
    for (i, a) in pollster::block_on(t.read_cold(cold)) {
        answers[i] = a;
    }
}

fn get_split(t: &dyn Tier, keys: &[Vec<u8>]) -> (Vec<ColdAnswer>, usize) {
    let (mut answers, cold) = lookup(t, keys);
    let n = cold.len();
    read_cold(t, &mut answers, cold);
    (answers, n)
}

fn want(v: Vec<u8>) -> ColdAnswer {
    Ok(Some(Bytes::from(v)))
}

#[test]
fn one_device_read_per_cold_get_and_neighbours_share_one() {
    let disk = SimDisk::new(11);
    let t = cold_tier(&disk, 3_000);
    // Keys far apart in the log: one read each.
    let spread: Vec<u64> = (0..60).map(|i| i * 40 + 7).collect();
    let keys: Vec<Vec<u8>> = spread.iter().map(|&i| key(i)).collect();
    let before = t.stats().device_reads;
    let (answers, cold) = get_split(&t, &keys);
    assert_eq!(cold, keys.len(), "nothing was in RAM");
    assert_eq!(t.stats().device_reads - before, keys.len() as u64);
    for (a, &i) in answers.into_iter().zip(&spread) {
        assert_eq!(a, want(value(i, 0)), "key {i}");
    }
    // Keys written one after another: their blocks touch, so the reads
    // merge into a few.
    let run: Vec<Vec<u8>> = (2_500..2_564).map(key).collect();
    let before = t.stats().device_reads;
    let (answers, cold) = get_split(&t, &run);
    assert_eq!(cold, run.len());
    let reads = t.stats().device_reads - before;
    assert!((1..=4).contains(&reads), "{reads} reads for 64 neighbours");
    for (a, i) in answers.into_iter().zip(2_500..) {
        assert_eq!(a, want(value(i, 0)), "key {i}");
    }
    // Read once, the blocks are in RAM: no cold GET the second time.
    let (answers, cold) = get_split(&t, &run[..8]);
    assert_eq!(cold, 0, "{:?}", t.stats());
    assert_eq!(answers[0], want(value(2_500, 0)));
    // A key that does not exist reads nothing.
    let before = t.stats().device_reads;
    let (answers, _) = get_split(&t, &[b"never written".to_vec()]);
    assert_eq!(answers, vec![Ok(None)]);
    assert_eq!(t.stats().device_reads, before);
}

#[test]
fn the_answer_is_the_value_at_lookup_time_and_the_cache_keeps_the_new_one() {
    let disk = SimDisk::new(12);
    let mut t = HybridTier::new(disk.clone(), settings(1 << 20)).expect("tier");
    for i in 0..2_000 {
        put(&mut t, &key(i), &value(i, 0));
    }
    checkpoint(&mut t);
    // A fresh tier over the same files: nothing in RAM.
    let entries = checkpoint(&mut t);
    drop(t);
    let mut t = reload(&disk, settings(1 << 20), &entries);
    let k = key(77);
    let (mut answers, cold) = lookup(&t, std::slice::from_ref(&k));
    assert_eq!(cold.len(), 1);
    // Overwritten and deleted while its read is on the device.
    put(&mut t, &k, &value(77, 1));
    assert!(t.delete(
        fnv1a64(b"key-00000078"),
        b"key-00000078",
        common::hybrid::lsn()
    ));
    read_cold(&t, &mut answers, cold);
    assert_eq!(answers[0], want(value(77, 0)), "the value at lookup time");
    let (after, _) = get_split(&t, &[k.clone(), key(78)]);
    assert_eq!(after, vec![want(value(77, 1)), Ok(None)]);
    assert_eq!(t.get(fnv1a64(&k), &k).as_deref(), Some(&value(77, 1)[..]));
}

/// A value of a fixed size: records of the same keys land at the same
/// offsets in every segment written in the same order.
fn fixed(i: u64, round: u64) -> Vec<u8> {
    (0..200).map(|j| (i * 7 + j + round * 13) as u8).collect()
}

#[test]
fn a_segment_gc_removes_during_the_read_still_answers_and_its_slot_is_reused_safely() {
    let disk = SimDisk::new(13);
    // Small segments: every round of writes below fills a few, so the
    // last round starts new ones in the slots GC freed.
    let small = HybridSettings {
        segment_bytes: 64 << 10,
        ..settings(1 << 20)
    };
    let mut t = HybridTier::new(disk.clone(), small.clone()).expect("tier");
    for i in 0..800 {
        put(&mut t, &key(i), &fixed(i, 0));
    }
    let entries = checkpoint(&mut t);
    let mut t = reload(&disk, small, &entries);
    let first_segment = disk
        .files()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .min()
        .expect("a segment");
    let k = key(3);
    let (mut answers, cold) = lookup(&t, std::slice::from_ref(&k));
    assert_eq!(cold.len(), 1, "key 3's record is on the device");
    // Every key is overwritten a few times; GC and checkpoints remove the
    // first segment; then a last round writes new segments, the first of
    // them in the freed slot, with live records at the old one's offsets.
    for round in 1..7 {
        for i in 0..800 {
            put(&mut t, &key(i), &fixed(i, round));
        }
        while t.background_step() {}
        checkpoint(&mut t);
    }
    checkpoint(&mut t);
    assert!(
        !disk.files().contains(&first_segment),
        "GC removed {}",
        first_segment.display()
    );
    for i in 0..800 {
        put(&mut t, &key(i), &fixed(i, 7));
    }
    read_cold(&t, &mut answers, cold);
    assert_eq!(answers[0], want(fixed(3, 0)), "read from the open file");
    // The old record was not cached under an address that now names
    // another record.
    let keys: Vec<Vec<u8>> = (0..800).map(key).collect();
    let (after, _) = get_split(&t, &keys);
    for (a, i) in after.into_iter().zip(0..) {
        assert_eq!(a, want(fixed(i, 7)), "key {i}");
    }
}

#[test]
fn a_cold_get_held_after_its_device_read_across_a_put_a_delete_and_gc_answers_the_value_it_looked_up(
) {
    let disk = SimDisk::new(15);
    let small = HybridSettings {
        segment_bytes: 64 << 10,
        ..settings(1 << 20)
    };
    let mut t = HybridTier::new(disk.clone(), small.clone()).expect("tier");
    // Round 0 and round 1 of every key: round 0's records are the older
    // ones a wrong answer would come from.
    for round in 0..2 {
        for i in 0..800 {
            put(&mut t, &key(i), &fixed(i, round));
        }
        checkpoint(&mut t);
    }
    let entries = checkpoint(&mut t);
    let mut t = reload(&disk, small, &entries);
    let k = key(3);
    let (mut answers, cold) = lookup(&t, std::slice::from_ref(&k));
    assert_eq!(cold.len(), 1, "key 3's record is on the device");
    let before = t.stats();
    let hold = t.hold_next_cold_read();
    let mut read = t.read_cold(cold);
    assert!(
        (&mut read).now_or_never().is_none() && hold.reached(),
        "the read stops at its hold once its device read is done"
    );
    // While the GET is open: the key is overwritten, deleted, every other
    // key rewritten twice, and GC collects what that left behind (the
    // segments of both older rounds among them).
    put(&mut t, &k, &fixed(3, 2));
    assert!(t.delete(fnv1a64(&k), &k, common::hybrid::lsn()));
    for round in 2..4 {
        for i in (0..800).filter(|&i| i != 3) {
            put(&mut t, &key(i), &fixed(i, round));
        }
        while t.background_step() {}
        checkpoint(&mut t);
    }
    assert!(
        t.stats().gc_runs > before.gc_runs,
        "GC ran while the GET was open"
    );
    hold.release();
    for (i, a) in pollster::block_on(read) {
        answers[i] = a;
    }
    assert_eq!(
        answers[0],
        want(fixed(3, 1)),
        "the value the key held when the GET was looked up, not round 0's"
    );
    // Nothing stale was cached: the key stays deleted, the others read
    // their newest round.
    let keys: Vec<Vec<u8>> = (0..800).map(key).collect();
    let (after, _) = get_split(&t, &keys);
    for (a, i) in after.into_iter().zip(0..) {
        let wanted = if i == 3 { Ok(None) } else { want(fixed(i, 3)) };
        assert_eq!(a, wanted, "key {i}");
    }
}

#[test]
fn keys_with_the_same_hash_are_told_apart_on_the_cold_path() {
    let disk = SimDisk::new(14);
    // Keys whose hashes share partition, home bucket and tag (a key's hash
    // is its routing hash: the tier recomputes it from a record's key, so
    // a made-up shared hash would make every other key's record look like
    // a dangling entry). The last one is never written.
    let small = HybridSettings {
        index_keys: 1_000,
        ..settings(0)
    };
    let mut t = HybridTier::new(disk.clone(), small.clone()).expect("tier");
    for (i, k) in SHARED_TAG[..5].iter().enumerate() {
        t.put(
            fnv1a64(k.as_bytes()),
            k.as_bytes(),
            &value(i as u64, 0),
            common::hybrid::lsn(),
        );
    }
    let entries = checkpoint(&mut t);
    let t = reload(&disk, small, &entries);
    // Every candidate's tag matches: the lookup cannot be answered from
    // the index; the reads go on candidate by candidate until the key
    // compares equal.
    let keys: Vec<Bytes> = [4usize, 0, 2, 5]
        .iter()
        .map(|&i| Bytes::from(SHARED_TAG[i]))
        .collect();
    let hashes: Vec<u64> = keys.iter().map(|k| fnv1a64(k)).collect();
    let (mut out, mut cold) = (Vec::new(), Vec::new());
    let mut left = usize::MAX;
    t.get_many_split(&hashes, &keys, &mut out, &mut left, &mut cold);
    let mut answers: Vec<ColdAnswer> = out.into_iter().map(Ok).collect();
    assert_eq!(cold.len(), 4);
    read_cold(&t, &mut answers, cold);
    assert_eq!(
        answers,
        vec![
            want(value(4, 0)),
            want(value(0, 0)),
            want(value(2, 0)),
            Ok(None)
        ]
    );
}

#[test]
fn a_damaged_block_answers_an_error_for_its_keys_only() {
    let disk = SimDisk::new(15);
    let t = cold_tier(&disk, 500);
    let seg = disk
        .files()
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .expect("a segment");
    assert!(disk.corrupt(&seg, 4096 + 100, 1));
    let keys: Vec<Vec<u8>> = (0..500).map(key).collect();
    let (answers, cold) = get_split(&t, &keys);
    assert_eq!(cold, 500);
    let mut errors = 0;
    for (i, a) in answers.into_iter().enumerate() {
        match a {
            Ok(v) => assert_eq!(v, Some(Bytes::from(value(i as u64, 0))), "key {i}"),
            Err(reason) => {
                assert!(reason.contains(&seg.display().to_string()), "{reason}");
                assert!(reason.contains("checksum"), "{reason}");
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
fn read_errors_on_the_cold_path_are_per_key_and_the_next_read_works() {
    let disk = SimDisk::new(16);
    let t = cold_tier(&disk, 400);
    disk.set_faults(SimFaults {
        read_error_probability: 0.5,
        path_filter: Some(".seg".into()),
        ..SimFaults::default()
    });
    let spread: Vec<Vec<u8>> = (0..40).map(|i| key(i * 10)).collect();
    let (answers, _) = get_split(&t, &spread);
    let failed = answers.iter().filter(|a| a.is_err()).count();
    assert!(failed > 5 && failed < 35, "{failed} of 40 failed");
    for (a, i) in answers.iter().zip((0..).step_by(10)) {
        if let Ok(v) = a {
            assert_eq!(v.as_deref(), Some(&value(i, 0)[..]), "key {i}");
        }
    }
    disk.set_faults(SimFaults::default());
    let (answers, _) = get_split(&t, &spread);
    for (a, i) in answers.into_iter().zip((0..).step_by(10)) {
        assert_eq!(a, want(value(i, 0)), "key {i}");
    }
}

/// Every segment read takes this long in the engine tests below.
const SLOW_READ: Duration = Duration::from_secs(2);

fn engine_key(i: u64) -> Bytes {
    Bytes::from(key(i))
}

fn engine_value(i: u64) -> Bytes {
    let mut b = format!("value of {i}:").into_bytes();
    b.resize(1000, i as u8);
    Bytes::from(b)
}

/// One hybrid shard with 3,000 keys of 1 KB written and nothing of them in
/// RAM (reopened, no cache), and every segment read made [`SLOW_READ`]
/// slow.
fn slow_cold_engine(disk: &SimDisk) -> Engine {
    let mut config = common::small_config(Path::new("/e"), 1, tunables::Durability::Sync);
    config.storage.tier = tunables::Tier::Hybrid;
    config.storage.value_segment_size = tunables::ByteSize::mib(1);
    config.storage.cache_bytes = tunables::ByteSize(0);
    config.storage.index_keys = 10_000;
    // No GC: its reads (blocking, 2 s each here) are not what is tested.
    config.storage.gc_garbage_percent = 95;
    {
        let engine = Engine::open_with_disk(&config, disk.clone()).expect("open");
        let h = engine.handle();
        for chunk in (0..3_000u64).collect::<Vec<_>>().chunks(100) {
            let ops = chunk
                .iter()
                .map(|&i| Op::Put {
                    key: engine_key(i),
                    value: engine_value(i),
                })
                .collect();
            h.batch_blocking(ops).expect("puts");
        }
    }
    let engine = Engine::open_with_disk(&config, disk.clone()).expect("reopen");
    disk.set_faults(SimFaults {
        read_latency: Some(SLOW_READ),
        path_filter: Some(".seg".into()),
        ..SimFaults::default()
    });
    engine
}

/// Runs `ops` on a thread of its own; after 200 ms checks that a write and
/// a read of the key written are answered while `ops` still wait for the
/// device. Returns `ops`'s answers and how long they took.
fn served_while_waiting(engine: &Engine, ops: Vec<Op>) -> (Vec<OpResult>, Duration) {
    let h = engine.handle();
    let waiting = {
        let h = h.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let answers = h.batch_blocking(ops).expect("batch");
            (answers, started.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let answers = h
        .batch_blocking(vec![
            Op::Put {
                key: Bytes::from_static(b"fresh"),
                value: Bytes::from_static(b"new value"),
            },
            Op::Get {
                key: Bytes::from_static(b"fresh"),
            },
        ])
        .expect("write while reads wait");
    assert_eq!(
        answers,
        vec![
            OpResult::Ok,
            OpResult::Value(Bytes::from_static(b"new value"))
        ]
    );
    assert!(
        !waiting.is_finished(),
        "the write was answered while the device reads were still on the device"
    );
    waiting.join().expect("batch thread")
}

/// Through the engine: while a batch of cold GETs waits for the device,
/// the same shard answers writes and reads of keys in RAM; the batch's
/// reads go to the device together, so it takes about one read's time,
/// not one per key.
#[test]
fn a_shard_keeps_serving_while_cold_reads_are_on_the_device() {
    let disk = SimDisk::new(17);
    let engine = slow_cold_engine(&disk);
    let spread: Vec<u64> = (0..20).map(|i| i * 150 + 3).collect();
    let ops = spread
        .iter()
        .map(|&i| Op::Get { key: engine_key(i) })
        .collect();
    let (answers, took) = served_while_waiting(&engine, ops);
    for (a, &i) in answers.iter().zip(&spread) {
        assert_eq!(a, &OpResult::Value(engine_value(i)), "key {i}");
    }
    // One read after another would take 20 reads' time (40 s).
    assert!(
        took < SLOW_READ * 8,
        "20 cold GETs of one batch took {took:?}: their reads did not overlap"
    );
    disk.set_faults(SimFaults::default());
}

/// Through the engine: deletes of cold keys are applied at once, and only
/// their answers (whether the key was there) wait for the device; the
/// shard serves meanwhile, and the keys read as gone right away.
#[test]
fn a_shard_keeps_serving_while_deletes_wait_for_their_answers() {
    let disk = SimDisk::new(18);
    let engine = slow_cold_engine(&disk);
    let h = engine.handle();
    let spread: Vec<u64> = (0..20).map(|i| i * 150 + 5).collect();
    let ops = spread
        .iter()
        .map(|&i| Op::Delete { key: engine_key(i) })
        // A key never written, on no candidate's tag: answered from RAM.
        .chain([Op::Delete {
            key: Bytes::from_static(b"never written"),
        }])
        .collect();
    let (answers, took) = served_while_waiting(&engine, ops);
    let mut want = vec![OpResult::Ok; spread.len()];
    want.push(OpResult::NotFound);
    assert_eq!(answers, want);
    assert!(
        took < SLOW_READ * 8,
        "20 cold deletes of one batch took {took:?}: their reads did not overlap"
    );
    // Gone, and telling so reads nothing.
    let again: Vec<Op> = spread
        .iter()
        .flat_map(|&i| {
            [
                Op::Get { key: engine_key(i) },
                Op::Delete { key: engine_key(i) },
            ]
        })
        .collect();
    let reads = || {
        // The shard publishes its tier's counters every 100 ms.
        std::thread::sleep(Duration::from_millis(300));
        engine.metrics().shards[0]
            .hybrid
            .expect("hybrid")
            .device_reads
    };
    let before = reads();
    let answers = h.batch_blocking(again).expect("again");
    assert!(
        answers.iter().all(|a| *a == OpResult::NotFound),
        "{answers:?}"
    );
    assert_eq!(reads(), before, "deleted keys read nothing");
    disk.set_faults(SimFaults::default());
}

fn walk(t: &dyn Tier) -> std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
    let mut seen = std::collections::BTreeMap::new();
    for p in 0..t.partition_count() {
        t.visit_partition(p, &mut |k, v, _| {
            assert!(
                seen.insert(k.to_vec(), v.to_vec()).is_none(),
                "the walk lists {:?} twice",
                String::from_utf8_lossy(k)
            );
        });
    }
    seen
}

/// Checks every key of `model` (and a few never written) through the
/// blocking reads, the split reads and a walk.
fn check(
    t: &mut HybridTier<SimDisk>,
    model: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
    n: u64,
) {
    let keys: Vec<Vec<u8>> = (0..n + 20).map(key).collect();
    check_keys(t, model, &keys);
}

/// Checks `keys` against `model` through the blocking reads and the split
/// reads, and the whole model through a walk.
fn check_keys(
    t: &mut HybridTier<SimDisk>,
    model: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
    keys: &[Vec<u8>],
) {
    let (answers, _) = get_split(t, keys);
    for (k, a) in keys.iter().zip(answers) {
        let want = model.get(k).map(|v| Bytes::from(v.clone()));
        assert_eq!(a, Ok(want.clone()), "{}", String::from_utf8_lossy(k));
        assert_eq!(t.get(fnv1a64(k), k), want, "{}", String::from_utf8_lossy(k));
    }
    assert_eq!(&walk(t), model);
    assert!(t.take_read_errors().is_empty());
}

#[test]
fn an_overwrite_of_a_cold_key_reads_nothing_and_reads_see_the_new_value() {
    let disk = SimDisk::new(21);
    let mut t = cold_tier(&disk, 2_000);
    // Every overwrite below is counted as garbage; GC at 5% settles them.
    let entries = checkpoint(&mut t);
    let gc_early = HybridSettings {
        gc_garbage_percent: 5,
        ..settings(0)
    };
    let mut t = reload(&disk, gc_early, &entries);
    let mut model: std::collections::BTreeMap<Vec<u8>, Vec<u8>> =
        (0..2_000).map(|i| (key(i), value(i, 0))).collect();
    let before = t.stats();
    for i in (0..2_000).step_by(4) {
        put(&mut t, &key(i), &value(i, 1));
        model.insert(key(i), value(i, 1));
    }
    let after = t.stats();
    assert_eq!(after.device_reads, before.device_reads, "no overwrite read");
    assert!(after.unresolved_entries >= 500, "{after:?}");
    let n = model.len() as u64;
    assert!(t.len() <= n && n <= t.len() + after.unresolved_entries);
    check(&mut t, &model, 2_000);
    // A delete leaves no older version behind.
    for i in (0..2_000).step_by(8) {
        assert!(
            t.delete(fnv1a64(&key(i)), &key(i), common::hybrid::lsn()),
            "key {i} was there"
        );
        model.remove(&key(i));
    }
    check(&mut t, &model, 2_000);
    // GC settles the unresolved entries: the count is exact again.
    while t.background_step() {}
    let settled = t.stats();
    assert!(settled.gc_runs > 0, "{settled:?}");
    check(&mut t, &model, 2_000);
    // Overwritten again and checkpointed with entries unresolved: a
    // restart from the checkpoint still reads the newest values.
    for i in (1..2_000).step_by(2) {
        put(&mut t, &key(i), &value(i, 2));
        model.insert(key(i), value(i, 2));
    }
    assert!(t.stats().unresolved_entries > 0);
    let entries = checkpoint(&mut t);
    disk.crash();
    let mut back = reload(&disk, settings(0), &entries);
    assert_eq!(
        back.stats().unresolved_entries,
        t.stats().unresolved_entries
    );
    check(&mut back, &model, 2_000);
    while back.background_step() {}
    check(&mut back, &model, 2_000);
    assert!(back.stats().unresolved_entries < t.stats().unresolved_entries);
}

type Model = std::collections::BTreeMap<Vec<u8>, Vec<u8>>;

/// A small tier (an index for 1,000 keys, GC past 5% garbage) with the six
/// [`SHARED_TAG`] keys and keys 0..300 on the device, reloaded from a
/// checkpoint so nothing is in RAM: its settings, the tier, the model, and
/// every key written.
fn shared_tag_tier(disk: &SimDisk) -> (HybridSettings, HybridTier<SimDisk>, Model, Vec<Vec<u8>>) {
    let small = HybridSettings {
        index_keys: 1_000,
        gc_garbage_percent: 5,
        ..settings(0)
    };
    let mut t = HybridTier::new(disk.clone(), small.clone()).expect("tier");
    let mut model = Model::new();
    for (i, k) in SHARED_TAG.iter().enumerate() {
        put(&mut t, k.as_bytes(), &value(i as u64, 0));
        model.insert(k.as_bytes().to_vec(), value(i as u64, 0));
    }
    for i in 0..300 {
        put(&mut t, &key(i), &value(i, 0));
        model.insert(key(i), value(i, 0));
    }
    let entries = checkpoint(&mut t);
    let t = reload(disk, small.clone(), &entries);
    let keys = model.keys().cloned().collect();
    (small, t, model, keys)
}

#[test]
fn blind_writes_of_keys_that_share_a_tag_stay_apart() {
    let disk = SimDisk::new(22);
    let (small, mut t, mut model, keys) = shared_tag_tier(&disk);
    let reload =
        |entries: &[(Vec<u8>, Vec<u8>, Option<u64>)]| reload(&disk, small.clone(), entries);
    let check = |t: &mut HybridTier<SimDisk>, model: &Model| check_keys(t, model, &keys);
    // The first blind overwrite leaves the other five keys' entries
    // unresolved beside its key's old one: they do share the tag.
    let reads = t.stats().device_reads;
    put(&mut t, SHARED_TAG[0].as_bytes(), &value(0, 1));
    model.insert(SHARED_TAG[0].as_bytes().to_vec(), value(0, 1));
    assert_eq!(t.stats().unresolved_entries, 6, "{:?}", t.stats());
    assert_eq!(t.stats().device_reads, reads, "a blind put reads nothing");
    check(&mut t, &model);
    for round in 2..5u64 {
        // Fresh from the checkpoint each round: nothing in RAM.
        let entries = checkpoint(&mut t);
        t = reload(&entries);
        for (i, k) in SHARED_TAG.iter().enumerate() {
            if !(i as u64 + round).is_multiple_of(3) {
                put(&mut t, k.as_bytes(), &value(i as u64, round));
                model.insert(k.as_bytes().to_vec(), value(i as u64, round));
            }
        }
        check(&mut t, &model);
    }
    for k in [SHARED_TAG[2], SHARED_TAG[5]] {
        assert!(t.delete(fnv1a64(k.as_bytes()), k.as_bytes(), common::hybrid::lsn()));
        model.remove(k.as_bytes());
    }
    check(&mut t, &model);
    let entries = checkpoint(&mut t);
    let mut t = reload(&entries);
    check(&mut t, &model);
    // GC settles what is left; a key that only shared a tag is counted
    // again.
    for i in 0..300 {
        put(&mut t, &key(i), &value(i, 9));
        model.insert(key(i), value(i, 9));
    }
    while t.background_step() {}
    check(&mut t, &model);
    assert!(t.stats().gc_runs > 0);
}

#[test]
fn an_older_version_with_an_expiry_time_never_expires_the_key() {
    let disk = SimDisk::new(23);
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    for i in 0..500u64 {
        t.put_expiring(
            fnv1a64(&key(i)),
            &key(i),
            &value(i, 0),
            Some(1_000),
            common::hybrid::lsn(),
        );
    }
    let entries = checkpoint(&mut t);
    let mut t = reload(&disk, settings(0), &entries);
    t.set_now_ms(500);
    // Overwritten blind without an expiry time: the older record still
    // sits in the expiry list, and must not make the key due.
    for i in 0..250u64 {
        put(&mut t, &key(i), &value(i, 1));
    }
    assert!(t.stats().unresolved_entries >= 250);
    t.set_now_ms(2_000);
    let due: std::collections::BTreeSet<Vec<u8>> =
        t.due_keys(10_000).into_iter().map(|k| k.to_vec()).collect();
    let want: std::collections::BTreeSet<Vec<u8>> = (250..500).map(key).collect();
    assert_eq!(due, want);
    for i in 0..500u64 {
        let got = t.get(fnv1a64(&key(i)), &key(i));
        let want = (i < 250).then(|| Bytes::from(value(i, 1)));
        assert_eq!(got, want, "key {i}");
    }
}

/// A delete the shard's way: looked up, applied blind, and, when RAM
/// cannot tell, answered by a read afterwards. Returns whether the key
/// was there.
fn delete_blind(t: &mut HybridTier<SimDisk>, k: &[u8]) -> ColdAnswer {
    let h = fnv1a64(k);
    match t.delete_lookup(h, k) {
        DeleteLookup::Absent => Ok(None),
        DeleteLookup::Live => {
            t.delete_blind(h, k, common::hybrid::lsn());
            Ok(Some(Bytes::new()))
        }
        DeleteLookup::Expired => {
            t.delete_blind(h, k, common::hybrid::lsn());
            Ok(None)
        }
        DeleteLookup::Cold(g) => {
            assert!(g.delete);
            let reads = t.stats().device_reads;
            t.delete_blind(h, k, common::hybrid::lsn());
            assert_eq!(
                t.stats().device_reads,
                reads,
                "the delete itself reads nothing"
            );
            let mut answer = [Ok(None)];
            read_cold(t, &mut answer, vec![g]);
            let [answer] = answer;
            answer
        }
    }
}

#[test]
fn a_delete_of_a_cold_key_reads_nothing_and_its_answer_one_record() {
    let disk = SimDisk::new(24);
    let mut t = cold_tier(&disk, 2_000);
    let mut model: std::collections::BTreeMap<Vec<u8>, Vec<u8>> =
        (0..2_000).map(|i| (key(i), value(i, 0))).collect();
    let before = t.stats().device_reads;
    for i in (0..2_000).step_by(40) {
        t.forget_cached();
        let answer = delete_blind(&mut t, &key(i));
        assert!(matches!(answer, Ok(Some(_))), "key {i}");
        model.remove(&key(i));
    }
    assert_eq!(t.stats().device_reads - before, 50, "one read per answer");
    // Settled by the answer's read: nothing of those keys is left.
    assert_eq!(t.stats().unresolved_entries, 0, "{:?}", t.stats());
    assert_eq!(t.stats().deleted_keys, 0, "{:?}", t.stats());
    let before = t.stats().device_reads;
    for i in (0..2_000).step_by(40) {
        assert_eq!(delete_blind(&mut t, &key(i)), Ok(None), "key {i}");
        assert_eq!(get(&t, &key(i)), None);
    }
    assert_eq!(t.stats().device_reads, before, "deleted keys read nothing");
    check(&mut t, &model, 2_000);
    let entries = checkpoint(&mut t);
    let mut t = reload(&disk, settings(0), &entries);
    check(&mut t, &model, 2_000);
}

#[test]
fn a_blind_delete_answered_later_leaves_its_key_deleted_and_the_others_readable() {
    // Deletes whose answers are not read (as after a crash, or while the
    // read is still on the device): the keys are gone at once.
    let disk = SimDisk::new(25);
    let (small, mut t, mut model, keys) = shared_tag_tier(&disk);
    let reads = t.stats().device_reads;
    for k in [SHARED_TAG[1], SHARED_TAG[4]] {
        let h = fnv1a64(k.as_bytes());
        // The answer's read is dropped, never made.
        let DeleteLookup::Cold(_) = t.delete_lookup(h, k.as_bytes()) else {
            panic!("{k} is on the device");
        };
        t.delete_blind(h, k.as_bytes(), common::hybrid::lsn());
        model.remove(k.as_bytes());
    }
    assert_eq!(t.stats().device_reads, reads, "blind deletes read nothing");
    // Every key sharing the tag had its entry unresolved (any may have been
    // the deleted key's).
    assert_eq!(t.stats().unresolved_entries, 6, "{:?}", t.stats());
    assert_eq!(t.stats().deleted_keys, 2);
    check_keys(&mut t, &model, &keys);
    // Through a checkpoint the deleted keys stay deleted.
    let entries = checkpoint(&mut t);
    let mut t = reload(&disk, small.clone(), &entries);
    check_keys(&mut t, &model, &keys);
    assert_eq!(t.stats().deleted_keys, 2);
    // Written again: read back, and no longer listed as deleted.
    put(&mut t, SHARED_TAG[4].as_bytes(), &value(4, 7));
    model.insert(SHARED_TAG[4].as_bytes().to_vec(), value(4, 7));
    assert_eq!(t.stats().deleted_keys, 1);
    check_keys(&mut t, &model, &keys);
    // GC settles every unresolved entry: the dead ones go, the others are
    // current again, and no key is left listed.
    for i in 0..300 {
        put(&mut t, &key(i), &value(i, 9));
        model.insert(key(i), value(i, 9));
    }
    while t.background_step() {}
    check_keys(&mut t, &model, &keys);
    assert_eq!(t.stats().unresolved_entries, 0, "{:?}", t.stats());
    assert_eq!(t.stats().deleted_keys, 0, "{:?}", t.stats());
    assert_eq!(t.len(), model.len() as u64);
}

#[test]
fn an_unreadable_newer_record_is_an_error_never_the_older_version() {
    let disk = SimDisk::new(24);
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    put(&mut t, &key(0), &value(0, 0));
    let entries = checkpoint(&mut t);
    let mut t = reload(&disk, settings(0), &entries);
    // A blind overwrite: the old record stays beside the new one,
    // unresolved, and a reload forgets everything held in RAM.
    put(&mut t, &key(0), &value(0, 1));
    assert_eq!(t.stats().unresolved_entries, 1);
    let entries = checkpoint(&mut t);
    let t = reload(&disk, settings(0), &entries);
    let newer = disk
        .files()
        .into_iter()
        .find(|p| p.ends_with("0000000000000002.seg"))
        .expect("the overwrite's segment");
    assert!(disk.corrupt(&newer, 4096 + 40, 1));
    let (answers, _) = get_split(&t, &[key(0)]);
    let reason = answers[0].clone().expect_err("the newer record is damaged");
    assert!(reason.contains("0000000000000002.seg"), "{reason}");
    assert_eq!(t.get(fnv1a64(&key(0)), &key(0)), None);
    let mut t = t;
    assert_eq!(t.take_read_errors().len(), 1);
}

#[test]
fn puts_past_the_unresolved_bound_settle_their_candidates_after_writing() {
    let disk = SimDisk::new(25);
    let mut t = HybridTier::new(disk.clone(), settings(0)).expect("tier");
    let mut model = std::collections::BTreeMap::new();
    for i in 0..1_000 {
        put(&mut t, &key(i), &value(i, 0));
        model.insert(key(i), value(i, 0));
    }
    let entries = checkpoint(&mut t);
    let mut t = reload(&disk, settings(0), &entries);
    t.set_unresolved_max(50);
    t.set_settles_max(12);
    let reads = t.stats().device_reads;
    // Even keys blind, then odd ones once the set is full.
    for i in 0..50 {
        put(&mut t, &key(i * 18), &value(i * 18, 1));
        model.insert(key(i * 18), value(i * 18, 1));
    }
    assert_eq!(
        t.stats().device_reads,
        reads,
        "blind while the set has room"
    );
    assert_eq!(t.stats().unresolved_entries, 50);
    assert_eq!(run_settles(&mut t), 0, "no settling read under the bound");
    // Full: each overwrite is still blind, and queues a settling read.
    for i in 0..10 {
        put(&mut t, &key(i * 90 + 1), &value(i * 90 + 1, 1));
        model.insert(key(i * 90 + 1), value(i * 90 + 1, 1));
    }
    assert_eq!(t.stats().device_reads, reads, "a put read: {:?}", t.stats());
    assert_eq!(t.stats().unresolved_entries, 60);
    assert!(t.write_room());
    // With as many settling reads open as allowed, the shard holds writes
    // back; a put made anyway reads its candidates itself.
    for i in 0..2 {
        put(&mut t, &key(i * 90 + 3), &value(i * 90 + 3, 1));
        model.insert(key(i * 90 + 3), value(i * 90 + 3, 1));
    }
    assert!(!t.write_room());
    assert_eq!(t.stats().device_reads, reads);
    put(&mut t, &key(5), &value(5, 1));
    model.insert(key(5), value(5, 1));
    assert!(t.stats().device_reads > reads, "{:?}", t.stats());
    assert_eq!(t.stats().unresolved_entries, 62);
    // Gets meanwhile take the new records.
    check(&mut t, &model, 1_000);
    // The reads drop the older records they find: the set is back at its
    // bound.
    let reads = t.stats().device_reads;
    assert_eq!(run_settles(&mut t), 12);
    assert!(t.stats().device_reads > reads, "{:?}", t.stats());
    assert_eq!(t.stats().unresolved_entries, 50);
    assert_eq!(t.stats().settles_done, 12);
    assert!(t.write_room());
    check(&mut t, &model, 1_000);
}

#[test]
fn deletes_past_the_bound_go_blind_while_settling_reads_have_room() {
    let disk = SimDisk::new(26);
    let mut t = cold_tier(&disk, 2_000);
    t.set_unresolved_max(4);
    t.set_settles_max(3);
    // Four blind deletes whose answers are never read: the deleted-key
    // set is at its bound.
    for i in 0..4u64 {
        let k = key(i * 100);
        let DeleteLookup::Cold(_) = t.delete_lookup(fnv1a64(&k), &k) else {
            panic!("key {i}: its record is on the device");
        };
        t.delete_blind(fnv1a64(&k), &k, common::hybrid::lsn());
    }
    assert_eq!(t.stats().deleted_keys, 4);
    // Past the bound: still blind, the answer's read counted among the
    // settling reads.
    let (k1, k2, k3) = (key(1_001), key(1_002), key(1_003));
    let reads = t.stats().device_reads;
    let mut held = Vec::new();
    for k in [&k1, &k2] {
        let DeleteLookup::Cold(mut g) = t.delete_lookup(fnv1a64(k), k) else {
            panic!("blind past the bound");
        };
        t.delete_blind(fnv1a64(k), k, common::hybrid::lsn());
        g.index = held.len();
        held.push(g);
    }
    assert_eq!(t.stats().device_reads, reads, "a delete read");
    assert_eq!(t.stats().deleted_keys, 6);
    assert!(t.write_room());
    // A lookup whose delete is not applied (its WAL record did not fit)
    // and is dropped gives its count back.
    let DeleteLookup::Cold(g) = t.delete_lookup(fnv1a64(&k3), &k3) else {
        panic!("blind past the bound");
    };
    assert!(!t.write_room(), "three settling reads open");
    drop(g);
    assert!(t.write_room());
    // The third one is applied; then all three are open, and a fourth
    // delete reads its key's record before it is applied.
    let DeleteLookup::Cold(mut g) = t.delete_lookup(fnv1a64(&k3), &k3) else {
        panic!("blind past the bound");
    };
    t.delete_blind(fnv1a64(&k3), &k3, common::hybrid::lsn());
    g.index = held.len();
    held.push(g);
    assert!(!t.write_room());
    let k4 = key(1_004);
    assert!(matches!(
        t.delete_lookup(fnv1a64(&k4), &k4),
        DeleteLookup::Live
    ));
    t.delete_blind(fnv1a64(&k4), &k4, common::hybrid::lsn());
    assert!(t.stats().device_reads > reads);
    assert_eq!(
        t.stats().deleted_keys,
        7,
        "the blocking delete left no key behind"
    );
    // The answers: each key was there; their reads settle what the blind
    // deletes left.
    let mut answers = vec![Ok(None); 3];
    read_cold(&t, &mut answers, held);
    for (a, i) in answers.iter().zip([1_001u64, 1_002, 1_003]) {
        assert_eq!(a, &Ok(Some(Bytes::from(value(i, 0)))), "key {i}");
    }
    assert!(t.write_room());
    assert_eq!(t.stats().deleted_keys, 4, "{:?}", t.stats());
    for i in [1_001u64, 1_002, 1_003, 1_004, 0, 100] {
        assert_eq!(t.get(fnv1a64(&key(i)), &key(i)), None, "key {i}");
    }
    assert_eq!(
        t.get(fnv1a64(&key(1_005)), &key(1_005)),
        Some(Bytes::from(value(1_005, 0)))
    );
}

#[test]
fn a_delete_answer_settles_every_older_record_of_its_key() {
    let disk = SimDisk::new(27);
    let mut t = cold_tier(&disk, 2_000);
    // A blind overwrite: the key's older record stays, unresolved.
    let k = key(700);
    put(&mut t, &k, &value(700, 1));
    assert_eq!(t.stats().unresolved_entries, 1);
    // Both records on the device, none in RAM.
    checkpoint(&mut t);
    t.forget_cached();
    let DeleteLookup::Cold(mut g) = t.delete_lookup(fnv1a64(&k), &k) else {
        panic!("the key's records are on the device");
    };
    t.delete_blind(fnv1a64(&k), &k, common::hybrid::lsn());
    assert_eq!(t.stats().deleted_keys, 1);
    g.index = 0;
    let mut answer = [Ok(None)];
    read_cold(&t, &mut answer, vec![g]);
    // The answer is the newer value; the read went on to the older record,
    // so nothing of the key is left to settle.
    assert_eq!(answer[0], Ok(Some(Bytes::from(value(700, 1)))));
    assert_eq!(t.stats().deleted_keys, 0, "{:?}", t.stats());
    assert_eq!(t.stats().unresolved_entries, 0, "{:?}", t.stats());
    assert_eq!(t.get(fnv1a64(&k), &k), None);
}

/// Device reads of one cold GET of `k` (nothing in RAM before it), and its
/// answer.
fn reads_of_cold_get(t: &mut HybridTier<SimDisk>, k: &[u8]) -> (u64, ColdAnswer) {
    t.forget_cached();
    let before = t.stats().device_reads;
    let (mut answers, _) = get_split(t, &[k.to_vec()]);
    (t.stats().device_reads - before, answers.remove(0))
}

#[test]
fn reads_per_cold_get_after_overwrites_deletes_and_shared_tags() {
    let disk = SimDisk::new(31);
    let (small, mut t, mut model, _) = shared_tag_tier(&disk);
    // Written out and loaded again: nothing of the new records in RAM
    // either (the checkpoint lists what is unresolved and deleted).
    let cold_again = |t: &mut HybridTier<SimDisk>| {
        let entries = checkpoint(t);
        *t = reload(&disk, small.clone(), &entries);
    };
    // Blind overwrites (nothing in RAM): keys 0..150 and three of the
    // keys that share a tag; their older entries stay, unresolved.
    for i in 0..150 {
        put(&mut t, &key(i), &value(i, 1));
        model.insert(key(i), value(i, 1));
    }
    for (i, k) in SHARED_TAG.iter().enumerate().take(3) {
        put(&mut t, k.as_bytes(), &value(i as u64, 1));
        model.insert(k.as_bytes().to_vec(), value(i as u64, 1));
    }
    // Blind deletes: keys 150..175 answered (their answers' reads settle
    // them), keys 175..200 and a shared-tag key not answered (they stay in
    // the deleted set, their entries dead).
    for i in 150..175 {
        t.forget_cached();
        let answer = delete_blind(&mut t, &key(i));
        assert!(matches!(answer, Ok(Some(_))), "key {i}");
        model.remove(&key(i));
    }
    let unanswered: Vec<Vec<u8>> = (175..200)
        .map(key)
        .chain([SHARED_TAG[3].as_bytes().to_vec()])
        .collect();
    for k in &unanswered {
        let h = fnv1a64(k);
        t.forget_cached();
        assert!(matches!(t.delete_lookup(h, k), DeleteLookup::Cold(_)));
        t.delete_blind(h, k, common::hybrid::lsn());
        model.remove(k);
    }
    assert!(t.stats().unresolved_entries >= 150, "{:?}", t.stats());
    assert!(t.stats().deleted_keys >= 25, "{:?}", t.stats());
    let shared: std::collections::BTreeSet<Vec<u8>> =
        SHARED_TAG.iter().map(|k| k.as_bytes().to_vec()).collect();
    let check = |t: &mut HybridTier<SimDisk>,
                 model: &Model,
                 shared_entries: u64,
                 in_deleted_set: bool,
                 when: &str| {
        // A key with a tag of its own: one read, overwritten or not (its
        // newest entry is tried first).
        for i in 0..300 {
            let (reads, answer) = reads_of_cold_get(t, &key(i));
            let want = model.get(&key(i)).map(|v| Bytes::from(v.clone()));
            assert_eq!(answer, Ok(want.clone()), "{when}: key {i}");
            let expected = u64::from(want.is_some());
            assert_eq!(reads, expected, "{when}: key {i}: reads of a cold GET");
        }
        // Keys that share a tag: each entry of the tag is read once at
        // most, and a deleted one's not at all.
        for k in &shared {
            let (reads, answer) = reads_of_cold_get(t, k);
            let want = model.get(k).map(|v| Bytes::from(v.clone()));
            assert_eq!(
                answer,
                Ok(want.clone()),
                "{when}: {}",
                String::from_utf8_lossy(k)
            );
            assert!(reads >= u64::from(want.is_some()), "{when}");
            // A key still in the deleted set reads nothing; once GC has
            // settled its dead entry it is an absent key of a shared tag.
            if want.is_none() && in_deleted_set {
                assert_eq!(reads, 0, "{when}: a key deleted blind reads nothing");
            }
            assert!(reads <= shared_entries, "{when}: {reads} reads");
        }
        // Keys never written: nearly all read nothing (a tag matches one
        // entry of the ~300 in 1 time in ~30,000).
        let mut reads = 0;
        for i in 0..10_000 {
            let (r, answer) = reads_of_cold_get(t, format!("absent-{i}").as_bytes());
            assert_eq!(answer, Ok(None));
            reads += r;
        }
        assert!(reads <= 10, "{when}: {reads} reads for 10,000 absent keys");
    };
    cold_again(&mut t);
    assert!(t.stats().unresolved_entries >= 150, "{:?}", t.stats());
    assert_eq!(t.stats().deleted_keys, 26, "{:?}", t.stats());
    // The tag's entries: six first records, three overwrites.
    check(&mut t, &model, 9, true, "unsettled");
    // GC settles what is left.
    for i in 200..300 {
        put(&mut t, &key(i), &value(i, 2));
        model.insert(key(i), value(i, 2));
    }
    while t.background_step() {}
    assert!(t.stats().gc_runs > 0);
    cold_again(&mut t);
    // Settled: one entry per live key of the tag.
    check(&mut t, &model, 5, false, "after GC");
}
