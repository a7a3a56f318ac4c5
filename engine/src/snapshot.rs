//! Snapshot files (checkpoints of one shard's tier): the byte format, a
//! streaming writer that turns blocks of entries into large O_DIRECT
//! writes, and the loader used by recovery. `chain` picks and loads the
//! snapshot chain recovery starts from.
//!
//! Layout: a 4 KiB header block (magic, version, shard, covered LSN, max
//! commit version, CRC; a delta snapshot adds the LSN of the snapshot it
//! builds on and a second CRC; format 5 adds the data directory's identity
//! and a CRC of the whole header), then a stream of checksummed blocks of
//! entries, then
//! a trailer (block count, entry count, end LSN, payload bytes, CRC), zero
//! padded to a 4 KiB boundary. A snapshot is valid only if every block and
//! the trailer check out and the counts agree; a file is only ever named
//! `LSN.snap` after it was written in full and fdatasync'ed. Diagrams in
//! `docs/wal.md`.

use crate::error::{IoFailure, SnapshotError};
use crate::io::window::FileWindow;
use crate::io::{AlignedBuf, DiskFile, ALIGN};
use crate::layout::{is_foreign, DirId, FORMAT_VERSION, FORMAT_VERSION_DIR_ID, FORMAT_VERSION_MIN};
use crate::tier::Tier;
use std::path::{Path, PathBuf};

pub mod chain;

pub const SNAPSHOT_MAGIC: [u8; 8] = *b"RINGKVSN";
/// Header of a full snapshot: magic, version, shard, LSN, max commit
/// version, CRC of the 32 bytes before it. Zeroes follow (older builds
/// require them, so a full snapshot is still readable by them).
const HEADER_BYTES: usize = 36;
/// Header of a delta snapshot: the full header, then the LSN of the
/// snapshot it builds on (never 0) and a CRC of the 44 bytes before it.
const DELTA_HEADER_BYTES: usize = 48;
/// Header of format 5 (full or delta): the delta header's 48 bytes (zero
/// after byte 36 in a full snapshot), the directory identity u64 and a CRC
/// of the 56 bytes before it.
const DIR_HEADER_BYTES: usize = 60;
const _: () = assert!(DIR_HEADER_BYTES <= ALIGN);
const BLOCK_MAGIC: [u8; 4] = *b"SBLK";
const TRAILER_MAGIC: [u8; 4] = *b"STRL";
/// Block header: magic, crc, seq u64, payload_len u32, entry_count u32.
pub const BLOCK_HEADER_BYTES: usize = 24;
/// Trailer: magic, crc, block_count, entry_count, end_lsn, payload_bytes, max_commit_version.
pub const TRAILER_BYTES: usize = 48;
/// Entry header: key_len u32, value_len u32.
pub const ENTRY_HEADER_BYTES: usize = 8;
/// Bit of an entry's key_len (format 2): 8 bytes of expiry time (absolute
/// Unix ms, LE) follow the entry header, before the key.
pub const ENTRY_KEY_LEN_EXPIRES: u32 = 1 << 31;
/// Bytes of an entry's expiry time.
pub const ENTRY_EXPIRY_BYTES: usize = 8;
/// Bit of an entry's key_len, in delta snapshots only: the key was
/// deleted since the base snapshot (no value, no expiry follows).
pub const ENTRY_KEY_LEN_DELETED: u32 = 1 << 30;
/// Key length bits of an entry's key_len.
const ENTRY_KEY_LEN_MASK: u32 = ENTRY_KEY_LEN_DELETED - 1;
/// A block is closed once its payload passes this size.
pub const BLOCK_TARGET_BYTES: usize = 256 * 1024;
/// Size of each O_DIRECT write of a snapshot.
pub const WRITE_CHUNK_BYTES: usize = 1 << 20;
const _: () = assert!(WRITE_CHUNK_BYTES.is_multiple_of(ALIGN));
const _: () = assert!(HEADER_BYTES <= ALIGN);

/// What a snapshot's header and trailer say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotMeta {
    pub shard: u32,
    /// Every record with an LSN at or below this is reflected in the snapshot.
    pub lsn: u64,
    /// LSN applied when the copy ended; records in `(lsn, end_lsn]` may or
    /// may not be reflected (a fuzzy snapshot), and are replayed from the WAL.
    pub end_lsn: u64,
    /// Largest commit version any entry may carry.
    pub max_commit_version: u64,
    /// A delta snapshot: the LSN of the snapshot it builds on (its entries
    /// are loaded over that one's). `None`: a full snapshot.
    pub base_lsn: Option<u64>,
    pub entries: u64,
    pub blocks: u64,
}

fn le4(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn le8(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Encodes the header block of a snapshot of shard `owner.0` in the data
/// directory whose identity is `owner.1`; `base_lsn` makes it a delta
/// snapshot's.
pub fn encode_header(
    (shard, dir_id): (u32, DirId),
    lsn: u64,
    max_commit_version: u64,
    base_lsn: Option<u64>,
    block: &mut [u8],
) {
    assert_eq!(block.len(), ALIGN);
    block.fill(0);
    block[0..8].copy_from_slice(&SNAPSHOT_MAGIC);
    block[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    block[12..16].copy_from_slice(&shard.to_le_bytes());
    block[16..24].copy_from_slice(&lsn.to_le_bytes());
    block[24..32].copy_from_slice(&max_commit_version.to_le_bytes());
    let crc = crc32fast::hash(&block[0..32]);
    block[32..36].copy_from_slice(&crc.to_le_bytes());
    if let Some(base) = base_lsn {
        assert!(
            base != 0 && base < lsn,
            "a delta builds on an older snapshot"
        );
        block[36..44].copy_from_slice(&base.to_le_bytes());
        let crc = crc32fast::hash(&block[0..44]);
        block[44..48].copy_from_slice(&crc.to_le_bytes());
    }
    block[48..56].copy_from_slice(&dir_id.to_le_bytes());
    let crc = crc32fast::hash(&block[0..56]);
    block[56..60].copy_from_slice(&crc.to_le_bytes());
}

/// Turns entries into checksummed blocks, built in place in the caller's
/// output buffer: a value is copied once, into `out`, never into a block
/// of its own first (a 100 MiB value costs 100 MiB while it is staged, not
/// twice that).
#[derive(Debug, Default)]
pub struct BlockEncoder {
    next_seq: u64,
    entries: u64,
    payload_bytes: u64,
    /// Where the open block's header placeholder starts in `out`.
    open_at: Option<usize>,
    open_entries: u32,
}

impl BlockEncoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Readies the open block for an entry of `entry` bytes: closes it
    /// first if the entry would take it past its target size.
    fn make_room(&mut self, entry: usize, out: &mut Vec<u8>) {
        if let Some(at) = self.open_at {
            assert!(at <= out.len(), "the open block lives in the same buffer");
            let payload = out.len() - at - BLOCK_HEADER_BYTES;
            if self.open_entries > 0 && payload + entry > BLOCK_TARGET_BYTES {
                self.finish_block(out);
            }
        }
        if self.open_at.is_none() {
            self.open_at = Some(out.len());
            out.resize(out.len() + BLOCK_HEADER_BYTES, 0);
        }
        out.reserve(entry);
    }

    /// Adds one entry (with its expiry time, if it has one), closing the
    /// open block first if it is full.
    pub fn add(&mut self, key: &[u8], value: &[u8], expires_at_ms: Option<u64>, out: &mut Vec<u8>) {
        let extra = expires_at_ms.map_or(0, |_| ENTRY_EXPIRY_BYTES);
        self.make_room(ENTRY_HEADER_BYTES + extra + key.len() + value.len(), out);
        let key_len = u32::try_from(key.len()).expect("key over 4 GiB");
        assert!(key_len <= ENTRY_KEY_LEN_MASK, "key over 1 GiB");
        let value_len = u32::try_from(value.len()).expect("value over 4 GiB");
        let flag = expires_at_ms.map_or(0, |_| ENTRY_KEY_LEN_EXPIRES);
        out.extend_from_slice(&(key_len | flag).to_le_bytes());
        out.extend_from_slice(&value_len.to_le_bytes());
        if let Some(at) = expires_at_ms {
            out.extend_from_slice(&at.to_le_bytes());
        }
        out.extend_from_slice(key);
        out.extend_from_slice(value);
        self.open_entries += 1;
    }

    /// Adds a deleted-key entry (delta snapshots only).
    pub fn add_deleted(&mut self, key: &[u8], out: &mut Vec<u8>) {
        self.make_room(ENTRY_HEADER_BYTES + key.len(), out);
        let key_len = u32::try_from(key.len()).expect("key over 4 GiB");
        assert!(key_len <= ENTRY_KEY_LEN_MASK, "key over 1 GiB");
        out.extend_from_slice(&(key_len | ENTRY_KEY_LEN_DELETED).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(key);
        self.open_entries += 1;
    }

    /// Closes the open block (if it has entries): fills in its header.
    /// `out` must be the buffer the block's entries were added to, not
    /// cleared or written out since.
    pub fn finish_block(&mut self, out: &mut [u8]) {
        let Some(at) = self.open_at else {
            return;
        };
        if self.open_entries == 0 {
            return;
        }
        assert!(
            at + BLOCK_HEADER_BYTES <= out.len(),
            "the open block lives in the same buffer"
        );
        let b = &mut out[at..];
        let payload_len = b.len() - BLOCK_HEADER_BYTES;
        let payload_u32 = u32::try_from(payload_len).expect("block over 4 GiB");
        b[0..4].copy_from_slice(&BLOCK_MAGIC);
        b[8..16].copy_from_slice(&self.next_seq.to_le_bytes());
        b[16..20].copy_from_slice(&payload_u32.to_le_bytes());
        b[20..24].copy_from_slice(&self.open_entries.to_le_bytes());
        let crc = crc32fast::hash(&b[8..]);
        b[4..8].copy_from_slice(&crc.to_le_bytes());
        self.next_seq += 1;
        self.entries += u64::from(self.open_entries);
        self.payload_bytes += payload_len as u64;
        self.open_at = None;
        self.open_entries = 0;
    }

    /// The trailer closing the stream (call after the last `finish_block`).
    pub fn trailer(&self, end_lsn: u64, max_commit_version: u64) -> [u8; TRAILER_BYTES] {
        assert_eq!(self.open_entries, 0, "finish the open block first");
        let mut t = [0u8; TRAILER_BYTES];
        t[0..4].copy_from_slice(&TRAILER_MAGIC);
        t[8..16].copy_from_slice(&self.next_seq.to_le_bytes());
        t[16..24].copy_from_slice(&self.entries.to_le_bytes());
        t[24..32].copy_from_slice(&end_lsn.to_le_bytes());
        t[32..40].copy_from_slice(&self.payload_bytes.to_le_bytes());
        t[40..48].copy_from_slice(&max_commit_version.to_le_bytes());
        let crc = crc32fast::hash(&t[8..]);
        t[4..8].copy_from_slice(&crc.to_le_bytes());
        t
    }

    pub fn entries(&self) -> u64 {
        self.entries
    }
}

/// Streams bytes into a file as large aligned O_DIRECT writes.
pub struct ChunkWriter<'a, F: DiskFile> {
    file: &'a F,
    path: &'a Path,
    buf: Option<AlignedBuf>,
    file_offset: u64,
}

impl<'a, F: DiskFile> ChunkWriter<'a, F> {
    pub fn new(file: &'a F, path: &'a Path) -> Self {
        ChunkWriter {
            file,
            path,
            buf: Some(AlignedBuf::with_capacity(WRITE_CHUNK_BYTES)),
            file_offset: 0,
        }
    }

    async fn write_out(&mut self) -> Result<(), SnapshotError> {
        let Some(mut buf) = self.buf.take() else {
            unreachable!("chunk buffer always returned");
        };
        buf.pad_to_align();
        let len = buf.len() as u64;
        let offset = self.file_offset;
        let (res, mut buf) = self.file.write_at(buf, offset).await;
        buf.set_len(0);
        self.buf = Some(buf);
        res.map_err(SnapshotError::io_at("write", self.path, offset))?;
        self.file_offset += len;
        Ok(())
    }

    /// Appends bytes, writing every full chunk.
    pub async fn write(&mut self, mut bytes: &[u8]) -> Result<(), SnapshotError> {
        while !bytes.is_empty() {
            let buf = self.buf.as_mut().expect("chunk buffer present");
            let n = buf.remaining().min(bytes.len());
            buf.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if buf.remaining() == 0 {
                self.write_out().await?;
            }
        }
        Ok(())
    }

    /// Writes what is buffered, zero padded to a block; returns the file length.
    pub async fn finish(&mut self) -> Result<u64, SnapshotError> {
        if self.buf.as_ref().is_some_and(|b| !b.is_empty()) {
            self.write_out().await?;
        }
        Ok(self.file_offset)
    }
}

/// The entry count stated by the trailer at the end of a snapshot file,
/// found in the file's last two aligned blocks (the trailer is followed
/// only by zero padding up to a block boundary); `None` if no trailer with
/// a valid checksum sits there. Nothing else is checked: this is a hint
/// for sizing tables before [`load`], which checks everything.
pub async fn entry_count_hint<F: DiskFile>(file: &F) -> Option<u64> {
    const TAIL_BYTES: usize = 2 * ALIGN;
    let file_len = file.len().await.ok()?;
    if file_len < TAIL_BYTES as u64 || file_len % ALIGN as u64 != 0 {
        return None;
    }
    let (res, buf) = file
        .read_at(
            AlignedBuf::with_capacity(TAIL_BYTES),
            file_len - TAIL_BYTES as u64,
        )
        .await;
    let tail = &buf.as_slice()[..res.ok()?];
    // The trailer's last byte is at or after the last non-zero byte.
    let last_nonzero = tail.iter().rposition(|&b| b != 0)?;
    let first = (last_nonzero + 1).saturating_sub(TRAILER_BYTES);
    let last = tail.len().checked_sub(TRAILER_BYTES)?;
    (first..=last)
        .find_map(|at| {
            let t = &tail[at..at + TRAILER_BYTES];
            let valid = t[0..4] == TRAILER_MAGIC && le4(&t[4..8]) == crc32fast::hash(&t[8..]);
            valid.then(|| le8(&t[16..24]))
        })
        // A count no file of this size can hold is not worth a table that big.
        .filter(|&entries| entries <= file_len / ENTRY_HEADER_BYTES as u64)
}

/// What a snapshot's header block says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotHeader {
    pub version: u32,
    pub lsn: u64,
    pub max_commit_version: u64,
    /// The snapshot a delta builds on; `None` for a full snapshot.
    pub base_lsn: Option<u64>,
    /// The identity of the data directory that wrote it (0: format 4 or
    /// older, which has none).
    pub dir_id: DirId,
}

/// Decodes and checks a header block, of a snapshot of shard `owner.0` in
/// the data directory whose identity is `owner.1` (0: check no identity).
fn decode_header(
    header: &[u8],
    path: &Path,
    (expected_shard, expected_dir): (u32, DirId),
) -> Result<SnapshotHeader, SnapshotError> {
    let corrupt = |reason: String| SnapshotError::Corrupt {
        file: path.to_path_buf(),
        offset: 0,
        reason,
    };
    if header.len() < ALIGN {
        return Err(corrupt("shorter than its header block".into()));
    }
    let stored = le4(&header[32..36]);
    let computed = crc32fast::hash(&header[0..32]);
    if stored != computed {
        return Err(corrupt(format!(
            "header checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
        )));
    }
    if header[0..8] != SNAPSHOT_MAGIC {
        return Err(corrupt("bad magic".into()));
    }
    let version = le4(&header[8..12]);
    if !(FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&version) {
        return Err(corrupt(format!("unsupported format version {version}")));
    }
    let shard = le4(&header[12..16]);
    if shard != expected_shard {
        return Err(corrupt(format!(
            "belongs to shard {shard}, not {expected_shard}"
        )));
    }
    let lsn = le8(&header[16..24]);
    let base = le8(&header[36..44]);
    let base_lsn = if base == 0 && header[44..48].iter().all(|&b| b == 0) {
        None
    } else {
        let stored = le4(&header[44..48]);
        let computed = crc32fast::hash(&header[0..44]);
        if stored != computed {
            return Err(corrupt(format!(
                "delta header checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            )));
        }
        if base == 0 || base >= lsn {
            return Err(corrupt(format!(
                "a delta of LSN {lsn} cannot build on LSN {base}"
            )));
        }
        Some(base)
    };
    let (data, dir_id) = if version >= FORMAT_VERSION_DIR_ID {
        let stored = le4(&header[56..60]);
        let computed = crc32fast::hash(&header[0..56]);
        if stored != computed {
            return Err(corrupt(format!(
                "header checksum mismatch at 56 (stored {stored:#010x}, computed {computed:#010x})"
            )));
        }
        (DIR_HEADER_BYTES, le8(&header[48..56]))
    } else {
        (DELTA_HEADER_BYTES, 0)
    };
    if header[data..].iter().any(|&b| b != 0) {
        return Err(corrupt("bytes after the header are not zero".into()));
    }
    if is_foreign(dir_id, expected_dir) {
        return Err(SnapshotError::ForeignDirectory {
            file: path.to_path_buf(),
            found: dir_id,
            expected: expected_dir,
        });
    }
    Ok(SnapshotHeader {
        version,
        lsn,
        max_commit_version: le8(&header[24..32]),
        base_lsn,
        dir_id,
    })
}

/// Reads and checks only the header block of a snapshot (recovery uses it
/// to find which snapshot each delta builds on before loading any).
pub async fn read_header<F: DiskFile>(
    file: &F,
    path: &Path,
    owner: (u32, DirId),
) -> Result<SnapshotHeader, SnapshotError> {
    let (res, buf) = file.read_at(AlignedBuf::with_capacity(ALIGN), 0).await;
    let n = res.map_err(|source| SnapshotError::Io {
        op: "read",
        file: path.to_path_buf(),
        offset: 0,
        source,
    })?;
    decode_header(&buf.as_slice()[..n], path, owner)
}

/// Reads and checks a whole snapshot, putting every entry into `tier`
/// (with `None`, only checks it: every checksum, count and entry bound is
/// verified the same way, nothing is kept). On error `tier` holds a partial
/// load and must be discarded.
pub async fn load<F: DiskFile>(
    file: &F,
    path: &Path,
    owner: (u32, DirId),
    mut tier: Option<&mut dyn Tier>,
) -> Result<SnapshotMeta, SnapshotError> {
    let corrupt = |offset: u64, reason: String| SnapshotError::Corrupt {
        file: path.to_path_buf(),
        offset,
        reason,
    };
    let mut win = FileWindow::new(file, path)
        .await
        .map_err(SnapshotError::io_at("read", path, 0))?;
    let header = win
        .get(0, ALIGN)
        .await
        .map_err(SnapshotError::io_at("read", path, 0))?;
    let file_head = decode_header(header, path, owner)?;
    if let Some(tier) = tier.as_deref_mut() {
        tier.load_checkpoint_begin(file_head.base_lsn.is_some())
            .map_err(|reason| corrupt(0, reason))?;
    }

    let mut pos = ALIGN as u64;
    let mut read = BlockCounts::default();
    let mut progress = crate::progress::Progress::new("reading a snapshot", path);
    loop {
        let file_len = win.file_len();
        progress.tick(pos, file_len, read.entries);
        let head = win
            .get(pos, BLOCK_HEADER_BYTES)
            .await
            .map_err(SnapshotError::io_at("read", path, pos))?;
        if head.len() < 4 {
            return Err(corrupt(pos, "ends before its trailer".into()));
        }
        if head[0..4] == TRAILER_MAGIC {
            let t = win
                .get(pos, TRAILER_BYTES)
                .await
                .map_err(SnapshotError::io_at("read", path, pos))?;
            return check_trailer(t, &file_head, owner.0, &read)
                .map_err(|reason| corrupt(pos, reason));
        }
        if head.len() < BLOCK_HEADER_BYTES || head[0..4] != BLOCK_MAGIC {
            return Err(corrupt(pos, "expected a block or the trailer".into()));
        }
        let stored = le4(&head[4..8]);
        let seq = le8(&head[8..16]);
        let payload_len = u64::from(le4(&head[16..20]));
        let count = le4(&head[20..24]);
        let block_len = BLOCK_HEADER_BYTES as u64 + payload_len;
        if pos + block_len > file_len {
            return Err(corrupt(
                pos,
                format!("block of {block_len} bytes runs past the end"),
            ));
        }
        let block = win
            .get(pos, block_len as usize)
            .await
            .map_err(SnapshotError::io_at("read", path, pos))?;
        let computed = crc32fast::hash(&block[8..]);
        if stored != computed {
            return Err(corrupt(
                pos,
                format!(
                    "block checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
                ),
            ));
        }
        if seq != read.blocks {
            return Err(corrupt(
                pos,
                format!("block {seq} where {} was expected", read.blocks),
            ));
        }
        load_entries(
            &block[BLOCK_HEADER_BYTES..],
            count,
            &file_head,
            tier.as_deref_mut(),
        )
        .map_err(|reason| corrupt(pos, reason))?;
        read.blocks += 1;
        read.entries += u64::from(count);
        read.payload += payload_len;
        pos += block_len;
    }
}

/// What a snapshot's blocks held, to check against its trailer.
#[derive(Debug, Default)]
struct BlockCounts {
    blocks: u64,
    entries: u64,
    payload: u64,
}

/// Checks a snapshot's trailer (`t`, as read: maybe cut short) against the
/// header and what the blocks held; its figures make the snapshot's meta.
fn check_trailer(
    t: &[u8],
    head: &SnapshotHeader,
    shard: u32,
    read: &BlockCounts,
) -> Result<SnapshotMeta, String> {
    if t.len() < TRAILER_BYTES {
        return Err("trailer cut short".into());
    }
    let stored = le4(&t[4..8]);
    let computed = crc32fast::hash(&t[8..TRAILER_BYTES]);
    if stored != computed {
        return Err("trailer checksum mismatch".into());
    }
    let (t_blocks, t_entries) = (le8(&t[8..16]), le8(&t[16..24]));
    let end_lsn = le8(&t[24..32]);
    let t_payload = le8(&t[32..40]);
    let max_commit_version = le8(&t[40..48]).max(head.max_commit_version);
    if t_blocks != read.blocks || t_entries != read.entries || t_payload != read.payload {
        return Err(format!(
            "trailer counts {t_blocks} blocks / {t_entries} entries / {t_payload} bytes, \
             file holds {} / {} / {}",
            read.blocks, read.entries, read.payload
        ));
    }
    if end_lsn < head.lsn {
        return Err(format!("end LSN {end_lsn} below start LSN {}", head.lsn));
    }
    Ok(SnapshotMeta {
        shard,
        lsn: head.lsn,
        end_lsn,
        base_lsn: head.base_lsn,
        max_commit_version,
        entries: read.entries,
        blocks: read.blocks,
    })
}

/// Decodes the `count` entries of one block's payload, each into `tier`
/// (checked only, with `None`). Every entry must lie inside the payload,
/// and the entries must fill it exactly.
fn load_entries<'t>(
    payload: &[u8],
    count: u32,
    head: &SnapshotHeader,
    mut tier: Option<&mut (dyn Tier + 't)>,
) -> Result<(), String> {
    let mut at = 0usize;
    for _ in 0..count {
        if payload.len() - at < ENTRY_HEADER_BYTES {
            return Err("entry header past the block end".into());
        }
        let k_field = le4(&payload[at..]);
        let v = le4(&payload[at + 4..]) as usize;
        at += ENTRY_HEADER_BYTES;
        if k_field & ENTRY_KEY_LEN_DELETED != 0 {
            let k = (k_field & ENTRY_KEY_LEN_MASK) as usize;
            if head.base_lsn.is_none() || k_field & ENTRY_KEY_LEN_EXPIRES != 0 || v != 0 {
                return Err("a deleted-key entry outside a delta, or with a value".into());
            }
            if payload.len() - at < k {
                return Err("entry past the block end".into());
            }
            if let Some(tier) = tier.as_deref_mut() {
                tier.load_checkpoint_delete(&payload[at..at + k])?;
            }
            at += k;
            continue;
        }
        let mut expires_at_ms = None;
        if k_field & ENTRY_KEY_LEN_EXPIRES != 0 {
            if head.version < 2 {
                return Err("expiry flag in a version 1 snapshot".into());
            }
            if payload.len() - at < ENTRY_EXPIRY_BYTES {
                return Err("entry expiry past the block end".into());
            }
            let when = le8(&payload[at..]);
            if when == 0 {
                return Err("entry expiry of 0".into());
            }
            expires_at_ms = Some(when);
            at += ENTRY_EXPIRY_BYTES;
        }
        let k = (k_field & !ENTRY_KEY_LEN_EXPIRES) as usize;
        if payload.len() - at < k + v {
            return Err("entry past the block end".into());
        }
        if let Some(tier) = tier.as_deref_mut() {
            let key = &payload[at..at + k];
            tier.load_checkpoint_entry(key, &payload[at + k..at + k + v], expires_at_ms)?;
        }
        at += k + v;
    }
    if at != payload.len() {
        return Err("bytes left over after the block's entries".into());
    }
    Ok(())
}

/// A snapshot file found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotFile {
    pub lsn: u64,
    pub path: PathBuf,
    /// The snapshot a delta builds on; `None` for a full snapshot.
    pub base_lsn: Option<u64>,
    /// File size.
    pub bytes: u64,
}

// Chains: which snapshot files a state is loaded from and which are kept.

/// Snapshots whose chains are kept on disk: the newest only. Disk use is
/// bounded by live data (`docs/wal.md`, "Disk bounded by live data"), and
/// an older chain would double it; a damaged newest chain is refused at
/// recovery, never read as an older state.
pub(crate) const SNAPSHOTS_KEPT: usize = 1;

/// The snapshots a snapshot's state is loaded from, the full one first:
/// `Some(indexes into snapshots)`, or `None` if a base is missing.
pub(crate) fn chain_of(snapshots: &[SnapshotFile], at: usize) -> Option<Vec<usize>> {
    let mut chain = vec![at];
    let mut cur = &snapshots[at];
    while let Some(base) = cur.base_lsn {
        let i = snapshots.iter().position(|s| s.lsn == base)?;
        chain.push(i);
        cur = &snapshots[i];
    }
    chain.reverse();
    Some(chain)
}

/// What the next checkpoint builds on: the newest snapshot's LSN if it may
/// be a delta over it (`marks_valid`: the tier's change marks are relative
/// to it), `None` for a full one. A chain stops at `deltas_max` deltas, and
/// once its deltas together outgrow its full snapshot, so a recovery reads
/// at most about twice a full snapshot.
pub(crate) fn delta_base(
    snapshots: &[SnapshotFile],
    marks_valid: bool,
    deltas_max: u32,
) -> Option<u64> {
    let newest = snapshots.len().checked_sub(1)?;
    if !marks_valid || deltas_max == 0 {
        return None;
    }
    let chain = chain_of(snapshots, newest)?;
    let deltas = chain.len() - 1;
    let full_bytes = snapshots[chain[0]].bytes;
    let delta_bytes: u64 = chain[1..].iter().map(|&i| snapshots[i].bytes).sum();
    (deltas < deltas_max as usize && delta_bytes < full_bytes).then_some(snapshots[newest].lsn)
}

/// The snapshots to keep (sorted by LSN): the chains of the
/// SNAPSHOTS_KEPT newest.
pub(crate) fn retained(snapshots: &[SnapshotFile]) -> Vec<bool> {
    let mut keep = vec![false; snapshots.len()];
    let n = snapshots.len();
    for at in n.saturating_sub(SNAPSHOTS_KEPT)..n {
        match chain_of(snapshots, at) {
            Some(chain) => chain.into_iter().for_each(|i| keep[i] = true),
            None => keep[at] = true,
        }
    }
    keep
}

/// The size of the full snapshot the newest snapshot's chain starts from
/// (0 without one).
pub(crate) fn full_bytes(snapshots: &[SnapshotFile]) -> u64 {
    let Some(newest) = snapshots.len().checked_sub(1) else {
        return 0;
    };
    chain_of(snapshots, newest).map_or(snapshots[newest].bytes, |c| snapshots[c[0]].bytes)
}

/// The bytes of the newest snapshot's chain: what a checkpoint keeps on
/// disk (0 without one).
pub(crate) fn chain_bytes(snapshots: &[SnapshotFile]) -> u64 {
    let Some(newest) = snapshots.len().checked_sub(1) else {
        return 0;
    };
    chain_of(snapshots, newest).map_or(snapshots[newest].bytes, |c| {
        c.iter().map(|&i| snapshots[i].bytes).sum()
    })
}

/// The LSN of the oldest snapshot a recovery may load: the oldest of the
/// SNAPSHOTS_KEPT newest. The WAL is kept from there on.
pub(crate) fn fallback_lsn(snapshots: &[SnapshotFile]) -> u64 {
    snapshots[snapshots.len().saturating_sub(SNAPSHOTS_KEPT)].lsn
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::sim::SimDisk;
    use crate::io::Disk;
    use crate::tier::MemoryTier;

    const DIR: DirId = 0x0d12_0000_0000_0001;

    /// A snapshot header carries its directory's identity: another
    /// directory's is refused by name, one without an identity (format 4
    /// and older) is read, and a flipped identity byte is damage.
    #[test]
    fn the_directory_identity_is_checked() {
        let mut header = vec![0u8; ALIGN];
        encode_header((1, DIR), 77, 5, Some(70), &mut header);
        let path = Path::new("/s/77.snap");
        let h = decode_header(&header, path, (1, DIR)).expect("own");
        assert_eq!(
            (h.dir_id, h.base_lsn, h.version),
            (DIR, Some(70), FORMAT_VERSION)
        );
        assert!(
            decode_header(&header, path, (1, 0)).is_ok(),
            "0 checks nothing"
        );
        let err = decode_header(&header, path, (1, DIR + 1)).expect_err("foreign");
        assert!(
            matches!(err, SnapshotError::ForeignDirectory { found: DIR, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("77.snap"), "{err}");
        assert!(err.to_string().contains("another data directory"), "{err}");
        let mut flipped = header.clone();
        flipped[50] ^= 4;
        assert!(matches!(
            decode_header(&flipped, path, (1, DIR)),
            Err(SnapshotError::Corrupt { .. })
        ));
        // Format 4: no identity, accepted by any directory.
        let mut old = header.clone();
        old[8..12].copy_from_slice(&4u32.to_le_bytes());
        old[48..60].fill(0);
        let crc = crc32fast::hash(&old[0..32]);
        old[32..36].copy_from_slice(&crc.to_le_bytes());
        let crc = crc32fast::hash(&old[0..44]);
        old[44..48].copy_from_slice(&crc.to_le_bytes());
        let h = decode_header(&old, path, (1, DIR + 1)).expect("format 4");
        assert_eq!(h.dir_id, 0);
    }

    async fn write_snapshot(disk: &SimDisk, path: &Path, n: u32) -> u64 {
        let file = disk.open(path, true).await.expect("open");
        let mut w = ChunkWriter::new(&file, path);
        let mut header = vec![0u8; ALIGN];
        encode_header((1, DIR), 77, 5, None, &mut header);
        w.write(&header).await.expect("write");
        let mut enc = BlockEncoder::new();
        let mut out = Vec::new();
        for i in 0..n {
            let k = format!("key-{i}");
            // Every third entry carries an expiry time.
            let at = (i % 3 == 1).then_some(4_000_000_000_000 + u64::from(i));
            enc.add(
                k.as_bytes(),
                &vec![i as u8; (i % 3000) as usize],
                at,
                &mut out,
            );
            if i % 97 == 0 {
                enc.finish_block(&mut out);
                w.write(&out).await.expect("write");
                out.clear();
            }
        }
        enc.finish_block(&mut out);
        out.extend_from_slice(&enc.trailer(80, 6));
        w.write(&out).await.expect("write");
        let len = w.finish().await.expect("finish");
        file.sync_data().await.expect("sync");
        len
    }

    #[test]
    fn round_trip_and_damage_detected() {
        let rt = compio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            let disk = SimDisk::new(1);
            disk.create_dir_all(Path::new("/s")).expect("dir");
            let path = Path::new("/s/1.snap");
            let len = write_snapshot(&disk, path, 1000).await;
            assert_eq!(len % ALIGN as u64, 0);
            let file = disk.open(path, false).await.expect("open");
            let mut tier = MemoryTier::new();
            let meta = load(&file, path, (1, DIR), Some(&mut tier))
                .await
                .expect("valid");
            // Checking alone reads the same metadata.
            assert_eq!(
                load(&file, path, (1, DIR), None).await.expect("valid"),
                meta
            );
            assert_eq!(meta.lsn, 77);
            assert_eq!(meta.end_lsn, 80);
            assert_eq!(meta.max_commit_version, 6);
            assert_eq!(meta.entries, 1000);
            assert_eq!(tier.len(), 1000);
            // The trailer's count is found from the file's end alone.
            assert_eq!(entry_count_hint(&file).await, Some(1000));
            let k = b"key-500";
            assert_eq!(
                tier.get(crate::hash::fnv1a64(k), k).as_deref(),
                Some(&vec![(500 % 256) as u8; 500][..])
            );
            assert_eq!(tier.expiring_count(), 333);
            let k = b"key-499";
            assert_eq!(
                tier.get_expiring(crate::hash::fnv1a64(k), k)
                    .map(|(_, at)| at),
                Some(Some(4_000_000_000_499))
            );
            // Wrong shard.
            assert!(load(&file, path, (2, DIR), Some(&mut MemoryTier::new()))
                .await
                .is_err());
            assert!(load(&file, path, (2, DIR), None).await.is_err());
            drop(file);
            // Any damaged byte in the data is detected.
            for offset in [0u64, 40, 4096, 4100, 4096 + 30_000, len / 2, len - 4096] {
                let image = disk.read_written(path).expect("image");
                let data_end = image.iter().rposition(|&b| b != 0).expect("data") as u64;
                let offset = offset.min(data_end);
                disk.corrupt(path, offset, 1);
                let file = disk.open(path, false).await.expect("open");
                let res = load(&file, path, (1, DIR), Some(&mut MemoryTier::new())).await;
                assert!(res.is_err(), "damage at {offset} undetected");
                let res = load(&file, path, (1, DIR), None).await;
                assert!(res.is_err(), "damage at {offset} undetected by a check");
                disk.corrupt(path, offset, 1); // flip back
            }
            // A cut-off file is detected.
            let file = disk.open(path, false).await.expect("open");
            file.set_len(len / 2 / ALIGN as u64 * ALIGN as u64)
                .await
                .expect("truncate");
            assert!(load(&file, path, (1, DIR), Some(&mut MemoryTier::new()))
                .await
                .is_err());
            assert!(load(&file, path, (1, DIR), None).await.is_err());
        });
    }

    #[test]
    fn a_delta_loads_over_its_base_and_its_header_is_checked() {
        let rt = compio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            let disk = SimDisk::new(2);
            disk.create_dir_all(Path::new("/s")).expect("dir");
            let base = Path::new("/s/77.snap");
            write_snapshot(&disk, base, 100).await;
            // The delta: key-1 deleted, key-2 changed, key-200 new.
            let path = Path::new("/s/90.snap");
            let file = disk.open(path, true).await.expect("open");
            let mut w = ChunkWriter::new(&file, path);
            let mut header = vec![0u8; ALIGN];
            encode_header((1, DIR), 90, 7, Some(77), &mut header);
            w.write(&header).await.expect("write");
            let mut enc = BlockEncoder::new();
            let mut out = Vec::new();
            enc.add_deleted(b"key-1", &mut out);
            enc.add(b"key-2", b"changed", None, &mut out);
            enc.add(b"key-200", b"new", Some(5_000_000_000_000), &mut out);
            enc.finish_block(&mut out);
            out.extend_from_slice(&enc.trailer(91, 7));
            w.write(&out).await.expect("write");
            w.finish().await.expect("finish");
            drop(file);

            let mut tier = MemoryTier::new();
            let file = disk.open(base, false).await.expect("open");
            assert_eq!(
                load(&file, base, (1, DIR), Some(&mut tier))
                    .await
                    .expect("base")
                    .base_lsn,
                None
            );
            let file = disk.open(path, false).await.expect("open");
            let meta = load(&file, path, (1, DIR), Some(&mut tier))
                .await
                .expect("delta");
            assert_eq!((meta.lsn, meta.base_lsn, meta.entries), (90, Some(77), 3));
            let head = read_header(&file, path, (1, DIR)).await.expect("header");
            assert_eq!((head.lsn, head.base_lsn), (90, Some(77)));
            let get = |k: &[u8]| tier.get(crate::hash::fnv1a64(k), k);
            assert_eq!(tier.len(), 100);
            assert_eq!(get(b"key-1"), None);
            assert_eq!(get(b"key-2").as_deref(), Some(&b"changed"[..]));
            assert_eq!(get(b"key-200").as_deref(), Some(&b"new"[..]));
            // The base LSN is covered by its own checksum.
            drop(file);
            disk.corrupt(path, 37, 1);
            let file = disk.open(path, false).await.expect("open");
            let err = read_header(&file, path, (1, DIR))
                .await
                .expect_err("damaged");
            assert!(err.to_string().contains("delta header checksum"), "{err}");
            assert!(load(&file, path, (1, DIR), None).await.is_err());
            disk.corrupt(path, 37, 1);
            // A deleted-key entry is refused in a full snapshot.
            let full = Path::new("/s/95.snap");
            let file = disk.open(full, true).await.expect("open");
            let mut w = ChunkWriter::new(&file, full);
            encode_header((1, DIR), 95, 7, None, &mut header);
            w.write(&header).await.expect("write");
            let mut enc = BlockEncoder::new();
            let mut out = Vec::new();
            enc.add_deleted(b"key-1", &mut out);
            enc.finish_block(&mut out);
            out.extend_from_slice(&enc.trailer(95, 7));
            w.write(&out).await.expect("write");
            w.finish().await.expect("finish");
            let err = load(&file, full, (1, DIR), None)
                .await
                .expect_err("refused");
            assert!(err.to_string().contains("outside a delta"), "{err}");
        });
    }
}
