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
        // 1. Wait until there is something to flush (and, in async mode,
        //    until the interval passed or someone asked for a flush).
        loop {
            if wal.is_poisoned() {
                return;
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
                break;
            }
            let wanted = wal.flush_wanted.notified();
            if has_records && settings.durability != Durability::Sync {
                let left = settings.flush_interval.saturating_sub(last_flush.elapsed());
                let _ = compio::time::timeout(left, wanted).await;
            } else {
                wanted.await;
            }
        }
        // 2. Optionally let more records join this group commit.
        let delay = settings.group_commit_max_delay;
        if settings.durability == Durability::Sync && !delay.is_zero() {
            let (_, requested, full) = wal.flush_state();
            if !requested && !full {
                let deadline = Instant::now() + delay;
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    let wanted = wal.flush_wanted.notified();
                    let _ = compio::time::timeout(left, wanted).await;
                    let (_, requested, full) = wal.flush_state();
                    if requested || full {
                        break;
                    }
                }
            }
        }
        // 3. Seal and write.
        let Some(flush) = wal.take_flush() else {
            continue;
        };
        last_flush = Instant::now();
        let path = files.paths.segment(flush.seq);
        let file = match files.file(flush.seq).await {
            Ok(f) => f,
            Err(reason) => {
                wal.poison(
                    "segment creation",
                    &path,
                    flush.offset,
                    &std::io::Error::other(reason),
                );
                return;
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
        let (res, buf) = file.write_at(buf, flush.offset).await;
        if let Err(e) = res {
            wal.poison("write", &path, flush.offset, &e);
            return;
        }
        let sync_started = Instant::now();
        if let Err(e) = file.sync_data().await {
            wal.poison("fdatasync", &path, flush.offset, &e);
            return;
        }
        let sync_us = sync_started.elapsed().as_micros() as u64;
        if flush.starts_segment {
            files.mark_live(flush.seq, flush.first_lsn);
            // The head names this segment before its first records are
            // acknowledged, so losing the segment is detected at recovery.
            let head = files.head.borrow_mut().take();
            if let Some(mut head) = head {
                let advanced = head.advance(flush.seq, flush.first_lsn).await;
                *files.head.borrow_mut() = Some(head);
                if let Err(e) = advanced {
                    let (path, source) = match e {
                        WalError::Io { file, source, .. } => (file, source),
                        other => (path.clone(), std::io::Error::other(other.to_string())),
                    };
                    wal.poison("head update", &path, 0, &source);
                    return;
                }
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
    }
}
