//! Value segments damaged on disk, and the keys that damage costs: a file
//! cut short (found when the shard opens, and by `verify`), a file that is
//! missing (a start refuses it), and blocks whose checksum fails (found by
//! `verify`, which reads every block). `docs/storage.md`, "Damage to value
//! segments".
//!
//! What must hold: damage is counted in index entries, never guessed from
//! bytes. Settled entries are keys (a key has at most one); unresolved
//! ones are counted apart (mostly older versions of keys written since).
//! A damaged segment's keys stay in the index: their reads answer
//! `VALUE_UNREADABLE` naming the file and offset, as they always did; only
//! now the start says so once, instead of each read on its own.

use super::log::ReadError;
use super::log::ValueLog;
use super::log::BLOCK;
use super::Inner;
use crate::io::AlignedBuf;
use crate::io::Disk;
use crate::io::DiskFile;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;

/// One damaged value segment and what it costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentDamage {
    pub file: PathBuf,
    /// Its sequence number (the file's name).
    pub seq: u64,
    /// The file is not there at all.
    pub missing: bool,
    /// The file's length in bytes (0 when missing).
    pub file_bytes: u64,
    /// The length the loaded checkpoint's segment table says the file
    /// holds records up to, in whole blocks: every address the index may
    /// hold into it lies below.
    pub needed_bytes: u64,
    /// Blocks (indexes) that cannot be read: from the end of the last
    /// whole block of a cut file on, and those whose checksum failed.
    pub bad_blocks: Vec<Range<u64>>,
    /// Keys whose values lie in those blocks (settled index entries).
    pub keys: u64,
    /// Unresolved entries whose records lie there: older versions of
    /// keys written since, or (rarely) the current record of a key that
    /// shares a tag with one written since.
    pub unresolved: u64,
}

impl SegmentDamage {
    /// What is wrong with the file and what it costs, without its name.
    pub fn loss(&self) -> String {
        use std::fmt::Write as _;
        let mut t = String::new();
        if self.missing {
            let _ = write!(
                t,
                "is missing (the index needs {} bytes of it)",
                self.needed_bytes
            );
        } else {
            let _ = write!(
                t,
                "is {} bytes, the index needs {}",
                self.file_bytes, self.needed_bytes
            );
            for r in self.bad_blocks.iter().filter(|r| r.end != u64::MAX) {
                let (from, count) = (r.start * BLOCK as u64, r.end - r.start);
                let _ = write!(t, ", {count} damaged block(s) at offset {from}");
            }
            if let Some(r) = self.bad_blocks.iter().find(|r| r.end == u64::MAX) {
                let _ = write!(t, ", unreadable from offset {}", r.start * BLOCK as u64);
            }
        }
        let _ = write!(t, ": {} keys unreadable", self.keys);
        if self.unresolved > 0 {
            let _ = write!(
                t,
                " (and {} unresolved entries: older versions, or rarely a key sharing a tag)",
                self.unresolved
            );
        }
        t
    }
}

impl std::fmt::Display for SegmentDamage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.file.display(), self.loss())
    }
}

/// The blocks `bad` covers, past the last whole block of a file of
/// `whole_blocks`: what reads of a file cut there can no longer get.
pub fn cut_from(whole_blocks: u64) -> Range<u64> {
    whole_blocks..u64::MAX
}

impl<D: Disk> Inner<D> {
    /// Where the file of segment `slot` ends, when it ends before the
    /// blocks its table entry says it holds: (whole blocks, bytes). Found
    /// by reads of one block (a binary search over the blocks needed,
    /// about 14 reads for a 64 MiB segment; one read when the file is
    /// whole): the disk layer has no blocking stat.
    pub(super) fn cut_short(&self, slot: u32) -> Result<Option<(u64, u64)>, ReadError> {
        let Some(seg) = self.log.segs.get(slot as usize).and_then(|s| s.as_ref()) else {
            return Ok(None);
        };
        let needed = seg.end.div_ceil(BLOCK as u64);
        let mut buf = AlignedBuf::with_capacity(BLOCK);
        let mut read = |block: u64| {
            let offset = block * BLOCK as u64;
            seg.file
                .read_at_blocking(&mut buf, offset)
                .map_err(|source| ReadError::Io {
                    file: seg.path.clone(),
                    offset,
                    source,
                })
        };
        if needed == 0 || read(needed - 1)? == BLOCK {
            return Ok(None);
        }
        // Blocks below `lo` are whole; block `hi` is not.
        let (mut lo, mut hi) = (0, needed - 1);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if read(mid)? == BLOCK {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let tail = read(lo)? as u64;
        Ok(Some((lo, lo * BLOCK as u64 + tail)))
    }

    /// The index entries into segment `slot` whose records cannot be read
    /// when the blocks `bad` are bad: (settled, unresolved). An entry
    /// starting in a bad block is; so is the one starting last before a
    /// bad range if its record runs into it, which one read of it tells
    /// (records never overlap, so no entry before that one can). The
    /// segment need not be open (a missing file: every entry counts).
    pub(super) fn count_unreadable(&mut self, slot: u32, bad: &[Range<u64>]) -> (u64, u64) {
        let mut addrs = Vec::new();
        let log = &self.log;
        self.index.for_each_addr(|a| {
            if log.decode_addr(a).slot == slot {
                addrs.push(a);
            }
        });
        addrs.sort_unstable();
        addrs.dedup();
        let block_of = |log: &ValueLog<D>, a: u32| log.decode_addr(a).offset / BLOCK as u64;
        let mut lost = vec![false; addrs.len()];
        for range in bad {
            let first = addrs.partition_point(|&a| block_of(&self.log, a) < range.start);
            let end = addrs.partition_point(|&a| block_of(&self.log, a) < range.end);
            lost[first..end].iter_mut().for_each(|l| *l = true);
            if first > 0
                && !lost[first - 1]
                && self
                    .log
                    .segs
                    .get(slot as usize)
                    .is_some_and(|s| s.is_some())
            {
                lost[first - 1] = self.log.read(addrs[first - 1], 0).is_err();
            }
        }
        let (mut keys, mut unresolved) = (0, 0);
        for (a, _) in addrs.iter().zip(&lost).filter(|(_, &l)| l) {
            if self.blind.unresolved.contains(a) {
                unresolved += 1;
            } else {
                keys += 1;
            }
        }
        (keys, unresolved)
    }

    /// The damage of segment `slot` (`seq`, records up to `end` by its
    /// table entry) given its bad blocks, counted.
    fn damage_of(
        &mut self,
        (slot, seq, end): (u32, u64, u64),
        file_bytes: Option<u64>,
        bad: Vec<Range<u64>>,
    ) -> SegmentDamage {
        let (keys, unresolved) = self.count_unreadable(slot, &bad);
        SegmentDamage {
            // A missing file may have no entry at all (the table's first
            // slot, with nothing opened yet).
            file: self
                .log
                .segs
                .get(slot as usize)
                .and_then(|s| s.as_ref())
                .map_or_else(|| self.log.path_of(seq), |s| s.path.clone()),
            seq,
            missing: file_bytes.is_none(),
            file_bytes: file_bytes.unwrap_or(0),
            needed_bytes: end.div_ceil(BLOCK as u64) * BLOCK as u64,
            bad_blocks: bad,
            keys,
            unresolved,
        }
    }

    /// At the end of recovery (the checkpoint loaded, the WAL replayed,
    /// so keys written again since are not counted): each segment the
    /// checkpoint's table opened whose file ends before the records the
    /// table says it holds. Logged once, in one line for the shard, and
    /// kept for the tier's stats. A probe that fails is logged and the
    /// segment left to its reads' own errors.
    pub(super) fn check_loaded_segments(&mut self) {
        let loaded = std::mem::take(&mut self.loading.loaded);
        let mut found = Vec::new();
        for (slot, seq, end) in loaded {
            if self.log.seq_of_slot(slot) != Some(seq) {
                continue;
            }
            match self.cut_short(slot) {
                Ok(None) => {}
                Ok(Some((blocks, bytes))) => {
                    let d = self.damage_of((slot, seq, end), Some(bytes), vec![cut_from(blocks)]);
                    found.push(d);
                }
                Err(e) => tracing::warn!(
                    shard = self.settings.shard,
                    error = %e,
                    "hybrid tier: could not check the length of a value segment"
                ),
            }
        }
        if found.is_empty() {
            return;
        }
        let keys: u64 = found.iter().map(|d| d.keys).sum();
        let unresolved: u64 = found.iter().map(|d| d.unresolved).sum();
        let list: Vec<String> = found.iter().map(ToString::to_string).collect();
        tracing::warn!(
            shard = self.settings.shard,
            unreadable_keys = keys,
            unresolved_entries = unresolved,
            damaged = %list.join("; "),
            "hybrid tier: value segments are damaged (cut short): the keys whose values lie past their ends stay, and reads of them answer VALUE_UNREADABLE"
        );
        self.loading.damage = found;
    }

    /// The reason a start refuses a checkpoint whose table lists value
    /// segments that are missing (`missing`: slot and sequence), with the
    /// keys the index holds into each.
    pub(super) fn missing_reason(&mut self, missing: &[(u32, u64, u64)]) -> String {
        let mut parts = Vec::new();
        for &seg in missing {
            let d = self.damage_of(seg, None, vec![cut_from(0)]);
            parts.push(format!(
                "{} (the checkpoint's index holds {} keys there, and {} unresolved entries; the WAL replay may have replaced some)",
                d.file.display(),
                d.keys,
                d.unresolved
            ));
        }
        let hot = if self.log.has_hot() {
            " (nor on the hot device)"
        } else {
            ""
        };
        format!(
            "value segment(s) missing{hot}: {}; restore the file(s), or check storage.value_device; to start without their records, create each one empty, and the start reports its keys as unreadable (docs/storage.md, \"Damage to value segments\")",
            parts.join("; ")
        )
    }

    /// For `verify`: every segment of the loaded checkpoint's table that
    /// is missing, shorter than its table entry says, or has blocks whose
    /// checksum failed, with the keys of the loaded index it costs.
    /// `files` holds what a read of every block found, by sequence
    /// number: the file's length and its bad blocks.
    pub(super) fn inspect_damage(
        &mut self,
        files: &BTreeMap<u64, (u64, Vec<Range<u64>>)>,
    ) -> Vec<SegmentDamage> {
        let mut out = Vec::new();
        for seg in std::mem::take(&mut self.loading.missing) {
            out.push(self.damage_of(seg, None, vec![cut_from(0)]));
        }
        for (slot, seq, end) in std::mem::take(&mut self.loading.loaded) {
            let Some((bytes, bad)) = files.get(&seq) else {
                continue;
            };
            let whole = bytes / BLOCK as u64;
            let mut bad: Vec<Range<u64>> =
                bad.iter().filter(|r| r.start < whole).cloned().collect();
            if whole < end.div_ceil(BLOCK as u64) {
                bad.push(cut_from(whole));
            }
            if !bad.is_empty() {
                out.push(self.damage_of((slot, seq, end), Some(*bytes), bad));
            }
        }
        out.sort_by_key(|d| d.seq);
        out
    }
}
