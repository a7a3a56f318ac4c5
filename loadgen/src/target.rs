//! The boundary between workloads and the system under test: "open a
//! connection, send a batch of operations, get one answer per operation, read
//! the server's STATS".
//!
//! What must hold: a session answers a batch with exactly one [`Reply`] per
//! [`Op`], in request order; a transport failure is a [`TargetError`] (it ends
//! the run), while a refused operation is a [`Reply::Failed`] (it is counted).

use bytes::Bytes;
use std::future::Future;

/// One operation of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put {
        key: Bytes,
        value: Bytes,
    },
    Get {
        key: Bytes,
    },
    /// Up to `count` records in key order starting at `start` (YCSB E).
    Scan {
        start: Bytes,
        count: u32,
    },
    /// Opens the session's transaction.
    Begin,
    /// Locks and reads a key (in a transaction).
    GetForUpdate {
        key: Bytes,
    },
    Commit,
    Rollback,
}

/// The answer to one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A put was applied.
    Done,
    /// A get found its key.
    Value(Bytes),
    /// A get found no such key.
    NotFound,
    /// A scan returned this many records.
    Rows(u32),
    /// The server refused the operation; the text is its reason.
    Failed(String),
    /// The transaction was aborted (DIE, LOCK_TIMEOUT, ABORTED): retry it.
    Aborted(String),
}

/// A failure of the connection or the protocol: the run cannot go on.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    #[error("cannot connect to {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("request to {addr} failed: {reason}")]
    Request { addr: String, reason: String },
    #[error("server at {addr} answered {got} replies to a batch of {sent} operations")]
    ReplyCount {
        addr: String,
        sent: usize,
        got: usize,
    },
    #[error("server at {addr} does not support {what}")]
    Unsupported { addr: String, what: &'static str },
}

/// Something loadgen can benchmark: the embedded server or a running daemon.
pub trait Target: Send + Sync + 'static {
    type Session: Session;

    /// Opens one connection (one per client task).
    fn connect(&self) -> impl Future<Output = Result<Self::Session, TargetError>> + Send;

    /// The address the sessions connect to, for reports.
    fn addr(&self) -> String;
}

/// One connection to a [`Target`].
pub trait Session: Send + 'static {
    /// Sends `ops` as one batch; answers one reply per op, in order.
    fn batch(
        &mut self,
        ops: Vec<Op>,
    ) -> impl Future<Output = Result<Vec<Reply>, TargetError>> + Send;

    /// The server's STATS (name, value) pairs (names: docs/loadgen.md).
    fn stats(&mut self) -> impl Future<Output = Result<Vec<(String, String)>, TargetError>> + Send;

    /// Whether the target has an ordered range read (YCSB E's scan needs
    /// one; ringkv's hash-order SCAN does not serve it).
    fn supports_scan(&self) -> bool;
}

/// An in-memory target for the driver's and workloads' unit tests: a sorted
/// map behind a mutex, with STATS counters shaped like the server's.
#[cfg(test)]
pub mod memory {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    #[derive(Debug, Default)]
    struct State {
        map: BTreeMap<Bytes, Bytes>,
        puts: u64,
        gets: u64,
        /// Keys whose reads answer a wrong value (to test verification).
        corrupt: Vec<Bytes>,
    }

    #[derive(Debug, Clone, Default)]
    pub struct MemoryTarget {
        state: Arc<Mutex<State>>,
        pub scan: bool,
        /// A session unused for this long is closed, as a server closes
        /// idle connections: its next request fails.
        pub idle_close: Option<std::time::Duration>,
    }

    impl MemoryTarget {
        pub fn with_scan(scan: bool) -> MemoryTarget {
            MemoryTarget {
                scan,
                ..MemoryTarget::default()
            }
        }
        pub fn keys(&self) -> usize {
            self.state.lock().expect("lock").map.len()
        }
        pub fn corrupt(&self, key: Bytes) {
            self.state.lock().expect("lock").corrupt.push(key);
        }
    }

    pub struct MemorySession {
        state: Arc<Mutex<State>>,
        scan: bool,
        idle_close: Option<std::time::Duration>,
        last_used: std::time::Instant,
    }

    impl MemorySession {
        /// Fails a request on a session the "server" closed for idleness.
        fn touch(&mut self) -> Result<(), TargetError> {
            let now = std::time::Instant::now();
            let idle = now.duration_since(self.last_used);
            self.last_used = now;
            match self.idle_close {
                Some(max) if idle > max => Err(TargetError::Request {
                    addr: "memory".to_string(),
                    reason: "the server closed the connection (idle)".to_string(),
                }),
                _ => Ok(()),
            }
        }
    }

    impl Target for MemoryTarget {
        type Session = MemorySession;
        async fn connect(&self) -> Result<MemorySession, TargetError> {
            Ok(MemorySession {
                state: self.state.clone(),
                scan: self.scan,
                idle_close: self.idle_close,
                last_used: std::time::Instant::now(),
            })
        }
        fn addr(&self) -> String {
            "memory".to_string()
        }
    }

    impl Session for MemorySession {
        async fn batch(&mut self, ops: Vec<Op>) -> Result<Vec<Reply>, TargetError> {
            self.touch()?;
            let mut st = self.state.lock().expect("lock");
            let mut out = Vec::with_capacity(ops.len());
            for op in ops {
                out.push(match op {
                    Op::Put { key, value } => {
                        st.puts += 1;
                        st.map.insert(key, value);
                        Reply::Done
                    }
                    Op::Get { key } => {
                        st.gets += 1;
                        if st.corrupt.contains(&key) {
                            Reply::Value(Bytes::from_static(b"garbage"))
                        } else {
                            match st.map.get(&key) {
                                Some(v) => Reply::Value(v.clone()),
                                None => Reply::NotFound,
                            }
                        }
                    }
                    Op::Scan { start, count } => {
                        let n = st.map.range(start..).take(count as usize).count();
                        Reply::Rows(n as u32)
                    }
                    // One session at a time holds the map: no contention here.
                    Op::Begin | Op::Commit | Op::Rollback => Reply::Done,
                    Op::GetForUpdate { key } => match st.map.get(&key) {
                        Some(v) => Reply::Value(v.clone()),
                        None => Reply::NotFound,
                    },
                });
            }
            Ok(out)
        }

        async fn stats(&mut self) -> Result<Vec<(String, String)>, TargetError> {
            self.touch()?;
            let st = self.state.lock().expect("lock");
            let pairs = [
                ("server.version", "0.0.0-memory".to_string()),
                ("server.backend", "memory".to_string()),
                ("server.durability", "none".to_string()),
                ("server.shards", "1".to_string()),
                ("ops.put", st.puts.to_string()),
                ("ops.get", st.gets.to_string()),
                ("engine.keys", st.map.len().to_string()),
                ("device.wal.profile", "unthrottled".to_string()),
                ("device.wal.iops_limit", "0".to_string()),
                ("device.wal.burst_iops", "0".to_string()),
                ("device.wal.ios", (st.puts / 100).to_string()),
                ("device.wal.writes", (st.puts / 100).to_string()),
                ("device.wal.bytes_written", (st.puts * 1000).to_string()),
                ("device.wal.fsync_p99_us", "150".to_string()),
                ("device.wal.token_wait_us", "0".to_string()),
            ];
            Ok(pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect())
        }

        fn supports_scan(&self) -> bool {
            self.scan
        }
    }
}
