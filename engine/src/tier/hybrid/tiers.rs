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
//!   record: to the hot device's head again if the key was read at least
//!   `promote_reads` times lately (a second chance, which halves its
//!   count: it must be read again to stay another round) and the hot
//!   device has room, else to the cold device.
//! - **Promotion.** A cold GET that reads a key's current record from the
//!   cold device copies it to the hot device when the key was read at
//!   least `promote_reads` times lately and the hot device has room.
//! - **How often a key is read** is a count-min sketch of 4-bit counters
//!   (four rows), a counter per 128 bytes of `hot_bytes` in each row (at
//!   most 4M: 8 MiB per shard), all halved once as many reads were added
//!   as a row has counters, so old reads fade: "read twice lately" means
//!   about twice among the shard's last reads of that many keys.
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
//! Which device holds a segment is where its file is.

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

/// How often keys were read lately: a count-min sketch of 4-bit counters,
/// sixteen to a word, whose counters all halve once `sample` reads were
/// added (as many as a row has counters).
pub(super) struct FrequencySketch {
    words: Vec<u64>,
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
            width,
            additions: 0,
            sample: width as u64,
        }
    }

    pub(super) fn memory_bytes(&self) -> u64 {
        (self.words.len() * 8) as u64
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

    /// How many times `hash`'s key was read lately (at most 15; never
    /// less than the truth since the last halving, maybe more).
    pub(super) fn estimate(&self, hash: u64) -> u8 {
        (0..ROWS)
            .map(|row| self.counter(self.counter_index(hash, row)))
            .min()
            .unwrap_or(0)
    }

    /// Adds one read of `hash`'s key: the smallest of its counters go up
    /// (a conservative update, which keeps the estimates of other keys
    /// sharing its counters closer to theirs).
    pub(super) fn record(&mut self, hash: u64) {
        let est = self.estimate(hash);
        if est < COUNTER_MAX {
            for row in 0..ROWS {
                let i = self.counter_index(hash, row);
                if self.counter(i) == est {
                    self.set_counter(i, est + 1);
                }
            }
        }
        self.additions += 1;
        if self.additions >= self.sample {
            for w in &mut self.words {
                *w = (*w >> 1) & 0x7777_7777_7777_7777;
            }
            self.additions /= 2;
        }
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

/// Placement across the hot and the cold device of one shard.
pub(super) struct Tiering {
    /// Bytes the hot device's segment files may take (this shard's part
    /// of `storage.hot_bytes`).
    pub(super) hot_bytes: u64,
    /// Reads lately that make a cold record move up, or a hot one stay.
    pub(super) promote_reads: u8,
    pub(super) sketch: FrequencySketch,
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
            promote_reads: promote_reads.clamp(1, COUNTER_MAX),
            sketch: FrequencySketch::new(width),
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
            t.sketch.record(hash);
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
    /// their key was read often enough lately (spending its second
    /// chance) and the hot device has room, and go cold otherwise. A
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
        if room && t.sketch.estimate(hash) >= t.promote_reads {
            t.sketch.halve(hash);
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
    /// is on the cold one, was read often enough lately, and the hot
    /// device has room.
    pub(super) fn maybe_promote(&mut self, hash: u64, addr: u32, r: &Record) {
        if self.faults.fault.is_some() || r.lsn.is_none() || !self.hot_has_room(0) {
            return;
        }
        let Some(t) = self.tiering.as_ref() else {
            return;
        };
        if t.sketch.estimate(hash) < t.promote_reads {
            return;
        }
        if self.blind.unresolved.contains(&addr)
            || self.log.seg_of(addr).is_none_or(|s| s.device != MAIN)
        {
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
    use super::FrequencySketch;

    /// A key read n times estimates at least n (up to 15), keys never read
    /// mostly 0, and the counters halve after the sample.
    #[test]
    fn the_sketch_counts_reads_and_forgets_them() {
        let mut s = FrequencySketch::new(1024);
        for k in 0..100u64 {
            for _ in 0..(k % 7) {
                s.record(k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            }
        }
        for k in 0..100u64 {
            assert!(s.estimate(k.wrapping_mul(0x9E37_79B9_7F4A_7C15)) >= (k % 7) as u8);
        }
        let unseen = (1000..2000u64)
            .filter(|k| s.estimate(k.wrapping_mul(0x9E37_79B9_7F4A_7C15)) > 0)
            .count();
        assert!(unseen < 50, "{unseen} of 1000 unseen keys estimate above 0");
        let hot = 42u64.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for _ in 0..40 {
            s.record(hot);
        }
        assert_eq!(s.estimate(hot), 15);
        s.halve(hot);
        assert_eq!(s.estimate(hot), 7);
        // The sample (as many reads as a row has counters) halves every
        // counter.
        for k in 0..1024u64 {
            s.record(k.wrapping_mul(0xD6E8_FEB8_6659_FD93) | 1 << 63);
        }
        assert!(s.estimate(hot) <= 4, "{}", s.estimate(hot));
    }
}
