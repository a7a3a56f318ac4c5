//! Where things live on disk. Data directory: `DATA/MANIFEST`. WAL device
//! root (the `wal_device`'s path, or `DATA` when empty):
//! `ROOT/shard-NNN/wal/SEQ.wal` and `ROOT/shard-NNN/snapshots/LSN.snap`
//! (numbers zero-padded to 20 digits so names sort like numbers). Value
//! device root (the `value_device`'s path, or `DATA` when empty):
//! `VROOT/shard-NNN/values/` holds the hybrid tier's value segments; when
//! both devices are one, that folder sits beside `wal/` and `snapshots/`.
//!
//! Also here, because WAL segments and snapshot files share it: the
//! on-disk format version; and the data directory's identity, which every
//! file header carries.

use std::path::{Path, PathBuf};

/// Version of the WAL and snapshot formats written by this build. Version 2
/// added expiry times (the `FLAG_EXPIRES` record flag and the snapshot
/// entry flag); files of version 1 hold neither and are still read. A
/// build that knows only version 1 refuses a version 2 header instead of
/// misreading the records or entries behind it. Version 3 added chunk
/// chains to the WAL (the `Chunk` record kind and the `FLAG_CHAIN_END` Put
/// flag) so a value may be larger than one flush buffer; snapshot files did
/// not change. Files of versions 1 and 2 are still read. Version 4 gave
/// the seal's last four payload bytes (zero before) a meaning: the LSNs
/// still in flight when the flush was submitted, which lets several
/// flushes be on the device at once; zero there reads as before, so older
/// logs are still read, and a build that knows only version 3 refuses a
/// version 4 log instead of taking a nonzero field for damage and maybe
/// cutting acknowledged records as a torn tail. Snapshot files did not
/// change.
/// Version 5 added the data directory's identity ([`DirId`]) to the
/// segment and snapshot headers; a build that knows only version 4 refuses
/// a version 5 header (its version check), so it never takes another
/// directory's file for its own without being able to tell.
pub const FORMAT_VERSION: u32 = 5;
/// The first format version whose headers carry the directory identity.
pub const FORMAT_VERSION_DIR_ID: u32 = 5;
/// Oldest format version this build reads.
pub const FORMAT_VERSION_MIN: u32 = 1;

pub const WAL_SUFFIX: &str = ".wal";
pub const SNAPSHOT_SUFFIX: &str = ".snap";
pub const TMP_SUFFIX: &str = ".tmp";
pub const DAMAGED_SUFFIX: &str = ".damaged";
/// The folder of a shard's value segments (hybrid tier).
const VALUES_DIR: &str = "values";
/// The folder of a shard's value segments on the hot device (its own
/// name, so a hot device in the same folder as the cold one is still told
/// apart).
const HOT_VALUES_DIR: &str = "values-hot";

/// The directories of one shard.
#[derive(Debug, Clone)]
pub struct ShardPaths {
    pub shard: usize,
    pub dir: PathBuf,
    pub wal_dir: PathBuf,
    pub snapshot_dir: PathBuf,
    /// The hybrid tier's value segments: `shard-NNN/values` under the value
    /// device's root (under the WAL root until [`ShardPaths::with_value_root`]).
    pub values_dir: PathBuf,
    /// The hybrid tier's hot segments (`storage.hot_device`):
    /// `shard-NNN/values-hot` under the hot device's root, if one is set.
    pub hot_values_dir: Option<PathBuf>,
}

impl ShardPaths {
    pub fn new(root: &Path, shard: usize) -> ShardPaths {
        let dir = root.join(format!("shard-{shard:03}"));
        ShardPaths {
            shard,
            wal_dir: dir.join("wal"),
            snapshot_dir: dir.join("snapshots"),
            values_dir: dir.join(VALUES_DIR),
            hot_values_dir: None,
            dir,
        }
    }

    /// These paths with the value segments under `value_root` (the value
    /// device's directory) instead of the WAL root.
    pub fn with_value_root(mut self, value_root: &Path) -> ShardPaths {
        self.values_dir = value_root
            .join(format!("shard-{:03}", self.shard))
            .join(VALUES_DIR);
        self
    }

    /// These paths with hot value segments under `hot_root` (the hot
    /// device's directory).
    pub fn with_hot_root(mut self, hot_root: &Path) -> ShardPaths {
        self.hot_values_dir = Some(
            hot_root
                .join(format!("shard-{:03}", self.shard))
                .join(HOT_VALUES_DIR),
        );
        self
    }

    pub fn segment(&self, seq: u64) -> PathBuf {
        self.wal_dir.join(format!("{seq:020}{WAL_SUFFIX}"))
    }

    pub fn snapshot(&self, lsn: u64) -> PathBuf {
        self.snapshot_dir
            .join(format!("{lsn:020}{SNAPSHOT_SUFFIX}"))
    }

    pub fn snapshot_tmp(&self, lsn: u64) -> PathBuf {
        self.snapshot_dir
            .join(format!("{lsn:020}{SNAPSHOT_SUFFIX}{TMP_SUFFIX}"))
    }
}

/// The number in a file name `NNNN<suffix>`, if the name has that form.
pub fn parse_numbered(path: &Path, suffix: &str) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let digits = name.strip_suffix(suffix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A data directory's identity: a random nonzero 64-bit number drawn when
/// the directory is made and kept in its manifest, written into the header
/// of every WAL segment, snapshot, value segment and `wal.head` slot the
/// engine writes. 0 means "unknown": a file written before the identity
/// existed (an older header format) or a directory not yet given one.
pub type DirId = u64;

/// Whether a file whose header carries `found` belongs to another data
/// directory than the one whose manifest holds `expected`. A file (or a
/// manifest) without an identity (0) is never foreign: files written
/// before the identity existed cannot be told apart.
pub fn is_foreign(found: DirId, expected: DirId) -> bool {
    found != 0 && expected != 0 && found != expected
}

/// The words of a refusal of a file that belongs to another data directory.
pub fn foreign_reason(found: DirId, expected: DirId) -> String {
    format!(
        "belongs to another data directory (its directory id {found:#018x}, this directory's {expected:#018x}; a file copied from another directory or backup?)"
    )
}

/// The file whose presence in a directory marks an online backup into it
/// that has not finished.
pub const BACKUP_MARKER: &str = "BACKUP-IN-PROGRESS";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let p = ShardPaths::new(Path::new("/data"), 7);
        assert_eq!(p.dir, Path::new("/data/shard-007"));
        let seg = p.segment(42);
        assert_eq!(
            seg,
            Path::new("/data/shard-007/wal/00000000000000000042.wal")
        );
        assert_eq!(parse_numbered(&seg, WAL_SUFFIX), Some(42));
        assert_eq!(parse_numbered(&p.snapshot(9), SNAPSHOT_SUFFIX), Some(9));
        assert_eq!(parse_numbered(&p.snapshot_tmp(9), SNAPSHOT_SUFFIX), None);
        assert_eq!(parse_numbered(Path::new("x.wal"), WAL_SUFFIX), None);
    }

    #[test]
    fn values_follow_the_value_device() {
        let p = ShardPaths::new(Path::new("/data"), 3);
        assert_eq!(p.values_dir, Path::new("/data/shard-003/values"));
        let p = p.with_value_root(Path::new("/mnt/cold"));
        assert_eq!(p.values_dir, Path::new("/mnt/cold/shard-003/values"));
        assert_eq!(p.wal_dir, Path::new("/data/shard-003/wal"));
        let same = ShardPaths::new(Path::new("/data"), 3).with_value_root(Path::new("/data"));
        assert_eq!(same.values_dir, Path::new("/data/shard-003/values"));
        let hot = same.with_hot_root(Path::new("/data"));
        assert_eq!(
            hot.hot_values_dir.as_deref(),
            Some(Path::new("/data/shard-003/values-hot"))
        );
    }
}
