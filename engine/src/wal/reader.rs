//! Reading WAL segments back: a forward-sliding window over a file
//! ([`FileWindow`], also used for snapshots), the validation of one flush
//! ([`scan_flush`]), the replay of a validated flush, and the search for a
//! complete flush after damage that tells a torn tail from corruption.
//!
//! What must hold: a flush counts as complete only if every record in it
//! decodes, LSNs grow by one, the first record (and only it) carries
//! `FLAG_FIRST`, and a seal ends it on a block boundary describing exactly
//! this flush (start offset, first/last LSN, record count); a flush at
//! offset 0 must also carry a valid segment header for this shard and
//! segment. Nothing is replayed from a flush that is not complete.

use crate::error::Damage;
use crate::io::{AlignedBuf, DiskFile, ALIGN};
use crate::wal::format::{
    decode_record, decode_segment_header, Decoded, Record, RecordKind, SegmentHeader, BLOCK_BYTES,
    FLAG_EXPIRES, FLAG_FIRST, RECORD_HEADER_BYTES, SEGMENT_DATA_OFFSET,
};
use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Bytes read from disk at a time.
pub const READ_CHUNK_BYTES: usize = 1 << 20;
const _: () = assert!(READ_CHUNK_BYTES % ALIGN == 0);

fn align_down(n: u64) -> u64 {
    n - n % ALIGN as u64
}

/// A read of one chunk that is in flight (or already done) while the caller
/// works on the chunks before it.
type ChunkRead<'a> = Pin<Box<dyn Future<Output = (io::Result<usize>, AlignedBuf)> + 'a>>;

/// The read of the chunk after the last one taken into the window.
struct ReadAhead<'a> {
    offset: u64,
    read: ChunkRead<'a>,
}

/// A window over a file that slides forward: `get(offset, len)` returns the
/// bytes `[offset, offset + len)` (fewer at end of file), reading aligned
/// chunks as needed. Bytes before `min(offset, keep_from)` may be dropped.
///
/// Double buffered: whenever a full chunk arrives, the read of the next one
/// is started before `get` returns, so the disk reads chunk n + 1 while the
/// caller parses chunk n. A read-ahead's result (data or error) is used
/// only if the caller then asks for that chunk, so reading ahead never
/// changes what a caller sees.
pub struct FileWindow<'a, F: DiskFile> {
    file: &'a F,
    path: &'a Path,
    file_len: u64,
    start: u64,
    data: Vec<u8>,
    keep_from: u64,
    /// Chunk buffers not in use by a read (at most two exist).
    spare: Vec<AlignedBuf>,
    ahead: Option<ReadAhead<'a>>,
    bytes_read: u64,
}

impl<'a, F: DiskFile> FileWindow<'a, F> {
    pub async fn new(file: &'a F, path: &'a Path) -> io::Result<FileWindow<'a, F>> {
        let file_len = file.len().await?;
        Ok(FileWindow {
            file,
            path,
            file_len,
            start: 0,
            data: Vec::new(),
            keep_from: u64::MAX,
            spare: vec![AlignedBuf::with_capacity(READ_CHUNK_BYTES)],
            ahead: None,
            bytes_read: 0,
        })
    }

    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    pub fn path(&self) -> &Path {
        self.path
    }

    /// Bytes read from disk so far (chunks taken into the window; a
    /// read-ahead counts once it is used).
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// Keep bytes from `offset` on in memory (until changed).
    pub fn keep_from(&mut self, offset: u64) {
        self.keep_from = offset;
    }

    fn spare_buf(&mut self) -> AlignedBuf {
        self.spare
            .pop()
            .unwrap_or_else(|| AlignedBuf::with_capacity(READ_CHUNK_BYTES))
    }

    /// The chunk at `at`: the read-ahead if it is for `at`, else a new read
    /// (a read-ahead for another offset is waited for and dropped).
    async fn read_chunk(&mut self, at: u64) -> (io::Result<usize>, AlignedBuf) {
        if let Some(ahead) = self.ahead.take() {
            let (res, buf) = ahead.read.await;
            if ahead.offset == at {
                return (res, buf);
            }
            self.spare.push(buf);
        }
        let buf = self.spare_buf();
        self.file.read_at(buf, at).await
    }

    /// Starts reading the chunk at `at` and hands it to the backend before
    /// returning (polled once, then the backend's queue is submitted), so
    /// the read proceeds while the caller computes.
    fn read_ahead(&mut self, at: u64) {
        assert!(self.ahead.is_none(), "one read-ahead at a time");
        let buf = self.spare_buf();
        let mut read: ChunkRead<'a> = Box::pin(self.file.read_at(buf, at));
        let mut cx = Context::from_waker(Waker::noop());
        if let Poll::Ready(done) = read.as_mut().poll(&mut cx) {
            read = Box::pin(std::future::ready(done));
        } else {
            crate::io::submit_queued();
        }
        self.ahead = Some(ReadAhead { offset: at, read });
    }

    pub async fn get(&mut self, offset: u64, len: usize) -> io::Result<&[u8]> {
        let end = (offset.saturating_add(len as u64)).min(self.file_len);
        if offset < self.start {
            self.start = align_down(offset.min(self.keep_from));
            self.data.clear();
        }
        while self.start + (self.data.len() as u64) < end {
            let drop_to = align_down(offset.min(self.keep_from));
            if drop_to > self.start {
                let n = ((drop_to - self.start) as usize).min(self.data.len());
                self.data.drain(..n);
                self.start += n as u64;
            }
            let at = self.start + self.data.len() as u64;
            assert_eq!(at % ALIGN as u64, 0, "window reads stay aligned");
            let (res, buf) = self.read_chunk(at).await;
            let got = match res {
                Ok(n) => n,
                Err(e) => {
                    self.spare.push(buf);
                    return Err(e);
                }
            };
            self.data.extend_from_slice(&buf.as_slice()[..got]);
            self.spare.push(buf);
            self.bytes_read += got as u64;
            if got < READ_CHUNK_BYTES {
                // End of file (or a file shorter than its stat said).
                self.file_len = self.file_len.min(at + got as u64);
                break;
            }
            let next = at + READ_CHUNK_BYTES as u64;
            if next < self.file_len {
                self.read_ahead(next);
            }
        }
        let from = (offset.saturating_sub(self.start) as usize).min(self.data.len());
        let to = (end.saturating_sub(self.start) as usize).clamp(from, self.data.len());
        Ok(&self.data[from..to])
    }
}

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
        let block = win.get(0, BLOCK_BYTES).await?;
        match decode_segment_header(block) {
            // Never written (zero) or recycled and waiting (prepared): the
            // segment holds nothing of the current log. Its first flush
            // writes the header, so bytes after an unused header belong to
            // no complete flush.
            Ok(None) => return Ok(FlushScan::Zero),
            Ok(Some(h)) if h.is_prepared() => return Ok(FlushScan::Zero),
            Ok(Some(h)) => {
                if h.shard != identity.shard || h.seq != identity.seq {
                    return Ok(FlushScan::Damaged {
                        offset: 0,
                        reason: Damage::ForeignSegment {
                            expected_shard: identity.shard,
                            found_shard: h.shard,
                            expected_seq: identity.seq,
                            found_seq: h.seq,
                        },
                    });
                }
                header = Some(h);
            }
            Err(reason) => return Ok(FlushScan::Damaged { offset: 0, reason }),
        }
        pos = SEGMENT_DATA_OFFSET;
    }
    let mut first_lsn = 0u64;
    let mut last_lsn = 0u64;
    let mut records = 0u32;
    loop {
        let max_size = file_len.saturating_sub(pos).min(u64::from(u32::MAX)) as usize;
        let mut want = RECORD_HEADER_BYTES;
        let decoded = loop {
            let bytes = win.get(pos, want).await?;
            match decode_record(bytes, max_size) {
                Ok(Decoded::NeedMore { size })
                    if size > want && (size as u64) <= max_size as u64 =>
                {
                    want = size;
                }
                Ok(Decoded::NeedMore { size }) => {
                    break Err(Damage::BadRecordSize { size: size as u64 });
                }
                Ok(Decoded::Zero) => break Ok(None),
                Ok(Decoded::Record(r)) => break Ok(Some(summary(&r))),
                Err(d) => break Err(d),
            }
        };
        let rec = match decoded {
            Err(reason) => {
                return Ok(FlushScan::Damaged {
                    offset: pos,
                    reason,
                })
            }
            Ok(None) if records == 0 && header.is_none() => return Ok(FlushScan::Zero),
            Ok(None) => {
                return Ok(FlushScan::Damaged {
                    offset: pos,
                    reason: Damage::MissingSeal,
                })
            }
            Ok(Some(rec)) => rec,
        };
        if rec.kind == RecordKind::Seal {
            let damaged = |reason| {
                Ok(FlushScan::Damaged {
                    offset: pos,
                    reason,
                })
            };
            if records == 0 {
                return damaged(Damage::FlushBoundary);
            }
            let end = pos + rec.size as u64;
            if end % BLOCK_BYTES as u64 != 0 {
                return damaged(Damage::SealMismatch {
                    field: "end offset alignment",
                    expected: 0,
                    found: end % BLOCK_BYTES as u64,
                });
            }
            let seal = rec.seal.expect("seal info for seals");
            for (field, expected, found) in [
                ("flush_offset", start, seal.flush_offset),
                ("first_lsn", first_lsn, seal.first_lsn),
                ("last_lsn", last_lsn, seal.last_lsn),
                (
                    "record_count",
                    u64::from(records),
                    u64::from(seal.record_count),
                ),
            ] {
                if expected != found {
                    return damaged(Damage::SealMismatch {
                        field,
                        expected,
                        found,
                    });
                }
            }
            return Ok(FlushScan::Complete(FlushInfo {
                start,
                end,
                first_lsn,
                last_lsn,
                records,
                header,
            }));
        }
        if records == 0 {
            if !rec.first {
                return Ok(FlushScan::Damaged {
                    offset: pos,
                    reason: Damage::FlushBoundary,
                });
            }
            if let Some(h) = header {
                if h.first_lsn != rec.lsn {
                    return Ok(FlushScan::Damaged {
                        offset: pos,
                        reason: Damage::SegmentLsnMismatch {
                            expected: h.first_lsn,
                            found: rec.lsn,
                        },
                    });
                }
            }
            first_lsn = rec.lsn;
        } else {
            if rec.first {
                return Ok(FlushScan::Damaged {
                    offset: pos,
                    reason: Damage::FlushBoundary,
                });
            }
            if rec.lsn != last_lsn.wrapping_add(1) {
                return Ok(FlushScan::Damaged {
                    offset: pos,
                    reason: Damage::LsnGap {
                        expected: last_lsn.wrapping_add(1),
                        found: rec.lsn,
                    },
                });
            }
        }
        last_lsn = rec.lsn;
        records += 1;
        pos += rec.size as u64;
    }
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
/// first-of-flush Put/Delete header with zero reserved bits (a Put may
/// also carry `FLAG_EXPIRES`). Cheap filter
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
        flags & !FLAG_EXPIRES == FLAG_FIRST
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
    /// A complete flush whose LSNs lie after the log's end, if any.
    pub complete_flush_at: Option<u64>,
    /// Offset just past the last block holding a non-zero byte (at or
    /// after `from`), or `from` if all zero.
    pub nonzero_end: u64,
}

/// Scans the block boundaries of `[from, file_len)` for a complete flush
/// with `first_lsn > after_lsn`, and notes how far non-zero bytes reach.
pub async fn scan_tail<F: DiskFile>(
    win: &mut FileWindow<'_, F>,
    from: u64,
    after_lsn: u64,
    identity: SegmentIdentity,
) -> io::Result<TailScan> {
    assert_eq!(from % BLOCK_BYTES as u64, 0);
    let mut out = TailScan {
        complete_flush_at: None,
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
        if !is_zero(block) {
            out.nonzero_end = block_start + BLOCK_BYTES as u64;
            let candidate = if block_start == 0 {
                true
            } else {
                plausible_flush_start(&block[..RECORD_HEADER_BYTES.min(block.len())], max_size)
            };
            if candidate && out.complete_flush_at.is_none() {
                if let FlushScan::Complete(info) = scan_flush(win, block_start, identity).await? {
                    if info.first_lsn > after_lsn {
                        out.complete_flush_at = Some(block_start);
                    }
                }
            }
        }
        block_start += BLOCK_BYTES as u64;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::real::RealDisk;
    use crate::io::sim::SimDisk;
    use crate::io::Disk;

    /// The window hands out the file's bytes whatever the read-ahead did:
    /// across chunk boundaries, after a backward seek, and at the end.
    async fn window_reads_the_file<D: Disk>(disk: &D, dir: &Path) {
        disk.create_dir_all(dir).expect("dir");
        let path = dir.join("f");
        let file = disk.open(&path, true).await.expect("open");
        let len = 3 * READ_CHUNK_BYTES + 5 * ALIGN;
        let image: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut buf = AlignedBuf::with_capacity(len);
        buf.extend_from_slice(&image);
        let (res, _) = file.write_at(buf, 0).await;
        res.expect("write");
        let mut win = FileWindow::new(&file, &path).await.expect("window");
        let reads = [
            (0u64, 100usize),
            (READ_CHUNK_BYTES as u64 - 10, 20),
            (2 * READ_CHUNK_BYTES as u64 + 3, READ_CHUNK_BYTES),
            (10, 4096), // backward
            (len as u64 - 7, 100),
            (len as u64 + 1, 10),
        ];
        for (offset, want) in reads {
            let got = win.get(offset, want).await.expect("get").to_vec();
            let from = (offset as usize).min(len);
            let to = (offset as usize + want).min(len);
            assert_eq!(got, image[from..to], "offset {offset} len {want}");
        }
    }

    #[test]
    fn window_reads_the_same_bytes_with_read_ahead_sim() {
        let rt = compio::runtime::Runtime::new().expect("runtime");
        rt.block_on(window_reads_the_file(&SimDisk::new(7), Path::new("/w")));
    }

    /// On a real file the read-ahead is in flight while `get` returns.
    #[test]
    fn window_reads_the_same_bytes_with_read_ahead_real() {
        let target = concat!(env!("CARGO_MANIFEST_DIR"), "/../target");
        std::fs::create_dir_all(target).expect("target dir");
        let tmp = tempfile::tempdir_in(target).expect("tempdir");
        let rt = compio::runtime::Runtime::new().expect("runtime");
        rt.block_on(window_reads_the_file(&RealDisk, tmp.path()));
    }
}
