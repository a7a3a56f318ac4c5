//! The hybrid tier's writes: puts and deletes (reading or blind), the
//! unresolved entries and deleted keys blind writes leave, and the byte
//! counts they move.

use super::cold::CandState;
use super::cold::ColdCand;
use super::cold::ColdKey;
use super::cold::OpenSettle;
use super::cold::Where;
use super::index::Candidate;
use super::index::KeyHash;
use super::log;
use super::log::ReadError;
use super::log::Record;
use super::lookup::Lookup;
use super::Inner;
use crate::io::Disk;
use crate::tier::Presence;
use bytes::Bytes;
/// What a put found of its key's entries (see `Inner::put_candidates`).
struct PutCandidates<F> {
    /// The key's records in RAM.
    mine: Vec<(Candidate, Record)>,
    /// Entries it cannot tell: they stay, unresolved.
    unknown: Vec<Candidate>,
    /// Settling reads to queue for the unknown ones on the device.
    settle: Vec<ColdCand<F>>,
}

impl<D: Disk> Inner<D> {
    /// A record the index no longer points at. An unresolved one's bytes
    /// were counted as garbage when it became unresolved.
    pub(super) fn forget(&mut self, addr: u32, r: &Record) {
        if !self.blind.unresolved.remove(&addr) {
            if let Some(seg) = self.log.seg_of_mut(addr) {
                seg.live_bytes = seg.live_bytes.saturating_sub(r.size);
            }
        }
        self.cache.remove(addr);
        if let Some(at) = r.expires_at_ms {
            self.expiring.remove(at, addr);
        }
    }

    /// Removes the entry pointing at `addr` (found again: a spilled
    /// entry's place moves when another is removed).
    pub(super) fn remove_entry(&mut self, h: KeyHash, addr: u32) {
        if let Some(loc) = self.index.find_addr(h, addr) {
            self.index.remove(loc);
        }
    }

    pub(super) fn note_fault(&mut self, what: &str, e: &std::io::Error) {
        if self.faults.fault.is_none() {
            self.faults.fault = Some(format!(
                "value segment {what} in {} failed: {e}",
                self.log.dir().display()
            ));
        }
    }

    pub(super) fn check_orphans(&mut self) {
        if !self.loading.orphans_checked {
            self.loading.orphans_checked = true;
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
    /// none in RAM). `lsn`: the WAL record of the write, stored in the
    /// record.
    pub(super) fn put(
        &mut self,
        hash: u64,
        key: &[u8],
        value: &[u8],
        at: Option<u64>,
        lsn: u64,
    ) -> bool {
        self.check_orphans();
        let h = KeyHash::new(hash);
        let PutCandidates {
            mine,
            unknown,
            settle,
        } = self.put_candidates(h, key);
        let new = mine.is_empty();
        if self.faults.fault.is_some() {
            self.faults.unwritten.insert(key.into());
            return new;
        }
        let (addr, span) = match self.log.append(self.write_device(), key, value, at, lsn) {
            Ok(a) => a,
            Err(e) => {
                self.note_fault("write", &e);
                self.faults.unwritten.insert(key.into());
                return new;
            }
        };
        if !self.faults.unwritten.is_empty() {
            self.faults.unwritten.remove(key);
        }
        // Its entries left are dead; the new one is newer than all.
        let new = self.take_deleted(key) || new;
        if let Some(t) = at {
            self.expiring.insert(t, addr);
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
            if self.blind.unresolved.insert(c.addr) {
                // Most likely the key's older record: count it as garbage,
                // guessing its size from the new one (GC finds out).
                if let Some(seg) = self.log.seg_of_mut(c.addr) {
                    seg.live_bytes = seg.live_bytes.saturating_sub(size);
                }
            }
        }
        if !settle.is_empty() {
            let counted = Some(OpenSettle::new(&self.settling.settles_open));
            self.settling.settles.push(ColdKey {
                key: Bytes::copy_from_slice(key),
                hash,
                now_ms: self.now_ms,
                cands: settle.into(),
                failed: None,
                reads: 0,
                hot_reads: 0,
                bytes: 0,
                settle: true,
                background: true,
                best: None,
                counted,
            });
        }
        new
    }

    /// What a put finds of its key's entries: the records in RAM that are
    /// the key's, the candidates it cannot tell (they stay, unresolved),
    /// and, past the unresolved bound, the settling reads to queue for
    /// those on the device. With every settling read open, reads the
    /// candidates itself.
    fn put_candidates(&mut self, h: KeyHash, key: &[u8]) -> PutCandidates<D::File> {
        let mut mine: Vec<(Candidate, Record)> = Vec::new();
        let mut unknown: Vec<Candidate> = Vec::new();
        let mut settle: Vec<ColdCand<D::File>> = Vec::new();
        let full = !self.unresolved_room();
        if !full || self.settling.settles_open.get() < self.settling.settles_max {
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
                    self.faults.warn(
                        self.settings.shard,
                        "could not read a candidate record on write",
                        &e,
                    );
                    unknown = self.ordered_candidates(h);
                }
            }
        }
        PutCandidates {
            mine,
            unknown,
            settle,
        }
    }

    /// A delete: removes every entry of the key (the unresolved older ones
    /// too), reading the candidates that are not in RAM. Returns whether
    /// the key was there (expired or not), or why it could not be told.
    pub(super) fn delete(&mut self, hash: u64, key: &[u8]) -> Result<bool, ReadError> {
        self.faults.unwritten.remove(key);
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
    pub(super) fn delete_blind(&mut self, hash: u64, key: &[u8]) {
        if !self.faults.unwritten.is_empty() {
            self.faults.unwritten.remove(key);
        }
        if self.is_deleted(key) {
            return;
        }
        let allowed = self.settling.blind_allowed.take() == Some(hash);
        if !self.blind_room() && !allowed {
            if let Err(e) = self.delete(hash, key) {
                self.faults.warn(
                    self.settings.shard,
                    "delete could not read a candidate record; its key is deleted blind",
                    &e,
                );
            }
            return;
        }
        self.delete_unread(hash, key);
    }

    /// The work of a blind delete, whatever the sets' bound (see
    /// [`Inner::delete_blind`]).
    pub(super) fn delete_unread(&mut self, hash: u64, key: &[u8]) {
        if self.is_deleted(key) {
            return;
        }
        let h = KeyHash::new(hash);
        let mut mine: Vec<(Candidate, Record)> = Vec::new();
        let mut current_in_ram = false;
        let mut settled_unknown = Vec::new();
        let mut unresolved_unknown = false;
        // Settled entries whose record cannot be theirs (another partition
        // or tag): they dangle, and may have been the key's newest.
        let mut dangling = Vec::new();
        for c in self.ordered_candidates(h) {
            let settled = !self.blind.unresolved.contains(&c.addr);
            match self.where_is(&c) {
                Where::Ram(Ok(r)) if r.key == key => {
                    current_in_ram |= settled;
                    mine.push((c, r));
                }
                Where::Ram(Ok(r)) if self.check_dangling(h, c.addr, &r).is_ok() => {}
                Where::Ram(Ok(_)) if settled => dangling.push(c),
                Where::Ram(Ok(_)) => unresolved_unknown = true,
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
        // A dangling entry is left dead under `deleted`, whatever was found:
        // settled, it would read as an error for the key.
        for c in &dangling {
            self.blind.unresolved.insert(c.addr);
        }
        let mark = if current_in_ram {
            unresolved_unknown || !dangling.is_empty()
        } else {
            // Their bytes stay counted as live: most are other keys'
            // records; the answer's read settles this key's own.
            for c in &settled_unknown {
                self.blind.unresolved.insert(c.addr);
            }
            unresolved_unknown || !settled_unknown.is_empty() || !dangling.is_empty()
        };
        if mark {
            self.blind.deleted_bytes += key.len() as u64;
            self.blind.deleted.insert(key.into());
        }
    }

    /// Whether a delete may go without reading: room in both `unresolved`
    /// and `deleted` (a put needs room in `unresolved` only).
    pub(super) fn blind_room(&self) -> bool {
        self.unresolved_room()
            && (self.blind.replaying || self.blind.deleted.len() < self.blind.unresolved_max)
    }

    /// Whether a put may go without reading: room in `unresolved`. A WAL
    /// replay has room whatever the bound (it holds at most what the WAL
    /// since the checkpoint wrote): a replay that read every overwritten
    /// key's records took a minute at 100M keys.
    pub(super) fn unresolved_room(&self) -> bool {
        self.blind.replaying || self.blind.unresolved.len() < self.blind.unresolved_max
    }

    /// The answer of a blind delete read the key's record at `addr` (from
    /// before the delete, so dead now): its entry goes if it is still
    /// there. `counted`: its bytes still count as live (it was settled
    /// when the delete looked it up).
    pub(super) fn settle_deleted(&mut self, hash: u64, addr: u32, counted: bool, r: &Record) {
        let h = KeyHash::new(hash);
        if !self.blind.unresolved.contains(&addr) || self.index.find_addr(h, addr).is_none() {
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
    pub(super) fn drop_dead(&mut self, h: KeyHash, addr: u32, r: &Record) {
        self.blind.unresolved.remove(&addr);
        self.remove_entry(h, addr);
        self.cache.remove(addr);
        if let Some(at) = r.expires_at_ms {
            self.expiring.remove(at, addr);
        }
        self.undelete_if_settled(h, &r.key);
    }

    /// Takes `key` out of `deleted` once no unresolved entry shares its
    /// tag (none of its dead entries is left).
    pub(super) fn undelete_if_settled(&mut self, h: KeyHash, key: &[u8]) {
        if !self.is_deleted(key) {
            return;
        }
        let mut cands = Vec::new();
        self.index.candidates(h, &mut cands);
        if cands
            .iter()
            .all(|c| !self.blind.unresolved.contains(&c.addr))
        {
            self.take_deleted(key);
        }
    }

    /// Takes out of `deleted` every key none of whose dead entries is left
    /// (GC settled them one by one, and the last one settled may have been
    /// another key's that shares the tag). One index lookup per key.
    pub(super) fn prune_deleted(&mut self) {
        if self.blind.deleted.is_empty() {
            return;
        }
        let keys: Vec<Box<[u8]>> = self.blind.deleted.iter().cloned().collect();
        for k in keys {
            let h = self.key_hash(&k);
            self.undelete_if_settled(h, &k);
        }
    }

    /// Removes `key` from `deleted`; returns whether it was there.
    pub(super) fn take_deleted(&mut self, key: &[u8]) -> bool {
        let was = !self.blind.deleted.is_empty() && self.blind.deleted.remove(key);
        if was {
            self.blind.deleted_bytes -= key.len() as u64;
        }
        was
    }
    /// Tells from RAM when it can (a key deleted blind is absent; a
    /// candidate in RAM that matches answers); otherwise the answer is
    /// read like a cold GET's, after the delete was applied blind. With
    /// `deleted` or `unresolved` full that read counts among the settling
    /// reads ([`SETTLES_MAX`]); past those, the delete reads now, blocking.
    /// `Err`: the key whose answer is to read.
    pub(super) fn delete_lookup(
        &mut self,
        hash: u64,
        key: &[u8],
    ) -> Result<Presence, Box<ColdKey<D::File>>> {
        // Past the sets' bound the delete still goes blind while settling
        // reads have room: its answer's read settles what it leaves.
        let past_bound = !self.blind_room();
        let found = if !past_bound || self.settling.settles_open.get() < self.settling.settles_max {
            match self.lookup(hash, key) {
                Lookup::Found(r) => r,
                Lookup::Failed(e) => {
                    self.note_read_error(key, &e.to_string());
                    None
                }
                Lookup::Cold(mut ck) => {
                    ck.settle = true;
                    if past_bound {
                        ck.counted = Some(OpenSettle::new(&self.settling.settles_open));
                        self.settling.blind_allowed = Some(hash);
                    }
                    return Err(Box::new(ck));
                }
            }
        } else {
            self.find_for_read(hash, key)
        };
        Ok(match found {
            None => Presence::Absent,
            Some(r) if self.live(&r) => Presence::Live,
            Some(_) => Presence::Expired,
        })
    }
}
