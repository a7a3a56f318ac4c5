//! Checkpoints of one shard: a fuzzy snapshot written one tier partition
//! at a time (the shard keeps serving between partitions), published only
//! after it and every WAL record it may reflect are durable, followed by
//! the removal of snapshots and WAL segments no longer needed.
//!
//! What must hold: a snapshot named `S.snap` reflects every record with an
//! LSN <= S and possibly some records in (S, E]; it is renamed into place
//! only after the WAL is durable through E and the snapshot itself is
//! fdatasync'ed; WAL segments are removed only when every record in them is
//! at or below the LSN of the *older* of the two snapshots kept, so a
//! damaged newest snapshot can always fall back to the older one.

use crate::error::{EngineError, SnapshotError};
use crate::io::{Disk, DiskFile, ALIGN};
use crate::layout::ShardPaths;
use crate::shard::core::ShardCore;
use crate::shard::notify::yield_now;
use crate::snapshot::{self, BlockEncoder, ChunkWriter, SnapshotFile};
use crate::wal::writer::SegmentFiles;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// Snapshots kept on disk (the newest and one older fallback).
pub(crate) const SNAPSHOTS_KEPT: usize = 2;
/// Pause after a failed checkpoint before trying again.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// Checkpoint settings from the config.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CheckpointSettings {
    pub(crate) wal_bytes: u64,
    /// Zero disables time-based checkpoints.
    pub(crate) interval: Duration,
}

/// The checkpoint loop of one shard.
pub(crate) async fn run_checkpointer<D: Disk>(
    core: Rc<ShardCore>,
    files: Rc<SegmentFiles<D>>,
    disk: D,
    paths: ShardPaths,
    settings: CheckpointSettings,
    mut snapshots: Vec<SnapshotFile>,
) {
    let mut last_checkpoint = Instant::now();
    loop {
        if core.is_poisoned() {
            return;
        }
        let (bytes, writes) = core.since_checkpoint();
        let by_bytes = bytes >= core.checkpoint_threshold().max(settings.wal_bytes);
        let by_time = !settings.interval.is_zero()
            && writes > 0
            && last_checkpoint.elapsed() >= settings.interval;
        if !(by_bytes || by_time) {
            let wanted = core.checkpoint_wanted.notified();
            if settings.interval.is_zero() {
                wanted.await;
            } else {
                let left = settings
                    .interval
                    .saturating_sub(last_checkpoint.elapsed())
                    .max(Duration::from_millis(1));
                let _ = compio::time::timeout(left, wanted).await;
            }
            continue;
        }
        last_checkpoint = Instant::now();
        match checkpoint(&core, &files, &disk, &paths, &mut snapshots).await {
            Ok(_) => {}
            Err(e) => {
                core.stats.checkpoint_failures.fetch_add(1, Relaxed);
                if core.is_poisoned() {
                    return;
                }
                tracing::warn!(shard = paths.shard, error = %e, "checkpoint failed; will retry");
                compio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

/// Takes one checkpoint now. Returns the snapshot written, or `None` if
/// nothing was logged since the last one.
pub(crate) async fn checkpoint<D: Disk>(
    core: &ShardCore,
    files: &SegmentFiles<D>,
    disk: &D,
    paths: &ShardPaths,
    snapshots: &mut Vec<SnapshotFile>,
) -> Result<Option<SnapshotFile>, EngineError> {
    let started = Instant::now();
    // A transaction part logged but not applied yet is not in the tier: the
    // snapshot must not claim its LSN (replay from below it is idempotent).
    let lsn = match core.txn.checkpoint_lsn_max() {
        Some(max) => core.last_lsn().min(max),
        None => core.last_lsn(),
    };
    if lsn == 0 || snapshots.last().is_some_and(|s| s.lsn >= lsn) {
        core.checkpoint_started();
        return Ok(None);
    }
    core.checkpoint_started();
    core.with_tier_mut(|t| t.checkpoint_begin());
    let shard = paths.shard as u32;
    let tmp = paths.snapshot_tmp(lsn);
    let io = |op: &'static str, file: &std::path::Path| {
        let file = file.to_path_buf();
        move |source| SnapshotError::Io {
            op,
            file,
            offset: 0,
            source,
        }
    };
    let file = disk.open(&tmp, true).await.map_err(io("create", &tmp))?;
    file.set_len(0).await.map_err(io("truncate", &tmp))?;
    let result = async {
        let mut writer = ChunkWriter::new(&file, &tmp);
        let mut header = vec![0u8; ALIGN];
        snapshot::encode_header(shard, lsn, core.clock.current(), &mut header);
        writer.write(&header).await?;
        let mut encoder = BlockEncoder::new();
        let mut staged = Vec::new();
        let partitions = core.with_tier(|t| t.partition_count());
        for p in 0..partitions {
            // One partition is copied in one synchronous step, then written
            // while the shard goes on serving.
            core.with_tier(|t| {
                t.visit_checkpoint_partition(p, &mut |k, v, at| encoder.add(k, v, at, &mut staged));
            });
            encoder.finish_block(&mut staged);
            if !staged.is_empty() {
                writer.write(&staged).await?;
                staged.clear();
            }
            yield_now().await;
        }
        // A tier with files of its own makes what the copied entries
        // point at durable, and adds its last entries.
        core.with_tier_mut(|t| {
            t.checkpoint_finish(&mut |k, v, at| encoder.add(k, v, at, &mut staged))
        })
        .map_err(|reason| SnapshotError::Tier { reason })?;
        encoder.finish_block(&mut staged);
        if !staged.is_empty() {
            writer.write(&staged).await?;
            staged.clear();
        }
        let end_lsn = core.last_lsn();
        // Every value in the snapshot must come from a durable record.
        core.wait_durable(end_lsn)
            .await
            .map_err(|()| SnapshotError::Aborted)?;
        staged.extend_from_slice(&encoder.trailer(end_lsn, core.clock.current()));
        writer.write(&staged).await?;
        let file_bytes = writer.finish().await?;
        file.sync_data().await.map_err(io("fdatasync", &tmp))?;
        Ok::<(u64, u64), SnapshotError>((encoder.entries(), file_bytes))
    }
    .await;
    drop(file);
    let (entries, file_bytes) = match result {
        Ok(n) => n,
        Err(e) => {
            let _ = disk.remove_file(&tmp).await;
            return Err(e.into());
        }
    };
    let path = paths.snapshot(lsn);
    disk.rename(&tmp, &path).await.map_err(io("rename", &tmp))?;
    disk.sync_dir(&paths.snapshot_dir)
        .await
        .map_err(io("fsync directory", &paths.snapshot_dir))?;
    let snap = SnapshotFile { lsn, path };
    snapshots.push(snap.clone());

    // Retention: keep the newest SNAPSHOTS_KEPT; the WAL reaches back to
    // the oldest kept one.
    let mut removed = false;
    while snapshots.len() > SNAPSHOTS_KEPT {
        let old = snapshots.remove(0);
        disk.remove_file(&old.path)
            .await
            .map_err(io("remove", &old.path))?;
        removed = true;
    }
    if removed {
        disk.sync_dir(&paths.snapshot_dir)
            .await
            .map_err(io("fsync directory", &paths.snapshot_dir))?;
    }
    core.txn.publish_floor(snapshots[0].lsn);
    // Segments with parts of multi-shard transactions stay until every
    // participant's kept snapshots cover its own part.
    let keep_from = match core.txn.retain_from() {
        Some(lsn) => snapshots[0].lsn.min(lsn.saturating_sub(1)),
        None => snapshots[0].lsn,
    };
    // Keep enough spares for the WAL the next checkpoint interval writes.
    let pool_max = (core.checkpoint_threshold() / files.segment_bytes()) as usize + 1;
    let segments_removed = files.remove_covered(keep_from, pool_max).await?;
    core.with_tier_mut(|t| t.checkpoint_published());
    let elapsed = started.elapsed();
    core.checkpoint_written(file_bytes);
    let s = &core.stats;
    s.checkpoints.fetch_add(1, Relaxed);
    s.checkpoint_last_duration_us
        .store(elapsed.as_micros() as u64, Relaxed);
    s.checkpoint_last_lsn.store(lsn, Relaxed);
    tracing::debug!(
        shard = paths.shard,
        lsn,
        entries,
        segments_removed,
        duration_ms = elapsed.as_millis() as u64,
        "checkpoint written"
    );
    Ok(Some(snap))
}
