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
//!   after its GC, so the older checkpoint kept never points into it.
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
pub mod index;
pub mod log;
mod resize;

use self::cache::Cache;
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
use std::collections::{BTreeSet, VecDeque};
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
/// What one key with an expiry time costs in RAM beyond its slot.
const EXPIRING_KEY_BYTES: u64 = 40;
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
}

/// Counters of the hybrid tier (for STATS and `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HybridStats {
    pub keys: u64,
    pub index_bytes: u64,
    pub cache_bytes: u64,
    pub cache_records: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub segments: u64,
    pub segment_bytes: u64,
    /// Record bytes appended to the open segments (live or not).
    pub record_bytes: u64,
    pub live_bytes: u64,
    pub device_reads: u64,
    pub device_bytes_read: u64,
    pub device_bytes_written: u64,
    pub gc_runs: u64,
    pub gc_bytes_read: u64,
    pub gc_bytes_written: u64,
    pub read_errors: u64,
    pub spilled_keys: u64,
    /// Entries blind writes left unresolved.
    pub unresolved_entries: u64,
    /// Keys deleted without reading whose older entries are still in the
    /// index (unresolved, dead; GC settles them).
    pub deleted_keys: u64,
    /// Settling reads finished: reads of the older records of keys put
    /// while the unresolved set was full, made after the put.
    pub settles_done: u64,
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
    expiring: BTreeSet<(u64, u32)>,
    now_ms: u64,
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
    /// Checkpoints started (GC epochs).
    epoch: u64,
    /// Segment files not checked against the loaded checkpoint yet.
    orphans_checked: bool,
    gc_runs: u64,
    gc_bytes_read: u64,
    gc_bytes_written: u64,
    /// The segment GC is working through, and where it goes on.
    gc_victim: Option<(u32, u64)>,
    /// Entries a blind write left behind: the addresses of records that
    /// may hold an older version of a key written since (a write whose
    /// candidates were not in RAM did not read them). Reads try them last,
    /// newest first; GC, deletes and walks settle them.
    unresolved: std::collections::HashSet<u32>,
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
    /// While a checkpoint runs: the (expiry, address) pairs GC moved away
    /// from since it began. Its index partitions copied before a move
    /// point at the old address, and the expiry list is written at its
    /// finish, so it lists them too (recovery drops the pairs its index
    /// does not point at when they come due).
    checkpoint_expiring_moved: Option<Vec<(u64, u32)>>,
    /// Reads that settle the candidates of puts made past the unresolved
    /// set's bound, waiting for [`Tier::take_settles`].
    settles: Vec<ColdKey<D::File>>,
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
    /// A checkpoint's layout entry was loaded (recovery): the index has
    /// the size a delta loaded over it must have.
    layout_loaded: bool,
    /// The segment table of the checkpoint file loaded last, opened once
    /// the whole chain is loaded (`load_checkpoint_done`).
    pending_segments: Option<Vec<u8>>,
}

/// Bytes of one row of a checkpoint's segment table.
const SEGMENT_ROW_BYTES: usize = 4 + 8 * 4 + 2 + 8;

/// Blocks one GC step reads (256 KiB): the longest the shard pauses for GC
/// is about one read of this size plus rewriting its live records.
const GC_STEP_BLOCKS: u64 = 64;

/// Most blocks one merged GET read covers (256 KiB).
const MERGE_BLOCKS: u64 = 64;

/// Most unresolved entries per shard: an 32nd of the keys the index is
/// sized for (about 0.3 bytes of RAM per key at most), at least 4096.
fn unresolved_max(index_keys: u64) -> usize {
    (index_keys / 32).max(4096) as usize
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
    bytes: u64,
    /// The read answers a delete that was applied blind, or settles a
    /// put's candidates: the key's record it finds is dead (older than
    /// the delete or the put), and its entry goes.
    settle: bool,
    /// A settling read of a put; no one waits for its answer.
    background: bool,
    /// A settling read's answer, from the first record of the key it
    /// found; it goes on to the other candidates, whose records of the key
    /// are older and go too.
    answer: Option<Option<Bytes>>,
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
                expiring: BTreeSet::new(),
                now_ms: 0,
                read_errors: Vec::new(),
                read_error_count: 0,
                fault: None,
                unwritten: Default::default(),
                epoch: 0,
                orphans_checked: false,
                gc_runs: 0,
                gc_bytes_read: 0,
                gc_bytes_written: 0,
                gc_victim: None,
                unresolved: std::collections::HashSet::new(),
                unresolved_max: unresolved_max(settings_index_keys),
                checkpoint_unresolved: Vec::new(),
                deleted: std::collections::HashSet::new(),
                deleted_bytes: 0,
                checkpoint_deleted: Vec::new(),
                checkpoint_expiring_moved: None,
                settles: Vec::new(),
                settles_open: std::rc::Rc::new(std::cell::Cell::new(0)),
                blind_allowed: None,
                settles_max: SETTLES_MAX,
                settles_done: 0,
                layout_loaded: false,
                replaying: false,
                pending_segments: None,
            }),
        }
    }

    /// The tier hashing keys with `hasher` instead of the unkeyed
    /// [`TableHasher::LEGACY`] the constructors start with. Only for a
    /// fresh tier (before any entry or checkpoint is loaded); a checkpoint
    /// must be loaded with the hasher it was written with.
    pub fn with_table_hasher(mut self, hasher: TableHasher) -> HybridTier<D> {
        let st = self.inner.get_mut();
        assert!(
            st.index.is_empty() && !st.layout_loaded,
            "the table hasher is chosen before the tier holds anything"
        );
        st.hasher = hasher;
        self
    }

    pub fn stats(&self) -> HybridStats {
        self.inner.borrow().stats()
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
        self.inner.get_mut().settles_max = max;
    }

    /// Bounds the unresolved entries at `max` instead of the size
    /// `index_keys` gives, so tests reach a full set with few keys.
    #[doc(hidden)]
    pub fn set_unresolved_max(&mut self, max: usize) {
        self.inner.get_mut().unresolved_max = max;
    }
}

impl<D: Disk> Inner<D> {
    /// The index hash of `key` (recomputed from a record's key).
    fn key_hash(&self, key: &[u8]) -> KeyHash {
        KeyHash::new(self.hasher.hash_key(key))
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
        HybridStats {
            keys: self
                .index
                .len()
                .saturating_sub(self.unresolved.len() as u64),
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
            gc_runs: self.gc_runs,
            gc_bytes_read: self.gc_bytes_read,
            gc_bytes_written: self.gc_bytes_written,
            read_errors: self.read_error_count,
            spilled_keys: self.index.spilled(),
            unresolved_entries: self.unresolved.len() as u64,
            deleted_keys: self.deleted.len() as u64,
            settles_done: self.settles_done,
        }
    }

    /// The record at a candidate: cache first, then the log (RAM tail or
    /// device), which fills the cache.
    fn record(&mut self, c: &Candidate) -> Result<Record, ReadError> {
        if let Some(r) = self.cache.get(c.addr) {
            return Ok(r);
        }
        self.read_into_cache(c)
    }

    /// Reads the record at a candidate (RAM tail, recent blocks or a
    /// blocking device read) and caches it.
    fn read_into_cache(&mut self, c: &Candidate) -> Result<Record, ReadError> {
        let started = std::time::Instant::now();
        let reads = self.log.reads;
        let r = self.log.read(c.addr, c.span)?;
        if self.log.reads > reads {
            self.settings
                .read_latency_us
                .record(started.elapsed().as_micros() as u64);
        }
        self.cache.insert(c.addr, r.clone());
        Ok(r)
    }

    /// Where a candidate's record is: in RAM (the cache, the recent
    /// blocks, the unwritten tail: read now) or on the device (not read).
    fn where_is(&mut self, c: &Candidate) -> Where<D::File> {
        if let Some(r) = self.cache.get(c.addr) {
            return Where::Ram(Ok(r));
        }
        let spot = match self.log.locate(c.addr, c.span) {
            Ok(spot) => spot,
            Err(e) => return Where::Ram(Err(e)),
        };
        if !self.log.in_ram(spot.slot, spot.first, spot.count) {
            if let Some(src) = self.log.device_source(spot.slot, spot.first, spot.count) {
                return Where::Device(spot, src);
            }
        }
        // In RAM, or partly in the unwritten tail (a record written just
        // now that crosses the end of what is on the device): read it here.
        Where::Ram(self.read_into_cache(c))
    }

    /// The record at `addr` for a walk (key scan, expiry): from the cache
    /// if there, else read, without filling the cache or counting a miss.
    fn record_for_walk(&mut self, addr: u32, span: u8) -> Result<Record, ReadError> {
        match self.cache.peek(addr) {
            Some(r) => Ok(r.clone()),
            None => self.log.read(addr, span),
        }
    }

    /// How recent the record at `addr` is: (segment sequence, offset).
    /// Appends (writes and GC's copies) always go to the newest place.
    fn age(&self, addr: u32) -> (u64, u64) {
        let a = self.log.decode_addr(addr);
        (self.log.seq_of_slot(a.slot).unwrap_or(0), a.offset)
    }

    /// The entries whose tag matches `h`, in the order reads try them: the
    /// settled ones first (a key has at most one settled entry, so any
    /// order will do), then the unresolved ones, newest first (a key's
    /// newest record is the one that counts).
    fn ordered_candidates(&self, h: KeyHash) -> Vec<Candidate> {
        let mut cands = Vec::new();
        self.index.candidates(h, &mut cands);
        if !self.unresolved.is_empty() && cands.len() > 1 {
            cands.sort_by_key(|c| {
                if self.unresolved.contains(&c.addr) {
                    (1, std::cmp::Reverse(self.age(c.addr)))
                } else {
                    (0, std::cmp::Reverse((0, 0)))
                }
            });
        }
        cands
    }

    /// The entry and record of `key`. `Err` when no candidate matched and
    /// at least one could not be read (the key may be in it).
    fn find(&mut self, h: KeyHash, key: &[u8]) -> Result<Option<(Candidate, Record)>, ReadError> {
        self.check_written(key)?;
        if self.is_deleted(key) {
            return Ok(None);
        }
        self.find_entry(h, key)
    }

    /// `Err` if `key`'s newest put never reached the segments (its entries
    /// are older than what was acknowledged or logged).
    fn check_written(&self, key: &[u8]) -> Result<(), ReadError> {
        if !self.unwritten.is_empty() && self.unwritten.contains(key) {
            return Err(ReadError::Unwritten {
                dir: self.log.dir().to_path_buf(),
            });
        }
        Ok(())
    }

    /// `Err` if the record `r` read at entry `addr`, a candidate for `h`,
    /// cannot be that entry's record: its key's partition or tag differs.
    /// Such an entry dangles; it may have been the key's newest, so what
    /// comes after it must not be taken for the key's current record.
    fn check_dangling(&self, h: KeyHash, addr: u32, r: &Record) -> Result<(), ReadError> {
        if self.key_hash(&r.key).could_share_entry(h) {
            return Ok(());
        }
        let a = self.log.decode_addr(addr);
        Err(ReadError::Dangling {
            file: self.log.path_of_slot(a.slot),
            offset: a.offset,
        })
    }

    /// `find` without the shortcut for a key deleted blind: its newest
    /// entry (dead), for a put to replace. During a replay, a settled
    /// entry of such a key may also be there (an index partition copied
    /// after a put the replay has not reached yet); this finds it first.
    fn find_entry(
        &mut self,
        h: KeyHash,
        key: &[u8],
    ) -> Result<Option<(Candidate, Record)>, ReadError> {
        let mut failed = None;
        for c in self.ordered_candidates(h) {
            match self.record(&c) {
                Ok(r) if r.key == key => {
                    // An unresolved entry is the key's current record only
                    // if no entry tried before it is: one that could not
                    // be read may be.
                    return match failed {
                        Some(e) if self.unresolved.contains(&c.addr) => Err(e),
                        _ => Ok(Some((c, r))),
                    };
                }
                Ok(r) => {
                    if let Err(e) = self.check_dangling(h, c.addr, &r) {
                        failed = failed.or(Some(e));
                    }
                }
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    /// Every entry of `key` (its newest first: the one that counts), for a
    /// delete, which must leave none behind. `Err` if a candidate that may
    /// hold the key could not be read.
    fn find_all(&mut self, h: KeyHash, key: &[u8]) -> Result<Vec<(Candidate, Record)>, ReadError> {
        let mut found = Vec::new();
        if self.is_deleted(key) {
            // Every entry of it is dead already.
            return Ok(found);
        }
        let mut failed = None;
        for c in self.ordered_candidates(h) {
            match self.record(&c) {
                Ok(r) if r.key == key => found.push((c, r)),
                Ok(_) => {}
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(found),
        }
    }

    /// Whether `key` was deleted blind since its last put: then it has no
    /// settled entry, and every unresolved one is dead.
    fn is_deleted(&self, key: &[u8]) -> bool {
        !self.deleted.is_empty() && self.deleted.contains(key)
    }

    /// Whether the record at `addr` (of `key`, an unresolved entry) is an
    /// older version of its key: another entry of the key is newer, or the
    /// key was deleted since.
    fn superseded(&mut self, addr: u32, key: &[u8]) -> Result<bool, ReadError> {
        if self.is_deleted(key) {
            return Ok(true);
        }
        let h = self.key_hash(key);
        let age = self.age(addr);
        for c in self.ordered_candidates(h) {
            if c.addr == addr || self.age(c.addr) <= age {
                continue;
            }
            if self.record(&c)?.key == key {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// For a walk: whether a record the index points at is its key's
    /// current one (not an unresolved older version).
    fn current(&mut self, addr: u32, r: &Record) -> Result<bool, ReadError> {
        if !self.unresolved.contains(&addr) {
            return Ok(true);
        }
        Ok(!self.superseded(addr, &r.key)?)
    }

    /// `find` for a read: a failure is kept for `take_read_errors` and
    /// answers as absent.
    fn find_for_read(&mut self, hash: u64, key: &[u8]) -> Option<Record> {
        match self.find(KeyHash::new(hash), key) {
            Ok(found) => found.map(|(_, r)| r),
            Err(e) => {
                self.note_read_error(key, &e.to_string());
                None
            }
        }
    }

    /// A read of `key` failed: kept for `take_read_errors`.
    fn note_read_error(&mut self, key: &[u8], reason: &str) {
        self.read_error_count += 1;
        tracing::warn!(error = %reason, "hybrid tier: a key's record could not be read");
        self.read_errors
            .push((Bytes::copy_from_slice(key), reason.to_string()));
    }

    /// Looks `key` up for a GET without waiting for the device: candidates
    /// whose records are in RAM are compared now when their turn allows;
    /// the rest are left to read, in the order reads try them.
    fn lookup(&mut self, hash: u64, key: &[u8]) -> Lookup<D::File> {
        if let Err(e) = self.check_written(key) {
            return Lookup::Failed(e);
        }
        if self.is_deleted(key) {
            return Lookup::Found(None);
        }
        let mut queue = VecDeque::new();
        let mut failed: Option<ReadError> = None;
        for c in self.ordered_candidates(KeyHash::new(hash)) {
            // A settled entry that matches is the key's, whatever is still
            // to read; an unresolved one only if nothing before it is.
            let settled = !self.unresolved.contains(&c.addr);
            match self.where_is(&c) {
                Where::Ram(res) if settled || queue.is_empty() => match res {
                    Ok(r) if r.key == key => {
                        return match failed {
                            // An earlier candidate could not be read and
                            // may be the key's newer record.
                            Some(e) if !settled => Lookup::Failed(e),
                            _ => Lookup::Found(Some(r)),
                        };
                    }
                    Ok(r) => {
                        if let Err(e) = self.check_dangling(KeyHash::new(hash), c.addr, &r) {
                            failed.get_or_insert(e);
                        }
                    }
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                },
                Where::Ram(res) => queue.push_back(ColdCand {
                    addr: c.addr,
                    span: c.span,
                    unresolved: !settled,
                    state: CandState::Known(res),
                }),
                Where::Device(spot, src) => queue.push_back(ColdCand {
                    addr: c.addr,
                    span: c.span,
                    unresolved: !settled,
                    state: CandState::Read {
                        spot,
                        src,
                        blocks: None,
                    },
                }),
            }
        }
        if !queue.is_empty() {
            return Lookup::Cold(ColdKey {
                key: Bytes::copy_from_slice(key),
                hash,
                now_ms: self.now_ms,
                cands: queue,
                failed: failed.map(|e| e.to_string()),
                reads: 0,
                bytes: 0,
                settle: false,
                background: false,
                answer: None,
                counted: None,
            });
        }
        match failed {
            Some(e) => Lookup::Failed(e),
            None => Lookup::Found(None),
        }
    }

    /// Answers a cold GET whose next candidate was read, or hands it back
    /// for another read.
    fn finish_one(
        &mut self,
        mut ck: Box<ColdKey<D::File>>,
    ) -> Result<ColdAnswer, Box<ColdKey<D::File>>> {
        self.log.reads += std::mem::take(&mut ck.reads);
        self.log.bytes_read += std::mem::take(&mut ck.bytes);
        loop {
            match ck.cands.front() {
                None => break,
                // Its turn, and not read yet.
                Some(ColdCand {
                    state: CandState::Read { blocks: None, .. },
                    ..
                }) => return Err(ck),
                Some(_) => {}
            }
            let ColdCand {
                addr,
                span,
                unresolved,
                state,
            } = ck.cands.pop_front().expect("looked at");
            let (record, cacheable) = match state {
                CandState::Known(r) => (r, false),
                CandState::Read {
                    mut spot,
                    src,
                    blocks,
                } => {
                    let parsed = blocks.expect("read").and_then(|payloads| {
                        self.log
                            .remember_read(spot.slot, src.seq, spot.first, &payloads);
                        parse_record(&payloads, &spot, self.log.segment_bytes(), &src.path)
                    });
                    let same_segment = self.log.seq_of_slot(spot.slot) == Some(src.seq);
                    let record = match parsed {
                        Ok(Parsed::Record(r)) => Ok(r),
                        Ok(Parsed::NeedBlocks(count)) => {
                            if same_segment
                                && self
                                    .log
                                    .device_source(spot.slot, spot.first, count)
                                    .is_none()
                            {
                                // The rest is still in the unwritten tail.
                                self.log.read(addr, span)
                            } else {
                                // Read again, whole this time.
                                spot.count = count;
                                ck.cands.push_front(ColdCand {
                                    addr,
                                    span,
                                    unresolved,
                                    state: CandState::Read {
                                        spot,
                                        src,
                                        blocks: None,
                                    },
                                });
                                continue;
                            }
                        }
                        Err(e) => Err(e),
                    };
                    (record, same_segment)
                }
            };
            match record {
                Ok(r) if r.key == ck.key && ck.settle && ck.answer.is_some() => {
                    // An older record of the key: as dead as the first.
                    if cacheable {
                        self.settle_deleted(ck.hash, addr, !unresolved, &r);
                    }
                }
                Ok(r) if r.key == ck.key && unresolved && ck.failed.is_some() => {
                    // An earlier candidate could not be read and may be
                    // the key's newer record.
                    break;
                }
                Ok(r) if r.key == ck.key => {
                    if ck.settle {
                        // A blind delete's answer, or a put's settling
                        // read: the record is dead now, and so is every
                        // older one of the key among the candidates left
                        // (reading them all leaves the key no unresolved
                        // entry, so it leaves the deleted-key set).
                        if cacheable {
                            self.settle_deleted(ck.hash, addr, !unresolved, &r);
                        }
                        let live = r.expires_at_ms.is_none_or(|at| at > ck.now_ms);
                        ck.answer = Some(live.then_some(r.value));
                        continue;
                    } else if cacheable
                        && self.index.find_addr(KeyHash::new(ck.hash), addr).is_some()
                    {
                        // Cached only if the index still points at this
                        // record (a write since the lookup moved the key
                        // on, or GC removed the segment and its slot was
                        // reused).
                        self.cache.insert(addr, r.clone());
                    }
                    let live = r.expires_at_ms.is_none_or(|at| at > ck.now_ms);
                    return Ok(Ok(live.then_some(r.value)));
                }
                Ok(r) => {
                    if let Err(e) = self.check_dangling(KeyHash::new(ck.hash), addr, &r) {
                        tracing::warn!(error = %e, "hybrid tier: a candidate entry dangles");
                        ck.failed.get_or_insert(e.to_string());
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "hybrid tier: a candidate record could not be read");
                    ck.failed.get_or_insert(e.to_string());
                }
            }
        }
        if let Some(answer) = ck.answer.take() {
            return Ok(Ok(answer));
        }
        Ok(match ck.failed {
            Some(reason) => {
                self.read_error_count += 1;
                Err(reason)
            }
            None => Ok(None),
        })
    }

    fn live(&self, r: &Record) -> bool {
        r.expires_at_ms.is_none_or(|at| at > self.now_ms)
    }

    /// A record the index no longer points at. An unresolved one's bytes
    /// were counted as garbage when it became unresolved.
    fn forget(&mut self, addr: u32, r: &Record) {
        if !self.unresolved.remove(&addr) {
            if let Some(seg) = self.log.seg_of_mut(addr) {
                seg.live_bytes = seg.live_bytes.saturating_sub(r.size);
            }
        }
        self.cache.remove(addr);
        if let Some(at) = r.expires_at_ms {
            self.expiring.remove(&(at, addr));
        }
    }

    /// Removes the entry pointing at `addr` (found again: a spilled
    /// entry's place moves when another is removed).
    fn remove_entry(&mut self, h: KeyHash, addr: u32) {
        if let Some(loc) = self.index.find_addr(h, addr) {
            self.index.remove(loc);
        }
    }

    fn note_fault(&mut self, what: &str, e: &std::io::Error) {
        if self.fault.is_none() {
            self.fault = Some(format!(
                "value segment {what} in {} failed: {e}",
                self.log.dir().display()
            ));
        }
    }

    fn check_orphans(&mut self) {
        if !self.orphans_checked {
            self.orphans_checked = true;
            match self.log.remove_orphans() {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    shard = self.settings.shard,
                    removed = n,
                    "removed value segments written after the checkpoint recovery used (the WAL replay writes their records again)"
                ),
                Err(e) => self.note_fault("cleanup", &e),
            }
        }
    }

    /// A put. Candidates in RAM are compared; those on the device are not
    /// read (a blind write): the new entry is added beside them, and they
    /// become unresolved (reads try them after it; GC, deletes and walks
    /// settle them). Once `unresolved` is at its bound, the put also
    /// queues a settling read of them ([`Tier::take_settles`]), made after
    /// the put: the key's older record it finds goes, so the set stays
    /// near its bound. Only when [`SETTLES_MAX`] settling reads are open
    /// does a put read its candidates itself, blocking.
    /// Returns whether no entry of the key was found (after a blind write:
    /// none in RAM).
    fn put(&mut self, hash: u64, key: &[u8], value: &[u8], at: Option<u64>) -> bool {
        self.check_orphans();
        let h = KeyHash::new(hash);
        let mut mine: Vec<(Candidate, Record)> = Vec::new();
        let mut unknown: Vec<Candidate> = Vec::new();
        let mut settle: Vec<ColdCand<D::File>> = Vec::new();
        let full = !self.unresolved_room();
        if !full || self.settles_open.get() < self.settles_max {
            for c in self.ordered_candidates(h) {
                match self.where_is(&c) {
                    Where::Ram(Ok(r)) if r.key == key => mine.push((c, r)),
                    Where::Ram(Ok(_)) => {}
                    // Unreadable: it may be the key's; keep it, unresolved
                    // (reads find the new record first).
                    Where::Ram(Err(_)) => unknown.push(c),
                    Where::Device(spot, src) => {
                        unknown.push(c);
                        // Any record of the key among these is older than
                        // the one this put appends: whichever the read
                        // finds is dead.
                        if full {
                            settle.push(ColdCand {
                                addr: c.addr,
                                span: c.span,
                                // All of them are, once this put is applied.
                                unresolved: true,
                                state: CandState::Read {
                                    spot,
                                    src,
                                    blocks: None,
                                },
                            });
                        }
                    }
                }
            }
        } else {
            match self.find_entry(h, key) {
                Ok(found) => mine.extend(found),
                Err(e) => {
                    // The key may be in the unreadable record: keep that
                    // entry, but unresolved (with the others), so reads
                    // take the new record first even once it reads again.
                    tracing::warn!(error = %e, "hybrid tier: could not read a candidate record on write");
                    unknown = self.ordered_candidates(h);
                }
            }
        }
        let new = mine.is_empty();
        if self.fault.is_some() {
            self.unwritten.insert(key.into());
            return new;
        }
        let (addr, span) = match self.log.append(key, value, at) {
            Ok(a) => a,
            Err(e) => {
                self.note_fault("write", &e);
                self.unwritten.insert(key.into());
                return new;
            }
        };
        if !self.unwritten.is_empty() {
            self.unwritten.remove(key);
        }
        // Its entries left are dead; the new one is newer than all.
        let new = self.take_deleted(key) || new;
        if let Some(t) = at {
            self.expiring.insert((t, addr));
        }
        let size = log::record_size(key.len(), value.len(), at.is_some());
        let mut mine = mine.into_iter();
        match (unknown.is_empty(), mine.next()) {
            (true, Some((c, r))) => {
                self.forget(c.addr, &r);
                self.index.set(c.loc, addr, span);
            }
            (_, first) => {
                if let Some((c, r)) = first {
                    self.forget(c.addr, &r);
                    self.remove_entry(h, c.addr);
                }
                self.index.insert(h, addr, span);
            }
        }
        for (c, r) in mine {
            self.forget(c.addr, &r);
            self.remove_entry(h, c.addr);
        }
        for c in unknown {
            if self.unresolved.insert(c.addr) {
                // Most likely the key's older record: count it as garbage,
                // guessing its size from the new one (GC finds out).
                if let Some(seg) = self.log.seg_of_mut(c.addr) {
                    seg.live_bytes = seg.live_bytes.saturating_sub(size);
                }
            }
        }
        if !settle.is_empty() {
            let counted = Some(OpenSettle::new(&self.settles_open));
            self.settles.push(ColdKey {
                key: Bytes::copy_from_slice(key),
                hash,
                now_ms: self.now_ms,
                cands: settle.into(),
                failed: None,
                reads: 0,
                bytes: 0,
                settle: true,
                background: true,
                answer: None,
                counted,
            });
        }
        new
    }

    /// A delete: removes every entry of the key (the unresolved older ones
    /// too), reading the candidates that are not in RAM. Returns whether
    /// the key was there (expired or not), or why it could not be told.
    fn delete(&mut self, hash: u64, key: &[u8]) -> Result<bool, ReadError> {
        self.unwritten.remove(key);
        let h = KeyHash::new(hash);
        let found = match self.find_all(h, key) {
            Ok(found) => found,
            Err(e) => {
                // A candidate that may be the key's could not be read: the
                // key goes all the same, the way a blind delete takes it
                // (what cannot be read is left dead under `deleted`), past
                // the sets' bound if need be: only unreadable records bring
                // a delete here, and it must never be dropped.
                self.delete_unread(hash, key);
                return Err(e);
            }
        };
        let existed = !found.is_empty();
        for (c, r) in found {
            self.forget(c.addr, &r);
            self.remove_entry(h, c.addr);
        }
        Ok(existed)
    }

    /// A delete that does not read: entries of the key whose records are
    /// in RAM go; if any candidate's record is on the device (or cannot be
    /// read), the key goes into `deleted`, and the settled candidates
    /// among those become unresolved when the key's current record was not
    /// found in RAM (it may be one of them). Reads the candidates instead
    /// (a blocking delete) when `deleted` or `unresolved` is full and so
    /// are the settling reads (a blind delete is always right; the bound
    /// is on the RAM its sets take until reads settle them).
    fn delete_blind(&mut self, hash: u64, key: &[u8]) {
        if !self.unwritten.is_empty() {
            self.unwritten.remove(key);
        }
        if self.is_deleted(key) {
            return;
        }
        let allowed = self.blind_allowed.take() == Some(hash);
        if !self.blind_room() && !allowed {
            if let Err(e) = self.delete(hash, key) {
                tracing::warn!(error = %e, "hybrid tier: delete could not read a candidate record; its key is deleted blind");
            }
            return;
        }
        self.delete_unread(hash, key);
    }

    /// The work of a blind delete, whatever the sets' bound (see
    /// [`Inner::delete_blind`]).
    fn delete_unread(&mut self, hash: u64, key: &[u8]) {
        if self.is_deleted(key) {
            return;
        }
        let h = KeyHash::new(hash);
        let mut mine: Vec<(Candidate, Record)> = Vec::new();
        let mut current_in_ram = false;
        let mut settled_unknown = Vec::new();
        let mut unresolved_unknown = false;
        for c in self.ordered_candidates(h) {
            let settled = !self.unresolved.contains(&c.addr);
            match self.where_is(&c) {
                Where::Ram(Ok(r)) if r.key == key => {
                    current_in_ram |= settled;
                    mine.push((c, r));
                }
                Where::Ram(Ok(_)) => {}
                Where::Ram(Err(_)) | Where::Device(..) if settled => settled_unknown.push(c),
                Where::Ram(Err(_)) | Where::Device(..) => unresolved_unknown = true,
            }
        }
        for (c, r) in mine {
            self.forget(c.addr, &r);
            self.remove_entry(h, c.addr);
        }
        // With the current record found in RAM, the settled entries on the
        // device are other keys'; the unresolved ones may be older
        // versions of this one.
        let mark = if current_in_ram {
            unresolved_unknown
        } else {
            // Their bytes stay counted as live: most are other keys'
            // records; the answer's read settles this key's own.
            for c in &settled_unknown {
                self.unresolved.insert(c.addr);
            }
            unresolved_unknown || !settled_unknown.is_empty()
        };
        if mark {
            self.deleted_bytes += key.len() as u64;
            self.deleted.insert(key.into());
        }
    }

    /// Whether a delete may go without reading: room in both `unresolved`
    /// and `deleted` (a put needs room in `unresolved` only).
    fn blind_room(&self) -> bool {
        self.unresolved_room() && (self.replaying || self.deleted.len() < self.unresolved_max)
    }

    /// Whether a put may go without reading: room in `unresolved`. A WAL
    /// replay has room whatever the bound (it holds at most what the WAL
    /// since the checkpoint wrote): a replay that read every overwritten
    /// key's records took a minute at 100M keys.
    fn unresolved_room(&self) -> bool {
        self.replaying || self.unresolved.len() < self.unresolved_max
    }

    /// The answer of a blind delete read the key's record at `addr` (from
    /// before the delete, so dead now): its entry goes if it is still
    /// there. `counted`: its bytes still count as live (it was settled
    /// when the delete looked it up).
    fn settle_deleted(&mut self, hash: u64, addr: u32, counted: bool, r: &Record) {
        let h = KeyHash::new(hash);
        if !self.unresolved.contains(&addr) || self.index.find_addr(h, addr).is_none() {
            return;
        }
        if counted {
            if let Some(seg) = self.log.seg_of_mut(addr) {
                seg.live_bytes = seg.live_bytes.saturating_sub(r.size);
            }
        }
        self.drop_dead(h, addr, r);
    }

    /// Removes the unresolved entry at `addr`, whose record `r` is dead
    /// (superseded, or of a key deleted since), with everything that
    /// names it; its key leaves `deleted` if that was its last dead entry.
    fn drop_dead(&mut self, h: KeyHash, addr: u32, r: &Record) {
        self.unresolved.remove(&addr);
        self.remove_entry(h, addr);
        self.cache.remove(addr);
        if let Some(at) = r.expires_at_ms {
            self.expiring.remove(&(at, addr));
        }
        self.undelete_if_settled(h, &r.key);
    }

    /// Takes `key` out of `deleted` once no unresolved entry shares its
    /// tag (none of its dead entries is left).
    fn undelete_if_settled(&mut self, h: KeyHash, key: &[u8]) {
        if !self.is_deleted(key) {
            return;
        }
        let mut cands = Vec::new();
        self.index.candidates(h, &mut cands);
        if cands.iter().all(|c| !self.unresolved.contains(&c.addr)) {
            self.take_deleted(key);
        }
    }

    /// Takes out of `deleted` every key none of whose dead entries is left
    /// (GC settled them one by one, and the last one settled may have been
    /// another key's that shares the tag). One index lookup per key.
    fn prune_deleted(&mut self) {
        if self.deleted.is_empty() {
            return;
        }
        let keys: Vec<Box<[u8]>> = self.deleted.iter().cloned().collect();
        for k in keys {
            let h = self.key_hash(&k);
            self.undelete_if_settled(h, &k);
        }
    }

    /// Removes `key` from `deleted`; returns whether it was there.
    fn take_deleted(&mut self, key: &[u8]) -> bool {
        let was = !self.deleted.is_empty() && self.deleted.remove(key);
        if was {
            self.deleted_bytes -= key.len() as u64;
        }
        was
    }

    /// One GC step: picks a victim if none is in progress and garbage is
    /// over the bound, then rewrites the live records of the next
    /// [`GC_STEP_BLOCKS`] blocks of it. Returns whether it did anything.
    fn gc_step(&mut self) -> bool {
        if self.fault.is_some() {
            return false;
        }
        self.check_orphans();
        let (victim, from) = match self.gc_victim {
            Some(v) => v,
            None => match self.pick_victim() {
                Some(slot) => (slot, 0),
                None => return false,
            },
        };
        let read_before = self.log.bytes_read;
        let step = self.log.scan_from(victim, from, GC_STEP_BLOCKS);
        self.gc_bytes_read += self.log.bytes_read - read_before;
        let give_up = |st: &mut Self, e: &ReadError| {
            tracing::error!(error = %e, "hybrid tier GC could not read a segment or a record; the segment stays");
            // Do not pick it again and again.
            if let Some(seg) = st.log.segs[victim as usize].as_mut() {
                seg.total_bytes = seg.live_bytes;
            }
            st.gc_victim = None;
        };
        let (records, next) = match step {
            Ok(r) => r,
            Err(e) => {
                give_up(self, &e);
                return false;
            }
        };
        for (addr, r) in records {
            let h = self.key_hash(&r.key);
            if self.index.find_addr(h, addr).is_none() {
                continue;
            }
            if self.unresolved.contains(&addr) {
                match self.superseded(addr, &r.key) {
                    Ok(true) => {
                        // An older version: its entry goes (its bytes
                        // were counted as garbage already).
                        self.drop_dead(h, addr, &r);
                        continue;
                    }
                    // The key's current record after all (two keys shared
                    // a tag): copied below, settled.
                    Ok(false) => {
                        self.unresolved.remove(&addr);
                    }
                    Err(e) => {
                        give_up(self, &e);
                        return false;
                    }
                }
            }
            let Some(loc) = self.index.find_addr(h, addr) else {
                continue;
            };
            let (new, span) = match self.log.append(&r.key, &r.value, r.expires_at_ms) {
                Ok(a) => a,
                Err(e) => {
                    self.note_fault("write (GC)", &e);
                    return false;
                }
            };
            self.index.set(loc, new, span);
            self.gc_bytes_written += r.size;
            if let Some(seg) = self.log.segs[victim as usize].as_mut() {
                seg.live_bytes = seg.live_bytes.saturating_sub(r.size);
            }
            self.cache.rename(addr, new);
            if let Some(at) = r.expires_at_ms {
                self.expiring.remove(&(at, addr));
                self.expiring.insert((at, new));
                if let Some(moved) = self.checkpoint_expiring_moved.as_mut() {
                    moved.push((at, addr));
                }
            }
        }
        let end = self.log.segs[victim as usize].as_ref().map_or(0, |s| s.end);
        if next >= end {
            if let Some(seg) = self.log.segs[victim as usize].as_mut() {
                seg.live_bytes = 0;
                seg.state = SegState::Zombie {
                    gc_epoch: self.epoch,
                    confirms: 0,
                };
            }
            self.gc_victim = None;
            self.gc_runs += 1;
            self.prune_deleted();
        } else {
            self.gc_victim = Some((victim, next));
        }
        true
    }

    /// The sealed segment with the best cost-benefit score, if the garbage
    /// of the sealed segments is over `gc_garbage_percent`.
    fn pick_victim(&self) -> Option<u32> {
        let (mut total, mut live) = (0u64, 0u64);
        let mut best: Option<(f64, u32)> = None;
        let next_seq = self.log.next_seq;
        let active = self.log.active_slot();
        for (slot, seg) in self.log.segs.iter().enumerate() {
            let Some(seg) = seg else { continue };
            if seg.state != SegState::Sealed || Some(slot as u32) == active {
                continue;
            }
            total += seg.total_bytes;
            live += seg.live_bytes.min(seg.total_bytes);
            if seg.total_bytes == 0 {
                continue;
            }
            let u = seg.live_bytes.min(seg.total_bytes) as f64 / seg.total_bytes as f64;
            if u > 0.95 {
                continue;
            }
            let age = (next_seq - seg.seq) as f64;
            let score = (1.0 - u) * age / (1.0 + u);
            if best.is_none_or(|(s, _)| score > s) {
                best = Some((score, slot as u32));
            }
        }
        let (_, victim) = best?;
        ((total - live) * 100 > total * u64::from(self.settings.gc_garbage_percent))
            .then_some(victim)
    }

    fn encode_segments(&self) -> Vec<u8> {
        let mut v = Vec::new();
        for (slot, seg) in self.log.segs.iter().enumerate() {
            let Some(seg) = seg else { continue };
            let (state, gc_epoch, confirms) = match seg.state {
                SegState::Sealed => (0u8, 0, 0),
                SegState::Active => (1, 0, 0),
                SegState::Zombie { gc_epoch, confirms } => (2, gc_epoch, confirms),
            };
            v.extend_from_slice(&(slot as u32).to_le_bytes());
            v.extend_from_slice(&seg.seq.to_le_bytes());
            v.extend_from_slice(&seg.end.to_le_bytes());
            v.extend_from_slice(&seg.total_bytes.to_le_bytes());
            v.extend_from_slice(&seg.live_bytes.to_le_bytes());
            v.push(state);
            v.push(confirms);
            v.extend_from_slice(&gc_epoch.to_le_bytes());
        }
        v
    }

    /// After recovery: a segment GC had emptied when the checkpoint was
    /// taken is kept for the index partitions copied while its GC ran, and
    /// those, loaded now, may still point into it (GC moved the records
    /// after the copy; the WAL replay does not repeat GC). Such a segment
    /// is not empty after all: it becomes an ordinary sealed segment, all
    /// garbage as far as the counts know, so GC empties it again, moving
    /// what the index holds, before it may be removed. Left a zombie, it
    /// would be removed two checkpoints later and leave those entries
    /// pointing at nothing, or at whatever the next segment in its slot
    /// holds at that offset.
    fn reopen_zombies_in_use(&mut self) {
        let zombies: Vec<u32> = (0..self.log.segs.len() as u32)
            .filter(|&slot| {
                self.log.segs[slot as usize]
                    .as_ref()
                    .is_some_and(|s| matches!(s.state, SegState::Zombie { .. }))
            })
            .collect();
        if zombies.is_empty() {
            return;
        }
        let mut in_use = std::collections::BTreeSet::new();
        let log = &self.log;
        self.index.for_each_addr(|a| {
            let slot = log.decode_addr(a).slot;
            if zombies.contains(&slot) {
                in_use.insert(slot);
            }
        });
        for slot in in_use {
            if let Some(seg) = self.log.segs[slot as usize].as_mut() {
                tracing::info!(
                    shard = self.settings.shard,
                    segment = seg.seq,
                    "a value segment emptied by GC before the crash is still in use by the recovered index; GC empties it again"
                );
                seg.state = SegState::Sealed;
                seg.live_bytes = 0;
            }
        }
    }

    /// Opens the segments of a checkpoint's table. Returns the (slot,
    /// sequence) of the emptied segments it lists that are gone.
    fn load_segments(&mut self, bytes: &[u8]) -> Result<Vec<(u32, u64)>, String> {
        const ROW: usize = SEGMENT_ROW_BYTES;
        if bytes.len() % ROW != 0 {
            return Err(format!("segment table of {} bytes", bytes.len()));
        }
        let mut gone = Vec::new();
        for row in bytes.chunks_exact(ROW) {
            let u64_at = |i: usize| u64::from_le_bytes(row[i..i + 8].try_into().expect("8 bytes"));
            let slot = u32::from_le_bytes(row[0..4].try_into().expect("4 bytes"));
            let (seq, end, total, live) = (u64_at(4), u64_at(12), u64_at(20), u64_at(28));
            let state = match row[36] {
                // An active segment at checkpoint time is only read from
                // now on: new records go to a new segment.
                0 | 1 => SegState::Sealed,
                // Emptied by GC. It may be gone already: it is removed once
                // two checkpoints that started after its GC are published,
                // and the newest of those still lists it; neither points
                // into it (an older chain loaded as a fallback may: see
                // `check_removed_segments`). If it is still there, an index
                // copied while its GC ran may point into it: keep it.
                2 if !self.log.segment_exists(seq) => {
                    gone.push((slot, seq));
                    continue;
                }
                2 => SegState::Zombie {
                    gc_epoch: 0,
                    confirms: 0,
                },
                s => return Err(format!("segment state {s}")),
            };
            self.log
                .open_existing(slot, seq, end, total, state)
                .map_err(|e| e.to_string())?;
            if let Some(seg) = self.log.segs[slot as usize].as_mut() {
                seg.live_bytes = live;
            }
        }
        Ok(gone)
    }

    /// Refuses a loaded chain whose index points into a segment that GC
    /// emptied and that was removed since (`gone`, from
    /// [`Inner::load_segments`]). Only an older chain than the newest can
    /// (the segment goes once two checkpoints that started after its GC
    /// are published, and neither points into it), loaded because a newer
    /// one is damaged; its entries there would read as errors, or as
    /// whatever a segment that took the slot holds. Recovery then takes
    /// another snapshot, or stops.
    fn check_removed_segments(&self, gone: &[(u32, u64)]) -> Result<(), String> {
        if gone.is_empty() {
            return Ok(());
        }
        let mut hit = None;
        self.index.for_each_addr(|a| {
            let slot = self.log.decode_addr(a).slot;
            if hit.is_none() {
                hit = gone.iter().find(|g| g.0 == slot).copied();
            }
        });
        match hit {
            None => Ok(()),
            Some((_, seq)) => Err(format!(
                "its index points into value segment {}, which GC emptied and removed after this snapshot was taken",
                self.log.path_of(seq).display()
            )),
        }
    }
}

impl<D: Disk> Tier for HybridTier<D> {
    fn table_hasher(&self) -> TableHasher {
        self.inner.borrow().hasher
    }

    fn get(&self, hash: u64, key: &[u8]) -> Option<Bytes> {
        let mut st = self.inner.borrow_mut();
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
            // Reads of the same segment whose blocks touch or overlap go
            // as one read, up to MERGE_BLOCKS blocks.
            struct Merged {
                first: u64,
                end: u64,
                gets: Vec<usize>,
            }
            let mut merged: Vec<Merged> = Vec::new();
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
                    _ => merged.push(Merged {
                        first,
                        end,
                        gets: vec![i],
                    }),
                }
                last_seq = Some(seq);
            }
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
                        st.settles_done += 1;
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
        let found = if !past_bound || st.settles_open.get() < st.settles_max {
            match st.lookup(hash, key) {
                Lookup::Found(r) => r,
                Lookup::Failed(e) => {
                    st.note_read_error(key, &e.to_string());
                    None
                }
                Lookup::Cold(mut ck) => {
                    ck.settle = true;
                    if past_bound {
                        ck.counted = Some(OpenSettle::new(&st.settles_open));
                        st.blind_allowed = Some(hash);
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

    fn delete_blind(&mut self, hash: u64, key: &[u8]) {
        self.inner.get_mut().delete_blind(hash, key);
    }

    fn take_settles(&mut self, max: usize, out: &mut Vec<ColdGet>) {
        let st = self.inner.get_mut();
        let n = st.settles.len().min(max);
        out.extend(st.settles.drain(..n).map(|ck| ColdGet {
            index: 0,
            delete: false,
            state: Box::new(ck),
        }));
    }

    fn settles_waiting(&self) -> bool {
        !self.inner.borrow().settles.is_empty()
    }

    fn write_room(&self) -> bool {
        let st = self.inner.borrow();
        st.settles_open.get() < st.settles_max || st.blind_room()
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
    ) -> bool {
        self.inner.get_mut().put(hash, key, value, expires_at_ms)
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
            .copied()
            .collect();
        let mut keys = Vec::new();
        for (at, addr) in due {
            if keys.len() >= max {
                break;
            }
            match st.record_for_walk(addr, 1) {
                Ok(r) => {
                    let h = st.key_hash(&r.key);
                    // An unresolved older version must not delete the key
                    // its newer record holds.
                    let current = st.index.find_addr(h, addr).is_some()
                        && r.expires_at_ms == Some(at)
                        && st.current(addr, &r).unwrap_or(false);
                    if current {
                        keys.push(r.key);
                    } else {
                        // Stale (from a fuzzy checkpoint): the key moved on.
                        st.expiring.remove(&(at, addr));
                    }
                }
                Err(e) => {
                    // Kept: the key is due, and its record may read again
                    // (a later call tries it again).
                    tracing::warn!(error = %e, "hybrid tier: an expiring record could not be read; its key is expired once it can be");
                }
            }
        }
        keys
    }

    fn expiring_count(&self) -> u64 {
        self.inner.borrow().expiring.len() as u64
    }

    fn delete(&mut self, hash: u64, key: &[u8]) -> bool {
        match self.inner.get_mut().delete(hash, key) {
            Ok(existed) => existed,
            Err(e) => {
                tracing::warn!(error = %e, "hybrid tier: delete could not read a candidate record");
                false
            }
        }
    }

    /// The index's entries less the unresolved ones (nearly all older
    /// versions; a key that only shares a tag with a key written blind is
    /// left out of the count until GC settles it).
    fn len(&self) -> u64 {
        let st = self.inner.borrow();
        st.index.len().saturating_sub(st.unresolved.len() as u64)
    }

    fn memory_bytes(&self) -> u64 {
        let st = self.inner.borrow();
        st.index.memory_bytes()
            + st.cache.bytes()
            + st.expiring.len() as u64 * EXPIRING_KEY_BYTES
            + st.unresolved.capacity() as u64 * 5
            + st.deleted_bytes
            + st.deleted.capacity() as u64 * DELETED_KEY_BYTES
            + (1 << 20)
            + (log::RECENT_BLOCKS * log::BLOCK) as u64
    }

    fn partition_count(&self) -> usize {
        PARTITIONS
    }

    fn visit_partition(&self, partition: usize, f: &mut EntryVisitor<'_>) {
        let mut st = self.inner.borrow_mut();
        let mut entries = st.index.entries(partition);
        entries.sort_unstable();
        for (addr, span) in entries {
            let record = st
                .record_for_walk(addr, span)
                .and_then(|r| Ok((st.current(addr, &r)?, r)));
            match record {
                Ok((true, r)) if st.live(&r) => f(&r.key, &r.value, r.expires_at_ms),
                Ok(_) => {}
                Err(e) => {
                    st.read_error_count += 1;
                    tracing::warn!(error = %e, "hybrid tier: a record could not be read during a key walk; its key is left out");
                }
            }
        }
    }

    fn take_read_errors(&mut self) -> Vec<(Bytes, String)> {
        std::mem::take(&mut self.inner.get_mut().read_errors)
    }

    fn take_fault(&mut self) -> Option<String> {
        self.inner.get_mut().fault.take()
    }

    fn background_tasks(&self) -> super::TierTasks {
        super::TierTasks {
            background: true,
            settles: true,
        }
    }

    fn background_step(&mut self) -> bool {
        self.inner.get_mut().gc_step()
    }

    fn checkpoint_begin(&mut self) {
        let st = self.inner.get_mut();
        st.epoch += 1;
        st.checkpoint_unresolved = st.unresolved.iter().copied().collect();
        st.checkpoint_deleted = st.deleted.iter().cloned().collect();
        st.checkpoint_expiring_moved = Some(Vec::new());
    }

    fn visit_checkpoint_partition(
        &mut self,
        partition: usize,
        delta: bool,
        f: &mut CheckpointVisitor<'_>,
    ) {
        let st = self.inner.get_mut();
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
        let mut exp: Vec<(u64, u32)> = st.expiring.iter().copied().collect();
        let moved = st.checkpoint_expiring_moved.take().unwrap_or_default();
        if !moved.is_empty() {
            exp.extend(moved);
            exp.sort_unstable();
            exp.dedup();
        }
        for (i, chunk) in exp.chunks(EXPIRING_CHUNK).enumerate() {
            let mut key = KEY_EXPIRING.to_vec();
            key.extend_from_slice(&(i as u32).to_le_bytes());
            let mut v = Vec::with_capacity(chunk.len() * 12);
            for (at, addr) in chunk {
                v.extend_from_slice(&at.to_le_bytes());
                v.extend_from_slice(&addr.to_le_bytes());
            }
            f(&key, Some(&v), None);
        }
        // Which entries are unresolved is part of the index: without it a
        // read could take a key's older record for its current one.
        let unresolved = std::mem::take(&mut st.checkpoint_unresolved);
        for (i, chunk) in unresolved.chunks(EXPIRING_CHUNK).enumerate() {
            let mut key = KEY_UNRESOLVED.to_vec();
            key.extend_from_slice(&(i as u32).to_le_bytes());
            let v: Vec<u8> = chunk.iter().flat_map(|a| a.to_le_bytes()).collect();
            f(&key, Some(&v), None);
        }
        // So are the keys deleted blind: without them their dead entries
        // would read as current.
        let deleted = std::mem::take(&mut st.checkpoint_deleted);
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

    fn checkpoint_published(&mut self) {
        let st = self.inner.get_mut();
        let epoch = st.epoch;
        let mut gone = Vec::new();
        for (slot, seg) in st.log.segs.iter_mut().enumerate() {
            let Some(seg) = seg else { continue };
            if let SegState::Zombie { gc_epoch, confirms } = &mut seg.state {
                if *gc_epoch < epoch {
                    *confirms += 1;
                    if *confirms >= 2 {
                        gone.push(slot as u32);
                    }
                }
            }
        }
        for slot in gone {
            // GC settled every unresolved entry in it; none may outlive it
            // and name a record of the segment that takes its slot.
            let log = &st.log;
            st.unresolved.retain(|&a| log.decode_addr(a).slot != slot);
            if let Err(e) = st.log.remove(slot) {
                tracing::warn!(error = %e, "could not remove a value segment emptied by GC");
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
        if !st.layout_loaded {
            return Err("a delta checkpoint with no full checkpoint before it".into());
        }
        st.expiring.clear();
        st.unresolved.clear();
        st.deleted.clear();
        st.deleted_bytes = 0;
        Ok(())
    }

    fn load_checkpoint_done(&mut self) -> Result<(), String> {
        let st = self.inner.get_mut();
        let gone = match st.pending_segments.take() {
            Some(table) => st.load_segments(&table)?,
            None => Vec::new(),
        };
        st.check_removed_segments(&gone)
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
                if st.layout_loaded {
                    return Err(format!(
                        "a delta checkpoint of {buckets} buckets per partition over one of {}",
                        st.index.buckets_per_partition()
                    ));
                }
                // Loaded at the size it was written with; `recovery_done`
                // resizes it to `index_keys` (see `resize`).
                st.index = Index::with_buckets(buckets as usize);
            }
            st.layout_loaded = true;
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
            if value.len() % SEGMENT_ROW_BYTES != 0 {
                return Err(format!("segment table of {} bytes", value.len()));
            }
            st.pending_segments = Some(value.to_vec());
            return Ok(());
        }
        if key.starts_with(KEY_UNRESOLVED) {
            if value.len() % 4 != 0 {
                return Err("unresolved-entry chunk of the wrong size".into());
            }
            st.unresolved.extend(
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
                if st.deleted.insert(k.into()) {
                    st.deleted_bytes += k.len() as u64;
                }
                rest = &rest[4 + k.len()..];
            }
            return Ok(());
        }
        if key.starts_with(KEY_EXPIRING) {
            if value.len() % 12 != 0 {
                return Err("expiry chunk of the wrong size".into());
            }
            for e in value.chunks_exact(12) {
                let at = u64::from_le_bytes(e[0..8].try_into().expect("8 bytes"));
                let addr = u32::from_le_bytes(e[8..12].try_into().expect("4 bytes"));
                st.expiring.insert((at, addr));
            }
            return Ok(());
        }
        Err(format!(
            "entry {:?} is not part of a hybrid checkpoint (was this directory written by the memory tier?)",
            String::from_utf8_lossy(&key[..key.len().min(32)])
        ))
    }

    fn replay_begin(&mut self) {
        self.inner.get_mut().replaying = true;
    }

    fn recovery_done(&mut self) {
        let st = self.inner.get_mut();
        st.replaying = false;
        st.check_orphans();
        st.resize_index();
        st.reopen_zombies_in_use();
        // A checkpoint lists the entries unresolved when it began; some of
        // them may be gone from the index copied after (GC settled them).
        // An address no entry holds must not stay listed: a record written
        // there later would be taken for an older version.
        if !st.unresolved.is_empty() {
            let mut present = std::collections::HashSet::new();
            let unresolved = &st.unresolved;
            st.index.for_each_addr(|a| {
                if unresolved.contains(&a) {
                    present.insert(a);
                }
            });
            st.unresolved = present;
        }
        // A key deleted blind whose dead entries are all gone need not
        // stay listed.
        st.prune_deleted();
    }

    fn hybrid_stats(&self) -> Option<HybridStats> {
        Some(self.stats())
    }
}
