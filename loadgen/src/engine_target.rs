//! `--target engine`: the ringkv engine library driven in this process, with
//! no TCP and no protocol in between, the way the MapDB/ChronicleMap document
//! drove its stores. Each engine gets a fresh temporary data directory and
//! the chosen disk profile on its WAL device.
//!
//! A call runs on the shard thread that owns its first key (as the server's
//! connections do): the batch is handed to that shard's runtime with
//! [`Engine::spawn_on`] and answered through a oneshot channel, so the engine
//! serves it on its inline, same-thread path and the caller's future stays
//! `Send` (the engine's own `Handle::batch` future is not, because on a
//! shard thread it borrows that shard's state).
//!
//! What must hold: a session answers a batch with one [`Reply`] per [`Op`]
//! in order (the engine's own contract); STATS are built from the engine's
//! metrics with the same names and meanings as the server's STATS
//! (docs/loadgen.md "STATS keys used"), so every report reads the same way
//! whatever the target; the data directory is removed when the engine stops.

use crate::cli::DurabilityArg;
use crate::embedded::{embedded_config, EmbeddedError, EmbeddedStorage};
use crate::target::{Op, Reply, Session, Target, TargetError};
use engine::metrics::EngineMetrics;
use engine::{Engine, Handle, OpResult};
use std::sync::Arc;
use tempfile::TempDir;
use tunables::Config;

/// An engine opened on its own temporary data directory.
pub struct EngineTarget {
    engine: Option<Arc<Engine>>,
    handle: Handle,
    facts: Arc<Facts>,
    profile: String,
    // Removed after the engine has stopped (field order: engine first).
    _dir: TempDir,
}

/// What STATS reports besides the metrics: fixed for the engine's life.
#[derive(Debug)]
struct Facts {
    backend: String,
    durability: String,
    /// `memory` or `hybrid`.
    tier: String,
    /// (device name, sustained IOPS, burst IOPS) per device.
    limits: Vec<(String, u64, u64)>,
}

impl EngineTarget {
    /// Opens an engine (blocking: call from a blocking context).
    pub fn start(
        profile: &str,
        durability: DurabilityArg,
        shards: u32,
        storage: EmbeddedStorage,
    ) -> Result<EngineTarget, EmbeddedError> {
        let dir = tempfile::Builder::new()
            .prefix("loadgen-engine-")
            .tempdir()
            .map_err(EmbeddedError::TempDir)?;
        let config = embedded_config(dir.path(), profile, durability, shards, storage)?;
        let engine = Engine::open(&config).map_err(|e| EmbeddedError::Start {
            profile: profile.to_string(),
            durability: durability.as_str(),
            tier: storage.tier.as_str(),
            reason: e.to_string(),
        })?;
        let facts = Arc::new(Facts {
            backend: engine.backend().name().to_string(),
            durability: durability.as_str().to_string(),
            tier: engine.tier().as_str().to_string(),
            limits: device_limits(&config),
        });
        Ok(EngineTarget {
            handle: engine.handle(),
            engine: Some(Arc::new(engine)),
            facts,
            profile: profile.to_string(),
            _dir: dir,
        })
    }

    /// Shuts the engine down (flushing its WAL) and removes its directory.
    pub fn stop(mut self) -> Result<(), EmbeddedError> {
        let profile = self.profile.clone();
        let Some(engine) = self.engine.take() else {
            return Ok(());
        };
        match Arc::try_unwrap(engine) {
            Ok(engine) => engine.shutdown().map_err(|e| EmbeddedError::Stop {
                profile,
                reason: e.to_string(),
            }),
            // A session outlived its phase: dropping the last reference
            // shuts the engine down (errors are logged by the engine).
            Err(_) => Err(EmbeddedError::Stop {
                profile,
                reason: "a client session is still open".to_string(),
            }),
        }
    }
}

impl EngineTarget {
    /// Runs `clients` client loops on the engine's own shard threads (client
    /// `t` on shard `t % shards`), the way an application embedding the
    /// engine calls it: operations owned by that shard run inline on the
    /// caller's thread, others go to their shard. `client(t, handle)` builds
    /// loop `t`'s future there. Answers in client order.
    pub async fn run_on_shards<F, Fut, R>(
        &self,
        clients: usize,
        client: F,
    ) -> Result<Vec<R>, TargetError>
    where
        F: Fn(usize, Handle) -> Fut + Send + Sync + Clone + 'static,
        Fut: std::future::Future<Output = R> + 'static,
        R: Send + 'static,
    {
        let engine = self.engine.as_ref().ok_or_else(|| TargetError::Connect {
            addr: "in-process engine".to_string(),
            reason: "the engine has stopped".to_string(),
        })?;
        let shards = engine.shard_count().max(1);
        let mut answers = Vec::with_capacity(clients);
        for t in 0..clients {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let handle = self.handle.clone();
            let client = client.clone();
            engine.spawn_on(t % shards, move || async move {
                // The receiver is gone only if the caller stopped waiting.
                let _ = tx.send(client(t, handle).await);
            });
            answers.push(rx);
        }
        let mut out = Vec::with_capacity(clients);
        for rx in answers {
            out.push(rx.await.map_err(|_| TargetError::Request {
                addr: "in-process engine".to_string(),
                reason: "the engine stopped before a client loop ended".to_string(),
            })?);
        }
        Ok(out)
    }
}

fn device_limits(config: &Config) -> Vec<(String, u64, u64)> {
    config
        .devices
        .iter()
        .map(|(name, device)| {
            let p = config.profile(&device.profile).unwrap_or_default();
            (name.clone(), p.iops, p.burst_iops)
        })
        .collect()
}

/// One client of the in-process engine: a clone of its handle.
pub struct EngineSession {
    engine: Arc<Engine>,
    handle: Handle,
    facts: Arc<Facts>,
}

impl Target for EngineTarget {
    type Session = EngineSession;

    async fn connect(&self) -> Result<EngineSession, TargetError> {
        let engine = self.engine.clone().ok_or_else(|| TargetError::Connect {
            addr: "in-process engine".to_string(),
            reason: "the engine has stopped".to_string(),
        })?;
        Ok(EngineSession {
            engine,
            handle: self.handle.clone(),
            facts: self.facts.clone(),
        })
    }

    fn addr(&self) -> String {
        "in-process engine".to_string()
    }
}

impl Session for EngineSession {
    async fn batch(&mut self, ops: Vec<Op>) -> Result<Vec<Reply>, TargetError> {
        let mut request = Vec::with_capacity(ops.len());
        for op in ops {
            request.push(match op {
                Op::Put { key, value } => engine::Op::Put { key, value },
                Op::Get { key } => engine::Op::Get { key },
                Op::Begin | Op::GetForUpdate { .. } | Op::Commit | Op::Rollback => {
                    return Err(TargetError::Unsupported {
                        addr: "in-process engine".to_string(),
                        what: "transactions (run putgettx with --target server or --server)",
                    })
                }
                Op::Scan { .. } => {
                    return Err(TargetError::Unsupported {
                        addr: "in-process engine".to_string(),
                        what: "SCAN",
                    })
                }
            });
        }
        let count = request.len();
        let shard = request
            .first()
            .map_or(0, |op| self.handle.shard_of(op.key()));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let handle = self.handle.clone();
        self.engine.spawn_on(shard, move || async move {
            // The receiver is gone only if the client stopped waiting.
            let _ = tx.send(handle.batch(request).await);
        });
        let answer = rx.await.map_err(|_| TargetError::Request {
            addr: "in-process engine".to_string(),
            reason: "the engine stopped before answering".to_string(),
        })?;
        match answer {
            Ok(results) => Ok(results
                .into_iter()
                .map(|r| match r {
                    OpResult::Ok => Reply::Done,
                    OpResult::Value(v) => Reply::Value(v),
                    OpResult::NotFound => Reply::NotFound,
                    OpResult::Err(e) => Reply::Failed(e.to_string()),
                    // loadgen sends no read-modify-writes.
                    OpResult::Updated(a) => {
                        Reply::Failed(format!("unexpected update answer {a:?}"))
                    }
                })
                .collect()),
            // The whole batch was refused: every operation failed.
            Err(e) => Ok(vec![Reply::Failed(e.to_string()); count]),
        }
    }

    async fn stats(&mut self) -> Result<Vec<(String, String)>, TargetError> {
        Ok(stats_pairs(&self.facts, &self.handle.metrics_now().await))
    }

    fn supports_scan(&self) -> bool {
        false
    }
}

/// The STATS pairs loadgen reads, from an engine metrics snapshot.
fn stats_pairs(facts: &Facts, m: &EngineMetrics) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut put = |name: String, value: String| out.push((name, value));
    put(
        "server.version".into(),
        format!("{} (engine)", env!("CARGO_PKG_VERSION")),
    );
    put("server.backend".into(), facts.backend.clone());
    put("server.durability".into(), facts.durability.clone());
    put("server.tier".into(), facts.tier.clone());
    put("server.shards".into(), m.shards.len().to_string());
    let sum = |f: fn(&engine::ShardMetrics) -> u64| m.shards.iter().map(f).sum::<u64>();
    put("engine.keys".into(), sum(|s| s.keys).to_string());
    put(
        "engine.memory_bytes".into(),
        sum(|s| s.memory_bytes).to_string(),
    );
    put(
        "wal.bytes_written".into(),
        sum(|s| s.wal_bytes_written).to_string(),
    );
    put("wal.flushes".into(), sum(|s| s.wal_flushes).to_string());
    // Same buckets in every shard: merge, then take the quantile.
    let mut fsync = engine::HistogramSnapshot::default();
    for s in &m.shards {
        fsync.merge(&s.fdatasync_latency_us);
    }
    let fsync_p99_us = fsync.quantile(0.99);
    put("wal.fsync_p99_us".into(), fsync_p99_us.to_string());
    for d in &m.devices {
        let (iops, burst) = facts
            .limits
            .iter()
            .find(|l| l.0 == d.name)
            .map_or((0, 0), |l| (l.1, l.2));
        let io = &d.io;
        let fields = [
            ("profile", d.profile.clone()),
            ("iops_limit", iops.to_string()),
            ("burst_iops", burst.to_string()),
            ("ios", io.ios_admitted.to_string()),
            ("reads", io.reads.to_string()),
            ("writes", io.writes.to_string()),
            ("syncs", io.syncs.to_string()),
            ("bytes_read", io.bytes_read.to_string()),
            ("bytes_written", io.bytes_written.to_string()),
            ("token_wait_us", (io.wait_ns_total / 1_000).to_string()),
            (
                "fsync_p99_us",
                (io.fsync_latency.quantile(0.99) / 1_000).to_string(),
            ),
        ];
        for (key, value) in fields {
            put(format!("device.{}.{key}", d.name), value);
        }
    }
    out
}

/// `--target engine` for the sweep's single client: the engine opened
/// through its embedded API ([`engine::Db`]) on a thread of its own, which
/// runs the client loop itself (a `Db` stays on the thread that opened it,
/// and its calls run there, as in a program that embeds ringkv). Each engine
/// gets a fresh temporary data directory, removed when it stops.
pub struct DbTarget {
    jobs: std::sync::mpsc::Sender<DbJob>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
    facts: Arc<Facts>,
    profile: String,
    // Removed after the engine has stopped (the thread is joined first).
    _dir: TempDir,
}

/// Work for the `Db`'s thread.
type DbJob = Box<dyn FnOnce(&engine::Db) + Send>;

impl DbTarget {
    /// Opens a `Db` on a new thread (blocking: call from a blocking context).
    pub fn start(
        profile: &str,
        durability: DurabilityArg,
        storage: EmbeddedStorage,
    ) -> Result<DbTarget, EmbeddedError> {
        let dir = tempfile::Builder::new()
            .prefix("loadgen-db-")
            .tempdir()
            .map_err(EmbeddedError::TempDir)?;
        let config = embedded_config(dir.path(), profile, durability, 1, storage)?;
        let limits = device_limits(&config);
        let (jobs, inbox) = std::sync::mpsc::channel::<DbJob>();
        let (opened_tx, opened) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("loadgen-db".to_string())
            .spawn(move || {
                let db = match engine::Db::open_with(config) {
                    Ok(db) => {
                        let _ = opened_tx.send(Ok(db.backend().name().to_string()));
                        db
                    }
                    Err(e) => {
                        let _ = opened_tx.send(Err(e.to_string()));
                        return Ok(());
                    }
                };
                while let Ok(job) = inbox.recv() {
                    job(&db);
                }
                db.close().map_err(|e| e.to_string())
            })
            .map_err(EmbeddedError::TempDir)?;
        let start_error = |reason: String| EmbeddedError::Start {
            profile: profile.to_string(),
            durability: durability.as_str(),
            tier: storage.tier.as_str(),
            reason,
        };
        let backend = match opened.recv() {
            Ok(Ok(backend)) => backend,
            Ok(Err(reason)) => return Err(start_error(reason)),
            Err(_) => return Err(start_error("the Db thread ended".to_string())),
        };
        let facts = Arc::new(Facts {
            backend,
            durability: durability.as_str().to_string(),
            tier: storage.tier.as_str().to_string(),
            limits,
        });
        Ok(DbTarget {
            jobs,
            thread: Some(thread),
            facts,
            profile: profile.to_string(),
            _dir: dir,
        })
    }

    /// Runs `f` on the `Db`'s thread and returns its output.
    pub async fn run<R, F>(&self, f: F) -> Result<R, TargetError>
    where
        F: FnOnce(&engine::Db) -> R + Send + 'static,
        R: Send + 'static,
    {
        let gone = || TargetError::Request {
            addr: "in-process engine (Db)".to_string(),
            reason: "the Db's thread has ended".to_string(),
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Box::new(move |db| {
                let _ = tx.send(f(db));
            }))
            .map_err(|_| gone())?;
        rx.await.map_err(|_| gone())
    }

    /// STATS pairs, as [`EngineSession::stats`] gives them.
    pub async fn stats(&self) -> Result<Vec<(String, String)>, TargetError> {
        let facts = self.facts.clone();
        self.run(move |db| stats_pairs(&facts, &db.metrics())).await
    }

    /// Closes the `Db` (flushing its WAL) and removes its directory
    /// (blocking).
    pub fn stop(mut self) -> Result<(), EmbeddedError> {
        let (jobs, _) = std::sync::mpsc::channel();
        drop(std::mem::replace(&mut self.jobs, jobs));
        let stop_error = |reason: String| EmbeddedError::Stop {
            profile: self.profile.clone(),
            reason,
        };
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Ok(()))) | None => Ok(()),
            Some(Ok(Err(reason))) => Err(stop_error(reason)),
            Some(Err(_)) => Err(stop_error("the Db's thread panicked".to_string())),
        }
    }
}
