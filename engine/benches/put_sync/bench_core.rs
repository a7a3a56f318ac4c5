//! The core of the `put_sync` benchmark, shared by the bench binary and by
//! a tiny-size test run (so the benchmark never rots): raw O_DIRECT write
//! bandwidth of the disk, durable (`sync`) puts through `Handle::batch`
//! from concurrent submitters, and memory per key of the memory tier.
//! It measures; it asserts nothing about speed.

#![allow(dead_code)]

use bytes::Bytes;
use hdrhistogram::Histogram;
use ringkv_engine::io::real::RealDisk;
use ringkv_engine::io::runtime::{build_runtime, choose_backend, BackendKind};
use ringkv_engine::io::{AlignedBuf, Disk, DiskFile};
use ringkv_engine::{Engine, Op, OpResult};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tunables::{Backend, ByteSize, Config, Durability};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Directory for the data and the raw-bandwidth files (a real disk).
    pub dir: PathBuf,
    /// Length of the durable-put phase.
    pub seconds: f64,
    /// Stop the put phase after this many puts (tests); `None` = time only.
    pub max_puts: Option<u64>,
    pub batch: usize,
    pub value_size: usize,
    pub submitters: usize,
    /// 0 = one per core.
    pub shards: u32,
    /// Distinct keys the puts cycle through.
    pub key_space: u64,
    /// Length of the raw-bandwidth phase (0 skips it).
    pub raw_seconds: f64,
    /// File size each raw writer preallocates and overwrites.
    pub raw_file_bytes: u64,
    /// Keys inserted for the memory measurement (0 skips it).
    pub memory_keys: u64,
    pub backend: Backend,
    /// Overrides of the engine config (group commit, checkpoints).
    pub group_commit_max_bytes: ByteSize,
    pub checkpoint_wal_bytes: ByteSize,
    /// `storage.wal_flushes_in_flight` of the put phase.
    pub wal_flushes_in_flight: u32,
    /// `storage.max_memory` of the memory phase (0: no limit; a limit
    /// above what it inserts measures the cost of the check alone).
    pub max_memory: ByteSize,
}

impl Default for Options {
    fn default() -> Self {
        let storage = tunables::StorageConfig::default();
        Options {
            dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-put-sync"),
            seconds: 10.0,
            max_puts: None,
            batch: 1000,
            value_size: 1000,
            submitters: 16,
            shards: 0,
            key_space: 1_000_000,
            raw_seconds: 4.0,
            raw_file_bytes: 256 << 20,
            memory_keys: 1_000_000,
            backend: Backend::Auto,
            group_commit_max_bytes: storage.group_commit_max_bytes,
            checkpoint_wal_bytes: storage.checkpoint_wal_bytes,
            wal_flushes_in_flight: storage.wal_flushes_in_flight,
            max_memory: ByteSize(0),
        }
    }
}

/// Raw sequential O_DIRECT bandwidth: each writer overwrites a
/// preallocated file with `group_bytes` writes, one fdatasync after each.
#[derive(Debug, Clone, Default)]
pub struct RawResult {
    pub writers: usize,
    pub group_bytes: u64,
    pub groups: u64,
    pub bytes: u64,
    pub elapsed: Duration,
}

impl RawResult {
    pub fn bytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The durable-put phase.
#[derive(Debug, Clone, Default)]
pub struct PutResult {
    pub puts: u64,
    pub batches: u64,
    pub elapsed: Duration,
    pub wal_bytes: u64,
    pub wal_flushes: u64,
    pub fsync_p50_us: u64,
    pub fsync_p99_us: u64,
    pub checkpoints: u64,
    /// Batch latency percentiles in microseconds: p50, p95, p99, p99.9, max.
    pub latency_us: [u64; 5],
    pub shards: usize,
    pub backend: String,
    /// Bytes the WAL device wrote (WAL flushes, segment preallocation, snapshots).
    pub device_bytes_written: u64,
}

impl PutResult {
    pub fn puts_per_sec(&self) -> f64 {
        self.puts as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    pub fn wal_bytes_per_sec(&self) -> f64 {
        self.wal_bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Memory per key of the memory tier.
#[derive(Debug, Clone, Default)]
pub struct MemoryResult {
    pub keys: u64,
    pub value_size: usize,
    pub rss_delta_bytes: u64,
    pub tier_bytes: u64,
    /// `storage.max_memory` of the run (0: none).
    pub max_memory: u64,
    /// Time the inserts took (batches of 10,000 puts, one submitter).
    pub insert_seconds: f64,
}

/// Everything one run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub machine: String,
    pub config: String,
    pub raw: Option<RawResult>,
    /// Raw bandwidth measured again right after the put phase (the disk's
    /// speed drifts on a shared machine; the WAL is compared to the mean).
    pub raw_after: Option<RawResult>,
    pub puts: PutResult,
    pub memory: Option<MemoryResult>,
}

fn read_first_line(path: &str, prefix: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find(|l| l.starts_with(prefix))
        .map(|l| l.split(':').nth(1).unwrap_or(l).trim().to_string())
}

/// File system type of the mount holding `dir`.
fn fs_type(dir: &Path) -> String {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let mut best: Option<(usize, String)> = None;
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 3 {
            continue;
        }
        let mount = Path::new(fields[1]);
        if dir.starts_with(mount) {
            let len = fields[1].len();
            if best.as_ref().is_none_or(|(l, _)| len > *l) {
                best = Some((len, format!("{} on {}", fields[2], fields[0])));
            }
        }
    }
    best.map_or_else(|| "unknown".to_string(), |(_, t)| t)
}

pub fn machine(dir: &Path) -> String {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = read_first_line("/proc/cpuinfo", "model name").unwrap_or_default();
    let mem = read_first_line("/proc/meminfo", "MemTotal").unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    format!(
        "{cpus} CPUs ({model}), {mem} RAM, Linux {kernel}, {} at {}",
        fs_type(dir),
        dir.display()
    )
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Measures raw bandwidth with `writers` threads (one file each).
pub fn raw_bandwidth(
    dir: &Path,
    seconds: f64,
    group_bytes: u64,
    file_bytes: u64,
    writers: usize,
    backend: BackendKind,
) -> RawResult {
    std::fs::create_dir_all(dir).expect("bench dir");
    let file_bytes = file_bytes.max(group_bytes) / group_bytes * group_bytes;
    let ready = Arc::new(std::sync::Barrier::new(writers + 1));
    let start_flag = Arc::new(std::sync::Barrier::new(writers + 1));
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let path = dir.join(format!("raw-{w}.bin"));
            let (ready, start_flag) = (ready.clone(), start_flag.clone());
            std::thread::spawn(move || {
                let rt = build_runtime(backend, 64).expect("runtime");
                rt.block_on(async move {
                    let file = RealDisk.open(&path, true).await.expect("open raw file");
                    file.allocate_zeroed(file_bytes).await.expect("preallocate");
                    file.sync_data().await.expect("sync");
                    let mut buf = AlignedBuf::with_capacity(group_bytes as usize);
                    buf.set_len(group_bytes as usize);
                    buf.as_mut_slice().fill(0xA5);
                    ready.wait();
                    start_flag.wait();
                    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
                    let (mut groups, mut offset) = (0u64, 0u64);
                    while Instant::now() < deadline {
                        let (r, b) = file.write_at(buf, offset).await;
                        r.expect("raw write");
                        buf = b;
                        file.sync_data().await.expect("raw fdatasync");
                        groups += 1;
                        offset = (offset + group_bytes) % file_bytes;
                    }
                    drop(file);
                    let _ = std::fs::remove_file(&path);
                    groups
                })
            })
        })
        .collect();
    ready.wait();
    let started = Instant::now();
    start_flag.wait();
    let groups: u64 = threads
        .into_iter()
        .map(|t| t.join().expect("raw writer"))
        .sum();
    let elapsed = started.elapsed();
    RawResult {
        writers,
        group_bytes,
        groups,
        bytes: groups * group_bytes,
        elapsed,
    }
}

fn key_of(i: u64) -> Bytes {
    Bytes::from(format!("k{i:015}"))
}

/// Inserts `keys` keys into a `none`-durability engine and reports memory.
pub fn memory_per_key(
    dir: &Path,
    keys: u64,
    value_size: usize,
    backend: Backend,
    max_memory: ByteSize,
) -> MemoryResult {
    let mut config = Config {
        shards: 1,
        ..Default::default()
    };
    config.storage.data_dir = dir.join("memory-unused");
    config.storage.durability = Durability::None;
    config.storage.max_memory = max_memory;
    config.io.backend = backend;
    let value = Bytes::from(vec![0x5Au8; value_size]);
    let before = rss_bytes();
    let engine = Engine::open(&config).expect("open none-mode engine");
    let h = engine.handle();
    let started = Instant::now();
    let chunk = 10_000u64;
    let mut i = 0;
    while i < keys {
        let n = chunk.min(keys - i);
        let ops = (i..i + n)
            .map(|k| Op::Put {
                key: key_of(k),
                value: value.clone(),
            })
            .collect();
        h.batch_blocking(ops).expect("insert");
        i += n;
    }
    let insert_seconds = started.elapsed().as_secs_f64();
    let after = rss_bytes();
    let tier_bytes = engine.metrics().shards.iter().map(|s| s.memory_bytes).sum();
    engine.shutdown().expect("shutdown");
    MemoryResult {
        keys,
        value_size,
        rss_delta_bytes: after.saturating_sub(before),
        tier_bytes,
        max_memory: max_memory.as_u64(),
        insert_seconds,
    }
}

/// The durable-put phase: `submitters` threads send batches of `batch`
/// puts of `value_size` bytes through `Handle::batch_blocking`.
pub fn durable_puts(opts: &Options) -> PutResult {
    let data = opts.dir.join("data");
    let _ = std::fs::remove_dir_all(&data);
    let mut config = Config {
        shards: opts.shards,
        ..Default::default()
    };
    config.storage.data_dir = data.clone();
    config.storage.durability = Durability::Sync;
    config.storage.group_commit_max_bytes = opts.group_commit_max_bytes;
    config.storage.checkpoint_wal_bytes = opts.checkpoint_wal_bytes;
    config.storage.wal_flushes_in_flight = opts.wal_flushes_in_flight;
    config.limits.ops_per_frame_max = config.limits.ops_per_frame_max.max(opts.batch as u32);
    config.io.backend = opts.backend;
    let engine = Engine::open(&config).expect("open engine");
    let h = engine.handle();
    // Keys and the value are static slices: cloning and dropping them costs
    // nothing, so the submitters stay cheap (a real client runs elsewhere)
    // and no shared reference count bounces between cores. The engine
    // still copies every byte into its WAL buffer and its tier.
    let key_bytes: &'static [u8] = Box::leak(
        (0..opts.key_space)
            .flat_map(|i| format!("k{i:015}").into_bytes())
            .collect::<Vec<u8>>()
            .into_boxed_slice(),
    );
    let keys: Arc<Vec<Bytes>> = Arc::new(key_bytes.chunks(16).map(Bytes::from_static).collect());
    let value = Bytes::from_static(Box::leak(vec![0xC3u8; opts.value_size].into_boxed_slice()));
    let stop = Arc::new(AtomicBool::new(false));
    let puts_issued = Arc::new(AtomicU64::new(0));
    let m0 = engine.metrics();
    let started = Instant::now();
    let threads: Vec<_> = (0..opts.submitters)
        .map(|t| {
            let (h, keys, value, stop, issued) = (
                h.clone(),
                keys.clone(),
                value.clone(),
                stop.clone(),
                puts_issued.clone(),
            );
            let (batch, max_puts) = (opts.batch as u64, opts.max_puts);
            let deadline = started + Duration::from_secs_f64(opts.seconds);
            std::thread::spawn(move || {
                let mut hist =
                    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
                let space = keys.len() as u64;
                let mut next = (t as u64 * 7919 * batch) % space;
                let (mut puts, mut batches) = (0u64, 0u64);
                loop {
                    if stop.load(Ordering::Relaxed)
                        || Instant::now() >= deadline && max_puts.is_none()
                    {
                        break;
                    }
                    if let Some(max) = max_puts {
                        if issued.fetch_add(batch, Ordering::Relaxed) >= max {
                            break;
                        }
                    }
                    let ops: Vec<Op> = (0..batch)
                        .map(|i| Op::Put {
                            key: keys[((next + i) % space) as usize].clone(),
                            value: value.clone(),
                        })
                        .collect();
                    next = (next + batch) % space;
                    let t0 = Instant::now();
                    let answers = h.batch_blocking(ops).expect("batch");
                    let us = t0.elapsed().as_micros() as u64;
                    assert!(answers.iter().all(|a| *a == OpResult::Ok), "a put failed");
                    let _ = hist.record(us.max(1));
                    puts += batch;
                    batches += 1;
                }
                (hist, puts, batches)
            })
        })
        .collect();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
    let (mut puts, mut batches) = (0, 0);
    for t in threads {
        let (h, p, b) = t.join().expect("submitter");
        hist.add(&h).expect("merge histograms");
        puts += p;
        batches += b;
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let m1 = engine.metrics();
    let sum = |f: &dyn Fn(&ringkv_engine::ShardMetrics) -> u64,
               m: &ringkv_engine::EngineMetrics|
     -> u64 { m.shards.iter().map(f).sum() };
    let mut fsync = ringkv_engine::HistogramSnapshot::default();
    for s in &m1.shards {
        fsync.merge(&s.fdatasync_latency_us);
    }
    let result = PutResult {
        puts,
        batches,
        elapsed,
        wal_bytes: sum(&|s| s.wal_bytes_written, &m1) - sum(&|s| s.wal_bytes_written, &m0),
        wal_flushes: sum(&|s| s.wal_flushes, &m1) - sum(&|s| s.wal_flushes, &m0),
        fsync_p50_us: fsync.quantile(0.5),
        fsync_p99_us: fsync.quantile(0.99),
        checkpoints: sum(&|s| s.checkpoints, &m1),
        latency_us: [
            hist.value_at_quantile(0.5),
            hist.value_at_quantile(0.95),
            hist.value_at_quantile(0.99),
            hist.value_at_quantile(0.999),
            hist.max(),
        ],
        shards: engine.shard_count(),
        backend: engine.backend().to_string(),
        device_bytes_written: m1.devices.iter().map(|d| d.io.bytes_written).sum::<u64>()
            - m0.devices.iter().map(|d| d.io.bytes_written).sum::<u64>(),
    };
    engine.shutdown().expect("shutdown");
    let _ = std::fs::remove_dir_all(&data);
    result
}

/// Runs every phase of the benchmark.
pub fn run(opts: &Options) -> Report {
    std::fs::create_dir_all(&opts.dir).expect("bench dir");
    let backend = choose_backend(opts.backend).expect("backend");
    let memory = (opts.memory_keys > 0).then(|| {
        memory_per_key(
            &opts.dir,
            opts.memory_keys,
            opts.value_size,
            opts.backend,
            opts.max_memory,
        )
    });
    let shards = if opts.shards == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        opts.shards as usize
    };
    let measure_raw = || {
        (opts.raw_seconds > 0.0).then(|| {
            raw_bandwidth(
                &opts.dir,
                opts.raw_seconds,
                opts.group_commit_max_bytes.as_u64().min(1 << 20),
                opts.raw_file_bytes,
                shards,
                backend,
            )
        })
    };
    let raw = measure_raw();
    let puts = durable_puts(opts);
    let raw_after = measure_raw();
    Report {
        machine: machine(&opts.dir),
        config: format!(
            "durability=sync shards={} backend={} submitters={} batch={} value_size={} key_space={} group_commit_max_bytes={} checkpoint_wal_bytes={} (snapshot-size adaptive) wal_flushes_in_flight={}",
            puts.shards,
            puts.backend,
            opts.submitters,
            opts.batch,
            opts.value_size,
            opts.key_space,
            opts.group_commit_max_bytes.as_u64(),
            opts.checkpoint_wal_bytes.as_u64(),
            opts.wal_flushes_in_flight,
        ),
        raw,
        raw_after,
        puts,
        memory,
    }
}

impl Report {
    /// Mean raw bandwidth of the measurements before and after the puts.
    pub fn raw_bytes_per_sec(&self) -> Option<f64> {
        let v: Vec<f64> = [&self.raw, &self.raw_after]
            .into_iter()
            .flatten()
            .map(RawResult::bytes_per_sec)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mb = |b: f64| b / 1e6;
        writeln!(f, "machine: {}", self.machine)?;
        writeln!(f, "config:  {}", self.config)?;
        for (when, raw) in [("before", &self.raw), ("after", &self.raw_after)] {
            if let Some(r) = raw {
                writeln!(
                    f,
                    "raw O_DIRECT ({when} the puts): {:.0} MB/s ({} writers x {} KiB write + fdatasync, {} groups in {:.2} s)",
                    mb(r.bytes_per_sec()),
                    r.writers,
                    r.group_bytes / 1024,
                    r.groups,
                    r.elapsed.as_secs_f64()
                )?;
            }
        }
        let p = &self.puts;
        writeln!(
            f,
            "durable puts: {:.0}/s ({} puts in {} batches, {:.2} s)",
            p.puts_per_sec(),
            p.puts,
            p.batches,
            p.elapsed.as_secs_f64()
        )?;
        let [p50, p95, p99, p999, max] = p.latency_us;
        writeln!(
            f,
            "batch latency (us): p50 {p50} p95 {p95} p99 {p99} p99.9 {p999} max {max}"
        )?;
        write!(
            f,
            "WAL: {:.0} MB/s, {} flushes ({:.0} KiB each), fdatasync p50 <= {} us p99 <= {} us, {} checkpoints",
            mb(p.wal_bytes_per_sec()),
            p.wal_flushes,
            p.wal_bytes as f64 / p.wal_flushes.max(1) as f64 / 1024.0,
            p.fsync_p50_us,
            p.fsync_p99_us,
            p.checkpoints
        )?;
        if let Some(raw) = self.raw_bytes_per_sec() {
            write!(
                f,
                " = {:.0}% of raw (mean of before and after)",
                100.0 * p.wal_bytes_per_sec() / raw.max(1.0)
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "device: {:.0} MB/s written in all (WAL + segment preallocation + snapshots)",
            mb(p.device_bytes_written as f64 / p.elapsed.as_secs_f64().max(1e-9))
        )?;
        if let Some(m) = &self.memory {
            writeln!(
                f,
                "memory tier: {:.0} bytes/key by RSS delta, {:.0} bytes/key counted by the tier ({} keys of {} B values)",
                m.rss_delta_bytes as f64 / m.keys.max(1) as f64,
                m.tier_bytes as f64 / m.keys.max(1) as f64,
                m.keys,
                m.value_size
            )?;
            writeln!(
                f,
                "memory tier inserts (durability none, 1 shard, batches of 10000): {:.0} puts/s, storage.max_memory = {} bytes",
                m.keys as f64 / m.insert_seconds.max(1e-9),
                m.max_memory
            )?;
        }
        Ok(())
    }
}
