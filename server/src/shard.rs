//! What the server keeps per shard thread ([`ShardContext`]: the engine
//! handle, the registry of this thread's connections, a log rate limiter)
//! and across threads ([`Shared`]: limits, the encoded hello-ack, counters,
//! the open-connection total, the shutting-down flag).
//!
//! What must hold: [`ShardContext`] never leaves its thread (it is `!Send`
//! by construction, `Rc`/`Cell`); the only cross-thread state touched per
//! connection is the open-connection total (at accept and close) and per
//! request the shard's own counter block and the shutting-down flag (a
//! relaxed load).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ringkv_protocol::Limits;

use crate::auth::Authenticator;
use crate::native::connection::ConnState;
use crate::native::session::CloseReason;
use crate::ops::counters::{CountersSnapshot, ShardCounters};

/// Facts about the running server that STATS and /metrics report.
#[derive(Debug, Clone)]
pub struct ServerFacts {
    pub version: &'static str,
    pub backend: String,
    pub durability: String,
    /// `storage.tier`: `memory` or `hybrid`.
    pub tier: String,
    pub shard_count: usize,
    /// Where the shard threads run: "0,1" (shard i on the i-th CPU), "-"
    /// for a shard not pinned (`io.cpus`).
    pub cpus: String,
    /// The RESP listener's address, when enabled.
    pub resp_listen: Option<SocketAddr>,
    /// Whether RESP FLUSHDB/FLUSHALL run (`server.resp_flush_enabled`).
    pub resp_flush_enabled: bool,
    /// Every configured device with its profile.
    pub devices: Vec<DeviceFacts>,
}

/// A configured device and the disk profile it enforces.
#[derive(Debug, Clone)]
pub struct DeviceFacts {
    pub name: String,
    pub profile_name: String,
    pub profile: tunables::ProfileConfig,
}

/// Who may use the data listener: the password check and the handshake
/// deadline.
#[derive(Debug)]
pub struct Access {
    pub auth: Arc<Authenticator>,
    /// A connection must complete its handshake (TLS included) within this.
    pub handshake_timeout: Duration,
    /// TLS on the native listener; `None`: plaintext.
    pub tls: Option<Arc<crate::tls::TlsConfig>>,
    /// TLS on the RESP listener; `None`: plaintext.
    pub resp_tls: Option<Arc<crate::tls::TlsConfig>>,
}

impl Access {
    /// No password, no TLS, the default handshake deadline.
    pub fn open() -> Access {
        Access {
            auth: Arc::new(Authenticator::open()),
            handshake_timeout: Duration::from_secs(10),
            tls: None,
            resp_tls: None,
        }
    }
}

/// State shared by every shard thread of one server.
#[derive(Debug)]
pub struct Shared {
    pub access: Access,
    pub limits: Limits,
    /// The encoded hello-ack, identical for every connection.
    pub hello_ack: Bytes,
    pub counters: Box<[ShardCounters]>,
    /// The RESP listener's counters, one block per shard.
    pub resp_counters: Box<[crate::resp::RespCounters]>,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub started: Instant,
    pub facts: ServerFacts,
    pub handle: engine::Handle,
    /// Transaction limits and timeouts (`server.txn_*`).
    pub txn: crate::native::txn::TxnConfig,
    connections_open: AtomicUsize,
    shutting_down: AtomicBool,
}

impl Shared {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        access: Access,
        limits: Limits,
        hello_ack: Bytes,
        shard_count: usize,
        idle_timeout: Duration,
        max_connections: usize,
        facts: ServerFacts,
        handle: engine::Handle,
        txn: crate::native::txn::TxnConfig,
    ) -> Shared {
        Shared {
            access,
            limits,
            hello_ack,
            counters: (0..shard_count).map(|_| ShardCounters::default()).collect(),
            resp_counters: (0..shard_count)
                .map(|_| crate::resp::RespCounters::default())
                .collect(),
            idle_timeout,
            max_connections,
            started: Instant::now(),
            facts,
            handle,
            txn,
            connections_open: AtomicUsize::new(0),
            shutting_down: AtomicBool::new(false),
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Connections open on all shards.
    pub fn connections_open(&self) -> usize {
        self.connections_open.load(Ordering::Relaxed)
    }

    /// Takes one of the `max_connections` slots, or `None` if all are taken.
    pub fn try_acquire_connection(self: &Arc<Self>) -> Option<ConnectionSlot> {
        let mut current = self.connections_open.load(Ordering::Relaxed);
        loop {
            if current >= self.max_connections {
                return None;
            }
            match self.connections_open.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(ConnectionSlot {
                        shared: Arc::clone(self),
                    })
                }
                Err(seen) => current = seen,
            }
        }
    }

    /// The sum of every shard's counters.
    pub fn counters_total(&self) -> CountersSnapshot {
        let mut total = CountersSnapshot::default();
        for c in self.counters.iter() {
            total.add(c);
        }
        total
    }
}

/// One taken connection slot; released when dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    shared: Arc<Shared>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let before = self.shared.connections_open.fetch_sub(1, Ordering::AcqRel);
        assert!(before >= 1, "connection slot released twice");
    }
}

/// A connection's place in its shard's registry; removed on drop.
#[derive(Debug)]
pub struct Registration {
    ctx: Rc<ShardContext>,
    conn: Rc<ConnState>,
}

impl Registration {
    pub fn conn(&self) -> &Rc<ConnState> {
        &self.conn
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let removed = self.ctx.conns.borrow_mut().remove(&self.conn.id);
        assert!(
            removed.is_some(),
            "connection {} unregistered twice",
            self.conn.id
        );
    }
}

/// Warnings about misbehaving clients allowed per second per shard; the
/// rest go to debug level so a flood of garbage cannot flood the log.
const WARNINGS_PER_SECOND: u32 = 5;

/// One shard thread's server state. Lives in an `Rc` on that thread.
#[derive(Debug)]
pub struct ShardContext {
    pub shard: usize,
    pub shared: Arc<Shared>,
    pub handle: engine::Handle,
    conns: RefCell<HashMap<u64, Rc<ConnState>>>,
    next_conn_id: Cell<u64>,
    warn_window_start: Cell<Instant>,
    warnings_in_window: Cell<u32>,
    warnings_suppressed: Cell<u64>,
}

impl ShardContext {
    pub fn new(shard: usize, shared: Arc<Shared>) -> ShardContext {
        let handle = shared.handle.clone();
        ShardContext {
            shard,
            shared,
            handle,
            conns: RefCell::new(HashMap::new()),
            next_conn_id: Cell::new(0),
            warn_window_start: Cell::new(Instant::now()),
            warnings_in_window: Cell::new(0),
            warnings_suppressed: Cell::new(0),
        }
    }

    pub fn counters(&self) -> &ShardCounters {
        &self.shared.counters[self.shard]
    }

    pub fn resp_counters(&self) -> &crate::resp::RespCounters {
        &self.shared.resp_counters[self.shard]
    }

    /// Adds a connection to this shard's registry; it stays there until the
    /// returned guard is dropped, which must happen before its socket is
    /// closed (declare the guard after the socket so it drops first, also
    /// when unwinding).
    pub fn register(self: &Rc<Self>, peer: SocketAddr, fd: RawFd) -> Registration {
        let n = self.next_conn_id.get();
        self.next_conn_id.set(n + 1);
        // Ids are unique per server: shard in the top byte.
        let id = ((self.shard as u64) << 56) | n;
        let now = Instant::now();
        let conn = Rc::new(ConnState::new(
            id,
            peer,
            fd,
            now,
            now + self.shared.access.handshake_timeout,
        ));
        self.conns.borrow_mut().insert(id, Rc::clone(&conn));
        Registration {
            ctx: Rc::clone(self),
            conn,
        }
    }

    /// Connections open on this shard.
    pub fn connection_count(&self) -> usize {
        self.conns.borrow().len()
    }

    /// Closes connections idle for `idle_timeout`, and those that did not
    /// finish their handshake in time; returns how many.
    pub fn close_idle(&self, now: Instant) -> usize {
        let timeout = self.shared.idle_timeout;
        let idle: Vec<(Rc<ConnState>, CloseReason)> = self
            .conns
            .borrow()
            .values()
            .filter_map(|c| c.idle_reason(now, timeout).map(|r| (Rc::clone(c), r)))
            .collect();
        for (conn, reason) in &idle {
            conn.force_close(*reason, true);
        }
        idle.len()
    }

    /// Stops reading every connection (`both`: also writing), so each one
    /// answers what it has read and closes.
    pub fn close_all(&self, reason: CloseReason, both: bool) {
        let all: Vec<Rc<ConnState>> = self.conns.borrow().values().cloned().collect();
        for conn in all {
            conn.force_close(reason, both);
        }
    }

    /// Whether a warning about a client may be logged now (rate limit).
    pub fn allow_warning(&self) -> bool {
        let now = Instant::now();
        if now.saturating_duration_since(self.warn_window_start.get()) >= Duration::from_secs(1) {
            let suppressed = self.warnings_suppressed.replace(0);
            if suppressed > 0 {
                tracing::warn!(
                    shard = self.shard,
                    suppressed,
                    "more client protocol warnings were suppressed (see debug logs)"
                );
            }
            self.warn_window_start.set(now);
            self.warnings_in_window.set(0);
        }
        let n = self.warnings_in_window.get();
        if n < WARNINGS_PER_SECOND {
            self.warnings_in_window.set(n + 1);
            true
        } else {
            self.warnings_suppressed
                .set(self.warnings_suppressed.get() + 1);
            false
        }
    }

    /// The STATS answer from a snapshot whose tier counters may be up to
    /// one background pause old (for answers that cannot wait).
    pub fn stats_pairs(&self) -> Vec<(String, String)> {
        crate::ops::stats::stats_pairs(&self.shared, &self.handle.metrics())
    }

    /// The STATS answer, with every shard's tier counters copied after
    /// whatever was answered before it (see `Handle::metrics_now`).
    pub async fn stats_pairs_now(&self) -> Vec<(String, String)> {
        crate::ops::stats::stats_pairs(&self.shared, &self.handle.metrics_now().await)
    }
}
