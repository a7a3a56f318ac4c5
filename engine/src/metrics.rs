//! Engine metrics: per-shard counters kept in atomics by the shard thread
//! (written by one thread, read by any), and the plain-data snapshot
//! [`EngineMetrics`] that callers export (the server as Prometheus text).
//! Reading metrics never takes a lock on the data path.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use crate::histogram::{AtomicHistogram, HistogramSnapshot};

/// Engine-wide transaction counters (read by the server's STATS).
#[derive(Debug, Default)]
pub struct TxnStats {
    pub open: AtomicU64,
    pub commits: AtomicU64,
    pub rollbacks: AtomicU64,
    pub aborts_die: AtomicU64,
    pub aborts_lock_timeout: AtomicU64,
    pub aborts_idle: AtomicU64,
    pub aborts_dropped: AtomicU64,
    pub commit_failures: AtomicU64,
    pub lock_waits: AtomicU64,
    pub lock_wait_us: AtomicU64,
    /// Recovery at this open: multi-shard parts applied / dropped (their
    /// transaction had a part missing).
    pub recovered_parts_applied: AtomicU64,
    pub recovered_parts_dropped: AtomicU64,
}

/// One shard's counters, as plain data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShardMetrics {
    pub shard: usize,
    /// Keys in the tier.
    pub keys: u64,
    /// Bytes the tier holds (entries + index), see [`crate::tier::Tier::memory_bytes`].
    pub memory_bytes: u64,
    /// This shard's share of `storage.max_memory` (0: no limit).
    pub memory_bytes_max: u64,
    /// Writes refused because they would grow the tier past
    /// `memory_bytes_max` (plain writes and transaction commits), this run.
    pub oom_refusals: u64,
    pub ops_get: u64,
    pub ops_put: u64,
    pub ops_delete: u64,
    /// Operations answered with an error (limits, poisoning).
    pub ops_failed: u64,
    /// Bytes written to WAL segments (records, seals, segment headers).
    pub wal_bytes_written: u64,
    /// Group commits (one write + one fdatasync each).
    pub wal_flushes: u64,
    /// Data records logged.
    pub wal_records: u64,
    /// Data records per group commit.
    pub group_commit_records: HistogramSnapshot,
    /// Bytes per group commit.
    pub group_commit_bytes: HistogramSnapshot,
    /// fdatasync latency of WAL flushes, in microseconds.
    pub fdatasync_latency_us: HistogramSnapshot,
    /// Last LSN assigned (applied in memory).
    pub current_lsn: u64,
    /// Last LSN known durable on disk.
    pub durable_lsn: u64,
    /// Whether a failed write or fdatasync stopped this shard's writes.
    pub poisoned: bool,
    pub checkpoints: u64,
    pub checkpoint_last_duration_us: u64,
    /// LSN covered by the newest checkpoint.
    pub checkpoint_last_lsn: u64,
    pub checkpoint_failures: u64,
    /// Checkpoints written as deltas (what changed since the one before).
    pub checkpoint_deltas: u64,
    /// Bytes of the checkpoint files written, this run.
    pub checkpoint_bytes: u64,
    pub recovery_duration_us: u64,
    pub recovery_bytes_replayed: u64,
    pub recovery_records_replayed: u64,
    /// Entries loaded from the snapshot at recovery.
    pub recovery_snapshot_entries: u64,
    /// Sub-batches waiting in this shard's inbound channel.
    pub queue_depth: u64,
    /// Sub-batches this shard sent to other shards through the mesh (its
    /// callers' requests for keys another shard owns), this run.
    pub cross_requests: u64,
    /// Wake-ups this shard gave parked peers (one per sleep it ended,
    /// MSG_RING or eventfd), this run. Over `cross_requests`: what a
    /// cross-shard request costs in wake-ups.
    pub wakeups: u64,
    /// The most sub-batches this shard has had unanswered at one peer, this
    /// run: never over `limits.shard_queue_depth` (the mesh's back-pressure).
    pub cross_in_flight_peak: u64,
    /// Bytes in WAL segment files (live, open and spare).
    pub wal_live_bytes: u64,
    /// WAL segments created by zero-filling a new file (this run).
    pub segments_created: u64,
    /// WAL segments made by recycling a retired one (this run).
    pub segments_recycled: u64,
    /// Durable marks written to `wal.head` (this run; `docs/wal.md`,
    /// "The durable mark").
    pub wal_marks: u64,
    /// Expired keys deleted (by active expiry, or by a write that found
    /// its key expired), this run.
    pub expired_keys: u64,
    /// Keys that carry an expiry time (expired or not yet deleted).
    pub expiring_keys: u64,
    /// The hybrid tier's counters (`None` on the memory tier).
    pub hybrid: Option<crate::tier::HybridStats>,
    /// Latency of the hybrid tier's device reads (cold GETs, checks of a
    /// key on overwrite), in microseconds.
    pub cold_read_latency_us: HistogramSnapshot,
}

/// One device's counters and profile, as plain data.
#[derive(Debug, Clone)]
pub struct DeviceMetrics {
    /// Device name in the config (`[devices.NAME]`).
    pub name: String,
    /// Disk profile the device enforces.
    pub profile: String,
    /// The device's own counters.
    pub io: crate::io::throttle::DeviceMetricsSnapshot,
}

/// Everything the engine reports: cheap to take, from any thread.
#[derive(Debug, Clone)]
pub struct EngineMetrics {
    pub shards: Vec<ShardMetrics>,
    pub devices: Vec<DeviceMetrics>,
}

impl EngineMetrics {
    /// The hybrid tier's counters summed over the shards (`None` on the
    /// memory tier), and the shards' cold read latencies merged: what
    /// [`crate::HybridStats::counters`] turns into the server-wide values.
    pub fn hybrid_total(&self) -> (Option<crate::tier::HybridStats>, HistogramSnapshot) {
        let mut latency = HistogramSnapshot::default();
        let mut total: Option<crate::tier::HybridStats> = None;
        for s in &self.shards {
            latency.merge(&s.cold_read_latency_us);
            if let Some(h) = &s.hybrid {
                total.get_or_insert_with(Default::default).add(h);
            }
        }
        (total, latency)
    }
}

/// The atomics behind [`ShardMetrics`], shared by a shard thread (writer)
/// and every handle (readers).
pub(crate) struct ShardStats {
    pub(crate) keys: AtomicU64,
    pub(crate) memory_bytes: AtomicU64,
    pub(crate) memory_bytes_max: AtomicU64,
    pub(crate) oom_refusals: AtomicU64,
    pub(crate) ops_get: AtomicU64,
    pub(crate) ops_put: AtomicU64,
    pub(crate) ops_delete: AtomicU64,
    pub(crate) ops_failed: AtomicU64,
    pub(crate) wal_bytes_written: AtomicU64,
    pub(crate) wal_flushes: AtomicU64,
    pub(crate) wal_records: AtomicU64,
    pub(crate) group_commit_records: AtomicHistogram,
    pub(crate) group_commit_bytes: AtomicHistogram,
    pub(crate) fdatasync_latency_us: AtomicHistogram,
    pub(crate) current_lsn: AtomicU64,
    pub(crate) durable_lsn: AtomicU64,
    pub(crate) poisoned: AtomicBool,
    pub(crate) checkpoints: AtomicU64,
    pub(crate) checkpoint_last_duration_us: AtomicU64,
    pub(crate) checkpoint_last_lsn: AtomicU64,
    pub(crate) checkpoint_failures: AtomicU64,
    pub(crate) checkpoint_deltas: AtomicU64,
    pub(crate) checkpoint_bytes: AtomicU64,
    pub(crate) recovery_duration_us: AtomicU64,
    pub(crate) recovery_bytes_replayed: AtomicU64,
    pub(crate) recovery_records_replayed: AtomicU64,
    pub(crate) recovery_snapshot_entries: AtomicU64,
    pub(crate) wal_live_bytes: AtomicU64,
    pub(crate) segments_created: AtomicU64,
    pub(crate) segments_recycled: AtomicU64,
    pub(crate) wal_marks: AtomicU64,
    pub(crate) expired_keys: AtomicU64,
    pub(crate) expiring_keys: AtomicU64,
    pub(crate) cross_requests: AtomicU64,
    pub(crate) wakeups: AtomicU64,
    pub(crate) cross_in_flight_peak: AtomicU64,
    /// Messages the shard took from its inbox and from the mesh (the
    /// request watch reads it: a shard whose inbox waits while this stands
    /// still is not serving).
    pub(crate) taken: AtomicU64,
    /// Published by the shard thread a few times a second (never on the
    /// request path).
    pub(crate) tier: std::sync::Mutex<crate::tier::TierStats>,
    pub(crate) cold_read_latency_us: std::sync::Arc<AtomicHistogram>,
}

impl ShardStats {
    pub(crate) fn new() -> Self {
        ShardStats {
            keys: AtomicU64::new(0),
            memory_bytes: AtomicU64::new(0),
            memory_bytes_max: AtomicU64::new(0),
            oom_refusals: AtomicU64::new(0),
            ops_get: AtomicU64::new(0),
            ops_put: AtomicU64::new(0),
            ops_delete: AtomicU64::new(0),
            ops_failed: AtomicU64::new(0),
            wal_bytes_written: AtomicU64::new(0),
            wal_flushes: AtomicU64::new(0),
            wal_records: AtomicU64::new(0),
            group_commit_records: AtomicHistogram::new(),
            group_commit_bytes: AtomicHistogram::new(),
            fdatasync_latency_us: AtomicHistogram::new(),
            current_lsn: AtomicU64::new(0),
            durable_lsn: AtomicU64::new(0),
            poisoned: AtomicBool::new(false),
            checkpoints: AtomicU64::new(0),
            checkpoint_last_duration_us: AtomicU64::new(0),
            checkpoint_last_lsn: AtomicU64::new(0),
            checkpoint_failures: AtomicU64::new(0),
            checkpoint_deltas: AtomicU64::new(0),
            checkpoint_bytes: AtomicU64::new(0),
            recovery_duration_us: AtomicU64::new(0),
            recovery_bytes_replayed: AtomicU64::new(0),
            recovery_records_replayed: AtomicU64::new(0),
            recovery_snapshot_entries: AtomicU64::new(0),
            wal_live_bytes: AtomicU64::new(0),
            segments_created: AtomicU64::new(0),
            segments_recycled: AtomicU64::new(0),
            wal_marks: AtomicU64::new(0),
            expired_keys: AtomicU64::new(0),
            expiring_keys: AtomicU64::new(0),
            cross_requests: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            cross_in_flight_peak: AtomicU64::new(0),
            tier: std::sync::Mutex::new(crate::tier::TierStats::default()),
            cold_read_latency_us: std::sync::Arc::new(AtomicHistogram::new()),
        }
    }

    pub(crate) fn snapshot(&self, shard: usize, queue_depth: usize) -> ShardMetrics {
        ShardMetrics {
            shard,
            keys: self.keys.load(Relaxed),
            memory_bytes: self.memory_bytes.load(Relaxed),
            memory_bytes_max: self.memory_bytes_max.load(Relaxed),
            oom_refusals: self.oom_refusals.load(Relaxed),
            ops_get: self.ops_get.load(Relaxed),
            ops_put: self.ops_put.load(Relaxed),
            ops_delete: self.ops_delete.load(Relaxed),
            ops_failed: self.ops_failed.load(Relaxed),
            wal_bytes_written: self.wal_bytes_written.load(Relaxed),
            wal_flushes: self.wal_flushes.load(Relaxed),
            wal_records: self.wal_records.load(Relaxed),
            group_commit_records: self.group_commit_records.snapshot(),
            group_commit_bytes: self.group_commit_bytes.snapshot(),
            fdatasync_latency_us: self.fdatasync_latency_us.snapshot(),
            current_lsn: self.current_lsn.load(Relaxed),
            durable_lsn: self.durable_lsn.load(Relaxed),
            poisoned: self.poisoned.load(Relaxed),
            checkpoints: self.checkpoints.load(Relaxed),
            checkpoint_last_duration_us: self.checkpoint_last_duration_us.load(Relaxed),
            checkpoint_last_lsn: self.checkpoint_last_lsn.load(Relaxed),
            checkpoint_failures: self.checkpoint_failures.load(Relaxed),
            checkpoint_deltas: self.checkpoint_deltas.load(Relaxed),
            checkpoint_bytes: self.checkpoint_bytes.load(Relaxed),
            recovery_duration_us: self.recovery_duration_us.load(Relaxed),
            recovery_bytes_replayed: self.recovery_bytes_replayed.load(Relaxed),
            recovery_records_replayed: self.recovery_records_replayed.load(Relaxed),
            recovery_snapshot_entries: self.recovery_snapshot_entries.load(Relaxed),
            queue_depth: queue_depth as u64,
            cross_requests: self.cross_requests.load(Relaxed),
            wakeups: self.wakeups.load(Relaxed),
            cross_in_flight_peak: self.cross_in_flight_peak.load(Relaxed),
            wal_live_bytes: self.wal_live_bytes.load(Relaxed),
            segments_created: self.segments_created.load(Relaxed),
            segments_recycled: self.segments_recycled.load(Relaxed),
            wal_marks: self.wal_marks.load(Relaxed),
            expired_keys: self.expired_keys.load(Relaxed),
            expiring_keys: self.expiring_keys.load(Relaxed),
            hybrid: self.tier.lock().unwrap_or_else(|p| p.into_inner()).hybrid(),
            cold_read_latency_us: self.cold_read_latency_us.snapshot(),
        }
    }
}
