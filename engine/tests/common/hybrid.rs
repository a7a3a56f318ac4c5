//! Helpers for the tests of the hybrid tier on its own (no engine): its
//! settings, keys and values of varied sizes, and checkpoints taken and
//! loaded the way the shard does.

use bytes::Bytes;
use ringkv_engine::hash::fnv1a64;
use ringkv_engine::histogram::AtomicHistogram;
use ringkv_engine::io::sim::SimDisk;
use ringkv_engine::tier::{HybridSettings, HybridTier, Tier};
use std::path::PathBuf;
use std::sync::Arc;

/// One checkpoint entry: (key, value, expiry).
pub type CheckpointEntry = (Vec<u8>, Vec<u8>, Option<u64>);
pub type Entries = Vec<CheckpointEntry>;

/// One shard's settings: 1 MiB segments, an index for 10,000 keys, GC
/// past 30% garbage.
pub fn settings(cache_bytes: u64) -> HybridSettings {
    HybridSettings {
        shard: 0,
        dir: PathBuf::from("/v/shard-000/values"),
        segment_bytes: 1 << 20,
        index_keys: 10_000,
        cache_bytes,
        gc_garbage_percent: 30,
        read_latency_us: Arc::new(AtomicHistogram::new()),
        hot: None,
    }
}

/// Keys whose hashes share partition, home bucket and tag in an index of
/// four buckets per partition (found by a search over `tag-NNNNNNNNN`).
pub const SHARED_TAG: [&str; 6] = [
    "tag-000000000",
    "tag-017941882",
    "tag-028139317",
    "tag-032695921",
    "tag-081407437",
    "tag-085314964",
];

pub fn key(i: u64) -> Vec<u8> {
    format!("key-{i:08}").into_bytes()
}

/// 20 to 3,019 bytes, different for each key and round.
pub fn value(i: u64, round: u64) -> Vec<u8> {
    let len = 20 + (i * 37 + round * 11) % 3000;
    (0..len).map(|j| (i + j + round) as u8).collect()
}

pub fn put(t: &mut dyn Tier, k: &[u8], v: &[u8]) -> bool {
    t.put(fnv1a64(k), k, v, lsn())
}

pub fn get(t: &dyn Tier, k: &[u8]) -> Option<Bytes> {
    t.get(fnv1a64(k), k)
}

/// Takes a full checkpoint's entries the way the shard does.
/// Makes every settling read the tier queued, as the shard's settling
/// task does; returns how many finished.
pub fn run_settles(t: &mut dyn Tier) -> usize {
    let mut cold = Vec::new();
    t.take_settles(usize::MAX, &mut cold);
    pollster::block_on(t.read_cold(cold)).len()
}

pub fn checkpoint(t: &mut dyn Tier) -> Entries {
    checkpoint_of(t, false)
}

/// Takes a checkpoint's entries the way the shard does: a delta (what
/// changed since the last one) or a full one.
pub fn checkpoint_of(t: &mut dyn Tier, delta: bool) -> Entries {
    let mut out = Vec::new();
    let mut push = |k: &[u8], v: Option<&[u8]>, at: Option<u64>| {
        let v = v.expect("a hybrid checkpoint lists no deleted keys");
        out.push((k.to_vec(), v.to_vec(), at));
    };
    t.checkpoint_begin();
    for p in 0..t.partition_count() {
        t.visit_checkpoint_partition(p, delta, &mut push);
    }
    t.checkpoint_finish(&mut push).expect("checkpoint");
    t.checkpoint_published();
    out
}

/// A new tier over `disk` with `settings`, and the hot device they name
/// (on the same disk) if any.
pub fn open(disk: &SimDisk, settings: HybridSettings) -> HybridTier<SimDisk> {
    use ringkv_engine::io::Disk;
    let hot = settings.hot.clone();
    let t = HybridTier::new(disk.clone(), settings).expect("tier");
    match hot {
        Some(h) => {
            disk.create_dir_all(&h.dir).expect("hot folder");
            t.with_hot_device(disk.clone())
        }
        None => t,
    }
}

/// A new tier over `disk` loaded from a checkpoint's entries, as recovery
/// does: nothing of the values is in RAM.
pub fn reload(
    disk: &SimDisk,
    settings: HybridSettings,
    entries: &[(Vec<u8>, Vec<u8>, Option<u64>)],
) -> HybridTier<SimDisk> {
    reload_chain(disk, settings, &[entries])
}

/// [`reload`] from a chain: a full checkpoint's entries, then those of
/// each delta over it, in order.
pub fn reload_chain(
    disk: &SimDisk,
    settings: HybridSettings,
    chain: &[&[CheckpointEntry]],
) -> HybridTier<SimDisk> {
    let mut t = open(disk, settings);
    for (i, entries) in chain.iter().enumerate() {
        t.load_checkpoint_begin(i > 0).expect("checkpoint starts");
        for (k, v, at) in entries.iter() {
            t.load_checkpoint_entry(k, v, *at).expect("entry loads");
        }
    }
    t.load_checkpoint_done().expect("the chain loads");
    t.recovery_done();
    t
}

/// The buckets per partition a checkpoint's index was written with (its
/// layout entry).
pub fn layout_buckets(entries: &[(Vec<u8>, Vec<u8>, Option<u64>)]) -> u64 {
    let (_, layout, _) = entries
        .iter()
        .find(|(k, _, _)| k.as_slice() == b"\0hybrid/layout")
        .expect("a layout entry");
    u64::from_le_bytes(layout[4..12].try_into().expect("8 bytes"))
}

/// The LSN of the next write a test applies to a tier directly: one more
/// than the last, as the WAL numbers its records (per process; a tier
/// only needs them to grow).
pub fn lsn() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
