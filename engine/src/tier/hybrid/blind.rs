//! What blind writes and deletes leave behind (see the module doc of
//! `hybrid`): the unresolved entries, the keys deleted without reading,
//! and the copies of both a running checkpoint lists. The writes and
//! deletes that fill them are in `writes.rs`; GC and reads settle them.

/// What one deleted key costs in RAM beyond its bytes (its box and its
/// place in the set).
pub(super) const DELETED_KEY_BYTES: u64 = 40;

/// Most unresolved entries per shard: an 32nd of the keys the index is
/// sized for (about 0.3 bytes of RAM per key at most), at least 4096.
fn unresolved_max(index_keys: u64) -> usize {
    (index_keys / 32).max(4096) as usize
}

/// What blind writes and deletes leave behind: entries that may hold an
/// older version of a key, and keys deleted without reading.
pub(super) struct BlindSets {
    /// Entries a blind write left behind: the addresses of records that
    /// may hold an older version of a key written since (a write whose
    /// candidates were not in RAM did not read them). Reads try them last,
    /// newest first; GC, deletes and walks settle them.
    pub(super) unresolved: hashbrown::HashSet<u32>,
    /// Most entries `unresolved` may hold; past it writes read their
    /// candidates again.
    pub(super) unresolved_max: usize,
    /// A recovery replays the WAL (`replay_begin` until `recovery_done`):
    /// blind writes are not bounded by `unresolved_max`.
    pub(super) replaying: bool,
    /// `unresolved` as it was when the running checkpoint began: what the
    /// checkpoint lists. Entries made unresolved later come back with the
    /// replay of the writes that made them so; entries GC settles later
    /// (no WAL record) must stay listed, or an index partition copied
    /// before GC settled them would have two current entries for one key.
    pub(super) checkpoint_unresolved: Vec<u32>,
    /// Keys a delete removed without reading (see the module doc): every
    /// entry of such a key is unresolved and dead. Bounded by
    /// `unresolved_max`; past it deletes read.
    pub(super) deleted: std::collections::HashSet<Box<[u8]>>,
    /// Bytes of the keys in `deleted`.
    pub(super) deleted_bytes: u64,
    /// `deleted` as it was when the running checkpoint began (see
    /// `checkpoint_unresolved`; a put or a delete after it comes back with
    /// the replay).
    pub(super) checkpoint_deleted: Vec<Box<[u8]>>,
}

impl BlindSets {
    /// Empty sets for a tier whose index is sized for `index_keys`.
    pub(super) fn new(index_keys: u64) -> BlindSets {
        BlindSets {
            unresolved: hashbrown::HashSet::new(),
            unresolved_max: unresolved_max(index_keys),
            replaying: false,
            checkpoint_unresolved: Vec::new(),
            deleted: std::collections::HashSet::new(),
            deleted_bytes: 0,
            checkpoint_deleted: Vec::new(),
        }
    }

    /// RAM of the sets: the unresolved entries' table as allocated, the
    /// deleted keys with their boxes, and the copies a running checkpoint
    /// holds.
    pub(super) fn memory_bytes(&self) -> u64 {
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
    pub(super) fn unresolved_growth_bytes(&self, more: usize) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::BlindSets;

    /// `unresolved_growth_bytes` bounds what the sets' RAM grows by, for
    /// one entry more and for several, through a few doublings and with
    /// removals in between (which leave tombstones in the table).
    #[test]
    fn unresolved_growth_bounds_the_set_growth() {
        let mut sets = BlindSets::new(0);
        sets.unresolved_max = usize::MAX;
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
}
