//! Resizing the hybrid index to `storage.index_keys`: at the end of
//! recovery, an index whose buckets per partition differ from what
//! `index_keys` sizes (its checkpoint was written under another setting)
//! is rebuilt at the configured size.
//!
//! The index keeps tags and addresses, not hashes, so the rebuild reads
//! the key of every entry's record from the segments: entries are taken in
//! address order, so each segment is read front to back, records that lie
//! close together share one read of up to [`RUN_BLOCKS`] blocks, and the
//! cache is not filled. Each key's hash must name its entry's partition
//! and tag; the entry goes into the new table with its address and span
//! unchanged, so everything keyed by address (the cache, the expiry set)
//! stays valid. Spilled entries move into the table if it now has room; a
//! smaller table spills what does not fit, as inserts always do.
//!
//! All or nothing: if a record cannot be read, or its key does not match
//! its entry, the old index stays (every entry kept: reads of the damaged
//! record keep answering errors) and an error is logged; the resize is
//! tried again at the next restart.

use super::index::{buckets_for, Entry, Index};
use super::log::{parse_record, Parsed, ReadError, RecordSpot, PAYLOAD};
use super::Inner;
use crate::io::Disk;
use bytes::Bytes;
use std::path::Path;

/// Most blocks one read covers (1 MiB).
const RUN_BLOCKS: u64 = 256;
/// Blocks holding no wanted record that a read still covers rather than
/// being split in two (32 KiB: cheaper than another read).
const GAP_BLOCKS: u64 = 8;

impl<D: Disk> Inner<D> {
    /// Rebuilds the index at the size `settings.index_keys` asks for, if
    /// that is not its size.
    pub(super) fn resize_index(&mut self) {
        let from = self.index.buckets_per_partition();
        let to = buckets_for(self.settings.index_keys);
        if from == to {
            return;
        }
        let started = std::time::Instant::now();
        let (reads, bytes) = (self.log.reads, self.log.bytes_read);
        let spilled_before = self.index.spilled();
        let rebuilt = self.rebuild_index(to);
        let seconds = started.elapsed().as_secs_f64();
        let (device_reads, bytes_read) = (self.log.reads - reads, self.log.bytes_read - bytes);
        match rebuilt {
            Ok(index) => {
                self.index = index;
                tracing::info!(
                    shard = self.settings.shard,
                    buckets_before = from,
                    buckets_after = to,
                    entries_moved = self.index.len(),
                    spilled_before,
                    spilled_after = self.index.spilled(),
                    device_reads,
                    bytes_read,
                    seconds,
                    "hybrid index resized to storage.index_keys (buckets per partition)"
                );
            }
            Err(reason) => tracing::error!(
                shard = self.settings.shard,
                buckets = from,
                buckets_wanted = to,
                error = %reason,
                seconds,
                "hybrid index NOT resized to storage.index_keys: a record could not be read or does not match its entry; the index keeps its checkpoint's size and every entry (the resize is tried again at the next restart)"
            ),
        }
    }

    /// A new index of `buckets` buckets per partition holding every entry
    /// of the current one, or why it could not be built.
    fn rebuild_index(&mut self, buckets: usize) -> Result<Index, String> {
        let mut entries = self.index.all_entries();
        entries.sort_unstable_by_key(|e| e.addr);
        let mut index = Index::with_buckets(buckets);
        let mut spots: Vec<RecordSpot> = Vec::new();
        let mut at = 0;
        while at < entries.len() {
            let run = self.plan_run(&entries[at..], &mut spots)?;
            let path = self.log.path_of_slot(run.slot);
            let payloads = self
                .log
                .read_blocks(run.slot, run.first, run.count, false)
                .map_err(|e| e.to_string())?;
            for (e, spot) in entries[at..].iter().zip(&spots) {
                let lo = (spot.first - run.first) as usize * PAYLOAD;
                let key = self
                    .key_at(spot, &payloads[lo..], &path)
                    .map_err(|e| e.to_string())?;
                let h = self.key_hash(&key);
                if !e.matches(h) {
                    return Err(format!(
                        "the record at offset {} of {} holds a key whose hash does not match its index entry",
                        spot.offset,
                        path.display()
                    ));
                }
                index.insert(h, e.addr, e.span());
            }
            at += spots.len();
        }
        assert_eq!(index.len(), entries.len() as u64, "every entry moved");
        Ok(index)
    }

    /// The next read of a rebuild: the records of `entries` (sorted by
    /// address, at least one) from the first on that lie in one segment,
    /// no more than [`GAP_BLOCKS`] apart and within [`RUN_BLOCKS`] blocks
    /// of the first. Their spots go to `spots`; returns the blocks to read.
    fn plan_run(&self, entries: &[Entry], spots: &mut Vec<RecordSpot>) -> Result<Run, String> {
        spots.clear();
        let locate = |e: &Entry| self.log.locate(e.addr, e.span()).map_err(|e| e.to_string());
        let head = locate(&entries[0])?;
        let mut end = head.first + head.count;
        spots.push(head);
        for e in &entries[1..] {
            let s = locate(e)?;
            if s.slot != head.slot
                || s.first > end + GAP_BLOCKS
                || s.first + s.count > head.first + RUN_BLOCKS
            {
                break;
            }
            end = end.max(s.first + s.count);
            spots.push(s);
        }
        Ok(Run {
            slot: head.slot,
            first: head.first,
            count: end - head.first,
        })
    }

    /// The key of the record at `spot`, from `payloads` (the checked
    /// payloads from the spot's first block on) or, for a record that runs
    /// past them, from a read of its own.
    fn key_at(
        &mut self,
        spot: &RecordSpot,
        payloads: &[u8],
        path: &Path,
    ) -> Result<Bytes, ReadError> {
        let segment_bytes = self.log.segment_bytes();
        let count = match parse_record(payloads, spot, segment_bytes, path)? {
            Parsed::Record(r) => return Ok(r.key),
            Parsed::NeedBlocks(count) => count,
        };
        let whole = self.log.read_blocks(spot.slot, spot.first, count, false)?;
        match parse_record(&whole, spot, segment_bytes, path)? {
            Parsed::Record(r) => Ok(r.key),
            Parsed::NeedBlocks(_) => Err(ReadError::Corrupt {
                file: path.to_path_buf(),
                offset: spot.offset,
                reason: "the record is longer than the blocks its header names".into(),
            }),
        }
    }
}

/// Blocks `first..first + count` of segment `slot`, read at once.
struct Run {
    slot: u32,
    first: u64,
    count: u64,
}
