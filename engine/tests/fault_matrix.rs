//! The storage-fault matrix (docs/wal.md, "Storage-fault matrix"): every
//! file kind a data directory holds, damaged every way a disk or an
//! operator can damage it, at the first, a middle and the last flush or
//! block, after a clean stop and after two kinds of crash; then reopened.
//!
//! What must hold, for every row (the invariant): no acknowledged write
//! disappears, or reads wrong, without a loud error. Each reopen must end
//! in exactly one of:
//! - `Refused`: the open fails and its error names the damaged file;
//! - `NothingLost`: every acknowledged key reads its last acknowledged value;
//! - `LossReported`: the keys that lost their value answer `VALUE_UNREADABLE`
//!   and the start counted exactly them (`unreadable_keys_at_start`); every
//!   other key reads right;
//! - `LossOnRead`: as `LossReported`, but the start counted none: bad blocks
//!   inside a value segment, which a start does not look for
//!   (docs/storage.md, "Damage to value segments"); each read names the
//!   file and offset, `verify` counts them;
//! - `Window`: only after a crash with no durable mark since the last flush,
//!   and only for damage to that flush: the writes missing are exactly
//!   those of the last batch, each key back at its previous value.
//!
//! Anything else (a wrong or missing value without a refusal or a report,
//! a panic, a hang) fails the row. Each row's observed outcome is also
//! compared with `MATRIX` (the docs' table), so a change of behavior
//! shows. Rows marked `Bug` are real bugs this matrix found: they are
//! skipped (run them with `RINGKV_MATRIX_ALL=1`); each names its bug.
//! `RINGKV_MATRIX_OBSERVE=1` prints every row without comparing with
//! `MATRIX`.

mod common;

use bytes::Bytes;
use common::{block_on, key, small_config, use_small_hybrid_tier, Captured};
use ringkv_engine::io::sim::{SimDisk, SimImage};
use ringkv_engine::io::{AlignedBuf, Disk, DiskFile, ALIGN};
use ringkv_engine::layout::ShardPaths;
use ringkv_engine::wal::format::decode_segment_header;
use ringkv_engine::wal::head::read_head;
use ringkv_engine::{Engine, EngineError, Op, OpError, WalError};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use tunables::{ByteSize, Config, Durability};

const ROOT: &str = "/fm";
const SHARDS: u32 = 2;
/// Keys 0..KEYS; keys 120.. are written once (cold), 200..204 deleted.
const KEYS: u64 = 240;
const BATCH: u64 = 4;
const BLOCK: u64 = ALIGN as u64;

// ---------------------------------------------------------------------
// The dimensions.

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Tier {
    Memory,
    Hybrid,
    /// The hybrid tier with `storage.hot_device` set: every value is on it.
    HybridHot,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The oldest used WAL segment still on disk.
    WalOldest,
    /// A used WAL segment between the oldest and the newest.
    WalMiddle,
    /// The newest used WAL segment (the last flush is in it).
    WalNewest,
    WalHead,
    /// The full snapshot at the base of the newest chain (memory tier).
    SnapFull,
    /// The newest snapshot, a delta (memory tier).
    SnapDelta,
    Manifest,
    /// The manifest of a hybrid-tier directory (it holds the table hash
    /// key its checkpoints' index tags are made with).
    HybridManifest,
    /// The oldest hybrid value segment (on the value device).
    ValueSeg,
    /// The oldest value segment on the hot device.
    HotSeg,
    /// The hybrid tier's full checkpoint at the base of the chain.
    HybridFull,
    /// The hybrid tier's newest checkpoint, a delta.
    HybridDelta,
}

impl Kind {
    fn tier(self) -> Tier {
        match self {
            Kind::HybridManifest | Kind::ValueSeg | Kind::HybridFull | Kind::HybridDelta => {
                Tier::Hybrid
            }
            Kind::HotSeg => Tier::HybridHot,
            _ => Tier::Memory,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Damage {
    /// 4 or 8 bytes XOR'ed with 0xFF.
    Flip,
    /// A 4 KiB sector written with zeroes.
    Zero,
    /// The file cut inside a block (at the position, or to about half).
    Cut,
    Missing,
    /// The same-named file of a second data directory, written with the
    /// same operations but other values.
    OtherDir,
    /// The same-named file of shard 1, in shard 0's place.
    OtherShard,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pos {
    /// The first flush (WAL) or block (snapshot, value segment).
    First,
    Middle,
    Last,
    /// `wal.head`: the slot with the larger generation.
    Current,
    /// `wal.head`: the other slot.
    Older,
    /// The damage has no position (a missing or replaced file; a cut of a
    /// one-block file).
    Whole,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stop {
    /// `Engine::shutdown`: the durable mark covers every record.
    Clean,
    /// A crash once the WAL was idle long enough for the durable mark.
    CrashMarked,
    /// A crash right after the last acknowledged write, no mark since.
    CrashUnmarked,
}

const STOPS: [Stop; 3] = [Stop::Clean, Stop::CrashMarked, Stop::CrashUnmarked];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Refused,
    NothingLost,
    LossReported,
    LossOnRead,
    Window,
}

/// A row's expected outcome under one stop.
#[derive(Clone, Copy, Debug)]
enum Expect {
    Is(Outcome),
    /// A real bug: the row is skipped; the text names it. (No row is
    /// marked so today: the foreign-file rows are fixed by the directory
    /// identity. Kept for the next bug the matrix finds.)
    #[allow(dead_code)]
    Bug(&'static str),
}

use Damage::*;
use Kind::*;
use Pos::*;

const R: Expect = Expect::Is(Outcome::Refused);
const N: Expect = Expect::Is(Outcome::NothingLost);
const L: Expect = Expect::Is(Outcome::LossReported);
const O: Expect = Expect::Is(Outcome::LossOnRead);
const W: Expect = Expect::Is(Outcome::Window);

/// The matrix: (file kind, damage, position, expected outcome after a
/// clean stop, a crash after the durable mark, a crash with no mark).
/// Mirrors the table in docs/wal.md, "Storage-fault matrix".
#[rustfmt::skip]
const MATRIX: &[(Kind, Damage, Pos, [Expect; 3])] = &[
    // ---- WAL segments (memory tier) ----
    (WalOldest, Flip, First, [R, R, R]),
    (WalOldest, Flip, Middle, [R, R, R]),
    (WalOldest, Flip, Last, [R, R, R]),
    (WalOldest, Zero, First, [R, R, R]),
    (WalOldest, Zero, Middle, [R, R, R]),
    (WalOldest, Zero, Last, [R, R, R]),
    (WalOldest, Cut, First, [R, R, R]),
    (WalOldest, Cut, Middle, [R, R, R]),
    (WalOldest, Cut, Last, [R, R, R]),
    (WalOldest, Missing, Whole, [R, R, R]),
    (WalOldest, OtherDir, Whole, [R, R, R]),
    (WalOldest, OtherShard, Whole, [R, R, R]),
    (WalMiddle, Flip, First, [R, R, R]),
    (WalMiddle, Flip, Middle, [R, R, R]),
    (WalMiddle, Flip, Last, [R, R, R]),
    (WalMiddle, Zero, First, [R, R, R]),
    (WalMiddle, Zero, Middle, [R, R, R]),
    (WalMiddle, Zero, Last, [R, R, R]),
    (WalMiddle, Cut, First, [R, R, R]),
    (WalMiddle, Cut, Middle, [R, R, R]),
    (WalMiddle, Cut, Last, [R, R, R]),
    (WalMiddle, Missing, Whole, [R, R, R]),
    (WalMiddle, OtherDir, Whole, [R, R, R]),
    (WalMiddle, OtherShard, Whole, [R, R, R]),
    (WalNewest, Flip, First, [R, R, R]),
    (WalNewest, Flip, Middle, [R, R, R]),
    (WalNewest, Flip, Last, [R, R, W]),
    (WalNewest, Zero, First, [R, R, R]),
    (WalNewest, Zero, Middle, [R, R, R]),
    (WalNewest, Zero, Last, [R, R, W]),
    (WalNewest, Cut, First, [R, R, R]),
    (WalNewest, Cut, Middle, [R, R, R]),
    (WalNewest, Cut, Last, [R, R, R]),
    (WalNewest, Missing, Whole, [R, R, R]),
    (WalNewest, OtherDir, Whole, [R, R, R]),
    (WalNewest, OtherShard, Whole, [R, R, R]),
    // ---- wal.head ----
    (WalHead, Flip, Current, [N, N, N]),
    (WalHead, Flip, Older, [N, N, N]),
    (WalHead, Zero, Current, [N, N, N]),
    (WalHead, Zero, Older, [N, N, N]),
    (WalHead, Cut, Whole, [N, N, N]),
    (WalHead, Missing, Whole, [N, N, N]),
    (WalHead, OtherDir, Whole, [R, R, R]),
    // ---- snapshots (memory tier) ----
    (SnapFull, Flip, First, [R, R, R]),
    (SnapFull, Flip, Middle, [R, R, R]),
    (SnapFull, Flip, Last, [R, R, R]),
    (SnapFull, Zero, First, [R, R, R]),
    (SnapFull, Zero, Middle, [R, R, R]),
    (SnapFull, Zero, Last, [R, R, R]),
    (SnapFull, Cut, First, [R, R, R]),
    (SnapFull, Cut, Middle, [R, R, R]),
    (SnapFull, Cut, Last, [R, R, R]),
    (SnapFull, Missing, Whole, [R, R, R]),
    (SnapFull, OtherDir, Whole, [R, R, R]),
    (SnapDelta, Flip, First, [R, R, R]),
    (SnapDelta, Flip, Middle, [R, R, R]),
    (SnapDelta, Flip, Last, [R, R, R]),
    (SnapDelta, Zero, First, [R, R, R]),
    (SnapDelta, Zero, Middle, [R, R, R]),
    (SnapDelta, Zero, Last, [R, R, R]),
    (SnapDelta, Cut, First, [R, R, R]),
    (SnapDelta, Cut, Middle, [R, R, R]),
    (SnapDelta, Cut, Last, [R, R, R]),
    (SnapDelta, Missing, Whole, [R, R, R]),
    (SnapDelta, OtherDir, Whole, [R, R, R]),
    // ---- MANIFEST ----
    (Manifest, Flip, Whole, [R, R, R]),
    (Manifest, Zero, Whole, [R, R, R]),
    (Manifest, Cut, Whole, [R, R, R]),
    (Manifest, Missing, Whole, [R, R, R]),
    (Manifest, OtherDir, Whole, [R, R, R]),
    (HybridManifest, Flip, Whole, [R, R, R]),
    (HybridManifest, Zero, Whole, [R, R, R]),
    (HybridManifest, Cut, Whole, [R, R, R]),
    (HybridManifest, Missing, Whole, [R, R, R]),
    (HybridManifest, OtherDir, Whole, [R, R, R]),
    // ---- hybrid value segments ----
    (ValueSeg, Flip, First, [N, N, N]),
    (ValueSeg, Flip, Middle, [O, O, O]),
    (ValueSeg, Flip, Last, [O, O, O]),
    (ValueSeg, Zero, First, [N, N, N]),
    (ValueSeg, Zero, Middle, [O, O, O]),
    (ValueSeg, Zero, Last, [O, O, O]),
    (ValueSeg, Cut, First, [L, L, L]),
    (ValueSeg, Cut, Middle, [L, L, L]),
    (ValueSeg, Cut, Last, [L, L, L]),
    (ValueSeg, Missing, Whole, [R, R, R]),
    (ValueSeg, OtherDir, Whole, [R, R, R]),
    (ValueSeg, OtherShard, Whole, [R, R, R]),
    (HotSeg, Flip, First, [N, N, N]),
    (HotSeg, Flip, Middle, [O, O, O]),
    (HotSeg, Flip, Last, [O, O, O]),
    (HotSeg, Zero, First, [N, N, N]),
    (HotSeg, Zero, Middle, [O, O, O]),
    (HotSeg, Zero, Last, [O, O, O]),
    (HotSeg, Cut, First, [L, L, L]),
    (HotSeg, Cut, Middle, [L, L, L]),
    (HotSeg, Cut, Last, [L, L, L]),
    (HotSeg, Missing, Whole, [R, R, R]),
    (HotSeg, OtherDir, Whole, [R, R, R]),
    (HotSeg, OtherShard, Whole, [R, R, R]),
    // ---- the hybrid tier's checkpoints (index table) ----
    (HybridFull, Flip, First, [R, R, R]),
    (HybridFull, Flip, Middle, [R, R, R]),
    (HybridFull, Flip, Last, [R, R, R]),
    (HybridFull, Zero, First, [R, R, R]),
    (HybridFull, Zero, Middle, [R, R, R]),
    (HybridFull, Zero, Last, [R, R, R]),
    (HybridFull, Cut, First, [R, R, R]),
    (HybridFull, Cut, Middle, [R, R, R]),
    (HybridFull, Cut, Last, [R, R, R]),
    (HybridFull, Missing, Whole, [R, R, R]),
    (HybridFull, OtherDir, Whole, [R, R, R]),
    (HybridDelta, Flip, First, [R, R, R]),
    (HybridDelta, Flip, Middle, [R, R, R]),
    (HybridDelta, Flip, Last, [R, R, R]),
    (HybridDelta, Zero, First, [R, R, R]),
    (HybridDelta, Zero, Middle, [R, R, R]),
    (HybridDelta, Zero, Last, [R, R, R]),
    (HybridDelta, Cut, First, [R, R, R]),
    (HybridDelta, Cut, Middle, [R, R, R]),
    (HybridDelta, Cut, Last, [R, R, R]),
    (HybridDelta, Missing, Whole, [R, R, R]),
    (HybridDelta, OtherDir, Whole, [R, R, R]),
];

// ---------------------------------------------------------------------
// Building a data directory: the same operations for every tier, beside
// a model of every acknowledged write.

fn config(tier: Tier, stop: Stop) -> Config {
    let mut c = small_config(Path::new(ROOT), SHARDS, Durability::Sync);
    // Checkpoints only when the build asks: a full one, then deltas.
    c.storage.checkpoint_wal_bytes = ByteSize::mib(64);
    let idle = match stop {
        Stop::CrashMarked => 5_000,
        Stop::Clean | Stop::CrashUnmarked => 60_000_000,
    };
    c.storage.wal_mark_interval = tunables::Duration::from_micros(idle);
    if tier != Tier::Memory {
        use_small_hybrid_tier(&mut c);
        // No GC: records stay where they were written.
        c.storage.gc_garbage_percent = 95;
    }
    if tier == Tier::HybridHot {
        c.devices.insert("hot".to_string(), Default::default());
        c.storage.hot_device = "hot".to_string();
        c.storage.hot_bytes = ByteSize::mib(4);
    }
    c
}

/// A value naming its directory, key and version; its length depends on
/// the key and version only, so both directories lay out their files alike.
fn value(dir: u8, i: u64, version: u64) -> Bytes {
    let len = 40 + ((i * 131 + version * 31) % 500) as usize;
    let mut v = format!("d{dir}:{i}:{version}:").into_bytes();
    v.resize(len, b'.');
    Bytes::from(v)
}

/// Every key's last acknowledged version (`None`: deleted or never written).
type Model = BTreeMap<u64, Option<u64>>;

/// A built data directory, as the stop left it.
struct Built {
    image: SimImage,
    model: Model,
    /// The model before the last batch.
    prev: Model,
    /// The keys the last batch wrote.
    last_batch: BTreeSet<u64>,
}

fn paths(shard: usize) -> ShardPaths {
    ShardPaths::new(Path::new(ROOT), shard)
}

fn puts(h: &ringkv_engine::Handle, model: &mut Model, dir: u8, keys: &[u64], version: u64) {
    let ops = keys
        .iter()
        .map(|&i| Op::Put {
            key: key(i),
            value: value(dir, i, version),
        })
        .collect();
    h.batch_blocking(ops).expect("puts");
    for &i in keys {
        model.insert(i, Some(version));
    }
}

/// Writes keys `range` at `versions`, `BATCH` keys a batch.
fn rounds(
    h: &ringkv_engine::Handle,
    model: &mut Model,
    dir: u8,
    range: std::ops::Range<u64>,
    versions: &[u64],
) {
    for &version in versions {
        let keys: Vec<u64> = range.clone().collect();
        for chunk in keys.chunks(BATCH as usize) {
            puts(h, model, dir, chunk, version);
        }
    }
}

fn build(tier: Tier, stop: Stop, dir: u8) -> Built {
    let disk = SimDisk::new(1 + u64::from(dir));
    let config = config(tier, stop);
    let engine = open_logged(&config, disk.clone())
        .0
        .expect("open a new directory");
    let h = engine.handle();
    let mut model: Model = (0..KEYS).map(|i| (i, None)).collect();
    rounds(&h, &mut model, dir, 0..KEYS, &[1]);
    h.checkpoint_all().expect("full checkpoint");
    rounds(&h, &mut model, dir, 0..40, &[2]);
    let deleted: Vec<Op> = (200..204).map(|i| Op::Delete { key: key(i) }).collect();
    h.batch_blocking(deleted).expect("deletes");
    for i in 200..204 {
        model.insert(i, None);
    }
    h.checkpoint_all().expect("first delta");
    rounds(&h, &mut model, dir, 40..80, &[3, 4]);
    h.checkpoint_all().expect("second delta");
    // Enough after the last checkpoint for three used segments (only the
    // WAL after the newest snapshot is kept).
    rounds(&h, &mut model, dir, 80..120, &[5, 6, 7, 8]);
    let prev = model.clone();
    let last_batch: BTreeSet<u64> = (0..8).collect();
    puts(&h, &mut model, dir, &(0..8).collect::<Vec<_>>(), 9);
    match stop {
        Stop::Clean => engine.shutdown().expect("shutdown"),
        Stop::CrashMarked => {
            let deadline = Instant::now() + Duration::from_secs(30);
            for shard in 0..SHARDS as usize {
                let last = engine.metrics().shards[shard].current_lsn;
                while marked_lsn(&disk, shard) < last {
                    assert!(Instant::now() < deadline, "no durable mark after 30 s idle");
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            engine.halt();
            disk.crash();
        }
        Stop::CrashUnmarked => {
            let last = engine.metrics().shards[0].current_lsn;
            assert!(marked_lsn(&disk, 0) < last, "no mark covers the last batch");
            engine.halt();
            disk.crash();
        }
    }
    Built {
        image: disk.image(),
        model,
        prev,
        last_batch,
    }
}

fn marked_lsn(disk: &SimDisk, shard: usize) -> u64 {
    block_on(read_head(disk, &paths(shard), shard as u32))
        .expect("head")
        .map_or(0, |h| h.marked_lsn)
}

/// The directories built so far, by (tier, stop, directory).
type BuiltSet = Mutex<BTreeMap<(Tier, Stop, u8), &'static Built>>;

/// Each (tier, stop, directory) is built once per test binary.
fn built(tier: Tier, stop: Stop, dir: u8) -> &'static Built {
    static BUILT: OnceLock<BuiltSet> = OnceLock::new();
    let mut all = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    all.entry((tier, stop, dir))
        .or_insert_with(|| Box::leak(Box::new(build(tier, stop, dir))))
}

fn disk_of(image: &SimImage) -> SimDisk {
    let disk = SimDisk::new(99);
    disk.restore(image);
    disk
}

// ---------------------------------------------------------------------
// Opening with the log captured, so the recovery cases can be read.

fn log() -> &'static Captured {
    static LOG: OnceLock<Captured> = OnceLock::new();
    LOG.get_or_init(Captured::install)
}

/// Opens the engine; also returns shard 0's recovery cases from the log
/// (opens are serialized so the lines are this open's).
fn open_logged(config: &Config, disk: SimDisk) -> (Result<Engine, EngineError>, String) {
    static OPENS: Mutex<()> = Mutex::new(());
    let _one = OPENS.lock().unwrap_or_else(|p| p.into_inner());
    let from = log().text().len();
    let opened = Engine::open_with_disk(config, disk);
    let text = log().text();
    let cases = text[from..]
        .lines()
        .filter(|l| l.contains("shard recovered") && l.contains("shard=0 "))
        .filter_map(|l| l.split_once("cases=").map(|(_, c)| c.trim().to_string()))
        .next_back()
        .unwrap_or_default();
    (opened, cases)
}

// ---------------------------------------------------------------------
// Finding the file a row damages, and where.

/// The used WAL segments of shard 0, oldest first.
fn used_segments(disk: &SimDisk, shard: usize) -> Vec<PathBuf> {
    let mut used: Vec<(u64, PathBuf)> = disk
        .list_dir(&paths(shard).wal_dir)
        .expect("list")
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .filter_map(|p| {
            let bytes = disk.read_written(&p)?;
            match decode_segment_header(&bytes[..ALIGN]) {
                Ok(Some(h)) if !h.is_prepared() => Some((h.seq, p)),
                _ => None,
            }
        })
        .collect();
    used.sort();
    used.into_iter().map(|u| u.1).collect()
}

/// The flushes of a WAL segment as (start, end) offsets: each ends after
/// its seal (record kind 3), on a block boundary. They stop where the LSNs
/// stop rising: what follows is a recycled file's stale flushes.
fn wal_flushes(bytes: &[u8]) -> Vec<(u64, u64)> {
    let mut flushes = Vec::new();
    let (mut start, mut at) = (0usize, ALIGN);
    let mut last_lsn = 0u64;
    while at + 32 <= bytes.len() {
        let size = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4")) as usize;
        if size < 32 || at + size > bytes.len() {
            break;
        }
        let lsn = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().expect("8"));
        if lsn < last_lsn {
            break;
        }
        last_lsn = lsn;
        let kind = bytes[at + 24];
        at += size;
        if kind == 3 {
            flushes.push((start as u64, at as u64));
            start = at;
        }
    }
    flushes
}

/// A snapshot's blocks as (start, end) offsets (after the 4 KiB header,
/// back to back, up to the trailer).
fn snapshot_blocks(bytes: &[u8]) -> Vec<(u64, u64)> {
    let mut blocks = Vec::new();
    let mut at = ALIGN;
    while at + 24 <= bytes.len() && &bytes[at..at + 4] == b"SBLK" {
        let payload = u32::from_le_bytes(bytes[at + 16..at + 20].try_into().expect("4")) as usize;
        blocks.push((at as u64, (at + 24 + payload) as u64));
        at += 24 + payload;
    }
    blocks
}

/// The snapshot files of shard 0: (LSN, path, is a delta), oldest first.
fn snapshots(disk: &SimDisk) -> Vec<(u64, PathBuf, bool)> {
    let mut snaps: Vec<(u64, PathBuf, bool)> = disk
        .list_dir(&paths(0).snapshot_dir)
        .expect("list")
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "snap"))
        .map(|p| {
            let bytes = disk.read_written(&p).expect("snapshot");
            let base = u64::from_le_bytes(bytes[36..44].try_into().expect("8"));
            let lsn = u64::from_le_bytes(bytes[16..24].try_into().expect("8"));
            (lsn, p, base != 0)
        })
        .collect();
    snaps.sort();
    snaps
}

/// The oldest value segment in `dir`.
fn oldest_segment(disk: &SimDisk, dir: &Path) -> PathBuf {
    let mut segs: Vec<PathBuf> = disk
        .list_dir(dir)
        .expect("list")
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    segs.into_iter().next().expect("a value segment")
}

/// The damaged file of `kind` on `disk` (shard 0), and the spans damage
/// at a position goes to: flushes, blocks or slots.
fn target(disk: &SimDisk, kind: Kind) -> (PathBuf, Vec<(u64, u64)>) {
    let p = paths(0);
    let spans_of_segment = |path: &PathBuf| {
        let bytes = disk.read_written(path).expect("segment");
        wal_flushes(&bytes)
    };
    match kind {
        WalOldest | WalMiddle | WalNewest => {
            let used = used_segments(disk, 0);
            assert!(used.len() >= 3, "three used segments: {used:?}");
            let path = match kind {
                WalOldest => used[0].clone(),
                WalMiddle => used[used.len() / 2].clone(),
                _ => used[used.len() - 1].clone(),
            };
            let spans = spans_of_segment(&path);
            (path, spans)
        }
        WalHead => {
            let path = p.dir.join("wal.head");
            let bytes = disk.read_written(&path).expect("head");
            let generation = |slot: usize| {
                u64::from_le_bytes(
                    bytes[slot * ALIGN + 16..slot * ALIGN + 24]
                        .try_into()
                        .expect("8"),
                )
            };
            // Spans: [current, older].
            let (current, older) = if generation(0) > generation(1) {
                (0, 1)
            } else {
                (1, 0)
            };
            let slot = |s: u64| (s * BLOCK, (s + 1) * BLOCK);
            (path, vec![slot(current), slot(older)])
        }
        SnapFull | SnapDelta | HybridFull | HybridDelta => {
            let snaps = snapshots(disk);
            let path = if matches!(kind, SnapFull | HybridFull) {
                let full: Vec<_> = snaps.iter().filter(|s| !s.2).collect();
                full.last().expect("a full snapshot").1.clone()
            } else {
                let newest = snaps.last().expect("a snapshot");
                assert!(newest.2, "the newest snapshot is a delta: {snaps:?}");
                newest.1.clone()
            };
            let bytes = disk.read_written(&path).expect("snapshot");
            let blocks = snapshot_blocks(&bytes);
            assert!(
                blocks.len() >= 3,
                "{}: {} blocks",
                path.display(),
                blocks.len()
            );
            (path, blocks)
        }
        Manifest | HybridManifest => (PathBuf::from(ROOT).join("MANIFEST"), vec![(0, BLOCK)]),
        ValueSeg | HotSeg => {
            let dir = if kind == HotSeg {
                p.hot_values_dir
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(ROOT).join("shard-000/values-hot"))
            } else {
                p.values_dir.clone()
            };
            let path = oldest_segment(disk, &dir);
            let bytes = disk.read_written(&path).expect("segment");
            // Blocks 1.. up to the last one that holds anything.
            let used = bytes
                .chunks(ALIGN)
                .rposition(|b| b.iter().any(|&x| x != 0))
                .expect("a written segment") as u64;
            assert!(used >= 3, "{}: {used} blocks", path.display());
            let spans = (1..=used).map(|b| (b * BLOCK, (b + 1) * BLOCK)).collect();
            (path, spans)
        }
    }
}

fn span_at(spans: &[(u64, u64)], pos: Pos) -> (u64, u64) {
    match pos {
        First | Current | Whole => spans[0],
        Middle => spans[spans.len() / 2],
        Last | Older => spans[spans.len() - 1],
    }
}

/// Replaces `path` on `disk` with `bytes` (durably).
fn write_file(disk: &SimDisk, path: &Path, bytes: &[u8]) {
    block_on(async {
        let f = disk.open(path, true).await.expect("open");
        f.set_len(0).await.expect("empty");
        let padded = bytes.len().div_ceil(ALIGN) * ALIGN;
        let mut buf = AlignedBuf::with_capacity(padded.max(ALIGN));
        buf.extend_from_slice(bytes);
        buf.extend_from_slice(&vec![0; padded - bytes.len()]);
        if padded > 0 {
            f.write_at_blocking(&buf, 0).expect("write");
        }
        f.set_len(bytes.len() as u64).await.expect("length");
        f.sync_data().await.expect("sync");
        disk.sync_dir(path.parent().expect("a folder"))
            .await
            .expect("sync dir");
    });
}

fn cut(disk: &SimDisk, path: &Path, len: u64) {
    block_on(async {
        let f = disk.open(path, false).await.expect("open");
        f.set_len(len).await.expect("cut");
        f.sync_data().await.expect("sync");
    });
}

fn zero_sector(disk: &SimDisk, path: &Path, offset: u64) {
    let mut bytes = disk.read_written(path).expect("file");
    let at = (offset / BLOCK * BLOCK) as usize;
    let end = (at + ALIGN).min(bytes.len());
    bytes[at..end].fill(0);
    write_file(disk, path, &bytes);
}

/// Damages `disk` as the row says; returns the damaged file.
fn damage(
    disk: &SimDisk,
    kind: Kind,
    damage: Damage,
    pos: Pos,
    stop: Stop,
) -> Result<PathBuf, String> {
    let (path, spans) = target(disk, kind);
    let (start, end) = span_at(&spans, pos);
    match damage {
        Flip => {
            // In the middle of the span's last 4 KiB (a flush's records,
            // a block's payload, a slot's fields).
            let at = match kind {
                WalHead => start + 16,
                Manifest | HybridManifest => 16,
                _ => {
                    end.saturating_sub(BLOCK).max(start)
                        + (end - end.saturating_sub(BLOCK).max(start)) / 2
                }
            };
            assert!(disk.corrupt(&path, at, 8));
        }
        Zero => {
            let at = match kind {
                WalOldest | WalMiddle | WalNewest => end - BLOCK,
                _ => (start + end) / 2,
            };
            zero_sector(disk, &path, at);
        }
        Cut => {
            let len = match kind {
                // A cut inside the flush: the middle of it, in a block.
                WalOldest | WalMiddle | WalNewest => (start + end) / 2 / BLOCK * BLOCK + 100,
                WalHead => BLOCK + 100,
                // Inside its fields (the rest of the block is zeroes).
                Manifest | HybridManifest => 40,
                ValueSeg | HotSeg => start + 100,
                _ => (start + end) / 2,
            };
            cut(disk, &path, len);
        }
        Missing => {
            block_on(disk.remove_file(&path)).expect("remove");
            block_on(disk.sync_dir(path.parent().expect("folder"))).expect("sync dir");
        }
        OtherDir => {
            let other = disk_of(&built(kind.tier(), stop, 1).image);
            let bytes = other
                .read_written(&path)
                .ok_or_else(|| format!("the other directory has no {}", path.display()))?;
            write_file(disk, &path, &bytes);
        }
        OtherShard => {
            let s = path.to_string_lossy().replace("shard-000", "shard-001");
            let bytes = disk
                .read_written(Path::new(&s))
                .ok_or_else(|| format!("shard 1 has no {s}"))?;
            write_file(disk, &path, &bytes);
        }
    }
    Ok(path)
}

// ---------------------------------------------------------------------
// Reopening and classifying.

/// What a reopen came to: the outcome (or why it breaks the invariant)
/// and the recovery cases or the error kind.
struct Observed {
    outcome: Result<Outcome, String>,
    detail: String,
}

/// The error's kind: the variant names down to the damage.
fn error_kind(e: &EngineError) -> String {
    if let EngineError::Wal(WalError::Corrupt { reason, .. }) = e.root() {
        let d = format!("{reason:?}");
        return format!("Corrupt/{}", d.split([' ', '{', '(']).next().unwrap_or(""));
    }
    let d = format!("{:?}", e.root());
    d.split([' ', '{'])
        .next()
        .unwrap_or("")
        .trim_end_matches('(')
        .replace('(', "/")
}

fn reopen(
    (kind, damage): (Kind, Damage),
    stop: Stop,
    disk: SimDisk,
    file: &Path,
    b: &'static Built,
    window_allowed: bool,
) -> Observed {
    let (opened, cases) = open_logged(&config(kind.tier(), stop), disk);
    let engine = match opened {
        Err(e) => {
            let text = e.to_string();
            let name = file
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            // A missing newest snapshot is named by nothing left on disk:
            // the refusal must then say that a snapshot is missing.
            let missing_snapshot = damage == Missing
                && matches!(kind, SnapFull | SnapDelta | HybridFull | HybridDelta);
            let outcome = if text.contains(&name)
                || (missing_snapshot && text.contains("a snapshot covering LSN"))
            {
                Ok(Outcome::Refused)
            } else {
                Err(format!("refused without naming {name}: {text}"))
            };
            return Observed {
                outcome,
                detail: error_kind(&e),
            };
        }
        Ok(engine) => engine,
    };
    let h = engine.handle();
    let (mut unreadable, mut window) = (0u64, 0u64);
    let mut wrong = Vec::new();
    for i in 0..KEYS {
        let want = b.model[&i].map(|v| value(0, i, v));
        match pollster::block_on(h.get(key(i))) {
            Ok(got) if got == want => {}
            Ok(got) if b.last_batch.contains(&i) && got == b.prev[&i].map(|v| value(0, i, v)) => {
                window += 1
            }
            Err(OpError::ValueUnreadable { reason, .. }) if reason.contains(".seg") => {
                unreadable += 1
            }
            other => wrong.push(format!(
                    "key {i}: {:?}",
                    other
                        .map(|g| g
                            .map(|v| String::from_utf8_lossy(&v[..v.len().min(12)]).into_owned()))
                )),
        }
    }
    let reported: u64 = engine
        .metrics()
        .shards
        .iter()
        .filter_map(|s| s.hybrid.map(|h| h.unreadable_keys_at_start))
        .sum();
    engine.halt();
    let outcome = if !wrong.is_empty() {
        Err(format!(
            "{} keys wrong or missing without a report: {}",
            wrong.len(),
            wrong[..wrong.len().min(3)].join(", ")
        ))
    } else if window > 0 && !(window_allowed && unreadable == 0) {
        Err(format!(
            "{window} keys of the last batch lost outside the undetectable window"
        ))
    } else if window > 0 {
        Ok(Outcome::Window)
    } else if unreadable > 0 && reported == unreadable {
        Ok(Outcome::LossReported)
    } else if unreadable > 0 && reported == 0 && matches!(kind, ValueSeg | HotSeg) {
        Ok(Outcome::LossOnRead)
    } else if unreadable > 0 || reported > 0 {
        Err(format!(
            "{unreadable} keys unreadable, the start reported {reported}"
        ))
    } else {
        Ok(Outcome::NothingLost)
    };
    Observed {
        outcome,
        detail: if cases.is_empty() { "-".into() } else { cases },
    }
}

/// Runs one row under one stop, with a bound on its time: a hang fails.
fn run_cell(kind: Kind, dmg: Damage, pos: Pos, stop: Stop) -> Observed {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let b = built(kind.tier(), stop, 0);
        let disk = disk_of(&b.image);
        let observed = match damage(&disk, kind, dmg, pos, stop) {
            Ok(file) => {
                // Damage confined to the last flush after a crash with no
                // mark since: the only window the WAL cannot see.
                let window_allowed = stop == Stop::CrashUnmarked
                    && kind == WalNewest
                    && pos == Last
                    && matches!(dmg, Flip | Zero);
                reopen((kind, dmg), stop, disk, &file, b, window_allowed)
            }
            Err(why) => Observed {
                outcome: Err(why),
                detail: "-".into(),
            },
        };
        let _ = tx.send(observed);
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(o) => o,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Observed {
            outcome: Err("hang: no answer in 120 s".into()),
            detail: "-".into(),
        },
        Err(_) => Observed {
            outcome: Err("panicked".into()),
            detail: "-".into(),
        },
    }
}

/// Runs every row of `kinds` under every stop; fails with every row whose
/// outcome breaks the invariant or differs from `MATRIX`.
fn run(kinds: &[Kind]) {
    let observe = std::env::var_os("RINGKV_MATRIX_OBSERVE").is_some();
    let all = std::env::var_os("RINGKV_MATRIX_ALL").is_some();
    let mut failures = Vec::new();
    let mut ran = 0;
    for &(kind, dmg, pos, expected) in MATRIX.iter().filter(|r| kinds.contains(&r.0)) {
        for (stop, expect) in STOPS.iter().zip(expected) {
            if let Expect::Bug(bug) = expect {
                if !all {
                    println!("| {kind:?} | {dmg:?} | {pos:?} | {stop:?} | skipped: bug {bug} | |");
                    continue;
                }
            }
            let o = run_cell(kind, dmg, pos, *stop);
            ran += 1;
            let shown = match &o.outcome {
                Ok(out) => format!("{out:?}"),
                Err(why) => format!("FAILS: {why}"),
            };
            println!(
                "| {kind:?} | {dmg:?} | {pos:?} | {stop:?} | {shown} | {} |",
                o.detail
            );
            let ok = match (&o.outcome, expect) {
                (Err(_), _) => false,
                (Ok(_), _) if observe => true,
                (Ok(got), Expect::Is(want)) => *got == want,
                (Ok(_), Expect::Bug(_)) => false,
            };
            if !ok {
                failures.push(format!(
                    "{kind:?} {dmg:?} {pos:?} {stop:?}: expected {expect:?}, got {shown} ({})",
                    o.detail
                ));
            }
        }
    }
    assert!(ran > 0, "no row ran");
    assert!(
        failures.is_empty(),
        "{} rows fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn wal_oldest_segment() {
    run(&[WalOldest]);
}

#[test]
fn wal_middle_segment() {
    run(&[WalMiddle]);
}

#[test]
fn wal_newest_segment() {
    run(&[WalNewest]);
}

#[test]
fn wal_head() {
    run(&[WalHead]);
}

#[test]
fn snapshots_full_and_delta() {
    run(&[SnapFull, SnapDelta]);
}

#[test]
fn manifests() {
    run(&[Manifest, HybridManifest]);
}

#[test]
fn value_segments() {
    run(&[ValueSeg]);
}

#[test]
fn hot_device_value_segments() {
    run(&[HotSeg]);
}

#[test]
fn hybrid_checkpoints() {
    run(&[HybridFull, HybridDelta]);
}
