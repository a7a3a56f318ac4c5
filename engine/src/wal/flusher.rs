//! The tasks that move one shard's WAL to disk: the flusher (group
//! commit: take the sealed buffer, one O_DIRECT write, one fdatasync,
//! acknowledge) and the segment creator (keeps the next segment file
//! ready). Each works on the shard's [`Wal`] and its [`SegmentFiles`]
//! only, so it can run, and be tested, without a shard.
//!
//! What must hold: at most `storage.wal_flushes_in_flight` flushes are on
//! the device at once, each sealed with the LSNs in flight before it; a
//! segment's first flush is in flight alone; a record is acknowledged
//! (sync mode) only after the durable write of its flush and of every
//! flush before it returned; a failed write poisons the shard, is never
//! retried, and nothing after the durable prefix is acknowledged
//! (`docs/wal.md`, "Several flushes in flight").

use crate::error::WalError;
use crate::io::{Disk, DiskFile};
use crate::notify::Notify;
use crate::wal::durable::{FlushDone, Wal};
use crate::wal::format::{set_segment_header_flags, BLOCK_BYTES, SEGMENT_FLAG_RECYCLED};
use crate::wal::writer::SealedFlush;
use crate::wal::writer::SegmentFiles;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tunables::Durability;

/// Flusher settings from the config.
#[derive(Debug, Clone, Copy)]
pub struct FlusherSettings {
    pub durability: Durability,
    pub group_commit_max_delay: Duration,
    pub flush_interval: Duration,
    /// Most flushes on the device at once (`storage.wal_flushes_in_flight`).
    pub flushes_in_flight: usize,
    /// How often the durable mark is written while records become durable
    /// (`storage.wal_mark_interval`).
    pub mark_interval: Duration,
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

/// The flushes a shard has on the device, oldest first, and the wake-up
/// its flusher waits on when one returns. Each flush's outcome lands in
/// its slot when its write returns, in any order; the flusher retires
/// them in submission (LSN) order.
#[derive(Default)]
struct InFlight {
    flushes: RefCell<VecDeque<Slot>>,
    returned: Notify,
    /// A durable mark is being written into the head (beside the flushes:
    /// it must not hold them up, or `async` writes would wait unflushed
    /// behind it). A segment's first flush, which moves the head too,
    /// waits for it.
    marking: Cell<bool>,
}

/// One flush on the device.
struct Slot {
    starts_segment: bool,
    outcome: Rc<RefCell<Option<Outcome>>>,
}

/// How a flush's write (and, for a segment's first flush, the head
/// update) ended.
type Outcome = Result<FlushDone, Failure>;

/// A failed flush: what failed, where, and the error.
struct Failure {
    what: &'static str,
    path: PathBuf,
    offset: u64,
    error: std::io::Error,
}

impl InFlight {
    /// Whether another flush may go to the device now: fewer than
    /// `flushes_max` are out, none has failed, none starts a segment, and
    /// if the next one starts a segment nothing else is out (a segment's
    /// first flush is in flight alone, `docs/wal.md`).
    fn may_submit(&self, wal: &Wal, flushes_max: usize) -> bool {
        let flushes = self.flushes.borrow();
        let failed = flushes
            .iter()
            .any(|f| matches!(*f.outcome.borrow(), Some(Err(_))));
        // A segment's first flush goes alone: nothing else in flight, and
        // no durable mark being written (both move the head).
        let alone = flushes.is_empty() && !self.marking.get();
        let starts_segment = wal.next_flush_starts_segment();
        flushes.len() < flushes_max
            && !failed
            && !flushes.iter().any(|f| f.starts_segment)
            && (alone || !starts_segment)
    }

    /// Acknowledges the returned flushes at the front, oldest first: the
    /// durable LSN moves over the contiguous prefix only. A failed flush
    /// there poisons the WAL (nothing after it is acknowledged, even if it
    /// returned). Returns false once the WAL is poisoned.
    fn retire(&self, wal: &Wal) -> bool {
        loop {
            let outcome = {
                let mut flushes = self.flushes.borrow_mut();
                let Some(front) = flushes.front() else {
                    return !wal.is_poisoned();
                };
                if front.outcome.borrow().is_none() {
                    return !wal.is_poisoned();
                }
                let slot = flushes.pop_front().expect("a front slot");
                let outcome = slot.outcome.borrow_mut().take();
                outcome.expect("a returned flush")
            };
            if wal.is_poisoned() {
                return false;
            }
            match outcome {
                Ok(done) => wal.flush_complete(done),
                Err(f) => {
                    wal.poison(f.what, &f.path, f.offset, &f.error);
                    return false;
                }
            }
        }
    }
}

/// The group-commit loop of one shard: take the open buffer, write it,
/// acknowledge once it and every flush before it returned, repeat, with up
/// to `flushes_in_flight` flushes on the device at once. Exits only when
/// the shard is poisoned.
pub(crate) async fn run_flusher<D: Disk>(
    wal: Rc<Wal>,
    files: Rc<SegmentFiles<D>>,
    settings: FlusherSettings,
) {
    let flushes_max = settings.flushes_in_flight.max(1);
    let in_flight = Rc::new(InFlight::default());
    let mut last_flush = Instant::now();
    let mut last_mark = Instant::now();
    if let Some(head) = files.head.borrow().as_ref() {
        wal.set_marked(head.state().marked_lsn);
    }
    loop {
        let wanted = wal.flush_wanted.notified();
        let returned = in_flight.returned.notified();
        if !in_flight.retire(&wal) {
            return;
        }
        // The durable mark vouches for everything durable so far: started
        // once per `mark_interval` while records become durable (it runs
        // beside the flushes, never holding them up), and at once when a
        // clean stop asks for it.
        let mark_pending = !in_flight.marking.get() && wal.durable_lsn() > wal.marked_lsn();
        let mark_left = settings.mark_interval.saturating_sub(last_mark.elapsed());
        if mark_pending && (wal.mark_requested() || mark_left.is_zero()) {
            last_mark = Instant::now();
            start_mark(&wal, &files, &in_flight);
            continue;
        }
        let due = if in_flight.may_submit(&wal, flushes_max) {
            due(&wal, &settings, last_flush)
        } else {
            Due::AfterReturn
        };
        let (wanted, returned) = (std::pin::pin!(wanted), std::pin::pin!(returned));
        match due {
            Due::Now => {}
            Due::AfterReturn => {
                returned.await;
                continue;
            }
            Due::WhenWanted if mark_pending => {
                // Idle with a mark to write: wake when it is due.
                let either = futures::future::select(wanted, returned);
                let _ = compio::time::timeout(mark_left, either).await;
                continue;
            }
            Due::WhenWanted => {
                futures::future::select(wanted, returned).await;
                continue;
            }
            Due::After(left) => {
                let either = futures::future::select(wanted, returned);
                let _ = compio::time::timeout(left, either).await;
                continue;
            }
        }
        gather_more(&wal, &settings, &in_flight).await;
        if !in_flight.may_submit(&wal, flushes_max) {
            continue;
        }
        // Seal and write.
        let Some(flush) = wal.take_flush() else {
            continue;
        };
        last_flush = Instant::now();
        let outcome = Rc::new(RefCell::new(None));
        in_flight.flushes.borrow_mut().push_back(Slot {
            starts_segment: flush.starts_segment,
            outcome: outcome.clone(),
        });
        let write = write_flush(files.clone(), flush, outcome, in_flight.clone());
        if flushes_max == 1 {
            // One at a time: no task to spawn.
            write.await;
        } else {
            compio::runtime::spawn(write).detach();
        }
    }
}

/// When the flusher should submit the open buffer.
enum Due {
    Now,
    /// In `async` mode: once this much time passed (or earlier if asked).
    After(Duration),
    /// When records arrive or a flush is asked for.
    WhenWanted,
    /// No flush may go out until one in flight returns.
    AfterReturn,
}

/// Whether the open buffer is due (in `async` mode, once the interval
/// passed or someone asked for a flush).
fn due(wal: &Wal, settings: &FlusherSettings, last_flush: Instant) -> Due {
    let (has_records, requested, full) = wal.flush_state();
    if !has_records {
        return Due::WhenWanted;
    }
    if settings.durability == Durability::Sync || requested || full {
        return Due::Now;
    }
    let left = settings.flush_interval.saturating_sub(last_flush.elapsed());
    if left.is_zero() {
        Due::Now
    } else {
        Due::After(left)
    }
}

/// In `sync`, with a group-commit delay set, lets more records join this
/// flush: until the delay passes, the buffer fills or a flush is asked for.
/// Flushes returning meanwhile are acknowledged at once.
async fn gather_more(wal: &Wal, settings: &FlusherSettings, in_flight: &InFlight) {
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
        let wanted = std::pin::pin!(wal.flush_wanted.notified());
        let returned = std::pin::pin!(in_flight.returned.notified());
        let either = futures::future::select(wanted, returned);
        let _ = compio::time::timeout(left, either).await;
        if !in_flight.retire(wal) {
            return;
        }
        let (_, requested, full) = wal.flush_state();
        if requested || full {
            return;
        }
    }
}

/// Writes one sealed flush durably and, when it starts a segment, moves
/// the head; leaves the outcome in its slot and wakes the flusher.
async fn write_flush<D: Disk>(
    files: Rc<SegmentFiles<D>>,
    flush: SealedFlush,
    slot: Rc<RefCell<Option<Outcome>>>,
    in_flight: Rc<InFlight>,
) {
    let outcome = write_flush_bytes(&files, flush).await;
    *slot.borrow_mut() = Some(outcome);
    in_flight.returned.notify();
}

/// The write of [`write_flush`]: the flush's bytes in one durable write,
/// then, for a segment's first flush, the head update.
async fn write_flush_bytes<D: Disk>(files: &SegmentFiles<D>, flush: SealedFlush) -> Outcome {
    let path = files.paths.segment(flush.seq);
    let fail = |what, offset, error| Failure {
        what,
        path: path.clone(),
        offset,
        error,
    };
    let file = match files.file(flush.seq).await {
        Ok(f) => f,
        Err(reason) => {
            let e = std::io::Error::other(reason);
            return Err(fail("segment creation", flush.offset, e));
        }
    };
    if flush.starts_segment && flush.seq > 0 {
        // Alone in flight: every older segment's flushes returned.
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
        return Err(fail("durable write", flush.offset, e));
    }
    let sync_us = sync_started.elapsed().as_micros() as u64;
    if flush.starts_segment {
        files.mark_live(flush.seq, flush.first_lsn);
        // The head names this segment before its first records are
        // acknowledged, so losing the segment is detected at recovery.
        if let Err((path, source)) = advance_head(files, flush.seq, flush.first_lsn, &path).await {
            return Err(Failure {
                what: "head update",
                path,
                offset: 0,
                error: source,
            });
        }
    }
    Ok(FlushDone {
        last_lsn: flush.last_lsn,
        buf,
        bytes,
        records: u64::from(flush.records),
        sync_us,
        live_wal_bytes: files.file_count() as u64 * files.segment_bytes,
    })
}

/// Starts writing the durable mark in a task of its own; the flusher is
/// woken when it is done (or failed, which poisons the WAL).
fn start_mark<D: Disk>(wal: &Rc<Wal>, files: &Rc<SegmentFiles<D>>, in_flight: &Rc<InFlight>) {
    in_flight.marking.set(true);
    let (wal, files, in_flight) = (wal.clone(), files.clone(), in_flight.clone());
    compio::runtime::spawn(async move {
        write_mark(&wal, &files).await;
        in_flight.marking.set(false);
        in_flight.returned.notify();
    })
    .detach();
}

/// Writes the durable mark through the WAL's durable LSN into the head
/// (`docs/wal.md`, "The durable mark"). A failed write poisons the shard,
/// as a failed flush does: the device lost a write it was asked to make
/// durable. Returns false then.
async fn write_mark<D: Disk>(wal: &Wal, files: &SegmentFiles<D>) -> bool {
    let lsn = wal.durable_lsn();
    let head = files.head.borrow_mut().take();
    let Some(mut head) = head else {
        // Only the flusher takes the head out, and it is here: nothing to
        // write to means a WAL without files.
        wal.set_marked(lsn);
        return true;
    };
    let written = head.mark(lsn).await;
    *files.head.borrow_mut() = Some(head);
    match written {
        Ok(()) => {
            wal.set_marked(lsn);
            wal.stats()
                .wal_marks
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            true
        }
        Err(e) => {
            let (file, source) = match e {
                WalError::Io { file, source, .. } => (file, source),
                other => (
                    files.paths.dir.join(crate::wal::head::HEAD_FILE),
                    std::io::Error::other(other.to_string()),
                ),
            };
            wal.poison("durable mark", &file, 0, &source);
            false
        }
    }
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
    const DIR_ID: u64 = 0x5eed_0000_0000_0001;

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
            dir_id: DIR_ID,
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
        start_with(disk, segment_bytes, flush_bytes, 1).await
    }

    /// [`start`] with up to `in_flight` flushes on the device at once.
    async fn start_with(
        disk: SimDisk,
        segment_bytes: u64,
        flush_bytes: usize,
        in_flight: usize,
    ) -> Rig {
        start_marking(
            disk,
            segment_bytes,
            flush_bytes,
            in_flight,
            Duration::from_secs(60),
        )
        .await
    }

    /// [`start_with`] writing the durable mark every `mark_interval`.
    async fn start_marking(
        disk: SimDisk,
        segment_bytes: u64,
        flush_bytes: usize,
        in_flight: usize,
        mark_interval: Duration,
    ) -> Rig {
        let paths = ShardPaths::new(Path::new("/flusher"), SHARD as usize);
        for dir in [&paths.wal_dir, &paths.snapshot_dir] {
            disk.create_dir_all(dir).expect("dir");
        }
        let r = recovered(&disk, &paths, segment_bytes).await;
        let files = SegmentFiles::open(
            disk.clone(),
            paths.clone(),
            (segment_bytes, DIR_ID),
            r.live_segments,
            (r.next_segment_seq, r.next_segment_ready),
            (r.next_segment_recycled, None),
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
        )
        .with_dir_id(DIR_ID)
        .with_flushes_in_flight(in_flight);
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
            flushes_in_flight: in_flight,
            mark_interval,
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
        wal.complete(applied, crate::mesh::Reply::Direct(tx));
        rx
    }

    /// [`put`], waiting for buffer space while the open buffer is full.
    async fn put_when_room(
        wal: &Wal,
        key: &[u8],
        value_len: usize,
    ) -> oneshot::Receiver<Vec<OpResult>> {
        loop {
            let freed = wal.space_freed.notified();
            if wal.flush_state().2 {
                wal.request_flush();
                freed.await;
                continue;
            }
            return put(wal, key, value_len);
        }
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

    /// A slow durable mark does not hold up the flushes after it: a write
    /// made while the head's fdatasync is still on the device is answered
    /// before the mark is written (in `async` mode it would otherwise sit
    /// unflushed, past the loss window `flush_interval` promises).
    #[test]
    fn a_slow_durable_mark_does_not_hold_up_flushes() {
        run(async {
            let disk = SimDisk::new(16);
            let rig =
                start_marking(disk.clone(), 1 << 20, 64 << 10, 1, Duration::from_millis(5)).await;
            // Every write to the head is slow (the first flush's head
            // update too, which only delays the first answer).
            disk.set_faults(SimFaults {
                latency: Some(Duration::from_millis(500)),
                path_filter: Some("wal.head".into()),
                ..SimFaults::default()
            });
            assert_eq!(answer(put(&rig.wal, b"first", 100)).await, OpResult::Ok);
            // Past `mark_interval`: the mark (through LSN 1) starts and
            // waits on the head's slow write.
            compio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(answer(put(&rig.wal, b"second", 100)).await, OpResult::Ok);
            assert_eq!(rig.wal.durable_lsn(), 2);
            assert_eq!(
                rig.wal.marked_lsn(),
                0,
                "the second write was answered while the mark was still being written"
            );
            // The mark started before the second write: it lands through
            // LSN 1 first.
            let deadline = Instant::now() + Duration::from_secs(10);
            while rig.wal.marked_lsn() == 0 {
                assert!(Instant::now() < deadline, "the mark never landed");
                compio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(rig.wal.marked_lsn(), 1);
            // The mark then lands, and the next idle spell marks the rest.
            let deadline = Instant::now() + Duration::from_secs(10);
            while rig.wal.marked_lsn() < 2 {
                assert!(Instant::now() < deadline, "marked {}", rig.wal.marked_lsn());
                compio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }

    /// Flush A fails while flush B, submitted after it, is on the device
    /// too (k = 4): B's write lands, but nothing after the durable prefix
    /// is acknowledged, and recovery ends the log before A (B is a torn
    /// in-flight window). With k = 1, B is never written.
    #[test]
    fn a_failed_flush_acknowledges_nothing_after_the_durable_prefix() {
        for in_flight in [1usize, 4] {
            run(async {
                let disk = SimDisk::new(15);
                let rig = start_with(disk.clone(), 1 << 20, 64 << 10, in_flight).await;
                assert_eq!(answer(put(&rig.wal, b"kept", 100)).await, OpResult::Ok);
                let writes_before = disk.stats().writes;
                let segment = rig.paths.segment(1);
                disk.set_faults(SimFaults {
                    latency: Some(Duration::from_millis(200)),
                    fail_write_after: Some(0),
                    path_filter: Some(segment.file_name().unwrap().to_string_lossy().into()),
                    ..SimFaults::default()
                });
                let a = put(&rig.wal, b"a", 100);
                compio::time::sleep(Duration::from_millis(10)).await;
                let b = put(&rig.wal, b"b", 100);
                let poisoned = OpResult::Err(OpError::Poisoned {
                    shard: SHARD as usize,
                });
                assert_eq!(answer(a).await, poisoned, "k = {in_flight}");
                assert_eq!(answer(b).await, poisoned, "k = {in_flight}");
                assert_eq!(rig.wal.durable_lsn(), 1, "k = {in_flight}");
                // Let B's write finish (it is on the device with k > 1).
                compio::time::sleep(Duration::from_millis(500)).await;
                let b_written = disk.stats().writes > writes_before;
                assert_eq!(b_written, in_flight > 1, "k = {in_flight}");
                disk.crash();
                // Recovery opens (B after a hole in A is a torn window, not
                // damage) and keeps what was acknowledged. A failed write
                // may still have landed (and a crash may keep it, or B's
                // sync make it durable): unacknowledged records may be
                // there, B only with k > 1.
                let r = recovered(&disk, &rig.paths, 1 << 20).await;
                let most = if in_flight > 1 { 3 } else { 2 };
                assert!(
                    (1..=most).contains(&r.last_lsn),
                    "k = {in_flight}: last LSN {} {:?}",
                    r.last_lsn,
                    r.cases
                );
            });
        }
    }

    /// k = 4 on a disk whose writes complete in any order and whose crash
    /// keeps any subset of the writes in flight (each whole, lost or
    /// torn): answers come in LSN order, every answered record survives,
    /// and recovery never refuses; over the seeds some crash left a
    /// complete flush after a lost one (row `TornWindow`).
    #[test]
    fn with_flushes_in_flight_a_crash_loses_no_acknowledged_write() {
        use crate::rng::SplitMix64;
        use crate::wal::recovery::RecoveryCase;
        let mut windows = 0;
        for seed in 0..48u64 {
            run(async {
                let disk = SimDisk::new(seed);
                let rig = start_with(disk.clone(), 1 << 20, 16 << 10, 4).await;
                disk.set_faults(SimFaults {
                    latency: Some(Duration::from_micros(200)),
                    latency_jitter: Some(Duration::from_millis(2)),
                    crash_keeps_any_writes: true,
                    ..SimFaults::default()
                });
                let mut rng = SplitMix64::new(seed);
                let mut waiting = Vec::new();
                for _ in 0..20 + rng.below(30) {
                    for _ in 0..1 + rng.below(3) {
                        let lsn = waiting.len() as u64 + 1;
                        waiting.push(put_when_room(&rig.wal, &lsn.to_le_bytes(), 1000).await);
                    }
                    compio::time::sleep(Duration::from_micros(rng.below(600))).await;
                }
                compio::time::sleep(Duration::from_micros(rng.below(3000))).await;
                // What was answered before the power loss, in LSN order.
                let mut answered = 0u64;
                for (i, rx) in waiting.iter_mut().enumerate() {
                    if let Ok(Some(results)) = rx.try_recv() {
                        assert_eq!(results, vec![OpResult::Ok]);
                        assert_eq!(answered, i as u64, "seed {seed}: answers out of order");
                        answered += 1;
                    }
                }
                assert!(rig.wal.durable_lsn() >= answered);
                disk.crash();
                let r = recovered(&disk, &rig.paths, 1 << 20).await;
                assert!(
                    r.last_lsn >= answered,
                    "seed {seed}: answered {answered}, recovered {}: {:?}",
                    r.last_lsn,
                    r.cases
                );
                for lsn in 1..=r.last_lsn {
                    let key = lsn.to_le_bytes();
                    let h = r.tier.table_hasher().hash_key(&key);
                    assert!(
                        r.tier.get(h, &key).is_some(),
                        "seed {seed}: LSN {lsn} missing"
                    );
                }
                if r.cases.contains(&RecoveryCase::TornWindow) {
                    windows += 1;
                }
                let last = r.last_lsn;
                drop(r);
                // Recovering again (after the window was erased) agrees.
                let again = recovered(&disk, &rig.paths, 1 << 20).await;
                assert_eq!(again.last_lsn, last, "seed {seed}");
            });
        }
        assert!(windows > 0, "no crash left a torn in-flight window");
    }
}
