//! The life of one shard thread: pin to a core, build the runtime, recover,
//! start the WAL tasks (flusher, segment creator, checkpointer) and serve
//! the inbox until shutdown, or stop dead on halt.
//!
//! What must hold: the shard reports ready only after recovery finished and
//! the commit clock saw every recovered version; a graceful stop answers
//! everything queued before it and leaves the WAL durable through the last
//! LSN (or reports the poisoning); a broken invariant in an engine task
//! aborts the process instead of serving on corrupt state.

use crate::error::EngineError;
use crate::io::runtime::{build_runtime, BackendKind};
use crate::io::Disk;
use crate::layout::ShardPaths;
use crate::metrics::ShardStats;
use crate::shard::checkpoint::{checkpoint, run_checkpointer, CheckpointSettings};
use crate::shard::core::{CommitClock, CoreSettings, ShardCore};
use crate::shard::router::{clear_local, set_local, Control, ShardMsg};
use crate::snapshot::SnapshotFile;
use crate::tier::config::{ShardTier, TierSettings};
use crate::tier::Tier as TierStore;
use crate::txn::record::HeldPart;
use crate::wal::flusher::{run_flusher, run_segment_creator, FlusherSettings};
use crate::wal::head::HeadState;
use crate::wal::recovery::{recover_into, Recovered, RecoveryConfig, TierFactory};
use crate::wal::segment::LiveSegment;
use crate::wal::writer::{SegmentFiles, WalAppender};
use futures::FutureExt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tunables::Durability;

/// What a shard answers when it stopped recovering only because another
/// shard failed to: the engine reports the other shard's error instead.
pub(crate) const ANOTHER_SHARD_FAILED: &str = "another shard failed to recover";

/// Per-shard settings taken from the config.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShardSettings {
    pub(crate) durability: Durability,
    pub(crate) segment_bytes: u64,
    pub(crate) group_commit_max_bytes: usize,
    pub(crate) group_commit_max_delay: Duration,
    /// `storage.wal_flushes_in_flight`.
    pub(crate) wal_flushes_in_flight: usize,
    /// `storage.wal_mark_interval`.
    pub(crate) wal_mark_interval: Duration,
    pub(crate) flush_interval: Duration,
    pub(crate) checkpoint_wal_bytes: u64,
    pub(crate) checkpoint_interval: Duration,
    pub(crate) checkpoint_deltas_max: u32,
    /// Time between two active-expiry ticks.
    pub(crate) expiry_tick: Duration,
    /// Most expired keys one tick deletes.
    pub(crate) expiry_keys_per_tick: usize,
    pub(crate) max_record_bytes: usize,
    /// Largest value an [`crate::Op::Update`] may write.
    pub(crate) value_bytes_max: usize,
    pub(crate) read_bytes_max: usize,
    /// This shard's share of `storage.max_memory` (0: no limit).
    pub(crate) memory_bytes_max: u64,
    /// `storage.tier`: which tier this shard runs, and this shard's part of
    /// its settings.
    pub(crate) tier: TierSettings,
    /// How the tier's tables hash keys (the manifest's key, or a fresh
    /// one for an engine that keeps nothing on disk).
    pub(crate) table_hasher: crate::hash::TableHasher,
    /// The data directory's identity (the manifest's), written into the
    /// header of every file the shard makes and checked in every file it
    /// opens (0 in `none` durability, which keeps no file).
    pub(crate) dir_id: crate::layout::DirId,
}

/// Everything a shard thread starts with.
pub(crate) struct ShardStart<D: Disk> {
    pub(crate) engine_id: u64,
    pub(crate) shard: usize,
    /// `None` in `none` durability (no files at all).
    pub(crate) disk: Option<D>,
    /// The hybrid tier's value segments' disk, throttled by the
    /// `storage.value_device`'s profile (the same device as `disk` when
    /// `value_device == wal_device`). `None` unless the tier is hybrid.
    pub(crate) value_disk: Option<D>,
    /// The hot device's disk (`storage.hot_device`, hybrid tier), if set;
    /// the hot segments go to `paths.hot_values_dir`.
    pub(crate) hot_disk: Option<D>,
    /// The shard's folders; the hybrid tier keeps its segments in `values_dir`.
    pub(crate) paths: ShardPaths,
    pub(crate) settings: ShardSettings,
    pub(crate) stats: Arc<ShardStats>,
    pub(crate) clock: Arc<CommitClock>,
    pub(crate) txn_stats: Arc<crate::metrics::TxnStats>,
    pub(crate) txn_floors: Arc<[std::sync::atomic::AtomicU64]>,
    pub(crate) exchange: Arc<crate::txn::recovery::Exchange>,
    pub(crate) inbox: flume::Receiver<ShardMsg>,
    /// The queues to and from the other shards.
    pub(crate) mesh: Arc<crate::mesh::Mesh>,
    pub(crate) control: flume::Receiver<Control>,
    pub(crate) halt: flume::Receiver<()>,
    /// Set when this thread ends (see [`crate::shard::router::EngineShared::closed`]).
    pub(crate) closed: Arc<std::sync::atomic::AtomicBool>,
    pub(crate) ready: flume::Sender<(usize, Result<(), EngineError>)>,
    pub(crate) backend: BackendKind,
    pub(crate) queue_depth: u32,
    pub(crate) core_id: Option<core_affinity::CoreId>,
}

/// Spawns an engine task whose panic stops the process.
pub(crate) fn spawn_critical(
    name: &'static str,
    shard: usize,
    task: impl Future<Output = ()> + 'static,
) {
    compio::runtime::spawn(async move {
        if let Err(panic) = AssertUnwindSafe(task).catch_unwind().await {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(shard, task = name, panic = %msg,
                "engine task panicked (broken invariant); aborting rather than serving on corrupt state");
            eprintln!("ringkv engine: shard {shard} task {name} panicked: {msg}; aborting");
            std::process::abort();
        }
    })
    .detach();
}

/// The body of a shard thread.
pub(crate) fn run<D: Disk>(start: ShardStart<D>) {
    let shard = start.shard;
    if let Some(core) = start.core_id {
        if !core_affinity::set_for_current(core) {
            tracing::debug!(
                shard,
                core = core.id,
                "could not pin the shard thread to its core; running unpinned"
            );
        }
    }
    let runtime = match shard_runtime(&start) {
        Some(rt) => rt,
        None => return,
    };
    let halt = start.halt.clone();
    let inbox = start.inbox.clone();
    let closed = start.closed.clone();
    // With other shards to talk to, the loop turns the mesh too.
    let port = (start.mesh.shards() > 1).then(|| {
        crate::mesh::Port::install(
            start.mesh.clone(),
            shard,
            start.stats.clone(),
            &runtime,
            start.backend == BackendKind::Uring,
        )
    });
    crate::mesh::drive(&runtime, port.as_deref(), async move {
        let main = std::pin::pin!(shard_main(start));
        let halted = std::pin::pin!(halt.recv_async());
        futures::future::select(main, halted).await;
    });
    end_shard(runtime, &closed, &inbox, port.as_deref());
}

/// The shard's runtime, or `None` after reporting why it could not be built.
fn shard_runtime<D: Disk>(start: &ShardStart<D>) -> Option<compio::runtime::Runtime> {
    match build_runtime(start.backend, start.queue_depth) {
        Ok(rt) => Some(rt),
        Err(source) => {
            let _ = start.ready.send((
                start.shard,
                Err(EngineError::Io {
                    op: "build the shard's I/O runtime",
                    path: start.paths.dir.clone(),
                    source,
                }),
            ));
            None
        }
    }
}

/// What a shard does once its loop has ended, on its own thread: nothing
/// is answered from here on, so callers waiting on it see their answer
/// channel close instead of waiting forever.
fn end_shard(
    runtime: compio::runtime::Runtime,
    closed: &std::sync::atomic::AtomicBool,
    inbox: &flume::Receiver<ShardMsg>,
    port: Option<&crate::mesh::Port>,
) {
    closed.store(true, std::sync::atomic::Ordering::SeqCst);
    if let Some(port) = port {
        port.close();
    }
    if let Some(core) = clear_local() {
        core.abandon();
    }
    while inbox.try_recv().is_ok() {}
    drop(runtime);
    while inbox.try_recv().is_ok() {}
    if let Some(port) = port {
        port.discard();
    }
}

/// A shard run by the thread that opened it, not by a thread of its own
/// (the embedded [`crate::Db`]): its runtime turns only while that thread
/// drives it ([`InlineShard::drive`]), inside each call.
pub(crate) struct InlineShard {
    /// `None` once ended.
    runtime: Option<compio::runtime::Runtime>,
    /// The shard's main task (recovery, then the inbox), ended by `halt`.
    main: Option<compio::runtime::JoinHandle<()>>,
    halt: flume::Sender<()>,
    closed: Arc<std::sync::atomic::AtomicBool>,
    inbox: flume::Receiver<ShardMsg>,
    /// The coarse clock when the runtime last looked for finished I/O and
    /// due timers.
    looked: std::cell::Cell<u64>,
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds: a few nanoseconds to read,
/// moving once per kernel tick.
fn coarse_now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl InlineShard {
    /// Builds the runtime on this thread and starts the shard's task on it;
    /// the caller drives it until the shard reports ready.
    pub(crate) fn start<D: Disk>(
        start: ShardStart<D>,
        halt: flume::Sender<()>,
    ) -> Option<InlineShard> {
        let runtime = shard_runtime(&start)?;
        let halted = start.halt.clone();
        let closed = start.closed.clone();
        let inbox = start.inbox.clone();
        let main = runtime.spawn(async move {
            let main = std::pin::pin!(shard_main(start));
            let halted = std::pin::pin!(halted.recv_async());
            futures::future::select(main, halted).await;
        });
        Some(InlineShard {
            runtime: Some(runtime),
            main: Some(main),
            halt,
            closed,
            inbox,
            looked: std::cell::Cell::new(0),
        })
    }

    /// Runs `future` to its end on this thread, turning the shard's
    /// runtime meanwhile (its other tasks run too), then
    /// [`InlineShard::after_call`].
    pub(crate) fn drive<F: Future>(&self, future: F) -> F::Output {
        let runtime = self.runtime.as_ref().expect("drive after end");
        let out = runtime.block_on(future);
        self.after_call();
        out
    }

    /// After a call: once per tick of the coarse clock (1-4 ms), looks
    /// for finished I/O and due timers and runs the tasks waiting for
    /// them and the ones calls woke meanwhile (the WAL's flusher with new
    /// records), so the background work goes on while the caller keeps
    /// calling, at a cost spread over many calls. Nothing a call answers
    /// waits for this: a write that finds no room in the WAL buffer, and
    /// every `sync` write, waits in [`InlineShard::drive`], which turns
    /// the runtime until it is done.
    pub(crate) fn after_call(&self) {
        let now = coarse_now();
        if now != self.looked.get() {
            self.looked.set(now);
            self.look();
        }
    }

    /// Looks for finished I/O and due timers without blocking and runs
    /// the tasks they wake.
    pub(crate) fn look(&self) {
        if let Some(runtime) = &self.runtime {
            runtime.enter(|| {
                runtime.poll_with(Some(Duration::ZERO));
                while runtime.run() {}
            });
        }
    }

    /// Turns the runtime until the shard's main task has ended (after
    /// its answer to a shutdown it still has to leave its loop).
    pub(crate) fn join(&mut self) {
        if let (Some(main), Some(runtime)) = (self.main.take(), &self.runtime) {
            let _ = runtime.block_on(main);
        }
    }

    /// Whether the shard's task has ended (shut down, halted or failed).
    pub(crate) fn ended(&self) -> bool {
        self.main.as_ref().is_none_or(|m| m.is_finished())
    }

    /// Stops the shard where it is (no flush): what a crash leaves.
    pub(crate) fn halt(&mut self) {
        let _ = self.halt.try_send(());
        self.join();
        self.end();
    }

    /// Ends the shard once its task has ended (or drops the task).
    pub(crate) fn end(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            if let Some(main) = self.main.take() {
                runtime.enter(|| drop(main));
            }
            end_shard(runtime, &self.closed, &self.inbox, None);
        }
    }
}

impl Drop for InlineShard {
    fn drop(&mut self) {
        let _ = self.halt.try_send(());
        self.end();
    }
}

/// Until a shard has reported its transaction parts to the recovery
/// exchange, its failure (an error or a panic) must release the other
/// shards waiting there.
struct ExchangeGuard(Option<Arc<crate::txn::recovery::Exchange>>);

impl Drop for ExchangeGuard {
    fn drop(&mut self) {
        if let Some(x) = self.0.take() {
            x.fail();
        }
    }
}

/// What recovery leaves for the WAL tasks (absent in `none` durability).
struct WalStart {
    /// Segments with records, oldest first.
    live: Vec<LiveSegment>,
    /// The segment new writes go to, and whether it exists.
    next_segment: (u64, bool),
    /// Whether that segment was recycled.
    next_recycled: bool,
    /// The live segment new writes continue in, and where (see
    /// [`crate::wal::recovery::Recovered::resume`]).
    resume: Option<(u64, u64)>,
    /// Unused segments kept for recycling.
    spares: Vec<PathBuf>,
    /// Valid snapshots kept, oldest first.
    snapshots: Vec<SnapshotFile>,
    /// The head as read, and the head recovery found true.
    head: (Option<HeadState>, HeadState),
    /// WAL bytes written for the records replayed after the snapshot.
    replayed_bytes: u64,
    /// Records replayed after the snapshot.
    replayed_records: u64,
}

/// A shard's state after recovery, before its core is built.
struct Restored {
    tier: Box<dyn TierStore>,
    last_lsn: u64,
    wal: Option<WalStart>,
    /// Multi-shard transaction parts recovery found complete and applied;
    /// their keys stay locked until every shard has them.
    held: Vec<HeldPart>,
    /// The oldest snapshot a recovery may load (not the full snapshot a
    /// kept chain starts from); 0 with no snapshot.
    floor: u64,
}

async fn shard_main<D: Disk>(start: ShardStart<D>) {
    let ShardStart {
        engine_id,
        shard,
        disk,
        value_disk,
        hot_disk,
        paths,
        settings,
        stats,
        clock,
        txn_stats,
        txn_floors,
        exchange,
        inbox,
        control,
        ready,
        ..
    } = start;
    let mut exchange_guard = ExchangeGuard(Some(exchange));
    let fail = |e: EngineError| {
        let _ = ready.send((
            shard,
            Err(EngineError::Shard {
                shard,
                source: Box::new(e),
            }),
        ));
    };

    // 0. The tier: recovery loads a checkpoint into tiers made here.
    let tier_config = match settings.tier.config(ShardTier {
        shard,
        paths: &paths,
        value_disk,
        hot_disk,
        read_latency_us: stats.cold_read_latency_us.clone(),
        dir_id: settings.dir_id,
    }) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let make_tier = |hint: Option<u64>| tier_config.build(hint, settings.table_hasher);

    // 1. Recovery.
    let restored = match &disk {
        None => Restored {
            tier: make_tier(None),
            last_lsn: 0,
            wal: None,
            held: Vec::new(),
            floor: 0,
        },
        Some(disk) => {
            let recovered = RecoveryParts {
                shard,
                settings: &settings,
                stats: &stats,
                clock: &clock,
                txn_stats: &txn_stats,
            };
            match recovered
                .restore(disk, &paths, &make_tier, &mut exchange_guard)
                .await
            {
                Ok(r) => r,
                Err(e) => return fail(e),
            }
        }
    };

    // 2. The core, and the WAL tasks.
    let txn = |held| crate::shard::txn::TxnShard::new(shard, txn_floors, txn_stats, held);
    let (core, wal) = build_core(shard, &settings, stats, clock, restored, txn);
    exchange_guard.0 = None;
    if let (Some(disk), Some(wal)) = (disk, wal) {
        if let Err(e) = start_wal(&core, disk, &paths, &settings, wal).await {
            return fail(e);
        }
    }
    spawn_background(&core, &settings);
    set_local(engine_id, shard, core.clone());
    compio::runtime::spawn(async move {
        while let Ok(Control::Spawn(f)) = control.recv_async().await {
            compio::runtime::spawn(f()).detach();
        }
    })
    .detach();
    let _ = ready.send((shard, Ok(())));

    // 3. Serve the inbox.
    let port = crate::mesh::port_of(engine_id);
    serve(&core, &inbox, port, settings.durability, shard).await;
}

/// The shard's core over its recovered state (a WAL appender when the
/// shard has a WAL; `txn` makes the transaction side from the parts
/// recovery holds), and what the WAL tasks start from.
fn build_core(
    shard: usize,
    settings: &ShardSettings,
    stats: Arc<ShardStats>,
    clock: Arc<CommitClock>,
    restored: Restored,
    txn: impl FnOnce(Vec<HeldPart>) -> crate::shard::txn::TxnShard,
) -> (Rc<ShardCore>, Option<WalStart>) {
    let appender = restored.wal.as_ref().map(|w| {
        let (seq, offset) = w.resume.unwrap_or((w.next_segment.0, 0));
        WalAppender::new(
            shard as u32,
            settings.segment_bytes,
            settings.group_commit_max_bytes,
            settings.max_record_bytes,
            seq,
        )
        .resuming_at(offset)
        .with_dir_id(settings.dir_id)
        .with_flushes_in_flight(settings.wal_flushes_in_flight)
    });
    let core = Rc::new(ShardCore::new(
        CoreSettings {
            shard,
            durability: settings.durability,
            checkpoint_wal_bytes: settings.checkpoint_wal_bytes,
            max_record_bytes: settings.max_record_bytes,
            value_bytes_max: settings.value_bytes_max,
            read_bytes_max: settings.read_bytes_max,
            memory_bytes_max: settings.memory_bytes_max,
        },
        restored.tier,
        restored.last_lsn,
        appender,
        stats,
        clock,
        txn(restored.held),
    ));
    core.txn.publish_floor(restored.floor);
    (core, restored.wal)
}

/// What recovering a shard with a WAL reads and reports to.
struct RecoveryParts<'a> {
    shard: usize,
    settings: &'a ShardSettings,
    stats: &'a ShardStats,
    clock: &'a CommitClock,
    txn_stats: &'a crate::metrics::TxnStats,
}

impl RecoveryParts<'_> {
    /// Recovers the shard's tier and WAL state, then settles its
    /// multi-shard transaction parts with the other shards.
    async fn restore<D: Disk>(
        &self,
        disk: &D,
        paths: &ShardPaths,
        make_tier: &TierFactory<'_>,
        exchange_guard: &mut ExchangeGuard,
    ) -> Result<Restored, EngineError> {
        let shard = self.shard;
        let cfg = RecoveryConfig {
            shard: shard as u32,
            segment_bytes: self.settings.segment_bytes,
            dir_id: self.settings.dir_id,
        };
        let r = recover_into(disk, paths, cfg, make_tier).await?;
        self.clock.observe(r.max_commit_version);
        self.report(&r);
        let floor = if r.snapshots.is_empty() {
            0
        } else {
            crate::snapshot::fallback_lsn(&r.snapshots)
        };
        // The exchange: every shard reports the multi-shard parts in its
        // log; a part applies only if all of its transaction's parts are
        // somewhere.
        let exchange = exchange_guard
            .0
            .take()
            .expect("the exchange is reported once");
        let Some(decision) = exchange.report(shard as u16, &r.txn.seen) else {
            return Err(EngineError::Config {
                reason: ANOTHER_SHARD_FAILED.into(),
            });
        };
        let mut tier = r.tier;
        let (applied, dropped) = r.txn.finish(&decision.complete, &mut *tier);
        tier.recovery_done();
        self.txn_stats
            .recovered_parts_applied
            .fetch_add(applied, Relaxed);
        self.txn_stats
            .recovered_parts_dropped
            .fetch_add(dropped, Relaxed);
        if dropped > 0 {
            tracing::warn!(
                shard,
                applied,
                dropped,
                "multi-shard transaction parts recovered; the dropped ones belong to commits that never finished"
            );
        } else if applied > 0 {
            tracing::info!(shard, applied, "multi-shard transaction parts recovered");
        }
        Ok(Restored {
            tier,
            last_lsn: r.last_lsn,
            wal: Some(WalStart {
                live: r.live_segments,
                next_segment: (r.next_segment_seq, r.next_segment_ready),
                next_recycled: r.next_segment_recycled,
                resume: r.resume,
                spares: r.spares,
                snapshots: r.snapshots,
                head: (r.head, r.head_found),
                replayed_bytes: r.wal_bytes_after_snapshot,
                replayed_records: r.records_replayed,
            }),
            held: decision.held_on(shard as u16),
            floor,
        })
    }

    /// Recovery's figures into the shard's stats and the log.
    fn report(&self, r: &Recovered) {
        let stats = self.stats;
        stats
            .recovery_duration_us
            .store(r.duration.as_micros() as u64, Relaxed);
        stats
            .recovery_bytes_replayed
            .store(r.bytes_replayed, Relaxed);
        stats
            .recovery_records_replayed
            .store(r.records_replayed, Relaxed);
        stats
            .recovery_snapshot_entries
            .store(r.snapshot_entries, Relaxed);
        stats
            .checkpoint_last_lsn
            .store(r.snapshots.last().map_or(0, |s| s.lsn), Relaxed);
        tracing::info!(
            shard = self.shard,
            duration_ms = r.duration.as_millis() as u64,
            snapshot_entries = r.snapshot_entries,
            records_replayed = r.records_replayed,
            bytes_replayed = r.bytes_replayed,
            bytes_read = r.bytes_read,
            last_lsn = r.last_lsn,
            cases = %crate::wal::recovery::cases_summary(&r.cases),
            "shard recovered"
        );
    }
}

/// Opens the segment files and starts the WAL's tasks: the flusher, a
/// checkpoint after a long replay, the first segments made ready, the
/// segment creator and the checkpointer.
async fn start_wal<D: Disk>(
    core: &Rc<ShardCore>,
    disk: D,
    paths: &ShardPaths,
    settings: &ShardSettings,
    wal: WalStart,
) -> Result<(), EngineError> {
    let shard = core.settings.shard;
    let files = SegmentFiles::open(
        disk.clone(),
        paths.clone(),
        (settings.segment_bytes, settings.dir_id),
        wal.live,
        wal.next_segment,
        (wal.next_recycled, wal.resume.map(|(seq, _)| seq)),
        wal.spares,
        wal.head,
    )
    .await?;
    let files = Rc::new(files);
    spawn_critical(
        "wal-flusher",
        shard,
        run_flusher(
            core.wal.clone(),
            files.clone(),
            FlusherSettings {
                durability: settings.durability,
                group_commit_max_delay: settings.group_commit_max_delay,
                flush_interval: settings.flush_interval,
                flushes_in_flight: settings.wal_flushes_in_flight,
                mark_interval: settings.wal_mark_interval,
            },
        ),
    );
    spawn_critical(
        "wal-durability-watch",
        shard,
        crate::wal::watch::run_durability_watch(
            core.wal.clone(),
            crate::wal::watch::warn_after(settings.flush_interval, settings.group_commit_max_delay),
        ),
    );
    let replayed = (wal.replayed_bytes, wal.replayed_records);
    let mut snapshots = wal.snapshots;
    // The WAL replayed counts toward the next checkpoint, whatever the
    // restart pattern. The first checkpoint is a full one: due once the WAL
    // reaches what the disk bound allows beside the chain recovery loaded
    // (a tier without estimates: once the WAL has grown by the size of the
    // full snapshot recovery loaded).
    let threshold = crate::shard::checkpoint::bounded_threshold(
        core,
        &snapshots,
        settings.checkpoint_wal_bytes,
    )
    .unwrap_or_else(|| crate::snapshot::full_bytes(&snapshots));
    core.wal.set_checkpoint_threshold(threshold);
    core.wal.carry_over(replayed.0, replayed.1);
    // The first checkpoint of a process is a full one (the tier's change
    // marks are not relative to any snapshot yet).
    let marks_valid = if replayed.0 > 0 && replayed.0 >= core.wal.checkpoint_threshold() {
        checkpoint_before_serving(core, &files, &disk, paths, &mut snapshots, replayed).await
    } else {
        false
    };
    prepare_first_segments(core, &files).await;
    spawn_critical(
        "segment-creator",
        shard,
        run_segment_creator(core.wal.clone(), files.clone()),
    );
    spawn_critical(
        "checkpointer",
        shard,
        run_checkpointer(
            core.clone(),
            files,
            disk,
            paths.clone(),
            CheckpointSettings {
                wal_bytes: settings.checkpoint_wal_bytes,
                interval: settings.checkpoint_interval,
                deltas_max: settings.checkpoint_deltas_max,
            },
            snapshots,
            marks_valid,
        ),
    );
    Ok(())
}

/// After a replay of a whole checkpoint threshold or more, a checkpoint
/// before the shard reports ready. Not fatal when it fails (e.g. a full
/// disk): the shard serves and the checkpointer retries. Returns whether
/// the tier's change marks are now relative to the snapshot written.
async fn checkpoint_before_serving<D: Disk>(
    core: &ShardCore,
    files: &SegmentFiles<D>,
    disk: &D,
    paths: &ShardPaths,
    snapshots: &mut Vec<SnapshotFile>,
    (replayed_bytes, replayed_records): (u64, u64),
) -> bool {
    let shard = core.settings.shard;
    let started = std::time::Instant::now();
    match checkpoint(core, files, disk, paths, snapshots, None).await {
        Ok(written) => {
            tracing::info!(
                shard,
                bytes_replayed = replayed_bytes,
                duration_ms = started.elapsed().as_millis() as u64,
                "checkpoint after a long replay written before serving"
            );
            written.is_some()
        }
        Err(e) => {
            core.wal.carry_over(replayed_bytes, replayed_records);
            core.stats.checkpoint_failures.fetch_add(1, Relaxed);
            tracing::warn!(shard, error = %e,
                "checkpoint after recovery failed; serving anyway, the checkpointer retries");
            false
        }
    }
}

/// Prepares, before the shard reports ready, the segment new writes go to
/// and one spare after it (recycled from the pool when possible, else
/// zero-filled), so the first writes neither wait for a zero-fill nor share
/// the device with one; then waits until the device has paid for that I/O
/// (a throttled profile admits the read only then). Failures are not fatal:
/// a nearly full disk still starts.
async fn prepare_first_segments<D: Disk>(core: &ShardCore, files: &SegmentFiles<D>) {
    let open_seq = core.wal.open_segment_seq();
    let mut made_any = false;
    for seq in [open_seq, open_seq + 1] {
        if seq > open_seq && !files.has_segment(open_seq) {
            break;
        }
        if let Some(recycled) = files.make(seq).await {
            made_any = true;
            let counter = if recycled {
                &core.stats.segments_recycled
            } else {
                &core.stats.segments_created
            };
            counter.fetch_add(1, Relaxed);
        }
    }
    if made_any {
        files.settle(open_seq + 1).await;
        files.settle(open_seq).await;
    }
}

/// The background tasks the tier asks for (the hybrid tier's GC and
/// settling reads), and active expiry.
fn spawn_background(core: &Rc<ShardCore>, settings: &ShardSettings) {
    let shard = core.settings.shard;
    let tasks = core.with_tier(|t| t.background_tasks());
    // The counters as recovery left them, before the first background
    // step: metrics read right after the engine opens see this shard's.
    core.publish_tier_stats();
    if tasks.background {
        spawn_critical(
            "tier-gc",
            shard,
            crate::shard::gc::run_tier_background(core.clone()),
        );
    }
    if tasks.settles {
        spawn_critical(
            "tier-settle",
            shard,
            crate::shard::gc::run_settles(core.clone()),
        );
    }
    spawn_critical(
        "active-expiry",
        shard,
        crate::shard::expiry::run_active_expiry(
            core.clone(),
            settings.expiry_tick,
            settings.expiry_keys_per_tick,
        ),
    );
}

/// Serves the inbox and the sub-batches other shards sent through the mesh,
/// until a shutdown message (answered once the WAL is durable through the
/// last LSN) or until every sender is gone.
async fn serve(
    core: &Rc<ShardCore>,
    inbox: &flume::Receiver<ShardMsg>,
    port: Option<Rc<crate::mesh::Port>>,
    durability: Durability,
    shard: usize,
) {
    loop {
        let next = {
            let mut recv = std::pin::pin!(inbox.recv_async());
            std::future::poll_fn(|cx| {
                if let Some(incoming) = port.as_ref().and_then(|p| p.poll_request(cx)) {
                    return std::task::Poll::Ready(Some(Err(incoming)));
                }
                recv.as_mut().poll(cx).map(|m| m.ok().map(Ok))
            })
            .await
        };
        core.stats.taken.fetch_add(1, Relaxed);
        // `Err`: from a peer, through the mesh; `Ok`: from the inbox.
        let msg = match next {
            None => break,
            Some(Err(crate::mesh::Incoming::Batch(ops, reply))) => {
                run_batch(core, ops, reply).await;
                continue;
            }
            Some(Err(crate::mesh::Incoming::Job(job))) => {
                job();
                continue;
            }
            Some(Ok(msg)) => msg,
        };
        match msg {
            ShardMsg::Batch { ops, reply } => {
                run_batch(core, ops, crate::mesh::Reply::Direct(reply)).await
            }
            ShardMsg::Txn(msg) => crate::shard::txn::handle(core, msg),
            ShardMsg::Backup(req) => core.backup.push(core, req),
            ShardMsg::Refresh { done } => {
                core.publish_tier_stats();
                let _ = done.send(());
            }
            ShardMsg::Shutdown { done } => {
                let result = match durability {
                    Durability::None => Ok(()),
                    _ => {
                        // Durable, then vouched for in `wal.head`: after a
                        // clean stop, any damage to the last flush is
                        // damage, never a torn write (`docs/wal.md`).
                        let last = core.last_lsn();
                        match core.wait_durable(last).await {
                            Ok(()) => core.wal.mark_through(last).await,
                            Err(()) => Err(()),
                        }
                        .map_err(|()| EngineError::PoisonedAtShutdown { shard })
                    }
                };
                let _ = done.send(result);
                break;
            }
        }
    }
}

/// Applies a sub-batch in order and answers it (once its writes are
/// durable); its device reads go on while the next batches apply.
async fn run_batch(core: &Rc<ShardCore>, ops: Vec<crate::Op>, reply: crate::mesh::Reply) {
    let (applied, cold) = core.apply_in_order(ops).await;
    if cold.is_empty() {
        core.complete(applied, reply);
    } else {
        let core = core.clone();
        compio::runtime::spawn(async move {
            let applied = core.finish_reads(applied, cold).await;
            core.complete(applied, reply);
        })
        .detach();
    }
}
