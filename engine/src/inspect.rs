//! Offline, read-only examination of a data directory, for the operator
//! tools `ringkv-server inspect`, `verify` and `repair` (`docs/operations.md`).
//!
//! What must hold: nothing here modifies the directory except
//! [`repair_wal_tail`], and only when asked. Every file is read through
//! the engine's own decoders (segment headers, [`scan_flush`],
//! [`scan_tail`], [`snapshot::load`], the WAL head, the manifest, the
//! hybrid tier's block checks), and the verdict "would the server start"
//! comes from running the engine's real open ([`Engine::open_with_disk`])
//! on an [`OverlayDisk`]: recovery runs exactly as at a start, but what it
//! writes (segment recycling, renamed snapshots, the replayed hybrid
//! segments) stays in memory. So this module and recovery cannot disagree.

mod overlay;

/// Where a data directory keeps its manifest (whether a directory holds
/// ringkv data at all).
pub use crate::manifest::manifest_path;
pub use crate::tier::SegmentDamage;
pub use overlay::{OverlayDisk, OverlayFile};

use crate::engine::Engine;
use crate::error::EngineError;
use crate::io::{Disk, DiskFile};
use crate::layout::{
    foreign_reason, is_foreign, parse_numbered, DirId, ShardPaths, DAMAGED_SUFFIX, SNAPSHOT_SUFFIX,
    TMP_SUFFIX, WAL_SUFFIX,
};
use crate::manifest::{self, Manifest};
use crate::snapshot;
use crate::tier::hybrid::log as value_log;
use crate::wal::chain::{ChainReplay, UnfinishedChain};
use crate::wal::format::{decode_segment_header, BLOCK_BYTES};
use crate::wal::head::{read_head, HeadState};
use crate::wal::reader::{
    replay_flush, scan_flush, scan_tail, FileWindow, FlushScan, SegmentIdentity,
};
use std::fmt;
use std::path::{Path, PathBuf};
use tunables::{Config, Durability};

/// How much to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Headers, names and sizes only (`inspect`).
    Headers,
    /// Every byte of every file, every checksum (`verify`).
    Full,
}

/// One thing found wrong, with the file and byte offset it is at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub offset: Option<u64>,
    pub what: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.offset {
            Some(o) => write!(f, "{} at offset {o}: {}", self.file.display(), self.what),
            None => write!(f, "{}: {}", self.file.display(), self.what),
        }
    }
}

/// What block 0 of a WAL segment says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SegmentState {
    /// Holds records of the log from `first_lsn` on.
    Used { first_lsn: u64 },
    /// All zero, or prepared (recycled and waiting for its first flush).
    Unused { recycled: bool },
    /// The header does not decode.
    Damaged(String),
}

/// How the records of a used segment end (full reads only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SegmentEnd {
    /// Zeroes, stale records of a recycled file, or the segment's end.
    Clean { offset: u64 },
    /// A damaged flush with no complete newer flush after it in this
    /// segment: recovery's `TornTail` (never acknowledged; not replayed)
    /// when it ends the log, its `Rollover` when the next segment
    /// continues the LSNs.
    Torn { offset: u64, reason: String },
    /// A damaged flush followed by a complete flush with newer LSNs:
    /// recovery's `DamageBeforeData` (it refuses to open).
    DamageBeforeData {
        /// Where the damaged flush starts (a block boundary).
        flush_start: u64,
        offset: u64,
        reason: String,
        /// Where the first complete newer flush starts.
        newer_flush_at: u64,
        /// Offset past the last non-zero block of the segment.
        nonzero_end: u64,
    },
}

/// One WAL segment file.
#[derive(Debug, Clone)]
pub struct SegmentReport {
    pub path: PathBuf,
    pub seq: u64,
    pub bytes: u64,
    /// The size a used segment's header says it was created with; a file
    /// shorter than that was cut (no crash makes one).
    pub created_bytes: Option<u64>,
    pub state: SegmentState,
    /// Full reads: the complete flushes read from the segment's start.
    pub flushes: u64,
    /// Full reads: where each of those flushes starts.
    pub flush_offsets: Vec<u64>,
    pub records: u64,
    /// Full reads: the last LSN of the complete flushes (None: none).
    pub last_lsn: Option<u64>,
    /// Full reads: where those flushes end (the next flush would start).
    pub records_end: u64,
    pub end: Option<SegmentEnd>,
    /// Full reads: a broken chunk chain in the segment (the offset of the
    /// flush holding its end record, and what is wrong).
    pub chain_damage: Option<(u64, String)>,
}

/// Full reads: the chunk chains of one shard's log (values larger than a
/// flush, `docs/wal.md`).
#[derive(Debug, Clone, Default)]
pub struct ChunkChains {
    /// Chains read whole (their value is in the log).
    pub whole: u64,
    /// Chains left unfinished and followed by other records (dropped).
    pub abandoned: u64,
    /// The chain the log ends in, unfinished (dropped at recovery: never
    /// acknowledged).
    pub unfinished: Option<UnfinishedChain>,
}

/// One snapshot file.
#[derive(Debug, Clone)]
pub struct SnapshotReport {
    pub path: PathBuf,
    pub lsn: u64,
    pub bytes: u64,
    /// The snapshot a delta builds on (`None`: a full snapshot, or the
    /// header could not be read).
    pub base_lsn: Option<u64>,
    /// Full reads: the entries of the file (counted while checking it).
    pub entries: Option<u64>,
    /// What is wrong with it, if anything.
    pub error: Option<String>,
}

/// One hybrid-tier value segment file.
#[derive(Debug, Clone)]
pub struct ValueSegmentReport {
    pub path: PathBuf,
    pub seq: u64,
    pub bytes: u64,
    /// Full reads: blocks whose checksum held.
    pub blocks_checked: u64,
    /// Full reads: ranges of blocks (indexes) whose checksum failed.
    pub bad_blocks: Vec<std::ops::Range<u64>>,
}

/// One shard's files.
#[derive(Debug, Clone)]
pub struct ShardReport {
    pub shard: u32,
    pub dir: PathBuf,
    /// `None`: no `wal.head` file (a directory older than the head).
    pub head: Option<HeadState>,
    pub segments: Vec<SegmentReport>,
    pub snapshots: Vec<SnapshotReport>,
    /// The newest snapshot's chain, LSNs oldest (the full one) first;
    /// empty without a snapshot or when a base is missing.
    pub chain: Vec<u64>,
    pub values: Vec<ValueSegmentReport>,
    /// Leftovers recovery removes or ignores (`*.tmp`, `*.damaged`).
    pub leftovers: Vec<PathBuf>,
    /// Full reads: the chunk chains of the log.
    pub chunk_chains: ChunkChains,
    /// Full reads, hybrid tier: the value segments the newest snapshot's
    /// table lists that are missing, shorter than it says or hold bad
    /// blocks, with the keys of its index each costs; and the snapshot
    /// counted in. Empty when there is no snapshot to count from.
    pub value_damage: Vec<SegmentDamage>,
    pub value_damage_counted_in: Option<PathBuf>,
}

impl ShardReport {
    /// The LSN range of the log: first LSN of the oldest used segment and
    /// the last LSN read (full reads) or the newest segment's first LSN.
    pub fn lsn_range(&self) -> Option<(u64, u64)> {
        let used = || {
            self.segments.iter().filter_map(|s| match s.state {
                SegmentState::Used { first_lsn } => Some((first_lsn, s.last_lsn)),
                _ => None,
            })
        };
        let (first, _) = used().next()?;
        let last = used().map(|(f, l)| l.unwrap_or(f)).max().unwrap_or(first);
        Some((first, last))
    }
}

/// What recovery says about the directory: the engine's real open, run on
/// an [`OverlayDisk`].
#[derive(Debug, Clone)]
pub struct OpenSummary {
    pub shards: Vec<ShardOpen>,
}

/// One shard after the trial open.
#[derive(Debug, Clone)]
pub struct ShardOpen {
    pub shard: usize,
    pub keys: u64,
    pub last_lsn: u64,
    pub snapshot_entries: u64,
    pub records_replayed: u64,
    /// Hybrid tier: live record bytes / record bytes in its value segments.
    pub live_ratio: Option<f64>,
    /// Hybrid tier: value segments the open found cut short, and the keys
    /// whose values lie past their ends (after the WAL replay: what a
    /// start reports).
    pub damaged_segments: u64,
    pub unreadable_keys: u64,
}

/// Everything found.
#[derive(Debug, Clone)]
pub struct Report {
    pub data_dir: PathBuf,
    pub depth: Depth,
    /// `Err`: the manifest is missing or does not decode (the text says which).
    pub manifest: Result<Manifest, String>,
    pub shards: Vec<ShardReport>,
    pub problems: Vec<Problem>,
}

/// Where the WAL and value files live for `config` (the devices' paths,
/// or the data directory), and the hot device's root if one is set.
fn roots(config: &Config) -> (PathBuf, PathBuf, Option<PathBuf>) {
    let dir_of = |name: &str| {
        config
            .devices
            .get(name)
            .filter(|d| !d.path.as_os_str().is_empty())
            .map_or_else(|| config.storage.data_dir.clone(), |d| d.path.clone())
    };
    let hot = &config.storage.hot_device;
    (
        dir_of(&config.storage.wal_device),
        dir_of(&config.storage.value_device),
        (!hot.is_empty()).then(|| dir_of(hot)),
    )
}

fn problem(file: &Path, offset: Option<u64>, what: impl Into<String>) -> Problem {
    Problem {
        file: file.to_path_buf(),
        offset,
        what: what.into(),
    }
}

/// Examines the data directory of `config` (its `storage.data_dir` and
/// devices) without changing it. `Headers` reads headers, names and sizes;
/// `Full` reads every byte and checks every checksum, the LSN continuity
/// across segments and the snapshot chains.
pub fn examine(config: &Config, depth: Depth) -> Report {
    let disk = OverlayDisk::new();
    let data_dir = config.storage.data_dir.clone();
    let mut problems = Vec::new();
    let manifest_path = manifest::manifest_path(&data_dir);
    let manifest = match pollster::block_on(manifest::load(&disk, &data_dir)) {
        Ok(Some(m)) => Ok(m),
        Ok(None) => {
            problems.push(problem(&manifest_path, None, "no manifest"));
            Err("missing".to_string())
        }
        Err(e) => {
            problems.push(problem(&manifest_path, Some(0), e.to_string()));
            Err(e.to_string())
        }
    };
    let marker = data_dir.join(crate::layout::BACKUP_MARKER);
    if marker.exists() {
        problems.push(problem(
            &marker,
            None,
            format!("an online backup into this directory never finished ({}): the copy is incomplete and no server starts on it", crate::layout::BACKUP_MARKER),
        ));
    }
    let (wal_root, value_root, hot_root) = roots(config);
    // The manifest's identity: every file's is checked against it (0, a
    // manifest of before identities or none at all: nothing to check).
    let dir_id = manifest.as_ref().map_or(0, |m| m.dir_id);
    if let Some(m) = manifest.as_ref().ok().filter(|m| m.dir_id != 0) {
        let check = crate::identity::check_manifest(
            &disk,
            &manifest_path,
            &wal_root,
            m.shard_count,
            m.dir_id,
        );
        if let Err(e) = pollster::block_on(check) {
            problems.push(problem(&manifest_path, None, e.to_string()));
        }
    }
    let shard_count = match &manifest {
        Ok(m) => m.shard_count as usize,
        // Without a manifest, look at the shard folders that exist.
        Err(_) => (0..)
            .take_while(|&s| ShardPaths::new(&wal_root, s).dir.is_dir())
            .count(),
    };
    let mut shards = Vec::new();
    for shard in 0..shard_count {
        let mut paths = ShardPaths::new(&wal_root, shard).with_value_root(&value_root);
        if let Some(root) = &hot_root {
            paths = paths.with_hot_root(root);
        }
        if !paths.dir.is_dir() {
            problems.push(problem(
                &paths.dir,
                None,
                "the manifest names this shard but its folder is missing",
            ));
            continue;
        }
        let mut report =
            pollster::block_on(examine_shard(&disk, &paths, dir_id, depth, &mut problems));
        let hybrid = manifest
            .as_ref()
            .is_ok_and(|m| m.tier == tunables::Tier::Hybrid);
        if depth == Depth::Full && hybrid {
            let counted =
                pollster::block_on(count_value_damage(&disk, config, &paths, dir_id, &report));
            add_value_damage(&mut report, counted, &mut problems);
        }
        shards.push(report);
    }
    // Shard folders beyond the manifest's count.
    if manifest.is_ok() {
        let extra = ShardPaths::new(&wal_root, shard_count).dir;
        if extra.is_dir() {
            problems.push(problem(
                &extra,
                None,
                format!("a shard folder beyond the manifest's {shard_count} shards"),
            ));
        }
    }
    Report {
        data_dir,
        depth,
        manifest,
        shards,
        problems,
    }
}

async fn examine_shard(
    disk: &OverlayDisk,
    paths: &ShardPaths,
    dir_id: DirId,
    depth: Depth,
    problems: &mut Vec<Problem>,
) -> ShardReport {
    let shard = paths.shard as u32;
    let head = match read_head(disk, paths, shard).await {
        Ok(Some(h)) if is_foreign(h.dir_id, dir_id) => {
            let what = foreign_reason(h.dir_id, dir_id);
            problems.push(problem(&paths.dir.join("wal.head"), Some(0), what));
            None
        }
        Ok(h) => h,
        Err(e) => {
            problems.push(problem(&paths.dir.join("wal.head"), Some(0), e.to_string()));
            None
        }
    };
    let mut leftovers = Vec::new();
    let (segments, chunk_chains) =
        examine_segments(disk, (paths, dir_id), depth, problems, &mut leftovers).await;
    check_log(paths, &segments, head, depth, problems);
    let snapshots = examine_snapshots(disk, (paths, dir_id), depth, problems, &mut leftovers).await;
    let chain = newest_chain(&snapshots);
    if let Some(newest) = snapshots.last() {
        if chain.is_empty() && newest.error.is_none() {
            problems.push(problem(
                &newest.path,
                None,
                "a base of this delta snapshot is missing",
            ));
        }
    }
    check_snapshot_coverage(paths, &segments, &snapshots, problems);
    let values = examine_values(disk, (paths, dir_id), depth, problems);
    let report = ShardReport {
        shard,
        dir: paths.dir.clone(),
        head,
        segments,
        snapshots,
        chain,
        values,
        leftovers,
        chunk_chains,
        value_damage: Vec::new(),
        value_damage_counted_in: None,
    };
    if depth == Depth::Full {
        check_mark(&report, problems);
    }
    report
}

async fn examine_segments(
    disk: &OverlayDisk,
    (paths, dir_id): (&ShardPaths, DirId),
    depth: Depth,
    problems: &mut Vec<Problem>,
    leftovers: &mut Vec<PathBuf>,
) -> (Vec<SegmentReport>, ChunkChains) {
    let files = match disk.list_dir(&paths.wal_dir) {
        Ok(f) => f,
        Err(e) => {
            problems.push(problem(&paths.wal_dir, None, format!("cannot list: {e}")));
            return (Vec::new(), ChunkChains::default());
        }
    };
    let mut numbered = Vec::new();
    for path in files {
        match parse_numbered(&path, WAL_SUFFIX) {
            Some(seq) => numbered.push((seq, path)),
            None => leftovers.push(path),
        }
    }
    // In log order, so chunk chains are followed across segments.
    numbered.sort();
    let mut chains = ChainReplay::counting();
    let mut out = Vec::new();
    for (seq, path) in numbered {
        let owner = (paths.shard as u32, dir_id);
        match examine_segment(disk, &path, owner, seq, depth, &mut chains).await {
            Ok(r) => {
                if let Some((offset, why)) = &r.chain_damage {
                    problems.push(problem(&path, Some(*offset), why.clone()));
                }
                out.push(r);
            }
            Err(e) => problems.push(problem(&path, None, format!("cannot read: {e}"))),
        }
    }
    let summary = ChunkChains {
        whole: chains.whole,
        abandoned: chains.abandoned,
        unfinished: chains.unfinished(),
    };
    (out, summary)
}

async fn examine_segment(
    disk: &OverlayDisk,
    path: &Path,
    (shard, dir_id): (u32, DirId),
    seq: u64,
    depth: Depth,
    chains: &mut ChainReplay,
) -> std::io::Result<SegmentReport> {
    let file = disk.open(path, false).await?;
    let mut win = FileWindow::new(&file, path).await?;
    let bytes = win.file_len();
    let block = win.get(0, BLOCK_BYTES).await?;
    let header = decode_segment_header(block);
    let created_bytes = match &header {
        Ok(Some(h)) if !h.is_prepared() => Some(h.segment_bytes),
        _ => None,
    };
    let recycled = matches!(&header, Ok(Some(h)) if h.is_recycled());
    let state = match header {
        Ok(Some(h)) if is_foreign(h.dir_id, dir_id) => {
            SegmentState::Damaged(foreign_reason(h.dir_id, dir_id))
        }
        Ok(None) => SegmentState::Unused { recycled: false },
        Ok(Some(h)) if h.is_prepared() => SegmentState::Unused { recycled: true },
        Ok(Some(h)) if h.shard != shard || h.seq != seq => SegmentState::Damaged(format!(
            "the header names shard {} segment {}, not shard {shard} segment {seq}",
            h.shard, h.seq
        )),
        Ok(Some(h)) => SegmentState::Used {
            first_lsn: h.first_lsn,
        },
        Err(d) => SegmentState::Damaged(d.to_string()),
    };
    let mut report = SegmentReport {
        path: path.to_path_buf(),
        seq,
        bytes,
        created_bytes,
        state,
        flushes: 0,
        flush_offsets: Vec::new(),
        records: 0,
        last_lsn: None,
        records_end: 0,
        end: None,
        chain_damage: None,
    };
    if depth == Depth::Full && matches!(report.state, SegmentState::Used { .. }) {
        let identity = SegmentIdentity { shard, seq };
        walk_flushes(&mut win, identity, recycled, &mut report, chains).await?;
    }
    Ok(report)
}

/// Reads the flushes of a used segment from its start, as recovery does,
/// and classifies how they end.
async fn walk_flushes<F: DiskFile>(
    win: &mut FileWindow<'_, F>,
    identity: SegmentIdentity,
    recycled: bool,
    report: &mut SegmentReport,
    chains: &mut ChainReplay,
) -> std::io::Result<()> {
    let mut pos = 0u64;
    let mut last: Option<u64> = None;
    let mut progress = crate::progress::Progress::new("checking a WAL segment", win.path());
    loop {
        progress.tick(pos, win.file_len(), report.flushes);
        match scan_flush(win, pos, identity).await? {
            FlushScan::Complete(info) if last.is_none_or(|l| info.first_lsn == l + 1) => {
                let mut broken = None;
                replay_flush(win, &info, &mut |r| {
                    if let Err(d) = chains.record(r) {
                        broken.get_or_insert(d);
                    }
                })
                .await?;
                if let Some(d) = broken {
                    report
                        .chain_damage
                        .get_or_insert((info.start, format!("{d} (recovery refuses the log)")));
                }
                report.flushes += 1;
                report.flush_offsets.push(info.start);
                report.records += u64::from(info.records);
                last = Some(info.last_lsn);
                pos = info.end;
            }
            // Zeroes, or a complete flush of older LSNs (stale bytes of a
            // recycled file): the segment's records end here.
            FlushScan::Complete(_) | FlushScan::Zero => {
                report.end = Some(SegmentEnd::Clean { offset: pos });
                break;
            }
            FlushScan::Damaged { offset, reason } => {
                let after = last.unwrap_or(0);
                let next_block = pos + BLOCK_BYTES as u64;
                // A cut file may end inside a block: scan whole blocks only.
                let whole = win.file_len() / BLOCK_BYTES as u64 * BLOCK_BYTES as u64;
                let tail = scan_tail(win, next_block.min(whole), after, identity).await?;
                // A recycled file holds stale bytes of its earlier use
                // after the records: a record there that is not the next
                // LSN is one of them, not a torn write (as recovery reads it).
                let stale = recycled
                    && pos > 0
                    && !crate::wal::recovery::looks_current(win, pos, after + 1).await;
                report.end = Some(match tail.complete_flush_at {
                    Some(at) => SegmentEnd::DamageBeforeData {
                        flush_start: pos,
                        offset,
                        reason: reason.to_string(),
                        newer_flush_at: at,
                        nonzero_end: tail.nonzero_end,
                    },
                    None if stale => SegmentEnd::Clean { offset: pos },
                    None => SegmentEnd::Torn {
                        offset,
                        reason: reason.to_string(),
                    },
                });
                break;
            }
        }
    }
    report.last_lsn = last;
    report.records_end = pos;
    Ok(())
}

/// LSN continuity across segments, the head, and the damage rows.
fn check_log(
    paths: &ShardPaths,
    segments: &[SegmentReport],
    head: Option<HeadState>,
    depth: Depth,
    problems: &mut Vec<Problem>,
) {
    let used: Vec<&SegmentReport> = segments
        .iter()
        .filter(|s| matches!(s.state, SegmentState::Used { .. }))
        .collect();
    for s in segments {
        if let SegmentState::Damaged(why) = &s.state {
            problems.push(problem(&s.path, Some(0), format!("segment header: {why}")));
        }
    }
    if let (Some(first_used), Some(newest)) = (used.first(), used.last()) {
        for s in segments
            .iter()
            .filter(|s| s.seq > first_used.seq && s.seq < newest.seq)
        {
            if !matches!(s.state, SegmentState::Used { .. }) {
                problems.push(problem(
                    &s.path,
                    Some(0),
                    "an unused or damaged segment between used ones: the log has a hole",
                ));
            }
        }
    }
    for pair in used.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let SegmentState::Used { first_lsn: next } = b.state else {
            continue;
        };
        if b.seq != a.seq + 1 && !segments.iter().any(|s| s.seq > a.seq && s.seq < b.seq) {
            problems.push(problem(
                &paths.segment(a.seq + 1),
                None,
                format!(
                    "segment missing: {} is followed by {}",
                    a.path.display(),
                    b.path.display()
                ),
            ));
        }
        if depth == Depth::Full {
            if let Some(last) = a.last_lsn {
                if next != last + 1 {
                    problems.push(problem(&b.path, Some(0), format!(
                        "LSN gap: the previous segment ends at LSN {last}, this one starts at {next}"
                    )));
                }
            }
        } else if let SegmentState::Used { first_lsn } = a.state {
            if next <= first_lsn {
                problems.push(problem(
                    &b.path,
                    Some(0),
                    format!(
                    "starts at LSN {next}, not after the previous segment's first LSN {first_lsn}"
                ),
                ));
            }
        }
    }
    for s in &used {
        if let Some(created) = s.created_bytes.filter(|&c| s.bytes < c) {
            problems.push(problem(&s.path, Some(s.bytes), format!(
                "the segment is {} bytes but was created with {created}: cut short, which no crash does \
                 (recovery: ShortSegment, refuses to open{})",
                s.bytes,
                if Some(s.seq) == used.last().map(|u| u.seq) {
                    "; `ringkv-server repair --truncate-wal-tail` restores its size and gives up what was cut"
                } else {
                    ""
                }
            )));
        }
    }
    let mark = head.map_or(0, |h| h.marked_lsn);
    check_segment_ends(&used, mark, problems);
    check_head(paths, &used, head, problems);
}

/// Full reads: the durable mark in `wal.head` must not be above where the
/// log (or the newest snapshot) ends (recovery's `MarkedRecordsMissing`).
fn check_mark(shard: &ShardReport, problems: &mut Vec<Problem>) {
    let Some(head) = shard.head.filter(|h| h.marked_lsn > 0) else {
        return;
    };
    let end = log_end(shard);
    if head.marked_lsn > end {
        problems.push(problem(
            &shard.dir.join(crate::wal::head::HEAD_FILE),
            None,
            format!(
                "the durable mark says every record through LSN {} was durable, but the log ends at LSN {end}: \
                 {} durable record(s) (LSNs {}..={}) are damaged or gone (recovery: MarkedRecordsMissing, refuses to open; \
                 `ringkv-server repair --truncate-wal-tail` can give them up)",
                head.marked_lsn,
                head.marked_lsn - end,
                end + 1,
                head.marked_lsn
            ),
        ));
    }
}

/// Full reads: the last LSN recovery would reach, the log's or the
/// newest snapshot's, whichever is larger.
fn log_end(shard: &ShardReport) -> u64 {
    let log = shard
        .segments
        .iter()
        .filter(|s| matches!(s.state, SegmentState::Used { .. }))
        .filter_map(|s| s.last_lsn)
        .max()
        .unwrap_or(0);
    log.max(shard.chain.last().copied().unwrap_or(0))
}

/// The damage rows of the used segments' ends: damage before newer data
/// (recovery refuses), and torn flushes (recovery drops them).
fn check_segment_ends(used: &[&SegmentReport], mark: u64, problems: &mut Vec<Problem>) {
    for (i, s) in used.iter().enumerate() {
        let is_last = i + 1 == used.len();
        match &s.end {
            Some(SegmentEnd::DamageBeforeData {
                offset,
                reason,
                newer_flush_at,
                ..
            }) => {
                problems.push(problem(&s.path, Some(*offset), format!(
                    "{reason}; a complete flush with newer LSNs follows at offset {newer_flush_at} \
                     (recovery: DamageBeforeData, refuses to open{})",
                    if is_last { "; `ringkv-server repair --truncate-wal-tail` can drop the damaged flush and everything after it" } else { "" }
                )));
            }
            Some(SegmentEnd::Torn { offset, reason })
                if is_last && mark > s.last_lsn.unwrap_or(0) =>
            {
                problems.push(problem(&s.path, Some(*offset), format!(
                    "damaged flush: {reason}; wal.head's durable mark (LSN {mark}) says it was durable, \
                     so this is damage, not a torn write (recovery: MarkedRecordsMissing, refuses to open)"
                )));
            }
            Some(SegmentEnd::Torn { offset, reason }) => {
                let case = if is_last { "TornTail" } else { "Rollover" };
                problems.push(problem(&s.path, Some(*offset), format!(
                    "torn flush: {reason} (recovery: {case}; the flush was never acknowledged and is not replayed)"
                )));
            }
            _ => {}
        }
    }
}

/// Whether the WAL head names a segment the log holds.
fn check_head(
    paths: &ShardPaths,
    used: &[&SegmentReport],
    head: Option<HeadState>,
    problems: &mut Vec<Problem>,
) {
    if let (Some(h), Some(newest)) = (head, used.last()) {
        if h.seq > newest.seq {
            problems.push(problem(
                &paths.segment(h.seq),
                None,
                format!(
                    "wal.head names segment {} (first LSN {}) but the newest used segment is {} \
                 (recovery: NewestSegmentMissing, refuses to open)",
                    h.seq, h.first_lsn, newest.seq
                ),
            ));
        }
    } else if let Some(h) = head {
        if h.seq > 0 {
            problems.push(problem(
                &paths.segment(h.seq),
                None,
                format!(
                    "wal.head names segment {} but no segment holds records",
                    h.seq
                ),
            ));
        }
    }
}

async fn examine_snapshots(
    disk: &OverlayDisk,
    (paths, dir_id): (&ShardPaths, DirId),
    depth: Depth,
    problems: &mut Vec<Problem>,
    leftovers: &mut Vec<PathBuf>,
) -> Vec<SnapshotReport> {
    let files = match disk.list_dir(&paths.snapshot_dir) {
        Ok(f) => f,
        Err(e) => {
            problems.push(problem(
                &paths.snapshot_dir,
                None,
                format!("cannot list: {e}"),
            ));
            return Vec::new();
        }
    };
    let owner = (paths.shard as u32, dir_id);
    let mut out = Vec::new();
    for path in files {
        let Some(lsn) = parse_numbered(&path, SNAPSHOT_SUFFIX) else {
            let name = path.to_string_lossy();
            if name.ends_with(TMP_SUFFIX) || name.ends_with(DAMAGED_SUFFIX) {
                leftovers.push(path);
            }
            continue;
        };
        let mut report = SnapshotReport {
            path: path.clone(),
            lsn,
            bytes: 0,
            base_lsn: None,
            entries: None,
            error: None,
        };
        let result: Result<(), String> = async {
            let file = disk.open(&path, false).await.map_err(|e| e.to_string())?;
            report.bytes = file.len().await.map_err(|e| e.to_string())?;
            let header = snapshot::read_header(&file, &path, owner)
                .await
                .map_err(|e| e.to_string())?;
            report.base_lsn = header.base_lsn;
            if header.lsn != lsn {
                return Err(format!(
                    "the header covers LSN {}, the name says {lsn}",
                    header.lsn
                ));
            }
            if depth == Depth::Full {
                let meta = snapshot::load(&file, &path, owner, None)
                    .await
                    .map_err(|e| e.to_string())?;
                report.entries = Some(meta.entries);
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            problems.push(problem(&path, snapshot_offset(&e), e.clone()));
            report.error = Some(e);
        }
        out.push(report);
    }
    out.sort_by_key(|s| s.lsn);
    out
}

/// The offset a snapshot error names ("... at offset N ...").
fn snapshot_offset(message: &str) -> Option<u64> {
    let rest = &message[message.find("at offset ")? + "at offset ".len()..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// The chain of the newest snapshot, LSNs oldest first.
fn newest_chain(snapshots: &[SnapshotReport]) -> Vec<u64> {
    let Some(mut cur) = snapshots.last() else {
        return Vec::new();
    };
    let mut chain = vec![cur.lsn];
    while let Some(base) = cur.base_lsn {
        match snapshots.iter().find(|s| s.lsn == base) {
            Some(s) => {
                chain.push(s.lsn);
                cur = s;
            }
            None => return Vec::new(),
        }
    }
    chain.reverse();
    chain
}

/// A snapshot needs the WAL to reach back to it (recovery replays after it).
fn check_snapshot_coverage(
    paths: &ShardPaths,
    segments: &[SegmentReport],
    snapshots: &[SnapshotReport],
    problems: &mut Vec<Problem>,
) {
    let first_used = segments.iter().find_map(|s| match s.state {
        SegmentState::Used { first_lsn } => Some(first_lsn),
        _ => None,
    });
    let newest_valid = snapshots.iter().rev().find(|s| s.error.is_none());
    match (first_used, newest_valid, snapshots.last()) {
        (None, _, Some(s)) => problems.push(problem(&s.path, None, format!(
            "a snapshot exists but no WAL segment holds records (recovery: NoWalForSnapshot) in {}",
            paths.wal_dir.display()
        ))),
        (Some(first), Some(s), _) if first > s.lsn + 1 => problems.push(problem(&s.path, None, format!(
            "the WAL starts at LSN {first}, after this snapshot's LSN {} + 1: records are missing (recovery: MissingHistory)",
            s.lsn
        ))),
        (Some(first), None, Some(s)) if first > 1 => problems.push(problem(&s.path, None, format!(
            "no valid snapshot and the WAL starts at LSN {first}, not 1 (recovery: NoUsableSnapshot)"
        ))),
        _ => {}
    }
}

fn examine_values(
    disk: &OverlayDisk,
    (paths, dir_id): (&ShardPaths, DirId),
    depth: Depth,
    problems: &mut Vec<Problem>,
) -> Vec<ValueSegmentReport> {
    let mut files = Vec::new();
    // The value device's folder and the hot device's, if one is set.
    for dir in std::iter::once(&paths.values_dir).chain(&paths.hot_values_dir) {
        if !dir.is_dir() {
            continue;
        }
        match disk.list_dir(dir) {
            Ok(f) => files.extend(f),
            Err(e) => problems.push(problem(dir, None, format!("cannot list: {e}"))),
        }
    }
    let mut out = Vec::new();
    for path in files {
        let Some(seq) = parse_numbered(&path, ".seg") else {
            continue;
        };
        let mut report = ValueSegmentReport {
            path: path.clone(),
            seq,
            bytes: 0,
            blocks_checked: 0,
            bad_blocks: Vec::new(),
        };
        problems.extend(check_value_segment(
            &path,
            (paths.shard as u32, dir_id),
            depth,
            &mut report,
        ));
        out.push(report);
    }
    out
}

/// Checks one value segment file block by block (only its header for
/// `Headers`), recording its length and its bad blocks in `report`; the
/// problems found, at most three: the header, the first run of bad
/// blocks (with how many there are), a partial block at the end.
fn check_value_segment(
    path: &Path,
    owner: (u32, DirId),
    depth: Depth,
    report: &mut ValueSegmentReport,
) -> Vec<Problem> {
    use std::io::Read;
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return vec![problem(path, None, format!("cannot open: {e}"))],
    };
    report.bytes = file.metadata().map_or(0, |m| m.len());
    let block = value_log::BLOCK;
    let mut buf = vec![0u8; block];
    let mut index = 0u64;
    let mut problems = Vec::new();
    let mut first_bad: Option<Problem> = None;
    let mut progress = crate::progress::Progress::new("checking a value segment", path);
    loop {
        progress.tick(index * block as u64, report.bytes, index);
        let mut filled = 0;
        while filled < block {
            match file.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    problems.push(problem(
                        path,
                        Some(index * block as u64),
                        format!("read failed: {e}"),
                    ));
                    return problems;
                }
            }
        }
        let offset = index * block as u64;
        if filled == 0 {
            break;
        }
        if filled < block {
            problems.push(problem(path, Some(offset), format!(
                "a partial block of {filled} bytes at the end (value segments are written in whole {block}-byte blocks)"
            )));
            break;
        }
        if index == 0 {
            if let Err(why) = value_log::check_header(&buf, owner, report.seq) {
                problems.push(problem(
                    path,
                    Some(0),
                    format!("value segment header: {why}"),
                ));
                return problems;
            }
            report.blocks_checked += 1;
        } else if let Err(e) = value_log::check_blocks(report.seq, index, path, &buf) {
            // Go on: every bad block is recorded (a run of them as one
            // range), so the keys they cost can be counted.
            match report.bad_blocks.last_mut() {
                Some(r) if r.end == index => r.end += 1,
                _ => report.bad_blocks.push(index..index + 1),
            }
            first_bad.get_or_insert_with(|| match e {
                value_log::ReadError::Corrupt { offset, reason, .. } => {
                    problem(path, Some(offset), reason)
                }
                other => problem(path, Some(offset), other.to_string()),
            });
        } else {
            report.blocks_checked += 1;
        }
        index += 1;
        if depth == Depth::Headers {
            break;
        }
    }
    if let Some(mut p) = first_bad {
        let bad: u64 = report.bad_blocks.iter().map(|r| r.end - r.start).sum();
        if bad > 1 {
            p.what += &format!(
                " ({bad} bad blocks in {} run(s) in this file)",
                report.bad_blocks.len()
            );
        }
        problems.insert(0, p);
    }
    problems
}

/// Full reads, hybrid tier: the engine's own count of what the damage to
/// value segments costs. The newest snapshot's chain is loaded into a
/// hybrid tier as recovery loads it (over the overlay: nothing is
/// written), without the WAL replay; the tier then checks its table
/// against what the read of every block found. `Err` says why it could
/// not count (no snapshot, or one that does not load: verify's other
/// findings say why).
async fn count_value_damage(
    disk: &OverlayDisk,
    config: &Config,
    paths: &ShardPaths,
    dir_id: DirId,
    report: &ShardReport,
) -> Result<(PathBuf, Vec<SegmentDamage>), String> {
    use crate::tier::{HotSettings, HybridSettings, HybridTier, Tier};
    let s = &config.storage;
    let settings = HybridSettings {
        shard: paths.shard as u32,
        dir: paths.values_dir.clone(),
        segment_bytes: s.value_segment_size.as_u64(),
        index_keys: s.index_keys,
        cache_bytes: 0,
        gc_garbage_percent: s.gc_garbage_percent,
        read_latency_us: std::sync::Arc::new(crate::histogram::AtomicHistogram::new()),
        hot: paths.hot_values_dir.clone().map(|dir| HotSettings {
            dir,
            bytes: 0,
            promote_reads: u8::try_from(s.hot_promote_reads).unwrap_or(u8::MAX),
        }),
    };
    let hot = settings.hot.is_some();
    let mut tier = HybridTier::in_existing_dir(disk.clone(), settings).with_dir_id(dir_id);
    if hot {
        tier = tier.with_hot_device(disk.clone());
    }
    let mut newest = None;
    for &lsn in &report.chain {
        let Some(snap) = report.snapshots.iter().find(|p| p.lsn == lsn) else {
            return Err(format!("the snapshot of LSN {lsn} is not listed"));
        };
        let file = disk
            .open(&snap.path, false)
            .await
            .map_err(|e| e.to_string())?;
        let tier: &mut dyn Tier = &mut tier;
        snapshot::load(&file, &snap.path, (paths.shard as u32, dir_id), Some(tier))
            .await
            .map_err(|e| e.to_string())?;
        newest = Some(snap.path.clone());
    }
    let newest = newest.ok_or("no snapshot: its index is where keys are counted")?;
    let files = report
        .values
        .iter()
        .map(|v| (v.seq, (v.bytes, v.bad_blocks.clone())))
        .collect();
    Ok((newest, tier.inspect_damage(&files)?))
}

/// The damage [`count_value_damage`] counted, as problems (one per
/// segment, at its first bad byte) and in the shard's report.
fn add_value_damage(
    report: &mut ShardReport,
    counted: Result<(PathBuf, Vec<SegmentDamage>), String>,
    problems: &mut Vec<Problem>,
) {
    let (snapshot, damage) = match counted {
        Ok(c) => c,
        Err(why) => {
            // Only worth saying when there is damage to count.
            if report.values.iter().any(|v| !v.bad_blocks.is_empty()) {
                problems.push(problem(
                    &report.dir,
                    None,
                    format!("the keys that damaged value segments cost were not counted: {why}"),
                ));
            }
            return;
        }
    };
    let name = snapshot.file_name().map_or_else(
        || snapshot.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    for d in &damage {
        let offset = d
            .bad_blocks
            .first()
            .map(|r| r.start * value_log::BLOCK as u64);
        problems.push(problem(&d.file, offset.filter(|_| !d.missing), format!(
            "value segment damaged: it {} (counted in the index of the newest snapshot, {name}, before the WAL replay: keys written again since read fine; the start counts after it)",
            d.loss()
        )));
    }
    report.value_damage = damage;
    report.value_damage_counted_in = Some(snapshot);
}

/// Runs the engine's real open on an [`OverlayDisk`] over the directory of
/// `config` (nothing reaches the real files), then stops it. `Ok` means a
/// server with this config would start on the directory as it is.
pub fn trial_open(config: &Config, disk: OverlayDisk) -> Result<OpenSummary, EngineError> {
    let engine = Engine::open_with_disk(config, disk)?;
    // The hybrid tier's counters (the live ratio) are published by each
    // shard's background task on its first turn, just after the open.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let mut metrics = engine.metrics();
    while config.storage.tier == tunables::Tier::Hybrid
        && metrics.shards.iter().any(|s| s.hybrid.is_none())
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
        metrics = engine.metrics();
    }
    engine.halt();
    Ok(OpenSummary {
        shards: metrics
            .shards
            .iter()
            .map(|s| ShardOpen {
                shard: s.shard,
                keys: s.keys,
                last_lsn: s.current_lsn,
                snapshot_entries: s.recovery_snapshot_entries,
                records_replayed: s.recovery_records_replayed,
                live_ratio: s.hybrid.as_ref().and_then(|h| {
                    (h.record_bytes > 0).then(|| h.live_bytes as f64 / h.record_bytes as f64)
                }),
                damaged_segments: s.hybrid.map_or(0, |h| h.damaged_segments_at_start),
                unreadable_keys: s.hybrid.map_or(0, |h| h.unreadable_keys_at_start),
            })
            .collect(),
    })
}

/// The configuration the offline tools open a directory with: `base` (the
/// operator's config file, or the defaults) with the shard count and tier
/// taken from the manifest, durable writes, and no listeners' concerns.
pub fn config_for(base: &Config, manifest: Option<&Manifest>) -> Config {
    let mut config = base.clone();
    config.shards = 0;
    if config.storage.durability == Durability::None {
        config.storage.durability = Durability::Sync;
    }
    if let Some(m) = manifest {
        config.storage.tier = m.tier;
    }
    // The overlay needs no io_uring; a config that demands it must not make
    // the trial fail where the directory is fine.
    config.io.backend = tunables::Backend::Auto;
    config
}

/// What [`repair_wal_tail`] drops from one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailRepair {
    pub shard: u32,
    pub segment: PathBuf,
    /// Where the zeroed range starts (the damaged flush's block).
    pub offset: u64,
    /// Bytes zeroed: `offset` up to the last non-zero block.
    pub bytes: u64,
    /// Complete flushes (and their records) in the dropped range with
    /// records the newest snapshot does not hold: data that was
    /// acknowledged once and is given up.
    pub flushes: u64,
    pub records: u64,
    /// LSNs of those records, if any.
    pub lsns: Option<(u64, u64)>,
    /// Records in the dropped range that the newest snapshot holds (lost
    /// from the log, not from the data).
    pub covered_records: u64,
    /// Why the flush at `offset` is damaged.
    pub reason: String,
    /// The segment was cut short: the repair grows it back to the size it
    /// was created with (the regrown part reads as zeroes).
    pub grow_to: Option<u64>,
    /// `wal.head`'s durable mark is above where the log ends after the
    /// repair: (the head file, the mark, the LSN it is lowered to).
    pub mark: Option<(PathBuf, u64, u64)>,
}

/// The repairs [`repair_wal_tail`] can make: in each shard whose newest
/// used segment holds damage followed by newer complete flushes
/// (recovery's `DamageBeforeData`), zero the damaged flush and everything
/// after it in that segment. Damage anywhere else is not repaired by a
/// truncation and is returned as `Err` with the reason.
pub fn plan_wal_tail_repair(report: &Report) -> (Vec<TailRepair>, Vec<Problem>) {
    let mut repairs = Vec::new();
    let mut refused = Vec::new();
    for shard in &report.shards {
        let used: Vec<&SegmentReport> = shard
            .segments
            .iter()
            .filter(|s| matches!(s.state, SegmentState::Used { .. }))
            .collect();
        let before = repairs.len();
        plan_cut_segments(shard, &used, &mut repairs, &mut refused);
        if repairs.len() == before {
            plan_damage_before_data(shard, &used, &mut repairs, &mut refused);
        }
        if repairs.len() == before {
            plan_mark_only(shard, &used, &mut repairs);
        }
    }
    (repairs, refused)
}

/// The mark a repair leaves: `None` if `wal.head`'s durable mark is not
/// above `end` (the last LSN the log, or the newest snapshot, holds after
/// the repair).
fn lowered_mark(shard: &ShardReport, end: u64) -> Option<(PathBuf, u64, u64)> {
    let end = end.max(shard.chain.last().copied().unwrap_or(0));
    let mark = shard.head.map_or(0, |h| h.marked_lsn);
    (mark > end).then(|| (shard.dir.join(crate::wal::head::HEAD_FILE), mark, end))
}

/// A used segment cut short: only the shard's newest one can be repaired
/// (it is grown back to its size and the flush the cut tore is zeroed);
/// an older one would leave a hole in the log.
fn plan_cut_segments(
    shard: &ShardReport,
    used: &[&SegmentReport],
    repairs: &mut Vec<TailRepair>,
    refused: &mut Vec<Problem>,
) {
    for (i, s) in used.iter().enumerate() {
        let Some(created) = s.created_bytes.filter(|&c| s.bytes < c) else {
            continue;
        };
        if i + 1 != used.len() {
            refused.push(problem(&s.path, Some(s.bytes), "a segment that is not the shard's newest was cut short: the log after it cannot be trusted; not repaired"));
            continue;
        }
        // Where the complete flushes stop: the cut tore the flush there
        // (or fell after the last one).
        let from = s.records_end;
        let end = s.last_lsn.unwrap_or(0);
        let mark = lowered_mark(shard, end);
        let (records, lsns) = match &mark {
            Some((_, m, e)) => (m - e, Some((e + 1, *m))),
            None => (0, None),
        };
        repairs.push(TailRepair {
            shard: shard.shard,
            segment: s.path.clone(),
            offset: from,
            bytes: s.bytes.saturating_sub(from),
            flushes: 0,
            records,
            lsns,
            covered_records: 0,
            reason: format!(
                "the segment was cut to {} of its {created} bytes; whatever the cut removed after offset {} is gone",
                s.bytes, s.bytes
            ),
            grow_to: Some(created),
            mark,
        });
    }
}

/// The newest segment ends in a damaged flush that the durable mark says
/// was durable: nothing is zeroed (recovery passes a torn flush by
/// itself); the mark is lowered to where the log ends, and the records
/// between are given up.
fn plan_mark_only(shard: &ShardReport, used: &[&SegmentReport], repairs: &mut Vec<TailRepair>) {
    let Some(s) = used.last() else {
        return;
    };
    let end = s.last_lsn.unwrap_or(0);
    let Some(mark) = lowered_mark(shard, end) else {
        return;
    };
    let (offset, reason) = match &s.end {
        Some(SegmentEnd::Torn { offset, reason }) => (*offset, reason.clone()),
        Some(SegmentEnd::Clean { offset }) => (*offset, "the log ends cleanly here".to_string()),
        _ => (0, "the log ends here".to_string()),
    };
    repairs.push(TailRepair {
        shard: shard.shard,
        segment: s.path.clone(),
        offset,
        bytes: 0,
        flushes: 0,
        records: mark.1 - mark.2,
        lsns: Some((mark.2 + 1, mark.1)),
        covered_records: 0,
        reason,
        grow_to: None,
        mark: Some(mark),
    });
}

/// Damage followed by newer complete flushes in the newest segment
/// (recovery's `DamageBeforeData`): zero the damaged flush and all after.
fn plan_damage_before_data(
    shard: &ShardReport,
    used: &[&SegmentReport],
    repairs: &mut Vec<TailRepair>,
    refused: &mut Vec<Problem>,
) {
    {
        for (i, s) in used.iter().enumerate() {
            let Some(SegmentEnd::DamageBeforeData {
                flush_start,
                offset,
                reason,
                nonzero_end,
                ..
            }) = &s.end
            else {
                continue;
            };
            if i + 1 != used.len() {
                refused.push(problem(&s.path, Some(*offset), "damage in a segment that is not the shard's newest: a tail truncation would drop whole later segments; not repaired"));
            } else if *flush_start == 0 {
                refused.push(problem(&s.path, Some(*offset), "the damaged flush is the segment's first (it carries the header the WAL head relies on); not repaired"));
            } else {
                match count_dropped(
                    &s.path,
                    (shard.shard, s.seq),
                    (*flush_start, *nonzero_end),
                    s.last_lsn.unwrap_or(0),
                    shard.chain.last().copied().unwrap_or(0),
                ) {
                    Ok(Dropped {
                        flushes,
                        records,
                        lsns,
                        covered_records,
                    }) => repairs.push(TailRepair {
                        shard: shard.shard,
                        segment: s.path.clone(),
                        offset: *flush_start,
                        bytes: nonzero_end - flush_start,
                        flushes,
                        records,
                        lsns,
                        covered_records,
                        reason: reason.clone(),
                        grow_to: None,
                        mark: lowered_mark(shard, s.last_lsn.unwrap_or(0)),
                    }),
                    Err(e) => refused.push(problem(
                        &s.path,
                        Some(*flush_start),
                        format!("cannot read: {e}"),
                    )),
                }
            }
        }
    }
}

/// What lies in a range a repair drops.
#[derive(Debug, Default)]
struct Dropped {
    flushes: u64,
    records: u64,
    lsns: Option<(u64, u64)>,
    covered_records: u64,
}

/// Complete flushes with LSNs after `after_lsn` at the block boundaries of
/// `[from, to)` (of segment `seq` of `shard`). A record is lost unless the
/// newest snapshot (through `covered_lsn`) holds it; a flush's records
/// have one LSN each, `first_lsn..=last_lsn`.
fn count_dropped(
    path: &Path,
    (shard, seq): (u32, u64),
    (from, to): (u64, u64),
    after_lsn: u64,
    covered_lsn: u64,
) -> std::io::Result<Dropped> {
    let disk = OverlayDisk::new();
    pollster::block_on(async {
        let file = disk.open(path, false).await?;
        let mut win = FileWindow::new(&file, path).await?;
        let identity = SegmentIdentity { shard, seq };
        let mut d = Dropped::default();
        let mut at = from;
        while at < to {
            match scan_flush(&mut win, at, identity).await? {
                FlushScan::Complete(info) if info.first_lsn > after_lsn => {
                    let first = info.first_lsn.max(covered_lsn + 1);
                    let lost = info.last_lsn.saturating_add(1).saturating_sub(first);
                    d.covered_records += u64::from(info.records).saturating_sub(lost);
                    if lost > 0 {
                        d.flushes += 1;
                        d.records += lost;
                        d.lsns = Some(match d.lsns {
                            None => (first, info.last_lsn),
                            Some((a, b)) => (a.min(first), b.max(info.last_lsn)),
                        });
                    }
                    at = info.end;
                }
                _ => at += BLOCK_BYTES as u64,
            }
        }
        Ok(d)
    })
}

/// Makes `repairs` on an [`OverlayDisk`], to try them: zeroes each
/// range, grows a cut segment back, lowers the durable mark.
fn zero_in_overlay(disk: &OverlayDisk, repairs: &[TailRepair]) -> std::io::Result<()> {
    for r in repairs {
        let file = disk.open_blocking(&r.segment, false)?;
        let mut buf = crate::io::AlignedBuf::with_capacity(BLOCK_BYTES);
        buf.set_len(BLOCK_BYTES);
        buf.as_mut_slice().fill(0);
        // The range starts on a block; a cut segment may end inside one.
        let end = r.offset + r.bytes;
        let mut at = r.offset;
        while at < end {
            file.write_at_blocking(&buf, at)?;
            at += BLOCK_BYTES as u64;
        }
        if let Some(len) = r.grow_to {
            pollster::block_on(file.set_len(len))?;
        }
        if let Some((head, _, to)) = &r.mark {
            let bytes = lowered_head(head, r.shard, *to)?;
            let file = disk.open_blocking(head, false)?;
            let mut buf = crate::io::AlignedBuf::with_capacity(bytes.len());
            buf.set_len(bytes.len());
            buf.as_mut_slice().copy_from_slice(&bytes);
            file.write_at_blocking(&buf, 0)?;
        }
    }
    Ok(())
}

/// The head file at `path` with its durable mark lowered to `to`.
fn lowered_head(path: &Path, shard: u32, to: u64) -> std::io::Result<Vec<u8>> {
    let bytes = std::fs::read(path)?;
    crate::wal::head::with_mark_at_most(&bytes, shard, to).ok_or_else(|| {
        std::io::Error::other(format!(
            "{}: neither slot of the WAL head is valid",
            path.display()
        ))
    })
}

/// Makes `repairs` in the real files, each fdatasync'ed: the zeroed
/// ranges, a cut segment grown back, then the lowered durable mark. The
/// mark goes last: a crash before it leaves the old mark, which recovery
/// still refuses, and running the repair again finishes the job.
fn zero_in_files(repairs: &[TailRepair]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    for r in repairs {
        let file = std::fs::OpenOptions::new().write(true).open(&r.segment)?;
        let zeroes = vec![0u8; 1 << 20];
        let mut at = r.offset;
        let end = r.offset + r.bytes;
        while at < end {
            let n = (end - at).min(zeroes.len() as u64) as usize;
            file.write_all_at(&zeroes[..n], at)?;
            at += n as u64;
        }
        if let Some(len) = r.grow_to {
            file.set_len(len)?;
        }
        file.sync_data()?;
        if let Some((head, _, to)) = &r.mark {
            let bytes = lowered_head(head, r.shard, *to)?;
            let file = std::fs::OpenOptions::new().write(true).open(head)?;
            file.write_all_at(&bytes, 0)?;
            file.sync_data()?;
        }
    }
    Ok(())
}

/// Makes the repairs [`plan_wal_tail_repair`] found: first on an
/// [`OverlayDisk`], where the engine must then open (else nothing is
/// written and the error is returned), then in the real segment files
/// (each range written with zeroes and fdatasync'ed). Returns what the
/// engine's open says afterwards.
pub fn repair_wal_tail(
    config: &Config,
    repairs: &[TailRepair],
) -> Result<OpenSummary, RepairError> {
    let overlay = OverlayDisk::new();
    zero_in_overlay(&overlay, repairs).map_err(RepairError::Io)?;
    trial_open(config, overlay).map_err(RepairError::StillRefused)?;
    zero_in_files(repairs).map_err(RepairError::Io)?;
    trial_open(config, OverlayDisk::new()).map_err(RepairError::AfterRepair)
}

/// Why a repair was not made (or not enough).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RepairError {
    #[error("the repair was not written: after it, recovery would still refuse: {0}")]
    StillRefused(EngineError),
    #[error("the repair was written, yet recovery still refuses: {0}")]
    AfterRepair(EngineError),
    #[error("writing the repair failed: {0}")]
    Io(std::io::Error),
}
