//! Crash recovery of one shard: pick the snapshot, replay the WAL after it,
//! decide where the log ends, and leave the directory ready for new
//! writes. Every decision is one named row of [`RecoveryCase`], each with
//! its own test.
//!
//! What must hold: every flush whose fdatasync returned before the crash is
//! replayed; nothing from an incomplete flush is replayed; damage with a
//! complete, newer flush after it refuses to open (naming file and offset)
//! instead of silently dropping acknowledged data. Recovery writes nothing
//! over the log: new writes go to another segment, and bytes after the
//! log's end (a torn flush, or stale records of a recycled segment) are
//! never mistaken for data because every later flush carries higher LSNs.
//!
//! The snapshot phase's file work (listing the snapshots, reading their
//! headers, loading the newest chain that checks out) is in
//! `snapshot::chain`; this file keeps the decision table and the replay.

use crate::error::IoFailure;
use crate::error::{Damage, EngineError, SnapshotError, WalError};
use crate::io::{Disk, DiskFile};
use crate::layout::{is_foreign, parse_numbered, DirId, ShardPaths, WAL_SUFFIX};
pub use crate::snapshot::chain::TierFactory;
use crate::snapshot::chain::{
    kept_snapshots, list_snapshots, load_newest_chain, read_snapshot_headers,
    remove_unfinished_snapshots, set_aside_damaged, unusable_after,
};
use crate::snapshot::SnapshotFile;
use crate::tier::{MemoryTier, Tier};
use crate::txn::recovery::TxnReplay;
use crate::wal::chain::ChainReplay;
use crate::wal::format::{
    decode_segment_header, RecordKind, SegmentHeader, BLOCK_BYTES, RECORD_HEADER_BYTES,
};
use crate::wal::head::{read_head, HeadState};
use crate::wal::reader::{
    replay_flush, scan_flush, scan_tail, FileWindow, FlushInfo, FlushScan, SegmentIdentity,
};
use crate::wal::segment::{
    create_segment, erase_window, prepare_segment, recycle_into, LiveSegment, SEGMENT_TMP_SUFFIX,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The recovery decision table. Each row names what recovery saw and what
/// it did; [`Recovered::cases`] lists the rows that fired, in order.
///
/// A segment's header is *used* (it names its first LSN), *unused* (all
/// zero, or *prepared*: recycled and waiting for its first flush), or
/// *damaged*. Only used segments hold records of the log.
///
/// | case | seen | decision |
/// |---|---|---|
/// | `NoWal` | no segment holds records | start at LSN snapshot + 1 |
/// | `SnapshotLoaded` | newest snapshot valid | load it; replay from its LSN + 1 |
/// | `DamagedSnapshotSkipped` | newest snapshot damaged, an older valid one and the WAL reach back to it | rename the damaged one `*.damaged`, use the older |
/// | `NoUsableSnapshot` | snapshots exist, none valid with WAL coverage, WAL does not start at LSN 1 | refuse: [`SnapshotError::NoUsableSnapshot`] |
/// | `SegmentSkipped` | the next used segment starts at or below snapshot + 1 | do not read this one (all its records are in the snapshot) |
/// | `FlushReplayed` | a complete flush continuing the log | replay the records above the snapshot LSN, go on after its seal |
/// | `LsnGap` | a complete flush, or the next used segment, starting above the next LSN | refuse: [`WalError::Corrupt`] with [`Damage::LsnGap`] (a flush), [`Damage::LogStopsBeforeNext`] (naming where the log stops) or [`Damage::SegmentMissing`] (a segment number skipped) |
/// | `MissingHistory` | the first flush starts above snapshot + 1 | refuse: [`Damage::MissingHistory`] |
/// | `Rollover` | the log stops in a segment and the next segment's header is used and starts at the next LSN | continue in the next segment |
/// | `CleanEnd` | zeroes, or a complete flush with older LSNs (stale bytes of a recycled segment), where the next flush would start; the next segment is not used | the log ends here |
/// | `TornTail` | a damaged flush (bad checksum, no seal, ...) at the end, no complete flush with newer LSNs after it | the log ends before it; it was never acknowledged and is never replayed |
/// | `TornWindow` | a damaged or missing flush followed in its segment by complete flushes with newer LSNs whose seals all prove they were submitted while the hole's LSN was not yet durable (several flushes in flight) | the log ends before the hole; nothing from it on was acknowledged; the window's flushes are erased (zeroed, durably) before new writes |
/// | `DamageBeforeData` | damage, zeroes or stale bytes, followed in the same segment (or a later damaged-header segment) by a complete flush with newer LSNs that its seal does not place in the hole's in-flight window | refuse: [`WalError::Corrupt`] naming file + offset of the damage |
/// | `UsedSegmentAfterUnused` | a used segment after the end of the log | refuse: [`Damage::UsedSegmentAfterUnused`] |
/// | `UnusedSegmentReused` | an unused segment of the right size after the last used one | it receives the next flush |
/// | `SegmentRecycled` | any other unused segment of the right size (or one whose only flush is torn) | kept as a spare for recycling |
/// | `UnusedSegmentRemoved` | a short or damaged-header segment holding nothing | removed |
/// | `NoWalForSnapshot` | a snapshot exists but no segment is used | refuse: [`Damage::NoWalForSnapshot`] |
/// | (foreign segment) | a used header naming another shard or segment number | refuse: [`Damage::ForeignSegment`] |
/// | `NewestSegmentMissing` | the WAL head (`wal.head`) names a segment with acknowledged records after the segment the log ends in | refuse: [`Damage::NewestSegmentMissing`] |
/// | (broken chain) | a chain's end record whose chunks are not the records right before it, or a chain longer than the largest value | refuse: [`Damage::BadChain`] |
/// | `UnfinishedChain` | the log ends after chunks of a chain whose end record is missing (in a torn flush or never written) | drop the chain: its value was never acknowledged |
/// | `ShortSegment` | a used segment shorter than the size its header says it was created with (no crash makes one: segments are created whole and renamed) | refuse: [`Damage::ShortSegment`] |
/// | `MarkedRecordsMissing` | the log (with the snapshot) ends below the durable mark in `wal.head` (records known durable are gone: a damaged last flush, a cut segment) | refuse: [`Damage::MarkedRecordsMissing`] naming where the log stops |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryCase {
    NoWal,
    SnapshotLoaded,
    DamagedSnapshotSkipped,
    NoUsableSnapshot,
    SegmentSkipped,
    FlushReplayed,
    LsnGap,
    MissingHistory,
    Rollover,
    CleanEnd,
    TornTail,
    TornWindow,
    DamageBeforeData,
    UsedSegmentAfterUnused,
    UnusedSegmentReused,
    SegmentRecycled,
    UnusedSegmentRemoved,
    NoWalForSnapshot,
    NewestSegmentMissing,
    UnfinishedChain,
    ShortSegment,
    MarkedRecordsMissing,
}

/// `cases` for a log line: each case once, in the order it first happened,
/// with its count when it happened more than once (`FlushReplayed×20000`).
/// Its length is bounded by the number of cases, whatever the WAL held.
pub fn cases_summary(cases: &[RecoveryCase]) -> String {
    let mut counted: Vec<(RecoveryCase, u64)> = Vec::new();
    for &case in cases {
        match counted.iter_mut().find(|(c, _)| *c == case) {
            Some((_, n)) => *n += 1,
            None => counted.push((case, 1)),
        }
    }
    let words: Vec<String> = counted
        .iter()
        .map(|(case, n)| match n {
            1 => format!("{case:?}"),
            n => format!("{case:?}×{n}"),
        })
        .collect();
    words.join(" ")
}

/// What recovery hands to the shard.
pub struct Recovered {
    pub tier: Box<dyn Tier>,
    /// Transaction parts seen; multi-shard ones wait for the exchange.
    pub(crate) txn: TxnReplay,
    /// Last LSN of the recovered state (0 for an empty shard).
    pub last_lsn: u64,
    pub max_commit_version: u64,
    /// Segments with records, oldest first.
    pub live_segments: Vec<LiveSegment>,
    /// The segment new writes go to (full size, unused header).
    pub next_segment_seq: u64,
    /// Whether that segment exists. False when it had to be created and
    /// that failed (a full disk): the shard starts, serves reads, and its
    /// segment creator keeps trying; writes fail if it never succeeds.
    pub next_segment_ready: bool,
    /// Whether that segment was recycled (may hold stale bytes).
    pub next_segment_recycled: bool,
    /// `Some((seq, offset))`: new writes continue in segment `seq` (the
    /// newest used one) at `offset`, the end of the log, and the next
    /// segment is the spare ahead of it; `None`: they start the next
    /// segment.
    pub resume: Option<(u64, u64)>,
    /// Unused segments of the right size kept for recycling.
    pub spares: Vec<PathBuf>,
    /// Valid snapshots kept, oldest first.
    pub snapshots: Vec<SnapshotFile>,
    pub records_replayed: u64,
    /// Bytes of the replayed records.
    pub bytes_replayed: u64,
    /// Bytes of the WAL flushes holding records after the snapshot (what
    /// the flusher wrote for them: headers, records, seals and padding).
    pub wal_bytes_after_snapshot: u64,
    pub bytes_read: u64,
    pub snapshot_entries: u64,
    pub duration: Duration,
    pub cases: Vec<RecoveryCase>,
    /// The WAL head as read (`None`: no head file yet).
    pub head: Option<HeadState>,
    /// The head recovery found true: the newest segment holding a complete
    /// flush of the log (seq 0 if none) and its first LSN.
    pub head_found: HeadState,
}

/// Settings recovery needs.
#[derive(Debug, Clone, Copy)]
pub struct RecoveryConfig {
    pub shard: u32,
    pub segment_bytes: u64,
    /// The data directory's identity (the manifest's): a segment, snapshot
    /// or head carrying another nonzero one is refused. 0: check nothing.
    pub dir_id: DirId,
}

/// What block 0 of a segment says.
#[derive(Debug, Clone)]
enum HeaderState {
    Used(SegmentHeader),
    /// All zero, or prepared (recycled, waiting); `true` if recycled.
    Unused {
        recycled: bool,
    },
    Damaged(Damage),
}

struct Segment<D: Disk> {
    seq: u64,
    path: PathBuf,
    file: D::File,
    len: u64,
    header: HeaderState,
}

impl<D: Disk> Segment<D> {
    fn used(&self) -> Option<SegmentHeader> {
        match self.header {
            HeaderState::Used(h) => Some(h),
            _ => None,
        }
    }
}

/// Where the valid log ends: segment index, offset, and the damage found
/// there (`None` for zeroes or stale bytes).
type LogEnd = (usize, u64, Option<(u64, Damage)>);

fn corrupt(file: &Path, offset: u64, reason: Damage) -> EngineError {
    EngineError::Wal(WalError::Corrupt {
        file: file.to_path_buf(),
        offset,
        reason,
    })
}

async fn open_segments<D: Disk>(
    disk: &D,
    paths: &ShardPaths,
    (shard, dir_id): (u32, DirId),
    cases: &mut Vec<RecoveryCase>,
) -> Result<(Vec<Segment<D>>, u64), EngineError> {
    let mut segments = Vec::new();
    let mut max_seq = 0u64;
    let files = disk
        .list_dir(&paths.wal_dir)
        .map_err(|source| EngineError::Io {
            op: "list WAL directory",
            path: paths.wal_dir.clone(),
            source,
        })?;
    let mut removed_tmp = false;
    for path in files {
        if path.to_string_lossy().ends_with(SEGMENT_TMP_SUFFIX) {
            // A segment whose creation did not finish (crash, full disk).
            tracing::info!(file = %path.display(), "removing an unfinished WAL segment");
            disk.remove_file(&path).await.map_err(WalError::io_at(
                "remove unfinished segment",
                &path,
                0,
            ))?;
            removed_tmp = true;
            continue;
        }
        let Some(seq) = parse_numbered(&path, WAL_SUFFIX) else {
            tracing::warn!(file = %path.display(), "ignoring a file that is not a WAL segment");
            continue;
        };
        max_seq = max_seq.max(seq);
        let file = disk
            .open(&path, false)
            .await
            .map_err(WalError::io_at("open", &path, 0))?;
        let (header, len) = {
            let mut win = FileWindow::new(&file, &path)
                .await
                .map_err(WalError::io_at("stat", &path, 0))?;
            let len = win.file_len();
            let block = win
                .get(0, BLOCK_BYTES)
                .await
                .map_err(WalError::io_at("read", &path, 0))?;
            let header = match decode_segment_header(block) {
                Ok(Some(h)) if is_foreign(h.dir_id, dir_id) => {
                    return Err(corrupt(
                        &path,
                        0,
                        Damage::ForeignDirectory {
                            found: h.dir_id,
                            expected: dir_id,
                        },
                    ));
                }
                Ok(None) => HeaderState::Unused { recycled: false },
                Ok(Some(h)) if h.is_prepared() => HeaderState::Unused { recycled: true },
                Ok(Some(h)) => {
                    if h.shard != shard || h.seq != seq {
                        return Err(corrupt(
                            &path,
                            0,
                            Damage::ForeignSegment {
                                expected_shard: shard,
                                found_shard: h.shard,
                                expected_seq: seq,
                                found_seq: h.seq,
                            },
                        ));
                    }
                    if len < h.segment_bytes {
                        // Segments are created whole under a temporary
                        // name and renamed, so no crash leaves a used one
                        // short: its cut-off flushes were durable.
                        cases.push(RecoveryCase::ShortSegment);
                        return Err(corrupt(
                            &path,
                            len,
                            Damage::ShortSegment {
                                len,
                                created: h.segment_bytes,
                            },
                        ));
                    }
                    HeaderState::Used(h)
                }
                Err(d) => HeaderState::Damaged(d),
            };
            (header, len)
        };
        segments.push(Segment {
            seq,
            path,
            file,
            len,
            header,
        });
    }
    if removed_tmp {
        disk.sync_dir(&paths.wal_dir)
            .await
            .map_err(WalError::io_at("fsync directory", &paths.wal_dir, 0))?;
    }
    segments.sort_by_key(|s| s.seq);
    Ok((segments, max_seq))
}

/// Whether the record header at the damage point is one of the current
/// generation's (LSN `next`), i.e. a torn write rather than stale bytes.
pub(crate) async fn looks_current<F: DiskFile>(
    win: &mut FileWindow<'_, F>,
    offset: u64,
    next: u64,
) -> bool {
    let Ok(head) = win.get(offset, RECORD_HEADER_BYTES).await else {
        return false;
    };
    if head.len() < RECORD_HEADER_BYTES {
        return false;
    }
    let mut lsn = [0u8; 8];
    lsn.copy_from_slice(&head[8..16]);
    u64::from_le_bytes(lsn) == next
}

/// Recovers one shard from `paths`. See [`RecoveryCase`] for the rules.
/// Recovers a shard into a memory tier.
pub async fn recover<D: Disk>(
    disk: &D,
    paths: &ShardPaths,
    config: RecoveryConfig,
) -> Result<Recovered, EngineError> {
    let memory = |hint: Option<u64>| -> Box<dyn Tier> {
        Box::new(match hint {
            Some(entries) => MemoryTier::with_capacity(entries),
            None => MemoryTier::new(),
        })
    };
    recover_into(disk, paths, config, &memory).await
}

/// Recovers a shard into tiers made by `new_tier`. Recovery runs as named
/// phases, in this order: open the segments, choose the snapshot, replay
/// the log after it, check the log reaches the segment `wal.head` names,
/// and ready the directory for new writes. Every phase appends the
/// [`RecoveryCase`] rows it decides to one list, so [`Recovered::cases`]
/// reads in the order recovery met them.
pub async fn recover_into<D: Disk>(
    disk: &D,
    paths: &ShardPaths,
    config: RecoveryConfig,
    new_tier: &TierFactory<'_>,
) -> Result<Recovered, EngineError> {
    let started = Instant::now();
    let mut cases = Vec::new();
    let head = read_head(disk, paths, config.shard).await?;
    if let Some(h) = head.filter(|h| is_foreign(h.dir_id, config.dir_id)) {
        return Err(corrupt(
            &paths.dir.join(crate::wal::head::HEAD_FILE),
            0,
            Damage::ForeignDirectory {
                found: h.dir_id,
                expected: config.dir_id,
            },
        ));
    }
    let owner = (config.shard, config.dir_id);
    let (segments, max_seq) = open_segments(disk, paths, owner, &mut cases).await?;
    let mut snapshot = choose_snapshot(disk, paths, owner, &segments, new_tier, &mut cases).await?;
    snapshot.tier.replay_begin();
    let mut replay = replay_log(
        paths,
        config.shard,
        &segments,
        &mut *snapshot.tier,
        snapshot.lsn,
        snapshot.max_commit_version,
        &mut cases,
    )
    .await?;
    let head_found = check_head(paths, head, &segments, replay.newest_used, &mut cases)?;
    let last_lsn = replay.last_lsn.unwrap_or(snapshot.lsn).max(snapshot.lsn);
    check_mark(paths, head, &segments, &replay, last_lsn, &mut cases)?;
    make_durable_what_was_read(disk, paths, &segments).await?;
    let position =
        prepare_for_writes(disk, paths, config, &segments, max_seq, &replay, &mut cases).await?;
    let live_segments = replay.take_live_segments(&segments);
    Ok(Recovered {
        txn: replay.txn,
        tier: snapshot.tier,
        last_lsn,
        max_commit_version: replay.max_commit_version,
        live_segments,
        next_segment_seq: position.next_segment_seq,
        next_segment_ready: position.next_segment_ready,
        next_segment_recycled: position.next_segment_recycled,
        resume: position.resume,
        spares: position.spares,
        snapshots: snapshot.kept,
        records_replayed: replay.records_replayed,
        bytes_replayed: replay.bytes_replayed,
        wal_bytes_after_snapshot: replay.wal_bytes_after_snapshot,
        bytes_read: replay.bytes_read + position.bytes_read,
        snapshot_entries: snapshot.entries,
        duration: started.elapsed(),
        cases,
        head,
        head_found,
    })
}

/// What the snapshot phase settled on: the tier holding the newest usable
/// snapshot (an empty tier without one) and what that snapshot covers.
struct SnapshotPhase {
    tier: Box<dyn Tier>,
    /// Last LSN the snapshot covers (0 without a snapshot): replay starts
    /// after it.
    lsn: u64,
    max_commit_version: u64,
    entries: u64,
    /// Valid snapshots kept, oldest first.
    kept: Vec<SnapshotFile>,
}

/// Phase: choose the snapshot. Removes unfinished snapshots, then loads
/// the newest snapshot whose chain (the full snapshot it starts from and
/// every delta up to it, `docs/wal.md`) checks out, and renames every
/// snapshot newer than it `*.damaged` when an older snapshot plus the WAL
/// cover them (rows `SnapshotLoaded`, `DamagedSnapshotSkipped`,
/// `NoUsableSnapshot`).
async fn choose_snapshot<D: Disk>(
    disk: &D,
    paths: &ShardPaths,
    owner: (u32, DirId),
    segments: &[Segment<D>],
    new_tier: &TierFactory<'_>,
    cases: &mut Vec<RecoveryCase>,
) -> Result<SnapshotPhase, EngineError> {
    let (listed, leftovers) = list_snapshots(disk, paths)?;
    let mut dir_changed = remove_unfinished_snapshots(disk, leftovers).await?;
    let (snapshots, mut damaged) = read_snapshot_headers(disk, listed, owner).await?;
    let first_header_lsn = segments.iter().find_map(|s| s.used().map(|h| h.first_lsn));
    let chosen = load_newest_chain(
        disk,
        &snapshots,
        &mut damaged,
        first_header_lsn,
        owner,
        new_tier,
    )
    .await?;
    let kept = kept_snapshots(disk, &snapshots, chosen.as_ref(), owner).await?;

    // Snapshots newer than the one chosen cannot be used: rename them.
    let chosen_lsn = chosen.as_ref().map_or(0, |c| snapshots[c.at].lsn);
    let unusable = unusable_after(&snapshots, &damaged, chosen_lsn);
    if let Some((newest, reason)) = unusable.first() {
        if chosen.is_none() && first_header_lsn != Some(1) {
            cases.push(RecoveryCase::NoUsableSnapshot);
            return Err(SnapshotError::NoUsableSnapshot {
                file: newest.path.clone(),
                reason: reason.clone(),
            }
            .into());
        }
        set_aside_damaged(disk, &unusable).await?;
        dir_changed = true;
        cases.push(RecoveryCase::DamagedSnapshotSkipped);
    }
    if dir_changed {
        sync_snapshot_dir(disk, paths).await?;
    }
    match chosen {
        Some(c) => {
            cases.push(RecoveryCase::SnapshotLoaded);
            Ok(SnapshotPhase {
                tier: c.tier,
                lsn: c.meta.lsn,
                max_commit_version: c.meta.max_commit_version,
                entries: c.entries,
                kept,
            })
        }
        None => Ok(SnapshotPhase {
            tier: new_tier(None),
            lsn: 0,
            max_commit_version: 0,
            entries: 0,
            kept,
        }),
    }
}

/// What replaying the log left: where it ends and what was read on the way.
struct ReplayPhase {
    /// Transaction parts seen, in skipped segments too.
    txn: TxnReplay,
    /// Indexes of the segments with a used header, oldest first.
    used: Vec<usize>,
    /// How many of `used` were skipped: every record in them is in the
    /// snapshot (row `SegmentSkipped`).
    skipped: usize,
    /// Index of the segment replay started in (`segments.len()` if none).
    start: usize,
    /// Last LSN the snapshot covers (0 without one).
    snapshot_lsn: u64,
    /// LSN of the last record of the log (`None`: no complete flush).
    last_lsn: Option<u64>,
    max_commit_version: u64,
    records_replayed: u64,
    bytes_replayed: u64,
    wal_bytes_after_snapshot: u64,
    bytes_read: u64,
    /// Segments whose first flush belongs to the log, oldest first.
    live_segments: Vec<LiveSegment>,
    /// Where the log ends (`None`: no used segment was replayed).
    end: Option<LogEnd>,
    /// The newest segment holding a complete flush of the log: (seq, first LSN).
    newest_used: Option<(u64, u64)>,
    /// The chunk chain being put back together.
    chain: ChainReplay,
    /// A torn in-flight window after the end of the log (row
    /// `TornWindow`): segment index and the byte range of its flushes,
    /// erased before new writes.
    window: Option<(usize, u64, u64)>,
}

/// How one segment's part of the log ended.
enum SegmentEnd {
    /// The next segment continues the log (row `Rollover`).
    Rollover,
    /// The log ends in this segment.
    LogEnd(LogEnd),
}

/// Phase: replay the log after the snapshot into `tier`, flush by flush
/// and segment by segment, up to where it ends (rows `NoWal`,
/// `NoWalForSnapshot`, `SegmentSkipped`, `FlushReplayed`, `MissingHistory`,
/// `LsnGap`, `Rollover`, `CleanEnd`, `TornTail`, `DamageBeforeData`).
async fn replay_log<D: Disk>(
    paths: &ShardPaths,
    shard: u32,
    segments: &[Segment<D>],
    tier: &mut dyn Tier,
    snapshot_lsn: u64,
    snapshot_max_version: u64,
    cases: &mut Vec<RecoveryCase>,
) -> Result<ReplayPhase, EngineError> {
    let need = snapshot_lsn + 1;
    let n = segments.len();
    let used: Vec<usize> = (0..n).filter(|&i| segments[i].used().is_some()).collect();
    if used.is_empty() {
        if snapshot_lsn > 0 {
            cases.push(RecoveryCase::NoWalForSnapshot);
            return Err(corrupt(
                &paths.wal_dir,
                0,
                Damage::NoWalForSnapshot { snapshot_lsn },
            ));
        }
        cases.push(RecoveryCase::NoWal);
    }
    // Skip used segments whose successor starts at or below `need`.
    let mut k = 0usize;
    while k + 1 < used.len() {
        match segments[used[k + 1]].used() {
            Some(h) if h.first_lsn <= need => {
                cases.push(RecoveryCase::SegmentSkipped);
                k += 1;
            }
            _ => break,
        }
    }
    let start = used.get(k).copied().unwrap_or(n);
    let mut txn = TxnReplay::default();
    let skipped_bytes_read =
        read_skipped_txn_parts(shard, segments, &used[..k], tier, &mut txn).await?;
    let mut phase = ReplayPhase {
        txn,
        used,
        skipped: k,
        start,
        snapshot_lsn,
        last_lsn: None,
        max_commit_version: snapshot_max_version,
        records_replayed: 0,
        bytes_replayed: 0,
        wal_bytes_after_snapshot: 0,
        bytes_read: skipped_bytes_read,
        live_segments: Vec::new(),
        end: None,
        newest_used: None,
        chain: ChainReplay::keeping(),
        window: None,
    };
    let mut i = start;
    while i < n {
        let seg = &segments[i];
        let mut win = FileWindow::new(&seg.file, &seg.path)
            .await
            .map_err(WalError::io_at("stat", &seg.path, 0))?;
        let (pos, damage) = phase
            .replay_segment(seg, &mut win, tier, shard, cases)
            .await?;
        match phase
            .end_of_segment(segments, &mut win, (i, pos, damage), shard, cases)
            .await?
        {
            SegmentEnd::Rollover => i += 1,
            SegmentEnd::LogEnd(end) => {
                phase.end = Some(end);
                break;
            }
        }
    }
    if let Some(c) = phase.chain.unfinished() {
        tracing::warn!(
            shard,
            first_lsn = c.first_lsn,
            last_lsn = c.last_lsn,
            bytes = c.bytes,
            "the WAL ends inside a chunk chain (its value was never acknowledged); it is dropped"
        );
        cases.push(RecoveryCase::UnfinishedChain);
    }
    Ok(phase)
}

/// Segments below the replay start are not replayed, but the transaction
/// parts in them count as present (docs/transactions.md, recovery rule).
/// Returns the bytes read.
async fn read_skipped_txn_parts<D: Disk>(
    shard: u32,
    segments: &[Segment<D>],
    skipped: &[usize],
    tier: &mut dyn Tier,
    txn: &mut TxnReplay,
) -> Result<u64, EngineError> {
    let mut skipped_bytes_read = 0u64;
    for &idx in skipped {
        let seg = &segments[idx];
        let identity = SegmentIdentity {
            shard,
            seq: seg.seq,
        };
        let mut win = FileWindow::new(&seg.file, &seg.path)
            .await
            .map_err(WalError::io_at("stat", &seg.path, 0))?;
        let mut pos = 0u64;
        let mut last: Option<u64> = None;
        while let FlushScan::Complete(flush) = scan_flush(&mut win, pos, identity)
            .await
            .map_err(WalError::io_at("read", &seg.path, pos))?
        {
            if last.is_some_and(|l| flush.first_lsn <= l) {
                break; // stale bytes of a recycled segment
            }
            let tier_ref = &mut *tier;
            let txn_ref = &mut *txn;
            replay_flush(&mut win, &flush, &mut |r| {
                if r.kind == RecordKind::TxnPart {
                    txn_ref.part(r.lsn, r.key, r.value, false, tier_ref);
                }
            })
            .await
            .map_err(WalError::io_at("read", &seg.path, pos))?;
            last = Some(flush.last_lsn);
            pos = flush.end;
        }
        skipped_bytes_read += win.bytes_read();
    }
    Ok(skipped_bytes_read)
}

impl ReplayPhase {
    /// The LSN the log reached so far: its last record, or the snapshot's.
    fn after_lsn(&self) -> u64 {
        self.last_lsn.unwrap_or(self.snapshot_lsn)
    }

    /// Replays the complete flushes of `seg` that continue the log and
    /// returns where they stop: the offset, and the damage found there
    /// (`None` for zeroes or stale bytes). The log may still go on in the
    /// next segment; [`ReplayPhase::end_of_segment`] decides.
    async fn replay_segment<D: Disk>(
        &mut self,
        seg: &Segment<D>,
        win: &mut FileWindow<'_, D::File>,
        tier: &mut dyn Tier,
        shard: u32,
        cases: &mut Vec<RecoveryCase>,
    ) -> Result<(u64, Option<(u64, Damage)>), EngineError> {
        let identity = SegmentIdentity {
            shard,
            seq: seg.seq,
        };
        let mut pos = 0u64;
        let mut progress = crate::progress::Progress::new("replaying a WAL segment", &seg.path);
        loop {
            progress.tick(pos, win.file_len(), self.records_replayed);
            let scan = scan_flush(win, pos, identity)
                .await
                .map_err(WalError::io_at("read", &seg.path, pos))?;
            match scan {
                FlushScan::Complete(flush) => {
                    if !self.continues_log(&flush, seg, pos, cases)? {
                        return Ok((pos, None));
                    }
                    self.replay_one_flush(seg, win, &flush, pos, tier).await?;
                    cases.push(RecoveryCase::FlushReplayed);
                    self.last_lsn = Some(flush.last_lsn);
                    pos = flush.end;
                }
                FlushScan::Zero => return Ok((pos, None)),
                FlushScan::Damaged {
                    offset,
                    reason: reason @ Damage::ForeignSegment { .. },
                } => return Err(corrupt(&seg.path, offset, reason)),
                FlushScan::Damaged { offset, reason } => return Ok((pos, Some((offset, reason)))),
            }
        }
    }

    /// Whether the complete flush at `pos` of `seg` continues the log
    /// replayed so far. False for stale bytes of a recycled segment (older
    /// LSNs after the end, never at offset 0: a used header names its
    /// flush's first LSN); an error for a gap or for history missing
    /// between the snapshot and the log.
    fn continues_log<D: Disk>(
        &self,
        flush: &FlushInfo,
        seg: &Segment<D>,
        pos: u64,
        cases: &mut Vec<RecoveryCase>,
    ) -> Result<bool, EngineError> {
        let need = self.snapshot_lsn + 1;
        match self.last_lsn {
            None if flush.first_lsn > need => {
                cases.push(RecoveryCase::MissingHistory);
                Err(corrupt(
                    &seg.path,
                    pos,
                    Damage::MissingHistory {
                        needed_lsn: need,
                        first_lsn: flush.first_lsn,
                        segment_before: seg.seq.saturating_sub(1),
                    },
                ))
            }
            Some(last) if pos > 0 && flush.first_lsn <= last => Ok(false),
            Some(last) if flush.first_lsn != last + 1 => {
                cases.push(RecoveryCase::LsnGap);
                Err(corrupt(
                    &seg.path,
                    pos,
                    Damage::LsnGap {
                        expected: last + 1,
                        found: flush.first_lsn,
                    },
                ))
            }
            _ => Ok(true),
        }
    }

    /// Replays one complete flush (at `pos` of `seg`) into the tier: the
    /// records after the snapshot, and every transaction part (the exchange
    /// needs those the snapshot covers too).
    async fn replay_one_flush<D: Disk>(
        &mut self,
        seg: &Segment<D>,
        win: &mut FileWindow<'_, D::File>,
        flush: &FlushInfo,
        pos: u64,
        tier: &mut dyn Tier,
    ) -> Result<(), EngineError> {
        let need = self.snapshot_lsn + 1;
        if self.newest_used.is_none_or(|(seq, _)| seq < seg.seq) {
            let first = seg.used().map_or(flush.first_lsn, |h| h.first_lsn);
            self.newest_used = Some((seg.seq, first));
        }
        if pos == 0 {
            self.live_segments.push(LiveSegment {
                seq: seg.seq,
                path: seg.path.clone(),
                first_lsn: flush.first_lsn,
                bytes: seg.len,
            });
        }
        let txn = &mut self.txn;
        let chain = &mut self.chain;
        let mut chain_damage = None;
        let mut replayed = 0u64;
        let mut version = self.max_commit_version;
        let bytes = replay_flush(win, flush, &mut |r| {
            version = version.max(r.commit_version);
            if r.lsn < need && r.kind != RecordKind::TxnPart {
                // In the snapshot. No chain crosses its LSN (a checkpoint
                // never claims part of one), so chunks below it belong to
                // chains it holds whole.
                return;
            }
            let whole = match chain.record(r) {
                Ok(whole) => whole,
                Err(d) => {
                    chain_damage.get_or_insert(d);
                    return;
                }
            };
            if r.kind == RecordKind::Chunk {
                // Applied with its chain's end record.
                replayed += u64::from(r.lsn >= need);
                return;
            }
            if r.kind == RecordKind::TxnPart {
                txn.part(r.lsn, r.key, r.value, r.lsn >= need, tier);
                if r.lsn >= need {
                    replayed += 1;
                }
                return;
            }
            if r.lsn < need {
                return;
            }
            let h = tier.table_hasher().hash_key(r.key);
            match r.kind {
                RecordKind::Put => {
                    let value = whole.as_deref().unwrap_or(r.value);
                    tier.put_expiring(h, r.key, value, r.expires_at_ms, r.lsn);
                }
                RecordKind::Delete => {
                    tier.delete_blind(h, r.key, r.lsn);
                }
                RecordKind::Seal | RecordKind::TxnPart | RecordKind::Chunk => {
                    unreachable!("replay_flush skips seals; parts and chunks are handled above")
                }
            }
            txn.overwritten(r.key);
            replayed += 1;
        })
        .await
        .map_err(WalError::io_at("read", &seg.path, pos))?;
        if let Some(d) = chain_damage {
            return Err(corrupt(&seg.path, pos, d));
        }
        self.max_commit_version = version;
        self.records_replayed += replayed;
        if flush.last_lsn >= need {
            self.bytes_replayed += bytes;
            self.wal_bytes_after_snapshot += flush.end - pos;
        }
        Ok(())
    }

    /// What lies after the log's stop in its segment: refuses when a
    /// complete newer flush outside the hole's in-flight window proves
    /// damage; otherwise returns whether the stop is a torn write and the
    /// row that names it (`TornWindow` when a window follows the hole,
    /// whose range is kept for erasing).
    async fn scan_after_stop<D: Disk>(
        &mut self,
        segments: &[Segment<D>],
        win: &mut FileWindow<'_, D::File>,
        seg_end: &LogEnd,
        identity: SegmentIdentity,
        cases: &mut Vec<RecoveryCase>,
    ) -> Result<(bool, RecoveryCase), EngineError> {
        // The log stops in this segment at `pos`. Nothing newer may follow
        // in it: a complete flush with newer LSNs means acknowledged data
        // sits behind damage, unless its seal proves it was in flight with
        // the hole's flush (`TornWindow`).
        let (i, pos) = (seg_end.0, seg_end.1);
        let seg = &segments[i];
        let after = self.after_lsn();
        let tail = scan_tail(win, pos, after, identity)
            .await
            .map_err(WalError::io_at("read", &seg.path, pos))?;
        if let Some(at) = tail.complete_flush_at {
            cases.push(RecoveryCase::DamageBeforeData);
            let offset = seg_end.2.as_ref().map_or(pos, |(o, _)| *o);
            return Err(corrupt(
                &seg.path,
                offset,
                Damage::ValidFlushAfterDamage {
                    file: seg.path.clone(),
                    offset: at,
                },
            ));
        }
        let torn = match &seg_end.2 {
            Some((offset, _)) => {
                // Damage right where the next flush starts: a torn write if
                // its header carries the next LSN or the segment was never
                // recycled (fresh segments hold no stale bytes).
                let _ = offset;
                // At offset 0 the used header itself names the next LSN.
                pos == 0
                    || !segments[i].used().is_some_and(|h| h.is_recycled())
                    || looks_current(win, pos, after + 1).await
            }
            None => tail.nonzero_end > pos && !segments[i].used().is_some_and(|h| h.is_recycled()),
        } || tail.window.is_some();
        if let Some((from, to)) = tail.window {
            tracing::warn!(file = %seg.path.display(), hole_offset = pos, window_from = from, window_to = to,
                flushes = tail.window_flushes, first_missing_lsn = after + 1,
                "WAL ends with a torn in-flight window (never acknowledged); it is not replayed and is erased");
            self.window = Some((i, from, to));
        }
        let torn_case = if tail.window.is_some() {
            RecoveryCase::TornWindow
        } else {
            RecoveryCase::TornTail
        };
        Ok((torn, torn_case))
    }

    /// Decides what follows the log's stop at `seg_end` in segment `i`:
    /// the next segment continues it, or the log ends here (cleanly or
    /// with a torn flush), or newer data sits behind damage and recovery
    /// refuses.
    async fn end_of_segment<D: Disk>(
        &mut self,
        segments: &[Segment<D>],
        win: &mut FileWindow<'_, D::File>,
        seg_end: LogEnd,
        shard: u32,
        cases: &mut Vec<RecoveryCase>,
    ) -> Result<SegmentEnd, EngineError> {
        let i = seg_end.0;
        let pos = seg_end.1;
        let seg = &segments[i];
        let identity = SegmentIdentity {
            shard,
            seq: seg.seq,
        };
        let after = self.after_lsn();
        let (torn, torn_case) = self
            .scan_after_stop(segments, win, &seg_end, identity, cases)
            .await?;
        self.bytes_read += win.bytes_read();
        // Rollover: the next segment is used and continues the log.
        if let Some(next) = segments.get(i + 1) {
            if let Some(h) = next.used() {
                let expected = after + 1;
                if h.first_lsn == expected && self.last_lsn.is_some() {
                    if seg_end.2.is_some() || torn {
                        // A torn flush followed by a segment continuing at
                        // the next LSN: the log was recovered once and went on.
                        cases.push(torn_case);
                    }
                    cases.push(RecoveryCase::Rollover);
                    return Ok(SegmentEnd::Rollover);
                }
                if self.last_lsn.is_some() {
                    // Name where the records went missing: a segment
                    // number skipped in between, else where the log stops.
                    cases.push(RecoveryCase::LsnGap);
                    let skipped = next.seq > seg.seq + 1;
                    let (file, offset, reason) = if skipped {
                        let name = format!("{:020}{WAL_SUFFIX}", seg.seq + 1);
                        let missing = seg.path.with_file_name(name);
                        let reason = Damage::SegmentMissing {
                            next: next.path.clone(),
                            expected,
                            found: h.first_lsn,
                        };
                        (missing, 0, reason)
                    } else {
                        let offset = seg_end.2.as_ref().map_or(pos, |(o, _)| *o);
                        let reason = Damage::LogStopsBeforeNext {
                            next: next.path.clone(),
                            expected,
                            found: h.first_lsn,
                        };
                        (seg.path.clone(), offset, reason)
                    };
                    return Err(corrupt(&file, offset, reason));
                }
            }
        }
        // A damaged header right after the end: that segment's first flush tore.
        let torn = torn
            || segments
                .get(i + 1)
                .is_some_and(|next| matches!(next.header, HeaderState::Damaged(_)));
        if torn {
            let (offset, reason) = seg_end
                .2
                .as_ref()
                .map(|(o, d)| (*o, d.to_string()))
                .unwrap_or((pos, "zeroes before written blocks".to_string()));
            tracing::warn!(file = %segments[i].path.display(), flush_offset = pos, damage_offset = offset,
                damage = %reason, "WAL ends with a torn flush (never acknowledged); it is not replayed");
            cases.push(torn_case);
        } else {
            cases.push(RecoveryCase::CleanEnd);
        }
        Ok(SegmentEnd::LogEnd(seg_end))
    }

    /// The live segments, with the used segments skipped below the
    /// snapshot put back in order: they stay until the next checkpoint
    /// recycles them.
    fn take_live_segments<D: Disk>(&mut self, segments: &[Segment<D>]) -> Vec<LiveSegment> {
        let mut live_segments = std::mem::take(&mut self.live_segments);
        for &u in &self.used[..self.skipped.min(self.used.len())] {
            let seg = &segments[u];
            if let Some(h) = seg.used() {
                live_segments.insert(
                    live_segments.partition_point(|s| s.seq < seg.seq),
                    LiveSegment {
                        seq: seg.seq,
                        path: seg.path.clone(),
                        first_lsn: h.first_lsn,
                        bytes: seg.len,
                    },
                );
            }
        }
        live_segments
    }
}

/// Phase: the head names the newest segment whose first flush was durable
/// (and acknowledged); the log must reach it (row `NewestSegmentMissing`).
/// Returns the head recovery found true.
fn check_head<D: Disk>(
    paths: &ShardPaths,
    head: Option<HeadState>,
    segments: &[Segment<D>],
    newest_used: Option<(u64, u64)>,
    cases: &mut Vec<RecoveryCase>,
) -> Result<HeadState, EngineError> {
    let found = newest_used.map_or(0, |(seq, _)| seq);
    // A segment with a used header at or past the named one also reaches
    // it: the named segment may have been retired by a checkpoint that
    // covered it, with the next segment's first flush torn by the crash.
    // A deleted or emptied newest segment leaves no such header.
    let newest_header = segments
        .iter()
        .filter(|s| s.used().is_some())
        .map(|s| s.seq)
        .max()
        .unwrap_or(0);
    if let Some(h) = head {
        if h.seq > found.max(newest_header) {
            cases.push(RecoveryCase::NewestSegmentMissing);
            return Err(corrupt(
                &paths.segment(h.seq),
                0,
                Damage::NewestSegmentMissing {
                    head_seq: h.seq,
                    found_seq: found,
                },
            ));
        }
    }
    Ok(HeadState {
        generation: 0,
        seq: found,
        first_lsn: newest_used.map_or(0, |(_, lsn)| lsn),
        marked_lsn: 0,
        // Filled in by the head's writer (`open_head`), which writes its own.
        dir_id: 0,
    })
}

/// Phase: the head's durable mark says every record through it was
/// durable; the recovered log must reach it (row `MarkedRecordsMissing`).
/// A log that ends below the mark lost acknowledged records to damage
/// (a flipped or zeroed last flush, a truncated segment): a crash alone
/// never takes back a durable flush.
fn check_mark<D: Disk>(
    paths: &ShardPaths,
    head: Option<HeadState>,
    segments: &[Segment<D>],
    replay: &ReplayPhase,
    last_lsn: u64,
    cases: &mut Vec<RecoveryCase>,
) -> Result<(), EngineError> {
    let Some(marked) = head.map(|h| h.marked_lsn).filter(|&m| m > last_lsn) else {
        return Ok(());
    };
    cases.push(RecoveryCase::MarkedRecordsMissing);
    let (file, offset, found) = match &replay.end {
        Some((i, pos, damage)) => (
            segments[*i].path.clone(),
            damage.as_ref().map_or(*pos, |(o, _)| *o),
            damage.as_ref().map(|(_, d)| d.to_string()),
        ),
        None => (paths.wal_dir.clone(), 0, None),
    };
    Err(corrupt(
        &file,
        offset,
        Damage::MarkedRecordsMissing {
            marked_lsn: marked,
            last_lsn,
            found: found.unwrap_or_else(|| "the log ends cleanly".into()),
        },
    ))
}

/// Phase: before recovery writes anything, makes durable what it read.
/// A run killed between a write and its sync (a segment's prepared header
/// before its fdatasync, a rename before its directory fsync) leaves bytes
/// and names in the page cache that read back like durable ones but would
/// not survive a power loss. Recovery decides from them: which files are
/// spares to rename into the log, where the log ends, which snapshot
/// covers it. Building on them unsynced, a later power loss could bring
/// back what they replaced: a renamed spare with the header of the segment
/// it was ("header says segment 5, but the file is segment 8"), or a log
/// end that new flushes were appended after. So every segment file is
/// fdatasync'ed and both directories fsync'ed first; after a clean stop
/// nothing is dirty and each sync returns at once.
async fn make_durable_what_was_read<D: Disk>(
    disk: &D,
    paths: &ShardPaths,
    segments: &[Segment<D>],
) -> Result<(), EngineError> {
    for seg in segments {
        seg.file.sync_data().await.map_err(WalError::io_at(
            "fdatasync (recovery)",
            &seg.path,
            0,
        ))?;
    }
    disk.sync_dir(&paths.wal_dir)
        .await
        .map_err(WalError::io_at("fsync directory", &paths.wal_dir, 0))?;
    sync_snapshot_dir(disk, paths).await
}

async fn sync_snapshot_dir<D: Disk>(disk: &D, paths: &ShardPaths) -> Result<(), EngineError> {
    disk.sync_dir(&paths.snapshot_dir)
        .await
        .map_err(|source| EngineError::Io {
            op: "fsync snapshot directory",
            path: paths.snapshot_dir.clone(),
            source,
        })
}

/// Where new writes go once recovery is done.
struct WritePosition {
    /// The segment new writes go to (full size, unused header).
    next_segment_seq: u64,
    next_segment_recycled: bool,
    /// False when the segment had to be created and that failed.
    next_segment_ready: bool,
    /// Unused segments of the right size kept for recycling.
    spares: Vec<PathBuf>,
    /// Bytes read checking damaged headers after the end of the log.
    bytes_read: u64,
    /// The newest used segment and the offset where the log ends in it,
    /// when new writes continue there (see [`Recovered::resume`]).
    resume: Option<(u64, u64)>,
}

/// Phase: ready the directory for new writes. No used segment may follow
/// the end of the log; damaged headers may not hide newer flushes; unused
/// segments become the segment for new writes or spares, the rest is
/// removed (rows `UsedSegmentAfterUnused`, `DamageBeforeData`,
/// `UnusedSegmentReused`, `SegmentRecycled`, `UnusedSegmentRemoved`).
async fn prepare_for_writes<D: Disk>(
    disk: &D,
    paths: &ShardPaths,
    config: RecoveryConfig,
    segments: &[Segment<D>],
    max_seq: u64,
    replay: &ReplayPhase,
    cases: &mut Vec<RecoveryCase>,
) -> Result<WritePosition, EngineError> {
    let (mut remove, spares, bytes_read) =
        sort_segments_after_end(config.shard, segments, replay, cases).await?;
    if let Some((i, from, to)) = replay.window {
        // Before anything new is written: the window's LSNs are reused.
        erase_window(&segments[i].file, &segments[i].path, from, to).await?;
    }
    // The segment for new writes: an unused one of the right size after
    // every used one, else a spare renamed into place, else a new one.
    let max_used_seq = replay.used.last().map_or(0, |&u| segments[u].seq);
    let fits = |j: &usize| segments[*j].len == config.segment_bytes;
    let mut kept_spares = Vec::new();
    let mut next: Option<(u64, bool)> = None;
    for j in spares {
        if !fits(&j) {
            remove.push(j);
            continue;
        }
        let recycled = !matches!(segments[j].header, HeaderState::Unused { recycled: false });
        if next.is_none() && segments[j].seq > max_used_seq && segments[j].used().is_none() {
            next = Some((segments[j].seq, recycled));
            cases.push(RecoveryCase::UnusedSegmentReused);
        } else {
            if segments[j].used().is_some() {
                // A torn first flush left a used header: prepare it.
                prepare_segment(
                    &segments[j].file,
                    &segments[j].path,
                    config.shard,
                    config.segment_bytes,
                    config.dir_id,
                )
                .await?;
            }
            kept_spares.push(segments[j].path.clone());
            cases.push(RecoveryCase::SegmentRecycled);
        }
    }
    for &j in &remove {
        let seg = &segments[j];
        tracing::info!(file = %seg.path.display(), "removing a WAL segment that holds nothing");
        disk.remove_file(&seg.path)
            .await
            .map_err(WalError::io_at("remove", &seg.path, 0))?;
        cases.push(RecoveryCase::UnusedSegmentRemoved);
    }
    if !remove.is_empty() {
        disk.sync_dir(&paths.wal_dir)
            .await
            .map_err(WalError::io_at("fsync directory", &paths.wal_dir, 0))?;
    }
    let (next_segment_seq, next_segment_recycled, next_segment_ready) = match next {
        Some((seq, recycled)) => (seq, recycled, true),
        None => {
            let seq = max_seq + 1;
            match kept_spares.pop() {
                Some(spare) => {
                    recycle_into(disk, paths, &spare, seq).await?;
                    (seq, true, true)
                }
                None => match create_segment(disk, paths, seq, config.segment_bytes).await {
                    Ok(_) => (seq, false, true),
                    Err(e) => {
                        // A full disk must not keep the data from being
                        // read: start without it.
                        tracing::warn!(shard = config.shard, error = %e,
                            "could not create the WAL segment for new writes; starting anyway (reads work, writes fail until it can be made)");
                        (seq, false, false)
                    }
                },
            }
        }
    };
    Ok(WritePosition {
        next_segment_seq,
        next_segment_recycled,
        next_segment_ready,
        spares: kept_spares,
        bytes_read,
        resume: resume_position(config, segments, replay),
    })
}

/// Where new writes continue in the newest used segment: right after the
/// last flush of the log (a torn flush or erased window after it is
/// overwritten), when that segment has the configured size and room left.
/// A restart then fills the segment the last run left half empty instead
/// of leaving its free tail on disk. Safe because every flush is read back
/// only through a seal that names its own start offset and LSNs: bytes a
/// new flush does not overwrite can never pass for part of it, and after
/// it they read as the end of the log, as they did before.
fn resume_position<D: Disk>(
    config: RecoveryConfig,
    segments: &[Segment<D>],
    replay: &ReplayPhase,
) -> Option<(u64, u64)> {
    let (i, pos, _) = replay.end.as_ref()?;
    let seg = &segments[*i];
    let header = seg.used()?;
    let newest = replay.used.last() == Some(i);
    let sized = seg.len == config.segment_bytes && header.segment_bytes == config.segment_bytes;
    (newest && sized && *pos > 0 && *pos < config.segment_bytes && replay.last_lsn.is_some())
        .then_some((seg.seq, *pos))
}

/// Sorts the segments against the end of the log: returns the indexes to
/// remove (damaged headers holding nothing), the candidate spares (unused
/// headers, and a used one whose only flush tore), and the bytes read.
async fn sort_segments_after_end<D: Disk>(
    shard: u32,
    segments: &[Segment<D>],
    replay: &ReplayPhase,
    cases: &mut Vec<RecoveryCase>,
) -> Result<(Vec<usize>, Vec<usize>, u64), EngineError> {
    let n = segments.len();
    let after_lsn = replay.after_lsn();
    let (end_index, end_pos) = replay.end.as_ref().map_or((n, 0), |(ei, ep, _)| (*ei, *ep));
    let mut bytes_read = 0u64;
    let mut remove: Vec<usize> = Vec::new();
    let mut spares: Vec<usize> = Vec::new();
    for (j, seg) in segments.iter().enumerate() {
        let after_end = j > end_index || (j == end_index && end_pos == 0 && seg.used().is_none());
        let before_start = j < replay.start;
        match &seg.header {
            HeaderState::Used(_) if after_end => {
                cases.push(RecoveryCase::UsedSegmentAfterUnused);
                return Err(corrupt(
                    &segments[end_index.min(n - 1)].path,
                    end_pos,
                    Damage::UsedSegmentAfterUnused {
                        file: seg.path.clone(),
                    },
                ));
            }
            HeaderState::Used(_) => {
                // Part of the log, or skipped below the snapshot.
                if j == end_index && end_pos == 0 {
                    // Its first flush is torn: it holds nothing valid.
                    spares.push(j);
                }
            }
            HeaderState::Damaged(_) if after_end || before_start => {
                if after_end {
                    let mut win = FileWindow::new(&seg.file, &seg.path)
                        .await
                        .map_err(WalError::io_at("stat", &seg.path, 0))?;
                    let tail = scan_tail(
                        &mut win,
                        0,
                        after_lsn,
                        SegmentIdentity {
                            shard,
                            seq: seg.seq,
                        },
                    )
                    .await
                    .map_err(WalError::io_at("read", &seg.path, 0))?;
                    bytes_read += win.bytes_read();
                    if let Some(at) = tail.complete_flush_at {
                        cases.push(RecoveryCase::DamageBeforeData);
                        return Err(corrupt(
                            &seg.path,
                            0,
                            Damage::ValidFlushAfterDamage {
                                file: seg.path.clone(),
                                offset: at,
                            },
                        ));
                    }
                }
                remove.push(j);
            }
            HeaderState::Damaged(d) => {
                // Inside the kept log region: the main scan met it.
                tracing::warn!(file = %seg.path.display(), damage = %d, "damaged segment header");
            }
            HeaderState::Unused { .. } => spares.push(j),
        }
    }
    Ok((remove, spares, bytes_read))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The "shard recovered" line names each case once with its count: its
    /// size does not grow with the number of flushes replayed.
    #[test]
    fn the_cases_summary_is_bounded_whatever_the_wal_held() {
        let mut cases = vec![RecoveryCase::SnapshotLoaded];
        cases.extend(std::iter::repeat_n(RecoveryCase::FlushReplayed, 20_000));
        cases.push(RecoveryCase::Rollover);
        cases.extend(std::iter::repeat_n(RecoveryCase::FlushReplayed, 5));
        cases.push(RecoveryCase::CleanEnd);
        assert_eq!(
            cases_summary(&cases),
            "SnapshotLoaded FlushReplayed×20005 Rollover CleanEnd"
        );
        assert_eq!(cases_summary(&[]), "");
        let all = [
            RecoveryCase::NoWal,
            RecoveryCase::SnapshotLoaded,
            RecoveryCase::DamagedSnapshotSkipped,
            RecoveryCase::NoUsableSnapshot,
            RecoveryCase::SegmentSkipped,
            RecoveryCase::FlushReplayed,
            RecoveryCase::LsnGap,
            RecoveryCase::MissingHistory,
            RecoveryCase::Rollover,
            RecoveryCase::CleanEnd,
            RecoveryCase::TornTail,
            RecoveryCase::TornWindow,
            RecoveryCase::DamageBeforeData,
            RecoveryCase::UsedSegmentAfterUnused,
            RecoveryCase::UnusedSegmentReused,
            RecoveryCase::SegmentRecycled,
            RecoveryCase::UnusedSegmentRemoved,
            RecoveryCase::NoWalForSnapshot,
            RecoveryCase::NewestSegmentMissing,
            RecoveryCase::UnfinishedChain,
            RecoveryCase::ShortSegment,
            RecoveryCase::MarkedRecordsMissing,
        ];
        let many: Vec<RecoveryCase> = all.iter().cycle().take(1_000_000).copied().collect();
        assert!(cases_summary(&many).len() < 1024);
    }
}
