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

use crate::error::{Damage, WalError};
use crate::io::{AlignedBuf, Disk, DiskFile};
use crate::layout::ShardPaths;
use crate::wal::format::BLOCK_BYTES;
use std::path::{Path, PathBuf};

/// File name of the head file inside the shard directory.
pub const HEAD_FILE: &str = "wal.head";
const HEAD_MAGIC: [u8; 8] = *b"RINGKVWH";
const HEAD_VERSION: u32 = 1;
/// Bytes of a slot that carry data (the rest of the block is zero).
const SLOT_BYTES: usize = 40;
const SLOTS: usize = 2;

/// What the head says: segment `seq` (first LSN `first_lsn`) holds
/// acknowledged records; `seq == 0` means no segment did yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadState {
    pub generation: u64,
    pub seq: u64,
    pub first_lsn: u64,
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
    let stored = u32_at(block, SLOT_BYTES);
    if stored != crc32fast::hash(&block[0..SLOT_BYTES])
        || u32_at(block, 8) != HEAD_VERSION
        || u32_at(block, 12) != shard
        || block[SLOT_BYTES + 4..BLOCK_BYTES].iter().any(|&b| b != 0)
    {
        return None;
    }
    Some(HeadState {
        generation: u64_at(block, 16),
        seq: u64_at(block, 24),
        first_lsn: u64_at(block, 32),
    })
}

fn io_err(op: &'static str, file: &Path) -> impl FnOnce(std::io::Error) -> WalError {
    let file = file.to_path_buf();
    move |source| WalError::Io {
        op,
        file,
        offset: 0,
        source,
    }
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
        .map_err(io_err("open", &path))?;
    let buf = AlignedBuf::with_capacity(BLOCK_BYTES * SLOTS);
    let (res, buf) = file.read_at(buf, 0).await;
    let n = res.map_err(io_err("read", &path))?;
    let bytes = &buf.as_slice()[..n];
    let best = bytes
        .chunks(BLOCK_BYTES)
        .filter_map(|slot| decode_slot(shard, slot))
        .max_by_key(|s| s.generation);
    match best {
        Some(state) => Ok(Some(state)),
        None => Err(WalError::Corrupt {
            file: path,
            offset: 0,
            reason: Damage::BadHead,
        }),
    }
}

/// The open head file of a running shard.
pub struct WalHead<F: DiskFile> {
    file: F,
    path: PathBuf,
    shard: u32,
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
        };
        let mut block = AlignedBuf::with_capacity(BLOCK_BYTES);
        block.set_len(BLOCK_BYTES);
        encode_slot(self.shard, &next, block.as_mut_slice());
        let slot = (next.generation % SLOTS as u64) * BLOCK_BYTES as u64;
        let (res, _) = self.file.write_at(block, slot).await;
        res.map_err(io_err("write head", &self.path))?;
        self.file
            .sync_data()
            .await
            .map_err(io_err("fdatasync head", &self.path))?;
        self.state = next;
        Ok(())
    }
}

/// Opens the head file after recovery, creating it (whole, under a
/// temporary name, then renamed and the directory fsync'ed) when it does
/// not exist yet, naming `state`.
pub async fn open_head<D: Disk>(
    disk: &D,
    paths: &ShardPaths,
    shard: u32,
    existing: Option<HeadState>,
    state: HeadState,
) -> Result<WalHead<D::File>, WalError> {
    let path = head_path(paths);
    if let Some(existing) = existing {
        let file = disk
            .open(&path, false)
            .await
            .map_err(io_err("open", &path))?;
        return Ok(WalHead {
            file,
            path,
            shard,
            state: existing,
        });
    }
    let tmp = paths.dir.join(format!("{HEAD_FILE}.tmp"));
    {
        let file = disk
            .open(&tmp, true)
            .await
            .map_err(io_err("create", &tmp))?;
        let mut buf = AlignedBuf::with_capacity(BLOCK_BYTES * SLOTS);
        buf.set_len(BLOCK_BYTES * SLOTS);
        // Both slots valid from the start (generations 0 and 1); the next
        // update goes to slot 0 with generation 2.
        for (i, slot) in buf.as_mut_slice().chunks_mut(BLOCK_BYTES).enumerate() {
            let s = HeadState {
                generation: i as u64,
                ..state
            };
            encode_slot(shard, &s, slot);
        }
        let (res, _) = file.write_at(buf, 0).await;
        res.map_err(io_err("write head", &tmp))?;
        file.sync_data()
            .await
            .map_err(io_err("fdatasync head", &tmp))?;
    }
    disk.rename(&tmp, &path)
        .await
        .map_err(io_err("rename head", &tmp))?;
    disk.sync_dir(&paths.dir)
        .await
        .map_err(io_err("fsync directory", &paths.dir))?;
    let file = disk
        .open(&path, false)
        .await
        .map_err(io_err("open", &path))?;
    Ok(WalHead {
        file,
        path,
        shard,
        state: HeadState {
            generation: 1,
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
}
