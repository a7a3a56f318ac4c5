//! Engine metrics: per-shard counters kept in atomics by the shard thread
//! (written by one thread, read by any), and the plain-data snapshot
//! [`EngineMetrics`] that callers export (the server as Prometheus text).
//! Reading metrics never takes a lock on the data path.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

const HISTOGRAM_BUCKETS: usize = 40;

/// A histogram with power-of-two buckets, as plain data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Histogram {
    /// Inclusive upper bound of each bucket: 0, 1, 3, 7, ..., 2^i - 1; the
    /// last bucket also takes everything larger.
    pub bounds: Vec<u64>,
    /// Samples per bucket (not cumulative).
    pub counts: Vec<u64>,
    /// Number of samples.
    pub count: u64,
    /// Sum of all samples.
    pub sum: u64,
}

impl Histogram {
    /// Smallest bucket bound that at least `q` (0..=1) of the samples are
    /// at or below; 0 when empty.
    pub fn quantile_bound(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let target = ((self.count as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            seen += count;
            if seen >= target {
                return *bound;
            }
        }
        self.bounds.last().copied().unwrap_or(0)
    }

    /// Mean of the samples (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }
}

/// A histogram one thread records into and any thread reads.
pub(crate) struct AtomicHistogram {
    buckets: [AtomicU64; HISTOGRAM_BUCKETS],
    count: AtomicU64,
    sum: AtomicU64,
}

impl AtomicHistogram {
    pub(crate) fn new() -> Self {
        AtomicHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
        }
    }

    pub(crate) fn record(&self, value: u64) {
        let bucket = ((64 - value.leading_zeros()) as usize).min(HISTOGRAM_BUCKETS - 1);
        self.buckets[bucket].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum.fetch_add(value, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Histogram {
        Histogram {
            bounds: (0..HISTOGRAM_BUCKETS)
                .map(|i| {
                    if i == HISTOGRAM_BUCKETS - 1 {
                        u64::MAX
                    } else {
                        (1u64 << i) - 1
                    }
                })
                .collect(),
            counts: self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
            count: self.count.load(Relaxed),
            sum: self.sum.load(Relaxed),
        }
    }
}

/// One shard's counters, as plain data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShardMetrics {
    pub shard: usize,
    /// Keys in the tier.
    pub keys: u64,
    /// Bytes the tier holds (entries + index), see [`crate::tier::Tier::memory_bytes`].
    pub memory_bytes: u64,
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
    pub group_commit_records: Histogram,
    /// Bytes per group commit.
    pub group_commit_bytes: Histogram,
    /// fdatasync latency of WAL flushes, in microseconds.
    pub fdatasync_latency_us: Histogram,
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
    pub recovery_duration_us: u64,
    pub recovery_bytes_replayed: u64,
    pub recovery_records_replayed: u64,
    /// Entries loaded from the snapshot at recovery.
    pub recovery_snapshot_entries: u64,
    /// Sub-batches waiting in this shard's inbound channel.
    pub queue_depth: u64,
    /// Bytes in WAL segment files (live, open and spare).
    pub wal_live_bytes: u64,
    /// WAL segments created by zero-filling a new file (this run).
    pub segments_created: u64,
    /// WAL segments made by recycling a retired one (this run).
    pub segments_recycled: u64,
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

/// The atomics behind [`ShardMetrics`], shared by a shard thread (writer)
/// and every handle (readers).
pub(crate) struct ShardStats {
    pub(crate) keys: AtomicU64,
    pub(crate) memory_bytes: AtomicU64,
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
    pub(crate) recovery_duration_us: AtomicU64,
    pub(crate) recovery_bytes_replayed: AtomicU64,
    pub(crate) recovery_records_replayed: AtomicU64,
    pub(crate) recovery_snapshot_entries: AtomicU64,
    pub(crate) wal_live_bytes: AtomicU64,
    pub(crate) segments_created: AtomicU64,
    pub(crate) segments_recycled: AtomicU64,
}

impl ShardStats {
    pub(crate) fn new() -> Self {
        ShardStats {
            keys: AtomicU64::new(0),
            memory_bytes: AtomicU64::new(0),
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
            recovery_duration_us: AtomicU64::new(0),
            recovery_bytes_replayed: AtomicU64::new(0),
            recovery_records_replayed: AtomicU64::new(0),
            recovery_snapshot_entries: AtomicU64::new(0),
            wal_live_bytes: AtomicU64::new(0),
            segments_created: AtomicU64::new(0),
            segments_recycled: AtomicU64::new(0),
        }
    }

    pub(crate) fn snapshot(&self, shard: usize, queue_depth: usize) -> ShardMetrics {
        ShardMetrics {
            shard,
            keys: self.keys.load(Relaxed),
            memory_bytes: self.memory_bytes.load(Relaxed),
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
            recovery_duration_us: self.recovery_duration_us.load(Relaxed),
            recovery_bytes_replayed: self.recovery_bytes_replayed.load(Relaxed),
            recovery_records_replayed: self.recovery_records_replayed.load(Relaxed),
            recovery_snapshot_entries: self.recovery_snapshot_entries.load(Relaxed),
            queue_depth: queue_depth as u64,
            wal_live_bytes: self.wal_live_bytes.load(Relaxed),
            segments_created: self.segments_created.load(Relaxed),
            segments_recycled: self.segments_recycled.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_and_quantiles() {
        let h = AtomicHistogram::new();
        for v in [0, 1, 2, 3, 4, 100, 1000] {
            h.record(v);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 7);
        assert_eq!(s.sum, 1110);
        assert_eq!(s.counts[0], 1); // 0
        assert_eq!(s.counts[1], 1); // 1
        assert_eq!(s.counts[2], 2); // 2..=3
        assert_eq!(s.counts[3], 1); // 4..=7
        assert_eq!(s.quantile_bound(0.5), 3);
        assert_eq!(s.quantile_bound(1.0), 1023);
        h.record(u64::MAX);
        assert_eq!(h.snapshot().counts[HISTOGRAM_BUCKETS - 1], 1);
    }
}
