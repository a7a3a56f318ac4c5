//! The hybrid tier: a compact index in RAM ([`index`]), values in
//! append-only segment files on the value device ([`log`]), hot records in
//! a scan-resistant cache ([`cache`]). `docs/storage.md` has the formats
//! and the rules; in short:
//!
//! - **Keys are told apart by their bytes, never by their hash.** The
//!   index keeps 15 bits of a key's hash per entry; every entry whose tag
//!   matches is a candidate whose record is read (from the cache, the
//!   unwritten tail in RAM, or the device) and whose key is compared. Two
//!   keys with equal tags simply have two entries.
//! - **Writes.** A put appends a record to the active segment (through a
//!   1 MiB buffer) and points the key's entry at it. It never reads the
//!   device (a blind write): candidates whose records are in RAM are
//!   compared, and the key's older entry among them replaced; candidates
//!   on the device are left beside the new entry, marked *unresolved*. A
//!   key has at most one entry that is not unresolved, its newest; reads
//!   try those first, then the unresolved ones newest first. GC, deletes
//!   and walks settle unresolved entries (they read those records anyway).
//! - **Deletes** do not read either. Entries of the key found in RAM go;
//!   those on the device stay, unresolved, and the key is put in a set of
//!   *deleted keys*: while it is there, every entry of it is dead (it has
//!   no settled entry), so reads answer absent without reading. A put of
//!   the key takes it out; GC takes it out once it has settled the key's
//!   last unresolved entry. Whether the key was there is read afterwards,
//!   asynchronously, for the answer ([`Tier::delete_lookup`]).
//! - **Durability.** The WAL stays the commit point. Values reach segment
//!   files in the background of appends and are fdatasync'ed by each
//!   checkpoint before it is published, so WAL segments are retired only
//!   once everything they hold is durable in segments.
//! - **Checkpoints** write the index (6 bytes per slot), the segment table
//!   and the expiry list through the snapshot container, never the values.
//! - **GC** rewrites the live records of the segment with the best
//!   cost-benefit score once garbage passes `storage.gc_garbage_percent`;
//!   an emptied segment is removed only after two checkpoints that started
//!   after its GC, and once no snapshot kept (a file of the two newest
//!   chains, which recovery may fall back to) is older than its GC.
//! - **Resize.** An index loaded from a checkpoint has the size it was
//!   written with; when recovery is done and `index_keys` asks for another
//!   size, `resize.rs` rebuilds it by reading every record's key.
//! - **Faults.** A read that fails or a block whose checksum does not match
//!   answers an error for the keys it holds (naming file and offset), never
//!   a wrong value; a failed segment write or fdatasync poisons the shard.
//!
//! GETs of cold keys read asynchronously: [`Tier::get_many_split`] looks a
//! run of keys up and answers what RAM holds; the records of the others
//! are read together by [`Tier::fetch_cold`] (one read per record, reads of
//! adjacent blocks merged, no borrow of the tier held meanwhile, so the
//! shard keeps serving) and answered by [`Tier::finish_cold`]; so are the
//! answers of blind deletes, and the settling reads puts queue once the
//! unresolved set is at its bound ([`Tier::take_settles`]). Every other
//! device I/O here (appends, GC, key walks, read-modify-writes, puts and
//! deletes past [`SETTLES_MAX`] open settling reads) is blocking, on the
//! shard thread.

pub mod cache;
mod damage;
pub mod index;
pub mod log;
mod expiry_list;
mod gc;
mod lookup;
mod segments;
mod writes;
mod resize;
mod stats;
mod tiers;

use self::cache::Cache;
pub use self::damage::SegmentDamage;
pub use self::stats::HybridStats;
use self::index::{Candidate, Index, KeyHash, PARTITIONS};
use self::log::{
    check_blocks, parse_record, DeviceSource, Parsed, ReadError, Record, RecordSpot, SegState,
    ValueLog, BLOCK,
};
use super::{CheckpointVisitor, ColdAnswer, ColdFetch, ColdGet, EntryVisitor, Tier};
use crate::hash::TableHasher;
use crate::io::{AlignedBuf, Disk, DiskFile};
use bytes::Bytes;
use std::cell::RefCell;
use self::expiry_list::ExpiryList;
use std::collections::VecDeque;
use std::path::PathBuf;

const KEY_LAYOUT: &[u8] = b"\0hybrid/layout";
const KEY_INDEX: &[u8] = b"\0hybrid/index/";
const KEY_SEGMENTS: &[u8] = b"\0hybrid/segments";
const KEY_EXPIRING: &[u8] = b"\0hybrid/expiring/";
const KEY_UNRESOLVED: &[u8] = b"\0hybrid/unresolved/";
const KEY_DELETED: &[u8] = b"\0hybrid/deleted/";
/// 2: checkpoints may list unresolved entries (version 1 has none).
/// 3: checkpoints may list deleted keys (versions 1 and 2 have none).
const LAYOUT_VERSION: u32 = 3;
/// Buckets per index chunk in a checkpoint (~400 KB).
const CHECKPOINT_BUCKETS: usize = 8192;
/// Expiry entries per checkpoint chunk.
const EXPIRING_CHUNK: usize = 32 * 1024;
/// What one deleted key costs in RAM beyond its bytes (its box and its
/// place in the set).
const DELETED_KEY_BYTES: u64 = 40;
/// Bytes of deleted keys per checkpoint chunk.
const DELETED_CHUNK_BYTES: usize = 256 * 1024;

/// Settings of one shard's hybrid tier.
#[derive(Clone)]
pub struct HybridSettings {
    pub shard: u32,
    pub dir: PathBuf,
    pub segment_bytes: u64,
    pub index_keys: u64,
    pub cache_bytes: u64,
    pub gc_garbage_percent: u32,
    /// Where device read latencies go (µs).
    pub read_latency_us: std::sync::Arc<crate::histogram::AtomicHistogram>,
    /// A hot device in front of the value device (`tiers`), if any.
    pub hot: Option<HotSettings>,
}

/// The hot device of a shard's hybrid tier (`storage.hot_device`).
#[derive(Clone, Debug)]
pub struct HotSettings {
    /// The folder of this shard's hot segments.
    pub dir: PathBuf,
    /// Bytes its segment files may take (this shard's part of
    /// `storage.hot_bytes`); at least four segments.
    pub bytes: u64,
    /// Reads lately that move a cold record up or keep a hot one
    /// (`storage.hot_promote_reads`).
    pub promote_reads: u8,
}

struct Inner<D: Disk> {
    /// Makes the table hash of every key (see [`Tier::table_hasher`]): the
    /// index's partitions, buckets and tags, which checkpoints store, come
    /// from it.
    hasher: TableHasher,
    settings: HybridSettings,
    index: Index,
    log: ValueLog<D>,
    cache: Cache,
    /// (expiry, address) of every record with an expiry time the index
    /// may point at (checked against the index when used).
    expiring: ExpiryList,
    now_ms: u64,
    /// Checkpoints started (GC epochs).
    epoch: u64,
    /// While a checkpoint runs: the (expiry, address) pairs GC moved away
    /// from since it began. Its index partitions copied before a move
    /// point at the old address, and the expiry list is written at its
    /// finish, so it lists them too (recovery drops the pairs its index
    /// does not point at when they come due).
    checkpoint_expiring_moved: Option<Vec<(u64, u32)>>,
    blind: BlindSets,
    settling: Settling<D::File>,
    gc: GcState,
    faults: Faults,
    loading: LoadState,
    /// Placement across a hot and a cold device, if a hot one is set.
    tiering: Option<tiers::Tiering>,
}

/// What blind writes and deletes leave behind: entries that may hold an
/// older version of a key, and keys deleted without reading.
struct BlindSets {
    /// Entries a blind write left behind: the addresses of records that
    /// may hold an older version of a key written since (a write whose
    /// candidates were not in RAM did not read them). Reads try them last,
    /// newest first; GC, deletes and walks settle them.
    unresolved: hashbrown::HashSet<u32>,
    /// Most entries `unresolved` may hold; past it writes read their
    /// candidates again.
    unresolved_max: usize,
    /// A recovery replays the WAL (`replay_begin` until `recovery_done`):
    /// blind writes are not bounded by `unresolved_max`.
    replaying: bool,
    /// `unresolved` as it was when the running checkpoint began: what the
    /// checkpoint lists. Entries made unresolved later come back with the
    /// replay of the writes that made them so; entries GC settles later
    /// (no WAL record) must stay listed, or an index partition copied
    /// before GC settled them would have two current entries for one key.
    checkpoint_unresolved: Vec<u32>,
    /// Keys a delete removed without reading (see the module doc): every
    /// entry of such a key is unresolved and dead. Bounded by
    /// `unresolved_max`; past it deletes read.
    deleted: std::collections::HashSet<Box<[u8]>>,
    /// Bytes of the keys in `deleted`.
    deleted_bytes: u64,
    /// `deleted` as it was when the running checkpoint began (see
    /// `checkpoint_unresolved`; a put or a delete after it comes back with
    /// the replay).
    checkpoint_deleted: Vec<Box<[u8]>>,
}

impl BlindSets {
    /// RAM of the sets: the unresolved entries' table as allocated, the
    /// deleted keys with their boxes, and the copies a running checkpoint
    /// holds.
    fn memory_bytes(&self) -> u64 {
        let unresolved = self.unresolved.allocation_size() as u64;
        let deleted = self.deleted_bytes + self.deleted.capacity() as u64 * DELETED_KEY_BYTES;
        let copies = self.checkpoint_unresolved.capacity() as u64 * 4
            + self.checkpoint_deleted.capacity() as u64 * 16;
        unresolved + deleted + copies
    }

    /// At least what [`BlindSets::memory_bytes`] grows by when
    /// `unresolved` takes up to `more` new entries: nothing while they fit
    /// its capacity, else a new table. hashbrown sizes that table for the
    /// entries (a power of two of buckets, at least 8 for 4-byte entries,
    /// keeping an eighth free) or, when they would fit the old one, at
    /// most doubles it.
    fn unresolved_growth_bytes(&self, more: usize) -> u64 {
        let needed = self.unresolved.len() + more;
        if needed <= self.unresolved.capacity() {
            return 0;
        }
        let now = self.unresolved.allocation_size() as u64;
        let buckets = (needed.max(7) * 8 / 7).next_power_of_two() as u64;
        // 4-byte slots, a control byte each and a group of spare ones.
        let for_needed = buckets * 5 + 32;
        for_needed.max(2 * now) - now
    }
}

/// The reads that settle blind writes made past the sets' bound.
struct Settling<F> {
    /// Reads that settle the candidates of puts made past the unresolved
    /// set's bound, waiting for [`Tier::take_settles`].
    settles: Vec<ColdKey<F>>,
    /// Settling reads queued or in flight (not finished yet): each holds
    /// an [`OpenSettle`], which counts it until it is dropped.
    settles_open: std::rc::Rc<std::cell::Cell<usize>>,
    /// The last delete looked up past the sets' bound with an answer read
    /// counted among the settling reads: it may go blind.
    blind_allowed: Option<u64>,
    /// Most settling reads open ([`SETTLES_MAX`]).
    settles_max: usize,
    /// Settling reads finished.
    settles_done: u64,
}

/// Where a settling scan is (`settle_step`).
#[derive(Clone, Copy)]
struct SettleScan {
    slot: u32,
    seq: u64,
    /// Where the scan goes on.
    from: u64,
    /// Where it stops: the segment's end when the scan began (the active
    /// segment grows meanwhile; what is appended after, the scan leaves).
    until: u64,
}

/// Garbage collection's place and counters.
struct GcState {
    runs: u64,
    bytes_read: u64,
    bytes_written: u64,
    /// The segment GC is working through, and where it goes on.
    victim: Option<(u32, u64)>,
    /// The segment a settling scan is working through (`settle_step`).
    settling: Option<SettleScan>,
    /// Sequence numbers of the segments settling scans went through since
    /// the unresolved set was last within its bound: each is scanned once
    /// (what it could not settle, a later scan would not either).
    settled_segments: Vec<u64>,
    /// Set when the round of settling scans went through every segment
    /// holding unresolved entries: the log's next segment number then.
    /// Until the set is back within its bound, a scan starts again only
    /// for a segment started since (looking for one counts the whole set).
    settle_round_ended: Option<u64>,
    /// Sequence numbers of the segments GC gave up on (a read failed):
    /// eviction from the hot device passes them by too.
    gave_up: Vec<u64>,
    /// Whether the running checkpoint is a full one (not a delta).
    checkpoint_full: bool,
    /// (epoch, full) of the checkpoints published since this tier was
    /// made, oldest first, from the full one the second newest builds on:
    /// the snapshots kept (`snapshot::retained`) as far as this tier
    /// knows. Snapshots from before a restart are not in it.
    published: Vec<(u64, bool)>,
}

/// What went wrong: read errors to report, a failed write that poisons
/// the shard, keys whose newest put was not written.
struct Faults {
    /// Errors of reads since the last `take_read_errors`: (key, message).
    read_errors: Vec<(Bytes, String)>,
    read_error_count: u64,
    /// A write or fdatasync of a segment failed: the shard must stop
    /// taking writes.
    fault: Option<String>,
    /// Keys whose newest put failed to append (after a fault): their
    /// entries point at older records, so reads answer an error for them
    /// instead ([`ReadError::Unwritten`]). Only a poisoned shard has any
    /// (it logs no more writes, so the set grows by one batch at most).
    unwritten: std::collections::HashSet<Box<[u8]>>,
    /// Bounds the warnings failed reads log.
    warnings: ReadWarnings,
}

impl Faults {
    /// Logs a failed read of the device (`what` happened, because of
    /// `error`) unless this minute already logged [`READ_WARNINGS_PER_MINUTE`]
    /// of them; the rest are counted and said in one line when a later
    /// minute's first failure comes. Each failure is still answered as an
    /// error to its request, and STATS counts every one (`read_errors`).
    fn warn(&mut self, shard: u32, what: &str, error: &dyn std::fmt::Display) {
        if self.warnings.allow(shard) {
            tracing::warn!(shard, error = %error, "hybrid tier: {what}");
        }
    }
}

/// Failed-read warnings logged per shard per minute: one damaged segment
/// can fail thousands of reads, and the log would repeat one fact.
const READ_WARNINGS_PER_MINUTE: u32 = 10;

/// The window [`Faults::warn`] counts in.
#[derive(Default)]
struct ReadWarnings {
    window_start: Option<std::time::Instant>,
    logged: u32,
    held_back: u64,
}

impl ReadWarnings {
    fn allow(&mut self, shard: u32) -> bool {
        let now = std::time::Instant::now();
        let expired = self
            .window_start
            .is_none_or(|at| now.duration_since(at) >= std::time::Duration::from_secs(60));
        if expired {
            if self.held_back > 0 {
                tracing::warn!(
                    shard,
                    not_logged = self.held_back,
                    "hybrid tier: more reads failed than were logged one by one; STATS read_errors counts every failure"
                );
            }
            *self = ReadWarnings {
                window_start: Some(now),
                ..ReadWarnings::default()
            };
        }
        if self.logged < READ_WARNINGS_PER_MINUTE {
            self.logged += 1;
            true
        } else {
            self.held_back += 1;
            false
        }
    }
}

/// Recovery's progress through a checkpoint chain.
struct LoadState {
    /// Segment files not checked against the loaded checkpoint yet.
    orphans_checked: bool,
    /// A checkpoint's layout entry was loaded (recovery): the index has
    /// the size a delta loaded over it must have.
    layout_loaded: bool,
    /// The segment table of the checkpoint file loaded last, opened once
    /// the whole chain is loaded (`load_checkpoint_done`).
    pending_segments: Option<Vec<u8>>,
    /// The segments that table opened, and those it lists that are gone
    /// (not emptied by GC): (slot, sequence, end). Checked against their
    /// files once recovery is done (`damage`).
    loaded: Vec<(u32, u64, u64)>,
    missing: Vec<(u32, u64, u64)>,
    /// The damaged segments that check found (reported once, at the start).
    damage: Vec<SegmentDamage>,
}

/// Bytes of one row of a checkpoint's segment table.
const SEGMENT_ROW_BYTES: usize = 4 + 8 * 4 + 2 + 8;

/// Blocks one GC step reads (256 KiB): the longest the shard pauses for GC
/// is about one read of this size plus rewriting its live records.
const GC_STEP_BLOCKS: u64 = 64;

/// Most blocks one merged GET read covers (256 KiB).
const MERGE_BLOCKS: u64 = 64;

/// Two ascending sequences as one, each pair once.
fn merge_sorted<T: Ord + Copy>(
    a: impl Iterator<Item = T>,
    b: impl Iterator<Item = T>,
) -> impl Iterator<Item = T> {
    let mut a = a.peekable();
    let mut b = b.peekable();
    let mut last: Option<T> = None;
    std::iter::from_fn(move || loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x <= y => a.next(),
            (Some(_), Some(_)) | (None, Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, None) => return None,
        }?;
        if last != Some(next) {
            last = Some(next);
            return Some(next);
        }
    })
}

/// Most unresolved entries per shard: an 32nd of the keys the index is
/// sized for (about 0.3 bytes of RAM per key at most), at least 4096.
fn unresolved_max(index_keys: u64) -> usize {
    (index_keys / 32).max(4096) as usize
}

/// The epoch of the oldest snapshot kept, from the checkpoints published
/// (`(epoch, full)`, oldest first): the full snapshot the second newest
/// builds on. `None` when that is not known (it was written before this
/// tier was made: recovery may still load it). Drops the entries older
/// than it.
fn oldest_kept_epoch(published: &mut Vec<(u64, bool)>) -> Option<u64> {
    let second = published.len().checked_sub(2)?;
    let start = published[..=second].iter().rposition(|&(_, full)| full)?;
    published.drain(..start);
    Some(published[0].0)
}

/// Most settling reads queued or in flight per shard. Past it a put
/// reads its candidates itself; the shard holds writes back before that
/// ([`Tier::write_room`]).
const SETTLES_MAX: usize = 4096;

/// A candidate record of a cold GET.
struct ColdCand<F> {
    addr: u32,
    span: u8,
    /// An unresolved entry: the answer only if every candidate before it
    /// was read and is another key's.
    unresolved: bool,
    state: CandState<F>,
}

enum CandState<F> {
    /// On the device: `blocks` are the checked payloads once read.
    Read {
        spot: RecordSpot,
        src: DeviceSource<F>,
        blocks: Option<Result<Vec<u8>, ReadError>>,
    },
    /// Found in RAM, but tried only after the candidates before it.
    Known(Result<Record, ReadError>),
}

/// Where a candidate's record is.
enum Where<F> {
    Ram(Result<Record, ReadError>),
    Device(RecordSpot, DeviceSource<F>),
}

/// A GET waiting for device reads (what a [`ColdGet`] holds).
struct ColdKey<F> {
    key: Bytes,
    hash: u64,
    /// The tier's clock when the GET was looked up.
    now_ms: u64,
    /// Candidates still to try, in order; the first is the one read next.
    cands: VecDeque<ColdCand<F>>,
    /// Why an earlier candidate could not be read (the key may be there).
    failed: Option<String>,
    /// Device reads done for this GET and their bytes, not counted yet (a
    /// merged read counts once, for the first GET it served).
    reads: u64,
    /// Of `reads`, those of hot segments.
    hot_reads: u64,
    bytes: u64,
    /// The read answers a delete that was applied blind, or settles a
    /// put's candidates: the key's record it finds is dead (older than
    /// the delete or the put), and its entry goes.
    settle: bool,
    /// A settling read of a put; no one waits for its answer.
    background: bool,
    /// The newest record of the key found so far among unresolved
    /// candidates (by LSN, see `Inner::is_newer`), its address and whether
    /// it may be cached: the answer once every candidate is read. A
    /// settling read keeps it from any candidate (every record of the key
    /// it finds is dead; the newest tells whether the key was live).
    best: Option<(u32, Record, bool)>,
    /// Counted in `settles_open` (a put's settling read, or the answer
    /// read of a delete applied blind past the sets' bound) until dropped.
    counted: Option<OpenSettle>,
}

/// One open settling read, counted until dropped (finished, or abandoned:
/// a delete looked up again when its WAL record did not fit).
struct OpenSettle(std::rc::Rc<std::cell::Cell<usize>>);

impl OpenSettle {
    fn new(open: &std::rc::Rc<std::cell::Cell<usize>>) -> OpenSettle {
        open.set(open.get() + 1);
        OpenSettle(open.clone())
    }
}

impl Drop for OpenSettle {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// Where a cold read's answer goes: (its index, whether it answers a
/// delete), as in [`ColdGet`].
type Placed = (usize, bool);

/// What a lookup found.
enum Lookup<F> {
    /// The record, from RAM (or none).
    Found(Option<Record>),
    /// No candidate matched and one could not be read.
    Failed(ReadError),
    /// Candidates to read from the device.
    Cold(ColdKey<F>),
}

/// The hybrid tier of one shard.
pub struct HybridTier<D: Disk> {
    inner: RefCell<Inner<D>>,
}

impl<D: Disk> HybridTier<D> {
    /// A tier over the segment directory `settings.dir` (created if
    /// missing). Segment files already there are opened only as a
    /// checkpoint names them; any other is removed before the first write.
    pub fn new(disk: D, settings: HybridSettings) -> std::io::Result<HybridTier<D>> {
        disk.create_dir_all(&settings.dir)?;
        Ok(HybridTier::in_existing_dir(disk, settings))
    }

    /// [`HybridTier::new`] for a segment directory that exists already.
    pub fn in_existing_dir(disk: D, settings: HybridSettings) -> HybridTier<D> {
        let settings_index_keys = settings.index_keys;
        let log = ValueLog::new(
            disk,
            settings.dir.clone(),
            settings.shard,
            settings.segment_bytes,
        );
        HybridTier {
            inner: RefCell::new(Inner {
                hasher: TableHasher::LEGACY,
                index: Index::new(settings.index_keys),
                cache: Cache::new(settings.cache_bytes),
                settings,
                log,
                expiring: ExpiryList::new(),
                now_ms: 0,
                epoch: 0,
                checkpoint_expiring_moved: None,
                blind: BlindSets {
                    unresolved: hashbrown::HashSet::new(),
                    unresolved_max: unresolved_max(settings_index_keys),
                    replaying: false,
                    checkpoint_unresolved: Vec::new(),
                    deleted: std::collections::HashSet::new(),
                    deleted_bytes: 0,
                    checkpoint_deleted: Vec::new(),
                },
                settling: Settling {
                    settles: Vec::new(),
                    settles_open: std::rc::Rc::new(std::cell::Cell::new(0)),
                    blind_allowed: None,
                    settles_max: SETTLES_MAX,
                    settles_done: 0,
                },
                gc: GcState {
                    runs: 0,
                    bytes_read: 0,
                    bytes_written: 0,
                    victim: None,
                    settling: None,
                    settled_segments: Vec::new(),
                    settle_round_ended: None,
                    gave_up: Vec::new(),
                    checkpoint_full: false,
                    published: Vec::new(),
                },
                faults: Faults {
                    read_errors: Vec::new(),
                    read_error_count: 0,
                    fault: None,
                    unwritten: Default::default(),
                    warnings: ReadWarnings::default(),
                },
                loading: LoadState {
                    orphans_checked: false,
                    layout_loaded: false,
                    pending_segments: None,
                    loaded: Vec::new(),
                    missing: Vec::new(),
                    damage: Vec::new(),
                },
                tiering: None,
            }),
        }
    }

    /// Puts the hot device `settings.hot` names in front of the value
    /// device: `disk` is its disk (its profile throttles its I/O), and the
    /// folder `settings.hot` names must exist. Before anything is loaded.
    pub fn with_hot_device(mut self, disk: D) -> HybridTier<D> {
        let st = self.inner.get_mut();
        let hot = st
            .settings
            .hot
            .clone()
            .expect("settings.hot names the hot device's folder");
        st.log.add_hot(disk, hot.dir);
        st.tiering = Some(tiers::Tiering::new(hot.bytes, hot.promote_reads));
        self
    }

    /// The tier hashing keys with `hasher` instead of the unkeyed
    /// [`TableHasher::LEGACY`] the constructors start with. Only for a
    /// fresh tier (before any entry or checkpoint is loaded); a checkpoint
    /// must be loaded with the hasher it was written with.
    /// This tier writing `dir_id` (the data directory's identity) into the
    /// header of every value segment it makes, and refusing a segment
    /// whose header carries another (0: checks nothing; tests only).
    pub fn with_dir_id(mut self, dir_id: crate::layout::DirId) -> HybridTier<D> {
        self.inner.get_mut().log.set_dir_id(dir_id);
        self
    }

    pub fn with_table_hasher(mut self, hasher: TableHasher) -> HybridTier<D> {
        let st = self.inner.get_mut();
        assert!(
            st.index.is_empty() && !st.loading.layout_loaded,
            "the table hasher is chosen before the tier holds anything"
        );
        st.hasher = hasher;
        self
    }

    pub fn stats(&self) -> HybridStats {
        self.inner.borrow().stats()
    }

    /// The damaged value segments found when the shard opened (see
    /// `damage`), with the keys each cost.
    pub fn damage_at_start(&self) -> Vec<SegmentDamage> {
        self.inner.borrow().loading.damage.clone()
    }

    /// For `verify`, in place of [`Tier::load_checkpoint_done`] on a tier
    /// a checkpoint chain was loaded into (no WAL replay): the segments of
    /// its table that are missing, shorter than the table says, or hold
    /// the bad blocks a read of every block found (`files`: by sequence
    /// number, the file's length and its bad block ranges), with the keys
    /// of its index each costs.
    pub fn inspect_damage(
        &mut self,
        files: &std::collections::BTreeMap<u64, (u64, Vec<std::ops::Range<u64>>)>,
    ) -> Result<Vec<SegmentDamage>, String> {
        let st = self.inner.get_mut();
        if let Some(table) = st.loading.pending_segments.take() {
            st.load_segments(&table)?;
        }
        Ok(st.inspect_damage(files))
    }

    /// Forgets the records kept in RAM (the cache and the recent blocks),
    /// as if other reads had pushed them out, so tests with few keys
    /// reach the paths of records on the device.
    #[doc(hidden)]
    pub fn forget_cached(&mut self) {
        let st = self.inner.get_mut();
        st.cache = Cache::new(st.settings.cache_bytes);
        st.log.forget_recent();
    }

    /// Allows `max` settling reads open instead of [`SETTLES_MAX`], so
    /// tests reach the limit with few keys.
    #[doc(hidden)]
    pub fn set_settles_max(&mut self, max: usize) {
        self.inner.get_mut().settling.settles_max = max;
    }

    /// Bounds the unresolved entries at `max` instead of the size
    /// `index_keys` gives, so tests reach a full set with few keys.
    #[doc(hidden)]
    pub fn set_unresolved_max(&mut self, max: usize) {
        self.inner.get_mut().blind.unresolved_max = max;
    }
}

impl<D: Disk> Inner<D> {
    /// The index hash of `key` (recomputed from a record's key).
    fn key_hash(&self, key: &[u8]) -> KeyHash {
        KeyHash::new(self.hasher.hash_key(key))
    }

    /// Whether the record `r` at `addr`, reached through an entry of
    /// `partition`, is that entry's: its key falls in the partition and
    /// an entry of its own points at it.
    fn own_entry(&self, partition: usize, addr: u32, r: &Record) -> bool {
        let h = self.key_hash(&r.key);
        h.partition() == partition && self.index.find_addr(h, addr).is_some()
    }
    fn stats(&self) -> HybridStats {
        let segs = self.log.segs.iter().flatten();
        let (mut segments, mut bytes, mut records, mut live) = (0, 0, 0, 0);
        for s in segs {
            segments += 1;
            bytes += s.end;
            records += s.total_bytes;
            live += s.live_bytes.min(s.total_bytes);
        }
        let hot = self.device_use(log::HOT);
        let t = self.tiering.as_ref();
        HybridStats {
            keys: self
                .index
                .len()
                .saturating_sub(self.blind.unresolved.len() as u64),
            index_bytes: self.index.memory_bytes(),
            cache_bytes: self.cache.bytes(),
            cache_records: self.cache.len() as u64,
            cache_hits: self.cache.hits,
            cache_misses: self.cache.misses,
            segments,
            segment_bytes: bytes,
            record_bytes: records,
            live_bytes: live,
            device_reads: self.log.reads,
            device_bytes_read: self.log.bytes_read,
            device_bytes_written: self.log.bytes_written,
            gc_runs: self.gc.runs,
            gc_bytes_read: self.gc.bytes_read,
            gc_bytes_written: self.gc.bytes_written,
            read_errors: self.faults.read_error_count,
            spilled_keys: self.index.spilled(),
            unresolved_entries: self.blind.unresolved.len() as u64,
            deleted_keys: self.blind.deleted.len() as u64,
            settles_done: self.settling.settles_done,
            expiry_bytes: self.expiring.memory_bytes(),
            expiry_pairs: self.expiring.len() as u64,
            blind_sets_bytes: self.blind.memory_bytes(),
            hot_segments: hot.segments,
            hot_segment_bytes: hot.file_bytes,
            hot_live_bytes: hot.live_bytes,
            hot_reads: self.log.hot_reads,
            promotions: t.map_or(0, |t| t.promotions),
            promoted_bytes: t.map_or(0, |t| t.promoted_bytes),
            demotions: t.map_or(0, |t| t.demotions),
            demoted_bytes: t.map_or(0, |t| t.demoted_bytes),
            move_waits: t.map_or(0, |t| t.move_waits),
            damaged_segments_at_start: self.loading.damage.len() as u64,
            unreadable_keys_at_start: self.loading.damage.iter().map(|d| d.keys).sum(),
        }
    }
}

/// One device read a batch of cold GETs shares: blocks `first..end` of one
/// segment, for the GETs (indexes into the batch) whose next blocks lie in
/// it.
struct MergedRead {
    first: u64,
    end: u64,
    gets: Vec<usize>,
}

/// The reads a batch of cold GETs makes next: the blocks each needs, in
/// order; reads of the same segment whose blocks touch or overlap go as one
/// read, up to MERGE_BLOCKS blocks.
fn merge_reads<F>(keys: &[(Placed, Box<ColdKey<F>>)]) -> Vec<MergedRead> {
    // The blocks each GET needs next: (segment, first, end, GET).
    let mut wanted: Vec<(u64, u64, u64, usize)> = keys
        .iter()
        .enumerate()
        .filter_map(|(i, (_, ck))| match &ck.cands.front()?.state {
            CandState::Read {
                spot,
                src,
                blocks: None,
            } => Some((src.seq, spot.first, spot.first + spot.count, i)),
            _ => None,
        })
        .collect();
    wanted.sort_unstable();
    let mut merged: Vec<MergedRead> = Vec::new();
    let mut last_seq = None;
    for (seq, first, end, i) in wanted {
        match merged.last_mut() {
            Some(m)
                if last_seq == Some(seq)
                    && first <= m.end
                    && end.max(m.end) - m.first <= MERGE_BLOCKS =>
            {
                m.end = m.end.max(end);
                m.gets.push(i);
            }
            _ => merged.push(MergedRead {
                first,
                end,
                gets: vec![i],
            }),
        }
        last_seq = Some(seq);
    }
    merged
}

impl<D: Disk> Tier for HybridTier<D> {
    fn table_hasher(&self) -> TableHasher {
        self.inner.borrow().hasher
    }

    fn get(&self, hash: u64, key: &[u8]) -> Option<Bytes> {
        let mut st = self.inner.borrow_mut();
        st.note_get(hash);
        let r = st.find_for_read(hash, key)?;
        st.live(&r).then_some(r.value)
    }

    fn get_many_split(
        &self,
        hashes: &[u64],
        keys: &[Bytes],
        out: &mut Vec<Option<Bytes>>,
        read_left: &mut usize,
        cold: &mut Vec<ColdGet>,
    ) -> usize {
        assert_eq!(hashes.len(), keys.len());
        let mut st = self.inner.borrow_mut();
        let mut answered = 0;
        for (i, (&h, k)) in hashes.iter().zip(keys).enumerate() {
            if *read_left == 0 {
                break;
            }
            st.note_get(h);
            match st.lookup(h, k) {
                Lookup::Found(r) => {
                    let v = r.filter(|r| st.live(r)).map(|r| r.value);
                    *read_left = read_left.saturating_sub(v.as_ref().map_or(0, |v| v.len()));
                    out.push(v);
                }
                Lookup::Failed(e) => {
                    st.note_read_error(k, &e.to_string());
                    out.push(None);
                }
                Lookup::Cold(ck) => {
                    out.push(None);
                    cold.push(ColdGet {
                        index: i,
                        delete: false,
                        state: Box::new(ck),
                    });
                }
            }
            answered += 1;
        }
        answered
    }

    fn fetch_cold(&self, gets: Vec<ColdGet>) -> ColdFetch {
        let latency = self.inner.borrow().settings.read_latency_us.clone();
        Box::pin(async move {
            let mut keys: Vec<(Placed, Box<ColdKey<D::File>>)> = gets
                .into_iter()
                .map(|g| {
                    let ck = g
                        .state
                        .downcast::<ColdKey<D::File>>()
                        .expect("a cold GET of this tier");
                    ((g.index, g.delete), ck)
                })
                .collect();
            let merged = merge_reads(&keys);
            let reads = merged.iter().map(|m| {
                let file = match keys[m.gets[0]].1.cands.front().map(|c| &c.state) {
                    Some(CandState::Read { src, .. }) => std::rc::Rc::clone(&src.file),
                    _ => unreachable!("only reads were wanted"),
                };
                let (offset, len) = (m.first * BLOCK as u64, (m.end - m.first) as usize * BLOCK);
                async move {
                    let started = std::time::Instant::now();
                    let (res, buf) = file.read_at(AlignedBuf::with_capacity(len), offset).await;
                    (res, buf, started.elapsed())
                }
            });
            let done = futures::future::join_all(reads).await;
            for (m, (res, buf, took)) in merged.iter().zip(done) {
                latency.record(took.as_micros() as u64);
                let n = res.as_ref().map_or(0, |&n| n);
                if res.is_ok() {
                    let first = &mut keys[m.gets[0]].1;
                    first.reads += 1;
                    first.bytes += n as u64;
                    if let Some(CandState::Read { src, .. }) = first.cands.front().map(|c| &c.state) {
                        first.hot_reads += u64::from(src.device == log::HOT);
                    }
                }
                for &i in &m.gets {
                    let Some(CandState::Read { spot, src, blocks }) =
                        keys[i].1.cands.front_mut().map(|c| &mut c.state)
                    else {
                        unreachable!("only reads were wanted");
                    };
                    let lo = (spot.first - m.first) as usize * BLOCK;
                    let hi = lo + spot.count as usize * BLOCK;
                    let at = m.first * BLOCK as u64;
                    *blocks = Some(match &res {
                        Err(e) => Err(ReadError::Io {
                            file: src.path.clone(),
                            offset: at,
                            source: std::io::Error::new(e.kind(), e.to_string()),
                        }),
                        Ok(_) if n < hi => Err(ReadError::Corrupt {
                            file: src.path.clone(),
                            offset: at + n as u64,
                            reason: format!(
                                "the file ends {n} bytes into a {}-byte read",
                                buf.capacity()
                            ),
                        }),
                        Ok(_) => {
                            check_blocks(src.seq, spot.first, &src.path, &buf.as_slice()[lo..hi])
                        }
                    });
                }
            }
            keys.into_iter()
                .map(|((index, delete), ck)| ColdGet {
                    index,
                    delete,
                    state: ck as Box<dyn std::any::Any>,
                })
                .collect()
        })
    }

    fn finish_cold(
        &self,
        gets: Vec<ColdGet>,
        answers: &mut Vec<(usize, ColdAnswer)>,
        again: &mut Vec<ColdGet>,
    ) {
        let mut st = self.inner.borrow_mut();
        for g in gets {
            let ck = g
                .state
                .downcast::<ColdKey<D::File>>()
                .expect("a cold GET of this tier");
            let background = ck.background;
            match st.finish_one(ck) {
                Ok(answer) => {
                    if background {
                        st.settling.settles_done += 1;
                    }
                    answers.push((g.index, answer));
                }
                Err(ck) => again.push(ColdGet {
                    index: g.index,
                    delete: g.delete,
                    state: ck,
                }),
            }
        }
    }

    fn contains(&self, hash: u64, key: &[u8]) -> bool {
        let mut st = self.inner.borrow_mut();
        st.find_for_read(hash, key).is_some_and(|r| st.live(&r))
    }

    fn presence(&self, hash: u64, key: &[u8]) -> super::Presence {
        let mut st = self.inner.borrow_mut();
        match st.find_for_read(hash, key) {
            None => super::Presence::Absent,
            Some(r) if st.live(&r) => super::Presence::Live,
            Some(_) => super::Presence::Expired,
        }
    }

    fn contains_any(&self, hash: u64, key: &[u8]) -> bool {
        self.inner.borrow_mut().find_for_read(hash, key).is_some()
    }

    /// Tells from RAM when it can (a key deleted blind is absent; a
    /// candidate in RAM that matches answers); otherwise the answer is
    /// read like a cold GET's, after the delete was applied blind. With
    /// `deleted` or `unresolved` full that read counts among the settling
    /// reads ([`SETTLES_MAX`]); past those, the delete reads now, blocking.
    fn delete_lookup(&self, hash: u64, key: &[u8]) -> super::DeleteLookup {
        use super::DeleteLookup;
        let mut st = self.inner.borrow_mut();
        // Past the sets' bound the delete still goes blind while settling
        // reads have room: its answer's read settles what it leaves.
        let past_bound = !st.blind_room();
        let found = if !past_bound || st.settling.settles_open.get() < st.settling.settles_max {
            match st.lookup(hash, key) {
                Lookup::Found(r) => r,
                Lookup::Failed(e) => {
                    st.note_read_error(key, &e.to_string());
                    None
                }
                Lookup::Cold(mut ck) => {
                    ck.settle = true;
                    if past_bound {
                        ck.counted = Some(OpenSettle::new(&st.settling.settles_open));
                        st.settling.blind_allowed = Some(hash);
                    }
                    return DeleteLookup::Cold(ColdGet {
                        index: 0,
                        delete: true,
                        state: Box::new(ck),
                    });
                }
            }
        } else {
            st.find_for_read(hash, key)
        };
        match found {
            None => DeleteLookup::Absent,
            Some(r) if st.live(&r) => DeleteLookup::Live,
            Some(_) => DeleteLookup::Expired,
        }
    }

    /// Deletes write no record to the segments: `lsn` is not kept.
    fn delete_blind(&mut self, hash: u64, key: &[u8], _lsn: u64) {
        self.inner.get_mut().delete_blind(hash, key);
    }

    fn take_settles(&mut self, max: usize, out: &mut Vec<ColdGet>) {
        let st = self.inner.get_mut();
        let n = st.settling.settles.len().min(max);
        out.extend(st.settling.settles.drain(..n).map(|ck| ColdGet {
            index: 0,
            delete: false,
            state: Box::new(ck),
        }));
    }

    fn settles_waiting(&self) -> bool {
        !self.inner.borrow().settling.settles.is_empty()
    }

    fn write_room(&self) -> bool {
        let st = self.inner.borrow();
        st.settling.settles_open.get() < st.settling.settles_max || st.blind_room()
    }

    fn get_expiring(&self, hash: u64, key: &[u8]) -> Option<(Bytes, Option<u64>)> {
        let mut st = self.inner.borrow_mut();
        let r = st.find_for_read(hash, key)?;
        st.live(&r).then_some((r.value, r.expires_at_ms))
    }

    fn put_expiring(
        &mut self,
        hash: u64,
        key: &[u8],
        value: &[u8],
        expires_at_ms: Option<u64>,
        lsn: u64,
    ) -> bool {
        self.inner.get_mut().put(hash, key, value, expires_at_ms, lsn)
    }

    fn set_now_ms(&mut self, now_ms: u64) {
        self.inner.get_mut().now_ms = now_ms;
    }

    fn due_keys(&self, max: usize) -> Vec<Bytes> {
        let mut st = self.inner.borrow_mut();
        let now = st.now_ms;
        let due: Vec<(u64, u32)> = st
            .expiring
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(max * 2)
            .collect();
        let mut keys = Vec::new();
        for (at, addr) in due {
            if keys.len() >= max {
                break;
            }
            // An unresolved older version must not delete the key its
            // newer record holds; whether it is one may take a read of
            // the newer candidates.
            let checked = st.record_for_walk(addr, 1).and_then(|r| {
                let h = st.key_hash(&r.key);
                let listed = st.index.find_addr(h, addr).is_some() && r.expires_at_ms == Some(at);
                let current = listed && st.current(addr, &r)?;
                Ok((r, current))
            });
            match checked {
                Ok((r, true)) => keys.push(r.key),
                Ok((_, false)) => {
                    // Stale (from a fuzzy checkpoint): the key moved on.
                    st.expiring.remove(at, addr);
                }
                Err(e) => {
                    // Kept: the key may be due, and the records may read
                    // again (a later call tries them again).
                    let shard = st.settings.shard;
                    st.faults.warn(
                        shard,
                        "an expiring record could not be read; its key is expired once it can be",
                        &e,
                    );
                }
            }
        }
        keys
    }

    fn expiring_count(&self) -> u64 {
        self.inner.borrow().expiring.len() as u64
    }

    /// Deletes write no record to the segments: `lsn` is not kept.
    fn delete(&mut self, hash: u64, key: &[u8], _lsn: u64) -> bool {
        let st = self.inner.get_mut();
        match st.delete(hash, key) {
            Ok(existed) => existed,
            Err(e) => {
                st.faults.warn(
                    st.settings.shard,
                    "delete could not read a candidate record",
                    &e,
                );
                false
            }
        }
    }

    /// The index's entries less the unresolved ones (nearly all older
    /// versions; a key that only shares a tag with a key written blind is
    /// left out of the count until GC settles it).
    fn len(&self) -> u64 {
        let st = self.inner.borrow();
        st.index.len().saturating_sub(st.blind.unresolved.len() as u64)
    }

    /// The read cache counts at its bound, full or not: reads fill it with
    /// no check against a memory limit, so a write must not take its room.
    fn memory_bytes(&self) -> u64 {
        let st = self.inner.borrow();
        st.index.memory_bytes()
            + st.tiering.as_ref().map_or(0, |t| t.sketch.memory_bytes())
            + st.cache.budget()
            + st.expiring.memory_bytes()
            + st.blind.memory_bytes()
            // The write buffer of each device's open segment.
            + (1 << 20) * (1 + u64::from(st.log.has_hot()))
            + (log::RECENT_BLOCKS * log::BLOCK) as u64
    }

    /// The value goes to a segment on the device, not to RAM. A put may add
    /// an index entry (a blind write keeps the older ones unresolved until
    /// GC settles them), which costs RAM only once its partition's fixed
    /// slots are all taken (a spilled entry); an expiry time adds its
    /// pair to the expiry list. Overwrites count the same (whether the key is there
    /// may need a device read). A blind write leaves the entries it could
    /// not tell apart in the unresolved set, which may have to grow.
    fn put_growth_bytes(
        &self,
        hash: u64,
        _key: &[u8],
        _value_len: usize,
        expires_at_ms: Option<u64>,
    ) -> i64 {
        let st = self.inner.borrow();
        let h = KeyHash::new(hash);
        let spill = if st.index.insert_would_spill(h) {
            index::SPILL_KEY_BYTES
        } else {
            0
        };
        let expiry = expires_at_ms.map_or(0, |at| st.expiring.insert_growth_bytes(at));
        let unresolved = st
            .blind
            .unresolved_growth_bytes(st.index.candidate_count(h));
        (spill + expiry) as i64 + unresolved as i64
    }

    fn partition_count(&self) -> usize {
        PARTITIONS
    }

    fn visit_partition(&self, partition: usize, f: &mut EntryVisitor<'_>) {
        let mut st = self.inner.borrow_mut();
        let mut entries = st.index.entries(partition);
        entries.sort_unstable();
        entries.dedup_by_key(|e| e.0);
        for (addr, span) in entries {
            let record = st
                .record_for_walk(addr, span)
                .and_then(|r| Ok((st.current(addr, &r)?, r)));
            match record {
                // Listed only through its own entry: one that dangles (a
                // record of another partition, or one whose key no longer
                // points at it) is not the key's.
                Ok((true, r)) if !st.own_entry(partition, addr, &r) => {
                    tracing::warn!(partition, addr, "hybrid tier: an index entry dangles; a key walk leaves it out");
                }
                Ok((true, r)) if st.live(&r) => f(&r.key, &r.value, r.expires_at_ms),
                Ok(_) => {}
                Err(e) => {
                    st.faults.read_error_count += 1;
                    let shard = st.settings.shard;
                    st.faults.warn(
                        shard,
                        "a record could not be read during a key walk; its key is left out",
                        &e,
                    );
                }
            }
        }
    }

    fn take_read_errors(&mut self) -> Vec<(Bytes, String)> {
        std::mem::take(&mut self.inner.get_mut().faults.read_errors)
    }

    fn take_fault(&mut self) -> Option<String> {
        self.inner.get_mut().faults.fault.take()
    }

    fn background_tasks(&self) -> super::TierTasks {
        super::TierTasks {
            background: true,
            settles: true,
        }
    }

    fn checkpoint_wanted(&self) -> Option<bool> {
        self.inner.borrow().checkpoint_wanted()
    }

    fn background_step(&mut self) -> bool {
        let st = self.inner.get_mut();
        st.gc_step() || st.settle_step()
    }

    fn background_wait(&self) -> Option<std::time::Instant> {
        // A time gone by is no reason to look again at once: GC, if it
        // still waits, sets a new one at its next step.
        let until = self.inner.borrow().tiering.as_ref()?.gc_paused_until?;
        (until > std::time::Instant::now()).then_some(until)
    }

    fn checkpoint_begin(&mut self) {
        let st = self.inner.get_mut();
        st.epoch += 1;
        st.blind.checkpoint_unresolved = st.blind.unresolved.iter().copied().collect();
        st.blind.checkpoint_deleted = st.blind.deleted.iter().cloned().collect();
        st.checkpoint_expiring_moved = Some(Vec::new());
    }

    fn visit_checkpoint_partition(
        &mut self,
        partition: usize,
        delta: bool,
        f: &mut CheckpointVisitor<'_>,
    ) {
        let st = self.inner.get_mut();
        st.gc.checkpoint_full = !delta;
        if partition == 0 {
            let mut layout = Vec::new();
            layout.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
            layout.extend_from_slice(&(st.index.buckets_per_partition() as u64).to_le_bytes());
            layout.extend_from_slice(&st.settings.segment_bytes.to_le_bytes());
            layout.extend_from_slice(&st.epoch.to_le_bytes());
            f(KEY_LAYOUT, Some(&layout), None);
        }
        let chunks = if delta {
            st.index.encode_changed(partition, CHECKPOINT_BUCKETS)
        } else {
            st.index.encode_partition(partition, CHECKPOINT_BUCKETS)
        };
        for (first, bytes) in chunks {
            let mut key = KEY_INDEX.to_vec();
            key.extend_from_slice(&(partition as u32).to_le_bytes());
            key.extend_from_slice(&first.to_le_bytes());
            f(&key, Some(&bytes), None);
        }
    }

    fn checkpoint_finish(&mut self, f: &mut CheckpointVisitor<'_>) -> Result<(), String> {
        let st = self.inner.get_mut();
        st.check_orphans();
        if let Err(e) = st.log.flush() {
            st.note_fault("fdatasync", &e);
            return Err(format!("value segments could not be made durable: {e}"));
        }
        f(KEY_SEGMENTS, Some(&st.encode_segments()), None);
        // The list and the pairs moved away during the checkpoint, merged
        // in order a chunk at a time (no copy of the whole list).
        let mut moved = st.checkpoint_expiring_moved.take().unwrap_or_default();
        moved.sort_unstable();
        let mut pairs = merge_sorted(st.expiring.iter(), moved.into_iter()).peekable();
        let mut i = 0u32;
        while pairs.peek().is_some() {
            let mut key = KEY_EXPIRING.to_vec();
            key.extend_from_slice(&i.to_le_bytes());
            let mut v = Vec::with_capacity(EXPIRING_CHUNK * 12);
            for (at, addr) in pairs.by_ref().take(EXPIRING_CHUNK) {
                v.extend_from_slice(&at.to_le_bytes());
                v.extend_from_slice(&addr.to_le_bytes());
            }
            f(&key, Some(&v), None);
            i += 1;
        }
        // Which entries are unresolved is part of the index: without it a
        // read could take a key's older record for its current one.
        let unresolved = std::mem::take(&mut st.blind.checkpoint_unresolved);
        for (i, chunk) in unresolved.chunks(EXPIRING_CHUNK).enumerate() {
            let mut key = KEY_UNRESOLVED.to_vec();
            key.extend_from_slice(&(i as u32).to_le_bytes());
            let v: Vec<u8> = chunk.iter().flat_map(|a| a.to_le_bytes()).collect();
            f(&key, Some(&v), None);
        }
        // So are the keys deleted blind: without them their dead entries
        // would read as current.
        let deleted = std::mem::take(&mut st.blind.checkpoint_deleted);
        let mut chunk = Vec::new();
        let mut chunks = 0u32;
        for (i, k) in deleted.iter().enumerate() {
            chunk.extend_from_slice(&(k.len() as u32).to_le_bytes());
            chunk.extend_from_slice(k);
            if chunk.len() >= DELETED_CHUNK_BYTES || i + 1 == deleted.len() {
                let mut key = KEY_DELETED.to_vec();
                key.extend_from_slice(&chunks.to_le_bytes());
                f(&key, Some(&chunk), None);
                chunk.clear();
                chunks += 1;
            }
        }
        Ok(())
    }

    fn backup_files(&self) -> Vec<crate::tier::TierFile> {
        self.inner.borrow().log.backup_files()
    }

    /// A segment GC emptied goes once two checkpoints that started after
    /// its GC are published and no snapshot kept is older than its GC:
    /// the chains of the two newest snapshots are kept, and a recovery
    /// whose newer files are damaged may load any of them, so a delta
    /// chain whose full snapshot was copied before the GC can point into
    /// it until a newer full snapshot and one more replace that chain.
    fn checkpoint_published(&mut self) {
        let st = self.inner.get_mut();
        let epoch = st.epoch;
        st.gc.published.push((epoch, st.gc.checkpoint_full));
        let oldest_kept = oldest_kept_epoch(&mut st.gc.published);
        let mut gone = Vec::new();
        for (slot, seg) in st.log.segs.iter_mut().enumerate() {
            let Some(seg) = seg else { continue };
            if let SegState::Zombie { gc_epoch, confirms } = &mut seg.state {
                if *gc_epoch < epoch {
                    *confirms = confirms.saturating_add(1);
                    if *confirms >= 2 && oldest_kept.is_some_and(|e| e > *gc_epoch) {
                        gone.push(slot as u32);
                    }
                }
            }
        }
        let removed_any = !gone.is_empty();
        for slot in gone {
            // GC settled every unresolved entry in it; none may outlive it
            // and name a record of the segment that takes its slot.
            let log = &st.log;
            st.blind.unresolved.retain(|&a| log.decode_addr(a).slot != slot);
            if let Err(e) = st.log.remove(slot) {
                tracing::warn!(error = %e, "could not remove a value segment emptied by GC");
            }
        }
        // A hot device emptied (`hot_bytes = 0`): the folder no longer
        // needs it to start.
        if removed_any && st.log.has_hot() {
            if let Err(e) = st.log.unmark_hot_if_empty() {
                tracing::warn!(error = %e, "could not remove the hot-device marker");
            }
        }
    }

    /// A delta carries the segment table, the expiry list and the
    /// unresolved and deleted lists whole: those loaded before it go. Its
    /// index chunks are loaded over the index loaded so far. (The segment
    /// table is only kept until the chain is loaded: an older file's table
    /// may list segments removed since.)
    fn load_checkpoint_begin(&mut self, delta: bool) -> Result<(), String> {
        let st = self.inner.get_mut();
        if !delta {
            return Ok(());
        }
        if !st.loading.layout_loaded {
            return Err("a delta checkpoint with no full checkpoint before it".into());
        }
        st.expiring.clear();
        st.blind.unresolved.clear();
        st.blind.deleted.clear();
        st.blind.deleted_bytes = 0;
        Ok(())
    }

    fn load_checkpoint_done(&mut self) -> Result<(), String> {
        let st = self.inner.get_mut();
        let gone = match st.loading.pending_segments.take() {
            Some(table) => st.load_segments(&table)?,
            None => Vec::new(),
        };
        st.check_removed_segments(&gone)?;
        // A segment file that is gone is refused, not served as damage: a
        // folder or device that is not the one the data was written to
        // (a mount missing, a wrong value_device) looks just like it, and
        // a start would then write new segments beside nothing. Recovery
        // takes an older snapshot the WAL still covers if there is one.
        let missing = std::mem::take(&mut st.loading.missing);
        if !missing.is_empty() {
            return Err(st.missing_reason(&missing));
        }
        Ok(())
    }

    fn load_checkpoint_delete(&mut self, _key: &[u8]) -> Result<(), String> {
        Err("a deleted-key entry in a hybrid checkpoint (was this directory written by the memory tier?)".into())
    }

    fn load_checkpoint_entry(
        &mut self,
        key: &[u8],
        value: &[u8],
        _expires_at_ms: Option<u64>,
    ) -> Result<(), String> {
        let st = self.inner.get_mut();
        if key == KEY_LAYOUT {
            if value.len() != 28 {
                return Err("hybrid layout entry of the wrong size".into());
            }
            let version = u32::from_le_bytes(value[0..4].try_into().expect("4 bytes"));
            if !(1..=LAYOUT_VERSION).contains(&version) {
                return Err(format!("hybrid index layout version {version}"));
            }
            let buckets = u64::from_le_bytes(value[4..12].try_into().expect("8 bytes"));
            let seg_bytes = u64::from_le_bytes(value[12..20].try_into().expect("8 bytes"));
            if seg_bytes != st.settings.segment_bytes {
                return Err(format!(
                    "the checkpoint's value segments are {seg_bytes} bytes; storage.value_segment_size is {} (it cannot change on an existing data directory)",
                    st.settings.segment_bytes
                ));
            }
            if buckets == 0 || buckets > u32::MAX as u64 {
                return Err(format!("hybrid index of {buckets} buckets per partition"));
            }
            if buckets as usize != st.index.buckets_per_partition() {
                if st.loading.layout_loaded {
                    return Err(format!(
                        "a delta checkpoint of {buckets} buckets per partition over one of {}",
                        st.index.buckets_per_partition()
                    ));
                }
                // Loaded at the size it was written with; `recovery_done`
                // resizes it to `index_keys` (see `resize`).
                st.index = Index::with_buckets(buckets as usize);
            }
            st.loading.layout_loaded = true;
            return Ok(());
        }
        if let Some(rest) = key.strip_prefix(KEY_INDEX) {
            if rest.len() != 8 {
                return Err("index chunk key of the wrong size".into());
            }
            let part = u32::from_le_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
            let first = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
            return st.index.decode_chunk(part, first, value);
        }
        if key == KEY_SEGMENTS {
            if !value.len().is_multiple_of(SEGMENT_ROW_BYTES) {
                return Err(format!("segment table of {} bytes", value.len()));
            }
            st.loading.pending_segments = Some(value.to_vec());
            return Ok(());
        }
        if key.starts_with(KEY_UNRESOLVED) {
            if !value.len().is_multiple_of(4) {
                return Err("unresolved-entry chunk of the wrong size".into());
            }
            st.blind.unresolved.extend(
                value
                    .chunks_exact(4)
                    .map(|a| u32::from_le_bytes(a.try_into().expect("4 bytes"))),
            );
            return Ok(());
        }
        if key.starts_with(KEY_DELETED) {
            let mut rest = value;
            while !rest.is_empty() {
                let len = rest
                    .get(..4)
                    .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize);
                let Some(k) = len.and_then(|len| rest.get(4..4 + len)) else {
                    return Err("deleted-key chunk cut short".into());
                };
                if st.blind.deleted.insert(k.into()) {
                    st.blind.deleted_bytes += k.len() as u64;
                }
                rest = &rest[4 + k.len()..];
            }
            return Ok(());
        }
        if key.starts_with(KEY_EXPIRING) {
            if !value.len().is_multiple_of(12) {
                return Err("expiry chunk of the wrong size".into());
            }
            for e in value.chunks_exact(12) {
                let at = u64::from_le_bytes(e[0..8].try_into().expect("8 bytes"));
                let addr = u32::from_le_bytes(e[8..12].try_into().expect("4 bytes"));
                st.expiring.insert(at, addr);
            }
            return Ok(());
        }
        Err(format!(
            "entry {:?} is not part of a hybrid checkpoint (was this directory written by the memory tier?)",
            String::from_utf8_lossy(&key[..key.len().min(32)])
        ))
    }

    fn replay_begin(&mut self) {
        self.inner.get_mut().blind.replaying = true;
    }

    fn recovery_done(&mut self) {
        let st = self.inner.get_mut();
        st.blind.replaying = false;
        st.check_orphans();
        st.check_loaded_segments();
        st.resize_index();
        st.reopen_zombies_in_use();
        st.forget_hot_use();
        // A checkpoint lists the entries unresolved when it began; some of
        // them may be gone from the index copied after (GC settled them).
        // An address no entry holds must not stay listed: a record written
        // there later would be taken for an older version.
        if !st.blind.unresolved.is_empty() {
            let mut present = hashbrown::HashSet::new();
            let unresolved = &st.blind.unresolved;
            st.index.for_each_addr(|a| {
                if unresolved.contains(&a) {
                    present.insert(a);
                }
            });
            st.blind.unresolved = present;
        }
        // A key deleted blind whose dead entries are all gone need not
        // stay listed.
        st.prune_deleted();
    }

    fn stats(&self) -> super::TierStats {
        super::TierStats::Hybrid(HybridTier::stats(self))
    }
}

#[cfg(test)]
mod tests {
    use super::{BlindSets, ReadWarnings, READ_WARNINGS_PER_MINUTE};

    /// `unresolved_growth_bytes` bounds what the sets' RAM grows by, for
    /// one entry more and for several, through a few doublings and with
    /// removals in between (which leave tombstones in the table).
    #[test]
    fn unresolved_growth_bounds_the_set_growth() {
        let mut sets = BlindSets {
            unresolved: hashbrown::HashSet::new(),
            unresolved_max: usize::MAX,
            replaying: false,
            checkpoint_unresolved: Vec::new(),
            deleted: std::collections::HashSet::new(),
            deleted_bytes: 0,
            checkpoint_deleted: Vec::new(),
        };
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut grew = 0;
        for step in 0..20_000u32 {
            let more = 1 + (next() % 4) as usize;
            let bound = sets.unresolved_growth_bytes(more);
            let before = sets.memory_bytes();
            for _ in 0..more {
                sets.unresolved.insert(next() as u32 | 1);
            }
            let after = sets.memory_bytes();
            assert!(
                after <= before + bound,
                "step {step}: grew {} bytes, bound {bound}",
                after - before
            );
            grew += u32::from(after > before);
            // Take one out about every third step: the table keeps
            // tombstones.
            if next() % 3 == 0 {
                if let Some(&a) = sets.unresolved.iter().next() {
                    sets.unresolved.remove(&a);
                }
            }
        }
        assert!(grew >= 10, "the set grew only {grew} times");
    }

    /// A damaged segment fails every read of its keys: the log gets the
    /// first few of a minute and one line for the rest, not one per read.
    #[test]
    fn failed_read_warnings_are_bounded_per_minute() {
        let mut w = ReadWarnings::default();
        let logged = (0..13_334).filter(|_| w.allow(0)).count();
        assert_eq!(logged, READ_WARNINGS_PER_MINUTE as usize);
        assert_eq!(w.held_back, 13_334 - u64::from(READ_WARNINGS_PER_MINUTE));
        // A new minute: the count held back is said and a new one starts.
        w.window_start = Some(std::time::Instant::now() - std::time::Duration::from_secs(61));
        assert!(w.allow(0));
        assert_eq!((w.logged, w.held_back), (1, 0));
    }
}
