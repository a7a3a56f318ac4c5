//! WAL byte layouts: the segment header block, data records and the seal
//! record that closes every flush. All integers are little-endian. A record
//! is valid only if its CRC32 (IEEE, crc32fast) over every byte after the
//! checksum field matches; the decoder never trusts a length it has not
//! bounds-checked. The diagrams live in `docs/wal.md`.

use crate::error::Damage;
use crate::io::ALIGN;

/// Unit of every WAL write: flushes start and end on block boundaries.
pub const BLOCK_BYTES: usize = ALIGN;
/// Physical sector size the format assumes is written atomically (or not at all).
pub const SECTOR_BYTES: usize = 4096;
const _: () = assert!(BLOCK_BYTES.is_multiple_of(SECTOR_BYTES));

use crate::layout::DirId;
/// The format version is shared with snapshot files, so it is defined in
/// `crate::layout`, below both.
pub use crate::layout::{FORMAT_VERSION, FORMAT_VERSION_DIR_ID, FORMAT_VERSION_MIN};

/// First bytes of every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"RINGKVWL";
/// Bytes of the segment header that carry data; the rest of block 0 is zero.
/// Format 5: the format 4 header (its CRC at 44 over bytes 0..44, where a
/// format 4 build checks it before it refuses the version), the directory
/// identity u64 at 48 and a CRC-32 of bytes 0..56 at 56.
pub const SEGMENT_HEADER_BYTES: usize = 60;
/// Bytes of a segment header before format 5 (no directory identity).
const SEGMENT_HEADER_BYTES_V4: usize = 48;
/// Segment header flag: the file was recycled from an older segment, so the
/// bytes after the end of its log may be stale records of an older
/// generation (all with LSNs below this segment's first LSN).
pub const SEGMENT_FLAG_RECYCLED: u32 = 0x1;
const SEGMENT_FLAGS_KNOWN: u32 = SEGMENT_FLAG_RECYCLED;
/// Records start after the header block.
pub const SEGMENT_DATA_OFFSET: u64 = BLOCK_BYTES as u64;
const _: () = assert!(SEGMENT_HEADER_BYTES <= BLOCK_BYTES);

/// Fixed header of every record.
pub const RECORD_HEADER_BYTES: usize = 32;
/// Payload of a seal: flush offset u64, first LSN u64, record count u32,
/// LSNs in flight u32 (format 4; zero before).
pub const SEAL_PAYLOAD_BYTES: usize = 24;
/// Smallest seal record.
pub const SEAL_MIN_BYTES: usize = RECORD_HEADER_BYTES + SEAL_PAYLOAD_BYTES;
/// Largest seal record (`seal_size` never returns more).
pub const SEAL_MAX_BYTES: usize = SEAL_MIN_BYTES - 1 + BLOCK_BYTES;
/// Bytes a flush buffer keeps free for its seal.
pub const SEAL_RESERVE_BYTES: usize = SEAL_MAX_BYTES;
const _: () = assert!(SEAL_MIN_BYTES < BLOCK_BYTES);

/// Flag bit: this record is the first of its flush (it starts on a block boundary).
pub const FLAG_FIRST: u8 = 0x01;
/// Flag bit (Put records only, format 2): the value field starts with the
/// key's expiry time, u64 LE Unix milliseconds, followed by the value.
pub const FLAG_EXPIRES: u8 = 0x02;
/// Bytes of the expiry field of a `FLAG_EXPIRES` record.
pub const EXPIRY_BYTES: usize = 8;
/// Flag bit (Put records only, format 3): the Put ends a chunk chain. Its
/// value field holds (after the expiry, if any) the LSN of the chain's
/// first `Chunk` record, u64 LE, then the value's last bytes; the value is
/// the chain's chunks in LSN order followed by those bytes.
pub const FLAG_CHAIN_END: u8 = 0x04;
/// Bytes of the chain-start field of a `FLAG_CHAIN_END` Put.
pub const CHAIN_START_BYTES: usize = 8;
/// Most value bytes one chunk chain may carry (the largest value the
/// config allows, `limits.value_bytes_max` at most 512 MiB). Recovery
/// refuses a longer chain instead of growing its buffer without bound.
pub const CHAIN_BYTES_MAX: usize = 512 << 20;
const RECORD_FLAGS_KNOWN: u8 = FLAG_FIRST | FLAG_EXPIRES | FLAG_CHAIN_END;

/// What a record does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// Sets a key to a value.
    Put = 1,
    /// Removes a key (no value).
    Delete = 2,
    /// Closes a flush and pads it to a block boundary; consumes no LSN.
    Seal = 3,
    /// One shard's part of a committed transaction: the key field holds the
    /// part header (transaction id, participant shards), the value field the
    /// writes (see `crate::txn::record` and `docs/wal.md`).
    TxnPart = 4,
    /// Format 3: a piece of a value too large for one flush buffer (no key;
    /// the value field holds the piece). Chunks of one value have
    /// consecutive LSNs and are followed by the `FLAG_CHAIN_END` Put that
    /// names the first of them; see `docs/wal.md`, "Chunk chains".
    Chunk = 5,
}

impl RecordKind {
    fn from_u8(kind: u8) -> Option<RecordKind> {
        match kind {
            1 => Some(RecordKind::Put),
            2 => Some(RecordKind::Delete),
            3 => Some(RecordKind::Seal),
            4 => Some(RecordKind::TxnPart),
            5 => Some(RecordKind::Chunk),
            _ => None,
        }
    }
}

/// Total bytes of a data record.
#[inline]
pub fn record_size(key_len: usize, value_len: usize) -> usize {
    RECORD_HEADER_BYTES + key_len + value_len
}

/// Total bytes of a Put record carrying an expiry time.
#[inline]
pub fn record_size_expiring(key_len: usize, value_len: usize, expires_at_ms: Option<u64>) -> usize {
    record_size(key_len, value_len) + expires_at_ms.map_or(0, |_| EXPIRY_BYTES)
}

/// Writes one data record at the start of `out` and returns its size.
/// `out` must hold at least `record_size(key.len(), value.len())` bytes.
#[inline]
pub fn encode_record(
    out: &mut [u8],
    lsn: u64,
    commit_version: u64,
    kind: RecordKind,
    flags: u8,
    key: &[u8],
    value: &[u8],
) -> usize {
    encode_record_expiring(out, lsn, commit_version, kind, flags, key, value, None)
}

/// [`encode_record`] for a Put that may carry an expiry time (absolute Unix
/// milliseconds): with one, the record gets `FLAG_EXPIRES` and the expiry
/// leads its value field. `out` must hold
/// `record_size_expiring(key.len(), value.len(), expires_at_ms)` bytes.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn encode_record_expiring(
    out: &mut [u8],
    lsn: u64,
    commit_version: u64,
    kind: RecordKind,
    flags: u8,
    key: &[u8],
    value: &[u8],
    expires_at_ms: Option<u64>,
) -> usize {
    assert!(kind != RecordKind::Seal, "seals are written by encode_seal");
    assert!(
        kind != RecordKind::Chunk,
        "chunks are written by encode_chunk"
    );
    assert!(matches!(kind, RecordKind::Put | RecordKind::TxnPart) || value.is_empty());
    assert!(kind == RecordKind::Put || expires_at_ms.is_none());
    encode_fields(
        out,
        RecordHead {
            lsn,
            commit_version,
            kind,
            flags,
        },
        key,
        expires_at_ms,
        None,
        value,
    )
}

/// Total bytes of a `Chunk` record carrying `piece_len` value bytes.
#[inline]
pub fn chunk_record_size(piece_len: usize) -> usize {
    RECORD_HEADER_BYTES + piece_len
}

/// Total bytes of the `FLAG_CHAIN_END` Put that closes a chain.
#[inline]
pub fn chain_end_size(key_len: usize, tail_len: usize, expires_at_ms: Option<u64>) -> usize {
    record_size_expiring(key_len, tail_len, expires_at_ms) + CHAIN_START_BYTES
}

/// Writes a `Chunk` record holding `piece` at the start of `out` and
/// returns its size.
pub fn encode_chunk(
    out: &mut [u8],
    lsn: u64,
    commit_version: u64,
    flags: u8,
    piece: &[u8],
) -> usize {
    let head = RecordHead {
        lsn,
        commit_version,
        kind: RecordKind::Chunk,
        flags,
    };
    encode_fields(out, head, b"", None, None, piece)
}

/// Writes the Put that ends the chain whose first chunk has LSN
/// `chain_first_lsn` (below `lsn`): the key, the expiry if any, and the
/// value's last bytes `tail`. Returns its size.
#[allow(clippy::too_many_arguments)]
pub fn encode_chain_end(
    out: &mut [u8],
    lsn: u64,
    commit_version: u64,
    flags: u8,
    key: &[u8],
    tail: &[u8],
    expires_at_ms: Option<u64>,
    chain_first_lsn: u64,
) -> usize {
    assert!(
        chain_first_lsn > 0 && chain_first_lsn < lsn,
        "a chain ends after its chunks"
    );
    let head = RecordHead {
        lsn,
        commit_version,
        kind: RecordKind::Put,
        flags: flags | FLAG_CHAIN_END,
    };
    encode_fields(out, head, key, expires_at_ms, Some(chain_first_lsn), tail)
}

/// The fixed fields of a record header.
#[derive(Clone, Copy)]
struct RecordHead {
    lsn: u64,
    commit_version: u64,
    kind: RecordKind,
    flags: u8,
}

/// Writes a record: header, key, the optional expiry and chain-start
/// fields, then `value`; sets the checksum last.
fn encode_fields(
    out: &mut [u8],
    head: RecordHead,
    key: &[u8],
    expires_at_ms: Option<u64>,
    chain_first_lsn: Option<u64>,
    value: &[u8],
) -> usize {
    assert_eq!(
        head.flags & FLAG_EXPIRES,
        0,
        "FLAG_EXPIRES follows expires_at_ms"
    );
    assert_eq!(
        head.flags & FLAG_CHAIN_END != 0,
        chain_first_lsn.is_some(),
        "FLAG_CHAIN_END goes with a chain start"
    );
    let flags = head.flags | expires_at_ms.map_or(0, |_| FLAG_EXPIRES);
    let size = record_size_expiring(key.len(), value.len(), expires_at_ms)
        + chain_first_lsn.map_or(0, |_| CHAIN_START_BYTES);
    let size_u32 = u32::try_from(size).expect("record larger than 4 GiB");
    let key_len = u32::try_from(key.len()).expect("key larger than 4 GiB");
    let out = &mut out[..size];
    out[4..8].copy_from_slice(&size_u32.to_le_bytes());
    out[8..16].copy_from_slice(&head.lsn.to_le_bytes());
    out[16..24].copy_from_slice(&head.commit_version.to_le_bytes());
    out[24] = head.kind as u8;
    out[25] = flags;
    out[26..28].copy_from_slice(&[0, 0]);
    out[28..32].copy_from_slice(&key_len.to_le_bytes());
    let mut at = RECORD_HEADER_BYTES + key.len();
    out[RECORD_HEADER_BYTES..at].copy_from_slice(key);
    if let Some(expiry) = expires_at_ms {
        out[at..at + EXPIRY_BYTES].copy_from_slice(&expiry.to_le_bytes());
        at += EXPIRY_BYTES;
    }
    if let Some(first) = chain_first_lsn {
        out[at..at + CHAIN_START_BYTES].copy_from_slice(&first.to_le_bytes());
        at += CHAIN_START_BYTES;
    }
    out[at..].copy_from_slice(value);
    let crc = crc32fast::hash(&out[4..]);
    out[0..4].copy_from_slice(&crc.to_le_bytes());
    size
}

/// Size of the seal that closes a flush whose records end `used` bytes
/// after the flush start (`used` counts the header block too, if any):
/// the seal pads to the next block boundary, spilling into one more block
/// when the gap is smaller than a minimal seal.
#[inline]
pub fn seal_size(used: usize) -> usize {
    let gap = used.next_multiple_of(BLOCK_BYTES) - used;
    let size = if gap >= SEAL_MIN_BYTES {
        gap
    } else {
        gap + BLOCK_BYTES
    };
    debug_assert!((SEAL_MIN_BYTES..=SEAL_MAX_BYTES).contains(&size));
    size
}

/// What a seal says about its flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealInfo {
    /// File offset where the flush starts (0 when it carries the segment header).
    pub flush_offset: u64,
    /// LSN of the flush's first record.
    pub first_lsn: u64,
    /// LSN of the flush's last record.
    pub last_lsn: u64,
    /// Data records in the flush.
    pub record_count: u32,
    /// How many LSNs right before this flush's first were logged but not
    /// yet durable when this flush was submitted: the records of the
    /// flushes still in flight with it. Zero with one flush in flight
    /// (and in every log written before format 4). Recovery uses it to
    /// tell a torn in-flight window from damage (`docs/wal.md`).
    pub lsns_in_flight: u32,
}

impl SealInfo {
    /// The durable LSN when this flush was submitted, as the seal proves
    /// it (`None` if the field claims more LSNs than precede the flush:
    /// such a seal proves nothing).
    pub fn durable_at_submit(&self) -> Option<u64> {
        self.first_lsn
            .checked_sub(1)?
            .checked_sub(u64::from(self.lsns_in_flight))
    }
}

/// Writes a seal filling all of `out` (whose length came from `seal_size`).
pub fn encode_seal(out: &mut [u8], seal: &SealInfo) {
    let size = out.len();
    assert!((SEAL_MIN_BYTES..=SEAL_MAX_BYTES).contains(&size));
    out.fill(0);
    out[4..8].copy_from_slice(&(size as u32).to_le_bytes());
    out[8..16].copy_from_slice(&seal.last_lsn.to_le_bytes());
    out[24] = RecordKind::Seal as u8;
    let p = RECORD_HEADER_BYTES;
    out[p..p + 8].copy_from_slice(&seal.flush_offset.to_le_bytes());
    out[p + 8..p + 16].copy_from_slice(&seal.first_lsn.to_le_bytes());
    out[p + 16..p + 20].copy_from_slice(&seal.record_count.to_le_bytes());
    out[p + 20..p + 24].copy_from_slice(&seal.lsns_in_flight.to_le_bytes());
    let crc = crc32fast::hash(&out[4..]);
    out[0..4].copy_from_slice(&crc.to_le_bytes());
}

/// A decoded record borrowing its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub size: usize,
    pub lsn: u64,
    pub commit_version: u64,
    pub kind: RecordKind,
    pub flags: u8,
    pub key: &'a [u8],
    /// The value (after the expiry field, when the record has one).
    pub value: &'a [u8],
    /// The key's expiry time (absolute Unix ms) of a `FLAG_EXPIRES` Put.
    pub expires_at_ms: Option<u64>,
    /// The LSN of the first chunk of the chain a `FLAG_CHAIN_END` Put
    /// closes (`value` then holds only the value's last bytes).
    pub chain_first_lsn: Option<u64>,
}

impl Record<'_> {
    pub fn is_first(&self) -> bool {
        self.flags & FLAG_FIRST != 0
    }

    /// The seal's description of its flush (only for `RecordKind::Seal`).
    pub fn seal_info(&self) -> SealInfo {
        assert_eq!(self.kind, RecordKind::Seal);
        let v = self.value;
        SealInfo {
            flush_offset: u64::from_le_bytes(le8(&v[0..8])),
            first_lsn: u64::from_le_bytes(le8(&v[8..16])),
            last_lsn: self.lsn,
            record_count: u32::from_le_bytes(le4(&v[16..20])),
            lsns_in_flight: u32::from_le_bytes(le4(&v[20..24])),
        }
    }
}

/// Result of looking at the bytes where a record may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// The header is all zero: nothing was ever written here.
    Zero,
    /// A valid record.
    Record(Record<'a>),
    /// The header is plausible but the record is `size` bytes and `bytes`
    /// holds fewer: fetch more and decode again.
    NeedMore { size: usize },
}

fn le4(b: &[u8]) -> [u8; 4] {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    a
}

fn le8(b: &[u8]) -> [u8; 8] {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    a
}

/// Decodes the record at the start of `bytes`. `max_size` bounds the size
/// field (the bytes left in the segment): a larger value is damage, never
/// an allocation.
pub fn decode_record(bytes: &[u8], max_size: usize) -> Result<Decoded<'_>, Damage> {
    if bytes.len() < RECORD_HEADER_BYTES {
        if max_size < RECORD_HEADER_BYTES {
            return Err(Damage::BadRecordSize {
                size: max_size as u64,
            });
        }
        return Ok(Decoded::NeedMore {
            size: RECORD_HEADER_BYTES,
        });
    }
    let header = &bytes[..RECORD_HEADER_BYTES];
    if header.iter().all(|&b| b == 0) {
        return Ok(Decoded::Zero);
    }
    let stored_crc = u32::from_le_bytes(le4(&header[0..4]));
    let size = u32::from_le_bytes(le4(&header[4..8])) as usize;
    if size < RECORD_HEADER_BYTES || size > max_size {
        return Err(Damage::BadRecordSize { size: size as u64 });
    }
    if bytes.len() < size {
        return Ok(Decoded::NeedMore { size });
    }
    let record = &bytes[..size];
    let computed = crc32fast::hash(&record[4..]);
    if computed != stored_crc {
        return Err(Damage::ChecksumMismatch {
            expected: stored_crc,
            found: computed,
        });
    }
    // The checksum matched: the fields below were written by an encoder.
    let lsn = u64::from_le_bytes(le8(&header[8..16]));
    let commit_version = u64::from_le_bytes(le8(&header[16..24]));
    let Some(kind) = RecordKind::from_u8(header[24]) else {
        return Err(Damage::UnknownRecordKind { kind: header[24] });
    };
    let flags = header[25];
    if header[26] != 0 || header[27] != 0 || flags & !RECORD_FLAGS_KNOWN != 0 {
        return Err(Damage::ReservedNotZero);
    }
    let key_len = u32::from_le_bytes(le4(&header[28..32])) as usize;
    if key_len > size - RECORD_HEADER_BYTES {
        return Err(Damage::BadRecordSize { size: size as u64 });
    }
    let key = &record[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + key_len];
    let value = &record[RECORD_HEADER_BYTES + key_len..];
    let (expires_at_ms, value) = take_expiry(kind, flags, value, size)?;
    let (chain_first_lsn, value) = take_chain_start(kind, flags, lsn, value, size)?;
    check_kind(kind, flags, key, value, size)?;
    Ok(Decoded::Record(Record {
        size,
        lsn,
        commit_version,
        kind,
        flags,
        key,
        value,
        expires_at_ms,
        chain_first_lsn,
    }))
}

/// Splits a Put's expiry time off the front of `value` when the record
/// (of `size` bytes) carries one.
fn take_expiry(
    kind: RecordKind,
    flags: u8,
    value: &[u8],
    size: usize,
) -> Result<(Option<u64>, &[u8]), Damage> {
    if flags & FLAG_EXPIRES == 0 {
        return Ok((None, value));
    }
    if kind != RecordKind::Put || value.len() < EXPIRY_BYTES {
        return Err(Damage::BadRecordSize { size: size as u64 });
    }
    let at = u64::from_le_bytes(le8(&value[..EXPIRY_BYTES]));
    if at == 0 {
        // The encoder never writes 0 (it means "no expiry" in memory).
        return Err(Damage::ReservedNotZero);
    }
    Ok((Some(at), &value[EXPIRY_BYTES..]))
}

/// Splits a chain end's chain start off the front of `value` when the
/// record (of `size` bytes) closes a chunk chain.
fn take_chain_start(
    kind: RecordKind,
    flags: u8,
    lsn: u64,
    value: &[u8],
    size: usize,
) -> Result<(Option<u64>, &[u8]), Damage> {
    if flags & FLAG_CHAIN_END == 0 {
        return Ok((None, value));
    }
    if kind != RecordKind::Put || value.len() < CHAIN_START_BYTES {
        return Err(Damage::BadRecordSize { size: size as u64 });
    }
    let first = u64::from_le_bytes(le8(&value[..CHAIN_START_BYTES]));
    if first == 0 || first >= lsn {
        return Err(Damage::BadChain {
            lsn,
            reason: "its chain starts at or after it",
        });
    }
    Ok((Some(first), &value[CHAIN_START_BYTES..]))
}

/// What each record kind requires of its fields.
fn check_kind(
    kind: RecordKind,
    flags: u8,
    key: &[u8],
    value: &[u8],
    size: usize,
) -> Result<(), Damage> {
    match kind {
        RecordKind::Put => {}
        RecordKind::Chunk => {
            if !key.is_empty() || flags & !FLAG_FIRST != 0 {
                return Err(Damage::ReservedNotZero);
            }
        }
        RecordKind::Delete => {
            if !value.is_empty() {
                return Err(Damage::BadRecordSize { size: size as u64 });
            }
        }
        RecordKind::TxnPart => {
            if let Err(reason) = crate::txn::record::check_part(key, value) {
                return Err(Damage::BadTxnPart { reason });
            }
        }
        RecordKind::Seal => {
            if !key.is_empty() || flags != 0 || size < SEAL_MIN_BYTES {
                return Err(Damage::BadRecordSize { size: size as u64 });
            }
            if value[SEAL_PAYLOAD_BYTES..].iter().any(|&b| b != 0) {
                return Err(Damage::ReservedNotZero);
            }
        }
    }
    Ok(())
}

/// The segment header (block 0 of every segment file).
///
/// A header with `first_lsn == 0` is *prepared*: the segment was recycled
/// and waits for its first flush (which rewrites block 0 with the real
/// header); it holds no record of the current log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub shard: u32,
    pub seq: u64,
    pub first_lsn: u64,
    pub segment_bytes: u64,
    pub flags: u32,
    /// The data directory's identity (format 5); 0 in an older header.
    pub dir_id: DirId,
}

impl SegmentHeader {
    /// The header of a recycled segment waiting for its first flush.
    pub fn prepared(shard: u32, segment_bytes: u64, dir_id: DirId) -> SegmentHeader {
        SegmentHeader {
            shard,
            seq: 0,
            first_lsn: 0,
            segment_bytes,
            flags: SEGMENT_FLAG_RECYCLED,
            dir_id,
        }
    }

    pub fn is_prepared(&self) -> bool {
        self.first_lsn == 0
    }

    pub fn is_recycled(&self) -> bool {
        self.flags & SEGMENT_FLAG_RECYCLED != 0
    }
}

/// Writes the header into `block` (one block; the rest is zeroed).
pub fn encode_segment_header(header: &SegmentHeader, block: &mut [u8]) {
    assert_eq!(block.len(), BLOCK_BYTES);
    assert_eq!(header.flags & !SEGMENT_FLAGS_KNOWN, 0);
    block.fill(0);
    block[0..8].copy_from_slice(&SEGMENT_MAGIC);
    block[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    block[12..16].copy_from_slice(&header.shard.to_le_bytes());
    block[16..24].copy_from_slice(&header.seq.to_le_bytes());
    block[24..32].copy_from_slice(&header.first_lsn.to_le_bytes());
    block[32..40].copy_from_slice(&header.segment_bytes.to_le_bytes());
    block[40..44].copy_from_slice(&header.flags.to_le_bytes());
    let crc = crc32fast::hash(&block[0..44]);
    block[44..48].copy_from_slice(&crc.to_le_bytes());
    block[48..56].copy_from_slice(&header.dir_id.to_le_bytes());
    let crc = crc32fast::hash(&block[0..56]);
    block[56..60].copy_from_slice(&crc.to_le_bytes());
}

/// Re-encodes a valid header block with `flags` set (the flusher marks the
/// first flush of a recycled segment).
pub fn set_segment_header_flags(block: &mut [u8], flags: u32) {
    let mut header = decode_segment_header(block)
        .ok()
        .flatten()
        .expect("a header this process just encoded");
    header.flags |= flags;
    encode_segment_header(&header, block);
}

/// Reads a segment header; `Ok(None)` if block 0 is all zero (a segment
/// created ahead of need and never written).
pub fn decode_segment_header(block: &[u8]) -> Result<Option<SegmentHeader>, Damage> {
    if block.len() < BLOCK_BYTES {
        if block.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        return Err(Damage::BadSegmentHeader {
            reason: "file shorter than one block",
        });
    }
    let block = &block[..BLOCK_BYTES];
    if block.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let stored = u32::from_le_bytes(le4(&block[44..48]));
    let computed = crc32fast::hash(&block[0..44]);
    if stored != computed {
        return Err(Damage::ChecksumMismatch {
            expected: stored,
            found: computed,
        });
    }
    if block[0..8] != SEGMENT_MAGIC {
        return Err(Damage::BadSegmentHeader {
            reason: "bad magic",
        });
    }
    let version = u32::from_le_bytes(le4(&block[8..12]));
    if !(FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&version) {
        return Err(Damage::BadSegmentHeader {
            reason: "unsupported format version",
        });
    }
    let (data, dir_id) = if version >= FORMAT_VERSION_DIR_ID {
        let stored = u32::from_le_bytes(le4(&block[56..60]));
        let computed = crc32fast::hash(&block[0..56]);
        if stored != computed {
            return Err(Damage::ChecksumMismatch {
                expected: stored,
                found: computed,
            });
        }
        (
            SEGMENT_HEADER_BYTES,
            u64::from_le_bytes(le8(&block[48..56])),
        )
    } else {
        (SEGMENT_HEADER_BYTES_V4, 0)
    };
    if block[data..].iter().any(|&b| b != 0) {
        return Err(Damage::BadSegmentHeader {
            reason: "bytes after the header are not zero",
        });
    }
    let flags = u32::from_le_bytes(le4(&block[40..44]));
    if flags & !SEGMENT_FLAGS_KNOWN != 0 {
        return Err(Damage::BadSegmentHeader {
            reason: "unknown flags",
        });
    }
    Ok(Some(SegmentHeader {
        shard: u32::from_le_bytes(le4(&block[12..16])),
        seq: u64::from_le_bytes(le8(&block[16..24])),
        first_lsn: u64::from_le_bytes(le8(&block[24..32])),
        segment_bytes: u64::from_le_bytes(le8(&block[32..40])),
        flags,
        dir_id,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode(lsn: u64, version: u64, kind: RecordKind, key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; record_size(key.len(), value.len())];
        let n = encode_record(&mut out, lsn, version, kind, FLAG_FIRST, key, value);
        assert_eq!(n, out.len());
        out
    }

    #[test]
    fn zero_header_is_zero() {
        let zeros = [0u8; 64];
        assert_eq!(decode_record(&zeros, 64), Ok(Decoded::Zero));
    }

    #[test]
    fn need_more_when_short() {
        let rec = encode(7, 9, RecordKind::Put, b"key", &[5u8; 100]);
        assert_eq!(
            decode_record(&rec[..40], 4096),
            Ok(Decoded::NeedMore { size: rec.len() })
        );
        assert_eq!(
            decode_record(&rec[..10], 4096),
            Ok(Decoded::NeedMore {
                size: RECORD_HEADER_BYTES
            })
        );
    }

    #[test]
    fn size_beyond_segment_is_damage() {
        let rec = encode(7, 9, RecordKind::Put, b"key", &[5u8; 100]);
        assert!(matches!(
            decode_record(&rec, rec.len() - 1),
            Err(Damage::BadRecordSize { .. })
        ));
    }

    #[test]
    fn seal_sizes_pad_to_block() {
        for used in [
            0,
            1,
            100,
            4096 - SEAL_MIN_BYTES,
            4096 - SEAL_MIN_BYTES + 1,
            4095,
            4096,
            8191,
        ] {
            let s = seal_size(used);
            assert_eq!((used + s) % BLOCK_BYTES, 0, "used {used}");
            assert!(
                (SEAL_MIN_BYTES..=SEAL_MAX_BYTES).contains(&s),
                "used {used}"
            );
        }
    }

    #[test]
    fn seal_round_trip() {
        let info = SealInfo {
            flush_offset: 8192,
            first_lsn: 10,
            last_lsn: 19,
            record_count: 10,
            lsns_in_flight: 7,
        };
        assert_eq!(info.durable_at_submit(), Some(2));
        let mut out = vec![0u8; seal_size(100)];
        encode_seal(&mut out, &info);
        let Ok(Decoded::Record(r)) = decode_record(&out, out.len()) else {
            panic!("seal did not decode");
        };
        assert_eq!(r.kind, RecordKind::Seal);
        assert_eq!(r.seal_info(), info);
    }

    #[test]
    fn segment_header_round_trip_and_damage() {
        let h = SegmentHeader {
            shard: 3,
            seq: 42,
            first_lsn: 1000,
            segment_bytes: 1 << 20,
            flags: SEGMENT_FLAG_RECYCLED,
            dir_id: 0xfeed_beef_0000_0001,
        };
        let mut block = vec![0u8; BLOCK_BYTES];
        encode_segment_header(&h, &mut block);
        assert_eq!(decode_segment_header(&block), Ok(Some(h)));
        assert_eq!(decode_segment_header(&vec![0u8; BLOCK_BYTES]), Ok(None));
        for bit in 0..(SEGMENT_HEADER_BYTES * 8) {
            let mut b = block.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_segment_header(&b).is_err(), "bit {bit} undetected");
        }
    }

    proptest! {
        #[test]
        fn record_round_trip(
            lsn in any::<u64>(),
            version in any::<u64>(),
            key in proptest::collection::vec(any::<u8>(), 1..300),
            value in proptest::collection::vec(any::<u8>(), 0..3000),
            is_delete in any::<bool>(),
        ) {
            let (kind, value) = if is_delete { (RecordKind::Delete, Vec::new()) } else { (RecordKind::Put, value) };
            let rec = encode(lsn, version, kind, &key, &value);
            let decoded = decode_record(&rec, rec.len());
            let Ok(Decoded::Record(r)) = decoded else { panic!("did not decode: {decoded:?}") };
            prop_assert_eq!(r.size, rec.len());
            prop_assert_eq!(r.lsn, lsn);
            prop_assert_eq!(r.commit_version, version);
            prop_assert_eq!(r.kind, kind);
            prop_assert!(r.is_first());
            prop_assert_eq!(r.key, &key[..]);
            prop_assert_eq!(r.value, &value[..]);
        }

        #[test]
        fn any_flipped_bit_is_detected(
            key in proptest::collection::vec(any::<u8>(), 1..40),
            value in proptest::collection::vec(any::<u8>(), 0..200),
            bit_seed in any::<u64>(),
        ) {
            let rec = encode(5, 6, RecordKind::Put, &key, &value);
            let bit = (bit_seed % (rec.len() as u64 * 8)) as usize;
            let mut bad = rec.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            // A flipped bit must never yield a valid record. The slice is as
            // long as the bound, so a grown size is damage, not NeedMore.
            let decoded = decode_record(&bad, rec.len());
            prop_assert!(decoded.is_err(), "undetected flip at bit {}: {:?}", bit, decoded);
        }
    }

    #[test]
    fn an_expiring_put_round_trips_and_every_bit_flip_is_detected() {
        let (key, value, at) = (b"ttl-key", b"the value", 4_102_444_800_123u64);
        let size = record_size_expiring(key.len(), value.len(), Some(at));
        assert_eq!(size, record_size(key.len(), value.len()) + EXPIRY_BYTES);
        let mut rec = vec![0u8; size];
        let n = encode_record_expiring(
            &mut rec,
            9,
            3,
            RecordKind::Put,
            FLAG_FIRST,
            key,
            value,
            Some(at),
        );
        assert_eq!(n, size);
        let Ok(Decoded::Record(r)) = decode_record(&rec, rec.len()) else {
            panic!("did not decode");
        };
        assert_eq!(
            (r.key, r.value, r.expires_at_ms),
            (&key[..], &value[..], Some(at))
        );
        assert_eq!(r.flags, FLAG_FIRST | FLAG_EXPIRES);
        assert!(r.is_first());
        for bit in 0..rec.len() * 8 {
            let mut bad = rec.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_record(&bad, rec.len()).is_err(), "bit {bit}");
        }
        // A plain put has no expiry and no flag.
        let plain = encode(1, 1, RecordKind::Put, key, value);
        let Ok(Decoded::Record(r)) = decode_record(&plain, plain.len()) else {
            panic!("did not decode");
        };
        assert_eq!(r.expires_at_ms, None);
    }

    /// Re-encodes `rec` with its flags byte replaced (a valid checksum), as
    /// a writer that knows more flags would.
    fn with_flags(rec: &[u8], flags: u8) -> Vec<u8> {
        let mut out = rec.to_vec();
        out[25] = flags;
        let crc = crc32fast::hash(&out[4..]);
        out[0..4].copy_from_slice(&crc.to_le_bytes());
        out
    }

    #[test]
    fn unknown_or_misplaced_flags_are_refused() {
        let put = encode(1, 1, RecordKind::Put, b"k", &[7u8; 20]);
        // A flag this build does not know: refused, never read as data.
        assert_eq!(
            decode_record(&with_flags(&put, FLAG_FIRST | 0x08), put.len()),
            Err(Damage::ReservedNotZero)
        );
        // FLAG_CHAIN_END naming a chain start at or after the record, or on
        // a delete.
        assert!(matches!(
            decode_record(&with_flags(&put, FLAG_CHAIN_END), put.len()),
            Err(Damage::BadChain { .. })
        ));
        let del = encode(1, 1, RecordKind::Delete, b"k", b"");
        assert!(decode_record(&with_flags(&del, FLAG_CHAIN_END), del.len()).is_err());
        // FLAG_EXPIRES on a delete, or on a put too short for the expiry.
        let del = encode(1, 1, RecordKind::Delete, b"k", b"");
        assert!(decode_record(&with_flags(&del, FLAG_EXPIRES), del.len()).is_err());
        let short = encode(1, 1, RecordKind::Put, b"k", &[1u8; 7]);
        assert!(decode_record(&with_flags(&short, FLAG_EXPIRES), short.len()).is_err());
        // An expiry of 0 (the encoder never writes it).
        let zero = encode(1, 1, RecordKind::Put, b"k", &[0u8; 8]);
        assert!(decode_record(&with_flags(&zero, FLAG_EXPIRES), zero.len()).is_err());
    }

    #[test]
    fn segment_headers_of_versions_1_to_5_are_read_and_others_refused() {
        let h = SegmentHeader {
            shard: 1,
            seq: 2,
            first_lsn: 3,
            segment_bytes: 1 << 20,
            flags: 0,
            dir_id: 0x0123_4567_89ab_cdef,
        };
        let mut block = vec![0u8; BLOCK_BYTES];
        encode_segment_header(&h, &mut block);
        assert_eq!(u32::from_le_bytes(le4(&block[8..12])), FORMAT_VERSION);
        assert_eq!(decode_segment_header(&block), Ok(Some(h)));
        // Versions 1 to 4: the header ends at byte 48 and has no identity.
        let mut old = block.clone();
        old[48..60].fill(0);
        for (version, ok) in [
            (1u32, true),
            (2, true),
            (3, true),
            (4, true),
            (6, false),
            (0, false),
        ] {
            old[8..12].copy_from_slice(&version.to_le_bytes());
            let crc = crc32fast::hash(&old[0..44]);
            old[44..48].copy_from_slice(&crc.to_le_bytes());
            let decoded = decode_segment_header(&old);
            assert_eq!(decoded.is_ok(), ok, "version {version}");
            if ok {
                assert_eq!(decoded.ok().flatten().map(|h| h.dir_id), Some(0));
            }
        }
        // A format 4 build checks the CRC at 44 first, then the version: it
        // refuses a format 5 header by its version, not as damage.
        assert_eq!(
            u32::from_le_bytes(le4(&block[44..48])),
            crc32fast::hash(&block[0..44])
        );
        // A format 5 header whose identity is damaged is refused.
        let mut bad = block.clone();
        bad[50] ^= 1;
        assert!(decode_segment_header(&bad).is_err());
    }

    #[test]
    fn every_single_bit_flip_of_one_record_is_detected() {
        let rec = encode(123, 456, RecordKind::Put, b"some-key", b"some value bytes");
        for bit in 0..rec.len() * 8 {
            let mut bad = rec.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            // With max_size = len, a larger size is damage; a smaller one
            // fails the checksum.
            match decode_record(&bad, rec.len()) {
                Err(_) => {}
                other => panic!("bit {bit}: {other:?}"),
            }
        }
    }
}
