//! [`Engine`] (owns the shard threads: open, metrics, shutdown, halt) and
//! [`Handle`] (the cloneable, thread-safe way to run operations).
//!
//! What must hold: `open` returns only after every shard recovered (or
//! returns the first error after stopping the others); the manifest is
//! checked before any shard touches its files, so a data directory is never
//! opened with another shard count than it was written with.

use crate::api::{Op, OpError, OpResult};
use crate::error::EngineError;
use crate::io::real::RealDisk;
use crate::io::runtime::{build_runtime, choose_backend, BackendKind};
use crate::io::throttle::{build_devices, Device, Throttled};
use crate::io::Disk;
use crate::layout::{DirId, ShardPaths};
use crate::manifest::{self, Manifest};
use crate::metrics::{DeviceMetrics, EngineMetrics, ShardStats};
use crate::shard::core::CommitClock;
use crate::shard::router::{
    local_shard, Control, EngineShared, Limits, ShardMsg, CONTROL_QUEUE_DEPTH,
};
use crate::shard::thread::{run, InlineShard, ShardSettings, ShardStart, ANOTHER_SHARD_FAILED};
#[cfg(test)]
use crate::tier::config::per_shard_budgets;
use crate::tier::config::{TierDirs, TierPlan};
use crate::wal::format::{chain_end_size, record_size_expiring, CHAIN_BYTES_MAX};
use crate::wal::writer::buffer_bytes_needed;
use bytes::Bytes;
use futures::channel::oneshot;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use tunables::{Config, Durability, Tier as StorageTier};

static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

/// The storage engine: one pinned thread per shard, each with its own
/// runtime, WAL and tier. Not generic: the disk type is chosen at `open`.
///
/// Keys are routed to shard `fnv1a64(key) % shard_count` (see
/// [`crate::hash`]); the shard count is recorded in `DATA/MANIFEST`.
pub struct Engine {
    shared: Arc<EngineShared>,
    threads: Vec<JoinHandle<()>>,
    halts: Vec<flume::Sender<()>>,
    backend: BackendKind,
    durability: Durability,
    tier: StorageTier,
}

/// A cloneable handle to run operations on the engine, from any thread.
///
/// Durability of an answer follows the engine's mode: in `sync`, a write
/// (or a batch containing one) is answered after the fdatasync covering it
/// and everything logged before it; in `async`, once applied in memory; in
/// `none`, the engine never writes files. Reads may see writes that are
/// applied but not yet durable (as Redis does): a reader can observe a value
/// that a crash then loses, if its writer had not yet been answered.
#[derive(Clone)]
pub struct Handle {
    pub(crate) shared: Arc<EngineShared>,
}

// A handle goes to any thread; the engine may be moved to another thread.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    const fn send<T: Send>() {}
    send_sync::<Handle>();
    send::<Engine>();
};

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("engine_id", &self.shared.engine_id)
            .field("shards", &self.shared.shard_count)
            .finish()
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("engine_id", &self.shared.engine_id)
            .field("shards", &self.shared.shard_count)
            .field("backend", &self.backend)
            .field("durability", &self.durability)
            .field("tier", &self.tier)
            .finish()
    }
}

fn config_err(reason: impl Into<String>) -> EngineError {
    EngineError::Config {
        reason: reason.into(),
    }
}

impl Engine {
    /// Opens (recovering if needed) the engine on real disks, with the
    /// backend chosen by `config.io.backend` (io_uring, or the fallback).
    pub fn open(config: &Config) -> Result<Engine, EngineError> {
        Self::open_with_disk(config, RealDisk)
    }

    /// Opens the engine on any [`Disk`] (tests use [`crate::io::sim::SimDisk`]).
    /// The WAL and snapshots go through the device named by
    /// `config.storage.wal_device`, paying its disk profile.
    pub fn open_with_disk<D: Disk>(config: &Config, disk: D) -> Result<Engine, EngineError> {
        Self::open_parts(config, disk, false).map(|(engine, _)| engine)
    }

    /// Opens the engine with its one shard run by this thread (the
    /// embedded [`crate::Db`]): the shard's runtime turns only inside
    /// [`InlineShard::drive`]. The config must ask for one shard.
    pub(crate) fn open_inline<D: Disk>(
        config: &Config,
        disk: D,
    ) -> Result<(Engine, InlineShard), EngineError> {
        let (engine, inline) = Self::open_parts(config, disk, true)?;
        Ok((
            engine,
            inline.expect("an inline open runs its shard inline"),
        ))
    }

    fn open_parts<D: Disk>(
        config: &Config,
        disk: D,
        inline: bool,
    ) -> Result<(Engine, Option<InlineShard>), EngineError> {
        config
            .validate()
            .map_err(|errors| config_err(errors.to_string()))?;
        let backend = choose_backend(config.io.backend)?;
        let s = &config.storage;
        let durability = s.durability;
        let tier = s.tier;
        let sizes = RecordSizes::from_config(config)?;
        let devices = build_devices(config)?;
        let wal_device = device_named(&devices, "storage.wal_device", &s.wal_device)?;
        // The tier's own files (the hybrid tier's value segments): on their
        // own device, which may be the WAL's (then the two share its
        // throttle).
        let value_device = device_named(&devices, "storage.value_device", &s.value_device)?;
        let plan = TierPlan::new(s, sizes.key_max, sizes.value_max)?;
        let wal_root = wal_device.dir().to_path_buf();
        let value_root = value_device.dir().to_path_buf();
        // A hot device in front of it, if the tier uses one.
        let hot_device = match plan.hot_device() {
            Some(name) => Some(device_named(&devices, "storage.hot_device", name)?),
            None => None,
        };
        let hot_root = hot_device.as_ref().map(|d| d.dir().to_path_buf());
        let shard_paths = |shard: usize| {
            let p = ShardPaths::new(&wal_root, shard).with_value_root(&value_root);
            match &hot_root {
                Some(root) => p.with_hot_root(root),
                None => p,
            }
        };

        // The manifest decides the shard count before any shard starts.
        let (shard_count, table_hasher, dir_id) = shard_count(config, &disk, backend, &wal_root)?;
        if durability != Durability::None {
            for shard in 0..shard_count {
                create_shard_dirs(&disk, &shard_paths(shard), plan.dirs())?;
            }
        }
        let mut settings = shard_settings(config, &plan, &sizes, shard_count, table_hasher)?;
        settings.dir_id = dir_id;
        let launch = Launch {
            shard_count,
            settings,
            wal_disk: (durability != Durability::None)
                .then(|| Throttled::new(disk.clone(), wal_device.clone())),
            hot_disk: hot_device
                .as_ref()
                .map(|d| Throttled::new(disk.clone(), d.clone())),
            value_disk: plan
                .keeps_files()
                .then(|| Throttled::new(disk, value_device.clone())),
            shard_paths: &shard_paths,
            backend,
            inbox_depth: config.limits.shard_queue_depth as usize,
            ring_depth: config.io.queue_depth,
            placement: tunables::CpuPlacement::parse(&config.io.cpus).map_err(|reason| {
                EngineError::Config {
                    reason: format!("io.cpus: {reason}"),
                }
            })?,
            inline,
        };
        let mut shards = launch.start()?;
        let inline = shards.inline.take();
        let shared = Arc::new(EngineShared {
            engine_id: shards.engine_id,
            shard_count,
            cpus: shards.cpus,
            inboxes: shards.inboxes,
            closed: shards.closed,
            controls: shards.controls,
            stats: shards.stats,
            devices: devices.into_values().collect(),
            shutting_down: AtomicBool::new(false),
            limits: Limits {
                key_bytes_max: sizes.key_max,
                value_bytes_max: sizes.value_max,
                ops_per_batch_max: config.limits.ops_per_frame_max as usize,
                record_bytes_max: sizes.max_record_bytes,
            },
            clock: shards.clock,
            txn_stats: shards.txn_stats,
            values_in_ram: plan.values_in_ram(),
            backup: crate::shard::backup::BackupShared::new(
                if durability == Durability::None {
                    Vec::new()
                } else {
                    (0..shard_count).map(shard_paths).collect()
                },
                s.data_dir.clone(),
                plan.dirs(),
            ),
        });
        tracing::info!(
            shards = shard_count,
            backend = %backend,
            durability = ?durability,
            tier = %tier,
            wal_root = %wal_root.display(),
            wal_device = %wal_device.name(),
            profile = %wal_device.profile_name(),
            value_device = %value_device.name(),
            hot_device = %hot_device.as_ref().map_or("", |d| d.name()),
            "engine open"
        );
        crate::request_watch::spawn(Arc::downgrade(&shared));
        let engine = Engine {
            shared,
            threads: shards.threads,
            halts: shards.halts,
            backend,
            durability,
            tier,
        };
        Ok((engine, inline))
    }

    /// A handle for running operations (cheap to clone, usable anywhere).
    pub fn handle(&self) -> Handle {
        Handle {
            shared: self.shared.clone(),
        }
    }

    pub fn shard_count(&self) -> usize {
        self.shared.shard_count
    }

    /// Runs `f()`'s future as a task on shard `shard`'s own runtime thread
    /// (the server runs its per-shard accept loop and connections there;
    /// engine calls from such tasks to the local shard run inline, without
    /// a channel hop). Panics if `shard >= shard_count()`. Silently drops
    /// the task if the shard has already stopped.
    pub fn spawn_on<F, Fut>(&self, shard: usize, f: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        assert!(shard < self.shared.shard_count, "no shard {shard}");
        if local_shard(self.shared.engine_id).is_some_and(|(s, _)| s == shard) {
            compio::runtime::spawn(f()).detach();
            return;
        }
        let task: crate::shard::router::SpawnFn = Box::new(move || Box::pin(f()));
        if self.shared.controls[shard]
            .send(Control::Spawn(task))
            .is_err()
        {
            tracing::warn!(shard, "spawn_on: the shard has stopped; task dropped");
        }
    }

    /// A snapshot of every counter: per shard and per device.
    pub fn metrics(&self) -> EngineMetrics {
        self.shared.metrics()
    }

    /// The CPU each shard thread is pinned to, by shard (`None`: not
    /// pinned; `io.cpus`).
    pub fn shard_cpus(&self) -> &[Option<usize>] {
        &self.shared.cpus
    }

    pub fn backend(&self) -> BackendKind {
        self.backend
    }

    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The storage tier the engine runs (`storage.tier`, which the data
    /// directory's manifest agrees with).
    pub fn tier(&self) -> StorageTier {
        self.tier
    }

    /// Graceful stop: new work is refused with `ShuttingDown`, everything
    /// already queued is answered, the WAL is flushed and fdatasync'ed, the
    /// threads are joined. Errs if a shard ended poisoned or panicked.
    /// Must not be called on a shard thread of this engine (it would wait
    /// for itself); that panics.
    pub fn shutdown(mut self) -> Result<(), EngineError> {
        self.stop_gracefully()
    }

    /// Crash-like stop for tests: the shard threads stop at once (their
    /// tasks are dropped at the next poll), nothing more is flushed.
    pub fn halt(mut self) {
        self.shared.shutting_down.store(true, Ordering::Release);
        let threads = std::mem::take(&mut self.threads);
        stop_threads(&self.halts, threads);
    }

    /// [`Engine::shutdown`] of an inline engine, whose shard `inline` runs
    /// on this thread: the shutdown is driven here, then the shard ends.
    pub(crate) fn shutdown_inline(self, inline: &mut InlineShard) -> Result<(), EngineError> {
        self.shared.shutting_down.store(true, Ordering::Release);
        let (done, rx) = oneshot::channel();
        let answer = if self.shared.inboxes[0]
            .send(ShardMsg::Shutdown { done })
            .is_ok()
            && !inline.ended()
        {
            let answer = inline.drive(rx);
            inline.join();
            answer
        } else {
            Err(oneshot::Canceled)
        };
        inline.end();
        match answer {
            Ok(result) => result,
            Err(_) => Err(EngineError::ShardPanicked { shard: 0 }),
        }
    }

    /// Stop of an inline engine that turns its runtime no more: its tasks
    /// are dropped where they are (a thread that unwinds must not run
    /// them). What it leaves is what a crash leaves.
    pub(crate) fn abandon_inline(self, inline: &mut InlineShard) {
        self.shared.shutting_down.store(true, Ordering::Release);
        inline.end();
    }

    /// Crash-like stop of an inline engine (see [`Engine::halt`]).
    pub(crate) fn halt_inline(self, inline: &mut InlineShard) {
        self.shared.shutting_down.store(true, Ordering::Release);
        inline.halt();
    }

    fn stop_gracefully(&mut self) -> Result<(), EngineError> {
        if self.threads.is_empty() {
            return Ok(());
        }
        assert!(
            local_shard(self.shared.engine_id).is_none(),
            "Engine::shutdown called on one of its own shard threads (it would wait for itself)"
        );
        self.shared.shutting_down.store(true, Ordering::Release);
        let mut waits = Vec::new();
        for (shard, inbox) in self.shared.inboxes.iter().enumerate() {
            let (done, rx) = oneshot::channel();
            if inbox.send(ShardMsg::Shutdown { done }).is_ok() {
                waits.push((shard, rx));
            }
        }
        let mut first_error = None;
        for (shard, rx) in waits {
            match pollster::block_on(rx) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(EngineError::ShardPanicked { shard });
                }
            }
        }
        for (shard, t) in std::mem::take(&mut self.threads).into_iter().enumerate() {
            if t.join().is_err() {
                first_error.get_or_insert(EngineError::ShardPanicked { shard });
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Engine {
    /// Dropping an engine that was neither shut down nor halted shuts it
    /// down gracefully (errors are logged).
    fn drop(&mut self) {
        if let Err(e) = self.stop_gracefully() {
            tracing::error!(error = %e, "engine shutdown on drop failed");
        }
    }
}

/// The size limits of keys, values and records the config sets.
struct RecordSizes {
    key_max: usize,
    value_max: usize,
    /// The largest single WAL record: what one flush buffer
    /// (`storage.group_commit_max_bytes`) holds besides the segment header
    /// and the seal. Larger Puts are logged as chunk chains.
    max_record_bytes: usize,
}

impl RecordSizes {
    /// Reads the limits, and checks that the group commit buffer holds the
    /// end record of a chain with the largest key and that the WAL segment
    /// holds one buffer.
    fn from_config(config: &Config) -> Result<RecordSizes, EngineError> {
        let l = &config.limits;
        let key_max = usize::try_from(l.key_bytes_max.as_u64())
            .map_err(|_| config_err("key_bytes_max too large"))?;
        let value_max = usize::try_from(l.value_bytes_max.as_u64())
            .map_err(|_| config_err("value_bytes_max too large"))?;
        if value_max > CHAIN_BYTES_MAX {
            return Err(config_err(format!(
                "limits.value_bytes_max = {value_max} bytes is over the largest value the WAL takes ({CHAIN_BYTES_MAX} bytes)"
            )));
        }
        let buffer = usize::try_from(config.storage.group_commit_max_bytes.as_u64())
            .map_err(|_| config_err("group_commit_max_bytes too large"))?;
        let mut max_record_bytes = buffer.saturating_sub(buffer_bytes_needed(0));
        if config.storage.durability == Durability::None {
            // No WAL: nothing is chained, a transaction part is never logged.
            max_record_bytes = record_size_expiring(key_max, value_max, Some(u64::MAX));
        }
        let chain_end = chain_end_size(key_max, 0, Some(u64::MAX));
        if config.storage.durability != Durability::None && max_record_bytes < chain_end {
            return Err(config_err(format!(
                "storage.group_commit_max_bytes = {buffer} bytes cannot hold a record of the largest key (limits.key_bytes_max = {key_max} bytes); it needs at least {} bytes",
                buffer_bytes_needed(chain_end)
            )));
        }
        let segment_bytes = config.storage.wal_segment_size.as_u64();
        let needed = buffer_bytes_needed(max_record_bytes) as u64;
        if config.storage.durability != Durability::None && segment_bytes < needed {
            return Err(crate::error::WalError::SegmentTooSmall {
                segment_bytes,
                needed,
            }
            .into());
        }
        Ok(RecordSizes {
            key_max,
            value_max,
            max_record_bytes,
        })
    }
}

/// The device a storage key names (`key` is its name in the config).
fn device_named(
    devices: &BTreeMap<String, Arc<Device>>,
    key: &str,
    name: &str,
) -> Result<Arc<Device>, EngineError> {
    devices.get(name).cloned().ok_or_else(|| {
        config_err(format!(
            "{key} = {name:?} names no device in [devices] (known: {})",
            devices.keys().cloned().collect::<Vec<_>>().join(", ")
        ))
    })
}

/// The shard count, table hasher and directory identity: from the config
/// in `none` durability (0 = one per core; a fresh key, no identity: no
/// file is kept), else what the manifest records (written on first open).
fn shard_count<D: Disk>(
    config: &Config,
    disk: &D,
    backend: BackendKind,
    wal_root: &Path,
) -> Result<(usize, crate::hash::TableHasher, DirId), EngineError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let s = &config.storage;
    if s.durability == Durability::None {
        // Nothing is kept: a fresh table hash key for this run.
        let key = disk
            .new_table_hash_key()
            .map_err(|source| EngineError::Io {
                op: "draw a table hash key",
                path: s.data_dir.clone(),
                source,
            })?;
        let shards = if config.shards == 0 {
            cores
        } else {
            config.shards as usize
        };
        return Ok((shards, crate::hash::TableHasher::keyed(key), 0));
    }
    let data_dir = s.data_dir.clone();
    let config_shards = config.shards;
    let tier = s.tier;
    let disk2 = disk.clone();
    let root = wal_root.to_path_buf();
    let result = std::thread::scope(|scope| {
        scope
            .spawn(move || {
                let rt = build_runtime(backend, 8).map_err(|source| EngineError::Io {
                    op: "build a runtime for the manifest",
                    path: data_dir.clone(),
                    source,
                })?;
                rt.block_on(settle_manifest(
                    &disk2,
                    &data_dir,
                    &root,
                    config_shards,
                    tier,
                    cores,
                ))
            })
            .join()
    });
    match result {
        Ok(r) => r.map(|(count, hasher, dir_id)| (count as usize, hasher, dir_id)),
        Err(_) => Err(EngineError::ShardPanicked { shard: 0 }),
    }
}

/// Makes a shard's WAL and snapshot folders, and the tier's own.
fn create_shard_dirs<D: Disk>(
    disk: &D,
    paths: &ShardPaths,
    tier_dirs: TierDirs,
) -> Result<(), EngineError> {
    for dir in [&paths.wal_dir, &paths.snapshot_dir]
        .into_iter()
        .chain(tier_dirs.of(paths))
    {
        disk.create_dir_all(dir).map_err(|source| EngineError::Io {
            op: "create directory",
            path: dir.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Every shard's settings, from the config.
fn shard_settings(
    config: &Config,
    plan: &TierPlan<'_>,
    sizes: &RecordSizes,
    shard_count: usize,
    table_hasher: crate::hash::TableHasher,
) -> Result<ShardSettings, EngineError> {
    let s = &config.storage;
    Ok(ShardSettings {
        durability: s.durability,
        tier: plan.shard_settings(shard_count)?,
        table_hasher,
        dir_id: 0,
        segment_bytes: s.wal_segment_size.as_u64(),
        // Checked to fit by `RecordSizes::from_config`.
        group_commit_max_bytes: s.group_commit_max_bytes.as_u64() as usize,
        group_commit_max_delay: s.group_commit_max_delay.get(),
        wal_flushes_in_flight: s.wal_flushes_in_flight as usize,
        wal_mark_interval: s.wal_mark_interval.get(),
        flush_interval: s.flush_interval.get(),
        checkpoint_wal_bytes: s.checkpoint_wal_bytes.as_u64(),
        checkpoint_interval: s.checkpoint_interval.get(),
        checkpoint_deltas_max: s.checkpoint_deltas_max,
        expiry_tick: s.expiry_tick.get(),
        expiry_keys_per_tick: s.expiry_keys_per_tick as usize,
        max_record_bytes: sizes.max_record_bytes,
        value_bytes_max: sizes.value_max,
        // What one response can carry: reading more for one batch only
        // makes values the server would drop (FRAME_TOO_LARGE).
        read_bytes_max: usize::try_from(config.limits.frame_bytes_max.as_u64())
            .map_err(|_| config_err("frame_bytes_max too large"))?,
        // Each shard its equal share: a shard checks its own writes
        // against it without asking the others (keys spread evenly).
        memory_bytes_max: s.max_memory.as_u64() / (shard_count as u64).max(1),
    })
}

/// What starting the shard threads needs.
struct Launch<'a, D: Disk> {
    shard_count: usize,
    settings: ShardSettings,
    /// The WAL's disk, throttled by its device (`None` in `none`).
    wal_disk: Option<Throttled<D>>,
    /// The disk of the tier's own files (a tier that keeps some).
    value_disk: Option<Throttled<D>>,
    /// The hot device's disk (`storage.hot_device`), if set.
    hot_disk: Option<Throttled<D>>,
    shard_paths: &'a dyn Fn(usize) -> ShardPaths,
    backend: BackendKind,
    /// Messages a shard's inbox holds.
    inbox_depth: usize,
    /// Entries of a shard's io_uring.
    ring_depth: u32,
    /// `io.cpus`.
    placement: tunables::CpuPlacement,
    /// The one shard runs on the opening thread (see [`InlineShard`]).
    inline: bool,
}

/// The CPU each shard thread is pinned to (`None`: not pinned), for
/// `placement` among the CPUs `allowed` (the process's affinity mask).
/// `auto` starts at a CPU chosen from the process id and `engine_id`, so
/// processes (and engines in one process) that share CPUs do not all put
/// their shard 0 on the first one.
fn shard_cpus(
    placement: &tunables::CpuPlacement,
    allowed: &[usize],
    shard_count: usize,
    engine_id: u64,
) -> Result<Vec<Option<usize>>, EngineError> {
    match placement {
        tunables::CpuPlacement::Off => Ok(vec![None; shard_count]),
        tunables::CpuPlacement::Auto if allowed.is_empty() => Ok(vec![None; shard_count]),
        tunables::CpuPlacement::Auto => {
            let start = (u64::from(std::process::id()) + engine_id) as usize % allowed.len();
            Ok((0..shard_count)
                .map(|s| Some(allowed[(start + s) % allowed.len()]))
                .collect())
        }
        tunables::CpuPlacement::List(cpus) => {
            if let Some(cpu) = cpus.iter().find(|c| !allowed.contains(c)) {
                return Err(EngineError::Config {
                    reason: format!(
                        "io.cpus names CPU {cpu}, which this process may not run on (its affinity mask: {})",
                        cpu_list(allowed)
                    ),
                });
            }
            Ok((0..shard_count)
                .map(|s| Some(cpus[s % cpus.len()]))
                .collect())
        }
    }
}

/// `[0, 1, 2, 5]` as "0-2,5".
fn cpu_list(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if j > i {
            format!("{}-{}", cpus[i], cpus[j])
        } else {
            cpus[i].to_string()
        });
        i = j + 1;
    }
    out.join(",")
}

/// The shard threads, started and recovered, and what the engine keeps of
/// each.
struct Shards {
    engine_id: u64,
    /// The CPU each shard thread is pinned to.
    cpus: Vec<Option<usize>>,
    clock: Arc<CommitClock>,
    txn_stats: Arc<crate::metrics::TxnStats>,
    inboxes: Vec<flume::Sender<ShardMsg>>,
    controls: Vec<flume::Sender<Control>>,
    halts: Vec<flume::Sender<()>>,
    closed: Vec<Arc<AtomicBool>>,
    stats: Vec<Arc<ShardStats>>,
    threads: Vec<JoinHandle<()>>,
    /// The shard run by the opening thread (an inline open).
    inline: Option<InlineShard>,
}

impl<D: Disk> Launch<'_, D> {
    /// Starts one thread per shard and waits until every shard has
    /// recovered; on a failure, stops them all and returns the first error.
    fn start(self) -> Result<Shards, EngineError> {
        let shard_count = self.shard_count;
        let allowed: Vec<usize> = core_affinity::get_core_ids()
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert!(
            !self.inline || shard_count == 1,
            "an inline engine runs one shard"
        );
        let (ready_tx, ready_rx) = flume::unbounded();
        let txn_floors: Arc<[AtomicU64]> = (0..shard_count).map(|_| AtomicU64::new(0)).collect();
        let exchange = Arc::new(crate::txn::recovery::Exchange::new(shard_count));
        let engine_id = NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed);
        let mesh = crate::mesh::Mesh::new(engine_id, shard_count, self.inbox_depth);
        let cpus = shard_cpus(&self.placement, &allowed, shard_count, engine_id)?;
        tracing::info!(
            engine = engine_id,
            cpus = %cpus
                .iter()
                .map(|c| c.map_or("-".to_string(), |c| c.to_string()))
                .collect::<Vec<_>>()
                .join(","),
            allowed = %cpu_list(&allowed),
            "shard threads placed (shard i on the i-th CPU; - = not pinned)"
        );
        let mut shards = Shards {
            engine_id,
            cpus: cpus.clone(),
            clock: Arc::new(CommitClock::new()),
            txn_stats: Arc::new(crate::metrics::TxnStats::default()),
            inboxes: Vec::new(),
            controls: Vec::new(),
            halts: Vec::new(),
            closed: Vec::new(),
            stats: Vec::new(),
            threads: Vec::new(),
            inline: None,
        };
        for (shard, cpu) in cpus.iter().enumerate() {
            let (inbox_tx, inbox_rx) = flume::bounded(self.inbox_depth);
            let (control_tx, control_rx) = flume::bounded(CONTROL_QUEUE_DEPTH);
            let (halt_tx, halt_rx) = flume::bounded(1);
            let shard_stats = Arc::new(ShardStats::new());
            let shard_closed = Arc::new(AtomicBool::new(false));
            let paths = (self.shard_paths)(shard);
            let wal_dir = paths.dir.clone();
            let start = ShardStart {
                engine_id: shards.engine_id,
                shard,
                disk: self.wal_disk.clone(),
                value_disk: self.value_disk.clone(),
                hot_disk: self.hot_disk.clone(),
                paths,
                settings: self.settings,
                stats: shard_stats.clone(),
                clock: shards.clock.clone(),
                txn_stats: shards.txn_stats.clone(),
                txn_floors: txn_floors.clone(),
                exchange: exchange.clone(),
                inbox: inbox_rx,
                mesh: mesh.clone(),
                control: control_rx,
                halt: halt_rx,
                closed: shard_closed.clone(),
                ready: ready_tx.clone(),
                backend: self.backend,
                queue_depth: self.ring_depth,
                core_id: cpu.map(|id| core_affinity::CoreId { id }),
            };
            if self.inline {
                // No thread: the shard's task waits in a runtime on this
                // one, which turns below until the shard is ready.
                shards.inboxes.push(inbox_tx);
                shards.controls.push(control_tx);
                shards.halts.push(halt_tx.clone());
                shards.closed.push(shard_closed);
                shards.stats.push(shard_stats);
                let Some(inline) = InlineShard::start(start, halt_tx) else {
                    break;
                };
                shards.inline = Some(inline);
                continue;
            }
            let spawned = std::thread::Builder::new()
                // At most 15 bytes: the kernel cuts a thread's name there,
                // and ps, top and perf show that name.
                .name(format!("rkv-shard-{shard:03}"))
                .spawn(move || run(start));
            match spawned {
                Ok(t) => shards.threads.push(t),
                Err(source) => {
                    exchange.fail();
                    stop_threads(&shards.halts, shards.threads);
                    return Err(EngineError::Io {
                        op: "spawn shard thread",
                        path: wal_dir,
                        source,
                    });
                }
            }
            shards.inboxes.push(inbox_tx);
            shards.controls.push(control_tx);
            shards.halts.push(halt_tx);
            shards.closed.push(shard_closed);
            shards.stats.push(shard_stats);
        }
        drop(ready_tx);
        let mut first_error = None;
        for _ in 0..shard_count {
            let ready = match &shards.inline {
                Some(inline) => inline.drive(ready_rx.recv_async()),
                None => ready_rx.recv(),
            };
            match ready {
                Ok((_, Ok(()))) => {}
                Ok((_, Err(e))) => {
                    // A shard that stopped only because another failed to
                    // recover says so; keep the error that names the cause,
                    // whichever came first.
                    let consequence = |e: &EngineError| matches!(e.root(), EngineError::Config { reason } if reason == ANOTHER_SHARD_FAILED);
                    if first_error.as_ref().is_none_or(consequence) {
                        first_error = Some(e);
                    }
                }
                Err(_) => {
                    first_error.get_or_insert(EngineError::ShardPanicked { shard: 0 });
                    break;
                }
            }
        }
        if let Some(e) = first_error {
            stop_threads(&shards.halts, shards.threads);
            return Err(e);
        }
        Ok(shards)
    }
}

fn stop_threads(halts: &[flume::Sender<()>], threads: Vec<JoinHandle<()>>) {
    for h in halts {
        let _ = h.try_send(());
    }
    for t in threads {
        let _ = t.join();
    }
}

/// Reads (or writes, on first open) the manifest and returns the shard
/// count, table hasher and directory identity to run with. A directory
/// without an identity (a new one, or a manifest older than version 4) is
/// given a fresh one; a manifest whose identity none of the directory's
/// files carries is refused (`crate::identity`).
async fn settle_manifest<D: Disk>(
    disk: &D,
    data_dir: &Path,
    wal_root: &Path,
    config_shards: u32,
    tier: StorageTier,
    cores: usize,
) -> Result<(u32, crate::hash::TableHasher, DirId), EngineError> {
    disk.create_dir_all(data_dir)
        .map_err(|source| EngineError::Io {
            op: "create data directory",
            path: data_dir.to_path_buf(),
            source,
        })?;
    let marker = data_dir.join(crate::layout::BACKUP_MARKER);
    if disk.exists(&marker) {
        return Err(crate::error::ManifestError::Corrupt {
            file: marker,
            reason: "an online backup into this directory never finished: the copy is incomplete; take the backup again".into(),
        }
        .into());
    }
    let existing = manifest::load(disk, data_dir).await?;
    if existing.is_some() {
        // A run killed between the manifest's rename and its directory
        // fsync leaves a name only the page cache holds; make it durable
        // before anything is written under it (see docs/wal.md, recovery
        // step 3: what was read is made durable first).
        use crate::error::IoFailure;
        disk.sync_dir(data_dir)
            .await
            .map_err(crate::error::ManifestError::io("fsync directory", data_dir))?;
    }
    if existing.is_none() {
        let first_shard = ShardPaths::new(wal_root, 0).dir;
        if disk.exists(&first_shard) {
            return Err(crate::error::ManifestError::Corrupt {
                file: manifest::manifest_path(data_dir),
                reason: format!(
                    "the manifest is missing but {} exists: the shard count of this data is unknown, refusing to guess",
                    first_shard.display()
                ),
            }
            .into());
        }
    }
    let count = manifest::resolve_shard_count(config_shards, existing.as_ref(), cores, data_dir)?;
    manifest::check_tier(tier, existing.as_ref(), data_dir)?;
    let (hasher, new_hasher) =
        manifest::settle_table_hasher(existing.as_ref(), || disk.new_table_hash_key()).map_err(
            |source| EngineError::Io {
                op: "draw a table hash key",
                path: data_dir.to_path_buf(),
                source,
            },
        )?;
    let (dir_id, new_dir_id) = match existing.as_ref().map(|m| m.dir_id) {
        Some(id) if id != 0 => (id, false),
        _ => (
            disk.new_dir_id().map_err(|source| EngineError::Io {
                op: "draw a data directory identity",
                path: data_dir.to_path_buf(),
                source,
            })?,
            true,
        ),
    };
    if existing.is_some() {
        // Before anything is written: a refused open leaves the manifest
        // as it was.
        crate::identity::check_manifest(
            disk,
            &manifest::manifest_path(data_dir),
            wal_root,
            count,
            dir_id,
        )
        .await?;
    }
    let current = Manifest::current(count, tier, hasher).with_dir_id(dir_id);
    match &existing {
        None => manifest::store(disk, data_dir, &current).await?,
        Some(m) if m.is_outdated() || new_hasher || new_dir_id => {
            // Same shard count and tier, in the layout this build writes
            // (a version 1 manifest gains its tier field, an old memory
            // directory a table hash key).
            manifest::store(disk, data_dir, &current).await?;
            tracing::info!(
                dir = %data_dir.display(),
                from = m.version,
                to = manifest::MANIFEST_VERSION,
                table_hash = hasher.name(),
                "manifest upgraded to the current format"
            );
        }
        Some(_) => {}
    }
    Ok((count, hasher, dir_id))
}

impl EngineShared {
    fn metrics(&self) -> EngineMetrics {
        EngineMetrics {
            shards: self
                .stats
                .iter()
                .enumerate()
                .map(|(i, s)| s.snapshot(i, self.inboxes[i].len()))
                .collect(),
            devices: self
                .devices
                .iter()
                .map(|d| DeviceMetrics {
                    name: d.name().to_string(),
                    profile: d.profile_name().to_string(),
                    io: d.metrics(),
                })
                .collect(),
        }
    }
}

impl Handle {
    pub fn shard_count(&self) -> usize {
        self.shared.shard_count
    }

    /// The shard owning `key`: `fnv1a64(key) % shard_count`.
    pub fn shard_of(&self, key: &[u8]) -> usize {
        self.shared.shard_of(key)
    }

    /// Runs a batch; the answers come back in op order. An op that breaks a
    /// limit (empty key, key or value too large) gets an error answer and
    /// is not applied; the rest of the batch still runs. `Err` only refuses
    /// the whole batch (`BatchTooLarge`, `ShuttingDown`). Called on a shard
    /// thread, that shard's part runs inline.
    pub async fn batch(&self, ops: Vec<Op>) -> Result<Vec<OpResult>, OpError> {
        self.shared.batch(ops).await
    }

    /// [`Handle::batch`] for plain threads: blocks until answered. Must not
    /// be called on a shard thread of this engine (it would block the
    /// shard it waits for); that is a programming error and panics.
    pub fn batch_blocking(&self, ops: Vec<Op>) -> Result<Vec<OpResult>, OpError> {
        assert!(
            local_shard(self.shared.engine_id).is_none(),
            "Handle::batch_blocking called on a shard thread; use Handle::batch (async) there"
        );
        // Waits on this thread; a wait past `RINGKV_CALL_WARN_MS` (30 s)
        // logs every shard's state once.
        crate::call_watch::block_on(self.batch(ops), &self.shared)
    }

    fn one(results: Result<Vec<OpResult>, OpError>) -> Result<OpResult, OpError> {
        let mut results = results?;
        assert_eq!(results.len(), 1);
        match results.pop() {
            Some(OpResult::Err(e)) => Err(e),
            Some(r) => Ok(r),
            None => unreachable!("one answer per operation"),
        }
    }

    pub async fn put(&self, key: Bytes, value: Bytes) -> Result<(), OpError> {
        Self::one(self.batch(vec![Op::Put { key, value }]).await).map(|_| ())
    }

    pub async fn get(&self, key: Bytes) -> Result<Option<Bytes>, OpError> {
        match Self::one(self.batch(vec![Op::Get { key }]).await)? {
            OpResult::Value(v) => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    /// Removes `key`; `Ok(true)` if it existed.
    pub async fn delete(&self, key: Bytes) -> Result<bool, OpError> {
        Ok(matches!(
            Self::one(self.batch(vec![Op::Delete { key }]).await)?,
            OpResult::Ok
        ))
    }

    /// See [`Engine::metrics`].
    pub fn metrics(&self) -> EngineMetrics {
        self.shared.metrics()
    }

    /// A snapshot of every counter in which the tier's own counters (the
    /// hybrid tier's segments, device reads, moves) include every request
    /// answered before this call: each shard copies them when it reaches
    /// this call's message. [`Handle::metrics`] may show them up to one
    /// background pause (100 ms) old. A stopped shard keeps its last copy.
    pub async fn metrics_now(&self) -> EngineMetrics {
        let mut waits = Vec::with_capacity(self.shared.inboxes.len());
        for inbox in &self.shared.inboxes {
            let (done, wait) = oneshot::channel();
            if inbox.send(ShardMsg::Refresh { done }).is_ok() {
                waits.push(wait);
            }
        }
        for wait in waits {
            let _ = wait.await;
        }
        self.shared.metrics()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `auto` uses every allowed CPU, starting at one that moves from engine
    /// to engine (and process to process), so two one-shard engines on a
    /// two-CPU mask do not share a CPU; a list must stay inside the mask.
    #[test]
    fn shard_cpus_spread_within_the_mask() {
        use tunables::CpuPlacement;
        let allowed = [2, 3];
        let a = shard_cpus(&CpuPlacement::Auto, &allowed, 1, 10).unwrap();
        let b = shard_cpus(&CpuPlacement::Auto, &allowed, 1, 11).unwrap();
        assert_ne!(a, b);
        let mut both = shard_cpus(&CpuPlacement::Auto, &allowed, 2, 10).unwrap();
        both.sort();
        assert_eq!(both, [Some(2), Some(3)]);
        assert_eq!(
            shard_cpus(&CpuPlacement::Auto, &[], 2, 1).unwrap(),
            [None, None]
        );
        assert_eq!(
            shard_cpus(&CpuPlacement::Off, &allowed, 2, 1).unwrap(),
            [None, None]
        );
        assert_eq!(
            shard_cpus(&CpuPlacement::List(vec![3]), &allowed, 3, 1).unwrap(),
            [Some(3), Some(3), Some(3)]
        );
        let e = shard_cpus(&CpuPlacement::List(vec![3, 0]), &allowed, 2, 1).unwrap_err();
        assert!(
            e.to_string().contains("CPU 0") && e.to_string().contains("2-3"),
            "{e}"
        );
        assert_eq!(cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    }

    #[test]
    fn hybrid_budgets_split_evenly_across_shards() {
        let mut s = tunables::StorageConfig {
            cache_bytes: tunables::ByteSize(1000),
            index_keys: 1025,
            ..Default::default()
        };
        assert_eq!(per_shard_budgets(&s, 1), (1000, 1025));
        // The cache never exceeds its total; the index covers at least its keys.
        assert_eq!(per_shard_budgets(&s, 3), (333, 342));
        assert_eq!(per_shard_budgets(&s, 4), (250, 257));
        s.cache_bytes = tunables::ByteSize(0);
        assert_eq!(per_shard_budgets(&s, 4).0, 0);
    }
}
