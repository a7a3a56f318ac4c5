//! The hybrid tier's value log: append-only segment files of 4 KiB blocks,
//! each block ending in a CRC32 of its 4,092 payload bytes seeded with the
//! segment's sequence number and the block's index (so a block of another
//! segment, or a stale block of a reused file, fails the check).
//!
//! ```text
//! segment file (value_segment_size bytes at most):
//!   block 0       header: "RKVSEGV1", version u32, shard u32, seq u64,
//!                 segment bytes u64, directory identity u64 (version 3),
//!                 zero padding, CRC32 (last 4 bytes)
//!   block 1..     payload[4092] crc32[4]  (records run across blocks)
//! record (starts 16-byte aligned, may cross block ends; the CRC words are
//! skipped):
//!   flags u8 (bit 0: a value record, bit 7: expiry follows)
//!   key_len u24 LE, value_len u32 LE,
//!   lsn u64 LE (version 2 segments only: the WAL LSN of the write),
//!   [expires_at_ms u64 LE], key, value
//! ```
//!
//! The header's version says which record layout the segment holds: this
//! build writes version 3 and reads 1 to 3 (a version 1 record has no
//! LSN; see [`Record::lsn`]; versions 2 and 3 hold the same records).
//! Version 3 added the data directory's identity to the header: a segment
//! carrying another directory's is refused when it is opened; one of
//! version 1 or 2 carries none and cannot be told apart.
//!
//! A record's address is `slot << offset_bits | file_offset / 16`, where a
//! slot names one segment file among the shard's open ones: 32 bits address
//! 64 GiB of segments per shard.
//!
//! All I/O here is blocking and done on the shard thread: appends fill a
//! 1 MiB buffer in RAM that is written (whole blocks only) when it fills;
//! [`ValueLog::flush`] writes the partial last block too (padded: the next
//! record starts in a fresh block, so a block is never written twice) and
//! fdatasyncs every segment written since the last flush.

use crate::io::{AlignedBuf, Disk, DiskFile, ALIGN};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

pub const BLOCK: usize = ALIGN;
/// Payload bytes of one block (the last four hold its CRC).
pub const PAYLOAD: usize = BLOCK - 4;
/// Records start at multiples of this.
pub const RECORD_ALIGN: u64 = 16;
const SEGMENT_MAGIC: [u8; 8] = *b"RKVSEGV1";
/// The format version new segments are written in.
pub const SEGMENT_VERSION: u32 = 3;
/// The first format version whose header carries the directory identity.
const SEGMENT_VERSION_DIR_ID: u32 = 3;
/// The oldest format version this build reads (records without an LSN).
pub const SEGMENT_VERSION_MIN: u32 = 1;
/// The file in the main device's segment folder that says some segments
/// live on a hot device: made with the first hot segment, removed once the
/// hot device holds none. A start without a hot device refuses a folder
/// that has it (its checkpoints name segments it would not find).
pub const HOT_MARKER: &str = "HOT-DEVICE";
/// Size of the RAM buffer appends go through.
const CHUNK: usize = 1 << 20;
/// Blocks read lately that are kept (1 MiB): reads of records that sit
/// side by side (a scan in write order, a key written after its
/// neighbours) take one device read per block, not per record.
pub const RECENT_BLOCKS: usize = 256;
pub const FLAG_VALUE: u8 = 1;
pub const FLAG_EXPIRES: u8 = 0x80;
/// Bytes of a record's header before its LSN and expiry: flags, key
/// length, value length.
pub const RECORD_HEADER: usize = 8;
/// The longest record header (version 2, with an expiry time).
pub const RECORD_HEADER_MAX: usize = RECORD_HEADER + 16;

/// The smallest value segment that holds a record of the largest key and
/// value (with its header, LSN and expiry, and a CRC word per block) after
/// the segment's header block, with a block to spare for alignment.
pub fn segment_bytes_needed(key_max: usize, value_max: usize) -> u64 {
    let record = (key_max + value_max + RECORD_HEADER_MAX) as u64;
    BLOCK as u64 + record.div_ceil(PAYLOAD as u64) * BLOCK as u64 + BLOCK as u64
}

/// What is wrong with a record or block read back.
#[derive(Debug)]
pub enum ReadError {
    Io {
        file: PathBuf,
        offset: u64,
        source: io::Error,
    },
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
    /// The key's newest write never reached the segments in `dir` (a
    /// segment write failed and poisoned the shard): whatever the index
    /// still points at is older. A restart replays the write from the WAL.
    Unwritten { dir: PathBuf },
    /// The record at an entry's address holds a key that cannot be the
    /// entry's (another partition or tag): the entry dangles (it points
    /// into a segment removed or rewritten since), so the key's newest
    /// record is unknown.
    Dangling { file: PathBuf, offset: u64 },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io {
                file,
                offset,
                source,
            } => write!(
                f,
                "reading value segment {} at offset {offset} failed: {source}",
                file.display()
            ),
            ReadError::Corrupt {
                file,
                offset,
                reason,
            } => write!(
                f,
                "value segment {} is damaged at offset {offset}: {reason}",
                file.display()
            ),
            ReadError::Dangling { file, offset } => write!(
                f,
                "the index points at value segment {} offset {offset}, which holds a record of an unrelated key (a dangling entry)",
                file.display()
            ),
            ReadError::Unwritten { dir } => write!(
                f,
                "the key's last write did not reach the value segments in {} (a failed write poisoned the shard; a restart recovers the write from the WAL)",
                dir.display()
            ),
        }
    }
}

/// One record, decoded.
#[derive(Debug, Clone)]
pub struct Record {
    pub key: bytes::Bytes,
    pub value: bytes::Bytes,
    pub expires_at_ms: Option<u64>,
    /// The WAL LSN of the write that made the record (GC's copies keep
    /// it); `None` for a record of a version 1 segment, which carries none,
    /// and for GC's copy of one (stored as LSN 0).
    pub lsn: Option<u64>,
    /// Bytes the record takes in the log (header to end, CRC words skipped).
    pub size: u64,
}

/// Bytes of a record's encoding in the format new segments are written in.
pub fn record_size(key: usize, value: usize, expires: bool) -> u64 {
    record_size_in(SEGMENT_VERSION, key, value, expires)
}

/// Bytes of a record's header in a segment of format `version`.
pub fn header_size(version: u32, expires: bool) -> usize {
    RECORD_HEADER + if version >= 2 { 8 } else { 0 } + if expires { 8 } else { 0 }
}

/// Bytes of a record's encoding in a segment of format `version`.
pub fn record_size_in(version: u32, key: usize, value: usize, expires: bool) -> u64 {
    (header_size(version, expires) + key + value) as u64
}

/// Decodes the fixed header of a record (whose first bytes are `h`, at
/// least [`RECORD_HEADER_MAX`] of them or all there are) in a segment of
/// format `version`: (flags, key length, value length, LSN, expiry, header
/// bytes). `None` if `h` is too short for it.
#[allow(clippy::type_complexity)]
fn decode_header(
    h: &[u8],
    version: u32,
) -> Option<(u8, usize, usize, Option<u64>, Option<u64>, usize)> {
    let fixed = h.get(..RECORD_HEADER)?;
    let flags = fixed[0];
    let key_len = u32::from_le_bytes([fixed[1], fixed[2], fixed[3], 0]) as usize;
    let value_len = u32::from_le_bytes(fixed[4..8].try_into().expect("4 bytes")) as usize;
    let expires = flags & FLAG_EXPIRES != 0;
    let len = header_size(version, expires);
    let rest = h.get(RECORD_HEADER..len)?;
    let word = |i: usize| u64::from_le_bytes(rest[i..i + 8].try_into().expect("8 bytes"));
    // LSN 0 (no WAL record has it): a copy of a version 1 record, whose
    // write is not known.
    let lsn = (version >= 2).then(|| word(0)).filter(|&l| l != 0);
    let at = if version >= 2 { 8 } else { 0 };
    let expires_at_ms = expires.then(|| word(at));
    Some((flags, key_len, value_len, lsn, expires_at_ms, len))
}

/// A segment's place in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegState {
    /// Sealed: full or closed, read-only.
    Sealed,
    /// Being appended to.
    Active,
    /// Emptied by GC; removed once `confirms` reaches 2 checkpoints that
    /// started after its GC ended.
    Zombie { gc_epoch: u64, confirms: u8 },
}

/// One open segment file.
pub struct Segment<F> {
    pub seq: u64,
    /// Shared with reads in flight, which keep the file open even if GC
    /// removes the segment meanwhile.
    pub file: Rc<F>,
    pub path: PathBuf,
    /// File bytes that hold records (blocks written or buffered).
    pub end: u64,
    /// Record bytes appended (dead or alive).
    pub total_bytes: u64,
    /// Record bytes the index still points to.
    pub live_bytes: u64,
    pub state: SegState,
    /// The segment's format version (its records' layout).
    pub version: u32,
    /// The device its file is on.
    pub device: Device,
}

/// Where a record lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addr {
    pub slot: u32,
    pub offset: u64,
}

/// The device a segment lives on: the value device (every segment when
/// no hot device is configured; the cold one otherwise), or the hot device.
pub type Device = u8;
/// `storage.value_device`: the cold device of a tiered shard.
pub const MAIN: Device = 0;
/// `storage.hot_device`.
pub const HOT: Device = 1;

/// Where one device's appends go: its folder, its active segment and the
/// RAM buffer in front of it.
struct Head<D: Disk> {
    disk: D,
    dir: PathBuf,
    active: Option<u32>,
    chunk: AlignedBuf,
    /// File offset of `chunk[0]` in the active segment (a block boundary).
    chunk_start: u64,
    /// File offset of the next append in the active segment.
    cursor: u64,
}

impl<D: Disk> Head<D> {
    fn new(disk: D, dir: PathBuf) -> Head<D> {
        Head {
            disk,
            dir,
            active: None,
            chunk: AlignedBuf::with_capacity(CHUNK),
            chunk_start: 0,
            cursor: 0,
        }
    }
}

/// One shard's value segments, on one device or two (a hot and a cold
/// one). Slots and sequence numbers are shared by both: an address does
/// not say which device holds its record; the segment does.
pub struct ValueLog<D: Disk> {
    shard: u32,
    /// The data directory's identity: written into every segment header,
    /// checked in every segment opened (0: none checked).
    dir_id: crate::layout::DirId,
    segment_bytes: u64,
    offset_bits: u32,
    pub segs: Vec<Option<Segment<D::File>>>,
    pub next_seq: u64,
    /// Indexed by [`Device`]: the main head, and the hot one if configured.
    heads: Vec<Head<D>>,
    /// Slots written since the last flush (fdatasync due).
    unsynced: Vec<u32>,
    /// Recently read blocks, by (slot, block), and their order.
    recent: std::collections::HashMap<(u32, u64), Box<[u8]>>,
    recent_order: std::collections::VecDeque<(u32, u64)>,
    /// Reads answered from those.
    pub recent_hits: u64,
    /// Device reads done (cold reads and GC reads), all devices.
    pub reads: u64,
    /// Of those, the reads of hot-device segments.
    pub hot_reads: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Segments removed (with `next_seq`, tells when the set of segments
    /// changed).
    pub removed: u64,
}

fn block_crc(seq: u64, block: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(&block.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// The file offset `len` payload bytes after `from` (CRC words skipped).
fn advance(from: u64, len: u64) -> u64 {
    let b = BLOCK as u64;
    let p = PAYLOAD as u64;
    let in_block = from % b;
    debug_assert!(in_block <= p);
    let logical = (from / b) * p + in_block + len;
    let mut end = (logical / p) * b + logical % p;
    // An end exactly at a block's payload end stays in that block.
    if logical.is_multiple_of(p) && len > 0 {
        end = (logical / p - 1) * b + p;
    }
    end
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// The next record start at or after `end`.
fn next_start(end: u64) -> u64 {
    let s = align_up(end, RECORD_ALIGN);
    if s % BLOCK as u64 > PAYLOAD as u64 - RECORD_ALIGN {
        align_up(s, BLOCK as u64)
    } else {
        s
    }
}

/// Where a record starts, and the blocks a read of it fetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordSpot {
    pub slot: u32,
    pub first: u64,
    pub count: u64,
    /// File offset of the record's first byte.
    pub offset: u64,
    /// The format version of the segment (the record's layout).
    pub version: u32,
}

/// A segment's file and identity, for a read outside the log (the shard's
/// asynchronous GET reads). The `Rc` keeps the file open for the read even
/// if GC removes the segment first; `seq` tells whether the slot still
/// holds that segment when the read is done.
pub struct DeviceSource<F> {
    pub file: Rc<F>,
    pub path: PathBuf,
    pub seq: u64,
    pub device: Device,
}

/// What [`parse_record`] found.
pub enum Parsed {
    Record(Record),
    /// The record runs past the bytes given: read this many blocks from
    /// the spot's first one.
    NeedBlocks(u64),
}

/// Checks the CRC of every block of `buf` (whole blocks, read from file
/// offset `first * BLOCK` of segment `seq`); returns their payloads.
pub fn check_blocks(seq: u64, first: u64, path: &Path, buf: &[u8]) -> Result<Vec<u8>, ReadError> {
    let mut out = Vec::with_capacity(buf.len() / BLOCK * PAYLOAD);
    for (i, block) in buf.chunks_exact(BLOCK).enumerate() {
        let b = first + i as u64;
        let stored = u32::from_le_bytes(block[PAYLOAD..].try_into().expect("4 bytes"));
        let computed = block_crc(seq, b, &block[..PAYLOAD]);
        if stored != computed {
            return Err(ReadError::Corrupt {
                file: path.to_path_buf(),
                offset: b * BLOCK as u64,
                reason: format!(
                    "block checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
                ),
            });
        }
        out.extend_from_slice(&block[..PAYLOAD]);
    }
    Ok(out)
}

/// Decodes the record at `spot` from `payloads`, the checked payloads of
/// blocks `spot.first..` (at least one).
pub fn parse_record(
    payloads: &[u8],
    spot: &RecordSpot,
    segment_bytes: u64,
    path: &Path,
) -> Result<Parsed, ReadError> {
    let offset = spot.offset;
    let in_block = (offset % BLOCK as u64) as usize;
    let corrupt = |reason: String| ReadError::Corrupt {
        file: path.to_path_buf(),
        offset,
        reason,
    };
    if payloads.len() < in_block + RECORD_HEADER {
        return Err(corrupt("the record header is past the blocks read".into()));
    }
    let Some((flags, key_len, value_len, lsn, expires_at_ms, hlen)) =
        decode_header(&payloads[in_block..], spot.version)
    else {
        // The LSN or expiry runs into the next block.
        return Ok(Parsed::NeedBlocks(
            (in_block + RECORD_HEADER_MAX).div_ceil(PAYLOAD) as u64,
        ));
    };
    if flags & !(FLAG_VALUE | FLAG_EXPIRES) != 0 || flags & FLAG_VALUE == 0 {
        return Err(corrupt(format!(
            "no record starts here (flags {flags:#04x})"
        )));
    }
    let size = (hlen + key_len + value_len) as u64;
    if advance(offset, size) > segment_bytes {
        return Err(corrupt(format!(
            "record of {size} bytes runs past the segment end"
        )));
    }
    let need = in_block + size as usize;
    if need > payloads.len() {
        return Ok(Parsed::NeedBlocks(need.div_ceil(PAYLOAD) as u64));
    }
    let body = &payloads[in_block..need];
    Ok(Parsed::Record(Record {
        key: bytes::Bytes::copy_from_slice(&body[hlen..hlen + key_len]),
        value: bytes::Bytes::copy_from_slice(&body[hlen + key_len..]),
        expires_at_ms,
        lsn,
        size,
    }))
}

impl<D: Disk> ValueLog<D> {
    pub fn new(disk: D, dir: PathBuf, shard: u32, segment_bytes: u64) -> ValueLog<D> {
        assert!(segment_bytes >= 2 * BLOCK as u64 && segment_bytes.is_multiple_of(BLOCK as u64));
        let offset_bits = (segment_bytes.next_power_of_two() / RECORD_ALIGN).trailing_zeros();
        assert!(offset_bits < 32);
        ValueLog {
            shard,
            dir_id: 0,
            segment_bytes,
            offset_bits,
            segs: Vec::new(),
            next_seq: 1,
            heads: vec![Head::new(disk, dir)],
            unsynced: Vec::new(),
            recent: std::collections::HashMap::new(),
            recent_order: std::collections::VecDeque::new(),
            recent_hits: 0,
            reads: 0,
            hot_reads: 0,
            bytes_read: 0,
            bytes_written: 0,
            removed: 0,
        }
    }

    /// Sets the data directory's identity, before any segment is opened.
    pub fn set_dir_id(&mut self, dir_id: crate::layout::DirId) {
        assert!(self.segs.is_empty());
        self.dir_id = dir_id;
    }

    /// Adds the hot device: segments in `dir` on `disk` (the folder must
    /// exist). Before any segment is opened.
    pub fn add_hot(&mut self, disk: D, dir: PathBuf) {
        assert!(self.heads.len() == 1 && self.segs.is_empty());
        self.heads.push(Head::new(disk, dir));
    }

    /// The disk of `device` (the main one when `device` is not configured).
    pub fn disk(&self, device: Device) -> &D {
        &self
            .heads
            .get(device as usize)
            .unwrap_or(&self.heads[MAIN as usize])
            .disk
    }

    /// Whether a hot device is configured.
    pub fn has_hot(&self) -> bool {
        self.heads.len() > HOT as usize
    }

    /// The main (value, or cold) device's segment folder.
    pub fn dir(&self) -> &Path {
        &self.heads[MAIN as usize].dir
    }

    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// Most segments the address space holds.
    pub fn max_slots(&self) -> u32 {
        1u32 << (32 - self.offset_bits).min(16)
    }

    /// Where segment `seq` is, on whichever device has it (the main
    /// device's path if none does).
    pub fn path_of(&self, seq: u64) -> PathBuf {
        self.device_of_seq(seq)
            .map_or_else(|| self.path_on(MAIN, seq), |d| self.path_on(d, seq))
    }

    /// The path segment `seq` has on `device`.
    pub fn path_on(&self, device: Device, seq: u64) -> PathBuf {
        self.heads[device as usize]
            .dir
            .join(format!("{seq:016}.seg"))
    }

    /// The device whose folder holds the file of segment `seq`: the hot
    /// one is looked at first (a file is made on one device and never
    /// copied to the other, so at most one has it).
    pub fn device_of_seq(&self, seq: u64) -> Option<Device> {
        (0..self.heads.len() as Device)
            .rev()
            .find(|&d| self.heads[d as usize].disk.exists(&self.path_on(d, seq)))
    }

    pub fn encode_addr(&self, a: Addr) -> u32 {
        (a.slot << self.offset_bits) | (a.offset / RECORD_ALIGN) as u32
    }

    pub fn decode_addr(&self, addr: u32) -> Addr {
        Addr {
            slot: addr >> self.offset_bits,
            offset: u64::from(addr & ((1u32 << self.offset_bits) - 1)) * RECORD_ALIGN,
        }
    }

    /// The segment an address names, if open.
    pub fn seg_of(&self, addr: u32) -> Option<&Segment<D::File>> {
        self.segs
            .get(self.decode_addr(addr).slot as usize)
            .and_then(|s| s.as_ref())
    }

    pub fn seg_of_mut(&mut self, addr: u32) -> Option<&mut Segment<D::File>> {
        let slot = self.decode_addr(addr).slot as usize;
        self.segs.get_mut(slot).and_then(|s| s.as_mut())
    }

    /// Opens a segment listed by a checkpoint, checking its header.
    pub fn open_existing(
        &mut self,
        slot: u32,
        seq: u64,
        end: u64,
        total_bytes: u64,
        state: SegState,
    ) -> Result<(), ReadError> {
        let device = self.device_of_seq(seq).unwrap_or(MAIN);
        let path = self.path_on(device, seq);
        let io_err = |source| ReadError::Io {
            file: path.clone(),
            offset: 0,
            source,
        };
        let file = self.heads[device as usize]
            .disk
            .open_blocking(&path, false)
            .map_err(io_err)?;
        let mut buf = AlignedBuf::with_capacity(BLOCK);
        let n = file.read_at_blocking(&mut buf, 0).map_err(io_err)?;
        self.reads += 1;
        self.bytes_read += n as u64;
        // A file cut inside its header block has nothing left to read and
        // nothing to tell its identity by: it opens as a segment cut short
        // (recovery reports the keys it held; their reads answer errors).
        // A whole header that does not check out is refused: it may be
        // another segment's file.
        let version = if n < BLOCK {
            SEGMENT_VERSION
        } else {
            check_header(buf.as_slice(), (self.shard, self.dir_id), seq).map_err(|reason| {
                ReadError::Corrupt {
                    file: path.clone(),
                    offset: 0,
                    reason,
                }
            })?
        };
        if self.segs.len() <= slot as usize {
            self.segs.resize_with(slot as usize + 1, || None);
        }
        self.segs[slot as usize] = Some(Segment {
            seq,
            file: Rc::new(file),
            path,
            end,
            total_bytes,
            live_bytes: 0,
            state,
            version,
            device,
        });
        self.next_seq = self.next_seq.max(seq + 1);
        Ok(())
    }

    /// Whether the file of segment `seq` exists.
    pub fn segment_exists(&self, seq: u64) -> bool {
        self.device_of_seq(seq).is_some()
    }

    fn start_segment(&mut self, device: Device) -> io::Result<()> {
        let slot = match self.segs.iter().position(|s| s.is_none()) {
            Some(s) => s as u32,
            None => {
                let s = self.segs.len() as u32;
                if s >= self.max_slots() {
                    return Err(io::Error::new(
                        io::ErrorKind::StorageFull,
                        format!(
                            "the shard's value log reached its {} segments of {} bytes (raise storage.value_segment_size)",
                            self.max_slots(),
                            self.segment_bytes
                        ),
                    ));
                }
                self.segs.push(None);
                s
            }
        };
        let seq = self.next_seq;
        let path = self.path_on(device, seq);
        if device == HOT {
            self.mark_hot()?;
        }
        let head = &mut self.heads[device as usize];
        let file = head.disk.open_blocking(&path, true)?;
        let mut header = AlignedBuf::with_capacity(BLOCK);
        header.set_len(BLOCK);
        encode_header(
            header.as_mut_slice(),
            (self.shard, self.dir_id),
            seq,
            self.segment_bytes,
        );
        file.write_at_blocking(&header, 0)?;
        head.disk.sync_dir_blocking(&head.dir)?;
        self.bytes_written += BLOCK as u64;
        self.next_seq += 1;
        self.segs[slot as usize] = Some(Segment {
            seq,
            file: Rc::new(file),
            path,
            end: BLOCK as u64,
            total_bytes: 0,
            live_bytes: 0,
            state: SegState::Active,
            version: SEGMENT_VERSION,
            device,
        });
        head.active = Some(slot);
        head.chunk_start = BLOCK as u64;
        head.cursor = BLOCK as u64;
        head.chunk.set_len(0);
        self.unsynced.push(slot);
        Ok(())
    }

    /// Appends one record to `device`'s active segment, written by the
    /// WAL record at `lsn` (a copy, by GC or between devices, passes the
    /// LSN of the record it copies); returns its address and span (1 if it
    /// runs past the end of its first block). A failed write leaves the
    /// log unusable for writes (the caller poisons the shard).
    pub fn append(
        &mut self,
        device: Device,
        key: &[u8],
        value: &[u8],
        expires_at_ms: Option<u64>,
        lsn: u64,
    ) -> io::Result<(u32, u8)> {
        let size = record_size(key.len(), value.len(), expires_at_ms.is_some());
        if advance(BLOCK as u64, size) > self.segment_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a record of {size} bytes does not fit a value segment of {} bytes",
                    self.segment_bytes
                ),
            ));
        }
        let head = &self.heads[device as usize];
        if head.active.is_none() || advance(head.cursor, size) > self.segment_bytes {
            self.seal_active(device)?;
            self.start_segment(device)?;
        }
        let head = &self.heads[device as usize];
        let slot = head.active.expect("an active segment");
        let start = head.cursor;
        let mut header = [0u8; RECORD_HEADER_MAX];
        header[0] = FLAG_VALUE
            | if expires_at_ms.is_some() {
                FLAG_EXPIRES
            } else {
                0
            };
        header[1..4].copy_from_slice(&(key.len() as u32).to_le_bytes()[..3]);
        header[4..8].copy_from_slice(&(value.len() as u32).to_le_bytes());
        header[8..16].copy_from_slice(&lsn.to_le_bytes());
        let hlen = match expires_at_ms {
            Some(at) => {
                header[16..24].copy_from_slice(&at.to_le_bytes());
                24
            }
            None => 16,
        };
        self.put_bytes(device, &header[..hlen])?;
        self.put_bytes(device, key)?;
        self.put_bytes(device, value)?;
        let head = &mut self.heads[device as usize];
        let end = head.cursor;
        head.cursor = next_start(end);
        let seg = self.segs[slot as usize]
            .as_mut()
            .expect("active segment open");
        seg.total_bytes += size;
        seg.live_bytes += size;
        seg.end = end;
        let span = ((end - 1) / BLOCK as u64 > start / BLOCK as u64) as u8;
        Ok((
            self.encode_addr(Addr {
                slot,
                offset: start,
            }),
            span,
        ))
    }

    /// Copies bytes at `device`'s cursor, skipping CRC words and writing
    /// the buffer out when it fills.
    fn put_bytes(&mut self, device: Device, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let head = &mut self.heads[device as usize];
            if head.cursor % BLOCK as u64 == PAYLOAD as u64 {
                head.cursor += 4;
            }
            if head.cursor - head.chunk_start == CHUNK as u64 {
                self.write_chunk(device, false)?;
            }
            let head = &mut self.heads[device as usize];
            let in_block = (head.cursor % BLOCK as u64) as usize;
            let n = bytes.len().min(PAYLOAD - in_block);
            let at = (head.cursor - head.chunk_start) as usize;
            if head.chunk.len() < at + n {
                let old = head.chunk.len();
                head.chunk.set_len(at + n);
                head.chunk.as_mut_slice()[old..at].fill(0);
            }
            head.chunk.as_mut_slice()[at..at + n].copy_from_slice(&bytes[..n]);
            head.cursor += n as u64;
            bytes = &bytes[n..];
        }
        Ok(())
    }

    /// Writes `device`'s buffered blocks: the whole ones, and with `tail`
    /// the partial last one too (zero padded); then starts the buffer at
    /// the next block boundary.
    fn write_chunk(&mut self, device: Device, tail: bool) -> io::Result<()> {
        let head = &mut self.heads[device as usize];
        let Some(slot) = head.active else {
            return Ok(());
        };
        let used = (head.cursor - head.chunk_start) as usize;
        let whole = if tail {
            used.div_ceil(BLOCK) * BLOCK
        } else {
            used / BLOCK * BLOCK
        };
        if whole == 0 {
            return Ok(());
        }
        let old = head.chunk.len();
        if old < whole {
            head.chunk.set_len(whole);
            head.chunk.as_mut_slice()[old..whole].fill(0);
        }
        let seg = self.segs[slot as usize].as_ref().expect("active segment");
        let seq = seg.seq;
        let first_block = head.chunk_start / BLOCK as u64;
        for (i, block) in head.chunk.as_mut_slice()[..whole]
            .chunks_exact_mut(BLOCK)
            .enumerate()
        {
            let crc = block_crc(seq, first_block + i as u64, &block[..PAYLOAD]);
            block[PAYLOAD..].copy_from_slice(&crc.to_le_bytes());
        }
        let mut out = AlignedBuf::with_capacity(whole);
        out.extend_from_slice(&head.chunk.as_slice()[..whole]);
        seg.file.write_at_blocking(&out, head.chunk_start)?;
        self.bytes_written += whole as u64;
        if !self.unsynced.contains(&slot) {
            self.unsynced.push(slot);
        }
        // Keep what follows the written blocks (a partial block stays in
        // RAM unless it was padded out).
        let rest = head.chunk.as_slice()[whole..used.max(whole)].to_vec();
        head.chunk.set_len(0);
        head.chunk.extend_from_slice(&rest);
        head.chunk_start += whole as u64;
        if tail {
            head.cursor = head.cursor.max(head.chunk_start);
            head.chunk.set_len(0);
        }
        Ok(())
    }

    fn seal_active(&mut self, device: Device) -> io::Result<()> {
        if let Some(slot) = self.heads[device as usize].active {
            self.write_chunk(device, true)?;
            if let Some(seg) = self.segs[slot as usize].as_mut() {
                seg.state = SegState::Sealed;
            }
            self.heads[device as usize].active = None;
        }
        Ok(())
    }

    /// Makes every record appended so far durable: writes the buffered
    /// blocks of each device (padding the last) and fdatasyncs every
    /// segment written since the last flush. The next record starts in a
    /// fresh block.
    pub fn flush(&mut self) -> io::Result<()> {
        for device in 0..self.heads.len() as Device {
            self.write_chunk(device, true)?;
        }
        for slot in std::mem::take(&mut self.unsynced) {
            if let Some(seg) = self.segs[slot as usize].as_ref() {
                seg.file.sync_data_blocking()?;
            }
        }
        for device in 0..self.heads.len() as Device {
            if self.heads[device as usize].cursor + BLOCK as u64 > self.segment_bytes {
                self.seal_active(device)?;
            }
        }
        Ok(())
    }

    /// Makes [`HOT_MARKER`] in the main device's folder if it is not there.
    fn mark_hot(&mut self) -> io::Result<()> {
        let main = &self.heads[MAIN as usize];
        let marker = main.dir.join(HOT_MARKER);
        if !main.disk.exists(&marker) {
            drop(main.disk.open_blocking(&marker, true)?);
            main.disk.sync_dir_blocking(&main.dir)?;
        }
        Ok(())
    }

    /// Removes [`HOT_MARKER`] once no open segment is on the hot device.
    pub fn unmark_hot_if_empty(&mut self) -> io::Result<()> {
        let main = &self.heads[MAIN as usize];
        let marker = main.dir.join(HOT_MARKER);
        if self.segs.iter().flatten().all(|s| s.device != HOT) && main.disk.exists(&marker) {
            main.disk.remove_file_blocking(&marker)?;
            main.disk.sync_dir_blocking(&main.dir)?;
        }
        Ok(())
    }

    /// The head whose active segment is `slot`, if any.
    fn head_of_active(&self, slot: u32) -> Option<&Head<D>> {
        self.heads.iter().find(|h| h.active == Some(slot))
    }

    /// The bytes of blocks `first..first + count` of segment `slot`,
    /// checked, with the CRC words removed: from the RAM buffer for the
    /// active segment's unwritten blocks, from the device otherwise (one
    /// read).
    pub fn read_blocks(
        &mut self,
        slot: u32,
        first: u64,
        count: u64,
        remember: bool,
    ) -> Result<Vec<u8>, ReadError> {
        let seg = match self.segs.get(slot as usize).and_then(|s| s.as_ref()) {
            Some(s) => s,
            None => {
                return Err(ReadError::Corrupt {
                    file: self.dir().to_path_buf(),
                    offset: first * BLOCK as u64,
                    reason: format!("address names segment slot {slot}, which is not open"),
                })
            }
        };
        let mut out = Vec::with_capacity(count as usize * PAYLOAD);
        let in_ram_from = self
            .head_of_active(slot)
            .map_or(u64::MAX, |h| h.chunk_start / BLOCK as u64);
        let disk_count = count.min(in_ram_from.saturating_sub(first));
        let cached = disk_count > 0
            && (first..first + disk_count).all(|b| self.recent.contains_key(&(slot, b)));
        if cached {
            for b in first..first + disk_count {
                out.extend_from_slice(&self.recent[&(slot, b)]);
            }
            self.recent_hits += 1;
        } else if disk_count > 0 {
            let offset = first * BLOCK as u64;
            let mut buf = AlignedBuf::with_capacity(disk_count as usize * BLOCK);
            let n = seg
                .file
                .read_at_blocking(&mut buf, offset)
                .map_err(|source| ReadError::Io {
                    file: seg.path.clone(),
                    offset,
                    source,
                })?;
            self.reads += 1;
            self.hot_reads += u64::from(seg.device == HOT);
            self.bytes_read += n as u64;
            if n < buf.capacity() {
                return Err(ReadError::Corrupt {
                    file: seg.path.clone(),
                    offset: offset + n as u64,
                    reason: format!(
                        "the file ends {n} bytes into a {}-byte read",
                        buf.capacity()
                    ),
                });
            }
            out.extend_from_slice(&check_blocks(seg.seq, first, &seg.path, buf.as_slice())?);
            if remember {
                for (i, block) in buf.as_slice().chunks_exact(BLOCK).enumerate() {
                    self.remember(slot, first + i as u64, &block[..PAYLOAD]);
                }
            }
        }
        for b in first + disk_count..first + count {
            let at = ((b - in_ram_from) * BLOCK as u64) as usize;
            let chunk = self
                .head_of_active(slot)
                .expect("an active segment")
                .chunk
                .as_slice();
            let mut block = [0u8; PAYLOAD];
            if at < chunk.len() {
                let n = (chunk.len() - at).min(PAYLOAD);
                block[..n].copy_from_slice(&chunk[at..at + n]);
            }
            out.extend_from_slice(&block);
        }
        Ok(out)
    }

    /// Drops the recent blocks (tests: as if other reads pushed them out).
    pub fn forget_recent(&mut self) {
        self.recent.clear();
        self.recent_order.clear();
    }

    /// Keeps a block just read among the recent ones (blocks are never
    /// rewritten, so a kept block stays right until its segment goes).
    fn remember(&mut self, slot: u32, block: u64, payload: &[u8]) {
        if self.recent.insert((slot, block), payload.into()).is_none() {
            self.recent_order.push_back((slot, block));
        }
        while self.recent_order.len() > RECENT_BLOCKS {
            if let Some(old) = self.recent_order.pop_front() {
                self.recent.remove(&old);
            }
        }
    }

    /// Where the record at `addr` starts and which blocks a read of it
    /// fetches first (`span`: the index's hint that it runs into the next
    /// block, so records up to about 4 KiB take one read of one or two
    /// blocks).
    pub fn locate(&self, addr: u32, span: u8) -> Result<RecordSpot, ReadError> {
        let Addr { slot, offset } = self.decode_addr(addr);
        let first = offset / BLOCK as u64;
        let in_block = (offset % BLOCK as u64) as usize;
        if in_block > PAYLOAD - RECORD_HEADER || offset < BLOCK as u64 {
            return Err(ReadError::Corrupt {
                file: self.path_of_slot(slot),
                offset,
                reason: "address is not a record start".into(),
            });
        }
        let seg = self.segs.get(slot as usize).and_then(|s| s.as_ref());
        let seg_blocks = seg.map_or(0, |s| s.end.div_ceil(BLOCK as u64));
        let version = seg.map_or(SEGMENT_VERSION, |s| s.version);
        let count = (u64::from(span) + 1).min(seg_blocks.saturating_sub(first).max(1));
        Ok(RecordSpot {
            slot,
            first,
            count,
            offset,
            version,
        })
    }

    /// Reads the record at `addr` (see [`ValueLog::locate`] for `span`).
    pub fn read(&mut self, addr: u32, span: u8) -> Result<Record, ReadError> {
        let mut spot = self.locate(addr, span)?;
        let mut bytes = self.read_blocks(spot.slot, spot.first, spot.count, true)?;
        loop {
            match parse_record(
                &bytes,
                &spot,
                self.segment_bytes,
                &self.path_of_slot(spot.slot),
            )? {
                Parsed::Record(r) => return Ok(r),
                Parsed::NeedBlocks(count) => {
                    let rest = self.read_blocks(
                        spot.slot,
                        spot.first + spot.count,
                        count - spot.count,
                        true,
                    )?;
                    bytes.extend_from_slice(&rest);
                    spot.count = count;
                }
            }
        }
    }

    /// Whether blocks `first..first + count` of segment `slot` can be had
    /// without a device read: all kept among the recent ones, or all in
    /// the active segment's unwritten tail. (A range that is partly both,
    /// or partly on the device, counts as needing the device.)
    pub fn in_ram(&self, slot: u32, first: u64, count: u64) -> bool {
        let unwritten = self
            .head_of_active(slot)
            .is_some_and(|h| first * BLOCK as u64 >= h.chunk_start);
        unwritten || (first..first + count).all(|b| self.recent.contains_key(&(slot, b)))
    }

    /// The open file behind segment `slot`, for a read done elsewhere (an
    /// asynchronous one), if all of blocks `first..first + count` are
    /// already written to it (not in the RAM tail).
    pub fn device_source(
        &self,
        slot: u32,
        first: u64,
        count: u64,
    ) -> Option<DeviceSource<D::File>> {
        let seg = self.segs.get(slot as usize)?.as_ref()?;
        if self
            .head_of_active(slot)
            .is_some_and(|h| (first + count) * BLOCK as u64 > h.chunk_start)
        {
            return None;
        }
        Some(DeviceSource {
            file: Rc::clone(&seg.file),
            path: seg.path.clone(),
            seq: seg.seq,
            device: seg.device,
        })
    }

    /// Keeps checked blocks read through a [`DeviceSource`] among the
    /// recent ones, if segment `slot` is still the one they came from.
    pub fn remember_read(&mut self, slot: u32, seq: u64, first: u64, payloads: &[u8]) {
        let same = self
            .segs
            .get(slot as usize)
            .and_then(|s| s.as_ref())
            .is_some_and(|s| s.seq == seq);
        if same {
            for (i, p) in payloads.chunks_exact(PAYLOAD).enumerate() {
                self.remember(slot, first + i as u64, p);
            }
        }
    }

    /// The sequence number of the segment in `slot`, if one is open there.
    pub fn seq_of_slot(&self, slot: u32) -> Option<u64> {
        self.segs.get(slot as usize)?.as_ref().map(|s| s.seq)
    }

    /// The records of segment `slot` from file offset `from` (a record
    /// start, or a block start), reading about `max_blocks` blocks (more
    /// if one record needs them), in order. Returns them and where the next
    /// call goes on; at or past the segment's end when it is done. Skips
    /// the padding after a flush. For GC, which reads a victim a step at a
    /// time.
    pub fn scan_from(
        &mut self,
        slot: u32,
        from: u64,
        max_blocks: u64,
    ) -> Result<(Vec<(u32, Record)>, u64), ReadError> {
        let (end, version) = match self.segs.get(slot as usize).and_then(|s| s.as_ref()) {
            Some(s) => (s.end, s.version),
            None => return Ok((Vec::new(), u64::MAX)),
        };
        let total = end.div_ceil(BLOCK as u64);
        let first = (from / BLOCK as u64).max(1);
        let mut out = Vec::new();
        if first >= total {
            return Ok((out, end));
        }
        let count = max_blocks.max(1).min(total - first);
        let payload = self.read_blocks(slot, first, count, false)?;
        let mut pos = from.max(BLOCK as u64);
        while pos < end {
            let logical =
                ((pos / BLOCK as u64 - first) * PAYLOAD as u64 + pos % BLOCK as u64) as usize;
            if logical + RECORD_HEADER > payload.len() {
                break;
            }
            let h = &payload[logical..];
            if h[0] & FLAG_VALUE == 0 {
                // Padding to a block end (after a flush): go on at the next block.
                pos = align_up(pos + 1, BLOCK as u64);
                continue;
            }
            let Some((_, key_len, value_len, lsn, expires_at_ms, hlen)) = decode_header(h, version)
            else {
                // The header runs past the window: read from here on.
                if out.is_empty() && first + count < total {
                    return self.scan_from(slot, pos, max_blocks + 1);
                }
                if first + count >= total {
                    return Err(ReadError::Corrupt {
                        file: self.path_of_slot(slot),
                        offset: pos,
                        reason: "record header runs past the segment's data".into(),
                    });
                }
                break;
            };
            let size = hlen + key_len + value_len;
            if logical + size > payload.len() {
                if first + count >= total {
                    return Err(ReadError::Corrupt {
                        file: self.path_of_slot(slot),
                        offset: pos,
                        reason: "record runs past the segment's data".into(),
                    });
                }
                if out.is_empty() {
                    // One record longer than the window: read it whole.
                    let need = (pos % BLOCK as u64 + advance(pos, size as u64) - pos)
                        .div_ceil(BLOCK as u64)
                        + 1;
                    return self.scan_from(slot, pos, need.max(max_blocks + 1));
                }
                break;
            }
            let body = &payload[logical..logical + size];
            let addr = self.encode_addr(Addr { slot, offset: pos });
            out.push((
                addr,
                Record {
                    key: bytes::Bytes::copy_from_slice(&body[hlen..hlen + key_len]),
                    value: bytes::Bytes::copy_from_slice(&body[hlen + key_len..]),
                    expires_at_ms,
                    lsn,
                    size: size as u64,
                },
            ));
            pos = next_start(advance(pos, size as u64));
        }
        Ok((out, pos))
    }

    pub fn path_of_slot(&self, slot: u32) -> PathBuf {
        self.segs
            .get(slot as usize)
            .and_then(|s| s.as_ref())
            .map_or_else(|| self.dir().to_path_buf(), |s| s.path.clone())
    }

    /// Every open segment file for an online backup: the sealed ones (and
    /// those GC emptied) whole, the active one up to its written blocks
    /// (its buffered tail is not in the file yet; blocks are written whole
    /// and never rewritten).
    pub fn backup_files(&self) -> Vec<crate::tier::TierFile> {
        let mut out = Vec::new();
        for (slot, seg) in self.segs.iter().enumerate() {
            let Some(seg) = seg else { continue };
            let active = self.head_of_active(slot as u32);
            out.push(crate::tier::TierFile {
                path: seg.path.clone(),
                bytes: active.map_or(u64::MAX, |h| h.chunk_start),
                sealed: active.is_none(),
            });
        }
        out
    }

    /// Closes a segment's slot and removes its file.
    pub fn remove(&mut self, slot: u32) -> io::Result<()> {
        // The slot will name another segment: forget its blocks.
        self.recent.retain(|&(s, _), _| s != slot);
        self.recent_order.retain(|&(s, _)| s != slot);
        if let Some(seg) = self.segs[slot as usize].take() {
            self.removed += 1;
            let (path, head) = (seg.path.clone(), &self.heads[seg.device as usize]);
            drop(seg);
            head.disk.remove_file_blocking(&path)?;
            head.disk.sync_dir_blocking(&head.dir)?;
        }
        Ok(())
    }

    /// Removes segment files in the directory that no slot names (written
    /// after the checkpoint recovery loaded: WAL replay writes their
    /// records again).
    pub fn remove_orphans(&mut self) -> io::Result<u64> {
        let mut removed = 0;
        for device in 0..self.heads.len() {
            let mut here = 0;
            let head = &self.heads[device];
            for path in head.disk.list_dir(&head.dir)? {
                let Some(seq) = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_suffix(".seg"))
                    .and_then(|n| n.parse::<u64>().ok())
                else {
                    continue;
                };
                self.next_seq = self.next_seq.max(seq + 1);
                // A segment open on the other device is not this file.
                let open_here = self
                    .segs
                    .iter()
                    .flatten()
                    .any(|s| s.seq == seq && s.device as usize == device);
                if !open_here {
                    head.disk.remove_file_blocking(&path)?;
                    here += 1;
                }
            }
            if here > 0 {
                head.disk.sync_dir_blocking(&head.dir)?;
            }
            removed += here;
        }
        Ok(removed)
    }
}

fn encode_header(
    block: &mut [u8],
    (shard, dir_id): (u32, crate::layout::DirId),
    seq: u64,
    segment_bytes: u64,
) {
    block.fill(0);
    block[0..8].copy_from_slice(&SEGMENT_MAGIC);
    block[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    block[12..16].copy_from_slice(&shard.to_le_bytes());
    block[16..24].copy_from_slice(&seq.to_le_bytes());
    block[24..32].copy_from_slice(&segment_bytes.to_le_bytes());
    block[32..40].copy_from_slice(&dir_id.to_le_bytes());
    let crc = block_crc(seq, 0, &block[..PAYLOAD]);
    block[PAYLOAD..].copy_from_slice(&crc.to_le_bytes());
}

/// Checks a segment's header block, of segment `seq` of shard `owner.0` in
/// the data directory whose identity is `owner.1` (0: checks none);
/// returns its format version.
pub(crate) fn check_header(
    block: &[u8],
    (shard, dir_id): (u32, crate::layout::DirId),
    seq: u64,
) -> Result<u32, String> {
    if block.len() < BLOCK {
        return Err("shorter than its header block".into());
    }
    let stored = u32::from_le_bytes(block[PAYLOAD..BLOCK].try_into().expect("4 bytes"));
    if stored != block_crc(seq, 0, &block[..PAYLOAD]) {
        return Err("header checksum mismatch (or the file belongs to another segment)".into());
    }
    if block[0..8] != SEGMENT_MAGIC {
        return Err("bad magic".into());
    }
    let version = u32::from_le_bytes(block[8..12].try_into().expect("4 bytes"));
    if !(SEGMENT_VERSION_MIN..=SEGMENT_VERSION).contains(&version) {
        return Err(format!(
            "segment format version {version}, this build reads {SEGMENT_VERSION_MIN} to {SEGMENT_VERSION}"
        ));
    }
    let owner = u32::from_le_bytes(block[12..16].try_into().expect("4 bytes"));
    if owner != shard {
        return Err(format!("segment of shard {owner}, opened by shard {shard}"));
    }
    let found = if version >= SEGMENT_VERSION_DIR_ID {
        u64::from_le_bytes(block[32..40].try_into().expect("8 bytes"))
    } else {
        0
    };
    if crate::layout::is_foreign(found, dir_id) {
        return Err(crate::layout::foreign_reason(found, dir_id));
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::sim::SimDisk;

    const SEG: u64 = 64 * 1024;

    fn log(disk: &SimDisk) -> ValueLog<SimDisk> {
        let dir = PathBuf::from("/values");
        disk.create_dir_all(&dir).expect("mkdir");
        ValueLog::new(disk.clone(), dir, 0, SEG)
    }

    /// Records of every shape (with and without expiry, headers that run
    /// into the next block) read back with the LSN they were written
    /// with, by address and by a scan, after the segment is reopened.
    #[test]
    fn records_read_back_with_their_lsn() {
        let disk = SimDisk::new(1);
        let mut w = log(&disk);
        let mut written = Vec::new();
        for i in 0..300u64 {
            let key = format!("key-{i}");
            let value = vec![i as u8; (i as usize * 37) % 700];
            let at = (i % 3 == 0).then_some(1_000 + i);
            let lsn = 10 + i * 2;
            let (addr, span) = w
                .append(MAIN, key.as_bytes(), &value, at, lsn)
                .expect("append");
            written.push((addr, span, key, value, at, lsn));
        }
        w.flush().expect("flush");
        let seqs: Vec<(u32, u64, u64, u64)> = w
            .segs
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| {
                s.as_ref()
                    .map(|s| (slot as u32, s.seq, s.end, s.total_bytes))
            })
            .collect();
        assert!(seqs.len() > 1, "several segments");
        let mut r = log(&disk);
        for &(slot, seq, end, total) in &seqs {
            r.open_existing(slot, seq, end, total, SegState::Sealed)
                .expect("open");
            assert_eq!(
                r.segs[slot as usize].as_ref().expect("open").version,
                SEGMENT_VERSION
            );
        }
        for (addr, span, key, value, at, lsn) in &written {
            let rec = r.read(*addr, *span).expect("read");
            assert_eq!(rec.key, key.as_bytes());
            assert_eq!(&rec.value[..], &value[..]);
            assert_eq!(rec.expires_at_ms, *at);
            assert_eq!(rec.lsn, Some(*lsn));
            assert_eq!(rec.size, record_size(key.len(), value.len(), at.is_some()));
        }
        let mut scanned = Vec::new();
        for &(slot, ..) in &seqs {
            let mut from = 0;
            loop {
                let (recs, next) = r.scan_from(slot, from, 1).expect("scan");
                scanned.extend(recs.into_iter().map(|(a, rec)| (a, rec.lsn)));
                if next >= r.segs[slot as usize].as_ref().expect("open").end {
                    break;
                }
                from = next;
            }
        }
        scanned.sort();
        let mut want: Vec<(u32, Option<u64>)> = written.iter().map(|w| (w.0, Some(w.5))).collect();
        want.sort();
        assert_eq!(scanned, want);
    }

    /// A version 1 segment (made here byte for byte: header version 1,
    /// records with no LSN) reads, its records without an LSN; a version
    /// this build does not know is refused.
    #[test]
    fn version_1_segments_read_without_an_lsn_and_unknown_versions_are_refused() {
        let disk = SimDisk::new(2);
        let mut l = log(&disk);
        let seq = 7;
        let mut file = vec![0u8; 2 * BLOCK];
        encode_header(&mut file[..BLOCK], (0, 0), seq, SEG);
        file[8..12].copy_from_slice(&1u32.to_le_bytes());
        let crc = block_crc(seq, 0, &file[..PAYLOAD]);
        file[PAYLOAD..BLOCK].copy_from_slice(&crc.to_le_bytes());
        // Two records: "a" = "xyz" with no expiry at offset 0 of block 1,
        // "bb" = "v" expiring at 5,000 at offset 16.
        let b = &mut file[BLOCK..];
        b[0] = FLAG_VALUE;
        b[1] = 1;
        b[4] = 3;
        b[8..12].copy_from_slice(b"axyz");
        b[16] = FLAG_VALUE | FLAG_EXPIRES;
        b[17] = 2;
        b[20] = 1;
        b[24..32].copy_from_slice(&5_000u64.to_le_bytes());
        b[32..35].copy_from_slice(b"bbv");
        let crc = block_crc(seq, 1, &b[..PAYLOAD]);
        b[PAYLOAD..BLOCK].copy_from_slice(&crc.to_le_bytes());
        let path = l.path_of(seq);
        let f = disk.open_blocking(&path, true).expect("create");
        let mut buf = AlignedBuf::with_capacity(file.len());
        buf.extend_from_slice(&file);
        f.write_at_blocking(&buf, 0).expect("write");
        l.open_existing(0, seq, BLOCK as u64 + 35, 35, SegState::Sealed)
            .expect("a version 1 segment opens");
        assert_eq!(l.segs[0].as_ref().expect("open").version, 1);
        let a = l.encode_addr(Addr {
            slot: 0,
            offset: BLOCK as u64,
        });
        let rec = l.read(a, 0).expect("read");
        assert_eq!(
            (&rec.key[..], &rec.value[..], rec.lsn, rec.size),
            (&b"a"[..], &b"xyz"[..], None, 12)
        );
        let (recs, _) = l.scan_from(0, 0, 4).expect("scan");
        let got: Vec<_> = recs
            .iter()
            .map(|(_, r)| (r.key.to_vec(), r.value.to_vec(), r.expires_at_ms, r.lsn))
            .collect();
        assert_eq!(
            got,
            vec![
                (b"a".to_vec(), b"xyz".to_vec(), None, None),
                (b"bb".to_vec(), b"v".to_vec(), Some(5_000), None),
            ]
        );

        let mut header = vec![0u8; BLOCK];
        encode_header(&mut header, (0, 0), 9, SEG);
        header[8..12].copy_from_slice(&4u32.to_le_bytes());
        let crc = block_crc(9, 0, &header[..PAYLOAD]);
        header[PAYLOAD..].copy_from_slice(&crc.to_le_bytes());
        let err = check_header(&header, (0, 0), 9).expect_err("version 4 refused");
        assert!(err.contains("version 4"), "{err}");
        encode_header(&mut header, (0, 0), 9, SEG);
        assert_eq!(check_header(&header, (0, 0), 9), Ok(SEGMENT_VERSION));
    }

    /// A version 3 header carries the directory identity: another
    /// directory's is refused, naming both; a version 2 header (none) is
    /// read by any directory.
    #[test]
    fn the_directory_identity_is_checked() {
        let mut header = vec![0u8; BLOCK];
        encode_header(&mut header, (0, 0xaaaa), 9, SEG);
        assert_eq!(check_header(&header, (0, 0xaaaa), 9), Ok(SEGMENT_VERSION));
        assert_eq!(check_header(&header, (0, 0), 9), Ok(SEGMENT_VERSION));
        let err = check_header(&header, (0, 0xbbbb), 9).expect_err("foreign");
        assert!(err.contains("another data directory"), "{err}");
        assert!(err.contains("aaaa") && err.contains("bbbb"), "{err}");
        header[8..12].copy_from_slice(&2u32.to_le_bytes());
        header[32..40].fill(0);
        let crc = block_crc(9, 0, &header[..PAYLOAD]);
        header[PAYLOAD..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(check_header(&header, (0, 0xbbbb), 9), Ok(2));
    }

    #[test]
    fn advance_skips_crc_words() {
        let b = BLOCK as u64;
        assert_eq!(advance(b, 10), b + 10);
        assert_eq!(advance(b, PAYLOAD as u64), b + PAYLOAD as u64);
        assert_eq!(advance(b, PAYLOAD as u64 + 1), 2 * b + 1);
        assert_eq!(advance(b + 4080, 20), 2 * b + 8);
        assert_eq!(next_start(b + 4081), 2 * b);
        assert_eq!(next_start(b + 17), b + 32);
    }
}
