//! Storage tiers: where a shard keeps its keys and values. A tier is owned
//! by one shard thread and is never shared; it sees operations in LSN order
//! and holds exactly the state the WAL describes up to the last applied LSN.
//!
//! Two tiers implement [`Tier`]: [`MemoryTier`] (every value in RAM) and
//! [`HybridTier`] (a compact index in RAM, values in segment files on a
//! device, hot ones cached). `docs/storage.md` compares them. What the
//! trait gives a tier that keeps values on a device:
//! - **GETs in two steps.** [`Tier::get_many_split`] looks a run of keys up
//!   and answers from RAM; the keys that need a device read come back as
//!   [`ColdGet`]s, and [`Tier::read_cold`] answers them all with one future
//!   (it holds no borrow of the tier, so the shard serves other requests
//!   while it waits, and runs every read a key takes inside). A memory tier
//!   answers everything in the first step.
//! - **Deletes that do not read.** [`Tier::delete_lookup`] tells a delete
//!   whether its key is there before it is logged, from RAM when it can;
//!   when that needs a device read it hands back a [`ColdGet`] whose
//!   answer is read like a GET's, and [`Tier::delete_blind`] removes the
//!   key at once without reading.
//! - **Room to write.** A tier that holds writes back ([`Tier::write_room`])
//!   says when there is room again through the [`TierRoom`] its shard gives
//!   it, not through the WAL's signals.
//! - **Writes that append.** The WAL record stays the commit point; a tier
//!   may write values to its own files in the background and makes them
//!   durable in [`Tier::checkpoint_finish`], before the checkpoint that
//!   lets the WAL behind it go is published.
//! - **Checkpoints and walks by partition.** Entries are split into
//!   [`Tier::partition_count`] partitions by hash bits the shard router does
//!   not use; a checkpoint copies one partition at a time, so the shard
//!   never stops for a whole-dataset copy.
//! - **Faults and read errors** reach the shard through
//!   [`Tier::take_fault`] (poison), in the answers of [`Tier::read_cold`],
//!   and, for reads made on the shard thread (RAM lookups, updates,
//!   deletes), through [`Tier::take_read_errors`] (an error answer for that
//!   key).
//! - **Memory accounting** ([`Tier::memory_bytes`]) so metrics and limits see
//!   what the process really uses.

pub(crate) mod config;
pub mod hybrid;
pub mod memory;

pub use hybrid::{HotSettings, HybridSettings, HybridStats, HybridTier, SegmentDamage};
pub use memory::MemoryTier;

use crate::io::Disk;
use bytes::Bytes;
use std::future::Future;
use std::pin::Pin;

/// What a checkpoint copy calls for each entry: `(key, value, expiry time
/// in Unix ms)`; a `None` value (delta checkpoints only) says that the key
/// was deleted since the checkpoint the delta builds on.
pub type CheckpointVisitor<'a> = dyn FnMut(&[u8], Option<&[u8]>, Option<u64>) + 'a;

/// What [`Tier::visit_partition`] calls for each entry: `(key, value,
/// expiry time in Unix ms)`.
pub type EntryVisitor<'a> = dyn FnMut(&[u8], &[u8], Option<u64>) + 'a;

/// A GET whose answer needs a device read: made by
/// [`Tier::get_many_split`] (and [`Tier::delete_lookup`],
/// [`Tier::take_settles`]), answered by [`Tier::read_cold`] of the tier
/// that made it. What the read is stays with that tier: the `ColdGet`
/// holds a ticket for it, and a ticket dropped unread lets the tier
/// forget the read.
pub struct ColdGet {
    /// Where the answer goes: an index into the caller's answers (the
    /// tier sets it to the key's place in its run; the caller may move it).
    pub index: usize,
    /// The read answers a DELETE (whether its key was there, live), not a
    /// GET; the delete itself was applied already.
    pub delete: bool,
    pub ticket: ColdTicket,
}

/// A tier's claim on one of the reads it holds for a [`ColdGet`]: the
/// read's number in the tier's set of reads not made yet. Dropping it
/// unread tells the set to forget the read (a delete looked up again
/// after its WAL record did not fit drops its first lookup's).
pub struct ColdTicket {
    id: u64,
    set: Option<std::rc::Rc<dyn ColdReads>>,
}

/// A tier's set of the reads its [`ColdTicket`]s name.
pub trait ColdReads {
    /// The ticket of read `id` was dropped unread.
    fn forget(&self, id: u64);
}

impl ColdTicket {
    /// A ticket for read `id` of `set`.
    pub fn new(id: u64, set: std::rc::Rc<dyn ColdReads>) -> ColdTicket {
        ColdTicket { id, set: Some(set) }
    }

    /// The read's number, for the set that made the ticket: the read is
    /// now the set's to make, and dropping the ticket no longer forgets
    /// it. Panics when `set` did not make it (a [`ColdGet`] handed to
    /// another tier is a bug of the caller).
    pub fn redeem(mut self, set: &std::rc::Rc<dyn ColdReads>) -> u64 {
        let made_by = self.set.take().expect("a ticket is redeemed once");
        assert!(
            std::ptr::addr_eq(std::rc::Rc::as_ptr(&made_by), std::rc::Rc::as_ptr(set)),
            "a cold read is answered by the tier that made it"
        );
        self.id
    }
}

impl Drop for ColdTicket {
    fn drop(&mut self) {
        if let Some(set) = self.set.take() {
            set.forget(self.id);
        }
    }
}

/// The answers of the cold reads [`Tier::read_cold`] was given: `(index,
/// answer)` for each, in any order.
pub type ColdRead = Pin<Box<dyn Future<Output = Vec<(usize, ColdAnswer)>>>>;

/// The answer to a [`ColdGet`]: the value (`None`: absent or expired), or
/// why its record could not be read (naming file and offset).
pub type ColdAnswer = Result<Option<Bytes>, String>;

/// How a tier tells its shard that writes it held back
/// ([`Tier::write_room`]) may go on: the shard's own signal, which the
/// tier raises when reads it counted against its bound finish.
#[derive(Clone, Default)]
pub struct TierRoom(std::rc::Rc<crate::notify::Notify>);

impl TierRoom {
    pub fn new() -> TierRoom {
        TierRoom::default()
    }

    /// There may be room again: wakes whoever waits in [`TierRoom::freed`].
    pub fn notify(&self) {
        self.0.notify();
    }

    /// Resolves after the next [`TierRoom::notify`] (one made after this
    /// call; take it before checking for room).
    pub(crate) fn freed(&self) -> crate::notify::Notified<'_> {
        self.0.notified()
    }
}

/// What [`Tier::presence`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    Absent,
    Live,
    /// An entry whose expiry time has passed (not deleted yet).
    Expired,
}

/// What [`Tier::delete_lookup`] found.
pub enum DeleteLookup {
    Absent,
    Live,
    /// An entry whose expiry time has passed (not deleted yet).
    Expired,
    /// Only a device read can tell; the answer comes from the read.
    Cold(ColdGet),
}

/// A tier's own counters, published by its shard a few times a second.
/// Adding a tier adds a variant. (The hybrid counters make it large; it
/// is copied a few times a second, which a box would turn into as many
/// allocations.)
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
#[allow(clippy::large_enum_variant)]
pub enum TierStats {
    /// The memory tier keeps no counters beyond the shard's.
    #[default]
    Memory,
    Hybrid(HybridStats),
}

impl TierStats {
    /// The hybrid tier's counters, when this is the hybrid tier.
    pub fn hybrid(&self) -> Option<HybridStats> {
        match self {
            TierStats::Hybrid(h) => Some(*h),
            TierStats::Memory => None,
        }
    }
}

/// Whether a tier value only grows while the shard runs (a count) or goes
/// up and down (a gauge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterKind {
    Counter,
    Gauge,
}

impl CounterKind {
    /// The kind as the STATS table writes it (`count` or `gauge`).
    pub fn stat_kind(self) -> &'static str {
        match self {
            CounterKind::Counter => "count",
            CounterKind::Gauge => "gauge",
        }
    }
}

/// How a tier value shows in STATS: as `tier.NAME`, with its unit and
/// meaning (`docs/protocol.md` lists them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatName {
    pub name: &'static str,
    pub unit: &'static str,
    pub meaning: &'static str,
}

/// How a tier value shows on `/metrics`: one sample per shard, labelled
/// with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricName {
    pub name: &'static str,
    pub help: &'static str,
}

/// One of a tier's values, named, so that STATS, `/metrics` and loadgen
/// show a tier's counters without naming each one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierCounter {
    /// The tier's own name for it (its field), unique in the tier's list.
    pub name: &'static str,
    pub kind: CounterKind,
    pub value: u64,
    /// Its STATS name, if STATS shows it.
    pub stat: Option<StatName>,
    /// Its metric, if `/metrics` shows it.
    pub metric: Option<MetricName>,
}

/// What a checkpoint taken now would write ([`Tier::checkpoint_estimate`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointEstimate {
    /// Payload bytes of a full copy: about the live data.
    pub full_bytes: u64,
    /// Payload bytes of a delta over the last copy.
    pub delta_bytes: u64,
}

/// The background tasks a tier needs its shard to run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierTasks {
    /// Steps of [`Tier::background_step`] (GC) whenever the tier has work.
    pub background: bool,
    /// Settling reads ([`Tier::take_settles`]) whenever the tier queues them.
    pub settles: bool,
}

/// How a shard builds its tier: recovery makes one from this for every
/// snapshot it tries, and a fresh shard makes one. Adding a tier adds a
/// variant here and its folder beside `memory.rs` and `hybrid/`.
pub enum TierConfig<D: Disk> {
    /// Keys and values in RAM.
    Memory,
    /// An index in RAM, values in segments on `disk`.
    Hybrid {
        disk: D,
        /// The hot device's disk, when `settings.hot` is set.
        hot_disk: Option<D>,
        settings: HybridSettings,
        /// The data directory's identity: in the header of every value
        /// segment made, checked in every one opened.
        dir_id: crate::layout::DirId,
    },
}

impl<D: Disk> TierConfig<D> {
    /// Makes what the tier needs on disk before any is built (the hybrid
    /// tier's segment folder).
    pub fn prepare(&self) -> std::io::Result<()> {
        match self {
            TierConfig::Memory => Ok(()),
            TierConfig::Hybrid {
                disk,
                hot_disk,
                settings,
                ..
            } => {
                disk.create_dir_all(&settings.dir)?;
                match (hot_disk, &settings.hot) {
                    (Some(hot), Some(h)) => hot.create_dir_all(&h.dir),
                    _ => Ok(()),
                }
            }
        }
    }

    /// A new, empty tier hashing keys with `hasher` (the data directory's
    /// table hasher); `entries` sizes its tables up front when known.
    pub fn build(&self, entries: Option<u64>, hasher: crate::hash::TableHasher) -> Box<dyn Tier> {
        match self {
            TierConfig::Memory => Box::new(match entries {
                Some(n) => MemoryTier::with_capacity_and_hasher(n, hasher),
                None => MemoryTier::with_hasher(hasher),
            }),
            TierConfig::Hybrid {
                disk,
                hot_disk,
                settings,
                dir_id,
            } => {
                let mut settings = settings.clone();
                if hot_disk.is_none() {
                    settings.hot = None;
                }
                let tier = HybridTier::in_existing_dir(disk.clone(), settings)
                    .with_table_hasher(hasher)
                    .with_dir_id(*dir_id);
                Box::new(match hot_disk {
                    // Its folder was made by `prepare`.
                    Some(hot) => tier.with_hot_device(hot.clone()),
                    None => tier,
                })
            }
        }
    }
}

/// One file of a tier's own, as an online backup sees it.
#[derive(Debug, Clone)]
pub struct TierFile {
    pub path: std::path::PathBuf,
    /// The bytes from the start of the file that are written (a file never
    /// changes below this).
    pub bytes: u64,
    /// Nothing is ever written to the file again (it may be hard-linked).
    pub sealed: bool,
}

/// The interface a shard uses to keep its key-value state.
///
/// `hash` is always the table hash of `key` under the tier's own hasher
/// (`self.table_hasher().hash_key(key)`, [`crate::hash::TableHasher`]);
/// the shard computes it once per operation and passes it down.
pub trait Tier {
    /// How this tier hashes keys: what every `hash` argument must be made
    /// with. Fixed for the life of the tier.
    fn table_hasher(&self) -> crate::hash::TableHasher;
    /// The value of `key`, copied out.
    fn get(&self, hash: u64, key: &[u8]) -> Option<Bytes>;
    /// The values of many keys at once: appends one answer per key to
    /// `out`, in the order of `keys`. `hashes[i]` is the table hash of
    /// `keys[i]`. The answers are exactly those of [`Tier::get`] for each
    /// key in turn (a batch has no writes in between). A tier may overlap
    /// the memory accesses of different keys (the memory tier looks every
    /// key up before copying any value) and may pack
    /// several values into one shared buffer: a returned `Bytes` can keep
    /// that buffer alive (bounded per tier; see its docs) until it drops.
    fn get_many(&self, hashes: &[u64], keys: &[Bytes], out: &mut Vec<Option<Bytes>>) {
        assert_eq!(hashes.len(), keys.len());
        out.extend(hashes.iter().zip(keys).map(|(&h, k)| self.get(h, k)));
    }
    /// [`Tier::get_many`] within a read budget: answers keys in order
    /// while `read_left` is above zero (each value found takes its length
    /// off it; the value that uses it up is still answered) and returns how
    /// many keys it answered; the values of the others are not copied. So a
    /// batch of GETs copies at most the budget plus one value.
    fn get_many_within(
        &self,
        hashes: &[u64],
        keys: &[Bytes],
        out: &mut Vec<Option<Bytes>>,
        read_left: &mut usize,
    ) -> usize {
        assert_eq!(hashes.len(), keys.len());
        let mut answered = 0;
        for (&h, k) in hashes.iter().zip(keys) {
            if *read_left == 0 {
                break;
            }
            let v = self.get(h, k);
            *read_left = read_left.saturating_sub(v.as_ref().map_or(0, |v| v.len()));
            out.push(v);
            answered += 1;
        }
        answered
    }
    /// [`Tier::get_many_within`] split in two: answers from RAM what it
    /// can now (pushing an answer, or a placeholder `None`, for every key
    /// it answers) and, for keys whose record must be read from a device,
    /// appends a [`ColdGet`] to `cold` instead of reading. Their values do
    /// not count against `read_left` (their sizes are not known yet). The
    /// answer each cold key gets later is the one it had when this was
    /// called: records are never changed in place, so writes applied
    /// meanwhile do not affect it. Tiers that hold every value in RAM never
    /// add to `cold`.
    fn get_many_split(
        &self,
        hashes: &[u64],
        keys: &[Bytes],
        out: &mut Vec<Option<Bytes>>,
        read_left: &mut usize,
        cold: &mut Vec<ColdGet>,
    ) -> usize {
        let _ = cold;
        self.get_many_within(hashes, keys, out, read_left)
    }
    /// Answers `gets` (made by this tier): reads every record they need,
    /// all at once (reads of adjacent blocks merged), again for those whose
    /// first record was another key's or longer than was read, until each
    /// has its answer. The future holds no borrow of the tier between
    /// reads: the shard serves other requests while it waits, and writes
    /// applied meanwhile do not change the answers (records are never
    /// changed in place). A read that fails answers an error for its key.
    /// Reads counted against [`Tier::write_room`] signal the tier's
    /// [`TierRoom`] when done.
    fn read_cold(&self, gets: Vec<ColdGet>) -> ColdRead {
        debug_assert!(gets.is_empty(), "this tier makes no cold reads");
        Box::pin(std::future::ready(
            gets.into_iter().map(|g| (g.index, Ok(None))).collect(),
        ))
    }
    /// The signal the tier raises when writes it held back
    /// ([`Tier::write_room`]) may go on; the shard sets it once, before
    /// the first write. A tier that never holds writes back ignores it.
    fn set_room_signal(&mut self, room: TierRoom) {
        let _ = room;
    }
    /// Whether `key` has an entry, and whether it has expired, in one
    /// lookup (what a delete needs to know before it is logged).
    fn presence(&self, hash: u64, key: &[u8]) -> Presence {
        if self.contains(hash, key) {
            Presence::Live
        } else if self.contains_any(hash, key) {
            Presence::Expired
        } else {
            Presence::Absent
        }
    }
    /// What a delete of `key` needs to know before it is logged: whether
    /// the key is there (live or expired), or, when only a device read can
    /// tell, a [`ColdGet`] (with `delete` set) whose answer says whether
    /// it was live when this was called. In that case the caller logs the
    /// delete and applies it with [`Tier::delete_blind`] right away, and
    /// answers once the read is done. Read errors go to
    /// [`Tier::take_read_errors`].
    fn delete_lookup(&self, hash: u64, key: &[u8]) -> DeleteLookup {
        match self.presence(hash, key) {
            Presence::Absent => DeleteLookup::Absent,
            Presence::Live => DeleteLookup::Live,
            Presence::Expired => DeleteLookup::Expired,
        }
    }
    /// Removes `key` (logged already) without answering whether it was
    /// there; a tier that keeps values on a device does it without a
    /// device read when it can. The default is [`Tier::delete`]. `lsn`:
    /// the WAL record of the delete, as for [`Tier::put_expiring`].
    fn delete_blind(&mut self, hash: u64, key: &[u8], lsn: u64) {
        self.delete(hash, key, lsn);
    }
    /// Moves up to `max` of the reads the tier wants made after writes it
    /// applied without them to `out` (the hybrid tier: the older records
    /// of keys put while its unresolved set was full). The caller reads
    /// them with [`Tier::read_cold`] whenever it likes (no write waits for
    /// them) and drops their answers.
    fn take_settles(&mut self, max: usize, out: &mut Vec<ColdGet>) {
        let _ = (max, out);
    }
    /// Whether reads wait for [`Tier::take_settles`].
    fn settles_waiting(&self) -> bool {
        false
    }
    /// Whether a put or a delete applied now would go without a device
    /// read. False while too many settling reads are open: the caller
    /// holds writes back until some finish (one applied anyway reads,
    /// blocking; the tier's [`TierRoom`] says when to look again).
    fn write_room(&self) -> bool {
        true
    }
    /// Whether `key` is present (and not expired).
    fn contains(&self, hash: u64, key: &[u8]) -> bool;
    /// Whether the tier holds an entry for `key`, expired or not.
    fn contains_any(&self, hash: u64, key: &[u8]) -> bool;
    /// The value of `key` and its expiry time (absolute Unix ms), if the
    /// key is present and not expired.
    fn get_expiring(&self, hash: u64, key: &[u8]) -> Option<(Bytes, Option<u64>)>;
    /// Sets `key` to `value` without an expiry time; returns true if the
    /// key was new. `lsn` as for [`Tier::put_expiring`].
    fn put(&mut self, hash: u64, key: &[u8], value: &[u8], lsn: u64) -> bool {
        self.put_expiring(hash, key, value, None, lsn)
    }
    /// Sets `key` to `value` expiring at `expires_at_ms` (absolute Unix ms,
    /// never 0; `None`: never); returns true if the key was new, as far as
    /// the tier knows without a device read (a hybrid tier's blind write
    /// answers true when no entry of the key is in RAM).
    ///
    /// `lsn` is the LSN of the WAL record that holds the write (a
    /// transaction's writes share their part's; a WAL replay passes each
    /// record's own, so a replayed write gets the version it had). A tier
    /// that keeps several records of a key stores it beside the value and
    /// tells newer from older by it; 0 when there is no WAL (durability
    /// `none`, memory tier only). The memory tier ignores it.
    fn put_expiring(
        &mut self,
        hash: u64,
        key: &[u8],
        value: &[u8],
        expires_at_ms: Option<u64>,
        lsn: u64,
    ) -> bool;
    /// Sets the tier's clock: entries expiring at or before `now_ms` are
    /// absent for every read (`get*`, `contains`, `visit_partition`) until
    /// they are deleted. The shard sets it before every step that reads.
    fn set_now_ms(&mut self, now_ms: u64);
    /// Whether a put without an expiry time reads the tier's clock. When
    /// it does not, a step of such puts alone may skip setting the clock
    /// (a clock read is a good part of a put's cost embedded).
    fn puts_read_clock(&self) -> bool {
        true
    }
    /// Up to `max` keys that have expired by the tier's clock, oldest
    /// expiry first (active expiry deletes them through logged deletes).
    fn due_keys(&self, max: usize) -> Vec<Bytes>;
    /// Entries that carry an expiry time (expired or not).
    fn expiring_count(&self) -> u64;
    /// Removes `key`; returns true if it existed. `lsn`: the WAL record of
    /// the delete, as for [`Tier::put_expiring`].
    fn delete(&mut self, hash: u64, key: &[u8], lsn: u64) -> bool;
    /// Number of keys.
    fn len(&self) -> u64;
    /// Whether there are no keys.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes of memory the tier holds (entries plus index), without the
    /// allocator's own per-allocation overhead.
    fn memory_bytes(&self) -> u64;
    /// How much a put of `key` with a `value_len`-byte value, expiring at
    /// `expires_at_ms` if given, would change [`Tier::memory_bytes`]: an upper
    /// bound, negative when the put frees more than it takes (a smaller
    /// value over a larger one). What `storage.max_memory` checks before a
    /// write is logged; it costs at most one lookup of the key.
    fn put_growth_bytes(
        &self,
        hash: u64,
        key: &[u8],
        value_len: usize,
        expires_at_ms: Option<u64>,
    ) -> i64;
    /// How many partitions [`Tier::visit_partition`] accepts.
    fn partition_count(&self) -> usize;
    /// Calls `f(key, value, expiry)` for every entry of partition
    /// `partition` that has not expired.
    fn visit_partition(&self, partition: usize, f: &mut EntryVisitor<'_>);

    /// The reads since the last call that could not be answered (a device
    /// read failed, or a block failed its checksum): `(key, message)`.
    /// Such a read answers as if the key were absent; the shard checks
    /// this after each read step and turns those answers into errors.
    fn take_read_errors(&mut self) -> Vec<(Bytes, String)> {
        Vec::new()
    }
    /// A write of the tier's own files failed (the shard is poisoned: the
    /// WAL still holds what was acknowledged).
    fn take_fault(&mut self) -> Option<String> {
        None
    }
    /// The background tasks the shard runs for this tier.
    fn background_tasks(&self) -> TierTasks {
        TierTasks::default()
    }
    /// Whether the tier needs a checkpoint sooner than the WAL's bytes or
    /// the interval would take one, and whether it must be a full one:
    /// `Some(true)` a full checkpoint, `Some(false)` any. (The hybrid tier
    /// with a hot device: segments GC emptied there are removed only once
    /// a full snapshot and one more checkpoint are published after their
    /// GC, and until then they keep the device from taking records.)
    fn checkpoint_wanted(&self) -> Option<bool> {
        None
    }
    /// What a checkpoint taken now would write, from the tier's own
    /// counts (`None`: the tier does not know, and the checkpointer goes by
    /// the WAL alone). The checkpointer sizes its threshold and picks a
    /// full copy or a delta by it (`docs/wal.md`, "Disk bounded by live
    /// data").
    fn checkpoint_estimate(&self) -> Option<CheckpointEstimate> {
        None
    }
    /// Background work (GC) in one bounded step; returns whether there was
    /// any (the caller yields and calls again).
    fn background_step(&mut self) -> bool {
        false
    }
    /// When background work that waits for a device (the hybrid tier's
    /// moves between devices, held to their share) may go on, if it waits:
    /// the caller looks again then rather than after its idle pause.
    fn background_wait(&self) -> Option<std::time::Instant> {
        None
    }
    /// A checkpoint starts copying the tier.
    fn checkpoint_begin(&mut self) {}
    /// Calls `f` for each checkpoint entry of `partition`: the partition's
    /// entries for a tier that keeps values in RAM; index chunks for one
    /// that keeps them in its own files. With `delta`, only what changed
    /// since the partition was last copied (the caller takes a delta only
    /// when that copy was published), deleted keys included; without it,
    /// everything. Either way the partition counts as copied from now on.
    fn visit_checkpoint_partition(
        &mut self,
        partition: usize,
        delta: bool,
        f: &mut CheckpointVisitor<'_>,
    );
    /// Called after every partition was copied: makes what the copied
    /// entries point at durable and adds the last entries (whole, in a
    /// delta too).
    fn checkpoint_finish(&mut self, _f: &mut CheckpointVisitor<'_>) -> Result<(), String> {
        Ok(())
    }
    /// The checkpoint was published (and older ones retired).
    fn checkpoint_published(&mut self) {}
    /// The tier's own files an online backup copies (`crate::backup`),
    /// each with the bytes of it that are written and never change again.
    /// Called on the shard thread between writes.
    fn backup_files(&self) -> Vec<TierFile> {
        Vec::new()
    }
    /// A checkpoint file starts loading (recovery): a full one into an
    /// empty tier, or a delta over what the files before it loaded.
    fn load_checkpoint_begin(&mut self, _delta: bool) -> Result<(), String> {
        Ok(())
    }
    /// Loads one entry of a checkpoint (recovery).
    fn load_checkpoint_entry(
        &mut self,
        key: &[u8],
        value: &[u8],
        expires_at_ms: Option<u64>,
    ) -> Result<(), String> {
        // A checkpoint entry has no LSN of its own (the memory tier, the
        // only one loading entries this way, keeps none).
        let hash = self.table_hasher().hash_key(key);
        self.put_expiring(hash, key, value, expires_at_ms, 0);
        Ok(())
    }
    /// Every file of the checkpoint chain is loaded (recovery; the WAL
    /// replay comes next). An error means the chain cannot be used.
    fn load_checkpoint_done(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// Loads a deleted-key entry of a delta checkpoint (recovery).
    fn load_checkpoint_delete(&mut self, key: &[u8]) -> Result<(), String> {
        let hash = self.table_hasher().hash_key(key);
        self.delete(hash, key, 0);
        Ok(())
    }
    /// The WAL replay of a recovery starts (after the checkpoint loaded).
    fn replay_begin(&mut self) {}
    /// Recovery is over (checkpoint loaded, WAL replayed).
    fn recovery_done(&mut self) {}
    /// The tier's own counters, for the shard's metrics.
    fn stats(&self) -> TierStats;
}
