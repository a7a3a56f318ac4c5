//! The WAL head file of one shard (`shard-NNN/wal.head`): durable knowledge
//! of the newest WAL segment that holds acknowledged records, kept outside
//! the segments themselves, so that losing the last segment (deleted,
//! truncated to nothing, never restored from a backup) is detected at
//! recovery instead of silently reverting acknowledged writes.
//!
//! What must hold: the head names segment `seq` only after the first flush
//! of `seq` is durable (so it never names a segment whose only flush was
//! torn), and it is made durable before that flush is acknowledged; it is
//! a lower bound (a crash between the flush and the head update leaves the
//! previous segment named, which is still true). The file has two 4 KiB
//! slots written alternately, each with a generation and a checksum, so a
//! torn update leaves the other slot, naming the previous segment, valid.
//! The file is created whole under a temporary name and renamed into
//! place, so it never exists without a valid slot.
//!
//! Version 2 slots also carry the *durable mark*: an LSN through which
//! every record was durable when the mark was written. The flusher writes
//! it when the WAL has been idle for `storage.wal_mark_interval` and at a
//! clean stop, so recovery can tell a damaged last flush (its LSNs are at
//! or below the mark: acknowledged data is gone) from a torn one (above
//! the mark: it may never have been acknowledged). Version 1 slots (no
//! mark) read as a mark of 0.
//!
//! Version 3 slots also carry the data directory's identity
//! ([`crate::layout::DirId`]), so a head copied from another directory is
//! refused by recovery instead of vouching for another log; version 1 and
//! 2 slots read with identity 0 (none: they cannot be told apart).

use crate::error::{Damage, IoFailure, WalError};
use crate::io::{AlignedBuf, Disk, DiskFile};
use crate::layout::{DirId, ShardPaths};
use crate::wal::format::BLOCK_BYTES;
use std::path::PathBuf;

/// File name of the head file inside the shard directory.
pub const HEAD_FILE: &str = "wal.head";
const HEAD_MAGIC: [u8; 8] = *b"RINGKVWH";
/// The version this build writes; it reads 1 to 3.
const HEAD_VERSION: u32 = 3;
/// Bytes of a version 1 slot that carry data (the rest of the block is zero).
const SLOT_BYTES_V1: usize = 40;
/// Bytes of a version 2 slot that carry data: version 1's and the mark.
const SLOT_BYTES_V2: usize = 48;
/// Bytes of a version 3 slot that carry data: version 2's and the
/// directory identity.
const SLOT_BYTES: usize = 56;
const SLOTS: usize = 2;

/// What the head says: segment `seq` (first LSN `first_lsn`) holds
/// acknowledged records; `seq == 0` means no segment did yet. Every record
/// through `marked_lsn` was durable when the slot was written (0: no mark).
/// `dir_id` is the identity of the data directory that wrote the slot (0:
/// a slot of version 1 or 2, which has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadState {
    pub generation: u64,
    pub seq: u64,
    pub first_lsn: u64,
    pub marked_lsn: u64,
    pub dir_id: DirId,
}

fn head_path(paths: &ShardPaths) -> PathBuf {
    paths.dir.join(HEAD_FILE)
}

fn encode_slot(shard: u32, state: &HeadState, block: &mut [u8]) {
    block.fill(0);
    block[0..8].copy_from_slice(&HEAD_MAGIC);
    block[8..12].copy_from_slice(&HEAD_VERSION.to_le_bytes());
    block[12..16].copy_from_slice(&shard.to_le_bytes());
    block[16..24].copy_from_slice(&state.generation.to_le_bytes());
    block[24..32].copy_from_slice(&state.seq.to_le_bytes());
    block[32..40].copy_from_slice(&state.first_lsn.to_le_bytes());
    block[40..48].copy_from_slice(&state.marked_lsn.to_le_bytes());
    block[48..56].copy_from_slice(&state.dir_id.to_le_bytes());
    let crc = crc32fast::hash(&block[0..SLOT_BYTES]);
    block[SLOT_BYTES..SLOT_BYTES + 4].copy_from_slice(&crc.to_le_bytes());
}

fn u64_at(block: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&block[at..at + 8]);
    u64::from_le_bytes(b)
}

fn u32_at(block: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&block[at..at + 4]);
    u32::from_le_bytes(b)
}

/// Decodes one slot: `None` if damaged (a torn update) or not of this shard.
fn decode_slot(shard: u32, block: &[u8]) -> Option<HeadState> {
    if block.len() < BLOCK_BYTES || block[0..8] != HEAD_MAGIC {
        return None;
    }
    let data = match u32_at(block, 8) {
        1 => SLOT_BYTES_V1,
        2 => SLOT_BYTES_V2,
        3 => SLOT_BYTES,
        _ => return None,
    };
    let stored = u32_at(block, data);
    if stored != crc32fast::hash(&block[0..data])
        || u32_at(block, 12) != shard
        || block[data + 4..BLOCK_BYTES].iter().any(|&b| b != 0)
    {
        return None;
    }
    Some(HeadState {
        generation: u64_at(block, 16),
        seq: u64_at(block, 24),
        first_lsn: u64_at(block, 32),
        marked_lsn: if data >= SLOT_BYTES_V2 {
            u64_at(block, 40)
        } else {
            0
        },
        dir_id: if data >= SLOT_BYTES {
            u64_at(block, 48)
        } else {
            0
        },
    })
}

/// Reads the head of a shard. `Ok(None)`: there is no head file (a data
/// directory written before the head existed). Both slots damaged is
/// corruption: the file is only ever created whole, and an update touches
/// one slot.
pub async fn read_head<D: Disk>(
    disk: &D,
    paths: &ShardPaths,
    shard: u32,
) -> Result<Option<HeadState>, WalError> {
    let path = head_path(paths);
    if !disk.exists(&path) {
        return Ok(None);
    }
    let file = disk
        .open(&path, false)
        .await
        .map_err(WalError::io("open", &path))?;
    let buf = AlignedBuf::with_capacity(BLOCK_BYTES * SLOTS);
    let (res, buf) = file.read_at(buf, 0).await;
    let n = res.map_err(WalError::io("read", &path))?;
    match decode_head_bytes(shard, &buf.as_slice()[..n]) {
        Some(state) => Ok(Some(state)),
        None => Err(WalError::Corrupt {
            file: path,
            offset: 0,
            reason: Damage::BadHead,
        }),
    }
}

/// The current slot of a head file's bytes, `None` if neither is valid.
pub fn decode_head_bytes(shard: u32, bytes: &[u8]) -> Option<HeadState> {
    bytes
        .chunks(BLOCK_BYTES)
        .filter_map(|slot| decode_slot(shard, slot))
        .max_by_key(|s| s.generation)
}

/// A head file's bytes with its durable mark lowered to at most `lsn`, in
/// both slots (`None` if neither slot is valid). Used where a copy or a
/// repair holds less of the log than the live head vouched for: an online
/// backup's cut, or `repair` after it dropped a damaged tail.
pub fn with_mark_at_most(bytes: &[u8], shard: u32, lsn: u64) -> Option<Vec<u8>> {
    let current = decode_head_bytes(shard, bytes)?;
    let mut out = vec![0u8; BLOCK_BYTES * SLOTS];
    for (i, slot) in out.chunks_mut(BLOCK_BYTES).enumerate() {
        // Each slot keeps the parity the writer expects of it.
        let next = current.generation + 1;
        let generation = if next % SLOTS as u64 == i as u64 {
            next
        } else {
            next + 1
        };
        let state = HeadState {
            generation,
            marked_lsn: current.marked_lsn.min(lsn),
            ..current
        };
        encode_slot(shard, &state, slot);
    }
    Some(out)
}

/// The open head file of a running shard.
pub struct WalHead<F: DiskFile> {
    file: F,
    path: PathBuf,
    shard: u32,
    /// The directory identity every slot written from now on carries.
    dir_id: DirId,
    state: HeadState,
}

impl<F: DiskFile> WalHead<F> {
    pub fn state(&self) -> HeadState {
        self.state
    }

    /// Records durably that segment `seq` (first LSN `first_lsn`) holds
    /// acknowledged records: one 4 KiB write into the older slot and one
    /// fdatasync. Called after the first flush of `seq` is durable and
    /// before it is acknowledged.
    pub async fn advance(&mut self, seq: u64, first_lsn: u64) -> Result<(), WalError> {
        if seq <= self.state.seq {
            return Ok(());
        }
        let next = HeadState {
            generation: self.state.generation + 1,
            seq,
            first_lsn,
            marked_lsn: self.state.marked_lsn,
            dir_id: self.dir_id,
        };
        self.write(next).await
    }

    /// Records durably that every record through `lsn` is durable (the
    /// durable mark): one 4 KiB write into the older slot and one
    /// fdatasync. The caller passes an LSN whose flush's durable write
    /// returned; a smaller mark than the current one is not written.
    pub async fn mark(&mut self, lsn: u64) -> Result<(), WalError> {
        if lsn <= self.state.marked_lsn {
            return Ok(());
        }
        let next = HeadState {
            generation: self.state.generation + 1,
            marked_lsn: lsn,
            dir_id: self.dir_id,
            ..self.state
        };
        self.write(next).await
    }

    /// Writes `next` into the slot its generation picks, durably.
    async fn write(&mut self, next: HeadState) -> Result<(), WalError> {
        let mut block = AlignedBuf::with_capacity(BLOCK_BYTES);
        block.set_len(BLOCK_BYTES);
        encode_slot(self.shard, &next, block.as_mut_slice());
        let slot = (next.generation % SLOTS as u64) * BLOCK_BYTES as u64;
        let (res, _) = self.file.write_at(block, slot).await;
        res.map_err(WalError::io("write head", &self.path))?;
        // The slot must be durable before it is relied on.
        self.file
            .sync_data()
            .await
            .map_err(WalError::io("fdatasync head", &self.path))?;
        self.state = next;
        Ok(())
    }
}

/// Opens the head file after recovery, creating it (whole, under a
/// temporary name, then renamed and the directory fsync'ed) when it does
/// not exist yet, naming `state`. Every slot written carries `dir_id`.
pub async fn open_head<D: Disk>(
    disk: &D,
    paths: &ShardPaths,
    shard: u32,
    dir_id: DirId,
    existing: Option<HeadState>,
    state: HeadState,
) -> Result<WalHead<D::File>, WalError> {
    let path = head_path(paths);
    if let Some(existing) = existing {
        let file = disk
            .open(&path, false)
            .await
            .map_err(WalError::io("open", &path))?;
        return Ok(WalHead {
            file,
            path,
            shard,
            dir_id,
            state: existing,
        });
    }
    let tmp = paths.dir.join(format!("{HEAD_FILE}.tmp"));
    {
        let file = disk
            .open(&tmp, true)
            .await
            .map_err(WalError::io("create", &tmp))?;
        let mut buf = AlignedBuf::with_capacity(BLOCK_BYTES * SLOTS);
        buf.set_len(BLOCK_BYTES * SLOTS);
        // Both slots valid from the start (generations 0 and 1); the next
        // update goes to slot 0 with generation 2.
        for (i, slot) in buf.as_mut_slice().chunks_mut(BLOCK_BYTES).enumerate() {
            let s = HeadState {
                generation: i as u64,
                dir_id,
                ..state
            };
            encode_slot(shard, &s, slot);
        }
        let (res, _) = file.write_at(buf, 0).await;
        res.map_err(WalError::io("write head", &tmp))?;
        file.sync_data()
            .await
            .map_err(WalError::io("fdatasync head", &tmp))?;
    }
    disk.rename(&tmp, &path)
        .await
        .map_err(WalError::io("rename head", &tmp))?;
    disk.sync_dir(&paths.dir)
        .await
        .map_err(WalError::io("fsync directory", &paths.dir))?;
    let file = disk
        .open(&path, false)
        .await
        .map_err(WalError::io("open", &path))?;
    Ok(WalHead {
        file,
        path,
        shard,
        dir_id,
        state: HeadState {
            generation: 1,
            dir_id,
            ..state
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_round_trip_and_every_flipped_bit_is_caught() {
        let s = HeadState {
            generation: 7,
            seq: 42,
            first_lsn: 1234,
            marked_lsn: 99_000,
            dir_id: 0xabcd_0000_0000_0001,
        };
        let mut block = vec![0u8; BLOCK_BYTES];
        encode_slot(3, &s, &mut block);
        assert_eq!(decode_slot(3, &block), Some(s));
        assert_eq!(decode_slot(4, &block), None, "another shard's head");
        for bit in 0..(SLOT_BYTES + 4) * 8 {
            let mut b = block.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode_slot(3, &b), None, "bit {bit}");
        }
        assert_eq!(decode_slot(3, &vec![0u8; BLOCK_BYTES]), None);
    }

    /// A version 1 slot (written before the durable mark) reads with a
    /// mark of 0, so old directories open as before.
    #[test]
    fn a_version_1_slot_reads_with_no_mark() {
        let mut block = vec![0u8; BLOCK_BYTES];
        block[0..8].copy_from_slice(&HEAD_MAGIC);
        block[8..12].copy_from_slice(&1u32.to_le_bytes());
        block[12..16].copy_from_slice(&3u32.to_le_bytes());
        block[16..24].copy_from_slice(&5u64.to_le_bytes());
        block[24..32].copy_from_slice(&8u64.to_le_bytes());
        block[32..40].copy_from_slice(&700u64.to_le_bytes());
        let crc = crc32fast::hash(&block[0..SLOT_BYTES_V1]);
        block[SLOT_BYTES_V1..SLOT_BYTES_V1 + 4].copy_from_slice(&crc.to_le_bytes());
        let expect = HeadState {
            generation: 5,
            seq: 8,
            first_lsn: 700,
            marked_lsn: 0,
            dir_id: 0,
        };
        assert_eq!(decode_slot(3, &block), Some(expect));
        block[44] = 1;
        assert_eq!(
            decode_slot(3, &block),
            None,
            "bytes after a v1 slot are zero"
        );
    }

    /// A version 2 slot (written before the directory identity) reads
    /// with identity 0; a version 4 slot (a newer build) is not read.
    #[test]
    fn a_version_2_slot_reads_with_no_identity() {
        let s = HeadState {
            generation: 4,
            seq: 8,
            first_lsn: 700,
            marked_lsn: 900,
            dir_id: 0,
        };
        let mut block = vec![0u8; BLOCK_BYTES];
        encode_slot(3, &s, &mut block);
        block[8..12].copy_from_slice(&2u32.to_le_bytes());
        block[SLOT_BYTES_V2..].fill(0);
        let crc = crc32fast::hash(&block[0..SLOT_BYTES_V2]);
        block[SLOT_BYTES_V2..SLOT_BYTES_V2 + 4].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_slot(3, &block), Some(s));
        let mut newer = vec![0u8; BLOCK_BYTES];
        encode_slot(3, &HeadState { dir_id: 9, ..s }, &mut newer);
        newer[8..12].copy_from_slice(&4u32.to_le_bytes());
        let crc = crc32fast::hash(&newer[0..SLOT_BYTES]);
        newer[SLOT_BYTES..SLOT_BYTES + 4].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_slot(3, &newer), None);
    }

    #[test]
    fn lowering_the_mark_writes_a_newer_slot_and_keeps_the_rest() {
        let s = HeadState {
            generation: 7,
            seq: 42,
            first_lsn: 1234,
            marked_lsn: 99_000,
            dir_id: 55,
        };
        let mut file = vec![0u8; BLOCK_BYTES * SLOTS];
        encode_slot(
            3,
            &HeadState { generation: 6, ..s },
            &mut file[..BLOCK_BYTES],
        );
        encode_slot(3, &s, &mut file[BLOCK_BYTES..]);
        let lowered = with_mark_at_most(&file, 3, 50_000).expect("a valid head");
        let state = decode_head_bytes(3, &lowered).expect("valid");
        assert_eq!(
            state,
            HeadState {
                generation: 9,
                marked_lsn: 50_000,
                ..s
            }
        );
        // Both slots say the same thing, so neither an old nor a new
        // build can pick up the higher mark again.
        for slot in lowered.chunks(BLOCK_BYTES) {
            assert_eq!(decode_slot(3, slot).map(|h| h.marked_lsn), Some(50_000));
        }
        let same = with_mark_at_most(&file, 3, 100_000).expect("valid");
        assert_eq!(
            decode_head_bytes(3, &same).map(|h| h.marked_lsn),
            Some(99_000)
        );
    }
}
