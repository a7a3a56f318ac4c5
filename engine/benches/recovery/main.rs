//! `cargo bench -p ringkv-engine --bench recovery -- [--keys N] [--passes N]
//! [--value-size N] [--key-size 8|16] [--shards N] [--dir PATH]
//! [--checkpoint-wal-bytes N] [--tier memory|hybrid] [--cache-bytes N]
//! [--updates N] [--deltas-max N] [--mixed] [--count-found]
//! [--phase fill|recover|all]`; `-- --help` describes each flag
//! (engine/benches/recovery/args.rs).
//!
//! `--mixed` adds a phase after the fill that leaves the data set the way
//! service does (see [`mixed`]): as many operations as keys, 70% overwrites,
//! 10% deletes, 10% writes with an expiry time, 10% inserts of new keys;
//! then it reports RAM per live key again (and the hybrid tier's sets the
//! index alone does not hold) and cold GETs' device reads per GET for keys
//! that are present, deleted and never written. `--count-found` then reads
//! every key back, before the restart and after it, and prints how many
//! are present beside the key count (a device read per key: slow).
//!
//! `--updates N` adds a phase after the fill: N overwrites of keys picked
//! uniformly at random, checkpointed as in service; it reports the
//! checkpoints written during it (full ones and deltas, bytes) and their
//! time. `--deltas-max` sets `storage.checkpoint_deltas_max` (0: every
//! checkpoint full), to compare delta checkpoints with full ones.
//!
//! With `--tier hybrid` the index is sized for `--keys`, and the fill also
//! reports VmRSS growth per key and the index's own bytes per key (the
//! hybrid tier's RAM figure in docs/benchmarks.md). `--key-size 8` writes
//! the key number as 8 bytes (the MapDB/ChronicleMap seed's shape with
//! `--value-size 32`).
//!
//! Fills a `sync` engine with `--keys` distinct keys, written `--passes`
//! times (batches of 1,000 from four threads; checkpoints happen as they
//! would in service, so two passes or more leave two snapshots per shard), reads the
//! process's VmRSS, shuts the engine down, then starts itself again as a
//! fresh process that only opens the same directory: it reports how long
//! recovery took, what it read (snapshot files, WAL replayed) and VmRSS
//! after the restart. See docs/benchmarks.md ("Performance round").

mod args;

use args::Phase;
use bytes::Bytes;
use clap::Parser;
use ringkv_engine::{Engine, Op};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;
use tunables::{ByteSize, Config, Durability};

/// The bench allocates through the server's allocator (mimalloc), so its
/// RAM figures are the ones a server would show; `RINGKV_BENCH_ALLOC=glibc`
/// runs it on glibc's malloc instead (the figures before 2026-12-06, and
/// the only allocator whose heap counters the bench can print).
struct BenchAlloc;

#[global_allocator]
static ALLOC: BenchAlloc = BenchAlloc;

/// 0 until the first allocation decides; then 1 (glibc) or 2 (mimalloc).
static ALLOC_CHOICE: AtomicU8 = AtomicU8::new(0);

fn on_glibc() -> bool {
    match ALLOC_CHOICE.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            // The first allocation of the process decides, before any
            // thread is spawned, so every block is freed by the allocator
            // that made it. getenv allocates nothing.
            // SAFETY: both strings are NUL-terminated and nothing in this
            // process sets the environment.
            let glibc = unsafe {
                let v = libc::getenv(c"RINGKV_BENCH_ALLOC".as_ptr());
                !v.is_null() && libc::strcmp(v, c"glibc".as_ptr()) == 0
            };
            ALLOC_CHOICE.store(if glibc { 1 } else { 2 }, Ordering::Relaxed);
            glibc
        }
    }
}

/// The allocator `on_glibc` chose.
fn chosen() -> &'static dyn GlobalAlloc {
    if on_glibc() {
        &System
    } else {
        &mimalloc::MiMalloc
    }
}

// SAFETY: every call goes to one allocator for the whole process (see
// `on_glibc`), which upholds GlobalAlloc's contract itself.
unsafe impl GlobalAlloc for BenchAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        unsafe { chosen().alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        unsafe { chosen().alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the allocator that made `ptr`.
        unsafe { chosen().dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged to the allocator that made `ptr`.
        unsafe { chosen().realloc(ptr, layout, new_size) }
    }
}

struct Options {
    keys: u64,
    passes: u64,
    value_size: usize,
    shards: u32,
    dir: PathBuf,
    checkpoint_wal_bytes: Option<u64>,
    phase: Phase,
    hybrid: bool,
    cache_bytes: Option<u64>,
    key_size: usize,
    updates: u64,
    deltas_max: Option<u32>,
    mixed: bool,
    count_found: bool,
}

fn key(opts: &Options, k: u64) -> Bytes {
    if opts.key_size == 8 {
        Bytes::copy_from_slice(&k.to_be_bytes())
    } else {
        Bytes::from(format!("k{k:015}"))
    }
}

fn vm_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// The heap as glibc's allocator sees it: bytes handed out (in arenas and
/// in mmapped blocks) and bytes free but kept in its arenas.
fn heap_bytes() -> (u64, u64) {
    // SAFETY: mallinfo2 takes no arguments and only reads the allocator's
    // counters.
    let m = unsafe { libc::mallinfo2() };
    ((m.uordblks + m.hblkhd) as u64, m.fordblks as u64)
}

/// Where the RAM goes on the hybrid tier, per live key: the tier's parts
/// as it counts them, then the heap and VmRSS around them.
fn ram_breakdown(phase: &str, engine: &Engine, rss_before: u64) {
    let m = engine.metrics();
    let keys = m.shards.iter().map(|s| s.keys).sum::<u64>().max(1) as f64;
    let Some(h) = m.hybrid_total().0 else {
        return;
    };
    let per = |b: u64| b as f64 / keys;
    let heap = if on_glibc() {
        let (in_use, free_kept) = heap_bytes();
        format!(
            "glibc heap in use {:.2} B, free but kept {:.2} B",
            per(in_use),
            per(free_kept)
        )
    } else {
        "allocator mimalloc".to_string()
    };
    let rss = vm_rss_bytes().saturating_sub(rss_before);
    println!(
        "{phase}: RAM per live key: index {:.2} B, cache {:.2} B, expiry list {:.2} B ({} pairs), \
         unresolved/deleted sets {:.2} B; {heap}; VmRSS growth {:.2} B",
        per(h.index_bytes),
        per(h.cache_bytes),
        per(h.expiry_bytes),
        h.expiry_pairs,
        per(h.blind_sets_bytes),
        per(rss),
    );
    for (i, s) in m.shards.iter().enumerate() {
        if let Some(h) = s.hybrid {
            println!(
                "{phase}: shard {i}: {} keys, {} index entries unresolved, {} deleted keys, {} expiry pairs",
                s.keys, h.unresolved_entries, h.deleted_keys, h.expiry_pairs
            );
        }
    }
}

fn config(opts: &Options) -> Config {
    let mut config = Config {
        shards: opts.shards,
        ..Default::default()
    };
    config.storage.data_dir = opts.dir.join("data");
    config.storage.durability = Durability::Sync;
    if let Some(b) = opts.checkpoint_wal_bytes {
        config.storage.checkpoint_wal_bytes = ByteSize(b);
        config.storage.checkpoint_interval = tunables::Duration::from_secs(0);
    }
    if let Some(d) = opts.deltas_max {
        config.storage.checkpoint_deltas_max = d;
    }
    if opts.hybrid {
        config.storage.tier = tunables::Tier::Hybrid;
        // `--mixed` inserts a tenth more keys.
        let inserts = if opts.mixed { opts.keys / 10 } else { 0 };
        config.storage.index_keys = (opts.keys + inserts).max(1024);
        if let Some(c) = opts.cache_bytes {
            config.storage.cache_bytes = ByteSize(c);
        }
    }
    config
}

fn bytes_under(dir: &Path, ext: &str) -> u64 {
    let mut total = 0;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            total += bytes_under(&p, ext);
        } else if p.extension().is_some_and(|x| x == ext) {
            total += e.metadata().map(|m| m.len()).unwrap_or(0);
        }
    }
    total
}

fn fill(opts: &Options) {
    let _ = std::fs::remove_dir_all(&opts.dir);
    std::fs::create_dir_all(&opts.dir).expect("create --dir");
    let rss_before = vm_rss_bytes();
    let engine = Engine::open(&config(opts)).expect("open engine");
    let value = Bytes::from(vec![0xA5u8; opts.value_size]);
    let started = Instant::now();
    let threads = 4u64;
    let per = opts.keys.div_ceil(threads);
    let passes = opts.passes;
    std::thread::scope(|s| {
        for t in 0..threads {
            let h = engine.handle();
            let value = value.clone();
            let (from, to) = (t * per, ((t + 1) * per).min(opts.keys));
            s.spawn(move || {
                for _ in 0..passes {
                    let mut i = from;
                    while i < to {
                        let n = 1000.min(to - i);
                        let ops = (i..i + n)
                            .map(|k| Op::Put {
                                key: key(opts, k),
                                value: value.clone(),
                            })
                            .collect();
                        h.batch_blocking(ops).expect("put batch");
                        i += n;
                    }
                }
            });
        }
    });
    let secs = started.elapsed().as_secs_f64();
    drop(value);
    let m = engine.metrics();
    let keys: u64 = m.shards.iter().map(|s| s.keys).sum();
    let tier: u64 = m.shards.iter().map(|s| s.memory_bytes).sum();
    let checkpoints: u64 = m.shards.iter().map(|s| s.checkpoints).sum();
    let rss = vm_rss_bytes();
    println!(
        "fill: {keys} keys of {} B ({passes} passes) in {secs:.2} s, {checkpoints} checkpoints; tier {} MiB; VmRSS before restart {} MiB",
        opts.value_size,
        tier >> 20,
        rss >> 20
    );
    println!(
        "fill: VmRSS grew {} MiB = {:.2} B per key",
        rss.saturating_sub(rss_before) >> 20,
        rss.saturating_sub(rss_before) as f64 / keys.max(1) as f64
    );
    if let Some(h) = m.hybrid_total().0 {
        let (index, cache, segs) = (h.index_bytes, h.cache_bytes, h.segment_bytes);
        println!(
            "fill: hybrid index {} MiB = {:.2} B per key; cache {} MiB; value segments {} MiB",
            index >> 20,
            index as f64 / keys.max(1) as f64,
            cache >> 20,
            segs >> 20
        );
    }
    if opts.mixed {
        mixed(opts, &engine, rss_before);
        if opts.count_found {
            count_found(opts, &engine);
        }
    }
    if opts.updates > 0 {
        update(opts, &engine);
    }
    engine.shutdown().expect("shutdown");
}

/// An update function for [`mixed`]: writes `arg` with the expiry time
/// `number` (Unix ms), whatever the key held, as `SET key value PX` does.
fn put_expiring(
    _: ringkv_engine::Current,
    _now: u64,
    arg: &Bytes,
    number: i64,
) -> ringkv_engine::UpdateOutcome {
    ringkv_engine::UpdateOutcome {
        write: ringkv_engine::UpdateWrite::PutExpiring(arg.clone(), Some(number as u64)),
        answer: ringkv_engine::UpdateAnswer::Ok,
    }
}

/// What `--mixed` does to key `k` of the fill (`k < --keys`), by `k % 10`:
/// 0 deleted, 1 rewritten with an expiry time a day ahead, 2..=9 overwritten
/// (uniformly at random, so some several times and some never). Keys from
/// `--keys` to `--keys * 1.1` are inserted. Each of the four threads owns
/// a quarter of the keys and interleaves its operations at random in the
/// 70/10/10/10 proportions.
fn mixed_op(
    opts: &Options,
    rng: &mut ringkv_engine::rng::SplitMix64,
    t: u64,
    progress: &mut [u64; 3],
    value: &Bytes,
) -> Option<Op> {
    let quarter = opts.keys.div_ceil(4);
    let (from, to) = (t * quarter, ((t + 1) * quarter).min(opts.keys));
    let pick = rng.below(10);
    match pick {
        0 => {
            // The next key of class 0 in this quarter.
            let k = from + progress[0] * 10 + (10 - from % 10) % 10;
            progress[0] += 1;
            (k < to).then(|| Op::Delete { key: key(opts, k) })
        }
        1 => {
            let k = from + progress[1] * 10 + (11 - from % 10) % 10;
            progress[1] += 1;
            let at = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_millis() as i64
                + 86_400_000;
            (k < to).then(|| Op::UpdateTtl {
                key: key(opts, k),
                update: ringkv_engine::TtlUpdate {
                    apply: put_expiring,
                    arg: value.clone(),
                    number: at,
                },
            })
        }
        2 => {
            let k = opts.keys + t + 4 * progress[2];
            progress[2] += 1;
            (k < opts.keys + opts.keys / 10).then(|| Op::Put {
                key: key(opts, k),
                value: value.clone(),
            })
        }
        _ => {
            // An overwrite of a key of class 2..=9.
            let k = loop {
                let k = from + rng.below(to - from);
                if k % 10 >= 2 {
                    break k;
                }
            };
            Some(Op::Put {
                key: key(opts, k),
                value: value.clone(),
            })
        }
    }
}

/// The `--mixed` phase and what it leaves (see [`mixed_op`]).
fn mixed(opts: &Options, engine: &Engine, rss_before: u64) {
    let value = Bytes::from(vec![0x3Cu8; opts.value_size]);
    let started = Instant::now();
    let per = opts.keys.div_ceil(4);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let h = engine.handle();
            let value = value.clone();
            s.spawn(move || {
                let mut rng = ringkv_engine::rng::SplitMix64::new(0x313d + t);
                let mut progress = [0u64; 3];
                let mut left = per;
                while left > 0 {
                    let n = 1000.min(left);
                    let ops: Vec<Op> = (0..n)
                        .filter_map(|_| mixed_op(opts, &mut rng, t, &mut progress, &value))
                        .collect();
                    h.batch_blocking(ops).expect("mixed batch");
                    left -= n;
                }
            });
        }
    });
    let secs = started.elapsed().as_secs_f64();
    drop(value);
    let m = engine.metrics();
    let keys: u64 = m.shards.iter().map(|s| s.keys).sum();
    let rss = vm_rss_bytes();
    println!(
        "mixed: {per} × 4 operations in {secs:.2} s; {keys} live keys; VmRSS grew {} MiB since the start = {:.2} B per live key",
        rss.saturating_sub(rss_before) >> 20,
        rss.saturating_sub(rss_before) as f64 / keys.max(1) as f64
    );
    if let Some(h) = m.hybrid_total().0 {
        println!(
            "mixed: hybrid index {:.2} B per live key; unresolved entries {}, deleted keys {}, spilled keys {}; GC runs {}",
            h.index_bytes as f64 / keys.max(1) as f64,
            h.unresolved_entries,
            h.deleted_keys,
            h.spilled_keys,
            h.gc_runs,
        );
        ram_breakdown("mixed", engine, rss_before);
        cold_gets(opts, engine);
    }
}

/// Picks a key number from a random stream.
type KeyPicker<'a> = Box<dyn Fn(&mut ringkv_engine::rng::SplitMix64) -> u64 + 'a>;

/// Device reads per GET, after `--mixed`, for three kinds of key: present
/// (classes 1..=9 and the inserts), deleted (class 0) and never written.
fn cold_gets(opts: &Options, engine: &Engine) {
    let reads = || -> u64 {
        engine
            .metrics()
            .shards
            .iter()
            .filter_map(|s| s.hybrid)
            .map(|h| h.device_reads)
            .sum()
    };
    let samples = 200_000u64.min(opts.keys);
    let mut rng = ringkv_engine::rng::SplitMix64::new(0x6e7);
    let total = opts.keys + opts.keys / 10;
    let kinds: [(&str, KeyPicker); 3] = [
        (
            "present",
            Box::new(move |r| loop {
                let k = r.below(total);
                if k >= opts.keys || k % 10 != 0 {
                    break k;
                }
            }),
        ),
        ("deleted", Box::new(move |r| r.below(opts.keys / 10) * 10)),
        (
            "never written",
            Box::new(move |r| total + r.below(u64::MAX / 2)),
        ),
    ];
    let h = engine.handle();
    for (name, pick) in kinds {
        let before = reads();
        let (mut found, mut missing) = (0u64, 0u64);
        let mut done = 0;
        while done < samples {
            let n = 1000.min(samples - done);
            let ops = (0..n)
                .map(|_| Op::Get {
                    key: key(opts, pick(&mut rng)),
                })
                .collect();
            for a in h.batch_blocking(ops).expect("get batch") {
                match a {
                    ringkv_engine::OpResult::Value(_) => found += 1,
                    _ => missing += 1,
                }
            }
            done += n;
        }
        let r = reads() - before;
        println!(
            "cold GETs of {name} keys: {samples} GETs ({found} found, {missing} not), {r} device reads = {:.4} per GET",
            r as f64 / samples as f64
        );
    }
}

/// Checkpoints written so far: (all, deltas, bytes).
fn checkpoint_counts(engine: &Engine) -> (u64, u64, u64) {
    let m = engine.metrics();
    m.shards.iter().fold((0, 0, 0), |(n, d, b), s| {
        (
            n + s.checkpoints,
            d + s.checkpoint_deltas,
            b + s.checkpoint_bytes,
        )
    })
}

/// Overwrites `--updates` keys picked uniformly at random.
fn update(opts: &Options, engine: &Engine) {
    let before = checkpoint_counts(engine);
    let value = Bytes::from(vec![0x5Au8; opts.value_size]);
    let started = Instant::now();
    let threads = 4u64;
    let per = opts.updates.div_ceil(threads);
    std::thread::scope(|s| {
        for t in 0..threads {
            let h = engine.handle();
            let value = value.clone();
            s.spawn(move || {
                let mut rng = ringkv_engine::rng::SplitMix64::new(0x5eed + t);
                let mut left = per;
                while left > 0 {
                    let n = 1000.min(left);
                    let ops = (0..n)
                        .map(|_| Op::Put {
                            key: key(opts, rng.below(opts.keys)),
                            value: value.clone(),
                        })
                        .collect();
                    h.batch_blocking(ops).expect("put batch");
                    left -= n;
                }
            });
        }
    });
    let secs = started.elapsed().as_secs_f64();
    let after = checkpoint_counts(engine);
    let (n, deltas, bytes) = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
    println!(
        "update: {} random overwrites in {secs:.2} s ({:.0}/s); {n} checkpoints ({deltas} deltas) wrote {} MiB",
        opts.updates,
        opts.updates as f64 / secs,
        bytes >> 20
    );
}

fn recover(opts: &Options) {
    let data = opts.dir.join("data");
    let snap_bytes = bytes_under(&data, "snap");
    let rss_before = vm_rss_bytes();
    let started = Instant::now();
    let engine = Engine::open(&config(opts)).expect("reopen engine");
    let wall = started.elapsed().as_secs_f64();
    let m = engine.metrics();
    let keys: u64 = m.shards.iter().map(|s| s.keys).sum();
    let slowest_us = m
        .shards
        .iter()
        .map(|s| s.recovery_duration_us)
        .max()
        .unwrap_or(0);
    let replayed: u64 = m.shards.iter().map(|s| s.recovery_bytes_replayed).sum();
    let entries: u64 = m.shards.iter().map(|s| s.recovery_snapshot_entries).sum();
    let rss = vm_rss_bytes();
    let loaded = opts.value_size as u64 * keys;
    println!(
        "recover: {keys} keys ({entries} from snapshots) in {wall:.2} s wall (slowest shard {:.2} s); \
         snapshot files on disk {} MiB, WAL replayed {} MiB; {:.2} GB of data per second; VmRSS after restart {} MiB",
        slowest_us as f64 / 1e6,
        snap_bytes >> 20,
        replayed >> 20,
        loaded as f64 / 1e9 / wall,
        rss >> 20
    );
    println!(
        "recover: VmRSS grew {} MiB = {:.2} B per key",
        rss.saturating_sub(rss_before) >> 20,
        rss.saturating_sub(rss_before) as f64 / keys.max(1) as f64
    );
    ram_breakdown("recover", &engine, rss_before);
    if opts.hybrid {
        settle(&engine, rss_before);
    }
    if opts.mixed && opts.count_found {
        count_found(opts, &engine);
    }
    engine.shutdown().expect("shutdown");
}

/// Waits for the shards' background steps to settle what the replay left
/// unresolved (until the count stops moving for a second), then reports
/// the key count and the RAM again.
fn settle(engine: &Engine, rss_before: u64) {
    let unresolved = || -> u64 {
        engine
            .metrics()
            .shards
            .iter()
            .filter_map(|s| s.hybrid.map(|h| h.unresolved_entries))
            .sum()
    };
    let started = Instant::now();
    let mut last = unresolved();
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
        let now = unresolved();
        if now == last {
            break;
        }
        last = now;
    }
    let m = engine.metrics();
    let keys: u64 = m.shards.iter().map(|s| s.keys).sum();
    let read: u64 = m
        .shards
        .iter()
        .filter_map(|s| s.hybrid.map(|h| h.gc_bytes_read))
        .sum();
    println!(
        "recover, settled: {keys} keys, {last} index entries unresolved after {:.1} s of background steps; GC and settling read {} MiB since the restart",
        started.elapsed().as_secs_f64() - 1.0,
        read >> 20
    );
    ram_breakdown("recover, settled", engine, rss_before);
}

/// Reads back every key `--mixed` could have left (a device read each, on
/// the hybrid tier) and compares how many are found with the key count.
fn count_found(opts: &Options, engine: &Engine) {
    let counted: u64 = engine.metrics().shards.iter().map(|s| s.keys).sum();
    let total = opts.keys + opts.keys / 10;
    let h = engine.handle();
    let mut found = 0u64;
    let mut k = 0;
    while k < total {
        let n = 1000.min(total - k);
        let ops = (k..k + n).map(|k| Op::Get { key: key(opts, k) }).collect();
        found += h
            .batch_blocking(ops)
            .expect("get batch")
            .iter()
            .filter(|a| matches!(a, ringkv_engine::OpResult::Value(_)))
            .count() as u64;
        k += n;
    }
    println!("recover: {found} of the keys read back are present; the key count says {counted}");
}

/// The bench's options from its command line.
fn options(args: args::Args) -> Options {
    Options {
        keys: args.keys,
        passes: args.passes,
        value_size: args.value_size,
        shards: args.shards,
        dir: args.dir,
        checkpoint_wal_bytes: args.checkpoint_wal_bytes,
        phase: args.phase,
        hybrid: args.tier == args::Tier::Hybrid,
        cache_bytes: args.cache_bytes,
        key_size: args.key_size.bytes(),
        updates: args.updates,
        deltas_max: args.deltas_max,
        mixed: args.mixed,
        count_found: args.count_found,
    }
}

fn main() {
    let opts = options(args::Args::parse());
    match opts.phase {
        Phase::Fill => fill(&opts),
        Phase::Recover => recover(&opts),
        Phase::All => {
            fill(&opts);
            // A fresh process, so VmRSS after the restart owes nothing to
            // the filling process's heap. The last `--phase` wins.
            let me = std::env::current_exe().expect("own path");
            let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
            args.retain(|a| a != "--bench");
            args.extend(["--phase".into(), "recover".into()]);
            let status = std::process::Command::new(me)
                .args(&args)
                .status()
                .expect("start the recovering process");
            assert!(status.success(), "recovering process failed");
        }
    }
}
