//! The server's own counters (the engine keeps its own): operations by kind
//! and status, frames, batch latency, connections and bytes, one block per
//! shard so each shard thread writes only its own cache lines.
//!
//! What must hold: the data path only ever touches its own shard's block
//! with relaxed atomic adds (no locks); readers (STATS, /metrics) sum the
//! blocks and may see a slightly stale but never torn total per counter.

use std::sync::atomic::{AtomicU64, Ordering};

use ringkv_protocol::Status;

use crate::native::session::CloseReason;
use engine::histogram::{AtomicHistogram, HistogramSnapshot};

/// Operation kinds as counted (and labelled `op` in /metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    Put,
    Get,
    Delete,
    Ping,
    Stats,
    /// BEGIN, GET_FOR_UPDATE, COMMIT, ROLLBACK.
    Txn,
    PutExpiring,
    Expire,
    Ttl,
    Scan,
}

impl OpKind {
    pub const ALL: [OpKind; 10] = [
        OpKind::Put,
        OpKind::Get,
        OpKind::Delete,
        OpKind::Ping,
        OpKind::Stats,
        OpKind::Txn,
        OpKind::PutExpiring,
        OpKind::Expire,
        OpKind::Ttl,
        OpKind::Scan,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            OpKind::Put => "put",
            OpKind::Get => "get",
            OpKind::Delete => "delete",
            OpKind::Ping => "ping",
            OpKind::Stats => "stats",
            OpKind::Txn => "txn",
            OpKind::PutExpiring => "put_expiring",
            OpKind::Expire => "expire",
            OpKind::Ttl => "ttl",
            OpKind::Scan => "scan",
        }
    }

    pub const fn index(self) -> usize {
        self as usize
    }

    /// Whether the engine runs this kind (the others the server answers).
    pub const fn is_engine_op(self) -> bool {
        matches!(
            self,
            OpKind::Put
                | OpKind::Get
                | OpKind::Delete
                | OpKind::PutExpiring
                | OpKind::Expire
                | OpKind::Ttl
        )
    }
}

const STATUS_COUNT: usize = Status::ALL.len();
const OP_KIND_COUNT: usize = OpKind::ALL.len();
const CLOSE_REASON_COUNT: usize = CloseReason::ALL.len();

/// Slot of each status code in the per-status arrays (u8::MAX = undefined).
const STATUS_SLOT: [u8; 256] = {
    let mut table = [u8::MAX; 256];
    let mut i = 0;
    while i < STATUS_COUNT {
        table[Status::ALL[i].code() as usize] = i as u8;
        i += 1;
    }
    table
};

/// Index of `status` in [`Status::ALL`].
pub fn status_slot(status: Status) -> usize {
    let slot = STATUS_SLOT[status.code() as usize];
    assert!(slot != u8::MAX, "status {status} missing from Status::ALL");
    slot as usize
}

/// Counts of one request's operations by kind and status, kept on the stack
/// while a frame is answered and added to the shard block once.
#[derive(Debug, Clone)]
pub struct OpTally {
    counts: [[u32; STATUS_COUNT]; OP_KIND_COUNT],
}

impl Default for OpTally {
    fn default() -> Self {
        OpTally {
            counts: [[0; STATUS_COUNT]; OP_KIND_COUNT],
        }
    }
}

impl OpTally {
    pub fn add(&mut self, kind: OpKind, status: Status) {
        self.counts[kind.index()][status_slot(status)] += 1;
    }

    pub fn get(&self, kind: OpKind, status: Status) -> u32 {
        self.counts[kind.index()][status_slot(status)]
    }
}

/// One shard's counters. 128-byte aligned so two shards never share a line.
#[repr(align(128))]
#[derive(Debug)]
pub struct ShardCounters {
    ops: [[AtomicU64; STATUS_COUNT]; OP_KIND_COUNT],
    /// Requests answered with a RESPONSE frame.
    requests: AtomicU64,
    /// ERROR frames sent, by status.
    error_frames: [AtomicU64; STATUS_COUNT],
    /// Time from a request being decoded to its response being encoded.
    batch_latency: AtomicHistogram,
    connections_accepted: AtomicU64,
    connections_closed: [AtomicU64; CLOSE_REASON_COUNT],
    bytes_received: AtomicU64,
    bytes_sent: AtomicU64,
}

impl Default for ShardCounters {
    fn default() -> Self {
        ShardCounters {
            ops: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            requests: AtomicU64::new(0),
            error_frames: std::array::from_fn(|_| AtomicU64::new(0)),
            batch_latency: AtomicHistogram::new(),
            connections_accepted: AtomicU64::new(0),
            connections_closed: std::array::from_fn(|_| AtomicU64::new(0)),
            bytes_received: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
        }
    }
}

impl ShardCounters {
    pub fn add_request(&self, tally: &OpTally, latency_us: u64) {
        for (row, counts) in self.ops.iter().zip(tally.counts.iter()) {
            for (cell, &n) in row.iter().zip(counts.iter()) {
                if n > 0 {
                    cell.fetch_add(u64::from(n), Ordering::Relaxed);
                }
            }
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.batch_latency.record(latency_us);
    }

    pub fn add_error_frame(&self, status: Status) {
        self.error_frames[status_slot(status)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_accepted(&self) {
        self.connections_accepted.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_closed(&self, reason: CloseReason) {
        self.connections_closed[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_received(&self, bytes: usize) {
        self.bytes_received
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn add_sent(&self, bytes: usize) {
        self.bytes_sent.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// A plain copy of this block.
    pub fn snapshot(&self) -> CountersSnapshot {
        let mut s = CountersSnapshot::default();
        s.add(self);
        s
    }
}

/// A plain (summable) copy of one or more [`ShardCounters`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CountersSnapshot {
    pub ops: [[u64; STATUS_COUNT]; OP_KIND_COUNT],
    pub requests: u64,
    pub error_frames: [u64; STATUS_COUNT],
    /// Microseconds.
    pub batch_latency: HistogramSnapshot,
    pub connections_accepted: u64,
    pub connections_closed: [u64; CLOSE_REASON_COUNT],
    pub bytes_received: u64,
    pub bytes_sent: u64,
}

impl CountersSnapshot {
    /// Adds a live block into this copy.
    pub fn add(&mut self, c: &ShardCounters) {
        for (row, live) in self.ops.iter_mut().zip(c.ops.iter()) {
            for (cell, a) in row.iter_mut().zip(live.iter()) {
                *cell += a.load(Ordering::Relaxed);
            }
        }
        self.requests += c.requests.load(Ordering::Relaxed);
        for (cell, a) in self.error_frames.iter_mut().zip(c.error_frames.iter()) {
            *cell += a.load(Ordering::Relaxed);
        }
        self.batch_latency.merge(&c.batch_latency.snapshot());
        self.connections_accepted += c.connections_accepted.load(Ordering::Relaxed);
        for (cell, a) in self
            .connections_closed
            .iter_mut()
            .zip(c.connections_closed.iter())
        {
            *cell += a.load(Ordering::Relaxed);
        }
        self.bytes_received += c.bytes_received.load(Ordering::Relaxed);
        self.bytes_sent += c.bytes_sent.load(Ordering::Relaxed);
    }

    pub fn ops(&self, kind: OpKind, status: Status) -> u64 {
        self.ops[kind.index()][status_slot(status)]
    }

    /// Operations of `kind` served, whatever their status.
    pub fn ops_of_kind(&self, kind: OpKind) -> u64 {
        self.ops[kind.index()].iter().sum()
    }

    pub fn error_frames(&self, status: Status) -> u64 {
        self.error_frames[status_slot(status)]
    }

    pub fn closed(&self, reason: CloseReason) -> u64 {
        self.connections_closed[reason.index()]
    }

    /// Connections closed for any reason.
    pub fn closed_total(&self) -> u64 {
        self.connections_closed.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_a_distinct_slot() {
        let mut seen = [false; STATUS_COUNT];
        for status in Status::ALL {
            let slot = status_slot(status);
            assert!(!seen[slot]);
            seen[slot] = true;
        }
    }

    #[test]
    fn tallies_add_up_across_shards() {
        let shards = [ShardCounters::default(), ShardCounters::default()];
        let mut tally = OpTally::default();
        tally.add(OpKind::Put, Status::Ok);
        tally.add(OpKind::Put, Status::Ok);
        tally.add(OpKind::Get, Status::NotFound);
        shards[0].add_request(&tally, 10);
        shards[1].add_request(&tally, 1000);
        shards[1].add_closed(CloseReason::IdleTimeout);
        shards[0].add_error_frame(Status::ChecksumMismatch);
        let mut total = CountersSnapshot::default();
        for s in &shards {
            total.add(s);
        }
        assert_eq!(total.ops(OpKind::Put, Status::Ok), 4);
        assert_eq!(total.ops_of_kind(OpKind::Get), 2);
        assert_eq!(total.requests, 2);
        assert_eq!(total.batch_latency.count(), 2);
        assert_eq!(total.closed(CloseReason::IdleTimeout), 1);
        assert_eq!(total.closed_total(), 1);
        assert_eq!(total.error_frames(Status::ChecksumMismatch), 1);
    }
}
