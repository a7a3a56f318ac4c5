//! The memory tier: every key and value in RAM, in one allocation per entry.
//!
//! Layout per entry: a hashbrown `HashTable` slot of 16 bytes (+1 control
//! byte) holding the entry's table hash and a thin pointer to one heap block
//! `[key_len u32][value_len u32][key][value]`. Keeping the hash in the slot
//! means a table resize moves slots without reading any entry block (with
//! only the pointer, every resize had to fetch every key from memory to
//! hash it again: a third of the CPU of a fill), and a lookup compares the
//! stored hash before it follows the pointer, so a slot whose 7-bit tag
//! matches by chance costs no cache miss. Entries are split into
//! [`PARTITION_COUNT`] partitions by the top bits of the mixed table hash
//! (the tier's [`TableHasher`], keyed in a data directory made by this
//! build, so a client cannot choose keys that share a probe chain), so
//! a checkpoint can copy one partition at a time and a table resize only
//! ever moves one partition's slots.
//! What must hold: `len` and `memory_bytes` always match the tables.
//!
//! **Expiry times.** A key with an expiry time has bit 31 of its `key_len`
//! set and 8 more bytes (the expiry, absolute Unix ms, LE) between the
//! header and the key; a key without one costs nothing extra. Keys with an
//! expiry are also indexed in `expiring`, an ordered map from (expiry,
//! table hash) to a count (16 bytes of key plus the B-tree's overhead per
//! such key, none for the others), so active expiry finds the due keys in
//! order without scanning the table. Reads (`get`, `get_many*`,
//! `contains`, `visit_partition`) treat an entry whose expiry is at or
//! before the tier's clock (`set_now_ms`) as absent; `len` still counts it
//! until it is deleted (as Redis's DBSIZE does).
//!
//! Batched reads ([`Tier::get_many`]) first look up every key of the batch,
//! then copy the values found: with no copy between two lookups the CPU
//! overlaps the cache misses of several lookups. Values are copied into
//! shared buffers of at most [`READ_CHUNK_BYTES_MAX`] bytes (one allocation
//! per buffer, not per value).

use super::Tier;
use crate::hash::{mix, TableHasher};
use bytes::{Bytes, BytesMut};
use hashbrown::HashTable;
use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::ptr::NonNull;

/// Partitions per shard tier (a power of two).
pub const PARTITION_COUNT: usize = 256;
const PARTITION_SHIFT: u32 = 64 - PARTITION_COUNT.trailing_zeros();
const _: () = assert!(PARTITION_COUNT.is_power_of_two());

const ENTRY_HEADER_BYTES: usize = 8;
const ENTRY_ALIGN: usize = 8;
/// Bit of `key_len` saying that an expiry time follows the header.
const KEY_LEN_EXPIRES: u32 = 1 << 31;
/// Bit of `key_len` saying that the entry changed since a checkpoint last
/// copied its partition (what a delta checkpoint copies).
const KEY_LEN_CHANGED: u32 = 1 << 30;
/// The key length bits of `key_len`.
const KEY_LEN_MASK: u32 = KEY_LEN_CHANGED - 1;
/// Bytes of the expiry time of an entry that has one.
const ENTRY_EXPIRY_BYTES: usize = 8;
/// What one key of the `expiring` index costs, counted in `memory_bytes`
/// (the (expiry, hash) pair, the count, and the B-tree's share).
const EXPIRING_INDEX_BYTES: u64 = 48;
/// What one remembered deleted key costs beyond its bytes (the set's slot
/// and the allocation's header), counted in `memory_bytes`.
const DELETED_KEY_BYTES: usize = 32;
/// At least what a partition table's first allocation takes (hashbrown:
/// 4 buckets of 16-byte slots plus control bytes), counted as the growth of
/// a put into an empty table.
const TABLE_FIRST_ALLOCATION_BYTES: i64 = 128;

/// Values read by one [`Tier::get_many`] are packed into shared buffers of
/// at most this many bytes (a larger value gets a buffer of its own). A
/// returned value keeps its whole buffer alive, so this bounds what a
/// caller holding one small value can pin. A shared buffer stays below
/// glibc's default mmap threshold (128 KiB), so it never costs an mmap and
/// fresh page faults.
pub const READ_CHUNK_BYTES_MAX: usize = 64 * 1024;

/// One owned heap block `[key_len u32 LE][value_len u32 LE][expiry u64 LE,
/// only if bit 31 of key_len][key][value]`.
struct Entry {
    ptr: NonNull<u8>,
}

impl Entry {
    fn layout(total: usize) -> Layout {
        Layout::from_size_align(total, ENTRY_ALIGN).expect("entry layout")
    }

    /// `expires_at_ms == 0`: no expiry.
    fn new(key: &[u8], value: &[u8], expires_at_ms: u64) -> Entry {
        let key_len = u32::try_from(key.len()).expect("key over 4 GiB");
        assert!(key_len <= KEY_LEN_MASK, "key over 1 GiB");
        let value_len = u32::try_from(value.len()).expect("value over 4 GiB");
        let (flag, extra) = if expires_at_ms != 0 {
            (KEY_LEN_EXPIRES, ENTRY_EXPIRY_BYTES)
        } else {
            (0, 0)
        };
        let key_len = key_len | flag | KEY_LEN_CHANGED;
        let total = ENTRY_HEADER_BYTES + extra + key.len() + value.len();
        let layout = Self::layout(total);
        // SAFETY: the layout has a non-zero size (at least the header).
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            handle_alloc_error(layout);
        };
        // SAFETY: the block is `total` bytes; the copies below fill it
        // exactly (the expiry only when `extra` is 8), from sources that
        // cannot overlap a fresh allocation.
        unsafe {
            let p = ptr.as_ptr();
            std::ptr::copy_nonoverlapping(key_len.to_le_bytes().as_ptr(), p, 4);
            std::ptr::copy_nonoverlapping(value_len.to_le_bytes().as_ptr(), p.add(4), 4);
            if extra != 0 {
                std::ptr::copy_nonoverlapping(
                    expires_at_ms.to_le_bytes().as_ptr(),
                    p.add(ENTRY_HEADER_BYTES),
                    ENTRY_EXPIRY_BYTES,
                );
            }
            let key_at = ENTRY_HEADER_BYTES + extra;
            std::ptr::copy_nonoverlapping(key.as_ptr(), p.add(key_at), key.len());
            std::ptr::copy_nonoverlapping(value.as_ptr(), p.add(key_at + key.len()), value.len());
        }
        Entry { ptr }
    }

    /// (key length, value length, bytes between the header and the key).
    fn layout_lens(&self) -> (usize, usize, usize) {
        // SAFETY: ptr points to an initialised block of at least 8 bytes.
        let header = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), ENTRY_HEADER_BYTES) };
        let mut k = [0u8; 4];
        let mut v = [0u8; 4];
        k.copy_from_slice(&header[0..4]);
        v.copy_from_slice(&header[4..8]);
        let k = u32::from_le_bytes(k);
        let extra = if k & KEY_LEN_EXPIRES != 0 {
            ENTRY_EXPIRY_BYTES
        } else {
            0
        };
        (
            (k & KEY_LEN_MASK) as usize,
            u32::from_le_bytes(v) as usize,
            extra,
        )
    }

    /// Whether the entry changed since a checkpoint last copied it.
    fn changed(&self) -> bool {
        // SAFETY: ptr points to an initialised block of at least 8 bytes.
        let b = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), 4) };
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & KEY_LEN_CHANGED != 0
    }

    /// Sets or clears the "changed since the last checkpoint copy" bit.
    fn set_changed(&mut self, changed: bool) {
        // SAFETY: the first 4 bytes of the owned block are `key_len`, and
        // `&mut self` means no other reference reads them meanwhile.
        let b = unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), 4) };
        let k = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let k = if changed {
            k | KEY_LEN_CHANGED
        } else {
            k & !KEY_LEN_CHANGED
        };
        b.copy_from_slice(&k.to_le_bytes());
    }

    fn lens(&self) -> (usize, usize) {
        let (k, v, _) = self.layout_lens();
        (k, v)
    }

    fn alloc_bytes(&self) -> usize {
        let (k, v, extra) = self.layout_lens();
        ENTRY_HEADER_BYTES + extra + k + v
    }

    /// The expiry time (absolute Unix ms), 0 if the entry has none.
    fn expires_at_ms(&self) -> u64 {
        let (_, _, extra) = self.layout_lens();
        if extra == 0 {
            return 0;
        }
        let mut e = [0u8; 8];
        e.copy_from_slice(&self.bytes()[ENTRY_HEADER_BYTES..ENTRY_HEADER_BYTES + extra]);
        u64::from_le_bytes(e)
    }

    /// Whether the entry is visible at `now_ms` (no expiry, or a later one).
    fn live_at(&self, now_ms: u64) -> bool {
        let at = self.expires_at_ms();
        at == 0 || at > now_ms
    }

    fn bytes(&self) -> &[u8] {
        let len = self.alloc_bytes();
        // SAFETY: the block is `len` initialised bytes, owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), len) }
    }

    fn key(&self) -> &[u8] {
        let (k, _, extra) = self.layout_lens();
        &self.bytes()[ENTRY_HEADER_BYTES + extra..ENTRY_HEADER_BYTES + extra + k]
    }

    fn value(&self) -> &[u8] {
        let (k, _, extra) = self.layout_lens();
        &self.bytes()[ENTRY_HEADER_BYTES + extra + k..]
    }

    /// Replaces the value in place when its length is unchanged (only for
    /// an entry without an expiry time).
    fn overwrite_value_same_len(&mut self, value: &[u8]) {
        let (k, v, extra) = self.layout_lens();
        assert_eq!(extra, 0);
        assert_eq!(v, value.len());
        // SAFETY: the value region is `v` bytes inside the owned block, and
        // `value` cannot alias it (the caller's bytes live elsewhere).
        unsafe {
            std::ptr::copy_nonoverlapping(
                value.as_ptr(),
                self.ptr.as_ptr().add(ENTRY_HEADER_BYTES + k),
                v,
            );
        }
        self.set_changed(true);
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let layout = Self::layout(self.alloc_bytes());
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

/// One table slot: the entry's table hash (the second half of [`split`])
/// and the entry itself.
struct Slot {
    hash: u64,
    entry: Entry,
}

struct Partition {
    table: HashTable<Slot>,
    /// Keys deleted since a checkpoint last copied this partition (what a
    /// delta checkpoint lists as deleted). Kept only once checkpoints run.
    /// Hashed with the standard library's randomly keyed SipHash-1-3.
    deleted: hashbrown::HashSet<Box<[u8]>, std::hash::RandomState>,
}

/// All entries of one shard, in RAM.
pub struct MemoryTier {
    /// Makes every `hash` this tier is given (see [`Tier::table_hasher`]).
    hasher: TableHasher,
    partitions: Box<[Partition]>,
    /// (expiry, table hash) of every entry with an expiry time, with the
    /// number of such entries (two keys may share both).
    expiring: std::collections::BTreeMap<(u64, u64), u32>,
    /// Sum of the counts in `expiring`.
    expiring_entries: u64,
    /// Entries expiring at or before this (Unix ms) are invisible to reads.
    now_ms: u64,
    len: u64,
    /// Sum of entry block sizes.
    entry_bytes: u64,
    /// Sum of the tables' allocations.
    table_bytes: u64,
    /// Whether deletes are remembered for the next delta checkpoint (set
    /// by the first checkpoint: with none, nothing would ever clear them).
    track_deletes: bool,
    /// Key bytes held in the partitions' `deleted` sets.
    deleted_bytes: u64,
    /// Sum of the block sizes of entries marked changed since a
    /// checkpoint last copied them (what a delta would copy of them).
    changed_bytes: u64,
}

impl Default for MemoryTier {
    fn default() -> Self {
        Self::new()
    }
}

#[inline]
fn split(hash: u64) -> (usize, u64) {
    let m = mix(hash);
    // Top bits pick the partition; the table gets the word rotated so that
    // neither its bucket bits (low) nor its tag bits (top 7) are the
    // partition bits, which are the same for every entry of a partition.
    ((m >> PARTITION_SHIFT) as usize, m.rotate_right(8))
}

#[inline]
fn table_hash(slot: &Slot) -> u64 {
    slot.hash
}

impl MemoryTier {
    /// An empty tier with the unkeyed [`TableHasher::LEGACY`] hash (tests
    /// of the tier alone; a shard passes its own with
    /// [`MemoryTier::with_hasher`]).
    pub fn new() -> Self {
        Self::with_hasher(TableHasher::LEGACY)
    }

    /// An empty tier whose tables hash keys with `hasher`.
    pub fn with_hasher(hasher: TableHasher) -> Self {
        let partitions = (0..PARTITION_COUNT)
            .map(|_| Partition {
                table: HashTable::new(),
                deleted: hashbrown::HashSet::default(),
            })
            .collect::<Vec<_>>()
            .into_boxed_slice();
        MemoryTier {
            hasher,
            partitions,
            expiring: std::collections::BTreeMap::new(),
            expiring_entries: 0,
            now_ms: 0,
            len: 0,
            entry_bytes: 0,
            table_bytes: 0,
            track_deletes: false,
            deleted_bytes: 0,
            changed_bytes: 0,
        }
    }

    /// An empty tier whose tables have room for about `entries` entries
    /// (spread over the partitions, with room for the uneven spread of a
    /// hash), so that filling it does not grow and rehash them.
    pub fn with_capacity(entries: u64) -> Self {
        Self::with_capacity_and_hasher(entries, TableHasher::LEGACY)
    }

    /// [`MemoryTier::with_capacity`] hashing keys with `hasher`.
    pub fn with_capacity_and_hasher(entries: u64, hasher: TableHasher) -> Self {
        let mut tier = Self::with_hasher(hasher);
        let per_partition = entries / PARTITION_COUNT as u64;
        let room = per_partition + per_partition / 8 + 16;
        let room = usize::try_from(room).unwrap_or(usize::MAX);
        for partition in tier.partitions.iter_mut() {
            partition.table = HashTable::with_capacity(room);
        }
        tier.table_bytes = tier
            .partitions
            .iter()
            .map(|p| Self::table_bytes_of(&p.table))
            .sum();
        tier
    }

    fn table_bytes_of(table: &HashTable<Slot>) -> u64 {
        table.allocation_size() as u64
    }

    fn index_add(&mut self, expires_at_ms: u64, hash: u64) {
        if expires_at_ms != 0 {
            *self.expiring.entry((expires_at_ms, hash)).or_insert(0) += 1;
            self.expiring_entries += 1;
        }
    }

    fn index_remove(&mut self, expires_at_ms: u64, hash: u64) {
        if expires_at_ms == 0 {
            return;
        }
        let slot = (expires_at_ms, hash);
        let count = self
            .expiring
            .get_mut(&slot)
            .expect("every entry with an expiry is indexed");
        *count -= 1;
        self.expiring_entries -= 1;
        if *count == 0 {
            self.expiring.remove(&slot);
        }
    }
}

impl Tier for MemoryTier {
    fn table_hasher(&self) -> TableHasher {
        self.hasher
    }

    fn get(&self, hash: u64, key: &[u8]) -> Option<Bytes> {
        let (p, h) = split(hash);
        self.partitions[p]
            .table
            .find(h, |s| s.hash == h && s.entry.key() == key)
            .map(|s| &s.entry)
            .filter(|e| e.live_at(self.now_ms))
            .map(|e| Bytes::copy_from_slice(e.value()))
    }

    /// Two passes: look up every key (the lookups are independent, so
    /// their cache misses overlap), then copy the values found into shared
    /// buffers of at most [`READ_CHUNK_BYTES_MAX`] bytes.
    fn get_many(&self, hashes: &[u64], keys: &[Bytes], out: &mut Vec<Option<Bytes>>) {
        let found = self.find_many(hashes, keys);
        copy_found(&found, out);
    }

    /// Looks every key up first (no copy), then copies the values of the
    /// prefix that the budget allows.
    fn get_many_within(
        &self,
        hashes: &[u64],
        keys: &[Bytes],
        out: &mut Vec<Option<Bytes>>,
        read_left: &mut usize,
    ) -> usize {
        let found = self.find_many(hashes, keys);
        let mut answered = 0;
        for entry in &found {
            if *read_left == 0 {
                break;
            }
            *read_left = read_left.saturating_sub(entry.map_or(0, |e| e.lens().1));
            answered += 1;
        }
        copy_found(&found[..answered], out);
        answered
    }

    fn contains(&self, hash: u64, key: &[u8]) -> bool {
        let (p, h) = split(hash);
        self.partitions[p]
            .table
            .find(h, |s| s.hash == h && s.entry.key() == key)
            .is_some_and(|s| s.entry.live_at(self.now_ms))
    }

    fn contains_any(&self, hash: u64, key: &[u8]) -> bool {
        let (p, h) = split(hash);
        self.partitions[p]
            .table
            .find(h, |s| s.hash == h && s.entry.key() == key)
            .is_some()
    }

    fn get_expiring(&self, hash: u64, key: &[u8]) -> Option<(Bytes, Option<u64>)> {
        let (p, h) = split(hash);
        self.partitions[p]
            .table
            .find(h, |s| s.hash == h && s.entry.key() == key)
            .map(|s| &s.entry)
            .filter(|e| e.live_at(self.now_ms))
            .map(|e| {
                let at = e.expires_at_ms();
                (Bytes::copy_from_slice(e.value()), (at != 0).then_some(at))
            })
    }

    fn set_now_ms(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
    }

    fn puts_read_clock(&self) -> bool {
        // A put replaces whatever entry is there, expired or not, and its
        // memory accounting does not look at expiry either.
        false
    }

    fn due_keys(&self, max: usize) -> Vec<Bytes> {
        let mut keys = Vec::new();
        for (&(at, hash), _) in self.expiring.range(..=(self.now_ms, u64::MAX)) {
            if keys.len() >= max {
                break;
            }
            let (p, h) = split(hash);
            let found = self.partitions[p].table.find(h, |s| {
                s.hash == h
                    && s.entry.expires_at_ms() == at
                    && self.hasher.hash_key(s.entry.key()) == hash
            });
            let entry = &found.expect("every indexed expiry has its entry").entry;
            keys.push(Bytes::copy_from_slice(entry.key()));
        }
        keys
    }

    fn expiring_count(&self) -> u64 {
        self.expiring_entries
    }

    fn put_expiring(
        &mut self,
        hash: u64,
        key: &[u8],
        value: &[u8],
        expires_at_ms: Option<u64>,
        _lsn: u64,
    ) -> bool {
        debug_assert_eq!(hash, self.hasher.hash_key(key), "hash from another hasher");
        let at = expires_at_ms.unwrap_or(0);
        assert!(expires_at_ms != Some(0), "an expiry time is after 1970");
        let (p, h) = split(hash);
        let table = &mut self.partitions[p].table;
        if let Some(Slot { entry, .. }) = table.find_mut(h, |s| s.hash == h && s.entry.key() == key)
        {
            let old_at = entry.expires_at_ms();
            let old = entry.alloc_bytes() as u64;
            if !entry.changed() {
                self.changed_bytes += old;
            }
            if old_at == 0 && at == 0 && entry.value().len() == value.len() {
                entry.overwrite_value_same_len(value);
            } else {
                *entry = Entry::new(key, value, at);
                let new = entry.alloc_bytes() as u64;
                self.entry_bytes = self.entry_bytes - old + new;
                self.changed_bytes = self.changed_bytes - old + new;
                self.index_remove(old_at, hash);
                self.index_add(at, hash);
            }
            return false;
        }
        self.index_add(at, hash);
        let table = &mut self.partitions[p].table;
        let before = Self::table_bytes_of(table);
        let entry = Entry::new(key, value, at);
        let size = entry.alloc_bytes() as u64;
        table.insert_unique(h, Slot { hash: h, entry }, table_hash);
        let after = Self::table_bytes_of(table);
        self.table_bytes = self.table_bytes - before + after;
        self.entry_bytes += size;
        self.changed_bytes += size;
        self.len += 1;
        true
    }

    fn delete(&mut self, hash: u64, key: &[u8], _lsn: u64) -> bool {
        let (p, h) = split(hash);
        let table = &mut self.partitions[p].table;
        match table.find_entry(h, |s| s.hash == h && s.entry.key() == key) {
            Ok(occupied) => {
                let (Slot { entry, .. }, _) = occupied.remove();
                self.entry_bytes -= entry.alloc_bytes() as u64;
                if entry.changed() {
                    self.changed_bytes -= entry.alloc_bytes() as u64;
                }
                self.len -= 1;
                self.index_remove(entry.expires_at_ms(), hash);
                if self.track_deletes && self.partitions[p].deleted.insert(key.into()) {
                    self.deleted_bytes += (key.len() + DELETED_KEY_BYTES) as u64;
                }
                true
            }
            Err(_) => false,
        }
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn stats(&self) -> super::TierStats {
        super::TierStats::Memory
    }

    fn memory_bytes(&self) -> u64 {
        self.entry_bytes
            + self.expiring.len() as u64 * EXPIRING_INDEX_BYTES
            + self.table_bytes
            + self.deleted_bytes
            + (self.partitions.len() * std::mem::size_of::<Partition>()) as u64
    }

    /// A new key: its block, its expiry index entry, and a table that is
    /// full grows (hashbrown doubles it: the growth is about the old
    /// allocation). An existing key: the difference of the blocks and of
    /// the expiry index entries.
    fn put_growth_bytes(
        &self,
        hash: u64,
        key: &[u8],
        value_len: usize,
        expires_at_ms: Option<u64>,
    ) -> i64 {
        let expiring = expires_at_ms.is_some();
        let extra = if expiring { ENTRY_EXPIRY_BYTES } else { 0 };
        let block = (ENTRY_HEADER_BYTES + extra + key.len() + value_len) as i64;
        let index_bytes = |has_expiry: bool| {
            if has_expiry {
                EXPIRING_INDEX_BYTES as i64
            } else {
                0
            }
        };
        let (p, h) = split(hash);
        let table = &self.partitions[p].table;
        match table.find(h, |s| s.hash == h && s.entry.key() == key) {
            Some(Slot { entry, .. }) => {
                block - entry.alloc_bytes() as i64 + index_bytes(expiring)
                    - index_bytes(entry.expires_at_ms() != 0)
            }
            None => {
                let table_growth = if table.len() == table.capacity() {
                    (table.allocation_size() as i64).max(TABLE_FIRST_ALLOCATION_BYTES)
                } else {
                    0
                };
                block + index_bytes(expiring) + table_growth
            }
        }
    }

    fn partition_count(&self) -> usize {
        self.partitions.len()
    }

    fn visit_partition(&self, partition: usize, f: &mut super::EntryVisitor<'_>) {
        for Slot { entry, .. } in self.partitions[partition].table.iter() {
            if entry.live_at(self.now_ms) {
                let at = entry.expires_at_ms();
                f(entry.key(), entry.value(), (at != 0).then_some(at));
            }
        }
    }

    fn checkpoint_begin(&mut self) {
        self.track_deletes = true;
    }

    /// A full copy writes every entry's block as it is held (header,
    /// expiry, key, value); a delta the changed ones and a key per delete.
    fn checkpoint_estimate(&self) -> Option<super::CheckpointEstimate> {
        Some(super::CheckpointEstimate {
            full_bytes: self.entry_bytes,
            delta_bytes: self.changed_bytes + self.deleted_bytes,
        })
    }

    /// A full copy: every live entry. A delta: the keys deleted since the
    /// last copy, then the entries changed since it; a changed entry that
    /// has expired is listed as deleted, since the copy the delta builds
    /// on may hold an older, live version of it.
    fn visit_checkpoint_partition(
        &mut self,
        partition: usize,
        delta: bool,
        f: &mut super::CheckpointVisitor<'_>,
    ) {
        let now = self.now_ms;
        let part = &mut self.partitions[partition];
        let deleted = std::mem::take(&mut part.deleted);
        self.deleted_bytes -= deleted
            .iter()
            .map(|k| (k.len() + DELETED_KEY_BYTES) as u64)
            .sum::<u64>();
        if delta {
            for key in &deleted {
                f(key, None, None);
            }
        }
        for Slot { entry, .. } in part.table.iter_mut() {
            if delta && !entry.changed() {
                continue;
            }
            if entry.live_at(now) {
                let at = entry.expires_at_ms();
                f(entry.key(), Some(entry.value()), (at != 0).then_some(at));
            } else if delta {
                f(entry.key(), None, None);
            }
            if entry.changed() {
                self.changed_bytes -= entry.alloc_bytes() as u64;
                entry.set_changed(false);
            }
        }
    }
}

impl MemoryTier {
    /// Looks every key up (the lookups are independent, so their cache
    /// misses overlap); copies nothing.
    fn find_many(&self, hashes: &[u64], keys: &[Bytes]) -> Vec<Option<&Entry>> {
        assert_eq!(hashes.len(), keys.len());
        hashes
            .iter()
            .zip(keys)
            .map(|(&hash, key)| {
                let (p, h) = split(hash);
                self.partitions[p]
                    .table
                    .find(h, |s| s.hash == h && s.entry.key() == &key[..])
                    .map(|s| &s.entry)
                    .filter(|e| e.live_at(self.now_ms))
            })
            .collect()
    }
}

/// Copies the values of `found` into shared buffers of at most
/// [`READ_CHUNK_BYTES_MAX`] bytes (one larger value alone) and appends one
/// answer per entry to `out`.
fn copy_found(found: &[Option<&Entry>], out: &mut Vec<Option<Bytes>>) {
    let value_len = |e: &Option<&Entry>| e.map_or(0, |e| e.lens().1);
    out.reserve(found.len());
    let mut first = 0;
    while first < found.len() {
        // One buffer: values first..end, together at most
        // READ_CHUNK_BYTES_MAX bytes (or one larger value alone).
        let mut end = first;
        let mut chunk_bytes = 0;
        while let Some(entry) = found.get(end) {
            let len = value_len(entry);
            if end > first && chunk_bytes + len > READ_CHUNK_BYTES_MAX {
                break;
            }
            chunk_bytes += len;
            end += 1;
        }
        let mut buf = BytesMut::with_capacity(chunk_bytes);
        for entry in found[first..end].iter().flatten() {
            buf.extend_from_slice(entry.value());
        }
        assert_eq!(buf.len(), chunk_bytes);
        let mut chunk = buf.freeze();
        for entry in &found[first..end] {
            out.push(entry.map(|e| chunk.split_to(e.lens().1)));
        }
        assert!(chunk.is_empty());
        first = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::fnv1a64;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn put(t: &mut MemoryTier, k: &[u8], v: &[u8]) -> bool {
        t.put(fnv1a64(k), k, v, 0)
    }

    /// What a checkpoint copy of every partition lists: key to value, or
    /// to `None` for a deleted key.
    type Copy = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

    fn copy(t: &mut MemoryTier, delta: bool) -> Copy {
        let mut out = Copy::new();
        t.checkpoint_begin();
        for p in 0..t.partition_count() {
            t.visit_checkpoint_partition(p, delta, &mut |k, v, _| {
                out.insert(k.to_vec(), v.map(<[u8]>::to_vec));
            });
        }
        out
    }

    fn load(t: &mut MemoryTier, copy: &Copy) {
        for (k, v) in copy {
            match v {
                Some(v) => t.load_checkpoint_entry(k, v, None).expect("entry"),
                None => t.load_checkpoint_delete(k).expect("delete"),
            }
        }
    }

    #[test]
    fn a_delta_lists_what_changed_since_the_last_copy() {
        let mut t = MemoryTier::new();
        for k in [&b"a"[..], b"b", b"c", b"e"] {
            put(&mut t, k, b"v1");
        }
        let full = copy(&mut t, false);
        assert_eq!(full.len(), 4);
        assert!(copy(&mut t, true).is_empty(), "nothing changed");
        t.delete(fnv1a64(b"b"), b"b", 0);
        put(&mut t, b"d", b"v1");
        // Same length: the value is overwritten in place.
        put(&mut t, b"a", b"v2");
        // Deleted and written again: both are listed, the value wins.
        t.delete(fnv1a64(b"e"), b"e", 0);
        put(&mut t, b"e", b"v3");
        // Changed, then expired before the copy: listed as deleted, since
        // the copy before holds an older, live value.
        t.put_expiring(fnv1a64(b"c"), b"c", b"v2", Some(1_000), 0);
        t.set_now_ms(2_000);
        let delta = copy(&mut t, true);
        let want: Copy = [
            (&b"a"[..], Some(&b"v2"[..])),
            (b"b", None),
            (b"c", None),
            (b"d", Some(b"v1")),
            (b"e", Some(b"v3")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
        .collect();
        assert_eq!(delta, want);
        assert!(copy(&mut t, true).is_empty(), "the copy cleared the marks");
        // The full copy with the delta loaded over it is the tier now.
        let mut back = MemoryTier::new();
        load(&mut back, &full);
        load(&mut back, &delta);
        back.set_now_ms(2_000);
        for k in [&b"a"[..], b"b", b"c", b"d", b"e"] {
            let h = fnv1a64(k);
            assert_eq!(back.get(h, k), t.get(h, k), "{k:?}");
        }
        // A full copy clears the marks and the deleted keys too.
        t.delete(fnv1a64(b"a"), b"a", 0);
        put(&mut t, b"f", b"v1");
        assert_eq!(copy(&mut t, false).len(), 3);
        assert!(copy(&mut t, true).is_empty());
        assert_eq!(t.deleted_bytes, 0);
    }

    #[test]
    fn deletes_are_not_remembered_before_a_checkpoint_runs() {
        let mut t = MemoryTier::new();
        put(&mut t, b"a", b"v");
        let before = t.memory_bytes();
        t.delete(fnv1a64(b"a"), b"a", 0);
        assert_eq!(t.deleted_bytes, 0);
        assert!(t.memory_bytes() < before);
    }

    fn recount(t: &MemoryTier) -> (u64, u64) {
        let mut n = 0;
        let mut bytes = 0;
        for p in 0..t.partition_count() {
            t.visit_partition(p, &mut |k, v, _| {
                n += 1;
                bytes += (ENTRY_HEADER_BYTES + k.len() + v.len()) as u64;
            });
        }
        (n, bytes)
    }

    #[test]
    fn put_get_delete() {
        let mut t = MemoryTier::new();
        assert!(put(&mut t, b"a", b"1"));
        assert!(!put(&mut t, b"a", b"2"));
        assert!(!put(&mut t, b"a", b"longer value"));
        assert_eq!(
            t.get(fnv1a64(b"a"), b"a").as_deref(),
            Some(&b"longer value"[..])
        );
        assert_eq!(t.get(fnv1a64(b"b"), b"b"), None);
        assert!(put(&mut t, b"e", b""));
        assert_eq!(t.get(fnv1a64(b"e"), b"e").as_deref(), Some(&b""[..]));
        assert_eq!(t.len(), 2);
        assert!(t.delete(fnv1a64(b"a"), b"a", 0));
        assert!(!t.delete(fnv1a64(b"a"), b"a", 0));
        assert_eq!(t.len(), 1);
        assert_eq!(recount(&t), (1, (ENTRY_HEADER_BYTES + 1) as u64));
    }

    #[test]
    fn presized_tier_holds_its_count_without_growing() {
        let mut t = MemoryTier::with_capacity(100_000);
        let table_bytes = t.table_bytes;
        assert!(table_bytes > 0);
        for i in 0..100_000u32 {
            assert!(put(&mut t, &i.to_le_bytes(), b"v"));
        }
        assert_eq!(t.table_bytes, table_bytes, "no table grew");
        assert_eq!(recount(&t).0, 100_000);
    }

    #[test]
    fn grows_across_resizes_and_accounts_memory() {
        let mut t = MemoryTier::new();
        for i in 0..50_000u32 {
            let k = format!("key-{i}");
            put(&mut t, k.as_bytes(), &i.to_le_bytes());
        }
        for i in 0..50_000u32 {
            let k = format!("key-{i}");
            assert_eq!(
                t.get(fnv1a64(k.as_bytes()), k.as_bytes()).as_deref(),
                Some(&i.to_le_bytes()[..])
            );
        }
        let (n, entry_bytes) = recount(&t);
        assert_eq!(n, 50_000);
        assert_eq!(t.entry_bytes, entry_bytes);
        let tables: u64 = t
            .partitions
            .iter()
            .map(|p| p.table.allocation_size() as u64)
            .sum();
        assert_eq!(t.table_bytes, tables);
        assert!(t.memory_bytes() > entry_bytes);
        // Every partition got some keys: the partition bits are spread.
        assert!(t.partitions.iter().all(|p| !p.table.is_empty()));
    }

    #[test]
    fn get_many_within_copies_no_more_than_the_budget_plus_one_value() {
        let mut t = MemoryTier::new();
        for i in 0..100u32 {
            put(&mut t, format!("key-{i}").as_bytes(), &[i as u8; 1000]);
        }
        // Every other key is missing: a miss costs nothing.
        let keys: Vec<Bytes> = (0..200u32)
            .map(|i| Bytes::from(format!("key-{}", if i % 2 == 0 { i / 2 } else { 1000 + i })))
            .collect();
        let hashes: Vec<u64> = keys.iter().map(|k| fnv1a64(k)).collect();
        let mut left = 10_500;
        let mut out = Vec::new();
        let answered = t.get_many_within(&hashes, &keys, &mut out, &mut left);
        // Ten values leave 500 bytes: the eleventh value is still answered
        // and uses the budget up.
        assert_eq!(answered, 21);
        assert_eq!(left, 0);
        assert_eq!(out.len(), answered);
        for (i, answer) in out.iter().enumerate() {
            assert_eq!(answer, &t.get(hashes[i], &keys[i]), "key {i}");
        }
        let mut left = usize::MAX;
        let mut all = Vec::new();
        assert_eq!(t.get_many_within(&hashes, &keys, &mut all, &mut left), 200);
    }

    #[test]
    fn get_many_answers_like_get() {
        let mut t = MemoryTier::new();
        let big = vec![7u8; READ_CHUNK_BYTES_MAX + 100];
        for i in 0..3_000u32 {
            let k = format!("key-{i}");
            let v: Vec<u8> = match i % 50 {
                0 => Vec::new(),
                1 => big.clone(),
                _ => (0..(i % 2_000)).map(|j| (i ^ j) as u8).collect(),
            };
            put(&mut t, k.as_bytes(), &v);
        }
        // Present, missing, repeated keys; batches of several sizes.
        let keys: Vec<Bytes> = (0..4_000u32)
            .map(|i| Bytes::from(format!("key-{}", (i * 7919) % 3_500)))
            .collect();
        let hashes: Vec<u64> = keys.iter().map(|k| fnv1a64(k)).collect();
        for size in [0usize, 1, 5, 17, 1_000, 4_000] {
            let mut out = vec![None];
            t.get_many(&hashes[..size], &keys[..size], &mut out);
            assert_eq!(out.len(), size + 1, "appends to out");
            for (i, answer) in out[1..].iter().enumerate() {
                assert_eq!(answer, &t.get(hashes[i], &keys[i]), "key {i}");
            }
        }
    }

    proptest! {
        #[test]
        fn behaves_like_a_btreemap(ops in proptest::collection::vec((0u8..3, 0u8..20, proptest::collection::vec(any::<u8>(), 0..40)), 1..400)) {
            let mut t = MemoryTier::new();
            let mut model = BTreeMap::new();
            for (op, k, v) in ops {
                let key = vec![b'k', k];
                let h = fnv1a64(&key);
                match op {
                    0 => { prop_assert_eq!(t.put(h, &key, &v, 0), model.insert(key.clone(), v).is_none()); }
                    1 => { prop_assert_eq!(t.delete(h, &key, 0), model.remove(&key).is_some()); }
                    _ => { prop_assert_eq!(t.get(h, &key).map(|b| b.to_vec()), model.get(&key).cloned()); }
                }
            }
            prop_assert_eq!(t.len(), model.len() as u64);
            let (n, bytes) = recount(&t);
            prop_assert_eq!(n, model.len() as u64);
            prop_assert_eq!(t.entry_bytes, bytes);
        }
    }

    proptest! {
        /// The delta estimate is exactly what the marks say a delta copies:
        /// the blocks of the changed entries plus the deleted keys, through
        /// puts, overwrites of every kind, deletes, and full and delta copies.
        #[test]
        fn the_delta_estimate_follows_the_marks(ops in proptest::collection::vec((0u8..6, 0u8..20, 0usize..40), 1..400)) {
            let mut t = MemoryTier::new();
            t.checkpoint_begin();
            for (op, k, len) in ops {
                let key = vec![b'k', k];
                let h = fnv1a64(&key);
                match op {
                    0 | 1 => { t.put(h, &key, &vec![k; len], 0); }
                    2 => { t.put_expiring(h, &key, &vec![k; len], Some(u64::MAX), 0); }
                    3 => { t.delete(h, &key, 0); }
                    _ => {
                        for p in 0..t.partition_count() {
                            t.visit_checkpoint_partition(p, op == 4, &mut |_, _, _| {});
                        }
                    }
                }
                let changed: u64 = t.partitions.iter()
                    .flat_map(|p| p.table.iter())
                    .filter(|s| s.entry.changed())
                    .map(|s| s.entry.alloc_bytes() as u64)
                    .sum();
                let est = t.checkpoint_estimate().expect("the memory tier estimates");
                prop_assert_eq!(est.delta_bytes, changed + t.deleted_bytes);
                prop_assert_eq!(est.full_bytes, t.entry_bytes);
            }
        }
    }

    proptest! {
        /// `put_growth_bytes` bounds what a put really adds to
        /// `memory_bytes` (exactly, when no table grows), and says when it
        /// frees: what `storage.max_memory` relies on.
        #[test]
        fn put_growth_bounds_the_change_of_memory_bytes(ops in proptest::collection::vec((0u8..64, 0usize..300, any::<bool>()), 1..600)) {
            let mut t = MemoryTier::new();
            for (k, len, expiring) in ops {
                let key = vec![b'k', k];
                let h = fnv1a64(&key);
                let value = vec![7u8; len];
                let at = expiring.then_some(1_000 + u64::from(k));
                let growth = t.put_growth_bytes(h, &key, len, at);
                let tables_before = t.table_bytes;
                let before = t.memory_bytes() as i64;
                t.put_expiring(h, &key, &value, at, 0);
                let change = t.memory_bytes() as i64 - before;
                prop_assert!(change <= growth, "put of {len} bytes grew {change}, bound {growth}");
                if t.table_bytes == tables_before {
                    prop_assert_eq!(change, growth);
                }
            }
        }
    }
}
