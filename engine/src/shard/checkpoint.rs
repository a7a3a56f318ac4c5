//! Checkpoints of one shard: a fuzzy snapshot written one tier partition
//! at a time (the shard keeps serving between partitions), published only
//! after it and every WAL record it may reflect are durable, followed by
//! the removal of snapshots and WAL segments no longer needed.
//!
//! What must hold: a snapshot named `S.snap` reflects every record with an
//! LSN <= S and possibly some records in (S, E]; it is renamed into place
//! only after the WAL is durable through E and the snapshot itself is
//! fdatasync'ed; WAL segments are retired only when every record in them is
//! at or below the LSN of the newest snapshot, and older snapshots only
//! once a newer one is published. Disk use stays within twice the live
//! data plus an allowance (`docs/wal.md`, "Disk bounded by live data").
//!
//! **Deltas.** A snapshot is either full or a delta: what changed since the
//! snapshot it builds on (its base), loaded over that base's own state. A
//! delta is taken only over the newest snapshot, and only if this process
//! published it and no checkpoint failed since: the tier's change marks are
//! cleared as partitions are copied, so they describe the changes since the
//! last *published* copy only then. A start therefore takes a full one
//! first. The files kept are the newest snapshot's chain (a full snapshot
//! and the deltas over it, in order).

use crate::error::IoFailure;
use crate::error::{EngineError, SnapshotError};
use crate::io::{Disk, DiskFile, ALIGN};
use crate::layout::ShardPaths;
use crate::notify::yield_now;
use crate::shard::backup::BackupRequest;
use crate::shard::core::ShardCore;
use crate::snapshot::{
    self, chain_bytes, delta_base, fallback_lsn, full_bytes, retained, BlockEncoder, ChunkWriter,
    SnapshotFile,
};
use crate::wal::writer::SegmentFiles;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// Pause after a failed checkpoint before trying again.
const RETRY_PAUSE: Duration = Duration::from_secs(1);
/// Least time between two checkpoints the tier asks for
/// ([`crate::tier::Tier::checkpoint_wanted`]).
const TIER_CHECKPOINT_GAP: Duration = Duration::from_secs(1);

/// Checkpoint settings from the config.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CheckpointSettings {
    pub(crate) wal_bytes: u64,
    /// Zero disables time-based checkpoints.
    pub(crate) interval: Duration,
    /// Most deltas in a row over one full snapshot; 0: every snapshot is
    /// full.
    pub(crate) deltas_max: u32,
}

/// The WAL bytes after which a checkpoint keeps disk use within twice the
/// live data plus `wal_bytes`: what the kept chain leaves of twice the
/// tier's estimate of a full copy, and never less than `wal_bytes`. `None`
/// when the tier does not estimate its copies.
pub(crate) fn bounded_threshold(
    core: &ShardCore,
    snapshots: &[SnapshotFile],
    wal_bytes: u64,
) -> Option<u64> {
    let e = core.with_tier(|t| t.checkpoint_estimate())?;
    Some(
        e.full_bytes
            .saturating_mul(2)
            .saturating_sub(chain_bytes(snapshots))
            .max(wal_bytes),
    )
}

/// Segment files a shard keeps at most, whatever checkpoints retire: the
/// WAL between two checkpoints (the threshold; it starts inside a segment
/// and is passed by up to a flush, so one segment more than its whole
/// segments), the spare ahead of the open segment, and the segments the
/// WAL started while a recent checkpoint ran (`ran_over`, the most of the
/// last four), up to the allowance's worth (`checkpoint_wal_bytes`). The
/// next checkpoint runs over about as many: a file kept for it is
/// recycled, where a removed one would be zero-filled again through the
/// device the WAL is waiting on (at the device's cap that was a quarter
/// of its bytes and the longest waits; docs/wal.md). The log grows past
/// it only while a checkpoint runs later than the ones before.
pub(crate) fn wal_files_max(core: &ShardCore, segment_bytes: u64, ran_over: usize) -> usize {
    let threshold = core.wal.checkpoint_threshold().div_ceil(segment_bytes) as usize;
    let allowance = core.wal.checkpoint_allowance().div_ceil(segment_bytes) as usize;
    threshold + 3 + ran_over.min(allowance)
}

/// The checkpoint loop of one shard; it also answers an online backup's
/// requests (`crate::shard::backup`).
pub(crate) async fn run_checkpointer<D: Disk>(
    core: Rc<ShardCore>,
    files: Rc<SegmentFiles<D>>,
    disk: D,
    paths: ShardPaths,
    settings: CheckpointSettings,
    snapshots: Vec<SnapshotFile>,
    marks_valid: bool,
) {
    core.backup.open();
    checkpoint_loop(&core, files, disk, paths, settings, snapshots, marks_valid).await;
    core.backup.refuse_all();
}

/// The checkpointer's view of its snapshot chain between checkpoints.
struct ChainState {
    snapshots: Vec<SnapshotFile>,
    /// The tier's change marks count from the last copy of each partition;
    /// they are relative to the newest snapshot only once this process has
    /// published one and no checkpoint failed since.
    marks_valid: bool,
    /// WAL bytes written since the newest full snapshot began, up to the
    /// start of the newest checkpoint.
    chain_wal: u64,
    last_checkpoint: Instant,
}

impl ChainState {
    /// Takes a checkpoint now (a delta when one may be taken) and keeps
    /// the chain's bookkeeping; a failure is counted and invalidates the
    /// change marks.
    async fn take<D: Disk>(
        &mut self,
        core: &ShardCore,
        files: &SegmentFiles<D>,
        disk: &D,
        paths: &ShardPaths,
        deltas_max: u32,
        full: bool,
    ) -> Result<(), EngineError> {
        let (bytes, _) = core.wal.since_checkpoint();
        let base = if full {
            None
        } else {
            self.base(core, deltas_max)
        };
        self.last_checkpoint = Instant::now();
        match checkpoint(core, files, disk, paths, &mut self.snapshots, base).await {
            Ok(written) => {
                if written.is_some() {
                    self.marks_valid = true;
                    self.chain_wal = if base.is_some() {
                        self.chain_wal + bytes
                    } else {
                        0
                    };
                }
                Ok(())
            }
            Err(e) => {
                self.marks_valid = false;
                core.stats.checkpoint_failures.fetch_add(1, Relaxed);
                Err(e)
            }
        }
    }

    /// What the next checkpoint builds on (`None`: a full one). Beyond
    /// the chain's own limits ([`delta_base`]), a tier that estimates its
    /// copies gets a delta only when it writes at most half of a full copy
    /// and keeps the chain within twice the live data: a delta of nearly
    /// everything writes about what a full copy does and leaves both on
    /// disk.
    fn base(&self, core: &ShardCore, deltas_max: u32) -> Option<u64> {
        let base = delta_base(&self.snapshots, self.marks_valid, deltas_max)?;
        let Some(e) = core.with_tier(|t| t.checkpoint_estimate()) else {
            return Some(base);
        };
        let chain = chain_bytes(&self.snapshots);
        let cheap = e.delta_bytes.saturating_mul(2) <= e.full_bytes;
        let fits = chain.saturating_add(e.delta_bytes) <= e.full_bytes.saturating_mul(2);
        (cheap && fits).then_some(base)
    }

    /// The WAL bytes after which the next checkpoint is due.
    ///
    /// With the tier's estimate of a full copy (about the live data L):
    /// the kept chain plus the WAL since it stay within `2 × L` plus the
    /// allowance `wal_bytes`, so the threshold is what the chain leaves of
    /// `2 × L`, and never below the allowance (`docs/wal.md`, "Disk bounded
    /// by live data"). After a full copy that is `max(L, wal_bytes)` of WAL
    /// per checkpoint.
    ///
    /// Without one: a delta costs about what the WAL since the last
    /// checkpoint holds, so it comes every `wal_bytes`; a full snapshot
    /// waits until the WAL written since the last full one began has grown
    /// by its size: a full copy is never taken more often than the log it
    /// replaces is written.
    fn threshold(&self, core: &ShardCore, settings: &CheckpointSettings) -> u64 {
        if let Some(bound) = bounded_threshold(core, &self.snapshots, settings.wal_bytes) {
            return bound;
        }
        match delta_base(&self.snapshots, self.marks_valid, settings.deltas_max) {
            Some(_) => settings.wal_bytes,
            None => full_bytes(&self.snapshots)
                .saturating_sub(self.chain_wal)
                .max(settings.wal_bytes),
        }
    }
}

async fn checkpoint_loop<D: Disk>(
    core: &Rc<ShardCore>,
    files: Rc<SegmentFiles<D>>,
    disk: D,
    paths: ShardPaths,
    settings: CheckpointSettings,
    snapshots: Vec<SnapshotFile>,
    marks_valid: bool,
) {
    let mut chain = ChainState {
        snapshots,
        marks_valid,
        chain_wal: 0,
        last_checkpoint: Instant::now(),
    };
    loop {
        if core.is_poisoned() {
            return;
        }
        if let Some(req) = core.backup.take() {
            // A backup's checkpoint is taken now, unless a backup holds
            // checkpoints (it would retire files being copied).
            let wants = matches!(req, BackupRequest::Checkpoint { .. }) && !core.backup.pinned();
            let result = if wants {
                let taken = chain.take(core, &files, &disk, &paths, settings.deltas_max, false);
                Some(taken.await.map_err(|e| format!("checkpoint failed: {e}")))
            } else {
                None
            };
            crate::shard::backup::handle(core, &files, &paths, &chain.snapshots, req, result).await;
            continue;
        }
        if core.backup.pinned() {
            // Held by a backup: no checkpoint (and so nothing retired)
            // until it lets go.
            core.wal.checkpoint_wanted.notified().await;
            continue;
        }
        let (bytes, writes) = core.wal.since_checkpoint();
        let threshold = chain.threshold(core, &settings);
        // The shard wakes this loop once its WAL passes the threshold.
        core.wal.set_checkpoint_threshold(threshold);
        let by_bytes = bytes >= threshold;
        let by_time = !settings.interval.is_zero()
            && writes > 0
            && chain.last_checkpoint.elapsed() >= settings.interval;
        // The tier's own need (a hot device kept full by emptied
        // segments), at most one checkpoint per TIER_CHECKPOINT_GAP.
        let tier_wants = core.with_tier(|t| t.checkpoint_wanted());
        let tier_wait = TIER_CHECKPOINT_GAP.saturating_sub(chain.last_checkpoint.elapsed());
        let by_tier = tier_wants.is_some() && tier_wait.is_zero();
        if !(by_bytes || by_time || by_tier) {
            let wanted = core.wal.checkpoint_wanted.notified();
            let mut left = (!settings.interval.is_zero()).then(|| {
                settings
                    .interval
                    .saturating_sub(chain.last_checkpoint.elapsed())
            });
            if tier_wants.is_some() {
                left = Some(left.map_or(tier_wait, |l| l.min(tier_wait)));
            }
            match left {
                None => wanted.await,
                Some(left) => {
                    let left = left.max(Duration::from_millis(1));
                    let _ = compio::time::timeout(left, wanted).await;
                }
            }
            continue;
        }
        let full = tier_wants == Some(true);
        if let Err(e) = chain
            .take(core, &files, &disk, &paths, settings.deltas_max, full)
            .await
        {
            if core.is_poisoned() {
                return;
            }
            tracing::warn!(shard = paths.shard, error = %e, "checkpoint failed; will retry");
            compio::time::sleep(RETRY_PAUSE).await;
        }
    }
}

/// Takes one checkpoint now: a delta over the snapshot of LSN `base` (the
/// newest; see [`delta_base`](crate::snapshot::delta_base)), or a full one. Returns the snapshot
/// written, or `None` if nothing was logged since the last one.
pub(crate) async fn checkpoint<D: Disk>(
    core: &ShardCore,
    files: &SegmentFiles<D>,
    disk: &D,
    paths: &ShardPaths,
    snapshots: &mut Vec<SnapshotFile>,
    base: Option<u64>,
) -> Result<Option<SnapshotFile>, EngineError> {
    debug_assert!(base.is_none() || base == snapshots.last().map(|s| s.lsn));
    let started = Instant::now();
    // A transaction part logged but not applied yet is not in the tier: the
    // snapshot must not claim its LSN (replay from below it is idempotent).
    let mut lsn = match core.txn.checkpoint_lsn_max() {
        Some(max) => core.last_lsn().min(max),
        None => core.last_lsn(),
    };
    // Nor may it claim part of a chunk chain: replay starts after the
    // snapshot's LSN and must meet every chain whole.
    if let Some(first) = core.wal.open_chain_first_lsn() {
        lsn = lsn.min(first - 1);
    }
    if lsn == 0 || snapshots.last().is_some_and(|s| s.lsn >= lsn) {
        core.wal.checkpoint_started();
        return Ok(None);
    }
    core.wal.checkpoint_started();
    core.with_tier_mut(|t| t.checkpoint_begin());
    let tmp = paths.snapshot_tmp(lsn);
    let file = disk
        .open(&tmp, true)
        .await
        .map_err(SnapshotError::io("create", &tmp))?;
    file.set_len(0)
        .await
        .map_err(SnapshotError::io("truncate", &tmp))?;
    let owner = (paths.shard as u32, files.dir_id());
    let result = write_snapshot(core, &file, &tmp, owner, lsn, base).await;
    drop(file);
    let (entries, file_bytes) = match result {
        Ok(n) => n,
        Err(e) => {
            let _ = disk.remove_file(&tmp).await;
            return Err(e.into());
        }
    };
    // The module's rule: renamed into place only once the WAL is durable
    // through the snapshot's LSN, and never claiming an unapplied part.
    debug_assert!(
        core.wal.durable_lsn() >= lsn,
        "snapshot {lsn} ahead of the durable WAL"
    );
    debug_assert!(
        core.txn.checkpoint_lsn_max().is_none_or(|max| lsn <= max),
        "snapshot {lsn} claims an unapplied transaction part"
    );
    let path = paths.snapshot(lsn);
    disk.rename(&tmp, &path)
        .await
        .map_err(SnapshotError::io("rename", &tmp))?;
    disk.sync_dir(&paths.snapshot_dir)
        .await
        .map_err(SnapshotError::io("fsync directory", &paths.snapshot_dir))?;
    let snap = SnapshotFile {
        lsn,
        path,
        base_lsn: base,
        bytes: file_bytes,
    };
    snapshots.push(snap.clone());
    let segments_removed = retire_covered(core, files, disk, paths, snapshots).await?;
    core.with_tier_mut(|t| t.checkpoint_published());
    let elapsed = started.elapsed();
    let s = &core.stats;
    s.checkpoints.fetch_add(1, Relaxed);
    s.checkpoint_deltas
        .fetch_add(u64::from(base.is_some()), Relaxed);
    s.checkpoint_bytes.fetch_add(file_bytes, Relaxed);
    s.checkpoint_last_duration_us
        .store(elapsed.as_micros() as u64, Relaxed);
    s.checkpoint_last_lsn.store(lsn, Relaxed);
    tracing::debug!(
        shard = paths.shard,
        lsn,
        delta_over = base,
        entries,
        bytes = file_bytes,
        segments_removed,
        duration_ms = elapsed.as_millis() as u64,
        "checkpoint written"
    );
    Ok(Some(snap))
}

/// Writes the snapshot of LSN `lsn` into `file` (at `tmp`) and makes it
/// durable: the header, the tier's entries one partition at a time (the
/// shard serves between them), the tier's last entries, and the trailer
/// once the WAL is durable through every value copied. Returns the entries
/// and the file's size.
async fn write_snapshot<F: DiskFile>(
    core: &ShardCore,
    file: &F,
    tmp: &std::path::Path,
    owner: (u32, crate::layout::DirId),
    lsn: u64,
    base: Option<u64>,
) -> Result<(u64, u64), SnapshotError> {
    let mut writer = ChunkWriter::new(file, tmp);
    let mut header = vec![0u8; ALIGN];
    snapshot::encode_header(owner, lsn, core.clock.current(), base, &mut header);
    writer.write(&header).await?;
    let mut encoder = BlockEncoder::new();
    let mut staged = Vec::new();
    let partitions = core.with_tier(|t| t.partition_count());
    for p in 0..partitions {
        // One partition is copied in one synchronous step, then written
        // while the shard goes on serving.
        core.with_tier_mut(|t| {
            t.visit_checkpoint_partition(p, base.is_some(), &mut |k, v, at| match v {
                Some(v) => encoder.add(k, v, at, &mut staged),
                None => encoder.add_deleted(k, &mut staged),
            });
        });
        encoder.finish_block(&mut staged);
        if !staged.is_empty() {
            writer.write(&staged).await?;
            release(&mut staged);
        }
        yield_now().await;
    }
    // A tier with files of its own makes what the copied entries point at
    // durable, and adds its last entries.
    core.with_tier_mut(|t| {
        t.checkpoint_finish(&mut |k, v, at| match v {
            Some(v) => encoder.add(k, v, at, &mut staged),
            None => encoder.add_deleted(k, &mut staged),
        })
    })
    .map_err(|reason| SnapshotError::Tier { reason })?;
    encoder.finish_block(&mut staged);
    if !staged.is_empty() {
        writer.write(&staged).await?;
        release(&mut staged);
    }
    let end_lsn = core.last_lsn();
    // Every value in the snapshot must come from a durable record.
    core.wait_durable(end_lsn)
        .await
        .map_err(|()| SnapshotError::Aborted)?;
    staged.extend_from_slice(&encoder.trailer(end_lsn, core.clock.current()));
    writer.write(&staged).await?;
    let file_bytes = writer.finish().await?;
    file.sync_data()
        .await
        .map_err(SnapshotError::io("fdatasync", tmp))?;
    Ok((encoder.entries(), file_bytes))
}

/// Empties the staging buffer once it is written; one that a large value
/// grew is freed, so a checkpoint holds a big value's copy only while that
/// value's partition is being written.
fn release(staged: &mut Vec<u8>) {
    const KEEP_BYTES: usize = 4 << 20;
    if staged.capacity() > KEEP_BYTES {
        *staged = Vec::new();
    } else {
        staged.clear();
    }
}

/// After a new snapshot: removes the snapshots retention no longer keeps
/// (only the newest one's chain stays, and the WAL from its LSN on) and
/// the WAL segments it covers. Returns how many segments went.
async fn retire_covered<D: Disk>(
    core: &ShardCore,
    files: &SegmentFiles<D>,
    disk: &D,
    paths: &ShardPaths,
    snapshots: &mut Vec<SnapshotFile>,
) -> Result<usize, EngineError> {
    let keep = retained(snapshots);
    let (kept, gone): (Vec<_>, Vec<_>) = std::mem::take(snapshots)
        .into_iter()
        .zip(keep)
        .partition(|(_, keep)| *keep);
    *snapshots = kept.into_iter().map(|(s, _)| s).collect();
    let removed = !gone.is_empty();
    for (old, _) in gone {
        disk.remove_file(&old.path)
            .await
            .map_err(SnapshotError::io("remove", &old.path))?;
    }
    if removed {
        disk.sync_dir(&paths.snapshot_dir)
            .await
            .map_err(SnapshotError::io("fsync directory", &paths.snapshot_dir))?;
    }
    core.txn.publish_floor(fallback_lsn(snapshots));
    // Segments with parts of multi-shard transactions stay until every
    // participant's kept snapshots cover its own part.
    let keep_from = match core.txn.retain_from() {
        Some(lsn) => fallback_lsn(snapshots).min(lsn.saturating_sub(1)),
        None => fallback_lsn(snapshots),
    };
    // The WAL's files stay within its allowance: the log one checkpoint
    // interval writes (in whole segments), the open segment and the spare
    // ahead of it, and what the WAL wrote past the snapshot's LSN while
    // this checkpoint ran. Retired segments are recycled up to that, not
    // beyond.
    let ran_over = files
        .live_segments()
        .iter()
        .filter(|s| s.first_lsn > keep_from + 1)
        .count();
    let ran_over = core.wal.checkpoint_ran_over(ran_over);
    let files_max = wal_files_max(core, files.segment_bytes(), ran_over);
    let durable = core.wal.durable_lsn();
    Ok(files.remove_covered(keep_from, durable, files_max).await?)
}
