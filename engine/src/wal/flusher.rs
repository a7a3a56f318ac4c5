//! The tasks that move one shard's WAL to disk: the flusher (group
//! commit: take the sealed buffer, one O_DIRECT write, one fdatasync,
//! acknowledge) and the segment creator (keeps the next segment file
//! ready). Each works on the shard's [`Wal`] and its [`SegmentFiles`]
//! only, so it can run, and be tested, without a shard.
//!
//! What must hold: exactly one flush is in flight per shard, so flushes
//! reach the disk in LSN order and only the last one can be torn; a
//! record is acknowledged (sync mode) only after the fdatasync of its
//! flush returned; a failed write or fdatasync poisons the shard and is
//! never retried.

use crate::error::WalError;
use crate::io::{Disk, DiskFile};
use crate::wal::durable::{FlushDone, Wal};
use crate::wal::format::{set_segment_header_flags, BLOCK_BYTES, SEGMENT_FLAG_RECYCLED};
use crate::wal::writer::SealedFlush;
use crate::wal::writer::SegmentFiles;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tunables::Durability;

/// Flusher settings from the config.
#[derive(Debug, Clone, Copy)]
pub struct FlusherSettings {
    pub durability: Durability,
    pub group_commit_max_delay: Duration,
    pub flush_interval: Duration,
}

/// Pause between two attempts to make a segment after one failed.
const CREATE_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// Keeps the segment the open buffer uses and one spare beyond it ready.
/// A failed creation (a full disk) is retried after a pause, at the next
/// rollover, or when the flusher needs the segment.
pub(crate) async fn run_segment_creator<D: Disk>(wal: Rc<Wal>, files: Rc<SegmentFiles<D>>) {
    loop {
        if wal.is_poisoned() {
            return;
        }
        let rolled = wal.segment_rolled.notified();
        let retry = files.retry_wanted.notified();
        // The segment the flusher waits for first; else the open one if it
        // is missing (a start on a full disk); else one spare ahead.
        let open = wal.open_segment_seq();
        let want = match files.needed.get() {
            Some(seq) if !files.has(seq) => Some(seq),
            _ if !files.has(open) => Some(open),
            _ if !files.has(open + 1) => Some(open + 1),
            _ => None,
        };
        let Some(want) = want else {
            // Nothing to make until the appender moves on or the flusher
            // needs something.
            let rolled = std::pin::pin!(rolled);
            let retry = std::pin::pin!(retry);
            futures::future::select(rolled, retry).await;
            continue;
        };
        match files.create_ahead(want).await {
            Some(true) => {
                wal.stats()
                    .segments_recycled
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Some(false) => {
                wal.stats()
                    .segments_created
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            None => {}
        }
        if files.create_failed.borrow().is_some() {
            let rolled = std::pin::pin!(rolled);
            let retry = std::pin::pin!(retry);
            let either = futures::future::select(rolled, retry);
            let _ = compio::time::timeout(CREATE_RETRY_PAUSE, either).await;
        }
    }
}

/// The group-commit loop of one shard: take the open buffer, write it,
/// fdatasync, acknowledge, repeat. Exits only when the shard is poisoned.
pub(crate) async fn run_flusher<D: Disk>(
    wal: Rc<Wal>,
    files: Rc<SegmentFiles<D>>,
    settings: FlusherSettings,
) {
    let mut last_flush = Instant::now();
    loop {
        if !wait_until_due(&wal, &settings, last_flush).await {
            return;
        }
        gather_more(&wal, &settings).await;
        // Seal and write.
        let Some(flush) = wal.take_flush() else {
            continue;
        };
        last_flush = Instant::now();
        if !write_flush(&wal, &files, flush).await {
            return;
        }
    }
}

/// Waits until there is something to flush (and, in async mode, until the
/// interval passed or someone asked for a flush). Returns false once the
/// WAL is poisoned.
async fn wait_until_due(wal: &Wal, settings: &FlusherSettings, last_flush: Instant) -> bool {
    loop {
        if wal.is_poisoned() {
            return false;
        }
        let (has_records, requested, full) = wal.flush_state();
        let due = match settings.durability {
            Durability::Sync => has_records,
            _ => {
                has_records
                    && (requested || full || last_flush.elapsed() >= settings.flush_interval)
            }
        };
        if due {
            return true;
        }
        let wanted = wal.flush_wanted.notified();
        if has_records && settings.durability != Durability::Sync {
            let left = settings.flush_interval.saturating_sub(last_flush.elapsed());
            let _ = compio::time::timeout(left, wanted).await;
        } else {
            wanted.await;
        }
    }
}

/// In `sync`, with a group-commit delay set, lets more records join this
/// flush: until the delay passes, the buffer fills or a flush is asked for.
async fn gather_more(wal: &Wal, settings: &FlusherSettings) {
    let delay = settings.group_commit_max_delay;
    if settings.durability != Durability::Sync || delay.is_zero() {
        return;
    }
    let (_, requested, full) = wal.flush_state();
    if requested || full {
        return;
    }
    let deadline = Instant::now() + delay;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let wanted = wal.flush_wanted.notified();
        let _ = compio::time::timeout(left, wanted).await;
        let (_, requested, full) = wal.flush_state();
        if requested || full {
            return;
        }
    }
}

/// Writes one sealed flush durably, moves the head when the flush starts a
/// segment, and acknowledges it. Returns false when a failure poisoned the
/// WAL.
async fn write_flush<D: Disk>(wal: &Wal, files: &SegmentFiles<D>, flush: SealedFlush) -> bool {
    let path = files.paths.segment(flush.seq);
    let file = match files.file(flush.seq).await {
        Ok(f) => f,
        Err(reason) => {
            let e = std::io::Error::other(reason);
            wal.poison("segment creation", &path, flush.offset, &e);
            return false;
        }
    };
    if flush.starts_segment && flush.seq > 0 {
        files.close_before(flush.seq);
    }
    let mut buf = flush.buf;
    if flush.starts_segment && files.is_recycled(flush.seq) {
        set_segment_header_flags(
            &mut buf.as_mut_slice()[..BLOCK_BYTES],
            SEGMENT_FLAG_RECYCLED,
        );
    }
    let bytes = buf.len() as u64;
    // One durable write (O_DSYNC on the real disk) in place of a write and
    // an fdatasync: every other write to a segment (creation, a recycled
    // segment's prepared header) was synced on its own, so this flush's
    // bytes are all that is not yet durable.
    let sync_started = Instant::now();
    let (res, buf) = file.write_at_durable(buf, flush.offset).await;
    if let Err(e) = res {
        wal.poison("durable write", &path, flush.offset, &e);
        return false;
    }
    let sync_us = sync_started.elapsed().as_micros() as u64;
    if flush.starts_segment {
        files.mark_live(flush.seq, flush.first_lsn);
        // The head names this segment before its first records are
        // acknowledged, so losing the segment is detected at recovery.
        if let Err((path, source)) = advance_head(files, flush.seq, flush.first_lsn, &path).await {
            wal.poison("head update", &path, 0, &source);
            return false;
        }
    }
    wal.flush_complete(FlushDone {
        last_lsn: flush.last_lsn,
        buf,
        bytes,
        records: u64::from(flush.records),
        sync_us,
        live_wal_bytes: files.file_count() as u64 * files.segment_bytes,
    });
    true
}

/// Points the WAL head at segment `seq`, whose first LSN is `first_lsn`.
async fn advance_head<D: Disk>(
    files: &SegmentFiles<D>,
    seq: u64,
    first_lsn: u64,
    path: &std::path::Path,
) -> Result<(), (std::path::PathBuf, std::io::Error)> {
    let head = files.head.borrow_mut().take();
    let Some(mut head) = head else {
        return Ok(());
    };
    let advanced = head.advance(seq, first_lsn).await;
    *files.head.borrow_mut() = Some(head);
    advanced.map_err(|e| match e {
        WalError::Io { file, source, .. } => (file, source),
        other => (path.to_path_buf(), std::io::Error::other(other.to_string())),
    })
}

#[cfg(test)]
mod tests {
    //! The WAL unit alone on the simulated disk: a `Wal`, its segment
    //! files, the flusher and the segment creator, and no shard or tier.

    use super::*;
    use crate::api::{OpError, OpResult};
    use crate::io::sim::{SimDisk, SimFaults};
    use crate::layout::ShardPaths;
    use crate::metrics::ShardStats;
    use crate::wal::durable::{Append, Applied, WriteSet};
    use crate::wal::format::RecordKind;
    use crate::wal::recovery::{recover, Recovered, RecoveryConfig};
    use crate::wal::writer::WalAppender;
    use futures::channel::oneshot;
    use std::path::Path;
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::Arc;

    const SHARD: u32 = 0;
    const RECORD_MAX: usize = 4096;

    struct Rig {
        disk: SimDisk,
        paths: ShardPaths,
        wal: Rc<Wal>,
        stats: Arc<ShardStats>,
    }

    fn config(segment_bytes: u64) -> RecoveryConfig {
        RecoveryConfig {
            shard: SHARD,
            segment_bytes,
        }
    }

    async fn recovered(disk: &SimDisk, paths: &ShardPaths, segment_bytes: u64) -> Recovered {
        recover(disk, paths, config(segment_bytes))
            .await
            .expect("recovery")
    }

    /// Recovers `disk` (fresh or not) and starts the flusher and the
    /// segment creator on what recovery left, as a shard does.
    async fn start(disk: SimDisk, segment_bytes: u64, flush_bytes: usize) -> Rig {
        let paths = ShardPaths::new(Path::new("/flusher"), SHARD as usize);
        for dir in [&paths.wal_dir, &paths.snapshot_dir] {
            disk.create_dir_all(dir).expect("dir");
        }
        let r = recovered(&disk, &paths, segment_bytes).await;
        let files = SegmentFiles::open(
            disk.clone(),
            paths.clone(),
            segment_bytes,
            r.live_segments,
            (r.next_segment_seq, r.next_segment_ready),
            r.next_segment_recycled,
            r.spares,
            (r.head, r.head_found),
        )
        .await
        .expect("segment files");
        let files = Rc::new(files);
        let appender = WalAppender::new(
            SHARD,
            segment_bytes,
            flush_bytes,
            RECORD_MAX,
            r.next_segment_seq,
        );
        let stats = Arc::new(ShardStats::new());
        let wal = Rc::new(Wal::new(
            SHARD as usize,
            r.last_lsn,
            Some(appender),
            stats.clone(),
            u64::MAX,
        ));
        let settings = FlusherSettings {
            durability: Durability::Sync,
            group_commit_max_delay: Duration::ZERO,
            flush_interval: Duration::from_millis(10),
        };
        compio::runtime::spawn(run_flusher(wal.clone(), files.clone(), settings)).detach();
        compio::runtime::spawn(run_segment_creator(wal.clone(), files)).detach();
        Rig {
            disk,
            paths,
            wal,
            stats,
        }
    }

    /// Logs one put and queues its answer for when it is durable.
    fn put(wal: &Wal, key: &[u8], value_len: usize) -> oneshot::Receiver<Vec<OpResult>> {
        let logged = wal.append(RecordKind::Put, key, &vec![9; value_len], None, || 1);
        let Append::Logged { lsn, rolled } = logged else {
            panic!("not logged: {logged:?}");
        };
        wal.appended(1, true, rolled);
        let (tx, rx) = oneshot::channel();
        let applied = Applied {
            results: vec![OpResult::Ok],
            wait_lsn: Some(lsn),
            writes: WriteSet::All,
        };
        wal.complete(applied, tx);
        rx
    }

    async fn answer(rx: oneshot::Receiver<Vec<OpResult>>) -> OpResult {
        let mut results = rx.await.expect("answered");
        assert_eq!(results.len(), 1);
        results.remove(0)
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        compio::runtime::Runtime::new()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn records_logged_together_are_one_flush_and_answered_once_durable() {
        run(async {
            let rig = start(SimDisk::new(11), 1 << 20, 64 << 10).await;
            // Ten batches logged before the flusher runs: one group commit.
            let waiting: Vec<_> = (0..10u8).map(|i| put(&rig.wal, &[i], 100)).collect();
            assert_eq!(
                rig.wal.durable_lsn(),
                0,
                "nothing is durable before the flush"
            );
            for rx in waiting {
                assert_eq!(answer(rx).await, OpResult::Ok);
            }
            assert_eq!(rig.wal.durable_lsn(), 10);
            assert_eq!(
                rig.stats.wal_flushes.load(Relaxed),
                1,
                "one flush for all ten"
            );
            // What was answered is on the durable image: a power loss
            // keeps all ten records.
            rig.disk.crash();
            let r = recovered(&rig.disk, &rig.paths, 1 << 20).await;
            assert_eq!(r.last_lsn, 10);
            assert_eq!(r.records_replayed, 10);
        });
    }

    #[test]
    fn records_logged_during_a_flush_go_in_the_next_one() {
        run(async {
            let disk = SimDisk::new(12);
            let rig = start(disk.clone(), 1 << 20, 64 << 10).await;
            // Slow syncs: the second batch is logged while the first
            // flush is on the device.
            disk.set_faults(SimFaults {
                latency: Some(Duration::from_millis(20)),
                ..SimFaults::default()
            });
            let first = put(&rig.wal, b"a", 100);
            compio::time::sleep(Duration::from_millis(5)).await;
            let second = put(&rig.wal, b"b", 100);
            assert_eq!(answer(first).await, OpResult::Ok);
            assert!(rig.wal.durable_lsn() >= 1);
            assert_eq!(answer(second).await, OpResult::Ok);
            assert_eq!(rig.wal.durable_lsn(), 2);
            assert_eq!(rig.stats.wal_flushes.load(Relaxed), 2);
        });
    }

    #[test]
    fn a_failed_fdatasync_poisons_the_wal_and_is_never_retried() {
        run(async {
            let disk = SimDisk::new(13);
            let rig = start(disk.clone(), 1 << 20, 64 << 10).await;
            assert_eq!(answer(put(&rig.wal, b"kept", 100)).await, OpResult::Ok);
            let syncs_before = disk.stats().syncs;
            disk.set_faults(SimFaults {
                fail_sync_after: Some(0),
                ..SimFaults::default()
            });
            let lost = put(&rig.wal, b"lost", 100);
            assert_eq!(
                answer(lost).await,
                OpResult::Err(OpError::Poisoned {
                    shard: SHARD as usize
                })
            );
            assert!(rig.wal.is_poisoned());
            assert!(rig.stats.poisoned.load(Relaxed));
            // Nothing more is logged, and asking for a flush makes no
            // second attempt at the sync.
            let refused = rig.wal.append(RecordKind::Put, b"after", b"v", None, || 1);
            assert_eq!(refused, Append::Poisoned);
            rig.wal.request_flush();
            compio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(disk.stats().syncs, syncs_before, "the sync was retried");
            assert_eq!(disk.stats().injected_sync_errors, 1);
            assert_eq!(rig.wal.durable_lsn(), 1);
            // The acknowledged record survives a power loss; the one whose
            // sync failed was never acknowledged.
            disk.crash();
            let r = recovered(&disk, &rig.paths, 1 << 20).await;
            assert!(r.last_lsn >= 1);
        });
    }

    #[test]
    fn the_log_rolls_over_segments_and_every_answered_record_recovers() {
        run(async {
            let segment_bytes = 64 << 10;
            let rig = start(SimDisk::new(14), segment_bytes, 16 << 10).await;
            let mut logged = 0u64;
            for round in 0..40u32 {
                let mut waiting = Vec::new();
                for i in 0..4u32 {
                    let key = (round * 4 + i).to_le_bytes();
                    waiting.push(put(&rig.wal, &key, 1000));
                    logged += 1;
                }
                for rx in waiting {
                    assert_eq!(answer(rx).await, OpResult::Ok);
                }
            }
            assert_eq!(rig.wal.durable_lsn(), logged);
            let made = rig.stats.segments_created.load(Relaxed)
                + rig.stats.segments_recycled.load(Relaxed);
            assert!(made >= 2, "160 KB of records made {made} segments ahead");
            assert!(rig.wal.open_segment_seq() >= 3, "the appender moved on");
            rig.disk.crash();
            let r = recovered(&rig.disk, &rig.paths, segment_bytes).await;
            assert_eq!(r.last_lsn, logged);
            assert_eq!(r.records_replayed, logged);
            assert!(r.live_segments.len() >= 3, "{:?}", r.live_segments);
        });
    }
}
