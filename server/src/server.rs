//! Starting and stopping a whole server: lock the data directory (and every
//! device directory outside it), bind the
//! per-shard listeners, open the engine (recovery), start each shard's
//! accept loop on its own runtime thread and the `/metrics` endpoint; and
//! the reverse on shutdown.
//!
//! What must hold: [`start`] either returns a server that is serving or
//! leaves nothing behind (lock released, engine shut down); a graceful
//! [`RunningServer::shutdown`] stops accepting, lets connections answer what
//! they read, then flushes and fsyncs the engine before returning.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ringkv_protocol::{Limits, ServerInfo};
use tunables::Config;

use crate::auth::{AuthError, Authenticator};
use crate::lockfile::{DirLock, LockError};
use crate::native::listener::{run_shard, DRAIN_TIME};
use crate::native::session::accepted_hello_ack;
use crate::ops::http::MetricsServer;
use crate::shard::{Access, DeviceFacts, ServerFacts, ShardContext, Shared};
use crate::sockets::{bind_reuseport_group, BindError};
use crate::tls::{TlsConfig, TlsError, TlsFiles};

/// How long [`RunningServer::shutdown`] waits for the shards to drain before
/// it shuts the engine down anyway.
const SHARD_STOP_WAIT: Duration = Duration::from_secs(10);

/// Why a server could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error("invalid configuration:\n{0}")]
    Config(#[from] tunables::ConfigErrors),
    #[error("cannot use {field} = \"{value}\": {reason}")]
    Address {
        field: &'static str,
        value: String,
        reason: String,
    },
    #[error("the limits in the configuration cannot be advertised to clients: {0}")]
    Limits(#[from] ringkv_protocol::LimitsError),
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("cannot open the engine: {0}")]
    Engine(#[source] engine::EngineError),
    #[error("cannot start the metrics endpoint on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("engine shutdown failed: {0}")]
    Shutdown(#[source] engine::EngineError),
}

/// Lets another thread (a signal handler thread, a test) ask a server to
/// stop; [`RunningServer::wait`] returns once asked.
#[derive(Debug, Clone, Default)]
pub struct StopHandle {
    inner: Arc<(Mutex<bool>, Condvar)>,
}

impl StopHandle {
    pub fn request_stop(&self) {
        let (flag, cv) = &*self.inner;
        let mut stop = flag.lock().unwrap_or_else(|e| e.into_inner());
        *stop = true;
        cv.notify_all();
    }

    pub fn is_stop_requested(&self) -> bool {
        let (flag, _) = &*self.inner;
        *flag.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait(&self) {
        let (flag, cv) = &*self.inner;
        let mut stop = flag.lock().unwrap_or_else(|e| e.into_inner());
        while !*stop {
            stop = cv.wait(stop).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A started server. Dropping it without [`RunningServer::shutdown`] shuts
/// it down anyway (and logs an error if that fails).
#[derive(Debug)]
pub struct RunningServer {
    local_addr: SocketAddr,
    metrics: Option<MetricsServer>,
    shared: Arc<Shared>,
    engine: Option<engine::Engine>,
    stops: Vec<futures::channel::oneshot::Sender<()>>,
    /// Each shard's accept loop reports here when it has drained (behind a
    /// mutex only so that `RunningServer` is `Sync`).
    stopped_shards: Mutex<mpsc::Receiver<usize>>,
    stop_handle: StopHandle,
    /// The TLS certificates, when a listener uses TLS.
    tls: Option<Arc<TlsConfig>>,
    /// Locks on the data directory and every other device directory, held
    /// until the engine is shut down.
    locks: Vec<DirLock>,
}

fn resolve(field: &'static str, value: &str) -> Result<SocketAddr, ServerError> {
    let mut addrs = value.to_socket_addrs().map_err(|e| ServerError::Address {
        field,
        value: value.to_string(),
        reason: e.to_string(),
    })?;
    addrs.next().ok_or_else(|| ServerError::Address {
        field,
        value: value.to_string(),
        reason: "it resolves to no address".to_string(),
    })
}

/// The limits clients are told in the hello-ack (and that the server
/// enforces), from the configuration.
pub fn limits_from_config(config: &Config) -> Result<Limits, ServerError> {
    let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    let limits = Limits {
        frame_bytes_max: clamp(config.limits.frame_bytes_max.as_u64()),
        ops_per_frame_max: config.limits.ops_per_frame_max,
        key_bytes_max: clamp(config.limits.key_bytes_max.as_u64()),
        value_bytes_max: clamp(config.limits.value_bytes_max.as_u64()),
        pipeline_depth_max: config.server.pipeline_depth_max,
    };
    limits.validate()?;
    Ok(limits)
}

/// The addresses the configuration names, resolved before anything binds.
struct Addresses {
    listen: SocketAddr,
    metrics: Option<SocketAddr>,
    resp: Option<SocketAddr>,
}

impl Addresses {
    fn resolve(config: &Config) -> Result<Addresses, ServerError> {
        let optional = |field: &'static str, value: &str| {
            if value.trim().is_empty() {
                Ok(None)
            } else {
                resolve(field, value).map(Some)
            }
        };
        Ok(Addresses {
            listen: resolve("server.listen", &config.server.listen)?,
            metrics: optional("server.metrics_listen", &config.server.metrics_listen)?,
            resp: optional("server.resp_listen", &config.server.resp_listen)?,
        })
    }
}

/// What answers while the engine recovers: the RESP port with -LOADING,
/// and the metrics endpoint (/healthz at once, /readyz and /metrics 503).
/// Dropping either stops it, so a failed start leaves neither behind.
struct EarlyPorts {
    loading: Option<crate::resp::loading::LoadingResponder>,
    metrics: Option<MetricsServer>,
}

impl EarlyPorts {
    fn start(
        addresses: &Addresses,
        resp_tls: Option<Arc<TlsConfig>>,
        metrics_access: crate::ops::http::MetricsAccess,
    ) -> Result<EarlyPorts, ServerError> {
        let loading = match addresses.resp {
            None => None,
            Some(addr) => {
                let responder = crate::resp::loading::LoadingResponder::start(addr, resp_tls)
                    .map_err(|source| match source.kind() {
                        std::io::ErrorKind::AddrInUse => BindError::AddrInUse { addr },
                        _ => BindError::Socket {
                            addr,
                            step: "bind",
                            source,
                        },
                    })?;
                tracing::info!(resp = %responder.addr(), "RESP port answers -LOADING until recovery ends");
                Some(responder)
            }
        };
        let metrics = match addresses.metrics {
            None => None,
            Some(addr) => {
                let m = MetricsServer::start(addr, metrics_access)
                    .map_err(|source| ServerError::Metrics { addr, source })?;
                tracing::info!(metrics = %m.local_addr(), "metrics endpoint answers /readyz 503 until recovery ends");
                Some(m)
            }
        };
        Ok(EarlyPorts { loading, metrics })
    }
}

/// The per-shard listeners of both ports, bound once the engine is open.
struct ShardListeners {
    native: Vec<std::net::TcpListener>,
    local_addr: SocketAddr,
    resp: Vec<std::net::TcpListener>,
    resp_addr: Option<SocketAddr>,
}

impl ShardListeners {
    /// Binds one native listener per shard, and takes the RESP port over
    /// from the loading responder (the port it was given, when the
    /// configuration said port 0).
    fn bind(
        config: &Config,
        listen: SocketAddr,
        loading: Option<crate::resp::loading::LoadingResponder>,
        shard_count: usize,
    ) -> Result<ShardListeners, ServerError> {
        let native = bind_reuseport_group(listen, shard_count)?;
        let local_addr = native[0].local_addr().map_err(|e| ServerError::Address {
            field: "server.listen",
            value: config.server.listen.clone(),
            reason: e.to_string(),
        })?;
        let (resp, resp_addr) = match loading.map(|l| l.stop()) {
            None => (Vec::new(), None),
            Some(addr) => {
                let l = bind_reuseport_group(addr, shard_count)?;
                let local = l[0].local_addr().map_err(|source| BindError::Socket {
                    addr,
                    step: "read the local address of",
                    source,
                })?;
                (l, Some(local))
            }
        };
        Ok(ShardListeners {
            native,
            local_addr,
            resp,
            resp_addr,
        })
    }
}

/// What INFO, STATS and the logs say about this server.
fn server_facts(
    config: &Config,
    engine: &engine::Engine,
    resp_listen: Option<SocketAddr>,
) -> ServerFacts {
    ServerFacts {
        version: env!("CARGO_PKG_VERSION"),
        backend: engine.backend().to_string(),
        durability: durability_name(config.storage.durability).to_string(),
        tier: engine.tier().as_str().to_string(),
        shard_count: engine.shard_count(),
        cpus: engine
            .shard_cpus()
            .iter()
            .map(|c| c.map_or("-".to_string(), |c| c.to_string()))
            .collect::<Vec<_>>()
            .join(","),
        resp_listen,
        resp_flush_enabled: config.server.resp_flush_enabled,
        devices: config
            .devices
            .iter()
            .map(|(name, d)| DeviceFacts {
                name: name.clone(),
                profile_name: d.profile.clone(),
                // Validation guarantees the profile exists.
                profile: config
                    .device_profile(name)
                    .unwrap_or_else(tunables::ProfileConfig::unthrottled),
            })
            .collect(),
    }
}

/// The state every shard's connections share.
fn shared_state(
    config: &Config,
    access: Access,
    limits: Limits,
    engine: &engine::Engine,
    facts: ServerFacts,
) -> Arc<Shared> {
    let shard_count = engine.shard_count();
    let hello_ack = accepted_hello_ack(
        limits,
        ServerInfo {
            server_id: server_id(),
            shard_count: u32::try_from(shard_count).unwrap_or(u32::MAX),
            server_name: format!("ringkv-server {}", env!("CARGO_PKG_VERSION")),
        },
    );
    Arc::new(Shared::new(
        access,
        limits,
        hello_ack,
        shard_count,
        config.server.idle_timeout.get(),
        config.server.max_connections as usize,
        facts,
        engine.handle(),
        crate::native::txn::TxnConfig::from_config(&config.server),
    ))
}

/// Starts each shard's accept loop on its runtime thread; each reports its
/// index on the returned channel once it has drained.
fn spawn_accept_loops(
    engine: &engine::Engine,
    shared: &Arc<Shared>,
    listeners: ShardListeners,
) -> (
    Vec<futures::channel::oneshot::Sender<()>>,
    mpsc::Receiver<usize>,
) {
    let (stopped_tx, stopped_shards) = mpsc::channel();
    let mut stops = Vec::with_capacity(listeners.native.len());
    let mut resp_listeners = listeners.resp.into_iter();
    for (shard, listener) in listeners.native.into_iter().enumerate() {
        let (stop_tx, stop_rx) = futures::channel::oneshot::channel();
        stops.push(stop_tx);
        let shared = Arc::clone(shared);
        let stopped_tx = stopped_tx.clone();
        let resp_listener = resp_listeners.next();
        engine.spawn_on(shard, move || async move {
            let ctx = std::rc::Rc::new(ShardContext::new(shard, shared));
            run_shard(ctx, listener, resp_listener, stop_rx).await;
            let _ = stopped_tx.send(shard);
        });
    }
    (stops, stopped_shards)
}

fn log_ready(
    config: &Config,
    shared: &Shared,
    local_addr: SocketAddr,
    metrics: Option<&MetricsServer>,
) {
    let devices: Vec<String> = shared
        .facts
        .devices
        .iter()
        .map(|d| format!("{}={}", d.name, d.profile_name))
        .collect();
    tracing::info!(
        addr = %local_addr,
        metrics = %metrics.map(|m| m.local_addr().to_string()).unwrap_or_else(|| "off".into()),
        resp = %shared.facts.resp_listen.map(|a| a.to_string()).unwrap_or_else(|| "off".into()),
        shards = shared.facts.shard_count,
        cpus = %shared.facts.cpus,
        durability = %shared.facts.durability,
        tier = %shared.facts.tier,
        backend = %shared.facts.backend,
        devices = %devices.join(","),
        auth = if shared.access.auth.is_required() { "password" } else { "none" },
        tls_native = config.server.tls_native,
        tls_metrics = config.server.tls_metrics,
        tls_resp = config.server.tls_resp,
        data_dir = %config.storage.data_dir.display(),
        pid = std::process::id(),
        "ringkv-server ready"
    );
}

/// Starts a server for `config` and returns once it is serving.
pub fn start(config: Config) -> Result<RunningServer, ServerError> {
    config.validate()?;
    let addresses = Addresses::resolve(&config)?;
    let limits = limits_from_config(&config)?;
    let auth = Arc::new(Authenticator::from_config(&config)?);
    let tls = match TlsFiles::from_config(&config) {
        Some(files) => Some(Arc::new(TlsConfig::load(files)?)),
        None => None,
    };
    let access = Access {
        auth: Arc::clone(&auth),
        handshake_timeout: config.server.handshake_timeout.get(),
        tls: tls.clone().filter(|_| config.server.tls_native),
        resp_tls: tls.clone().filter(|_| config.server.tls_resp),
    };
    let metrics_access = crate::ops::http::MetricsAccess {
        auth: Arc::clone(&auth),
        tls: tls.clone().filter(|_| config.server.tls_metrics),
    };
    let locks = lock_directories(&config)?;
    let early = EarlyPorts::start(&addresses, access.resp_tls.clone(), metrics_access)?;

    let engine = engine::Engine::open(&config).map_err(ServerError::Engine)?;
    let listeners = match ShardListeners::bind(
        &config,
        addresses.listen,
        early.loading,
        engine.shard_count(),
    ) {
        Ok(l) => l,
        Err(e) => {
            shutdown_engine_after_failed_start(engine);
            return Err(e);
        }
    };
    let local_addr = listeners.local_addr;
    let facts = server_facts(&config, &engine, listeners.resp_addr);
    let shared = shared_state(&config, access, limits, &engine, facts);
    let metrics = early.metrics;
    if let Some(m) = &metrics {
        m.serve_pages(Box::new(ServerPages(Arc::clone(&shared))));
    }
    let (stops, stopped_shards) = spawn_accept_loops(&engine, &shared, listeners);
    log_ready(&config, &shared, local_addr, metrics.as_ref());
    Ok(RunningServer {
        local_addr,
        metrics,
        shared,
        engine: Some(engine),
        stops,
        stopped_shards: Mutex::new(stopped_shards),
        stop_handle: StopHandle::default(),
        tls,
        locks,
    })
}

/// Locks the data directory, then each device directory that is not the
/// data directory (two servers must not share WAL files either).
fn lock_directories(config: &Config) -> Result<Vec<DirLock>, ServerError> {
    let data_dir = &config.storage.data_dir;
    let mut locks = vec![DirLock::acquire(data_dir)?];
    let mut locked = vec![std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.clone())];
    for device in config.devices.values() {
        if device.path.as_os_str().is_empty() {
            continue; // on the data directory
        }
        std::fs::create_dir_all(&device.path).map_err(|source| LockError::CreateDir {
            path: device.path.clone(),
            source,
        })?;
        let canonical = std::fs::canonicalize(&device.path).unwrap_or_else(|_| device.path.clone());
        if locked.contains(&canonical) {
            continue;
        }
        locks.push(DirLock::acquire(&device.path)?);
        locked.push(canonical);
    }
    Ok(locks)
}

/// What the metrics endpoint serves for a running server.
struct ServerPages(Arc<Shared>);

impl crate::ops::http::Pages for ServerPages {
    fn metrics(&self) -> String {
        crate::ops::metrics::render(&self.0, &self.0.handle.metrics())
    }

    fn readiness(&self) -> Result<(), String> {
        if self.0.is_shutting_down() {
            return Err("shutting down".to_string());
        }
        let poisoned: Vec<String> = self
            .0
            .handle
            .metrics()
            .shards
            .iter()
            .enumerate()
            .filter(|(_, s)| s.poisoned)
            .map(|(i, _)| i.to_string())
            .collect();
        if poisoned.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "shard {} poisoned (a failed write or fdatasync); restart the server",
                poisoned.join(", ")
            ))
        }
    }
}

fn shutdown_engine_after_failed_start(engine: engine::Engine) {
    if let Err(e) = engine.shutdown() {
        tracing::error!(error = %e, "engine shutdown after a failed start also failed");
    }
}

fn durability_name(d: tunables::Durability) -> &'static str {
    match d {
        tunables::Durability::Sync => "sync",
        tunables::Durability::Async => "async",
        tunables::Durability::None => "none",
    }
}

/// A per-start identity for the hello-ack: changes on every start, so a
/// client can tell a restarted server from the one it knew.
fn server_id() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    // Mixed time and pid: distinct across restarts and processes.
    engine::rng::mix64(nanos ^ (u64::from(std::process::id()) << 32))
}

impl RunningServer {
    /// The address clients connect to (the real port when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The RESP (Redis-protocol) listener's address, when enabled (the real
    /// port when 0 was asked).
    pub fn resp_addr(&self) -> Option<SocketAddr> {
        self.shared.facts.resp_listen
    }

    /// The `/metrics` endpoint's address, when enabled.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(MetricsServer::local_addr)
    }

    /// A snapshot of the engine's metrics.
    pub fn engine_metrics(&self) -> engine::metrics::EngineMetrics {
        self.shared.handle.metrics()
    }

    /// The STATS pairs, as a client would get them.
    pub fn stats(&self) -> Vec<(String, String)> {
        crate::ops::stats::stats_pairs(&self.shared, &self.shared.handle.metrics())
    }

    /// The Prometheus page, as `/metrics` would serve it.
    pub fn render_metrics(&self) -> String {
        crate::ops::metrics::render(&self.shared, &self.shared.handle.metrics())
    }

    /// Reads the TLS certificate, key and client-CA files again and uses them
    /// for new connections (open ones keep theirs). `Ok(false)`: TLS is off.
    /// On error the previous certificates stay in use.
    pub fn reload_tls(&self) -> Result<bool, TlsError> {
        match &self.tls {
            None => Ok(false),
            Some(tls) => tls.reload().map(|()| true),
        }
    }

    /// A handle that reloads the TLS files from another thread (SIGHUP).
    pub fn tls_reloader(&self) -> Option<Arc<TlsConfig>> {
        self.tls.clone()
    }

    /// A handle other threads use to ask this server to stop.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop_handle.clone()
    }

    /// Blocks until a stop is requested through [`RunningServer::stop_handle`].
    pub fn wait(&self) {
        self.stop_handle.wait();
    }

    /// Graceful stop: stop accepting, let connections answer what they have
    /// read (new requests get SHUTTING_DOWN), then flush and fsync the
    /// engine. Returns the engine's shutdown result.
    pub fn shutdown(mut self) -> Result<(), ServerError> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), ServerError> {
        let Some(engine) = self.engine.take() else {
            return Ok(());
        };
        let started = Instant::now();
        tracing::info!(
            open_connections = self.shared.connections_open(),
            "ringkv-server stopping"
        );
        self.stop_handle.request_stop();
        self.shared.begin_shutdown();
        let shard_count = self.stops.len();
        for stop in self.stops.drain(..) {
            // A shard whose loop already ended dropped its receiver; fine.
            let _ = stop.send(());
        }
        let deadline = Instant::now() + SHARD_STOP_WAIT.max(DRAIN_TIME * 2);
        let mut stopped = 0;
        let stopped_shards = self
            .stopped_shards
            .get_mut()
            .unwrap_or_else(|e| e.into_inner());
        while stopped < shard_count {
            let left = deadline.saturating_duration_since(Instant::now());
            match stopped_shards.recv_timeout(left) {
                Ok(_) => stopped += 1,
                Err(_) => {
                    tracing::warn!(
                        stopped,
                        shards = shard_count,
                        "not every shard finished draining in time; stopping the engine anyway"
                    );
                    break;
                }
            }
        }
        if let Some(m) = self.metrics.take() {
            m.stop();
        }
        let result = engine.shutdown().map_err(ServerError::Shutdown);
        match &result {
            Ok(()) => tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "ringkv-server stopped: connections drained, engine flushed and synced"
            ),
            Err(e) => tracing::error!(error = %e, "ringkv-server stopped with an engine error"),
        }
        self.locks.clear();
        result
    }
}

// Loadgen shares a running server between threads.
const _: () = {
    const fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<RunningServer>();
    send_and_sync::<StopHandle>();
};

impl Drop for RunningServer {
    fn drop(&mut self) {
        if self.engine.is_some() {
            if let Err(e) = self.stop_inner() {
                tracing::error!(error = %e, "shutdown on drop failed");
            }
        }
    }
}
