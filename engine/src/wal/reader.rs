//! Reading WAL segments back (through [`FileWindow`], which lives in
//! `crate::io::window`): the validation of one flush ([`scan_flush`]), the replay of a validated flush, and the search for a
//! complete flush after damage that tells a torn tail from corruption.
//!
//! What must hold: a flush counts as complete only if every record in it
//! decodes, LSNs grow by one, the first record (and only it) carries
//! `FLAG_FIRST`, and a seal ends it on a block boundary describing exactly
//! this flush (start offset, first/last LSN, record count); a flush at
//! offset 0 must also carry a valid segment header for this shard and
//! segment. Nothing is replayed from a flush that is not complete.

use crate::error::Damage;
use crate::io::DiskFile;
use crate::wal::format::{
    decode_record, decode_segment_header, Decoded, Record, RecordKind, SegmentHeader, BLOCK_BYTES,
    FLAG_CHAIN_END, FLAG_EXPIRES, FLAG_FIRST, RECORD_HEADER_BYTES, SEGMENT_DATA_OFFSET,
};
use std::io;

#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use crate::io::window::{FileWindow, READ_CHUNK_BYTES};

/// What was found where a flush may start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlushScan {
    /// A complete, valid flush.
    Complete(FlushInfo),
    /// Nothing was ever written here.
    Zero,
    /// Not a complete flush; the first problem found.
    Damaged { offset: u64, reason: Damage },
}

/// A complete flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushInfo {
    pub start: u64,
    /// Offset just past its seal (block-aligned).
    pub end: u64,
    pub first_lsn: u64,
    pub last_lsn: u64,
    pub records: u32,
    /// What its seal says was in flight when it was submitted
    /// ([`crate::wal::format::SealInfo::lsns_in_flight`]).
    pub lsns_in_flight: u32,
    /// The segment header, when the flush starts at offset 0.
    pub header: Option<SegmentHeader>,
}

/// What a segment is expected to say about itself.
#[derive(Debug, Clone, Copy)]
pub struct SegmentIdentity {
    pub shard: u32,
    pub seq: u64,
}

fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// Validates the flush starting at the block-aligned `start` (see the
/// module doc for what "complete" means).
pub async fn scan_flush<F: DiskFile>(
    win: &mut FileWindow<'_, F>,
    start: u64,
    identity: SegmentIdentity,
) -> io::Result<FlushScan> {
    assert_eq!(start % BLOCK_BYTES as u64, 0);
    win.keep_from(start);
    let file_len = win.file_len();
    if start + RECORD_HEADER_BYTES as u64 > file_len {
        // No room for a record: the segment is full (or the file short).
        return Ok(FlushScan::Zero);
    }
    let mut header = None;
    let mut pos = start;
    if start == 0 {
        match read_segment_header(win, identity).await? {
            Ok(h) => header = Some(h),
            Err(scan) => return Ok(scan),
        }
        pos = SEGMENT_DATA_OFFSET;
    }
    let mut seen = FlushSoFar::default();
    loop {
        let damaged = |reason| {
            Ok(FlushScan::Damaged {
                offset: pos,
                reason,
            })
        };
        let rec = match read_record(win, pos, file_len).await? {
            Err(reason) => return damaged(reason),
            Ok(None) if seen.records == 0 && header.is_none() => return Ok(FlushScan::Zero),
            Ok(None) => return damaged(Damage::MissingSeal),
            Ok(Some(rec)) => rec,
        };
        if rec.kind == RecordKind::Seal {
            return match check_seal(&rec, pos, start, &seen) {
                Ok((end, lsns_in_flight)) => Ok(FlushScan::Complete(FlushInfo {
                    start,
                    end,
                    first_lsn: seen.first_lsn,
                    last_lsn: seen.last_lsn,
                    records: seen.records,
                    lsns_in_flight,
                    header,
                })),
                Err(reason) => damaged(reason),
            };
        }
        if let Err(reason) = seen.add(&rec, header.as_ref()) {
            return damaged(reason);
        }
        pos += rec.size as u64;
    }
}

/// The records of a flush read so far.
#[derive(Debug, Default)]
struct FlushSoFar {
    first_lsn: u64,
    last_lsn: u64,
    records: u32,
}

impl FlushSoFar {
    /// Takes the next record (not a seal): the first one starts the flush
    /// (and, in a segment's first flush, has the header's first LSN); each
    /// later one continues it with the next LSN.
    fn add(&mut self, rec: &RecordSummary, header: Option<&SegmentHeader>) -> Result<(), Damage> {
        if self.records == 0 {
            if !rec.first {
                return Err(Damage::FlushBoundary);
            }
            if let Some(h) = header {
                if h.first_lsn != rec.lsn {
                    return Err(Damage::SegmentLsnMismatch {
                        expected: h.first_lsn,
                        found: rec.lsn,
                    });
                }
            }
            self.first_lsn = rec.lsn;
        } else {
            if rec.first {
                return Err(Damage::FlushBoundary);
            }
            if rec.lsn != self.last_lsn.wrapping_add(1) {
                return Err(Damage::LsnGap {
                    expected: self.last_lsn.wrapping_add(1),
                    found: rec.lsn,
                });
            }
        }
        self.last_lsn = rec.lsn;
        self.records += 1;
        Ok(())
    }
}

/// Block 0 of a segment, for a flush at offset 0: its header, or what to
/// report instead (`Zero` for a segment never written or recycled and
/// waiting; `Damaged` for a bad or foreign header).
async fn read_segment_header<F: DiskFile>(
    win: &mut FileWindow<'_, F>,
    identity: SegmentIdentity,
) -> io::Result<Result<SegmentHeader, FlushScan>> {
    let block = win.get(0, BLOCK_BYTES).await?;
    Ok(match decode_segment_header(block) {
        // Never written (zero) or recycled and waiting (prepared): the
        // segment holds nothing of the current log. Its first flush writes
        // the header, so bytes after an unused header belong to no complete
        // flush.
        Ok(None) => Err(FlushScan::Zero),
        Ok(Some(h)) if h.is_prepared() => Err(FlushScan::Zero),
        Ok(Some(h)) if h.shard != identity.shard || h.seq != identity.seq => {
            Err(FlushScan::Damaged {
                offset: 0,
                reason: Damage::ForeignSegment {
                    expected_shard: identity.shard,
                    found_shard: h.shard,
                    expected_seq: identity.seq,
                    found_seq: h.seq,
                },
            })
        }
        Ok(Some(h)) => Ok(h),
        Err(reason) => Err(FlushScan::Damaged { offset: 0, reason }),
    })
}

/// The record at `pos`: `None` where the bytes are zero, or the damage
/// that stops it from decoding.
async fn read_record<F: DiskFile>(
    win: &mut FileWindow<'_, F>,
    pos: u64,
    file_len: u64,
) -> io::Result<Result<Option<RecordSummary>, Damage>> {
    let max_size = file_len.saturating_sub(pos).min(u64::from(u32::MAX)) as usize;
    let mut want = RECORD_HEADER_BYTES;
    loop {
        let bytes = win.get(pos, want).await?;
        return Ok(match decode_record(bytes, max_size) {
            Ok(Decoded::NeedMore { size }) if size > want && (size as u64) <= max_size as u64 => {
                want = size;
                continue;
            }
            Ok(Decoded::NeedMore { size }) => Err(Damage::BadRecordSize { size: size as u64 }),
            Ok(Decoded::Zero) => Ok(None),
            Ok(Decoded::Record(r)) => Ok(Some(summary(&r))),
            Err(d) => Err(d),
        });
    }
}

/// Checks a seal at `pos` against the flush it closes (which started at
/// `start`). Returns the offset just past it and the seal's count of LSNs
/// in flight.
fn check_seal(
    rec: &RecordSummary,
    pos: u64,
    start: u64,
    seen: &FlushSoFar,
) -> Result<(u64, u32), Damage> {
    if seen.records == 0 {
        return Err(Damage::FlushBoundary);
    }
    let end = pos + rec.size as u64;
    if !end.is_multiple_of(BLOCK_BYTES as u64) {
        return Err(Damage::SealMismatch {
            field: "end offset alignment",
            expected: 0,
            found: end % BLOCK_BYTES as u64,
        });
    }
    let seal = rec.seal.expect("seal info for seals");
    for (field, expected, found) in [
        ("flush_offset", start, seal.flush_offset),
        ("first_lsn", seen.first_lsn, seal.first_lsn),
        ("last_lsn", seen.last_lsn, seal.last_lsn),
        (
            "record_count",
            u64::from(seen.records),
            u64::from(seal.record_count),
        ),
    ] {
        if expected != found {
            return Err(Damage::SealMismatch {
                field,
                expected,
                found,
            });
        }
    }
    Ok((end, seal.lsns_in_flight))
}

/// The parts of a record `scan_flush` needs after the borrow of the window ends.
struct RecordSummary {
    kind: RecordKind,
    size: usize,
    lsn: u64,
    first: bool,
    seal: Option<crate::wal::format::SealInfo>,
}

fn summary(r: &Record<'_>) -> RecordSummary {
    RecordSummary {
        kind: r.kind,
        size: r.size,
        lsn: r.lsn,
        first: r.flags & FLAG_FIRST != 0,
        seal: (r.kind == RecordKind::Seal).then(|| r.seal_info()),
    }
}

/// Calls `apply` for every data record of a flush `scan_flush` found
/// complete. Returns the bytes of the records applied.
pub async fn replay_flush<F: DiskFile>(
    win: &mut FileWindow<'_, F>,
    flush: &FlushInfo,
    apply: &mut dyn FnMut(&Record<'_>),
) -> io::Result<u64> {
    let mut pos = if flush.start == 0 {
        SEGMENT_DATA_OFFSET
    } else {
        flush.start
    };
    let mut bytes = 0u64;
    loop {
        let max_size = (flush.end - pos) as usize;
        let mut want = RECORD_HEADER_BYTES;
        loop {
            let slice = win.get(pos, want).await?;
            match decode_record(slice, max_size) {
                Ok(Decoded::NeedMore { size }) => {
                    assert!(size > want, "validated flush re-read differently");
                    want = size;
                }
                Ok(Decoded::Record(r)) => {
                    if r.kind == RecordKind::Seal {
                        assert_eq!(pos + r.size as u64, flush.end);
                        return Ok(bytes);
                    }
                    apply(&r);
                    bytes += r.size as u64;
                    pos += r.size as u64;
                    break;
                }
                other => {
                    // The bytes were validated moments ago and kept in
                    // memory: a different answer is a broken invariant.
                    panic!("validated flush re-read differently at offset {pos}: {other:?}");
                }
            }
        }
    }
}

/// Whether the 32 bytes at a block boundary could start a flush: a
/// first-of-flush Put/Delete/TxnPart/Chunk header with zero reserved bits
/// (a Put may also carry `FLAG_EXPIRES` and `FLAG_CHAIN_END`). Cheap filter
/// before a full decode, so garbage never drives large reads.
fn plausible_flush_start(head: &[u8], max_size: u64) -> bool {
    if head.len() < RECORD_HEADER_BYTES {
        return false;
    }
    let mut w = [0u8; 4];
    w.copy_from_slice(&head[4..8]);
    let size = u64::from(u32::from_le_bytes(w));
    w.copy_from_slice(&head[28..32]);
    let key_len = u64::from(u32::from_le_bytes(w));
    let kind = head[24];
    let flags = head[25];
    let flags_ok = if kind == RecordKind::Put as u8 {
        flags & !(FLAG_EXPIRES | FLAG_CHAIN_END) == FLAG_FIRST
    } else if kind == RecordKind::Chunk as u8 {
        flags == FLAG_FIRST && key_len == 0
    } else {
        (kind == RecordKind::Delete as u8 || kind == RecordKind::TxnPart as u8)
            && flags == FLAG_FIRST
    };
    flags_ok
        && head[26] == 0
        && head[27] == 0
        && size >= RECORD_HEADER_BYTES as u64
        && size <= max_size
        && key_len <= size - RECORD_HEADER_BYTES as u64
}

/// Result of looking past the end of the valid log.
#[derive(Debug, Default)]
pub struct TailScan {
    /// A complete flush whose LSNs lie after the log's end and whose seal
    /// does not place it in the in-flight window of the hole, if any: the
    /// proof that records after the hole had been durable (corruption).
    pub complete_flush_at: Option<u64>,
    /// Complete flushes with LSNs after the log's end that their seals
    /// prove were in flight together with the hole's flush (see
    /// [`in_flight_with_hole`]): a torn in-flight window, never
    /// acknowledged.
    pub window_flushes: u32,
    /// From the start of the first window flush to the end of the last.
    pub window: Option<(u64, u64)>,
    /// Offset just past the last block holding a non-zero byte (at or
    /// after `from`), or `from` if all zero.
    pub nonzero_end: u64,
}

/// The in-flight window rule (`docs/wal.md`, "Several flushes in flight"):
/// a complete flush found after a hole at LSN `after_lsn + 1` is part of a
/// torn in-flight window only if its seal proves that the hole's LSN was
/// not yet durable when it was submitted. Then nothing at or after the
/// hole was ever acknowledged. A seal written with one flush in flight (or
/// before format 4) claims no window, so any such flush after a hole is
/// proof of damage, as it always was.
pub fn in_flight_with_hole(flush: &FlushInfo, after_lsn: u64) -> bool {
    let seal = crate::wal::format::SealInfo {
        flush_offset: flush.start,
        first_lsn: flush.first_lsn,
        last_lsn: flush.last_lsn,
        record_count: flush.records,
        lsns_in_flight: flush.lsns_in_flight,
    };
    seal.durable_at_submit()
        .is_some_and(|durable| durable <= after_lsn)
}

/// Scans the block boundaries of `[from, file_len)` for complete flushes
/// with `first_lsn > after_lsn`, sorts them by [`in_flight_with_hole`],
/// and notes how far non-zero bytes reach.
pub async fn scan_tail<F: DiskFile>(
    win: &mut FileWindow<'_, F>,
    from: u64,
    after_lsn: u64,
    identity: SegmentIdentity,
) -> io::Result<TailScan> {
    assert_eq!(from % BLOCK_BYTES as u64, 0);
    let mut out = TailScan {
        complete_flush_at: None,
        window_flushes: 0,
        window: None,
        nonzero_end: from,
    };
    let mut block_start = from;
    while block_start < win.file_len() {
        win.keep_from(block_start);
        let max_size = win.file_len() - block_start;
        let block = win.get(block_start, BLOCK_BYTES).await?;
        if block.is_empty() {
            break;
        }
        let mut next = block_start + BLOCK_BYTES as u64;
        if !is_zero(block) {
            out.nonzero_end = next;
            let candidate = if block_start == 0 {
                true
            } else {
                plausible_flush_start(&block[..RECORD_HEADER_BYTES.min(block.len())], max_size)
            };
            if candidate && out.complete_flush_at.is_none() {
                if let FlushScan::Complete(info) = scan_flush(win, block_start, identity).await? {
                    if info.first_lsn > after_lsn {
                        if in_flight_with_hole(&info, after_lsn) {
                            out.window_flushes += 1;
                            let first = out.window.map_or(block_start, |w| w.0);
                            out.window = Some((first, info.end));
                            // Its blocks hold nothing else; go on after it.
                            out.nonzero_end = info.end;
                            next = info.end;
                        } else {
                            out.complete_flush_at = Some(block_start);
                        }
                    }
                }
            }
        }
        block_start = next;
    }
    Ok(out)
}
