//! The hybrid tier's garbage collection: the victim segment, and one
//! bounded step of copying its live records forward; and the settling
//! scan that brings an overfull unresolved set back within its bound.

use super::index::KeyHash;
use super::log;
use super::log::ReadError;
use super::log::Record;
use super::log::SegState;
use super::Inner;
use crate::io::Disk;
/// Where a settling scan is (`settle_step`).
#[derive(Clone, Copy)]
pub(super) struct SettleScan {
    pub(super) slot: u32,
    pub(super) seq: u64,
    /// Where the scan goes on.
    pub(super) from: u64,
    /// Where it stops: the segment's end when the scan began (the active
    /// segment grows meanwhile; what is appended after, the scan leaves).
    pub(super) until: u64,
}

/// Garbage collection's place and counters.
#[derive(Default)]
pub(super) struct GcState {
    pub(super) runs: u64,
    pub(super) bytes_read: u64,
    pub(super) bytes_written: u64,
    /// The segment GC is working through, and where it goes on.
    pub(super) victim: Option<(u32, u64)>,
    /// The segment a settling scan is working through (`settle_step`).
    pub(super) settling: Option<SettleScan>,
    /// Sequence numbers of the segments settling scans went through since
    /// the unresolved set was last within its bound: each is scanned once
    /// (what it could not settle, a later scan would not either).
    pub(super) settled_segments: Vec<u64>,
    /// Set when the round of settling scans went through every segment
    /// holding unresolved entries: the log's next segment number then.
    /// Until the set is back within its bound, a scan starts again only
    /// for a segment started since (looking for one counts the whole set).
    pub(super) settle_round_ended: Option<u64>,
    /// Sequence numbers of the segments GC gave up on (a read failed):
    /// eviction from the hot device passes them by too.
    pub(super) gave_up: Vec<u64>,
    /// Whether the running checkpoint is a full one (not a delta).
    pub(super) checkpoint_full: bool,
    /// (epoch, full) of the checkpoints published since this tier was
    /// made, oldest first, from the full one the second newest builds on:
    /// the snapshots kept (`snapshot::retained`) as far as this tier
    /// knows. Snapshots from before a restart are not in it.
    pub(super) published: Vec<(u64, bool)>,
}

/// Blocks one GC step reads (256 KiB): the longest the shard pauses for GC
/// is about one read of this size plus rewriting its live records.
pub(super) const GC_STEP_BLOCKS: u64 = 64;

/// The epoch of the oldest snapshot kept, from the checkpoints published
/// (`(epoch, full)`, oldest first): the full snapshot the second newest
/// builds on. `None` when that is not known (it was written before this
/// tier was made: recovery may still load it). Drops the entries older
/// than it.
pub(super) fn oldest_kept_epoch(published: &mut Vec<(u64, bool)>) -> Option<u64> {
    let second = published.len().checked_sub(2)?;
    let start = published[..=second].iter().rposition(|&(_, full)| full)?;
    published.drain(..start);
    Some(published[0].0)
}

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
            None => match self.pick_hot_victim().or_else(|| self.pick_victim()) {
                Some(slot) => (slot, 0),
                None => return false,
            },
        };
        let from_device = self.log.segs[victim as usize]
            .as_ref()
            .map_or(log::MAIN, |s| s.device);
        // A hot segment's records move between devices: the step waits
        // for the moves' share of both (it is remembered as the victim).
        if from_device == log::HOT {
            self.gc.victim = Some((victim, from));
            let end = self.log.segs[victim as usize]
                .as_ref()
                .map_or(from, |s| s.end);
            let len = (GC_STEP_BLOCKS * log::BLOCK as u64)
                .min(end.saturating_sub(from))
                .max(1);
            if !self.gc_move_allowed(len) {
                return false;
            }
        }
        let read_before = self.log.bytes_read;
        let step = self.log.scan_from(victim, from, GC_STEP_BLOCKS);
        self.gc.bytes_read += self.log.bytes_read - read_before;
        let give_up = |st: &mut Self, e: &ReadError| {
            tracing::error!(error = %e, "hybrid tier GC could not read a segment or a record; the segment stays");
            // Do not pick it again and again.
            if let Some(seg) = st.log.segs[victim as usize].as_mut() {
                seg.total_bytes = seg.live_bytes;
                st.gc.gave_up.push(seg.seq);
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
                match self.settle_unresolved(h, addr, &r) {
                    // An older version: its entry went (its bytes were
                    // counted as garbage already).
                    Ok(true) => continue,
                    // The key's current record: copied below.
                    Ok(false) => {}
                    Err(e) => {
                        give_up(self, &e);
                        return false;
                    }
                }
            }
            let to = self.gc_target(from_device, &r);
            if !self.move_record(h, addr, &r, to, "write (GC)") {
                if self.faults.fault.is_some() {
                    return false;
                }
                continue;
            }
            self.gc.bytes_written += r.size;
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
            self.index.unspill();
        } else {
            self.gc.victim = Some((victim, next));
        }
        true
    }

    /// One step of settling the unresolved set when it is far over its
    /// bound (twice it; then until it is back within it):
    /// a WAL replay's writes are all blind and not bounded, so after a
    /// restart the set (and the index entries it names) can hold tens of
    /// bytes of RAM per key, which GC alone would settle only as it comes
    /// to their segments. The step reads the next [`GC_STEP_BLOCKS`]
    /// blocks of the segment holding the most unresolved entries (the
    /// active one included, up to where it ended when the scan of it
    /// began) and settles each unresolved record there as GC does, without
    /// copying anything: an older version's entry goes, another key's
    /// current record leaves the set (its bytes counted live again).
    /// Returns whether it did anything.
    pub(super) fn settle_step(&mut self) -> bool {
        if self.faults.fault.is_some() || self.blind.replaying {
            return false;
        }
        let (len, max) = (self.blind.unresolved.len(), self.blind.unresolved_max);
        if len <= max {
            self.gc.settling = None;
            if !self.gc.settled_segments.is_empty() {
                self.gc.settled_segments.clear();
                if self.gc.settle_round_ended.take().is_none() {
                    self.settle_round_done();
                }
            }
            return false;
        }
        let scan = match self.gc.settling {
            Some(s) => s,
            // Every segment was scanned and none was started since: what
            // is left, a scan cannot settle (GC will, as it comes to those
            // segments). A segment started since is looked at.
            None if self.gc.settle_round_ended == Some(self.log.next_seq) => return false,
            // In service PUTs keep the set near its bound (each past it
            // queues a settling read): scans start only far past it.
            None if len <= max.saturating_mul(2) && self.gc.settled_segments.is_empty() => {
                return false
            }
            None => match self.settle_victim() {
                Some(s) => s,
                None => {
                    if self.gc.settle_round_ended.is_none() {
                        self.settle_round_done();
                    }
                    self.gc.settle_round_ended = Some(self.log.next_seq);
                    return false;
                }
            },
        };
        let SettleScan {
            slot,
            seq,
            from,
            until,
        } = scan;
        // GC may have emptied the segment since (its slot may hold a new
        // one): what was unresolved there, GC settled.
        let seg = self.log.segs.get(slot as usize).and_then(|s| s.as_ref());
        if !seg
            .is_some_and(|s| s.seq == seq && matches!(s.state, SegState::Sealed | SegState::Active))
        {
            self.gc.settling = None;
            return true;
        }
        let read_before = self.log.bytes_read;
        let step = self.log.scan_from(slot, from, GC_STEP_BLOCKS);
        self.gc.bytes_read += self.log.bytes_read - read_before;
        let (records, next) = match step {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "hybrid tier: a settling scan could not read a segment or a record; its unresolved entries stay for GC");
                self.gc.settling = None;
                return true;
            }
        };
        for (addr, r) in records {
            if !self.blind.unresolved.contains(&addr) {
                continue;
            }
            let h = self.key_hash(&r.key);
            // An entry of another tag at this address dangles: left to GC.
            if self.index.find_addr(h, addr).is_none() {
                continue;
            }
            match self.settle_unresolved(h, addr, &r) {
                Ok(true) => {}
                Ok(false) => {
                    if let Some(seg) = self.log.seg_of_mut(addr) {
                        seg.live_bytes = (seg.live_bytes + r.size).min(seg.total_bytes);
                    }
                }
                // A newer candidate could not be read: this one stays
                // unresolved (GC gives up on it the same way).
                Err(e) => {
                    self.faults.warn(
                        self.settings.shard,
                        "a settling scan could not read a newer candidate; the entry stays unresolved",
                        &e,
                    );
                }
            }
        }
        if next >= until {
            self.gc.settling = None;
            self.prune_deleted();
            self.index.unspill();
        } else {
            self.gc.settling = Some(SettleScan { from: next, ..scan });
        }
        true
    }

    /// Settles the unresolved record `r` at `addr` (its key's hash `h`,
    /// whose entry points at it) as a scan meets it: if a newer record of
    /// its key exists, the entry goes and this returns true; else it is
    /// its key's current record (two keys shared a tag) and leaves the
    /// set. A candidate that cannot be read leaves everything as it was.
    fn settle_unresolved(&mut self, h: KeyHash, addr: u32, r: &Record) -> Result<bool, ReadError> {
        let dead = self.superseded(addr, r)?;
        if dead {
            self.drop_dead(h, addr, r);
        } else {
            self.blind.unresolved.remove(&addr);
        }
        Ok(dead)
    }

    /// The end of a round of settling scans: what they freed goes back,
    /// the sets' tables shrink, and the allocator returns its free pages
    /// to the kernel (glibc keeps freed memory for reuse: after the sets
    /// and spilled entries a replay left on 10M keys, 28 B per key).
    fn settle_round_done(&mut self) {
        self.shrink_blind_sets();
        let moved = self.index.unspill();
        let released = release_free_memory();
        tracing::info!(
            shard = self.settings.shard,
            unresolved = self.blind.unresolved.len(),
            deleted_keys = self.blind.deleted.len(),
            spilled_moved = moved,
            released,
            "hybrid tier: settling scans done"
        );
    }

    /// The segment (not scanned yet this round) holding the most
    /// unresolved entries, and its first one's offset; recorded as
    /// scanned. The active segment is one of them: a replay that stayed
    /// in it (a store smaller than a segment) leaves every older version
    /// there, and neither GC nor a seal would come to it soon.
    fn settle_victim(&mut self) -> Option<SettleScan> {
        let mut per_slot = std::collections::HashMap::<u32, (usize, u64)>::new();
        for &addr in &self.blind.unresolved {
            let a = self.log.decode_addr(addr);
            let e = per_slot.entry(a.slot).or_insert((0, u64::MAX));
            e.0 += 1;
            e.1 = e.1.min(a.offset);
        }
        let (slot, (_, from)) = per_slot
            .into_iter()
            .filter(|&(slot, _)| {
                self.log
                    .segs
                    .get(slot as usize)
                    .and_then(|s| s.as_ref())
                    .is_some_and(|s| {
                        matches!(s.state, SegState::Sealed | SegState::Active)
                            && !self.gc.settled_segments.contains(&s.seq)
                    })
            })
            .max_by_key(|&(slot, (n, _))| (n, std::cmp::Reverse(slot)))?;
        let seg = self.log.segs.get(slot as usize)?.as_ref()?;
        let scan = SettleScan {
            slot,
            seq: seg.seq,
            from,
            until: seg.end,
        };
        self.gc.settled_segments.push(scan.seq);
        self.gc.settling = Some(scan);
        Some(scan)
    }

    /// Gives back the tables of the unresolved set and of the deleted
    /// keys once settling left them mostly empty (a table keeps its size
    /// when entries leave).
    fn shrink_blind_sets(&mut self) {
        let set = &mut self.blind.unresolved;
        if set.len() < set.capacity() / 4 {
            set.shrink_to(set.len() * 2);
        }
        let deleted = &mut self.blind.deleted;
        if deleted.len() < deleted.capacity() / 4 {
            deleted.shrink_to(deleted.len() * 2);
        }
    }

    /// The sealed segment with the best cost-benefit score, if the garbage
    /// of the sealed segments is over `gc_garbage_percent`.
    pub(super) fn pick_victim(&self) -> Option<u32> {
        let (mut total, mut live) = (0u64, 0u64);
        let mut best: Option<(f64, u32)> = None;
        let next_seq = self.log.next_seq;
        for (slot, seg) in self.log.segs.iter().enumerate() {
            let Some(seg) = seg else { continue };
            if seg.state != SegState::Sealed {
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

/// Asks the allocator to give its free pages back to the kernel; whether
/// it could. glibc only: other allocators return memory their own way.
fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes no pointer and only walks the
        // allocator's own free lists, under its own locks.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
