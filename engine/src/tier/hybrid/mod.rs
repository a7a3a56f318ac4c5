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
//! run of keys up and answers what RAM holds; the others are answered by
//! the one future [`Tier::read_cold`] returns (`cold.rs`: one read per
//! record, reads of adjacent blocks merged, no borrow of the tier held
//! while a read is on the device, so the shard keeps serving); so are the
//! answers of blind deletes, and the settling reads puts queue once the
//! unresolved set is at its bound ([`Tier::take_settles`]). Every other
//! device I/O here (appends, GC, key walks, read-modify-writes, puts and
//! deletes past `SETTLES_MAX` open settling reads) is blocking, on
//! the shard thread.

mod blind;
pub mod cache;
mod checkpoint;
mod cold;
mod damage;
mod expiry_list;
mod faults;
mod gc;
pub mod index;
pub mod log;
mod lookup;
mod resize;
mod segments;
mod stats;
mod tiers;
mod writes;

use self::blind::BlindSets;
use self::cache::Cache;
use self::checkpoint::LoadState;
pub use self::cold::ReadHold;
use self::cold::{PendingCold, Settling};
pub use self::damage::SegmentDamage;
use self::expiry_list::ExpiryList;
use self::faults::Faults;
use self::gc::GcState;
use self::index::{Index, PARTITIONS};
use self::log::ValueLog;
pub use self::stats::HybridStats;
use super::{CheckpointVisitor, ColdGet, ColdRead, EntryVisitor, Tier, TierRoom};
use crate::hash::TableHasher;
use crate::io::Disk;
use bytes::Bytes;
use std::cell::RefCell;
use std::path::PathBuf;

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
    /// Raised when cold reads finish: settling reads counted against the
    /// bound [`Tier::write_room`] checks are done.
    room: TierRoom,
}

/// The hybrid tier of one shard.
pub struct HybridTier<D: Disk> {
    /// Shared with the futures of cold reads, which borrow it between
    /// their device reads.
    inner: std::rc::Rc<RefCell<Inner<D>>>,
    /// The cold reads handed out and not read yet.
    pending: std::rc::Rc<PendingCold<D::File>>,
    /// A test's hold for the next cold read ([`HybridTier::hold_next_cold_read`]).
    hold: RefCell<Option<ReadHold>>,
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
            pending: PendingCold::new(),
            hold: RefCell::new(None),
            inner: std::rc::Rc::new(RefCell::new(Inner {
                hasher: TableHasher::LEGACY,
                index: Index::new(settings.index_keys),
                cache: Cache::new(settings.cache_bytes),
                settings,
                log,
                expiring: ExpiryList::new(),
                now_ms: 0,
                epoch: 0,
                checkpoint_expiring_moved: None,
                blind: BlindSets::new(settings_index_keys),
                settling: Settling::default(),
                gc: GcState::default(),
                faults: Faults::default(),
                loading: LoadState::default(),
                tiering: None,
                room: TierRoom::new(),
            })),
        }
    }

    /// Puts the hot device `settings.hot` names in front of the value
    /// device: `disk` is its disk (its profile throttles its I/O), and the
    /// folder `settings.hot` names must exist. Before anything is loaded.
    pub fn with_hot_device(self, disk: D) -> HybridTier<D> {
        {
            let mut guard = self.inner.borrow_mut();
            let st = &mut *guard;
            let hot = st
                .settings
                .hot
                .clone()
                .expect("settings.hot names the hot device's folder");
            st.log.add_hot(disk, hot.dir);
            st.tiering = Some(tiers::Tiering::new(hot.bytes, hot.promote_reads));
        }
        self
    }

    /// The tier hashing keys with `hasher` instead of the unkeyed
    /// [`TableHasher::LEGACY`] the constructors start with. Only for a
    /// fresh tier (before any entry or checkpoint is loaded); a checkpoint
    /// must be loaded with the hasher it was written with.
    /// This tier writing `dir_id` (the data directory's identity) into the
    /// header of every value segment it makes, and refusing a segment
    /// whose header carries another (0: checks nothing; tests only).
    pub fn with_dir_id(self, dir_id: crate::layout::DirId) -> HybridTier<D> {
        self.inner.borrow_mut().log.set_dir_id(dir_id);
        self
    }

    pub fn with_table_hasher(self, hasher: TableHasher) -> HybridTier<D> {
        {
            let mut guard = self.inner.borrow_mut();
            let st = &mut *guard;
            assert!(
                st.index.is_empty() && !st.loading.layout_loaded,
                "the table hasher is chosen before the tier holds anything"
            );
            st.hasher = hasher;
        }
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
        let mut guard = self.inner.borrow_mut();
        let st = &mut *guard;
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
        let mut guard = self.inner.borrow_mut();
        let st = &mut *guard;
        st.cache = Cache::new(st.settings.cache_bytes);
        st.log.forget_recent();
    }

    /// A test hook: the next [`Tier::read_cold`] waits, once its first
    /// device reads are done, until the returned hold is released (see
    /// [`ReadHold`]).
    #[doc(hidden)]
    pub fn hold_next_cold_read(&self) -> ReadHold {
        let hold = ReadHold::default();
        *self.hold.borrow_mut() = Some(hold.clone());
        hold
    }

    /// Allows `max` settling reads open instead of [`SETTLES_MAX`], so
    /// tests reach the limit with few keys.
    #[doc(hidden)]
    pub fn set_settles_max(&mut self, max: usize) {
        self.inner.borrow_mut().settling.settles_max = max;
    }

    /// Bounds the unresolved entries at `max` instead of the size
    /// `index_keys` gives, so tests reach a full set with few keys.
    #[doc(hidden)]
    pub fn set_unresolved_max(&mut self, max: usize) {
        self.inner.borrow_mut().blind.unresolved_max = max;
    }
}

impl<D: Disk> Tier for HybridTier<D> {
    fn table_hasher(&self) -> TableHasher {
        self.inner.borrow().hasher
    }

    fn get(&self, hash: u64, key: &[u8]) -> Option<Bytes> {
        let mut guard = self.inner.borrow_mut();
        let st = &mut *guard;
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
        let mut found_cold = Vec::new();
        let answered =
            self.inner
                .borrow_mut()
                .get_many_split(hashes, keys, out, read_left, &mut found_cold);
        cold.extend(
            found_cold
                .into_iter()
                .map(|(i, ck)| self.pending.hold(ck, i, false)),
        );
        answered
    }

    fn read_cold(&self, gets: Vec<ColdGet>) -> ColdRead {
        let keys = self.pending.take(gets);
        let hold = self.hold.borrow_mut().take();
        Box::pin(cold::read_cold(std::rc::Rc::clone(&self.inner), keys, hold))
    }

    fn set_room_signal(&mut self, room: TierRoom) {
        self.inner.borrow_mut().room = room;
    }

    fn contains(&self, hash: u64, key: &[u8]) -> bool {
        let mut guard = self.inner.borrow_mut();
        let st = &mut *guard;
        st.find_for_read(hash, key).is_some_and(|r| st.live(&r))
    }

    fn presence(&self, hash: u64, key: &[u8]) -> super::Presence {
        let mut guard = self.inner.borrow_mut();
        let st = &mut *guard;
        match st.find_for_read(hash, key) {
            None => super::Presence::Absent,
            Some(r) if st.live(&r) => super::Presence::Live,
            Some(_) => super::Presence::Expired,
        }
    }

    fn contains_any(&self, hash: u64, key: &[u8]) -> bool {
        self.inner.borrow_mut().find_for_read(hash, key).is_some()
    }

    fn delete_lookup(&self, hash: u64, key: &[u8]) -> super::DeleteLookup {
        use super::{DeleteLookup, Presence};
        let found = self.inner.borrow_mut().delete_lookup(hash, key);
        match found {
            Ok(Presence::Absent) => DeleteLookup::Absent,
            Ok(Presence::Live) => DeleteLookup::Live,
            Ok(Presence::Expired) => DeleteLookup::Expired,
            Err(ck) => DeleteLookup::Cold(self.pending.hold(*ck, 0, true)),
        }
    }

    /// Deletes write no record to the segments: `lsn` is not kept.
    fn delete_blind(&mut self, hash: u64, key: &[u8], _lsn: u64) {
        self.inner.borrow_mut().delete_blind(hash, key);
    }

    fn take_settles(&mut self, max: usize, out: &mut Vec<ColdGet>) {
        let mut guard = self.inner.borrow_mut();
        let st = &mut *guard;
        let n = st.settling.settles.len().min(max);
        out.extend(
            st.settling
                .settles
                .drain(..n)
                .map(|ck| self.pending.hold(ck, 0, false)),
        );
    }

    fn settles_waiting(&self) -> bool {
        !self.inner.borrow().settling.settles.is_empty()
    }

    fn write_room(&self) -> bool {
        let st = self.inner.borrow();
        st.settling.settles_open.get() < st.settling.settles_max || st.blind_room()
    }

    fn get_expiring(&self, hash: u64, key: &[u8]) -> Option<(Bytes, Option<u64>)> {
        let mut guard = self.inner.borrow_mut();
        let st = &mut *guard;
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
        self.inner
            .borrow_mut()
            .put(hash, key, value, expires_at_ms, lsn)
    }

    fn set_now_ms(&mut self, now_ms: u64) {
        self.inner.borrow_mut().now_ms = now_ms;
    }

    fn due_keys(&self, max: usize) -> Vec<Bytes> {
        self.inner.borrow_mut().due_keys(max)
    }

    fn expiring_count(&self) -> u64 {
        self.inner.borrow().expiring.len() as u64
    }

    /// Deletes write no record to the segments: `lsn` is not kept.
    fn delete(&mut self, hash: u64, key: &[u8], _lsn: u64) -> bool {
        let mut guard = self.inner.borrow_mut();
        let st = &mut *guard;
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
        st.index
            .len()
            .saturating_sub(st.blind.unresolved.len() as u64)
    }

    fn memory_bytes(&self) -> u64 {
        self.inner.borrow().memory_bytes()
    }

    fn put_growth_bytes(
        &self,
        hash: u64,
        _key: &[u8],
        _value_len: usize,
        expires_at_ms: Option<u64>,
    ) -> i64 {
        self.inner.borrow().put_growth_bytes(hash, expires_at_ms)
    }

    fn partition_count(&self) -> usize {
        PARTITIONS
    }

    fn visit_partition(&self, partition: usize, f: &mut EntryVisitor<'_>) {
        self.inner.borrow_mut().visit_partition(partition, f)
    }

    fn take_read_errors(&mut self) -> Vec<(Bytes, String)> {
        std::mem::take(&mut self.inner.borrow_mut().faults.read_errors)
    }

    fn take_fault(&mut self) -> Option<String> {
        self.inner.borrow_mut().faults.fault.take()
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
        let mut guard = self.inner.borrow_mut();
        let st = &mut *guard;
        st.gc_step() || st.settle_step()
    }

    fn background_wait(&self) -> Option<std::time::Instant> {
        // A time gone by is no reason to look again at once: GC, if it
        // still waits, sets a new one at its next step.
        let until = self.inner.borrow().tiering.as_ref()?.gc_paused_until?;
        (until > std::time::Instant::now()).then_some(until)
    }

    fn checkpoint_begin(&mut self) {
        self.inner.borrow_mut().checkpoint_begin()
    }

    fn visit_checkpoint_partition(
        &mut self,
        partition: usize,
        delta: bool,
        f: &mut CheckpointVisitor<'_>,
    ) {
        self.inner
            .borrow_mut()
            .checkpoint_partition(partition, delta, f)
    }

    fn checkpoint_finish(&mut self, f: &mut CheckpointVisitor<'_>) -> Result<(), String> {
        self.inner.borrow_mut().checkpoint_finish(f)
    }

    fn backup_files(&self) -> Vec<crate::tier::TierFile> {
        self.inner.borrow().log.backup_files()
    }

    fn checkpoint_published(&mut self) {
        self.inner.borrow_mut().checkpoint_published()
    }

    fn load_checkpoint_begin(&mut self, delta: bool) -> Result<(), String> {
        self.inner.borrow_mut().load_begin(delta)
    }

    fn load_checkpoint_done(&mut self) -> Result<(), String> {
        self.inner.borrow_mut().load_done()
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
        self.inner.borrow_mut().load_entry(key, value)
    }

    fn replay_begin(&mut self) {
        self.inner.borrow_mut().blind.replaying = true;
    }

    fn recovery_done(&mut self) {
        self.inner.borrow_mut().recovery_done()
    }

    fn stats(&self) -> super::TierStats {
        super::TierStats::Hybrid(HybridTier::stats(self))
    }
}
