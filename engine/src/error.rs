//! The engine's error types, one enum per layer (`WalError`, `SnapshotError`,
//! `ManifestError`), folded into [`EngineError`] with `From`. Every variant
//! carries the facts a person needs to act: file, offset, expected, found.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// An error type with a variant for a failed I/O call, naming the
/// operation, the file and (where the type keeps one) the offset. The
/// `map_err` closures that build it come from here, so the WAL, snapshot,
/// manifest and backup code need no helper of their own.
pub(crate) trait IoFailure: Sized {
    /// The error for `source`, which `op` on `file` at `offset` returned;
    /// a type that keeps no offset ignores it.
    fn from_io(op: &'static str, file: PathBuf, offset: u64, source: io::Error) -> Self;

    /// Maps an I/O error of `op` on `file` (at offset 0) to this type.
    fn io(op: &'static str, file: &Path) -> impl FnOnce(io::Error) -> Self {
        Self::io_at(op, file, 0)
    }

    /// Maps an I/O error of `op` on `file` at `offset` to this type.
    fn io_at(op: &'static str, file: &Path, offset: u64) -> impl FnOnce(io::Error) -> Self {
        let file = file.to_path_buf();
        move |source| Self::from_io(op, file, offset, source)
    }
}

/// Why a WAL record, flush or segment was judged damaged.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Damage {
    /// The stored checksum does not match the bytes.
    ChecksumMismatch { expected: u32, found: u32 },
    /// A record's size field is impossible (too small, past the segment end).
    BadRecordSize { size: u64 },
    /// A record kind this version does not know.
    UnknownRecordKind { kind: u8 },
    /// A transaction part whose checksum matched but whose payload does not
    /// parse (an encoder bug, not a torn write).
    BadTxnPart { reason: &'static str },
    /// A reserved field or flag is not zero.
    ReservedNotZero,
    /// A flush did not end with a seal record on a block boundary.
    MissingSeal,
    /// A seal record does not describe the flush it closes.
    SealMismatch {
        field: &'static str,
        expected: u64,
        found: u64,
    },
    /// The first record of a flush lacks its FIRST flag, or a later one has it.
    FlushBoundary,
    /// LSNs must grow by exactly one per record.
    LsnGap { expected: u64, found: u64 },
    /// A segment header is damaged or describes another shard / segment.
    BadSegmentHeader { reason: &'static str },
    /// A valid segment header that names another shard or segment number
    /// than its place in the directory: a misplaced file, not a torn write.
    ForeignSegment {
        expected_shard: u32,
        found_shard: u32,
        expected_seq: u64,
        found_seq: u64,
    },
    /// The log stops in this segment (damage, zeroes or its end) and the
    /// next used segment, `next`, starts later than the log continues:
    /// the records between were damaged or removed.
    LogStopsBeforeNext {
        next: PathBuf,
        expected: u64,
        found: u64,
    },
    /// This segment is missing: the log before it ends at `expected - 1`
    /// and the next used segment, `next`, starts at `found`.
    SegmentMissing {
        next: PathBuf,
        expected: u64,
        found: u64,
    },
    /// A segment header's first LSN does not continue the log.
    SegmentLsnMismatch { expected: u64, found: u64 },
    /// Damage (or a hole) sits before a complete, valid flush: acknowledged
    /// data may be behind the damage, so the log is not a torn tail.
    ValidFlushAfterDamage { file: PathBuf, offset: u64 },
    /// A complete, valid flush sits in a segment after an unused one.
    UsedSegmentAfterUnused { file: PathBuf },
    /// The WAL does not reach back to the snapshot (or to LSN 1).
    /// `segment_before`: the segment number before the one the log
    /// starts in (0: it starts in the first), which would hold the records.
    MissingHistory {
        needed_lsn: u64,
        first_lsn: u64,
        segment_before: u64,
    },
    /// A snapshot exists but the WAL directory holds no used segment.
    NoWalForSnapshot { snapshot_lsn: u64 },
    /// The WAL head names a segment holding acknowledged records that is
    /// not there (deleted, emptied, or its header destroyed).
    NewestSegmentMissing { head_seq: u64, found_seq: u64 },
    /// Neither slot of the WAL head file is valid.
    BadHead,
    /// A used segment is shorter than the size it was created with: no
    /// crash leaves one (segments are created whole, then renamed).
    ShortSegment { len: u64, created: u64 },
    /// The log ends below the WAL head's durable mark: records the mark
    /// says were durable (and may have been acknowledged) are gone.
    MarkedRecordsMissing {
        marked_lsn: u64,
        last_lsn: u64,
        found: String,
    },
    /// A chunk chain that cannot be whole: its end names chunks that are
    /// not right before it, or it grows past `CHAIN_BYTES_MAX`.
    BadChain { lsn: u64, reason: &'static str },
    /// A valid header (segment or `wal.head` slot) that carries another
    /// data directory's identity than the manifest's: a file copied from
    /// another directory, not damage.
    ForeignDirectory { found: u64, expected: u64 },
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Damage::ChecksumMismatch { expected, found } => {
                write!(f, "checksum mismatch (stored {expected:#010x}, computed {found:#010x})")
            }
            Damage::BadRecordSize { size } => write!(f, "impossible record size {size}"),
            Damage::UnknownRecordKind { kind } => write!(f, "unknown record kind {kind}"),
            Damage::BadTxnPart { reason } => write!(f, "transaction part does not parse: {reason}"),
            Damage::ReservedNotZero => write!(f, "a reserved field is not zero"),
            Damage::MissingSeal => write!(f, "flush does not end with a seal record"),
            Damage::SealMismatch {
                field,
                expected,
                found,
            } => write!(f, "seal field {field} is {found}, expected {expected}"),
            Damage::FlushBoundary => write!(f, "FIRST flag out of place"),
            Damage::LsnGap { expected, found } => {
                write!(f, "LSN {found} where {expected} was expected")
            }
            Damage::BadSegmentHeader { reason } => write!(f, "bad segment header: {reason}"),
            Damage::ForeignSegment {
                expected_shard,
                found_shard,
                expected_seq,
                found_seq,
            } => write!(
                f,
                "segment header says shard {found_shard} segment {found_seq}, but the file is shard {expected_shard} segment {expected_seq} (misplaced file?)"
            ),
            Damage::LogStopsBeforeNext {
                next,
                expected,
                found,
            } => write!(
                f,
                "the log stops here after LSN {}, but the next segment {} starts at LSN {found}: LSNs {expected}..={} are damaged or gone",
                expected - 1,
                next.display(),
                found.saturating_sub(1)
            ),
            Damage::SegmentMissing {
                next,
                expected,
                found,
            } => write!(
                f,
                "this segment is missing: the log before it ends at LSN {}, and the next segment {} starts at LSN {found}",
                expected - 1,
                next.display()
            ),
            Damage::SegmentLsnMismatch { expected, found } => write!(
                f,
                "segment starts at LSN {found} but the log continues at {expected}"
            ),
            Damage::ValidFlushAfterDamage { file, offset } => write!(
                f,
                "a complete flush follows at {} offset {offset}, so this is not a torn tail",
                file.display()
            ),
            Damage::UsedSegmentAfterUnused { file } => write!(
                f,
                "segment {} holds data but an earlier segment is unused",
                file.display()
            ),
            Damage::MissingHistory {
                needed_lsn,
                first_lsn,
                segment_before,
            } => {
                write!(
                    f,
                    "the log must reach back to LSN {needed_lsn} but starts at {first_lsn}: "
                )?;
                if *segment_before > 0 {
                    write!(
                        f,
                        "segment {segment_before:020}.wal, which would hold the records between, is missing, or "
                    )?;
                }
                write!(
                    f,
                    "a snapshot covering LSN {} or later is (missing from the snapshots directory, or unusable)",
                    first_lsn.saturating_sub(1)
                )
            }
            Damage::NoWalForSnapshot { snapshot_lsn } => write!(
                f,
                "snapshot covers LSN {snapshot_lsn} but no WAL segment holds data"
            ),
            Damage::NewestSegmentMissing { head_seq, found_seq } => write!(
                f,
                "the WAL head says segment {head_seq} holds acknowledged records, but the log ends in segment {found_seq} (the newest segment was deleted or damaged)"
            ),
            Damage::BadHead => write!(f, "neither slot of the WAL head file is valid"),
            Damage::ShortSegment { len, created } => write!(
                f,
                "the segment is {len} bytes but was created with {created} (cut short: damage, not a crash)"
            ),
            Damage::MarkedRecordsMissing {
                marked_lsn,
                last_lsn,
                found,
            } => write!(
                f,
                "wal.head's durable mark says every record through LSN {marked_lsn} was durable, but the log ends at LSN {last_lsn} ({found}): {} durable records are damaged or gone, not a torn write",
                marked_lsn - last_lsn
            ),
            Damage::BadChain { lsn, reason } => {
                write!(f, "chunk chain ending at LSN {lsn} is broken: {reason}")
            }
            Damage::ForeignDirectory { found, expected } => {
                f.write_str(&crate::layout::foreign_reason(*found, *expected))
            }
        }
    }
}

/// Errors of the write-ahead log: reading, writing, recovering.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    #[error("WAL {op} failed on {} at offset {offset}: {source}", file.display())]
    Io {
        op: &'static str,
        file: PathBuf,
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error("WAL is corrupt in {} at offset {offset}: {reason} (refusing to open; acknowledged data may be behind this point)", file.display())]
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: Damage,
    },
    #[error("wal_segment_size of {segment_bytes} bytes cannot hold a segment header plus the largest record ({needed} bytes); raise it or lower the key/value limits")]
    SegmentTooSmall { segment_bytes: u64, needed: u64 },
}

/// Errors of snapshot files (checkpoints).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    #[error("snapshot {op} failed on {} at offset {offset}: {source}", file.display())]
    Io {
        op: &'static str,
        file: PathBuf,
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error("snapshot {} is corrupt at offset {offset}: {reason}", file.display())]
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("snapshot {} {}; refusing to open", file.display(), crate::layout::foreign_reason(*found, *expected))]
    ForeignDirectory {
        file: PathBuf,
        found: u64,
        expected: u64,
    },
    #[error("snapshot {} is damaged ({reason}) and no older snapshot plus WAL covers it; refusing to open", file.display())]
    NoUsableSnapshot { file: PathBuf, reason: String },
    #[error("the WAL was poisoned while the checkpoint was being written")]
    Aborted,
    #[error("the storage tier could not finish the checkpoint: {reason}")]
    Tier { reason: String },
}

/// Errors of the data directory's manifest.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    #[error("manifest {} I/O failed during {op}: {source}", file.display())]
    Io {
        op: &'static str,
        file: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("manifest {} is corrupt: {reason}", file.display())]
    Corrupt { file: PathBuf, reason: String },
    #[error("manifest {} has format version {found}; this build reads versions {oldest} to {newest} (was it written by a newer build?)", file.display())]
    UnsupportedVersion {
        file: PathBuf,
        found: u32,
        oldest: u32,
        newest: u32,
    },
    #[error("manifest {} names tier code {found}, which this build does not know (0 = memory, 1 = hybrid); was it written by a newer build?", file.display())]
    UnknownTier { file: PathBuf, found: u32 },
    #[error("data directory {} holds a {:?} tier; storage.tier is {:?}: set storage.tier = {:?}, or point storage.data_dir at an empty directory (tiers cannot be converted in place)", dir.display(), manifest.as_str(), config.as_str(), manifest.as_str())]
    TierMismatch {
        dir: PathBuf,
        manifest: tunables::Tier,
        config: tunables::Tier,
    },
    #[error("manifest {} names hash {found:?}; this build routes keys with {supported:?}", file.display())]
    UnknownHash {
        file: PathBuf,
        found: String,
        supported: &'static str,
    },
    #[error("manifest {} belongs to another data directory: its directory id is {expected:#018x}, but the directory's files carry {found:#018x} (e.g. {}) and none carries the manifest's; was the manifest copied from another directory or backup?", file.display(), witness.display())]
    ForeignDirectory {
        file: PathBuf,
        /// The identity the files carry.
        found: u64,
        /// The manifest's identity.
        expected: u64,
        /// A file that carries `found`.
        witness: PathBuf,
    },
    #[error("the data directory {} was written with {manifest} shards but the config asks for {config}; re-sharding is not supported: set shards = {manifest} (or 0 to follow the manifest), or start from an empty data directory", dir.display())]
    ShardCountMismatch {
        dir: PathBuf,
        manifest: u32,
        config: u32,
    },
}

impl IoFailure for WalError {
    fn from_io(op: &'static str, file: PathBuf, offset: u64, source: io::Error) -> Self {
        WalError::Io {
            op,
            file,
            offset,
            source,
        }
    }
}

impl IoFailure for SnapshotError {
    fn from_io(op: &'static str, file: PathBuf, offset: u64, source: io::Error) -> Self {
        SnapshotError::Io {
            op,
            file,
            offset,
            source,
        }
    }
}

impl IoFailure for ManifestError {
    fn from_io(op: &'static str, file: PathBuf, _offset: u64, source: io::Error) -> Self {
        ManifestError::Io { op, file, source }
    }
}

/// Everything that can stop [`crate::Engine::open`] or
/// [`crate::Engine::shutdown`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Backend(#[from] crate::io::runtime::BackendError),
    #[error(transparent)]
    Device(#[from] crate::io::throttle::DeviceError),
    #[error("invalid engine configuration: {reason}")]
    Config { reason: String },
    #[error("{op} of {} failed: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("data directory {} is in use by another process (lock file held)", path.display())]
    Locked { path: PathBuf },
    #[error("shard {shard}: {source}")]
    Shard {
        shard: usize,
        #[source]
        source: Box<EngineError>,
    },
    #[error("shard {shard} thread panicked")]
    ShardPanicked { shard: usize },
    #[error("shard {shard} ended its WAL poisoned; its last writes may not be durable")]
    PoisonedAtShutdown { shard: usize },
}

impl EngineError {
    /// The innermost error, looking through [`EngineError::Shard`].
    pub fn root(&self) -> &EngineError {
        match self {
            EngineError::Shard { source, .. } => source.root(),
            other => other,
        }
    }
}
