//! The hybrid tier with a hot device in front of the value device, on its
//! own (no engine): where writes go, what GC moves off the hot device and
//! what it keeps there, what a read copies back, and that a restart finds
//! each record on the device it was on.

mod common;

use bytes::Bytes;
use common::hybrid::{checkpoint, lsn, open, reload, settings};
use ringkv_engine::hash::fnv1a64;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::io::throttle::{Device, Throttled};
use ringkv_engine::io::Disk;
use ringkv_engine::tier::{HotSettings, HybridSettings, HybridStats, HybridTier, Tier};
use std::sync::Arc;

const SEGMENT: u64 = 64 << 10;

thread_local! {
    static RUNTIME: compio::runtime::Runtime = compio::runtime::Runtime::new().expect("runtime");
}

/// 64 KiB segments, a hot device of `hot_segments` of them, promotion at
/// two reads, no read cache.
fn tiered(hot_segments: u64) -> HybridSettings {
    HybridSettings {
        segment_bytes: SEGMENT,
        hot: Some(HotSettings {
            dir: "/v/shard-000/values-hot".into(),
            bytes: hot_segments * SEGMENT,
            promote_reads: 2,
        }),
        ..settings(0)
    }
}

fn key(i: u64) -> Vec<u8> {
    format!("key-{i:06}").into_bytes()
}

/// About 1 KiB, different for each key and round.
fn value(i: u64, round: u64) -> Vec<u8> {
    let len = 900 + (i * 7 + round) % 200;
    (0..len).map(|j| (i * 31 + j + round) as u8).collect()
}

fn put<D: Disk>(t: &mut HybridTier<D>, i: u64, round: u64) {
    let k = key(i);
    t.put(fnv1a64(&k), &k, &value(i, round), lsn());
}

/// Reads `keys` the way the shard's GETs do (RAM first, the rest from the
/// device), checking each against round `round`'s value.
fn get_all<D: Disk>(t: &mut HybridTier<D>, keys: &[u64], round: u64) {
    let ks: Vec<Bytes> = keys.iter().map(|&i| Bytes::from(key(i))).collect();
    let hashes: Vec<u64> = ks.iter().map(|k| fnv1a64(k)).collect();
    let (mut out, mut cold) = (Vec::new(), Vec::new());
    let mut left = usize::MAX;
    t.get_many_split(&hashes, &ks, &mut out, &mut left, &mut cold);
    // A compio runtime drives the reads: a limited device waits on its
    // timer.
    for (i, a) in RUNTIME.with(|rt| rt.block_on(t.read_cold(cold))) {
        out[i] = a.expect("the record reads");
    }
    for (&i, got) in keys.iter().zip(out) {
        assert_eq!(
            got.as_deref(),
            Some(&value(i, round)[..]),
            "key {i} round {round}"
        );
    }
}

/// Runs GC until it has nothing to do.
fn gc<D: Disk>(t: &mut HybridTier<D>) {
    let mut steps = 0;
    while t.background_step() {
        steps += 1;
        assert!(steps < 100_000, "GC does not settle");
    }
}

/// Device reads of `keys` read cold now: (all, of them on the hot device).
fn reads_of<D: Disk>(t: &mut HybridTier<D>, keys: &[u64], round: u64) -> (u64, u64) {
    t.forget_cached();
    let before = t.stats();
    get_all(t, keys, round);
    let after = t.stats();
    (
        after.device_reads - before.device_reads,
        after.hot_reads - before.hot_reads,
    )
}

fn hot_share(s: &HybridStats) -> String {
    format!(
        "{} of {} segments hot, {} hot bytes, {} promotions, {} demotions",
        s.hot_segments, s.segments, s.hot_segment_bytes, s.promotions, s.demotions
    )
}

/// Writes fill the hot device, then go to the value device; GC empties
/// the oldest hot segments, keeping there the records read lately and
/// moving the others down; the hot device stays within its bytes.
#[test]
fn gc_moves_unread_records_down_and_keeps_the_read_ones() {
    let disk = SimDisk::new(1);
    let s = tiered(6);
    let mut t = open(&disk, s.clone());
    // 600 records of about 1 KiB: over twice the hot device.
    for i in 0..600 {
        put(&mut t, i, 0);
    }
    let st = t.stats();
    assert!(
        st.hot_segments >= 5 && st.segments > st.hot_segments,
        "{}",
        hot_share(&st)
    );
    // The first 40 keys (in the oldest hot segments) are read often.
    for _ in 0..3 {
        get_all(&mut t, &(0..40).collect::<Vec<_>>(), 0);
    }
    gc(&mut t);
    // (A checkpoint writes out what GC copied: reads below go to the
    // devices, not to the buffers in RAM.)
    let _ = checkpoint(&mut t);
    let st = t.stats();
    assert!(st.demotions > 0, "{}", hot_share(&st));
    assert!(
        st.hot_segment_bytes <= 2 * 6 * SEGMENT,
        "the hot device holds {} bytes",
        st.hot_segment_bytes
    );
    // The read ones are on the hot device; the oldest unread ones went
    // down.
    let (reads, hot) = reads_of(&mut t, &(0..40).collect::<Vec<_>>(), 0);
    assert!(
        reads > 0 && hot == reads,
        "{hot} of {reads} reads of read keys on the hot device"
    );
    let (reads, hot) = reads_of(&mut t, &(40..80).collect::<Vec<_>>(), 0);
    assert!(
        reads > 0 && hot == 0,
        "{hot} of {reads} reads of unread keys on the hot device"
    );
    // Every key still reads its value.
    get_all(&mut t, &(0..600).collect::<Vec<_>>(), 0);
}

/// A record on the value device that is read twice is copied to the hot
/// device by the read; a restart from a checkpoint finds it there, and the
/// ones left below still below.
#[test]
fn a_read_copies_a_cold_record_up_and_a_restart_keeps_it_there() {
    let disk = SimDisk::new(2);
    let s = tiered(4);
    let mut t = open(&disk, s.clone());
    for i in 0..600 {
        put(&mut t, i, 0);
    }
    gc(&mut t);
    // Keys written last went to the value device (the hot one was full).
    let cold: Vec<u64> = (580..600).collect();
    let (reads, hot) = reads_of(&mut t, &cold, 0);
    assert!(
        reads > 0 && hot == 0,
        "{hot} of {reads} reads on the hot device"
    );
    let before = t.stats().promotions;
    // The second read counts as often enough: copied up.
    let _ = reads_of(&mut t, &cold, 0);
    let st = t.stats();
    assert!(
        st.promotions >= before + cold.len() as u64 / 2,
        "{}",
        hot_share(&st)
    );
    // Across a restart from a checkpoint (which writes the copies out):
    // where each was.
    let entries = checkpoint(&mut t);
    let promoted: Vec<u64> = cold
        .iter()
        .copied()
        .filter(|&i| {
            let (r, h) = reads_of(&mut t, &[i], 0);
            r == 1 && h == 1
        })
        .collect();
    assert!(promoted.len() >= cold.len() / 2, "{promoted:?}");
    let below: Vec<u64> = (500..520).collect();
    drop(t);
    disk.crash();
    let mut back = reload(&disk, s, &entries);
    for &i in &promoted {
        let (r, h) = reads_of(&mut back, &[i], 0);
        assert!(
            r == 1 && h == 1,
            "key {i}: {h} of {r} reads on the hot device after the restart"
        );
    }
    let (r, h) = reads_of(&mut back, &below, 0);
    assert!(
        r > 0 && h == 0,
        "{h} of {r} reads of never-read keys on the hot device after the restart"
    );
    get_all(&mut back, &(0..600).collect::<Vec<_>>(), 0);
}

/// A copy up that a crash cuts off before the next checkpoint loses
/// nothing: the checkpoint still points at the copy below, which is
/// there; the copy up is garbage (its segment removed as an orphan, or
/// never pointed at).
#[test]
fn a_crash_after_a_copy_up_reads_the_copy_below() {
    let disk = SimDisk::new(3);
    let s = tiered(4);
    let mut t = open(&disk, s.clone());
    for i in 0..600 {
        put(&mut t, i, 0);
    }
    gc(&mut t);
    let entries = checkpoint(&mut t);
    let cold: Vec<u64> = (560..600).collect();
    let _ = reads_of(&mut t, &cold, 0);
    let _ = reads_of(&mut t, &cold, 0);
    assert!(t.stats().promotions > 0, "{}", hot_share(&t.stats()));
    drop(t);
    disk.crash();
    let mut back = reload(&disk, s, &entries);
    let (r, h) = reads_of(&mut back, &cold, 0);
    assert!(
        r > 0 && h == 0,
        "{h} of {r} reads on the hot device after the crash"
    );
    get_all(&mut back, &(0..600).collect::<Vec<_>>(), 0);
}

/// Segments GC emptied on the hot device keep it from taking records
/// until a full checkpoint and one more are published after their GC: the
/// tier asks for a full one once they take half the hot device, then for
/// any, and once both are published they are gone and it asks for none.
#[test]
fn emptied_hot_segments_ask_for_the_checkpoints_that_remove_them() {
    use common::hybrid::checkpoint_of;
    let disk = SimDisk::new(4);
    let s = tiered(4);
    let mut t = open(&disk, s.clone());
    assert_eq!(t.checkpoint_wanted(), None);
    // A first full checkpoint, so later ones may be deltas.
    let _ = checkpoint_of(&mut t, false);
    for round in 0..3 {
        for i in 0..600 {
            put(&mut t, i, round);
        }
        gc(&mut t);
    }
    let st = t.stats();
    assert_eq!(
        t.checkpoint_wanted(),
        Some(true),
        "{} ({} bytes in use of the hot files)",
        hot_share(&st),
        st.hot_segment_bytes
    );
    // A delta does not free them: a full one is still wanted.
    let _ = checkpoint_of(&mut t, true);
    gc(&mut t);
    assert_eq!(t.checkpoint_wanted(), Some(true));
    let _ = checkpoint_of(&mut t, false);
    gc(&mut t);
    assert_eq!(t.checkpoint_wanted(), Some(false));
    let before = t.stats().hot_segment_bytes;
    let _ = checkpoint_of(&mut t, true);
    let after = t.stats();
    assert_eq!(t.checkpoint_wanted(), None, "{}", hot_share(&after));
    assert!(
        after.hot_segment_bytes < before,
        "{} hot bytes before, {} after",
        before,
        after.hot_segment_bytes
    );
    get_all(&mut t, &(0..600).collect::<Vec<_>>(), 2);
}

/// A start that leaves out the hot device of a directory whose segments
/// are on it is refused with a config error naming `storage.hot_device`,
/// before recovery looks at a snapshot (which it would otherwise set aside
/// as damaged: their segments are not where it looks); with the hot device
/// back the directory opens with every value.
#[test]
fn a_start_without_the_hot_device_is_refused_and_sets_nothing_aside() {
    use ringkv_engine::{Engine, Op, OpResult};
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut with_hot = tunables::Config {
        shards: 1,
        ..Default::default()
    };
    with_hot.storage.data_dir = tmp.path().join("data");
    with_hot.storage.tier = tunables::Tier::Hybrid;
    with_hot.storage.durability = tunables::Durability::Sync;
    with_hot.storage.value_segment_size = tunables::ByteSize::kib(256);
    with_hot.storage.checkpoint_wal_bytes = tunables::ByteSize::kib(64);
    with_hot.limits.key_bytes_max = tunables::ByteSize(64);
    with_hot.limits.value_bytes_max = tunables::ByteSize(4096);
    // The default device: the data directory, unthrottled.
    with_hot
        .devices
        .insert("hot".to_string(), Default::default());
    with_hot.storage.hot_device = "hot".to_string();
    with_hot.storage.hot_bytes = tunables::ByteSize::mib(1);
    let engine = Engine::open(&with_hot).expect("open");
    let h = engine.handle();
    // Rounds of puts until two checkpoints are published.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut round = 0u64;
    while round < 20 || engine.metrics().shards[0].checkpoints < 2 {
        let ops = (0..50u64)
            .map(|i| Op::Put {
                key: Bytes::from(key(i)),
                value: Bytes::from(value(i, round)),
            })
            .collect();
        h.batch_blocking(ops).expect("puts");
        round += 1;
        assert!(std::time::Instant::now() < deadline, "no checkpoints");
    }
    let last = round - 1;
    engine.shutdown().expect("shutdown");
    let snapshots = |dir: &std::path::Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir.join("data/shard-000/snapshots"))
            .expect("snapshots")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let before = snapshots(tmp.path());
    assert!(before.iter().any(|s| s.ends_with(".snap")), "{before:?}");

    let mut without = with_hot.clone();
    without.storage.hot_device = String::new();
    without.storage.hot_bytes = tunables::ByteSize(0);
    let err = match Engine::open(&without) {
        Ok(_) => panic!("a start without the hot device opened"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("storage.hot_device"), "{err}");
    assert_eq!(
        snapshots(tmp.path()),
        before,
        "a refused start set snapshots aside"
    );

    let engine = Engine::open(&with_hot).expect("open with the hot device again");
    let h = engine.handle();
    let ops = (0..50u64)
        .map(|i| Op::Get {
            key: Bytes::from(key(i)),
        })
        .collect();
    let got = h.batch_blocking(ops).expect("gets");
    for (i, r) in got.into_iter().enumerate() {
        assert_eq!(
            r,
            OpResult::Value(Bytes::from(value(i as u64, last))),
            "key {i}"
        );
    }
    engine.shutdown().expect("shutdown");
}

/// A tier whose hot device is `disk` behind a device of 2 MiB/s (4 KiB
/// I/Os, no IOPS limit) of which moves may take `move_percent`; the value
/// device is not limited.
fn paced(disk: &SimDisk, move_percent: u32) -> HybridTier<Throttled<SimDisk>> {
    let profile = tunables::ProfileConfig {
        bytes_per_sec: tunables::ByteSize::mib(2),
        io_unit: tunables::ByteSize::kib(4),
        ..tunables::ProfileConfig::unthrottled()
    };
    let hot = Device::new("hot", "/v", "test", profile)
        .expect("profile")
        .with_move_percent(move_percent);
    let main = Device::new(
        "cold",
        "/v",
        "unthrottled",
        tunables::ProfileConfig::unthrottled(),
    )
    .expect("profile");
    let s = tiered(4);
    let dir = s.hot.as_ref().expect("hot").dir.clone();
    disk.create_dir_all(&dir).expect("hot folder");
    HybridTier::new(Throttled::new(disk.clone(), Arc::new(main)), s)
        .expect("tier")
        .with_hot_device(Throttled::new(disk.clone(), Arc::new(hot)))
}

/// Moves take no more than their share of the hot device
/// (`storage.hot_move_percent`). With 1% of 2 MiB/s (20 KiB/s, about 20
/// records a second), GC's step through a full hot segment spends the
/// share for about 3 s, GC waits that long, and the copies up that its
/// emptied segment made room for are skipped; with 100%, the share is
/// back 0.1 s later and the same reads copy most keys up.
#[test]
fn moves_between_devices_keep_to_their_share_of_the_device() {
    let cold: Vec<u64> = (580..600).collect();
    let mut copied = Vec::new();
    for percent in [1, 100] {
        let disk = SimDisk::new(7);
        let mut t = paced(&disk, percent);
        for i in 0..600 {
            put(&mut t, i, 0);
        }
        // The share starts full: the first step (the whole 64 KiB
        // segment, more than the share holds) goes; the next waits until
        // what it took has come back.
        let mut steps = 0;
        while t.background_step() {
            steps += 1;
            assert!(steps < 100, "GC of hot segments is not held back");
        }
        assert_eq!(
            steps, 1,
            "GC steps through hot segments before the share allows"
        );
        let wait = t
            .background_wait()
            .expect("GC stopped without waiting for the share")
            .saturating_duration_since(std::time::Instant::now());
        assert_eq!(t.stats().move_waits, 1);
        if percent == 1 {
            assert!(
                wait > std::time::Duration::from_millis(1500),
                "GC waits only {wait:?}"
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let _ = reads_of(&mut t, &cold, 0);
        let before = t.stats();
        let _ = reads_of(&mut t, &cold, 0);
        let after = t.stats();
        copied.push(after.promotions - before.promotions);
        if percent == 1 {
            assert!(
                after.move_waits > before.move_waits,
                "{}",
                hot_share(&after)
            );
        }
        get_all(&mut t, &(0..600).collect::<Vec<_>>(), 0);
    }
    assert!(
        copied[0] <= 3 && copied[1] >= cold.len() as u64 / 2,
        "copies up with 1% and 100% of the device: {copied:?}"
    );
}
