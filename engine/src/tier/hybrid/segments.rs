//! The hybrid tier's segment table in a checkpoint: encoded, loaded, and
//! checked against the segments on disk (zombies and removed segments).

use super::checkpoint::SEGMENT_ROW_BYTES;
use super::log::SegState;
use super::Inner;
use crate::io::Disk;
impl<D: Disk> Inner<D> {
    pub(super) fn encode_segments(&self) -> Vec<u8> {
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
    pub(super) fn reopen_zombies_in_use(&mut self) {
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
    /// sequence) of the emptied segments it lists that are gone. Others
    /// that are gone are listed in `loading.missing` (slot, sequence, end),
    /// those opened in `loading.loaded`, for the checks of `damage`.
    pub(super) fn load_segments(&mut self, bytes: &[u8]) -> Result<Vec<(u32, u64)>, String> {
        const ROW: usize = SEGMENT_ROW_BYTES;
        if !bytes.len().is_multiple_of(ROW) {
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
                // no snapshot kept is older than its GC, and the newest of
                // those still lists it; none points into it (a chain that
                // was not kept, or one from before that rule, may: see
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
            if !self.log.segment_exists(seq) {
                self.loading.missing.push((slot, seq, end));
                continue;
            }
            self.log
                .open_existing(slot, seq, end, total, state)
                .map_err(|e| e.to_string())?;
            if let Some(seg) = self.log.segs[slot as usize].as_mut() {
                seg.live_bytes = live;
            }
            self.loading.loaded.push((slot, seq, end));
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
    pub(super) fn check_removed_segments(&self, gone: &[(u32, u64)]) -> Result<(), String> {
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
