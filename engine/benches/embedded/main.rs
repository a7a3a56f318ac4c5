//! `cargo bench -p ringkv-engine --bench embedded -- [FLAGS]`; `-- --help`
//! lists them.
//!
//! The MapDB/ChronicleMap document's shape through the embedded API
//! ([`ringkv_engine::Db`]): 8-byte big-endian integer keys, 32-byte values
//! (eight random floats), one thread, one call per item: N puts in key
//! order, then N gets of keys drawn uniformly from 0..N. Prints seconds and
//! nanoseconds per call for each phase, and the process's CPU time. With
//! `--batch B`, puts go B to a call (`Db::batch`). `scripts/bench-embedded.sh`
//! runs it beside LMDB (docs/benchmarks.md, "Embedded").

use clap::Parser;

// As ringkv-server and loadgen do (a program embedding ringkv picks its
// own; the report of scripts/bench-embedded.sh names this one).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use ringkv_engine::{Db, Op, OpResult};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// Items written, then read.
    #[arg(long, default_value_t = 1_000_000)]
    items: u64,
    /// Reads (default: as many as items).
    #[arg(long)]
    reads: Option<u64>,
    /// none, async or sync.
    #[arg(long, default_value = "async")]
    durability: String,
    /// memory or hybrid.
    #[arg(long, default_value = "memory")]
    tier: String,
    /// Puts per call (1: `Db::put`; more: `Db::batch`).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// The hybrid tier's RAM cache, in MiB.
    #[arg(long, default_value_t = 64)]
    cache_mib: u64,
    /// The WAL (and value) device's profile.
    #[arg(long, default_value = "nvme")]
    profile: String,
    /// Folder the database is made in (a fresh subfolder, removed after).
    #[arg(long, default_value = "/tmp")]
    dir: std::path::PathBuf,
    /// Seed of the values and the read order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How the calls reach the engine: `db` (the embedded API, on this
    /// thread), `shard` (`Handle::batch` of one operation, run on the
    /// shard's own thread: the way loadgen's sweep called before `Db`), or
    /// `thread` (`Handle::batch_blocking` from this plain thread: each call
    /// crosses to the shard's thread and back).
    #[arg(long, default_value = "db")]
    api: String,
    /// Print one JSON line instead of text.
    #[arg(long)]
    json: bool,
    // `cargo bench` passes this to every bench target.
    #[arg(long, hide = true)]
    bench: bool,
}

/// xorshift64*: cheap, and the same numbers in every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn value(rng: &mut Rng) -> [u8; 32] {
    // The state in a local for the eight draws (a register), as the C
    // driver's compiler keeps it: the generator should cost both the same.
    let mut local = Rng(rng.0);
    let mut v = [0u8; 32];
    for c in v.chunks_exact_mut(4) {
        let f = (local.next() >> 40) as f32 / (1u64 << 24) as f32;
        c.copy_from_slice(&f.to_le_bytes());
    }
    rng.0 = local.0;
    v
}

fn cpu_seconds() -> f64 {
    // SAFETY: all-zero is a valid rusage; getrusage writes only into it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    s(u.ru_utime) + s(u.ru_stime)
}

fn main() {
    let args = Args::parse();
    let dir = tempfile::Builder::new()
        .prefix("ringkv-embedded-")
        .tempdir_in(&args.dir)
        .expect("a temporary folder");
    let mut config = tunables::Config::default();
    config.storage.data_dir = dir.path().to_path_buf();
    config.storage.durability = args.durability.parse().expect("none, async or sync");
    config.storage.tier = args.tier.parse().expect("memory or hybrid");
    config.storage.cache_bytes = tunables::ByteSize(args.cache_mib << 20);
    let wal = config.storage.wal_device.clone();
    config
        .devices
        .get_mut(&wal)
        .expect("the WAL device")
        .profile = args.profile.clone();
    config.storage.value_device = wal;
    let limits = config.profile(&args.profile).unwrap_or_default();
    let n = args.items;
    let reads = args.reads.unwrap_or(n);
    let run = match args.api.as_str() {
        "db" => run_db(&args, config),
        "shard" | "thread" => run_handle(&args, config),
        other => panic!("--api db, shard or thread, not {other}"),
    };
    let Run {
        write,
        read,
        write_cpu,
        read_cpu,
    } = run;
    let per = |d: Duration, k: u64| d.as_nanos() as f64 / k.max(1) as f64;
    if args.json {
        println!(
            "{{\"store\":\"ringkv\",\"api\":\"{}\",\"items\":{n},\"reads\":{reads},\"durability\":\"{}\",\"tier\":\"{}\",\"batch\":{},\"write_s\":{:.4},\"read_s\":{:.4},\"write_ns\":{:.1},\"read_ns\":{:.1},\"write_cpu_s\":{:.4},\"read_cpu_s\":{:.4},\"profile_iops\":{},\"profile_burst_iops\":{}}}",
            args.api, args.durability, args.tier, args.batch,
            write.as_secs_f64(), read.as_secs_f64(), per(write, n), per(read, reads),
            write_cpu, read_cpu, limits.iops, limits.burst_iops
        );
    } else {
        println!(
            "ringkv {} {} {} batch {}: write {n} in {:.3} s ({:.0} ns/item, cpu {:.3} s), read {reads} in {:.3} s ({:.0} ns/item, cpu {:.3} s)",
            args.api, args.tier, args.durability, args.batch,
            write.as_secs_f64(), per(write, n), write_cpu,
            read.as_secs_f64(), per(read, reads), read_cpu
        );
    }
}

/// What one run measured.
struct Run {
    write: Duration,
    read: Duration,
    write_cpu: f64,
    read_cpu: f64,
}

/// The write and read loops on the embedded API.
fn run_db(args: &Args, config: tunables::Config) -> Run {
    let db = Db::open_with(config).expect("open");
    let mut rng = Rng(args.seed.max(1));
    let n = args.items;
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    if args.batch <= 1 {
        for i in 0..n {
            db.put(i.to_be_bytes(), value(&mut rng)).expect("put");
        }
    } else {
        let mut i = 0;
        while i < n {
            let end = (i + args.batch as u64).min(n);
            for r in db.batch(put_ops(i..end, &mut rng)).expect("batch") {
                assert_eq!(r, OpResult::Ok, "a put failed");
            }
            i = end;
        }
    }
    let write = t0.elapsed();
    let cpu1 = cpu_seconds();
    let reads = args.reads.unwrap_or(n);
    let t1 = Instant::now();
    let mut found = 0u64;
    for _ in 0..reads {
        let k = rng.next() % n.max(1);
        if db.get(k.to_be_bytes()).expect("get").is_some() {
            found += 1;
        }
    }
    let read = t1.elapsed();
    let cpu2 = cpu_seconds();
    assert_eq!(found, reads, "every key read was written");
    let m = db.metrics();
    let shard = &m.shards[0];
    eprintln!(
        "wal: {} flushes, {} bytes; checkpoints: {} ({} deltas, {} bytes, last took {} us)",
        shard.wal_flushes,
        shard.wal_bytes_written,
        shard.checkpoints,
        shard.checkpoint_deltas,
        shard.checkpoint_bytes,
        shard.checkpoint_last_duration_us
    );
    db.close().expect("close");
    Run {
        write,
        read,
        write_cpu: cpu1 - cpu0,
        read_cpu: cpu2 - cpu1,
    }
}

fn put_ops(keys: std::ops::Range<u64>, rng: &mut Rng) -> Vec<Op> {
    keys.map(|k| Op::Put {
        key: bytes::Bytes::copy_from_slice(&k.to_be_bytes()),
        value: bytes::Bytes::copy_from_slice(&value(rng)),
    })
    .collect()
}

/// The same loops through the engine's `Handle`, on the shard's thread
/// (`--api shard`) or from this one (`--api thread`).
fn run_handle(args: &Args, mut config: tunables::Config) -> Run {
    config.shards = 1;
    let engine = ringkv_engine::Engine::open(&config).expect("open");
    let handle = engine.handle();
    let (n, reads, batch, seed) = (
        args.items,
        args.reads.unwrap_or(args.items),
        args.batch.max(1) as u64,
        args.seed.max(1),
    );
    let run = if args.api == "thread" {
        pollster::block_on(handle_loops(handle.clone(), true, n, reads, batch, seed))
    } else {
        // On the shard's thread, in a task there: `Handle::batch` runs
        // inline, its future awaited by the loop.
        let (tx, rx) = std::sync::mpsc::channel();
        let h = handle.clone();
        engine.spawn_on(0, move || async move {
            let _ = tx.send(handle_loops(h, false, n, reads, batch, seed).await);
        });
        rx.recv().expect("the loop's result")
    };
    engine.shutdown().expect("shutdown");
    run
}

/// The write and read loops through `h`: `Handle::batch_blocking` when
/// `blocking` (a plain thread), else `Handle::batch` awaited (on the
/// shard's thread).
async fn handle_loops(
    h: ringkv_engine::Handle,
    blocking: bool,
    n: u64,
    reads: u64,
    batch: u64,
    seed: u64,
) -> Run {
    let call = |ops: Vec<Op>| {
        let h = h.clone();
        async move {
            if blocking {
                h.batch_blocking(ops).expect("batch")
            } else {
                h.batch(ops).await.expect("batch")
            }
        }
    };
    let mut rng = Rng(seed);
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let mut i = 0;
    while i < n {
        let end = (i + batch).min(n);
        for r in call(put_ops(i..end, &mut rng)).await {
            assert_eq!(r, OpResult::Ok, "a put failed");
        }
        i = end;
    }
    let write = t0.elapsed();
    let cpu1 = cpu_seconds();
    let t1 = Instant::now();
    for _ in 0..reads {
        let k = rng.next() % n.max(1);
        let key = bytes::Bytes::copy_from_slice(&k.to_be_bytes());
        let r = call(vec![Op::Get { key }]).await;
        assert!(
            matches!(r[0], OpResult::Value(_)),
            "every key read was written"
        );
    }
    Run {
        write,
        read: t1.elapsed(),
        write_cpu: cpu1 - cpu0,
        read_cpu: cpu_seconds() - cpu1,
    }
}
