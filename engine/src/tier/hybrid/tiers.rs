//! Two devices under one shard's value log: a small fast one (hot) and a
//! large slow one (cold, `storage.value_device`). Where a record goes:
//!
//! - **Writes** go to the hot device while its segments in use (not
//!   emptied by GC) take less than `hot_bytes` and all its segment files
//!   less than twice that; past either, to the cold one. (A segment GC
//!   emptied stays until two checkpoints, and a full snapshot, are
//!   published after its GC: recovery may still load a snapshot that
//!   points into it.)
//! - **Eviction.** When the hot segments that are not emptied yet take
//!   more than `hot_bytes` less two segments, GC takes the oldest sealed
//!   hot segment as its victim (first in, first out) and moves each live
//!   record: to the hot device's head again if the admission test below
//!   keeps it there (a second chance, which halves its count: it must be
//!   read again to stay another round) and the hot device has room, else
//!   to the cold device.
//! - **Promotion.** A cold GET that reads a key's current record from the
//!   cold device copies it to the hot device when the admission test
//!   admits it and the hot device has room.
//!
//! **Admission by frequency** (TinyLFU's test, on a first-in first-out
//! device). A record enters (or stays on) the hot device only if its key
//! is estimated to be read more often than what it would push out. What a
//! move to the hot device's head pushes out is what GC finds at the other
//! end, the oldest hot segment, when it next evicts. Those records are
//! not in RAM, but GC reads each of them as it evicts, so the tier keeps
//! the key hashes of the last [`TAIL_SAMPLES`] live records GC met in a
//! hot victim (the *tail ring*); their estimates, taken when a decision is
//! made, stand for the frequency of the eviction end. A decision compares
//! the candidate with one of them, a different one each time (round
//! robin), which is cheap (two estimates: a few words of RAM) and, over many
//! decisions, admits a candidate about as often as it beats a record at
//! the eviction end:
//! - a copy up is admitted when the key's estimate is at least
//!   `promote_reads` (a floor: a key read once is never worth a cold
//!   read's copy) and *greater* than the sampled victim's: the newcomer
//!   must beat the incumbent;
//! - GC keeps a hot victim's record hot when its estimate is at least
//!   `promote_reads` and *at least* the sampled victim's (a tie keeps the
//!   record where it is: moving it costs I/O for nothing); it then enters
//!   the tail ring itself.
//!
//! Until GC has evicted from the hot device (the ring is empty) nothing is
//! pushed out and only the floor applies; the ring is not kept across a
//! restart, so after one the floor alone decides until GC's first hot
//! victim fills it again. Placement after a restart is where the records
//! were, as before.
//! - **How often a key is read** is a count-min sketch of 4-bit counters
//!   (four rows), a counter per 128 bytes of `hot_bytes` in each row (at
//!   most 4M), behind a *doorkeeper*: a bloom filter (three hashes, four
//!   bits per counter of a row) that takes a key's first read, so keys
//!   read once in a window never reach the counters and do not crowd the
//!   keys read again. A key's estimate is its counters' smallest plus one
//!   if the doorkeeper holds it. *Aging:* once as many reads were added
//!   as a row has counters (the sample window), every counter halves and
//!   the doorkeeper is cleared, so old reads fade: a key read often long
//!   ago loses to one read often now.
//! - **RAM**: the sketch takes 2 bytes per counter of a row (four rows of
//!   half a byte), the doorkeeper half a byte, the tail ring 8 bytes per
//!   sample (512 B a shard): 2.5 bytes per counter of a row, that is 2.5
//!   bytes per 128 bytes of `hot_bytes` (up to twice that with the width
//!   rounded up to a power of two): about 20 to 40 bytes per record the
//!   hot device holds with records of 1 KB, or 0.2 to 0.4 bytes per key of
//!   the data set when the hot device holds 1% of it; at most 10 MiB a
//!   shard (4M counters a row).
//! - **Moves keep to a share of each device** (`storage.hot_move_percent`
//!   of its profile, a budget of their own kept by the device): a copy up
//!   past the hot device's share is skipped, and GC of a hot segment
//!   waits until both devices' shares hold its next step.
//!
//! A move is the same as a GC copy: the record is appended with its own
//! LSN and the index entry switched to the copy; the old copy is garbage.
//! Recovery needs nothing new: a checkpoint's index points at one copy or
//! the other, both exist until GC empties the old one's segment, and a
//! segment is removed only once no snapshot kept is older than its GC.
//! Which device holds a segment is where its file is. The admission state
//! (sketch, doorkeeper, tail ring) is RAM only and starts empty.

use super::index::KeyHash;
use super::log::Record;
use super::log::SegState;
use super::log::{Device, HOT, MAIN};
use super::Inner;
use crate::io::Disk;

/// Rows of the sketch (independent hashes per key).
const ROWS: usize = 4;
/// The largest counter.
const COUNTER_MAX: u8 = 15;
/// Seeds of the rows' hashes.
const SEEDS: [u64; ROWS] = [
    0x243F_6A88_85A3_08D3,
    0x1319_8A2E_0370_7344,
    0xA409_3822_299F_31D0,
    0x082E_FA98_EC4E_6C89,
];
/// Bits of the doorkeeper per counter of a sketch row.
const DOOR_BITS_PER_COUNTER: usize = 4;
/// Hashes of the doorkeeper (bits set per key).
const DOOR_HASHES: usize = 3;
/// Multipliers for the doorkeeper's bit positions.
const DOOR_SEEDS: [u64; DOOR_HASHES] = [
    0xBF58_476D_1CE4_E5B9,
    0x94D0_49BB_1331_11EB,
    0xD6E8_FEB8_6659_FD93,
];
/// Key hashes of the live records GC met last in hot victims, the
/// admission test's stand-ins for what a move to the hot device pushes
/// out.
pub(super) const TAIL_SAMPLES: usize = 64;

/// A bloom filter of the keys read once since the last aging: a key's
/// first read sets its bits here, and only its later reads reach the
/// sketch's counters.
struct Doorkeeper {
    words: Vec<u64>,
    /// Bits minus one (a power of two).
    mask: u64,
}

impl Doorkeeper {
    fn new(bits: usize) -> Doorkeeper {
        let bits = bits.max(64).next_power_of_two();
        Doorkeeper {
            words: vec![0; bits / 64],
            mask: bits as u64 - 1,
        }
    }

    fn bit(&self, hash: u64, i: usize) -> u64 {
        (hash.wrapping_mul(DOOR_SEEDS[i]) >> 29) & self.mask
    }

    fn contains(&self, hash: u64) -> bool {
        (0..DOOR_HASHES).all(|i| {
            let b = self.bit(hash, i);
            self.words[(b / 64) as usize] & (1 << (b % 64)) != 0
        })
    }

    /// Sets `hash`'s bits; returns whether they were all set already.
    fn insert(&mut self, hash: u64) -> bool {
        let mut present = true;
        for i in 0..DOOR_HASHES {
            let b = self.bit(hash, i);
            let w = &mut self.words[(b / 64) as usize];
            present &= *w & (1 << (b % 64)) != 0;
            *w |= 1 << (b % 64);
        }
        present
    }

    fn clear(&mut self) {
        self.words.fill(0);
    }

    fn memory_bytes(&self) -> u64 {
        (self.words.len() * 8) as u64
    }
}

/// How often keys were read lately: a doorkeeper for first reads in front
/// of a count-min sketch of 4-bit counters, sixteen to a word; every
/// counter halves, and the doorkeeper is cleared, once `sample` reads were
/// added (as many as a row has counters).
pub(super) struct FrequencySketch {
    words: Vec<u64>,
    door: Doorkeeper,
    /// Counters per row (a power of two).
    width: usize,
    additions: u64,
    sample: u64,
}

impl FrequencySketch {
    /// A sketch of `width` counters per row (rounded up to a power of two,
    /// at least 64).
    pub(super) fn new(width: usize) -> FrequencySketch {
        let width = width.max(64).next_power_of_two();
        FrequencySketch {
            words: vec![0; ROWS * width / 16],
            door: Doorkeeper::new(width * DOOR_BITS_PER_COUNTER),
            width,
            additions: 0,
            sample: width as u64,
        }
    }

    pub(super) fn memory_bytes(&self) -> u64 {
        (self.words.len() * 8) as u64 + self.door.memory_bytes()
    }

    fn counter_index(&self, hash: u64, row: usize) -> usize {
        let h = (hash ^ SEEDS[row]).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        row * self.width + ((h >> 32) as usize & (self.width - 1))
    }

    fn counter(&self, i: usize) -> u8 {
        ((self.words[i / 16] >> ((i % 16) * 4)) & 0xF) as u8
    }

    fn set_counter(&mut self, i: usize, v: u8) {
        let shift = (i % 16) * 4;
        let w = &mut self.words[i / 16];
        *w = (*w & !(0xF << shift)) | (u64::from(v) << shift);
    }

    fn counters_min(&self, hash: u64) -> u8 {
        (0..ROWS)
            .map(|row| self.counter(self.counter_index(hash, row)))
            .min()
            .unwrap_or(0)
    }

    /// How many times `hash`'s key was read lately (at most 16: the
    /// doorkeeper's read and 15 counted; never less than the truth since
    /// the last aging, maybe more).
    pub(super) fn estimate(&self, hash: u64) -> u8 {
        self.counters_min(hash) + u8::from(self.door.contains(hash))
    }

    /// Adds one read of `hash`'s key: the first since the last aging goes
    /// to the doorkeeper only; a later one raises the smallest of its
    /// counters (a conservative update, which keeps the estimates of
    /// other keys sharing its counters closer to theirs).
    pub(super) fn record(&mut self, hash: u64) {
        if self.door.insert(hash) {
            let est = self.counters_min(hash);
            if est < COUNTER_MAX {
                for row in 0..ROWS {
                    let i = self.counter_index(hash, row);
                    if self.counter(i) == est {
                        self.set_counter(i, est + 1);
                    }
                }
            }
        }
        self.additions += 1;
        if self.additions >= self.sample {
            self.age();
        }
    }

    /// Halves every counter and clears the doorkeeper.
    fn age(&mut self) {
        for w in &mut self.words {
            *w = (*w >> 1) & 0x7777_7777_7777_7777;
        }
        self.door.clear();
        self.additions /= 2;
    }

    /// Halves the counters of `hash`'s key (its second chance is spent).
    pub(super) fn halve(&mut self, hash: u64) {
        for row in 0..ROWS {
            let i = self.counter_index(hash, row);
            let v = self.counter(i);
            self.set_counter(i, v / 2);
        }
    }
}

/// The admission test of the hot device (module doc): the sketch, the
/// floor (`promote_reads`) and the tail ring.
pub(super) struct Admission {
    pub(super) sketch: FrequencySketch,
    /// Reads lately a key needs at least to enter or stay on the hot
    /// device.
    floor: u8,
    /// Key hashes of the live records GC met last in hot victims.
    tail: [u64; TAIL_SAMPLES],
    /// Entries of `tail` filled (it fills from the start, then wraps).
    tail_len: usize,
    /// Where the next one goes.
    tail_next: usize,
    /// The entry the next decision compares with.
    tail_pick: usize,
}

impl Admission {
    pub(super) fn new(width: usize, floor: u8) -> Admission {
        Admission {
            sketch: FrequencySketch::new(width),
            floor: floor.clamp(1, COUNTER_MAX),
            tail: [0; TAIL_SAMPLES],
            tail_len: 0,
            tail_next: 0,
            tail_pick: 0,
        }
    }

    pub(super) fn memory_bytes(&self) -> u64 {
        self.sketch.memory_bytes() + (TAIL_SAMPLES * 8) as u64
    }

    /// Counts a read of `hash`'s key.
    pub(super) fn note_read(&mut self, hash: u64) {
        self.sketch.record(hash);
    }

    /// The estimate of the next sampled record of the eviction end, or
    /// `None` if GC has not met any yet.
    fn victim_estimate(&mut self) -> Option<u8> {
        if self.tail_len == 0 {
            return None;
        }
        self.tail_pick = (self.tail_pick + 1) % self.tail_len;
        Some(self.sketch.estimate(self.tail[self.tail_pick]))
    }

    /// Whether a cold record of `hash`'s key is copied up: read at least
    /// the floor lately, and more than a record at the eviction end.
    pub(super) fn admit(&mut self, hash: u64) -> bool {
        let est = self.sketch.estimate(hash);
        if est < self.floor {
            return false;
        }
        self.victim_estimate().is_none_or(|v| est > v)
    }

    /// Whether GC keeps on the hot device a live record of `hash`'s key
    /// it found in a hot victim (if `room`): read at least the floor
    /// lately and at least as often as a record at the eviction end; if
    /// so its count halves (a second chance spent). The record joins the
    /// tail ring either way.
    pub(super) fn keep(&mut self, hash: u64, room: bool) -> bool {
        let est = self.sketch.estimate(hash);
        let keep = room && est >= self.floor && self.victim_estimate().is_none_or(|v| est >= v);
        self.tail[self.tail_next] = hash;
        self.tail_next = (self.tail_next + 1) % TAIL_SAMPLES;
        self.tail_len = (self.tail_len + 1).min(TAIL_SAMPLES);
        if keep {
            self.sketch.halve(hash);
        }
        keep
    }
}

/// Placement across the hot and the cold device of one shard.
pub(super) struct Tiering {
    /// Bytes the hot device's segment files may take (this shard's part
    /// of `storage.hot_bytes`).
    pub(super) hot_bytes: u64,
    /// Which records enter the hot device, or stay there.
    pub(super) admission: Admission,
    pub(super) promotions: u64,
    pub(super) promoted_bytes: u64,
    pub(super) demotions: u64,
    pub(super) demoted_bytes: u64,
    /// Copies up skipped and GC steps held back for the moves' share of
    /// a device (`storage.hot_move_percent`).
    pub(super) move_waits: u64,
    /// GC of a hot segment waits for the moves' share until then.
    pub(super) gc_paused_until: Option<std::time::Instant>,
    /// What the hot segments took when the set of segments last changed
    /// (a segment started, emptied by GC or removed), and that change:
    /// placement looks at it for every write, so it is not summed over
    /// every segment each time. Appends to the open hot segment since are
    /// not in it: the hot device may go past `hot_bytes` by a segment.
    use_cache: std::cell::Cell<Option<(SegmentsVersion, DeviceUse)>>,
}

/// Tells the set of segments apart: the next sequence number, GC passes
/// finished, segments removed.
type SegmentsVersion = (u64, u64, u64);

impl Tiering {
    pub(super) fn new(hot_bytes: u64, promote_reads: u8) -> Tiering {
        // A counter per 128 bytes of hot records, at most 4M per row.
        let width = (hot_bytes / 128).clamp(1024, 1 << 22) as usize;
        Tiering {
            hot_bytes,
            admission: Admission::new(width, promote_reads),
            promotions: 0,
            promoted_bytes: 0,
            demotions: 0,
            demoted_bytes: 0,
            move_waits: 0,
            gc_paused_until: None,
            use_cache: std::cell::Cell::new(None),
        }
    }
}

/// Bytes of one device's segments: (files, of them not emptied by GC,
/// live record bytes, segments).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct DeviceUse {
    pub(super) file_bytes: u64,
    pub(super) in_use_bytes: u64,
    pub(super) live_bytes: u64,
    pub(super) record_bytes: u64,
    pub(super) segments: u64,
}

impl<D: Disk> Inner<D> {
    /// What the segments of `device` take.
    pub(super) fn device_use(&self, device: Device) -> DeviceUse {
        let mut u = DeviceUse::default();
        for s in self
            .log
            .segs
            .iter()
            .flatten()
            .filter(|s| s.device == device)
        {
            u.segments += 1;
            u.file_bytes += s.end;
            u.record_bytes += s.total_bytes;
            u.live_bytes += s.live_bytes.min(s.total_bytes);
            if !matches!(s.state, SegState::Zombie { .. }) {
                u.in_use_bytes += s.end;
            }
        }
        u
    }

    /// What the hot segments take, as of the last change to the set of
    /// segments (see `Tiering::use_cache`).
    fn hot_use(&self, t: &Tiering) -> DeviceUse {
        let key = (self.log.next_seq, self.gc.runs, self.log.removed);
        match t.use_cache.get() {
            Some((k, u)) if k == key => u,
            _ => {
                let u = self.device_use(HOT);
                t.use_cache.set(Some((key, u)));
                u
            }
        }
    }

    /// Forgets what the hot segments took (segments changed state another
    /// way: recovery reopened emptied ones).
    pub(super) fn forget_hot_use(&self) {
        if let Some(t) = self.tiering.as_ref() {
            t.use_cache.set(None);
        }
    }

    /// Whether the hot device takes another record: its segments in use
    /// take less than `hot_bytes` and `slack` more, and all its files
    /// (emptied ones too, until they are removed) less than twice
    /// `hot_bytes`. New records and copies up have no slack; GC keeping a
    /// record of a hot victim there has a segment of it (the victim,
    /// emptied, gives back at least what it keeps).
    fn hot_has_room(&self, slack: u64) -> bool {
        self.tiering.as_ref().is_some_and(|t| {
            let u = self.hot_use(t);
            u.in_use_bytes < t.hot_bytes + slack && u.file_bytes < t.hot_bytes.saturating_mul(2)
        })
    }

    /// The device a new write goes to.
    pub(super) fn write_device(&self) -> Device {
        if self.hot_has_room(0) {
            HOT
        } else {
            MAIN
        }
    }

    /// Counts a GET of the key with table hash `hash` (for placement).
    pub(super) fn note_get(&mut self, hash: u64) {
        if let Some(t) = self.tiering.as_mut() {
            t.admission.note_read(hash);
        }
    }

    /// Whether a checkpoint is wanted to free the hot device (see
    /// [`crate::tier::Tier::checkpoint_wanted`]): when segments GC emptied
    /// there take half of `hot_bytes` or more. A full one unless one was
    /// published after the GC of the oldest of them (then one more
    /// checkpoint lets them go).
    pub(super) fn checkpoint_wanted(&self) -> Option<bool> {
        let t = self.tiering.as_ref()?;
        let u = self.hot_use(t);
        if u.file_bytes.saturating_sub(u.in_use_bytes) < t.hot_bytes / 2 {
            return None;
        }
        let oldest = self
            .log
            .segs
            .iter()
            .flatten()
            .filter(|s| s.device == HOT)
            .filter_map(|s| match s.state {
                SegState::Zombie { gc_epoch, .. } => Some(gc_epoch),
                _ => None,
            })
            .min()?;
        let full_since = self
            .gc
            .published
            .iter()
            .any(|&(epoch, full)| full && epoch > oldest);
        Some(!full_since)
    }

    /// The oldest sealed hot segment (but one GC gave up on: a read of it
    /// failed), when the hot segments in use take more than `hot_bytes`
    /// less two segments.
    pub(super) fn pick_hot_victim(&self) -> Option<u32> {
        let t = self.tiering.as_ref()?;
        let target = t.hot_bytes.saturating_sub(2 * self.settings.segment_bytes);
        if self.device_use(HOT).in_use_bytes <= target {
            return None;
        }
        self.log
            .segs
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| Some((slot as u32, s.as_ref()?)))
            .filter(|(_, s)| {
                s.device == HOT && s.state == SegState::Sealed && !self.gc.gave_up.contains(&s.seq)
            })
            .min_by_key(|(_, s)| s.seq)
            .map(|(slot, _)| slot)
    }

    /// Whether GC may take its next step through a hot segment, `len`
    /// bytes of it: a step reads them from the hot device and writes at
    /// most as much, to either device, so both devices' shares for moves
    /// (`storage.hot_move_percent`) are charged that much when it goes.
    /// When either share is spent, GC waits until it has refilled
    /// ([`crate::tier::Tier::background_wait`]).
    pub(super) fn gc_move_allowed(&mut self, len: u64) -> bool {
        let now = std::time::Instant::now();
        let wait = self
            .log
            .disk(HOT)
            .move_wait(len)
            .max(self.log.disk(MAIN).move_wait(len));
        let Some(t) = self.tiering.as_mut() else {
            return true;
        };
        if !wait.is_zero() {
            if t.gc_paused_until.is_none() {
                t.move_waits += 1;
            }
            t.gc_paused_until = Some(now + wait);
            return false;
        }
        t.gc_paused_until = None;
        self.log.disk(HOT).take_move(len);
        self.log.disk(MAIN).take_move(len);
        true
    }

    /// Where GC copies a live record `r` of its victim, a segment of
    /// `from`: a cold segment's stay cold; a hot segment's stay hot if
    /// the admission test keeps them (spending their second chance) and
    /// the hot device has room, and go cold otherwise. A
    /// record without an LSN (from a version 1 segment) never changes
    /// device: only the place of such records orders them.
    pub(super) fn gc_target(&mut self, from: Device, r: &Record) -> Device {
        if from != HOT {
            return from;
        }
        if r.lsn.is_none() {
            return from;
        }
        let hash = self.hasher.hash_key(&r.key);
        let room = self.hot_has_room(self.settings.segment_bytes);
        let Some(t) = self.tiering.as_mut() else {
            return MAIN;
        };
        if t.admission.keep(hash, room) {
            return HOT;
        }
        t.demotions += 1;
        t.demoted_bytes += r.size;
        MAIN
    }

    /// Copies the record `r` at `addr`, whose entry (hash `h`) points at
    /// it, to `device`'s head and points the entry at the copy (GC's
    /// copies, and copies up to the hot device; `by` names which, for a
    /// fault). Returns whether it did: not if no entry points at `addr`
    /// any more, or the write failed (which poisons the shard).
    pub(super) fn move_record(
        &mut self,
        h: KeyHash,
        addr: u32,
        r: &Record,
        device: Device,
        by: &str,
    ) -> bool {
        let Some(loc) = self.index.find_addr(h, addr) else {
            return false;
        };
        // The copy keeps the record's LSN (0: a version 1 record's copy,
        // whose write is not known).
        let lsn = r.lsn.unwrap_or(0);
        let (new, span) = match self
            .log
            .append(device, &r.key, &r.value, r.expires_at_ms, lsn)
        {
            Ok(a) => a,
            Err(e) => {
                self.note_fault(by, &e);
                return false;
            }
        };
        self.index.set(loc, new, span);
        if let Some(seg) = self.log.seg_of_mut(addr) {
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
        true
    }

    /// After a cold GET read the key's current record `r` at `addr` (its
    /// settled entry) from the device: copies it to the hot device if it
    /// is on the cold one, the admission test admits it, and the hot
    /// device has room.
    pub(super) fn maybe_promote(&mut self, hash: u64, addr: u32, r: &Record) {
        if self.faults.fault.is_some() || r.lsn.is_none() || !self.hot_has_room(0) {
            return;
        }
        if self.blind.unresolved.contains(&addr)
            || self.log.seg_of(addr).is_none_or(|s| s.device != MAIN)
        {
            return;
        }
        let Some(t) = self.tiering.as_mut() else {
            return;
        };
        if !t.admission.admit(hash) {
            return;
        }
        // The read is done (the GET paid it); the copy's write is the
        // hot device's, out of its share for moves.
        let hot = self.log.disk(HOT);
        if !hot.move_wait(r.size).is_zero() {
            if let Some(t) = self.tiering.as_mut() {
                t.move_waits += 1;
            }
            return;
        }
        hot.take_move(r.size);
        if self.move_record(
            KeyHash::new(hash),
            addr,
            r,
            HOT,
            "write (copy to the hot device)",
        ) {
            if let Some(t) = self.tiering.as_mut() {
                t.promotions += 1;
                t.promoted_bytes += r.size;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Admission, FrequencySketch, TAIL_SAMPLES};
    use std::collections::HashMap;

    /// A well mixed hash for test key `k` (table hashes are).
    fn h(k: u64) -> u64 {
        let mut x = k.wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }

    /// A key read n times estimates at least n (up to 16), keys never read
    /// mostly 0, and the counters halve after the sample.
    #[test]
    fn the_sketch_counts_reads_and_forgets_them() {
        let mut s = FrequencySketch::new(1024);
        for k in 0..100u64 {
            for _ in 0..(k % 7) {
                s.record(h(k));
            }
        }
        for k in 0..100u64 {
            assert!(s.estimate(h(k)) >= (k % 7) as u8);
        }
        let unseen = (1000..2000u64).filter(|&k| s.estimate(h(k)) > 0).count();
        assert!(unseen < 50, "{unseen} of 1000 unseen keys estimate above 0");
        let hot = h(42);
        for _ in 0..40 {
            s.record(hot);
        }
        // 15 counted, and the doorkeeper's one.
        assert_eq!(s.estimate(hot), 16);
        s.halve(hot);
        assert_eq!(s.estimate(hot), 8);
        // The sample (as many reads as a row has counters) halves every
        // counter and clears the doorkeeper.
        for k in 0..1024u64 {
            s.record(h(1 << 40 | k));
        }
        assert!(s.estimate(hot) <= 3, "{}", s.estimate(hot));
    }

    /// The admission rule's own model, exact where the sketch estimates:
    /// per key, whether the doorkeeper holds it and its count past that
    /// (at most 15); aging halves the counts and empties the doorkeeper;
    /// the tail ring and its round robin as the module doc says.
    struct Model {
        door: HashMap<u64, bool>,
        count: HashMap<u64, u8>,
        reads: u64,
        window: u64,
        floor: u8,
        tail: Vec<u64>,
        next: usize,
        pick: usize,
    }

    impl Model {
        fn new(window: u64, floor: u8) -> Model {
            Model {
                door: HashMap::new(),
                count: HashMap::new(),
                reads: 0,
                window,
                floor,
                tail: Vec::new(),
                next: 0,
                pick: 0,
            }
        }

        fn est(&self, k: u64) -> u8 {
            self.count.get(&k).copied().unwrap_or(0) + u8::from(self.door.contains_key(&k))
        }

        fn read(&mut self, k: u64) {
            if self.door.insert(k, true).is_some() {
                let c = self.count.entry(k).or_insert(0);
                *c = (*c + 1).min(15);
            }
            self.reads += 1;
            if self.reads >= self.window {
                self.door.clear();
                for c in self.count.values_mut() {
                    *c /= 2;
                }
                self.reads /= 2;
            }
        }

        fn victim(&mut self) -> Option<u8> {
            if self.tail.is_empty() {
                return None;
            }
            self.pick = (self.pick + 1) % self.tail.len();
            Some(self.est(self.tail[self.pick]))
        }

        fn admit(&mut self, k: u64) -> bool {
            let e = self.est(k);
            e >= self.floor && self.victim().is_none_or(|v| e > v)
        }

        fn keep(&mut self, k: u64, room: bool) -> bool {
            let e = self.est(k);
            let keep = room && e >= self.floor && self.victim().is_none_or(|v| e >= v);
            if self.tail.len() < TAIL_SAMPLES {
                self.tail.push(k);
            } else {
                self.tail[self.next] = k;
            }
            self.next = (self.next + 1) % TAIL_SAMPLES;
            if keep {
                if let Some(c) = self.count.get_mut(&k) {
                    *c /= 2;
                }
            }
            keep
        }
    }

    /// Named cases first, then a random trace where every decision of
    /// the rule must match the model's.
    #[test]
    fn admission_admits_keys_read_more_than_the_eviction_end() {
        let mut a = Admission::new(1024, 2);
        // Before GC met any hot record, only the floor: a key read twice
        // is admitted, a key read once is not, and the doorkeeper took
        // that read (no counter holds it).
        let (hot, once) = (h(1), h(2));
        a.note_read(hot);
        a.note_read(hot);
        a.note_read(once);
        assert_eq!(
            a.sketch.counters_min(once),
            0,
            "the doorkeeper holds a first read"
        );
        assert!(!a.admit(once), "a key read once is not copied up");
        assert!(a.admit(hot));

        // The eviction end holds keys read three times: a key read four
        // times beats them, one read three times does not (a tie keeps
        // the incumbent), and GC keeps such a key on a tie.
        for k in 100..100 + TAIL_SAMPLES as u64 {
            for _ in 0..3 {
                a.note_read(h(k));
            }
            assert!(!a.keep(h(k), false), "no room: nothing is kept");
        }
        let (four, three) = (h(3), h(4));
        for _ in 0..4 {
            a.note_read(four);
        }
        for _ in 0..3 {
            a.note_read(three);
        }
        assert!(a.admit(four));
        assert!(!a.admit(three));
        assert!(a.keep(three, true), "GC keeps a record on a tie");

        // Aging: a key read often, but long ago, loses to a key read
        // often now. `old` is the eviction end; `fresh` is read 4 times
        // now, `old` 12 times before two sample windows of other keys.
        let mut a = Admission::new(1024, 2);
        let (old, fresh) = (h(5), h(6));
        for _ in 0..12 {
            a.note_read(old);
        }
        assert!(!a.keep(old, false));
        for _ in 0..4 {
            a.note_read(fresh);
        }
        assert!(!a.admit(fresh), "12 recent reads beat 4");
        for k in 0..2 * 1024u64 {
            a.note_read(h(1 << 40 | k));
        }
        for _ in 0..4 {
            a.note_read(fresh);
        }
        assert!(a.sketch.estimate(old) < 4, "{}", a.sketch.estimate(old));
        assert!(
            a.admit(fresh),
            "after aging, 4 fresh reads beat 12 old ones"
        );

        // A random trace of skewed reads, GC meeting records and copies
        // up: the rule decides as its model does.
        let mut a = Admission::new(1024, 2);
        let mut m = Model::new(1024, 2);
        let mut x = 0x1234_5678_9ABC_DEF1u64;
        let mut rand = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (mut admitted, mut refused) = (0, 0);
        for _ in 0..20_000 {
            // Key k of 48, read with weight about 1/(k+1).
            let r = rand(1000);
            let k = (0..48u64)
                .find(|&k| r < 1000 - 1000 / (k + 2))
                .unwrap_or(47);
            a.note_read(h(k));
            m.read(k);
            match rand(8) {
                0 => {
                    let got = a.admit(h(k));
                    assert_eq!(got, m.admit(k), "copy up of key {k}");
                    if got {
                        admitted += 1;
                    } else {
                        refused += 1;
                    }
                }
                1 => {
                    let k = rand(64);
                    let room = rand(4) != 0;
                    assert_eq!(a.keep(h(k), room), m.keep(k, room), "GC of key {k}");
                }
                _ => {}
            }
        }
        assert!(
            admitted > 100 && refused > 100,
            "{admitted} admitted, {refused} refused"
        );
    }
}
