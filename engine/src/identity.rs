//! The data directory's identity at open: the manifest's [`DirId`] against
//! the identities the directory's files carry. What must hold: a manifest
//! copied from another directory (whose identity none of this directory's
//! files carries) is refused, naming the manifest, before any shard reads
//! a file or anything is written. Each file's own identity is checked where
//! it is opened (recovery, snapshot loads, value segments, `verify`); this
//! check only tells "the manifest is the stranger" from "one file is".
//!
//! Which files it reads: per shard, `wal.head`, block 0 of every WAL
//! segment and the header block of every snapshot (one 4 KiB read each,
//! which recovery reads again right after). Files without an identity
//! (written before it existed), damaged headers and unreadable files tell
//! nothing and are passed over; recovery judges them. A directory with no
//! file carrying an identity (a new one, or one written before identities)
//! has nothing to compare with and is accepted.

use crate::error::ManifestError;
use crate::io::{AlignedBuf, Disk, DiskFile, ALIGN};
use crate::layout::{parse_numbered, DirId, ShardPaths, SNAPSHOT_SUFFIX, WAL_SUFFIX};
use crate::wal::format::decode_segment_header;
use crate::wal::head::{decode_head_bytes, HEAD_FILE};
use std::path::{Path, PathBuf};

/// The identity in the header of `path`, by what its name says it is;
/// `None` when it carries none or cannot be read.
async fn identity_of<D: Disk>(disk: &D, path: &Path, shard: u32) -> Option<DirId> {
    let file = disk.open(path, false).await.ok()?;
    let (res, buf) = file.read_at(AlignedBuf::with_capacity(2 * ALIGN), 0).await;
    let bytes = &buf.as_slice()[..res.ok()?];
    let id = if path.file_name().is_some_and(|n| n == HEAD_FILE) {
        decode_head_bytes(shard, bytes)?.dir_id
    } else if parse_numbered(path, WAL_SUFFIX).is_some() {
        decode_segment_header(bytes.get(..ALIGN)?).ok()??.dir_id
    } else {
        crate::snapshot::read_header(&file, path, (shard, 0))
            .await
            .ok()?
            .dir_id
    };
    (id != 0).then_some(id)
}

/// The files of a shard this check reads.
fn files_of<D: Disk>(disk: &D, paths: &ShardPaths) -> Vec<PathBuf> {
    let mut files = vec![paths.dir.join(HEAD_FILE)];
    for (dir, suffix) in [
        (&paths.wal_dir, WAL_SUFFIX),
        (&paths.snapshot_dir, SNAPSHOT_SUFFIX),
    ] {
        let listed = disk.list_dir(dir).unwrap_or_default();
        files.extend(
            listed
                .into_iter()
                .filter(|p| parse_numbered(p, suffix).is_some()),
        );
    }
    files
}

/// Refuses the manifest at `manifest` (identity `dir_id`) when some file
/// of the directory's `shard_count` shards under `wal_root` carries an
/// identity and none carries `dir_id`.
pub(crate) async fn check_manifest<D: Disk>(
    disk: &D,
    manifest: &Path,
    wal_root: &Path,
    shard_count: u32,
    dir_id: DirId,
) -> Result<(), ManifestError> {
    assert_ne!(
        dir_id, 0,
        "the manifest's identity is settled before the check"
    );
    let mut witness: Option<(PathBuf, DirId)> = None;
    for shard in 0..shard_count {
        let paths = ShardPaths::new(wal_root, shard as usize);
        for path in files_of(disk, &paths) {
            match identity_of(disk, &path, shard).await {
                Some(id) if id == dir_id => return Ok(()),
                Some(id) => {
                    witness.get_or_insert((path, id));
                }
                None => {}
            }
        }
    }
    match witness {
        None => Ok(()),
        Some((witness, found)) => Err(ManifestError::ForeignDirectory {
            file: manifest.to_path_buf(),
            found,
            expected: dir_id,
            witness,
        }),
    }
}
