//! The hybrid tier's checkpoints: what a checkpoint writes (the index in
//! chunks, the segment table, the expiry list, the unresolved entries and
//! the keys deleted blind; never the values), what publishing one lets GC
//! remove, and loading a chain of them back at recovery.

use super::damage::SegmentDamage;
use super::gc::oldest_kept_epoch;
use super::index::Index;
use super::log::SegState;
use super::Inner;
use crate::io::Disk;
use crate::tier::CheckpointVisitor;
pub(super) const KEY_LAYOUT: &[u8] = b"\0hybrid/layout";
pub(super) const KEY_INDEX: &[u8] = b"\0hybrid/index/";
pub(super) const KEY_SEGMENTS: &[u8] = b"\0hybrid/segments";
pub(super) const KEY_EXPIRING: &[u8] = b"\0hybrid/expiring/";
pub(super) const KEY_UNRESOLVED: &[u8] = b"\0hybrid/unresolved/";
pub(super) const KEY_DELETED: &[u8] = b"\0hybrid/deleted/";
/// 2: checkpoints may list unresolved entries (version 1 has none).
/// 3: checkpoints may list deleted keys (versions 1 and 2 have none).
pub(super) const LAYOUT_VERSION: u32 = 3;
/// Buckets per index chunk in a checkpoint (~400 KB).
pub(super) const CHECKPOINT_BUCKETS: usize = 8192;
/// Expiry entries per checkpoint chunk.
pub(super) const EXPIRING_CHUNK: usize = 32 * 1024;
/// Bytes of deleted keys per checkpoint chunk.
pub(super) const DELETED_CHUNK_BYTES: usize = 256 * 1024;

/// Recovery's progress through a checkpoint chain.
#[derive(Default)]
pub(super) struct LoadState {
    /// Segment files not checked against the loaded checkpoint yet.
    pub(super) orphans_checked: bool,
    /// A checkpoint's layout entry was loaded (recovery): the index has
    /// the size a delta loaded over it must have.
    pub(super) layout_loaded: bool,
    /// The segment table of the checkpoint file loaded last, opened once
    /// the whole chain is loaded (`load_checkpoint_done`).
    pub(super) pending_segments: Option<Vec<u8>>,
    /// The segments that table opened, and those it lists that are gone
    /// (not emptied by GC): (slot, sequence, end). Checked against their
    /// files once recovery is done (`damage`).
    pub(super) loaded: Vec<(u32, u64, u64)>,
    pub(super) missing: Vec<(u32, u64, u64)>,
    /// The damaged segments that check found (reported once, at the start).
    pub(super) damage: Vec<SegmentDamage>,
}

/// Bytes of one row of a checkpoint's segment table.
pub(super) const SEGMENT_ROW_BYTES: usize = 4 + 8 * 4 + 2 + 8;

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

impl<D: Disk> Inner<D> {
    pub(super) fn checkpoint_begin(&mut self) {
        self.epoch += 1;
        self.blind.checkpoint_unresolved = self.blind.unresolved.iter().copied().collect();
        self.blind.checkpoint_deleted = self.blind.deleted.iter().cloned().collect();
        self.checkpoint_expiring_moved = Some(Vec::new());
    }

    pub(super) fn checkpoint_partition(
        &mut self,
        partition: usize,
        delta: bool,
        f: &mut CheckpointVisitor<'_>,
    ) {
        self.gc.checkpoint_full = !delta;
        if partition == 0 {
            let mut layout = Vec::new();
            layout.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
            layout.extend_from_slice(&(self.index.buckets_per_partition() as u64).to_le_bytes());
            layout.extend_from_slice(&self.settings.segment_bytes.to_le_bytes());
            layout.extend_from_slice(&self.epoch.to_le_bytes());
            f(KEY_LAYOUT, Some(&layout), None);
        }
        let chunks = if delta {
            self.index.encode_changed(partition, CHECKPOINT_BUCKETS)
        } else {
            self.index.encode_partition(partition, CHECKPOINT_BUCKETS)
        };
        for (first, bytes) in chunks {
            let mut key = KEY_INDEX.to_vec();
            key.extend_from_slice(&(partition as u32).to_le_bytes());
            key.extend_from_slice(&first.to_le_bytes());
            f(&key, Some(&bytes), None);
        }
    }

    pub(super) fn checkpoint_finish(
        &mut self,
        f: &mut CheckpointVisitor<'_>,
    ) -> Result<(), String> {
        self.check_orphans();
        if let Err(e) = self.log.flush() {
            self.note_fault("fdatasync", &e);
            return Err(format!("value segments could not be made durable: {e}"));
        }
        f(KEY_SEGMENTS, Some(&self.encode_segments()), None);
        // The list and the pairs moved away during the checkpoint, merged
        // in order a chunk at a time (no copy of the whole list).
        let mut moved = self.checkpoint_expiring_moved.take().unwrap_or_default();
        moved.sort_unstable();
        let mut pairs = merge_sorted(self.expiring.iter(), moved.into_iter()).peekable();
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
        let unresolved = std::mem::take(&mut self.blind.checkpoint_unresolved);
        for (i, chunk) in unresolved.chunks(EXPIRING_CHUNK).enumerate() {
            let mut key = KEY_UNRESOLVED.to_vec();
            key.extend_from_slice(&(i as u32).to_le_bytes());
            let v: Vec<u8> = chunk.iter().flat_map(|a| a.to_le_bytes()).collect();
            f(&key, Some(&v), None);
        }
        // So are the keys deleted blind: without them their dead entries
        // would read as current.
        let deleted = std::mem::take(&mut self.blind.checkpoint_deleted);
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

    /// A segment GC emptied goes once two checkpoints that started after
    /// its GC are published and no snapshot kept is older than its GC:
    /// the chains of the two newest snapshots are kept, and a recovery
    /// whose newer files are damaged may load any of them, so a delta
    /// chain whose full snapshot was copied before the GC can point into
    /// it until a newer full snapshot and one more replace that chain.
    pub(super) fn checkpoint_published(&mut self) {
        let epoch = self.epoch;
        self.gc.published.push((epoch, self.gc.checkpoint_full));
        let oldest_kept = oldest_kept_epoch(&mut self.gc.published);
        let mut gone = Vec::new();
        for (slot, seg) in self.log.segs.iter_mut().enumerate() {
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
            let log = &self.log;
            self.blind
                .unresolved
                .retain(|&a| log.decode_addr(a).slot != slot);
            if let Err(e) = self.log.remove(slot) {
                tracing::warn!(error = %e, "could not remove a value segment emptied by GC");
            }
        }
        // A hot device emptied (`hot_bytes = 0`): the folder no longer
        // needs it to start.
        if removed_any && self.log.has_hot() {
            if let Err(e) = self.log.unmark_hot_if_empty() {
                tracing::warn!(error = %e, "could not remove the hot-device marker");
            }
        }
    }

    /// A delta carries the segment table, the expiry list and the
    /// unresolved and deleted lists whole: those loaded before it go. Its
    /// index chunks are loaded over the index loaded so far. (The segment
    /// table is only kept until the chain is loaded: an older file's table
    /// may list segments removed since.)
    pub(super) fn load_begin(&mut self, delta: bool) -> Result<(), String> {
        if !delta {
            return Ok(());
        }
        if !self.loading.layout_loaded {
            return Err("a delta checkpoint with no full checkpoint before it".into());
        }
        self.expiring.clear();
        self.blind.unresolved.clear();
        self.blind.deleted.clear();
        self.blind.deleted_bytes = 0;
        Ok(())
    }

    pub(super) fn load_entry(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
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
            if seg_bytes != self.settings.segment_bytes {
                return Err(format!(
                    "the checkpoint's value segments are {seg_bytes} bytes; storage.value_segment_size is {} (it cannot change on an existing data directory)",
                    self.settings.segment_bytes
                ));
            }
            if buckets == 0 || buckets > u32::MAX as u64 {
                return Err(format!("hybrid index of {buckets} buckets per partition"));
            }
            if buckets as usize != self.index.buckets_per_partition() {
                if self.loading.layout_loaded {
                    return Err(format!(
                        "a delta checkpoint of {buckets} buckets per partition over one of {}",
                        self.index.buckets_per_partition()
                    ));
                }
                // Loaded at the size it was written with; `recovery_done`
                // resizes it to `index_keys` (see `resize`).
                self.index = Index::with_buckets(buckets as usize);
            }
            self.loading.layout_loaded = true;
            return Ok(());
        }
        if let Some(rest) = key.strip_prefix(KEY_INDEX) {
            if rest.len() != 8 {
                return Err("index chunk key of the wrong size".into());
            }
            let part = u32::from_le_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
            let first = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
            return self.index.decode_chunk(part, first, value);
        }
        if key == KEY_SEGMENTS {
            if !value.len().is_multiple_of(SEGMENT_ROW_BYTES) {
                return Err(format!("segment table of {} bytes", value.len()));
            }
            self.loading.pending_segments = Some(value.to_vec());
            return Ok(());
        }
        if key.starts_with(KEY_UNRESOLVED) {
            if !value.len().is_multiple_of(4) {
                return Err("unresolved-entry chunk of the wrong size".into());
            }
            self.blind.unresolved.extend(
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
                if self.blind.deleted.insert(k.into()) {
                    self.blind.deleted_bytes += k.len() as u64;
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
                self.expiring.insert(at, addr);
            }
            return Ok(());
        }
        Err(format!(
            "entry {:?} is not part of a hybrid checkpoint (was this directory written by the memory tier?)",
            String::from_utf8_lossy(&key[..key.len().min(32)])
        ))
    }

    pub(super) fn load_done(&mut self) -> Result<(), String> {
        let gone = match self.loading.pending_segments.take() {
            Some(table) => self.load_segments(&table)?,
            None => Vec::new(),
        };
        self.check_removed_segments(&gone)?;
        // A segment file that is gone is refused, not served as damage: a
        // folder or device that is not the one the data was written to
        // (a mount missing, a wrong value_device) looks just like it, and
        // a start would then write new segments beside nothing. Recovery
        // takes an older snapshot the WAL still covers if there is one.
        let missing = std::mem::take(&mut self.loading.missing);
        if !missing.is_empty() {
            return Err(self.missing_reason(&missing));
        }
        Ok(())
    }

    pub(super) fn recovery_done(&mut self) {
        self.blind.replaying = false;
        self.check_orphans();
        self.check_loaded_segments();
        self.resize_index();
        self.reopen_zombies_in_use();
        self.forget_hot_use();
        // A checkpoint lists the entries unresolved when it began; some of
        // them may be gone from the index copied after (GC settled them).
        // An address no entry holds must not stay listed: a record written
        // there later would be taken for an older version.
        if !self.blind.unresolved.is_empty() {
            let mut present = hashbrown::HashSet::new();
            let unresolved = &self.blind.unresolved;
            self.index.for_each_addr(|a| {
                if unresolved.contains(&a) {
                    present.insert(a);
                }
            });
            self.blind.unresolved = present;
        }
        // A key deleted blind whose dead entries are all gone need not
        // stay listed.
        self.prune_deleted();
    }
}
