//! The hybrid tier's lookups: the candidates of a key in the index, in
//! order, the records they point at (cache, unwritten tail or device), and
//! the cold GETs that finish once their reads are back.

use super::cold::CandState;
use super::cold::ColdCand;
use super::cold::ColdKey;
use super::cold::Where;
use super::index::Candidate;
use super::index::KeyHash;
use super::log::ReadError;
use super::log::Record;
use super::Inner;
use crate::io::Disk;
use crate::tier::EntryVisitor;
use bytes::Bytes;
use std::collections::VecDeque;
/// What a lookup found.
pub(super) enum Lookup<F> {
    /// The record, from RAM (or none).
    Found(Option<Record>),
    /// No candidate matched and one could not be read.
    Failed(ReadError),
    /// Candidates to read from the device.
    Cold(ColdKey<F>),
}

impl<D: Disk> Inner<D> {
    /// The index hash of `key` (recomputed from a record's key).
    pub(super) fn key_hash(&self, key: &[u8]) -> KeyHash {
        KeyHash::new(self.hasher.hash_key(key))
    }

    /// Whether the record `r` at `addr`, reached through an entry of
    /// `partition`, is that entry's: its key falls in the partition and
    /// an entry of its own points at it.
    pub(super) fn own_entry(&self, partition: usize, addr: u32, r: &Record) -> bool {
        let h = self.key_hash(&r.key);
        h.partition() == partition && self.index.find_addr(h, addr).is_some()
    }

    /// The record at a candidate: cache first, then the log (RAM tail or
    /// device), which fills the cache.
    pub(super) fn record(&mut self, c: &Candidate) -> Result<Record, ReadError> {
        if let Some(r) = self.cache.get(c.addr) {
            return Ok(r);
        }
        self.read_into_cache(c)
    }

    /// Reads the record at a candidate (RAM tail, recent blocks or a
    /// blocking device read) and caches it.
    pub(super) fn read_into_cache(&mut self, c: &Candidate) -> Result<Record, ReadError> {
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
    pub(super) fn where_is(&mut self, c: &Candidate) -> Where<D::File> {
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
    pub(super) fn record_for_walk(&mut self, addr: u32, span: u8) -> Result<Record, ReadError> {
        match self.cache.peek(addr) {
            Some(r) => Ok(r.clone()),
            None => self.log.read(addr, span),
        }
    }

    /// Whether the place of two records orders them (newer segment and
    /// offset, newer record): with one device, appends go to one segment
    /// at a time; with a hot device, two segments are appended to side by
    /// side.
    pub(super) fn place_orders(&self) -> bool {
        !self.log.has_hot()
    }

    /// How recent the record at `addr` is: (segment sequence, offset).
    /// Appends (writes and GC's copies) always go to the newest place.
    pub(super) fn age(&self, addr: u32) -> (u64, u64) {
        let a = self.log.decode_addr(addr);
        (self.log.seq_of_slot(a.slot).unwrap_or(0), a.offset)
    }

    /// Whether record `a` (at `a_addr`) is a newer version of its key
    /// than record `b` (at `b_addr`, same key): by the LSNs of the writes
    /// that made them when both carry one and they differ. A record
    /// without an LSN (of a version 1 segment, or a copy of one) is older
    /// than any with one: every write that carries an LSN came after the
    /// data directory's last version 1 record. Two without an LSN, or the
    /// same write's record twice (a WAL replay writes a record again),
    /// go by place, the newer segment and offset being the newer: version
    /// 1 records never leave the main device, whose appends go to one
    /// segment at a time in sequence order (with a hot device, the two
    /// devices' active segments are appended to side by side, so place
    /// alone does not order records across them).
    pub(super) fn is_newer(&self, a_addr: u32, a: &Record, b_addr: u32, b: &Record) -> bool {
        match (a.lsn, b.lsn) {
            (Some(x), Some(y)) if x != y => x > y,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            _ => self.age(a_addr) > self.age(b_addr),
        }
    }

    /// The entries whose tag matches `h`, in the order reads try them: the
    /// settled ones first (a key has at most one settled entry, its newest
    /// record, so any order will do), then the unresolved ones, newest
    /// place first (the order saves reads: which record of the key is
    /// newest is decided by [`Inner::is_newer`]).
    pub(super) fn ordered_candidates(&self, h: KeyHash) -> Vec<Candidate> {
        let mut cands = Vec::new();
        self.index.candidates(h, &mut cands);
        if !self.blind.unresolved.is_empty() && cands.len() > 1 {
            cands.sort_by_key(|c| {
                if self.blind.unresolved.contains(&c.addr) {
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
    pub(super) fn find(
        &mut self,
        h: KeyHash,
        key: &[u8],
    ) -> Result<Option<(Candidate, Record)>, ReadError> {
        self.check_written(key)?;
        if self.is_deleted(key) {
            return Ok(None);
        }
        self.find_entry(h, key)
    }

    /// `Err` if `key`'s newest put never reached the segments (its entries
    /// are older than what was acknowledged or logged).
    pub(super) fn check_written(&self, key: &[u8]) -> Result<(), ReadError> {
        if !self.faults.unwritten.is_empty() && self.faults.unwritten.contains(key) {
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
    pub(super) fn check_dangling(
        &self,
        h: KeyHash,
        addr: u32,
        r: &Record,
    ) -> Result<(), ReadError> {
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
    pub(super) fn find_entry(
        &mut self,
        h: KeyHash,
        key: &[u8],
    ) -> Result<Option<(Candidate, Record)>, ReadError> {
        let mut failed = None;
        let mut best: Option<(Candidate, Record)> = None;
        for c in self.ordered_candidates(h) {
            match self.record(&c) {
                Ok(r) if r.key == key => {
                    if !self.blind.unresolved.contains(&c.addr) {
                        // Settled: the key's newest record.
                        return Ok(Some((c, r)));
                    }
                    // An unresolved entry is the key's current record only
                    // if no entry tried before it is: one that could not
                    // be read may be. Of the unresolved ones, the newest.
                    if best.is_none() {
                        if let Some(e) = failed {
                            return Err(e);
                        }
                    }
                    let newer = best
                        .as_ref()
                        .is_none_or(|(b, br)| self.is_newer(c.addr, &r, b.addr, br));
                    if newer {
                        best = Some((c, r));
                    }
                }
                Ok(r) => {
                    if let Err(e) = self.check_dangling(h, c.addr, &r) {
                        failed = failed.or(Some(e));
                    }
                }
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        // A candidate that failed after the newest found (at an older
        // place) is taken for older: its LSN is not known. (With a hot
        // device place does not order records: the read fails.)
        match (best, failed) {
            (Some(_), Some(e)) if !self.place_orders() => Err(e),
            (Some(found), _) => Ok(Some(found)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(None),
        }
    }

    /// Every entry of `key` (its newest first: the one that counts), for a
    /// delete, which must leave none behind. `Err` if a candidate that may
    /// hold the key could not be read.
    pub(super) fn find_all(
        &mut self,
        h: KeyHash,
        key: &[u8],
    ) -> Result<Vec<(Candidate, Record)>, ReadError> {
        let mut found = Vec::new();
        if self.is_deleted(key) {
            // Every entry of it is dead already.
            return Ok(found);
        }
        let mut failed = None;
        for c in self.ordered_candidates(h) {
            match self.record(&c) {
                Ok(r) if r.key == key => found.push((c, r)),
                // A record that cannot be the entry's: the entry dangles,
                // and may have been the key's.
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
            None => Ok(found),
        }
    }

    /// Whether `key` was deleted blind since its last put: then it has no
    /// settled entry, and every unresolved one is dead.
    pub(super) fn is_deleted(&self, key: &[u8]) -> bool {
        !self.blind.deleted.is_empty() && self.blind.deleted.contains(key)
    }

    /// Whether the record `r` at `addr` (an unresolved entry) is an older
    /// version of its key: another record of the key is newer
    /// ([`Inner::is_newer`]), or the key was deleted since. The key's
    /// records at older places are read too (an LSN, not the place,
    /// decides; and a record without one is older than any with one).
    /// `Err` when a candidate at a newer place cannot be read or dangles
    /// (it may be the key's, and its LSN is unknown); one at an older place
    /// that cannot be read is taken for older, unless a hot device is set
    /// (then place does not order records, and any such candidate is an
    /// `Err`).
    pub(super) fn superseded(&mut self, addr: u32, r: &Record) -> Result<bool, ReadError> {
        if self.is_deleted(&r.key) {
            return Ok(true);
        }
        let h = self.key_hash(&r.key);
        let age = self.age(addr);
        for c in self.ordered_candidates(h) {
            let newer_place = self.age(c.addr) > age || !self.place_orders();
            if c.addr == addr {
                continue;
            }
            let other = match self.record(&c) {
                Ok(other) => other,
                Err(e) if newer_place => return Err(e),
                Err(_) => continue,
            };
            if other.key == r.key {
                if self.is_newer(c.addr, &other, addr, r) {
                    return Ok(true);
                }
                continue;
            }
            // A newer entry that dangles may have been the key's: whether
            // this record is superseded cannot be told.
            if newer_place {
                self.check_dangling(h, c.addr, &other)?;
            }
        }
        Ok(false)
    }

    /// For a walk: whether a record the index points at is its key's
    /// current one (not an unresolved older version).
    pub(super) fn current(&mut self, addr: u32, r: &Record) -> Result<bool, ReadError> {
        if !self.blind.unresolved.contains(&addr) {
            return Ok(true);
        }
        Ok(!self.superseded(addr, r)?)
    }

    /// `find` for a read: a failure is kept for `take_read_errors` and
    /// answers as absent.
    pub(super) fn find_for_read(&mut self, hash: u64, key: &[u8]) -> Option<Record> {
        match self.find(KeyHash::new(hash), key) {
            Ok(found) => found.map(|(_, r)| r),
            Err(e) => {
                self.note_read_error(key, &e.to_string());
                None
            }
        }
    }

    /// A read of `key` failed: kept for `take_read_errors`.
    pub(super) fn note_read_error(&mut self, key: &[u8], reason: &str) {
        self.faults.read_error_count += 1;
        self.faults.warn(
            self.settings.shard,
            "a key's record could not be read",
            &reason,
        );
        self.faults
            .read_errors
            .push((Bytes::copy_from_slice(key), reason.to_string()));
    }

    /// Looks `key` up for a GET without waiting for the device: candidates
    /// whose records are in RAM are compared now when their turn allows;
    /// the rest are left to read, in the order reads try them.
    pub(super) fn lookup(&mut self, hash: u64, key: &[u8]) -> Lookup<D::File> {
        if let Err(e) = self.check_written(key) {
            return Lookup::Failed(e);
        }
        if self.is_deleted(key) {
            return Lookup::Found(None);
        }
        let mut queue = VecDeque::new();
        let mut failed: Option<ReadError> = None;
        // The newest unresolved record of the key found in RAM so far.
        let mut best: Option<(u32, Record)> = None;
        for c in self.ordered_candidates(KeyHash::new(hash)) {
            // A settled entry that matches is the key's, whatever is still
            // to read; an unresolved one only if nothing before it is, and
            // then the newest of the unresolved ones that match.
            let settled = !self.blind.unresolved.contains(&c.addr);
            match self.where_is(&c) {
                Where::Ram(res) if settled || queue.is_empty() => match res {
                    Ok(r) if r.key == key && settled => return Lookup::Found(Some(r)),
                    Ok(r) if r.key == key => {
                        if best.is_none() {
                            if let Some(e) = failed {
                                // An earlier candidate could not be read
                                // and may be the key's newer record.
                                return Lookup::Failed(e);
                            }
                        }
                        let newer = best
                            .as_ref()
                            .is_none_or(|(b, br)| self.is_newer(c.addr, &r, *b, br));
                        if newer {
                            best = Some((c.addr, r));
                        }
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
                hot_reads: 0,
                bytes: 0,
                settle: false,
                background: false,
                best: best.map(|(a, r)| (a, r, false)),
                counted: None,
            });
        }
        // A candidate that failed after the newest found (at an older
        // place) is taken for older: its LSN is not known. (With a hot
        // device place does not order records: the read fails.)
        match (best, failed) {
            (Some(_), Some(e)) if !self.place_orders() => Lookup::Failed(e),
            (Some((_, r)), _) => Lookup::Found(Some(r)),
            (None, Some(e)) => Lookup::Failed(e),
            (None, None) => Lookup::Found(None),
        }
    }

    pub(super) fn live(&self, r: &Record) -> bool {
        r.expires_at_ms.is_none_or(|at| at > self.now_ms)
    }

    pub(super) fn due_keys(&mut self, max: usize) -> Vec<Bytes> {
        let now = self.now_ms;
        let due: Vec<(u64, u32)> = self
            .expiring
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(max * 2)
            .collect();
        let mut keys = Vec::new();
        for (at, addr) in due {
            if keys.len() >= max {
                break;
            }
            // An unresolved older version must not delete the key its
            // newer record holds; whether it is one may take a read of
            // the newer candidates.
            let checked = self.record_for_walk(addr, 1).and_then(|r| {
                let h = self.key_hash(&r.key);
                let listed = self.index.find_addr(h, addr).is_some() && r.expires_at_ms == Some(at);
                let current = listed && self.current(addr, &r)?;
                Ok((r, current))
            });
            match checked {
                Ok((r, true)) => keys.push(r.key),
                Ok((_, false)) => {
                    // Stale (from a fuzzy checkpoint): the key moved on.
                    self.expiring.remove(at, addr);
                }
                Err(e) => {
                    // Kept: the key may be due, and the records may read
                    // again (a later call tries them again).
                    let shard = self.settings.shard;
                    self.faults.warn(
                        shard,
                        "an expiring record could not be read; its key is expired once it can be",
                        &e,
                    );
                }
            }
        }
        keys
    }

    pub(super) fn visit_partition(&mut self, partition: usize, f: &mut EntryVisitor<'_>) {
        let mut entries = self.index.entries(partition);
        entries.sort_unstable();
        entries.dedup_by_key(|e| e.0);
        for (addr, span) in entries {
            let record = self
                .record_for_walk(addr, span)
                .and_then(|r| Ok((self.current(addr, &r)?, r)));
            match record {
                // Listed only through its own entry: one that dangles (a
                // record of another partition, or one whose key no longer
                // points at it) is not the key's.
                Ok((true, r)) if !self.own_entry(partition, addr, &r) => {
                    tracing::warn!(
                        partition,
                        addr,
                        "hybrid tier: an index entry dangles; a key walk leaves it out"
                    );
                }
                Ok((true, r)) if self.live(&r) => f(&r.key, &r.value, r.expires_at_ms),
                Ok(_) => {}
                Err(e) => {
                    self.faults.read_error_count += 1;
                    let shard = self.settings.shard;
                    self.faults.warn(
                        shard,
                        "a record could not be read during a key walk; its key is left out",
                        &e,
                    );
                }
            }
        }
    }

    /// [`Tier::get_many_split`]'s lookups: answers from RAM what it can and
    /// leaves in `cold` the keys to read, each with its place in the run.
    pub(super) fn get_many_split(
        &mut self,
        hashes: &[u64],
        keys: &[Bytes],
        out: &mut Vec<Option<Bytes>>,
        read_left: &mut usize,
        cold: &mut Vec<(usize, ColdKey<D::File>)>,
    ) -> usize {
        assert_eq!(hashes.len(), keys.len());
        let mut answered = 0;
        for (i, (&h, k)) in hashes.iter().zip(keys).enumerate() {
            if *read_left == 0 {
                break;
            }
            self.note_get(h);
            match self.lookup(h, k) {
                Lookup::Found(r) => {
                    let v = r.filter(|r| self.live(r)).map(|r| r.value);
                    *read_left = read_left.saturating_sub(v.as_ref().map_or(0, |v| v.len()));
                    out.push(v);
                }
                Lookup::Failed(e) => {
                    self.note_read_error(k, &e.to_string());
                    out.push(None);
                }
                Lookup::Cold(ck) => {
                    out.push(None);
                    cold.push((i, ck));
                }
            }
            answered += 1;
        }
        answered
    }
}
