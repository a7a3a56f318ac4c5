//! A shard's WAL segment files on disk: creating one (zero-filled, under a
//! temporary name, renamed into place), preparing a used one for
//! recycling, and renaming a prepared one into the log.
//!
//! What must hold: a segment file named `SEQ.wal` always has its full
//! length and its name is durable before anything is written to it; a
//! prepared (recycled) segment holds nothing that belongs to the log.

use crate::error::IoFailure;
use crate::error::WalError;
use crate::io::{AlignedBuf, Disk, DiskFile};
use crate::layout::{ShardPaths, TMP_SUFFIX};
use crate::wal::format::{encode_segment_header, SegmentHeader, BLOCK_BYTES};
use std::path::{Path, PathBuf};

/// A WAL segment holding records, kept after recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveSegment {
    pub seq: u64,
    pub path: PathBuf,
    pub first_lsn: u64,
    pub bytes: u64,
}

/// Overwrites block 0 of a segment with a prepared header (recycled,
/// waiting for its first flush, carrying the directory identity `dir_id`)
/// and makes it durable. After this nothing in the file belongs to the log.
pub async fn prepare_segment<F: DiskFile>(
    file: &F,
    path: &Path,
    shard: u32,
    segment_bytes: u64,
    dir_id: crate::layout::DirId,
) -> Result<(), WalError> {
    let mut block = AlignedBuf::with_capacity(BLOCK_BYTES);
    block.set_len(BLOCK_BYTES);
    encode_segment_header(
        &SegmentHeader::prepared(shard, segment_bytes, dir_id),
        block.as_mut_slice(),
    );
    let (res, _) = file.write_at(block, 0).await;
    res.map_err(WalError::io_at("write prepared header", path, 0))?;
    file.sync_data()
        .await
        .map_err(WalError::io_at("fdatasync", path, 0))
}

/// Overwrites `[from, to)` of a segment with zeroes and makes them
/// durable: recovery erases a torn in-flight window this way, so its
/// complete flushes (never acknowledged, with LSNs the log reuses) can
/// never be read as records later (`docs/wal.md`).
pub async fn erase_window<F: DiskFile>(
    file: &F,
    path: &Path,
    from: u64,
    to: u64,
) -> Result<(), WalError> {
    assert!(
        from.is_multiple_of(BLOCK_BYTES as u64)
            && to.is_multiple_of(BLOCK_BYTES as u64)
            && from < to
    );
    let mut zeros = AlignedBuf::with_capacity((to - from) as usize);
    zeros.set_len((to - from) as usize);
    zeros.as_mut_slice().fill(0);
    let (res, _) = file.write_at(zeros, from).await;
    res.map_err(WalError::io_at("erase torn in-flight window", path, from))?;
    file.sync_data()
        .await
        .map_err(WalError::io_at("fdatasync", path, from))
}

/// Renames a prepared (or never written) segment file to segment `seq`
/// and makes the rename durable.
pub async fn recycle_into<D: Disk>(
    disk: &D,
    paths: &ShardPaths,
    from: &Path,
    seq: u64,
) -> Result<(), WalError> {
    let to = paths.segment(seq);
    disk.rename(from, &to)
        .await
        .map_err(WalError::io_at("rename (recycle)", from, 0))?;
    disk.sync_dir(&paths.wal_dir).await.map_err(WalError::io_at(
        "fsync directory",
        &paths.wal_dir,
        0,
    ))
}

/// Suffix of a segment being created (`SEQ.wal.tmp`); recovery removes
/// leftovers.
pub const SEGMENT_TMP_SUFFIX: &str = ".wal.tmp";

/// Creates segment `seq`: preallocated with written zeroes under a
/// temporary name, fdatasync'ed, renamed into place, directory fsync'ed;
/// length and name durable before it is returned. A failed creation (a
/// full disk) removes its partial file, so it never leaves a short
/// segment behind; a crash leaves only a `.wal.tmp` that recovery removes.
pub async fn create_segment<D: Disk>(
    disk: &D,
    paths: &ShardPaths,
    seq: u64,
    segment_bytes: u64,
) -> Result<D::File, WalError> {
    let path = paths.segment(seq);
    let tmp = PathBuf::from(format!("{}{}", path.display(), TMP_SUFFIX));
    let file = disk
        .open(&tmp, true)
        .await
        .map_err(WalError::io_at("create", &tmp, 0))?;
    let filled = async {
        file.allocate_zeroed(segment_bytes)
            .await
            .map_err(WalError::io_at("preallocate", &tmp, 0))?;
        file.sync_data()
            .await
            .map_err(WalError::io_at("fdatasync", &tmp, 0))
    }
    .await;
    if let Err(e) = filled {
        drop(file);
        if let Err(rm) = disk.remove_file(&tmp).await {
            tracing::warn!(file = %tmp.display(), error = %rm, "could not remove a partial WAL segment");
        }
        return Err(e);
    }
    disk.rename(&tmp, &path)
        .await
        .map_err(WalError::io_at("rename (new segment)", &tmp, 0))?;
    disk.sync_dir(&paths.wal_dir)
        .await
        .map_err(WalError::io_at("fsync directory", &paths.wal_dir, 0))?;
    Ok(file)
}
