//! The hybrid tier's garbage collection: the victim segment, and one
//! bounded step of copying its live records forward.

use super::*;

impl<D: Disk> Inner<D> {
    /// One GC step: picks a victim if none is in progress and garbage is
    /// over the bound, then rewrites the live records of the next
    /// [`GC_STEP_BLOCKS`] blocks of it. Returns whether it did anything.
    pub(super) fn gc_step(&mut self) -> bool {
        if self.faults.fault.is_some() {
            return false;
        }
        self.check_orphans();
        let (victim, from) = match self.gc.victim {
            Some(v) => v,
            None => match self.pick_victim() {
                Some(slot) => (slot, 0),
                None => return false,
            },
        };
        let read_before = self.log.bytes_read;
        let step = self.log.scan_from(victim, from, GC_STEP_BLOCKS);
        self.gc.bytes_read += self.log.bytes_read - read_before;
        let give_up = |st: &mut Self, e: &ReadError| {
            tracing::error!(error = %e, "hybrid tier GC could not read a segment or a record; the segment stays");
            // Do not pick it again and again.
            if let Some(seg) = st.log.segs[victim as usize].as_mut() {
                seg.total_bytes = seg.live_bytes;
            }
            st.gc.victim = None;
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
            if self.blind.unresolved.contains(&addr) {
                match self.superseded(addr, &r) {
                    Ok(true) => {
                        // An older version: its entry goes (its bytes
                        // were counted as garbage already).
                        self.drop_dead(h, addr, &r);
                        continue;
                    }
                    // The key's current record after all (two keys shared
                    // a tag): copied below, settled.
                    Ok(false) => {
                        self.blind.unresolved.remove(&addr);
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
            // The copy keeps the record's LSN (0: a version 1 record's
            // copy, whose write is not known).
            let lsn = r.lsn.unwrap_or(0);
            let (new, span) = match self.log.append(&r.key, &r.value, r.expires_at_ms, lsn) {
                Ok(a) => a,
                Err(e) => {
                    self.note_fault("write (GC)", &e);
                    return false;
                }
            };
            self.index.set(loc, new, span);
            self.gc.bytes_written += r.size;
            if let Some(seg) = self.log.segs[victim as usize].as_mut() {
                seg.live_bytes = seg.live_bytes.saturating_sub(r.size);
            }
            self.cache.rename(addr, new);
            if let Some(at) = r.expires_at_ms {
                self.expiring.remove(at, addr);
                self.expiring.insert(at, new);
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
            self.gc.victim = None;
            self.gc.runs += 1;
            self.prune_deleted();
        } else {
            self.gc.victim = Some((victim, next));
        }
        true
    }

    /// The sealed segment with the best cost-benefit score, if the garbage
    /// of the sealed segments is over `gc_garbage_percent`.
    pub(super) fn pick_victim(&self) -> Option<u32> {
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
}
